#!/usr/bin/env python3
"""Decode speed of SmolLM2-135M in transformers with its KV in kvcached, fetch vs attend.

For each prompt length: prefill the prompt, then time --steps greedy single-token decode
steps with transformers' own DynamicCache (the baseline, measured in the same run), with
kvcache.hf.KvcachedCache(decode="fetch") (every step reads each layer back) and with
decode="attend" (every step sends each layer's query to kvcached's Attend). The rounds
interleave the three caches so that a load change on this shared machine lands on all of them.
Prints tokens per second and the ratio to DynamicCache.

    python scripts/eval/hf_decode_speed.py --target 127.0.0.1:PORT --pool smollm2-f16
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import time
from typing import Any, Dict, List

import torch
import transformers
from transformers import DynamicCache

import kvcache
import kvcache.hf

REPO = pathlib.Path(__file__).resolve().parents[2]
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def decode_seconds(model: Any, cache: Any, ids: List[int], steps: int) -> float:
    """Seconds per decode step after prefilling `ids` into `cache`."""
    with torch.no_grad():
        logits = model(torch.tensor([ids]), past_key_values=cache).logits[0, -1]
        t0 = time.perf_counter()
        for i in range(steps):
            t = int(torch.argmax(logits))
            pos = torch.tensor([[len(ids) + i]])
            logits = model(torch.tensor([[t]]), past_key_values=cache,
                           position_ids=pos).logits[0, -1]
        return (time.perf_counter() - t0) / steps


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--pool", default="")
    ap.add_argument("--lengths", default="256,1024,2048")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--model-dir", default=str(REPO / ".cache" / "models"))
    args = ap.parse_args()
    model = transformers.AutoModelForCausalLM.from_pretrained(args.model_dir, gguf_file=GGUF)
    model.eval()
    tok = transformers.AutoTokenizer.from_pretrained(args.model_dir, gguf_file=GGUF)
    text = (REPO / ".cache" / "corpus" / "emma.txt").read_text()[20000:60000]
    all_ids = tok(text, add_special_tokens=False)["input_ids"]
    print("| prompt tokens | DynamicCache tok/s | kvcached fetch tok/s (vs Dynamic) | "
          "kvcached attend tok/s (vs Dynamic) | attend / fetch |")
    print("| --- | --- | --- | --- | --- |")
    with kvcache.Client(args.target, timeout=120) as client:
        for n in (int(x) for x in args.lengths.split(",")):
            ids = all_ids[:n]
            times: Dict[str, List[float]] = {"dynamic": [], "fetch": [], "attend": []}
            for _ in range(args.rounds):
                times["dynamic"].append(decode_seconds(model, DynamicCache(), ids, args.steps))
                for decode in ("fetch", "attend"):
                    with kvcache.hf.KvcachedCache(model, client, pool=args.pool,
                                                  decode=decode) as cache:
                        times[decode].append(decode_seconds(model, cache, ids, args.steps))
            rate = {k: 1.0 / statistics.median(v) for k, v in times.items()}
            print(f"| {n} | {rate['dynamic']:.1f} | {rate['fetch']:.1f} "
                  f"({rate['fetch'] / rate['dynamic']:.2f}x) | {rate['attend']:.1f} "
                  f"({rate['attend'] / rate['dynamic']:.2f}x) | "
                  f"{rate['attend'] / rate['fetch']:.2f}x |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
