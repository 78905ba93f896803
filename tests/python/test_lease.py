"""Leases through the Python client against a real kvcached: the description names every
(layer, kv head) lane's blocks and positions and the arena layout; a released sequence's
blocks stay pinned (pool bytes, lease statistics) until the lease is released; a lease ends
once; a short TTL expires on its own; bad requests get the contract's codes; asyncio too."""

from __future__ import annotations

import asyncio
from typing import Any, Iterator

import pytest

import kvcache
from conftest import HEAD_DIM, KV_HEADS, LAYERS, Server, random_kv, start, wait_until

BLOCK = 16
TOKENS = 40  # 3 blocks per lane, the last partly filled


@pytest.fixture(scope="module")
def lease_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """Its own kvcached: the statistics below are exact counts."""
    s = start(tmp_path_factory.mktemp("kvcached-lease"))
    yield s
    s.stop()


@pytest.fixture()
def lc(lease_server: Server) -> Iterator[kvcache.Client]:
    with kvcache.Client(lease_server.target, timeout=20) as c:
        yield c


def _filled(c: kvcache.Client) -> str:
    seq = c.create_sequence().sequence_id
    for layer in range(LAYERS):
        c.append(seq, layer, 0, random_kv(TOKENS, seed=layer), random_kv(TOKENS, seed=9 + layer))
    return seq


def test_lease_describes_and_pins_until_released(lc: kvcache.Client) -> None:
    baseline = lc.pool_stats().used_bytes
    seq = _filled(lc)
    filled = lc.pool_stats().used_bytes
    lease = lc.lease_sequence(seq)
    assert lease.sequence_id == seq and lease.device == "cpu"
    assert lease.block_tokens == BLOCK and lease.head_dim == HEAD_DIM
    assert list(lease.layers) == list(range(LAYERS))
    assert list(lease.layer_tokens) == [TOKENS] * LAYERS
    assert len(lease.arenas) == 1 and lease.arenas[0].record_bytes == 2 * HEAD_DIM
    assert len(lease.lanes) == LAYERS * KV_HEADS
    for i, lane in enumerate(lease.lanes):
        assert (lane.layer, lane.kv_head) == divmod(i, KV_HEADS)
        (segment,) = lane.segments
        assert list(segment.position_runs) == [0, TOKENS]  # one run: dense
        assert list(kvcache.lease_positions(segment)) == list(range(TOKENS))
        assert len(segment.blocks) == 3
    assert lease.leased_bytes == filled - baseline

    lc.release(seq)
    stats = lc.pool_stats()
    assert stats.used_bytes == filled, "the lease keeps the released sequence's blocks"
    assert stats.leases.active == 1 and stats.leases.leased_bytes == lease.leased_bytes
    assert lc.renew_lease(lease, ttl_ms=60000) > lease.expires_unix_ms
    assert lc.release_lease(lease) == 3 * LAYERS * KV_HEADS
    assert lc.pool_stats().used_bytes == baseline
    with pytest.raises(kvcache.NotFound, match="does not exist"):
        lc.release_lease(lease)
    with pytest.raises(kvcache.NotFound):
        lc.renew_lease(lease.lease_id)


def test_short_lease_expires_on_its_own(lc: kvcache.Client) -> None:
    baseline = lc.pool_stats().used_bytes
    expired = lc.pool_stats().leases.expired
    seq = _filled(lc)
    lc.lease_sequence(seq, [0, 2], ttl_ms=200)
    lc.release(seq)
    assert lc.pool_stats().used_bytes > baseline
    assert wait_until(lambda: lc.pool_stats().used_bytes == baseline, timeout=10)
    assert lc.pool_stats().leases.expired == expired + 1


def test_bad_lease_requests(lc: kvcache.Client) -> None:
    seq = _filled(lc)
    with pytest.raises(kvcache.InvalidArgument, match="ttl_ms"):
        lc.lease_sequence(seq, ttl_ms=10**9)
    with pytest.raises(kvcache.InvalidArgument, match="out of range"):
        lc.lease_sequence(seq, [LAYERS])
    with pytest.raises(kvcache.InvalidArgument, match="named twice"):
        lc.lease_sequence(seq, [1, 1])
    with pytest.raises(kvcache.NotFound):
        lc.lease_sequence("s-nothing")
    assert lc.pool_stats().leases.active == 0
    lc.release(seq)


def test_leases_are_listed_and_ended_by_an_admin(lc: kvcache.Client) -> None:
    # No authentication here: every caller may use the admin calls.
    seq = _filled(lc)
    lease = lc.lease_sequence(seq)

    def info() -> Any:  # kvcache.v1.LeaseInfo
        (found,) = [i for i in lc.list_leases() if i.lease_id == lease.lease_id]
        return found

    assert info().sequence_id == seq and info().leased_bytes == lease.leased_bytes
    assert info().lease_only_bytes == 0 and info().renewals == 0
    assert info().expires_unix_ms == lease.expires_unix_ms, "listing never extends a lease"
    lc.release(seq)
    assert info().lease_only_bytes == lease.leased_bytes, "only the lease pins them now"
    assert lc.end_lease(lease) == 3 * LAYERS * KV_HEADS
    assert all(i.lease_id != lease.lease_id for i in lc.list_leases())
    with pytest.raises(kvcache.NotFound):
        lc.end_lease(lease)


def test_asyncio_lease(lease_server: Server) -> None:
    async def run() -> None:
        async with kvcache.AsyncClient(lease_server.target, timeout=20) as c:
            seq = (await c.create_sequence()).sequence_id
            for layer in range(LAYERS):
                await c.append(seq, layer, 0, random_kv(TOKENS), random_kv(TOKENS, seed=1))
            lease = await c.lease_sequence(seq, [3])
            assert [lane.layer for lane in lease.lanes] == [3] * KV_HEADS
            assert await c.renew_lease(lease) >= lease.expires_unix_ms - 1000
            assert await c.release_lease(lease) == 0, "the sequence still holds its blocks"
            await c.release(seq)
    asyncio.run(run())
