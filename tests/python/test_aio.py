"""AsyncClient: the same calls on grpc.aio."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

import kvcache
from conftest import HEAD_DIM, KV_HEADS, LAYERS, Q_HEADS, random_kv


async def _round_trip(target: str) -> None:
    async with kvcache.AsyncClient(target) as client:
        pools = await client.list_pools()
        assert [p.name for p in pools] == ["f16", "bf16", "f32", "tiny"]
        seq = await client.create_sequence(pool="f32")
        k = {l: random_kv(40, np.float32, seed=l) for l in range(LAYERS)}
        await client.append(seq, 0, 0, k[0], -k[0])
        async with client.append_stream() as stream:
            for layer in range(1, LAYERS):
                await stream.append(seq, layer, 0, k[layer], -k[layer])
        assert stream.result.visible_tokens == 40
        kv = await client.fetch(seq)
        assert len(kv.heads) == LAYERS * KV_HEADS
        for (layer, head), got in kv.heads.items():
            assert got.keys.tobytes() == k[layer][:, head].tobytes()
            assert got.values.tobytes() == (-k[layer][:, head]).tobytes()
        it = client.fetch_chunks(seq, max_chunk_bytes=4096)
        first = await it.__anext__()
        assert first.layer == 0
        await it.aclose()
        q = np.ones((1, Q_HEADS, HEAD_DIM), np.float32)
        unary = await client.attend(seq, 2, q, [40])
        async with client.attend_session() as session:
            streamed = await session.attend(seq, 2, q, [40])
        np.testing.assert_allclose(streamed.output, unary.output, rtol=1e-6)
        info = await client.get_sequence(seq)
        assert info.visible_tokens == 40
        r = await client.compress(seq, kvcache.CompressionSpec(storage="int8"))
        assert r.bytes_after < r.bytes_before
        with pytest.raises(kvcache.FailedPrecondition):
            await client.append(seq, 0, 0, k[0], k[0])
        with pytest.raises(kvcache.FailedPrecondition):
            async with client.attend_session() as session:
                await session.attend(seq, 0, q, [1])
        assert (await client.pool_stats("f32")).sequences >= 1
        await client.release(seq)
        with pytest.raises(kvcache.NotFound):
            await client.get_sequence(seq)
        with pytest.raises(kvcache.NotFound):
            await client.fetch(seq)


def test_async_client_round_trip(server) -> None:
    asyncio.run(_round_trip(server.target))
