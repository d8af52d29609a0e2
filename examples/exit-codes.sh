#!/bin/sh
# examples/exit-codes.sh — check drainit's exit codes (README, "Exit codes") from the outside.
#
#   sh examples/exit-codes.sh path/to/drainit
#
# Runs drainit as an ordinary process (no root, no PID namespace: drainit makes
# itself a subreaper), with --probe-addr off everywhere so no port is needed.
# Prints one line per assertion and "N passed, M failed"; exits 1 on any failure.
# Every run is bounded by a watchdog (LIMIT seconds), so a hang is a failure,
# never a stuck script. POSIX sh: works with dash, busybox ash and bash.
#
# The single-quoted scripts expand "$1" and "$$" in the child shell, on purpose:
# shellcheck disable=SC2016

set -u

DRAINIT=${1:-}
if [ -z "$DRAINIT" ] || [ ! -x "$DRAINIT" ]; then
    echo "usage: $0 path/to/drainit" >&2
    exit 64
fi
LIMIT=${LIMIT:-15}

tmp=$(mktemp -d "${TMPDIR:-/tmp}/drainit-exit-codes.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
trap 'exit 130' INT TERM

passed=0
failed=0

# check EXPECTED DESCRIPTION: compare $code (set by run/start+finish) with EXPECTED.
check() {
    if [ "$code" = "$1" ]; then
        passed=$((passed + 1))
        echo "ok   - $2: exit $code"
    else
        failed=$((failed + 1))
        echo "FAIL - $2: exit $code, expected $1"
        # drainit's last stderr line is its exit report: show it for diagnosis.
        if [ -s "$tmp/stderr" ]; then
            echo "       last stderr line: $(tail -n 1 "$tmp/stderr")"
        fi
    fi
}

# start CMD...: run CMD in the background with a watchdog; sets $pid.
start() {
    : >"$tmp/stderr"
    "$@" </dev/null >/dev/null 2>"$tmp/stderr" &
    pid=$!
    # The watchdog SIGKILLs CMD after LIMIT seconds. Its sleep runs in the
    # background so that the TERM sent by finish() ends the watchdog at once.
    (
        sleep "$LIMIT" &
        s=$!
        trap 'kill "$s" 2>/dev/null; exit 0' TERM
        wait "$s"
        kill -KILL "$pid" 2>/dev/null
    ) &
    watchdog=$!
}

# finish: wait for the process started by start(); sets $code.
finish() {
    wait "$pid"
    code=$?
    kill -TERM "$watchdog" 2>/dev/null
    wait "$watchdog" 2>/dev/null
}

# run CMD...: start and finish.
run() {
    start "$@"
    finish
}

# wait_for_file PATH: bounded poll (LIMIT seconds) for a file the child creates
# once it runs; drainit installs its signal handlers before it spawns the child,
# so once the file exists a SIGTERM is a drain signal, not drainit's death.
wait_for_file() {
    i=0
    while [ ! -e "$1" ]; do
        i=$((i + 1))
        if [ "$i" -gt $((LIMIT * 20)) ]; then
            return 1
        fi
        sleep 0.05 2>/dev/null || sleep 1
    done
}

# 1. The child's own exit code passes through when there was no drain signal.
run "$DRAINIT" --probe-addr off -- sh -c 'exit 0'
check 0 "child exits 0"

run "$DRAINIT" --probe-addr off -- sh -c 'exit 7'
check 7 "child exits 7"

# 2. A child killed by signal S gives 128+S, as a shell would report it.
run "$DRAINIT" --probe-addr off -- sh -c 'kill -KILL $$'
check 137 "child killed by SIGKILL"

# 3. Spawn failures: 127 not found, 126 found but not executable.
run "$DRAINIT" --probe-addr off -- "$tmp/no-such-command"
check 127 "command not found"

printf '#!/bin/sh\nexit 0\n' >"$tmp/not-executable"
chmod 644 "$tmp/not-executable"
run "$DRAINIT" --probe-addr off -- "$tmp/not-executable"
check 126 "command not executable"

# 4. Usage and configuration errors; the child must never start.
run "$DRAINIT" --probe-addr off --no-such-flag -- sh -c "touch '$tmp/started-usage'"
check 64 "unknown flag"
if [ -e "$tmp/started-usage" ]; then
    code="child started"
    check "child not started" "unknown flag starts no child"
fi

start env DRAINIT_DRAIN_TIMEOUT=banana "$DRAINIT" --probe-addr off -- sh -c "touch '$tmp/started-config'"
finish
check 78 "bad duration in DRAINIT_DRAIN_TIMEOUT"
if [ -e "$tmp/started-config" ]; then
    code="child started"
    check "child not started" "bad duration starts no child"
fi

# 5. A drain: SIGTERM to drainit, forwarded at once (pre-drain delay 0s) to a
#    `sleep` that dies of it. Every descendant exited before the deadline → 0,
#    whatever the child's own status was.
start "$DRAINIT" --probe-addr off --pre-drain-delay 0s --drain-timeout 5s -- \
    sh -c 'touch "$1"; exec sleep 60' sh "$tmp/started-drain"
if wait_for_file "$tmp/started-drain"; then
    kill -TERM "$pid"
fi
finish
check 0 "SIGTERM drain of sleep"

# 6. A child that ignores SIGTERM is SIGKILLed at the deadline: abandoned → 2.
#    (An ignored disposition survives exec, so `sleep` ignores TERM too.)
start "$DRAINIT" --probe-addr off --pre-drain-delay 0s --drain-timeout 500ms -- \
    sh -c 'trap "" TERM; touch "$1"; exec sleep 60' sh "$tmp/started-ignore"
if wait_for_file "$tmp/started-ignore"; then
    kill -TERM "$pid"
fi
finish
check 2 "child ignores SIGTERM, --drain-timeout 500ms"

# 7. No pre-drain delay given, outside Kubernetes, nobody asked /readyz: the
#    default delay is 0, so `docker stop` or a test script does not wait 5 s.
#    (KUBERNETES_SERVICE_HOST empty counts as unset.)
start env KUBERNETES_SERVICE_HOST= "$DRAINIT" --probe-addr off --drain-timeout 5s -- \
    sh -c 'touch "$1"; exec sleep 60' sh "$tmp/started-default"
t0=$(date +%s)
if wait_for_file "$tmp/started-default"; then
    t0=$(date +%s)
    kill -TERM "$pid"
fi
finish
elapsed=$(($(date +%s) - t0))
if [ "$code" = 0 ] && [ "$elapsed" -gt 2 ]; then
    code="0 after ${elapsed}s"
fi
check 0 "default pre-drain delay is 0 where nothing routes by /readyz"

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
