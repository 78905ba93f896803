# Sourced by the worker's shell tests: require_worker_assets ROOT sets MODEL (SmolLM2-135M)
# and TEXT (Persuasion) under ROOT/.cache, and exits 77 (ctest's skip) when either is missing.
require_worker_assets() {
  MODEL="$1/.cache/models/SmolLM2-135M-Instruct.Q4_1.gguf"
  TEXT="$1/.cache/corpus/persuasion.txt"
  if [ ! -s "$MODEL" ] || [ ! -s "$TEXT" ]; then
    echo "SKIP: needs $MODEL (scripts/fetch_model.sh) and $TEXT (scripts/worker/extract_corpus.py)"
    exit 77
  fi
}
