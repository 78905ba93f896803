#!/usr/bin/env python3
"""Writes the seed corpora of tests/fuzz (corpus/<target>/) from scratch.

Seeds are valid inputs that reach deep: for request_fuzzer, one request of every RPC naming
the sequence "fz" the fuzzer creates before each input (pool "f": 2 layers, 2 kv heads,
4 query heads, head_dim 32, f16, RoPE; pool "b": f32, 1 layer, 1 kv head, d 16), encoded by
hand in the protobuf wire format so no generated Python code is needed. Deterministic:
rerunning gives the same files.  Usage: tests/fuzz/make_corpus.py [OUT_DIR]
"""
import os
import random
import struct
import sys


def varint(n):
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def vi(field, n):  # varint field
    return varint(field << 3) + varint(n)


def ld(field, payload):  # length-delimited field (bytes, string, message, packed)
    if isinstance(payload, str):
        payload = payload.encode()
    return varint(field << 3 | 2) + varint(len(payload)) + payload


def packed(field, values):
    return ld(field, b"".join(varint(v) for v in values))


def f16_bytes(n, seed):
    rng = random.Random(seed)
    return b"".join(struct.pack("<e", rng.uniform(-2, 2)) for _ in range(n))


def f32_bytes(n, seed):
    rng = random.Random(seed)
    return b"".join(struct.pack("<f", rng.uniform(-1, 1)) for _ in range(n))


F16, F32 = 2, 1  # DType
STORED = 2  # FetchFormat


def streaming(sinks, window, rerotate=False):
    return ld(1, vi(1, sinks) + vi(2, window) + vi(3, int(rerotate)))


def snapkv(window, budget, kernel, pooling=0):
    return ld(2, vi(1, window) + vi(2, budget) + vi(3, kernel) + vi(4, pooling))


def h2o(heavy, recent):
    return ld(3, vi(1, heavy) + vi(2, recent))


def layer_queries(layer, n, first):
    return (vi(1, layer) + vi(2, F32) + ld(3, f32_bytes(n * 4 * 32, layer + first)) +
            packed(4, range(first, first + n)))


def request_seeds():
    append = (ld(1, "fz") + vi(2, 0) + vi(3, 12) + vi(4, 2) + vi(5, F16) +
              ld(6, f16_bytes(2 * 2 * 32, 1)) + ld(7, f16_bytes(2 * 2 * 32, 2)))
    attend = (ld(1, "fz") + vi(2, 1) + vi(3, F32) + ld(4, f32_bytes(4 * 32, 3)) +
              packed(5, [12]) + vi(6, 1))
    prefix = ld(1, "m") + ld(2, "salt") + packed(3, range(100, 140))
    seeds = {
        "create_int4_streaming": (0, ld(1, "f") + ld(3, "c1") +
                                  ld(4, streaming(2, 4, True) + vi(4, 6) + vi(5, 2))),
        "create_pool_b_nvfp4": (0, ld(1, "b") + ld(2, "tenant-a") + ld(4, vi(4, 8))),
        "append": (1, append),
        "append_big": (1, ld(1, "fz") + vi(2, 1) + vi(3, 12) + vi(4, 40) +
                       ld(6, bytes(40 * 128)) + ld(7, bytes(40 * 128))),
        "get": (2, ld(1, "fz")),
        "release": (3, ld(1, "fz")),
        "compress_streaming_fp8": (4, ld(1, "fz") + ld(2, streaming(1, 6, True) + vi(4, 4))),
        "compress_snapkv": (4, ld(1, "fz") + ld(2, snapkv(2, 6, 3) + vi(4, 5)) +
                            ld(3, layer_queries(0, 2, 10)) + ld(3, layer_queries(1, 2, 10))),
        "compress_h2o_int4": (4, ld(1, "fz") + ld(2, h2o(3, 4) + vi(4, 7) + vi(5, 2))),
        "compress_nvfp4": (4, ld(1, "fz") + ld(2, vi(4, 8))),
        "attend": (5, attend),
        "fetch_stored": (6, ld(1, "fz") + vi(3, STORED)),
        "fetch_dense_f32": (6, ld(1, "fz") + packed(2, [1]) + vi(3, 1) + vi(4, F32) +
                            vi(5, 4096) + vi(6, 1)),
        "append_stream": (7, append),
        "attend_stream": (8, attend),
        "list_pools": (9, b""),
        "pool_stats": (10, ld(1, "f")),
        "list_sequences": (11, vi(3, 5)),
        "evict": (12, ld(1, "fz")),
        "drain": (13, b""),
        "drain_resume": (13, vi(1, 1)),
        "list_tenants": (14, b""),
        "fork": (15, ld(1, "fz") + ld(2, "fz-fork")),
        "lookup_prefix": (16, ld(1, "f") + ld(2, prefix) + vi(3, 6)),
        "publish_prefix": (17, ld(1, "fz") + ld(2, prefix)),
        "lease_all": (18, ld(1, "fz")),
        "lease_layer_ttl": (18, ld(1, "fz") + packed(2, [1]) + vi(3, 2000)),
        "renew_lease": (19, ld(1, "l-0000000000000000") + vi(2, 1000)),
        "release_lease": (20, ld(1, "l-0000000000000000")),
        "open_transfer": (21, b""),
        "send_lease": (22, ld(1, "t-0000000000000000") + ld(2, "l-0000000000000000") + vi(3, 1)),
        "close_transfer": (23, ld(1, "t-0000000000000000")),
        "list_leases": (24, ld(1, "tenant-a") + ld(2, "f")),
        "end_lease": (25, ld(2, "l-0000000000000000")),
        "server_info": (26, b""),
    }
    return {name: bytes([rpc]) + msg for name, (rpc, msg) in seeds.items()}


def op_sequence_seeds():
    # Any bytes are a valid program; these lengths give short and long runs.
    rng = random.Random(18)
    return {f"random_{n}": bytes(rng.randrange(256) for _ in range(n))
            for n in (16, 64, 256, 1024, 4096)}


def codec_seeds():
    # Header: format, head_dim index (16, 32, 64, 128), output dtype, group index; then
    # f16 rows and query bytes.
    seeds = {}
    for fmt in range(8):
        for dim_index, d in ((1, 32), (3, 128)):
            header = bytes([fmt, dim_index, fmt % 3, fmt % 4])
            seeds[f"format{fmt}_d{d}"] = header + f16_bytes(10 * d, fmt) + bytes(range(256))
    return seeds


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "corpus")
    for target, seeds in (("request_fuzzer", request_seeds()),
                          ("op_sequence_fuzzer", op_sequence_seeds()),
                          ("codec_fuzzer", codec_seeds())):
        os.makedirs(os.path.join(out, target), exist_ok=True)
        for name, data in seeds.items():
            with open(os.path.join(out, target, name), "wb") as f:
                f.write(data)


if __name__ == "__main__":
    main()
