"""AsyncClient: the asyncio variant of kvcache.Client (grpc.aio), with the same methods,
arguments, retry rules and exceptions; every call is a coroutine, fetch_chunks an async
iterator, append_stream and attend_session async context managers. On the server's node
fetch() reads from the server's memory as Client.fetch does (``data_path``; elsewhere it
receives leased blocks over the server's transfer channel, as Client.fetch does), and append()
and append_stream() copy into a staging region as Client's do (``append_path``); the socket
requests and the large copies run in the loop's default executor, never on the event loop.

    async with kvcache.AsyncClient("127.0.0.1:50051") as client:
        seq = await client.create_sequence()
        await client.append(seq, 0, 0, k, v)
        kv = await client.fetch(seq)
"""

from __future__ import annotations

import asyncio
import functools
import time
from typing import (Any, AsyncIterator, Awaitable, Callable, Dict, List, Optional, Sequence,
                    Tuple, TypeVar, Union)

import grpc
import grpc.aio
import numpy as np

from kvcache import _codec
from kvcache._channel import PathLike, Settings, make_settings, sequence_id
from kvcache._channel import lease_id as _lease_id
from kvcache._channel import sequence_id as _id_of  # where a parameter shadows the name
from kvcache._proto.kvcache.v1 import admin_service_pb2 as admin_pb
from kvcache._proto.kvcache.v1 import admin_service_pb2_grpc as admin_grpc
from kvcache._proto.kvcache.v1 import kvcache_service_pb2 as svc
from kvcache._proto.kvcache.v1 import kvcache_service_pb2_grpc as svc_grpc
from kvcache._proto.kvcache.v1 import types_pb2
from kvcache._local import (LocalReader, StagingSpace, connect_local, gather, read_dtype,
                            undecodable)
from kvcache._paths import (ConnectLocal, GetServerInfo, OpenStaging, OpenTransfer, PathState,
                            drive_async, grpc_result)
from kvcache._transfer import TransferReader, target_host
from kvcache._transfer import tls_context as transfer_tls
from kvcache.client import _SERVER_MAY_STILL_READ
from kvcache.errors import (Aborted, Cancelled, DeadlineExceeded, FailedPrecondition,
                            KvCacheError, from_rpc_error)
from kvcache.types import (AppendResult, AppendStreamResult, AttendResult, CompressionSpec, DType,
                           DTypeLike, FetchedChunk, FetchResult, LayerQueries, LayerQueryStats,
                           Prefix, PublishResult, ReleaseResult, StorageLike, parse_dtype,
                           parse_storage)

T = TypeVar("T")
_UNAVAILABLE = grpc.StatusCode.UNAVAILABLE
# Staged chunks at least this large are copied on an executor thread: a decode step's few
# KiB cost less to copy than the hop to a thread, a prefill chunk's MiBs would stall the loop.
_COPY_OFF_LOOP_BYTES = 256 << 10


async def _stage(staging: StagingSpace, sid: str, layer: int, start_position: int,
                 keys: np.ndarray, values: np.ndarray,
                 dtype: DTypeLike) -> Optional[Tuple[bytes, int]]:
    """_codec.stage_append, on an executor thread when the chunk is large."""
    stage = functools.partial(_codec.stage_append, sid, layer, start_position, keys, values,
                              dtype, staging.array, staging.region_id, staging.acquire)
    if keys.nbytes + values.nbytes < _COPY_OFF_LOOP_BYTES:
        return stage()
    return await asyncio.get_running_loop().run_in_executor(None, stage)


