#!/usr/bin/env bash
# Static checks of deploy/ (no cluster, no Docker, no network once the venv exists):
#  1. yamllint (deploy/.yamllint) over every YAML file in deploy/;
#  2. `kubectl kustomize` of the base and every overlay (skipped with a message where kubectl is
#     absent -- it is not in Debian -- and the base's YAML files are validated directly instead);
#  3. offline schema validation of the rendered manifests (kubernetes-validate, strict) plus a
#     ServiceMonitor check, cross-object consistency and the pool config parsed against
#     proto/kvcache/v1/config.proto (validate_manifests.py); and a self-test that it rejects a
#     broken manifest;
#  4. promtool check rules + promtool test rules for deploy/prometheus/alerts*.yaml;
#  5. the Grafana dashboard: JSON structure, metric names, and every query as a recording rule
#     through `promtool check rules`;
#  6. the Dockerfiles (check_dockerfiles.py).
# usage: static_test.sh   (from anywhere; ctest runs it; KUBECTL=/nonexistent tries the no-kubectl path)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
cd "$repo"
fail() { echo "FAIL: $*" >&2; exit 1; }
need() { command -v "$1" >/dev/null || fail "$1 not found: run scripts/install_deps.sh (Debian package $2)"; }
need yamllint yamllint
need promtool prometheus
need protoc protobuf-compiler
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

echo "== yamllint"
yamllint --strict -c deploy/.yamllint deploy/

echo "== kustomize"
renders=()
kubectl=${KUBECTL:-kubectl}
if command -v "$kubectl" >/dev/null; then
  for dir in deploy/k8s/base deploy/k8s/overlays/*/; do
    dir=${dir%/}
    out="$tmp/$(echo "$dir" | tr / _).yaml"
    "$kubectl" kustomize "$dir" >"$out" || fail "kubectl kustomize $dir"
    echo "rendered $dir: $(grep -c '^kind:' "$out") objects"
    renders+=("$out")
  done
  kustomize_args=()
else
  echo "SKIP: kubectl not found (it is not packaged in Debian): overlays are not rendered;" \
       "validating deploy/k8s/base's YAML files directly instead"
  kustomize_args=(--kustomize-dir deploy/k8s/base)
fi

echo "== schema validation"
venv=$("$here/make_venv.sh")
mkdir -p "$tmp/pb"
protoc -I proto --python_out="$tmp/pb" proto/kvcache/v1/config.proto proto/kvcache/v1/types.proto
validate() { "$venv/bin/python" "$here/validate_manifests.py" --pb-dir "$tmp/pb" --k8s-version 1.32.0 "$@"; }
validate "${kustomize_args[@]}" "${renders[@]}"
# The validator must reject what it claims to: a string replica count, an unknown field,
# and a probe on the wrong port.
if [ ${#renders[@]} -gt 0 ]; then src=${renders[0]}; else src=deploy/k8s/base/statefulset.yaml; fi
for breakage in 's/^  replicas: .*/  replicas: "two"/' 's/^  serviceName: kvcached/  serviceName: kvcached\n  servicename: typo/' \
                's/^\( *\)port: 50051$/\1port: 50052/'; do
  if [ ${#renders[@]} -gt 0 ]; then
    changed="$tmp/broken.yaml"
    sed "$breakage" "$src" >"$changed"
    broken=("$changed")
  else
    cp -r deploy/k8s/base "$tmp/broken-base"
    changed="$tmp/broken-base/statefulset.yaml"
    sed -i "$breakage" "$changed"
    broken=(--kustomize-dir "$tmp/broken-base")
  fi
  cmp -s "$src" "$changed" && fail "self-test: '$breakage' changed nothing"
  if validate "${broken[@]}" >/dev/null 2>&1; then fail "validator accepted a manifest broken by '$breakage'"; fi
  rm -rf "$tmp/broken-base"
done
echo "validator rejects broken manifests: ok"

echo "== promtool: alert rules"
promtool check rules deploy/prometheus/alerts.yaml
promtool test rules deploy/prometheus/alerts_test.yaml

echo "== dashboard"
python3 "$here/prom_queries.py" check deploy/grafana/kvcache-dashboard.json deploy/prometheus/alerts.yaml \
  "$tmp/dashboard-rules.yaml"
promtool check rules "$tmp/dashboard-rules.yaml"

echo "== Dockerfiles"
python3 "$here/check_dockerfiles.py" "$repo"
echo "PASS: deploy static checks"
