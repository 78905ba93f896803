#!/usr/bin/env bash
# kvcachectl and kvc-loadgen against a cluster of three real kvcached (--shard=kc-0..2):
# `cluster`, per-shard `sequences`/`stats`/`pools` with totals, the {shards, total} JSON shape,
# evict routed by id, a shard killed with SIGKILL, and drain refused without --shard.
# usage: kvcachectl_cluster_test.sh KVCACHED KVCACHECTL KVC_LOADGEN
# KVC_TEST_KEEP_GOING=1 reports every failing assertion instead of stopping at the first.
set -euo pipefail
KVCACHED=$1 CTL=$2 LOADGEN=$3
FAILED=0
fail() {
  echo "FAIL: $*" >&2
  FAILED=1
  [ "${KVC_TEST_KEEP_GOING:-0}" = 1 ] || exit 1
}
WORK=$(mktemp -d)
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill -9 $p 2>/dev/null || true; done; rm -rf "$WORK"' EXIT

# Three shards on free loopback ports (as tests/testing/start_kvcached.sh starts one).
ADDR=()
for i in 0 1 2; do
  # Exists before the first poll below: the background shell opens it only when it runs,
  # and under load that can be after the poll (sed on a missing file ends the script).
  : >"$WORK/kc-$i.log"
  "$KVCACHED" --listen=127.0.0.1:0 --metrics_listen=127.0.0.1:0 --capacity=64MiB \
    --shard=kc-$i 2>"$WORK/kc-$i.log" &
  PIDS+=($!)
done
for i in 0 1 2; do
  for _ in $(seq 1 100); do
    a=$(sed -n 's/.*kvcached listening on \(127\.0\.0\.1:[0-9]*\).*/\1/p' "$WORK/kc-$i.log")
    [ -n "$a" ] && break
    sleep 0.1
  done
  [ -n "$a" ] || { cat "$WORK/kc-$i.log" >&2; echo "kc-$i did not start" >&2; exit 1; }
  ADDR+=("$a")
done
TARGETS="${ADDR[0]},${ADDR[1]},${ADDR[2]}"
C=("$CTL" --targets="$TARGETS" --timeout_ms=3000)

# cluster: 3 serving shards, distinct incarnations.
out=$("${C[@]}" cluster)
echo "$out"
for i in 0 1 2; do
  grep -Eq "^${ADDR[$i]} +kc-$i +[0-9a-f]{8} +serving +yes +1 +33\.3% " <<<"$out" \
    || fail "cluster: row of kc-$i at ${ADDR[$i]}"
done
[ "$(awk 'NR>1 && $1!="total" {print $3}' <<<"$out" | sort -u | wc -l)" = 3 ] \
  || fail "cluster: incarnations not distinct"
grep -Eq '^total +3 shards +3 serving ' <<<"$out" || fail "cluster: total row"

# Load through the cluster, keeping 6 of 9 sequences.
out=$("$LOADGEN" --targets="$TARGETS" --sequences=9 --tokens=64 --keep=6 --tenant=cluster-test)
echo "$out"
grep -q "9 created, every byte fetched back and verified, 3 released, 6 kept" <<<"$out" \
  || fail "loadgen: summary"
[ "$(awk '$1=="shard" && $2 ~ /^kc-[0-2]$/ {n+=$3} END {print n+0}' <<<"$out")" = 9 ] \
  || fail "loadgen: per-shard sequences do not add up to 9"
grep -Eo '^  kept +kc-[0-2]:[0-9a-f]{8}:[^ ]+' <<<"$out" | awk '{print $2}' | sort >"$WORK/kept"
[ "$(wc -l <"$WORK/kept")" = 6 ] || fail "loadgen: 6 kept ids"

