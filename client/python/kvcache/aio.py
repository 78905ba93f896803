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

The calls are written once, in kvcache/_calls.py, as generators of I/O operations (kvcache/
_ops.py); this file awaits those operations, and holds the calls that are streams by nature.
"""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator, Callable, Coroutine, Optional, Sequence, Tuple

import grpc
import grpc.aio

from kvcache import _codec
from kvcache._calls import bind
from kvcache._channel import Settings
from kvcache._common import BoundStream, ClientBase
from kvcache._ops import (Close, FetchStream, Offload, OpenStream, Read, Receive, Rpc, Serialized,
                          Sleep, Start, Step, T, Wait, Write, drive)
from kvcache._proto.kvcache.v1 import kvcache_service_pb2 as svc
from kvcache._streams import AppendStreamCalls, AttendCalls, FetchRetry
from kvcache.errors import Cancelled, from_rpc_error
from kvcache.types import FetchedChunk


def _awaited(call: Callable[..., Step[T]]) -> Callable[..., Coroutine[Any, Any, T]]:
    async def run(self: "AsyncClient", *args: Any, **kwargs: Any) -> T:
        return await self._drive(call(self._core, *args, **kwargs))

    return run


@bind(_awaited)
class AsyncClient(ClientBase):
    """asyncio connection to kvcached; arguments as kvcache.Client (interceptors are
    grpc.aio client interceptors). Create it inside a running event loop."""

    def _open_channel(self, target: str, settings: Settings,
                      interceptors: Sequence[Any]) -> Tuple[Any, Any]:
        kwargs = {"options": settings.options, "interceptors": list(interceptors) or None}
        if settings.credentials is not None:
            channel = grpc.aio.secure_channel(target, settings.credentials, **kwargs)
        else:
            channel = grpc.aio.insecure_channel(target, **kwargs)
        # Serializes the read and append path decision (kvcache/_paths.py).
        self._paths_lock = asyncio.Lock()
        self._streams = (AsyncAppendStream, AsyncAttendSession)
        return channel, channel

    async def close(self) -> None:
        """Closes the channel; calls in flight are cancelled."""
        await self._channel.close()
        self._core.paths.close()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- the driver -------------------------------------------------------------------------

    def _drive(self, step: Step[T]) -> Coroutine[Any, Any, T]:
        return drive(step, self._perform, awaited=True)

    async def _perform(self, op: Any) -> Any:
        md = self._s.metadata
        loop = asyncio.get_running_loop()
        try:
            if isinstance(op, Rpc):
                return await self._methods[op.method](op.request, timeout=op.timeout,
                                                      metadata=md)
            if isinstance(op, Start):
                return self._methods[op.method](op.request, timeout=op.timeout, metadata=md)
            if isinstance(op, Wait):
                return await _reply(op.handle)
            if isinstance(op, OpenStream):
                return self._methods[op.method](timeout=op.timeout, metadata=md)
            if isinstance(op, Write):
                return await _write(op.handle, op.message)
            if isinstance(op, Read):
                return await _read(op.handle)
            if isinstance(op, Close):
                return await _close(op.handle, op.reply)
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None
        if isinstance(op, Offload):
            if op.large:
                return await loop.run_in_executor(None, op.fn, *op.args)
            return op.fn(*op.args)
        if isinstance(op, Sleep):
            return await asyncio.sleep(op.seconds)
        if isinstance(op, Serialized):
            async with self._paths_lock:
                return await self._drive(op.step)
        if isinstance(op, FetchStream):
            assembler = _codec.FetchAssembler()
            async for chunk in self._chunks(op.request, op.timeout):
                assembler.add(chunk)
            return assembler.result()
        assert isinstance(op, Receive), op

        # The channel is read on an executor thread while the SendLease call runs on the loop.
        async def call(nonce: int) -> Any:
            return await self._methods["SendLease"](op.request(nonce), timeout=op.timeout,
                                                    metadata=md)

        return await loop.run_in_executor(
            None, op.transfer.fetch, op.lease,
            lambda nonce: asyncio.run_coroutine_threadsafe(call(nonce), loop), op.timeout,
            op.gather)

    # -- streams ----------------------------------------------------------------------------

    async def _chunks(self, request: svc.FetchRequest,
                      timeout: float) -> AsyncIterator[FetchedChunk]:
        retry = FetchRetry(self._s)
        while True:
            call = self._methods["Fetch"](request, timeout=timeout, metadata=self._s.metadata)
            try:
                async for message in call:
                    yield retry.chunk(message)
                return
            except grpc.RpcError as e:
                wait = retry.failed(e)
            finally:
                call.cancel()
            await asyncio.sleep(wait)


@bind(_awaited, AppendStreamCalls, ("append", "finish"))
class AsyncAppendStream(BoundStream):
    """See kvcache.client.AppendStream; append() and finish() are coroutines."""

    CALLS = AppendStreamCalls

    async def __aenter__(self) -> "AsyncAppendStream":
        return self

    async def __aexit__(self, exc_type: Any, *rest: Any) -> None:
        if exc_type is not None:
            self.cancel()
        else:
            await self.finish()  # type: ignore[attr-defined]


@bind(_awaited, AttendCalls, ("attend", "close"))
class AsyncAttendSession(BoundStream):
    """See kvcache.client.AttendSession; attend() and close() are coroutines."""

    CALLS = AttendCalls

    async def __aenter__(self) -> "AsyncAttendSession":
        return self

    async def __aexit__(self, exc_type: Any, *rest: Any) -> None:
        if exc_type is not None:
            self.cancel()
        else:
            await self.close()  # type: ignore[attr-defined]


# The stream operations of kvcache/_ops.py on a grpc.aio call.

async def _reply(call: Any) -> Any:
    try:
        return await call
    except asyncio.CancelledError:
        if not call.cancelled():
            raise  # this task was cancelled, not the call
        raise Cancelled("the call was cancelled by the client") from None


async def _write(call: Any, message: Any) -> bool:
    try:
        await call.write(message)
        return True
    except (grpc.RpcError, asyncio.InvalidStateError):
        return False  # the call ended: Close says why


async def _read(call: Any) -> Any:
    try:
        r = await call.read()
    except asyncio.InvalidStateError:
        return None
    return None if r is grpc.aio.EOF else r


async def _close(call: Any, reply: bool) -> Any:
    try:
        await call.done_writing()
    except asyncio.InvalidStateError:
        pass  # it ended already
    if reply:
        return await _reply(call)
    code = await call.code()
    if code != grpc.StatusCode.OK:
        raise from_rpc_error(_Status(code, await call.details()))
    return None


class _Status:
    """A (code, details) pair shaped like grpc.RpcError for from_rpc_error."""

    def __init__(self, code: grpc.StatusCode, details: Optional[str]):
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> Optional[str]:
        return self._details
