#!/usr/bin/env python3
# attack.py -- a hostile client against the proxy, measured (not asserted).
#
#   python3 bench/attack.py [--bin PATH] [--flood N]
#
# Runs drainit (--bin, default target/debug/drainit) with --proxy in front of
# tests/fixtures/rawapp.py and prints one line per finding:
#   1. pipelining client during a drain: an 8 KiB receive buffer, GET of a
#      100,000-byte response, a second request 30 ms later: bytes received,
#      how the connection ended, the report's completed / canceled.
#   3. idle flood: N idle connections (default 5000; RLIMIT_NOFILE raised to
#      fit), then one request on a new connection: its answer time, and
#      drainit's RSS and open descriptors while the flood is held.
#   4. RFC 9112 leftovers: the status each bad request gets, and what the app
#      received as Content-Length for `Content-Length: 0005`.
#   2. HTTP/2: an h2c app allowing 100 streams (tests/fixtures/h2app.py, run by
#      /usr/bin/python3, which needs the `h2` package), one client opening 150
#      streams of 8 s (`nghttp -m 150`), then another client's request
#      (`nghttp`): its answer time. Skipped without nghttp.
# Python 3 stdlib only (the h2c app needs `h2`).
import argparse, json, os, resource, socket, subprocess, sys, time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
ap = argparse.ArgumentParser()
ap.add_argument("--bin", default=os.path.join(ROOT, "target/debug/drainit"))
ap.add_argument("--flood", type=int, default=5000)
opts = ap.parse_args()


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def start(pre_drain="0s"):
    port, app, probe = free_port(), free_port(), free_port()
    err = open("/tmp/attack-%d.err" % port, "w+")
    p = subprocess.Popen(
        [opts.bin, "--probe-addr", "127.0.0.1:%d" % probe,
         "--proxy", "127.0.0.1:%d=127.0.0.1:%d" % (port, app),
         "--ready-tcp", "127.0.0.1:%d" % app, "--pre-drain-delay", pre_drain,
         "--drain-timeout", "5s", "--", sys.executable,
         os.path.join(ROOT, "tests/fixtures/rawapp.py"), "--port", str(app)],
        stderr=err)
    for _ in range(200):
        if get(probe, "/readyz").startswith("HTTP/1.1 200"):
            break
        time.sleep(0.05)
    return p, port, probe, err


def get(port, path):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
            s.sendall(b"GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n" % path.encode())
            return s.makefile("rb").read().decode("latin1")
    except OSError:
        return ""


def report(p, err):
    p.send_signal(15)
    p.wait(20)
    err.seek(0)
    lines = [l for l in err.read().splitlines() if l.strip()]
    return json.loads(lines[-1])["requests"]


def pipelining():
    p, port, probe, err = start("3s")
    p.send_signal(15)
    while not get(probe, "/readyz").startswith("HTTP/1.1 503"):
        time.sleep(0.02)
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8192)
    s.connect(("127.0.0.1", port))
    s.sendall(b"GET /bytes?n=100000 HTTP/1.1\r\nHost: a\r\n\r\n")
    time.sleep(0.03)
    s.sendall(b"GET /second HTTP/1.1\r\nHost: a\r\n\r\n")
    got, end = b"", "EOF"
    while True:
        try:
            d = s.recv(4096)
        except OSError as e:
            end = e.strerror
            break
        if not d:
            break
        got += d
    body = got.split(b"\r\n\r\n", 1)[1] if b"\r\n\r\n" in got else b""
    p.wait(20)
    err.seek(0)
    req = json.loads([l for l in err.read().splitlines() if l.strip()][-1])["requests"]
    print("1. pipelining during a drain: %d of 100000 body bytes, then %s; report completed %d, canceled %d"
          % (len(body), end, req["completed"], req["canceled"]))


