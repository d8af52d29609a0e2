#!/usr/bin/env bash
# bench/run.sh — compare drainit with tini, dumb-init and catatonit on this machine,
# in one interleaved run, and print a Markdown table (see bench/README.md).
#
#   bench/run.sh [--quick] [DRAINIT_BINARY]
#
# DRAINIT_BINARY (or $DRAINIT) defaults to target/release/drainit, then the static
# build target/x86_64-unknown-linux-musl/release/drainit (then the static glibc
# build, target/x86_64-unknown-linux-gnu/release/drainit). Without any, the other
# inits are still compared. Round counts: BENCH_ROUNDS, BENCH_STARTUP_RUNS,
# BENCH_SIGNALS, BENCH_ORPHANS, BENCH_IDLE_SECS, BENCH_DEADLINE_RUNS,
# BENCH_DRAIN_TIMEOUT_MS; BENCH_OUT=file.json keeps the raw samples.
#
# Needs root (PID namespaces via unshare, apt-get), gcc and python3. Never part of
# the test suite: tests must not depend on timing.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(dirname "$here")
command_line="$0${*:+ $*}"

quick=()
drainit=${DRAINIT:-}
while [ $# -gt 0 ]; do
    case "$1" in
        --quick) quick=(--quick) ;;
        -h | --help)
            sed -n '2,14p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
            exit 0
            ;;
        -*) echo "bench: unknown option $1" >&2; exit 64 ;;
        *) drainit=$1 ;;
    esac
    shift
done

say() { echo "bench: $*" >&2; }

if [ "$(id -u)" -ne 0 ]; then
    say "needs root: the orphan benchmark runs each init as PID 1 in a new PID namespace"
    exit 1
fi

# ---- the inits to compare against, from Debian ------------------------------------
missing=()
for bin in tini dumb-init catatonit; do
    command -v "$bin" >/dev/null 2>&1 || missing+=("$bin")
done
if [ ${#missing[@]} -gt 0 ]; then
    say "installing ${missing[*]} (apt-get)"
    apt-get update -qq >&2
    pkgs=()
    for p in "${missing[@]}"; do
        # Only ask for packages this distribution actually has a candidate for.
        if apt-cache policy "$p" 2>/dev/null | grep 'Candidate: [0-9]' >/dev/null; then
            pkgs+=("$p")
        else
            say "no Debian package named $p here; it will be skipped"
        fi
    done
    if [ ${#pkgs[@]} -gt 0 ]; then
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${pkgs[@]}" >&2
    fi
fi
# Debian's tini package also ships /usr/bin/tini-static; bench.py uses it when present.

for tool in gcc python3 unshare file; do
    command -v "$tool" >/dev/null 2>&1 || { say "$tool is required"; exit 1; }
done

# ---- drainit ------------------------------------------------------------------------
static_build="$repo/target/x86_64-unknown-linux-musl/release/drainit"
[ -x "$static_build" ] || static_build="$repo/target/x86_64-unknown-linux-gnu/release/drainit"
if [ -z "$drainit" ]; then
    for c in "$repo/target/release/drainit" "$static_build"; do
        if [ -x "$c" ]; then drainit=$c; break; fi
    done
fi
if [ -n "$drainit" ]; then
    drainit=$(cd "$(dirname "$drainit")" && pwd)/$(basename "$drainit")
    [ -x "$drainit" ] || { say "drainit binary $drainit is not executable"; exit 1; }
    say "drainit: $drainit"
else
    say "no drainit binary (build it with: cargo build --release); comparing the others only"
fi

# ---- helpers, built fresh in a scratch directory --------------------------------------
work=$(mktemp -d /tmp/drainit-bench.XXXXXX)
trap 'rm -rf "$work"' EXIT
gcc -O2 -Wall -o "$work/helper" "$here/helper.c"
# drainit is measured from a copy: the file the linker has just written can sit in
# the page cache in larger folios, which a page fault maps whole, and the same bytes
# then read ~300 KiB more resident memory than a copy does (bench/README.md, "Resident memory").
if [ -n "$drainit" ]; then
    cp "$drainit" "$work/drainit"
    drainit=$work/drainit
fi

python3 "$here/bench.py" \
    --helper "$work/helper" --workdir "$work" \
    --drainit "$drainit" --drainit-static "$static_build" \
    --command "$command_line" "${quick[@]}"
