#!/usr/bin/env python3
"""Regenerates hot-text.ld: the functions drainit runs when it starts, serves its
probes, drains and exits, placed first in the static binary's code.

    python3 scripts/hot-text.py        # → hot-text.ld (commit it)

Why: the kernel maps a file's pages 64 KiB around each page fault (fault-around),
so a binary whose few hot functions are spread over all of its 1.5 MB of code has
nearly all of it resident. With the hot functions side by side, drainit's resident
memory is what it runs, not the size of everything linked in (the admission proxy,
HTTP/2, TOML parsing, backtraces). bench/README.md, "Hot code first", has the figures.

How: the static musl release build with its symbols kept (target/hot-text/,
DRAINIT_KEEP_SYMBOLS=1: build.rs then does not strip them) runs a few
scenarios under `valgrind --tool=callgrind --demangle=no`; every function it saw
executed becomes one input-section pattern of a linker script that GNU ld and lld
insert before `.text` (build.rs passes it for musl targets). The patterns drop the
parts of a symbol name that change from build to build (legacy `17h<hash>E`, v0
crate disambiguators `Cs<hash>_`, LLVM's `.NNN` clone suffixes), so the file stays
valid across source edits; a function that is renamed, or new, falls back to the
ordinary `.text` (more resident memory, never a failure). Regenerate it after a
dependency or toolchain update.

Needs: valgrind, the x86_64-unknown-linux-musl target, sleep and sh. Takes ~3 min.
"""

import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET = "x86_64-unknown-linux-musl"
TARGET_DIR = os.path.join(ROOT, "target", "hot-text")
OUT = os.path.join(ROOT, "hot-text.ld")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build():
    # The shipped build's own symbol names: the same profile, only the link keeps
    # the symbols (build.rs).
    env = dict(os.environ, DRAINIT_KEEP_SYMBOLS="1")
    subprocess.run(
        ["cargo", "build", "--release", "--target", TARGET, "--target-dir", TARGET_DIR],
        cwd=ROOT,
        env=env,
        check=True,
    )
    return os.path.join(TARGET_DIR, TARGET, "release", "drainit")


def get(port, path):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return None


def callgrind(out, argv, during=None, term_after=None, timeout=120):
    """Runs drainit under callgrind; `during(proc)` runs once it is up; SIGTERM
    after `term_after` s (None: it exits by itself)."""
    cmd = [
        "valgrind", "--tool=callgrind", "--demangle=no", "--trace-children=no",
        f"--callgrind-out-file={out}",
    ] + argv
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if during:
        during(p)
    if term_after is not None:
        time.sleep(term_after)
        p.send_signal(signal.SIGTERM)
    p.wait(timeout=timeout)


def scenarios(binary, work):
    outs = []

    # 1. A quiet life: start, readiness and liveness asked (a kubelet, a Docker
    #    HEALTHCHECK), the child exits by itself, the report; once more without
    #    the probe server.
    # 2. A drain: metrics and an unknown path asked, the drain signal, a child
    #    that drains.
    # 3. A child that ignores the drain signal: the deadline, SIGKILL, exit 2.
    def asking(port, paths):
        def ask(_p):
            deadline = time.time() + 60
            while time.time() < deadline and get(port, "/readyz") != 200:
                time.sleep(0.2)
            for path in paths:
                get(port, path)

        return ask

    # Twice: which timers fire, and so which code runs, varies from run to run.
    for run in range(2):
        port = free_port()
        out = os.path.join(work, f"cg.quiet.{run}")
        callgrind(
            out,
            [binary, "--probe-addr", f"127.0.0.1:{port}", "--", "sleep", "6"],
            during=asking(port, ["/healthz", "/readyz"]),
        )
        outs.append(out)
    # The same life without the probe server (`--probe-addr off`: a shell-script
    # test, a batch job): its parsing of `off` is the only code it adds.
    out = os.path.join(work, "cg.quiet.off")
    callgrind(out, [binary, "--probe-addr", "off", "--", "sleep", "2"])
    outs.append(out)

    # The drain, after a signal forwarded at once (SIGWINCH, which sleep
    # ignores): the forward's path is hot too.
    def asking_then_forwarding(port, paths):
        ask = asking(port, paths)

        def run(p):
            ask(p)
            p.send_signal(signal.SIGWINCH)
            time.sleep(0.3)

        return run

    port = free_port()
    out = os.path.join(work, "cg.drain")
    callgrind(
        out,
        [binary, "--probe-addr", f"127.0.0.1:{port}", "--report-file",
         os.path.join(work, "report.json"), "--", "sleep", "1000"],
        during=asking_then_forwarding(port, ["/metrics", "/nope"]),
        term_after=1.0,
    )
    outs.append(out)

    out = os.path.join(work, "cg.deadline")
    callgrind(
        out,
        [binary, "--probe-addr", "off", "--pre-drain-delay", "0s", "--drain-timeout", "1s",
         "--", "sh", "-c", "trap '' TERM; sleep 1000 & wait; wait"],
        term_after=3.0,
    )
    outs.append(out)
    return outs


NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_$.]*")


def pattern(name):
    """The build-independent input-section pattern of one symbol."""
    name = re.sub(r"\.[0-9]+$", ".*", name)  # LLVM clone suffix
    m = re.match(r"^(_ZN.*)17h[0-9a-f]{16}E(\.\*)?$", name)
    if m:
        return m.group(1) + "17h*"  # legacy mangling: the hash changes
    if name.startswith("_R"):
        return re.sub(r"Cs[0-9A-Za-z]*_", "Cs*_", name)  # v0: crate disambiguators
    return name


def main():
    # DRAINIT_HOT_TEXT_BIN: a build with symbols made already (the shipped
    # flags and DRAINIT_KEEP_SYMBOLS=1), instead of building one here.
    binary = os.environ.get("DRAINIT_HOT_TEXT_BIN") or build()
    # One group of patterns per scenario, in the scenarios' order, each without
    # what an earlier one has: the code of the shortest life first, then what a
    # life with probes and a drain adds, then the deadline's. Idle, drainit keeps
    # only the first groups resident.
    # LLVM merges identical functions and keeps the others' names as aliases:
    # callgrind may name a function by an alias, while its section is named
    # after the one kept. Every name at the address of an executed one counts.
    at, aliases = {}, {}
    nm = subprocess.run(["nm", binary], capture_output=True, text=True, check=True)
    for line in nm.stdout.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1] in "tTwW":
            at[parts[2]] = parts[0]
            aliases.setdefault(parts[0], []).append(parts[2])
    pats, seen, names = [], set(), set()
    with tempfile.TemporaryDirectory(prefix="drainit-hot-text.") as work:
        for out in scenarios(binary, work):
            group = set()
            with open(out, errors="replace") as f:
                for line in f:
                    m = re.match(r"^c?fn=\(\d+\)(?: (.*))?$", line.rstrip("\n"))
                    if m and m.group(1) and NAME.fullmatch(m.group(1)):
                        names.add(m.group(1))
                        for name in aliases.get(at.get(m.group(1)), [m.group(1)]):
                            group.add(pattern(name))
            pats += sorted(group - seen)
            seen |= group
    with open(OUT, "w") as f:
        f.write(
            "/* Generated by scripts/hot-text.py: the functions drainit runs when it\n"
            "   starts, serves its probes, drains and exits, first in its code (fewer\n"
            "   resident pages). build.rs passes it to the linker for musl targets. */\n"
            "SECTIONS\n{\n  .text.drainit.hot :\n  {\n"
            "    *rcrt1.o(.text .text.*)\n    *crt1.o(.text .text.*)\n"
            "    *libc.a:(.text .text.*)\n"
        )
        for p in pats:
            # `.text.unlikely.`: functions marked cold (std's slow paths).
            f.write(f"    *(.text.{p} .text.unlikely.{p})\n")
        f.write("  }\n}\nINSERT BEFORE .text;\n")
    print(f"hot-text: {len(names)} functions, {len(pats)} patterns → {OUT}")


if __name__ == "__main__":
    sys.exit(main())
