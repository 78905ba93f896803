"""The prefix cache through the client: a prefilled sequence is published, lookups count its
whole 16-token blocks, a sequence created with the prefix starts with them (the same bytes),
pool statistics count it all, bad requests get the status codes the contract names, and both
prefix calls are retried on UNAVAILABLE."""

from __future__ import annotations

import asyncio
import pathlib
import socket
from typing import Dict, Iterator, List, Tuple

import grpc
import grpc.aio
import numpy as np
import pytest

import kvcache
from conftest import KV_HEADS, LAYERS, Server, random_kv, start
from kvcache import CompressionSpec, Prefix

BLOCK = 16
# One cached entry: a 16-token f16 block of keys and values in every (layer, kv head) lane.
ENTRY_BYTES = LAYERS * KV_HEADS * 2 * BLOCK * 32 * 2


@pytest.fixture(scope="module")
def prefix_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """Its own kvcached: the cache outlives releases (it would hold the shared server's pool
    bytes) and the statistics below are exact counts."""
    s = start(tmp_path_factory.mktemp("kvcached-prefix"))
    yield s
    s.stop()


@pytest.fixture()
def pc(prefix_server: Server) -> Iterator[kvcache.Client]:
    with kvcache.Client(prefix_server.target, timeout=20) as c:
        yield c


class _Counter(grpc.UnaryUnaryClientInterceptor):
    def __init__(self) -> None:
        self.calls = 0

    def intercept_unary_unary(self, continuation, details, request):
        self.calls += 1
        return continuation(details, request)


class _AioCounter(grpc.aio.UnaryUnaryClientInterceptor):
    def __init__(self) -> None:
        self.calls = 0

    async def intercept_unary_unary(self, continuation, details, request):
        self.calls += 1
        return await continuation(details, request)


def _dead_port() -> str:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    return f"127.0.0.1:{port}"


def _ids(n: int, first: int) -> List[int]:
    return list(range(first, first + n))


def _prefill(client: kvcache.Client, seq, start: int, n: int,
             seed: int) -> Dict[int, Tuple[np.ndarray, np.ndarray]]:
    sent = {}
    for layer in range(LAYERS):
        k, v = random_kv(n, seed=seed * 100 + layer), random_kv(n, seed=seed * 100 + 50 + layer)
        client.append(seq, layer, start, k, v)
        sent[layer] = (k, v)
    return sent


def _head_bytes(kv: kvcache.FetchResult, limit: int) -> Dict[Tuple[int, int], bytes]:
    """Keys and values of each head's tokens at positions < limit."""
    out = {}
    for key, h in kv.heads.items():
        keep = h.positions < limit
        out[key] = h.keys[keep].tobytes() + h.values[keep].tobytes()
    return out


