"""Conversions between NumPy/Python values and kvcache.v1 messages, shared by both clients.

AppendRequest is encoded by hand: the keys and values buffers are copied once, straight
into the wire message, instead of array -> bytes -> protobuf field -> serialized message.
"""

from __future__ import annotations

from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

from kvcache._proto.kvcache.v1 import kvcache_service_pb2 as svc
from kvcache.types import (NUMPY_DTYPE, AttendResult, DType, DTypeLike, FetchedChunk,
                           FetchedHead, FetchResult, LayerQueries, LayerQueryStats, Prefix,
                           StorageFormat, parse_dtype)

KV_SERVICE = "/kvcache.v1.KvCacheService/"
ADMIN_SERVICE = "/kvcache.v1.AdminService/"


def _varint(value: int) -> bytes:
    if value < 0:
        value += 1 << 64  # int32/int64/enum negatives: ten-byte two's complement
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def wire_array(array: np.ndarray, dtype: DTypeLike, what: str) -> Tuple[np.ndarray, DType]:
    """The C-contiguous little-endian array to send and its DType.

    float16 -> F16, float32 -> F32; bf16 is passed as uint16 with dtype='bf16'. Copies only
    when the array is not already C-contiguous little-endian.
    """
    if not isinstance(array, np.ndarray):
        raise TypeError(f"{what} must be a numpy.ndarray, not {type(array).__name__}")
    wanted = parse_dtype(dtype)
    if wanted == DType.POOL:
        if array.dtype.kind == "f" and array.dtype.itemsize == 2:
            wanted = DType.F16
        elif array.dtype.kind == "f" and array.dtype.itemsize == 4:
            wanted = DType.F32
        else:
            raise TypeError(f"{what} has dtype {array.dtype}; pass float16 or float32, or raw "
                            "bfloat16 bits as uint16 with dtype='bf16'")
    expected = NUMPY_DTYPE[wanted]
    if array.dtype.kind != expected.kind or array.dtype.itemsize != expected.itemsize:
        raise TypeError(f"{what} has dtype {array.dtype} but dtype {wanted.name.lower()} needs "
                        f"{expected} elements")
    if array.dtype.byteorder == ">":
        array = array.astype(expected)
    return np.ascontiguousarray(array), wanted


def _checked_pair(keys: np.ndarray, values: np.ndarray,
                  dtype: DTypeLike) -> Tuple[np.ndarray, np.ndarray, DType]:
    if keys.ndim != 3 or values.ndim != 3:
        raise ValueError(f"keys and values must be [n, kv_heads, head_dim]; got shapes "
                         f"{keys.shape} and {values.shape}")
    if keys.shape != values.shape:
        raise ValueError(f"keys {keys.shape} and values {values.shape} differ in shape")
    k, k_dtype = wire_array(keys, dtype, "keys")
    v, v_dtype = wire_array(values, dtype, "values")
    if k_dtype != v_dtype:
        raise TypeError(f"keys are {k_dtype.name} but values are {v_dtype.name}")
    return k, v, k_dtype


def _append_head(sequence_id: str, layer: int, start_position: int, num_tokens: int,
                 dtype: DType) -> bytearray:
    sid = sequence_id.encode()
    head = bytearray()
    if sid:
        head += b"\x0a" + _varint(len(sid)) + sid
    for tag, value in ((0x10, layer), (0x18, start_position), (0x20, num_tokens),
                       (0x28, int(dtype))):
        if value:
            head += bytes([tag]) + _varint(value)
    return head


def encode_append(sequence_id: str, layer: int, start_position: int, keys: np.ndarray,
                  values: np.ndarray, dtype: DTypeLike = None) -> bytes:
    """A serialized kvcache.v1.AppendRequest; keys/values [n, kv_heads, head_dim]."""
    k, v, wire = _checked_pair(keys, values, dtype)
    head = _append_head(sequence_id, layer, start_position, k.shape[0], wire)
    kb = memoryview(k).cast("B")
    vb = memoryview(v).cast("B")
    return b"".join((head, b"\x32", _varint(kb.nbytes), kb, b"\x3a", _varint(vb.nbytes), vb))


