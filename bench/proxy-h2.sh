#!/usr/bin/env bash
# proxy-h2.sh -- HTTP/2 (prior knowledge) latency through drainit's admission
# proxy against the direct path, with h2load (Debian nghttp2-client) and the h2c
# app of the tests (tests/fixtures/h2app.py, Python `h2`).
#
#   bench/proxy-h2.sh [DRAINIT] [N] [CONNECTIONS] [STREAMS]
#
# Defaults: target/x86_64-unknown-linux-musl/release/drainit, 20000 requests,
# 16 connections, 10 concurrent streams each (h2load -n N -c C -m M). Runs the
# direct path, then the proxy, then the direct path again (the machine's drift
# shows), each once after a 2000-request warm-up; prints per-request latency
# percentiles from h2load's --log-file (µs) and drainit's CPU time and peak RSS
# over the proxied run.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-target/x86_64-unknown-linux-musl/release/drainit}
N=${2:-20000}
C=${3:-16}
M=${4:-10}
TMP=$(mktemp -d)
APP=$((20000 + RANDOM % 10000))
PX=$((APP + 1))
PROBE=$((APP + 2))

"$BIN" --probe-addr 127.0.0.1:$PROBE --proxy 127.0.0.1:$PX=127.0.0.1:$APP \
  --ready-tcp 127.0.0.1:$APP --pre-drain-delay 0s -- python3 tests/fixtures/h2app.py --port $APP \
  >"$TMP/drainit.out" 2>"$TMP/drainit.err" &
DPID=$!
trap 'kill -TERM $DPID 2>/dev/null || true; rm -rf "$TMP"' EXIT
for _ in $(seq 100); do
  curl -sf http://127.0.0.1:$PROBE/readyz >/dev/null 2>&1 && break
  sleep 0.1
done

pct() { # log file -> "p50 p90 p99 max" in µs (3rd column of h2load's log)
  awk '{print $3}' "$1" | sort -n | awk '{a[NR]=$1} END {
    printf "%d %d %d %d\n", a[int(NR*0.50)], a[int(NR*0.90)], a[int(NR*0.99)], a[NR] }'
}
cpu_ms() { awk '{print ($14 + $15) * 10}' /proc/$DPID/stat; }

run() { # name port
  h2load -n 2000 -c "$C" -m "$M" "http://127.0.0.1:$2/ok" >/dev/null
  local before; before=$(cpu_ms)
  h2load -n "$N" -c "$C" -m "$M" --log-file="$TMP/$1.log" "http://127.0.0.1:$2/ok" >"$TMP/$1.out"
  local after; after=$(cpu_ms)
  local rps; rps=$(awk '/^finished in/ {print $4}' "$TMP/$1.out")
  local ok; ok=$(awk '/^status codes:/ {print $3}' "$TMP/$1.out")
  read -r p50 p90 p99 max < <(pct "$TMP/$1.log")
  printf "%-8s req/s %8s  2xx %6s  p50 %6d  p90 %6d  p99 %6d  max %7d µs  drainit CPU %5d ms\n" \
    "$1" "$rps" "$ok" "$p50" "$p90" "$p99" "$max" $((after - before))
}

echo "h2load -n $N -c $C -m $M, GET /ok (3 bytes), $(nproc) cores"
run direct $APP
run proxy $PX
run direct2 $APP
echo "drainit peak RSS (VmHWM): $(awk '/VmHWM/ {print $2, $3}' /proc/$DPID/status)"
kill -TERM $DPID
wait $DPID || true
tail -n 1 "$TMP/drainit.err" | grep -o '"requests":{[^}]*}' 
