#!/usr/bin/env bash
# A real kvcached process with a tokens file, driven the way an operator would: tokens made
# with `kvcachectl hash-token`, kvc-loadgen and kvcachectl with --token_file / $KVC_TOKEN,
# tenant-scoped views, admin-only commands, a token revoked by SIGHUP, audit lines in the
# log, and a non-loopback listener refused without TLS.
# usage: auth_process_test.sh KVCACHED KVCACHECTL KVC_LOADGEN
set -euo pipefail
KVCACHED=$1 CTL=$2 LOADGEN=$3
. "$(dirname "$0")/../testing/start_kvcached.sh"
fail() { echo "FAIL: $*" >&2; exit 1; }

dir=$PWD/auth_process_test.tmp
rm -rf "$dir" && mkdir -m 700 "$dir"

# Tokens: hash-token prints "token: <hex>" and the tokens-file line.
make_token() {  # TENANT ROLE NAME
  local out
  out=$("$CTL" hash-token --tenant="$1" --role="$2" --generate)
  echo "$out" | sed -n 's/^token: //p' >"$dir/$3.token"
  echo "$out" | grep -v '^token: ' >>"$dir/tokens"
}
make_token team-a tenant a
make_token team-b tenant b
make_token ops admin admin
[ "$(grep -c . "$dir/tokens")" = 3 ] || fail "tokens file"
grep -q "$(cat "$dir/a.token")" "$dir/tokens" && fail "the tokens file holds a token in the clear"

cat >"$dir/config.textproto" <<CFG
listen: "127.0.0.1:0"
pools { name: "default" capacity_bytes: 268435456
        geometry { num_layers: 30 num_kv_heads: 3 num_query_heads: 9 head_dim: 64 } }
auth { tokens_file: "$dir/tokens" reload_interval_seconds: 1 }
quotas { tenant: "team-b" max_sequences: 1 }
CFG

# Not on the network without TLS: refused at startup, with the reason.
if "$KVCACHED" --config="$dir/config.textproto" --listen=0.0.0.0:0 --metrics_listen=off \
    2>"$dir/refused.log"; then
  fail "kvcached listened on 0.0.0.0 without TLS"
fi
grep -q "insecure: true" "$dir/refused.log" || fail "refusal does not say how to opt out"

start_kvcached "$KVCACHED" --config="$dir/config.textproto"
grep -q "authentication tokens file" "$KVC_LOG" || fail "startup line does not say auth is on"
ctl() { "$CTL" --target="$KVC_TARGET" "$@"; }

# Without a token: refused (exit 3 = the server refused), with UNAUTHENTICATED.
if out=$(ctl pools 2>&1); then fail "pools without a token succeeded"; fi
grep -q UNAUTHENTICATED <<<"$out" || fail "no UNAUTHENTICATED: $out"

"$LOADGEN" --target="$KVC_TARGET" --token_file="$dir/a.token" --sequences=2 --tokens=64 \
  --keep=2 >/dev/null || fail "loadgen as team-a"
KVC_TOKEN=$(cat "$dir/b.token") "$LOADGEN" --target="$KVC_TARGET" --sequences=1 --tokens=32 \
  --keep=1 >/dev/null || fail "loadgen as team-b (token from \$KVC_TOKEN)"

# Each tenant sees its own sequences and statistics; the admin sees everyone's.
[ "$(ctl --token_file="$dir/a.token" --json sequences | python3 -c \
  'import json,sys; s=json.load(sys.stdin)["sequences"]; assert all(x["tenant"]=="team-a" for x in s); print(len(s))')" = 2 ] \
  || fail "team-a's listing"
[ "$(ctl --token_file="$dir/b.token" --json sequences | python3 -c \
  'import json,sys; print(len(json.load(sys.stdin)["sequences"]))')" = 1 ] || fail "team-b's listing"
[ "$(ctl --token_file="$dir/admin.token" --json sequences | python3 -c \
  'import json,sys; print(len(json.load(sys.stdin)["sequences"]))')" = 3 ] || fail "admin listing"
out=$(ctl --token_file="$dir/b.token" stats)
echo "$out"
grep -Eq '^tenant +team-b$' <<<"$out" || fail "team-b's stats are not scoped"
grep -Eq '^quota sequences +1$' <<<"$out" || fail "team-b's quota"
out=$(ctl --token_file="$dir/admin.token" tenants)
echo "$out"
grep -Eq '^team-a +2 ' <<<"$out" || fail "tenants: team-a"
grep -Eq '^team-b +1 .* 1 +unlimited +unlimited$' <<<"$out" || fail "tenants: team-b"
[ "$(ctl --token_file="$dir/a.token" tenants | grep -c team-)" = 1 ] || fail "team-a sees others"

