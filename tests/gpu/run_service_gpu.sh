#!/usr/bin/env bash
# The prepared real-GPU run of issue #12: from a bundle made by scripts/gpu_bundle.sh (the GPU
# machine has CUDA, CMake and Python but no gRPC/Abseil/protobuf/GoogleTest), it runs
#   1. bundle       unpack, then ldd every binary (a missing library fails here, clearly)
#   2. kernel_checks   kvc_kernel_checks --backends cuda --require-cuda
#   2b. cuda_ipc       kvc_cuda_ipc_probe: a second process opens the pool's cudaIpc handle and an
#                      interprocess event, and a VMM allocation exported as a POSIX fd
#   3. longctx_demo    kvc_longctx_demo: the 1M-token Llama-3-70B-shaped INT4 sequence (kernels
#                      level), needles found, step time vs roofline, bytes vs f16
#   4. gpu_bench       kvc_gpu_bench: quantize/dequantize vs D2D copy, decode vs roofline, SnapKV
#                      score+select+gather vs one KV read (goals reported, not enforced)
#   4b. service_bench  rpc_benchmark --device=cuda:0: Append / Fetch through kvcached with a GPU
#                      pool vs raw gRPC streaming and memcpy of the same bytes
#   5. core:<test>     the KvStore-level gtest suites with KVC_TEST_POOL_DEVICE=cuda:0
#   6. service:<test>  the gRPC service suites with KVC_TEST_POOL_DEVICE=cuda:0, and
#                      device_read_test: the bundle's kvcached and the test as two processes,
#                      a device pool read through real CUDA IPC (kvc/client/device_reader.h);
#                      transfer_test: a device pool's leased blocks over a transfer channel;
#                      nccl_transfer_test: NCCL FetchInto and Append with both ranks on this
#                      GPU through the bundle's NCCL loopback library (tests/testing), and
#                      with real NCCL between cuda:0 and cuda:1 (skips on one GPU)
#   6a. service_demo   kvc_longctx_service_demo: the same 1M-token 70B-shaped INT4 sequence in a
#                      cuda:0 pool of the service core (KvStore), appended from device memory,
#                      Attend on every layer: needles found, step time, bytes vs f16
#   6b. kvcached:cuda_pool   kvcached starts with a cuda:0 pool beside a cpu pool, kvcachectl
#                      lists both, SIGTERM stops it cleanly
#   6c. kvcached:bad_device  a cuda:7 pool: kvcached must exit non-zero at once, naming the pool
#   7. memcheck        the CUDA kernel checks under compute-sanitizer --tool memcheck
#   8. racecheck       under --tool racecheck, only the checks whose kernels share memory
#                      between threads: --filter Decode, SnapKv and Select (bounded time)
# and writes into OUTDIR: summary.txt (one PASS/FAIL/SKIP line per step, with its reason and
# seconds), environment.txt, gpu_bench.json, longctx_demo.json, service_bench.json,
# details.tar.gz (every log and gtest XML): six files, inside the device tool's eight-file
# return limit.
# Every step has a timeout, and a step never runs past the whole run's deadline
# (KVC_GPU_DEADLINE_S, default 470 s), so the run ends in under 8 minutes.
# Exit 0 only if no step FAILED. Without a GPU (no nvidia-smi GPU, or KVC_GPU_ASSUME_NO_GPU=1)
# every GPU step is SKIP with the reason and the programs' own no-GPU path is exercised; exit 0.
#
#   tests/gpu/run_service_gpu.sh OUTDIR [BUNDLE_DIR]     # BUNDLE_DIR defaults to ./gpu-bundle
#
# How a session runs it on a lent H200 (the device tool carries git-ignored paths named in
# carry; gpu-bundle/ is ignored, ~10 MiB):
#   here:   scripts/gpu_bundle.sh gpu-bundle
#   device: run(carry=["gpu-bundle"], timeout_s=540,
#               command="bash tests/gpu/run_service_gpu.sh $OUT/gpu gpu-bundle")
#   then read $OUT/gpu/summary.txt (files_at); details.tar.gz holds every log.
# Instead of a bundle, KVC_GPU_BUILD_DIR=<cmake build dir> takes the binaries from a build
# (the ctest of this script's no-GPU path does that).
set -uo pipefail

