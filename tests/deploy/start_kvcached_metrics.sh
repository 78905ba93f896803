# Sourced by shell tests: start_kvcached_metrics KVCACHED LOG [ARGS...] starts kvcached with
# its gRPC and metrics endpoints on free loopback ports, waits (bounded, 10 s) until both are
# announced in LOG, and sets KVC_PID, KVC_TARGET (host:port) and KVC_METRICS (host:port).
# The caller stops the server (it is not trapped here, so the caller's EXIT trap stays its own).
start_kvcached_metrics() {
  local bin=$1 log=$2
  shift 2
  : >"$log"  # exists before the first poll below (the background shell opens it later)
  "$bin" --listen=127.0.0.1:0 --metrics_listen=127.0.0.1:0 "$@" >"$log" 2>&1 &
  KVC_PID=$!
  KVC_TARGET="" KVC_METRICS=""
  for _ in $(seq 1 100); do
    KVC_TARGET=$(sed -n 's/.*kvcached listening on \(127\.0\.0\.1:[0-9]*\).*/\1/p' "$log" | head -1)
    KVC_METRICS=$(sed -n 's|.*metrics on http://\(127\.0\.0\.1:[0-9]*\)/metrics.*|\1|p' "$log" | head -1)
    [ -n "$KVC_TARGET" ] && [ -n "$KVC_METRICS" ] && return 0
    kill -0 "$KVC_PID" 2>/dev/null || break
    sleep 0.1
  done
  echo "kvcached did not announce its gRPC and metrics ports:" >&2
  cat "$log" >&2
  return 1
}
