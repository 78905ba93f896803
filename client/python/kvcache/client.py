"""Client: the synchronous Python API of kvcached (kvcache.v1 over gRPC).

    with kvcache.Client("127.0.0.1:50051") as client:
        seq = client.create_sequence(pool="default")
        client.append(seq, layer=0, start_position=0, keys=k, values=v)
        kv = client.fetch(seq)            # kv[(layer, kv_head)].keys: [n, head_dim]

Every call has a deadline (`timeout`, seconds; per call `timeout=`). Failures raise the
kvcache.errors exception named after the gRPC status code. Only idempotent calls are retried,
only on UNAVAILABLE (kvcache/_calls.py says which). Thread-safe: share one Client.

The calls are written once, in kvcache/_calls.py, as generators of I/O operations (kvcache/
_ops.py); this file performs those operations with blocking calls, and holds the calls that
are streams by nature (fetch_chunks, append_stream, attend_session).
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any, Callable, Iterator, Sequence, Tuple

import grpc

from kvcache import _codec
from kvcache._calls import bind
from kvcache._channel import Settings
from kvcache._common import BoundStream, ClientBase
from kvcache._ops import (Close, FetchStream, Offload, OpenStream, Read, Receive, Rpc, Serialized,
                          Sleep, Start, Step, T, Wait, Write, drive, run_blocking)
from kvcache._proto.kvcache.v1 import kvcache_service_pb2 as svc
from kvcache._streams import AppendStreamCalls, AttendCalls, FetchRetry
from kvcache.errors import Cancelled, from_rpc_error
from kvcache.types import FetchedChunk


def _blocking(call: Callable[..., Step[T]]) -> Callable[..., T]:
    def run(self: "Client", *args: Any, **kwargs: Any) -> T:
        return self._drive(call(self._core, *args, **kwargs))

    return run


@bind(_blocking)
class Client(ClientBase):
    """A connection to kvcached. The channel connects lazily: an unreachable target (or a
    failed TLS handshake) shows up as ``Unavailable`` on the first call."""

    def _open_channel(self, target: str, settings: Settings,
                      interceptors: Sequence[Any]) -> Tuple[Any, Any]:
        if settings.credentials is not None:
            channel = grpc.secure_channel(target, settings.credentials, options=settings.options)
        else:
            channel = grpc.insecure_channel(target, options=settings.options)
        # Serializes the read and append path decision (kvcache/_paths.py).
        self._paths_lock = threading.Lock()
        self._streams = (AppendStream, AttendSession)
        return channel, grpc.intercept_channel(channel, *interceptors) if interceptors else channel

    def close(self) -> None:
        """Closes the channel; calls in flight are cancelled."""
        self._channel.close()
        with self._paths_lock:
            self._core.paths.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the driver -------------------------------------------------------------------------

    def _drive(self, step: Step[T]) -> T:
        return run_blocking(drive(step, self._perform, awaited=False))

    def _perform(self, op: Any) -> Any:
        md = self._s.metadata
        try:
            if isinstance(op, Rpc):
                return self._methods[op.method](op.request, timeout=op.timeout, metadata=md)
            if isinstance(op, Start):
                return self._methods[op.method].future(op.request, timeout=op.timeout,
                                                       metadata=md)
            if isinstance(op, Wait):
                return op.handle.result()
            if isinstance(op, OpenStream):
                return _QueuedCall(self._methods[op.method], op.timeout, md,
                                   reply=op.method == "AppendStream")
            if isinstance(op, Write):
                return op.handle.write(op.message)
            if isinstance(op, Read):
                return op.handle.read()
            if isinstance(op, Close):
                return op.handle.close()
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None
        except grpc.FutureCancelledError:
            raise Cancelled("the call was cancelled by the client") from None
        if isinstance(op, Offload):
            return op.fn(*op.args)
        if isinstance(op, Sleep):
            return time.sleep(op.seconds)
        if isinstance(op, Serialized):
            with self._paths_lock:
                return self._drive(op.step)
        if isinstance(op, FetchStream):
            assembler = _codec.FetchAssembler()
            for chunk in self._chunks(op.request, op.timeout):
                assembler.add(chunk)
            return assembler.result()
        assert isinstance(op, Receive), op

        def send(nonce: int) -> Any:
            return self._methods["SendLease"].future(op.request(nonce), timeout=op.timeout,
                                                     metadata=md)

        return op.transfer.fetch(op.lease, send, op.timeout, op.gather)

    # -- streams ----------------------------------------------------------------------------

    def _chunks(self, request: svc.FetchRequest, timeout: float) -> Iterator[FetchedChunk]:
        retry = FetchRetry(self._s)
        while True:
            call = self._methods["Fetch"](request, timeout=timeout, metadata=self._s.metadata)
            try:
                yield from map(retry.chunk, call)
                return
            except grpc.RpcError as e:
                time.sleep(retry.failed(e))
            finally:
                call.cancel()  # a no-op once the stream has ended


@bind(_blocking, AppendStreamCalls, ("append", "finish"))
class AppendStream(BoundStream):
    """One append_stream() (kvcache/_streams.py AppendStreamCalls). Leaving the ``with``
    block normally finishes it and sets ``result``; leaving it with an exception cancels it
    (messages the server already applied stay applied). Not thread-safe."""

    CALLS = AppendStreamCalls

    def __enter__(self) -> "AppendStream":
        return self

    def __exit__(self, exc_type: Any, *rest: Any) -> None:
        if exc_type is not None:
            self.cancel()
        else:
            self.finish()  # type: ignore[attr-defined]


@bind(_blocking, AttendCalls, ("attend", "close"))
class AttendSession(BoundStream):
    """A bidirectional AttendStream (kvcache/_streams.py AttendCalls): each attend() sends one
    request and waits for its answer. ``with`` closes it (cancels it if the block raised). Not
    thread-safe."""

    CALLS = AttendCalls

    def __enter__(self) -> "AttendSession":
        return self

    def __exit__(self, exc_type: Any, *rest: Any) -> None:
        if exc_type is not None:
            self.cancel()
        else:
            self.close()  # type: ignore[attr-defined]


class _QueuedCall:
    """A blocking streaming call whose requests come from a queue (at most 4 waiting): the
    stream handle of kvcache/_ops.py (write, read, close, cancel)."""

    def __init__(self, method: Any, timeout: float, metadata: Any, reply: bool):
        self._queue: "queue.Queue[Any]" = queue.Queue(4)
        self._reply = reply
        start = method.future if reply else method
        self._call = start(self._requests(), timeout=timeout, metadata=metadata)
        self._closed = False

    def _requests(self) -> Iterator[Any]:
        while True:
            item = self._queue.get()
            if item is None:
                return
            yield item

    def write(self, message: Any) -> bool:
        while not self._call.done():
            try:
                self._queue.put(message, timeout=0.05)
                return True
            except queue.Full:
                pass
        return False

    def read(self) -> Any:
        try:
            return next(self._call)
        except StopIteration:
            return None

    def close(self) -> Any:
        if not self._closed:
            self._closed = True
            self.write(None)
        if self._reply:
            return self._call.result()
        for _ in self._call:
            pass
        return None

    def cancel(self) -> None:
        self._closed = True
        self._call.cancel()
        try:
            self._queue.put_nowait(None)  # ends the request iterator
        except queue.Full:
            pass
