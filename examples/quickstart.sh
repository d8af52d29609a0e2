#!/bin/sh
# quickstart.sh -- build drainit and watch it drain a real HTTP app, step by step.
#
#   sh examples/quickstart.sh
#
# It builds the release binary, runs `python3 -m http.server` under drainit with a
# readiness check and a 2 s pre-drain delay, shows /readyz go from starting to
# ready, sends SIGTERM (what `docker stop` or the kubelet sends), shows /readyz
# answer 503 draining at once while the app still serves, and prints the exit code
# and the exit report. Loopback ports only; everything it starts, it stops.
set -eu
cd "$(dirname "$0")/.."
cargo build --release --quiet
# cargo puts the binary under $CARGO_TARGET_DIR when it is set.
DRAINIT=${CARGO_TARGET_DIR:-target}/release/drainit
APP=${APP_PORT:-18080}; PROBE=${PROBE_PORT:-18079}
get() { python3 -c 'import sys, urllib.request as u
try:
    r = u.urlopen(sys.argv[1], timeout=1); print(r.status, r.read().decode()[:200].replace("\n", " "))
except u.HTTPError as e:
    print(e.code, e.read().decode()[:200])
except Exception as e:
    print("000", type(e).__name__)' "$1"; }

"$DRAINIT" --probe-addr "127.0.0.1:$PROBE" --ready-tcp "127.0.0.1:$APP" \
  --pre-drain-delay 2s --drain-timeout 5s --report-file /tmp/drainit-report.json \
  -- python3 -m http.server "$APP" --bind 127.0.0.1 >/tmp/drainit-quickstart.out 2>/tmp/drainit-quickstart.err &
PID=$!
trap 'kill -KILL $PID 2>/dev/null || true' EXIT
echo "drainit pid $PID; /readyz right away: $(get http://127.0.0.1:$PROBE/readyz)"
i=0; until [ "$(get http://127.0.0.1:$PROBE/readyz | cut -c1-3)" = 200 ]; do
  # drainit gone (a taken port, a bad flag): say why at once instead of waiting.
  kill -0 $PID 2>/dev/null || {
    rc=0; wait $PID || rc=$?; trap - EXIT
    echo "drainit exited $rc before it was ready:"; cat /tmp/drainit-quickstart.err; exit 1
  }
  i=$((i + 1)); [ $i -gt 100 ] && { echo "never ready"; cat /tmp/drainit-quickstart.err; exit 1; }; sleep 0.1
done
echo "ready:            /readyz $(get http://127.0.0.1:$PROBE/readyz)"
echo "the app:          GET / -> $(get http://127.0.0.1:$APP/ | cut -c1-3)"
kill -TERM $PID
sleep 0.2
echo "after SIGTERM:    /readyz $(get http://127.0.0.1:$PROBE/readyz)"
echo "                  /healthz $(get http://127.0.0.1:$PROBE/healthz)"
echo "still serving:    GET / -> $(get http://127.0.0.1:$APP/ | cut -c1-3)  (pre-drain delay: 2 s)"
rc=0; wait $PID || rc=$?
trap - EXIT
echo "drainit exited $rc. Its log (stderr):"
sed 's/^/  /' /tmp/drainit-quickstart.err
