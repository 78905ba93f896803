#!/usr/bin/env python3
"""Perplexity after compression, kvpress and kvcached on the same model and the same token ids.

The setting both engines can measure: a context of --context tokens is prefilled and
compressed (kvpress: a press during the prefill of a transformers DynamicCache; kvcached:
kvcache.hf.KvcachedCache, compressed inside the service once the context is in), then the next
--continuation tokens of the same text are fed through the compressed cache in one chunk, and
their negative log-likelihood is averaged. Every setting keeps --budget tokens per kv head of
the context (the continuation itself is kept whole), so the settings differ only in which
context tokens they keep and how they store them. Query-aware policies (SnapKV) score with the
last queries of the context: there is no question here, which is what a generic-text
perplexity asks of them.

The texts are the project's corpora (scripts/worker/extract_corpus.py); windows start at
evenly spaced points of each text. Token ids come from the transformers tokenizer of the GGUF
(both engines get the same ids; the digits-first difference to kvc-worker's tokenizer does not
matter for a comparison between the two). Writes one JSON line per (text, window, setting) to
--out (resumable) and prints per-setting perplexity, the ratio to the full cache's, and bytes.

Needs the venv and kvcached of kvpress_side_by_side.py (same settings, same names).
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import sys
import time
from typing import Any, Dict, List, Tuple

import torch
import transformers

import kvcache

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from kvpress_side_by_side import GGUF, REPO, compressed_prefill, dense_f16_bytes  # noqa: E402

SETTINGS = ["hf-full", "kvcached-full", "kvcached-int4", "kvpress-snapkv",
            "kvpress-snapkv-w32k13", "kvcached-snapkv-avg-w32k13", "kvcached-snapkv",
            "kvcached-snapkv-int4", "kvpress-streaming", "kvcached-streaming",
            "kvcached-streaming-int4", "kvpress-expattn", "kvcached-expattn-int4", "kvpress-knorm"]


def windows(tok: Any, path: pathlib.Path, count: int, n: int) -> List[List[int]]:
    """`count` windows of n token ids, starting at evenly spaced characters of the text
    (tokenized from a slice: the corpora are megabytes; 8 characters per token is ample)."""
    text = path.read_text()
    out = []
    for w in range(count):
        start = (w + 1) * len(text) // (count + 1)
        ids = tok(text[start:start + 8 * n], add_special_tokens=False)["input_ids"][1:n + 1]
        if len(ids) < n:
            raise SystemExit(f"{path}: window {w} has {len(ids)} tokens, need {n}")
        out.append(ids)
    return out


def continuation_nll(model: Any, cache: Any, last_logits: torch.Tensor, cont: List[int],
                     pos: int) -> float:
    """Mean NLL of `cont` given the cache: its first token from the context's last logits, the
    rest from one forward of the whole continuation at explicit positions pos.. (a compressed
    DynamicCache is shorter than the positions it covers)."""
    positions = torch.arange(pos, pos + len(cont)).unsqueeze(0)
    logits = model(torch.tensor([cont]), past_key_values=cache, position_ids=positions).logits[0]
    all_logits = torch.cat([last_logits.unsqueeze(0), logits[:-1]]).float()
    logp = torch.log_softmax(all_logits, dim=-1)
    return float(-logp[torch.arange(len(cont)), torch.tensor(cont)].mean())


def run_one(model: Any, client: kvcache.Client, pool: str, setting: str, ids: List[int],
            context: int, budget: int) -> Dict[str, Any]:
    ctx, cont = ids[:context], ids[context:]
    t0 = time.time()
    with compressed_prefill(model, client, pool, setting, ctx, budget) as (
            cache, last, kept, held), torch.no_grad():
        nll = continuation_nll(model, cache, last, cont, len(ctx))
    return {"setting": setting, "context_tokens": len(ctx), "continuation_tokens": len(cont),
            "kept_per_head": kept, "bytes": held, "f16_bytes": dense_f16_bytes(model, len(ctx)),
            "nll": nll, "seconds": round(time.time() - t0, 2)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    corpus = REPO / ".cache" / "corpus"
    ap.add_argument("--texts", default=",".join(
        str(corpus / f"{n}.txt") for n in ("emma", "web_bible", "persuasion")))
    ap.add_argument("--windows", type=int, default=3, help="windows per text")
    ap.add_argument("--context", type=int, default=1024, help="tokens prefilled and compressed")
    ap.add_argument("--continuation", type=int, default=256, help="tokens scored after it")
    ap.add_argument("--budget", type=int, default=256, help="context tokens kept per kv head")
    ap.add_argument("--settings", default=",".join(SETTINGS))
    ap.add_argument("--target", help="kvcached host:port")
    ap.add_argument("--pool", default="", help="a pool of the model's geometry (f16)")
    ap.add_argument("--out", required=True, help="JSON lines (appended; finished rows skipped)")
    ap.add_argument("--model-dir", default=str(REPO / ".cache" / "models"))
    ap.add_argument("--summary-only", action="store_true", help="print the table of --out")
    args = ap.parse_args()
    out = pathlib.Path(args.out)
    if args.summary_only:
        summarize(out)
        return 0
    if not args.target:
        ap.error("--target is required (a kvcached serving --pool)")

    model = transformers.AutoModelForCausalLM.from_pretrained(args.model_dir, gguf_file=GGUF)
    model.eval()
    tok = transformers.AutoTokenizer.from_pretrained(args.model_dir, gguf_file=GGUF)
    done = set()
    if out.exists():
        for line in out.read_text().splitlines():
            r = json.loads(line)
            done.add((r["text"], r["window"], r["setting"]))
    with kvcache.Client(args.target, timeout=120) as client, out.open("a") as f:
        for text in args.texts.split(","):
            name = pathlib.Path(text).stem
            for w, ids in enumerate(windows(tok, pathlib.Path(text), args.windows,
                                            args.context + args.continuation)):
                for setting in args.settings.split(","):
                    if (name, w, setting) in done:
                        continue
                    r = run_one(model, client, args.pool, setting, ids, args.context,
                                args.budget)
                    r.update(text=name, window=w)
                    f.write(json.dumps(r) + "\n")
                    f.flush()
                    print(f"{name:10s} {w} {setting:26s} kept {r['kept_per_head']:5d} "
                          f"{r['f16_bytes'] / max(r['bytes'], 1):5.1f}x ppl "
                          f"{math.exp(r['nll']):7.3f} {r['seconds']:5.1f} s", file=sys.stderr)
    summarize(out)
    return 0


def summarize(path: pathlib.Path) -> None:
    """Per setting: perplexity (exp of the mean NLL over every window, each window weighted by
    its tokens, all equal here), its ratio to hf-full on the same windows, the worst window's
    ratio, and KV vs f16."""
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    full = {(r["text"], r["window"]): r["nll"] for r in rows if r["setting"] == "hf-full"}
    by: Dict[str, List[Dict[str, Any]]] = {}
    for r in rows:
        by.setdefault(r["setting"], []).append(r)
    texts = sorted({r["text"] for r in rows})
    print("| setting | windows | " + " | ".join(f"ppl {t}" for t in texts) +
          " | ppl all | vs full (worst window) | KV vs f16 |")
    print("| --- | --- | " + " | ".join("---" for _ in texts) + " | --- | --- | --- |")
    order = {s: i for i, s in enumerate(SETTINGS)}
    for setting, rs in sorted(by.items(), key=lambda x: order.get(x[0], 99)):
        per_text = []
        for t in texts:
            nll = [r["nll"] for r in rs if r["text"] == t]
            per_text.append(f"{math.exp(sum(nll) / len(nll)):.3f}" if nll else "-")
        mean = sum(r["nll"] for r in rs) / len(rs)
        paired = [(r["nll"], full[(r["text"], r["window"])]) for r in rs
                  if (r["text"], r["window"]) in full]
        if paired:
            vs = math.exp(sum(a - b for a, b in paired) / len(paired))
            worst = max(math.exp(a - b) for a, b in paired)
            vs_col = f"{vs:.3f} ({worst:.3f})"
        else:
            vs_col = "-"
        ratio = sum(r["f16_bytes"] / max(r["bytes"], 1) for r in rs) / len(rs)
        print(f"| {setting} | {len(rs)} | " + " | ".join(per_text) +
              f" | {math.exp(mean):.3f} | {vs_col} | {ratio:.1f}x |")


if __name__ == "__main__":
    sys.exit(main())
