#!/usr/bin/env python3
"""The arm64 build against tini-static for arm64, both under qemu-user emulation.

    python3 bench/arm64.py DRAINIT_ARM64 TINI_STATIC_ARM64 [RUNS]

    DRAINIT_ARM64       dist/drainit-arm64 (release.sh)
    TINI_STATIC_ARM64   tini built static for aarch64 (bench/README.md "arm64" says how)
    RUNS                start+exit runs per init, interleaved (default 200)

Prints a Markdown table: binary size, start+exit `/bin/true` (median and p99 ms of
`qemu-aarch64-static INIT -- /bin/true`, spawn to exit), and VmRSS / RssAnon /
RssFile of the emulated init 0.5 s after its child (`sleep`) started, 5 runs each.

Under emulation, every figure is qemu's as much as the init's: the start includes
qemu loading and translating the code it runs (a JIT), and the RSS includes qemu
itself and its translation cache. Only the ratio between the two inits under the same
emulator says something about the binaries, and only roughly. A benchmark, never a
test.
"""

import os
import statistics
import subprocess
import sys
import time

QEMU = os.environ.get("QEMU", "qemu-aarch64-static")


def argv(name, path, app):
    # drainit without its probe server (tini has none); tini takes the command after --.
    if name == "drainit":
        return [QEMU, path, "--probe-addr", "off", "--", *app]
    return [QEMU, path, "--", *app]


def start_exit(cmd):
    t = time.perf_counter()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return (time.perf_counter() - t) * 1000


def status(pid):
    out = {}
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            key, _, val = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssFile"):
                out[key] = int(val.split()[0])
    return out


def children(pid):
    with open("/proc/%d/task/%d/children" % (pid, pid)) as f:
        return f.read().split()


def rss(cmd):
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        end = time.monotonic() + 10
        while not children(p.pid):
            if time.monotonic() > end:
                raise RuntimeError("no child: %s" % cmd)
            time.sleep(0.01)
        time.sleep(0.5)
        return status(p.pid)
    finally:
        p.kill()
        p.wait()


def main():
    inits = {"tini-static": sys.argv[2], "drainit": sys.argv[1]}
    runs = int(sys.argv[3]) if len(sys.argv) > 3 else 200
    times = {n: [] for n in inits}
    for i in range(runs):
        # Alternate run by run, so that a noisy neighbour slows both alike.
        for name, path in inits.items():
            times[name].append(start_exit(argv(name, path, ["/bin/true"])))
    mems = {n: [] for n in inits}
    for i in range(5):
        for name, path in inits.items():
            mems[name].append(rss(argv(name, path, ["sleep", "5"])))

    def cell(name, value, base):
        return "%s (%.2f×)" % (value, float(value.split()[0]) / base)

    rows = []
    base = {}
    for name, path in inits.items():
        t = sorted(times[name])
        med = statistics.median(t)
        p99 = t[int(len(t) * 0.99) - 1]
        m = {k: statistics.median(x[k] for x in mems[name]) for k in ("VmRSS", "RssAnon", "RssFile")}
        size = os.path.getsize(path) / 1024
        base.setdefault("size", size)
        base.setdefault("med", med)
        base.setdefault("rss", m["VmRSS"])
        rows.append(
            "| %s | %s | %s | %.2f | %s | %d / %d |"
            % (
                name,
                cell(name, "%d" % size, base["size"]),
                cell(name, "%.2f" % med, base["med"]),
                p99,
                cell(name, "%d" % m["VmRSS"], base["rss"]),
                m["RssAnon"],
                m["RssFile"],
            )
        )
    print("| init (arm64, under %s) | binary KiB | start+exit median ms | p99 ms | VmRSS KiB | RssAnon / RssFile KiB |" % QEMU)
    print("|---|---|---|---|---|---|")
    print("\n".join(rows))
    print()
    print("%d start+exit runs per init, interleaved; RSS: median of 5 runs; ratios against tini-static." % runs)


if __name__ == "__main__":
    main()
