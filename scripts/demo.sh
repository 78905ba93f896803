#!/usr/bin/env bash
# The main job on the embedded default: builds kvcache, starts kvcached with its default
# host-memory pool (shaped like SmolLM2-135M) on 127.0.0.1, drives a prefill-style KV
# workload through it with the client library, then has the reference engine (SmolLM2-135M
# on CPU) answer a question about a long document with its KV cache in kvcached — once
# with a full f16 cache, once compressed (SnapKV + INT4) — shows the pools and sequences as
# an operator sees them with kvcachectl, and stops the server cleanly.
#
#   scripts/demo.sh [--sequences=N] [--tokens=N]     (flags go to kvc-loadgen)
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=${JOBS:-$(nproc)}
step() { printf '\n==> %s\n' "$*"; }

step "dependencies"
scripts/install_deps.sh
step "build (Release)"
cmake --preset default >/dev/null
cmake --build --preset default -j "$JOBS" --target kvcached kvcachectl kvc-loadgen kvc-worker

step "reference model (SmolLM2-135M-Instruct, GGUF) and text (Persuasion, Jane Austen)"
scripts/fetch_model.sh
python3 scripts/worker/extract_corpus.py --no-bible >/dev/null
mkdir -p .cache/demo
doc=.cache/demo/persuasion_with_pass_key.txt
# ~2,200 tokens of the novel with a pass key planted a third of the way in: the model can
# only answer from its KV cache.
python3 - "$doc" <<'PY'
import sys
text = open(".cache/corpus/persuasion.txt", encoding="utf-8").read()[3000:12000]
cut = text.index("\n\n", len(text) // 3)
text = text[:cut] + "\n\nThe pass key is 68142. Remember it. 68142 is the pass key.\n\n" + text[cut:]
open(sys.argv[1], "w", encoding="utf-8").write(text)
PY

step "start kvcached (default host pool on 127.0.0.1)"
. tests/testing/start_kvcached.sh
start_kvcached build/cachesvc/kvcached
sed 's/^/    /' "$KVC_LOG"

step "workload: kvc-loadgen through the client library"
build/client/kvc-loadgen --target="$KVC_TARGET" --sequences=8 --tokens=4096 --keep=2 "$@"

question="What is the pass key? Answer with the number only."
step "kvc-worker: answer from the document, full f16 KV cache in kvcached"
build/worker/kvc-worker generate --kv=kvcached --target="$KVC_TARGET" --prompt-file "$doc" \
  --question "$question" --max-new-tokens 12
step "kvc-worker: the same, compressed in kvcached (SnapKV budget 256 per head + INT4)"
build/worker/kvc-worker generate --kv=kvcached --target="$KVC_TARGET" --prompt-file "$doc" \
  --question "$question" --max-new-tokens 12 --policy snapkv=256 --storage int4

step "kvcachectl pools"
build/client/kvcachectl --target="$KVC_TARGET" pools
step "kvcachectl sequences"
build/client/kvcachectl --target="$KVC_TARGET" sequences
step "kvcachectl stats"
build/client/kvcachectl --target="$KVC_TARGET" stats

step "stop kvcached (SIGTERM)"
kill -TERM "$KVC_PID"
wait "$KVC_PID"
tail -n 2 "$KVC_LOG" | sed 's/^/    /'
