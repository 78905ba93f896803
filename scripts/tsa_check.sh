#!/usr/bin/env bash
# Clang thread-safety analysis: configures the clang-tsa preset (clang++-14, -Wthread-safety
# -Werror=thread-safety, no CUDA, no sanitizers; build-tsa/), compiles every translation unit
# outside kernels/ and tests/ (but those whose target waits on a program that links the
# kernels), plus the test files that take a lock, and links every library and program outside
# tests/ that does not need the kernels library (client, kvcachectl, kvc-loadgen, ...): a check that
# Debian's g++-built Abseil, gRPC and protobuf link with clang. Nothing is run. Exit 1 on the
# first ABSL_GUARDED_BY / ABSL_*_LOCKS_REQUIRED violation, with the compiler's message.
#
# Why not `cmake --build --preset clang-tsa`: kernels/ is C++-standard-library only by design
# (no Abseil), so it carries no annotation for the analysis to check, and a test that spawns
# kvcached would make ninja build it (and link every kernel test) for nothing. kernels/ does
# compile with clang 14 (the fuzz preset builds it).
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=${JOBS:-$(nproc)}
DIR=build-tsa
excluded='^(kernels|tests/kernels)/'

cmake --preset clang-tsa >/dev/null
# needs_kernels TARGET: does building TARGET build the kernels library? Also true of an
# object whose target waits on a program that links it (add_dependencies on kvcached makes
# the object order-depend on kvcached, so ninja would build the kernels for it).
needs_kernels() {
  # (no grep -q: an early exit would SIGPIPE ninja and fail the pipeline under pipefail)
  ninja -C "$DIR" -t inputs "$1" | grep 'kernels/libkvc_kernels\.a$' >/dev/null
}
# locks_in_test OBJECT: is OBJECT a test translation unit that takes a lock or names an annotated
# function? Test code that does neither has nothing for the analysis to check (every annotated
# function of the core takes a lock the tests cannot reach), so only these tests are compiled:
# it halves the stage's time.
locks_in_test() {
  local src
  src=$(sed -E 's|^(tests/.*)/CMakeFiles/[^/]+\.dir/(.*)\.o$|\1/\2|' <<<"$1")
  [ -f "$src" ] && grep -Eq 'Mutex|LOCKS_REQUIRED|GUARDED_BY|\.mu\(\)' "$src"
}
objects=()
while read -r t; do
  [[ "$t" =~ $excluded ]] && continue
  if [[ "$t" =~ ^tests/ ]] && ! locks_in_test "$t"; then continue; fi
  needs_kernels "$t" || objects+=("$t")
done < <(ninja -C "$DIR" -t targets all | sed -n 's/^\([^:]*\.o\): .*/\1/p')
links=()
while read -r t; do
  [[ "$t" =~ $excluded|^tests/ ]] && continue
  needs_kernels "$t" || links+=("$t")
done < <(ninja -C "$DIR" -t targets all |
  sed -n 's/^\([^:]*\): CXX_\(EXECUTABLE\|STATIC_LIBRARY\)_LINKER_.*/\1/p')
echo "tsa_check: compiling ${#objects[@]} translation units, linking ${#links[@]} targets" \
  "(clang++-14 -Wthread-safety -Werror=thread-safety)"
# -k 0: report every violation in one run, not just the first file's.
ninja -C "$DIR" -k 0 -j "$JOBS" "${objects[@]}" "${links[@]}"
echo "tsa_check: OK"
