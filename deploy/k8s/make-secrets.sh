#!/usr/bin/env bash
# Makes the credentials kvcached's manifests mount, so that no secret is ever committed:
#
#   make-secrets.sh [options] OUT_DIR
#
# First run on an empty OUT_DIR:
#   OUT_DIR/ca/ca.crt, ca.key           a private CA (the key stays here: it signs renewals)
#   OUT_DIR/tls/tls.crt, tls.key        kvcached's server certificate, for the Service's DNS names
#                                       (kvcached.NS.svc, *.kvcached.NS.svc for each pod, their
#                                       .cluster.local forms) plus localhost/127.0.0.1 for
#                                       `kubectl port-forward`
#   OUT_DIR/tls/ca.crt                  the CA bundle clients verify the server with
#   OUT_DIR/auth/tokens                 tokens file: lines "tenant role salt-hex sha256-hex"
#   OUT_DIR/clients/admin.token         the admin bearer token (tenant "ops", role admin)
#   OUT_DIR/clients/TENANT.token        a tenant bearer token (role tenant)
#   OUT_DIR/clients/TENANT.crt, .key    an mTLS client certificate for TENANT
#                                       (SAN URI spiffe://kvcache/tenant/TENANT)
#   OUT_DIR/kvcached-tls.secret.yaml    Secret kvcached-tls (type kubernetes.io/tls:
#                                       tls.crt, tls.key, ca.crt), mounted by the StatefulSet
#   OUT_DIR/kvcached-tokens.secret.yaml Secret kvcached-tokens (key `tokens`), mounted too
#   OUT_DIR/kvcache-client-TENANT.secret.yaml
#                                       Secret for TENANT's client pods: ca.crt and `token`
# On a later run the files already there are kept and the manifests are re-rendered from them
# (edit OUT_DIR/auth/tokens, re-run, apply), unless asked for something new:
#   --renew-certs   re-issue the server and client certificates from the existing CA
#   --new-ca        a new CA, then --renew-certs; tls/ca.crt bundles the new and the old CA so
#                   clients that trust either keep connecting while they are updated
#   --new-tokens    append a fresh admin and tenant token to auth/tokens; the old lines stay
#                   valid until removed (docs/OPERATIONS.md, "Rotating tokens")
# Other options:
#   --namespace NS        namespace of the Secrets and of the DNS names (default kvcache)
#   --service NAME        the headless Service's name (default kvcached)
#   --cluster-domain D    (default cluster.local)
#   --tenant T            the tenant of the generated tenant token and client cert (default demo)
#   --days N              certificate lifetime (default 365; the CA gets 10 years)
#   --apply               also `kubectl apply` the Secret manifests (server-side); not with --new-ca
# The manifests are `kubectl create secret ... --dry-run=client -o yaml` (offline); without
# kubectl an equivalent manifest is written by python3. Everything is created mode 0600/0700:
# the manifests and OUT_DIR hold the secrets in the clear. Needs openssl and python3.
set -euo pipefail
umask 077

fail() { echo "make-secrets.sh: $*" >&2; exit 1; }
namespace=kvcache service=kvcached domain=cluster.local tenant=demo days=365
renew=0 new_ca=0 new_tokens=0 apply=0 out=""
while [ $# -gt 0 ]; do
  case "$1" in
    --namespace) namespace=${2:?}; shift 2 ;;
    --service) service=${2:?}; shift 2 ;;
    --cluster-domain) domain=${2:?}; shift 2 ;;
    --tenant) tenant=${2:?}; shift 2 ;;
    --days) days=${2:?}; shift 2 ;;
    --renew-certs) renew=1; shift ;;
    --new-ca) new_ca=1; renew=1; shift ;;
    --new-tokens) new_tokens=1; shift ;;
    --apply) apply=1; shift ;;
    -h|--help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) fail "unknown option $1 (see --help)" ;;
    *) [ -z "$out" ] || fail "one OUT_DIR only"; out=$1; shift ;;
  esac