# sequences: the kept ones across shards, the right shard column, total = --keep.
out=$("${C[@]}" sequences)
echo "$out"
awk 'NR>1 && $1 ~ /^kc-/ {print $2}' <<<"$out" | sort >"$WORK/listed"
cmp -s "$WORK/kept" "$WORK/listed" || fail "sequences: listed ids differ from the kept ones"
awk 'NR>1 && $1 ~ /^kc-/ { split($2, p, ":"); if (p[1] != $1) bad=1 } END {exit bad}' <<<"$out" \
  || fail "sequences: SHARD column is not the shard the id names"
grep -q '^total: 6 sequences on 3 of 3 shards$' <<<"$out" || fail "sequences: total line"
out=$("${C[@]}" sequences --limit=2)
[ "$(awk 'NR>1 && $1 ~ /^kc-/' <<<"$out" | wc -l)" = 2 ] || fail "sequences --limit=2: rows"
grep -q '^total: 6 sequences on 3 of 3 shards (2 shown; raise --limit)$' <<<"$out" \
  || fail "sequences --limit=2: overall limit"

# stats: the total row is the sum of the shards.
out=$("${C[@]}" stats)
echo "$out"
grep -Eq '^total +\(all\) +192\.0 MiB ' <<<"$out" || fail "stats: total capacity"
grep -Eq ' PREFIX_ENTRIES +PREFIX_CACHED +PREFIX_HIT_RATE *$' <<<"$out" || fail "stats: prefix columns"
grep -Eq '^total .* 0 +0 B +- \(0 of 0 tokens\) *$' <<<"$out" || fail "stats: total prefix cache"
# SEQUENCES follows the used/total BLOCKS column (sizes like "1.0 MiB" hold a space).
seqs() { awk -v who="$1" '$1 ~ who { for (i = 2; i < NF; ++i) if ($i ~ /^[0-9]+\/[0-9]+$/) s += $(i+1) } END {print s+0}'; }
[ "$(seqs '^total$' <<<"$out")" = 6 ] || fail "stats: total sequences"
[ "$(seqs '^kc-' <<<"$out")" = 6 ] || fail "stats: shard sequences"

# JSON: {"shards":[{"shard","address","result"}],"total":{...}} for every per-shard command,
# and the totals are the sums.
for cmd in pools stats sequences cluster; do
  "${C[@]}" --json $cmd >"$WORK/$cmd.json" || fail "$cmd --json: exit $?"
  python3 - "$WORK/$cmd.json" "$cmd" "$TARGETS" <<'PY' || fail "$cmd --json: shape or totals"
import json, sys
d = json.load(open(sys.argv[1]))
cmd, targets = sys.argv[2], sys.argv[3].split(",")
assert set(d) == {"shards", "total"}, d.keys()
assert sorted(s["address"] for s in d["shards"]) == sorted(targets), d["shards"]
for s in d["shards"]:
    assert s["shard"] in ("kc-0", "kc-1", "kc-2") and "result" in s and "error" not in s, s
    assert {"shard", "address", "result"} <= set(s), s
res = [s["result"] for s in d["shards"]]
t = d["total"]
if cmd == "stats":
    for k in ("capacity_bytes", "used_bytes", "free_bytes", "total_blocks", "used_blocks",
              "sequences", "visible_tokens", "stored_token_heads", "appended_bytes_total",
              "fetched_bytes_total"):
        assert int(t[k]) == sum(int(r[k]) for r in res), (k, t[k])
    assert int(t["sequences"]) == 6 and int(t["visible_tokens"]) == 6 * 64, t
    for k in ("entries", "cached_bytes", "unreferenced_bytes", "lookups", "hit_tokens",
              "lookup_tokens", "checksum_misses", "evicted_entries"):
        assert int(t["prefix_cache"][k]) == sum(int(r["prefix_cache"][k]) for r in res), k
elif cmd == "pools":
    (p,) = t["pools"]
    assert p["name"] == "default" and int(p["sequences"]) == 6, p
    assert int(p["capacity_bytes"]) == sum(int(r["pools"][0]["capacity_bytes"]) for r in res)
elif cmd == "sequences":
    assert int(t["total"]) == 6 and len(t["sequences"]) == 6, t
    assert sum(int(r["total"]) for r in res) == 6
    for s in d["shards"]:
        for q in s["result"]["sequences"]:
            assert q["sequence_id"].split(":")[0] == s["shard"], (s["shard"], q)
