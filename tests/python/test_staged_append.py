"""Staged appends through the Python client against a real kvcached with a local_socket:
append() and append_stream() on the server's node copy keys and values into a staging region
and send offsets; the pool then holds exactly what a gRPC append of the same arrays stores
(f16, bf16, f32 pools, INT4 storage, unary and stream, layers interleaved as a prefill does),
a rejected message breaks the stream with its index and the applied count, chunks larger than
the region go as bytes, and a server without the socket leaves appends on gRPC saying why.
AsyncClient stages the same way, copying large chunks off the event loop."""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Iterator, List, Tuple

import numpy as np
import pytest

import kvcache
import kvcache._codec as codec_module
from conftest import LAYERS, Server, random_kv, start
from kvcache import CompressionSpec


@pytest.fixture(scope="module")
def local_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("kvcached-staged")
    s = start(tmp, f'local_socket: "{tmp / "kvcached.sock"}"\nlocal_socket_allow_same_uid: true\n')
    yield s
    s.stop()


def _arrays(pool: str, n: int, seed: int) -> List[Tuple[np.ndarray, np.ndarray]]:
    out = []
    for layer in range(LAYERS):
        k = random_kv(n, dtype=np.float32, seed=seed + layer)
        v = random_kv(n, dtype=np.float32, seed=seed + 50 + layer)
        if pool == "bf16":  # bf16 travels as the top 16 bits of f32
            k, v = ((k.view(np.uint32) >> 16).astype(np.uint16),
                    (v.view(np.uint32) >> 16).astype(np.uint16))
        else:
            dt = np.float16 if pool == "f16" else np.float32
            k, v = k.astype(dt), v.astype(dt)
        out.append((k, v))
    return out


