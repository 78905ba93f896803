#!/usr/bin/env bash
# kvcachectl against a running kvcached: tables, --json, filters, unreachable target,
# usage errors, and a clean SIGTERM shutdown of the server.
# usage: kvcachectl_test.sh KVCACHED KVCACHECTL KVC_LOADGEN
set -euo pipefail
KVCACHED=$1 CTL=$2 LOADGEN=$3
. "$(dirname "$0")/../testing/start_kvcached.sh"
fail() { echo "FAIL: $*" >&2; exit 1; }

start_kvcached "$KVCACHED" --capacity=256MiB
"$LOADGEN" --target="$KVC_TARGET" --sequences=3 --tokens=100 --keep=2 --tenant=ctl-test >/dev/null

out=$("$CTL" --target="$KVC_TARGET" pools)
echo "$out"
grep -q '^POOL ' <<<"$out" || fail "pools: no header"
grep -Eq '^default +cpu +30 +3 +9 +64 +f16' <<<"$out" || fail "pools: default pool row"

out=$("$CTL" --target="$KVC_TARGET" sequences)
echo "$out"
[ "$(echo "$out" | grep -c 'ctl-test')" = 2 ] || fail "sequences: expected 2 rows"

json=$("$CTL" --target="$KVC_TARGET" --json sequences --tenant=ctl-test)
python3 - "$json" <<'PY' || fail "sequences --json"
import json, sys
d = json.loads(sys.argv[1])
seqs = d["sequences"]
assert len(seqs) == 2, seqs
for s in seqs:
    assert s["tenant"] == "ctl-test" and int(s["visible_tokens"]) == 100, s
    assert len(s["layer_tokens"]) == 30, s
PY
[ "$("$CTL" --target="$KVC_TARGET" --json sequences --tenant=nobody | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["sequences"]))')" = 0 ] \
  || fail "tenant filter"

# Pages: one sequence per page, the next through the token the first printed; together the two.
out=$("$CTL" --target="$KVC_TARGET" sequences --limit=1)
echo "$out"
token=$(sed -n 's/.*(1 of 2 sequences shown; the next page: --page_token=\([A-Za-z0-9_=-]*\))$/\1/p' <<<"$out")
[ -n "$token" ] || fail "sequences --limit=1: no next page token"
p1=$("$CTL" --target="$KVC_TARGET" --json sequences --limit=1 | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["sequences"][0]["sequence_id"])')
p2=$("$CTL" --target="$KVC_TARGET" --json sequences --limit=1 --page_token="$token" \
  | python3 -c 'import json,sys; d=json.load(sys.stdin); assert not d.get("next_page_token"), d; print(d["sequences"][0]["sequence_id"])')
all=$("$CTL" --target="$KVC_TARGET" --json sequences | python3 -c 'import json,sys; print(" ".join(s["sequence_id"] for s in json.load(sys.stdin)["sequences"]))')
[ "$p1 $p2" = "$all" ] || fail "sequences pages: '$p1 $p2' is not '$all'"
if err=$("$CTL" --target="$KVC_TARGET" sequences --page_token=garbage! 2>&1); then
  fail "sequences: a bad page token was accepted"
fi
grep -q "INVALID_ARGUMENT: page_token is not one this server gave" <<<"$err" \
  || fail "sequences: a bad page token is not refused clearly: $err"

out=$("$CTL" --target="$KVC_TARGET" stats)
echo "$out"
grep -Eq '^sequences +2$' <<<"$out" || fail "stats: sequences"
grep -Eq '^visible tokens +200$' <<<"$out" || fail "stats: visible tokens"
python3 -c 'import json,sys; d=json.load(sys.stdin); assert int(d["sequences"])==2 and int(d["used_bytes"])>0, d' \
  <<<"$("$CTL" --target="$KVC_TARGET" --json stats)" || fail "stats --json"
# The prefix cache's figures (nothing published here: zeros, and no hit rate before a lookup).
grep -Eq '^prefix entries +0$' <<<"$out" || fail "stats: prefix entries"
grep -Eq '^prefix cached +0 B$' <<<"$out" || fail "stats: prefix cached bytes"
grep -Eq '^prefix unreferenced +0 B$' <<<"$out" || fail "stats: prefix unreferenced bytes"
grep -Eq '^prefix lookups +0 \(0 hits, 0 missed an evicted prefix\)$' <<<"$out" || fail "stats: prefix lookups"
grep -Eq '^prefix hit rate +- \(0 of 0 tokens\)$' <<<"$out" || fail "stats: prefix hit rate"
grep -Eq '^prefix attached tokens +0$' <<<"$out" || fail "stats: prefix attached tokens"
grep -Eq '^prefix checksum misses +0$' <<<"$out" || fail "stats: prefix checksum misses"
grep -Eq '^prefix evicted entries +0$' <<<"$out" || fail "stats: prefix evicted entries"
grep -Eq '^pinned only by leases +0 B$' <<<"$out" || fail "stats: pinned only by leases"
"$CTL" --target="$KVC_TARGET" --json --pool=default stats | python3 -c '
import json, sys
p = json.load(sys.stdin)["prefix_cache"]
keys = {"lookups", "hits", "lookup_tokens", "hit_tokens", "attached_tokens", "checksum_misses",
        "published_entries", "evicted_entries", "entries", "cached_bytes", "unreferenced_bytes",
        "corrupt_reads", "evicted_misses"}
