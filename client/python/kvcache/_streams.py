"""The streams of Client and AsyncClient, written once over the I/O operations of
kvcache/_ops.py (as the unary calls are in kvcache/_calls.py): when a Fetch stream is tried
again (FetchRetry), an append_stream() (AppendStreamCalls: staged appends on the server's node,
StagedStream, or one AppendStream call, MessageStream) and an attend_session() (AttendCalls).
The drivers bind their public methods with _calls.bind and perform the operations.
"""

from __future__ import annotations

import time
from typing import Any, List, Optional, Sequence, Tuple

import grpc
import numpy as np

from kvcache import _codec
from kvcache._channel import Settings, sequence_id
from kvcache._local import StagingSpace
from kvcache._ops import (COPY_OFF_LOOP_BYTES, SERVER_MAY_STILL_READ, Close, Offload, OpenStream,
                          Read, Start, Step, Wait, Write)
from kvcache.errors import (Aborted, DeadlineExceeded, FailedPrecondition, KvCacheError,
                            from_rpc_error)
from kvcache.types import AppendStreamResult, AttendResult, DTypeLike


class FetchRetry:
    """When a Fetch stream is tried again: on UNAVAILABLE before its first chunk, as every
    retried read, with exponential backoff."""

    def __init__(self, settings: Settings):
        self._s = settings
        self._attempt = 0
        self._backoff = settings.initial_backoff
        self.delivered = False

    def chunk(self, message: Any) -> Any:
        """A received message as a FetchedChunk."""
        self.delivered = True
        return _codec.chunk_from_proto(message)

    def failed(self, e: grpc.RpcError) -> float:
        """Seconds to wait before the next attempt, or raises the stream's error."""
        self._attempt += 1
        if (e.code() != grpc.StatusCode.UNAVAILABLE or self.delivered
                or self._attempt == self._s.max_attempts):
            error = from_rpc_error(e)
            if self.delivered:
                error.message = f"Fetch broke after some chunks: {error.message}"
                error.args = (error.message,)
            raise error from None
        wait, self._backoff = self._backoff, min(self._backoff * 2, self._s.max_backoff)
        return wait


# (sequence and layer, call handle, slot offset or None, message index, layer,
# start_position, tokens) per message in flight
_InFlight = Tuple[Tuple[str, int], Any, Optional[int], int, int, int, int]


class StagedStream:
    """append_stream() on the server's node: each append() copies keys and values into the
    staging region and sends an Append naming the offsets, with up to 4 in flight, one per
    (sequence, layer) so each layer's order holds (the only order the service needs); copying
    the next chunk overlaps the server writing the last. A chunk larger than the region goes as
    bytes. A rejected message breaks the stream: finish() raises its error, naming it and how
    many messages were applied (messages of other layers already in flight may have been)."""

    MAX_IN_FLIGHT = 4

    def __init__(self, staging: StagingSpace, timeout: float):
        self._staging = staging
        self._deadline = time.monotonic() + timeout
        self._in_flight: List[_InFlight] = []
        self._messages = self._tokens = self._visible = self._written = 0
        self._error: Optional[Tuple[int, KvCacheError, str]] = None
        self._closed = False
        self.result: Optional[AppendStreamResult] = None

    def _settle(self, entry: _InFlight) -> Step[None]:
        _, handle, offset, index, layer, start, tokens = entry
        try:
            r = yield Wait(handle)
        except KvCacheError as err:
            if offset is not None and not isinstance(err, SERVER_MAY_STILL_READ):
                self._staging.release(offset)
            if self._error is None or index < self._error[0]:
                self._error = (index, err, f"layer {layer}, start_position {start}")
            return
        self._messages += 1
        self._tokens += tokens
        self._visible = max(self._visible, r.visible_tokens)
        if offset is not None:
            self._staging.release(offset)

    def _settle_all(self) -> Step[None]:
        while self._in_flight:
            yield from self._settle(self._in_flight.pop(0))

    def _broken(self) -> Aborted:
        return Aborted("the append stream broke; finish() says why")

    def append(self, seq: Any, layer: int, start_position: int, keys: np.ndarray,
               values: np.ndarray, dtype: DTypeLike) -> Step[None]:
        if self._closed:
            raise FailedPrecondition("the append stream is finished")
        sid = sequence_id(seq)
        key = (sid, layer)
        for entry in [e for e in self._in_flight if e[0] == key]:
            self._in_flight.remove(entry)
            yield from self._settle(entry)
        while len(self._in_flight) >= self.MAX_IN_FLIGHT:
            yield from self._settle(self._in_flight.pop(0))
        if self._error is not None:
            raise self._broken()
        s = self._staging
        stage = Offload(_codec.stage_append,
                        (sid, layer, start_position, keys, values, dtype, s.array, s.region_id,
                         s.acquire), large=keys.nbytes + values.nbytes >= COPY_OFF_LOOP_BYTES)
        staged = yield stage
        if staged is None and isinstance(keys, np.ndarray) and 0 < 2 * keys.nbytes <= s.size:
            yield from self._settle_all()  # the region is busy: wait until it is empty
            if self._error is not None:
                raise self._broken()
            staged = yield stage
        left = self._deadline - time.monotonic()
        if left <= 0:
            if staged is not None:
                s.release(staged[1])
            self._error = (self._written, DeadlineExceeded("the append stream's deadline passed"),
                           f"layer {layer}, start_position {start_position}")
            raise self._broken()
        if staged is None:  # larger than the region: the bytes go in the request
            request: bytes = _codec.encode_append(sid, layer, start_position, keys, values, dtype)
            offset: Optional[int] = None
        else:
            request, offset = staged
        handle = yield Start("Append", request, left)
        self._in_flight.append((key, handle, offset, self._written, layer, start_position,
                                int(keys.shape[0])))
        self._written += 1

    def finish(self) -> Step[AppendStreamResult]:
        if self.result is not None:
            return self.result
        self._closed = True
        yield from self._settle_all()
        if self._error is not None:
            index, err, where = self._error
            raise type(err)(f"AppendStream message {index} ({where}) rejected: {err.message}; "
                            f"{self._messages} messages were applied", err.code)
        self.result = AppendStreamResult(self._messages, self._tokens, self._visible)
        return self.result

    def cancel(self) -> None:
        """Cancels the messages in flight; their slots stay in use (the server may still be
        reading them)."""
        self._closed = True
        for entry in self._in_flight:
            entry[1].cancel()
        self._in_flight.clear()


