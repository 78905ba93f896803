#!/usr/bin/env python3
"""Stores and restores the same KV in kvcached and in Redis 7, the way a new user would try
both from Python, on this machine, and reports tokens/s and server memory per token.

Workload (issue 13): --sequences sequences x --tokens tokens of Llama-3-8B's KV shape (32
layers x 8 kv heads x head_dim 128, f16: 128 KiB per token), random values.
  kvcached  create_sequence + one append_stream per sequence (messages of <= 1 MiB, layer
            after layer), by default from the same-node client (its appends go through a
            staging region; --store grpc: bytes over gRPC); restore = fetch of every layer, over gRPC (Client(local_reads=False)) and, with the
            server's local_socket, from the mapped pool (Client()). --storage int4_g64 or
            nvfp4 stores low-bit (the restore then decodes, over gRPC). --compress-to
            int4_g64|nvfp4 stores f16 and then compresses every sequence to that format
            (Compress, storage only), reporting server memory after it too: the freed f16
            blocks' pages go back to the OS past the pool's keep_free_bytes
            (--keep-free-mib; default the server's: a quarter of the capacity, <= 1 GiB).
  redis     redis-server from Debian (no persistence), redis-py; one key per 256-token chunk
            holding that chunk's K and V of every layer (how LMCache parks KV), SET and GET
            pipelined per sequence.
Every restored byte is compared with what was stored (a low-bit restore: within the format's
error), outside the timed part. Server memory = the server process's RSS after storing minus before, per token.

  scripts/redis_comparison.py [--kvcached build/cachesvc/kvcached] [--redis-server
      redis-server] [--sequences 8] [--tokens 2048] [--storage f16|int4_g64|nvfp4]
      [--store local|grpc] [--compress-to int4_g64|nvfp4] [--keep-free-mib N] [--rounds 3]
      [--json FILE]

Medians over rounds (each round stores into a fresh server process). A measurement, not a
test: it asserts nothing about speed.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List

import numpy as np

import kvcache
from bench_kvcached import start_kvcached

LAYERS, KV_HEADS, HEAD_DIM = 32, 8, 128
CHUNK = 256  # tokens per Redis key


def rss_bytes(pid: int) -> int:
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def settled_rss(pid: int, timeout_s: float = 20.0) -> int:
    """The RSS once it stopped falling for half a second (kvcached returns free pages from a
    background thread)."""
    deadline = time.monotonic() + timeout_s
    low, since = rss_bytes(pid), time.monotonic()
    while time.monotonic() < deadline and time.monotonic() - since < 0.5:
        time.sleep(0.05)
        now = rss_bytes(pid)
        if now < low:
            low, since = now, time.monotonic()
    return low


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_kv(sequences: int, tokens: int) -> List[np.ndarray]:
    """Per sequence: [2 (K, V), layers, tokens, kv heads, head_dim] f16."""
    rng = np.random.default_rng(0)
    return [rng.standard_normal((2, LAYERS, tokens, KV_HEADS, HEAD_DIM), dtype=np.float32)
            .astype(np.float16) for _ in range(sequences)]


def run_kvcached(a: argparse.Namespace, kv: List[np.ndarray]) -> Dict[str, float]:
    tokens = a.sequences * a.tokens
    capacity = tokens * LAYERS * KV_HEADS * HEAD_DIM * 4 + (256 << 20)
    policy = None if a.storage == "f16" else kvcache.CompressionSpec(storage=a.storage)
    per_message = max(1, (1 << 20) // (KV_HEADS * HEAD_DIM * 2 * 2))
    with tempfile.TemporaryDirectory() as tmp:
        keep = "" if a.keep_free_mib < 0 else "keep_free_bytes: %d " % (a.keep_free_mib << 20)
        config = ('pools { name: "bench" capacity_bytes: %d %sgeometry { num_layers: %d '
                  'num_kv_heads: %d num_query_heads: %d head_dim: %d dtype: DTYPE_F16 } }\n'
                  'local_socket: "%s"\nlocal_socket_allow_same_uid: true\n' % (capacity, keep, LAYERS, KV_HEADS, 4 * KV_HEADS,
                                            HEAD_DIM, pathlib.Path(tmp) / "kvcached.sock"))
        proc, target = start_kvcached(a.kvcached, config, pathlib.Path(tmp))
        try:
            with kvcache.Client(target, timeout=600, local_reads=False,
                                max_message_bytes=64 << 20) as grpc_client, \
                    kvcache.Client(target, timeout=600, max_message_bytes=64 << 20) as local:
                before = rss_bytes(proc.pid)
                t0 = time.perf_counter()
                seqs = []
                writer = local if a.store == "local" else grpc_client
                for s in kv:
                    seq = writer.create_sequence(pool="bench", policy=policy).sequence_id
                    with writer.append_stream() as stream:
                        for at in range(0, a.tokens, per_message):
                            end = min(a.tokens, at + per_message)
                            for layer in range(LAYERS):
                                stream.append(seq, layer, at, s[0, layer, at:end],
                                              s[1, layer, at:end])
                    seqs.append(seq)
                store = time.perf_counter() - t0
                grown = rss_bytes(proc.pid) - before
                out = {"store_s": store, "server_bytes_per_token": grown / tokens}
                if a.compress_to:
                    t0 = time.perf_counter()
                    for seq in seqs:
                        writer.compress(seq, kvcache.CompressionSpec(storage=a.compress_to))
                    out["compress_s"] = time.perf_counter() - t0
                    out["server_bytes_per_token_compressed"] = (
                        settled_rss(proc.pid) - before) / tokens
                for name, client in (("restore_grpc_s", grpc_client), ("restore_local_s", local)):
                    out[name] = 0.0
                    for seq, s in zip(seqs, kv):
                        t0 = time.perf_counter()
                        result = client.fetch(seq)
                        out[name] += time.perf_counter() - t0
                        check(result, s, exact=a.storage == "f16" and not a.compress_to)
                        del result
                out["local_data_path"] = local.data_path  # type: ignore[assignment]
                out["store_path"] = writer.append_path  # type: ignore[assignment]
                return out
        finally:
            proc.kill()
            proc.wait()


def check(result: kvcache.FetchResult, s: np.ndarray, exact: bool) -> None:
    for layer in range(LAYERS):
        for head in range(KV_HEADS):
            h = result[(layer, head)]
            for got, want in ((h.keys, s[0, layer, :, head]), (h.values, s[1, layer, :, head])):
                if got.shape != want.shape:
                    sys.exit(f"kvcached restored shape {got.shape}, stored {want.shape}")
                if exact and not np.array_equal(got, want):
                    sys.exit(f"kvcached restored other bytes (layer {layer} head {head})")
                if not exact:
                    err = np.abs(got.astype(np.float32) - want.astype(np.float32)).mean()
                    if not err < 0.2:  # 4-bit codes of N(0, 1) values: ~0.1
                        sys.exit(f"kvcached restored mean error {err} (layer {layer})")


def run_redis(a: argparse.Namespace, kv: List[np.ndarray]) -> Dict[str, float]:
    import redis  # redis-py, pip install redis

    tokens = a.sequences * a.tokens
    port = free_port()
    proc = subprocess.Popen([a.redis_server, "--port", str(port), "--bind", "127.0.0.1",
                             "--save", "", "--appendonly", "no", "--protected-mode", "no"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        r = redis.Redis(host="127.0.0.1", port=port)
        for _ in range(100):
            try:
                r.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        before = rss_bytes(proc.pid)
        t0 = time.perf_counter()
        for i, s in enumerate(kv):
            pipe = r.pipeline(transaction=False)
            for at in range(0, a.tokens, CHUNK):
                # The chunk's K and V of every layer, one contiguous value (a copy, as any
                # client that packs a chunk for a byte store makes one).
                pipe.set(f"seq{i}:{at}", np.ascontiguousarray(s[:, :, at:at + CHUNK]).tobytes())
            pipe.execute()
        store = time.perf_counter() - t0
        grown = rss_bytes(proc.pid) - before
        restore = 0.0
        for i, s in enumerate(kv):
            t0 = time.perf_counter()
            pipe = r.pipeline(transaction=False)
            for at in range(0, a.tokens, CHUNK):
                pipe.get(f"seq{i}:{at}")
            blobs = pipe.execute()
            restore += time.perf_counter() - t0
            for at, blob in zip(range(0, a.tokens, CHUNK), blobs):  # not timed
                got = np.frombuffer(blob, dtype=np.float16).reshape(2, LAYERS, -1, KV_HEADS,
                                                                    HEAD_DIM)
                if not np.array_equal(got, s[:, :, at:at + CHUNK]):
                    sys.exit(f"redis restored other bytes (sequence {i}, token {at})")
        r.close()
        return {"store_s": store, "restore_s": restore, "server_bytes_per_token": grown / tokens}
    finally:
        proc.kill()
        proc.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kvcached", default="build/cachesvc/kvcached")
    ap.add_argument("--redis-server", default="redis-server")
    ap.add_argument("--sequences", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--storage", default="f16", choices=["f16", "int4_g64", "nvfp4"])
    ap.add_argument("--store", default="local", choices=["local", "grpc"])
    ap.add_argument("--compress-to", default="", choices=["", "int4_g64", "nvfp4"])
    ap.add_argument("--keep-free-mib", type=int, default=-1)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    if a.compress_to and a.storage != "f16":
        sys.exit("--compress-to compresses what was stored f16: leave --storage f16")
    kv = make_kv(a.sequences, a.tokens)
    tokens = a.sequences * a.tokens
    runs: Dict[str, List[Dict[str, float]]] = {"kvcached": [], "redis": []}
    for _ in range(a.rounds):
        runs["redis"].append(run_redis(a, kv))
        runs["kvcached"].append(run_kvcached(a, kv))

    def med(name: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[name])

    rd_store, rd_restore = tokens / med("redis", "store_s"), tokens / med("redis", "restore_s")
    kv_store = tokens / med("kvcached", "store_s")
    kv_grpc = tokens / med("kvcached", "restore_grpc_s")
    kv_local = tokens / med("kvcached", "restore_local_s")
    both = {
        "redis": tokens / (med("redis", "store_s") + med("redis", "restore_s")),
        "kvcached_grpc": tokens / (med("kvcached", "store_s") + med("kvcached", "restore_grpc_s")),
        "kvcached_local": tokens / (med("kvcached", "store_s") +
                                    med("kvcached", "restore_local_s")),
    }
    mem_rd = med("redis", "server_bytes_per_token")
    mem_kv = med("kvcached", "server_bytes_per_token")
    print(f"redis_comparison: {a.sequences} sequences x {a.tokens} tokens, Llama-3-8B KV shape "
          f"(128 KiB/token f16), kvcached storage {a.storage}, median of {a.rounds} rounds")
    if a.compress_to:
        print(f"kvcached restores read the sequences after Compress to {a.compress_to} (decoded)")
    print(f"{'':<34} {'store tok/s':>12} {'restore tok/s':>14} {'store+restore':>14} "
          f"{'server KiB/token':>17}")
    print(f"{'redis 7 (redis-py, pipelined)':<34} {rd_store:12.0f} {rd_restore:14.0f} "
          f"{both['redis']:14.0f} {mem_rd / 1024:17.1f}")
    print(f"{'kvcached, restore over gRPC':<34} {kv_store:12.0f} {kv_grpc:14.0f} "
          f"{both['kvcached_grpc']:14.0f} {mem_kv / 1024:17.1f}")
    print(f"{'kvcached, restore same-node':<34} {kv_store:12.0f} {kv_local:14.0f} "
          f"{both['kvcached_local']:14.0f} {mem_kv / 1024:17.1f}")
    print(f"kvcached vs redis, store+restore: gRPC {both['kvcached_grpc'] / both['redis']:.2f}x, "
          f"same-node {both['kvcached_local'] / both['redis']:.2f}x; server memory per token "
          f"{mem_rd / mem_kv:.2f}x less" if mem_kv > 0 else "")
    if a.compress_to:
        mem_c = med("kvcached", "server_bytes_per_token_compressed")
        print(f"after Compress to {a.compress_to} ({med('kvcached', 'compress_s'):.2f} s): "
              f"kvcached {mem_c / 1024:.1f} KiB/token = {mem_rd / mem_c:.2f}x less than redis "
              f"(keep_free_bytes: "
              f"{'server default' if a.keep_free_mib < 0 else str(a.keep_free_mib) + ' MiB'})")
    print(f"same-node path: {runs['kvcached'][-1]['local_data_path']}; "
          f"store path: {runs['kvcached'][-1]['store_path']}")
    if a.json:
        pathlib.Path(a.json).write_text(json.dumps(
            {"args": vars(a), "runs": runs, "store_restore_tokens_per_s": both,
             "server_bytes_per_token": {"redis": mem_rd, "kvcached": mem_kv}}, indent=1) + "\n")


if __name__ == "__main__":
    main()
