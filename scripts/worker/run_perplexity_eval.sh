#!/usr/bin/env bash
# Perplexity of SmolLM2-135M on Persuasion with the local KV store: full cache within the 8K
# context vs window-only vs 4 sinks + window, then the two bounded policies streaming far past
# the context. Writes JSON and a log under .cache/eval/ (about 10 minutes on 2 busy cores).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BIN="${KVC_WORKER_BIN:-${ROOT}/build-w/kvc-worker}"
OUT="${ROOT}/.cache/eval"
mkdir -p "${OUT}"
"${ROOT}/scripts/fetch_model.sh" >/dev/null
TEXT="$(python3 "${ROOT}/scripts/worker/extract_corpus.py")"
"${BIN}" perplexity --text-file "${TEXT}" --max-tokens "${PPL_SHORT_TOKENS:-8192}" --chunk 128 \
  --segment 512 --policies full,window=1024,streaming=4+1020 --json "${OUT}/ppl_8k.json"
"${BIN}" perplexity --text-file "${TEXT}" --max-tokens "${PPL_LONG_TOKENS:-24576}" --chunk 128 \
  --segment 1024 --policies window=1024,streaming=4+1020 --json "${OUT}/ppl_long.json"