def _store(c: kvcache.Client, pool: str, kv: List[Tuple[np.ndarray, np.ndarray]], step: int,
           stream: bool, policy=None) -> str:
    seq = c.create_sequence(pool=pool, policy=policy).sequence_id
    n = kv[0][0].shape[0]
    if stream:
        with c.append_stream() as s:
            for at in range(0, n, step):
                for layer, (k, v) in enumerate(kv):
                    s.append(seq, layer, at, k[at:at + step], v[at:at + step], dtype=pool)
        assert s.result is not None and s.result.messages == LAYERS * -(-n // step)
    else:
        for at in range(0, n, step):
            for layer, (k, v) in enumerate(kv):
                c.append(seq, layer, at, k[at:at + step], v[at:at + step], dtype=pool)
    return seq


def _same_kv(reader: kvcache.Client, a: str, b: str) -> None:
    x, y = reader.fetch(a), reader.fetch(b)
    assert x.visible_tokens == y.visible_tokens > 0 and sorted(x.heads) == sorted(y.heads)
    for key in x.heads:
        assert x[key].keys.tobytes() == y[key].keys.tobytes(), key
        assert x[key].values.tobytes() == y[key].values.tobytes(), key


def test_staged_appends_store_what_grpc_appends_store(local_server: Server) -> None:
    with kvcache.Client(local_server.target) as local, \
            kvcache.Client(local_server.target, local_reads=False) as remote:
        assert local.append_path == "grpc (no append yet)"
        cases = [(pool, None) for pool in ("f16", "bf16", "f32")]
        cases.append(("f16", CompressionSpec(storage="int4_g32")))
        for i, (pool, policy) in enumerate(cases):
            kv = _arrays(pool, 90, seed=10 * i)
            for stream in (False, True):
                mine = _store(local, pool, kv, 32, stream, policy)
                theirs = _store(remote, pool, kv, 32, stream, policy)
                _same_kv(remote, mine, theirs)
        assert local.append_path == f"staged ({64 << 20}-byte region)"
        assert remote.append_path == "grpc (local_reads is off)"

        # A rejected message: finish() names it and how many were applied before it broke.
        kv = _arrays("f16", 8, seed=3)
        seq = local.create_sequence(pool="f16").sequence_id
        s = local.append_stream()
        s.append(seq, 0, 0, *kv[0])
        s.append(seq, 1, 5, *kv[1])  # a gap: layer 1 has no tokens
        with pytest.raises(kvcache.FailedPrecondition) as e:
            s.finish()
        assert "message 1 (layer 1, start_position 5) rejected" in e.value.message
        assert "1 messages were applied" in e.value.message


def test_chunks_larger_than_the_region_go_as_bytes(local_server: Server) -> None:
    # 8 KiB: a 32-token f16 chunk (2 x 4 KiB at 2 kv heads x 32) fills it; 40 tokens do not fit.
    with kvcache.Client(local_server.target, staging_bytes=8192) as small, \
            kvcache.Client(local_server.target, local_reads=False) as remote:
        kv = _arrays("f16", 120, seed=7)
        for step in (16, 40):
            for stream in (False, True):
                _same_kv(remote, _store(small, "f16", kv, step, stream),
                         _store(remote, "f16", kv, step, stream))
        assert small.append_path == "staged (8192-byte region)"


def test_a_server_without_the_socket_keeps_appends_on_grpc(tmp_path) -> None:
    s = start(tmp_path, "")
    try:
        with kvcache.Client(s.target) as c:
            kv = _arrays("f16", 20, seed=1)
            _store(c, "f16", kv, 20, stream=True)
            assert c.append_path == "grpc (the server has no local_socket)"
    finally:
        s.stop()


async def _store_async(c: kvcache.AsyncClient, pool: str, kv: List[Tuple[np.ndarray, np.ndarray]],
                       step: int, stream: bool, policy=None) -> str:
    seq = (await c.create_sequence(pool=pool, policy=policy)).sequence_id
    n = kv[0][0].shape[0]
    if stream:
        async with c.append_stream() as s:
            for at in range(0, n, step):
                for layer, (k, v) in enumerate(kv):
                    await s.append(seq, layer, at, k[at:at + step], v[at:at + step], dtype=pool)
        assert s.result is not None and s.result.messages == LAYERS * -(-n // step)
    else:
        for at in range(0, n, step):
            # the layers of one step concurrently: appends of different layers may overlap
            await asyncio.gather(*[
                c.append(seq, layer, at, k[at:at + step], v[at:at + step], dtype=pool)
                for layer, (k, v) in enumerate(kv)])
    return seq


def test_async_client_stages_appends_too(local_server: Server, server: Server,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    staged: List[Tuple[int, int]] = []  # (bytes of K + V, thread) of each staged chunk
    real = codec_module.stage_append

    def recording(*args: Any) -> Any:
        out = real(*args)
        if out is not None:
            staged.append((args[3].nbytes + args[4].nbytes, threading.get_ident()))
        return out

    monkeypatch.setattr(codec_module, "stage_append", recording)

    async def run() -> None:
        loop_thread = threading.get_ident()
        with kvcache.Client(local_server.target, local_reads=False) as remote:
            async with kvcache.AsyncClient(local_server.target) as c:
                assert c.append_path == "grpc (no append yet)"
                cases = [(pool, None) for pool in ("f16", "bf16", "f32")]
                cases.append(("f16", CompressionSpec(storage="int4_g32")))
                for i, (pool, policy) in enumerate(cases):
                    kv = _arrays(pool, 90, seed=10 * i)
                    for stream in (False, True):
                        mine = await _store_async(c, pool, kv, 32, stream, policy)
                        theirs = _store(remote, pool, kv, 32, stream, policy)
                        _same_kv(remote, mine, theirs)
                assert c.append_path == f"staged ({64 << 20}-byte region)"
                # Layer by layer, many small chunks: each layer's messages must reach the
                # server in order although up to 4 are in flight.
                kv = _arrays("f16", 96, seed=4)
                seq = (await c.create_sequence(pool="f16")).sequence_id
                async with c.append_stream() as s:
                    for layer, (k, v) in enumerate(kv):
                        for at in range(0, 96, 4):
                            await s.append(seq, layer, at, k[at:at + 4], v[at:at + 4])
                _same_kv(remote, seq, _store(remote, "f16", kv, 96, stream=False))
                # 600 f32 tokens are 600 KiB of K + V: copied on an executor thread; the
                # chunks above on the loop (a thread hop costs more than their copy).
                kv = _arrays("f32", 600, seed=5)
                for stream in (False, True):
                    _same_kv(remote, await _store_async(c, "f32", kv, 600, stream),
                             _store(remote, "f32", kv, 600, stream))
                small = [t for n, t in staged if n < 256 << 10]
                large = [t for n, t in staged if n >= 256 << 10]
                assert len(small) == (4 * 2 * 3 + 24) * LAYERS and set(small) == {loop_thread}
                assert len(large) == 2 * LAYERS and loop_thread not in large

                # A rejected message: finish() names it and how many were applied.
                kv = _arrays("f16", 8, seed=3)
                seq = (await c.create_sequence(pool="f16")).sequence_id
                s = c.append_stream()
                await s.append(seq, 0, 0, *kv[0])
                await s.append(seq, 1, 5, *kv[1])  # a gap: layer 1 has no tokens
                with pytest.raises(kvcache.FailedPrecondition) as e:
                    await s.finish()
                assert "message 1 (layer 1, start_position 5) rejected" in e.value.message
                assert "1 messages were applied" in e.value.message
                with pytest.raises(kvcache.FailedPrecondition):  # unary: the same error
                    await c.append(seq, 1, 5, *kv[1])

            async with kvcache.AsyncClient(local_server.target, staging_bytes=0) as c:
                await _store_async(c, "f16", _arrays("f16", 10, seed=1), 10, stream=True)
                assert c.append_path == "grpc (staging_bytes is 0)"
            async with kvcache.AsyncClient(server.target) as c:  # no local_socket there
                await _store_async(c, "f16", _arrays("f16", 10, seed=1), 10, stream=False)
                assert c.append_path == "grpc (the server has no local_socket)"

    asyncio.run(run())
