"""Bearer tokens against a kvcached with a tokens file made here; per-tenant sequences;
cancelled streams release the tenant's open-stream count."""

from __future__ import annotations

import numpy as np
import pytest

import kvcache
from conftest import HEAD_DIM, LAYERS, Q_HEADS, random_kv, wait_until


def _open_streams(client: kvcache.Client) -> int:
    return sum(t.open_streams for t in client.list_tenants())


def test_tokens_and_tenants(auth_server) -> None:
    target = auth_server.target
    with kvcache.Client(target) as anonymous:
        with pytest.raises(kvcache.Unauthenticated):
            anonymous.list_pools()
        with pytest.raises(kvcache.Unauthenticated):
            anonymous.create_sequence(pool="f16")
    with kvcache.Client(target, token="not-a-token") as wrong:
        with pytest.raises(kvcache.Unauthenticated):
            wrong.create_sequence(pool="f16")
    with kvcache.Client(target, token="alice-token") as alice, \
            kvcache.Client(target, token="bob-token") as bob, \
            kvcache.Client(target, token="ops-token") as ops:
        seq = alice.create_sequence(pool="f16", sequence_id="shared-name")
        assert seq.tenant == "alice"
        k = random_kv(8)
        for layer in range(LAYERS):
            alice.append(seq, layer, 0, k, k)
        for call in (bob.get_sequence, bob.fetch, bob.release):
            with pytest.raises(kvcache.NotFound):
                call("shared-name")
        with pytest.raises(kvcache.NotFound):
            bob.append("shared-name", 0, 8, k, k)
        bob_seq = bob.create_sequence(pool="f16", sequence_id="shared-name")  # own namespace
        assert bob_seq.tenant == "bob"
        with pytest.raises(kvcache.PermissionDenied):
            alice.create_sequence(pool="f16", tenant="bob")
        with pytest.raises(kvcache.PermissionDenied):
            alice.drain()
        with pytest.raises(kvcache.PermissionDenied):
            alice.fetch("shared-name", tenant="bob")
        assert [s.tenant for s in alice.list_sequences().sequences] == ["alice"]
        # The admin reads another tenant's sequence by naming the tenant, and may evict it.
        got = ops.fetch("shared-name", tenant="alice")
        np.testing.assert_array_equal(got[(0, 0)].keys, k[:, 0])
        assert ops.evict("shared-name", tenant="alice").freed_blocks > 0
        with pytest.raises(kvcache.NotFound):
            alice.get_sequence("shared-name")
        assert bob.release("shared-name").freed_blocks == 0  # it never had tokens
        try:
            assert ops.drain().draining
            # UNAVAILABLE, so that a caller creates the sequence on another instance.
            with pytest.raises(kvcache.Unavailable, match="draining"):
                alice.create_sequence(pool="f16")
        finally:
            assert not ops.drain(resume=True).draining


def test_cancelled_streams_are_closed_on_the_server(auth_server) -> None:
    with kvcache.Client(auth_server.target, token="alice-token") as alice:
        seq = alice.create_sequence(pool="f16")
        n = 8192  # 8 MiB of K+V: more than gRPC's flow-control windows buffer, so the
        k = random_kv(n)  # server's Fetch stays open while we do not read
        for layer in range(LAYERS):
            alice.append(seq, layer, 0, k, k)
        it = alice.fetch_chunks(seq, max_chunk_bytes=4096)
        next(it)
        assert _open_streams(alice) == 1  # the Fetch is open, waiting for us to read on
        it.close()
        assert wait_until(lambda: _open_streams(alice) == 0)
        session = alice.attend_session()
        session.attend(seq, 0, np.zeros((1, Q_HEADS, HEAD_DIM), np.float16), [n])
        assert _open_streams(alice) == 1
        session.cancel()
        assert wait_until(lambda: _open_streams(alice) == 0)
        alice.release(seq)
