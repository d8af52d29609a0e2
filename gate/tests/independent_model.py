#!/usr/bin/env python3
"""A second, independent implementation of the scenario of docs/gate.md, written from
the specification's text (not from the Rust), to check drainit-gate's model on
random settings (gate/tests/independent.rs).

Reads one JSON object of settings per line on stdin (the keys of `drainit-gate
model --json`'s "settings"), prints one JSON object per line: the ledger, the gate
and the requests (id, arrived_s, worker, end_s, status).

The specification, as implemented here (one clock tick per whole second, nothing
event-driven, unlike the Rust):
- workers W1..Wn start at 0 with `slots` slots, ready from start + startup;
- request i (1-based) arrives at first_at + (i-1)*every and runs `duration`;
- the router: candidates are up, admitting, not full, and (with route_ready)
  ready; least load (running invocations), ties to the lowest index; none: 503;
  without route_ready, a request sent to a worker not yet ready fails at once
  (500) and takes no slot;
- SIGTERM to W1 at signal_at: handling it, W1 stops admitting, finishes what runs,
  exits when nothing is left, and SIGKILL at signal_at + grace kills what still
  runs; not handling it, W1 exits at the signal and its invocations are killed;
- replacement: W(n+1) starts at the signal;
- one second's order: completions, then the signal and SIGKILL, then arrivals;
- the gate passes when nothing failed or was killed and
  rejected <= allow_503 percent of the requests.
"""

import json
import sys


def simulate(s):
    n = s["requests"]
    arrive = [s["first_at_s"] + i * s["every_s"] for i in range(n)]
    duration = s["duration_s"]
    startup = s["startup_s"]
    signal_at = s["signal_at_s"]
    kill_at = signal_at + s["grace_s"]

    workers = [{"start": 0, "up": True, "admitting": True, "jobs": {}}
               for _ in range(s["workers"])]
    rows = {}

    def ready(w, t):
        return t >= w["start"] + startup

    def kill_w1(t):
        w1 = workers[0]
        for rid in sorted(w1["jobs"]):
            rows[rid].update(end_s=t, status="killed")
        w1["jobs"] = {}
        w1["up"] = False

    last = max(arrive[-1], kill_at, signal_at + startup) + duration + 2
    for t in range(last + 1):
        # Completions.
        for w in workers:
            for rid, end in list(w["jobs"].items()):
                if end == t:
                    rows[rid].update(end_s=t, status="committed")
                    del w["jobs"][rid]
        w1 = workers[0]
        if w1["up"] and not w1["admitting"] and not w1["jobs"]:
            w1["up"] = False
        # The signal, then SIGKILL.
        if t == signal_at:
            if w1["up"]:
                w1["admitting"] = False
                if not s["handles_term"]:
                    kill_w1(t)
                elif not w1["jobs"]:
                    w1["up"] = False
            if s["replacement"]:
                workers.append({"start": t, "up": True, "admitting": True, "jobs": {}})
        if t == kill_at and s["handles_term"] and w1["up"]:
            kill_w1(t)
        # Arrivals.
        for i in range(n):
            if arrive[i] != t:
                continue
            rid = i + 1
            cands = [k for k, w in enumerate(workers)
                     if w["up"] and w["admitting"] and len(w["jobs"]) < s["slots"]
                     and (ready(w, t) or not s["route_ready"])]
            if not cands:
                rows[rid] = dict(id=rid, arrived_s=t, worker=None, end_s=t, status="rejected")
                continue
            k = min(cands, key=lambda k: (len(workers[k]["jobs"]), k))
            if not ready(workers[k], t):
                rows[rid] = dict(id=rid, arrived_s=t, worker=k + 1, end_s=t, status="failed")
                continue
            workers[k]["jobs"][rid] = t + duration
            rows[rid] = dict(id=rid, arrived_s=t, worker=k + 1, end_s=t + duration,
                             status="running")

    requests = [rows[i + 1] for i in range(n)]
    assert all(r["status"] != "running" for r in requests), "the run ended with work running"
    count = {k: sum(r["status"] == k for r in requests)
             for k in ("committed", "rejected", "failed", "killed")}
    passes = (count["failed"] == 0 and count["killed"] == 0
              and count["rejected"] * 100 <= s["allow_503_pct"] * n)
    return dict(count, gate="pass" if passes else "fail", requests=requests)


for line in sys.stdin:
    if line.strip():
        print(json.dumps(simulate(json.loads(line))), flush=True)
