"""Transfer channels for the Python client: the wire of KvCacheService.OpenTransfer /
SendLease (transfer/wire.h, docs/ARCHITECTURE.md "Transfers"), as the C++ client's
TransferReader (client/src/transfer_reader.h) speaks it.

A client that cannot map the server's pools (another node, another uid) opens a channel over
gRPC, connects to the TCP port the reply names (through TLS when the reply says so, verifying
the listener's certificate as gRPC's is verified) and presents the channel's token. Every
frame ends with a 16-byte tag, the Poly1305 tag of ChaCha20-Poly1305 under the channel's
frame_key (nonce: the frame's number on the channel; associated data: the payload;
plaintext: the header; transfer/frame_mac.h): a frame whose tag differs is refused
(DataLoss) and nothing of it is used. A fetch then
leases the layers, asks SendLease to write the lease's blocks into the channel while this
side reads them, ends the lease (the payload is this process's copy) and gathers each lane's
records out of the payload with the same code as the same-node path (_local.gather): the
blocks of each storage format arrive in lane order, so each segment's blocks are renumbered to
their place in the payload; records in another format than the requested dtype's raw one are
decoded as the server would (kvcache/_decode.py).
"""

from __future__ import annotations

import concurrent.futures
import hmac
import secrets
import select
import socket
import ssl
import struct
import threading
import time
from typing import Any, Callable, Dict, Optional, Tuple, TypeVar

import grpc
import numpy as np
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

from kvcache._proto.kvcache.v1 import kvcache_service_pb2 as svc
from kvcache.errors import (DataLoss, DeadlineExceeded, FailedPrecondition, Internal,
                            KvCacheError, Unavailable, from_rpc_error)

# "KVCXFER1", nonce (u64), payload bytes (u64), a gRPC status code (u32), 4 zero bytes.
_HEADER = struct.Struct("<8sQQII")
_MAGIC = b"KVCXFER1"
_MAX_REPLY = 256
_WIRE_VERSION = 2  # transfer/wire.h kWireVersion: frames end with their MAC
_MAC_BYTES = 16  # transfer/frame_mac.h kMacBytes
# A payload buffer up to this size is kept for the next fetch (a fresh one costs its page
# faults on every fetch); larger ones are dropped after use.
_MAX_SPARE_BYTES = 1 << 30
T = TypeVar("T")


def target_host(target: str) -> str:
    """The host part of a gRPC target ("host:port", "dns:///host:port", "ipv4:h:p",
    "[::1]:p"); "" for unix sockets and anything else without one."""
    if target.startswith("unix:"):
        return ""
    for scheme in ("dns:///", "dns:", "ipv4:", "ipv6:"):
        if target.startswith(scheme):
            target = target[len(scheme):]
            break
    target = target.split(",")[0]  # ipv4:a:p,b:p -> the first address
    host = target[:target.rfind(":")] if ":" in target else target
    if len(host) >= 2 and host[0] == "[" and host[-1] == "]":
        host = host[1:-1]
    return host


def should_open(info: Any, transfers: bool, data_path: str) -> Tuple[bool, str]:
    """After the same-node path was not taken (`data_path` says why): whether to open the
    transfer channel GetServerInfo's reply `info` offers, and what data_path says if not."""
    if info.transfer_port <= 0:
        return False, data_path
    if not transfers:
        return False, data_path[:-1] + "; transfers are off)"
    return True, data_path


def tls_context(settings: Any, opened: Any) -> Tuple[Optional[ssl.SSLContext], str]:
    """The TLS context and server name to reach the channel OpenTransfer `opened` answered:
    (None, "") in the clear; FailedPrecondition when the listener speaks TLS and the client
    has no CA to verify it with (the gRPC channel's settings)."""
    if not opened.tls:
        return None, ""
    if not settings.tls_ca:
        raise FailedPrecondition("the server's transfers speak TLS but this client has no CA "
                                 "(tls_ca)")
    context = ssl.create_default_context(cafile=settings.tls_ca)
    if settings.tls_cert:
        context.load_cert_chain(settings.tls_cert, settings.tls_key)
    return context, settings.tls_server_name or ""


def refused(data_path: str, error: KvCacheError) -> str:
    """data_path after opening a channel failed."""
    return data_path[:-1] + f"; transfer: {error.message})"