class AsyncClient:
    """asyncio connection to kvcached; arguments as kvcache.Client (interceptors are
    grpc.aio client interceptors). Create it inside a running event loop."""

    def __init__(self, target: str = "127.0.0.1:50051", *, timeout: float = 30.0,
                 max_attempts: int = 4, initial_backoff: float = 0.05, max_backoff: float = 2.0,
                 tls_ca: Optional[PathLike] = None, tls_cert: Optional[PathLike] = None,
                 tls_key: Optional[PathLike] = None, tls_server_name: Optional[str] = None,
                 token: Optional[str] = None, max_message_bytes: int = 16 << 20,
                 interceptors: Sequence[Any] = (), local_reads: bool = True,
                 transfers: bool = True, client_decode: bool = False,
                 staging_bytes: int = 64 << 20):
        self._s: Settings = make_settings(
            target, timeout=timeout, max_attempts=max_attempts, initial_backoff=initial_backoff,
            max_backoff=max_backoff, tls_ca=tls_ca, tls_cert=tls_cert, tls_key=tls_key,
            tls_server_name=tls_server_name, token=token, max_message_bytes=max_message_bytes)
        kwargs = {"options": self._s.options, "interceptors": list(interceptors) or None}
        if self._s.credentials is not None:
            self._channel = grpc.aio.secure_channel(target, self._s.credentials, **kwargs)
        else:
            self._channel = grpc.aio.insecure_channel(target, **kwargs)
        self._kv = svc_grpc.KvCacheServiceStub(self._channel)
        self._admin = admin_grpc.AdminServiceStub(self._channel)
        self._append = self._channel.unary_unary(
            _codec.KV_SERVICE + "Append", request_serializer=None,
            response_deserializer=svc.AppendResponse.FromString)
        self._append_stream = self._channel.stream_unary(
            _codec.KV_SERVICE + "AppendStream", request_serializer=None,
            response_deserializer=svc.AppendStreamResponse.FromString)
        # The same-node read path (or else the transfer channel), decided on the first fetch
        # as Client does, and the appends' staging region, on the first append. The local
        # socket's requests, the channel's reads and the copies out of the mapping or the
        # received blocks run in the loop's default executor, never on the loop.
        self._local_lock = asyncio.Lock()
        self._paths = PathState(local_reads, transfers, staging_bytes)
        self._client_decode = client_decode
        self._target = target

    async def close(self) -> None:
        """Closes the channel; calls in flight are cancelled."""
        await self._channel.close()
        self._paths.close()

    @property
    def data_path(self) -> str:
        """See Client.data_path."""
        return self._paths.data_path

    @property
    def append_path(self) -> str:
        """How append() and append_stream() move bytes: "staged (N-byte region)", or "grpc
        (why not staged)". Decided on the first append."""
        return self._paths.append_path

    async def _perform(self, op: Any, timeout: Optional[float]) -> Any:
        """The I/O of one step of the path decision (kvcache/_paths.py); blocking work on the
        loop's default executor."""
        loop = asyncio.get_running_loop()
        if isinstance(op, GetServerInfo):
            return await self._call(self._admin.GetServerInfo, admin_pb.GetServerInfoRequest(),
                                    timeout, retry=True)
        if isinstance(op, ConnectLocal):
            return await loop.run_in_executor(None, connect_local, op.info,
                                              self._paths.local_reads, self._s.token)
        if isinstance(op, OpenTransfer):
            return await self._open_transfer(timeout)
        assert isinstance(op, OpenStaging)
        return await loop.run_in_executor(None, op.local.open_staging, op.nbytes)

    async def _local_staging(self, timeout: Optional[float]) -> Optional[StagingSpace]:
        async with self._local_lock:
            return await drive_async(self._paths.staged(), lambda op: self._perform(op, timeout))

    async def _local_path(self, timeout: Optional[float]) -> Optional[LocalReader]:
        async with self._local_lock:
            return await drive_async(self._paths.read(), lambda op: self._perform(op, timeout))

    async def _open_transfer(self, timeout: Optional[float]) -> TransferReader:
        opened = await self._call(self._kv.OpenTransfer, svc.OpenTransferRequest(), timeout,
                                  retry=False)
        host = opened.host or target_host(self._target)
        try:
            if not host:
                raise FailedPrecondition("the target names no host to connect to (a unix "
                                         "socket?)")
            tls, server_name = transfer_tls(self._s, opened)
            return await asyncio.get_running_loop().run_in_executor(
                None, TransferReader, host, opened.port, opened.transfer_id, opened.token,
                opened.frame_key, tls, server_name)
        except KvCacheError:
            try:  # best effort: the server drops an unconnected channel after a while
                await self._call(self._kv.CloseTransfer,
                                 svc.CloseTransferRequest(transfer_id=opened.transfer_id),
                                 timeout, retry=False)
            except KvCacheError:
                pass
            raise

    async def _fetch_transferred(self, transfer: TransferReader, seq: Any,
                                 layers: Optional[Sequence[int]], dtype: DTypeLike,
                                 include_unfinished: bool,
                                 timeout: Optional[float]) -> Union[FetchResult, str]:
        """As Client._fetch_transferred: the channel is read on an executor thread while the
        SendLease call runs on the loop."""
        lease = await self.lease_sequence(seq, layers, timeout=timeout)
        try:
            wanted = None if dtype is None else parse_dtype(dtype)
            dt = read_dtype(lease, wanted, self._client_decode)
            if dt is None:
                return undecodable(lease, wanted)
            loop = asyncio.get_running_loop()
            request = svc.SendLeaseRequest(transfer_id=transfer.id, lease_id=lease.lease_id)

            async def call(nonce: int) -> Any:
                request.nonce = nonce
                return await self._kv.SendLease(request, timeout=self._timeout(timeout),
                                                metadata=self._s.metadata)

            def receive() -> Dict[Tuple[int, int], Any]:
                return transfer.fetch(
                    lease, lambda nonce: asyncio.run_coroutine_threadsafe(call(nonce), loop),
                    self._timeout(timeout),
                    lambda renumbered, arenas: gather(renumbered, dt, include_unfinished,
                                                      arenas.__getitem__))

            try:
                heads = await loop.run_in_executor(None, receive)
            except KvCacheError as e:
                if transfer.alive():
                    raise  # refused by the server (NotFound, ...): the channel is fine
                return f"the transfer channel broke: {e.code.name}: {e.message}"
        finally:
            try:  # best effort: the TTL ends it otherwise
                await self.release_lease(lease, timeout=timeout)
            except KvCacheError:
                pass
        return FetchResult(visible_tokens=lease.visible_tokens,
                           dtype=dt if heads else DType.POOL, heads=heads,
                           path=f"transfer ({transfer.where})")

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _timeout(self, timeout: Optional[float]) -> float:
        return self._s.timeout if timeout is None else timeout

    async def _call(self, method: Callable[..., Awaitable[T]], request: Any,
                    timeout: Optional[float], retry: bool) -> T:
        attempts = self._s.max_attempts if retry else 1
        backoff = self._s.initial_backoff
        for attempt in range(attempts):
            try:
                return await method(request, timeout=self._timeout(timeout),
                                    metadata=self._s.metadata)
            except grpc.RpcError as e:
                if e.code() != _UNAVAILABLE or attempt + 1 == attempts:
                    raise from_rpc_error(e) from None
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, self._s.max_backoff)
        raise AssertionError("unreachable")

    async def create_sequence(self, *, pool: str = "", tenant: str = "", sequence_id: str = "",
                              policy: Optional[CompressionSpec] = None,
                              prefix: Optional[Prefix] = None,
                              timeout: Optional[float] = None) -> types_pb2.SequenceInfo:
        """See Client.create_sequence."""
        request = svc.CreateSequenceRequest(pool=pool, tenant=tenant,
                                            client_sequence_id=sequence_id)
        if policy is not None:
            request.policy.CopyFrom(policy.to_proto())
        if prefix is not None:
            request.prefix.CopyFrom(_codec.prefix_spec(prefix))
        return await self._call(self._kv.CreateSequence, request, timeout, retry=False)

    async def fork_sequence(self, seq: Any, *, sequence_id: str = "",
                            timeout: Optional[float] = None) -> types_pb2.SequenceInfo:
        """See Client.fork_sequence."""
        request = svc.ForkSequenceRequest(sequence_id=_id_of(seq),
                                          client_sequence_id=sequence_id)
        return await self._call(self._kv.ForkSequence, request, timeout, retry=False)

    async def lease_sequence(self, seq: Any, layers: Optional[Sequence[int]] = None, *,
                             ttl_ms: int = 0, timeout: Optional[float] = None) -> svc.Lease:
        """See Client.lease_sequence."""
        request = svc.LeaseRequest(sequence_id=_id_of(seq), layers=list(layers or []),
                                   ttl_ms=ttl_ms)
        return await self._call(self._kv.LeaseSequence, request, timeout, retry=False)

    async def renew_lease(self, lease: Any, *, ttl_ms: int = 0,
                          timeout: Optional[float] = None) -> int:
        """See Client.renew_lease."""
        request = svc.RenewLeaseRequest(lease_id=_lease_id(lease), ttl_ms=ttl_ms)
        r = await self._call(self._kv.RenewLease, request, timeout, retry=True)
        return r.expires_unix_ms

    async def release_lease(self, lease: Any, *, timeout: Optional[float] = None) -> int:
        """See Client.release_lease."""
        request = svc.ReleaseLeaseRequest(lease_id=_lease_id(lease))
        r = await self._call(self._kv.ReleaseLease, request, timeout, retry=False)
        return r.freed_blocks

    async def append(self, seq: Any, layer: int, start_position: int, keys: np.ndarray,
                     values: np.ndarray, *, dtype: DTypeLike = None,
                     timeout: Optional[float] = None) -> AppendResult:
        """See Client.append."""
        sid = sequence_id(seq)
        staging = await self._local_staging(timeout) if isinstance(keys, np.ndarray) else None
        staged = None
        if staging is not None:
            staged = await _stage(staging, sid, layer, start_position, keys, values, dtype)
        if staged is None:
            request = _codec.encode_append(sid, layer, start_position, keys, values, dtype)
            r = await self._call(self._append, request, timeout, retry=False)
            return AppendResult(r.layer_tokens, r.visible_tokens)
        assert staging is not None
        request, offset = staged
        try:
            r = await self._call(self._append, request, timeout, retry=False)
        except KvCacheError as e:
            # The server might still be reading a slot whose call ended without its answer
            # (so might it after a cancelled task: that slot is never released either).
            if not isinstance(e, _SERVER_MAY_STILL_READ):
                staging.release(offset)
            raise
        staging.release(offset)
        return AppendResult(r.layer_tokens, r.visible_tokens)

    def append_stream(self, *, timeout: Optional[float] = None) -> "AsyncAppendStream":
        """``async with client.append_stream() as s: await s.append(...)``; s.result after.
        On the server's node (``append_path``) its messages are staged appends, up to 4 in
        flight, as kvcache.client.StagedAppendStream's."""
        return AsyncAppendStream(self, timeout)

    async def fetch_chunks(self, seq: Any, layers: Optional[Sequence[int]] = None,
                           dtype: DTypeLike = None, *, stored: bool = False,
                           include_unfinished: bool = False, max_chunk_bytes: int = 0,
                           tenant: str = "",
                           timeout: Optional[float] = None) -> AsyncIterator[FetchedChunk]:
        """See Client.fetch_chunks; ``await it.aclose()`` cancels the call."""
        request = _codec.fetch_request(sequence_id(seq), layers, dtype, stored,
                                       include_unfinished, max_chunk_bytes, tenant)
        backoff = self._s.initial_backoff
        delivered = False
        for attempt in range(self._s.max_attempts):
            call = self._kv.Fetch(request, timeout=self._timeout(timeout),
                                  metadata=self._s.metadata)
            try:
                async for message in call:
                    delivered = True
                    yield _codec.chunk_from_proto(message)
                return
            except grpc.RpcError as e:
                if e.code() != _UNAVAILABLE or delivered or attempt + 1 == self._s.max_attempts:
                    error = from_rpc_error(e)
                    if delivered:
                        error.message = f"Fetch broke after some chunks: {error.message}"
                        error.args = (error.message,)
                    raise error from None
            finally:
                call.cancel()
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, self._s.max_backoff)

    async def fetch(self, seq: Any, layers: Optional[Sequence[int]] = None,
                    dtype: DTypeLike = None, *, include_unfinished: bool = False,
                    tenant: str = "", timeout: Optional[float] = None) -> FetchResult:
        """See Client.fetch (the same-node path too)."""
        local = await self._local_path(timeout) if not tenant else None
        transfer = self._paths.transfer if not tenant and local is None else None
        why = "another tenant's sequence" if tenant else ""
        if transfer is not None:
            result = await self._fetch_transferred(transfer, seq, layers, dtype,
                                                   include_unfinished, timeout)
            if isinstance(result, FetchResult):
                return result
            why = result
        elif local is not None:
            lease = await self.lease_sequence(seq, layers, timeout=timeout)
            try:
                wanted = None if dtype is None else parse_dtype(dtype)
                result = await asyncio.get_running_loop().run_in_executor(
                    None, local.read, lease, wanted, include_unfinished, self._client_decode)
            finally:
                try:  # best effort: the TTL ends it otherwise
                    await self.release_lease(lease, timeout=timeout)
                except KvCacheError:
                    pass
            if isinstance(result, FetchResult):
                return result
            why = result
        assembler = _codec.FetchAssembler()
        async for chunk in self.fetch_chunks(seq, layers, dtype,
                                             include_unfinished=include_unfinished,
                                             tenant=tenant, timeout=timeout):
            assembler.add(chunk)
        return grpc_result(assembler.result(), why, self.data_path)

    async def get_sequence(self, seq: Any, *, tenant: str = "",
                           timeout: Optional[float] = None) -> types_pb2.SequenceInfo:
        """See Client.get_sequence."""
        request = svc.GetSequenceRequest(sequence_id=sequence_id(seq), tenant=tenant)
        return await self._call(self._kv.GetSequence, request, timeout, retry=True)

    async def release(self, seq: Any, *, timeout: Optional[float] = None) -> ReleaseResult:
        """See Client.release."""
        r = await self._call(self._kv.Release, svc.ReleaseRequest(sequence_id=sequence_id(seq)),
                             timeout, retry=False)
        return ReleaseResult(r.freed_blocks, r.freed_bytes)

    async def compress(self, seq: Any, spec: CompressionSpec,
                       queries: Optional[Sequence[LayerQueries]] = None, *,
                       query_stats: Optional[Sequence[LayerQueryStats]] = None,
                       timeout: Optional[float] = None) -> svc.CompressResponse:
        """See Client.compress."""
        request = svc.CompressRequest(sequence_id=sequence_id(seq), spec=spec.to_proto(),
                                      queries=_codec.compress_queries(queries),
                                      query_stats=_codec.compress_query_stats(query_stats))
        return await self._call(self._kv.Compress, request, timeout, retry=False)

    async def attend(self, seq: Any, layer: int, queries: np.ndarray, positions: Sequence[int],
                     *, dtype: DTypeLike = None, return_weights: bool = False,
                     timeout: Optional[float] = None) -> AttendResult:
        """See Client.attend."""
        request = _codec.attend_request(sequence_id(seq), layer, queries, positions, dtype,
                                        return_weights)
        r = await self._call(self._kv.Attend, request, timeout, retry=False)
        return _codec.attend_from_proto(r, queries.shape)

    def attend_session(self, *, timeout: Optional[float] = None) -> "AsyncAttendSession":
        """``async with client.attend_session() as s: await s.attend(...)``."""
        return AsyncAttendSession(self, timeout)

    async def lookup_prefix(self, prefix: Prefix, pool: str = "", storage: StorageLike = None,
                            *, timeout: Optional[float] = None) -> int:
        """See Client.lookup_prefix."""
        request = svc.LookupPrefixRequest(pool=pool, prefix=_codec.prefix_spec(prefix),
                                          storage=int(parse_storage(storage)))
        r = await self._call(self._kv.LookupPrefix, request, timeout, retry=True)
        return r.cached_tokens

    async def publish_prefix(self, seq: Any, prefix: Prefix, *,
                             timeout: Optional[float] = None) -> PublishResult:
        """See Client.publish_prefix."""
        request = svc.PublishPrefixRequest(sequence_id=sequence_id(seq),
                                           prefix=_codec.prefix_spec(prefix))
        r = await self._call(self._kv.PublishPrefix, request, timeout, retry=True)
        return PublishResult(r.published_tokens, r.new_tokens)

    async def list_pools(self, *, timeout: Optional[float] = None) -> List[types_pb2.PoolInfo]:
        """See Client.list_pools."""
        r = await self._call(self._admin.ListPools, admin_pb.ListPoolsRequest(), timeout,
                             retry=True)
        return list(r.pools)

    async def pool_stats(self, pool: str = "", *,
                         timeout: Optional[float] = None) -> admin_pb.PoolStats:
        """See Client.pool_stats."""
        return await self._call(self._admin.GetPoolStats,
                                admin_pb.GetPoolStatsRequest(pool=pool), timeout, retry=True)

    async def list_sequences(self, *, pool: str = "", tenant: str = "", limit: int = 0,
                             page_token: str = "", timeout: Optional[float] = None
                             ) -> admin_pb.ListSequencesResponse:
        """See Client.list_sequences."""
        request = admin_pb.ListSequencesRequest(pool=pool, tenant=tenant, limit=limit,
                                                page_token=page_token)
        return await self._call(self._admin.ListSequences, request, timeout, retry=True)

    async def list_tenants(self, *,
                           timeout: Optional[float] = None) -> List[admin_pb.TenantUsage]:
        """See Client.list_tenants."""
        r = await self._call(self._admin.ListTenants, admin_pb.ListTenantsRequest(), timeout,
                             retry=True)
        return list(r.tenants)

    async def evict(self, seq: Any, *, tenant: str = "",
                    timeout: Optional[float] = None) -> admin_pb.EvictSequenceResponse:
        """See Client.evict."""
        request = admin_pb.EvictSequenceRequest(sequence_id=sequence_id(seq), tenant=tenant)
        return await self._call(self._admin.EvictSequence, request, timeout, retry=False)

    async def drain(self, resume: bool = False, *,
                    timeout: Optional[float] = None) -> admin_pb.DrainResponse:
        """See Client.drain."""
        return await self._call(self._admin.Drain, admin_pb.DrainRequest(resume=resume),
                                timeout, retry=True)

    async def list_leases(self, *, tenant: str = "", pool: str = "",
                          timeout: Optional[float] = None) -> List[admin_pb.LeaseInfo]:
        """See Client.list_leases."""
        request = admin_pb.ListLeasesRequest(tenant=tenant, pool=pool)
        r = await self._call(self._admin.ListLeases, request, timeout, retry=True)
        return list(r.leases)

    async def end_lease(self, lease: Any, *, tenant: str = "",
                        timeout: Optional[float] = None) -> int:
        """See Client.end_lease."""
        request = admin_pb.EndLeaseRequest(tenant=tenant, lease_id=_lease_id(lease))
        r = await self._call(self._admin.EndLease, request, timeout, retry=False)
        return r.freed_blocks


