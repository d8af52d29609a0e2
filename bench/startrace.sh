#!/usr/bin/env bash
# bench/startrace.sh — the start-up race, measured: SIGTERM sent 0/50/200/1000 µs
# after execve to drainit (dynamic glibc and static musl builds) and to the C
# floor (a C program whose first statement blocks every signal; dynamic and
# static), each as an ordinary process and as PID 1 of a new PID namespace.
# Needs root (CLONE_NEWPID) and gcc. Prints a markdown table:
# killed / drained / lost out of TRIES per cell (bench/startrace.c says what each
# means). All programs take turns within each (mode, delay) step, in one run.
#
#   sudo bench/startrace.sh [TRIES]            (default 100 tries per cell)
#
# Environment: STARTRACE_GLIBC, STARTRACE_MUSL (the two drainit binaries; default
# target/release/drainit and target/x86_64-unknown-linux-musl/release/drainit),
# STARTRACE_GLIBC_BEFORE, STARTRACE_MUSL_BEFORE (optional: older builds, compared
# in the same run),
# STARTRACE_DELAYS (default 0,50,200,1000), STARTRACE_TIMEOUT_MS (default 300:
# how long a try waits before calling the signal lost; a drain here takes a few ms).
set -euo pipefail
cd "$(dirname "$0")/.."

tries=${1:-100}
delays=${STARTRACE_DELAYS:-0,50,200,1000}
timeout_ms=${STARTRACE_TIMEOUT_MS:-300}
glibc=$(realpath "${STARTRACE_GLIBC:-target/release/drainit}")
musl=$(realpath "${STARTRACE_MUSL:-target/x86_64-unknown-linux-musl/release/drainit}")
sleep_bin=$(command -v sleep)

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
gcc -O2 -o "$work/startrace" bench/startrace.c
gcc -O2 -static -o "$work/startrace-static" bench/startrace.c

# The drain needs no delay (and none is applied outside Kubernetes anyway): the
# SIGTERM is forwarded at once, `sleep` dies of it, drainit exits 0.
dflags=(--probe-addr off --pre-drain-delay 0s --drain-timeout 2s --log-level off)
names=("C floor, dynamic" "C floor, static" "drainit glibc (dynamic)" "drainit musl (static)")
cmds=(
  :: "$work/startrace" floor
  :: "$work/startrace-static" floor
  :: "$glibc" "${dflags[@]}" -- "$sleep_bin" 5
  :: "$musl" "${dflags[@]}" -- "$sleep_bin" 5
)
# Older builds to compare with, in the same run (e.g. before a change).
if [ -n "${STARTRACE_GLIBC_BEFORE:-}" ]; then
  names+=("drainit glibc, before")
  cmds+=(:: "$(realpath "$STARTRACE_GLIBC_BEFORE")" "${dflags[@]}" -- "$sleep_bin" 5)
fi
if [ -n "${STARTRACE_MUSL_BEFORE:-}" ]; then
  names+=("drainit musl, before")
  cmds+=(:: "$(realpath "$STARTRACE_MUSL_BEFORE")" "${dflags[@]}" -- "$sleep_bin" 5)
fi
env -u KUBERNETES_SERVICE_HOST "$work/startrace" "$tries" "$timeout_ms" "$delays" plain,pid1 \
  "${cmds[@]}" 2>/dev/null >"$work/out"

echo "SIGTERM sent N µs after execve; killed / drained / lost of $tries tries per cell"
echo "(lost: still running ${timeout_ms} ms later; $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg))"
echo
IFS=, read -ra ds <<<"$delays"
for mode in plain pid1; do
  label=$([ "$mode" = pid1 ] && echo "PID 1 of a PID namespace" || echo "ordinary process")
  printf '| %s |' "$label"
  for d in "${ds[@]}"; do printf ' %s µs |' "$d"; done
  echo
  printf '|---|'
  for _ in "${ds[@]}"; do printf -- '---|'; done
  echo
  for i in "${!names[@]}"; do
    printf '| %s |' "${names[$i]}"
    for d in "${ds[@]}"; do
      awk -v i="$i" -v m="$mode" -v d="$d" \
        '$1==i && $2==m && $3==d { printf " %d / %d / %d%s |", $5, $7, $9, ($11 ? " (+" $11 " other)" : "") }' \
        "$work/out"
    done
    echo
  done
  echo
done
