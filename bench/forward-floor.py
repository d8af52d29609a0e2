#!/usr/bin/env python3
"""bench/forward-floor.py DRAINIT [ROUNDS]: signal forward latency of drainit
against the smallest forwarders of forward-floor.c and dumb-init, interleaved in
chunks of 20 signals per round (helper.c's `siglat`, as run.sh measures it).
Prints the median per forwarder, µs. Needs gcc and dumb-init."""
import os, statistics, subprocess, sys, tempfile

here = os.path.dirname(os.path.abspath(__file__))
drainit, rounds = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 15
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
