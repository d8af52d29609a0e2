#!/usr/bin/env python3
"""Regenerates hot-text.ld: the functions drainit runs when it starts, serves its
probes, drains and exits, placed first in the static binary's code, and the
read-only data it reads to start and idle, placed first in its read-only data.

    python3 scripts/hot-text.py        # → hot-text.ld (commit it)

Why: the kernel maps a file's pages 64 KiB around each page fault (fault-around),
so a binary whose few hot functions are spread over all of its 1.5 MB of code has
nearly all of it resident. With the hot functions side by side, drainit's resident
memory is what it runs, not the size of everything linked in (the admission proxy,
HTTP/2, TOML parsing, backtraces). bench/README.md, "Hot code first", has the figures.
The same holds for `.rodata` (290 KiB): the constants start-up reads (format
strings, clap's and the settings' tables, std's) sat in every one of its 64 KiB
windows, so all of it was resident.

How: the static musl release build with its symbols kept (target/hot-text/,
DRAINIT_KEEP_SYMBOLS=1: build.rs then does not strip them) and its link map
(DRAINIT_LINK_MAP: build.rs asks the linker for one) runs a few scenarios under
valgrind. First under `--tool=lackey --trace-mem=yes`, up to the moment it idles:
with `--probe-addr off`, with the probe server, and after /readyz and /healthz were
asked; every instruction and every read-only datum it touched meanwhile names a
function, and an input section of the link map. Then the whole lives under
`--tool=callgrind --demangle=no`: a start, probes asked, a drain, a deadline. Every
function seen becomes one input-section pattern of the `.text.drainit.hot` section,
in that order (what an idle init runs first, so that it keeps only that resident;
inside an idle group, a pattern that also places other instances of a generic
function comes last; musl's objects an idle init runs first of all, the rest of
musl last), and every read-only input section touched one of `.rodata.drainit.hot`.
GNU ld and lld insert the first before `.text` and the second after `.rodata`
(build.rs passes the script for musl targets). The code the child runs between
`clone` and `execve` (spawn.rs's `exec_child`: valgrind does not follow it) and
musl's vDSO look-up (valgrind maps no vDSO) are named by hand, with what they call.

The text patterns drop the parts of a symbol name that change from build to build
(legacy `17h<hash>E`, v0 crate disambiguators `Cs<hash>_`, LLVM's `.NNN` clone
suffixes), so the file stays valid across source edits; a function that is
renamed, or new, falls back to the ordinary `.text` (more resident memory, never a
failure). The constants of `.rodata` have no names of their own: LLVM names them
`anon.<hash of the crate's global names>.<N>`, stable for the dependencies until
they change, and for drainit's own two crates until an edit adds or renames a
function or a constant before them; those that no longer match fall back to the
ordinary `.rodata` (more resident memory, never a failure). The hash also follows
the features cargo unifies, that is which packages are built together: this script
builds the default members, as release.sh builds `-p drainit -p drainit-gate`; a
`cargo build -p drainit` alone names drainit's constants otherwise, and idles
about 128 KiB bigger (measured 752 against 628 KiB). Regenerate it after a
dependency or toolchain update, and after a change to what start-up runs; the
build it traces must be the shipped one (RUSTFLAGS as release.sh sets them: a
static-PIE build is refused).

Needs: valgrind, the x86_64-unknown-linux-musl target, GNU ld (the link map is
read in its format), objdump, sleep and sh. Takes ~2 min.
"""

import bisect
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
MAP = os.path.join(TARGET_DIR, "drainit.map")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build():
    # The shipped build's own symbol names: the same profile, only the link keeps
    # the symbols (build.rs).
    env = dict(os.environ, DRAINIT_KEEP_SYMBOLS="1", DRAINIT_LINK_MAP=MAP)
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


