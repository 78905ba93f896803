#!/usr/bin/env python3
"""What a prompt's KV costs reused through kvcache.vllm against computing it again: the KV of a
--tokens-token prompt of SmolLM2-135M's shape (30 layers x 3 kv heads x head_dim 64, f16) is
saved by the connector's worker side (copied out of vLLM's paged layout, appended, published)
and loaded by another instance into other blocks (attach, fetch, written into the blocks),
against the reference engine computing that prompt's KV (`kvc-worker generate --kv local`, the
same model on this machine's CPU: its prefill time). Also: the bytes kvcached holds per token
in each --storage format. Each format runs over gRPC and over the same-node paths (kvcached
with a local_socket: shared-memory reads, staged appends).

Runs in the venv of tests/vllm (vllm importable):
  build/vllm-venv/bin/python scripts/vllm_reuse_benchmark.py [--kvcached build/cachesvc/kvcached]
      [--worker build/worker/kvc-worker] [--tokens 4096] [--rounds 3] [--storage "" int4_g32]

Medians over rounds. A measurement, not a test: it asserts nothing about speed (it does check
that every loaded f16 byte is the saved one).
"""
from __future__ import annotations

import argparse
import pathlib
import re
import statistics
import subprocess
import sys
import tempfile
import time

import torch

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "vllm"))

from conftest import GGUF, POOLS  # noqa: E402  (tests/vllm: pools and the local model)
from harness import BLOCK, vllm_config  # noqa: E402
from bench_kvcached import start_kvcached  # noqa: E402

import kvcache  # noqa: E402
from kvcache.vllm import KvcachedConnector  # noqa: E402
from kvcache.vllm.scheduler_side import KvcachedMetadata, LoadOp, SaveOp  # noqa: E402

LAYERS, KV_HEADS, HEAD_DIM = 30, 3, 64


def model_dir(tmp: pathlib.Path) -> pathlib.Path:
    from transformers import AutoConfig
    config = AutoConfig.from_pretrained(GGUF.parent, gguf_file=GGUF.name)
    config.architectures = ["LlamaForCausalLM"]
    config.save_pretrained(tmp)
    return tmp


def worker(config, num_blocks: int):
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
    connector = KvcachedConnector(config, KVConnectorRole.WORKER)
    backing = torch.randn(LAYERS, num_blocks, BLOCK, KV_HEADS, 2 * HEAD_DIM).half()
    caches = {f"model.layers.{i}.self_attn.attn": backing[i].permute(0, 2, 1, 3)
              for i in range(LAYERS)}
    connector.register_kv_caches(caches)
    return connector, list(caches.values())


def reference_prefill(binary: str, tokens: int):
    """(prompt tokens, seconds) of kvc-worker computing the KV of a ~tokens-token prompt."""
    text = (REPO / ".cache" / "corpus" / "emma.txt").read_text()
    words = text.split()
    prompt = " ".join(words[:int(tokens * 0.8)])  # about 1.26 tokens per word (Emma)
    out = subprocess.run([binary, "generate", f"--model={GGUF}", "--kv=local", "--raw",
                          "--max-new-tokens=1", f"--prompt={prompt}"],
                         capture_output=True, text=True, check=True)
    m = re.search(r"prompt (\d+) tokens, prefill ([\d.]+) s", out.stderr)
    assert m, out.stderr[-2000:]
    return int(m.group(1)), float(m.group(2))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kvcached", default=str(REPO / "build/cachesvc/kvcached"))
    ap.add_argument("--worker", default=str(REPO / "build/worker/kvc-worker"))
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--storage", nargs="+", default=["", "int4_g32"])
    args = ap.parse_args()
    n = args.tokens // BLOCK * BLOCK
    blocks = n // BLOCK
    tmp = pathlib.Path(tempfile.mkdtemp())
    mdir = model_dir(tmp / "model")
    pools = POOLS.replace("268435456", str(1 << 30))
    same_node = f'local_socket: "{tmp}/kvcached.sock"\nlocal_socket_allow_same_uid: true\n'
    runs = [(s, m) for m in ("grpc", "same-node") for s in args.storage]
    for storage, mode in runs:  # a kvcached of its own each: the cache starts empty
        proc, target = start_kvcached(args.kvcached,
                                      pools + (same_node if mode == "same-node" else ""), tmp)
        try:
            extra = {"target": target, "pool": "smollm2", "storage": storage}
            saver, saver_caches = worker(vllm_config(mdir, target, extra), 2 * blocks + 1)
            loader, loader_caches = worker(vllm_config(mdir, target, extra), 2 * blocks + 1)
            saves, loads = [], []
            for r in range(args.rounds):
                prompt = [r * 100000 + i for i in range(n)]  # a new prompt each round
                src = list(range(1, blocks + 1))
                dst = list(range(blocks + 1, 2 * blocks + 1))
                start = time.perf_counter()
                saver.bind_connector_metadata(KvcachedMetadata(saves=[SaveOp("a", prompt, "", 0,
                                                                             src)]))
                saver.wait_for_save()
                saver._worker.wait_saves()
                saves.append(time.perf_counter() - start)
                start = time.perf_counter()
                loader.bind_connector_metadata(KvcachedMetadata(loads=[LoadOp("b", prompt, "", 0,
                                                                              n, dst)]))
                loader.start_load_kv(None)
                loads.append(time.perf_counter() - start)
                assert not loader.get_block_ids_with_load_errors()
                if storage == "":
                    assert all(torch.equal(a[src], b[dst])
                               for a, b in zip(saver_caches, loader_caches))
            with kvcache.Client(target) as c:
                stats = c.pool_stats("smollm2").prefix_cache
            per_token = stats.cached_bytes / (n * args.rounds)
            print(f"{mode}, storage {storage or 'f16'}: {n} tokens, save {statistics.median(saves):.3f} s,"
                  f" load {statistics.median(loads):.3f} s (medians of {args.rounds}); kvcached "
                  f"holds {per_token:,.0f} bytes per token ({per_token * n / 2**20:.1f} MiB); "
                  f"fetch path {loader.client.data_path}, append path {saver.client.append_path}")
            for c in (saver, loader):
                c.shutdown()
        finally:
            proc.kill()
            proc.wait()  # its metrics port is free for the next one
    tokens, seconds = reference_prefill(args.worker, n)
    print(f"reference engine (kvc-worker generate --kv=local, CPU): computing the KV of a "
          f"{tokens}-token prompt takes {seconds:.2f} s")


if __name__ == "__main__":
    main()
