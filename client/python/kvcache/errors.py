"""Exceptions for the gRPC status codes kvcached returns.

Every failed call raises a subclass of :class:`KvCacheError` named after its status code
(``NotFound`` for NOT_FOUND, ...), carrying ``.code`` (a :class:`grpc.StatusCode`) and the
server's message (``.message``), which names the field and what was expected.
"""

from __future__ import annotations

from typing import Dict, Optional, Type

import grpc


class KvCacheError(Exception):
    """A call to kvcached failed; ``code`` is the gRPC status code, ``message`` the reason."""

    code: grpc.StatusCode = grpc.StatusCode.UNKNOWN

    def __init__(self, message: str, code: Optional[grpc.StatusCode] = None):
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code

    def __str__(self) -> str:
        return f"{self.code.name}: {self.message}"


def _make(name: str, code: grpc.StatusCode) -> Type[KvCacheError]:
    cls = type(name, (KvCacheError,), {"code": code, "__doc__": f"gRPC status {code.name}."})
    cls.__module__ = __name__
    return cls


Cancelled = _make("Cancelled", grpc.StatusCode.CANCELLED)
Unknown = _make("Unknown", grpc.StatusCode.UNKNOWN)
InvalidArgument = _make("InvalidArgument", grpc.StatusCode.INVALID_ARGUMENT)
DeadlineExceeded = _make("DeadlineExceeded", grpc.StatusCode.DEADLINE_EXCEEDED)
NotFound = _make("NotFound", grpc.StatusCode.NOT_FOUND)
AlreadyExists = _make("AlreadyExists", grpc.StatusCode.ALREADY_EXISTS)
PermissionDenied = _make("PermissionDenied", grpc.StatusCode.PERMISSION_DENIED)
ResourceExhausted = _make("ResourceExhausted", grpc.StatusCode.RESOURCE_EXHAUSTED)
FailedPrecondition = _make("FailedPrecondition", grpc.StatusCode.FAILED_PRECONDITION)
Aborted = _make("Aborted", grpc.StatusCode.ABORTED)
OutOfRange = _make("OutOfRange", grpc.StatusCode.OUT_OF_RANGE)
Unimplemented = _make("Unimplemented", grpc.StatusCode.UNIMPLEMENTED)
Internal = _make("Internal", grpc.StatusCode.INTERNAL)
Unavailable = _make("Unavailable", grpc.StatusCode.UNAVAILABLE)
DataLoss = _make("DataLoss", grpc.StatusCode.DATA_LOSS)
Unauthenticated = _make("Unauthenticated", grpc.StatusCode.UNAUTHENTICATED)

_BY_CODE: Dict[grpc.StatusCode, Type[KvCacheError]] = {
    cls.code: cls
    for cls in (Cancelled, Unknown, InvalidArgument, DeadlineExceeded, NotFound, AlreadyExists,
                PermissionDenied, ResourceExhausted, FailedPrecondition, Aborted, OutOfRange,
                Unimplemented, Internal, Unavailable, DataLoss, Unauthenticated)
}


def from_rpc_error(error: grpc.RpcError) -> KvCacheError:
    """The exception for a failed call (grpc.RpcError or grpc.aio.AioRpcError)."""
    code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
    details = error.details() if hasattr(error, "details") else str(error)
    cls = _BY_CODE.get(code, KvCacheError)
    return cls(details or "", code)


__all__ = ["KvCacheError", "from_rpc_error"] + [c.__name__ for c in _BY_CODE.values()]