def test_publish_lookup_and_attach(pc: kvcache.Client) -> None:
    doc = _ids(41, 1000)  # 2 whole blocks + 9 tokens
    prefix = Prefix("test-model", doc)
    first = pc.create_sequence(pool="f16")
    assert first.attached_tokens == 0
    sent = _prefill(pc, first, 0, 41, seed=1)

    r = pc.publish_prefix(first, prefix)
    assert isinstance(r, kvcache.PublishResult)
    assert (r.published_tokens, r.new_tokens) == (32, 32)
    r = pc.publish_prefix(first.sequence_id, prefix)
    assert (r.published_tokens, r.new_tokens) == (32, 0), "publishing again adds nothing"

    assert pc.lookup_prefix(prefix, pool="f16") == 32
    assert pc.lookup_prefix(Prefix("test-model", np.array(doc, np.int64)), "f16") == 32
    assert pc.lookup_prefix(Prefix("test-model", doc[:31]), "f16") == 16  # whole blocks
    assert pc.lookup_prefix(Prefix("test-model", doc + _ids(100, 5)), "f16") == 32
    assert pc.lookup_prefix(Prefix("test-model", _ids(41, 5)), "f16") == 0
    assert pc.lookup_prefix(Prefix("other-model", doc), "f16") == 0
    assert pc.lookup_prefix(Prefix("test-model", doc, salt="s"), "f16") == 0
    assert pc.lookup_prefix(prefix, "f16", storage="int8") == 0  # another format
    assert pc.lookup_prefix(prefix, "f32") == 0  # another pool
    assert pc.lookup_prefix(prefix) == 32  # "" = the first pool, f16

    second = pc.create_sequence(pool="f16", prefix=prefix)
    assert (second.attached_tokens, second.visible_tokens) == (32, 32)
    info = pc.get_sequence(second)
    assert info.attached_tokens == 32 and list(info.layer_tokens) == [32] * LAYERS
    _prefill(pc, second, 32, 20, seed=2)  # its own question after the shared document
    assert pc.get_sequence(second).visible_tokens == 52
    got = pc.fetch(second)
    assert _head_bytes(got, 32) == _head_bytes(pc.fetch(first), 32)
    for (layer, head), h in got.heads.items():  # and they are the bytes the first appended
        k, v = sent[layer]
        assert h.keys[:32].tobytes() == k[:32, head].tobytes()
        assert h.values[:32].tobytes() == v[:32, head].tobytes()
    assert h.positions.tolist() == list(range(52))

    # The document outlives the sequence that published it.
    pc.release(first)
    third = pc.create_sequence(pool="f16", prefix=prefix)
    assert third.attached_tokens == 32
    pc.release(second)
    pc.release(third)
    assert pc.lookup_prefix(prefix, "f16") == 32


def test_pool_stats_count_the_cache(tmp_path: pathlib.Path) -> None:
    server = start(tmp_path)  # fresh counters
    try:
        with kvcache.Client(server.target, timeout=20) as c:
            empty = c.pool_stats("f16")
            assert empty.HasField("prefix_cache") and empty.prefix_cache.lookups == 0
            doc = Prefix("stats-model", _ids(70, 7))  # 4 whole blocks
            first = c.create_sequence(pool="f16")
            _prefill(c, first, 0, 70, seed=3)
            assert c.publish_prefix(first, doc).new_tokens == 64
            assert c.lookup_prefix(doc, "f16") == 64                         # hit: 64 of 64
            assert c.lookup_prefix(Prefix("stats-model", _ids(40, 9)), "f16") == 0  # 0 of 32
            used = c.pool_stats("f16").used_bytes
            second = c.create_sequence(pool="f16", prefix=doc)             # hit: 64 of 64
            assert second.attached_tokens == 64
            assert c.pool_stats("f16").used_bytes == used, "attaching copies nothing"

            s = c.pool_stats("f16")
            assert isinstance(s, kvcache.PoolStats)
            p = s.prefix_cache
            assert isinstance(p, kvcache.PrefixCacheStats)
            assert (p.lookups, p.hits) == (3, 2)
            assert (p.hit_tokens, p.lookup_tokens) == (128, 160)
            assert p.attached_tokens == 64
            assert (p.published_entries, p.entries) == (4, 4)
            assert p.cached_bytes == 4 * ENTRY_BYTES
            assert p.unreferenced_bytes == 0  # both sequences use the blocks
            assert (p.checksum_misses, p.evicted_entries) == (0, 0)
            assert c.pool_stats("f32").prefix_cache.lookups == 0  # per pool
            assert c.pool_stats().prefix_cache.entries == 4  # all pools summed

            c.release(first)
            c.release(second)
            p = c.pool_stats("f16").prefix_cache
            assert p.entries == 4 and p.unreferenced_bytes == p.cached_bytes == 4 * ENTRY_BYTES
    finally:
        server.stop()


def test_tenant_stats_have_no_prefix_cache(auth_server) -> None:
    with kvcache.Client(auth_server.target, token="alice-token") as alice, \
            kvcache.Client(auth_server.target, token="ops-token") as ops:
        mine = alice.pool_stats("f16")
        assert mine.tenant == "alice" and not mine.HasField("prefix_cache")
        assert ops.pool_stats("f16").HasField("prefix_cache")