def children_of(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return f.read().split()
    except OSError:
        return []


def lackey_idle(log, argv, paths=(), env=None):
    """Runs drainit (its child `sleep`) under lackey until it idles, asks the
    probe `paths` if any, and returns the addresses of the instructions it ran
    and of the memory it read or wrote meanwhile (what the rest of its life does
    is the callgrind scenarios' part)."""
    cmd = ["valgrind", "--tool=lackey", "--trace-mem=yes", f"--log-file={log}"] + argv
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         env=dict(os.environ, **(env or {})))
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not any(
            open(f"/proc/{c}/comm").read().strip() == "sleep" for c in children_of(p.pid)
        ):
            time.sleep(0.2)
        # The start's last steps after the spawn (the runtime's first turns).
        time.sleep(2)
        port = next((a.rsplit(":", 1)[1] for a in argv if a.startswith("127.0.0.1:")), None)
        for path in paths:
            get(port, path)
        if paths:
            time.sleep(2)
        size = os.path.getsize(log)
    finally:
        # Its child too: killed with drainit, it would stay, an orphan.
        for child in children_of(p.pid):
            try:
                os.kill(int(child), signal.SIGKILL)
            except OSError:
                pass
        p.kill()
        p.wait()
    code, data = set(), set()
    with open(log, errors="replace") as f:
        for line in f.read(size).splitlines():
            m = re.match(r"^(I | L | S | M )\s*([0-9a-f]+),", line)
            if m:
                (code if m.group(1) == "I " else data).add(int(m.group(2), 16))
    return code, data


def text_symbols(binary):
    """`(start, end, names)` of every function of `binary`, sorted: LLVM merges
    identical functions and keeps the others' names as aliases, so one address may
    have several names, and the section is named after one of them."""
    nm = subprocess.run(["nm", "-S", binary], capture_output=True, text=True, check=True)
    by_at = {}
    for line in nm.stdout.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[2] in "tTwW":
            at, size = int(parts[0], 16), int(parts[1], 16)
            end, names = by_at.get(at, (at, []))
            by_at[at] = (max(end, at + size), names + [parts[3]])
    return sorted((at, end, names) for at, (end, names) in by_at.items())


def containing(ranges, addresses):
    """The indexes of `ranges` (sorted `(start, end, …)`) holding one of `addresses`."""
    starts = [r[0] for r in ranges]
    hit = set()
    for a in addresses:
        i = bisect.bisect_right(starts, a) - 1
        if i >= 0 and a < ranges[i][1]:
            hit.add(i)
    return hit


def input_sections(link_map, prefix):
    """`(start, end, name, file)` of every input section named `prefix…` in the
    link map (GNU ld's format: the name, then address, size and file, on one line
    or two)."""
    out = []
    with open(link_map, errors="replace") as f:
        lines = f.read().splitlines()
    head = re.compile(r"^ (" + re.escape(prefix) + r"\S*)(?:\s+0x([0-9a-f]+)\s+0x([0-9a-f]+)\s+(\S+))?\s*$")
    for i, line in enumerate(lines):
        m = head.match(line)
        if not m:
            continue
        if m.group(2):
            at, size, path = m.group(2), m.group(3), m.group(4)
        else:
            n = re.match(r"^\s+0x([0-9a-f]+)\s+0x([0-9a-f]+)\s+(\S+)", lines[i + 1] if i + 1 < len(lines) else "")
            if not n:
                continue
            at, size, path = n.groups()
        at, size = int(at, 16), int(size, 16)
        if at and size:
            out.append((at, at + size, m.group(1), path))
    return sorted(out)


def libc_members(link_map):
    """`(start, end, member)` of musl's code, one `.text` per object of libc.a
    (not built with a section per function)."""
    out = []
    for at, end, _, path in input_sections(link_map, ".text"):
        m = re.search(r"libc\.a\((.+)\)$", path)
        if m:
            out.append((at, end, m.group(1)))
    return out


def rodata_pattern(name, path):
    """The input-section pattern of one read-only section: functions' tables
    (`.rodata.<symbol>`, `.rodata..Lswitch.table.<symbol>`) as the text patterns,
    LLVM's constants (`.rodata..Lanon.<hash>.<N>`) and the merged ones
    (`.rodata.str1.1`, `.rodata.cst16`) by their exact name; musl's by its archive."""
    if "libc.a(" in path:
        return f"*libc.a:({name})"
    for prefix in (".rodata..Lswitch.table.", ".rodata."):
        rest = name[len(prefix):]
        if name.startswith(prefix) and (rest.startswith("_R") or rest.startswith("_ZN")):
            return f"*({prefix}{pattern(rest)})"
    return f"*({name})"


