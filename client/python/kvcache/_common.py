"""What Client and AsyncClient share besides their calls (kvcache/_calls.py): construction
and options, the path strings, and the entry points of the streams. A driver supplies its
channel (`_open_channel`), its lock, its stream classes and `_chunks` (a Fetch stream as an
iterator, or an async iterator)."""

from __future__ import annotations

from typing import Any, Optional, Sequence, Tuple

from kvcache import _codec
from kvcache._calls import Calls
from kvcache._channel import PathLike, Settings, make_settings, methods, sequence_id
from kvcache.types import AppendStreamResult, DTypeLike


class ClientBase:
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
        ``authorization: Bearer <token>``. interceptors: grpc client interceptors (grpc.aio
        ones for AsyncClient).
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
        self._s = make_settings(
            target, timeout=timeout, max_attempts=max_attempts, initial_backoff=initial_backoff,
            max_backoff=max_backoff, tls_ca=tls_ca, tls_cert=tls_cert, tls_key=tls_key,
            tls_server_name=tls_server_name, token=token, max_message_bytes=max_message_bytes)
        self._channel, channel = self._open_channel(target, self._s, interceptors)
        self._methods = methods(channel)
        self._core = Calls(self._s, target, local_reads=local_reads, transfers=transfers,
                           client_decode=client_decode, staging_bytes=staging_bytes)

    def _open_channel(self, target: str, settings: Settings,
                      interceptors: Sequence[Any]) -> Tuple[Any, Any]:
        """The channel to close, and the one to call through (with the interceptors)."""
        raise NotImplementedError

    @property
    def data_path(self) -> str:
        """How fetch() moves bytes: "shared-memory (PATH)", "transfer (HOST:PORT)", or
        "grpc (why neither)". Decided on the first fetch. A fetch whose records this path
        cannot carry (low-bit ones without client_decode) goes over gRPC: its result's
        ``path`` says which path each fetch took."""
        return self._core.paths.data_path

    @property
    def append_path(self) -> str:
        """How append() and append_stream() move bytes: "staged (N-byte region)", or "grpc
        (why not staged)". Decided on the first append."""
        return self._core.paths.append_path

    def fetch_chunks(self, seq: Any, layers: Optional[Sequence[int]] = None,
                     dtype: DTypeLike = None, *, stored: bool = False,
                     include_unfinished: bool = False, max_chunk_bytes: int = 0,
                     tenant: str = "", timeout: Optional[float] = None) -> Any:
        """Streams the sequence's tokens chunk by chunk (one (layer, kv head, token range)
        each): an iterator (AsyncClient: an async iterator) of FetchedChunk. Closing it early
        (``.close()`` / ``await it.aclose()``, or leaving a loop over it and dropping it)
        cancels the call. Retried on UNAVAILABLE only before the first chunk. stored=True
        returns records as stored (uint8 [n, record_bytes])."""
        request = _codec.fetch_request(sequence_id(seq), layers, dtype, stored,
                                       include_unfinished, max_chunk_bytes, tenant)
        return self._chunks(request, self._core.timeout(timeout))  # type: ignore[attr-defined]

    def append_stream(self, *, timeout: Optional[float] = None) -> Any:
        """A client-streaming append for prefills; use as a context manager (``async with``
        on AsyncClient, whose append() and finish() are coroutines):

            with client.append_stream() as stream:
                for layer in range(num_layers):
                    stream.append(seq, layer, 0, k[layer], v[layer])
            stream.result.visible_tokens

        On the server's node (``append_path``) its messages are staged appends, up to 4 in
        flight (kvcache/_streams.py). `timeout` covers the stream."""
        return self._streams[0](self, timeout)  # type: ignore[attr-defined]

    def attend_session(self, *, timeout: Optional[float] = None) -> Any:
        """A bidirectional Attend stream for a decode loop (``async with`` on AsyncClient);
        `timeout` covers the session."""
        return self._streams[1](self, timeout)  # type: ignore[attr-defined]


class BoundStream:
    """A driver's stream object: the stream's calls (CALLS, kvcache/_streams.py), run by the
    client's driver. Not thread-safe."""

    CALLS: Any = None

    def __init__(self, client: Any, timeout: Optional[float]):
        self._drive = client._drive
        self._core = self.CALLS(client._core, timeout)

    def cancel(self) -> None:
        """Cancels the stream at once; what the server already applied stays applied."""
        self._core.cancel()

    @property
    def result(self) -> Optional[AppendStreamResult]:
        """An append stream's totals, once finish() returned them."""
        return getattr(self._core, "result", None)