if [[ $# -lt 1 || $# -gt 2 ]]; then
  echo "usage: $0 OUTDIR [BUNDLE_DIR]" >&2
  exit 64
fi
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
mkdir -p "$1"
OUT=$(cd "$1" && pwd)
BUNDLE_ARG=${2:-gpu-bundle}
DEADLINE_S=${KVC_GPU_DEADLINE_S:-470}
START=$(date +%s)
DETAIL="$OUT/detail"
rm -rf "$DETAIL" "$OUT/details.tar.gz"
mkdir -p "$DETAIL"
: > "$OUT/summary.txt"
FAILS=0
PASSES=0
SKIPS=0

log() { echo "[run_service_gpu $(($(date +%s) - START))s] $*"; }
# One summary line per step: STATUS name (reason, seconds).
record() {
  local status=$1 name=$2 reason=$3 secs=${4:-0}
  printf '%-4s %-30s %s (%ss)\n' "$status" "$name" "$reason" "$secs" | tee -a "$OUT/summary.txt"
  case "$status" in
    PASS) PASSES=$((PASSES + 1)) ;;
    FAIL) FAILS=$((FAILS + 1)) ;;
    *) SKIPS=$((SKIPS + 1)) ;;
  esac
}
# Seconds a step may take: its own limit, cut to what is left before the deadline.
budget() {
  local want=$1 left=$((DEADLINE_S - ($(date +%s) - START)))
  if ((left < want)); then echo "$left"; else echo "$want"; fi
}
finish() {
  {
    echo "total: $PASSES passed, $FAILS failed, $SKIPS skipped in $(($(date +%s) - START))s"
    if ((FAILS == 0)); then echo "RESULT: PASS"; else echo "RESULT: FAIL"; fi
  } | tee -a "$OUT/summary.txt"
  if [[ -n "${UNPACKED:-}" ]]; then rm -rf "$UNPACKED"; fi
  if [[ -z "${KVC_GPU_KEEP_DETAIL:-}" ]]; then
    tar -C "$OUT" -czf "$OUT/details.tar.gz" detail && rm -rf "$DETAIL"
  fi
  exit $((FAILS == 0 ? 0 : 1))
}

# ---- environment and GPU detection
HAVE_GPU=0
GPU_REASON=""
if [[ -n "${KVC_GPU_ASSUME_NO_GPU:-}" ]]; then
  GPU_REASON="KVC_GPU_ASSUME_NO_GPU is set"
elif ! command -v nvidia-smi > /dev/null; then
  GPU_REASON="nvidia-smi not found"
elif ! nvidia-smi -L 2> /dev/null | grep -q "GPU"; then
  GPU_REASON="nvidia-smi lists no GPU"
else
  HAVE_GPU=1
fi
SANITIZER=$(command -v compute-sanitizer 2> /dev/null || true)
if [[ -z "$SANITIZER" ]]; then
  SANITIZER=$(ls -1 /usr/local/cuda*/bin/compute-sanitizer 2> /dev/null | sort -V | tail -1 || true)
fi
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "commit: $(git -C "$ROOT" rev-parse HEAD 2> /dev/null || echo unknown)"
  echo "gpu: $([[ $HAVE_GPU == 1 ]] && echo yes || echo "no ($GPU_REASON)")"
  uname -a
  echo "cpus: $(nproc)"
  head -2 /etc/os-release 2> /dev/null
  ldd --version 2>&1 | head -1
  nvidia-smi 2>&1 || echo "nvidia-smi: not available"
  nvcc --version 2>&1 | tail -2 || echo "nvcc: not on PATH"
  echo "compute-sanitizer: ${SANITIZER:-not found}"
  [[ -n "$SANITIZER" ]] && "$SANITIZER" --version 2>&1 | tail -1
} > "$OUT/environment.txt" 2>&1
log "gpu: $([[ $HAVE_GPU == 1 ]] && echo yes || echo "no ($GPU_REASON)"); deadline ${DEADLINE_S}s"