class AsyncAppendStream:
    """See kvcache.client.AppendStream; append() and finish() are coroutines. Which path it
    takes (one AppendStream call, or staged unary Appends on the server's node) is decided on
    its first append; the deadline runs from its creation."""

    def __init__(self, client: AsyncClient, timeout: Optional[float]):
        self._client = client
        self._timeout = timeout
        self._deadline = time.monotonic() + client._timeout(timeout)
        self._impl: Any = None  # _GrpcAppendStream or _StagedAppendStream
        self._cancelled = False

    @property
    def result(self) -> Optional[AppendStreamResult]:
        return None if self._impl is None else self._impl.result

    async def _open(self) -> Any:
        if self._impl is None:
            if self._cancelled:
                raise FailedPrecondition("the append stream is finished")
            staging = await self._client._local_staging(self._timeout)
            left = max(self._deadline - time.monotonic(), 0.001)
            self._impl = (_StagedAppendStream(self._client, staging, left)
                          if staging is not None else _GrpcAppendStream(self._client, left))
        return self._impl

    async def append(self, seq: Any, layer: int, start_position: int, keys: np.ndarray,
                     values: np.ndarray, *, dtype: DTypeLike = None) -> None:
        """Sends one Append (same arguments as Client.append)."""
        impl = await self._open()
        await impl.append(seq, layer, start_position, keys, values, dtype=dtype)

    async def finish(self) -> AppendStreamResult:
        """Ends the stream; the totals, or the first rejected message's error."""
        impl = await self._open()
        return await impl.finish()

    def cancel(self) -> None:
        """Cancels the messages in flight; those the server already applied stay applied."""
        self._cancelled = True
        if self._impl is not None:
            self._impl.cancel()

    async def __aenter__(self) -> "AsyncAppendStream":
        return self

    async def __aexit__(self, exc_type: Any, *rest: Any) -> None:
        if exc_type is not None:
            self.cancel()
        else:
            await self.finish()


