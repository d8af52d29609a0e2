#!/usr/bin/env bash
# bench/probe.sh — the probe server under load, and signal forwarding meanwhile.
#
#   bench/probe.sh [DRAINIT_BINARY]
#
# Runs drainit (default target/release/drainit, built when missing) with a Python
# child that serves http.server on a loopback port and timestamps every SIGUSR1 it
# receives. For two configurations (no check; one --ready-tcp check on the app's
# port) it measures, on loopback only:
#   - /readyz requests per second and p50/p99 latency with wrk --latency
#     (PROBE_BENCH_SECS seconds, default 10; PROBE_BENCH_CONNS connections,
#     default 50; PROBE_BENCH_THREADS wrk threads, default 1);
#   - the forward latency of a signal: SIGUSR1 sent to drainit → the child's
#     sigwaitinfo() returns, both sides reading CLOCK_MONOTONIC; idle, then while wrk
#     runs (PROBE_BENCH_SIGNALS signals each, default 200, 20 ms apart).
# Prints a Markdown table on stdout; progress goes to stderr. Installs wrk from
# Debian (apt-get) when it is missing, so run it as root. A benchmark, never a test.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(dirname "$here")
drainit=${1:-$repo/target/release/drainit}
secs=${PROBE_BENCH_SECS:-10}
conns=${PROBE_BENCH_CONNS:-50}
threads=${PROBE_BENCH_THREADS:-1}
signals=${PROBE_BENCH_SIGNALS:-200}

say() { echo "probe-bench: $*" >&2; }

if ! command -v wrk >/dev/null 2>&1; then
    say "installing wrk (apt-get)"
    apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk >&2
fi
command -v python3 >/dev/null 2>&1 || { say "python3 is required"; exit 1; }
if [ ! -x "$drainit" ]; then
    say "building drainit (cargo build --release)"
    (cd "$repo" && cargo build --release >&2)
fi

work=$(mktemp -d /tmp/drainit-probe-bench.XXXXXX)
pid=""
cleanup() {
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT

cat >"$work/pb.py" <<'PY'
import json, os, signal, socket, sys, threading, time

def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p

def app(port, marks):
    # SIGUSR1 blocked in every thread; the main thread takes it with sigwaitinfo,
    # so the timestamp is taken the moment the kernel hands the signal over.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    import http.server
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", port), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    fd = os.open(marks, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    while True:
        signal.sigwaitinfo({signal.SIGUSR1})
        os.write(fd, b"%d\n" % time.monotonic_ns())

def wait_ready(port, within=10.0):
    import http.client
    end = time.time() + within
    while time.time() < end:
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
            c.request("GET", "/readyz")
            if c.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.05)
    sys.exit("drainit never became ready")

def lines(path):
    try:
        with open(path, "rb") as f:
            return f.read().split(b"\n")[:-1]
    except FileNotFoundError:
        return []

def send_signals(pid, marks, n, gap):
    lat = []
    for _ in range(n):
        before = len(lines(marks))
        t0 = time.monotonic_ns()
        os.kill(pid, signal.SIGUSR1)
        end = time.monotonic() + 2
        while True:
            got = lines(marks)
            if len(got) > before:
                lat.append((int(got[before]) - t0) / 1000.0)
                break
            if time.monotonic() > end:
                lat.append(float("inf"))
                break
            time.sleep(0.0005)
        time.sleep(gap)
    lat.sort()
    pct = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))]
    print(json.dumps({"n": len(lat), "p50_us": pct(0.50), "p99_us": pct(0.99), "max_us": lat[-1]}))

cmd = sys.argv[1]
if cmd == "port":
    print(free_port())
elif cmd == "app":
    app(int(sys.argv[2]), sys.argv[3])
elif cmd == "ready":
    wait_ready(int(sys.argv[2]))
elif cmd == "signals":
    send_signals(int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), float(sys.argv[5]))
PY

pb() { python3 "$work/pb.py" "$@"; }

# wrk's "Requests/sec", and the 50% / 99% lines of --latency.
wrk_field() { awk -v k="$2" '$1 == k { print $2; exit }' "$1"; }

rows=()
for config in none tcp; do
    probe=$(pb port)
    app=$(pb port)
    marks="$work/marks-$config"
    checks=()
    [ "$config" = tcp ] && checks=(--ready-tcp "127.0.0.1:$app")
    say "[$config] starting drainit (probe :$probe, app :$app)"
    "$drainit" --probe-addr "127.0.0.1:$probe" --pre-drain-delay 0s --drain-timeout 2s \
        --log-level warn "${checks[@]}" -- python3 "$work/pb.py" app "$app" "$marks" \
        2>"$work/drainit-$config.err" &
    pid=$!
    pb ready "$probe"

    say "[$config] signal forward latency, idle ($signals signals)"
    idle=$(pb signals "$pid" "$marks" "$signals" 0.01)

    say "[$config] wrk -t$threads -c$conns -d${secs}s --latency /readyz, with signals meanwhile"
    wrk -t"$threads" -c"$conns" -d"${secs}s" --latency "http://127.0.0.1:$probe/readyz" >"$work/wrk-$config.txt" &
    wrk_pid=$!
    sleep 1
    loaded=$(pb signals "$pid" "$marks" "$signals" 0.02)
    wait "$wrk_pid"

    rps=$(wrk_field "$work/wrk-$config.txt" "Requests/sec:")
    p50=$(wrk_field "$work/wrk-$config.txt" "50%")
    p99=$(wrk_field "$work/wrk-$config.txt" "99%")
    errors=$(grep -E "Socket errors|Non-2xx" "$work/wrk-$config.txt" | tr -s ' ' | sed 's/^ //' | paste -sd ';' - || true)
    [ -n "$errors" ] || errors="none"
    sig() { python3 -c 'import json,sys; d=json.loads(sys.argv[1]); print("%.0f / %.0f µs" % (d["p50_us"], d["p99_us"]))' "$1"; }
    rows+=("| $config | $rps | $p50 | $p99 | $errors | $(sig "$idle") | $(sig "$loaded") |")

    kill -TERM "$pid"
    wait "$pid" || true
    pid=""
done

echo "drainit probe benchmark — $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) CPUs, $(uname -r), wrk -t$threads -c$conns -d${secs}s"
echo
echo "| checks | /readyz req/s | p50 | p99 | wrk errors | SIGUSR1 forward p50 / p99, idle | under /readyz load |"
echo "|---|---:|---:|---:|---|---:|---:|"
printf '%s\n' "${rows[@]}"
