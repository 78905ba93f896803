#!/usr/bin/env bash
# kvcached with a pool on a CUDA device it cannot use exits at once, non-zero, with a message
# that names the pool and says why (never a crash loop of an unexplained abort). cuda:63 cannot
# exist: in a CUDA build on a machine without a GPU the runtime says why, on a GPU machine the
# ordinal is missing, and a build without CUDA says so. The same server with the pool on the
# host starts (so the refusal is about the device, not the rest of the config).
# usage: device_startup_test.sh KVCACHED
set -euo pipefail
KVCACHED=$1
fail() { echo "FAIL: $*" >&2; exit 1; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

config() {  # DEVICE
  cat << EOF2
listen: "127.0.0.1:0"
pools { name: "gpu-pool" device: "$1" capacity_bytes: 67108864
        geometry { num_layers: 2 num_kv_heads: 2 num_query_heads: 4 head_dim: 64 block_tokens: 16
                   dtype: DTYPE_F16 } }
EOF2
}

config cuda:63 > "$dir/bad.textproto"
start=$(date +%s)
set +e
timeout 20 "$KVCACHED" --config="$dir/bad.textproto" --metrics_listen=off > "$dir/bad.log" 2>&1
rc=$?
set -e
cat "$dir/bad.log"
[ "$rc" != 0 ] || fail "kvcached started with an unusable cuda:63 pool"
[ "$rc" != 124 ] || fail "kvcached did not exit within 20 s"
[ "$rc" -lt 128 ] || fail "kvcached died of a signal ($rc) instead of exiting with an error"
[ $(($(date +%s) - start)) -le 10 ] || fail "the refusal took more than 10 s"
grep -q "pool 'gpu-pool': device 'cuda:63' cannot be used: " "$dir/bad.log" ||
  fail "the message does not name the pool and the device"
grep -Eq "node needs an NVIDIA driver|built without CUDA" "$dir/bad.log" ||
  fail "the message does not say what to do"

config cpu > "$dir/good.textproto"
"$KVCACHED" --config="$dir/good.textproto" --metrics_listen=off > "$dir/good.log" 2>&1 &
pid=$!
for _ in $(seq 100); do
  grep -q "listening" "$dir/good.log" && break
  kill -0 "$pid" 2> /dev/null || { cat "$dir/good.log"; fail "a host pool did not start"; }
  sleep 0.1
done
grep -q "listening" "$dir/good.log" || { cat "$dir/good.log"; fail "no 'listening' line"; }
kill -TERM "$pid"
wait "$pid" || fail "kvcached did not stop cleanly on SIGTERM"
echo "device_startup_test: PASS"
