#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz (the fuzz preset: clang 14, ASan + UBSan, in
# build-fuzz/) and runs each one for SECONDS (default 60) on a fresh copy of its seed corpus,
# one process each, JOBS (default: the number of cores) at a time, so each still has a core
# of its own for its whole time. Exit 1 on any finding (crash, abort, sanitizer
# report, leak, timeout, out-of-memory): the input libFuzzer saved is named in the output
# ("FINDING ... input: PATH"); rerun it with build-fuzz/tests/fuzz/<target> PATH.
#
#   scripts/run_fuzzers.sh [SECONDS]
#   FUZZERS="codec_fuzzer" scripts/run_fuzzers.sh 600    # a subset
#
# Each run's log, grown corpus and saved inputs stay in build-fuzz/fuzz-runs/<target>/.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
JOBS=${JOBS:-$(nproc)}
targets=${FUZZERS:-request_fuzzer op_sequence_fuzzer codec_fuzzer}

cmake --preset fuzz >/dev/null
cmake --build --preset fuzz -j "$JOBS"

# As the asan test preset: a leak is a finding (gRPC's OpenSSL objects freed on its own
# threads at exit are suppressed there and here); UBSan stops at the first report.
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
export LSAN_OPTIONS=suppressions=$PWD/tests/lsan.supp:print_suppressions=0
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1

# fuzz_one TARGET: one fuzzer's run; its log and exit status stay in its work directory.
fuzz_one() {
  local t=$1 work=build-fuzz/fuzz-runs/$1 rc=0
  local args=(-max_total_time="$seconds" -timeout=30 -print_final_stats=1
              -artifact_prefix="$work/artifacts/")
  if [ -f tests/fuzz/"$t".dict ]; then args+=(-dict=tests/fuzz/"$t".dict); fi
  # Every 4 bytes or so are one model step, and each step checks every byte it fetches:
  # 1 KiB (a few hundred steps) keeps runs at tens per second under ASan.
  if [ "$t" = op_sequence_fuzzer ]; then args+=(-max_len=1024); fi
  # gRPC's sync server starts and ends its threads as load changes. libFuzzer's leak check
  # after an input, racing a thread that is exiting, reported everything that thread owned
  # (23 KB in 14 allocations, __cxa_thread_atexit_impl's record among them) once in 1.5e5
  # runs; the input alone runs clean. So request_fuzzer is checked for leaks when the
  # process exits (LeakSanitizer, detect_leaks=1 above) and for blocks after every input.
  if [ "$t" = request_fuzzer ]; then args+=(-detect_leaks=0); fi
  build-fuzz/tests/fuzz/"$t" "${args[@]}" "$work/corpus" >"$work/log" 2>&1 || rc=$?
  echo "$rc" >"$work/rc"
}

for t in $targets; do
  work=build-fuzz/fuzz-runs/$t
  rm -rf "$work"
  mkdir -p "$work/corpus" "$work/artifacts"
  cp tests/fuzz/corpus/"$t"/* "$work/corpus/"
  printf -- '--> %s for %ss\n' "$t" "$seconds"
  fuzz_one "$t" &
  while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n || true; done
done
wait

failed=0
for t in $targets; do
  work=build-fuzz/fuzz-runs/$t
  rc=$(cat "$work/rc" 2>/dev/null || echo 1)
  printf '\n--> %s\n' "$t"
  # The last status line (executions, coverage, corpus) and the final counters. -a: the
  # server's log lines quote fuzzed bytes, so grep would take the log for binary.
  grep -aE '^#[0-9]+' "$work/log" | tail -1 || true
  grep -aE '^stat::(number_of_executed_units|average_exec_per_sec|peak_rss_mb)' "$work/log" || true
  if [ "$rc" -ne 0 ]; then
    failed=1
    tail -n 60 "$work/log"
    input=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$work/log" | tail -1)
    echo "FINDING in $t (exit $rc); input: ${input:-none saved}; log: $work/log"
  fi
done
exit "$failed"
