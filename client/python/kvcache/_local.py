"""Same-node reads for the Python client: the protocol of kvcached's local socket
(cachesvc/transport/local_socket.h) and reads of a Lease's records from the mapped host arenas, as
the C++ client's LocalReader (client/src/local_reader.h) does.

The reader connects to the socket the server names in GetServerInfo, checks that the
greeting carries the server's token (the same server, not another one at that path) and
authenticates with the client's bearer token (the connection then acts for that tenant). It
reserves address space for each arena it reads and maps into it, read-only and at their
places, the segments a lease names (their memfds come over the socket, SCM_RIGHTS, only for
segments holding the tenant's own blocks), again whenever a lease names a newer epoch. A
read copies each lane's records out of the mapping with NumPy (one gather per segment). Records stored in
another format than the requested dtype's raw one (INT4, FP8, NVFP4, ... or f16 asked as
f32) are decoded as the server would (kvcache/_decode.py) when the client's client_decode
is on; otherwise read() returns None and the caller fetches over gRPC (the server's C++
decode is faster than NumPy's).

The same connection opens staging regions for appends (open_staging, StagingSpace): the
server's memfd mapped writable here, which Client.append and append_stream copy keys and values
into before sending an Append that names the offsets (cachesvc/transport/staging_regions.h).
"""

from __future__ import annotations

import ctypes
import mmap
import os
import select
import socket
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

import numpy as np

from kvcache._proto.kvcache.v1 import kvcache_service_pb2 as svc
from kvcache._proto.kvcache.v1 import types_pb2
from kvcache.errors import (Aborted, DeadlineExceeded, FailedPrecondition, Internal,
                            KvCacheError, Unavailable)
from kvcache._decode import DECODABLE, RAW_FORMAT, decode, output_dtype
from kvcache.types import DType, FetchedHead, FetchResult, lease_positions

_MAX_LINE = 512
_MAP_FIXED = 0x10  # <sys/mman.h>; the mmap module does not export it

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long]


class _Arena:
    """One (pool, format) arena as this process maps it: a reservation of its whole size
    (inaccessible, so a read outside a mapped segment faults instead of showing bytes) with
    segments mapped in place at i * segment_bytes."""

    def __init__(self, size: int, segment_bytes: int):
        self.segment_bytes = segment_bytes
        self._map = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS |
                              getattr(mmap, "MAP_NORESERVE", 0), prot=0)  # PROT_NONE
        self.array = np.frombuffer(self._map, dtype=np.uint8)
        self.epochs = [0] * (size // segment_bytes)  # per segment: the epoch mapped, 0 = none

    def map_segment(self, index: int, fd: int) -> None:
        at = self.array.ctypes.data + index * self.segment_bytes
        if _libc.mmap(at, self.segment_bytes, mmap.PROT_READ, mmap.MAP_SHARED | _MAP_FIXED,
                      fd, 0) != at:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))


def server_info_failed(error: KvCacheError) -> Tuple[bool, str]:
    """When GetServerInfo failed: whether the path is decided (asked again on the next fetch
    only when the server could not be reached) and what data_path says."""
    decided = not isinstance(error, (Unavailable, DeadlineExceeded))
    return decided, f"grpc (GetServerInfo failed: {error})"


def connect_local(info: Any, local_reads: bool = True,
                  bearer_token: Optional[str] = None) -> Tuple[Optional["LocalReader"], str]:
    """The reader of the local socket GetServerInfo's reply names (None when there is none,
    it refuses or local_reads is off), and what data_path says. Blocking: the asyncio client
    runs it in an executor."""
    if not local_reads:
        return None, "grpc (local_reads is off)"
    if not info.local_socket:
        return None, "grpc (the server has no local_socket)"
    try:
        return LocalReader(info.local_socket, info.local_token, bearer_token), \
            f"shared-memory ({info.local_socket})"
    except KvCacheError as e:
        return None, f"grpc ({e.message})"