def reached(binary, roots, stops):
    """The start addresses of the functions `roots` (start addresses) call,
    directly or through others, themselves included: the calls and jumps
    `objdump -d` shows (not the indirect ones), not through `stops` (the
    failure paths: they do not run at a start that works)."""
    dump = subprocess.run(
        ["objdump", "-d", "--no-show-raw-insn", binary], capture_output=True, text=True, check=True
    )
    calls, current = {}, None
    for line in dump.stdout.splitlines():
        m = re.match(r"^([0-9a-f]+) <.*>:$", line)
        if m:
            current = int(m.group(1), 16)
            calls[current] = set()
            continue
        m = re.match(r"^\s+[0-9a-f]+:\s+(?:call|jmp|j[a-z]+)\s+([0-9a-f]+) <", line)
        if m and current is not None:
            calls[current].add(int(m.group(1), 16))
    seen, todo = set(), list(roots)
    while todo:
        at = todo.pop()
        if at not in seen and at not in stops:
            seen.add(at)
            todo.extend(calls.get(at, ()))
    return seen


# Code that runs at every start but not under valgrind: the child's side of spawn,
# between `clone` and `execve` (spawn.rs; valgrind does not follow a CLONE_VM
# child), and musl's look-up of clock_gettime in the vDSO (valgrind maps none).
UNSEEN = re.compile(r"^_ZN7drainit5spawn\d+(exec_child|switch_ids|fill_listen_pid)|^__vdsosym$")
# What the child calls only when it fails (exit 127), and where a failure goes.
FAILING = re.compile(r"abort|assert|panic|fail|unwrap|expect|[Uu]nwind|unw_|[Ee]rror")


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


def idle_lives(binary, work):
    """What drainit touches to start and idle, in the order an init meets it:
    without the probe server (on the platform this machine is, then on none and
    in Kubernetes: each says its grace budget with constants of its own, and the
    tests run with DRAINIT_PLATFORM=none), with it, and once /readyz and /healthz
    were asked (a kubelet, a Docker HEALTHCHECK). One `(code, data)` of
    addresses each."""
    port = free_port()
    off = [binary, "--probe-addr", "off", "--", "sleep", "1000"]
    probes = [binary, "--probe-addr", f"127.0.0.1:{port}", "--", "sleep", "1000"]
    lives = [
        (off, (), {}),
        (off, (), {"DRAINIT_PLATFORM": "none"}),
        (off, (), {"DRAINIT_PLATFORM": "kubernetes"}),
        (probes, (), {}),
        (probes, ("/readyz", "/healthz"), {}),
    ]
    return [
        lackey_idle(os.path.join(work, f"lackey.{i}"), argv, paths, env)
        for i, (argv, paths, env) in enumerate(lives)
    ]


