#!/usr/bin/env bash
# bench/proxy.sh — added latency of drainit's --proxy against the direct path, HAProxy
# and nginx, in one interleaved run, and the highest throughput of each; prints a
# Markdown table (see bench/README.md, "proxy.sh").
#
#   bench/proxy.sh [--quick] [DRAINIT_BINARY]
#
# DRAINIT_BINARY (or $DRAINIT) defaults to the static build
# target/x86_64-unknown-linux-musl/release/drainit, then target/release/drainit. A
# drainit whose --help has no --proxy is skipped (the other paths are still measured).
# Settings: BENCH_ROUNDS (10), BENCH_RATE (1000 req/s), BENCH_CONNS (16),
# BENCH_RATE_SECS (3 s per round), BENCH_MAX_SECS (2 s per round); BENCH_KEEP=1
# keeps the scratch directory (configurations, logs); BENCH_NICE=-10 runs it all at
# that niceness (same for every path) on a machine busy with other work;
# BENCH_DRAINIT_ALT=path adds a second drainit build as path "drainit-alt";
# BENCH_FLOORS=1 builds bench/floor and adds its three reference proxies, "floor-copy"
# (bytes copied, no HTTP), "floor-http1" (a minimal HTTP/1 path without hyper) and
# "floor-hyper" (the least a proxy on hyper and tokio does, as drainit's is).
#
# Installs what is missing: haproxy and nginx (apt-get), oha (cargo install oha
# --locked, a few minutes once). Needs python3. About 4 minutes; --quick (one round) about 30 s.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(dirname "$here")
# The command as run, with the BENCH_* settings given, for the report.
command_line="$( (env | grep -E '^BENCH_[A-Z_]+=' || true) | sort | tr '\n' ' ')$0${*:+ $*}"

quick=()
drainit=${DRAINIT:-}
while [ $# -gt 0 ]; do
    case "$1" in
        --quick) quick=(--quick) ;;
        -h | --help)
            sed -n '2,20p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
            exit 0
            ;;
        -*) echo "bench-proxy: unknown option $1" >&2; exit 64 ;;
        *) drainit=$1 ;;
    esac
    shift
done

say() { echo "bench-proxy: $*" >&2; }

# ---- HAProxy and nginx, from Debian ------------------------------------------------------
export PATH="$PATH:/usr/sbin:/sbin:$HOME/.cargo/bin"
missing=()
command -v haproxy >/dev/null 2>&1 || missing+=(haproxy)
command -v nginx >/dev/null 2>&1 || missing+=(nginx)
if [ ${#missing[@]} -gt 0 ]; then
    [ "$(id -u)" -eq 0 ] || { say "needs ${missing[*]}: install them, or run as root"; exit 1; }
    say "installing ${missing[*]} (apt-get)"
    apt-get update -qq >&2
    # No service is started by the package here (no systemd); the bench runs its own
    # instances on free ports with configurations in a scratch directory.
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >&2
fi

# ---- oha, the load generator (fixed rate, latency percentiles, JSON) ---------------------
if ! command -v oha >/dev/null 2>&1; then
    command -v cargo >/dev/null 2>&1 || { say "oha is missing and there is no cargo to install it"; exit 1; }
    say "installing oha (cargo install oha --locked; a few minutes, once)"
    cargo install oha --locked >&2
fi
command -v python3 >/dev/null 2>&1 || { say "python3 is required"; exit 1; }

# ---- drainit ------------------------------------------------------------------------------
if [ -z "$drainit" ]; then
    for c in "$repo/target/x86_64-unknown-linux-musl/release/drainit" "$repo/target/release/drainit"; do
        if [ -x "$c" ]; then drainit=$c; break; fi
    done
fi
skip=""
if [ -z "$drainit" ]; then
    skip="no drainit binary (cargo build --release --target x86_64-unknown-linux-musl)"
elif ! "$drainit" --help 2>/dev/null | grep -- '--proxy' >/dev/null; then
    skip="$drainit has no --proxy (its --help does not list it)"
    drainit=""
else
    drainit=$(cd "$(dirname "$drainit")" && pwd)/$(basename "$drainit")
fi
if [ -n "$skip" ]; then say "drainit skipped: $skip"; else say "drainit: $drainit"; fi
alt=${BENCH_DRAINIT_ALT:-}
if [ -n "$alt" ]; then
    [ -x "$alt" ] || { say "BENCH_DRAINIT_ALT=$alt is not an executable"; exit 1; }
    alt=$(cd "$(dirname "$alt")" && pwd)/$(basename "$alt")
    say "drainit-alt: $alt"
fi

extras=()
if [ -n "${BENCH_FLOORS:-}" ]; then
    say "building bench/floor (reference proxies)"
    cargo build -q --release --manifest-path "$here/floor/Cargo.toml" --target-dir "$repo/target/bench-floor" >&2
    for f in floor-copy floor-http1 floor-hyper; do extras+=(--extra "$f=$repo/target/bench-floor/release/$f"); done
fi

work=$(mktemp -d /tmp/drainit-bench-proxy.XXXXXX)
# BENCH_KEEP=1 keeps the scratch directory (configurations, logs) for a look afterwards.
if [ -n "${BENCH_KEEP:-}" ]; then say "keeping $work"; else trap 'rm -rf "$work"' EXIT; fi

# BENCH_NICE=-10 runs the whole bench (app, proxies, oha) at that niceness: on a machine
# shared with builds, the scheduler's delays otherwise swamp microsecond differences.
# Every path gets the same priority, so the comparison stays fair.
nice=()
if [ -n "${BENCH_NICE:-}" ]; then nice=(nice -n "$BENCH_NICE"); say "niceness $BENCH_NICE"; fi

"${nice[@]}" python3 "$here/proxy.py" \
    --workdir "$work" --oha "$(command -v oha)" \
    --nginx "$(command -v nginx)" --haproxy "$(command -v haproxy)" \
    --drainit "$drainit" --drainit-skip "$skip" --drainit-alt "$alt" \
    --command "$command_line" "${extras[@]}" "${quick[@]}"
