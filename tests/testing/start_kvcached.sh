# Sourced by shell tests: start_kvcached KVCACHED [ARGS...] starts kvcached on a free
# loopback port, waits until it listens, and sets KVC_PID and KVC_TARGET. The server is
# stopped (SIGKILL) when the sourcing shell exits, whatever happens; stop_kvcached stops it
# gracefully first (SIGTERM, then SIGKILL after 5 s), for scripts that trap EXIT with it.
start_kvcached() {
  local bin=$1
  shift
  KVC_LOG=$(mktemp)
  "$bin" --listen=127.0.0.1:0 --metrics_listen=127.0.0.1:0 "$@" 2>"$KVC_LOG" &
  KVC_PID=$!
  trap 'kill -9 $KVC_PID 2>/dev/null || true; rm -f "$KVC_LOG"' EXIT
  for _ in $(seq 1 100); do
    KVC_TARGET=$(sed -n 's/.*kvcached listening on \(127\.0\.0\.1:[0-9]*\).*/\1/p' "$KVC_LOG")
    [ -n "$KVC_TARGET" ] && return 0
    kill -0 $KVC_PID 2>/dev/null || break
    sleep 0.1
  done
  echo "kvcached did not start:" >&2
  cat "$KVC_LOG" >&2
  return 1
}

stop_kvcached() {
  kill "$KVC_PID" 2>/dev/null || true
  for _ in $(seq 1 50); do kill -0 "$KVC_PID" 2>/dev/null || break; sleep 0.1; done
  kill -9 "$KVC_PID" 2>/dev/null || true
  wait "$KVC_PID" 2>/dev/null || true
  rm -f "$KVC_LOG"
}
