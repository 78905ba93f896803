"""Streaming calls: AppendStream prefill, chunked Fetch, attend sessions, cancellation."""

from __future__ import annotations

import numpy as np
import pytest

import kvcache
from conftest import HEAD_DIM, KV_HEADS, LAYERS, Q_HEADS, random_kv


def _prefill(client: kvcache.Client, n: int, chunk: int = 16):
    seq = client.create_sequence(pool="f16")
    k = {l: random_kv(n, seed=l) for l in range(LAYERS)}
    with client.append_stream() as stream:
        for start in range(0, n, chunk):
            for layer in range(LAYERS):
                part = k[layer][start:start + chunk]
                stream.append(seq, layer, start, part, -part)
    assert stream.result is not None
    assert stream.result.messages == LAYERS * ((n + chunk - 1) // chunk)
    assert stream.result.tokens == LAYERS * n and stream.result.visible_tokens == n
    return seq, k


def test_append_stream_then_chunked_fetch(client: kvcache.Client) -> None:
    n = 200
    seq, k = _prefill(client, n)
    chunks = list(client.fetch_chunks(seq, max_chunk_bytes=4096))  # 4 KiB: 32 tokens here
    assert len(chunks) > LAYERS * KV_HEADS and chunks[-1].last
    assert not any(c.last for c in chunks[:-1])
    for (layer, head), got in client.fetch(seq).heads.items():
        np.testing.assert_array_equal(got.keys, k[layer][:, head])
        np.testing.assert_array_equal(got.values, -k[layer][:, head])
    client.release(seq)


def test_append_stream_reports_the_rejected_message(client: kvcache.Client) -> None:
    seq = client.create_sequence(pool="f16")
    k = random_kv(8)
    with pytest.raises(kvcache.FailedPrecondition, match="2"):
        with client.append_stream() as stream:
            stream.append(seq, 0, 0, k, k)
            stream.append(seq, 1, 0, k, k)
            stream.append(seq, 0, 100, k, k)  # out of order: the server ends the stream
    assert list(client.get_sequence(seq).layer_tokens)[:2] == [8, 8]
    client.release(seq)


def test_fetch_iterator_closed_early_cancels(client: kvcache.Client) -> None:
    seq, _ = _prefill(client, 256)
    it = client.fetch_chunks(seq, max_chunk_bytes=4096)
    first = next(it)
    assert (first.layer, first.kv_head, first.first_index) == (0, 0, 0)
    it.close()
    with pytest.raises(StopIteration):
        next(it)
    # The channel is still usable and the sequence can go (no stream holds it).
    assert client.release(seq).freed_blocks > 0


def _reference_attention(keys: np.ndarray, values: np.ndarray, q: np.ndarray) -> np.ndarray:
    """softmax(q.k/sqrt(d)) v per query head; query head h reads kv head h // group."""
    group = Q_HEADS // KV_HEADS
    out = np.zeros(q.shape, np.float64)
    for h in range(Q_HEADS):
        kh = keys[:, h // group].astype(np.float64)
        logits = kh @ q[:, h].astype(np.float64).T / np.sqrt(HEAD_DIM)  # [t, n]
        w = np.exp(logits - logits.max(axis=0))
        w /= w.sum(axis=0)
        out[:, h] = (w.T @ values[:, h // group].astype(np.float64))
    return out


def test_attend_unary_and_session_agree_with_reference(client: kvcache.Client) -> None:
    n = 48
    seq, k = _prefill(client, n)
    q = np.random.default_rng(5).standard_normal((2, Q_HEADS, HEAD_DIM)).astype(np.float32)
    unary = client.attend(seq, 1, q, [n, n], return_weights=True)
    assert unary.output.shape == q.shape and unary.output.dtype == np.float32
    assert unary.weights.shape == (2, Q_HEADS, n)
    np.testing.assert_allclose(unary.weights.sum(axis=2), 1.0, rtol=1e-5)
    expected = _reference_attention(k[1], -k[1], q)
    np.testing.assert_allclose(unary.output, expected, atol=2e-3)
    with client.attend_session() as session:
        for layer in range(LAYERS):
            r = session.attend(seq, layer, q, [n, n])
            np.testing.assert_allclose(r.output, _reference_attention(k[layer], -k[layer], q),
                                       atol=2e-3)
    with pytest.raises(kvcache.FailedPrecondition):
        session.attend(seq, 0, q, [n, n])  # closed
    client.release(seq)


def test_attend_session_errors_and_cancel(client: kvcache.Client) -> None:
    seq, _ = _prefill(client, 16)
    q = np.zeros((1, Q_HEADS, HEAD_DIM), np.float16)
    session = client.attend_session()
    session.attend(seq, 0, q, [16])
    session.cancel()  # closing mid-session
    with pytest.raises(kvcache.FailedPrecondition):
        session.attend(seq, 0, q, [16])
    with client.attend_session() as session:
        with pytest.raises(kvcache.FailedPrecondition):
            session.attend(seq, 0, q, [3])  # the server ends the stream with the error
    assert client.get_sequence(seq).visible_tokens == 16
    client.release(seq)
