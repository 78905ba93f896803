"""Every status code the contract promises for bad input arrives as its exception, with the
server's message; retries happen only for idempotent reads on UNAVAILABLE."""

from __future__ import annotations

import socket
import time

import grpc
import numpy as np
import pytest

import kvcache
from conftest import HEAD_DIM, LAYERS, Q_HEADS, random_kv
from kvcache import CompressionSpec, SnapKV, StreamingLLM


@pytest.fixture()
def seq(client: kvcache.Client):
    s = client.create_sequence(pool="f16")
    yield s
    try:
        client.release(s)
    except kvcache.NotFound:
        pass


def test_append_errors(client: kvcache.Client, seq) -> None:
    k = random_kv(4)
    wrong_heads = np.zeros((4, 3, HEAD_DIM), np.float16)
    with pytest.raises(kvcache.InvalidArgument) as e:
        client.append(seq, 0, 0, wrong_heads, wrong_heads)
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT and e.value.message
    with pytest.raises(kvcache.InvalidArgument, match="layer"):
        client.append(seq, LAYERS, 0, k, k)
    with pytest.raises(kvcache.InvalidArgument):
        client.append(seq, -1, 0, k, k)
    with pytest.raises(kvcache.FailedPrecondition):  # a gap: the layer has 0 tokens
        client.append(seq, 0, 5, k, k)
    client.append(seq, 0, 0, k, k)
    with pytest.raises(kvcache.FailedPrecondition):  # the same range again
        client.append(seq, 0, 0, k, k)
    with pytest.raises(kvcache.NotFound):
        client.append("no-such-sequence", 0, 0, k, k)
    assert client.get_sequence(seq).layer_tokens[0] == 4  # failed appends changed nothing


def test_sequence_errors(client: kvcache.Client, seq) -> None:
    with pytest.raises(kvcache.NotFound, match="pool"):
        client.create_sequence(pool="no-such-pool")
    with pytest.raises(kvcache.AlreadyExists):
        client.create_sequence(pool="f16", sequence_id=seq.sequence_id)
    with pytest.raises(kvcache.InvalidArgument):
        client.create_sequence(pool="f16", sequence_id="bad id with spaces")
    for call in (client.get_sequence, client.release, client.fetch):
        with pytest.raises(kvcache.NotFound):
            call("no-such-sequence")
    with pytest.raises(kvcache.InvalidArgument):
        client.fetch(seq, layers=[LAYERS])
    with pytest.raises(kvcache.NotFound):
        client.pool_stats("no-such-pool")
    with pytest.raises(kvcache.InvalidArgument):  # residual larger than the window
        client.create_sequence(pool="f16", policy=CompressionSpec(
            eviction=StreamingLLM(4, 8), storage="int8", residual_tokens=16))


def test_compress_and_attend_errors(client: kvcache.Client, seq) -> None:
    k = random_kv(20)
    for layer in range(LAYERS):
        client.append(seq, layer, 0, k, k)
    before = client.get_sequence(seq)
    with pytest.raises(kvcache.InvalidArgument, match="(?i)quer"):  # SnapKV needs queries
        client.compress(seq, CompressionSpec(eviction=SnapKV(window=4, budget=8)))
    with pytest.raises(kvcache.InvalidArgument):  # budget must exceed the window
        client.compress(seq, CompressionSpec(eviction=SnapKV(window=8, budget=8)))
    with pytest.raises(kvcache.FailedPrecondition):  # H2O without accumulated scores
        client.compress(seq, CompressionSpec(eviction=kvcache.H2O(heavy=4, recent=4)))
    q = np.zeros((1, Q_HEADS, HEAD_DIM), np.float16)
    with pytest.raises(kvcache.FailedPrecondition):  # before the layer's last token
        client.attend(seq, 0, q, [3])
    with pytest.raises(kvcache.InvalidArgument):  # wrong number of query heads
        client.attend(seq, 0, np.zeros((1, 3, HEAD_DIM), np.float16), [20])
    with pytest.raises(kvcache.InvalidArgument):
        client.attend(seq, LAYERS, q, [20])
    with pytest.raises(kvcache.NotFound):
        client.compress("no-such-sequence", CompressionSpec(storage="int8"))
    after = client.get_sequence(seq)  # nothing changed
    assert (after.storage, after.bytes, list(after.stored_tokens)) == \
        (before.storage, before.bytes, list(before.stored_tokens))


def test_pool_full_is_resource_exhausted(client: kvcache.Client) -> None:
    seq = client.create_sequence(pool="tiny")  # 32 blocks: 4 per (layer, head) lane
    k = random_kv(64)
    for layer in range(LAYERS):
        client.append(seq, layer, 0, k, k)
    with pytest.raises(kvcache.ResourceExhausted):
        client.append(seq, 0, 64, k[:1], k[:1])
    assert client.get_sequence(seq).layer_tokens[0] == 64
    client.release(seq)


def test_deadline_exceeded(client: kvcache.Client, seq) -> None:
    with pytest.raises(kvcache.DeadlineExceeded):
        client.list_pools(timeout=-1)  # already past
    k = random_kv(4)
    for layer in range(LAYERS):
        client.append(seq, layer, 0, k, k)
    q = np.zeros((1, Q_HEADS, HEAD_DIM), np.float16)
    session = client.attend_session(timeout=0.3)  # the deadline covers the whole session
    session.attend(seq, 0, q, [4])
    time.sleep(0.5)
    with pytest.raises(kvcache.DeadlineExceeded):
        session.attend(seq, 0, q, [4])


class _Counter(grpc.UnaryUnaryClientInterceptor):
    def __init__(self) -> None:
        self.calls = 0

    def intercept_unary_unary(self, continuation, details, request):
        self.calls += 1
        return continuation(details, request)


def _dead_port() -> str:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    return f"127.0.0.1:{port}"


def test_retries_only_idempotent_reads_on_unavailable() -> None:
    counter = _Counter()
    with kvcache.Client(_dead_port(), timeout=5, max_attempts=3, initial_backoff=0.01,
                        interceptors=[counter]) as c:
        with pytest.raises(kvcache.Unavailable):
            c.list_pools()
        assert counter.calls == 3
        counter.calls = 0
        with pytest.raises(kvcache.Unavailable):
            c.get_sequence("s")
        assert counter.calls == 3
        counter.calls = 0
        with pytest.raises(kvcache.Unavailable):
            c.create_sequence()
        with pytest.raises(kvcache.Unavailable):
            c.release("s")
        assert counter.calls == 2  # once each: not idempotent
        with pytest.raises(kvcache.Unavailable):
            c.append("s", 0, 0, random_kv(1), random_kv(1))


def test_error_classes_carry_code_and_message() -> None:
    e = kvcache.errors.from_rpc_error(_FakeError(grpc.StatusCode.PERMISSION_DENIED, "nope"))
    assert isinstance(e, kvcache.PermissionDenied) and isinstance(e, kvcache.KvCacheError)
    assert e.code == grpc.StatusCode.PERMISSION_DENIED and e.message == "nope"
    assert str(e) == "PERMISSION_DENIED: nope"


class _FakeError(grpc.RpcError):
    def __init__(self, code, details):
        self._c, self._d = code, details

    def code(self):
        return self._c

    def details(self):
        return self._d
