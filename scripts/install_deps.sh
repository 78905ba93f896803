#!/usr/bin/env bash
# Installs the Debian 12 packages kvcache needs to build and test. Idempotent: only
# packages that are missing are installed, so a second run costs about a second.
set -euo pipefail

# Build and test dependencies of the service, client and tests.
PACKAGES=(
  build-essential cmake ninja-build pkg-config git ca-certificates
  libgrpc++-dev libgrpc-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev prometheus-cpp-dev libgtest-dev libgmock-dev libbenchmark-dev
  clang-format python3 python3-pip
)
# Token hashing (libcrypto) and the TLS tests' certificates (openssl CLI).
PACKAGES+=(libssl-dev openssl)
# Prefix keys and block checksums of the prefix cache (XXH3).
PACKAGES+=(libxxhash-dev)
# Static checks of the test command: the clang-tsa preset (clang 14 thread-safety analysis,
# scripts/tsa_check.sh) and clang-tidy (scripts/tidy.sh).
PACKAGES+=(clang-14 clang-tidy-14)
# libFuzzer and clang's sanitizer runtimes (the fuzz preset, scripts/run_fuzzers.sh): only a
# Recommends of clang-14, which --no-install-recommends below leaves out.
PACKAGES+=(libclang-rt-14-dev)
# Reference worker (model engine): BLAS for the matrix products.
PACKAGES+=(libopenblas-dev)
# Reference worker fixtures (scripts/worker/make_fixtures.py builds its venv with it).
PACKAGES+=(python3-venv)
# Deploy checks (tests/deploy): Prometheus server + promtool, yamllint.
PACKAGES+=(prometheus yamllint)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install_deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "install_deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
