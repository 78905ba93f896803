"""The I/O operations the shared core (kvcache/_calls.py) asks its two drivers to perform.

A call of the core is a generator: it yields one of the operations below, receives its result
(or has the exception it raised thrown in) and finally returns the call's value. Client
(kvcache/client.py) performs each operation with a plain, blocking call; AsyncClient
(kvcache/aio.py) awaits it, and runs the blocking ones in the loop's default executor. This
file names them; kvcache/_streams.py writes the streams with them.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Coroutine, Generator, Tuple, TypeVar

from kvcache.errors import (Cancelled, DataLoss, DeadlineExceeded, Internal, Unavailable,
                            Unknown)

T = TypeVar("T")
Step = Generator[Any, Any, T]

# Errors with which an append can end while the server may still be reading its staged bytes
# (the client gave up or lost the answer, not the server refusing): such a slot is never reused.
SERVER_MAY_STILL_READ = (DeadlineExceeded, Cancelled, Unavailable, Unknown, Internal, DataLoss)

# Staged chunks at least this large are copied on an executor thread by AsyncClient: a decode
# step's few KiB cost less to copy than the hop to a thread, a prefill chunk's MiBs would stall
# the loop.
COPY_OFF_LOOP_BYTES = 256 << 10


@dataclasses.dataclass(frozen=True)
class Rpc:
    """One attempt of the unary `method` (a KvCacheService or AdminService method name;
    "Append" takes the bytes of _codec.encode_append): its reply."""
    method: str
    request: Any
    timeout: float


@dataclasses.dataclass(frozen=True)
class Start:
    """Rpc without waiting: a handle for Wait (and .cancel())."""
    method: str
    request: Any
    timeout: float


@dataclasses.dataclass(frozen=True)
class Wait:
    """The reply of a Start's call; Cancelled once it was cancelled."""
    handle: Any


@dataclasses.dataclass(frozen=True)
class Sleep:
    seconds: float


@dataclasses.dataclass(frozen=True)
class Offload:
    """fn(*args): blocking work (socket requests, reads out of a mapping, large copies). The
    asynchronous driver runs it in the loop's default executor when `large`."""
    fn: Callable[..., Any]
    args: Tuple[Any, ...]
    large: bool = True


@dataclasses.dataclass(frozen=True)
class Serialized:
    """Runs `step` (a generator of these operations) under the client's path lock (a
    threading.Lock or an asyncio.Lock): the path decision (kvcache/_paths.py) is not locked
    otherwise."""
    step: Step[Any]


@dataclasses.dataclass(frozen=True)
class FetchStream:
    """A gRPC Fetch of `request` read to its end, retried as fetch_chunks is: a FetchResult."""
    request: Any
    timeout: float


@dataclasses.dataclass(frozen=True)
class OpenStream:
    """A streaming call of `method`: AppendStream (client-streaming) or AttendStream
    (bidirectional); a handle for Write, Read and Close (and .cancel())."""
    method: str
    timeout: float


@dataclasses.dataclass(frozen=True)
class Write:
    """Sends `message` on the stream: True, or False when the call has ended (Close says
    why)."""
    handle: Any
    message: Any


@dataclasses.dataclass(frozen=True)
class Read:
    """The stream's next reply, or None once the server ended it (Close says how)."""
    handle: Any


@dataclasses.dataclass(frozen=True)
class Close:
    """Ends the stream's writing and waits for the call's end: the reply of a
    client-streaming call (`reply`), None of a bidirectional one; raises the call's error
    (Cancelled once it was cancelled)."""
    handle: Any
    reply: bool


@dataclasses.dataclass(frozen=True)
class Receive:
    """transfer.fetch(lease, send, timeout, gather) where send(nonce) sends SendLease
    request(nonce) while the channel is read: the received heads."""
    transfer: Any
    lease: Any
    request: Callable[[int], Any]
    timeout: float
    gather: Callable[..., Any]


async def drive(step: Step[T], perform: Callable[[Any], Any], awaited: bool) -> T:
    """Runs one call of the core, performing each operation it yields with `perform`
    (awaiting what it returns when `awaited`); what an operation raises (a cancellation too)
    goes back into the call, whose cleanup may perform more. The one driver loop of both
    clients: Client runs it with run_blocking, as nothing it awaits then suspends."""
    try:
        op = next(step)
        while True:
            try:
                result = perform(op)
                if awaited:
                    result = await result
            except BaseException as e:  # noqa: B902 (the call decides what it handles)
                op = step.throw(e)
                continue
            op = step.send(result)
    except StopIteration as stop:
        return stop.value


def run_blocking(coroutine: Coroutine[Any, Any, T]) -> T:
    """The value of a coroutine that never suspends (drive with awaited=False)."""
    try:
        coroutine.send(None)
    except StopIteration as done:
        return done.value
    coroutine.close()
    raise AssertionError("a blocking call suspended")