def status_of(port, raw, timeout=5, whole=False):
    """The answer's status line (or all of it, `whole`), or `error ...`."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall(raw)
            f = s.makefile("rb")
            return (f.read() if whole else f.readline()).decode("latin1")
    except OSError as e:
        return "error %s" % e


def rfc():
    p, port, probe, err = start()
    rows = [
        b"GET /h HTTP/1.1\r\nHost: a, b\r\n\r\n",
        b"GET /h HTTP/1.1\r\nHost: a/b?c@d\r\n\r\n",
        b"GET http://user:pw@evil/ HTTP/1.1\r\nHost: a\r\n\r\n",
        b"GET ftp://evil/ HTTP/1.1\r\nHost: a\r\n\r\n",
        b"POST /c HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\nZZ\r\n\r\n",
    ]
    out = []
    for r in rows:
        out.append("%r -> %s" % (r.split(b"\r\n")[0 if b"Host: a\r" in r else 1].decode(),
                                  status_of(port, r)[9:12]))
    cl = status_of(port, b"POST /length HTTP/1.1\r\nHost: a\r\nContent-Length: 0005\r\n"
                         b"Connection: close\r\n\r\nhello", whole=True)
    out.append("Content-Length: 0005 -> app got %r" % cl.rsplit("\r\n\r\n", 1)[-1])
    req = report(p, err)
    print("4. RFC 9112 leftovers: " + "; ".join(out)
          + "; report malformed %d, canceled %d" % (req["malformed"], req["canceled"]))


def flood():
    n = opts.flood
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = max(soft, min(hard, 4 * n + 2048))
    resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    p, port, probe, err = start()
    conns = []
    for _ in range(n):
        s = socket.socket()
        s.setblocking(False)
        try:
            s.connect(("127.0.0.1", port))
        except BlockingIOError:
            pass
        conns.append(s)
    time.sleep(2)
    t = time.monotonic()
    got = status_of(port, b"GET /x HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n", 60)
    took = time.monotonic() - t
    rss = [l for l in open("/proc/%d/status" % p.pid) if l.startswith("VmRSS")][0].split()[1]
    fds = len(os.listdir("/proc/%d/fd" % p.pid))
    for s in conns:
        s.close()
    report(p, err)
    print("3. %d idle connections (RLIMIT_NOFILE %d): a new request answered %s in %.3f s; "
          "drainit RSS %s kB, %d open descriptors" % (n, want, got[9:12], took, rss, fds))


def h2stall():
    import shutil
    if not shutil.which("nghttp"):
        print("2. HTTP/2: skipped (no nghttp)")
        return
    port, app, probe = free_port(), free_port(), free_port()
    log = "/tmp/attack-h2-%d.log" % port
    err = open("/tmp/attack-%d.err" % port, "w+")
    p = subprocess.Popen(
        [opts.bin, "--probe-addr", "127.0.0.1:%d" % probe,
         "--proxy", "127.0.0.1:%d=127.0.0.1:%d" % (port, app),
         "--ready-tcp", "127.0.0.1:%d" % app, "--pre-drain-delay", "0s",
         "--drain-timeout", "5s", "--", "/usr/bin/python3",
         os.path.join(ROOT, "tests/fixtures/h2app.py"), "--port", str(app),
         "--log", log, "--max-streams", "100"],
        stderr=err)
    for _ in range(200):
        if get(probe, "/readyz").startswith("HTTP/1.1 200"):
            break
        time.sleep(0.05)
    a = subprocess.Popen(["nghttp", "-m", "150", "http://127.0.0.1:%d/hold?ms=8000" % port],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(200):
        if os.path.exists(log) and open(log).read().count("recv GET /hold") >= 100:
            break
        time.sleep(0.05)
    t = time.monotonic()
    b = subprocess.run(["nghttp", "http://127.0.0.1:%d/ok" % port], capture_output=True, timeout=60)
    took = time.monotonic() - t
    a.wait(60)
    report(p, err)
    print("2. HTTP/2: an app allowing 100 streams, one client's 150 streams of 8 s: "
          "another client's request answered %r in %.3f s" % (b.stdout.decode().strip(), took))


pipelining()
flood()
rfc()
h2stall()
