#!/usr/bin/env bash
# End to end, as a user runs it: kvc-worker asks three questions about one document with its
# KV cache in kvcached, once prefilling every prompt and once with --reuse (the first request
# publishes the document, the others attach it from kvcached's prefix cache). The answers must
# be the same, the later requests must attach most of their prompt, and the pass key must be
# found. Skips (exit 77) when the model or the text is missing.
# With a query-agnostic POLICY (expattn=B, needs kvcached's ExpectedAttentionSpec) every
# request compresses the document before its question; with --reuse only the first does: it
# publishes the document's raw blocks (before compressing) and keeps the compressed document,
# which the later requests fork (all of the document, none of the question), and the answers
# must still match the plain run's (the pass key is not required: the compressed document may
# have lost it).
# usage: ask_reuse_test.sh KVCACHED KVC_WORKER REPO_ROOT [POLICY]
set -euo pipefail
KVCACHED=$1 WORKER=$2 ROOT=$3 POLICY=${4:-full}
. "$ROOT/tests/testing/worker_assets.sh"
require_worker_assets "$ROOT"
. "$ROOT/tests/testing/start_kvcached.sh"
work=$(mktemp -d)
cat >"$work/config.textproto" <<'CFG'
pools { name: "default" capacity_bytes: 268435456
        geometry { num_layers: 30 num_kv_heads: 3 num_query_heads: 9 head_dim: 64
                   rope { theta: 100000 style: ROPE_STYLE_NEOX } } }
CFG
start_kvcached "$KVCACHED" --config="$work/config.textproto"
trap 'kill -9 $KVC_PID 2>/dev/null || true; rm -rf "$KVC_LOG" "$work"' EXIT
python3 - "$TEXT" "$work/doc.txt" <<'PY'
import sys
text = open(sys.argv[1], encoding="utf-8").read()[3000:5000]
cut = text.index("\n\n", len(text) // 3)
text = text[:cut] + "\n\nThe pass key is 68142. Remember it. 68142 is the pass key.\n\n" + text[cut:]
open(sys.argv[2], "w", encoding="utf-8").write(text)
PY
printf '%s\n' "What is the pass key? Answer with the number only." \
  "Who is the baronet of Kellynch Hall?" "What is the pass key? Reply with just the digits." \
  >"$work/questions.txt"
for mode in plain reuse; do
  flag=""
  [ "$mode" = reuse ] && flag=--reuse
  "$WORKER" ask --target="$KVC_TARGET" --model="$MODEL" --prompt-file "$work/doc.txt" \
    --questions-file "$work/questions.txt" --max-new-tokens 16 --policy "$POLICY" $flag \
    --json "$work/$mode.json" >"$work/$mode.out" 2>&1 || { cat "$work/$mode.out"; exit 1; }
  cat "$work/$mode.out"
done
python3 - "$work/plain.json" "$work/reuse.json" "$POLICY" <<'PY'
import json, sys
plain = [json.loads(l) for l in open(sys.argv[1])]
reuse = [json.loads(l) for l in open(sys.argv[2])]
agnostic = "expattn=" in sys.argv[3]
assert len(plain) == len(reuse) == 3, (len(plain), len(reuse))
for p, r in zip(plain, reuse):
    assert p["answer"] == r["answer"], f"answers differ: {p['answer']!r} vs {r['answer']!r}"
    assert p["attached_tokens"] == 0, p
assert reuse[0]["attached_tokens"] == 0, reuse[0]
for p in plain:
    assert p["forked_tokens"] == 0, p
if agnostic:
    # The document's whole blocks only (published before the compression): not the question.
    doc = reuse[0]["published_tokens"]
    assert reuse[0]["prompt_tokens"] - 64 <= doc <= reuse[0]["prompt_tokens"] - 16, reuse[0]
    assert reuse[0]["forked_tokens"] == 0, reuse[0]
    # The later ones fork the kept compressed document: every document token, whole blocks
    # and the partial last one, and nothing of the question.
    for r in reuse[1:]:
        assert r["attached_tokens"] == 0, r
        assert doc <= r["forked_tokens"] < doc + 16, (r, doc)
        assert r["forked_tokens"] == reuse[1]["forked_tokens"], r
else:
    assert all(r["forked_tokens"] == 0 for r in reuse), reuse
    assert reuse[0]["published_tokens"] >= reuse[0]["prompt_tokens"] - 16, reuse[0]
    for r in reuse[1:]:
        assert r["attached_tokens"] >= r["prompt_tokens"] - 48, r
    assert "68142" in reuse[0]["answer"] and "68142" in reuse[2]["answer"], reuse
ttft = lambda rows: sum(r["ttft_s"] for r in rows[1:]) / (len(rows) - 1)
reused = lambda r: r["attached_tokens"] + r["forked_tokens"]
print(f"ask_reuse_test: OK (answers identical; questions 2-3 reuse "
      f"{reused(reuse[1])}/{reuse[1]['prompt_tokens']} and "
      f"{reused(reuse[2])}/{reuse[2]['prompt_tokens']} tokens; time to first token "
      f"{ttft(plain):.2f} s -> {ttft(reuse):.2f} s)")
PY
