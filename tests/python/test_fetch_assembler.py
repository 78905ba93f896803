"""kvcache._codec.FetchAssembler, which joins a gRPC Fetch's chunks per (layer, kv head): each
lane's chunks are joined when the next lane begins (to free their buffers early), and a lane
whose chunks come back after another lane's is still assembled in order; a chunk that skips
or repeats tokens of its lane is refused."""

from __future__ import annotations

import numpy as np
import pytest

from kvcache import _codec
from kvcache.types import DType, FetchedChunk, StorageFormat


def _chunk(layer: int, head: int, first: int, n: int) -> FetchedChunk:
    base = 1000 * layer + 100 * head + first
    rows = np.arange(base, base + n, dtype=np.float32)[:, None] * np.ones((1, 4), np.float32)
    return FetchedChunk(layer=layer, kv_head=head, first_index=first,
                        positions=np.arange(first, first + n, dtype=np.int32), keys=rows,
                        values=-rows, dtype=DType.F32, storage=StorageFormat.F32, last=False,
                        visible_tokens=9)


def test_lanes_are_joined_in_order_even_when_they_come_back() -> None:
    a = _codec.FetchAssembler()
    for chunk in (_chunk(0, 0, 0, 3), _chunk(0, 0, 3, 2), _chunk(0, 1, 0, 4),
                  _chunk(0, 0, 5, 4), _chunk(1, 0, 0, 1)):
        a.add(chunk)
    r = a.result()
    assert sorted(r.heads) == [(0, 0), (0, 1), (1, 0)]
    assert r.visible_tokens == 9 and r.dtype == DType.F32
    lane = r[(0, 0)]
    assert list(lane.positions) == list(range(9))
    assert list(lane.keys[:, 0]) == list(range(0, 9))
    assert np.array_equal(lane.values, -lane.keys)
    assert list(r[(0, 1)].keys[:, 0]) == [100, 101, 102, 103]
    assert r[(1, 0)].keys.shape == (1, 4)


def test_a_chunk_out_of_order_is_refused() -> None:
    a = _codec.FetchAssembler()
    a.add(_chunk(0, 0, 0, 3))
    a.add(_chunk(0, 1, 0, 3))
    with pytest.raises(RuntimeError, match="starts at 4 but 3 tokens arrived"):
        a.add(_chunk(0, 0, 4, 1))
