#!/usr/bin/env python3
"""Added latency of drainit's --proxy against the direct path, HAProxy and nginx.

Called by bench/proxy.sh, which installs the tools (oha, haproxy, nginx) and finds
drainit. Progress goes to stderr; the Markdown report goes to stdout. Standard
library only. Every wait is bounded.

One upstream app (an nginx serving a 1 kB static file, one worker, its own port)
sits behind every path, so the paths differ only in the proxy in front of it:

  direct   client -> app
  drainit  client -> drainit --proxy -> app   (drainit wraps `sleep infinity`)
  haproxy  client -> haproxy (mode http)  -> app
  nginx    client -> nginx (proxy_pass, upstream keepalive) -> app

Rounds: every round gives every path its turn at the fixed-rate run, then its
turn at the closed-loop run, in an order rotated by one each round, so that drift
of the machine (a build next door) spreads over all of them. Each figure in the
table is the median over the rounds of that round's figure.
"""

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time

PCTS = ("p50", "p90", "p99")


def log(msg):
    print(f"bench-proxy: {msg}", file=sys.stderr, flush=True)


def env_num(name, default, kind=int):
    v = os.environ.get(name)
    return kind(v) if v not in (None, "") else default


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, proc, secs=10.0):
    """Wait until 127.0.0.1:port accepts a connection; False if proc died or time ran out."""
    end = time.monotonic() + secs
    while time.monotonic() < end:
        if proc.poll() is not None:
            return False
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return True
        except OSError:
            time.sleep(0.05)
    return False


