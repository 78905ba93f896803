"""Same-node reads through the Python client against a real kvcached with a local_socket:
fetch() maps the host pool and returns exactly what the gRPC path returns (f16, bf16 and f32
pools, a layer subset, an unfinished layer, a StreamingLLM-compacted sequence), ending every
lease it took; records in another format (INT4, or f16 asked as f32) come over gRPC with the
same result (decoded here with client_decode: test_record_decode.py); a server without the
socket, or a uid it refuses, leaves the client on gRPC saying why. AsyncClient takes the same
path (its reads off the event loop)."""

from __future__ import annotations

import asyncio
import os
import threading
from typing import Iterator

import numpy as np
import pytest

import kvcache
import kvcache._local as local_module
from conftest import (HEAD_DIM, LAYERS, Server, fill_after_restart, random_kv, start,
                      threads_calling)
from kvcache import CompressionSpec, StreamingLLM


def _socket_config(path: str, uids: str = "local_socket_allow_same_uid: true\n") -> str:
    # The test is the engine and runs as kvcached's uid, which the socket admits only when
    # told to.
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

        # Records in another format than the requested dtype's come over gRPC, equal all the
        # same.
        # same, and each result says the path it took while data_path keeps the decision.
        int4 = _filled(local, "f16", 40, policy=CompressionSpec(storage="int4_g32"))
        got = local.fetch(int4)
        _same(got, remote.fetch(int4))
        assert got.path == ("grpc (STORAGE_FORMAT_INT4_G32 records are decoded by the server "
                            "(client_decode is off))"), got.path
        _same(local.fetch(seqs[0], dtype="f32"), remote.fetch(seqs[0], dtype="f32"))
        assert local.fetch(seqs[0]).path == local.data_path
        assert local.data_path.startswith("shared-memory (")
        assert remote.fetch(seqs[0]).path == "grpc (local_reads is off)"
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
            assert "is kvcached's own uid, which may not connect" in c.data_path, c.data_path
    finally:
        refusing.stop()


def test_async_client_reads_the_mapped_pool_too(local_server: Server, server: Server) -> None:
    with kvcache.Client(local_server.target, local_reads=False) as remote:
        f16 = _filled(remote, "f16", 70)
        f32 = _filled(remote, "f32", 33)
        int4 = _filled(remote, "f16", 40, policy=CompressionSpec(storage="int4_g32"))
        want = {(seq, str(kw)): remote.fetch(seq, **kw)
                for seq in (f16, f32, int4)
                for kw in ({}, {"layers": [1]}, {"include_unfinished": True})}
        before = remote.pool_stats().leases

    async def run() -> None:
        async with kvcache.AsyncClient(local_server.target) as c:
            assert c.data_path == "grpc (no fetch yet)"
            loop_thread = threading.get_ident()
            with threads_calling(local_module.LocalReader, "read") as reads:
                # Concurrent fetches share the one reader (its socket requests are locked).
                got = await asyncio.gather(*[
                    c.fetch(seq, **kw)
                    for seq in (f16, f32, int4)
                    for kw in ({}, {"layers": [1]}, {"include_unfinished": True})])
            for (key, expected), result in zip(want.items(), got):
                _same(result, expected)
            assert c.data_path.startswith("shared-memory ("), c.data_path
            assert len(reads) == 9 and loop_thread not in reads  # never on the event loop
            with pytest.raises(kvcache.NotFound):
                await c.fetch("s-nothing")
        async with kvcache.AsyncClient(local_server.target, local_reads=False) as c:
            _same(await c.fetch(f16), want[(f16, "{}")])
            assert c.data_path == "grpc (local_reads is off)"
        async with kvcache.AsyncClient(server.target) as c:  # no local_socket there
            seq = (await c.create_sequence()).sequence_id
            k = random_kv(8)
            for layer in range(LAYERS):
                await c.append(seq, layer, 0, k, k)
            assert len((await c.fetch(seq)).heads) == LAYERS * 2
            assert c.data_path == "grpc (the server has no local_socket)"

    asyncio.run(run())
    with kvcache.Client(local_server.target, local_reads=False) as remote:
        after = remote.pool_stats().leases
        # Every fetch but the missing sequence's took a lease and ended it; the INT4 ones
        # then came over gRPC (client_decode is off).
        assert after.granted - before.granted == 9
        assert after.released - before.released == 9 and after.active == 0


def test_a_client_that_outlives_a_server_restart_reads_only_the_new_servers_kv(tmp_path) -> None:
    """kvcached is killed and started again on the same port and socket path: the client's
    mappings and staging region are the dead server's (their memfds live on while mapped) and
    the new server hands out the same block ids, so reading on through them would return the
    old server's KV as the new sequence's. The client must notice and serve the new bytes."""
    config = _socket_config(str(tmp_path / "kvcached.sock"))
    first = start(tmp_path, config)
    with kvcache.Client(first.target) as c:
        old = _filled(c, "f16", 40)
        assert c.fetch(old)[(0, 0)].keys.shape == (40, HEAD_DIM)
        assert c.data_path.startswith("shared-memory") and c.append_path.startswith("staged")
        first.stop()
        second = start(tmp_path, config, listen=first.target)
        try:
            fill_after_restart(c)
            assert c.data_path.startswith("shared-memory"), c.data_path
            assert c.append_path.startswith("staged"), c.append_path
            with pytest.raises(kvcache.NotFound):
                c.fetch(old)
        finally:
            second.stop()
