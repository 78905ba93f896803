#!/usr/bin/env bash
# The test command: on a fresh Debian 12 machine, installs what is missing, fetches the
# reference model, checks layering and formatting, builds everything (Release; CUDA
# kernels too where nvcc exists) and runs every test with ctest.
#
#   scripts/test.sh            # default suite
#   scripts/test.sh --asan     # also build and run the whole suite under ASan + UBSan
#   scripts/test.sh --tsan     # also under ThreadSanitizer
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=${JOBS:-$(nproc)}

extra=()
for arg in "$@"; do
  case "$arg" in
    --asan) extra+=(asan) ;;
    --tsan) extra+=(tsan) ;;
    *) echo "usage: scripts/test.sh [--asan] [--tsan]" >&2; exit 64 ;;
  esac
done

step() { printf '\n==> %s\n' "$*"; }

step "dependencies"
scripts/install_deps.sh
if [ -x scripts/fetch_model.sh ]; then
  step "reference model and text"
  scripts/fetch_model.sh
  # Jane Austen's novels from Debian's r-cran-janeaustenr (apt-get download; no R). Tests
  # that need the text skip, saying so, when it cannot be had.
  if ! python3 scripts/worker/extract_corpus.py --no-bible >/dev/null; then
    { apt-get update -qq >/dev/null 2>&1 || sudo apt-get update -qq >/dev/null 2>&1; } || true
    python3 scripts/worker/extract_corpus.py --no-bible >/dev/null ||
      echo "WARNING: corpus extraction failed; the tests that read the novels will skip"
  fi
fi

step "layering and formatting"
scripts/check_deps.sh
scripts/format.sh --check

for preset in default "${extra[@]}"; do
  step "configure + build ($preset)"
  cmake --preset "$preset" >/dev/null
  cmake --build --preset "$preset" -j "$JOBS"
  step "test ($preset)"
  ctest --preset "$preset" -j "$JOBS"
done
