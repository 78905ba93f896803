#!/usr/bin/env python3
"""The prepared real-GPU run of kvcache.vllm (never run yet: no GPU has been lent with vLLM
installed). vLLM serves --model with KvcachedConnector against a running kvcached:

  1. greedy     the same prompts' greedy outputs with the connector and a cold cache, then again
                from a second vLLM instance that loads their prefixes from kvcached, then
                with no connector at all: all three must be identical (f16 storage)
  2. ttft       time to first token of a repeated ~--ttft-tokens-token prompt: without
                kvcached (vLLM's own prefix cache off, so every run computes it), and with
                kvcached after one run published it (medians of --rounds)

vLLM's own prefix cache is off in every instance, so each hit is kvcached's. Prints one JSON
object. Needs vllm and kvcache (client/python) importable, a GPU, and kvcached at --target
with a pool of the model's shape (--pool).

  python tests/gpu/vllm_e2e.py --model DIR --target 127.0.0.1:50051 --pool NAME
"""
from __future__ import annotations

import argparse
import gc
import json
import statistics
import time

import torch
from vllm import LLM, SamplingParams
from vllm.config import KVTransferConfig


def make_llm(model: str, connector: dict | None) -> LLM:
    transfer = None
    if connector is not None:
        transfer = KVTransferConfig(kv_connector="KvcachedConnector",
                                    kv_connector_module_path="kvcache.vllm", kv_role="kv_both",
                                    kv_load_failure_policy="recompute",
                                    kv_connector_extra_config=connector)
    return LLM(model=model, dtype="float16", enable_prefix_caching=False,
               gpu_memory_utilization=0.5, max_model_len=16384, kv_transfer_config=transfer)


def drop(llm: LLM) -> None:
    del llm
    gc.collect()
    torch.cuda.empty_cache()


def greedy(llm: LLM, prompts: list) -> list:
    params = SamplingParams(temperature=0.0, max_tokens=32)
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params)]


def ttft(llm: LLM, prompt: str, rounds: int) -> float:
    params = SamplingParams(temperature=0.0, max_tokens=1)
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        llm.generate([prompt], params)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--target", default="127.0.0.1:50051")
    ap.add_argument("--pool", default="")
    ap.add_argument("--ttft-tokens", type=int, default=8192)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    connector = {"target": args.target, "pool": args.pool}
    base = ("The KV cache of a long document is computed once and reused by every question "
            "about it. ") * 40
    prompts = [base + q for q in ("Summarize it.", "What is reused?", "Why is it fast?")]
    report: dict = {}

    llm = make_llm(args.model, connector)
    cold = greedy(llm, prompts)
    drop(llm)
    llm = make_llm(args.model, connector)  # another instance: every hit is kvcached's
    warm = greedy(llm, prompts)
    drop(llm)
    llm = make_llm(args.model, None)
    plain = greedy(llm, prompts)
    report["greedy"] = {"same_with_hit": warm == cold, "same_as_without_connector": cold == plain}

    long_prompt = " ".join(f"w{i % 977}" for i in range(args.ttft_tokens))
    report["ttft_without_kvcached_s"] = ttft(llm, long_prompt, args.rounds)
    drop(llm)
    llm = make_llm(args.model, connector)
    ttft(llm, long_prompt, 1)  # publishes it
    report["ttft_with_kvcached_s"] = ttft(llm, long_prompt, args.rounds)
    drop(llm)
    report["ttft_speedup"] = report["ttft_without_kvcached_s"] / report["ttft_with_kvcached_s"]
    print(json.dumps(report, indent=2))
    ok = report["greedy"]["same_with_hit"] and report["greedy"]["same_as_without_connector"]
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