done
[ -n "$out" ] || fail "usage: make-secrets.sh [options] OUT_DIR (see --help)"
# Tenant names as the server accepts them (config.proto: [A-Za-z0-9._-], 1-64 characters).
[[ "$tenant" =~ ^[A-Za-z0-9._-]{1,64}$ ]] || fail "--tenant must be [A-Za-z0-9._-]{1,64}"
[[ "$days" =~ ^[1-9][0-9]*$ ]] || fail "--days must be a positive integer"
command -v openssl >/dev/null || fail "openssl not found (scripts/install_deps.sh installs it)"
command -v python3 >/dev/null || fail "python3 not found"
kubectl=${KUBECTL:-kubectl}
command -v "$kubectl" >/dev/null || kubectl=""
[ "$apply" = 0 ] || [ -n "$kubectl" ] || fail "--apply needs kubectl"
# A new CA must reach the clients (kvcache-client-* Secrets, the bundle) before kvcached serves
# a certificate they cannot verify yet: the operator applies the manifests in two steps.
[ "$apply" = 0 ] || [ "$new_ca" = 0 ] || fail "--new-ca with --apply would break clients that still trust" \
  "only the old CA: apply kvcache-client-*.secret.yaml first, then kvcached-tls (docs/OPERATIONS.md)"

mkdir -p "$out"/{ca,tls,auth,clients}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Our own openssl config, so the system's openssl.cnf cannot add or duplicate extensions.
cat >"$tmp/openssl.cnf" <<EOF
[req]
distinguished_name = dn
prompt = no
[dn]
CN = unused
[ca]
basicConstraints = critical, CA:TRUE, pathlen:0
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
[server]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
subjectAltName = DNS:$service, DNS:$service.$namespace, DNS:$service.$namespace.svc, DNS:$service.$namespace.svc.$domain, DNS:*.$service.$namespace.svc, DNS:*.$service.$namespace.svc.$domain, DNS:localhost, IP:127.0.0.1
[client]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = clientAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
subjectAltName = URI:spiffe://kvcache/tenant/$tenant
EOF

# ECDSA P-256: supported by every TLS stack gRPC uses, and fast to make.
newkey() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }
# issue KEY CRT SUBJECT SECTION: a certificate for KEY signed by the CA.
issue() {
  openssl req -new -config "$tmp/openssl.cnf" -key "$1" -subj "$3" -out "$tmp/req.csr"
  openssl x509 -req -in "$tmp/req.csr" -CA "$out/ca/ca.crt" -CAkey "$out/ca/ca.key" \
    -set_serial "0x$(openssl rand -hex 16)" -days "$days" -sha256 \
    -extfile "$tmp/openssl.cnf" -extensions "$4" -out "$2" 2>/dev/null
}

if [ ! -s "$out/ca/ca.key" ] || [ "$new_ca" = 1 ]; then
  [ -s "$out/ca/ca.crt" ] && cp "$out/ca/ca.crt" "$tmp/old-ca.crt"
  newkey "$out/ca/ca.key"
  openssl req -x509 -new -config "$tmp/openssl.cnf" -key "$out/ca/ca.key" -days 3650 -sha256 \
    -subj "/O=kvcache/CN=kvcache CA $(date -u +%Y-%m-%d)" -extensions ca -out "$out/ca/ca.crt"
  # The bundle clients trust: the new CA, then the one it replaces (if any) -- only the most
  # recent previous CA, so a second rotation drops the oldest.
  cp "$out/ca/ca.crt" "$out/tls/ca.crt"
  [ -s "$tmp/old-ca.crt" ] && openssl x509 -in "$tmp/old-ca.crt" >>"$out/tls/ca.crt"
  renew=1
  echo "CA: $out/ca/ca.crt"
fi
[ -s "$out/tls/ca.crt" ] || cp "$out/ca/ca.crt" "$out/tls/ca.crt"

if [ ! -s "$out/tls/tls.crt" ] || [ "$renew" = 1 ]; then
  newkey "$tmp/tls.key"
  issue "$tmp/tls.key" "$tmp/tls.crt" "/O=kvcache/CN=$service.$namespace.svc" server
  # Key and certificate are replaced together (two renames right after each other) so a
  # reader never sees a new key with an old certificate for long; in the pod the kubelet swaps
  # the whole Secret volume at once anyway.
  mv "$tmp/tls.key" "$out/tls/tls.key"
  mv "$tmp/tls.crt" "$out/tls/tls.crt"
  newkey "$tmp/client.key"
  issue "$tmp/client.key" "$tmp/client.crt" "/O=kvcache/CN=$tenant" client
  mv "$tmp/client.key" "$out/clients/$tenant.key"
  mv "$tmp/client.crt" "$out/clients/$tenant.crt"
  echo "server certificate: $out/tls/tls.crt ($(openssl x509 -in "$out/tls/tls.crt" -noout -enddate))"