def plan(lease: svc.Lease) -> Tuple[svc.Lease, Dict[int, Tuple[int, int]], int]:
    """The lease with every segment's blocks renumbered to their place among the payload's
    blocks of that format, each format's (offset, bytes) in the payload, and the payload's
    length: for each storage format in number order, its blocks in lane order."""
    renumbered = svc.Lease()
    renumbered.CopyFrom(lease)
    block_bytes = {a.format: a.block_bytes for a in lease.arenas}
    count: Dict[int, int] = {}
    for lane in renumbered.lanes:
        for seg in lane.segments:
            if seg.format not in block_bytes:
                raise Internal("the lease names no arena for a segment")
            first = count.get(seg.format, 0)
            n = len(seg.blocks)
            seg.blocks[:] = range(first, first + n)
            count[seg.format] = first + n
    spans: Dict[int, Tuple[int, int]] = {}
    total = 0
    for storage in sorted(count):
        size = count[storage] * block_bytes[storage]
        spans[storage] = (total, size)
        total += size
    return renumbered, spans, total


class TransferReader:
    """One connected transfer channel. Fetches on it run one at a time (call order).
    Thread-safe."""

    def __init__(self, host: str, port: int, transfer_id: str, token: str,
                 frame_key: bytes = b"", tls: Optional[ssl.SSLContext] = None,
                 server_name: str = ""):
        """Connects (through `tls` when given, the listener's certificate checked for
        `server_name` or else `host`) and presents the token. Unavailable when the port
        cannot be reached or the handshake fails; FailedPrecondition when the server refuses
        the greeting."""
        self.id = transfer_id
        self.where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        self._lock = threading.Lock()  # one fetch at a time
        self._broken = False
        self._nonce = secrets.randbits(63)
        self._frames = 0  # frames read on this channel: each frame's number for its tag
        self._aead = ChaCha20Poly1305(frame_key) if len(frame_key) == 32 else None
        self._spare: Optional[np.ndarray] = None
        try:
            self._sock = socket.create_connection((host, port), timeout=5)
        except OSError as e:
            raise Unavailable(f"cannot connect to transfer {self.where}: "
                              f"{e.strerror or e}") from None
        if tls is not None:
            try:
                self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                self._sock = tls.wrap_socket(self._sock, server_hostname=server_name or host)
            except OSError as e:  # ssl.SSLError included
                self._sock.close()
                raise Unavailable(f"transfer {self.where}: TLS handshake failed: {e}") from None
            self.where += ", TLS"
        try:
            self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._sock.sendall(
                f"KVC-TRANSFER {_WIRE_VERSION} {transfer_id} {token}\n".encode())
            reply = b""
            while not reply.endswith(b"\n") and len(reply) < _MAX_REPLY:
                got = self._sock.recv(1)
                if not got:
                    break
                reply += got
        except OSError as e:
            self._sock.close()
            raise Unavailable(f"transfer {self.where}: {e.strerror or e}") from None
        if reply != b"OK\n":
            self._sock.close()
            why = reply.decode("utf-8", "replace").rstrip("\n")[:200] or "closed"
            raise FailedPrecondition(f"transfer {self.where} refused: {why}")

    def alive(self) -> bool:
        """False once the channel broke or the server hung up (it writes only what a
        SendLease asked for: readable between fetches means closed). Never blocks on a fetch
        in progress: that one will tell."""
        if self._broken:
            return False
        if not self._lock.acquire(blocking=False):
            return True
        try:
            p = select.poll()
            p.register(self._sock, select.POLLIN)
            return not p.poll(0)
        finally:
            self._lock.release()

    def close(self) -> None:
        self._break()
        with self._lock:
            self._sock.close()

    def _tag(self, frame: int, header: bytearray, payload: Optional[np.ndarray],
             total: int) -> bytes:
        """The tag frame number `frame` must carry (transfer/frame_mac.h); when the channel
        has no usable key, a value of another length, which matches no tag."""
        if self._aead is None:
            return bytes(_MAC_BYTES + 1)  # compare_digest of different lengths: never equal
        nonce = bytes(4) + frame.to_bytes(8, "little")
        aad = memoryview(payload)[:total] if payload is not None else b""
        return self._aead.encrypt(nonce, bytes(header), aad)[-_MAC_BYTES:]

    def _break(self) -> None:
        self._broken = True
        try:
            # shutdown, not close: the server's write fails at once instead of stalling.
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _read_exactly(self, view: memoryview, deadline: float,
                      give_up: Callable[[], bool]) -> None:
        """Fills `view` from the socket. Unavailable when the server closes first; _Deadline
        past `deadline`; _GaveUp when `give_up()` turns true while nothing arrives (the
        SendLease call failed: no more bytes may come). fetch() turns both into errors."""
        got = 0
        while got < len(view):
            left = deadline - time.monotonic()
            if left <= 0:
                raise _Deadline()
            self._sock.settimeout(min(left, 0.05))
            try:
                n = self._sock.recv_into(view[got:])
            except socket.timeout:
                if give_up():
                    raise _GaveUp() from None
                continue
            except ssl.SSLError as e:
                if e.reason in ("DECRYPTION_FAILED_OR_BAD_RECORD_MAC", "BAD_RECORD_MAC"):
                    raise DataLoss(f"transfer {self.where}: a TLS record failed its integrity "
                                   f"check (changed on the way): {e}") from None
                raise Unavailable(f"transfer {self.where}: {e}") from None
            except OSError as e:
                raise Unavailable(f"transfer {self.where}: {e.strerror or e}") from None
            if n == 0:
                raise Unavailable(f"transfer {self.where} closed after {got} of {len(view)} "
                                  "bytes")
            got += n

    def fetch(self, lease: svc.Lease, send: Callable[[int], Any], timeout: float,
              consume: Callable[[svc.Lease, Dict[int, np.ndarray]], T]) -> T:
        """Receives `lease`'s blocks: `send(nonce)` starts the SendLease call and returns its
        grpc future. Returns what `consume` makes of the renumbered lease and each storage
        format's blocks as a uint8 array (block b of the format at b * block_bytes); the
        arrays are reused by the next fetch, so `consume` copies what it keeps.
        The call's own error when the server refused before the payload (the channel stays
        usable); Unavailable/DeadlineExceeded/Internal when the stream broke (the channel is
        closed for good: open another)."""
        renumbered, spans, total = plan(lease)
        with self._lock:
            if self._broken:
                raise Unavailable(f"transfer {self.where} broke earlier")
            self._nonce = (self._nonce + 1) & ((1 << 64) - 1)
            nonce = self._nonce
            deadline = time.monotonic() + timeout
            future = send(nonce)
            failed = lambda: future.done() and future.exception() is not None  # noqa: E731
            header = bytearray(_HEADER.size)
            code = 0
            frame = self._frames
            self._frames += 1  # every frame read counts, refusals too
            try:
                try:
                    self._read_exactly(memoryview(header), deadline, failed)
                    magic, got_nonce, length, code, pad = _HEADER.unpack(bytes(header))
                    if magic != _MAGIC or pad != 0 or got_nonce != nonce or (code and length):
                        raise Internal(f"transfer {self.where} is out of step")
                    if code == 0:
                        if length != total:
                            raise Internal(f"transfer {self.where} sends {length} bytes for a "
                                           f"lease of {total}")
                        if self._spare is not None and self._spare.size >= total:
                            payload = self._spare
                        else:
                            payload = np.empty(max(total, 1), dtype=np.uint8)
                        self._spare = payload if payload.size <= _MAX_SPARE_BYTES else None
                        self._read_exactly(memoryview(payload)[:total], deadline, failed)
                    # The frame's MAC: what came is used only if it is what the server sent.
                    tag = bytearray(_MAC_BYTES)
                    self._read_exactly(memoryview(tag), deadline, failed)
                    if not hmac.compare_digest(self._tag(frame, header, payload if code == 0
                                                         else None, total), bytes(tag)):
                        raise DataLoss(f"transfer {self.where}: a frame's MAC does not match "
                                       "its bytes (changed on the way, or not this "
                                       "channel's); nothing of it is used")
                except (_GaveUp, _Deadline, KvCacheError) as e:
                    self._break()
                    future.cancel()
                    if isinstance(e, _GaveUp):
                        # The call failed before its frame came: its error says why, and the
                        # stream cannot be trusted after.
                        raise _call_error(future) from None
                    if isinstance(e, _Deadline):
                        raise DeadlineExceeded(f"transfer {self.where}: the payload did not "
                                               "arrive before the deadline") from None
                    raise
                try:
                    future.result(timeout=max(deadline - time.monotonic(), 0.001))
                except Exception:
                    if code == 0:
                        self._break()  # a failure the frame did not announce
                    raise _call_error(future) from None
                if code != 0:
                    self._break()
                    raise Internal("the server announced a refusal but SendLease succeeded")
            except BaseException:
                if not future.done():
                    future.cancel()
                raise
            return consume(renumbered, {storage: payload[offset:offset + size]
                                        for storage, (offset, size) in spans.items()})


class _GaveUp(Exception):
    pass


class _Deadline(Exception):
    pass


def _call_error(future: Any) -> KvCacheError:
    """The error of a SendLease call: a grpc future (Client) or a concurrent.futures one
    (AsyncClient: the call runs on the event loop)."""
    try:
        error = future.exception(timeout=0)
    except (grpc.FutureTimeoutError, concurrent.futures.TimeoutError):
        return DeadlineExceeded("SendLease did not answer before the deadline")
    except (grpc.FutureCancelledError, concurrent.futures.CancelledError):
        return Unavailable("SendLease was cancelled")
    if isinstance(error, grpc.RpcError):
        return from_rpc_error(error)
    return Unavailable(f"SendLease failed: {error}")
