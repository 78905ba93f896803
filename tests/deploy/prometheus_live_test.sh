#!/usr/bin/env bash
# The dashboard and alert rules against real components: kvcached (on deploy/k8s/base's pool
# config) with its metrics endpoint, a real Prometheus (Debian package prometheus) scraping it
# every second and loading deploy/prometheus/alerts.yaml, and kvc-loadgen driving traffic.
# Then every dashboard query, dashboard variable and alert expression is evaluated through
# Prometheus's HTTP API (prom_queries.py live): all must evaluate, dashboard queries must return
# data, up{job="kvcached"} must be 1, every kvcached metric must be scraped, every rule healthy;
# kvcached runs with --shard=kvcached-0 (where it has the flag) and must export its kvc_shard_info;
# and /metrics must pass `promtool check metrics`.
# Everything listens on 127.0.0.1, every loop is bounded, everything started is killed on exit.
# usage: prometheus_live_test.sh KVCACHED KVC_LOADGEN
set -euo pipefail
KVCACHED=$1 LOADGEN=$2
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
fail() { echo "FAIL: $*" >&2; exit 1; }
for tool in prometheus promtool; do
  command -v $tool >/dev/null || fail "$tool not found: run scripts/install_deps.sh (Debian package prometheus)"
done
help=$("$KVCACHED" --helpfull 2>&1 || true)
grep -q -- '--metrics_listen' <<<"$help" \
  || fail "$KVCACHED has no --metrics_listen flag (no Prometheus endpoint to scrape)"

tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
. "$here/start_kvcached_metrics.sh"

echo "== kvcached"
# The base's pools without its tls and auth blocks: their files exist only in a pod (Secret
# volumes), and a loopback listen may be plaintext. What this test measures is /metrics.
sed '/^tls {/,/^}/d; /^auth {/,/^}/d' "$repo/deploy/k8s/base/config.textproto" >"$tmp/config.textproto"
# A shard name as the StatefulSet gives one (the pod name), so that kvc_shard_info, the
# dashboard's $shard variable and its "Per shard" row have data. A kvcached built before
# --shard existed has none of them: the test then says so and does not require them.
shard_args=()
if grep -qE -- '--shard([^_a-z]|$)' <<<"$help"; then
  shard_args=(--shard=kvcached-0)
else
  echo "note: $KVCACHED has no --shard flag: kvc_shard_info and the per-shard panels are not checked"
  export KVC_ABSENT_OK=kvc_shard_info
fi
start_kvcached_metrics "$KVCACHED" "$tmp/kvcached.log" --config="$tmp/config.textproto" "${shard_args[@]}"
pids+=("$KVC_PID")
echo "kvcached pid $KVC_PID grpc $KVC_TARGET metrics $KVC_METRICS"

echo "== prometheus"
cat >"$tmp/prometheus.yml" <<YAML
global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
rule_files:
  - $repo/deploy/prometheus/alerts.yaml
scrape_configs:
  - job_name: kvcached
    static_configs:
      - targets: ["$KVC_METRICS"]
YAML
promtool check config "$tmp/prometheus.yml" >/dev/null || fail "prometheus config"
prom=""
for attempt in 1 2 3; do
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  prometheus --config.file="$tmp/prometheus.yml" --storage.tsdb.path="$tmp/tsdb" \
    --web.listen-address="127.0.0.1:$port" --log.level=warn >"$tmp/prometheus.log" 2>&1 &
  ppid=$!
  pids+=("$ppid")
  for _ in $(seq 1 50); do
    if python3 -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:$port/-/ready', timeout=1)" \
         2>/dev/null; then prom="http://127.0.0.1:$port"; break 2; fi
    kill -0 "$ppid" 2>/dev/null || break
    sleep 0.2
  done
  kill -9 "$ppid" 2>/dev/null || true
  echo "prometheus attempt $attempt did not become ready:" >&2
  cat "$tmp/prometheus.log" >&2
done
[ -n "$prom" ] || fail "prometheus did not start"
echo "prometheus $prom"

echo "== traffic"
# A bounded background loop (about 40 s at most), still running while the queries evaluate so
# that rate() windows hold increases. Each run leaves one sequence in the pool.
(
  for _ in $(seq 1 40); do
    "$LOADGEN" --target="$KVC_TARGET" --sequences=4 --tokens=256 --chunk_tokens=64 --keep=1 >/dev/null 2>&1 || true
    sleep 0.5
  done
) &
pids+=("$!")

query() {
  python3 - "$prom" "$1" <<'PY'
import json, sys, urllib.parse, urllib.request
url = f"{sys.argv[1]}/api/v1/query?" + urllib.parse.urlencode({"query": sys.argv[2]})
print(len(json.load(urllib.request.urlopen(url, timeout=5))["data"]["result"]))
PY
}
# Wait (bounded: 30 s) until Prometheus holds several scrapes with RPC traffic.
ready=""
for _ in $(seq 1 60); do
  n=$(query 'count_over_time(kvc_rpc_requests_total{job="kvcached"}[1m]) > 4' 2>/dev/null || echo 0)
  if [ "${n:-0}" -gt 0 ]; then ready=1; break; fi
  kill -0 "$KVC_PID" 2>/dev/null || { cat "$tmp/kvcached.log" >&2; fail "kvcached exited"; }
  sleep 0.5
done
if [ -z "$ready" ]; then
  echo "kvcached /metrics:" >&2
  python3 -c "import urllib.request; print(urllib.request.urlopen('http://$KVC_METRICS/metrics').read().decode())" \
    2>&1 | head -40 >&2 || true
  fail "Prometheus has no kvc_rpc_requests_total samples after 30 s"
fi
sleep 3  # a few more scrapes and rule evaluations

echo "== promtool check metrics"
python3 -c "import urllib.request; print(urllib.request.urlopen('http://$KVC_METRICS/metrics').read().decode(), end='')" \
  >"$tmp/metrics.txt"
promtool check metrics <"$tmp/metrics.txt" || fail "promtool check metrics"

if [ ${#shard_args[@]} -gt 0 ]; then
  n=$(query 'kvc_shard_info{job="kvcached",shard="kvcached-0"} == 1')
  [ "$n" = 1 ] || fail "kvc_shard_info{shard=\"kvcached-0\"} 1 not scraped (got $n series)"
  echo "kvc_shard_info{shard=\"kvcached-0\"} 1: ok"
fi

echo "== dashboard queries and alert expressions"
python3 "$here/prom_queries.py" live "$prom" "$repo/deploy/grafana/kvcache-dashboard.json" \
  "$repo/deploy/prometheus/alerts.yaml"
echo "PASS: Prometheus live test"