fi

# add_token TENANT ROLE FILE: a random token into FILE and its salted hash into auth/tokens
# (the line `kvcachectl hash-token` prints: SHA-256 over the salt bytes then the token bytes).
add_token() {
  python3 - "$1" "$2" "$3" "$out/auth/tokens" <<'EOF'
import hashlib, os, secrets, sys, time
tenant, role, token_path, tokens_path = sys.argv[1:]
token = secrets.token_urlsafe(32)  # 256 bits
salt = os.urandom(16)
digest = hashlib.sha256(salt + token.encode()).hexdigest()
with open(token_path, "w") as f:
    f.write(token + "\n")
with open(tokens_path, "a") as f:
    f.write(f"# {tenant} ({role}), added {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC\n")
    f.write(f"{tenant} {role} {salt.hex()} {digest}\n")
EOF
  echo "token for $1 ($2): $3"
}
if [ ! -s "$out/auth/tokens" ]; then
  printf '%s\n' "# kvcached tokens file: tenant role salt-hex sha256-hex (made by make-secrets.sh)" \
    >"$out/auth/tokens"
  new_tokens=1
fi
if [ "$new_tokens" = 1 ]; then
  add_token ops admin "$out/clients/admin.token"
  add_token "$tenant" tenant "$out/clients/$tenant.token"
fi
[ -s "$out/clients/$tenant.token" ] || fail "no token file $out/clients/$tenant.token: run with --new-tokens"

# secret_yaml NAME TYPE OUTFILE KEY=FILE...: the Secret manifest, as kubectl writes it offline.
secret_yaml() {
  local name=$1 type=$2 file=$3
  shift 3
  if [ -n "$kubectl" ]; then
    local args=()
    for kv in "$@"; do args+=("--from-file=$kv"); done
    "$kubectl" create secret generic "$name" --type="$type" --namespace="$namespace" "${args[@]}" \
      --dry-run=client -o yaml >"$file"
  else
    python3 - "$name" "$type" "$namespace" "$@" >"$file" <<'EOF'
import base64, sys
name, type_, ns, *pairs = sys.argv[1:]
print("apiVersion: v1\ndata:")
for kv in sorted(pairs):
    key, path = kv.split("=", 1)
    print(f"  {key}: {base64.b64encode(open(path, 'rb').read()).decode()}")
print(f"kind: Secret\nmetadata:\n  creationTimestamp: null\n  name: {name}\n  namespace: {ns}\ntype: {type_}")
EOF
  fi
}
secret_yaml kvcached-tls kubernetes.io/tls "$out/kvcached-tls.secret.yaml" \
  "tls.crt=$out/tls/tls.crt" "tls.key=$out/tls/tls.key" "ca.crt=$out/tls/ca.crt"
secret_yaml kvcached-tokens Opaque "$out/kvcached-tokens.secret.yaml" "tokens=$out/auth/tokens"
secret_yaml "kvcache-client-$tenant" Opaque "$out/kvcache-client-$tenant.secret.yaml" \
  "ca.crt=$out/tls/ca.crt" "token=$out/clients/$tenant.token"
echo "manifests: $out/kvcached-tls.secret.yaml $out/kvcached-tokens.secret.yaml" \
  "$out/kvcache-client-$tenant.secret.yaml"

if [ "$apply" = 1 ]; then
  # Server-side apply: client-side apply would copy the whole Secret, keys included, into the
  # kubectl.kubernetes.io/last-applied-configuration annotation.
  "$kubectl" apply --server-side --field-manager=make-secrets --namespace="$namespace" \
    -f "$out/kvcached-tls.secret.yaml" -f "$out/kvcached-tokens.secret.yaml" \
    -f "$out/kvcache-client-$tenant.secret.yaml"
fi