elif cmd == "cluster":
    assert t["shards"] == 3 and t["serving"] == 3, t
    assert len({s["incarnation"] for s in d["shards"]}) == 3, d["shards"]
    assert all(s["state"] == "serving" for s in d["shards"]), d["shards"]
PY
done

# evict and sequence show go to the shard the id names.
id=$(head -1 "$WORK/kept")
shard=${id%%:*}
"${C[@]}" sequence show "$id" | grep -Eq '^visible tokens +64$' || fail "sequence show by id"
"${C[@]}" evict "$id" | grep -q "^evicted $id: freed " || fail "evict by id"
out=$("${C[@]}" sequences)
grep -q "$id" <<<"$out" && fail "evict: $id still listed"
grep -q '^total: 5 sequences on 3 of 3 shards$' <<<"$out" || fail "evict: total after"

# drain across a cluster needs --shard (and drains nothing without it).
set +e
"${C[@]}" drain 2>"$WORK/err"; rc=$?
set -e
[ $rc = 1 ] && grep -q "needs --shard=NAME" "$WORK/err" || fail "drain without --shard: exit $rc"
[ "$("${C[@]}" cluster | grep -Ec '^127\.0\.0\.1:[0-9]+ .* serving ')" = 3 ] || fail "drain without --shard drained"
"${C[@]}" drain --shard=kc-2 | grep -q "^draining: no new sequences accepted" || fail "drain kc-2"
"${C[@]}" cluster | grep -Eq "^${ADDR[2]} +kc-2 .* draining " || fail "cluster: kc-2 draining"
"${C[@]}" drain --resume --shard=kc-2 | grep -q "^accepting new sequences" || fail "resume kc-2"

# kc-1 dies: cluster shows it not serving; pools exits non-zero and still prints the others.
kill -9 "${PIDS[1]}"
wait "${PIDS[1]}" 2>/dev/null || true
set +e
out=$("${C[@]}" cluster); rc=$?
set -e
echo "$out"
[ $rc = 2 ] || fail "cluster after kill: exit $rc"
grep -E "^${ADDR[1]} " <<<"$out" | grep -q ' serving ' && fail "cluster: dead kc-1 shown serving"
grep -Eq "^${ADDR[1]} .* unreachable " <<<"$out" || fail "cluster: dead kc-1 not unreachable"
grep -Eq '^total +3 shards +2 serving ' <<<"$out" || fail "cluster after kill: total row"
set +e
out=$("${C[@]}" pools 2>"$WORK/err"); rc=$?
set -e
echo "$out"
[ $rc = 2 ] || fail "pools after kill: exit $rc, expected 2"
grep -Eq '^kc-0 +default ' <<<"$out" && grep -Eq '^kc-2 +default ' <<<"$out" \
  || fail "pools after kill: the two live shards"
grep -q "at ${ADDR[1]} did not answer: UNAVAILABLE" <<<"$out" || fail "pools: the dead shard's error"
grep -q "1 of 3 shards did not answer" "$WORK/err" || fail "pools: stderr summary"
set +e
"${C[@]}" --json stats >"$WORK/stats.json"; rc=$?
set -e
[ $rc = 2 ] || fail "stats --json after kill: exit $rc"
python3 - "$WORK/stats.json" "${ADDR[1]}" <<'PY' || fail "stats --json after kill"
import json, sys
d = json.load(open(sys.argv[1]))
dead = [s for s in d["shards"] if s["address"] == sys.argv[2]]
assert len(dead) == 1 and "UNAVAILABLE" in dead[0]["error"] and "result" not in dead[0], dead
live = [s for s in d["shards"] if "result" in s]
assert len(live) == 2
assert int(d["total"]["sequences"]) == sum(int(s["result"]["sequences"]) for s in live)
PY

[ $FAILED = 0 ] || exit 1
echo "kvcachectl_cluster_test: OK"
