#!/usr/bin/env bash
# The pass-key harness with every policy's cache in kvcached (kvc-worker passkey
# --kv=kvcached), on two ~512-token cases of Persuasion: the full f16 cache must name both
# keys; StreamingLLM 4+60 (the needle evicted) must lose them by far in log-probability;
# SnapKV 128 + INT4 must hold at least 8x fewer bytes than the full cache and keep more of
# the answer than StreamingLLM; Expected Attention 128 + INT4 (query-agnostic: the context is
# compressed before the question is prefilled; needs kvcached's ExpectedAttentionSpec) must
# hold at least 8x fewer bytes and see the context alone; every sequence must be released.
# Skips (exit 77) when the model or the text is missing.
# usage: passkey_service_test.sh KVCACHED KVC_WORKER REPO_ROOT
set -euo pipefail
KVCACHED=$1 WORKER=$2 ROOT=$3
. "$ROOT/tests/testing/worker_assets.sh"
require_worker_assets "$ROOT"
. "$ROOT/tests/testing/start_kvcached.sh"
start_kvcached "$KVCACHED" --capacity=256MiB
json=$(mktemp)
trap 'kill -9 $KVC_PID 2>/dev/null || true; rm -f "$KVC_LOG" "$json"' EXIT
"$WORKER" passkey --kv=kvcached --target="$KVC_TARGET" --model="$MODEL" --haystack-file "$TEXT" \
  --lengths 512 --depths 0.2,0.5 --seed 1234 \
  --policies full,snapkv=128:int4,streaming=4+60,expattn=128:int4 --json "$json"
python3 - "$json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
by = {}
for s in d["scores"]:
    by.setdefault(s["policy"], []).append(s)
fails = []
def check(ok, what):
    if not ok:
        fails.append(what)
full, snap, stream = by["full"], by["snapkv=128:int4"], by["streaming=4+60"]
for f, e in zip(full, by["expattn=128:int4"]):
    tag = "depth %.1f" % f["depth"]
    check(e["kv_bytes"] * 8 < f["kv_bytes"], tag + ": Expected Attention 128 + INT4 >= 8x smaller")
    check(e["prompt_tokens"] == e["context_tokens"] < f["prompt_tokens"],
          tag + ": Expected Attention compressed the context alone")
    print("%s: Expected Attention 128 + INT4: log p %.2f (full %.2f, StreamingLLM 4+60 and "
          "SnapKV 128 in the table above)" % (tag, e["answer_logprob"], f["answer_logprob"]))
for f, c, w in zip(full, snap, stream):
    tag = "depth %.1f" % f["depth"]
    check(f["teacher_forced_match"] and f["generated_match"], tag + ": full cache names the key")
    check(f["answer_logprob"] > -3, tag + ": full-cache log p > -3")
    check(abs(f["kv_bytes"] / f["dense_f16_bytes"] - 1) < 0.1, tag + ": full f16 ~ dense f16 bytes")
    check(w["answer_logprob"] < f["answer_logprob"] - 8, tag + ": StreamingLLM loses the needle")
    check(c["answer_logprob"] > w["answer_logprob"] + 5, tag + ": SnapKV keeps more than StreamingLLM")
    check(c["kv_bytes"] * 8 < f["kv_bytes"], tag + ": SnapKV 128 + INT4 >= 8x smaller")
    check(c["prompt_tokens"] == f["prompt_tokens"] > 512, tag + ": the question is in the prompt")
check(d["pool_after"] == d["pool_before"], "every sequence released")
for f in fails:
    print("FAIL:", f)
sys.exit(1 if fails else 0)
PY
echo "passkey_service_test: OK"