def stage_append(sequence_id: str, layer: int, start_position: int, keys: np.ndarray,
                 values: np.ndarray, dtype: DTypeLike, region: np.ndarray, region_id: str,
                 acquire: Callable[[int], Optional[int]]) -> Optional[Tuple[bytes, int]]:
    """Copies keys and values into a slot of a staging region (uint8 array; `acquire(bytes)`
    gives the slot's offset or None) and returns (a serialized AppendRequest whose `staged`
    field points at them, the slot's offset); None when no slot is free (send bytes then)."""
    k, v, wire = _checked_pair(keys, values, dtype)
    n = k.nbytes
    half = (n + 63) // 64 * 64
    if n == 0:
        return None
    offset = acquire(2 * half)
    if offset is None:
        return None
    region[offset:offset + n] = k.reshape(-1).view(np.uint8)
    region[offset + half:offset + half + n] = v.reshape(-1).view(np.uint8)
    rid = region_id.encode()
    staged = (b"\x0a" + _varint(len(rid)) + rid + b"\x10" + _varint(offset) + b"\x18" +
              _varint(offset + half) + b"\x20" + _varint(n))
    head = _append_head(sequence_id, layer, start_position, k.shape[0], wire)
    return bytes(head + b"\x42" + _varint(len(staged)) + staged), offset


def fetch_request(sequence_id: str, layers: Optional[Sequence[int]], dtype: DTypeLike,
                  stored: bool, include_unfinished: bool, max_chunk_bytes: int,
                  tenant: str) -> svc.FetchRequest:
    return svc.FetchRequest(
        sequence_id=sequence_id, layers=list(layers or []),
        format=svc.FETCH_FORMAT_STORED if stored else svc.FETCH_FORMAT_DENSE,
        dtype=int(parse_dtype(dtype)), include_unfinished=include_unfinished,
        max_chunk_bytes=max_chunk_bytes, tenant=tenant)


def chunk_from_proto(m: svc.FetchChunk) -> FetchedChunk:
    n = m.num_tokens
    if m.record_bytes:  # stored format: raw records
        keys = np.frombuffer(m.keys, dtype=np.uint8).reshape(n, m.record_bytes)
        values = np.frombuffer(m.values, dtype=np.uint8).reshape(n, m.record_bytes)
    else:
        np_dtype = NUMPY_DTYPE[DType(m.dtype)]
        keys = np.frombuffer(m.keys, dtype=np_dtype).reshape(n, -1)
        values = np.frombuffer(m.values, dtype=np_dtype).reshape(n, -1)
    return FetchedChunk(layer=m.layer, kv_head=m.kv_head, first_index=m.first_index,
                        positions=np.asarray(m.positions, dtype=np.int32), keys=keys,
                        values=values, dtype=DType(m.dtype), storage=StorageFormat(m.storage),
                        last=m.last, visible_tokens=m.visible_tokens)


class FetchAssembler:
    """Concatenates dense chunks per (layer, kv head), checking they arrive in order.

    The server sends lane after lane, so a lane's chunks are joined as soon as the next lane
    begins and the chunks' buffers freed: the join then reuses memory the process already
    touched instead of faulting in fresh pages for the whole result while every chunk is
    still held (a 1 GiB Python fetch spent most of its time in page faults that way)."""

    def __init__(self) -> None:
        self._parts: Dict[Tuple[int, int], List[FetchedHead]] = {}
        self._next: Dict[Tuple[int, int], int] = {}
        self._current: Optional[Tuple[int, int]] = None
        self.visible_tokens = 0
        self.dtype = DType.POOL

    def add(self, chunk: FetchedChunk) -> None:
        key = (chunk.layer, chunk.kv_head)
        expected = self._next.get(key, chunk.first_index)
        if chunk.first_index != expected:
            raise RuntimeError(f"Fetch chunk for layer {chunk.layer} head {chunk.kv_head} starts "
                               f"at {chunk.first_index} but {expected} tokens arrived before it")
        if key != self._current and self._current is not None:
            self._join(self._current)
        self._current = key
        self._next[key] = expected + len(chunk.positions)
        self._parts.setdefault(key, []).append(FetchedHead(chunk.keys, chunk.values,
                                                           chunk.positions))
        self.visible_tokens = chunk.visible_tokens
        self.dtype = chunk.dtype

    def _join(self, key: Tuple[int, int]) -> None:
        parts = self._parts[key]
        if len(parts) > 1:
            self._parts[key] = [FetchedHead(np.concatenate([p.keys for p in parts]),
                                            np.concatenate([p.values for p in parts]),
                                            np.concatenate([p.positions for p in parts]))]

    def result(self) -> FetchResult:
        for key in self._parts:
            self._join(key)
        heads = {key: parts[0] for key, parts in self._parts.items()}
        return FetchResult(visible_tokens=self.visible_tokens, dtype=self.dtype, heads=heads)


