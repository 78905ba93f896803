# Sourced by the load tests. Sets WORK (a temporary folder, removed at exit) and defines:
#   write_config CAPACITY_BYTES   the test pool (4 layers x 4 kv heads x 128, f16) -> $WORK/kvcached.conf
#   start_server KVCACHED LISTEN  starts kvcached on LISTEN (127.0.0.1:0 = a free port), waits
#                                 until it serves; sets SRV_PID and SRV_TARGET
#   scaled N                      N, or N / 4 (at least 1) in a sanitizer build
# Every kvcached started here is SIGKILLed when the sourcing shell exits.
WORK=$(mktemp -d)
SRV_PIDS=()
cleanup() {
  local p
  for p in "${SRV_PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*" >&2
  for log in "$WORK"/kvcached*.log; do
    [ -f "$log" ] && { echo "--- $log (tail)" >&2; tail -20 "$log" >&2; }
  done
  exit 1
}

write_config() {
  cat >"$WORK/kvcached.conf" <<CONF
pools { name: 'load' capacity_bytes: $1
        geometry { num_layers: 4 num_kv_heads: 4 num_query_heads: 8 head_dim: 128
                   block_tokens: 16 dtype: DTYPE_F16 } }
CONF
}

start_server() {
  local bin=$1 listen=$2 log="$WORK/kvcached.${#SRV_PIDS[@]}.log"
  : >"$log"  # exists before the first poll below (the background shell opens it later)
  "$bin" --config="$WORK/kvcached.conf" --listen="$listen" --metrics_listen=127.0.0.1:0 \
    "${@:3}" 2>"$log" &
  SRV_PID=$!
  SRV_PIDS+=("$SRV_PID")
  SRV_TARGET=
  # Sanitizer builds take seconds to start.
  for _ in $(seq 1 600); do
    SRV_TARGET=$(sed -n 's/.*kvcached listening on \(127\.0\.0\.1:[0-9]*\).*/\1/p' "$log")
    [ -n "$SRV_TARGET" ] && return 0
    kill -0 "$SRV_PID" 2>/dev/null || break
    sleep 0.1
  done
  cat "$log" >&2
  fail "kvcached did not start on $listen"
}

scaled() {
  if [ -n "${KVC_SANITIZE:-}" ]; then
    local n=$(($1 / 4))
    echo $((n > 0 ? n : 1))
  else
    echo "$1"
  fi
}
