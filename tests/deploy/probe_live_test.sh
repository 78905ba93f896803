#!/usr/bin/env bash
# The StatefulSet's probes against a real kvcached (loopback, no cluster): the commands and
# paths are taken from deploy/k8s/base/statefulset.yaml, only the metrics port is replaced by
# the free port this kvcached got.
#  * startup/liveness: httpGet /metrics on the metrics port answers 200;
#  * readiness: the exec probe (bash /dev/tcp + grep kvc_draining) exits 0 while serving, 1
#    after `kvcachectl drain` (what grpc.health.v1 reports then is NOT_SERVING), 0 again after
#    `kvcachectl drain --resume`, and 1 once kvcached has exited;
#  * none of them touches the gRPC port, which is why they keep working when it serves TLS.
# usage: probe_live_test.sh KVCACHED KVCACHECTL
set -euo pipefail
KVCACHED=$1 KVCACHECTL=$2
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
fail() { echo "FAIL: $*" >&2; exit 1; }
tmp=$(mktemp -d)
KVC_PID=""
cleanup() {
  if [ -n "$KVC_PID" ]; then kill -9 "$KVC_PID" 2>/dev/null || true; fi
  wait 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
venv=$("$here/make_venv.sh")

# The probes as the manifest has them: readiness's bash command, startup/liveness's httpGet.
"$venv/bin/python" - "$repo/deploy/k8s/base/statefulset.yaml" "$tmp" <<'PY'
import sys, yaml
sts = yaml.safe_load(open(sys.argv[1]))
(c,) = [c for c in sts["spec"]["template"]["spec"]["containers"] if c["name"] == "kvcached"]
cmd = c["readinessProbe"]["exec"]["command"]
assert cmd[:2] == ["/bin/bash", "-c"], cmd
open(f"{sys.argv[2]}/readiness.sh", "w").write(cmd[2])
for p in ("startupProbe", "livenessProbe"):
    g = c[p]["httpGet"]
    assert g["port"] == "metrics", g
    open(f"{sys.argv[2]}/{p}.path", "w").write(g["path"])
PY
grep -q '9464' "$tmp/readiness.sh" || fail "readiness probe does not name the metrics port 9464"

. "$here/start_kvcached_metrics.sh"
# The base's pools without tls/auth (their files exist only in a pod); the probes read /metrics.
sed '/^tls {/,/^}/d; /^auth {/,/^}/d' "$repo/deploy/k8s/base/config.textproto" >"$tmp/config.textproto"
start_kvcached_metrics "$KVCACHED" "$tmp/kvcached.log" --config="$tmp/config.textproto" \
  --shutdown_grace_seconds=1
port=${KVC_METRICS##*:}
sed -i "s|/dev/tcp/127.0.0.1/9464|/dev/tcp/127.0.0.1/$port|" "$tmp/readiness.sh"
echo "kvcached pid $KVC_PID grpc $KVC_TARGET metrics $KVC_METRICS"
echo "readiness probe: /bin/bash -c '$(cat "$tmp/readiness.sh")'"

ready() { timeout 2 /bin/bash -c "$(cat "$tmp/readiness.sh")"; }
for p in startupProbe livenessProbe; do
  path=$(cat "$tmp/$p.path")
  code=$(python3 -c "import urllib.request; print(urllib.request.urlopen('http://$KVC_METRICS$path', timeout=2).status)")
  [ "$code" = 200 ] || fail "$p: GET $path answered $code"
  echo "$p: GET $path -> $code"
done
start=$(date +%s%N)
for _ in 1 2 3 4 5 6 7 8 9 10; do ready || fail "readiness probe failed on a serving kvcached"; done
echo "readiness while serving: ok (exit 0; $(( ($(date +%s%N) - start) / 10000000 )) ms per probe, bash included)"
"$KVCACHECTL" --target="$KVC_TARGET" drain
if ready; then fail "readiness probe passed while draining"; fi
echo "readiness while draining: fails (exit 1), as grpc.health.v1 reports NOT_SERVING"
"$KVCACHECTL" --target="$KVC_TARGET" drain --resume
ready || fail "readiness probe failed after drain --resume"
echo "readiness after resume: ok (exit 0)"
kill -TERM "$KVC_PID"
for _ in $(seq 1 50); do kill -0 "$KVC_PID" 2>/dev/null || break; sleep 0.1; done
kill -0 "$KVC_PID" 2>/dev/null && fail "kvcached did not exit on SIGTERM"
if ready 2>/dev/null; then fail "readiness probe passed with kvcached gone"; fi
echo "readiness with kvcached stopped: fails"
echo "PASS: probes"
