#!/usr/bin/env bash
# The installed client package works from a separate CMake project: install this build
# into a temporary prefix, build tests/client/package_consumer against it with
# find_package(kvcache), and run it against a real kvcached.
# usage: package_test.sh BUILD_DIR SOURCE_DIR KVCACHED [SANITIZE]
# SANITIZE: the -fsanitize= list the package was built with (its static libraries need the
# consumer to link the same sanitizer runtime).
set -euo pipefail
BUILD=$1 SRC=$2 KVCACHED=$3 SANITIZE=${4:-}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$BUILD" --prefix "$work/prefix" >/dev/null
test -f "$work/prefix/include/kvc/client/kv_cache_client.h"
if grep -rq 'pb.h' "$work/prefix/include/kvc/client"; then
  echo "FAIL: public client headers include generated protobuf headers" >&2
  exit 1
fi
flags=()
if [ -n "$SANITIZE" ]; then
  flags+=("-DCMAKE_CXX_FLAGS=-fsanitize=$SANITIZE" "-DCMAKE_EXE_LINKER_FLAGS=-fsanitize=$SANITIZE")
fi
if ! cmake -S "$SRC/tests/client/package_consumer" -B "$work/consumer" -G Ninja \
  -DCMAKE_PREFIX_PATH="$work/prefix" -DCMAKE_BUILD_TYPE=Release "${flags[@]}" >"$work/log" 2>&1 ||
  ! cmake --build "$work/consumer" >>"$work/log" 2>&1; then
  cat "$work/log" >&2
  echo "FAIL: the consumer project did not configure or build against the package" >&2
  exit 1
fi
. "$SRC/tests/testing/start_kvcached.sh"
start_kvcached "$KVCACHED" --capacity=64MiB
trap 'kill -9 $KVC_PID 2>/dev/null || true; rm -rf "$work" "$KVC_LOG"' EXIT
"$work/consumer/consumer" "$KVC_TARGET"
