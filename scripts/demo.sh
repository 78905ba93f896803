#!/usr/bin/env bash
# The main job on the embedded default: builds kvcache, starts kvcached with its default
# host-memory pool (shaped like SmolLM2-135M) on 127.0.0.1, drives a prefill-style KV
# workload through it with the client library, shows the pools and sequences as an
# operator sees them with kvcachectl, and stops the server cleanly.
#
#   scripts/demo.sh [--sequences=N] [--tokens=N]     (flags go to kvc-loadgen)
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=${JOBS:-$(nproc)}
step() { printf '\n==> %s\n' "$*"; }

step "dependencies"
scripts/install_deps.sh
step "build (Release)"
cmake --preset default >/dev/null
cmake --build --preset default -j "$JOBS" --target kvcached kvcachectl kvc-loadgen

step "start kvcached (default host pool on 127.0.0.1)"
. tests/testing/start_kvcached.sh
start_kvcached build/cachesvc/kvcached
sed 's/^/    /' "$KVC_LOG"

step "workload: kvc-loadgen through the client library"
build/client/kvc-loadgen --target="$KVC_TARGET" --sequences=8 --tokens=4096 --keep=2 "$@"

step "kvcachectl pools"
build/client/kvcachectl --target="$KVC_TARGET" pools
step "kvcachectl sequences"
build/client/kvcachectl --target="$KVC_TARGET" sequences
step "kvcachectl stats"
build/client/kvcachectl --target="$KVC_TARGET" stats

step "stop kvcached (SIGTERM)"
kill -TERM "$KVC_PID"
wait "$KVC_PID"
tail -n 2 "$KVC_LOG" | sed 's/^/    /'