def http_get(port, path="/1k", secs=3.0):
    """One GET over a fresh connection; (status, body length) or (None, error text)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=secs) as s:
            s.sendall(f"GET {path} HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n".encode())
            data = b""
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        return int(head.split()[1]), len(body)
    except (OSError, ValueError, IndexError) as e:
        return None, str(e)


def proc_tree(pid):
    """pid and all its descendants (through /proc/*/stat parent links)."""
    parents = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    st = f.read()
                parents[int(d)] = int(st[st.rindex(")") + 2 :].split()[1])
            except (OSError, ValueError):
                pass
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(c for c, pp in parents.items() if pp == p)
    return out


def haproxy_conf(port, app_port):
    """HAProxy's configuration for the bench: `mode http`, keep-alive both sides,
    `http-reuse always`, `option forwardfor`, listening on 127.0.0.1:port, the app
    on 127.0.0.1:app_port. bench/proxy-instructions.sh uses it too."""
    return f"""global
    maxconn 4000
defaults
    mode http
    option http-keep-alive
    option forwardfor
    timeout connect 5s
    timeout client 60s
    timeout server 60s
    timeout http-keep-alive 60s
frontend fe
    bind 127.0.0.1:{port}
    default_backend app
backend app
    http-reuse always
    server app 127.0.0.1:{app_port}
"""


def cpu_ns(pids):
    """CPU time of pids so far, in ns: for each of their threads the first field
    of /proc/PID/task/TID/schedstat (time spent on a CPU, user and system), or,
    on a kernel without schedstat, utime + stime of /proc/PID/stat (whole clock
    ticks, 10 ms: about 3 µs per request over a 3 s run at 1000 req/s)."""
    total = 0
    for p in pids:
        try:
            ns = 0
            for tid in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{tid}/schedstat") as f:
                    ns += int(f.read().split()[0])
            total += ns
            continue
        except (OSError, ValueError, IndexError):
            pass
        try:
            with open(f"/proc/{p}/stat") as f:
                st = f.read()
            fields = st[st.rindex(")") + 2 :].split()
            hz = os.sysconf("SC_CLK_TCK")
            total += (int(fields[11]) + int(fields[12])) * 1_000_000_000 // hz
        except (OSError, ValueError, IndexError):
            pass
    return total


def status_kb(pid, key):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def rss_kb(pids):
    vals = [status_kb(p, "VmRSS") for p in pids]
    vals = [v for v in vals if v is not None]
    return sum(vals) if vals else None


class Sampler(threading.Thread):
    """Samples the summed VmRSS of a fixed set of pids every 100 ms; keeps the peak."""

    def __init__(self, pids):
        super().__init__(daemon=True)
        self.pids, self.peak, self.stop_ev = pids, None, threading.Event()

    def run(self):
        while not self.stop_ev.wait(0.1):
            v = rss_kb(self.pids)
            if v is not None and (self.peak is None or v > self.peak):
                self.peak = v

    def stop(self):
        self.stop_ev.set()
        self.join(2)
        return self.peak


class Path:
    def __init__(self, name, port, proc=None, pids=None):
        self.name, self.port, self.proc = name, port, proc
        self.pids = pids or []  # the proxy's own processes (for CPU and RSS)
        self.lat = []  # per round: {"p50": s, ...}
        self.rps = []  # per round: closed-loop requests/s
        self.cpu_us_per_req = []  # per round: proxy CPU per request at the fixed rate
        self.rss_rate = []  # per round: peak RSS during the fixed-rate run (kB)
        self.rss_max = []  # per round: peak RSS during the closed-loop run (kB)
        self.errors = 0
        self.tool_cpu = []  # per round: load tool CPU share at the fixed rate (%)
        self.tool_cpu_max = []  # per round: load tool CPU share in the closed loop (%)


def run_oha(args, port, extra, secs):
    """Run oha against the path; returns (parsed JSON, load tool CPU seconds, wall s)."""
    cmd = [
        args.oha, "--no-tui", "--output-format", "json",
        "-c", str(args.conns), "-z", f"{secs}s",
        # wait for the requests in flight at the end instead of counting them as errors
        "--wait-ongoing-requests-after-deadline",
        *extra,
        f"http://127.0.0.1:{port}/1k",
    ]
    before = os.times()
    t0 = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=secs + 60)
    wall = time.monotonic() - t0
    after = os.times()
    cpu = (after.children_user - before.children_user) + (
        after.children_system - before.children_system
    )
    if p.returncode != 0:
        raise RuntimeError(f"oha failed ({p.returncode}): {p.stderr.strip()[:400]}")
    return json.loads(p.stdout), cpu, wall


def errors_of(res):
    codes = res.get("statusCodeDistribution") or {}
    bad = sum(v for k, v in codes.items() if k != "200")
    bad += sum((res.get("errorDistribution") or {}).values())
    return bad


def measure_rate(args, path, r):
    sampler = Sampler(path.pids) if path.pids else None
    if sampler:
        sampler.start()
    c0 = cpu_ns(path.pids)
    res, tool_cpu, wall = run_oha(
        args, path.port, ["-q", str(args.rate), "--latency-correction"], args.rate_secs
    )
    c1 = cpu_ns(path.pids)
    n = sum((res.get("statusCodeDistribution") or {}).values())
    path.errors += errors_of(res)
    lp = res["latencyPercentiles"]
    path.lat.append({p: lp[p] for p in PCTS})
    path.tool_cpu.append(100.0 * tool_cpu / wall)
    if path.pids and n:
        path.cpu_us_per_req.append((c1 - c0) / 1e3 / n)
    if sampler:
        path.rss_rate.append(sampler.stop())
    log(
        f"round {r + 1} {path.name:8s} {args.rate}/s: "
        + " ".join(f"{p}={lp[p] * 1e6:.0f}us" for p in PCTS)
        + f" n={n} achieved={n / args.rate_secs:.0f}/s oha_cpu={100 * tool_cpu / wall:.0f}%"
    )


def measure_max(args, path, r):
    sampler = Sampler(path.pids) if path.pids else None
    if sampler:
        sampler.start()
    res, tool_cpu, wall = run_oha(args, path.port, [], args.max_secs)
    path.errors += errors_of(res)
    rps = res["summary"]["requestsPerSec"]
    path.rps.append(rps)
    path.tool_cpu_max.append(100.0 * tool_cpu / wall)
    if sampler:
        path.rss_max.append(sampler.stop())
    log(f"round {r + 1} {path.name:8s} closed loop: {rps:.0f} req/s oha_cpu={100 * tool_cpu / wall:.0f}%")


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def fmt(v, spec="{:.0f}", none="n/a"):
    return none if v is None else spec.format(v)


def start(cmd, name, workdir, **kw):
    log_f = open(os.path.join(workdir, f"{name}.log"), "w")
    return subprocess.Popen(cmd, stdout=log_f, stderr=subprocess.STDOUT, start_new_session=True, **kw)


def stop(proc):
    if proc is None or proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--oha", required=True)
    ap.add_argument("--nginx", required=True)
    ap.add_argument("--haproxy", required=True)
    ap.add_argument("--drainit", default="")
    ap.add_argument("--drainit-skip", default="", help="why drainit is skipped")
    ap.add_argument("--drainit-alt", default="", help="a second drainit build to compare")
    ap.add_argument(
        "--extra", action="append", default=[],
        help="NAME=BINARY: a reference proxy taking --proxy LISTEN=UPSTREAM (bench/floor)",
    )
    ap.add_argument("--command", default="bench/proxy.sh")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    q = args.quick
    args.rounds = env_num("BENCH_ROUNDS", 1 if q else 10)
    args.rate = env_num("BENCH_RATE", 1000)
    args.conns = env_num("BENCH_CONNS", 16)
    args.rate_secs = env_num("BENCH_RATE_SECS", 3)
    args.max_secs = env_num("BENCH_MAX_SECS", 2)
    w = args.workdir

    ports = {n: free_port() for n in ("app", "haproxy", "nginx")}
    www = os.path.join(w, "www")
    os.makedirs(www, exist_ok=True)
    with open(os.path.join(www, "1k"), "wb") as f:
        f.write(b"x" * 1023 + b"\n")
    os.chmod(w, 0o755)
    os.chmod(www, 0o755)

    def nginx_conf(name, workers, server_body, http_extra=""):
        d = os.path.join(w, name)
        os.makedirs(d, exist_ok=True)
        conf = os.path.join(d, "nginx.conf")
        with open(conf, "w") as f:
            f.write(
                f"""worker_processes {workers};
daemon off;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    keepalive_requests 1000000;
    keepalive_timeout 75s;
    client_body_temp_path {d}/body;
    proxy_temp_path {d}/proxy;
    fastcgi_temp_path {d}/fastcgi;
    uwsgi_temp_path {d}/uwsgi;
    scgi_temp_path {d}/scgi;
    {http_extra}
    server {{
        listen 127.0.0.1:{ports[name]};
        {server_body}
    }}
}}
"""
            )
        return conf

    app_conf = nginx_conf("app", 1, f"location / {{ root {www}; }}")
    ngx_conf = nginx_conf(
        "nginx",
        "auto",
        """location / {
            proxy_pass http://app;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
        }""",
        http_extra=f"upstream app {{ server 127.0.0.1:{ports['app']}; keepalive 32; }}",
    )
    hap_conf = os.path.join(w, "haproxy.cfg")
    with open(hap_conf, "w") as f:
        f.write(haproxy_conf(ports["haproxy"], ports["app"]))

    procs = []
    paths = []
    try:
        app = start([args.nginx, "-c", app_conf], "app", w)
        procs.append(app)
        if not wait_port(ports["app"], app):
            sys.exit(f"the upstream nginx did not start; see {w}/app.log and {w}/app/error.log")
        paths.append(Path("direct", ports["app"]))

        # drainit, and optionally a second build of it (BENCH_DRAINIT_ALT) as "drainit-alt"
        for name, binary in (("drainit", args.drainit), ("drainit-alt", args.drainit_alt)):
            if not binary:
                continue
            ports[name] = free_port()
            proc = start(
                [
                    binary, "--probe-addr", "off", "--log-level", "warn",
                    "--proxy", f"127.0.0.1:{ports[name]}=127.0.0.1:{ports['app']}",
                    "--", "sleep", "infinity",
                ],
                name,
                w,
            )
            procs.append(proc)
            if not wait_port(ports[name], proc):
                sys.exit(f"{binary} --proxy did not start; see {w}/{name}.log")
            paths.append(Path(name, ports[name], proc, [proc.pid]))

        # reference proxies (BENCH_FLOORS=1: bench/floor's byte copy and minimal
        # HTTP/1 path), started like drainit without its other flags
        for extra in args.extra:
            name, binary = extra.split("=", 1)
            ports[name] = free_port()
            proc = start(
                [binary, "--proxy", f"127.0.0.1:{ports[name]}=127.0.0.1:{ports['app']}"], name, w
            )
            procs.append(proc)
            if not wait_port(ports[name], proc):
                sys.exit(f"{binary} did not start; see {w}/{name}.log")
            paths.append(Path(name, ports[name], proc, [proc.pid]))

        hap = start([args.haproxy, "-db", "-f", hap_conf], "haproxy", w)
        procs.append(hap)
        if not wait_port(ports["haproxy"], hap):
            sys.exit(f"haproxy did not start; see {w}/haproxy.log")
        paths.append(Path("haproxy", ports["haproxy"], hap, [hap.pid]))

        ngx = start([args.nginx, "-c", ngx_conf], "nginx", w)
        procs.append(ngx)
        if not wait_port(ports["nginx"], ngx):
            sys.exit(f"the proxy nginx did not start; see {w}/nginx.log and {w}/nginx/error.log")
        time.sleep(0.3)  # let the workers come up before their pids are taken
        paths.append(Path("nginx", ports["nginx"], ngx, proc_tree(ngx.pid)))

        for p in paths:
            st, n = http_get(p.port)
            if st != 200 or n != 1024:
                sys.exit(f"{p.name}: GET /1k answered {st} with {n} body bytes, expected 200 and 1024")

        idle_rss = {p.name: rss_kb(p.pids) for p in paths if p.pids}

        log("warm-up: 2 s at the fixed rate through every path (not counted)")
        for p in paths:
            run_oha(args, p.port, ["-q", str(args.rate)], 2)

        load = os.getloadavg()
        t_start = time.monotonic()
        for r in range(args.rounds):
            order = paths[r % len(paths) :] + paths[: r % len(paths)]
            for p in order:
                measure_rate(args, p, r)
            for p in order:
                measure_max(args, p, r)
        elapsed = time.monotonic() - t_start
        hwm = {p.name: status_kb(p.pids[0], "VmHWM") for p in paths if p.name.startswith("drainit")}
        for p in paths:
            if p.proc is not None and p.proc.poll() is not None:
                sys.exit(f"{p.name} exited during the run ({p.proc.returncode}); see {w}/{p.name}.log")
    finally:
        for pr in reversed(procs):
            stop(pr)

    report(args, paths, hwm, idle_rss, load, elapsed)


def report(args, paths, hwm, idle_rss, load, elapsed):
    by = {p.name: p for p in paths}
    direct = by["direct"]
    d = {k: med([x[k] for x in direct.lat]) for k in PCTS}

    def added(p, k):
        v = med([x[k] for x in p.lat])
        return None if v is None else (v - d[k]) * 1e6

    out = []
    out.append(
        f"### Proxy latency: HTTP/1.1, 1 kB responses, {args.conns} keep-alive connections, "
        f"{args.rate} req/s\n"
    )
    out.append(
        "| path | p50 µs | p90 µs | p99 µs | added p50 µs | added p90 µs | added p99 µs "
        "| CPU µs/req | max req/s (closed loop) | errors |"
    )
    out.append("|---|---|---|---|---|---|---|---|---|---|")
    for p in paths:
        lat = [fmt(med([x[k] for x in p.lat]) * 1e6) for k in PCTS]
        add = ["—"] * 3 if p is direct else [fmt(added(p, k), "{:+.0f}") for k in PCTS]
        cpu = fmt(med(p.cpu_us_per_req), "{:.1f}") if p.pids else "—"
        out.append(
            f"| {p.name} | {' | '.join(lat)} | {' | '.join(add)} | {cpu} "
            f"| {fmt(med(p.rps))} | {p.errors} |"
        )
    if args.drainit_skip:
        out.append(f"| drainit | skipped: {args.drainit_skip} | | | | | | | | |")
    out.append("")
    for name in ("drainit", "drainit-alt"):
        if name not in by:
            continue
        dr = by[name]
        for ref in ("haproxy", "nginx"):
            if ref not in by:
                continue
            parts = []
            for k in PCTS:
                a, b = added(dr, k), added(by[ref], k)
                ok = a is not None and b is not None and a > 0 and b > 0
                parts.append(f"{k} {fmt(a / b, '{:.2f}') + '×' if ok else 'n/a (an added figure ≤ 0)'}")
            rr = med(dr.rps) / med(by[ref].rps) if med(by[ref].rps) else None
            out.append(
                f"- {name} against {ref}: added latency {', '.join(parts)}; "
                f"max throughput {fmt(rr, '{:.2f}')}×"
            )
        out.append(
            f"- {name} RSS: idle {fmt(idle_rss.get(name))} kB, peak at {args.rate} req/s "
            f"{fmt(max(filter(None, dr.rss_rate), default=None))} kB, peak in the closed loop "
            f"{fmt(max(filter(None, dr.rss_max), default=None))} kB (VmHWM {fmt(hwm.get(name))} kB)"
        )
    if args.rounds > 1:
        spread = ", ".join(
            f"{k} {min(x[k] for x in direct.lat) * 1e6:.0f}–{max(x[k] for x in direct.lat) * 1e6:.0f}"
            for k in PCTS
        )
        out.append(f"- noise: the direct path's own figures ranged over the rounds as {spread} µs")
    others = [
        f"{n} {fmt(idle_rss.get(n))} kB idle / {fmt(max(filter(None, by[n].rss_max), default=None))} kB loaded"
        for n in ("haproxy", "nginx")
        if n in by
    ]
    out.append(f"- for comparison, summed RSS of all processes: {', '.join(others)}")
    out.append(
        f"- load tool (oha) CPU: {fmt(med([x for p in paths for x in p.tool_cpu]))}% of one core "
        f"at {args.rate} req/s, {fmt(med([x for p in paths for x in p.tool_cpu_max]))}% in the closed loop"
    )
    out.append("")
    out.append(
        "Added = the path's percentile minus the direct path's, each the median over "
        f"{args.rounds} interleaved rounds of {args.rate_secs} s at {args.rate} req/s "
        f"(oha -q {args.rate} --latency-correction, {args.conns} connections); "
        f"ratios are drainit's added latency over the other proxy's (below 1 = drainit adds less). "
        f"Max req/s: oha closed loop, {args.conns} connections, {args.max_secs} s per round, median. "
        f"CPU µs/req: the proxy's own CPU time (all its threads, /proc/PID/task/*/schedstat, ns) over the fixed-rate run divided by its "
        f"requests. Upstream: nginx, one worker, a 1024-byte static file. "
        f"HAProxy {version([args.haproxy, '-v'])}, nginx {version([args.nginx, '-v'])}, "
        f"oha {version([args.oha, '--version'])}; "
        + (f"drainit: `{args.drainit}`; " if args.drainit else "")
        + (f"drainit-alt: `{args.drainit_alt}`; " if args.drainit_alt else "")
        + f"{os.cpu_count()} CPUs, load average {load[0]:.2f} at the start; measured part {elapsed:.0f} s."
    )
    out.append("")
    out.append(f"Command: `{args.command}`")
    print("\n".join(out))


def version(cmd):
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=5)
        text = (p.stdout + p.stderr).strip().splitlines()[0]
    except (OSError, IndexError, subprocess.TimeoutExpired):
        return "?"
    for tok in text.replace("/", " ").split():
        if tok[:1].isdigit():
            return tok
    return text


if __name__ == "__main__":
    main()
