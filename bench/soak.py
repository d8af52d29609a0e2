#!/usr/bin/env python3
"""bench/soak.py — a bounded soak of drainit: does anything grow while it works?

    python3 bench/soak.py [DURATION_S] [DRAINIT]     (default 600 s, the static
                                                      musl build)

One drainit runs an app (bench/soak.py itself, as `app`) that churns orphans
(a double-forked `sleep` every 20 ms, re-parented to drainit and reaped by it) and
counts the SIGHUPs it receives. Meanwhile the soak:

  - probes: two threads open a fresh connection per request to /healthz and
    /readyz (an exec check, `true`, runs on every /readyz once ready) as fast as
    they are answered, a 2 ms pause between requests;
  - forwarded signals: SIGHUP to drainit every 100 ms, forwarded to the app;
  - samples drainit every 10 s: VmRSS (KiB), open fds, CPU (% of one core over the
    interval), zombies among its children.

Trend rule (after a 60 s warm-up, which allocator arenas and the runtime's
buffers need to settle): the samples are split in thirds; the run FAILS if the
median of the last third exceeds the median of the first third by more than
10 % + 256 KiB for RSS, or by more than 4 for fds, or if the last third's
minimum exceeds the first third's maximum for both (monotonic growth); also if
drainit dies, a probe is answered with anything but 200, more than 2 zombies are
seen in one sample, or more than 1 % + 5 of the SIGHUPs sent do not reach the app
(standard signals coalesce). At the end
drainit gets SIGTERM and must exit 0 (drained).

Prints a markdown table of the samples and the verdict; exit 0 pass, 1 fail.
"""
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time


def app(counter_path):
    """The child: orphan churn, counts SIGHUPs into counter_path."""
    hups = [0]

    def on_hup(_s, _f):
        hups[0] += 1

    signal.signal(signal.SIGHUP, on_hup)
    signal.signal(signal.SIGTERM, lambda _s, _f: sys.exit(0))
    last_write = 0.0
    while True:
        pid = os.fork()
        if pid == 0:
            # The grandchild outlives its parent: an orphan for drainit to reap.
            if os.fork() == 0:
                os.execvp("sleep", ["sleep", "0.05"])
            os._exit(0)
        os.waitpid(pid, 0)
        now = time.monotonic()
        if now - last_write > 0.5:
            with open(counter_path + ".tmp", "w") as f:
                f.write(str(hups[0]))
            os.replace(counter_path + ".tmp", counter_path)
            last_write = now
        time.sleep(0.02)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def get(port, path):
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while True:
            chunk = s.recv(4096)
            if not chunk:
                break
            data += chunk
    return int(data.split(b" ", 2)[1])


