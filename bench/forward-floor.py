#!/usr/bin/env python3
"""bench/forward-floor.py [--cgroup] DRAINIT [ROUNDS]: signal forward latency of
drainit against the smallest forwarders of forward-floor.c and dumb-init,
interleaved in chunks of 20 signals per round (helper.c's `siglat`, as run.sh
measures it). Prints the median per forwarder, µs. --cgroup: everything in a cpu
cgroup of its own, as in a container (bench.py's `cpu_cgroup`: no scheduler
autogroups there). Needs gcc and dumb-init; root for --cgroup."""
import os, statistics, subprocess, sys, tempfile

here = os.path.dirname(os.path.abspath(__file__))
args = sys.argv[1:]
cgroup = None
if args and args[0] == "--cgroup":
    args = args[1:]
    sys.path.insert(0, here)
    from bench import cpu_cgroup
    cgroup, why = cpu_cgroup()
    if not cgroup:
        sys.exit(f"forward-floor: no cpu cgroup: {why}")
    with open(os.path.join(cgroup, "cgroup.procs"), "w") as f:
        f.write("0")
drainit, rounds = args[0], int(args[1]) if len(args) > 1 else 15
work = tempfile.mkdtemp(prefix="drainit-floor.")
helper, floor = os.path.join(work, "helper"), os.path.join(work, "floor")
subprocess.run(["gcc", "-O2", "-o", helper, os.path.join(here, "helper.c")], check=True)
subprocess.run(["gcc", "-O2", "-o", floor, os.path.join(here, "forward-floor.c")], check=True)
inits = {
    "sigwait (C)": [floor, "sigwait"],
    "signalfd-epoll (C)": [floor, "signalfd-epoll"],
    "sigwait-setsid (C)": [floor, "sigwait-setsid"],
    "dumb-init": ["dumb-init"],
    "drainit": [drainit, "--probe-addr", "off", "--"],
}
got = {k: [] for k in inits}
fifo = os.path.join(work, "sig.fifo")
for _ in range(rounds):
    for name, argv in inits.items():
        if os.path.exists(fifo):
            os.unlink(fifo)
        p = subprocess.run([helper, "siglat", "20", fifo] + argv + [helper, "sigchild", fifo],
                           capture_output=True, text=True, timeout=120)
        got[name] += [int(x) for x in p.stdout.split()]
for name, v in got.items():
    print(f"{name}: n={len(v)} median {statistics.median(v) / 1000:.1f} µs" if v else f"{name}: none")
if cgroup:
    with open(os.path.join(os.path.dirname(cgroup), "cgroup.procs"), "w") as f:
        f.write("0")
    os.rmdir(cgroup)