def test_prefix_errors(pc: kvcache.Client) -> None:
    ids = _ids(32, 0)
    with pytest.raises(kvcache.InvalidArgument, match=r"prefix\.model"):
        pc.create_sequence(pool="f16", prefix=Prefix("", ids))
    with pytest.raises(kvcache.InvalidArgument, match=r"prefix\.model"):
        pc.lookup_prefix(Prefix("", ids), "f16")
    with pytest.raises(kvcache.InvalidArgument, match=r"prefix\.token_ids\[2\]"):
        pc.create_sequence(pool="f16", prefix=Prefix("m", [1, 2, -5]))
    with pytest.raises(kvcache.InvalidArgument, match=r"prefix\.token_ids\[2\]"):
        pc.lookup_prefix(Prefix("m", [1, 2, -5]), "f16")
    residual = CompressionSpec(storage="int4_g32", residual_tokens=16)
    with pytest.raises(kvcache.FailedPrecondition, match="residual"):
        pc.create_sequence(pool="f16", policy=residual, prefix=Prefix("m", ids))
    seq = pc.create_sequence(pool="f16", policy=residual)
    try:
        _prefill(pc, seq, 0, 32, seed=4)
        with pytest.raises(kvcache.FailedPrecondition, match="residual"):
            pc.publish_prefix(seq, Prefix("m", ids))
        with pytest.raises(kvcache.InvalidArgument, match=r"prefix\.model"):
            pc.publish_prefix(seq, Prefix("", ids))
    finally:
        pc.release(seq)
    with pytest.raises(kvcache.NotFound):
        pc.publish_prefix("s-0000000000000000", Prefix("m", ids))
    with pytest.raises(kvcache.NotFound, match="pool 'nopool' not found"):
        pc.lookup_prefix(Prefix("m", ids), "nopool")
    with pytest.raises(kvcache.NotFound):
        pc.create_sequence(pool="nopool", prefix=Prefix("m", ids))
    # Misuse caught before sending.
    with pytest.raises(TypeError, match="kvcache.Prefix"):
        pc.lookup_prefix(ids, "f16")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="1-D integer"):
        pc.lookup_prefix(Prefix("m", np.zeros(4, np.float32)), "f16")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="storage"):
        pc.lookup_prefix(Prefix("m", ids), "f16", storage="int3")


def test_prefix_calls_are_retried_on_unavailable() -> None:
    counter = _Counter()
    with kvcache.Client(_dead_port(), timeout=5, max_attempts=3, initial_backoff=0.01,
                        interceptors=[counter]) as c:
        with pytest.raises(kvcache.Unavailable):
            c.lookup_prefix(Prefix("m", [1]))
        assert counter.calls == 3
        counter.calls = 0
        with pytest.raises(kvcache.Unavailable):
            c.publish_prefix("s", Prefix("m", [1]))
        assert counter.calls == 3
        counter.calls = 0
        with pytest.raises(kvcache.Unavailable):
            c.create_sequence(prefix=Prefix("m", [1]))
        assert counter.calls == 1  # not idempotent


async def _async_prefix(target: str) -> None:
    async with kvcache.AsyncClient(target) as client:
        doc = Prefix("async-model", _ids(50, 300), salt="a")  # 3 whole blocks
        first = await client.create_sequence(pool="f32")
        for layer in range(LAYERS):
            k = random_kv(50, np.float32, seed=layer)
            await client.append(first, layer, 0, k, -k)
        r = await client.publish_prefix(first, doc)
        assert (r.published_tokens, r.new_tokens) == (48, 48)
        assert await client.lookup_prefix(doc, "f32") == 48
        assert await client.lookup_prefix(doc, "f32", storage="int8") == 0
        second = await client.create_sequence(pool="f32", prefix=doc)
        assert second.attached_tokens == 48
        a, b = await client.fetch(first), await client.fetch(second)
        assert _head_bytes(a, 48) == _head_bytes(b, 48)
        assert (await client.pool_stats("f32")).prefix_cache.attached_tokens >= 48
        with pytest.raises(kvcache.InvalidArgument, match=r"prefix\.model"):
            await client.create_sequence(pool="f32", prefix=Prefix("", _ids(16, 0)))
        with pytest.raises(kvcache.NotFound):
            await client.publish_prefix("s-0000000000000000", doc)
        with pytest.raises(kvcache.NotFound):
            await client.lookup_prefix(doc, "nopool")
        await client.release(first)
        await client.release(second)