def sample(pid):
    with open(f"/proc/{pid}/status") as f:
        rss = next(int(l.split()[1]) for l in f if l.startswith("VmRSS"))
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    cpu_ticks = int(fields[11]) + int(fields[12])
    zombies = 0
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            kids = f.read().split()
        for k in kids:
            try:
                with open(f"/proc/{k}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                        zombies += 1
            except OSError:
                pass
    except OSError:
        pass
    return rss, fds, cpu_ticks, zombies


def main():
    if len(sys.argv) >= 3 and sys.argv[1] == "app":
        app(sys.argv[2])
        return 0
    duration = float(sys.argv[1]) if len(sys.argv) > 1 else 600.0
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    drainit = sys.argv[2] if len(sys.argv) > 2 else os.path.join(
        root, "target/x86_64-unknown-linux-musl/release/drainit")
    tmp = tempfile.mkdtemp(prefix="drainit-soak-")
    counter = os.path.join(tmp, "hups")
    port = free_port()
    env = dict(os.environ)
    env.pop("KUBERNETES_SERVICE_HOST", None)
    proc = subprocess.Popen(
        [drainit, "--probe-addr", f"127.0.0.1:{port}", "--ready-exec", "true",
         "--pre-drain-delay", "0s", "--drain-timeout", "5s", "--log-level", "warn",
         "--", sys.executable, os.path.abspath(__file__), "app", counter],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=open(os.path.join(tmp, "stderr"), "w"), env=env)
    pid = proc.pid
    stop = threading.Event()
    probes = {"ok": 0, "bad": 0}
    hups_sent = [0]

    def prober(path):
        while not stop.is_set():
            try:
                code = get(port, path)
                probes["ok" if code == 200 else "bad"] += 1
            except OSError:
                probes["bad"] += 1
            time.sleep(0.002)

    def hupper():
        while not stop.is_set():
            try:
                os.kill(pid, signal.SIGHUP)
                hups_sent[0] += 1
            except ProcessLookupError:
                return
            time.sleep(0.1)

    # Wait for readiness, and for the app's SIGHUP handler (its first count),
    # before loading it.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not os.path.exists(counter):
        time.sleep(0.05)
    while time.monotonic() < deadline:
        try:
            if get(port, "/readyz") == 200:
                break
        except OSError:
            pass
        time.sleep(0.05)
    threads = [threading.Thread(target=prober, args=(p,), daemon=True)
               for p in ("/healthz", "/readyz")] + [threading.Thread(target=hupper, daemon=True)]
    for t in threads:
        t.start()

    tick = os.sysconf("SC_CLK_TCK")
    start = time.monotonic()
    rows = []
    failures = []
    prev_cpu, prev_t = sample(pid)[2], start
    while time.monotonic() - start < duration:
        time.sleep(min(10, max(0.0, duration - (time.monotonic() - start))))
        if proc.poll() is not None:
            failures.append(f"drainit exited early ({proc.returncode})")
            break
        now = time.monotonic()
        rss, fds, cpu, zombies = sample(pid)
        cpu_pct = 100.0 * (cpu - prev_cpu) / tick / (now - prev_t)
        prev_cpu, prev_t = cpu, now
        try:
            hups_got = int(open(counter).read())
        except (OSError, ValueError):
            hups_got = 0
        rows.append((round(now - start), rss, fds, cpu_pct, zombies,
                     probes["ok"], probes["bad"], hups_sent[0], hups_got))
        if zombies > 2:
            failures.append(f"{zombies} zombies at {round(now - start)} s")
    stop.set()
    for t in threads:
        t.join(timeout=10)
    time.sleep(1)  # the app writes its count every 0.5 s
    try:
        hups_got = int(open(counter).read())
    except (OSError, ValueError):
        hups_got = 0
    if proc.poll() is None:
        os.kill(pid, signal.SIGTERM)
        try:
            code = proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
        if code != 0:
            failures.append(f"drainit exited {code} after SIGTERM, not 0")
    report = open(os.path.join(tmp, "stderr")).read().strip().splitlines()
    report = report[-1] if report else ""
    shutil.rmtree(tmp, ignore_errors=True)

    print(f"drainit soak, {duration:.0f} s: {drainit}")
    print()
    print("| t (s) | VmRSS (KiB) | fds | CPU % | zombies | probes ok | probes not 200 | HUP sent | HUP received |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]:.1f} | {r[4]} | {r[5]} | {r[6]} | {r[7]} | {r[8]} |")
    print()
    steady = [r for r in rows if r[0] > 60] or rows
    if not steady:
        failures.append("no sample taken")
        steady = [(0, 0, 0, 0.0, 0, 0, 0, 0, 0)]
    n = max(1, len(steady) // 3)
    first, last = steady[:n], steady[-n:]
    for name, i, rel, absolute in (("RSS", 1, 0.10, 256), ("fds", 2, 0.0, 4)):
        f_med = statistics.median(r[i] for r in first)
        l_med = statistics.median(r[i] for r in last)
        limit = f_med * (1 + rel) + absolute
        monotonic = len(steady) >= 6 and min(r[i] for r in last) > max(r[i] for r in first)
        print(f"- {name}: median {f_med} in the first third after warm-up, {l_med} in the last "
              f"(limit {limit:.0f}); last third's min {'above' if monotonic else 'not above'} "
              f"the first third's max")
        if l_med > limit or (monotonic and l_med > f_med + absolute / 4):
            failures.append(f"{name} grows: {f_med} -> {l_med}")
    if probes["bad"]:
        failures.append(f"{probes['bad']} probes not answered 200")
    # Standard signals coalesce (one pending at a time): a few may merge.
    if hups_sent[0] and hups_got < 0.99 * hups_sent[0] - 5:
        failures.append(f"only {hups_got} of {hups_sent[0]} SIGHUPs reached the app")
    print(f"- probes answered 200: {probes['ok']}; SIGHUP sent {hups_sent[0]}, received {hups_got}")
    print(f"- exit report: {report}")
    print(f"- verdict: {'FAIL: ' + '; '.join(failures) if failures else 'pass'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
