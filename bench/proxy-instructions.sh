#!/usr/bin/env bash
# bench/proxy-instructions.sh — instructions drainit executes per proxied request,
# counted with callgrind (independent of the machine's load).
#
#   bench/proxy-instructions.sh [DRAINIT_BINARY]
#
# One app (an nginx, one worker, serving a 1 kB file, as in bench/proxy.py) behind
# `drainit --probe-addr off --log-level warn --proxy 127.0.0.1:P=127.0.0.1:APP --
# sleep infinity`, run under `valgrind --tool=callgrind`. oha sends N requests
# over C keep-alive connections (HTTP/1.1), then drainit gets SIGTERM. The same
# run with 0 requests (same waits) is subtracted and the difference divided by N:
# drainit's own instructions per proxied request, all its threads counted.
# Settings: N (3000), C (16), RUNS (1: each count is the median of RUNS runs).
# DRAINIT_BINARY defaults to target/x86_64-unknown-linux-musl/release/drainit; any
# proxy that takes `--proxy LISTEN=UPSTREAM` and ignores drainit's other arguments
# is counted the same way (bench/floor's reference proxies).
# HAPROXY=1 also counts HAProxy's (bench/proxy.sh's configuration, its threads
# serialised by valgrind) for the same N requests: its idle loop wakes on timers
# of its own, so its count is taken with the instrumentation switched on just
# before the requests and off just after (`callgrind_control -i`), not by
# subtraction.
# Needs valgrind, nginx, oha (bench/proxy.sh installs the last two). About 1 min.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(dirname "$here")
drainit=${1:-$repo/target/x86_64-unknown-linux-musl/release/drainit}
n=${N:-3000}
c=${C:-16}
runs=${RUNS:-1}
export PATH="$PATH:/usr/sbin:/sbin:$HOME/.cargo/bin"
say() { echo "proxy-instructions: $*" >&2; }
for tool in valgrind nginx oha python3; do
    command -v "$tool" >/dev/null 2>&1 || { say "needs $tool"; exit 1; }
done
[ -x "$drainit" ] || { say "no drainit at $drainit"; exit 1; }

work=$(mktemp -d)
app_pid=
cleanup() {
    [ -n "$app_pid" ] && kill "$app_pid" 2>/dev/null && wait "$app_pid" 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() { # port pid
    for _ in $(seq 1 600); do
        kill -0 "$2" 2>/dev/null || return 1
        (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
        sleep 0.1
    done
    return 1
}

# ---- the app: nginx serving 1 kB ------------------------------------------------------------
mkdir -p "$work/www" "$work/app"
head -c 1023 /dev/zero | tr '\0' x >"$work/www/1k"
echo >>"$work/www/1k"
chmod 755 "$work" "$work/www"
app_port=$(free_port)
cat >"$work/app/nginx.conf" <<EOF
worker_processes 1;
daemon off;
pid $work/app/nginx.pid;
error_log $work/app/error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    keepalive_requests 1000000;
    keepalive_timeout 75s;
    client_body_temp_path $work/app/body;
    proxy_temp_path $work/app/proxy;
    fastcgi_temp_path $work/app/fastcgi;
    uwsgi_temp_path $work/app/uwsgi;
    scgi_temp_path $work/app/scgi;
    server { listen 127.0.0.1:$app_port; location / { root $work/www; } }
}
EOF
nginx -c "$work/app/nginx.conf" -e "$work/app/error.log" >/dev/null 2>&1 &
app_pid=$!
wait_port "$app_port" "$app_pid" || { say "the app did not start"; exit 1; }

# ---- one callgrind run: instructions of drainit serving $1 requests -------------------------
count() {
    local requests=$1 port out pid
    port=$(free_port)
    out="$work/cg.$requests.$RANDOM"
    valgrind --tool=callgrind --callgrind-out-file="$out.cg" --log-file="$out.log" \
        "$drainit" --probe-addr off --log-level warn \
        --proxy "127.0.0.1:$port=127.0.0.1:$app_port" -- sleep infinity >"$out.report" &
    pid=$!
    wait_port "$port" "$pid" || { say "drainit did not listen"; exit 1; }
    sleep 1
    if [ "$requests" -gt 0 ]; then
        oha --no-tui -n "$requests" -c "$c" --output-format json \
            "http://127.0.0.1:$port/1k" >"$out.oha" 2>&1
        python3 - "$out.oha" "$requests" <<'PY' || { say "oha: not every request was a 200"; exit 1; }
import json, sys
res = json.load(open(sys.argv[1]))
codes = res.get("statusCodeDistribution", {})
sys.exit(0 if codes == {"200": int(sys.argv[2])} else 1)
PY
    else
        sleep 0.2
    fi
    sleep 1
    kill -TERM "$pid"
    wait "$pid" || true
    sed -n 's/.*Collected : \([0-9]*\).*/\1/p' "$out.log"
}

# ---- HAProxy's instructions for $1 requests, counted only while they run ---------------------
count_haproxy() {
    local requests=$1 port out pid
    port=$(free_port)
    out="$work/hap.$RANDOM"
    # bench/proxy.sh's configuration, from bench/proxy.py.
    python3 -c 'import sys; sys.path.insert(0, sys.argv[1]); import proxy; print(proxy.haproxy_conf(int(sys.argv[2]), int(sys.argv[3])))' \
        "$here" "$port" "$app_port" >"$out.cfg"
    valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$out.cg" \
        --log-file="$out.log" haproxy -f "$out.cfg" -db -q &
    pid=$!
    wait_port "$port" "$pid" || { say "haproxy did not listen"; exit 1; }
    sleep 1
    callgrind_control -i on "$pid" >/dev/null
    oha --no-tui -n "$requests" -c "$c" "http://127.0.0.1:$port/1k" >/dev/null 2>&1
    callgrind_control -i off "$pid" >/dev/null
    kill -TERM "$pid"
    wait "$pid" || true
    sed -n 's/.*Collected : \([0-9]*\).*/\1/p' "$out.log"
}

median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
zero=$(for _ in $(seq 1 "$runs"); do count 0; done | median)
full=$(for _ in $(seq 1 "$runs"); do count "$n"; done | median)
per=$(( (full - zero) / n ))
say "0 requests: $zero instructions; $n requests ($c connections): $full"
echo "$per instructions per proxied request ($n requests, $c connections, $(basename "$drainit"))"
if [ -n "${HAPROXY:-}" ]; then
    command -v haproxy >/dev/null 2>&1 || { say "HAPROXY=1 needs haproxy"; exit 1; }
    hap=$(for _ in $(seq 1 "$runs"); do count_haproxy "$n"; done | median)
    echo "$(( hap / n )) instructions per proxied request for HAProxy ($n requests, $c connections, $(haproxy -v | sed -n '1s/^HAProxy version \([^ ]*\).*/\1/p'))"
fi
