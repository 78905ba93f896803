"""Channel options shared by Client and AsyncClient: TLS, bearer token, retry settings."""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Dict, List, Optional, Tuple, Union

import grpc

from kvcache import _codec
from kvcache._proto.kvcache.v1 import admin_service_pb2_grpc as admin_grpc
from kvcache._proto.kvcache.v1 import kvcache_service_pb2 as svc
from kvcache._proto.kvcache.v1 import kvcache_service_pb2_grpc as svc_grpc
from kvcache.errors import InvalidArgument

PathLike = Union[str, "os.PathLike[str]"]


@dataclasses.dataclass(frozen=True)
class Settings:
    target: str
    timeout: float
    max_attempts: int
    initial_backoff: float
    max_backoff: float
    metadata: Tuple[Tuple[str, str], ...]
    credentials: Optional[grpc.ChannelCredentials]
    options: List[Tuple[str, object]]
    token: Optional[str] = None  # the bearer token, also presented on the local socket
    # The TLS files (paths), also what a TLS transfer listener is verified with.
    tls_ca: Optional[str] = None
    tls_cert: Optional[str] = None
    tls_key: Optional[str] = None
    tls_server_name: Optional[str] = None


def _read(path: Optional[PathLike], what: str) -> Optional[bytes]:
    if path is None:
        return None
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise InvalidArgument(f"cannot read {what} {os.fspath(path)!r}: {e.strerror}") from None


def make_settings(target: str, *, timeout: float, max_attempts: int, initial_backoff: float,
                  max_backoff: float, tls_ca: Optional[PathLike], tls_cert: Optional[PathLike],
                  tls_key: Optional[PathLike], tls_server_name: Optional[str],
                  token: Optional[str], max_message_bytes: int) -> Settings:
    """Validates the options as the C++ client's Connect does (InvalidArgument if bad)."""
    if not target:
        raise InvalidArgument("target is empty")
    if max_attempts < 1:
        raise InvalidArgument(f"max_attempts is {max_attempts}; expected >= 1")
    if timeout <= 0:
        raise InvalidArgument(f"timeout is {timeout}; expected > 0 seconds")
    if (tls_cert is None) != (tls_key is None):
        raise InvalidArgument("tls_cert and tls_key go together (mTLS)")
    if (tls_cert is not None or tls_server_name is not None) and tls_ca is None:
        raise InvalidArgument("tls_cert, tls_key and tls_server_name need tls_ca (TLS is on "
                              "when tls_ca is set)")
    metadata: Tuple[Tuple[str, str], ...] = ()
    if token is not None:
        if not token or not all(0x21 <= ord(c) <= 0x7E for c in token):
            raise InvalidArgument("token must be non-empty printable ASCII without spaces")
        metadata = (("authorization", f"Bearer {token}"),)
    options: List[Tuple[str, object]] = [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", -1),  # the server bounds what it sends
    ]
    credentials = None
    if tls_ca is not None:
        credentials = grpc.ssl_channel_credentials(
            root_certificates=_read(tls_ca, "tls_ca"), private_key=_read(tls_key, "tls_key"),
            certificate_chain=_read(tls_cert, "tls_cert"))
        if tls_server_name:
            options.append(("grpc.ssl_target_name_override", tls_server_name))
    return Settings(target=target, timeout=timeout, max_attempts=max_attempts,
                    initial_backoff=initial_backoff, max_backoff=max_backoff, metadata=metadata,
                    credentials=credentials, options=options, token=token,
                    tls_ca=None if tls_ca is None else os.fspath(tls_ca),
                    tls_cert=None if tls_cert is None else os.fspath(tls_cert),
                    tls_key=None if tls_key is None else os.fspath(tls_key),
                    tls_server_name=tls_server_name or None)


def sequence_id(seq: object) -> str:
    """A sequence id from a str or anything with .sequence_id (SequenceInfo)."""
    if isinstance(seq, str):
        return seq
    sid = getattr(seq, "sequence_id", None)
    if isinstance(sid, str):
        return sid
    raise TypeError(f"expected a sequence id or a SequenceInfo, not {type(seq).__name__}")


def lease_id(lease: object) -> str:
    """A lease id from a str or a Lease (.lease_id)."""
    if isinstance(lease, str):
        return lease
    lid = getattr(lease, "lease_id", None)
    if isinstance(lid, str):
        return lid
    raise TypeError(f"expected a lease id or a Lease, not {type(lease).__name__}")


def methods(channel: Any) -> Dict[str, Any]:
    """Every KvCacheService and AdminService method of `channel` (a grpc or grpc.aio one) by
    name, the method names being unique across the two services; "Append" and
    "AppendStream" take requests already serialized by _codec.encode_append (one copy of the
    tensors)."""
    found = {**vars(svc_grpc.KvCacheServiceStub(channel)),
             **vars(admin_grpc.AdminServiceStub(channel))}
    found["Append"] = channel.unary_unary(_codec.KV_SERVICE + "Append", request_serializer=None,
                                          response_deserializer=svc.AppendResponse.FromString)
    found["AppendStream"] = channel.stream_unary(
        _codec.KV_SERVICE + "AppendStream", request_serializer=None,
        response_deserializer=svc.AppendStreamResponse.FromString)
    return found