def read_dtype(lease: svc.Lease, dtype: Optional[DType], decode: bool) -> Optional[DType]:
    """The dtype a read of `lease` returns (`dtype`, or the pool's); None when a segment
    would need decoding and `decode` is off (or its format is unknown here): fetch over gRPC
    then, decoded by the server."""
    dt = output_dtype(lease.dtype, dtype)
    if dt is None:
        return None
    allowed = DECODABLE if decode else {RAW_FORMAT[dt]}
    if any(s.format not in allowed for lane in lease.lanes for s in lane.segments):
        return None
    return dt


def undecodable(lease: svc.Lease, dtype: Optional[DType]) -> str:
    """Why read_dtype() said None, for FetchResult.path."""
    dt = output_dtype(lease.dtype, dtype)
    if dt is None:
        return "the requested dtype is decoded by the server"
    formats = sorted({types_pb2.StorageFormat.Name(s.format) for lane in lease.lanes
                      for s in lane.segments if s.format != RAW_FORMAT[dt]})
    return (f"{', '.join(formats)} records are decoded by the server (client_decode is off)"
            if formats else "records are decoded by the server")


def gather(lease: svc.Lease, dt: DType, include_unfinished: bool,
           arena_of: Callable[[int], np.ndarray]) -> Dict[Tuple[int, int], FetchedHead]:
    """Each lane's tokens below its layer's limit (visible tokens, or the layer's appended
    ones with include_unfinished), copied out of the arenas `arena_of(storage format)` gives
    (uint8, block b of the format at b * block_bytes): one gather per segment, then the
    records decoded into `dt` where they are stored in another format (_decode.decode)."""
    layouts = {a.format: a for a in lease.arenas}
    bt = lease.block_tokens
    heads: Dict[Tuple[int, int], FetchedHead] = {}
    layer_limit = {layer: (lease.layer_tokens[i] if include_unfinished
                           else lease.visible_tokens)
                   for i, layer in enumerate(lease.layers)}
    for lane in lease.lanes:
        limit = layer_limit[lane.layer]
        keys, values, positions = [], [], []
        for seg in lane.segments:
            pos = lease_positions(seg)
            if len(pos) == 0:
                continue
            layout = layouts.get(seg.format)
            if layout is None:
                raise Internal("the lease names no arena for a segment")
            arena = arena_of(seg.format)
            blocks = np.asarray(seg.blocks, dtype=np.int64)
            total = arena.size // layout.block_bytes
            if blocks.size and (blocks.min() < 0 or blocks.max() >= total):
                raise Internal(f"a lease block is outside the {arena.size}-byte arena")
            per_block = arena[:total * layout.block_bytes].reshape(total, layout.block_bytes)
            rb = layout.record_bytes
            keep = pos < limit
            for offset, out in ((layout.key_offset, keys), (layout.value_offset, values)):
                # One gather: each block's records of this lane, then the stored tokens.
                rows = per_block[blocks, offset:offset + bt * rb].reshape(-1, rb)[:len(pos)]
                out.append(decode(seg.format, lease.head_dim, rows if keep.all() else rows[keep],
                                  dt))
            positions.append(pos[keep])
        n = sum(len(p) for p in positions)
        if n == 0:
            continue  # as gRPC: a lane with no tokens sends no chunk
        k = keys[0] if len(keys) == 1 else np.concatenate(keys)
        v = values[0] if len(values) == 1 else np.concatenate(values)
        p = positions[0] if len(positions) == 1 else np.concatenate(positions)
        heads[(lane.layer, lane.kv_head)] = FetchedHead(k, v, p)
    return heads

class StagingSpace:
    """A staging region mapped writable, and which of its bytes appends in flight use (first
    fit). Thread-safe."""

    def __init__(self, region_id: str, m: mmap.mmap):
        self.region_id = region_id
        self.size = len(m)
        self._map = m
        self.array = np.frombuffer(m, dtype=np.uint8)
        self._lock = threading.Lock()
        self._used: Dict[int, int] = {}  # offset -> bytes, disjoint

    def acquire(self, nbytes: int) -> Optional[int]:
        """The offset of `nbytes` free bytes (64-aligned), now in use; None when no free run
        is that long."""
        want = (nbytes + 63) // 64 * 64
        if want <= 0 or want > self.size:
            return None
        with self._lock:
            at = 0
            for offset in sorted(self._used):
                if offset - at >= want:
                    break
                at = offset + self._used[offset]
            if self.size - at < want:
                return None
            self._used[at] = want
            return at

    def release(self, offset: int) -> None:
        with self._lock:
            self._used.pop(offset, None)


