"""The Python client's decode of stored records (kvcache/_decode.py, client_decode=True)
against the server's: a sequence stored in every storage format (with and without a raw
recent window), read through the mapped pool and over a transfer channel into f16, bf16 and
f32, equals a gRPC Fetch
(decoded by kvcached) bit for bit; values span zeros, tiny and large magnitudes so every code
and scale path is reached."""

from __future__ import annotations

from typing import Iterator

import numpy as np
import pytest

import kvcache
from conftest import KV_HEADS, LAYERS, Server, start
from kvcache import CompressionSpec
from kvcache._decode import _E4M3, _to_bf16
from test_local_read import _same

FORMATS = ("fp8_e4m3", "int8", "int4_g32", "int4_g64", "nvfp4")
# head_dim 128 (Llama's): the test pools' 32 is too narrow for INT4 g64's groups. Pool name:
# dtype.
WIDE = {"w16": "F16", "wbf16": "BF16", "w32": "F32"}
HEAD_DIM = 128


@pytest.fixture(scope="module")
def decode_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("kvcached-decode")
    pools = "".join(
        f'pools {{ name: "{name}" capacity_bytes: 8388608 geometry {{ num_layers: {LAYERS} '
        f'num_kv_heads: {KV_HEADS} num_query_heads: 4 head_dim: {HEAD_DIM} '
        f'dtype: DTYPE_{dtype} }} }}\n' for name, dtype in WIDE.items())
    s = start(tmp, pools + f'local_socket: "{tmp / "kvcached.sock"}"\n'
              'local_socket_allow_same_uid: true\ntransfer_listen: "127.0.0.1:0"\n')
    yield s
    s.stop()


def _values(n: int, seed: int) -> np.ndarray:
    """[n, kv_heads, head_dim] float32: normal values, a zero token, a token of tiny values,
    a token of large ones, and single outliers."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, KV_HEADS, HEAD_DIM)).astype(np.float32)
    x[1] = 0
    x[2] *= 1e-6
    x[3] *= 3000
    x[4:, :, 5] *= 40
    return x


def _stored(c: kvcache.Client, pool: str, storage: str, residual: int, n: int = 70) -> str:
    policy = CompressionSpec(storage=storage, residual_tokens=residual)
    seq = c.create_sequence(pool=pool, policy=policy).sequence_id
    for layer in range(LAYERS):
        k, v = _values(n, layer), _values(n, 100 + layer)
        if pool == "wbf16":
            k, v = (_to_bf16(x) for x in (k, v))
            c.append(seq, layer, 0, k, v, dtype="bf16")
        else:
            dtype = np.float16 if pool == "w16" else np.float32
            c.append(seq, layer, 0, k.astype(dtype), v.astype(dtype))
    return seq


@pytest.mark.parametrize("storage", FORMATS)
def test_decoded_records_equal_the_servers_on_every_path(decode_server: Server,
                                                         storage: str) -> None:
    with kvcache.Client(decode_server.target, client_decode=True) as local, \
            kvcache.Client(decode_server.target, local_reads=False, client_decode=True) \
            as transfer, \
            kvcache.Client(decode_server.target, local_reads=False, transfers=False) as grpc_:
        sends = decode_server.rpc_count("SendLease")
        fetches = decode_server.rpc_count("Fetch")
        reads = 0
        for pool in WIDE:
            for residual in (0, 16):
                seq = _stored(grpc_, pool, storage, residual)
                for dtype in (None, "f16", "bf16", "f32"):
                    want = grpc_.fetch(seq, dtype=dtype)
                    assert len(want.heads) == LAYERS * KV_HEADS
                    _same(local.fetch(seq, dtype=dtype), want)
                    _same(transfer.fetch(seq, dtype=dtype), want)
                    reads += 1
        assert local.data_path.startswith("shared-memory ("), local.data_path
        assert transfer.data_path.startswith("transfer ("), transfer.data_path
        # Every read but gRPC's own went through a lease: none fell back to a Fetch.
        assert decode_server.rpc_count("Fetch") - fetches == reads
        assert decode_server.rpc_count("SendLease") - sends == reads


def test_the_fp8_table_is_the_kernels_e4m3() -> None:
    # Spot values of E4M3ToFloat (fp_formats.h): smallest subnormal, 1.0, the maximum 448,
    # a negative, and the NaN codes.
    assert _E4M3[0x01] == np.float32(2.0 ** -9)
    assert _E4M3[0x38] == 1.0 and _E4M3[0x7E] == 448.0 and _E4M3[0xB8] == -1.0
    assert np.isnan(_E4M3[0x7F]) and np.isnan(_E4M3[0xFF])
