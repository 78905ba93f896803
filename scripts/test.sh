#!/usr/bin/env bash
# The test command (what CI runs: .ci/run calls exactly this). On a fresh Debian 12 machine it
# installs what is missing, fetches the reference model, then runs these stages in order and
# prints each one's wall time:
#
#   checks      layering (check_deps.sh), formatting (format.sh --check), file sizes
#               (check_sizes.sh)
#   tidy        clang-tidy on the C++ files changed by the last commit (scripts/tidy.sh)
#   default     Release build (CUDA kernels too where nvcc exists) + every test with ctest
#               (under CI=true the default and cudasim builds are unity builds, as the
#               sanitizer builds always are)
#   python      the Python client (client/python[hf]: with torch and transformers, ~5.6 GB)
#               pip-installed into a fresh venv under build/python-venv (in the background from
#               the start: the stage waits for it), and pytest tests/python
#               against build/cachesvc/kvcached (and build/worker/kvc-worker, for the
#               transformers tests' token ids and answers)
#   vllm        kvcache.vllm (vLLM's KV connector) under vLLM's own scheduler on CPU: pytest
#               tests/vllm in build/vllm-venv (client/python[vllm] with vllm 0.33.0, ~9.5 GB),
#               made in the background like the python venv
#   cudasim     the core and service suites on a device pool: the cudasim preset builds the
#               CUDA backend on the host simulator (tests/kernels/cudasim) and runs every
#               pool-parametrized test with KVC_TEST_POOL_DEVICE=cuda:0 (<Test>@cuda_sim)
#   clang-tsa   clang 14 thread-safety analysis, compile only (scripts/tsa_check.sh)
#   asan        ASan + UBSan build (-O1, line tables, unity build) + every test
#   tsan        ThreadSanitizer build (-O1, line tables, unity build) + every test but the
#               three model_e2e scripts (kvc-worker answering through kvcached: minutes each
#               under TSan, and their threads are the worker's and service's, which other
#               tests cover there) and the model's forward-pass tests (label model_forward:
#               their threads are the kernels' pool, which attention_test covers there)
#   fuzz        clang 14 libFuzzer build (fuzz preset, unity build) + each fuzzer 60 s on its
#               seed corpus (scripts/run_fuzzers.sh; fails on any finding)
#
# A failing stage does not stop the later ones (one CI run reports everything); the exit
# status is 1 if any stage failed. Timings from a fresh clone are in CONTRIBUTING.md.
#
#   scripts/test.sh                  all of the above (CI)
#   scripts/test.sh --quick          checks + default + python + vllm, for local iterations
#   scripts/test.sh --quick --tsan   ... plus the named stages (--tidy --cudasim --tsa --asan
#                                    --tsan --fuzz)
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=${JOBS:-$(nproc)}
export JOBS

quick=0
extra=()
for arg in "$@"; do
  case "$arg" in
    --quick) quick=1 ;;
    --tidy | --cudasim | --tsa | --asan | --tsan | --fuzz) extra+=("${arg#--}") ;;
    *)
      echo "usage: scripts/test.sh [--quick [--tidy] [--cudasim] [--tsa] [--asan] [--tsan]" \
        "[--fuzz]]" >&2
      exit 64
      ;;
  esac
done
want() {  # want STAGE: is this stage part of this run?
  [ "$quick" = 0 ] && return 0
  local s
  for s in "${extra[@]}"; do [ "$s" = "$1" ] && return 0; done
  return 1
}

summary=()
failed=0
total_start=$SECONDS
# stage NAME COMMAND...: runs COMMAND, records its wall time and status, never exits.
stage() {
  local name=$1 start=$SECONDS rc=0
  shift
  printf '\n==> %s\n' "$name"
  "$@" || rc=$?
  local t=$((SECONDS - start)) result=ok
  if [ "$rc" -ne 0 ]; then result="FAILED (exit $rc)"; failed=1; fi
  summary+=("$(printf '  %-22s %3dm%02ds  %s' "$name" $((t / 60)) $((t % 60)) "$result")")
  return "$rc"
}
skip() { summary+=("$(printf '  %-22s %8s  skipped: %s' "$1" "" "$2")"); }