def main():
    # DRAINIT_HOT_TEXT_BIN and DRAINIT_HOT_TEXT_MAP: a build with symbols made
    # already (the shipped flags, DRAINIT_KEEP_SYMBOLS=1 and DRAINIT_LINK_MAP=its
    # map), instead of building one here.
    binary = os.environ.get("DRAINIT_HOT_TEXT_BIN") or build()
    # The shipped build is linked at fixed addresses (RUSTFLAGS with
    # `-C relocation-model=static`, as release.sh builds it): a static-PIE build is
    # moved at load, so no address valgrind sees would match its link map.
    with open(binary, "rb") as f:
        if f.read(18)[16] != 2:  # e_type ET_EXEC (ELF header, little-endian)
            sys.exit(
                "hot-text: " + binary + " is position-independent: build with "
                "RUSTFLAGS='-C target-feature=+crt-static -C relocation-model=static' "
                "(as release.sh does)"
            )
    link_map = os.environ.get("DRAINIT_HOT_TEXT_MAP", MAP)
    functions = text_symbols(binary)
    sections = input_sections(link_map, ".rodata")
    members = libc_members(link_map)
    # One group of patterns per scenario, in the scenarios' order, each without
    # what an earlier one has: the code an idle init ran to start (without probes,
    # with them, asked), then what a whole life, a drain and a deadline add. Idle,
    # drainit keeps only the first groups resident.
    # LLVM merges identical functions and keeps the others' names as aliases:
    # callgrind may name a function by an alias, while its section is named
    # after the one kept. Every name at the address of an executed one counts.
    aliases = {}
    for at, _, all_names in functions:
        for name in all_names:
            aliases[name] = all_names
    pats, seen, names, libc = [], set(), set(), set()
    data_pats, data_seen = [], set()

    # The bytes each pattern places: every function whose name it matches (one
    # generic function's instances share a pattern, the hash being dropped).
    placed = {}
    for at, end, all_names in functions:
        for p in {pattern(name) for name in all_names}:
            placed[p] = placed.get(p, 0) + end - at

    def add(group, ran=None):
        """`ran`: the bytes of each pattern the group ran. A pattern that places
        more than that (other instances of a generic function) goes after those
        that place only what ran, so that what the group runs stays together."""
        nonlocal pats, seen
        waste = (lambda p: max(placed.get(p, 0) - ran.get(p, 0), 0)) if ran else (lambda p: 0)
        pats += sorted(group - seen, key=lambda p: (waste(p), p))
        seen |= group

    with tempfile.TemporaryDirectory(prefix="drainit-hot-text.") as work:
        for n, (code, data) in enumerate(idle_lives(binary, work)):
            if n == 0:
                # That code and all it calls (musl's execvpe and the rest).
                roots = [at for at, _, all_names in functions if any(UNSEEN.search(x) for x in all_names)]
                stops = {at for at, _, all_names in functions if any(FAILING.search(x) for x in all_names)}
                code = code | reached(binary, roots, stops)
            group, ran = set(), {}
            for i in containing(functions, code):
                names.update(functions[i][2])
                at, end, all_names = functions[i]
                for p in {pattern(name) for name in all_names}:
                    group.add(p)
                    ran[p] = ran.get(p, 0) + end - at
            # musl's objects, whole, those start-up runs first.
            libc.update(members[i][2] for i in containing(members, code))
            add(group, ran)
            # The read-only data in the order the binary has it (a table next to
            # the function that reads it, a crate's constants together).
            for i in sorted(containing(sections, data)):
                p = rodata_pattern(sections[i][2], sections[i][3])
                if p not in data_seen:
                    data_pats.append(p)
                    data_seen.add(p)
        for out in scenarios(binary, work):
            group = set()
            with open(out, errors="replace") as f:
                for line in f:
                    m = re.match(r"^c?fn=\(\d+\)(?: (.*))?$", line.rstrip("\n"))
                    if m and m.group(1) and NAME.fullmatch(m.group(1)):
                        names.add(m.group(1))
                        for name in aliases.get(m.group(1), [m.group(1)]):
                            group.add(pattern(name))
            add(group)
    with open(OUT, "w") as f:
        f.write(
            "/* Generated by scripts/hot-text.py: the functions drainit runs when it\n"
            "   starts, serves its probes, drains and exits, first in its code, and the\n"
            "   read-only data it reads to start and idle, first in its read-only data\n"
            "   (fewer resident pages). build.rs passes it to the linker for musl\n"
            "   targets. */\n"
            "SECTIONS\n{\n  .text.drainit.hot :\n  {\n"
            "    *rcrt1.o(.text .text.*)\n    *crt1.o(.text .text.*)\n"
        )
        for member in sorted(libc):
            f.write(f"    *libc.a:{member}(.text .text.*)\n")
        for p in pats:
            # `.text.unlikely.`: functions marked cold (std's slow paths).
            f.write(f"    *(.text.{p} .text.unlikely.{p})\n")
        # The rest of musl: callgrind names its functions, not their objects.
        f.write("    *libc.a:(.text .text.*)\n")
        f.write("  }\n}\nINSERT BEFORE .text;\n")
        f.write("SECTIONS\n{\n  .rodata.drainit.hot :\n  {\n")
        for p in data_pats:
            f.write(f"    {p}\n")
        f.write("  }\n}\nINSERT AFTER .rodata;\n")
    print(
        f"hot-text: {len(names)} functions, {len(pats)} patterns, "
        f"{len(data_pats)} read-only sections → {OUT}"
    )


if __name__ == "__main__":
    sys.exit(main())
