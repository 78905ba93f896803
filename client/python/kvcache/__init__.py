"""kvcache: Python client of kvcached, the kvcache.v1 KV-cache service.

Client (synchronous) and AsyncClient (asyncio) expose every KvCacheService and AdminService
call with NumPy arrays for keys, values and queries (and the prefix cache: Prefix,
lookup_prefix, publish_prefix, create_sequence(prefix=...)); errors are kvcache.errors exceptions
named after the gRPC status codes.
"""

from kvcache.aio import AsyncAppendStream, AsyncAttendSession, AsyncClient
from kvcache.client import AppendStream, AttendSession, Client
from kvcache.errors import *  # noqa: F401,F403  (the exception classes)
from kvcache.errors import KvCacheError
from kvcache.types import (H2O, AppendResult, AppendStreamResult, AttendResult,
                           CompressionSpec, DType, ExpectedAttention, FetchedChunk, FetchedHead,
                           FetchResult, LayerQueries, LayerQueryStats, PoolStats, Prefix,
                           PrefixCacheStats, PublishResult, ReleaseResult, SnapKV, StorageFormat,
                           StreamingLLM, lease_positions)

__version__ = "0.1.0"
