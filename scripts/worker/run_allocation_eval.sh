#!/usr/bin/env bash
# Issue 19's budget-allocation grid through kvcached: pass-key retrieval on Emma and the World
# English Bible with SnapKV's budget spread uniformly, by score across each layer's kv heads
# (AdaKV, `adasnapkv`), and per layer (PyramidKV, `pyramidkv` / `adapyramidkv`), at the same
# kept tokens, with INT4 storage; and query-agnostic Expected Attention (`expattn` /
# `adaexpattn`, the same budgets: 4 sinks + a 32-token window included) compressing the context
# before the question is prefilled (SnapKV's window holds the question). Starts its own kvcached (4 GiB f16 pool) on a free loopback
# port; writes per-haystack JSON, markdown and logs under $EVAL_OUT
# (default .cache/eval/allocation). Knobs: EVAL_LENGTHS (1024,2048), EVAL_DEPTHS (9 depths),
# EVAL_KEYS (3 keys per cell: 2 haystacks x 9 x 3 = 54 cases per length), EVAL_POLICIES,
# EVAL_HAYSTACKS ("emma web_bible"; one of them to run a long grid in two sittings).
# Answers are scored within 32 greedy tokens (the model often restates the question first);
# --key-tokens also counts the pass key's digit tokens each cache holds. Summary, paired
# differences and plot: scripts/worker/summarize_allocation_eval.py $EVAL_OUT --plot F.png.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BIN="${KVC_WORKER_BIN:-${ROOT}/build/worker/kvc-worker}"
KVCACHED="${KVCACHED_BIN:-${ROOT}/build/cachesvc/kvcached}"
OUT="${EVAL_OUT:-${ROOT}/.cache/eval/allocation}"
mkdir -p "${OUT}"
"${ROOT}/scripts/fetch_model.sh" >/dev/null
TEXT="$(python3 "${ROOT}/scripts/worker/extract_corpus.py")"
CORPUS="$(dirname "${TEXT}")"

DEFAULT_POLICIES="full,snapkv=512:int4,adasnapkv=512:int4,snapkv=256:int4,adasnapkv=256:int4"
DEFAULT_POLICIES+=",pyramidkv=256:int4,adapyramidkv=256:int4,snapkv=128:int4,adasnapkv=128:int4"
DEFAULT_POLICIES+=",expattn=512:int4,adaexpattn=512:int4,expattn=256:int4,adaexpattn=256:int4"
DEFAULT_POLICIES+=",expattn=128:int4,adaexpattn=128:int4"
POLICIES="${EVAL_POLICIES:-${DEFAULT_POLICIES}}"
LENGTHS="${EVAL_LENGTHS:-1024,2048}"
DEPTHS="${EVAL_DEPTHS:-0,0.125,0.25,0.375,0.5,0.625,0.75,0.875,1}"
KEYS="${EVAL_KEYS:-3}"

. "${ROOT}/tests/testing/start_kvcached.sh"
start_kvcached "${KVCACHED}" --capacity=4GiB
trap stop_kvcached EXIT
echo "run_allocation_eval: kvcached at ${KVC_TARGET}; output in ${OUT}" >&2
start=$(date +%s)
for hay in ${EVAL_HAYSTACKS:-emma web_bible}; do
  "${BIN}" passkey --kv=kvcached --target "${KVC_TARGET}" --haystack-file "${CORPUS}/${hay}.txt" \
    --label "${hay}" --lengths "${LENGTHS}" --depths "${DEPTHS}" --keys "${KEYS}" \
    --answer-tokens 32 --key-tokens --policies "${POLICIES}" --json "${OUT}/passkey_${hay}.json" \
    2> >(tee "${OUT}/passkey_${hay}.log" >&2) | tee "${OUT}/passkey_${hay}.md"
done
echo "run_allocation_eval: done in $(($(date +%s) - start)) s (lengths ${LENGTHS}, depths" \
  "${DEPTHS}, keys ${KEYS}, load $(cut -d' ' -f1-3 /proc/loadavg))" | tee "${OUT}/run.txt" >&2
