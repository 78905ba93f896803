#!/usr/bin/env bash
# kvc-loadgen's prefill on the same node as a kvcached with a local socket: its appends go
# through a staging region and its fetches read the mapped pool (the client chooses both by
# itself), every fetched byte is verified against what was appended, and its report says which
# paths it took. Then the same with --local_reads=false must say gRPC for both.
# usage: same_node_load_test.sh KVCACHED KVC_LOADGEN
set -euo pipefail
KVCACHED=$1 LOADGEN=$2
. "$(dirname "$0")/load_lib.sh"

write_config $((256 * 1024 * 1024))
# The socket by flag, as deploy/k8s/overlays/same-node passes it (one path per pod).
start_server "$KVCACHED" 127.0.0.1:0 --local_socket="$WORK/kvcached.sock" --local_socket_allow_same_uid
[ "$(stat -c %a "$WORK/kvcached.sock")" = 666 ] || fail "the socket is not connectable by other uids"

"$LOADGEN" --target="$SRV_TARGET" --sequences=6 --tokens=1024 --chunk_tokens=128 --threads=2 \
  >"$WORK/local.txt" || fail "kvc-loadgen (same node) exited $?"
cat "$WORK/local.txt"
grep -q "every byte fetched back and verified" "$WORK/local.txt" || fail "nothing verified"
grep -Eq "^  fetch path +shared-memory \($WORK/kvcached.sock\)$" "$WORK/local.txt" ||
  fail "the fetches did not read the mapped pool"
grep -Eq "^  append path +staged \(67108864-byte region\)$" "$WORK/local.txt" ||
  fail "the appends did not go through a staging region"

"$LOADGEN" --target="$SRV_TARGET" --sequences=2 --tokens=512 --local_reads=false \
  >"$WORK/grpc.txt" || fail "kvc-loadgen (gRPC) exited $?"
grep -Eq "^  fetch path +grpc \(local_reads is off\)$" "$WORK/grpc.txt" || fail "fetch path"
grep -Eq "^  append path +grpc \(local_reads is off\)$" "$WORK/grpc.txt" || fail "append path"
echo "same_node_load_test: OK"
