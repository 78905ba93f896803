#!/usr/bin/env python3
"""kvpress and kvcached side by side on the same model, the same token ids, the same kept tokens.

SmolLM2-135M-Instruct runs in transformers (CPU, float32, from the project's GGUF) for both
engines; only the KV cache differs:
  * kvpress (NVIDIA, PyPI): its presses compress a transformers DynamicCache during the prefill
    (SnapKV with kvpress's defaults, window 64 and kernel 5, and with kvcached's, window 32 and
    kernel 13; StreamingLLM; Expected Attention; Knorm). The cache stays in the model's dtype.
  * kvcached through kvcache.hf.KvcachedCache: the same policies (SnapKV window 32 kernel 13
    max-pooled, kvcached's default, and with kvpress's average pooling at both windows;
    StreamingLLM 4 sinks; Expected Attention), compressed inside the service, stored as f16 or
    INT4 (int4_g32).
Every setting keeps the same tokens per kv head (--budget; kvpress: compression_ratio chosen so
that compute_n_kept gives exactly that). The cases are kvc-worker's pass-key grid
(`kvc-worker passkey --cases-out`), the answer is greedy, scored when the pass key appears in
the first --answer-tokens generated tokens. Two placements of the question:
  * outside: the context is prefilled and compressed, then the question is prefilled through
    the compressed cache (kvpress's pipeline does this);
  * inside: context + question are prefilled and compressed together (SnapKV's window then
    holds the question; kvc-worker generate does this).
Writes one JSON line per (case, setting, placement) to --out and prints a markdown table.

Needs a venv with kvpress and the kvcache client with its [hf] extra (kvpress pins
transformers < 5.3; kvcache.hf works with 5.2), a kvcached with a pool of the model's geometry
(f16 is what the bytes below assume), and the cases file. See docs/EVALUATION.md for the
exact commands and the results.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import pathlib
import re
import sys
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import torch
import transformers
from transformers import DynamicCache

import kvcache
import kvcache.hf

REPO = pathlib.Path(__file__).resolve().parents[2]
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SETTINGS = ["hf-full", "kvpress-snapkv", "kvpress-snapkv-w32k13", "kvpress-streaming",
            "kvpress-expattn", "kvpress-knorm", "kvcached-full", "kvcached-snapkv",
            "kvcached-snapkv-int4", "kvcached-streaming-int4", "kvcached-expattn-int4",
            "kvcached-snapkv-avg-w64k5", "kvcached-snapkv-avg-w32k13"]


def forward(model: Any, cache: Any, ids: List[int], pos: int) -> torch.Tensor:
    """Last logits of `ids` fed at positions pos.. . Explicit positions, as kvpress's pipeline
    passes them: a compressed DynamicCache is shorter than the positions it covers (kvcached's
    cache counts positions itself; the same ids make no difference there)."""
    positions = torch.arange(pos, pos + len(ids)).unsqueeze(0)
    return model(torch.tensor([ids]), past_key_values=cache, position_ids=positions).logits[0, -1]


def greedy(model: Any, cache: Any, logits: torch.Tensor, n: int, eos: int, pos: int,
           done: Callable[[List[int]], bool]) -> List[int]:
    """Up to n greedy tokens; stops at EOS or once `done` (the pass key was said: the rest
    cannot change the score)."""
    out: List[int] = []
    for _ in range(n):
        t = int(torch.argmax(logits))
        out.append(t)
        if t == eos or len(out) == n or done(out):
            break
        logits = forward(model, cache, [t], pos)
        pos += 1
    return out


# (kvpress setting, kvcached setting) that run the same algorithm at the same kept tokens.
PAIRS = [("hf-full", "kvcached-full"), ("kvpress-snapkv", "kvcached-snapkv-avg-w64k5"),
         ("kvpress-snapkv-w32k13", "kvcached-snapkv-avg-w32k13"),
         ("kvpress-snapkv-w32k13", "kvcached-snapkv"),
         ("kvpress-streaming", "kvcached-streaming"),
         ("kvpress-streaming", "kvcached-streaming-int4"),
         ("kvpress-expattn", "kvcached-expattn-int4")]


def kvpress_setting(name: str, budget: int, prompt_len: int) -> Optional[Any]:
    import kvpress
    ratio = 1.0 - (budget + 0.5) / prompt_len  # compute_n_kept: int(n * (1 - ratio)) = budget
    return {
        "kvpress-snapkv": lambda: kvpress.SnapKVPress(compression_ratio=ratio),
        "kvpress-snapkv-w32k13": lambda: kvpress.SnapKVPress(compression_ratio=ratio,
                                                             window_size=32, kernel_size=13),
        "kvpress-streaming": lambda: kvpress.StreamingLLMPress(compression_ratio=ratio, n_sink=4),
        "kvpress-expattn": lambda: kvpress.ExpectedAttentionPress(compression_ratio=ratio),
        "kvpress-knorm": lambda: kvpress.KnormPress(compression_ratio=ratio),
    }[name]()


def kvcached_spec(name: str, budget: int) -> Optional[kvcache.CompressionSpec]:
    return {
        "kvcached-full": None,
        "kvcached-int4": kvcache.CompressionSpec(storage="int4_g32"),  # storage only
        "kvcached-snapkv": kvcache.CompressionSpec(eviction=kvcache.SnapKV(32, budget)),
        "kvcached-snapkv-int4": kvcache.CompressionSpec(eviction=kvcache.SnapKV(32, budget),
                                                        storage="int4_g32"),
        # kvpress's SnapKV: average pooling (kvcached's default is max), window 64 kernel 5
        # (kvpress's defaults) or kvcached's window and kernel.
        "kvcached-snapkv-avg-w64k5": kvcache.CompressionSpec(
            eviction=kvcache.SnapKV(64, budget, pooling_kernel=5, pooling="avg")),
        "kvcached-snapkv-avg-w32k13": kvcache.CompressionSpec(
            eviction=kvcache.SnapKV(32, budget, pooling_kernel=13, pooling="avg")),
        "kvcached-streaming": kvcache.CompressionSpec(
            eviction=kvcache.StreamingLLM(sinks=4, window=budget - 4)),
        "kvcached-streaming-int4": kvcache.CompressionSpec(
            eviction=kvcache.StreamingLLM(sinks=4, window=budget - 4), storage="int4_g32"),
        "kvcached-expattn-int4": kvcache.CompressionSpec(
            eviction=kvcache.ExpectedAttention(window=32, budget=budget), storage="int4_g32"),
    }[name]


def dense_f16_bytes(model: Any, tokens: int) -> int:
    """Bytes of `tokens` tokens of every layer's keys and values in f16 (2 x 2 bytes)."""
    cfg = model.config
    return tokens * cfg.num_hidden_layers * cfg.num_key_value_heads * (
        cfg.hidden_size // cfg.num_attention_heads) * 2 * 2


@contextlib.contextmanager
def compressed_prefill(model: Any, client: kvcache.Client, pool: str, setting: str,
                       prompt: List[int], budget: int) -> Iterator[Tuple[Any, torch.Tensor, int, int]]:
    """Prefills `prompt` into the setting's cache and compresses it (kvpress: its press during
    the prefill; kvcached: Compress in the service once the prompt is in). Yields (cache, last
    logits, tokens kept per kv head, bytes held); a kvcached sequence is released on exit."""
    with torch.no_grad():
        if setting.startswith("kvcached"):
            spec = kvcached_spec(setting, budget)
            with kvcache.hf.KvcachedCache(model, client, pool=pool, compression=spec) as cache:
                logits = model(torch.tensor([prompt]), past_key_values=cache).logits[0, -1]
                if spec is not None:
                    cache.compress()
                info = client.get_sequence(cache.sequence)
                yield cache, logits, max(info.stored_tokens), info.bytes
            return
        cache = DynamicCache()
        press = None if setting == "hf-full" else kvpress_setting(setting, budget, len(prompt))
        with press(model) if press is not None else contextlib.nullcontext():
            logits = model(torch.tensor([prompt]), past_key_values=cache).logits[0, -1]
        kept = cache.layers[0].keys.shape[-2]
        # kvpress keeps the model's dtype: counted as f16
        yield cache, logits, kept, dense_f16_bytes(model, kept)


def run_one(model: Any, client: kvcache.Client, pool: str, setting: str, case: Dict[str, Any],
            inside: bool, budget: int, answer_tokens: int, eos: int,
            done: Callable[[List[int]], bool]) -> Dict[str, Any]:
    ctx, question = case["context"], case["question"]
    prompt = ctx + question if inside else ctx
    t0 = time.time()
    with compressed_prefill(model, client, pool, setting, prompt, budget) as (
            cache, logits, kept, held), torch.no_grad():
        if not inside:
            logits = forward(model, cache, question, len(prompt))
        gen = greedy(model, cache, logits, answer_tokens, eos, len(ctx) + len(question), done)
    return {"setting": setting, "placement": "inside" if inside else "outside",
            "length": case["length"], "depth": case["depth"], "key_index": case["key_index"],
            "passkey": case["passkey"], "prompt_tokens": len(prompt), "kept_per_head": kept,
            "bytes": held, "f16_bytes": dense_f16_bytes(model, len(prompt)), "generated": gen,
            "seconds": round(time.time() - t0, 2)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", required=True, help="kvc-worker passkey --cases-out file")
    ap.add_argument("--target", required=True, help="kvcached host:port")
    ap.add_argument("--pool", required=True, help="a pool of the model's geometry (f16)")
    ap.add_argument("--budget", type=int, default=256, help="tokens kept per kv head")
    ap.add_argument("--answer-tokens", type=int, default=32)
    ap.add_argument("--settings", default=",".join(SETTINGS))
    ap.add_argument("--placements", default="outside,inside")
    ap.add_argument("--out", required=True, help="JSON lines (appended; finished rows skipped)")
    ap.add_argument("--model-dir", default=str(REPO / ".cache" / "models"))
    ap.add_argument("--summary-only", action="store_true", help="print the tables of --out")
    ap.add_argument("--worker-json", default="",
                    help="comma-separated `kvc-worker passkey --kv=kvcached --json` files, one "
                         "per --cases-out file in the order --cases concatenates them: compare "
                         "the C++ worker's answers with these (question inside)")
    args = ap.parse_args()
    if args.summary_only:
        summarize(pathlib.Path(args.out))
        if args.worker_json:
            compare_worker(pathlib.Path(args.out), args.worker_json.split(","))
        return 0

    model = transformers.AutoModelForCausalLM.from_pretrained(args.model_dir, gguf_file=GGUF)
    model.eval()
    tok = transformers.AutoTokenizer.from_pretrained(args.model_dir, gguf_file=GGUF)
    cases = [json.loads(line) for line in open(args.cases)]
    out = pathlib.Path(args.out)
    done = set()
    if out.exists():
        for line in out.read_text().splitlines():
            r = json.loads(line)
            done.add((r["setting"], r["placement"], r["case"]))
    settings = args.settings.split(",")
    with kvcache.Client(args.target, timeout=120) as client, out.open("a") as f:
        for index, case in enumerate(cases):
            for placement in args.placements.split(","):
                for setting in settings:
                    key = (setting, placement, index)
                    if key in done:
                        continue
                    r = run_one(model, client, args.pool, setting, case, placement == "inside",
                                args.budget, args.answer_tokens, tok.eos_token_id,
                                lambda ids: case["passkey"] in tok.decode(ids))
                    r["case"] = index  # line of --cases
                    r["answer"] = tok.decode(r["generated"])
                    r["found"] = case["passkey"] in r["answer"]
                    f.write(json.dumps(r) + "\n")
                    f.flush()
                    print(f"{setting:24s} {placement:7s} len {r['prompt_tokens']:5d} depth "
                          f"{case['depth']:.3f} kept {r['kept_per_head']:5d} "
                          f"{r['f16_bytes'] / max(r['bytes'], 1):5.1f}x found {r['found']:d} "
                          f"{r['seconds']:5.1f} s {r['answer'][:40]!r}", file=sys.stderr)
    summarize(out)
    return 0


def summarize(path: pathlib.Path) -> None:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    table: Dict[Tuple[str, str], List[Dict[str, Any]]] = {}
    for r in rows:
        table.setdefault((r["setting"], r["placement"]), []).append(r)
    print("| setting | question | found | kept per head | KV vs f16 |")
    print("| --- | --- | --- | --- | --- |")
    for (setting, placement), rs in sorted(table.items(), key=lambda x: (x[0][1], x[0][0])):
        found = sum(r["found"] for r in rs)
        ratio = sum(r["f16_bytes"] / max(r["bytes"], 1) for r in rs) / len(rs)
        kept = sum(r["kept_per_head"] for r in rs) / len(rs)
        print(f"| {setting} | {placement} | {found}/{len(rs)} | {kept:.0f} | {ratio:.1f}x |")
    # The same algorithm in both engines: how often the answers are token for token the same.
    print("\n| kvpress | kvcached | question | same answer | both found | only kvpress | "
          "only kvcached |\n| --- | --- | --- | --- | --- | --- | --- |")
    by_case = {(r["setting"], r["placement"], r["case"]): r for r in rows}
    for a, b in PAIRS:
        for placement in ("outside", "inside"):
            cases = sorted(c for (s, p, c) in by_case if s == a and p == placement and
                           (b, placement, c) in by_case)
            if not cases:
                continue
            ra = [by_case[(a, placement, c)] for c in cases]
            rb = [by_case[(b, placement, c)] for c in cases]
            same = sum(x["generated"] == y["generated"] for x, y in zip(ra, rb))
            both = sum(x["found"] and y["found"] for x, y in zip(ra, rb))
            only_a = sum(x["found"] and not y["found"] for x, y in zip(ra, rb))
            only_b = sum(y["found"] and not x["found"] for x, y in zip(ra, rb))
            print(f"| {a} | {b} | {placement} | {same}/{len(cases)} | {both} | {only_a} | "
                  f"{only_b} |")


def compare_worker(path: pathlib.Path, worker_files: List[str]) -> None:
    """The C++ worker (its own f32 engine, KV in kvcached) against transformers on the same
    token ids, answer by answer. The worker's JSON names no case, so cases are matched by order
    (each file lists its cases by length, depth and key, as --cases-out wrote them); the pass
    keys must then agree, which checks the matching. The worker always generates
    --answer-tokens tokens; this script stops once the key is said, so a found answer is
    compared as a prefix."""
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    by_case = {(r["setting"], r["placement"], r["case"]): r for r in rows}
    worker: Dict[Tuple[str, int], Dict[str, Any]] = {}
    base = 0
    for file in worker_files:
        scores = json.loads(pathlib.Path(file).read_text())["scores"]
        order: List[Tuple[int, float, int]] = []
        for s in scores:
            cell = (s["context_tokens"], s["depth"], s["key_index"])
            if cell not in order:
                order.append(cell)
            worker[(s["policy"], base + order.index(cell))] = s
        base += len(order)
    print("\n| kvc-worker (C++) | transformers | same text | same bytes | found: worker / "
          "transformers |\n| --- | --- | --- | --- | --- |")
    policies = sorted({p for p, _ in worker})
    for policy in policies:
        budget = re.match(r"snapkv=(\d+)(:int4)?$", policy)
        settings = (["hf-full", "kvcached-full"] if policy == "full" else
                    ["kvcached-snapkv-int4" if budget.group(2) else "kvcached-snapkv"]
                    if budget else [])
        for setting in settings:
            n = same = same_bytes = found_w = found_t = 0
            for (p, case), s in sorted(worker.items()):
                r = by_case.get((setting, "inside", case))
                if p != policy or r is None:
                    continue
                if r["passkey"] != s["passkey"]:
                    raise SystemExit(f"case {case}: pass key {r['passkey']} here, "
                                     f"{s['passkey']} in the worker's JSON: files out of order?")
                n += 1
                same += (s["generated"].startswith(r["answer"]) if r["found"]
                         else s["generated"] == r["answer"])
                same_bytes += setting.startswith("kvcached") and s["kv_bytes"] == r["bytes"]
                found_w += s["generated_match"]
                found_t += r["found"]
            if n:
                bytes_col = f"{same_bytes}/{n}" if setting.startswith("kvcached") else "-"
                print(f"| {policy} | {setting} | {same}/{n} | {bytes_col} | {found_w} / "
                      f"{found_t} |")


if __name__ == "__main__":
    sys.exit(main())