def test_async_prefix(prefix_server: Server) -> None:
    asyncio.run(_async_prefix(prefix_server.target))


def test_async_prefix_calls_are_retried() -> None:
    async def run() -> None:
        counter = _AioCounter()
        async with kvcache.AsyncClient(_dead_port(), timeout=5, max_attempts=3,
                                       initial_backoff=0.01, interceptors=[counter]) as c:
            with pytest.raises(kvcache.Unavailable):
                await c.lookup_prefix(Prefix("m", [1]))
            assert counter.calls == 3
            counter.calls = 0
            with pytest.raises(kvcache.Unavailable):
                await c.publish_prefix("s", Prefix("m", [1]))
            assert counter.calls == 3
            counter.calls = 0
            with pytest.raises(kvcache.Unavailable):
                await c.create_sequence(prefix=Prefix("m", [1]))
            assert counter.calls == 1  # not idempotent

    asyncio.run(run())


def test_fork_shares_a_compressed_sequence_copy_on_write(pc: kvcache.Client) -> None:
    """A prefilled document compressed once (StreamingLLM + INT4) is forked per question:
    each fork starts with the document's bytes, appends its own question, and a change to
    one fork is never seen by the document or another fork."""
    doc = pc.create_sequence(pool="f16")
    _prefill(pc, doc, 0, 100, seed=7)
    pc.compress(doc, CompressionSpec(eviction=kvcache.StreamingLLM(sinks=4, window=40),
                                     storage="int4_g32"))
    before = _head_bytes(pc.fetch(doc), 1 << 30)
    a = pc.fork_sequence(doc, sequence_id="fork-a")
    b = pc.fork_sequence(doc.sequence_id)
    assert a.sequence_id == "fork-a"
    assert (a.visible_tokens, b.visible_tokens) == (100, 100)
    assert a.storage == b.storage == pc.get_sequence(doc).storage
    assert _head_bytes(pc.fetch(a), 1 << 30) == before
    _prefill(pc, a, 100, 9, seed=8)
    pc.compress(a, CompressionSpec(eviction=kvcache.StreamingLLM(sinks=2, window=10)))
    assert _head_bytes(pc.fetch(doc), 1 << 30) == before
    assert _head_bytes(pc.fetch(b), 1 << 30) == before
    with pytest.raises(kvcache.AlreadyExists):
        pc.fork_sequence(doc, sequence_id="fork-a")
    with pytest.raises(kvcache.InvalidArgument, match="client_sequence_id"):
        pc.fork_sequence(doc, sequence_id="bad name!")
    for s in (a, b, doc):
        pc.release(s)
    with pytest.raises(kvcache.NotFound):
        pc.fork_sequence(doc)


def test_fork_is_not_retried() -> None:
    counter = _Counter()
    with kvcache.Client(_dead_port(), timeout=5, max_attempts=3, initial_backoff=0.01,
                        interceptors=[counter]) as c:
        with pytest.raises(kvcache.Unavailable):
            c.fork_sequence("s-0000000000000000")
        assert counter.calls == 1  # a retry after a lost reply would fork twice


def test_async_fork(prefix_server: Server) -> None:
    async def run() -> None:
        async with kvcache.AsyncClient(prefix_server.target, timeout=20) as c:
            doc = await c.create_sequence(pool="f16")
            await c.append(doc, 0, 0, random_kv(20, seed=1), random_kv(20, seed=2))
            fork = await c.fork_sequence(doc)
            assert list(fork.layer_tokens)[0] == 20
            await c.release(fork)
            await c.release(doc)
            with pytest.raises(kvcache.NotFound):
                await c.fork_sequence(doc)

    asyncio.run(run())