def attend_request(sequence_id: str, layer: int, queries: np.ndarray, positions: Iterable[int],
                   dtype: DTypeLike, return_weights: bool) -> svc.AttendRequest:
    if queries.ndim != 3:
        raise ValueError(f"queries must be [n, num_query_heads, head_dim]; got {queries.shape}")
    q, q_dtype = wire_array(queries, dtype, "queries")
    return svc.AttendRequest(sequence_id=sequence_id, layer=layer, dtype=int(q_dtype),
                             queries=q.tobytes(), positions=list(positions),
                             return_weights=return_weights)


def attend_from_proto(m: svc.AttendResponse, queries_shape: Tuple[int, ...]) -> AttendResult:
    dtype = DType(m.dtype)
    output = np.frombuffer(m.output, dtype=NUMPY_DTYPE[dtype]).reshape(queries_shape)
    weights = positions = None
    if len(m.weights):
        n, heads = queries_shape[0], queries_shape[1]
        weights = np.asarray(m.weights, dtype=np.float32).reshape(n, heads, m.max_stored)
        positions = np.asarray(m.weight_positions, dtype=np.int32).reshape(-1, m.max_stored)
    return AttendResult(layer=m.layer, output=output, dtype=dtype, max_stored=m.max_stored,
                        weights=weights, weight_positions=positions)


def compress_queries(queries: Optional[Sequence[LayerQueries]]) -> List[svc.LayerQueries]:
    out = []
    for lq in queries or []:
        if lq.queries.ndim != 3:
            raise ValueError(f"layer {lq.layer} queries must be [n, num_query_heads, head_dim]; "
                             f"got {lq.queries.shape}")
        q, q_dtype = wire_array(lq.queries, lq.dtype, f"layer {lq.layer} queries")
        out.append(svc.LayerQueries(layer=lq.layer, dtype=int(q_dtype), queries=q.tobytes(),
                                    positions=list(lq.positions)))
    return out


def compress_query_stats(stats: Optional[Sequence[LayerQueryStats]]) -> List[svc.LayerQueryStats]:
    out = []
    for st in stats or []:
        mean = np.asarray(st.mean, dtype=np.float32)
        if mean.ndim != 2:
            raise ValueError(f"layer {st.layer} mean must be [num_query_heads, head_dim]; "
                             f"got {mean.shape}")
        m = svc.LayerQueryStats(layer=st.layer, mean=mean.ravel().tolist())
        if st.covariance is not None:
            cov = np.asarray(st.covariance, dtype=np.float32)
            if cov.shape != (mean.shape[0], mean.shape[1], mean.shape[1]):
                raise ValueError(f"layer {st.layer} covariance must be [num_query_heads, head_dim, "
                                 f"head_dim] = {(mean.shape[0], mean.shape[1], mean.shape[1])}; "
                                 f"got {cov.shape}")
            m.covariance.extend(cov.ravel().tolist())
        out.append(m)
    return out


def prefix_spec(prefix: Prefix) -> svc.PrefixSpec:
    """The PrefixSpec of a kvcache.Prefix (TypeError for anything else)."""
    if not isinstance(prefix, Prefix):
        raise TypeError(f"prefix must be a kvcache.Prefix, not {type(prefix).__name__}")
    return prefix.to_proto()
