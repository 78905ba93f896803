"""How Client and AsyncClient move bytes, decided once for both, without I/O ("sans-IO").

PathState holds the decision: the same-node reader (kvcache/_local.py) or else the transfer
channel (kvcache/_transfer.py) for reads, the staging region for appends, and the strings
``data_path`` / ``append_path`` report. Its methods are generators of the shared core's I/O
operations (kvcache/_ops.py): the I/O they need comes from `io` (PathIo, implemented by
kvcache/_calls.py), so the rules (when to decide again after a restart or a broken channel,
what each path string says) exist once.

The caller serializes the generators (_ops.Serialized): the state is not locked here.
"""

from __future__ import annotations

from typing import Any, Optional, Protocol

from kvcache._local import LocalReader, StagingSpace, server_info_failed
from kvcache._ops import Step
from kvcache._transfer import TransferReader
from kvcache._transfer import refused as transfer_refused
from kvcache._transfer import should_open as transfer_should_open
from kvcache.errors import KvCacheError
from kvcache.types import FetchResult


class PathIo(Protocol):
    def server_info(self, timeout: Optional[float]) -> Step[Any]:
        """AdminService.GetServerInfo, retried as reads are."""

    def connect_local(self, info: Any) -> Step[Any]:
        """_local.connect_local(info, ...): (LocalReader or None, data_path)."""

    def open_transfer(self, timeout: Optional[float]) -> Step[TransferReader]:
        """A transfer channel (OpenTransfer, then connect)."""

    def open_staging(self, local: LocalReader, nbytes: int) -> Step[StagingSpace]:
        """local.open_staging(nbytes)."""


class PathState:
    def __init__(self, io: PathIo, local_reads: bool, transfers: bool, staging_bytes: int):
        self.io = io
        self.local_reads = local_reads
        self.transfers = transfers
        self.staging_bytes = staging_bytes
        self.local: Optional[LocalReader] = None
        self.transfer: Optional[TransferReader] = None
        self.decided = not local_reads and not transfers
        self.data_path = ("grpc (local_reads and transfers are off)" if self.decided
                          else "grpc (no fetch yet)")
        self.staging: Optional[StagingSpace] = None
        self.staging_decided = False
        self.append_path = "grpc (no append yet)"

    def read(self, timeout: Optional[float]) -> Step[Optional[LocalReader]]:
        """The same-node reader to read through, or None (then `transfer`, if set, else
        gRPC). Decides on the first call and again once the socket or the channel broke
        (a server restart: its mappings and staging region are of memory it no longer
        serves)."""
        if self.decided and self.transfer is not None:
            if self.transfer.alive():
                return None
            self.transfer.close()  # the channel broke (or the server hung up): decide again
            self.transfer, self.decided = None, False
        elif self.decided and (self.local is None or self.local.alive()):
            return self.local
        elif self.decided:
            assert self.local is not None
            self.local.close()
            self.local, self.decided = None, False
            self.staging, self.staging_decided = None, False
            self.append_path = "grpc (no append since the local socket closed)"
        try:
            info = yield from self.io.server_info(timeout)
        except KvCacheError as e:
            # Unreachable: the next fetch asks again.
            self.decided, self.data_path = server_info_failed(e)
            return None
        self.decided = True
        self.local, self.data_path = yield from self.io.connect_local(info)
        if self.local is not None:
            return self.local
        # No same-node path: a transfer channel, if the server offers one.
        open_one, self.data_path = transfer_should_open(info, self.transfers, self.data_path)
        if open_one:
            try:
                self.transfer = yield from self.io.open_transfer(timeout)
                self.data_path = f"transfer ({self.transfer.where})"
            except KvCacheError as e:
                self.data_path = transfer_refused(self.data_path, e)
        return None

    def staged(self, timeout: Optional[float]) -> Step[Optional[StagingSpace]]:
        """The staging region appends copy into, or None (gRPC). Decided on the first
        append, and again after the read path was decided again."""
        if self.staging_bytes <= 0:
            self.staging_decided = True
            self.append_path = "grpc (staging_bytes is 0)"
            return None
        local = yield from self.read(timeout)  # every time: a restart drops the old region too
        if self.staging_decided:
            return self.staging
        if local is None:
            # Undecided while the server is unreachable, as the read path is.
            self.staging_decided = self.decided
            self.append_path = ("grpc (no same-node path; transfer channels carry reads only)"
                                if self.transfer is not None else self.data_path)
            return None
        self.staging_decided = True
        try:
            self.staging = yield from self.io.open_staging(local, self.staging_bytes)
        except KvCacheError as e:
            self.append_path = f"grpc ({e.message})"
            return None
        self.append_path = f"staged ({self.staging.size}-byte region)"
        return self.staging

    def close(self) -> None:
        if self.local is not None:
            self.local.close()
        if self.transfer is not None:
            self.transfer.close()


def grpc_result(result: FetchResult, why: str, data_path: str) -> FetchResult:
    """`result` (assembled from a gRPC Fetch) with its path said: why it did not take the
    decided path, or the decision's own reason when gRPC is what was decided."""
    result.path = f"grpc ({why})" if why else data_path
    return result