# ---- step 1: the binaries (bundle or build dir)
T0=$(date +%s)
BIN=""
if [[ -n "${KVC_GPU_BUILD_DIR:-}" ]]; then
  # Link the build's binaries into one folder so every later step finds them the same way.
  BIN="$DETAIL/build-bin"
  mkdir -p "$BIN"
  for t in kvcached kvc_kernel_checks kvc_gpu_bench kvc_longctx_demo kvc_longctx_service_demo \
    rpc_benchmark kvc_cuda_ipc_probe \
    device_pool_test kv_store_test \
    compression_test residual_test concurrent_fetch_test threaded_model_test \
    kv_store_model_test fault_injection_test stats_scaling_test service_test \
    compress_service_test operability_test device_read_test transfer_test nccl_transfer_test; do
    f=$(find "$KVC_GPU_BUILD_DIR" -path '*/CMakeFiles' -prune -o -type f -name "$t" -perm -u+x \
      -print 2> /dev/null | head -1)
    [[ -n "$f" ]] && ln -s "$f" "$BIN/$t"
  done
  loopback=$(find "$KVC_GPU_BUILD_DIR" -name libkvc_nccl_loopback.so -print -quit 2> /dev/null)
  [[ -n "$loopback" ]] && export KVC_NCCL_LOOPBACK="$loopback"
  record PASS bundle "binaries from build dir $KVC_GPU_BUILD_DIR ($(ls "$BIN" | wc -l) found)" \
    $(($(date +%s) - T0))
