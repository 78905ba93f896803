#!/usr/bin/env bash
# make_certs.sh OUTDIR: the certificates the TLS tests and the TLS benchmark use, made fresh
# with the openssl CLI (nothing secret is checked in, and nothing expires in the repository).
#
#   ca.pem / ca.key                 the deployment's CA
#   other-ca.pem / other-ca.key     an unrelated CA (trusting it must not be enough)
#   server.{pem,key}                kvcached: SAN IP 127.0.0.1, DNS localhost
#   server-rotated.{pem,key}        the next server pair: the same SANs plus DNS rotated.kvcache.test
#   server-expired.{pem,key}        valid only in January 2020
#   client-a.{pem,key}              SAN URI spiffe://kvcache/tenant-a
#   client-b.{pem,key}              SAN DNS tenant-b.example
#   client-expired.{pem,key}        SAN URI spiffe://kvcache/tenant-a, valid only in January 2020
#   client-other-ca.{pem,key}       SAN URI spiffe://kvcache/tenant-a, signed by other-ca
#
# EC P-256 keys: quick to make, and what gRPC's TLS stacks all accept. OpenSSL 3.0 has no
# -not_before for `openssl x509`, so the expired ones go through `openssl ca`.
set -euo pipefail
out=${1:?usage: make_certs.sh OUTDIR}
mkdir -p "$out"
cd "$out"
command -v openssl >/dev/null || { echo "make_certs.sh: openssl not on PATH" >&2; exit 1; }

key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }

cat > ext.cnf <<'CNF'
[ca_ext]
basicConstraints = critical, CA:true
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
[server_ext]
basicConstraints = critical, CA:false
keyUsage = critical, digitalSignature
extendedKeyUsage = serverAuth
subjectAltName = IP:127.0.0.1, DNS:localhost
[rotated_ext]
basicConstraints = critical, CA:false
keyUsage = critical, digitalSignature
extendedKeyUsage = serverAuth
subjectAltName = IP:127.0.0.1, DNS:localhost, DNS:rotated.kvcache.test
[client_a_ext]
basicConstraints = critical, CA:false
keyUsage = critical, digitalSignature
extendedKeyUsage = clientAuth
subjectAltName = URI:spiffe://kvcache/tenant-a
[client_b_ext]
basicConstraints = critical, CA:false
keyUsage = critical, digitalSignature
extendedKeyUsage = clientAuth
subjectAltName = DNS:tenant-b.example
CNF

ca() {  # ca NAME SUBJECT
  key "$1.key"
  openssl req -x509 -new -key "$1.key" -subj "$2" -days 3650 -sha256 \
    -addext "basicConstraints=critical,CA:true" -addext "keyUsage=critical,keyCertSign,cRLSign" \
    -out "$1.pem"
}

leaf() {  # leaf NAME CN CA EXTENSIONS
  key "$1.key"
  openssl req -new -key "$1.key" -subj "/CN=$2" -out "$1.csr"
  openssl x509 -req -in "$1.csr" -CA "$3.pem" -CAkey "$3.key" -CAcreateserial -days 825 \
    -sha256 -extfile ext.cnf -extensions "$4" -out "$1.pem" 2>/dev/null
  rm -f "$1.csr"
}

expired() {  # expired NAME CN CA EXTENSIONS: valid 2020-01-01 .. 2020-02-01 only
  key "$1.key"
  openssl req -new -key "$1.key" -subj "/CN=$2" -out "$1.csr"
  mkdir -p ca-db
  : > ca-db/index.txt
  [ -f ca-db/serial ] || echo 1000 > ca-db/serial
  cat > ca-db/ca.cnf <<CNF
[ca]
default_ca = kvc_ca
[kvc_ca]
database = ca-db/index.txt
new_certs_dir = ca-db
serial = ca-db/serial
default_md = sha256
policy = any
unique_subject = no
[any]
commonName = supplied
CNF
  openssl ca -batch -notext -config ca-db/ca.cnf -cert "$3.pem" -keyfile "$3.key" \
    -in "$1.csr" -out "$1.pem" -startdate 20200101000000Z -enddate 20200201000000Z \
    -extfile ext.cnf -extensions "$4" 2>/dev/null
  rm -f "$1.csr"
}

ca ca "/CN=kvcache test CA"
ca other-ca "/CN=unrelated test CA"
leaf server kvcached ca server_ext
leaf server-rotated kvcached-rotated ca rotated_ext
expired server-expired kvcached-expired ca server_ext
leaf client-a tenant-a ca client_a_ext
leaf client-b tenant-b ca client_b_ext
expired client-expired tenant-a-expired ca client_a_ext
leaf client-other-ca tenant-a other-ca client_a_ext
rm -rf ca-db ext.cnf ./*.srl
