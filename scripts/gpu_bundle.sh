#!/usr/bin/env bash
# Builds the bundle that tests/gpu/run_service_gpu.sh runs on a GPU machine that has the
# CUDA toolkit, CMake and Python but no gRPC, Abseil, protobuf or GoogleTest (the device
# machines lent to sessions). Run it HERE, on the Debian build machine:
#
#   scripts/gpu_bundle.sh BUNDLE_DIR        # e.g. scripts/gpu_bundle.sh gpu-bundle
#
# It configures a separate build dir (build-gpu-bundle; CUDA on, sm_90, fatbins compressed,
# no worker), builds kvcached, kvcachectl, the core and service gtest binaries, the kernel
# checks and the real-GPU programs (tests/gpu), and assembles a tree
#   bin/      the binaries, stripped (strip --strip-unneeded)
#   lib/      every shared library they load except the glibc family (libc, libm, libpthread,
#             libdl, librt, ld-linux): gRPC, Abseil, protobuf, OpenSSL, prometheus-cpp, ... and
#             libstdc++/libgcc_s (the GPU box's may be older)
#   env.sh    source it: LD_LIBRARY_PATH=<tree>/lib
#   MANIFEST.txt  commit, flags, sizes, the newest GLIBC symbol version needed
# BUNDLE_DIR gets that tree packed as kvcache-gpu-bundle.tar.xz (plus a copy of MANIFEST.txt):
# the tree is ~67 MiB, mostly the same static code (kernels, cachesvc, gtest) repeated in
# every test binary, which xz -9 packs into ~10 MiB; run_service_gpu.sh unpacks it (tar -xJ,
# or Python's tarfile where xz is missing). KVC_BUNDLE_COMPRESS=0 writes the tree itself.
# Fails when BUNDLE_DIR exceeds 60 MiB (the device tool carries 64 MiB with the repository).
# gtest/gmock are linked statically (Debian's CMake config gives static archives), so the
# bundle needs no GoogleTest on the GPU box. CUDA's runtime is linked statically (cudart_static):
# the driver (libcuda) comes from the GPU box. The binaries need the GPU box's glibc to be at
# least this machine's (MANIFEST says which version; Debian 12 has 2.36).
#
# Environment: KVC_BUNDLE_BUILD_DIR (default ROOT/build-gpu-bundle), KVC_BUNDLE_JOBS
# (default nproc), KVC_BUNDLE_LIMIT_MIB (default 60), KVC_BUNDLE_COMPRESS (default 1).
# Exit: 0 bundle written; 1 over the size limit; 2 configure/build failed; 64 bad usage.
set -euo pipefail