else
  BUNDLE=$(cd "$BUNDLE_ARG" 2> /dev/null && pwd || true)
  if [[ -z "$BUNDLE" ]]; then
    HOWTO="make one where gRPC and GoogleTest are installed: scripts/gpu_bundle.sh gpu-bundle"
    echo "No bundle at '$BUNDLE_ARG'; $HOWTO, then carry it (carry [\"gpu-bundle\"])." >&2
    if [[ $HAVE_GPU == 1 ]]; then
      record FAIL bundle "no bundle at '$BUNDLE_ARG' on a GPU machine; $HOWTO" 0
      finish
    fi
    # Without a GPU every later step is a SKIP anyway: say so per step and exit 0.
    record SKIP bundle "no bundle at '$BUNDLE_ARG'; $HOWTO" 0
    BIN="$DETAIL/no-binaries"
  else
    TREE="$BUNDLE"
    if [[ -f "$BUNDLE/kvcache-gpu-bundle.tar.xz" ]]; then
      TREE="${TMPDIR:-/tmp}/kvc-gpu-bundle.$$"
      UNPACKED="$TREE"
      rm -rf "$TREE" && mkdir -p "$TREE"
      # xz may be missing on a bare GPU box; CPython's tarfile reads .tar.xz by itself.
      if ! { command -v xz > /dev/null && tar -C "$TREE" -xJf "$BUNDLE/kvcache-gpu-bundle.tar.xz"; } &&
        ! python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \
          "$BUNDLE/kvcache-gpu-bundle.tar.xz" "$TREE"; then
        record FAIL bundle "cannot unpack $BUNDLE/kvcache-gpu-bundle.tar.xz" $(($(date +%s) - T0))
        finish
      fi
    fi
    if [[ ! -f "$TREE/env.sh" || ! -d "$TREE/bin" ]]; then
      record FAIL bundle "$BUNDLE holds neither kvcache-gpu-bundle.tar.xz nor bin/ and env.sh" 0
      finish
    fi
    # shellcheck disable=SC1091
    source "$TREE/env.sh"
    BIN="$TREE/bin"
    cp "$TREE/MANIFEST.txt" "$DETAIL/MANIFEST.txt" 2> /dev/null
    missing=""
    for b in "$BIN"/*; do
      if ldd "$b" 2>&1 | grep -q "not found"; then
        missing+=" $(basename "$b"): $(ldd "$b" | grep "not found" | awk '{print $1}' | tr '\n' ' ')"
      fi
      if ldd "$b" 2>&1 | grep -q "version .GLIBC.* not found"; then
        missing+=" $(basename "$b"): needs a newer glibc (MANIFEST.txt says which)"
      fi
    done
    if [[ -n "$missing" ]]; then
      record FAIL bundle "unresolved libraries:$missing" $(($(date +%s) - T0))
      finish
    fi
    record PASS bundle "$(ls "$BIN" | wc -l) binaries, every library resolved ($BUNDLE)" \
      $(($(date +%s) - T0))
  fi
fi
{
  echo "binaries: $BIN"
  ls -l "$BIN"/ 2>&1
} >> "$OUT/environment.txt"

# run_step NAME TIMEOUT LOGNAME CMD...: runs a command under its (deadline-cut) timeout.
# Sets RC (124 = timed out) and SECS.
run_step() {
  local name=$1 limit logname=$3
  limit=$(budget "$2")
  shift 3
  local t0
  t0=$(date +%s)
  if ((limit < 5)); then
    RC=200
    SECS=0
    return
  fi
  log "$name (timeout ${limit}s)"
  timeout --kill-after=10 "$limit" "$@" > "$DETAIL/$logname.log" 2>&1
  RC=$?
  SECS=$(($(date +%s) - t0))
}
# Maps RC to a summary line; $2 is what a pass means.
judge() {
  local name=$1 passed=$2
  case $RC in
    0) record PASS "$name" "$passed" "$SECS" ;;
    124 | 137) record FAIL "$name" "timed out (see $name.log in details)" "$SECS" ;;
    200) record SKIP "$name" "no time left before the ${DEADLINE_S}s deadline" 0 ;;
    *) record FAIL "$name" "exit $RC (see its log in details.tar.gz)" "$SECS" ;;
  esac
}
have() { [[ -x "$BIN/$1" ]]; }

# ---- step 2: kernel checks, plain
if [[ $HAVE_GPU != 1 ]]; then
  record SKIP kernel_checks "no GPU: $GPU_REASON"
elif ! have kvc_kernel_checks; then
  record FAIL kernel_checks "kvc_kernel_checks missing from the bundle"
else
  run_step kernel_checks 30 kernel_checks "$BIN/kvc_kernel_checks" --backends cuda \
    --require-cuda --json "$DETAIL/kernel_checks.json"
  judge kernel_checks "$(grep -E "passed," "$DETAIL/kernel_checks.log" | tail -1)"
fi

# ---- step 2b: CUDA IPC between two processes (legacy handles + event, VMM POSIX fds): the
# facts device-pool leases are designed on (issue #13 item 3)
if [[ $HAVE_GPU != 1 ]]; then
  record SKIP cuda_ipc "no GPU: $GPU_REASON"
elif ! have kvc_cuda_ipc_probe; then
  record FAIL cuda_ipc "kvc_cuda_ipc_probe missing"
else
  run_step cuda_ipc 40 cuda_ipc "$BIN/kvc_cuda_ipc_probe" --json "$DETAIL/cuda_ipc.json"
  judge cuda_ipc "$(grep -E "^(legacy_ipc|vmm_posix_fd|same_process_open|child_.*gbps)" \
    "$DETAIL/cuda_ipc.log" | tr '\n' ';' | cut -c1-300)"
fi

# ---- steps 3 and 4: the demo and the benchmarks. These programs print SKIP themselves
# without a GPU; here that path runs too (small sizes), so a broken binary shows up on CI.
if have kvc_longctx_demo; then
  if [[ $HAVE_GPU == 1 ]]; then
    run_step longctx_demo 80 longctx_demo "$BIN/kvc_longctx_demo" --json "$OUT/longctx_demo.json"
  else
    run_step longctx_demo 30 longctx_demo "$BIN/kvc_longctx_demo" --tokens 4096 --layers 2 \
      --steps 1 --needles 2 --json "$OUT/longctx_demo.json"
  fi
  if [[ $RC == 0 ]] && grep -q "^SKIP" "$DETAIL/longctx_demo.log"; then
    record SKIP longctx_demo "$(grep -m1 '^SKIP' "$DETAIL/longctx_demo.log")" "$SECS"
  else
    judge longctx_demo "$(grep -E "kvc_longctx_demo: PASS|roofline" "$DETAIL/longctx_demo.log" |
      tr '\n' ' ' | cut -c1-300)"
  fi
elif [[ $HAVE_GPU != 1 ]]; then
  record SKIP longctx_demo "no GPU ($GPU_REASON) and no kvc_longctx_demo binary"
else
  record FAIL longctx_demo "kvc_longctx_demo missing"
fi
if have kvc_gpu_bench; then
  if [[ $HAVE_GPU == 1 ]]; then
    run_step gpu_bench 70 gpu_bench "$BIN/kvc_gpu_bench" --reps 10 --json "$OUT/gpu_bench.json"
  else
    run_step gpu_bench 30 gpu_bench "$BIN/kvc_gpu_bench" --quick --json "$OUT/gpu_bench.json"
  fi
  if [[ $RC == 0 ]] && grep -q "^SKIP" "$DETAIL/gpu_bench.log"; then
    record SKIP gpu_bench "$(grep -m1 '^SKIP' "$DETAIL/gpu_bench.log")" "$SECS"
  else
    judge gpu_bench "$(grep -E "^kvc_gpu_bench: .* cases ran" "$DETAIL/gpu_bench.log")"
  fi
  grep -E "GOAL MISSED| met$" "$DETAIL/gpu_bench.log" | sed 's/^/     bench: /' >> "$OUT/summary.txt"
elif [[ $HAVE_GPU != 1 ]]; then
  record SKIP gpu_bench "no GPU ($GPU_REASON) and no kvc_gpu_bench binary"
else
  record FAIL gpu_bench "kvc_gpu_bench missing"
fi

# ---- step 4b: Append / Fetch through kvcached with a cuda:0 pool vs raw gRPC and memcpy
if [[ $HAVE_GPU != 1 ]]; then
  record SKIP service_bench "no GPU: $GPU_REASON"
elif ! have rpc_benchmark; then
  record FAIL service_bench "rpc_benchmark missing"
else
  run_step service_bench 40 service_bench "$BIN/rpc_benchmark" --device=cuda:0 --tls=false \
    --total_mib=512 --rounds=3 --json="$OUT/service_bench.json"
  judge service_bench "$(grep -E "Append|Fetch" "$DETAIL/service_bench.log" | tr -s ' ' |
    tr '\n' ';' | cut -c1-300)"
fi

# ---- steps 5 and 6: the core and service suites on a cuda:0 pool
gtest_step() {
  local kind=$1 t=$2 limit=$3
  local name="$kind:$t"
  if [[ $HAVE_GPU != 1 ]]; then
    record SKIP "$name" "no GPU: $GPU_REASON"
  elif ! have "$t"; then
    record FAIL "$name" "$t missing"
  else
    # Pointer checks on: a host pointer that reached a kernel is a clear error, not a fault.
    KVC_TEST_POOL_DEVICE=cuda:0 KVC_CUDA_CHECK_POINTERS=1 \
      KVC_THREADED_MODEL_SECONDS=${KVC_THREADED_MODEL_SECONDS:-10} \
      run_step "$name" "$limit" "$t" "$BIN/$t" --gtest_output="xml:$DETAIL/$t.xml"
    judge "$name" "$(grep -E "^\[  PASSED  \]" "$DETAIL/$t.log" | tail -1)"
  fi
}
for t in device_pool_test kv_store_test compression_test residual_test concurrent_fetch_test \
  kv_store_model_test fault_injection_test stats_scaling_test; do
  gtest_step core "$t" 10
done
gtest_step core threaded_model_test 25
gtest_step service service_test 15
gtest_step service compress_service_test 15
gtest_step service operability_test 25
# Two processes: the bundle's kvcached with a cuda:0 pool, the test reading it through real
# CUDA IPC (kvc/client/device_reader.h).
KVC_KVCACHED="$BIN/kvcached" gtest_step service device_read_test 30
# Transfer channels from a cuda:0 pool: leased blocks copied off the device and sent over TCP.
gtest_step service transfer_test 15
# NCCL transfers with both ranks on this GPU through the loopback library (env.sh names it in
# KVC_NCCL_LOOPBACK; real NCCL refuses two ranks on one GPU): the pool's device-to-device
# gathers, the device receive buffer, device decode and appends from device memory, for real.
gtest_step service nccl_transfer_test 20

# ---- step 6a: the 1M-token demo through the service core: KvStore with a cuda:0 pool,
# device-resident appends, Attend on every layer (its JSON goes into details.tar.gz)
if [[ $HAVE_GPU != 1 ]]; then
  record SKIP service_demo "no GPU: $GPU_REASON"
elif ! have kvc_longctx_service_demo; then
  record FAIL service_demo "kvc_longctx_service_demo missing"
else
  KVC_CUDA_CHECK_POINTERS=1 run_step service_demo 100 service_demo \
    "$BIN/kvc_longctx_service_demo" --device=cuda:0 --json="$DETAIL/longctx_service_demo.json"
  judge service_demo "$(grep -E "needles|decode|filled" "$DETAIL/service_demo.log" |
    tr -s ' ' | tr '\n' ';' | cut -c1-300)"
fi

# ---- steps 6b and 6c: kvcached itself with device pools (the overlay's startup path)
kvcached_config() {  # DEVICE PORT
  cat << EOF
listen: "127.0.0.1:$2"
pools {
  name: "gpu-llama3-8b"
  device: "$1"
  capacity_bytes: 1073741824
  geometry { num_layers: 32 num_kv_heads: 8 num_query_heads: 32 head_dim: 128
             block_tokens: 16 dtype: DTYPE_BF16 rope { theta: 500000 } }
}
pools {
  name: "host-smollm2"
  device: "cpu"
  capacity_bytes: 268435456
  geometry { num_layers: 30 num_kv_heads: 3 num_query_heads: 9 head_dim: 64
             block_tokens: 16 dtype: DTYPE_F16 rope { theta: 100000 style: ROPE_STYLE_NEOX } }
}
EOF
}
if [[ $HAVE_GPU != 1 ]]; then
  record SKIP kvcached:cuda_pool "no GPU: $GPU_REASON"
  record SKIP kvcached:bad_device "no GPU: $GPU_REASON"
elif ! have kvcached || ! have kvcachectl; then
  record FAIL kvcached:cuda_pool "kvcached or kvcachectl missing"
else
  kvcached_config cuda:0 50151 > "$DETAIL/kvcached_cuda.textproto"
  run_step kvcached:cuda_pool 20 kvcached_cuda_pool bash -c '
    "$0/kvcached" --config="$1/kvcached_cuda.textproto" --metrics_listen=off \
      > "$1/kvcached_cuda.server.log" 2>&1 &
    pid=$!
    for _ in $(seq 50); do
      grep -q "kvcached listening on" "$1/kvcached_cuda.server.log" && break
      kill -0 $pid 2> /dev/null || break
      sleep 0.2
    done
    cat "$1/kvcached_cuda.server.log"
    if ! grep -q "kvcached listening on" "$1/kvcached_cuda.server.log"; then
      kill $pid 2> /dev/null
      echo "kvcached did not start"
      exit 1
    fi
    "$0/kvcachectl" --target=127.0.0.1:50151 pools
    rc=$?
    kill -TERM $pid
    wait $pid
    stop=$?
    tail -3 "$1/kvcached_cuda.server.log"
    echo "kvcachectl exit $rc, kvcached exit $stop"
    [[ $rc == 0 && $stop == 0 ]] && grep -q "cuda:0" "$1/kvcached_cuda.server.log"' "$BIN" "$DETAIL"
  judge kvcached:cuda_pool "started with a cuda:0 pool, kvcachectl pools answered, stopped cleanly"
  kvcached_config cuda:7 50152 > "$DETAIL/kvcached_bad.textproto"
  run_step kvcached:bad_device 15 kvcached_bad_device bash -c '
    "$0/kvcached" --config="$1/kvcached_bad.textproto" --metrics_listen=off
    rc=$?
    echo "kvcached exit $rc"
    [[ $rc != 0 && $rc != 124 ]]' "$BIN" "$DETAIL"
  if [[ $RC == 0 ]] && ! grep -q "gpu-llama3-8b" "$DETAIL/kvcached_bad_device.log"; then
    RC=1  # it exited, but its message does not name the pool
  fi
  judge kvcached:bad_device "exited at once: $(grep -m1 -iE "error|gpu-llama3-8b" "$DETAIL/kvcached_bad_device.log" | cut -c1-160)"
fi

# ---- steps 7 and 8: compute-sanitizer over the CUDA kernel checks
sanitizer_unsupported() {
  grep -qE "Device not supported|not supported on this (platform|device)|Unable to find injection" \
    "$DETAIL/$1.log"
}
if [[ $HAVE_GPU != 1 ]]; then
  record SKIP memcheck "no GPU: $GPU_REASON"
  record SKIP racecheck "no GPU: $GPU_REASON"
elif [[ -z "$SANITIZER" ]]; then
  record SKIP memcheck "compute-sanitizer not found (PATH, /usr/local/cuda*/bin)"
  record SKIP racecheck "compute-sanitizer not found (PATH, /usr/local/cuda*/bin)"
