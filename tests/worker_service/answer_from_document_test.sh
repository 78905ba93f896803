#!/usr/bin/env bash
# End to end, as a user runs it: kvcached on loopback, SmolLM2-135M in kvc-worker with its KV
# cache in kvcached, compressed there (SnapKV budget 256 + INT4), must still answer a pass
# key planted in ~2,200 tokens of Persuasion, from at least 20x less KV memory than f16.
# Skips (exit 77) when the model or the text is missing.
# usage: answer_from_document_test.sh KVCACHED KVC_WORKER REPO_ROOT
set -euo pipefail
KVCACHED=$1 WORKER=$2 ROOT=$3
. "$ROOT/tests/testing/worker_assets.sh"
require_worker_assets "$ROOT"
. "$ROOT/tests/testing/start_kvcached.sh"
start_kvcached "$KVCACHED"
doc=$(mktemp)
out=$(mktemp)
trap 'kill -9 $KVC_PID 2>/dev/null || true; rm -f "$KVC_LOG" "$doc" "$out"' EXIT
python3 - "$TEXT" "$doc" <<'PY'
import sys
text = open(sys.argv[1], encoding="utf-8").read()[3000:12000]
cut = text.index("\n\n", len(text) // 3)
text = text[:cut] + "\n\nThe pass key is 68142. Remember it. 68142 is the pass key.\n\n" + text[cut:]
open(sys.argv[2], "w", encoding="utf-8").write(text)
PY
"$WORKER" generate --kv=kvcached --target="$KVC_TARGET" --model="$MODEL" --prompt-file "$doc" \
  --question "What is the pass key? Answer with the number only." --max-new-tokens 12 \
  --policy snapkv=256 --storage int4 >"$out" 2>"$out.err" || { cat "$out.err"; exit 1; }
cat "$out" "$out.err"
grep -q 68142 "$out" || { echo "FAIL: the answer does not contain the pass key"; exit 1; }
ratio=$(sed -n 's/.*: \([0-9.]*\)x smaller.*/\1/p' "$out.err")
python3 -c "import sys; r=float('$ratio'); sys.exit(0 if r >= 20 else 1)" ||
  { echo "FAIL: only ${ratio}x smaller than f16"; exit 1; }
rm -f "$out.err"
echo "answer_from_document_test: OK (${ratio}x smaller than f16)"
