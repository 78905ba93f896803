#!/usr/bin/env bash
# kvcached SIGKILLed under a mixed load of 32 clients: every client's call returns
# UNAVAILABLE (or DEADLINE_EXCEEDED) within a bound of the kill, nothing hangs, no call
# returned OK with wrong or truncated data; kvcached restarted on the same port starts empty
# and serves a new mixed run with no error but pool-full RESOURCE_EXHAUSTED.
# usage: kill_under_load_test.sh KVCACHED KVC_LOADGEN KVCACHECTL  (KVC_SANITIZE in sanitizer builds)
set -euo pipefail
KVCACHED=$1 LOADGEN=$2 CTL=$3
. "$(dirname "$0")/load_lib.sh"

CLIENTS=$(scaled 32)
SCALE=1
[ -n "${KVC_SANITIZE:-}" ] && SCALE=3
# From the kill until the last client's call returned. A killed server resets its
# connections: calls in flight fail at once, new ones fail fast (no wait-for-ready), retried
# reads back off 50 + 100 + 200 ms before giving up. 3 s is ten times that; the per-call
# deadline (10 s) is what bounds a call that saw no reset.
BOUND_MS=$((3000 * SCALE))
write_config $((CLIENTS * 4 * 1024 * 1024))
start_server "$KVCACHED" 127.0.0.1:0
TARGET=$SRV_TARGET
PID=$SRV_PID

"$LOADGEN" --target="$TARGET" --mode=mixed --clients="$CLIENTS" --duration=120s \
  --deadline=$((10 * SCALE))s --expect_server_loss --json="$WORK/lost.json" \
  >"$WORK/lost.out" 2>&1 &
LOADGEN_PID=$!
# Mid-run: wait until the pool holds data, then a little more so every client is busy.
for _ in $(seq 1 300); do
  used=$("$CTL" --target="$TARGET" --json stats | python3 -c \
    'import json,sys; print(int(json.load(sys.stdin).get("used_bytes", 0)))')
  [ "$used" -gt 0 ] && break
  sleep 0.1
done
[ "$used" -gt 0 ] || fail "the load never put data in the pool"
sleep $((2 * SCALE))
KILL_MS=$(date +%s%3N)
kill -9 "$PID"
# Nothing hangs: kvc-loadgen ends on its own well before its 120 s.
for _ in $(seq 1 $((300 * SCALE))); do
  kill -0 "$LOADGEN_PID" 2>/dev/null || break
  sleep 0.1
done
if kill -0 "$LOADGEN_PID" 2>/dev/null; then
  kill -9 "$LOADGEN_PID"
  cat "$WORK/lost.out" >&2
  fail "kvc-loadgen still running $((30 * SCALE)) s after the kill"
fi
rc=0
wait "$LOADGEN_PID" || rc=$?
cat "$WORK/lost.out"

python3 - "$WORK/lost.json" "$KILL_MS" "$BOUND_MS" "$CLIENTS" <<'PY' || fail "after the kill"
import json, sys
r = json.load(open(sys.argv[1]))
kill_ms, bound_ms, clients = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
loss = r["server_loss"]
drain_ms = loss["last_return_unix_ms"] - kill_ms
print(f"kill -> last client call returned: {drain_ms} ms (bound {bound_ms} ms); "
      f"{loss['clients_lost']} of {clients} clients saw the loss; codes {r['codes']}")
assert loss["clients_lost"] == clients, loss
assert drain_ms <= bound_ms, f"{drain_ms} ms from the kill to the last return > {bound_ms} ms"
assert r["fetches_checked"] > 0, "no Fetch was verified before the kill"
assert r["wrong_bytes"] == 0 and r["bad_results"] == 0 and r["missing_rows"] == 0, r["problems"]
assert r["unexpected_errors"] == 0, r["unexpected_examples"]
assert set(r["codes"]) <= {"OK", "RESOURCE_EXHAUSTED", "UNAVAILABLE", "DEADLINE_EXCEEDED"}, r["codes"]
assert r["codes"].get("UNAVAILABLE", 0) + r["codes"].get("DEADLINE_EXCEEDED", 0) >= clients
PY
[ "$rc" = 0 ] || fail "kvc-loadgen exited $rc"

# Restart on the same port: empty, and serving.
start_server "$KVCACHED" "$TARGET"
[ "$SRV_TARGET" = "$TARGET" ] || fail "restarted on $SRV_TARGET, not $TARGET"
"$CTL" --target="$TARGET" --json stats | python3 -c '
import json, sys
d = json.load(sys.stdin)
assert int(d.get("sequences", 0)) == 0 and int(d.get("used_bytes", 0)) == 0, d' \
  || fail "the restarted kvcached is not empty"
rc=0
"$LOADGEN" --target="$TARGET" --mode=mixed --clients="$CLIENTS" --duration=$((5 * SCALE))s \
  --json="$WORK/after.json" || rc=$?
[ "$rc" = 0 ] || fail "the run after the restart: kvc-loadgen exited $rc"
python3 - "$WORK/after.json" <<'PY' || fail "the run after the restart"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["fetches_checked"] > 0 and r["wrong_bytes"] == 0 and r["bad_results"] == 0, r["problems"]
assert r["unexpected_errors"] == 0 and set(r["codes"]) <= {"OK", "RESOURCE_EXHAUSTED"}, r["codes"]
assert r["resource_exhausted"]["pool_full"] == r["resource_exhausted"]["count"]
assert r["pool"]["back_to_baseline"] and r["pool"]["end_sequences"] == 0, r["pool"]
PY
echo "PASS"
