"""A transfer frame changed on the way, in the clear or under TLS, reaches nothing the Python
client returns: the channel refuses it (DataLoss: the frame's tag, or TLS's record MAC, does
not match), the fetch goes over gRPC and returns the sequence's KV, and data_path says why.
The server advertises 127.0.0.2 for its channels (transfer_advertise_host), where a proxy
passes the reader's bytes as they are and flips one byte of the server's (the C++ readers:
tests/security/transfer_security_test.cc)."""

from __future__ import annotations

import pathlib
import re
import select
import socket
import subprocess
import threading
from typing import Dict, Iterator, List, Tuple

import pytest

import kvcache
from conftest import REPO, Server, start
from test_local_read import _filled, _same


class TamperProxy:
    """127.0.0.2:`port` to 127.0.0.1:`port`; byte `flip_at` of what the server sends (counted
    from the first, per connection; -1: none) arrives with every bit flipped."""

    def __init__(self, port: int, flip_at: int):
        self.flipped = 0
        self._port, self._flip_at = port, flip_at
        self._stop = threading.Event()
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.2", port))
        self._listener.listen(8)
        self._threads: List[threading.Thread] = []
        self._accept = threading.Thread(target=self._serve, daemon=True)
        self._accept.start()

    def close(self) -> None:
        self._stop.set()
        self._accept.join()
        for t in self._threads:
            t.join()
        self._listener.close()

    def _serve(self) -> None:
        while not self._stop.is_set():
            if not select.select([self._listener], [], [], 0.1)[0]:
                continue
            reader, _ = self._listener.accept()
            server = socket.create_connection(("127.0.0.1", self._port))
            for args in ((reader, server, -1), (server, reader, self._flip_at)):
                t = threading.Thread(target=self._pump, args=args, daemon=True)
                t.start()
                self._threads.append(t)

    def _pump(self, source: socket.socket, sink: socket.socket, flip_at: int) -> None:
        at = 0
        try:
            while not self._stop.is_set():
                if not select.select([source], [], [], 0.1)[0]:
                    continue
                chunk = bytearray(source.recv(65536))
                if not chunk:
                    break
                if at <= flip_at < at + len(chunk):
                    chunk[flip_at - at] ^= 0xFF
                    self.flipped += 1
                at += len(chunk)
                sink.sendall(chunk)
        except OSError:
            pass
        for s, how in ((sink, socket.SHUT_WR), (source, socket.SHUT_RD)):
            try:
                s.shutdown(how)
            except OSError:
                pass


@pytest.fixture(scope="module", params=["clear", "tls"])
def advertised(request: pytest.FixtureRequest,
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tuple[Server, Dict]]:
    """A kvcached whose channels are advertised at 127.0.0.2, and the client options to reach
    it; under TLS, certificates made fresh by tests/security/make_certs.sh."""
    d = tmp_path_factory.mktemp(f"kvcached-tamper-{request.param}")
    config = 'transfer_listen: "127.0.0.1:0"\ntransfer_advertise_host: "127.0.0.2"\n'
    options: Dict = {"local_reads": False}
    if request.param == "tls":
        subprocess.run(["bash", str(REPO / "tests/security/make_certs.sh"), str(d / "certs")],
                       check=True, capture_output=True)
        c = d / "certs"
        config += f'tls {{ cert_file: "{c}/server.pem" key_file: "{c}/server.key" }}\n'
        # The certificate names localhost and 127.0.0.1: the channel at 127.0.0.2 is checked
        # for the name gRPC's connection was checked for.
        options.update(tls_ca=c / "ca.pem", tls_server_name="localhost")
    s = start(d, config)
    yield s, options
    s.stop()


def _channel_port(c: kvcache.Client, seq: str) -> int:
    """The channel's port, from the reason a fetch with no proxy yet gives for using gRPC."""
    c.fetch(seq)
    found = re.search(r"cannot connect to transfer 127\.0\.0\.2:(\d+)", c.data_path)
    assert found, c.data_path
    return int(found.group(1))


def test_a_changed_frame_is_refused_and_nothing_of_it_is_used(
        advertised: Tuple[Server, Dict]) -> None:
    server, options = advertised
    tls = "tls_ca" in options
    with kvcache.Client(server.target, transfers=False, **options) as g:
        with kvcache.Client(server.target, **options) as c:
            seq = _filled(c, "f16", 300)
            want = g.fetch(seq)
            port = _channel_port(c, seq)
        # Unchanged, the proxy passes a whole fetch: what refuses below is the check.
        honest = TamperProxy(port, -1)
        try:
            with kvcache.Client(server.target, **options) as c:
                got = c.fetch(seq)
                assert got.path.startswith(f"transfer (127.0.0.2:{port}"), got.path
                _same(got, want)
        finally:
            honest.close()
        # One byte of the payload (in the clear: past "OK\n" and the 32-byte header; under TLS
        # well past the handshake, inside an application data record) arrives changed.
        tamper = TamperProxy(port, 30000 if tls else 3 + 32 + 100)
        try:
            with kvcache.Client(server.target, **options) as c:
                got = c.fetch(seq)
                assert tamper.flipped == 1
                _same(got, want)  # over gRPC: nothing of the changed frame
                assert got.path.startswith("grpc (the transfer channel broke: DATA_LOSS: "), \
                    got.path
                why = "a TLS record failed its integrity check" if tls else \
                    "a frame's MAC does not match its bytes"
                assert why in got.path, got.path
        finally:
            tamper.close()
