"""Client: the synchronous Python API of kvcached (kvcache.v1 over gRPC).

    with kvcache.Client("127.0.0.1:50051") as client:
        seq = client.create_sequence(pool="default")
        client.append(seq, layer=0, start_position=0, keys=k, values=v)
        kv = client.fetch(seq)            # kv[(layer, kv_head)].keys: [n, head_dim]

Every call has a deadline (`timeout`, seconds; per call `timeout=`). Failures raise the
kvcache.errors exception named after the gRPC status code. Only idempotent calls
(get_sequence, fetch before its first chunk, lookup_prefix, publish_prefix, list_pools,
pool_stats, list_sequences, list_tenants, drain) are retried, only on UNAVAILABLE, with
exponential backoff: the same rules as the C++ client (client/src/kv_cache_client.cc).
Thread-safe: share one Client.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any, Callable, Iterator, List, Optional, Sequence, Tuple, TypeVar, Union

import grpc
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
                            drive, grpc_result)
from kvcache._transfer import TransferReader, target_host
from kvcache._transfer import tls_context as transfer_tls
from kvcache.errors import (Aborted, Cancelled, DataLoss, DeadlineExceeded, FailedPrecondition,
                            Internal, KvCacheError, Unavailable, Unknown, from_rpc_error)
from kvcache.types import (AppendResult, AppendStreamResult, AttendResult, CompressionSpec, DType,
                           DTypeLike, FetchedChunk, FetchResult, LayerQueries, LayerQueryStats,
                           Prefix, PublishResult, ReleaseResult, StorageLike, parse_dtype,
                           parse_storage)

T = TypeVar("T")
_UNAVAILABLE = grpc.StatusCode.UNAVAILABLE


# Errors with which an append can end while the server may still be reading its staged bytes
# (the client gave up or lost the answer, not the server refusing).
_SERVER_MAY_STILL_READ = (DeadlineExceeded, Cancelled, Unavailable, Unknown, Internal, DataLoss)

class Client:
    """A connection to kvcached. The channel connects lazily: an unreachable target (or a
    failed TLS handshake) shows up as ``Unavailable`` on the first call."""

    def __init__(self, target: str = "127.0.0.1:50051", *, timeout: float = 30.0,
                 max_attempts: int = 4, initial_backoff: float = 0.05, max_backoff: float = 2.0,
                 tls_ca: Optional[PathLike] = None, tls_cert: Optional[PathLike] = None,
                 tls_key: Optional[PathLike] = None, tls_server_name: Optional[str] = None,
                 token: Optional[str] = None, max_message_bytes: int = 16 << 20,
                 interceptors: Sequence[Any] = (), local_reads: bool = True,
                 transfers: bool = True, client_decode: bool = False,
                 staging_bytes: int = 64 << 20):
        """target: any gRPC target (host:port, unix:/path, dns:///...). timeout: default
        deadline of each call in seconds. max_attempts: for retried reads (1 = no retries).
        tls_ca: PEM CA file; set = TLS (tls_cert + tls_key for mTLS; tls_server_name when the
        certificate does not name the target's host). token: bearer token sent as
        ``authorization: Bearer <token>``. interceptors: grpc client interceptors.
        local_reads: fetch() reads host pools from the server's memory when the server is on
        this node and lets this process map its pools (its ``local_socket``; docs/
        ARCHITECTURE.md "Same-node reads"); ``data_path`` says which path is used and why.
        transfers: without the same-node path, fetch() receives the leased blocks over the
        server's transfer channel when it offers one (its ``transfer_listen``; docs/
        ARCHITECTURE.md "Transfers").
        client_decode: on those two paths, records stored in a low-bit format (or in another
        dtype than the requested one) are decoded here in NumPy, bit for bit as the server
        decodes them, instead of fetched over gRPC decoded by the server. Off by default: the
        server's decode plus gRPC is ~3x faster than NumPy's decode on one machine (docs/
        BENCHMARKS.md); on when a slow network or busy server cores make the compressed
        bytes worth decoding here.
        staging_bytes: with local_reads on the server's node, append() and append_stream()
        copy keys and values into a staging region of this many bytes that the server reads
        them from (0: always send them over gRPC); ``append_path`` says which.
        Raises InvalidArgument for bad options or an unreadable TLS file."""
        self._s: Settings = make_settings(
            target, timeout=timeout, max_attempts=max_attempts, initial_backoff=initial_backoff,
            max_backoff=max_backoff, tls_ca=tls_ca, tls_cert=tls_cert, tls_key=tls_key,
            tls_server_name=tls_server_name, token=token, max_message_bytes=max_message_bytes)
        if self._s.credentials is not None:
            channel = grpc.secure_channel(target, self._s.credentials, options=self._s.options)
        else:
            channel = grpc.insecure_channel(target, options=self._s.options)
        self._raw_channel = channel
        if interceptors:
            channel = grpc.intercept_channel(channel, *interceptors)
        self._channel = channel
        self._kv = svc_grpc.KvCacheServiceStub(channel)
        self._admin = admin_grpc.AdminServiceStub(channel)
        # How reads and appends move bytes (kvcache/_paths.py), decided on the first fetch
        # and append, under this lock.
        self._local_lock = threading.Lock()
        self._paths = PathState(local_reads, transfers, staging_bytes)
        self._client_decode = client_decode
        self._target = target
        # Append requests arrive serialized by _codec.encode_append (one copy of the tensors).
        self._append = channel.unary_unary(
            _codec.KV_SERVICE + "Append", request_serializer=None,
            response_deserializer=svc.AppendResponse.FromString)
        self._append_stream = channel.stream_unary(
            _codec.KV_SERVICE + "AppendStream", request_serializer=None,
            response_deserializer=svc.AppendStreamResponse.FromString)

    # -- plumbing ---------------------------------------------------------------------------

    def close(self) -> None:
        """Closes the channel; calls in flight are cancelled."""
        self._raw_channel.close()
        with self._local_lock:
            self._paths.close()

    @property
    def data_path(self) -> str:
        """How fetch() moves bytes: "shared-memory (PATH)", "transfer (HOST:PORT)", or
        "grpc (why neither)". Decided on the first fetch. A fetch whose records this path
        cannot carry (low-bit ones without client_decode) goes over gRPC: its result's
        ``path`` says which path each fetch took."""
        with self._local_lock:
            return self._paths.data_path

    @property
    def append_path(self) -> str:
        """How append() and append_stream() move bytes: "staged (N-byte region)", or "grpc
        (why not staged)". Decided on the first append."""
        with self._local_lock:
            return self._paths.append_path

    def _perform(self, op: Any, timeout: Optional[float]) -> Any:
        """The I/O of one step of the path decision (kvcache/_paths.py)."""
        if isinstance(op, GetServerInfo):
            return self._call(self._admin.GetServerInfo, admin_pb.GetServerInfoRequest(),
                              timeout, retry=True)
        if isinstance(op, ConnectLocal):
            return connect_local(op.info, self._paths.local_reads, self._s.token)
        if isinstance(op, OpenTransfer):
            return self._open_transfer(timeout)
        assert isinstance(op, OpenStaging)
        return op.local.open_staging(op.nbytes)

    def _local_staging(self, timeout: Optional[float]) -> Optional[StagingSpace]:
        with self._local_lock:
            return drive(self._paths.staged(), lambda op: self._perform(op, timeout))

    def _local_path(self, timeout: Optional[float]) -> Optional[LocalReader]:
        with self._local_lock:
            return drive(self._paths.read(), lambda op: self._perform(op, timeout))

    def _open_transfer(self, timeout: Optional[float]) -> TransferReader:
        opened = self._call(self._kv.OpenTransfer, svc.OpenTransferRequest(), timeout,
                            retry=False)
        host = opened.host or target_host(self._target)
        try:
            if not host:
                raise FailedPrecondition("the target names no host to connect to (a unix "
                                         "socket?)")
            tls, server_name = transfer_tls(self._s, opened)
            return TransferReader(host, opened.port, opened.transfer_id, opened.token,
                                  opened.frame_key, tls, server_name)
        except KvCacheError:
            try:  # best effort: the server drops an unconnected channel after a while
                self._call(self._kv.CloseTransfer,
                           svc.CloseTransferRequest(transfer_id=opened.transfer_id), timeout,
                           retry=False)
            except KvCacheError:
                pass
            raise

    def _transfer_path(self) -> Optional[TransferReader]:
        """The transfer channel _local_path decided on, if it did."""
        with self._local_lock:
            return self._paths.transfer

    def _fetch_transferred(self, transfer: TransferReader, seq: Any,
                           layers: Optional[Sequence[int]], dtype: DTypeLike,
                           include_unfinished: bool,
                           timeout: Optional[float]) -> Union[FetchResult, str]:
        """fetch() over the transfer channel; None when a record needs decoding and
        client_decode is off, or the channel broke (then over gRPC; the next fetch decides
        the path again)."""
        lease = self.lease_sequence(seq, layers, timeout=timeout)
        try:
            wanted = None if dtype is None else parse_dtype(dtype)
            dt = read_dtype(lease, wanted, self._client_decode)
            if dt is None:
                return undecodable(lease, wanted)

            def send(nonce: int) -> Any:
                request = svc.SendLeaseRequest(transfer_id=transfer.id,
                                               lease_id=lease.lease_id, nonce=nonce)
                return self._kv.SendLease.future(request, timeout=self._timeout(timeout),
                                                 metadata=self._s.metadata)

            try:
                heads = transfer.fetch(
                    lease, send, self._timeout(timeout),
                    lambda renumbered, arenas: gather(renumbered, dt, include_unfinished,
                                                      arenas.__getitem__))
            except KvCacheError as e:
                if transfer.alive():
                    raise  # refused by the server (NotFound, ...): the channel is fine
                return f"the transfer channel broke: {e.code.name}: {e.message}"
        finally:
            try:  # best effort: the TTL ends it otherwise
                self.release_lease(lease, timeout=timeout)
            except KvCacheError:
                pass
        # As the gRPC path, whose dtype comes with the chunks: POOL when there were none.
        return FetchResult(visible_tokens=lease.visible_tokens,
                           dtype=dt if heads else DType.POOL, heads=heads,
                           path=f"transfer ({transfer.where})")

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _timeout(self, timeout: Optional[float]) -> float:
        return self._s.timeout if timeout is None else timeout

    def _call(self, method: Callable[..., T], request: Any, timeout: Optional[float],
              retry: bool) -> T:
        attempts = self._s.max_attempts if retry else 1
        backoff = self._s.initial_backoff
        for attempt in range(attempts):
            try:
                return method(request, timeout=self._timeout(timeout), metadata=self._s.metadata)
            except grpc.RpcError as e:
                if e.code() != _UNAVAILABLE or attempt + 1 == attempts:
                    raise from_rpc_error(e) from None
            time.sleep(backoff)
            backoff = min(backoff * 2, self._s.max_backoff)
        raise AssertionError("unreachable")

    # -- KvCacheService ---------------------------------------------------------------------

    def create_sequence(self, *, pool: str = "", tenant: str = "", sequence_id: str = "",
                        policy: Optional[CompressionSpec] = None,
                        prefix: Optional[Prefix] = None,
                        timeout: Optional[float] = None) -> types_pb2.SequenceInfo:
        """Creates an empty sequence (pool "" = the server's first). With `prefix` it starts
        from the longest cached prefix of those tokens: the reply's attached_tokens says how
        many (also its visible_tokens); append from there. Not retried (a retry after a lost
        reply would create a second sequence). NotFound (pool), AlreadyExists,
        InvalidArgument, ResourceExhausted, PermissionDenied (another tenant's name),
        FailedPrecondition (a prefix with a residual window policy)."""
        request = svc.CreateSequenceRequest(pool=pool, tenant=tenant,
                                            client_sequence_id=sequence_id)
        if policy is not None:
            request.policy.CopyFrom(policy.to_proto())
        if prefix is not None:
            request.prefix.CopyFrom(_codec.prefix_spec(prefix))
        return self._call(self._kv.CreateSequence, request, timeout, retry=False)

    def fork_sequence(self, seq: Any, *, sequence_id: str = "",
                      timeout: Optional[float] = None) -> types_pb2.SequenceInfo:
        """A new sequence starting with everything `seq` stores now (every layer, compressed
        or not): whole blocks are shared, and a later change to either sequence copies a
        shared block first, so the other never sees it. `sequence_id` names the fork
        (optional). Not retried (a retry after a lost reply would fork twice). NotFound,
        AlreadyExists, InvalidArgument, ResourceExhausted (pool or quota)."""
        request = svc.ForkSequenceRequest(sequence_id=_id_of(seq),
                                          client_sequence_id=sequence_id)
        return self._call(self._kv.ForkSequence, request, timeout, retry=False)

    def append(self, seq: Any, layer: int, start_position: int, keys: np.ndarray,
               values: np.ndarray, *, dtype: DTypeLike = None,
               timeout: Optional[float] = None) -> AppendResult:
        """Appends one layer's keys and values, [n, kv_heads, head_dim] float16/float32 (or
        bf16 bits as uint16 with dtype='bf16'), at start_position = the tokens the layer
        already has. All-or-nothing; not retried. The arrays are copied once, into the
        message (plus once more if not C-contiguous). InvalidArgument (shape, dtype, layer),
        FailedPrecondition (out of order), ResourceExhausted, NotFound. On the server's node
        (``append_path``) the arrays are copied into the staging region instead."""
        sid = sequence_id(seq)
        staging = self._local_staging(timeout) if isinstance(keys, np.ndarray) else None
        staged = None
        if staging is not None:
            staged = _codec.stage_append(sid, layer, start_position, keys, values, dtype,
                                         staging.array, staging.region_id, staging.acquire)
        if staged is None:
            request = _codec.encode_append(sid, layer, start_position, keys, values, dtype)
            r = self._call(self._append, request, timeout, retry=False)
            return AppendResult(r.layer_tokens, r.visible_tokens)
        assert staging is not None
        request, offset = staged
        try:
            r = self._call(self._append, request, timeout, retry=False)
        except KvCacheError as e:
            # The server might still be reading a slot whose call ended without its answer:
            # such a slot is never reused.
            if not isinstance(e, _SERVER_MAY_STILL_READ):
                staging.release(offset)
            raise
        staging.release(offset)
        return AppendResult(r.layer_tokens, r.visible_tokens)

    def append_stream(self, *, timeout: Optional[float] = None) -> "AppendStream":
        """A client-streaming append for prefills; use as a context manager:

            with client.append_stream() as stream:
                for layer in range(num_layers):
                    stream.append(seq, layer, 0, k[layer], v[layer])
            stream.result.visible_tokens
        """
        staging = self._local_staging(timeout)
        if staging is not None:
            return StagedAppendStream(self, staging, timeout)  # type: ignore[return-value]
        return AppendStream(self, timeout)

    def fetch_chunks(self, seq: Any, layers: Optional[Sequence[int]] = None,
                     dtype: DTypeLike = None, *, stored: bool = False,
                     include_unfinished: bool = False, max_chunk_bytes: int = 0,
                     tenant: str = "", timeout: Optional[float] = None) -> Iterator[FetchedChunk]:
        """Streams the sequence's tokens chunk by chunk (one (layer, kv head, token range)
        each). Closing the iterator early (``.close()``, or leaving a for loop over it and
        dropping it) cancels the call. Retried on UNAVAILABLE only before the first chunk.
        stored=True returns records as stored (uint8 [n, record_bytes])."""
        request = _codec.fetch_request(sequence_id(seq), layers, dtype, stored,
                                       include_unfinished, max_chunk_bytes, tenant)
        backoff = self._s.initial_backoff
        delivered = False
        for attempt in range(self._s.max_attempts):
            call = self._kv.Fetch(request, timeout=self._timeout(timeout),
                                  metadata=self._s.metadata)
            try:
                for message in call:
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
                call.cancel()  # a no-op once the stream has ended
            time.sleep(backoff)
            backoff = min(backoff * 2, self._s.max_backoff)

    def fetch(self, seq: Any, layers: Optional[Sequence[int]] = None, dtype: DTypeLike = None,
              *, include_unfinished: bool = False, tenant: str = "",
              timeout: Optional[float] = None) -> FetchResult:
        """Fetches the visible tokens, dense in `dtype` (None = pool's), assembled per
        (layer, kv head): result[(layer, head)].keys / .values [n, head_dim], .positions.
        On the same node (``data_path``) the records are copied from the mapped pool under a
        lease, elsewhere received over the server's transfer channel when it offers one;
        records stored in a low-bit format come over gRPC decoded by the server, or with
        client_decode are decoded here (kvcache/_decode.py) exactly as the server would: the
        result is the same on every path."""
        local = self._local_path(timeout) if not tenant else None
        transfer = self._transfer_path() if not tenant and local is None else None
        why = "another tenant's sequence" if tenant else ""
        if transfer is not None:
            result = self._fetch_transferred(transfer, seq, layers, dtype, include_unfinished,
                                             timeout)
            if isinstance(result, FetchResult):
                return result
            why = result
        elif local is not None:
            lease = self.lease_sequence(seq, layers, timeout=timeout)
            try:
                wanted = None if dtype is None else parse_dtype(dtype)
                result = local.read(lease, wanted, include_unfinished, self._client_decode)
            finally:
                try:  # best effort: the TTL ends it otherwise
                    self.release_lease(lease, timeout=timeout)
                except KvCacheError:
                    pass
            if isinstance(result, FetchResult):
                return result
            why = result
        assembler = _codec.FetchAssembler()
        for chunk in self.fetch_chunks(seq, layers, dtype, include_unfinished=include_unfinished,
                                       tenant=tenant, timeout=timeout):
            assembler.add(chunk)
        return grpc_result(assembler.result(), why, self.data_path)

    def get_sequence(self, seq: Any, *, tenant: str = "",
                     timeout: Optional[float] = None) -> types_pb2.SequenceInfo:
        """The sequence's lengths, stored tokens and bytes. Retried. NotFound."""
        request = svc.GetSequenceRequest(sequence_id=sequence_id(seq), tenant=tenant)
        return self._call(self._kv.GetSequence, request, timeout, retry=True)

    def release(self, seq: Any, *, timeout: Optional[float] = None) -> ReleaseResult:
        """Frees every block of the sequence. Not retried. NotFound."""
        r = self._call(self._kv.Release, svc.ReleaseRequest(sequence_id=sequence_id(seq)),
                       timeout, retry=False)
        return ReleaseResult(r.freed_blocks, r.freed_bytes)

    def compress(self, seq: Any, spec: CompressionSpec,
                 queries: Optional[Sequence[LayerQueries]] = None, *,
                 query_stats: Optional[Sequence[LayerQueryStats]] = None,
                 timeout: Optional[float] = None) -> svc.CompressResponse:
        """Evicts and/or converts what the sequence stores. SnapKV needs the last `window`
        queries of every layer; H2O may take every prompt query; ExpectedAttention needs
        `query_stats` of every layer. All-or-nothing; not retried.
        InvalidArgument (spec, queries), FailedPrecondition (H2O without scores), ..."""
        request = svc.CompressRequest(sequence_id=sequence_id(seq), spec=spec.to_proto(),
                                      queries=_codec.compress_queries(queries),
                                      query_stats=_codec.compress_query_stats(query_stats))
        return self._call(self._kv.Compress, request, timeout, retry=False)

    def attend(self, seq: Any, layer: int, queries: np.ndarray, positions: Sequence[int], *,
               dtype: DTypeLike = None, return_weights: bool = False,
               timeout: Optional[float] = None) -> AttendResult:
        """Decode attention of one layer's queries [n, num_query_heads, head_dim] over the
        stored tokens. Not retried (it accumulates H2O scores). FailedPrecondition if a
        position is before the layer's last token."""
        request = _codec.attend_request(sequence_id(seq), layer, queries, positions, dtype,
                                        return_weights)
        r = self._call(self._kv.Attend, request, timeout, retry=False)
        return _codec.attend_from_proto(r, queries.shape)

    def attend_session(self, *, timeout: Optional[float] = None) -> "AttendSession":
        """A bidirectional Attend stream for a decode loop; `timeout` covers the session."""
        return AttendSession(self, timeout)

    def lookup_prefix(self, prefix: Prefix, pool: str = "", storage: StorageLike = None, *,
                      timeout: Optional[float] = None) -> int:
        """How many leading tokens of `prefix` are cached now in `pool` ("" = the server's
        first) for a sequence stored in `storage` (None = the pool's raw format): a hint,
        nothing is held. Whole blocks only. Retried. NotFound (pool), InvalidArgument."""
        request = svc.LookupPrefixRequest(pool=pool, prefix=_codec.prefix_spec(prefix),
                                          storage=int(parse_storage(storage)))
        return self._call(self._kv.LookupPrefix, request, timeout, retry=True).cached_tokens

    def publish_prefix(self, seq: Any, prefix: Prefix, *,
                       timeout: Optional[float] = None) -> PublishResult:
        """Publishes the sequence's leading whole blocks that every layer has (and that were
        never evicted or moved) as `prefix`: its token_ids are the sequence's from position
        0, those whose keys and values were appended. Publishing again adds nothing: retried.
        NotFound, InvalidArgument, FailedPrecondition (a raw residual window)."""
        request = svc.PublishPrefixRequest(sequence_id=sequence_id(seq),
                                           prefix=_codec.prefix_spec(prefix))
        r = self._call(self._kv.PublishPrefix, request, timeout, retry=True)
        return PublishResult(r.published_tokens, r.new_tokens)

    def lease_sequence(self, seq: Any, layers: Optional[Sequence[int]] = None, *,
                       ttl_ms: int = 0, timeout: Optional[float] = None) -> svc.Lease:
        """Pins what the sequence's `layers` (None = all) store now for `ttl_ms` (0 = the
        server's default) and describes where every (layer, kv head) lane's records are in the
        pool's arenas; nothing described changes until the lease ends (release_lease or the
        TTL). Not retried (a lost reply would pin a second lease until its TTL). NotFound,
        InvalidArgument (layers, ttl_ms), ResourceExhausted (too many live leases)."""
        request = svc.LeaseRequest(sequence_id=sequence_id(seq), layers=list(layers or []),
                                   ttl_ms=ttl_ms)
        return self._call(self._kv.LeaseSequence, request, timeout, retry=False)

    def renew_lease(self, lease: Any, *, ttl_ms: int = 0,
                    timeout: Optional[float] = None) -> int:
        """Extends a live lease to now + ttl_ms (0 = default); returns the new expiry (unix
        ms). Retried. NotFound once it was released or expired: stop reading then."""
        request = svc.RenewLeaseRequest(lease_id=_lease_id(lease), ttl_ms=ttl_ms)
        return self._call(self._kv.RenewLease, request, timeout, retry=True).expires_unix_ms

    def release_lease(self, lease: Any, *, timeout: Optional[float] = None) -> int:
        """Ends a lease; returns the blocks that went back to the pool. Not retried.
        NotFound."""
        request = svc.ReleaseLeaseRequest(lease_id=_lease_id(lease))
        return self._call(self._kv.ReleaseLease, request, timeout, retry=False).freed_blocks

    # -- AdminService -----------------------------------------------------------------------

    def list_pools(self, *, timeout: Optional[float] = None) -> List[types_pb2.PoolInfo]:
        """Every pool with its geometry and usage. Retried."""
        r = self._call(self._admin.ListPools, admin_pb.ListPoolsRequest(), timeout, retry=True)
        return list(r.pools)

    def pool_stats(self, pool: str = "", *,
                   timeout: Optional[float] = None) -> admin_pb.PoolStats:
        """Statistics of one pool ("" = all summed), with its prefix cache's in .prefix_cache
        (unset in a tenant's own view). Retried. NotFound."""
        return self._call(self._admin.GetPoolStats, admin_pb.GetPoolStatsRequest(pool=pool),
                          timeout, retry=True)

    def list_sequences(self, *, pool: str = "", tenant: str = "", limit: int = 0,
                       page_token: str = "",
                       timeout: Optional[float] = None) -> admin_pb.ListSequencesResponse:
        """One page of sequences in creation order (.sequences, .total, .next_page_token:
        pass it as page_token for the next page; empty on the last). Retried."""
        request = admin_pb.ListSequencesRequest(pool=pool, tenant=tenant, limit=limit,
                                                page_token=page_token)
        return self._call(self._admin.ListSequences, request, timeout, retry=True)

    def list_tenants(self, *, timeout: Optional[float] = None) -> List[admin_pb.TenantUsage]:
        """Each tenant's holdings, open calls and quotas. Retried."""
        r = self._call(self._admin.ListTenants, admin_pb.ListTenantsRequest(), timeout,
                       retry=True)
        return list(r.tenants)

    def evict(self, seq: Any, *, tenant: str = "",
              timeout: Optional[float] = None) -> admin_pb.EvictSequenceResponse:
        """Frees a sequence on an operator's behalf (admin). Not retried. NotFound."""
        request = admin_pb.EvictSequenceRequest(sequence_id=sequence_id(seq), tenant=tenant)
        return self._call(self._admin.EvictSequence, request, timeout, retry=False)

    def drain(self, resume: bool = False, *,
              timeout: Optional[float] = None) -> admin_pb.DrainResponse:
        """Stops (resume=True: restarts) accepting new sequences (admin). Idempotent: retried."""
        return self._call(self._admin.Drain, admin_pb.DrainRequest(resume=resume), timeout,
                          retry=True)

    def list_leases(self, *, tenant: str = "", pool: str = "",
                    timeout: Optional[float] = None) -> List[admin_pb.LeaseInfo]:
        """Live leases, oldest first (a tenant sees its own). Never extends one. Retried."""
        request = admin_pb.ListLeasesRequest(tenant=tenant, pool=pool)
        return list(self._call(self._admin.ListLeases, request, timeout, retry=True).leases)

    def end_lease(self, lease: Any, *, tenant: str = "",
                  timeout: Optional[float] = None) -> int:
        """Ends any tenant's lease (admin); returns the blocks that went back to the pool. Not
        retried. NotFound, PermissionDenied."""
        request = admin_pb.EndLeaseRequest(tenant=tenant, lease_id=_lease_id(lease))
        return self._call(self._admin.EndLease, request, timeout, retry=False).freed_blocks


class AppendStream:
    """One AppendStream call. append() queues a message (blocking while 4 are queued);
    leaving the ``with`` block normally finishes the call and sets ``result``; leaving it
    with an exception cancels the call. A message the server rejects ends the stream: the
    next append() or finish() raises that error (its message says how many were applied)."""

    _QUEUE = 4

    def __init__(self, client: Client, timeout: Optional[float]):
        self._queue: "queue.Queue[Optional[bytes]]" = queue.Queue(self._QUEUE)
        self._future = client._append_stream.future(
            self._requests(), timeout=client._timeout(timeout), metadata=client._s.metadata)
        self._closed = False
        self.result: Optional[AppendStreamResult] = None

    def _requests(self) -> Iterator[bytes]:
        while True:
            item = self._queue.get()
            if item is None:
                return
            yield item

    def _put(self, item: Optional[bytes]) -> None:
        while True:
            try:
                self._queue.put(item, timeout=0.05)
                return
            except queue.Full:
                if self._future.done():
                    return  # the call ended; finish() reports why

    def append(self, seq: Any, layer: int, start_position: int, keys: np.ndarray,
               values: np.ndarray, *, dtype: DTypeLike = None) -> None:
        """Queues one Append (same arguments as Client.append)."""
        if self._closed:
            raise FailedPrecondition("the append stream is finished")
        if self._future.done():
            self.finish()  # raises the server's error
            raise Aborted("the server closed the append stream")
        self._put(_codec.encode_append(sequence_id(seq), layer, start_position, keys, values,
                                       dtype))

    def finish(self) -> AppendStreamResult:
        """Ends the stream and returns the totals, or raises the first rejected message's
        error."""
        if self.result is not None:
            return self.result
        if not self._closed:
            self._closed = True
            self._put(None)
        try:
            r = self._future.result()
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None
        except grpc.FutureCancelledError:
            raise Cancelled("the append stream was cancelled by the client") from None
        self.result = AppendStreamResult(r.messages, r.tokens, r.visible_tokens)
        return self.result

    def cancel(self) -> None:
        """Cancels the call; messages the server already applied stay applied."""
        self._closed = True
        self._future.cancel()

    def __enter__(self) -> "AppendStream":
        return self

    def __exit__(self, exc_type: Any, *rest: Any) -> None:
        if exc_type is not None:
            self.cancel()
        else:
            self.finish()


class StagedAppendStream:
    """append_stream() on the server's node: each append() copies keys and values into the
    staging region and sends an Append naming the offsets, with up to 4 in flight, one per
    (sequence, layer) so each layer's order holds (the only order the service needs); copying
    the next chunk overlaps the server writing the last. Same methods as AppendStream. A
    rejected message breaks the stream: finish() raises its error, naming it and how many
    messages were applied (messages of other layers already in flight may have been). Not
    thread-safe."""

    _MAX_IN_FLIGHT = 4

    def __init__(self, client: Client, staging: StagingSpace, timeout: Optional[float]):
        self._client = client
        self._staging = staging
        self._deadline = time.monotonic() + client._timeout(timeout)
        # (key, future, slot offset or None, message index, layer, start_position, tokens)
        self._in_flight: List[Tuple[Tuple[str, int], Any, Optional[int], int, int, int, int]] = []
        self._messages = self._tokens = self._visible = self._written = 0
        self._error: Optional[Tuple[int, KvCacheError, str]] = None
        self._closed = False
        self.result: Optional[AppendStreamResult] = None

    def _settle(self, entry: Tuple[Tuple[str, int], Any, Optional[int], int, int, int,
                                   int]) -> None:
        _, future, offset, index, layer, start, tokens = entry
        try:
            r = future.result()
        except (grpc.RpcError, grpc.FutureCancelledError) as e:
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

    def _settle_all(self) -> None:
        while self._in_flight:
            self._settle(self._in_flight.pop(0))

    def append(self, seq: Any, layer: int, start_position: int, keys: np.ndarray,
               values: np.ndarray, *, dtype: DTypeLike = None) -> None:
        """Sends one Append (same arguments as Client.append)."""
        if self._closed:
            raise FailedPrecondition("the append stream is finished")
        sid = sequence_id(seq)
        key = (sid, layer)
        for entry in [e for e in self._in_flight if e[0] == key]:
            self._in_flight.remove(entry)
            self._settle(entry)
        while len(self._in_flight) >= self._MAX_IN_FLIGHT:
            self._settle(self._in_flight.pop(0))
        if self._error is not None:
            raise Aborted("the append stream broke; finish() says why")
        left = self._deadline - time.monotonic()
        if left <= 0:
            self._error = (self._written, DeadlineExceeded("the append stream's deadline passed"),
                           f"layer {layer}, start_position {start_position}")
            raise Aborted("the append stream broke; finish() says why")
        s = self._staging
        staged = _codec.stage_append(sid, layer, start_position, keys, values, dtype, s.array,
                                     s.region_id, s.acquire)
        if staged is None and isinstance(keys, np.ndarray) and 0 < 2 * keys.nbytes <= s.size:
            self._settle_all()  # the region is busy: wait until it is empty
            staged = _codec.stage_append(sid, layer, start_position, keys, values, dtype,
                                         s.array, s.region_id, s.acquire)
        if staged is None:  # larger than the region: the bytes go in the request
            request: bytes = _codec.encode_append(sid, layer, start_position, keys, values, dtype)
            offset: Optional[int] = None
        else:
            request, offset = staged
        future = self._client._append.future(request, timeout=left,
                                             metadata=self._client._s.metadata)
        tokens = int(keys.shape[0])
        self._in_flight.append((key, future, offset, self._written, layer, start_position, tokens))
        self._written += 1

    def finish(self) -> AppendStreamResult:
        """Waits for every message and returns the totals, or raises the first rejected
        message's error."""
        if self.result is not None:
            return self.result
        self._closed = True
        self._settle_all()
        if self._error is not None:
            index, err, where = self._error
            raise type(err)(f"AppendStream message {index} ({where}) rejected: {err.message}; "
                            f"{self._messages} messages were applied", err.code)
        self.result = AppendStreamResult(self._messages, self._tokens, self._visible)
        return self.result

    def cancel(self) -> None:
        """Cancels the messages in flight; those the server already applied stay applied."""
        self._closed = True
        for entry in self._in_flight:
            entry[1].cancel()
        self._settle_all()

    def __enter__(self) -> "StagedAppendStream":
        return self

    def __exit__(self, exc_type: Any, *rest: Any) -> None:
        if exc_type is None:
            self.finish()
        else:
            self.cancel()


class AttendSession:
    """A bidirectional AttendStream: each attend() sends one request and waits for its
    answer. ``with`` closes it (cancels it if the block raised). Not thread-safe."""

    def __init__(self, client: Client, timeout: Optional[float]):
        self._queue: "queue.Queue[Optional[svc.AttendRequest]]" = queue.Queue()
        self._call = client._kv.AttendStream(self._requests(), timeout=client._timeout(timeout),
                                             metadata=client._s.metadata)
        self._closed = False

    def _requests(self) -> Iterator[svc.AttendRequest]:
        while True:
            item = self._queue.get()
            if item is None:
                return
            yield item

    def attend(self, seq: Any, layer: int, queries: np.ndarray, positions: Sequence[int], *,
               dtype: DTypeLike = None, return_weights: bool = False) -> AttendResult:
        """As Client.attend, on this stream."""
        if self._closed:
            raise FailedPrecondition("the attend session is closed")
        self._queue.put(_codec.attend_request(sequence_id(seq), layer, queries, positions, dtype,
                                              return_weights))
        try:
            r = next(self._call)
        except StopIteration:
            self._closed = True
            raise Aborted("the server closed the attend stream") from None
        except grpc.RpcError as e:
            self._closed = True
            raise from_rpc_error(e) from None
        return _codec.attend_from_proto(r, queries.shape)

    def close(self) -> None:
        """Ends the stream; raises the server's final error, if any."""
        if self._closed:
            return
        self._closed = True
        self._queue.put(None)
        try:
            for _ in self._call:
                pass
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None

    def cancel(self) -> None:
        """Cancels the stream at once."""
        self._closed = True
        self._call.cancel()
        self._queue.put(None)

    def __enter__(self) -> "AttendSession":
        return self

    def __exit__(self, exc_type: Any, *rest: Any) -> None:
        if exc_type is not None:
            self.cancel()
        else:
            self.close()
