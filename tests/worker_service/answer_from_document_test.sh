#!/usr/bin/env bash
# End to end, as a user runs it: kvcached on loopback with authentication on (a tokens file
# of salted hashes), SmolLM2-135M in kvc-worker with its KV cache in kvcached (its token
# from --token-file), compressed there (SnapKV budget 256 + INT4), must still answer a pass
# key planted in ~2,200 tokens of Persuasion, from at least 20x less KV memory than f16.
# Skips (exit 77) when the model or the text is missing.
# usage: answer_from_document_test.sh KVCACHED KVC_WORKER REPO_ROOT
set -euo pipefail
KVCACHED=$1 WORKER=$2 ROOT=$3
. "$ROOT/tests/testing/worker_assets.sh"
require_worker_assets "$ROOT"
. "$ROOT/tests/testing/start_kvcached.sh"
auth=$(mktemp -d)
# A token and its tokens-file line, hashed as the contract says: SHA-256(salt || token).
python3 - "$auth" <<'PY'
import hashlib, os, sys
d = sys.argv[1]
token = os.urandom(32).hex()
salt = os.urandom(16)
open(f"{d}/token", "w").write(token + "\n")
open(f"{d}/tokens", "w").write(f"reader tenant {salt.hex()} {hashlib.sha256(salt + token.encode()).hexdigest()}\n")
open(f"{d}/config.textproto", "w").write(f"""
pools {{ name: "default" capacity_bytes: 1073741824
        geometry {{ num_layers: 30 num_kv_heads: 3 num_query_heads: 9 head_dim: 64
                   rope {{ theta: 100000 style: ROPE_STYLE_NEOX }} }} }}
auth {{ tokens_file: "{d}/tokens" }}
""")
PY
start_kvcached "$KVCACHED" --config="$auth/config.textproto"
doc=$(mktemp)
out=$(mktemp)
trap 'kill -9 $KVC_PID 2>/dev/null || true; rm -rf "$KVC_LOG" "$doc" "$out" "$auth"' EXIT
python3 - "$TEXT" "$doc" <<'PY'
import sys
text = open(sys.argv[1], encoding="utf-8").read()[3000:12000]
cut = text.index("\n\n", len(text) // 3)
text = text[:cut] + "\n\nThe pass key is 68142. Remember it. 68142 is the pass key.\n\n" + text[cut:]
open(sys.argv[2], "w", encoding="utf-8").write(text)
PY
# Without the token the worker is refused.
if "$WORKER" generate --kv=kvcached --target="$KVC_TARGET" --model="$MODEL" --prompt "hi" \
    --max-new-tokens 1 >/dev/null 2>"$out.err"; then
  echo "FAIL: kvc-worker got in without a token"; exit 1
fi
grep -q UNAUTHENTICATED "$out.err" || { cat "$out.err"; echo "FAIL: not UNAUTHENTICATED"; exit 1; }
"$WORKER" generate --kv=kvcached --target="$KVC_TARGET" --token-file="$auth/token" \
  --model="$MODEL" --prompt-file "$doc" \
  --question "What is the pass key? Answer with the number only." --max-new-tokens 12 \
  --policy snapkv=256 --storage int4 >"$out" 2>"$out.err" || { cat "$out.err"; exit 1; }
cat "$out" "$out.err"
grep -q 68142 "$out" || { echo "FAIL: the answer does not contain the pass key"; exit 1; }
ratio=$(sed -n 's/.*: \([0-9.]*\)x smaller.*/\1/p' "$out.err")
python3 -c "import sys; r=float('$ratio'); sys.exit(0 if r >= 20 else 1)" ||
  { echo "FAIL: only ${ratio}x smaller than f16"; exit 1; }
rm -f "$out.err"
echo "answer_from_document_test: OK (${ratio}x smaller than f16)"
