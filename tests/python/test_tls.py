"""TLS and mTLS with certificates from tests/security/make_certs.sh (made fresh here)."""

from __future__ import annotations

import subprocess

import pytest

import kvcache
from conftest import REPO, start


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory):
    d = tmp_path_factory.mktemp("tls")
    subprocess.run(["bash", str(REPO / "tests/security/make_certs.sh"), str(d / "certs")],
                   check=True, capture_output=True)
    c = d / "certs"
    s = start(d, f'tls {{ cert_file: "{c}/server.pem" key_file: "{c}/server.key" '
                 f'client_ca_file: "{c}/ca.pem" require_client_cert: true }}\n'
                 f'auth {{ client_identities {{ san: "spiffe://kvcache/tenant-a" '
                 f'tenant: "tenant-a" }} }}\n')
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
