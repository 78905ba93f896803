#!/usr/bin/env python3
"""What a same-node fetch and a fetch over a transfer channel cost in Python against a gRPC
fetch and a NumPy copy of the same bytes, through a real kvcached (with a local_socket and a
transfer_listen) on this node and the Python client (pip install ./client/python).

A sequence of --tokens tokens of Llama-3-8B's KV shape (32 layers x 8 kv heads x head_dim 128,
f16: 128 KiB per token) is appended once; each round then measures, in the same run:
  copy     np.copyto of the same bytes between two preallocated arrays (the baseline)
  grpc      Client(local_reads=False, transfers=False).fetch(seq)
  local     Client().fetch(seq): a lease, each lane gathered from the mapped pool, released
  transfer  Client(local_reads=False).fetch(seq): a lease, its blocks received over the
            transfer channel (TCP over loopback here), released, each lane gathered
and checks that every fetch returns the appended bytes. With --storage (int8, fp8_e4m3,
int4_g32, int4_g64, nvfp4) the sequence is stored in that format: gRPC's fetch is decoded by
the server, the others by the client (client_decode=True: kvcache/_decode.py), and they must
agree bit for bit; GB/s then counts the dense f16 bytes returned.

  scripts/local_read_benchmark.py [--kvcached build/cachesvc/kvcached] [--tokens 2048]
                                  [--storage FORMAT] [--rounds 5] [--json FILE]

Medians over rounds. A measurement, not a test: it asserts nothing about speed.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import tempfile
import time

import numpy as np

import kvcache
from bench_kvcached import start_kvcached

LAYERS, KV_HEADS, HEAD_DIM = 32, 8, 128


def start(binary: str, capacity: int, tmp: pathlib.Path):
    return start_kvcached(binary, (
        'pools { name: "bench" capacity_bytes: %d geometry { num_layers: %d num_kv_heads: %d '
        'num_query_heads: %d head_dim: %d dtype: DTYPE_F16 } }\nlocal_socket: "%s"\nlocal_socket_allow_same_uid: true\n'
        'transfer_listen: "127.0.0.1:0"\n'
        % (capacity, LAYERS, KV_HEADS, 4 * KV_HEADS, HEAD_DIM, tmp / "kvcached.sock")), tmp)


def check(result: kvcache.FetchResult, keys: np.ndarray, values: np.ndarray, tokens: int) -> None:
    """Exactly the appended bytes (raw f16)."""
    for layer in range(LAYERS):
        for head in range(KV_HEADS):
            h = result[(layer, head)]
            if (h.keys.shape != (tokens, HEAD_DIM) or not np.array_equal(h.keys, keys[:, head])
                    or not np.array_equal(h.values, values[:, head])):
                sys.exit(f"fetch returned other bytes for layer {layer} head {head}")


def check_close(result: kvcache.FetchResult, keys: np.ndarray, tokens: int) -> None:
    """Within a low-bit format's error of the appended keys."""
    for layer in range(LAYERS):
        for head in range(KV_HEADS):
            h = result[(layer, head)]
            err = np.abs(h.keys.astype(np.float32) - keys[:, head].astype(np.float32)).mean()
            if h.keys.shape != (tokens, HEAD_DIM) or not err < 0.2:
                sys.exit(f"fetch returned keys {err:.3f} off for layer {layer} head {head}")


def same(a: kvcache.FetchResult, b: kvcache.FetchResult) -> None:
    for key in a.heads:
        if (a[key].keys.tobytes() != b[key].keys.tobytes()
                or a[key].values.tobytes() != b[key].values.tobytes()):
            sys.exit(f"the client's decode differs from the server's at {key}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kvcached", default="build/cachesvc/kvcached")
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--storage", default="", help="store in this low-bit format")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    token_bytes = LAYERS * KV_HEADS * HEAD_DIM * 2 * 2
    total = args.tokens * token_bytes
    rng = np.random.default_rng(0)
    keys = rng.standard_normal((args.tokens, KV_HEADS, HEAD_DIM)).astype(np.float16)
    values = rng.standard_normal((args.tokens, KV_HEADS, HEAD_DIM)).astype(np.float16)
    with tempfile.TemporaryDirectory() as tmp:
        proc, target = start(args.kvcached, total + total // 4 + (64 << 20), pathlib.Path(tmp))
        try:
            decode = bool(args.storage)
            with kvcache.Client(target, timeout=600, max_message_bytes=64 << 20,
                                client_decode=decode) as local, \
                    kvcache.Client(target, timeout=600, local_reads=False, transfers=False,
                                   max_message_bytes=64 << 20) as remote, \
                    kvcache.Client(target, timeout=600, local_reads=False,
                                   client_decode=decode) as transfer:
                policy = kvcache.CompressionSpec(storage=args.storage) if args.storage else None
                seq = remote.create_sequence(pool="bench", policy=policy).sequence_id
                per_message = max(1, (1 << 20) // (KV_HEADS * HEAD_DIM * 2))
                with remote.append_stream() as stream:
                    for at in range(0, args.tokens, per_message):
                        n = min(per_message, args.tokens - at)
                        for layer in range(LAYERS):
                            stream.append(seq, layer, at, keys[at:at + n], values[at:at + n])
                src = np.ones(total, dtype=np.uint8)
                dst = np.zeros(total, dtype=np.uint8)
                times = {"copy": [], "grpc": [], "local": [], "transfer": []}
                for _ in range(args.rounds):
                    t0 = time.perf_counter()
                    np.copyto(dst, src)
                    times["copy"].append(time.perf_counter() - t0)
                    decoded = None
                    for name, client in (("grpc", remote), ("local", local),
                                         ("transfer", transfer)):
                        t0 = time.perf_counter()
                        result = client.fetch(seq)
                        times[name].append(time.perf_counter() - t0)
                        if not args.storage:
                            check(result, keys, values, args.tokens)
                        elif decoded is None:
                            check_close(result, keys, args.tokens)
                            decoded = result
                        else:
                            same(result, decoded)
                        del result
                    del decoded
                path = local.data_path
                transfer_path = transfer.data_path
        finally:
            proc.kill()
            proc.wait()
    gbps = {k: total / 1e9 / statistics.median(v) for k, v in times.items()}
    print(f"local_read_benchmark: {args.tokens} tokens x {LAYERS} layers x {KV_HEADS} kv heads x "
          f"{HEAD_DIM} f16 = {total / 2**20:.0f} MiB, stored {args.storage or 'f16'}, "
          f"median of {args.rounds} rounds")
    print(f"{'measurement':<34} {'GB/s':>8} {'vs copy':>9} {'vs gRPC':>9}")
    for name, label in (("copy", "NumPy copy of the same bytes"), ("grpc", "fetch over gRPC"),
                        ("local", "fetch, same-node mapping"),
                        ("transfer", "fetch, transfer channel")):
        print(f"{label:<34} {gbps[name]:8.3f} {gbps[name] / gbps['copy']:9.3f} "
              f"{gbps[name] / gbps['grpc']:9.3f}")
    print(f"data paths: {path}; {transfer_path}")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(
            {"tokens": args.tokens, "bytes": total, "storage": args.storage or "f16",
             "rounds": args.rounds, "gbps": gbps,
             "data_path": path, "transfer_data_path": transfer_path}) + "\n")


if __name__ == "__main__":
    main()
