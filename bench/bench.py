#!/usr/bin/env python3
"""Compare drainit with tini, dumb-init and catatonit in one interleaved run.

Called by bench/run.sh, which installs the other inits and compiles helper.c.
Progress goes to stderr; the Markdown report goes to stdout. Every wait is
bounded, so a broken init under test shows up as "n/a" or a failure count
instead of a hung benchmark. Standard library only.

Rounds: in each round every init (and /bin/true run directly, as a baseline)
takes its turn at every measurement, in an order rotated by one each round, so
that drift of the machine (a build next door, thermal state, page cache) spreads
over all of them instead of landing on one.
"""

import argparse
import json
import math
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time


SIG_CHUNK = 20  # signals per init start; the inits take turns between chunks


def log(msg):
    print(f"bench: {msg}", file=sys.stderr, flush=True)


def env_int(name, default):
    v = os.environ.get(name)
    return int(v) if v not in (None, "") else default


def pct(values, p):
    """Nearest-rank percentile; None on no data."""
    if not values:
        return None
    s = sorted(values)
    return s[max(0, math.ceil(p / 100 * len(s)) - 1)]


def med(values):
    return statistics.median(values) if values else None


class Init:
    def __init__(self, name, path, prefix):
        self.name = name
        self.path = path  # the binary
        self.prefix = prefix  # argv before the child's command

    def argv(self, *cmd):
        return self.prefix + list(cmd)


def discover(drainit):
    inits = []
    for name, extra in (
        ("tini", ["--"]),
        ("tini-static", ["--"]),
        ("dumb-init", []),
        ("catatonit", ["--"]),
    ):
        p = shutil.which(name)
        if p:
            inits.append(Init(name, p, [p] + extra))
        else:
            log(f"{name} not found, skipped")
    if drainit:
        if os.access(drainit, os.X_OK):
            inits.append(Init("drainit", drainit, [drainit, "--probe-addr", "off", "--"]))
        else:
            log(f"drainit binary {drainit} missing or not executable, skipped")
    return inits


# ---- measurements -------------------------------------------------------------


def run_helper(args, timeout):
    """Run the C helper; return (stdout lines, stderr text) or (None, reason)."""
    try:
        p = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, "timeout"
    return p.stdout.split(), p.stderr


def measure_startup(h, commands, n):
    """Each command n times, taking turns run by run (helper spawnmix).

    Returns ([samples per command], [non-zero exits per command]).
    """
    sep = "@@drainit-bench@@"
    args = [h.helper, "spawnmix", str(n), sep]
    for argv in commands:
        args += [sep] + argv
    samples = [[] for _ in commands]
    fails = [0 for _ in commands]
    out, err = run_helper(args, timeout=60 + n * len(commands) * 0.2)
    if out is None:
        return samples, [n for _ in commands]
    for idx, ns in zip(out[0::2], out[1::2]):
        samples[int(idx)].append(int(ns))
    for line in err.splitlines():
        if line.startswith("fail "):
            _, idx, count = line.split()
            fails[int(idx)] += int(count)
    return samples, fails


def cpu_cgroup():
    """A cpu cgroup of our own for the container row, or (None, why not).

    A container's processes sit in a cgroup with the cpu controller (Docker,
    Kubernetes, systemd services), where the scheduler's autogroups, one per
    session, do not apply (kernel/sched/autogroup.h, task_wants_autogroup: only
    tasks of the root task group get one). cgroup v1's cpu hierarchy, or v2 with
    cpu enabled for the root's children.
    """
    name = f"drainit-bench.{os.getpid()}"
    why = "no cpu controller mounted"
    for base, v2 in (("/sys/fs/cgroup/cpu", False), ("/sys/fs/cgroup", True)):
        if v2:
            try:
                with open(os.path.join(base, "cgroup.subtree_control")) as f:
                    if "cpu" not in f.read().split():
                        continue
            except OSError:
                continue
        elif not os.path.isdir(base):
            continue
        path = os.path.join(base, name)
        try:
            os.mkdir(path)
            return path, None
        except OSError as e:
            why = f"{path}: {e.strerror}"
    return None, why


