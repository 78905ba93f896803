"""TLS and mTLS with certificates from tests/security/make_certs.sh (made fresh here)."""

from __future__ import annotations

import subprocess

import numpy as np
import pytest

import kvcache
from conftest import HEAD_DIM, LAYERS, REPO, start


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory):
    d = tmp_path_factory.mktemp("tls")
    subprocess.run(["bash", str(REPO / "tests/security/make_certs.sh"), str(d / "certs")],
                   check=True, capture_output=True)
    c = d / "certs"
    s = start(d, f'tls {{ cert_file: "{c}/server.pem" key_file: "{c}/server.key" '
                 f'client_ca_file: "{c}/ca.pem" require_client_cert: true }}\n'
                 f'auth {{ client_identities {{ san: "spiffe://kvcache/tenant-a" '
                 f'tenant: "tenant-a" }} }}\n'
                 'transfer_listen: "127.0.0.1:0"\n')
    yield s, c
    s.stop()


def test_mtls_identity_and_refusals(tls) -> None:
    server, c = tls
    port = server.target.split(":")[1]
    with kvcache.Client(f"localhost:{port}", tls_ca=c / "ca.pem", tls_cert=c / "client-a.pem",
                        tls_key=c / "client-a.key") as client:
        assert client.create_sequence(pool="f16").tenant == "tenant-a"
    # An IP target with tls_server_name naming a SAN of the server certificate.
    with kvcache.Client(server.target, tls_ca=c / "ca.pem", tls_cert=c / "client-a.pem",
                        tls_key=c / "client-a.key", tls_server_name="localhost") as client:
        assert [p.name for p in client.list_pools()][0] == "f16"
    with kvcache.Client(server.target, tls_ca=c / "other-ca.pem", tls_cert=c / "client-a.pem",
                        tls_key=c / "client-a.key", max_attempts=1, timeout=5) as client:
        with pytest.raises(kvcache.Unavailable):  # the server's certificate is not trusted
            client.list_pools()
    with kvcache.Client(server.target, max_attempts=1, timeout=5) as plaintext:
        with pytest.raises(kvcache.Unavailable):
            plaintext.list_pools()


def test_transfers_run_under_the_listeners_tls(tls) -> None:
    """With tls, the transfer listener speaks TLS too (the same certificate, verified as
    gRPC's), and a fetch over it equals a gRPC fetch byte for byte."""
    server, c = tls
    mtls = dict(tls_ca=c / "ca.pem", tls_cert=c / "client-a.pem", tls_key=c / "client-a.key",
                tls_server_name="localhost")
    with kvcache.Client(server.target, **mtls) as via, \
            kvcache.Client(server.target, transfers=False, **mtls) as grpc_only:
        seq = via.create_sequence(pool="f16")
        rng = np.random.default_rng(5)
        for layer in range(LAYERS):
            kv = rng.standard_normal((300, 2, HEAD_DIM)).astype(np.float16)
            via.append(seq, layer, 0, kv, kv)
        got, want = via.fetch(seq), grpc_only.fetch(seq)
        assert via.data_path.startswith("transfer (127.0.0.1:") and \
            via.data_path.endswith(", TLS)"), via.data_path
        assert got.path == via.data_path and want.path.startswith("grpc (")
        assert got.heads.keys() == want.heads.keys()
        for key in want.heads:
            assert got[key].keys.tobytes() == want[key].keys.tobytes(), key
            assert got[key].values.tobytes() == want[key].values.tobytes(), key
