#!/usr/bin/env bash
# GPU checks for kernels/: builds ONLY kernels/ (standalone; needs cmake, a C++17 compiler
# and nvcc, no gRPC/GoogleTest/Google Benchmark), then runs every kernel check (spec, CPU
# and CUDA backends against the reference) and the benchmarks, and writes logs and JSON
# into OUTDIR. Takes a few minutes on a GPU box; also runs on a machine without a GPU, where
# the CUDA checks and benchmarks report SKIP.
#
#   tests/gpu/run_gpu_checks.sh OUTDIR
#
# Environment: KVC_CUDA_ARCH (default 90), KVC_GPU_BUILD_DIR (default build-gpu),
# KVC_GPU_JOBS (default nproc), KVC_REQUIRE_CUDA=1|0 (default: 1 when nvidia-smi lists a
# GPU, so that a broken CUDA setup fails instead of skipping).
# Exit status: 0 when nothing failed; 1 when a check failed; 2 when the build failed.
set -uo pipefail

if [[ $# -ne 1 ]]; then
  echo "usage: $0 OUTDIR" >&2
  exit 64
fi
mkdir -p "$1"
OUT=$(cd "$1" && pwd)
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BUILD=${KVC_GPU_BUILD_DIR:-$ROOT/build-gpu}
JOBS=${KVC_GPU_JOBS:-$(nproc)}
ARCH=${KVC_CUDA_ARCH:-90}
START=$(date +%s)

log() { echo "[run_gpu_checks $(($(date +%s) - START))s] $*" | tee -a "$OUT/summary.txt"; }

: > "$OUT/summary.txt"
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "commit: $(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)"
  uname -a
  nproc
  nvidia-smi 2>&1 || echo "nvidia-smi: not available"
  nvcc --version 2>&1 || echo "nvcc: not on PATH"
  cmake --version | head -1
  ${CXX:-c++} --version | head -1
} > "$OUT/environment.txt" 2>&1

REQUIRE_CUDA=${KVC_REQUIRE_CUDA:-}
if [[ -z "$REQUIRE_CUDA" ]]; then
  if nvidia-smi -L 2>/dev/null | grep -q "GPU"; then REQUIRE_CUDA=1; else REQUIRE_CUDA=0; fi
fi
log "root $ROOT, build $BUILD, arch $ARCH, jobs $JOBS, require_cuda $REQUIRE_CUDA"

GEN=()
if command -v ninja > /dev/null; then GEN=(-G Ninja); fi
if ! cmake -S "$ROOT/kernels" -B "$BUILD" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CUDA_ARCHITECTURES="$ARCH" -DKVC_ENABLE_CUDA=ON > "$OUT/configure.log" 2>&1; then
  log "FAILED: configure (see configure.log)"
  exit 2
fi
grep -E "kvcache: (CUDA|nvcc)" "$OUT/configure.log" | tee -a "$OUT/summary.txt"
if ! cmake --build "$BUILD" -j "$JOBS" --target kvc_kernel_checks kvc_kernels_bench > "$OUT/build.log" 2>&1; then
  log "FAILED: build (see build.log)"
  tail -30 "$OUT/build.log"
  exit 2
fi
log "built"

CHECK_ARGS=(--backends spec,cpu,cuda --json "$OUT/checks.json")
if [[ "$REQUIRE_CUDA" == 1 ]]; then CHECK_ARGS+=(--require-cuda); fi
timeout 300 "$BUILD/tests/kernels/kvc_kernel_checks" "${CHECK_ARGS[@]}" > "$OUT/checks.log" 2>&1
RC_CHECKS=$?
grep -E "^(FAIL|SKIP)|passed," "$OUT/checks.log" | tee -a "$OUT/summary.txt"
log "checks exit $RC_CHECKS"

# The opt-in fast decode kernel (KVC_CUDA_DECODE=fast): checked and measured beside the
# default one so that one GPU run decides whether it can become the default.
KVC_CUDA_DECODE=fast timeout 120 "$BUILD/tests/kernels/kvc_kernel_checks" --backends cuda \
  --filter Decode --json "$OUT/checks_fast_decode.json" > "$OUT/checks_fast_decode.log" 2>&1
RC_FAST=$?
KVC_CUDA_DECODE=fast timeout 120 "$BUILD/tests/kernels/kvc_kernel_checks" --backends cuda \
  --filter Pipeline >> "$OUT/checks_fast_decode.log" 2>&1
RC_FAST=$((RC_FAST | $?))
grep -E "^(PASS|FAIL|SKIP)" "$OUT/checks_fast_decode.log" | sed 's/^/fast decode: /' | tee -a "$OUT/summary.txt"
log "fast decode checks exit $RC_FAST (informational: the default kernel is the general one)"

timeout 240 "$BUILD/tests/kernels/bench/kvc_kernels_bench" --backend cuda --large \
  --json "$OUT/bench_cuda.json" > "$OUT/bench_cuda.log" 2>&1
RC_BENCH_CUDA=$?
cat "$OUT/bench_cuda.log" >> "$OUT/summary.txt"
log "cuda bench exit $RC_BENCH_CUDA"

KVC_CUDA_DECODE=fast timeout 120 "$BUILD/tests/kernels/bench/kvc_kernels_bench" --backend cuda --large \
  --filter decode --json "$OUT/bench_cuda_fast_decode.json" > "$OUT/bench_cuda_fast_decode.log" 2>&1
RC_BENCH_FAST=$?
sed 's/^/fast decode: /' "$OUT/bench_cuda_fast_decode.log" >> "$OUT/summary.txt"
log "cuda fast-decode bench exit $RC_BENCH_FAST"

timeout 120 "$BUILD/tests/kernels/bench/kvc_kernels_bench" --backend cpu --threads "$(nproc)" --quick \
  --json "$OUT/bench_cpu.json" > "$OUT/bench_cpu.log" 2>&1
RC_BENCH_CPU=$?
log "cpu bench ($(nproc) threads) exit $RC_BENCH_CPU"

if [[ $RC_CHECKS -ne 0 || $RC_BENCH_CUDA -ne 0 || $RC_BENCH_CPU -ne 0 ]]; then
  log "RESULT: FAIL"
  exit 1
fi
log "RESULT: PASS"
