"""Every call of Client and AsyncClient, written once, without I/O ("sans-IO").

Each public method of Calls is a generator of I/O operations (kvcache/_ops.py): it builds the
request, yields what it needs done, and returns the call's value. Client (kvcache/client.py)
binds each to a blocking method, AsyncClient (kvcache/aio.py) to a coroutine, with this
signature and docstring (`bind`): arguments, retry rules, the read and append paths and what
each result holds exist once, here. The drivers own only the I/O and the calls that are
streams by nature (fetch_chunks, append_stream, attend_session).

Retries: only idempotent calls (get_sequence, lookup_prefix, publish_prefix, renew_lease and
the admin reads; fetch before its first chunk) are retried, only on UNAVAILABLE, with
exponential backoff: the same rules as the C++ client.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, List, Optional, Sequence, Tuple, Union

import numpy as np

from kvcache import _codec
from kvcache._channel import Settings
from kvcache._channel import lease_id as _lease_id
from kvcache._channel import sequence_id as _id_of  # where a parameter shadows the name
from kvcache._local import (LocalReader, StagingSpace, connect_local, gather, read_dtype,
                            undecodable)
from kvcache._ops import (COPY_OFF_LOOP_BYTES, SERVER_MAY_STILL_READ, FetchStream, Offload,
                          Receive, Rpc, Serialized, Sleep, Step)
from kvcache._paths import PathState, grpc_result
from kvcache._proto.kvcache.v1 import admin_service_pb2 as admin_pb
from kvcache._proto.kvcache.v1 import kvcache_service_pb2 as svc
from kvcache._proto.kvcache.v1 import types_pb2
from kvcache._transfer import TransferReader, target_host
from kvcache._transfer import tls_context as transfer_tls
from kvcache.errors import FailedPrecondition, KvCacheError, Unavailable
from kvcache.types import (AppendResult, AttendResult, CompressionSpec, DType, DTypeLike,
                           FetchResult, LayerQueries, LayerQueryStats, Prefix, PublishResult,
                           ReleaseResult, StorageLike, parse_dtype, parse_storage)

# The calls bind() gives each client, in the order help() lists them.
PUBLIC = ("create_sequence", "fork_sequence", "append", "fetch", "get_sequence", "release",
          "compress", "attend", "lookup_prefix", "publish_prefix", "lease_sequence",
          "renew_lease", "release_lease", "list_pools", "pool_stats", "list_sequences",
          "list_tenants", "evict", "drain", "list_leases", "end_lease")


def bind(wrap: Callable[[Callable[..., Step[Any]]], Callable[..., Any]],
         source: Optional[type] = None,
         names: Sequence[str] = PUBLIC) -> Callable[[type], type]:
    """A class decorator giving a driver's class the calls `names` of `source` (Calls by
    default), each wrapped by `wrap` (which runs the generator on the driver, over the
    instance's `_core`) under the call's name, signature and docstring."""

    def decorate(cls: type) -> type:
        for name in names:
            call = getattr(source or Calls, name)
            method = functools.wraps(call)(wrap(call))
            # The client returns what the generator returns: "Step[X]" -> "X".
            returns = str(call.__annotations__["return"])
            assert returns.startswith("Step[") and returns.endswith("]"), name
            method.__annotations__ = {**call.__annotations__, "return": returns[5:-1]}
            method.__signature__ = inspect.signature(call).replace(  # type: ignore[attr-defined]
                return_annotation=returns[5:-1])
            setattr(cls, name, method)
        return cls

    return decorate


class Calls:
    """The calls of one client: its settings and its read and append path decision."""

    def __init__(self, settings: Settings, target: str, *, local_reads: bool, transfers: bool,
                 client_decode: bool, staging_bytes: int):
        self.s = settings
        self.target = target
        self.client_decode = client_decode
        self.paths = PathState(self, local_reads, transfers, staging_bytes)

    def timeout(self, timeout: Optional[float]) -> float:
        return self.s.timeout if timeout is None else timeout

    def unary(self, method: str, request: Any, timeout: Optional[float],
              retry: bool) -> Step[Any]:
        attempts = self.s.max_attempts if retry else 1
        backoff = self.s.initial_backoff
        for attempt in range(attempts):
            try:
                return (yield Rpc(method, request, self.timeout(timeout)))
            except Unavailable:
                if attempt + 1 == attempts:
                    raise
            yield Sleep(backoff)
            backoff = min(backoff * 2, self.s.max_backoff)
        raise AssertionError("unreachable")

    # -- the path decision's I/O (kvcache/_paths.py PathIo) ---------------------------------

    def server_info(self, timeout: Optional[float]) -> Step[Any]:
        return (yield from self.unary("GetServerInfo", admin_pb.GetServerInfoRequest(), timeout,
                                      retry=True))

    def connect_local(self, info: Any) -> Step[Any]:
        return (yield Offload(connect_local, (info, self.paths.local_reads, self.s.token)))

    def open_staging(self, local: LocalReader, nbytes: int) -> Step[StagingSpace]:
        return (yield Offload(local.open_staging, (nbytes,)))

    def open_transfer(self, timeout: Optional[float]) -> Step[TransferReader]:
        opened = yield from self.unary("OpenTransfer", svc.OpenTransferRequest(), timeout,
                                       retry=False)
        host = opened.host or target_host(self.target)
        try:
            if not host:
                raise FailedPrecondition("the target names no host to connect to (a unix "
                                         "socket?)")
            tls, server_name = transfer_tls(self.s, opened)
            return (yield Offload(TransferReader, (host, opened.port, opened.transfer_id,
                                                   opened.token, opened.frame_key, tls,
                                                   server_name)))
        except KvCacheError:
            try:  # best effort: the server drops an unconnected channel after a while
                yield from self.unary("CloseTransfer",
                                      svc.CloseTransferRequest(transfer_id=opened.transfer_id),
                                      timeout, retry=False)
            except KvCacheError:
                pass
            raise

    def staging(self, timeout: Optional[float]) -> Step[Optional[StagingSpace]]:
        """The staging region appends copy into, or None (gRPC)."""
        return (yield Serialized(self.paths.staged(timeout)))

    def _read_path(self, timeout: Optional[float]) -> Step[Tuple[Optional[LocalReader],
                                                                 Optional[TransferReader]]]:
        local = yield from self.paths.read(timeout)
        return local, self.paths.transfer

    def _leased(self, seq: Any, layers: Optional[Sequence[int]], timeout: Optional[float],
                read: Callable[[svc.Lease], Step[Union[FetchResult, str]]]
                ) -> Step[Union[FetchResult, str]]:
        """read(lease) under a lease of the sequence's layers, released afterwards."""
        lease = yield from self.lease_sequence(seq, layers, timeout=timeout)
        try:
            return (yield from read(lease))
        finally:
            try:  # best effort: the TTL ends it otherwise
                yield from self.release_lease(lease, timeout=timeout)
            except KvCacheError:
                pass

    def _received(self, transfer: TransferReader, wanted: Optional[DType],
                  include_unfinished: bool, timeout: Optional[float],
                  lease: svc.Lease) -> Step[Union[FetchResult, str]]:
        """The leased blocks over the transfer channel; a reason (then gRPC) when a record
        needs decoding and client_decode is off, or the channel broke (the next fetch decides
        the path again)."""
        dt = read_dtype(lease, wanted, self.client_decode)
        if dt is None:
            return undecodable(lease, wanted)

        def request(nonce: int) -> svc.SendLeaseRequest:
            return svc.SendLeaseRequest(transfer_id=transfer.id, lease_id=lease.lease_id,
                                        nonce=nonce)

        def assemble(renumbered: svc.Lease, arenas: Any) -> Any:
            return gather(renumbered, dt, include_unfinished, arenas.__getitem__)

        try:
            heads = yield Receive(transfer, lease, request, self.timeout(timeout), assemble)
        except KvCacheError as e:
            if transfer.alive():
                raise  # refused by the server (NotFound, ...): the channel is fine
            return f"the transfer channel broke: {e.code.name}: {e.message}"
        # As the gRPC path, whose dtype comes with the chunks: POOL when there were none.
        return FetchResult(visible_tokens=lease.visible_tokens,
                           dtype=dt if heads else DType.POOL, heads=heads,
                           path=f"transfer ({transfer.where})")

    def _mapped(self, local: LocalReader, wanted: Optional[DType], include_unfinished: bool,
                lease: svc.Lease) -> Step[Union[FetchResult, str]]:
        """The leased records copied out of the mapped pool; a reason when they cannot be."""
        return (yield Offload(local.read, (lease, wanted, include_unfinished,
                                           self.client_decode)))

    # -- KvCacheService ---------------------------------------------------------------------

    def create_sequence(self, *, pool: str = "", tenant: str = "", sequence_id: str = "",
                        policy: Optional[CompressionSpec] = None,
                        prefix: Optional[Prefix] = None,
                        timeout: Optional[float] = None) -> Step[types_pb2.SequenceInfo]:
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
        return (yield from self.unary("CreateSequence", request, timeout, retry=False))

    def fork_sequence(self, seq: Any, *, sequence_id: str = "",
                      timeout: Optional[float] = None) -> Step[types_pb2.SequenceInfo]:
        """A new sequence starting with everything `seq` stores now (every layer, compressed
        or not): whole blocks are shared, and a later change to either sequence copies a
        shared block first, so the other never sees it. `sequence_id` names the fork
        (optional). Not retried (a retry after a lost reply would fork twice). NotFound,
        AlreadyExists, InvalidArgument, ResourceExhausted (pool or quota)."""
        request = svc.ForkSequenceRequest(sequence_id=_id_of(seq),
                                          client_sequence_id=sequence_id)
        return (yield from self.unary("ForkSequence", request, timeout, retry=False))

    def append(self, seq: Any, layer: int, start_position: int, keys: np.ndarray,
               values: np.ndarray, *, dtype: DTypeLike = None,
               timeout: Optional[float] = None) -> Step[AppendResult]:
        """Appends one layer's keys and values, [n, kv_heads, head_dim] float16/float32 (or
        bf16 bits as uint16 with dtype='bf16'), at start_position = the tokens the layer
        already has. All-or-nothing; not retried. The arrays are copied once, into the
        message (plus once more if not C-contiguous). InvalidArgument (shape, dtype, layer),
        FailedPrecondition (out of order), ResourceExhausted, NotFound. On the server's node
        (``append_path``) the arrays are copied into the staging region instead."""
        sid = _id_of(seq)
        staging = (yield from self.staging(timeout)) if isinstance(keys, np.ndarray) else None
        staged = None
        if staging is not None:
            staged = yield Offload(_codec.stage_append,
                                   (sid, layer, start_position, keys, values, dtype,
                                    staging.array, staging.region_id, staging.acquire),
                                   large=keys.nbytes + values.nbytes >= COPY_OFF_LOOP_BYTES)
        if staged is None:
            request = _codec.encode_append(sid, layer, start_position, keys, values, dtype)
            r = yield from self.unary("Append", request, timeout, retry=False)
            return AppendResult(r.layer_tokens, r.visible_tokens)
        assert staging is not None
        request, offset = staged
        try:
            r = yield from self.unary("Append", request, timeout, retry=False)
        except KvCacheError as e:
            # The server might still be reading a slot whose call ended without its answer:
            # such a slot is never reused (nor is one of a cancelled task).
            if not isinstance(e, SERVER_MAY_STILL_READ):
                staging.release(offset)
            raise
        staging.release(offset)
        return AppendResult(r.layer_tokens, r.visible_tokens)

    def fetch(self, seq: Any, layers: Optional[Sequence[int]] = None, dtype: DTypeLike = None,
              *, include_unfinished: bool = False, tenant: str = "",
              timeout: Optional[float] = None) -> Step[FetchResult]:
        """Fetches the visible tokens, dense in `dtype` (None = pool's), assembled per
        (layer, kv head): result[(layer, head)].keys / .values [n, head_dim], .positions.
        On the same node (``data_path``) the records are copied from the mapped pool under a
        lease, elsewhere received over the server's transfer channel when it offers one;
        records stored in a low-bit format come over gRPC decoded by the server, or with
        client_decode are decoded here (kvcache/_decode.py) exactly as the server would: the
        result is the same on every path; its ``path`` says which one it took and why."""
        why = "another tenant's sequence" if tenant else ""
        if not tenant:
            local, transfer = yield Serialized(self._read_path(timeout))
            wanted = None if dtype is None else parse_dtype(dtype)
            read = (functools.partial(self._received, transfer, wanted, include_unfinished,
                                      timeout) if transfer is not None else
                    functools.partial(self._mapped, local, wanted, include_unfinished)
                    if local is not None else None)
            if read is not None:
                result = yield from self._leased(seq, layers, timeout, read)
                if isinstance(result, FetchResult):
                    return result
                why = result
        request = _codec.fetch_request(_id_of(seq), layers, dtype, False, include_unfinished,
                                       0, tenant)
        result = yield FetchStream(request, self.timeout(timeout))
        return grpc_result(result, why, self.paths.data_path)

    def get_sequence(self, seq: Any, *, tenant: str = "",
                     timeout: Optional[float] = None) -> Step[types_pb2.SequenceInfo]:
        """The sequence's lengths, stored tokens and bytes. Retried. NotFound."""
        request = svc.GetSequenceRequest(sequence_id=_id_of(seq), tenant=tenant)
        return (yield from self.unary("GetSequence", request, timeout, retry=True))

    def release(self, seq: Any, *, timeout: Optional[float] = None) -> Step[ReleaseResult]:
        """Frees every block of the sequence. Not retried. NotFound."""
        r = yield from self.unary("Release", svc.ReleaseRequest(sequence_id=_id_of(seq)),
                                  timeout, retry=False)
        return ReleaseResult(r.freed_blocks, r.freed_bytes)

    def compress(self, seq: Any, spec: CompressionSpec,
                 queries: Optional[Sequence[LayerQueries]] = None, *,
                 query_stats: Optional[Sequence[LayerQueryStats]] = None,
                 timeout: Optional[float] = None) -> Step[svc.CompressResponse]:
        """Evicts and/or converts what the sequence stores. SnapKV needs the last `window`
        queries of every layer; H2O may take every prompt query; ExpectedAttention needs
        `query_stats` of every layer. All-or-nothing; not retried.
        InvalidArgument (spec, queries), FailedPrecondition (H2O without scores), ..."""
        request = svc.CompressRequest(sequence_id=_id_of(seq), spec=spec.to_proto(),
                                      queries=_codec.compress_queries(queries),
                                      query_stats=_codec.compress_query_stats(query_stats))
        return (yield from self.unary("Compress", request, timeout, retry=False))

    def attend(self, seq: Any, layer: int, queries: np.ndarray, positions: Sequence[int], *,
               dtype: DTypeLike = None, return_weights: bool = False,
               timeout: Optional[float] = None) -> Step[AttendResult]:
        """Decode attention of one layer's queries [n, num_query_heads, head_dim] over the
        stored tokens. Not retried (it accumulates H2O scores). FailedPrecondition if a
        position is before the layer's last token."""
        request = _codec.attend_request(_id_of(seq), layer, queries, positions, dtype,
                                        return_weights)
        r = yield from self.unary("Attend", request, timeout, retry=False)
        return _codec.attend_from_proto(r, queries.shape)

    def lookup_prefix(self, prefix: Prefix, pool: str = "", storage: StorageLike = None, *,
                      timeout: Optional[float] = None) -> Step[int]:
        """How many leading tokens of `prefix` are cached now in `pool` ("" = the server's
        first) for a sequence stored in `storage` (None = the pool's raw format): a hint,
        nothing is held. Whole blocks only. Retried. NotFound (pool), InvalidArgument."""
        request = svc.LookupPrefixRequest(pool=pool, prefix=_codec.prefix_spec(prefix),
                                          storage=int(parse_storage(storage)))
        r = yield from self.unary("LookupPrefix", request, timeout, retry=True)
        return r.cached_tokens

    def publish_prefix(self, seq: Any, prefix: Prefix, *,
                       timeout: Optional[float] = None) -> Step[PublishResult]:
        """Publishes the sequence's leading whole blocks that every layer has (and that were
        never evicted or moved) as `prefix`: its token_ids are the sequence's from position
        0, those whose keys and values were appended. Publishing again adds nothing: retried.
        NotFound, InvalidArgument, FailedPrecondition (a raw residual window)."""
        request = svc.PublishPrefixRequest(sequence_id=_id_of(seq),
                                           prefix=_codec.prefix_spec(prefix))
        r = yield from self.unary("PublishPrefix", request, timeout, retry=True)
        return PublishResult(r.published_tokens, r.new_tokens)

    def lease_sequence(self, seq: Any, layers: Optional[Sequence[int]] = None, *,
                       ttl_ms: int = 0, timeout: Optional[float] = None) -> Step[svc.Lease]:
        """Pins what the sequence's `layers` (None = all) store now for `ttl_ms` (0 = the
        server's default) and describes where every (layer, kv head) lane's records are in the
        pool's arenas; nothing described changes until the lease ends (release_lease or the
        TTL). Not retried (a lost reply would pin a second lease until its TTL). NotFound,
        InvalidArgument (layers, ttl_ms), ResourceExhausted (too many live leases)."""
        request = svc.LeaseRequest(sequence_id=_id_of(seq), layers=list(layers or []),
                                   ttl_ms=ttl_ms)
        return (yield from self.unary("LeaseSequence", request, timeout, retry=False))

    def renew_lease(self, lease: Any, *, ttl_ms: int = 0,
                    timeout: Optional[float] = None) -> Step[int]:
        """Extends a live lease to now + ttl_ms (0 = default); returns the new expiry (unix
        ms). Retried. NotFound once it was released or expired: stop reading then."""
        request = svc.RenewLeaseRequest(lease_id=_lease_id(lease), ttl_ms=ttl_ms)
        r = yield from self.unary("RenewLease", request, timeout, retry=True)
        return r.expires_unix_ms

    def release_lease(self, lease: Any, *, timeout: Optional[float] = None) -> Step[int]:
        """Ends a lease; returns the blocks that went back to the pool. Not retried.
        NotFound."""
        request = svc.ReleaseLeaseRequest(lease_id=_lease_id(lease))
        r = yield from self.unary("ReleaseLease", request, timeout, retry=False)
        return r.freed_blocks

    # -- AdminService -----------------------------------------------------------------------

    def list_pools(self, *, timeout: Optional[float] = None) -> Step[List[types_pb2.PoolInfo]]:
        """Every pool with its geometry and usage. Retried."""
        r = yield from self.unary("ListPools", admin_pb.ListPoolsRequest(), timeout, retry=True)
        return list(r.pools)

    def pool_stats(self, pool: str = "", *,
                   timeout: Optional[float] = None) -> Step[admin_pb.PoolStats]:
        """Statistics of one pool ("" = all summed), with its prefix cache's in .prefix_cache
        (unset in a tenant's own view). Retried. NotFound."""
        return (yield from self.unary("GetPoolStats", admin_pb.GetPoolStatsRequest(pool=pool),
                                      timeout, retry=True))

    def list_sequences(self, *, pool: str = "", tenant: str = "", limit: int = 0,
                       page_token: str = "", timeout: Optional[float] = None
                       ) -> Step[admin_pb.ListSequencesResponse]:
        """One page of sequences in creation order (.sequences, .total, .next_page_token:
        pass it as page_token for the next page; empty on the last). Retried."""
        request = admin_pb.ListSequencesRequest(pool=pool, tenant=tenant, limit=limit,
                                                page_token=page_token)
        return (yield from self.unary("ListSequences", request, timeout, retry=True))

    def list_tenants(self, *,
                     timeout: Optional[float] = None) -> Step[List[admin_pb.TenantUsage]]:
        """Each tenant's holdings, open calls and quotas. Retried."""
        r = yield from self.unary("ListTenants", admin_pb.ListTenantsRequest(), timeout,
                                  retry=True)
        return list(r.tenants)

    def evict(self, seq: Any, *, tenant: str = "",
              timeout: Optional[float] = None) -> Step[admin_pb.EvictSequenceResponse]:
        """Frees a sequence on an operator's behalf (admin). Not retried. NotFound."""
        request = admin_pb.EvictSequenceRequest(sequence_id=_id_of(seq), tenant=tenant)
        return (yield from self.unary("EvictSequence", request, timeout, retry=False))

    def drain(self, resume: bool = False, *,
              timeout: Optional[float] = None) -> Step[admin_pb.DrainResponse]:
        """Stops (resume=True: restarts) accepting new sequences (admin). Idempotent: retried."""
        return (yield from self.unary("Drain", admin_pb.DrainRequest(resume=resume), timeout,
                                      retry=True))

    def list_leases(self, *, tenant: str = "", pool: str = "",
                    timeout: Optional[float] = None) -> Step[List[admin_pb.LeaseInfo]]:
        """Live leases, oldest first (a tenant sees its own). Never extends one. Retried."""
        request = admin_pb.ListLeasesRequest(tenant=tenant, pool=pool)
        r = yield from self.unary("ListLeases", request, timeout, retry=True)
        return list(r.leases)

    def end_lease(self, lease: Any, *, tenant: str = "",
                  timeout: Optional[float] = None) -> Step[int]:
        """Ends any tenant's lease (admin); returns the blocks that went back to the pool. Not
        retried. NotFound, PermissionDenied."""
        request = admin_pb.EndLeaseRequest(tenant=tenant, lease_id=_lease_id(lease))
        r = yield from self.unary("EndLease", request, timeout, retry=False)
        return r.freed_blocks
