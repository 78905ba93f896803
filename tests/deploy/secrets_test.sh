#!/usr/bin/env bash
# deploy/k8s/make-secrets.sh, offline: what it writes is usable and its rotation flags do what
# docs/OPERATIONS.md says.
#  * the server certificate verifies against the CA bundle as a TLS server certificate, for
#    every name clients use (the Service, each pod's name under the headless Service, localhost,
#    127.0.0.1) and not for another namespace; its key matches; a real TLS handshake
#    (openssl s_server/s_client) verifies with the hostname check on;
#  * the client certificate verifies as a TLS client certificate and carries the SPIFFE SAN;
#  * the tokens file has the contract's format and each issued token hashes to its line
#    (SHA-256 of the salt bytes then the token bytes);
#  * the Secret manifests parse, have the right names, types and keys, and decode to the files;
#    kubectl's and the no-kubectl fallback's manifests agree;
#  * secrets are mode 0600 in 0700 directories;
#  * a re-run changes nothing; --renew-certs re-issues the certificate under the same CA;
#    --new-tokens keeps the old lines; --new-ca bundles the new and the previous CA.
# usage: secrets_test.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
make="$repo/deploy/k8s/make-secrets.sh"
fail() { echo "FAIL: $*" >&2; exit 1; }
command -v openssl >/dev/null || fail "openssl not found: run scripts/install_deps.sh"
tmp=$(mktemp -d)
server_pid=""
cleanup() {
  if [ -n "$server_pid" ]; then kill "$server_pid" 2>/dev/null || true; fi
  wait 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
venv=$("$here/make_venv.sh")
out="$tmp/out"

echo "== first run"
"$make" --namespace kvc-test --tenant team-a "$out" >/dev/null
grep -q -- '--renew-certs' <<<"$("$make" --help)" || fail "--help"
if "$make" --tenant 'bad name' "$tmp/bad" 2>/dev/null; then fail "accepted an invalid tenant name"; fi

echo "== certificates"
openssl verify -CAfile "$out/tls/ca.crt" -purpose sslserver "$out/tls/tls.crt" >/dev/null \
  || fail "server certificate does not verify against tls/ca.crt"
for name in kvcached.kvc-test.svc kvcached.kvc-test.svc.cluster.local kvcached-0.kvcached.kvc-test.svc \
            kvcached-2.kvcached.kvc-test.svc.cluster.local kvcached localhost; do
  openssl x509 -in "$out/tls/tls.crt" -noout -checkhost "$name" | grep -q 'does match' \
    || fail "server certificate does not cover $name"
done
openssl x509 -in "$out/tls/tls.crt" -noout -checkip 127.0.0.1 | grep -q 'does match' || fail "no IP SAN 127.0.0.1"
for name in kvcached.other.svc kvcached-0.kvcached.other.svc example.com; do
  openssl x509 -in "$out/tls/tls.crt" -noout -checkhost "$name" | grep -q 'does NOT match' \
    || fail "server certificate covers $name"
done
[ "$(openssl pkey -in "$out/tls/tls.key" -pubout)" = "$(openssl x509 -in "$out/tls/tls.crt" -noout -pubkey)" ] \
  || fail "tls.key is not the key of tls.crt"
openssl verify -CAfile "$out/tls/ca.crt" -purpose sslclient "$out/clients/team-a.crt" >/dev/null \
  || fail "client certificate does not verify as a TLS client certificate"
openssl x509 -in "$out/clients/team-a.crt" -noout -ext subjectAltName | grep -q 'URI:spiffe://kvcache/tenant/team-a' \
  || fail "client certificate lacks its SPIFFE SAN"
if openssl verify -CAfile "$out/tls/ca.crt" -purpose sslserver "$out/clients/team-a.crt" >/dev/null 2>&1; then
  fail "the client certificate is also a server certificate"
fi
echo "server and client certificates verify; SANs ok"

# A real handshake: s_client checks the chain and the hostname against the server's cert.
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
openssl s_server -accept "127.0.0.1:$port" -cert "$out/tls/tls.crt" -key "$out/tls/tls.key" \
  -quiet -naccept 1 >/dev/null 2>&1 &
server_pid=$!
handshake=""
for _ in $(seq 1 50); do
  handshake=$(echo | timeout 5 openssl s_client -connect "127.0.0.1:$port" -CAfile "$out/tls/ca.crt" \
    -verify_hostname kvcached-1.kvcached.kvc-test.svc -verify_return_error -brief 2>&1) && break
  handshake=""
  sleep 0.1
done
grep -q 'Verification: OK' <<<"$handshake" || fail "TLS handshake did not verify: $handshake"
echo "TLS handshake as kvcached-1.kvcached.kvc-test.svc: $(grep -m1 'Protocol version' <<<"$handshake")"

echo "== tokens"
check_tokens() {  # FILE TOKEN-FILE:TENANT:ROLE ...
  python3 - "$@" <<'PY'
import hashlib, re, sys
lines = [l.split() for l in open(sys.argv[1]) if l.strip() and not l.lstrip().startswith("#")]
for f in lines:
    assert len(f) == 4 and f[1] in ("tenant", "admin"), f"bad line {f}"
    assert re.fullmatch(r"[A-Za-z0-9._-]{1,64}", f[0]) and re.fullmatch(r"[0-9a-f]{32}", f[2]), f
    assert re.fullmatch(r"[0-9a-f]{64}", f[3]), f
for spec in sys.argv[2:]:
    path, tenant, role = spec.split(":")
    token = open(path).read().strip()
    assert len(token) >= 40, "token too short"
    match = [f for f in lines if hashlib.sha256(bytes.fromhex(f[2]) + token.encode()).hexdigest() == f[3]]
    assert len(match) == 1 and match[0][:2] == [tenant, role], f"{path}: {match}"
print(len(lines), "token lines")
PY
}
check_tokens "$out/auth/tokens" "$out/clients/admin.token:ops:admin" "$out/clients/team-a.token:team-a:tenant"
cp "$out/clients/admin.token" "$tmp/old-admin.token"
cp "$out/clients/team-a.token" "$tmp/old-team-a.token"

echo "== manifests"
check_manifests() {  # DIR
  "$venv/bin/python" - "$1" <<'PY'
import base64, os, sys, yaml
d = sys.argv[1]
want = {"kvcached-tls": ("kubernetes.io/tls", {"tls.crt": "tls/tls.crt", "tls.key": "tls/tls.key", "ca.crt": "tls/ca.crt"}),
        "kvcached-tokens": ("Opaque", {"tokens": "auth/tokens"}),
        "kvcache-client-team-a": ("Opaque", {"ca.crt": "tls/ca.crt", "token": "clients/team-a.token"})}
for name, (type_, keys) in want.items():
    (doc,) = list(yaml.safe_load_all(open(f"{d}/{name}.secret.yaml")))
    assert doc["kind"] == "Secret" and doc["metadata"]["name"] == name, doc["metadata"]
    assert doc["metadata"]["namespace"] == "kvc-test" and doc["type"] == type_, (name, doc["type"])
    assert set(doc["data"]) == set(keys), (name, sorted(doc["data"]))
    for k, f in keys.items():
        assert base64.b64decode(doc["data"][k]) == open(f"{d}/{f}", "rb").read(), (name, k)
print("3 Secret manifests: names, types, keys, contents ok")
PY
}
check_manifests "$out"
if command -v kubectl >/dev/null; then
  # The fallback without kubectl must write the same Secrets.
  cp -r "$out" "$tmp/nokubectl"
  KUBECTL=/nonexistent "$make" --namespace kvc-test --tenant team-a "$tmp/nokubectl" >/dev/null
  check_manifests "$tmp/nokubectl"
  for f in "$out"/*.secret.yaml; do
    "$venv/bin/python" -c 'import sys, yaml; a, b = (yaml.safe_load(open(p)) for p in sys.argv[1:]); sys.exit(a != b)' \
      "$f" "$tmp/nokubectl/$(basename "$f")" || fail "$(basename "$f"): kubectl and fallback differ"
  done
  echo "kubectl and the no-kubectl fallback write the same manifests"
else
  echo "SKIP: kubectl not found: only the fallback's manifests were checked"
fi
bad=$(find "$out" \( -type f ! -perm 600 \) -o \( -type d ! -perm 700 \))
[ -z "$bad" ] || fail "not private: $bad"

echo "== rotation"
cp -r "$out" "$tmp/before"
"$make" --namespace kvc-test --tenant team-a "$out" >/dev/null
for f in tls/tls.crt tls/tls.key tls/ca.crt auth/tokens ca/ca.key; do
  cmp -s "$out/$f" "$tmp/before/$f" || fail "a plain re-run changed $f"
done
"$make" --namespace kvc-test --tenant team-a --renew-certs "$out" >/dev/null
cmp -s "$out/tls/tls.crt" "$tmp/before/tls/tls.crt" && fail "--renew-certs kept the certificate"
cmp -s "$out/tls/ca.crt" "$tmp/before/tls/ca.crt" || fail "--renew-certs changed the CA"
openssl verify -CAfile "$tmp/before/tls/ca.crt" "$out/tls/tls.crt" >/dev/null || fail "renewed cert not under the old CA"
"$make" --namespace kvc-test --tenant team-a --new-tokens "$out" >/dev/null
check_tokens "$out/auth/tokens" "$tmp/old-admin.token:ops:admin" "$tmp/old-team-a.token:team-a:tenant" \
  "$out/clients/admin.token:ops:admin" "$out/clients/team-a.token:team-a:tenant"
cmp -s "$out/clients/admin.token" "$tmp/old-admin.token" && fail "--new-tokens kept the admin token"
"$make" --namespace kvc-test --tenant team-a --new-ca "$out" >/dev/null
cmp -s "$out/ca/ca.crt" "$tmp/before/ca/ca.crt" && fail "--new-ca kept the CA"
[ "$(grep -c 'BEGIN CERTIFICATE' "$out/tls/ca.crt")" = 2 ] || fail "--new-ca: tls/ca.crt is not new + old CA"
openssl verify -CAfile "$out/ca/ca.crt" "$out/tls/tls.crt" >/dev/null || fail "--new-ca: cert not under the new CA"
openssl verify -CAfile "$tmp/before/ca/ca.crt" "$out/tls/tls.crt" >/dev/null 2>&1 && fail "--new-ca: cert under the old CA"
# Clients that still hold the previous bundle trust the old CA only; the new bundle has both.
grep -q "$(sed -n 2p "$tmp/before/ca/ca.crt")" "$out/tls/ca.crt" || fail "--new-ca: old CA not in the bundle"
check_manifests "$out"
echo "re-run keeps everything; --renew-certs, --new-tokens, --new-ca ok"
echo "PASS: make-secrets.sh"