class _GrpcAppendStream:
    """One AppendStream call (messages carry the bytes)."""

    def __init__(self, client: AsyncClient, timeout: float):
        self._call = client._append_stream(timeout=timeout, metadata=client._s.metadata)
        self._closed = False
        self.result: Optional[AppendStreamResult] = None

    async def append(self, seq: Any, layer: int, start_position: int, keys: np.ndarray,
                     values: np.ndarray, *, dtype: DTypeLike = None) -> None:
        if self._closed:
            raise FailedPrecondition("the append stream is finished")
        request = _codec.encode_append(sequence_id(seq), layer, start_position, keys, values,
                                       dtype)
        try:
            await self._call.write(request)
        except (grpc.RpcError, asyncio.InvalidStateError):
            await self.finish()  # raises the server's error
            raise Aborted("the server closed the append stream") from None

    async def finish(self) -> AppendStreamResult:
        if self.result is not None:
            return self.result
        try:
            if not self._closed:
                self._closed = True
                await self._call.done_writing()
            r = await self._call
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None
        except asyncio.CancelledError:
            raise Cancelled("the append stream was cancelled by the client") from None
        self.result = AppendStreamResult(r.messages, r.tokens, r.visible_tokens)
        return self.result

    def cancel(self) -> None:
        self._closed = True
        self._call.cancel()


