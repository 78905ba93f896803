"""Value types of the Python client: dtypes, storage formats, compression specs, prefixes,
results.

Metadata replies (SequenceInfo, PoolInfo, PoolStats, ...) are the generated kvcache.v1
protobuf messages, documented field by field in proto/kvcache/v1/*.proto (for the prefix
cache: SequenceInfo.attached_tokens, PoolStats.prefix_cache, a PrefixCacheStats); the types
here are the ones that carry tensors (NumPy arrays) or that callers build.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Dict, Optional, Sequence, Tuple, Union

import numpy as np

from kvcache._proto.kvcache.v1 import admin_service_pb2 as _admin
from kvcache._proto.kvcache.v1 import kvcache_service_pb2 as _svc
from kvcache._proto.kvcache.v1 import types_pb2 as _types


class DType(enum.IntEnum):
    """Element type of dense keys/values (kvcache.v1.DType). BF16 travels as raw uint16."""

    POOL = 0  # in requests: the pool's dtype
    F32 = 1
    F16 = 2
    BF16 = 3


class StorageFormat(enum.IntEnum):
    """How the service stores tokens (kvcache.v1.StorageFormat)."""

    POOL = 0  # raw, in the pool's dtype
    F32 = 1
    F16 = 2
    BF16 = 3
    FP8_E4M3 = 4
    INT8 = 5
    INT4_G32 = 6
    INT4_G64 = 7
    NVFP4 = 8


DTypeLike = Union[DType, str, None]
StorageLike = Union[StorageFormat, str, None]

_DTYPE_NAMES = {"f32": DType.F32, "float32": DType.F32, "f16": DType.F16,
                "float16": DType.F16, "bf16": DType.BF16, "bfloat16": DType.BF16}
# NumPy element type of each dtype on the wire (bf16 has none in NumPy: raw uint16).
NUMPY_DTYPE = {DType.F32: np.dtype("<f4"), DType.F16: np.dtype("<f2"),
               DType.BF16: np.dtype("<u2")}


def parse_dtype(dtype: DTypeLike) -> DType:
    """DType from a DType, a name ('f16', 'bf16', 'f32', 'float16', ...) or None (pool's)."""
    if dtype is None:
        return DType.POOL
    if isinstance(dtype, DType):
        return dtype
    if isinstance(dtype, str) and dtype.lower() in _DTYPE_NAMES:
        return _DTYPE_NAMES[dtype.lower()]
    raise ValueError(f"unknown dtype {dtype!r}; expected 'f32', 'f16', 'bf16' or a DType")


def parse_storage(storage: StorageLike) -> StorageFormat:
    """StorageFormat from a StorageFormat, a name ('int8', 'fp8_e4m3', 'int4_g32', ...) or None."""
    if storage is None:
        return StorageFormat.POOL
    if isinstance(storage, StorageFormat):
        return storage
    if isinstance(storage, str):
        try:
            return StorageFormat[storage.upper()]
        except KeyError:
            pass
    raise ValueError(f"unknown storage format {storage!r}; expected one of "
                     f"{[f.name.lower() for f in StorageFormat]}")


@dataclasses.dataclass(frozen=True)
class StreamingLLM:
    """Keep the first `sinks` and the newest `window` tokens; optionally re-rotate kept keys."""

    sinks: int
    window: int
    rerotate_keys: bool = False


@dataclasses.dataclass(frozen=True)
class SnapKV:
    """Keep `budget` tokens per kv head scored by the last `window` queries (needs queries)."""

    window: int
    budget: int
    pooling_kernel: int = 13  # measured default (docs/EVALUATION.md); the paper: 7
    pooling: str = "max"  # "max" or "avg"
    # AdaKV: share each layer's selections across its kv heads by score; every head first
    # takes head_floor_percent % of its share (None = the server's default, 20).
    adaptive: bool = False
    head_floor_percent: Optional[int] = None
    pyramid_beta: int = 0  # >= 2: PyramidKV's per-layer budgets (the paper: 20); 0 = flat


@dataclasses.dataclass(frozen=True)
class H2O:
    """Keep the `heavy` highest accumulated-attention tokens and the newest `recent`."""

    heavy: int
    recent: int


@dataclasses.dataclass(frozen=True)
class ExpectedAttention:
    """Query-agnostic (kvpress ExpectedAttentionPress): keep `budget` tokens per kv head
    (including `sinks` and the newest `window`), scored by the attention that queries drawn
    from the context's query statistics can be expected to pay (compress(query_stats=...)). The
    pool needs RoPE settings: the service averages the rotation over `future_positions`."""

    window: int
    budget: int
    sinks: Optional[int] = None  # None = the server's default, 4
    future_positions: int = 0    # 0 = 512
    value_norm: bool = True      # multiply by ||v|| (kvpress's use_vnorm)
    adaptive: bool = False       # AdaKV, as SnapKV's
    head_floor_percent: Optional[int] = None


@dataclasses.dataclass(frozen=True)
class CompressionSpec:
    """One eviction rule x one storage format x an optional raw recent residual."""

    eviction: Union[StreamingLLM, SnapKV, H2O, ExpectedAttention, None] = None
    storage: StorageLike = None
    residual_tokens: int = 0

    def to_proto(self) -> _types.CompressionSpec:
        spec = _types.CompressionSpec(storage=int(parse_storage(self.storage)),
                                      residual_tokens=self.residual_tokens)
        e = self.eviction
        if isinstance(e, StreamingLLM):
            spec.streaming_llm.CopyFrom(_types.StreamingLlmSpec(
                sinks=e.sinks, window=e.window, rerotate_keys=e.rerotate_keys))
        elif isinstance(e, SnapKV):
            pooling = {"max": _types.SnapKvSpec.POOLING_MAX,
                       "avg": _types.SnapKvSpec.POOLING_AVG}.get(e.pooling)
            if pooling is None:
                raise ValueError(f"SnapKV pooling {e.pooling!r}; expected 'max' or 'avg'")
            allocation = (_types.SnapKvSpec.ALLOCATION_ADAPTIVE if e.adaptive
                          else _types.SnapKvSpec.ALLOCATION_UNIFORM)
            spec.snapkv.CopyFrom(_types.SnapKvSpec(window=e.window, budget=e.budget,
                                                   pooling_kernel=e.pooling_kernel,
                                                   pooling=pooling, allocation=allocation,
                                                   pyramid_beta=e.pyramid_beta))
            if e.head_floor_percent is not None:
                spec.snapkv.head_floor_percent = e.head_floor_percent
        elif isinstance(e, H2O):
            spec.h2o.CopyFrom(_types.H2oSpec(heavy=e.heavy, recent=e.recent))
        elif isinstance(e, ExpectedAttention):
            allocation = (_types.SnapKvSpec.ALLOCATION_ADAPTIVE if e.adaptive
                          else _types.SnapKvSpec.ALLOCATION_UNIFORM)
            spec.expected_attention.CopyFrom(_types.ExpectedAttentionSpec(
                budget=e.budget, window=e.window, future_positions=e.future_positions,
                skip_value_norm=not e.value_norm, allocation=allocation))
            if e.sinks is not None:
                spec.expected_attention.sinks = e.sinks
            if e.head_floor_percent is not None:
                spec.expected_attention.head_floor_percent = e.head_floor_percent
        elif e is not None:
            raise TypeError("eviction must be StreamingLLM, SnapKV, H2O, ExpectedAttention or "
                            f"None, not {e!r}")
        return spec


@dataclasses.dataclass(frozen=True)
class Prefix:
    """A prefix named by its tokens (kvcache.v1.PrefixSpec), from position 0. Cached KV serves
    it only for the same `model` (an id the caller chooses: name the weights and anything else
    that changes keys and values), the same `salt`, tenant, pool and storage format. Only
    whole blocks (PoolInfo.geometry.block_tokens, 16 by default) are cached."""

    model: str                # 1-128 bytes
    token_ids: Sequence[int]  # each >= 0; a list, tuple or integer NumPy array
    salt: str = ""            # <= 128 bytes; only the same salt shares

    def to_proto(self) -> _svc.PrefixSpec:
        if isinstance(self.token_ids, np.ndarray):
            if self.token_ids.ndim != 1 or self.token_ids.dtype.kind not in "iu":
                raise TypeError("Prefix.token_ids must be a 1-D integer array, not "
                                f"{self.token_ids.ndim}-D {self.token_ids.dtype}")
            ids = self.token_ids.tolist()
        else:
            ids = [int(t) for t in self.token_ids]
        return _svc.PrefixSpec(model=self.model, salt=self.salt, token_ids=ids)


@dataclasses.dataclass
class LayerQueries:
    """Query vectors of one layer for Compress: [n, num_query_heads, head_dim] after RoPE."""

    layer: int
    queries: np.ndarray
    positions: Sequence[int]
    dtype: DTypeLike = None  # None: from the array (float16/float32); bf16 needs 'bf16'


@dataclasses.dataclass
class LayerQueryStats:
    """Statistics of one layer's context queries BEFORE RoPE, for ExpectedAttention: `mean`
    [num_query_heads, head_dim] and optionally `covariance` [num_query_heads, head_dim,
    head_dim] (on every layer or none), sent as float32."""

    layer: int
    mean: np.ndarray
    covariance: Optional[np.ndarray] = None


@dataclasses.dataclass(frozen=True)
class AppendResult:
    layer_tokens: int    # tokens this layer now has
    visible_tokens: int  # tokens every layer has


@dataclasses.dataclass(frozen=True)
class AppendStreamResult:
    messages: int        # messages applied
    tokens: int          # token-layers applied
    visible_tokens: int


@dataclasses.dataclass
class FetchedChunk:
    """One Fetch message: tokens [first_index, first_index + n) of one (layer, kv head).

    Dense: keys/values are [n, head_dim] arrays of the fetched dtype (bf16 as uint16).
    Stored format: [n, record_bytes] uint8 records (layout in docs/KERNELS.md).
    """

    layer: int
    kv_head: int
    first_index: int
    positions: np.ndarray  # int32 [n], original position of each token
    keys: np.ndarray
    values: np.ndarray
    dtype: DType
    storage: StorageFormat
    last: bool
    visible_tokens: int


@dataclasses.dataclass
class FetchedHead:
    """Every fetched token of one (layer, kv head): keys/values [n, head_dim], positions [n]."""

    keys: np.ndarray
    values: np.ndarray
    positions: np.ndarray


@dataclasses.dataclass
class FetchResult:
    """A whole dense Fetch, per (layer, kv_head)."""

    visible_tokens: int
    dtype: DType
    heads: Dict[Tuple[int, int], FetchedHead]
    # The path this fetch took: "shared-memory (PATH)", "transfer (HOST:PORT)" or
    # "grpc (why not one of those)" (the client's data_path says what it decided; a fetch of
    # records that path cannot carry still goes over gRPC, and says so here).
    path: str = ""

    def __getitem__(self, key: Tuple[int, int]) -> FetchedHead:
        return self.heads[key]


@dataclasses.dataclass
class AttendResult:
    """Decode attention output [n, num_query_heads, head_dim]; weights if asked for."""

    layer: int
    output: np.ndarray
    dtype: DType
    max_stored: int
    weights: Optional[np.ndarray]           # float32 [n, num_query_heads, max_stored]
    weight_positions: Optional[np.ndarray]  # int32 [num_kv_heads, max_stored], -1 = padding


@dataclasses.dataclass(frozen=True)
class ReleaseResult:
    freed_blocks: int
    freed_bytes: int


@dataclasses.dataclass(frozen=True)
class PublishResult:
    published_tokens: int  # leading tokens of the sequence now in the cache (whole blocks)
    new_tokens: int        # of which this call added (the others were cached already)


# Generated messages returned as they are (fields documented in proto/kvcache/v1).
SequenceInfo = _types.SequenceInfo  # .attached_tokens: tokens from the prefix cache
PoolInfo = _types.PoolInfo
PoolStats = _admin.PoolStats  # .prefix_cache: a PrefixCacheStats (unset in a tenant's view)
PrefixCacheStats = _admin.PrefixCacheStats  # hit rate = hit_tokens / lookup_tokens
CompressResponse = _svc.CompressResponse

__all__ = ["DType", "StorageFormat", "StreamingLLM", "SnapKV", "H2O", "CompressionSpec",
           "Prefix", "LayerQueries", "AppendResult", "AppendStreamResult", "FetchedChunk",
           "FetchedHead", "FetchResult", "AttendResult", "ReleaseResult", "PublishResult",
           "SequenceInfo", "PoolInfo", "PoolStats", "PrefixCacheStats", "CompressResponse",
           "parse_dtype", "parse_storage", "NUMPY_DTYPE"]


def lease_positions(segment: _svc.LeaseSegment) -> np.ndarray:
    """The original position of each token of a Lease's segment (int32), expanded from its
    run-length coded position_runs (pairs: first position, count)."""
    runs = np.asarray(segment.position_runs, dtype=np.int64).reshape(-1, 2)
    if runs.size == 0:
        return np.zeros(0, dtype=np.int32)
    counts = runs[:, 1]
    starts = np.repeat(runs[:, 0] - np.cumsum(counts) + counts, counts)
    return (starts + np.arange(int(counts.sum()))).astype(np.int32)
