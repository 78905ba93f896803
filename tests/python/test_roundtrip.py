"""Bit-exact round trips of keys and values through kvcached, one pool per dtype."""

from __future__ import annotations

import numpy as np
import pytest

import kvcache
from conftest import HEAD_DIM, KV_HEADS, LAYERS, random_kv
from kvcache import _codec
from kvcache._proto.kvcache.v1 import kvcache_service_pb2 as svc


def _bf16_bits(x: np.ndarray) -> np.ndarray:
    """bf16 bit patterns (round to nearest even) of float32 values, as uint16."""
    u = x.astype(np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


CASES = [("f16", np.float16, None), ("f32", np.float32, None), ("bf16", np.uint16, "bf16")]


@pytest.mark.parametrize("pool,np_dtype,dtype", CASES)
def test_append_fetch_is_bit_exact(client: kvcache.Client, pool, np_dtype, dtype) -> None:
    seq = client.create_sequence(pool=pool)
    n = 37  # not a multiple of the 16-token block
    sent = {}
    for layer in range(LAYERS):
        k, v = random_kv(n, np.float32, seed=layer), random_kv(n, np.float32, seed=100 + layer)
        if dtype == "bf16":
            k, v = _bf16_bits(k), _bf16_bits(v)
        else:
            k, v = k.astype(np_dtype), v.astype(np_dtype)
        r = client.append(seq, layer, 0, k, v, dtype=dtype)
        assert r.layer_tokens == n
        assert r.visible_tokens == (n if layer == LAYERS - 1 else 0)
        sent[layer] = (k, v)
    kv = client.fetch(seq)
    assert kv.visible_tokens == n
    assert sorted(kv.heads) == [(l, h) for l in range(LAYERS) for h in range(KV_HEADS)]
    for (layer, head), got in kv.heads.items():
        k, v = sent[layer]
        assert got.keys.dtype == np.dtype(np_dtype)
        assert got.keys.shape == (n, HEAD_DIM)
        assert got.keys.tobytes() == k[:, head].tobytes()
        assert got.values.tobytes() == v[:, head].tobytes()
        assert got.positions.tolist() == list(range(n))
    info = client.get_sequence(seq)
    assert info.visible_tokens == n and list(info.layer_tokens) == [n] * LAYERS
    released = client.release(seq)
    assert released.freed_blocks == LAYERS * KV_HEADS * 3  # 37 tokens = 3 blocks per lane


def test_fetch_converts_dtype_and_selects_layers(client: kvcache.Client) -> None:
    seq = client.create_sequence(pool="f16")
    k, v = random_kv(20), random_kv(20, seed=1)
    for layer in range(LAYERS):
        client.append(seq, layer, 0, k, v)
    kv = client.fetch(seq, layers=[2], dtype="f32")
    assert sorted(kv.heads) == [(2, 0), (2, 1)]
    assert kv.dtype == kvcache.DType.F32
    # f16 -> f32 is exact.
    np.testing.assert_array_equal(kv[(2, 1)].keys, k[:, 1].astype(np.float32))
    client.release(seq)


def test_append_accepts_non_contiguous_and_big_endian_arrays(client: kvcache.Client) -> None:
    seq = client.create_sequence(pool="f32")
    base = random_kv(8, np.float32)
    strided = np.ascontiguousarray(np.concatenate([base, base], axis=2))[:, :, ::2]
    assert not strided.flags.c_contiguous
    big = base.astype(">f4")
    for layer in range(LAYERS):
        client.append(seq, layer, 0, strided, big)
    got = client.fetch(seq)[(0, 1)]
    np.testing.assert_array_equal(got.keys, strided[:, 1])
    np.testing.assert_array_equal(got.values, base[:, 1])
    client.release(seq)


def test_encode_append_matches_protobuf() -> None:
    k = random_kv(3)
    v = random_kv(3, seed=2)
    wire = _codec.encode_append("seq-1", 2, 300, k, v)
    expected = svc.AppendRequest(sequence_id="seq-1", layer=2, start_position=300, num_tokens=3,
                                 dtype=2, keys=k.tobytes(), values=v.tobytes())
    assert wire == expected.SerializeToString()
    # Negative numbers (refused by the server, but encoded as protobuf does).
    wire = _codec.encode_append("", -1, -5, k, v, dtype="f16")
    assert svc.AppendRequest.FromString(wire) == svc.AppendRequest(
        layer=-1, start_position=-5, num_tokens=3, dtype=2, keys=k.tobytes(), values=v.tobytes())


def test_client_side_argument_errors(client: kvcache.Client) -> None:
    k = random_kv(2)
    with pytest.raises(TypeError, match="uint16 with dtype='bf16'"):
        client.append("x", 0, 0, k.view(np.uint16), k.view(np.uint16))
    with pytest.raises(TypeError, match="float32 .* needs float16"):
        client.append("x", 0, 0, k.astype(np.float32), k.astype(np.float32), dtype="f16")
    with pytest.raises(ValueError, match="differ in shape"):
        client.append("x", 0, 0, k, k[:1])
    with pytest.raises(ValueError, match=r"\[n, kv_heads, head_dim\]"):
        client.append("x", 0, 0, k[0], k[0])
    with pytest.raises(ValueError, match="unknown storage format"):
        kvcache.CompressionSpec(storage="int3").to_proto()
    with pytest.raises(kvcache.InvalidArgument, match="max_attempts"):
        kvcache.Client("127.0.0.1:1", max_attempts=0)
    with pytest.raises(kvcache.InvalidArgument, match="cannot read tls_ca"):
        kvcache.Client("127.0.0.1:1", tls_ca="/nonexistent/ca.pem")


def test_list_sequences_pages_through_every_sequence(client: kvcache.Client) -> None:
    """Pages of list_sequences, followed by next_page_token, list each sequence once, in
    creation order, with the total on every page (the server is shared: compare the ones this
    test made, in the pool only it uses here)."""
    made = [client.create_sequence(pool="tiny", tenant="pages").sequence_id for _ in range(5)]
    seen, token = [], ""
    while True:
        page = client.list_sequences(tenant="pages", limit=2, page_token=token)
        assert page.total == 5
        assert len(page.sequences) <= 2
        seen += [s.sequence_id for s in page.sequences]
        token = page.next_page_token
        if not token:
            break
    assert seen == made
    with pytest.raises(kvcache.InvalidArgument, match="page_token is not one"):
        client.list_sequences(page_token="garbage!")
    for seq in made:
        client.release(seq)
