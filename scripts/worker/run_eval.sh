#!/usr/bin/env bash
# The worker's quality evaluation with LOCAL KV caches (the grid through kvcached is
# scripts/worker/run_service_eval.sh): perplexity on Persuasion (full cache within the 8K
# context vs window-only vs 4 sinks + window; the bounded policies also far past the context)
# and passkey retrieval on Emma. Writes JSON, PNG plots and a log under .cache/eval/. About 30
# minutes on 2 cores; EVAL_QUICK=1 runs a small version (~3 minutes).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BIN="${KVC_WORKER_BIN:-${ROOT}/build-w/kvc-worker}"
OUT="${EVAL_OUT:-${ROOT}/.cache/eval}"
mkdir -p "${OUT}"
"${ROOT}/scripts/fetch_model.sh" >/dev/null
TEXT="$(python3 "${ROOT}/scripts/worker/extract_corpus.py")"
HAYSTACK="$(dirname "${TEXT}")/emma.txt"

if [ "${EVAL_QUICK:-0}" = 1 ]; then
  SHORT=2048 LONG=4096 LENGTHS=512,1024 DEPTHS=0,0.5,1 WINDOW=256
else
  SHORT=8192 LONG=24576 LENGTHS=1024,2048,4096 DEPTHS=0,0.25,0.5,0.75,1 WINDOW=1024
fi
SINK_WINDOW=$((WINDOW - 4))

"${BIN}" perplexity --text-file "${TEXT}" --max-tokens "${SHORT}" --chunk 128 --segment 512 \
  --policies "full,window=${WINDOW},streaming=4+${SINK_WINDOW}" --json "${OUT}/ppl_8k.json"
"${BIN}" perplexity --text-file "${TEXT}" --max-tokens "${LONG}" --chunk 128 --segment 1024 \
  --policies "window=${WINDOW},streaming=4+${SINK_WINDOW}" --json "${OUT}/ppl_long.json"
"${BIN}" perplexity --text-file "${TEXT}" --max-tokens "${LONG}" --chunk 128 --segment 1024 \
  --policies "streaming-rerotate=4+${SINK_WINDOW}" --json "${OUT}/ppl_long_rerotate.json"
"${BIN}" passkey --haystack-file "${HAYSTACK}" --lengths "${LENGTHS}" --depths "${DEPTHS}" \
  --policies "full,window=$((WINDOW / 2)),streaming=4+$((WINDOW / 2 - 4))" \
  --json "${OUT}/passkey.json" | tee "${OUT}/passkey.md"
if /usr/bin/python3 -c "import matplotlib" 2>/dev/null; then
  /usr/bin/python3 "${ROOT}/scripts/worker/plot_eval.py" --dir "${OUT}" | tee "${OUT}/perplexity.md"
else
  echo "run_eval: no matplotlib (apt-get install python3-matplotlib) - skipping plots" >&2
fi