# team-b's quota of one sequence: the next is refused and names the limit.
if out=$(KVC_TOKEN=$(cat "$dir/b.token") "$LOADGEN" --target="$KVC_TARGET" --sequences=1 \
    --tokens=16 2>&1); then fail "team-b passed its max_sequences"; fi
grep -q "max_sequences 1" <<<"$out" || fail "quota refusal: $out"

# Admin-only commands, and an admin acting on a tenant's sequence by naming the tenant.
id=$(ctl --token_file="$dir/a.token" --json sequences | python3 -c \
  'import json,sys; print(json.load(sys.stdin)["sequences"][0]["sequence_id"])')
if ctl --token_file="$dir/a.token" evict "$id" 2>/dev/null; then fail "a tenant evicted"; fi
if ctl --token_file="$dir/b.token" --tenant=team-a sequence show "$id" 2>/dev/null; then
  fail "team-b read team-a's sequence"
fi
if out=$(ctl --token_file="$dir/b.token" sequence show "$id" 2>&1); then
  fail "team-b read team-a's sequence by id"
fi
grep -q NOT_FOUND <<<"$out" || fail "team-a's sequence is not NOT_FOUND to team-b: $out"
ctl --token_file="$dir/admin.token" --tenant=team-a sequence show "$id" >/dev/null \
  || fail "admin cannot read team-a's sequence"
ctl --token_file="$dir/admin.token" --tenant=team-a evict "$id" | grep -q "evicted $id" \
  || fail "admin evict"
grep -q "audit: admin 'ops' (token) EvictSequence '$id' of tenant 'team-a'" "$KVC_LOG" \
  || fail "no audit line for the eviction"
grep -q "audit: refused EvictSequence" "$KVC_LOG" || fail "no audit line for the refusal"
# Leases: a tenant lists its own only and may not end any; the admin's EndLease is audited
# (no lease exists here: the refusals and the audit are what is checked).
ctl --token_file="$dir/a.token" leases >/dev/null || fail "team-a cannot list its leases"
if ctl --token_file="$dir/a.token" --tenant=team-b leases 2>/dev/null; then
  fail "team-a listed team-b's leases"
fi
if out=$(ctl --token_file="$dir/a.token" end-lease team-b l-x 2>&1); then
  fail "a tenant ended a lease"
fi
grep -q PERMISSION_DENIED <<<"$out" || fail "tenant end-lease: $out"
if out=$(ctl --token_file="$dir/admin.token" end-lease team-b l-x 2>&1); then
  fail "admin ended a lease that does not exist"
fi
grep -q NOT_FOUND <<<"$out" || fail "admin end-lease of an unknown lease: $out"
grep -q "audit: admin 'ops' (token) EndLease 'l-x' of tenant 'team-b'" "$KVC_LOG" \
  || fail "no audit line for EndLease"
grep -q "audit: refused EndLease" "$KVC_LOG" || fail "no audit line for the EndLease refusal"
grep -q "audit: authentication failed for peer" "$KVC_LOG" || fail "no audit line for auth"
for t in a b admin; do
  grep -q "$(cat "$dir/$t.token")" "$KVC_LOG" && fail "a token appears in the log"
done

# Revoke team-a's token: remove its line, SIGHUP; refused at once, others unaffected.
grep -v '^team-a ' "$dir/tokens" >"$dir/tokens.new" && mv "$dir/tokens.new" "$dir/tokens"
kill -HUP "$KVC_PID"
for _ in $(seq 1 50); do
  grep -q "SIGHUP: credentials reloaded" "$KVC_LOG" && break
  sleep 0.1
done
grep -q "SIGHUP: credentials reloaded" "$KVC_LOG" || fail "SIGHUP did not reload"
if out=$(ctl --token_file="$dir/a.token" pools 2>&1); then fail "revoked token still works"; fi
grep -q UNAUTHENTICATED <<<"$out" || fail "revoked token: $out"
ctl --token_file="$dir/b.token" pools >/dev/null || fail "team-b lost access on reload"
kill -0 "$KVC_PID" || fail "kvcached exited on SIGHUP"

# SIGTERM still shuts down cleanly.
kill -TERM "$KVC_PID"
wait "$KVC_PID" || fail "kvcached exit status $?"
rm -rf "$dir"
echo "PASS"