else
  run_step memcheck 45 memcheck "$SANITIZER" --tool memcheck --error-exitcode 97 \
    --print-limit 20 "$BIN/kvc_kernel_checks" --backends cuda --require-cuda
  if [[ $RC != 0 ]] && sanitizer_unsupported memcheck; then
    record SKIP memcheck "compute-sanitizer refused this machine: $(grep -m1 -E "not supported|injection" "$DETAIL/memcheck.log")" "$SECS"
  else
    judge memcheck "$(grep -m1 "ERROR SUMMARY" "$DETAIL/memcheck.log") over every CUDA check"
  fi
  run_step racecheck 45 racecheck bash -c '
    rc=0
    for f in Decode SnapKv Select; do
      echo "== --filter $f"
      "$0" --tool racecheck --error-exitcode 97 --print-limit 20 "$1" --backends cuda \
        --require-cuda --filter "$f" || rc=$?
    done
    exit $rc' "$SANITIZER" "$BIN/kvc_kernel_checks"
  if [[ $RC != 0 ]] && sanitizer_unsupported racecheck; then
    record SKIP racecheck "compute-sanitizer refused this machine: $(grep -m1 -E "not supported|injection" "$DETAIL/racecheck.log")" "$SECS"
  else
    judge racecheck "$(grep -c "ERROR SUMMARY: 0 errors" "$DETAIL/racecheck.log")/3 filtered runs clean (Decode, SnapKv, Select)"
  fi
fi
finish
