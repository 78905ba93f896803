#!/usr/bin/env bash
# CI check of the real-GPU scripts without a GPU (and without building a bundle, which takes
# minutes): both scripts parse (bash -n); run_service_gpu.sh's no-GPU path, fed the build's
# own binaries, exits 0 with every GPU step SKIP and its six output files; without a bundle
# it exits 0 and says how to make one; bad usage exits 64.
#   run_service_gpu_selftest.sh BUILD_DIR WORK_DIR
set -uo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
BUILD=$1
WORK=$2
rm -rf "$WORK" && mkdir -p "$WORK"
fail() {
  echo "SELFTEST FAIL: $*"
  exit 1
}

bash -n "$HERE/../../scripts/gpu_bundle.sh" || fail "scripts/gpu_bundle.sh does not parse"
bash -n "$HERE/run_service_gpu.sh" || fail "run_service_gpu.sh does not parse"

# The no-GPU path is forced even on a GPU machine (KVC_GPU_ASSUME_NO_GPU), so this stays quick.
KVC_GPU_ASSUME_NO_GPU=1 KVC_GPU_BUILD_DIR="$BUILD" bash "$HERE/run_service_gpu.sh" "$WORK/a" \
  > "$WORK/a.log" 2>&1 || fail "no-GPU run exited $? (log $WORK/a.log)"
S="$WORK/a/summary.txt"
for f in summary.txt environment.txt details.tar.gz gpu_bench.json longctx_demo.json; do
  [[ -s "$WORK/a/$f" ]] || fail "no-GPU run wrote no $f"
done
[[ $(find "$WORK/a" -type f | wc -l) -le 8 ]] || fail "more than the device tool's 8 files"
grep -q "^RESULT: PASS" "$S" || fail "no RESULT: PASS"
grep -q "^PASS bundle" "$S" || fail "build-dir binaries not found"
for step in kernel_checks cuda_ipc core:kv_store_test core:threaded_model_test service:service_test \
  service:operability_test memcheck racecheck; do
  grep -qE "^SKIP $step +no GPU: KVC_GPU_ASSUME_NO_GPU" "$S" || fail "step $step is not SKIP"
done
# The programs ran their own no-GPU path (SKIP), or passed where a GPU exists after all.
for step in longctx_demo gpu_bench; do
  grep -qE "^(SKIP|PASS) $step " "$S" || fail "$step neither skipped nor passed"
done
if grep -q "^SKIP longctx_demo" "$S"; then
  grep -q '"skipped": "no CUDA device' "$WORK/a/longctx_demo.json" || fail "demo JSON lacks skipped"
fi

# No bundle: SKIP with the recipe, exit 0.
KVC_GPU_ASSUME_NO_GPU=1 bash "$HERE/run_service_gpu.sh" "$WORK/b" "$WORK/no-such-bundle" \
  > "$WORK/b.log" 2>&1 || fail "no-bundle run exited $?"
grep -q "scripts/gpu_bundle.sh gpu-bundle" "$WORK/b.log" || fail "no-bundle run gives no recipe"
grep -q "^RESULT: PASS" "$WORK/b/summary.txt" || fail "no-bundle run did not pass"

bash "$HERE/run_service_gpu.sh" > /dev/null 2>&1
[[ $? == 64 ]] || fail "usage error did not exit 64"
echo "SELFTEST PASS"
cat "$S"