# (call, slot offset or None, message index, layer, start_position, tokens) per message
_InFlight = Tuple[Any, Optional[int], int, int, int, int]


class _StagedAppendStream:
    """Staged unary Appends, up to 4 in flight, one per (sequence, layer) so that each
    layer's order holds (the only order the service needs): kvcache.client.StagedAppendStream
    on asyncio. A chunk larger than the region goes as bytes; a rejected message breaks the
    stream (finish() names it and how many messages were applied)."""

    _MAX_IN_FLIGHT = 4

    def __init__(self, client: AsyncClient, staging: StagingSpace, timeout: float):
        self._client = client
        self._staging = staging
        self._deadline = time.monotonic() + timeout
        self._in_flight: List[Tuple[Tuple[str, int], _InFlight]] = []
        self._messages = self._tokens = self._visible = self._written = 0
        self._error: Optional[Tuple[int, KvCacheError, str]] = None
        self._closed = False
        self.result: Optional[AppendStreamResult] = None

    async def _settle(self, entry: _InFlight) -> None:
        call, offset, index, layer, start, tokens = entry
        try:
            r = await call
        except (grpc.RpcError, asyncio.CancelledError) as e:
            if isinstance(e, asyncio.CancelledError) and not call.cancelled():
                raise  # this task was cancelled, not the message
            err = (from_rpc_error(e) if isinstance(e, grpc.RpcError)
                   else Cancelled("the append stream was cancelled by the client"))
            if offset is not None and not isinstance(err, _SERVER_MAY_STILL_READ):
                self._staging.release(offset)
            if self._error is None or index < self._error[0]:
                self._error = (index, err, f"layer {layer}, start_position {start}")
            return
        self._messages += 1
        self._tokens += tokens
        self._visible = max(self._visible, r.visible_tokens)
        if offset is not None:
            self._staging.release(offset)

    async def _settle_all(self) -> None:
        while self._in_flight:
            await self._settle(self._in_flight.pop(0)[1])

    async def append(self, seq: Any, layer: int, start_position: int, keys: np.ndarray,
                     values: np.ndarray, *, dtype: DTypeLike = None) -> None:
        if self._closed:
            raise FailedPrecondition("the append stream is finished")
        sid = sequence_id(seq)
        key = (sid, layer)
        for entry in [e for e in self._in_flight if e[0] == key]:
            self._in_flight.remove(entry)
            await self._settle(entry[1])
        while len(self._in_flight) >= self._MAX_IN_FLIGHT:
            await self._settle(self._in_flight.pop(0)[1])
        if self._error is not None:
            raise Aborted("the append stream broke; finish() says why")
        s = self._staging
        staged = await _stage(s, sid, layer, start_position, keys, values, dtype)
        if staged is None and isinstance(keys, np.ndarray) and 0 < 2 * keys.nbytes <= s.size:
            await self._settle_all()  # the region is busy: wait until it is empty
            if self._error is not None:
                raise Aborted("the append stream broke; finish() says why")
            staged = await _stage(s, sid, layer, start_position, keys, values, dtype)
        left = self._deadline - time.monotonic()
        if left <= 0:
            if staged is not None:
                s.release(staged[1])
            self._error = (self._written, DeadlineExceeded("the append stream's deadline passed"),
                           f"layer {layer}, start_position {start_position}")
            raise Aborted("the append stream broke; finish() says why")
        if staged is None:  # larger than the region: the bytes go in the request
            request: bytes = _codec.encode_append(sid, layer, start_position, keys, values, dtype)
            offset: Optional[int] = None
        else:
            request, offset = staged
        call = self._client._append(request, timeout=left, metadata=self._client._s.metadata)
        entry: _InFlight = (call, offset, self._written, layer, start_position,
                            int(keys.shape[0]))
        self._in_flight.append((key, entry))
        self._written += 1

    async def finish(self) -> AppendStreamResult:
        if self.result is not None:
            return self.result
        self._closed = True
        await self._settle_all()
        if self._error is not None:
            index, err, where = self._error
            raise type(err)(f"AppendStream message {index} ({where}) rejected: {err.message}; "
                            f"{self._messages} messages were applied", err.code)
        self.result = AppendStreamResult(self._messages, self._tokens, self._visible)
        return self.result

    def cancel(self) -> None:
        # Slots of cancelled messages stay in use: the server may still be reading them.
        self._closed = True
        for _, (call, *_rest) in self._in_flight:
            call.cancel()
        self._in_flight.clear()