class MessageStream:
    """One AppendStream call: its messages carry the bytes."""

    def __init__(self, timeout: float):
        self._timeout = timeout
        self._handle: Any = None
        self._closed = False
        self.result: Optional[AppendStreamResult] = None

    def append(self, seq: Any, layer: int, start_position: int, keys: np.ndarray,
               values: np.ndarray, dtype: DTypeLike) -> Step[None]:
        if self._closed:
            raise FailedPrecondition("the append stream is finished")
        request = _codec.encode_append(sequence_id(seq), layer, start_position, keys, values,
                                       dtype)
        if self._handle is None:
            self._handle = yield OpenStream("AppendStream", self._timeout)
        if not (yield Write(self._handle, request)):
            yield from self.finish()  # raises the server's error
            raise Aborted("the server closed the append stream")

    def finish(self) -> Step[AppendStreamResult]:
        if self.result is not None:
            return self.result
        self._closed = True
        if self._handle is None:
            self._handle = yield OpenStream("AppendStream", self._timeout)
        r = yield Close(self._handle, reply=True)
        self.result = AppendStreamResult(r.messages, r.tokens, r.visible_tokens)
        return self.result

    def cancel(self) -> None:
        self._closed = True
        if self._handle is not None:
            self._handle.cancel()


class AppendStreamCalls:
    """One append_stream(). Which path it takes (staged appends on the server's node, or one
    AppendStream call) is decided on its first append; the deadline runs from its creation. A
    message the server rejects ends the stream: the next append() or finish() raises that
    error (its message says how many were applied)."""

    def __init__(self, calls: Any, timeout: Optional[float]):
        self._calls = calls
        self._timeout = timeout
        self._deadline = time.monotonic() + calls.timeout(timeout)
        self._impl: Any = None  # MessageStream or StagedStream
        self._cancelled = False

    @property
    def result(self) -> Optional[AppendStreamResult]:
        """The totals, once finish() returned them."""
        return None if self._impl is None else self._impl.result

    def _open(self) -> Step[Any]:
        if self._impl is None:
            if self._cancelled:
                raise FailedPrecondition("the append stream is finished")
            staging = yield from self._calls.staging(self._timeout)
            left = max(self._deadline - time.monotonic(), 0.001)
            self._impl = (StagedStream(staging, left) if staging is not None
                          else MessageStream(left))
        return self._impl

    def append(self, seq: Any, layer: int, start_position: int, keys: np.ndarray,
               values: np.ndarray, *, dtype: DTypeLike = None) -> Step[None]:
        """Sends one Append (same arguments as Client.append)."""
        impl = yield from self._open()
        yield from impl.append(seq, layer, start_position, keys, values, dtype)

    def finish(self) -> Step[AppendStreamResult]:
        """Ends the stream and returns the totals, or raises the first rejected message's
        error."""
        impl = yield from self._open()
        return (yield from impl.finish())

    def cancel(self) -> None:
        """Cancels the messages in flight; those the server already applied stay applied."""
        self._cancelled = True
        if self._impl is not None:
            self._impl.cancel()


class AttendCalls:
    """One attend_session(): a bidirectional AttendStream; each attend() sends one request and
    waits for its answer. Not thread-safe."""

    def __init__(self, calls: Any, timeout: Optional[float]):
        self._timeout = calls.timeout(timeout)
        self._deadline = time.monotonic() + self._timeout
        self._handle: Any = None
        self._closed = False

    def attend(self, seq: Any, layer: int, queries: np.ndarray, positions: Sequence[int], *,
               dtype: DTypeLike = None, return_weights: bool = False) -> Step[AttendResult]:
        """As Client.attend, on this stream."""
        if self._closed:
            raise FailedPrecondition("the attend session is closed")
        request = _codec.attend_request(sequence_id(seq), layer, queries, positions, dtype,
                                        return_weights)
        try:
            if self._handle is None:
                left = max(self._deadline - time.monotonic(), 0.001)
                self._handle = yield OpenStream("AttendStream", left)
            r = (yield Read(self._handle)) if (yield Write(self._handle, request)) else None
            if r is None:
                yield Close(self._handle, reply=False)  # raises the server's error
                raise Aborted("the server closed the attend stream")
        except BaseException:
            self._closed = True
            raise
        return _codec.attend_from_proto(r, queries.shape)

    def close(self) -> Step[None]:
        """Ends the stream; raises the server's final error, if any."""
        if self._closed:
            return
        self._closed = True
        if self._handle is not None:
            yield Close(self._handle, reply=False)

    def cancel(self) -> None:
        """Cancels the stream at once."""
        self._closed = True
        if self._handle is not None:
            self._handle.cancel()
