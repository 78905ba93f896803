#!/usr/bin/env bash
# Issue 5's quality grid measured THROUGH kvcached: starts its own kvcached on a free loopback
# port (4 GiB default pool, f16), then
#  1. pass-key retrieval with every policy's cache in a kvcached sequence
#     (kvc-worker passkey --kv=kvcached) on Emma and on the World English Bible, lengths x
#     depths, 17 policies: full f16; each storage format alone; SnapKV, H2O and StreamingLLM
#     at budgets 256/512/1024; SnapKV 1024 and 256 + INT4;
#  2. perplexity through kvcached on Persuasion with the full cache in each storage format
#     (f32 reference, f16, fp8, int8, int4 g32, int4 g64, nvfp4);
# then stops kvcached and writes the JSON, markdown and PNG plots
# (scripts/worker/plot_service_eval.py)
# under $EVAL_OUT (default .cache/eval/service). Full grid: 67.5 minutes on the busy 2-vCPU
# VM (load 4-7); EVAL_QUICK=1: ~4 minutes. Needs the top-level build (kvc-worker with the client).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BIN="${KVC_WORKER_BIN:-${ROOT}/build/worker/kvc-worker}"
KVCACHED="${KVCACHED_BIN:-${ROOT}/build/cachesvc/kvcached}"
OUT="${EVAL_OUT:-${ROOT}/.cache/eval/service}"
mkdir -p "${OUT}"
"${ROOT}/scripts/fetch_model.sh" >/dev/null
TEXT="$(python3 "${ROOT}/scripts/worker/extract_corpus.py")"
CORPUS="$(dirname "${TEXT}")"

POLICIES="full,full:fp8,full:int8,full:int4,full:int4g64,full:nvfp4"
POLICIES+=",snapkv=256,snapkv=512,snapkv=1024"
POLICIES+=",h2o=128+128,h2o=256+256,h2o=512+512"
POLICIES+=",streaming=4+252,streaming=4+508,streaming=4+1020"
POLICIES+=",snapkv=1024:int4,snapkv=256:int4"
FORMATS="f32 f16 fp8 int8 int4 int4g64 nvfp4"
if [ "${EVAL_QUICK:-0}" = 1 ]; then
  LENGTHS=512,1024 DEPTHS=0,0.5,1 KEYS=1 PPL_TOKENS=1024
else
  LENGTHS="${EVAL_LENGTHS:-1024,2048,4096,8000}" DEPTHS="${EVAL_DEPTHS:-0,0.25,0.5,0.75,1}"
  KEYS="${EVAL_KEYS:-1}" PPL_TOKENS="${EVAL_PPL_TOKENS:-8192}"
fi

. "${ROOT}/tests/testing/start_kvcached.sh"
start_kvcached "${KVCACHED}" --capacity=4GiB
trap stop_kvcached EXIT
echo "run_service_eval: kvcached at ${KVC_TARGET} (pid ${KVC_PID}); output in ${OUT}" >&2
start=$(date +%s)
declare -A SECONDS_OF

for hay in emma web_bible; do
  t0=$(date +%s)
  "${BIN}" passkey --kv=kvcached --target "${KVC_TARGET}" --haystack-file "${CORPUS}/${hay}.txt" \
    --label "${hay}" --lengths "${LENGTHS}" --depths "${DEPTHS}" --keys "${KEYS}" \
    --policies "${POLICIES}" --json "${OUT}/passkey_${hay}.json" \
    2> >(tee "${OUT}/passkey_${hay}.log" >&2) | tee "${OUT}/passkey_${hay}.md"
  SECONDS_OF[passkey_${hay}]=$(($(date +%s) - t0))
done

for fmt in ${FORMATS}; do
  t0=$(date +%s)
  "${BIN}" perplexity --kv=kvcached --target "${KVC_TARGET}" --text-file "${TEXT}" \
    --max-tokens "${PPL_TOKENS}" --chunk 128 --segment 512 --policies full --storage "${fmt}" \
    --json "${OUT}/ppl_${fmt}.json" 2> >(tr '\r' '\n' | grep -v '^\[perplexity\] kvcached' >&2)
  SECONDS_OF[ppl_${fmt}]=$(($(date +%s) - t0))
done

{
  echo "{\"date\": \"$(date -u +%Y-%m-%dT%H:%M:%SZ)\", \"quick\": ${EVAL_QUICK:-0},"
  echo " \"lengths\": \"${LENGTHS}\", \"depths\": \"${DEPTHS}\", \"keys\": ${KEYS},"
  echo " \"ppl_tokens\": ${PPL_TOKENS}, \"total_seconds\": $(($(date +%s) - start)),"
  echo " \"machine\": \"$(nproc) vCPUs, load $(cut -d' ' -f1-3 /proc/loadavg)\", \"seconds\": {"
  sep=""
  for k in "${!SECONDS_OF[@]}"; do printf '%s  "%s": %s' "$sep" "$k" "${SECONDS_OF[$k]}"; sep=$',\n'; done
  echo "}}"
} >"${OUT}/run.json"
echo "run_service_eval: done in $(($(date +%s) - start)) s" >&2
if /usr/bin/python3 -c "import matplotlib" 2>/dev/null; then
  /usr/bin/python3 "${ROOT}/scripts/worker/plot_service_eval.py" --dir "${OUT}" | tee "${OUT}/summary.md"
else
  echo "run_service_eval: no matplotlib (apt-get install python3-matplotlib) - skipping plots" >&2
fi