def measure_siglat(h, init, n, cgroup=None):
    fifo = os.path.join(h.workdir, "sig.fifo")

    def enter():
        with open(os.path.join(cgroup, "cgroup.procs"), "w") as f:
            f.write("0")

    try:
        p = subprocess.run(
            [h.helper, "siglat", str(n), fifo] + init.argv(h.helper, "sigchild", fifo),
            capture_output=True, text=True, timeout=30 + n * 2.1,
            preexec_fn=enter if cgroup else None)
        out, err = p.stdout.split(), p.stderr
    except subprocess.TimeoutExpired:
        out, err = None, "timeout"
    if out is None:
        return [], n, "timeout"
    lost = 0
    problems = []
    for line in err.splitlines():
        if line.startswith("lost "):
            lost += int(line.split()[1])
        elif line.startswith(("exit ", "helper:")):
            problems.append(line.strip())
    return [int(x) for x in out], lost, "; ".join(problems)


def measure_orphans(h, init, n):
    cmd = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child"] + init.argv(
        h.helper, "orphans", str(n), "60"
    )
    try:
        p = subprocess.run(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, timeout=150
        )
    except subprocess.TimeoutExpired:
        return None
    for line in p.stdout.splitlines():
        if line.startswith("orphans="):
            return {k: int(v) for k, v in (kv.split("=") for kv in line.split())}
    return None


def read_status(pid):
    """Resident and anonymous memory (KiB) of the process, context switches summed
    over threads. The memory from /proc/PID/smaps_rollup (`Rss`, `Anonymous`),
    which walks the page tables: status's VmRSS and RssAnon are per-CPU counters
    since Linux 6.2, read without folding what each CPU has not yet added (up to
    32 pages per CPU), so a process whose pages were faulted on another CPU (by
    a thread there, or after a migration) reads up to 128 KiB off on 2 CPUs.
    status's fields where smaps_rollup is missing (before Linux 4.14)."""
    fields = {}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                k, _, v = line.partition(":")
                if k in ("Rss", "Anonymous"):
                    fields["VmRSS" if k == "Rss" else "RssAnon"] = v.strip()
    except FileNotFoundError:
        pass
    if len(fields) < 2:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                k, _, v = line.partition(":")
                fields[k] = v.strip()
    switches = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                for line in f:
                    if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                        switches += int(line.split()[1])
        except FileNotFoundError:
            pass
    kib = lambda k: int(fields.get(k, "0 kB").split()[0])  # noqa: E731
    return kib("VmRSS"), kib("RssAnon"), switches