class AsyncAttendSession:
    """See kvcache.client.AttendSession; attend() and close() are coroutines."""

    def __init__(self, client: AsyncClient, timeout: Optional[float]):
        self._call = client._kv.AttendStream(timeout=client._timeout(timeout),
                                             metadata=client._s.metadata)
        self._closed = False

    async def _status_error(self) -> Exception:
        code = await self._call.code()
        if code == grpc.StatusCode.OK:
            return Aborted("the server closed the attend stream")
        details = await self._call.details()
        return from_rpc_error(_Status(code, details))

    async def attend(self, seq: Any, layer: int, queries: np.ndarray, positions: Sequence[int],
                     *, dtype: DTypeLike = None, return_weights: bool = False) -> AttendResult:
        """As Client.attend, on this stream."""
        if self._closed:
            raise FailedPrecondition("the attend session is closed")
        request = _codec.attend_request(sequence_id(seq), layer, queries, positions, dtype,
                                        return_weights)
        try:
            await self._call.write(request)
            r = await self._call.read()
        except grpc.RpcError as e:
            self._closed = True
            raise from_rpc_error(e) from None
        except asyncio.InvalidStateError:
            self._closed = True
            raise await self._status_error() from None
        if r is grpc.aio.EOF:
            self._closed = True
            raise await self._status_error()
        return _codec.attend_from_proto(r, queries.shape)

    async def close(self) -> None:
        """Ends the stream; raises the server's final error, if any."""
        if self._closed:
            return
        self._closed = True
        await self._call.done_writing()
        code = await self._call.code()
        if code != grpc.StatusCode.OK:
            raise from_rpc_error(_Status(code, await self._call.details()))

    def cancel(self) -> None:
        self._closed = True
        self._call.cancel()

    async def __aenter__(self) -> "AsyncAttendSession":
        return self

    async def __aexit__(self, exc_type: Any, *rest: Any) -> None:
        if exc_type is not None:
            self.cancel()
        else:
            await self.close()


class _Status:
    """A (code, details) pair shaped like grpc.RpcError for from_rpc_error."""

    def __init__(self, code: grpc.StatusCode, details: Optional[str]):
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> Optional[str]:
        return self._details
