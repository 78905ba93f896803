#!/usr/bin/env bash
# Creates (once) the Python venv the deploy tests use for offline Kubernetes schema validation
# and prints its path. Idempotent: a venv whose stamp matches the pinned requirements is reused.
#   usage: tests/deploy/make_venv.sh [VENV_DIR]   (default: REPO/.cache/venv-deploy)
# kubernetes-validate ships the Kubernetes OpenAPI schemas, so validation needs no cluster and
# no network; creating the venv needs PyPI once.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
venv=${1:-$repo/.cache/venv-deploy}
# protobuf 4.21.x is the Python runtime of protoc 3.21 (Debian 12's), which generates config_pb2.
requirements="kubernetes-validate==1.37.0 protobuf==4.21.12 PyYAML==6.0.2"
stamp="$venv/.kvc-requirements"
# ctest runs the deploy tests in parallel and each may call this: one makes the venv while the
# others wait on the lock, then find it made (without it, one would delete the venv another
# is filling).
mkdir -p "$(dirname "$venv")"
exec 9>"$venv.lock"
flock 9
if [ -x "$venv/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$requirements" ]; then
  echo "$venv"
  exit 0
fi
# Debian's interpreter: the one scripts/install_deps.sh provides (python3-venv).
python=/usr/bin/python3
[ -x "$python" ] || python=python3
rm -rf "$venv"
"$python" -m venv "$venv" >&2
# shellcheck disable=SC2086
"$venv/bin/pip" install --quiet --disable-pip-version-check $requirements >&2
echo "$requirements" >"$stamp"
echo "$venv"
