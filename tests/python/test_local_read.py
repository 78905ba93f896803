"""Same-node reads through the Python client against a real kvcached with a local_socket:
fetch() maps the host pool and returns exactly what the gRPC path returns (f16, bf16 and f32
pools, a layer subset, an unfinished layer, a StreamingLLM-compacted sequence), ending every
lease it took; records that would need decoding (INT4, or f16 asked as f32) come over gRPC
with the same result; a server without the socket, or a uid it refuses, leaves the client on
gRPC saying why."""

from __future__ import annotations

import os
from typing import Iterator

import numpy as np
import pytest

import kvcache
from conftest import LAYERS, Server, random_kv, start
from kvcache import CompressionSpec, StreamingLLM


def _socket_config(path: str, uids: str = "") -> str:
    return f'local_socket: "{path}"\n{uids}'


@pytest.fixture(scope="module")
def local_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("kvcached-local")
    s = start(tmp, _socket_config(str(tmp / "kvcached.sock")))
    yield s
    s.stop()


def _filled(c: kvcache.Client, pool: str, n: int, layers: int = LAYERS, policy=None) -> str:
    dtype = {"f16": np.float16, "bf16": np.uint16, "f32": np.float32}[pool]
    seq = c.create_sequence(pool=pool, policy=policy).sequence_id
    for layer in range(layers):
        k = random_kv(n, dtype=np.float32, seed=layer)
        v = random_kv(n, dtype=np.float32, seed=50 + layer)
        if pool == "bf16":  # bf16 travels as the top 16 bits of f32
            k, v = (k.view(np.uint32) >> 16).astype(np.uint16), (v.view(np.uint32) >> 16).astype(
                np.uint16)
        else:
            k, v = k.astype(dtype), v.astype(dtype)
        c.append(seq, layer, 0, k, v, dtype=pool)
    return seq


def _same(a: kvcache.FetchResult, b: kvcache.FetchResult) -> None:
    assert a.visible_tokens == b.visible_tokens and a.dtype == b.dtype
    assert sorted(a.heads) == sorted(b.heads)
    for key in a.heads:
        assert np.array_equal(a[key].positions, b[key].positions), key
        assert a[key].keys.dtype == b[key].keys.dtype and a[key].keys.shape == b[key].keys.shape
        assert a[key].keys.tobytes() == b[key].keys.tobytes(), key
        assert a[key].values.tobytes() == b[key].values.tobytes(), key


def test_fetch_from_the_mapped_pool_equals_fetch_over_grpc(local_server: Server) -> None:
    with kvcache.Client(local_server.target) as local, \
            kvcache.Client(local_server.target, local_reads=False) as remote:
        assert local.data_path == "grpc (no fetch yet)"
        seqs = [_filled(local, pool, 70) for pool in ("f16", "bf16", "f32")]
        ahead = _filled(local, "f16", 30, layers=1)  # layer 0 ahead of the others
        sink = _filled(local, "f16", 100)
        local.compress(sink, CompressionSpec(eviction=StreamingLLM(4, 30)))
        before = local.pool_stats().leases
        mapped = 0
        for seq in seqs + [ahead, sink]:
            for kwargs in ({}, {"layers": [2, 0]}, {"include_unfinished": True}):
                _same(local.fetch(seq, **kwargs), remote.fetch(seq, **kwargs))
                mapped += 1
        assert local.data_path.startswith("shared-memory (") and local.data_path.endswith(
            "kvcached.sock)"), local.data_path
        assert remote.data_path == "grpc (local_reads is off)"
        after = local.pool_stats().leases
        assert after.granted - before.granted == mapped  # every one read from the mapping
        assert after.released - before.released == mapped and after.active == 0

        # Records that would need decoding come over gRPC, equal all the same.
        int4 = _filled(local, "f16", 40, policy=CompressionSpec(storage="int4_g32"))
        _same(local.fetch(int4), remote.fetch(int4))
        _same(local.fetch(seqs[0], dtype="f32"), remote.fetch(seqs[0], dtype="f32"))
        assert local.pool_stats().leases.active == 0
        with pytest.raises(kvcache.NotFound):
            local.fetch("s-nothing")


def test_falls_back_to_grpc_and_says_why(server: Server,
                                         tmp_path_factory: pytest.TempPathFactory) -> None:
    with kvcache.Client(server.target) as c:  # the shared server has no local_socket
        seq = _filled(c, "f16", 20)
        _same(c.fetch(seq), kvcache.Client(server.target, local_reads=False).fetch(seq))
        assert c.data_path == "grpc (the server has no local_socket)"
    tmp = tmp_path_factory.mktemp("kvcached-local-refused")
    other_uid = os.geteuid() + 1
    refusing = start(tmp, _socket_config(str(tmp / "kvcached.sock"),
                                         f"local_socket_uids: {other_uid}\n"))
    try:
        with kvcache.Client(refusing.target) as c:
            seq = _filled(c, "f16", 20)
            assert len(c.fetch(seq).heads) == LAYERS * 2
            assert "may not map this server's pools" in c.data_path, c.data_path
    finally:
        refusing.stop()
