#!/usr/bin/env bash
# Static checks of deploy/ (no cluster, no Docker, no network once the venv exists):
#  1. yamllint (deploy/.yamllint) over every YAML file in deploy/;
#  2. `kubectl kustomize` of the base and every overlay (skipped with a message where kubectl is
#     absent -- it is not in Debian -- and the base's YAML files are validated directly instead);
#  3. offline schema validation of the rendered manifests (kubernetes-validate, strict) plus a
#     ServiceMonitor check, cross-object consistency, the pool config parsed against
#     proto/kvcache/v1/config.proto, and security: TLS + auth on a non-loopback listen, the
#     Secrets make-secrets.sh writes mounted read-only where the config names them, probes that
#     work with TLS, the NetworkPolicy, a distinct shard per pod (--shard=$(POD_NAME)) and a
#     headless Service that drops not-ready pods from DNS (validate_manifests.py); for the
#     cluster overlay also 3 replicas, topology spread over nodes and zones and the
#     PodDisruptionBudget (--cluster); for the same-node overlay a per-pod local socket in a
#     writable hostPath prepared by an init container, with engine uids allowed; every shipped textproto and each image's baked config on
#     its own; and a self-test that the validator rejects broken manifests and cluster overlays;
#  4. promtool check rules + promtool test rules for deploy/prometheus/alerts*.yaml;
#  5. the Grafana dashboard: JSON structure, metric names, and every query as a recording rule
#     through `promtool check rules`; the per-shard queries evaluated by `promtool test rules`
#     (dashboard_shard_test.yaml);
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
need openssl openssl  # deploy/k8s/make-secrets.sh
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

echo "== yamllint"
yamllint --strict -c deploy/.yamllint deploy/