assert set(p) == keys, sorted(p)
assert all(int(v) == 0 for v in p.values()), p' || fail "stats --json: prefix_cache"

# leases / end-lease (the leases themselves: tests/integration/auth_test.cc; none here)
out=$("$CTL" --target="$KVC_TARGET" leases --tenant=ctl-test)
echo "$out"
grep -Eq '^LEASE +TENANT +SEQUENCE +POOL +BYTES +LEASE-ONLY' <<<"$out" || fail "leases: no header"
[ "$(echo "$out" | wc -l)" = 1 ] || fail "leases: expected no rows"
"$CTL" --target="$KVC_TARGET" --json leases | python3 -c '
import json, sys
assert json.load(sys.stdin) == {"leases": []}' || fail "leases --json"
set +e
"$CTL" --target="$KVC_TARGET" end-lease ctl-test l-nosuch 2>err.txt; rc=$?
set -e
[ $rc = 3 ] && grep -q "lease 'l-nosuch' does not exist" err.txt || fail "end-lease unknown: exit $rc"
set +e
"$CTL" --target="$KVC_TARGET" end-lease l-nosuch 2>err.txt; rc=$?
set -e
[ $rc = 1 ] || fail "end-lease without a tenant: exit $rc"

# sequence show / --sort / evict / drain
first=$("$CTL" --target="$KVC_TARGET" --json sequences --sort=id | python3 -c 'import json,sys; print(json.load(sys.stdin)["sequences"][0]["sequence_id"])')
"$CTL" --target="$KVC_TARGET" --json sequences --sort=id | python3 -c '
import json, sys
ids = [s["sequence_id"] for s in json.load(sys.stdin)["sequences"]]
assert len(ids) >= 2 and ids == sorted(ids), ids' || fail "sequences --sort=id: not sorted by id"
"$CTL" --target="$KVC_TARGET" --json sequences --sort=bytes | python3 -c '
import json, sys
b = [int(s.get("bytes", 0)) for s in json.load(sys.stdin)["sequences"]]
assert b == sorted(b, reverse=True), b' || fail "sequences --sort=bytes: not largest first"
if "$CTL" --target="$KVC_TARGET" sequences --sort=size 2>"${TMPDIR:-/tmp}/kvcachectl_sort.$$.err"; then
  fail "sequences --sort=size should be refused"
fi
grep -q "not one of created, tokens, bytes, id" "${TMPDIR:-/tmp}/kvcachectl_sort.$$.err" || fail "--sort error message"
out=$("$CTL" --target="$KVC_TARGET" sequence show "$first")
echo "$out"
grep -Eq "^layer tokens +100 in each of 30 layers$" <<<"$out" || fail "sequence show"
out=$("$CTL" --target="$KVC_TARGET" evict "$first")
grep -q "evicted $first: freed 630 blocks" <<<"$out" || fail "evict: $out"
set +e
"$CTL" --target="$KVC_TARGET" sequence show "$first" 2>err.txt; rc=$?
set -e
[ $rc = 3 ] && grep -q "not found" err.txt || fail "show after evict: exit $rc"
"$CTL" --target="$KVC_TARGET" drain | grep -q "draining: no new sequences accepted; 1 sequences held" || fail "drain"
set +e
"$LOADGEN" --target="$KVC_TARGET" --sequences=1 --tokens=10 >/dev/null 2>err.txt; rc=$?
set -e
[ $rc != 0 ] && grep -q "draining" err.txt || fail "create while draining must fail (rc $rc)"
"$CTL" --target="$KVC_TARGET" drain --resume | grep -q "accepting new sequences" || fail "drain --resume"
"$LOADGEN" --target="$KVC_TARGET" --sequences=1 --tokens=10 >/dev/null || fail "create after resume"

set +e
"$CTL" --target="$KVC_TARGET" --pool=nosuch stats 2>err.txt; rc=$?
set -e
[ $rc = 3 ] || fail "unknown pool: exit $rc"
grep -q "pool 'nosuch' not found" err.txt || fail "unknown pool message"

set +e
"$CTL" --target=127.0.0.1:1 pools 2>err.txt; rc=$?
set -e
[ $rc = 2 ] || fail "unreachable: exit $rc"
grep -q "cannot reach kvcached at 127.0.0.1:1" err.txt || fail "unreachable message"

set +e
"$CTL" --target="$KVC_TARGET" frobnicate 2>err.txt; rc=$?
set -e
[ $rc = 1 ] || fail "unknown command: exit $rc"
rm -f err.txt

kill -TERM $KVC_PID
for _ in $(seq 1 150); do kill -0 $KVC_PID 2>/dev/null || break; sleep 0.1; done
if kill -0 $KVC_PID 2>/dev/null; then fail "kvcached did not stop on SIGTERM"; fi
wait $KVC_PID || fail "kvcached exited non-zero after SIGTERM"
grep -q "kvcached stopped" "$KVC_LOG" || fail "no shutdown log line"
echo "kvcachectl_test: OK"