def children_of(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


def free_loopback_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure_idle(specs, idle_secs):
    """Start every init wrapping `sleep`, all at once, and watch them idle together.

    Returns {name: (rss_kib, rss_anon_kib, ctxt_switches_in_window)}.
    """
    procs = {}
    for name, argv in specs:
        procs[name] = subprocess.Popen(
            argv + ["sleep", str(int(idle_secs) + 60)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    results = {}
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not all(
            children_of(p.pid) for p in procs.values()
        ):
            time.sleep(0.02)
        time.sleep(0.5)  # let each init finish its start-up work
        before = {}
        for name, p in procs.items():
            if p.poll() is None and children_of(p.pid):
                before[name] = read_status(p.pid)
        time.sleep(idle_secs)
        for name, b in before.items():
            p = procs[name]
            if p.poll() is None:
                rss, anon, sw = read_status(p.pid)
                results[name] = (rss, anon, sw - b[2])
    finally:
        for name, p in procs.items():
            for c in children_of(p.pid):
                try:
                    os.kill(c, signal.SIGKILL)  # the child exits → the init exits
                except ProcessLookupError:
                    pass
        for name, p in procs.items():
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    return results


def measure_deadline(h, drainit, n, timeout_ms):
    """n drains of a child that ignores SIGTERM; lateness of the SIGKILL."""
    fifo = os.path.join(h.workdir, "dl.fifo")
    errfile = os.path.join(h.workdir, "dl.err")
    rows = []
    for _ in range(n):
        cmd = [h.helper, "deadline", fifo, errfile, "20", drainit,
               "--probe-addr", "off", "--pre-drain-delay", "0s",
               "--drain-timeout", f"{timeout_ms}ms", "--",
               h.helper, "ignterm", fifo]
        out, _ = run_helper(cmd, timeout=60)
        if not out or len(out) < 2 or int(out[0]) < 0:
            rows.append(None)
            if len(rows) >= 3 and all(x is None for x in rows[-3:]):
                log("  deadline: 3 drains in a row failed, giving up on this round")
                break
            continue
        death_ns, code = int(out[0]), int(out[1])
        report = None
        try:
            with open(errfile) as f:
                lines = [l for l in f.read().splitlines() if l.strip()]
            report = json.loads(lines[-1]) if lines else None
        except (OSError, ValueError):
            report = None
        rows.append((death_ns, code, report))
    return rows


# ---- binary facts ---------------------------------------------------------------


def binary_facts(path):
    real = os.path.realpath(path)
    size = os.path.getsize(real)
    try:
        desc = subprocess.run(["file", "-L", real], capture_output=True, text=True).stdout
    except FileNotFoundError:
        desc = ""
    if "statically linked" in desc or "static-pie linked" in desc:
        static = "yes"
    elif "dynamically linked" in desc:
        static = "no"
    else:
        ldd = subprocess.run(["ldd", real], capture_output=True, text=True)
        static = "yes" if "not a dynamic executable" in (ldd.stdout + ldd.stderr) else "no"
    return size, static


def version_of(init):
    for flag in ("--version", "-V"):
        try:
            p = subprocess.run([init.path, flag], capture_output=True, text=True, timeout=5)
        except (subprocess.TimeoutExpired, OSError):
            continue
        text = (p.stdout + p.stderr).strip().splitlines()
        if p.returncode == 0 and text:
            return text[0].strip()
    return "?"


# ---- report -------------------------------------------------------------------------


def fmt(v, scale=1.0, digits=2):
    if v is None:
        return "n/a"
    return f"{v / scale:.{digits}f}"


def cell(v, ref, scale=1.0, digits=2):
    """Value and its ratio to tini's."""
    if v is None:
        return "n/a"
    s = fmt(v, scale, digits)
    if ref:
        s += f" ({v / ref:.2f}×)"
    return s


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--helper", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--drainit", default="")
    ap.add_argument("--drainit-static", default="")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--command", default="")
    a = ap.parse_args()
    q = a.quick
    cfg = {
        "BENCH_ROUNDS": env_int("BENCH_ROUNDS", 1 if q else 3),
        "BENCH_STARTUP_RUNS": env_int("BENCH_STARTUP_RUNS", 150 if q else 600),
        "BENCH_SIGNALS": env_int("BENCH_SIGNALS", 60 if q else 600),
        "BENCH_ORPHANS": env_int("BENCH_ORPHANS", 5000 if q else 20000),
        "BENCH_IDLE_SECS": env_int("BENCH_IDLE_SECS", 2 if q else 5),
        "BENCH_DEADLINE_RUNS": env_int("BENCH_DEADLINE_RUNS", 10 if q else 50),
        "BENCH_DRAIN_TIMEOUT_MS": env_int("BENCH_DRAIN_TIMEOUT_MS", 300),
    }
    rounds = max(1, cfg["BENCH_ROUNDS"])

    def share(total, r):
        """Round r's share of a total, so that the shares add up to the total."""
        return max(1, total // rounds + (1 if r < total % rounds else 0))

    h = argparse.Namespace(helper=a.helper, workdir=a.workdir)
    inits = discover(a.drainit)
    if not inits:
        log("nothing to measure")
        return 1
    names = [i.name for i in inits]
    drainit = next((i for i in inits if i.name == "drainit"), None)

    startup = {n: [] for n in names + ["direct"]}
    startup_fail = {n: 0 for n in names + ["direct"]}
    siglat = {n: [] for n in names}
    siglat_cg = {n: [] for n in names}
    cgroup, cgroup_why = cpu_cgroup()
    sig_lost = {n: 0 for n in names}
    sig_notes = {n: set() for n in names}
    orphans = {n: [] for n in names}
    idle = {n: [] for n in names}
    deadline_rows = []

    idle_specs = [(i.name, i.argv()) for i in inits]
    if drainit:
        port = free_loopback_port()
        idle_specs.append(
            ("drainit+probe",
             [drainit.path, "--probe-addr", f"127.0.0.1:{port}", "--"])
        )
        idle["drainit+probe"] = []

    t_start = time.monotonic()
    for r in range(rounds):
        order = inits[r % len(inits):] + inits[: r % len(inits)]
        log(f"round {r + 1}/{rounds}: order {', '.join(i.name for i in order)}")
        # Start-up + exit, the baseline in the rotation too; run by run in turn.
        seq = [None] + order
        vals, fails = measure_startup(
            h, [["/bin/true"] if i is None else i.argv("/bin/true") for i in seq],
            share(cfg["BENCH_STARTUP_RUNS"], r))
        for i, v, f in zip(seq, vals, fails):
            name = "direct" if i is None else i.name
            startup[name] += v
            startup_fail[name] += f
        log("  start-up done")
        # Signals in chunks of SIG_CHUNK, the inits taking turns chunk by chunk.
        left = share(cfg["BENCH_SIGNALS"], r)
        broken = set()  # inits whose child never started: not worth more waits
        while left > 0:
            n = min(SIG_CHUNK, left)
            left -= n
            for i in order:
                if i.name in broken:
                    continue
                vals, lost, note = measure_siglat(h, i, n)
                if "never became ready" in note:
                    broken.add(i.name)
                siglat[i.name] += vals
                sig_lost[i.name] += lost
                if note:
                    sig_notes[i.name].add(note)
                if cgroup and i.name not in broken:
                    vals, lost, note = measure_siglat(h, i, n, cgroup)
                    siglat_cg[i.name] += vals
                    sig_lost[i.name] += lost
                    if note:
                        sig_notes[i.name].add(note)
        log("  signal latency done")
        for i in order:
            res = measure_orphans(h, i, cfg["BENCH_ORPHANS"])
            orphans[i.name].append(res)
            log(f"  orphans {i.name}: {res}")
        res = measure_idle(idle_specs[r % len(idle_specs):] + idle_specs[: r % len(idle_specs)],
                           cfg["BENCH_IDLE_SECS"])
        for name, _ in idle_specs:
            idle[name].append(res.get(name))
        log(f"  idle: {res}")
        if drainit:
            deadline_rows += measure_deadline(
                h, drainit.path, share(cfg["BENCH_DEADLINE_RUNS"], r),
                cfg["BENCH_DRAIN_TIMEOUT_MS"])
            log("  deadline done")
    elapsed = time.monotonic() - t_start
    if cgroup:
        os.rmdir(cgroup)

    # ---- aggregate ----
    cols = names
    ref = "tini" if "tini" in names else names[0]
    direct_med = med(startup["direct"])
    st_med = {n: med(startup[n]) for n in names}
    st_p99 = {n: pct(startup[n], 99) for n in names}
    sl_med = {n: med(siglat[n]) for n in names}
    sl_p99 = {n: pct(siglat[n], 99) for n in names}
    slc_med = {n: med(siglat_cg[n]) for n in names}
    slc_p99 = {n: pct(siglat_cg[n], 99) for n in names}

    def ok_orphans(n):
        return [o for o in orphans[n] if o and o["reap_ns"] >= 0]

    reap_med = {n: med([o["reap_ns"] for o in ok_orphans(n)]) for n in names}
    cpu_med = {n: med([o["init_cpu_ns"] for o in ok_orphans(n) if o["init_cpu_ns"] >= 0])
               for n in names}
    zombies = {}
    for n in names:
        zs = [o["zombies"] for o in orphans[n] if o]
        failed = sum(1 for o in orphans[n] if not o)
        zombies[n] = (str(max(zs)) if zs else "n/a") + (f" ({failed} runs failed)" if failed else "")

    def idle_stat(n, k):
        vals = [x[k] for x in idle.get(n, []) if x]
        return med(vals)

    rss = {n: idle_stat(n, 0) for n in idle}
    anon = {n: idle_stat(n, 1) for n in idle}
    wake = {n: idle_stat(n, 2) for n in idle}
    facts = {i.name: binary_facts(i.path) for i in inits}

    def row(label, values, refv, scale=1.0, digits=2, ratio=True):
        cells = [cell(values[n], refv if ratio else None, scale, digits) for n in cols]
        return f"| {label} | " + " | ".join(cells) + " |"

    out = []
    out.append("## drainit benchmark")
    out.append("")
    out.append(f"Machine: {os.uname().sysname} {os.uname().release}, {os.cpu_count()} CPUs. "
               f"Rounds: {rounds} (interleaved, order rotated each round). "
               f"Ratios in parentheses are against {ref} (lower is better everywhere).")
    out.append("")
    out.append("| measure | " + " | ".join(cols) + " |")
    out.append("|---|" + "---|" * len(cols))
    out.append(row(f"start+exit `/bin/true`, median ms (n={len(startup[ref])})",
                   st_med, st_med[ref], 1e6))
    out.append(row("start+exit, p99 ms", st_p99, st_p99[ref], 1e6))
    if direct_med:
        out.append("| ×`/bin/true` run directly (median "
                   f"{direct_med / 1e6:.2f} ms) | "
                   + " | ".join(f"{st_med[n] / direct_med:.2f}×" if st_med[n] else "n/a"
                                for n in cols) + " |")
        out.append("| overhead over direct, median ms | "
                   + " | ".join(f"{(st_med[n] - direct_med) / 1e6:.2f}" if st_med[n] else "n/a"
                                for n in cols) + " |")
    out.append(row("RSS of the init (smaps_rollup `Rss`), KiB", rss, rss.get(ref), 1, 0))
    out.append(row("of which anonymous (`Anonymous`), KiB", anon, anon.get(ref), 1, 0))
    out.append("| binary size, KiB | " + " | ".join(
        f"{facts[n][0] / 1024:.0f} ({facts[n][0] / facts[ref][0]:.2f}×)" for n in cols) + " |")
    out.append("| static | " + " | ".join(facts[n][1] for n in cols) + " |")
    out.append(row(f"signal forward latency, median µs (n={len(siglat[ref])})",
                   sl_med, sl_med[ref], 1e3, 1))
    out.append(row("signal forward latency, p99 µs", sl_p99, sl_p99[ref], 1e3, 1))
    if cgroup:
        out.append(row("… in a cpu cgroup, as in a container, median µs "
                       f"(n={len(siglat_cg[ref])})", slc_med, slc_med[ref], 1e3, 1))
        out.append(row("… in a cpu cgroup, p99 µs", slc_p99, slc_p99[ref], 1e3, 1))
    out.append(row(f"reap {cfg['BENCH_ORPHANS']} orphans as PID 1, wall ms (median)",
                   reap_med, reap_med[ref], 1e6, 0))
    out.append(row("… CPU time of the init meanwhile, ms (median)", cpu_med, cpu_med[ref], 1e6, 0))
    out.append("| … zombies left (max) | " + " | ".join(zombies[n] for n in cols) + " |")
    out.append(row(f"idle wake-ups (context switches) in {cfg['BENCH_IDLE_SECS']} s, median",
                   wake, None, 1, 0, ratio=False))
    notes = []
    for n in names + ["direct"]:
        if startup_fail[n]:
            notes.append(f"{n}: {startup_fail[n]} start-up runs exited non-zero")
    for n in names:
        if sig_lost[n]:
            notes.append(f"{n}: {sig_lost[n]} signals never reached the child")
        for s in sig_notes[n]:
            notes.append(f"{n}: signal run: {s}")
    if not cgroup:
        notes.append(f"no signal rows in a cpu cgroup: {cgroup_why}")
    if "drainit+probe" in idle:
        notes.append(
            "drainit with its probe server on 127.0.0.1: "
            f"RSS {fmt(rss['drainit+probe'], 1, 0)} KiB, "
            f"idle wake-ups {fmt(wake['drainit+probe'], 1, 0)} in {cfg['BENCH_IDLE_SECS']} s")
    if a.drainit_static and os.path.exists(a.drainit_static):
        size, static = binary_facts(a.drainit_static)
        notes.append(f"static build {a.drainit_static}: {size / 1024:.0f} KiB, static: {static}")
    if notes:
        out.append("")
        for n in notes:
            out.append(f"- {n}")

    if drainit:
        good = [x for x in deadline_rows if x and x[0] >= 0]
        late_ms = [x[0] / 1e6 - cfg["BENCH_DRAIN_TIMEOUT_MS"] for x in good]
        codes = [x[1] for x in good]
        rep = []
        for x in good:
            d = (x[2] or {}).get("drain") or {}
            if isinstance(d.get("finished_at_ms"), (int, float)) and isinstance(
                d.get("deadline_ms"), (int, float)
            ):
                rep.append(d["finished_at_ms"] - d["deadline_ms"])
        out.append("")
        out.append(f"### drainit deadline precision ({len(deadline_rows)} drains, "
                   f"`--pre-drain-delay 0s --drain-timeout {cfg['BENCH_DRAIN_TIMEOUT_MS']}ms`, "
                   "child ignores SIGTERM)")
        out.append("")
        out.append("| measure | median | p99 | max |")
        out.append("|---|---|---|---|")
        out.append("| child's death − (kill(SIGTERM) + drain timeout), ms | "
                   + " | ".join(fmt(f(late_ms)) for f in (med, lambda v: pct(v, 99),
                                                            lambda v: max(v) if v else None))
                   + " |")
        out.append("| report `finished_at_ms − deadline_ms`, ms | "
                   + " | ".join(fmt(f(rep), 1, 0) for f in (med, lambda v: pct(v, 99),
                                                               lambda v: max(v) if v else None))
                   + " |")
        out.append("")
        out.append(f"- exit code 2 in {codes.count(2)} of {len(deadline_rows)} drains"
                   + (f"; other codes: {sorted(set(c for c in codes if c != 2))}"
                      if any(c != 2 for c in codes) else "")
                   + (f"; {len(deadline_rows) - len(good)} drains failed to run"
                      if len(good) < len(deadline_rows) else "")
                   + (f"; {len(good) - len(rep)} reports without drain times"
                      if len(rep) < len(good) else ""))

    out.append("")
    out.append("Versions: " + "; ".join(f"{i.name} `{i.path}` {version_of(i)}" for i in inits))
    out.append("")
    out.append("Settings: " + " ".join(f"{k}={v}" for k, v in cfg.items())
               + f"; total {elapsed:.0f} s")
    out.append("")
    out.append(f"Command: `{a.command}`")
    print("\n".join(out))

    if os.environ.get("BENCH_OUT"):
        with open(os.environ["BENCH_OUT"], "w") as f:
            json.dump({"config": cfg, "startup": startup, "siglat": siglat,
                       "siglat_cgroup": siglat_cg,
                       "orphans": orphans, "idle": idle,
                       "deadline": deadline_rows}, f)
        log(f"raw data written to {os.environ['BENCH_OUT']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