echo "== kustomize"
renders=()
cluster=()  # the cluster overlay's rendering, validated with --cluster (replicas, spread, budget)
same_node=""  # the same-node overlay's rendering (local socket), for its self-test below
kubectl=${KUBECTL:-kubectl}
if command -v "$kubectl" >/dev/null; then
  for dir in deploy/k8s/base deploy/k8s/overlays/*/; do
    dir=${dir%/}
    out="$tmp/$(echo "$dir" | tr / _).yaml"
    "$kubectl" kustomize "$dir" >"$out" || fail "kubectl kustomize $dir"
    echo "rendered $dir: $(grep -c '^kind:' "$out") objects"
    if [ "$dir" = deploy/k8s/overlays/cluster ]; then cluster=(--cluster "$out"); else renders+=("$out"); fi
    if [ "$dir" = deploy/k8s/overlays/same-node ]; then same_node=$out; fi
  done
  [ ${#cluster[@]} -gt 0 ] || fail "deploy/k8s/overlays/cluster was not rendered"
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
# The Secrets as make-secrets.sh writes them (throwaway keys in $tmp): their manifests are
# validated too, and the mounts are checked against their real keys.
deploy/k8s/make-secrets.sh "$tmp/secrets" >/dev/null
textprotos=()
while IFS= read -r f; do textprotos+=(--textproto "$f"); done < <(find deploy -name '*.textproto' | sort)
validate --secrets-dir "$tmp/secrets" "${textprotos[@]}" \
  --dockerfile deploy/docker/Dockerfile --dockerfile deploy/docker/Dockerfile.gpu \
  "${kustomize_args[@]}" "${cluster[@]}" "${renders[@]}"
# The validator must reject what it claims to: a string replica count, an unknown field, a
# readiness probe on the wrong port, a kubelet gRPC probe (no TLS), a credential Secret mounted
# writable, a tokens file where nothing is mounted, TLS dropped from a non-loopback listen, the
# NetworkPolicy opened to unlabelled client pods or to a port kvcached does not have, the
# --shard argument dropped or fixed (every pod the same shard name), POD_NAME taken from another
# field, not-ready (draining) pods published in DNS.
if [ ${#renders[@]} -gt 0 ]; then src=${renders[0]}; else src=deploy/k8s/base; fi
for breakage in 's/^  replicas: .*/  replicas: "two"/' 's/^  serviceName: kvcached/  serviceName: kvcached\n  servicename: typo/' \
                's|/dev/tcp/127.0.0.1/9464|/dev/tcp/127.0.0.1/9465|' \
                '/livenessProbe:/,/periodSeconds:/{s/httpGet:/grpc:/;/path: \/metrics/d;s/port: metrics/port: 50051/}' \
                '\|mountPath: /var/run/secrets/kvcached/tls|,/readOnly:/s/readOnly: true/readOnly: false/' \
                's|/var/run/secrets/kvcached/auth/tokens|/var/run/secrets/kvcached/tokens|' \
                's|^\( *\)cert_file:|\1# cert_file:|' 's|kvcache.io/client: "true"|team: any|' \
                '/^kind: NetworkPolicy/,/^---/s/port: metrics/port: 9999/' \
                '/- --shard=/d' 's/--shard=$(POD_NAME)/--shard=kvcached/' \
                's/fieldPath: metadata.name/fieldPath: metadata.namespace/' \
                's/^  clusterIP: None/  clusterIP: None\n  publishNotReadyAddresses: true/'; do
  if [ ${#renders[@]} -gt 0 ]; then
    changed="$tmp/broken.yaml"
    sed "$breakage" "$src" >"$changed"
    broken=("$changed")
  else
    changed="$tmp/broken-base"
    cp -r deploy/k8s/base "$changed"
    sed -i "$breakage" "$changed"/*.yaml "$changed"/*.textproto
    broken=(--kustomize-dir "$changed")
  fi
  diff -rq "$src" "$changed" >/dev/null && fail "self-test: '$breakage' changed nothing"
  if validate --secrets-dir "$tmp/secrets" "${broken[@]}" >"$tmp/broken.log" 2>&1; then
    fail "validator accepted a manifest broken by '$breakage'"
  fi
  echo "  rejected '$breakage': $(grep -m1 FAIL "$tmp/broken.log")"
  rm -rf "$tmp/broken-base"
done
echo "validator rejects broken manifests: ok"
# The cluster overlay's own assertions must fail when what they guard is broken: fewer shards,
# no spread over nodes or zones, a spread that selects no kvcached pod, a hard zone spread,
# tainted nodes counted, a budget that lets two shards go at once or selects nothing, the
# Service given a cluster IP.
if [ ${#cluster[@]} -gt 0 ]; then
  src=${cluster[1]}
  sts_pod='/^kind: StatefulSet/,/^---/'
  for breakage in 's/^  replicas: 3$/  replicas: 2/' \
                  "${sts_pod}{/topologySpreadConstraints:/,/^      volumes:/s|topologyKey: kubernetes.io/hostname|topologyKey: example.com/rack|}" \
                  "${sts_pod}{/topologySpreadConstraints:/,/^      volumes:/s|topologyKey: topology.kubernetes.io/zone|topologyKey: example.com/rack|}" \
                  "${sts_pod}{/topologySpreadConstraints:/,/^      volumes:/s|app.kubernetes.io/name: kvcached|app.kubernetes.io/name: other|}" \
                  's/whenUnsatisfiable: ScheduleAnyway/whenUnsatisfiable: DoNotSchedule/' \
                  '/nodeTaintsPolicy: Honor/d' \
                  '/^kind: PodDisruptionBudget/,/^---/s/maxUnavailable: 1/maxUnavailable: 2/' \
                  '/^kind: PodDisruptionBudget/,/^---/{/selector:/,/^---/s|app.kubernetes.io/name: kvcached|app.kubernetes.io/name: other|}' \
                  's/^  clusterIP: None/  clusterIP: 10.96.0.10/'; do
    sed "$breakage" "$src" >"$tmp/broken.yaml"
    cmp -s "$src" "$tmp/broken.yaml" && fail "self-test: '$breakage' changed nothing"
    if validate --secrets-dir "$tmp/secrets" --cluster "$tmp/broken.yaml" >"$tmp/broken.log" 2>&1; then
      fail "validator accepted a cluster overlay broken by '$breakage'"
    fi
    echo "  rejected '$breakage': $(grep -m1 FAIL "$tmp/broken.log")"
  done
  echo "validator rejects broken cluster overlays: ok"
else
  echo "SKIP: the cluster overlay's assertions (needs kubectl to render it)"
fi
# The same-node overlay's socket checks must fail when what they guard is broken: one path for
# every pod, the directory mounted read-only or private to the pod, no init container to give it
# to kvcached, no uids allowed.
if [ -n "$same_node" ]; then
  for breakage in 's|--local_socket=/run/kvcached/$(POD_NAME).sock|--local_socket=/run/kvcached/kvcached.sock|' \
                  '/- mountPath: \/run\/kvcached$/{n;s/name: local-socket$/name: local-socket\n          readOnly: true/}' \
                  '/- hostPath:$/{N;N;s/- hostPath:\n *path: \/run\/kvcached\n *type: DirectoryOrCreate/- emptyDir: {}/}' \
                  '/^      initContainers:/,/^      [a-z]/{/^      initContainers:/d;/^      [a-z]/!d}' \
                  's/local_socket_uids: \[1000\]/# no uids/' \
                  's/local_socket_uids: \[1000\]/local_socket_uids: [1000]\nlocal_socket_allow_same_uid: true/'; do
    sed "$breakage" "$same_node" >"$tmp/broken.yaml"
    cmp -s "$same_node" "$tmp/broken.yaml" && fail "self-test: '$breakage' changed nothing"
    if validate --secrets-dir "$tmp/secrets" "$tmp/broken.yaml" >"$tmp/broken.log" 2>&1; then
      fail "validator accepted a same-node overlay broken by '$breakage'"
    fi
    echo "  rejected '$breakage': $(grep -m1 FAIL "$tmp/broken.log")"
  done
  echo "validator rejects broken same-node overlays: ok"
else
  echo "SKIP: the same-node overlay's assertions (needs kubectl to render it)"
fi
# And a shipped config that the server would refuse: plaintext on every address, or insecure.
printf 'listen: "0.0.0.0:50051"\npools { name: "p" capacity_bytes: 1 }\n' >"$tmp/plain.textproto"
printf 'insecure: true\npools { name: "p" capacity_bytes: 1 }\n' >"$tmp/insecure.textproto"
for f in plain insecure; do
  if validate --textproto "$tmp/$f.textproto" >/dev/null 2>&1; then fail "validator accepted $f.textproto"; fi
done
echo "validator rejects plaintext and insecure configs: ok"

echo "== promtool: alert rules"
promtool check rules deploy/prometheus/alerts.yaml
promtool test rules deploy/prometheus/alerts_test.yaml

echo "== dashboard"
python3 "$here/prom_queries.py" check deploy/grafana/kvcache-dashboard.json deploy/prometheus/alerts.yaml \
  "$tmp/dashboard-rules.yaml"
promtool check rules "$tmp/dashboard-rules.yaml"
# The "Per shard" row's queries evaluated on two shards and an unsharded target: the join with
# kvc_shard_info attributes every series to its shard (tests/deploy/dashboard_shard_test.yaml).
cp "$here/dashboard_shard_test.yaml" "$tmp/"
promtool test rules "$tmp/dashboard_shard_test.yaml"

echo "== Dockerfiles"
python3 "$here/check_dockerfiles.py" "$repo"
echo "PASS: deploy static checks"
