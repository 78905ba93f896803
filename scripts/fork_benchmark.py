#!/usr/bin/env python3
"""What ForkSequence costs against prefilling the same KV again, through a real kvcached on
loopback and the Python client (pip install ./client/python).

A document of --tokens tokens (SmolLM2-135M's KV shape: 30 layers x 3 kv heads x head_dim 64,
f16) is prefilled once with append_stream, optionally compressed (--compress: StreamingLLM
4 + tokens/8 with INT4 storage, a stand-in for any compression done once per document), and
then each round measures, against the baseline measured in the same run:
  prefill   appending the (compressed-size) document into a new sequence again
  fork      fork_sequence of the document (shares whole blocks, copies each lane's last one)
and, after --forks forks held at once, the pool's used bytes against the document's.

  scripts/fork_benchmark.py [--kvcached build/cachesvc/kvcached] [--tokens 32768]
                            [--rounds 5] [--forks 8] [--compress] [--json FILE]

Medians over rounds. A measurement, not a test: it asserts nothing about speed.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import tempfile
import time

import numpy as np

import kvcache
from bench_kvcached import start_kvcached

LAYERS, KV_HEADS, HEAD_DIM = 30, 3, 64


def start(binary: str, capacity: int, tmp: pathlib.Path):
    return start_kvcached(binary, (
        'pools { name: "bench" capacity_bytes: %d geometry { num_layers: %d num_kv_heads: %d '
        'num_query_heads: %d head_dim: %d dtype: DTYPE_F16 rope { theta: 100000 } } }\n'
        % (capacity, LAYERS, KV_HEADS, 3 * KV_HEADS, HEAD_DIM)), tmp)


def prefill(client: kvcache.Client, seq, tokens: int, kv: np.ndarray) -> None:
    per_message = max(1, (1 << 20) // (KV_HEADS * HEAD_DIM * 2))
    with client.append_stream() as stream:
        for start_at in range(0, tokens, per_message):
            n = min(per_message, tokens - start_at)
            for layer in range(LAYERS):
                stream.append(seq, layer, start_at, kv[:n], kv[:n])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kvcached", default="build/cachesvc/kvcached")
    ap.add_argument("--tokens", type=int, default=32768)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--forks", type=int, default=8)
    ap.add_argument("--compress", action="store_true")
    ap.add_argument("--json", default="")
    a = ap.parse_args()

    doc_bytes = 2 * LAYERS * KV_HEADS * HEAD_DIM * 2 * a.tokens
    capacity = 3 * doc_bytes + (256 << 20)
    rng = np.random.default_rng(1)
    kv = rng.standard_normal((1 << 20) // (KV_HEADS * HEAD_DIM * 2) * KV_HEADS * HEAD_DIM)
    kv = kv.astype(np.float16).reshape(-1, KV_HEADS, HEAD_DIM)
    spec = kvcache.CompressionSpec(eviction=kvcache.StreamingLLM(4, a.tokens // 8),
                                   storage="int4_g32")
    with tempfile.TemporaryDirectory() as tmp:
        proc, target = start(a.kvcached, capacity, pathlib.Path(tmp))
        try:
            with kvcache.Client(target, timeout=600) as c:
                doc = c.create_sequence(pool="bench")
                prefill(c, doc, a.tokens, kv)
                if a.compress:
                    c.compress(doc, spec)
                held = c.get_sequence(doc).bytes
                prefill_s, fork_s = [], []
                for _ in range(a.rounds):
                    again = c.create_sequence(pool="bench")
                    t0 = time.perf_counter()
                    prefill(c, again, a.tokens, kv)
                    if a.compress:
                        c.compress(again, spec)
                    prefill_s.append(time.perf_counter() - t0)
                    c.release(again)
                    t0 = time.perf_counter()
                    f = c.fork_sequence(doc)
                    fork_s.append(time.perf_counter() - t0)
                    c.release(f)
                used_before = c.pool_stats("bench").used_bytes
                forks = [c.fork_sequence(doc) for _ in range(a.forks)]
                used_after = c.pool_stats("bench").used_bytes
                for f in forks:
                    c.release(f)
        finally:
            proc.kill()
            proc.wait()
    result = {
        "tokens": a.tokens, "compressed": a.compress, "document_bytes_held": held,
        "prefill_again_ms": 1e3 * statistics.median(prefill_s),
        "fork_ms": 1e3 * statistics.median(fork_s),
        "forks": a.forks, "pool_bytes_added_by_forks": used_after - used_before,
    }
    result["fork_speedup"] = result["prefill_again_ms"] / result["fork_ms"]
    result["forks_bytes_vs_one_copy"] = (used_after - used_before) / held
    print(json.dumps(result, indent=1))
    if a.json:
        pathlib.Path(a.json).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