class LocalReader:
    """A connection to kvcached's local socket and the arenas mapped through it.
    Thread-safe."""

    def __init__(self, path: str, token: str, bearer_token: Optional[str] = None):
        """FailedPrecondition when the socket refuses this uid or `bearer_token` (None: no
        credential), or greets with another token than `token`; Unavailable when nothing
        listens at `path`."""
        self.path = path
        self.token = token
        self._stale = False  # a lease of another server came by
        self._lock = threading.Lock()
        self._maps: Dict[Tuple[str, int], _Arena] = {}
        self._sock: Optional[socket.socket] = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._sock.settimeout(10)
            self._sock.connect(path)
            greeting, fds = self._read_line()
        except OSError as e:
            self._sock.close()
            raise Unavailable(f"local socket {path}: {e.strerror or e}") from None
        for fd in fds:
            os.close(fd)
        if greeting != f"KVC-LOCAL 2 {token}":
            self._sock.close()
            if greeting.startswith("ERR "):
                raise FailedPrecondition(f"{path} refused: {greeting[4:]}")
            raise FailedPrecondition(f"{path} is another server's (its greeting carries "
                                     "another token)")
        # The same credential as the gRPC calls: it decides whose segments this maps.
        with self._lock:
            reply, fds = self._ask(f"AUTH {bearer_token or '-'}\n")
        for fd in fds:
            os.close(fd)
        if reply != "OK":
            self.close()
            raise FailedPrecondition(f"{path} refused this client's credential: "
                                     f"{reply[4:204] if reply.startswith('ERR ') else reply[:200]}")

    def alive(self) -> bool:
        """False once the server's end closed (it exited or restarted: the mappings are of a
        dead server's memory) or a lease of another server came by; the client then decides
        its same-node path again. Never blocks."""
        with self._lock:
            if self._sock is None or self._stale:
                return False
            # poll, not recv(MSG_DONTWAIT): a socket with a timeout waits for data first.
            p = select.poll()
            p.register(self._sock, select.POLLIN)
            # Nothing to read: alive (the server never writes unasked); readable means end of
            # file or bytes nobody asked for, a hang-up or error the same.
            return not p.poll(0)

    def close(self) -> None:
        with self._lock:
            if self._sock is not None:
                self._sock.close()
                self._sock = None
            self._maps.clear()  # each mmap closes when no array views it any more

    def _read_line(self) -> Tuple[str, List[int]]:
        assert self._sock is not None
        line = b""
        fds: List[int] = []
        while not line.endswith(b"\n"):
            data, got, _, _ = socket.recv_fds(self._sock, 1, 1)
            fds.extend(got)
            if not data:
                for fd in fds:
                    os.close(fd)
                raise OSError("the server closed the local socket")
            line += data
            if len(line) > _MAX_LINE:
                raise OSError("a reply line is too long")
        return line[:-1].decode("utf-8", "replace"), fds

    def _ask(self, request: str) -> Tuple[str, List[int]]:
        """Sends one request line and reads the reply and the fds sent with it (call with
        _lock held). A broken connection is closed for good: Unavailable."""
        if self._sock is None:
            raise Unavailable("the local socket broke earlier")
        try:
            self._sock.sendall(request.encode())
            return self._read_line()
        except OSError as e:
            self._sock.close()
            self._sock = None
            raise Unavailable(f"local socket: {e}") from None

    def open_staging(self, nbytes: int) -> StagingSpace:
        """A staging region of `nbytes` made by the server, mapped writable here; it stays
        open while this connection does. FailedPrecondition with the server's reason when it
        refuses."""
        with self._lock:
            reply, fds = self._ask(f"STAGE {nbytes}\n")
        words = reply.split(" ")
        if len(words) != 3 or words[0] != "OK" or len(fds) != 1 or words[2] != str(nbytes):
            for fd in fds:
                os.close(fd)
            raise FailedPrecondition(f"no staging region: {reply[:200]}")
        try:
            m = mmap.mmap(fds[0], nbytes, flags=mmap.MAP_SHARED,
                          prot=mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fds[0])  # the mapping keeps the memory
        return StagingSpace(words[1], m)

    def _arena(self, pool: str, storage: int, leased: Any) -> np.ndarray:
        """The arena of (pool, storage format) as uint8 with every segment `leased` (a
        LeaseArena) names mapped at its epoch; address space reserved on first use."""
        with self._lock:
            key = (pool, storage)
            arena = self._maps.get(key)
            if arena is None:
                reply, fds = self._ask(f"ARENA {pool} {storage}\n")
                for fd in fds:
                    os.close(fd)
                words = reply.split(" ")
                if (len(words) != 4 or words[0] != "OK" or words[2] != "SEGMENTS"
                        or not words[1].isdigit() or not words[3].isdigit()
                        or int(words[3]) <= 0 or int(words[1]) % int(words[3]) != 0):
                    raise FailedPrecondition(f"pool '{pool}' cannot be mapped: {reply[:200]}")
                arena = _Arena(int(words[1]), int(words[3]))
                self._maps[key] = arena
            for seg in leased.segments:
                if not 0 <= seg.index < len(arena.epochs):
                    raise Internal(f"the lease names segment {seg.index} outside the arena")
                if arena.epochs[seg.index] == seg.epoch:
                    continue
                reply, fds = self._ask(f"SEGMENT {pool} {storage} {seg.index} {seg.epoch}\n")
                if reply != f"OK {arena.segment_bytes}" or len(fds) != 1:
                    for fd in fds:
                        os.close(fd)
                    raise FailedPrecondition(
                        f"segment {seg.index} of pool '{pool}' cannot be mapped: {reply[:200]}")
                try:
                    arena.epochs[seg.index] = 0
                    arena.map_segment(seg.index, fds[0])
                except OSError as e:
                    raise Unavailable(f"cannot map a segment of pool '{pool}': {e}") from None
                finally:
                    os.close(fds[0])  # the mapping keeps the memory
                arena.epochs[seg.index] = seg.epoch
            return arena.array

    def read(self, lease: svc.Lease, dtype: Optional[DType], include_unfinished: bool,
             decode: bool = False) -> Union[FetchResult, str]:
        """The lease's tokens below each layer's limit (visible tokens, or the layer's
        appended ones with include_unfinished) as a dense FetchResult equal to a gRPC fetch
        of the same layers (with `decode`, records in other formats decoded as the server
        would); or why not (a segment needs decoding and `decode` is off, a device pool,
        the lease is another server's, it cannot be mapped): fetch over gRPC then.
        Aborted when the lease could have ended before the read finished."""
        if lease.local_token != self.token:
            # Another server's lease (this one restarted): its block ids mean nothing in
            # these mappings. Over gRPC, and connect again next time.
            self._stale = True
            return "the lease is another server's (it restarted)"
        if lease.device != "cpu":
            return f"pool '{lease.pool}' is device memory"
        dt = read_dtype(lease, dtype, decode)
        if dt is None:
            return undecodable(lease, dtype)
        try:
            arenas = {a.format: self._arena(lease.pool, a.format, a) for a in lease.arenas}
        except KvCacheError as e:
            # Nothing was read yet: over gRPC (which says why if it refuses too, e.g. a
            # revoked credential), and decide the path again next time.
            self._stale = True
            return f"the lease cannot be mapped: {e.message}"
        heads = gather(lease, dt, include_unfinished, arenas.__getitem__)
        # A block of an expired lease may have been handed to another sequence meanwhile.
        if time.time() * 1000 >= lease.expires_unix_ms:
            raise Aborted("the lease expired while it was read; fetch again")
        # As the gRPC path, whose dtype comes with the chunks: POOL when there were none.
        return FetchResult(visible_tokens=lease.visible_tokens,
                           dtype=dt if heads else DType.POOL, heads=heads,
                           path=f"shared-memory ({self.path})")