fetch_assets() {
  scripts/fetch_model.sh || return
  # Jane Austen's novels from Debian's r-cran-janeaustenr (apt-get download; no R). Tests
  # that need the text skip, saying so, when it cannot be had.
  if ! python3 scripts/worker/extract_corpus.py --no-bible >/dev/null; then
    { apt-get update -qq >/dev/null 2>&1 || sudo apt-get update -qq >/dev/null 2>&1; } || true
    python3 scripts/worker/extract_corpus.py --no-bible >/dev/null ||
      echo "WARNING: corpus extraction failed; the tests that read the novels will skip"
  fi
}
checks() { scripts/check_deps.sh && scripts/format.sh --check && scripts/check_sizes.sh; }
# Under CI=true every build is a unity build (each is made once, from a fresh clone: a quarter
# less compile time); at home the default and cudasim builds stay one file per unit, so a
# rebuild recompiles one file and a missing #include fails there (CMakeLists.txt).
unity=OFF
if [ "${CI:-}" = true ]; then unity=ON; fi
build() {
  local flags=()
  case "$1" in default | cudasim) flags=("-DKVC_UNITY_BUILD=$unity") ;; esac
  cmake --preset "$1" "${flags[@]}" >/dev/null && cmake --build --preset "$1" -j "$JOBS"
}
run_tests() { ctest --preset "$1" -j "$JOBS"; }
# build + ctest of one preset as two stages; the tests are skipped when the build failed.
build_and_test() {
  if stage "$1: build" build "$1"; then
    stage "$1: ctest" run_tests "$1" || true
  else
    skip "$1: ctest" "build failed"
  fi
}

# The Python client against the default build's kvcached, from a fresh venv each run (a stale
# one could hide a packaging bug; pip's cache keeps it quick). The venvs are made in the
# background while the default build compiles (installing torch and transformers is
# minutes of download and unpacking, little CPU); each Python stage waits for its venv and
# reports its time. No kvcached is a failure.
make_python_venv() {
  rm -rf build/python-venv && python3 -m venv build/python-venv &&
    build/python-venv/bin/pip install --quiet "./client/python[hf]" pytest
}
# tests/vllm: vLLM's own scheduler and connector API with kvcache.vllm, in a venv of its own
# (vLLM pins torch and transformers to other versions than the hf extra's newest). vLLM 0.33.0:
# 0.34.0 pins flashinfer-python==0.7.3, which PyPI does not have (the suite also passes
# against 0.34.0 installed without its dependencies, by hand: CONTRIBUTING.md).
make_vllm_venv() {
  rm -rf build/vllm-venv && python3 -m venv build/vllm-venv &&
    build/vllm-venv/bin/pip install --quiet "./client/python[vllm]" vllm==0.33.0 gguf pytest
}
declare -A venv_pid
start_venv() {  # start_venv NAME MAKER: MAKER in the background, logged to build/NAME.log
  mkdir -p build
  local start=$SECONDS
  (
    rc=0
    "$2" >"build/$1.log" 2>&1 || rc=$?
    echo "$rc $((SECONDS - start))" >"build/$1.rc"
  ) &
  venv_pid[$1]=$!
}
wait_venv() {  # wait_venv NAME WHAT: waits for NAME, prints its log and time; 1 if it failed
  wait "${venv_pid[$1]}" || true
  local rc took
  read -r rc took <"build/$1.rc" || { rc=1; took=0; }
  cat "build/$1.log"
  echo "$1: venv with $2 made in the background in ${took}s (exit $rc)"
  [ "$rc" = 0 ] || return 1
  if [ ! -x build/cachesvc/kvcached ]; then
    echo "$1: no build/cachesvc/kvcached to test against (did the default build fail?)" >&2
    return 1
  fi
}
python_client() {
  wait_venv python-venv "client/python[hf]" || return 1
  KVCACHED=build/cachesvc/kvcached build/python-venv/bin/python -m pytest -q \
    -p no:cacheprovider tests/python
}
vllm_connector() {
  wait_venv vllm-venv "client/python[vllm] and vllm 0.33.0" || return 1
  KVCACHED=build/cachesvc/kvcached build/vllm-venv/bin/python -m pytest -q \
    -p no:cacheprovider tests/vllm
}

stage "dependencies" scripts/install_deps.sh || exit 1
start_venv python-venv make_python_venv
start_venv vllm-venv make_vllm_venv
if [ -x scripts/fetch_model.sh ]; then stage "model and text" fetch_assets || true; fi
stage "layering + format + sizes" checks || true
if want tidy; then stage "clang-tidy (changed)" scripts/tidy.sh || true; fi
build_and_test default
stage "python" python_client || true
stage "vllm" vllm_connector || true
if want cudasim; then build_and_test cudasim; fi
if want tsa; then stage "clang-tsa (compile)" scripts/tsa_check.sh || true; fi
if want asan; then build_and_test asan; fi
if want tsan; then build_and_test tsan; fi
if want fuzz; then stage "fuzz: build + run" scripts/run_fuzzers.sh 60 || true; fi

t=$((SECONDS - total_start))
printf '\n==> summary (%dm%02ds)\n' $((t / 60)) $((t % 60))
printf '%s\n' "${summary[@]}"
exit "$failed"
