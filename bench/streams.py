#!/usr/bin/env python3
"""streams.py -- how drainit's proxy closes 1,000 WebSockets at a drain.

    bench/streams.py [--drainit PATH] [--n 1000] [--spreads 10s,0s] [--json FILE]

For each --stream-spread value, in turn: starts

    drainit --probe-addr off --proxy 127.0.0.1:P=127.0.0.1:A --proxy-health /health
            --ready-tcp 127.0.0.1:A --pre-drain-delay 0s --drain-timeout 20s
            --stream-spread S --report-file R -- python3 bench/wsapp.py --port A

opens N WebSocket clients through the proxy (one process, one selectors loop;
every one checked with an echo), sends drainit SIGTERM, and records for each
client when drainit's close frame arrived and its status code (each client then
answers with its own close frame, as a browser does). drainit's CPU time
(utime+stime of /proc/PID/stat, all its threads) is sampled until it exits (the
last sample is taken while it is a zombie, so it is its final figure), its
VmRSS/VmHWM from /proc/PID/status. Prints a Markdown table on stdout, the raw
figures with --json. Python 3 stdlib only, root not needed (it raises its own
RLIMIT_NOFILE soft limit to the hard one: N clients + drainit's 2N descriptors).
Never a test: nothing in the suite depends on it.
"""
import argparse, base64, json, os, resource, selectors, signal, socket, struct
import subprocess, sys, tempfile, time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TICK_MS = 1000.0 / os.sysconf("SC_CLK_TCK")


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def cpu_ticks(pid):
    """(utime+stime in ticks, state) of pid, or None when it is gone."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            rest = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(rest[11]) + int(rest[12]), rest[0]


def mem_kb(pid):
    out = {}
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                k, _, v = line.partition(":")
                if k in ("VmRSS", "VmHWM"):
                    out[k] = int(v.split()[0])
    except OSError:
        pass
    return out


def http_get(port, path):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            s.sendall(b"GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n" % path)
            return s.recv(64).split(b" ")[1]
    except (OSError, IndexError):
        return None


def masked(op, data):
    mask = os.urandom(4)
    body = bytes(b ^ mask[i % 4] for i, b in enumerate(data))
    return struct.pack(">BB", 0x80 | op, 0x80 | len(data)) + mask + body


def ws_open(port):
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    key = base64.b64encode(os.urandom(16))
    s.sendall(b"GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
              b"Sec-WebSocket-Key: " + key + b"\r\nSec-WebSocket-Version: 13\r\n\r\n")
    buf = b""
    while b"\r\n\r\n" not in buf:
        got = s.recv(4096)
        if not got:
            raise RuntimeError("connection closed during the handshake")
        buf += got
    head, _, rest = buf.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 101"):
        raise RuntimeError("handshake answered %r" % head.split(b"\r\n")[0])
    s.setblocking(False)
    return s, rest


class Client:
    def __init__(self, sock, buf):
        self.sock, self.buf = sock, buf
        self.echoed = False
        self.close_t = None  # monotonic s when drainit's close frame arrived
        self.code = None
        self.eof_t = None

    def frames(self):
        """Complete server frames in buf (unmasked), as (opcode, payload)."""
        while len(self.buf) >= 2:
            ln, pos = self.buf[1] & 0x7F, 2
            if ln == 126:
                if len(self.buf) < 4:
                    return
                ln, pos = struct.unpack(">H", self.buf[2:4])[0], 4
            elif ln == 127:
                if len(self.buf) < 10:
                    return
                ln, pos = struct.unpack(">Q", self.buf[2:10])[0], 10
            if len(self.buf) < pos + ln:
                return
            op, data = self.buf[0] & 0x0F, self.buf[pos : pos + ln]
            self.buf = self.buf[pos + ln :]
            yield op, data


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100.0 * (len(xs) - 1))))] if xs else None


def run(drainit, n, spread):
    tmp = tempfile.mkdtemp(prefix="streams-bench-")
    app_port, port = free_port(), free_port()
    report, applog = os.path.join(tmp, "report.json"), os.path.join(tmp, "app.log")
    cmd = [drainit, "--probe-addr", "off",
           "--proxy", "127.0.0.1:%d=127.0.0.1:%d" % (port, app_port), "--proxy-health", "/health",
           "--ready-tcp", "127.0.0.1:%d" % app_port, "--pre-drain-delay", "0s",
           "--drain-timeout", "20s", "--stream-spread", spread, "--report-file", report,
           "--", sys.executable, os.path.join(HERE, "wsapp.py"), "--port", str(app_port),
           "--log", applog]
    errf = open(os.path.join(tmp, "stderr"), "w")
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=errf)
    pid = proc.pid
    end = time.time() + 10
    while http_get(port, b"/health") != b"200":
        if time.time() > end or proc.poll() is not None:
            raise SystemExit("drainit did not become ready; see %s/stderr" % tmp)
        time.sleep(0.05)
    idle_rss = mem_kb(pid).get("VmRSS")
    cpu_idle = cpu_ticks(pid)[0]

    sel = selectors.DefaultSelector()
    clients = []
    t_open = time.monotonic()
    for _ in range(n):
        s, rest = ws_open(port)
        c = Client(s, rest)
        clients.append(c)
        sel.register(s, selectors.EVENT_READ, c)
        s.sendall(masked(0x1, b"hi"))
    waiting, end = n, time.monotonic() + 20
    while waiting and time.monotonic() < end:
        for key, _ in sel.select(timeout=0.5):
            c = key.data
            c.buf += c.sock.recv(65536)
            for op, data in c.frames():
                if op == 0x1 and data == b"hi" and not c.echoed:
                    c.echoed, waiting = True, waiting - 1
    if waiting:
        raise SystemExit("%d of %d WebSockets got no echo" % (waiting, n))
    open_s = time.monotonic() - t_open
    time.sleep(0.5)  # let drainit settle before the "open" figures
    cpu_open = cpu_ticks(pid)[0]
    mem_open = mem_kb(pid)
    load = open("/proc/loadavg").read().split()[0]

    t0 = time.monotonic()
    os.kill(pid, signal.SIGTERM)
    last_cpu, hwm = cpu_open, mem_open.get("VmHWM")
    live = [n]

    def on_readable(c):
        try:
            got = c.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            got = b""
        now = time.monotonic()
        if not got:
            c.eof_t = now
            sel.unregister(c.sock)
            c.sock.close()
            live[0] -= 1
            return
        c.buf += got
        for op, data in c.frames():
            if op == 0x8 and c.close_t is None:
                c.close_t = now
                c.code = struct.unpack(">H", data[:2])[0] if len(data) >= 2 else None
                try:
                    c.sock.sendall(masked(0x8, data[:2]))
                except OSError:
                    pass

    end = t0 + 40
    while time.monotonic() < end:
        for key, _ in sel.select(timeout=0.005):
            on_readable(key.data)
        st = cpu_ticks(pid)
        if st is not None:
            last_cpu = st[0]
            if st[1] != "Z":
                hwm = max(hwm or 0, mem_kb(pid).get("VmHWM", 0))
            else:
                break
    # What drainit wrote before it exited and this loop has not read yet.
    while live[0] and time.monotonic() < end:
        for key, _ in sel.select(timeout=0.05):
            on_readable(key.data)
    code = proc.wait(timeout=30)
    errf.close()
    rep = json.load(open(report)) if os.path.exists(report) else {}
    app_term = None
    for line in open(applog) if os.path.exists(applog) else ():
        if line.startswith("signal TERM"):
            app_term = float(line.split("mono=", 1)[1].split()[0])

    closes = sorted((c.close_t - t0) * 1000 for c in clients if c.close_t is not None)
    codes = {}
    for c in clients:
        codes[str(c.code)] = codes.get(str(c.code), 0) + 1
    gaps = [b - a for a, b in zip(closes, closes[1:])]
    max100, j = 0, 0
    for i in range(len(closes)):
        while closes[i] - closes[j] >= 100:
            j += 1
        max100 = max(max100, i - j + 1)
    return {
        "spread": spread, "n": n, "load_at_sigterm": float(load), "open_s": open_s,
        "closed": len(closes), "codes": codes,
        "first_ms": closes[0] if closes else None, "last_ms": closes[-1] if closes else None,
        "max_per_100ms": max100, "gap_p50_ms": pct(gaps, 50), "gap_p99_ms": pct(gaps, 99),
        "cpu_open_ms": (cpu_open - cpu_idle) * TICK_MS, "cpu_drain_ms": (last_cpu - cpu_open) * TICK_MS,
        "rss_idle_kb": idle_rss, "rss_open_kb": mem_open.get("VmRSS"), "hwm_kb": hwm,
        "app_term_ms": (app_term - t0) * 1000 if app_term else None,
        "app_term_after_last_close_ms": (app_term - t0) * 1000 - closes[-1] if app_term and closes else None,
        "forwarded_at_ms": rep.get("drain", {}).get("forwarded_at_ms"),
        "exit": code, "streams": rep.get("streams"), "tmp": tmp,
        "closes_ms": [round(x, 3) for x in closes],
    }


def ms(x, nd=0):
    return "—" if x is None else ("{:,.%df}" % nd).format(x)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--drainit", default=os.path.join(
        ROOT, "target/x86_64-unknown-linux-musl/release/drainit"))
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--spreads", default="10s,0s")
    ap.add_argument("--json")
    a = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = 4 * a.n + 256
    if soft < need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(need, soft)), hard))
    rows = []
    for spread in a.spreads.split(","):
        print("spread %s: opening %d WebSockets..." % (spread, a.n), file=sys.stderr)
        rows.append(run(a.drainit, a.n, spread))
        print(json.dumps({k: v for k, v in rows[-1].items() if k != "closes_ms"}), file=sys.stderr)
    print("| `--stream-spread` | closed (1001) | first / last close | max closes in 100 ms (ideal) "
          "| gap p50 / p99 (ideal) | drainit CPU: open / drain | RSS idle / 1,000 open / VmHWM "
          "| app's SIGTERM (after last close) | `forwarded_at_ms` | exit | `streams` |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        secs = float(r["spread"].rstrip("s") or 0)
        ideal_gap = secs * 1000 / r["n"] if secs else 0
        ideal_100 = max(1, round(100 / ideal_gap)) if ideal_gap else r["n"]
        s = r["streams"] or {}
        print("| %s | %d of %d (%d) | %s / %s ms | %d (%d) | %s / %s ms (%s) | %s / %s ms "
              "| %s / %s / %s kB | %s ms (%s) | %s | %s | %s/%s/%s/%s |" % (
                  r["spread"], r["closed"], r["n"], r["codes"].get("1001", 0),
                  ms(r["first_ms"]), ms(r["last_ms"]), r["max_per_100ms"], ideal_100,
                  ms(r["gap_p50_ms"], 2), ms(r["gap_p99_ms"], 2), ms(ideal_gap, 2),
                  ms(r["cpu_open_ms"]), ms(r["cpu_drain_ms"]),
                  ms(r["rss_idle_kb"]), ms(r["rss_open_kb"]), ms(r["hwm_kb"]),
                  ms(r["app_term_ms"]), ms(r["app_term_after_last_close_ms"], 1),
                  ms(r["forwarded_at_ms"]), r["exit"],
                  s.get("opened"), s.get("completed"), s.get("closed_by_drain"), s.get("abandoned")))
    print("\n`streams`: opened/completed/closed_by_drain/abandoned; load average %s"
          % ", ".join("%.1f" % r["load_at_sigterm"] for r in rows)
          + " at each SIGTERM; %s" % " ".join(sys.argv))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
