"""Fixtures: real kvcached processes on 127.0.0.1 port 0 (tests/testing/start_kvcached.sh in
Python). The binary is $KVCACHED, else build/cachesvc/kvcached under the repository root; a
missing binary fails the tests (it never skips them)."""

from __future__ import annotations

import contextlib
import hashlib
import os
import pathlib
import re
import secrets
import subprocess
import threading
import time
import urllib.request
from typing import Any, Iterator, List

import numpy as np
import pytest

import kvcache

REPO = pathlib.Path(__file__).resolve().parents[2]
LISTENING = re.compile(r"kvcached listening on (127\.0\.0\.1:\d+)")
METRICS = re.compile(r"metrics on (http://127\.0\.0\.1:\d+/metrics)")

# Small pools: 4 layers x 2 kv heads (4 query heads) x head_dim 32, one per dtype.
GEOMETRY = "num_layers: 4 num_kv_heads: 2 num_query_heads: 4 head_dim: 32"
LAYERS, KV_HEADS, Q_HEADS, HEAD_DIM = 4, 2, 4, 32
POOLS = """
pools { name: "f16" capacity_bytes: 33554432
        geometry { %(g)s dtype: DTYPE_F16 rope { theta: 10000 } } }
pools { name: "bf16" capacity_bytes: 16777216 geometry { %(g)s dtype: DTYPE_BF16 } }
pools { name: "f32" capacity_bytes: 16777216 geometry { %(g)s dtype: DTYPE_F32 } }
pools { name: "tiny" capacity_bytes: 65536 geometry { %(g)s dtype: DTYPE_F16 } }
""" % {"g": GEOMETRY}


def kvcached_binary() -> pathlib.Path:
    path = pathlib.Path(os.environ.get("KVCACHED", REPO / "build" / "cachesvc" / "kvcached"))
    if not path.is_absolute():
        path = REPO / path
    if not os.access(path, os.X_OK):
        pytest.fail(f"kvcached not found at {path}: build it (cmake --preset default) or set "
                    "KVCACHED", pytrace=False)
    return path


class Server:
    """A running kvcached; `target` is host:port, `log` what it wrote to stderr so far."""

    def __init__(self, config: pathlib.Path, listen: str = "127.0.0.1:0"):
        self.proc = subprocess.Popen(
            [str(kvcached_binary()), f"--listen={listen}", "--metrics_listen=127.0.0.1:0",
             f"--config={config}"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.lines: List[str] = []
        found = threading.Event()
        self.target = ""

        def read() -> None:
            for line in self.proc.stderr:  # type: ignore[union-attr]
                self.lines.append(line)
                m = LISTENING.search(line)
                if m and not self.target:
                    self.target = m.group(1)
                    found.set()
            found.set()

        threading.Thread(target=read, daemon=True).start()
        if not found.wait(15) or not self.target:
            self.stop()
            raise RuntimeError("kvcached did not start:\n" + "".join(self.lines))

    @property
    def log(self) -> str:
        return "".join(self.lines)

    def rpc_count(self, method: str) -> int:
        """kvc_rpc_requests_total of `method` (every status code), from the server's
        Prometheus endpoint."""
        m = METRICS.search(self.log)
        assert m, "kvcached logged no metrics address"
        text = urllib.request.urlopen(m.group(1), timeout=10).read().decode()
        pattern = re.compile(r'^kvc_rpc_requests_total\{[^}]*method="' + re.escape(method) +
                             r'"[^}]*\} (\S+)$', re.M)
        return int(sum(float(v) for v in pattern.findall(text)))

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


def start(tmp: pathlib.Path, extra_config: str = "", listen: str = "127.0.0.1:0") -> Server:
    """kvcached with the test pools and `extra_config`, on `listen` (a free port by default;
    an earlier server's target to restart it there)."""
    config = tmp / "kvcached.textproto"
    config.write_text(POOLS + extra_config)
    return Server(config, listen)


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = start(tmp_path_factory.mktemp("kvcached"))
    yield s
    s.stop()


@pytest.fixture()
def client(server: Server) -> Iterator[kvcache.Client]:
    with kvcache.Client(server.target, timeout=20) as c:
        yield c


def token_line(tenant: str, role: str, token: str) -> str:
    """A tokens-file line: tenant role salt-hex sha256(salt || token)-hex."""
    salt = secrets.token_bytes(16)
    return f"{tenant} {role} {salt.hex()} {hashlib.sha256(salt + token.encode()).hexdigest()}\n"


@pytest.fixture(scope="module")
def auth_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("kvcached-auth")
    tokens = tmp / "tokens"
    tokens.write_text(token_line("alice", "tenant", "alice-token") +
                      token_line("bob", "tenant", "bob-token") +
                      token_line("ops", "admin", "ops-token"))
    s = start(tmp, f'auth {{ tokens_file: "{tokens}" }}\n')
    yield s
    s.stop()


def random_kv(n: int, dtype: np.dtype = np.float16, seed: int = 0) -> np.ndarray:
    """[n, kv_heads, head_dim] N(0, 1) values in `dtype`."""
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, KV_HEADS, HEAD_DIM)).astype(dtype)


def wait_until(predicate, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


@contextlib.contextmanager
def threads_calling(owner: Any, name: str) -> Iterator[List[int]]:
    """The thread of every call of owner.name (a class's method) while the block runs: an
    asyncio client's blocking work must never run on the event loop's thread."""
    threads: List[int] = []
    real = getattr(owner, name)

    def spy(*args: Any, **kwargs: Any) -> Any:
        threads.append(threading.get_ident())
        return real(*args, **kwargs)

    setattr(owner, name, spy)
    try:
        yield threads
    finally:
        setattr(owner, name, real)


def fill_after_restart(c: kvcache.Client) -> str:
    """After kvcached was started again at the client's address: waits for the client to
    reconnect, appends 40 tokens of KV the old server never held to a new f16 sequence (the new
    server hands out the old one's block ids again) and checks that fetch returns exactly
    them, whatever path it takes. Returns the sequence."""
    deadline = time.monotonic() + 20
    while True:  # the gRPC channel reconnects with its backoff
        try:
            seq = c.create_sequence(pool="f16").sequence_id
            break
        except kvcache.Unavailable:
            assert time.monotonic() < deadline, "the client never reconnected"
            time.sleep(0.1)
    for layer in range(LAYERS):
        k = random_kv(40, dtype=np.float16, seed=100 + layer)
        v = random_kv(40, dtype=np.float16, seed=200 + layer)
        c.append(seq, layer, 0, k, v)
    got = c.fetch(seq)
    for layer in range(LAYERS):
        for head in range(KV_HEADS):
            want = random_kv(40, dtype=np.float16, seed=100 + layer)[:, head, :]
            assert np.array_equal(got[(layer, head)].keys, want), (layer, head)
    return seq