if [[ $# -ne 1 ]]; then
  echo "usage: $0 BUNDLE_DIR" >&2
  exit 64
fi
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${KVC_BUNDLE_BUILD_DIR:-$ROOT/build-gpu-bundle}
JOBS=${KVC_BUNDLE_JOBS:-$(nproc)}
LIMIT_MIB=${KVC_BUNDLE_LIMIT_MIB:-60}
mkdir -p "$1"
BUNDLE=$(cd "$1" && pwd)
START=$(date +%s)
mkdir -p "$BUILD"

COMPRESS=${KVC_BUNDLE_COMPRESS:-1}

# Core (KvStore-level) and service (gRPC) suites whose fixtures take KVC_TEST_POOL_DEVICE
# (tests/testing/pool_device.h), then the programs. Host-only suites (host_block_pool_test,
# lane_plan_test, server_config_test) stay out: they would test nothing new on a GPU.
CORE_TESTS=(device_pool_test kv_store_test compression_test residual_test concurrent_fetch_test
  threaded_model_test kv_store_model_test fault_injection_test stats_scaling_test)
SERVICE_TESTS=(service_test compress_service_test operability_test device_read_test
  transfer_test nccl_transfer_test)
# Shared libraries built here that a test loads at run time (dlopen), carried in lib/:
# the NCCL loopback nccl_transfer_test stands in for libnccl with (env.sh names it).
LIBRARIES=(kvc_nccl_loopback)
PROGRAMS=(kvcached kvcachectl kvc_kernel_checks kvc_gpu_bench kvc_longctx_demo
  kvc_longctx_service_demo rpc_benchmark kvc_cuda_ipc_probe)
TARGETS=("${PROGRAMS[@]}" "${CORE_TESTS[@]}" "${SERVICE_TESTS[@]}")

LAUNCHER=()
CCACHE=off
if command -v ccache > /dev/null; then
  LAUNCHER=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
  CCACHE=on
fi
GEN=()
if command -v ninja > /dev/null; then GEN=(-G Ninja); fi
echo "[gpu_bundle] configure $BUILD"
if ! cmake -S "$ROOT" -B "$BUILD" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_CUDA_FLAGS="-Xfatbin=-compress-all" -DKVC_ENABLE_CUDA=ON \
    -DKVC_BUILD_WORKER=OFF "${LAUNCHER[@]}" \
    > "$BUILD/gpu_bundle.configure.log" 2>&1; then
  tail -30 "$BUILD/gpu_bundle.configure.log"
  echo "[gpu_bundle] FAILED: configure (log: $BUILD/gpu_bundle.configure.log)" >&2
  exit 2
fi
# -Xfatbin=-compress-all: each binary embeds the kernels' sm_90 code (4 MB raw, 0.7 MB
# compressed; the driver inflates it at load).
# A bundle without the CUDA backend would only ever print SKIP on the GPU box.
if ! grep -q "kvcache: CUDA" "$BUILD/gpu_bundle.configure.log"; then
  echo "[gpu_bundle] FAILED: CMake found no nvcc; the bundle needs the CUDA build" >&2
  exit 2
fi
echo "[gpu_bundle] build ${#TARGETS[@]} targets with -j$JOBS"
BUILD_START=$(date +%s)
if ! cmake --build "$BUILD" -j "$JOBS" --target "${TARGETS[@]}" "${LIBRARIES[@]}" \
  > "$BUILD/gpu_bundle.build.log" 2>&1; then
  grep -E "error|FAILED" "$BUILD/gpu_bundle.build.log" | head -30
  echo "[gpu_bundle] FAILED: build (log: $BUILD/gpu_bundle.build.log)" >&2
  exit 2
fi
BUILD_S=$(($(date +%s) - BUILD_START))

TREE="$BUILD/bundle-tree"
rm -rf "$TREE" "${BUNDLE:?}/bin" "${BUNDLE:?}/lib" "$BUNDLE/env.sh" "$BUNDLE/MANIFEST.txt" \
  "$BUNDLE/kvcache-gpu-bundle.tar.xz"
mkdir -p "$TREE/bin" "$TREE/lib"
for t in "${TARGETS[@]}"; do
  f=$(find "$BUILD" -path '*/CMakeFiles' -prune -o -type f -name "$t" -perm -u+x -print | head -1)
  if [[ -z "$f" ]]; then
    echo "[gpu_bundle] FAILED: built target $t not found under $BUILD" >&2
    exit 2
  fi
  cp "$f" "$TREE/bin/$t"
  strip --strip-unneeded "$TREE/bin/$t"
done

for l in "${LIBRARIES[@]}"; do
  f=$(find "$BUILD" -path '*/CMakeFiles' -prune -o -type f -name "lib$l.so" -print | head -1)
  if [[ -z "$f" ]]; then
    echo "[gpu_bundle] FAILED: built library lib$l.so not found under $BUILD" >&2
    exit 2
  fi
  cp "$f" "$TREE/lib/lib$l.so"
  strip --strip-unneeded "$TREE/lib/lib$l.so"
done

# Shared libraries: everything ldd resolves except the glibc family and the vDSO. The CUDA
# driver (libcuda) is never linked (cudart_static opens it at run time) and must not travel.
is_glibc() {
  case "$(basename "$1")" in
    libc.so.* | libm.so.* | libpthread.so.* | libdl.so.* | librt.so.* | ld-linux*.so.* | \
      libresolv.so.* | libutil.so.* | libmvec.so.* | libcuda.so.*) return 0 ;;
  esac
  return 1
}
missing=0
scan=("$TREE"/bin/*)
for l in "${LIBRARIES[@]}"; do scan+=("$TREE/lib/lib$l.so"); done
for b in "${scan[@]}"; do
  while read -r name arrow path _; do
    if [[ "$arrow" == "=>" && "$path" == "not" ]]; then
      echo "[gpu_bundle] FAILED: $(basename "$b") needs $name, which is not found here" >&2
      missing=1
      continue
    fi
    [[ "$arrow" == "=>" && "$path" == /* ]] || continue
    is_glibc "$path" && continue
    dest="$TREE/lib/$name"
    if [[ ! -e "$dest" ]]; then
      cp -L "$path" "$dest"
      chmod u+w "$dest"
      strip --strip-unneeded "$dest"
    fi
  done < <(ldd "$b")
done
[[ $missing -eq 0 ]] || exit 2

cat > "$TREE/env.sh" << 'EOF'
# Source this: the bundle's binaries find their shared libraries in ../lib.
KVC_BUNDLE_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export KVC_BUNDLE_DIR
export LD_LIBRARY_PATH="$KVC_BUNDLE_DIR/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export KVC_NCCL_LOOPBACK="$KVC_BUNDLE_DIR/lib/libkvc_nccl_loopback.so"
EOF

# The newest glibc symbol version any file needs: the GPU box's glibc must be at least this.
GLIBC_NEED=$(for f in "$TREE"/bin/* "$TREE"/lib/*; do objdump -T "$f" 2> /dev/null; done |
  grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1)
TREE_B=$(du -sb "$TREE" | cut -f1)
{
  echo "kvcache GPU bundle"
  echo "commit: $(git -C "$ROOT" rev-parse HEAD 2> /dev/null || echo unknown)$(git -C "$ROOT" diff --quiet HEAD 2> /dev/null || echo ' (uncommitted changes)')"
  echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(. /etc/os-release && echo "$PRETTY_NAME"), $(ldd --version | head -1)"
  echo "flags: Release, CUDA_ARCHITECTURES=90, -Xfatbin=-compress-all, KVC_BUILD_WORKER=OFF"
  grep -E "kvcache: CUDA" "$BUILD/gpu_bundle.configure.log" | head -1
  echo "needs: glibc >= ${GLIBC_NEED#GLIBC_}, an NVIDIA driver for CUDA 13 (cudart is static;"
  echo "       the NCCL loopback library loads the carried libcudart.so.13)"
  echo "build seconds: $BUILD_S (ccache $CCACHE)"
  echo "tree: $TREE_B bytes unpacked"
  echo "files:"
  (cd "$TREE" && find bin lib -type f -printf '%s %p\n' | sort -k2)
} > "$TREE/MANIFEST.txt"

if [[ "$COMPRESS" == 1 ]]; then
  echo "[gpu_bundle] packing $((TREE_B / 1048576)) MiB with xz -9 (about a minute)"
  tar -C "$TREE" -cf - MANIFEST.txt env.sh bin lib | xz -9 -T1 > "$BUNDLE/kvcache-gpu-bundle.tar.xz"
  cp "$TREE/MANIFEST.txt" "$BUNDLE/MANIFEST.txt"
else
  cp -a "$TREE/." "$BUNDLE/"
fi
SIZE_B=$(du -sb "$BUNDLE" | cut -f1)
SIZE_MIB=$(awk -v b="$SIZE_B" 'BEGIN { printf "%.1f", b / 1048576 }')
echo "size: $SIZE_B bytes in $BUNDLE ($SIZE_MIB MiB; limit $LIMIT_MIB MiB)" >> "$BUNDLE/MANIFEST.txt"
echo "[gpu_bundle] $BUNDLE: $(ls "$TREE/bin" | wc -l) binaries, $(ls "$TREE/lib" | wc -l) libraries, $((TREE_B / 1048576)) MiB unpacked, $SIZE_MIB MiB in the bundle, needs glibc >= ${GLIBC_NEED#GLIBC_}; build ${BUILD_S}s, total $(($(date +%s) - START))s"
if awk -v b="$SIZE_B" -v l="$LIMIT_MIB" 'BEGIN { exit !(b > l * 1048576) }'; then
  echo "[gpu_bundle] FAILED: bundle is $SIZE_MIB MiB, over the $LIMIT_MIB MiB limit" >&2
  exit 1
fi
echo "[gpu_bundle] OK. On a GPU machine: bash tests/gpu/run_service_gpu.sh OUTDIR $1"
