#!/usr/bin/env bash
# Rolling restart behind a real HAProxy, drainit's --proxy against the baselines.
# Runs a rollout instrument that this repository does not ship (its harness.py, unchanged),
# where one is at hand: ROLLOUT names it.
#
# Usage: bench/rollout-proxy.sh [BATCH_DIR]
#   ROLLOUT=DIR  the rollout instrument's folder (default: ../shared/rollout beside the
#                checkout, where CI keeps it)
#   DRAINIT=BIN  default target/x86_64-unknown-linux-musl/release/drainit (build it first)
#   REPS=N       repetitions of the proxy configurations (default 3)
#   BASE_REPS=N  repetitions of the baselines: drainit --probe-addr with HAProxy checking
#                the app port (appcheck), none, tini (default 1)
#   SETS='...'   which sets (default: 'proxy appcheck peers'); also 'proxy-1s': the proxy
#                with --pre-drain-delay 1s, under HAProxy's detection time (BASE_REPS runs)
# Each run takes ~30 s; the default matrix is 12 + 4 + 8 runs (~14 min).
# Tables: BATCH_DIR/tables.md (rollout/report.py over every run).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
rollout="${ROLLOUT:-$root/../shared/rollout}"
bin="${DRAINIT:-$root/target/x86_64-unknown-linux-musl/release/drainit}"
batch="${1:-${TMPDIR:-/tmp}/rollout-results/proxy-$(date +%Y%m%d-%H%M%S)}"
[ -x "$bin" ] || { echo "rollout-proxy: $bin not found (cargo build --release --target x86_64-unknown-linux-musl)" >&2; exit 66; }
proxy="$bin --proxy 127.0.0.1:{app}=127.0.0.1:{upstream} --proxy-health /health --ready-tcp 127.0.0.1:{upstream} --pre-drain-delay 3s --drain-timeout 10s --"
probe="$bin --probe-addr 127.0.0.1:{probe} --ready-tcp 127.0.0.1:{app} --pre-drain-delay 3s --drain-timeout 10s --"

run_set() {  # SET REPS NAME|INIT|harness-options ...
  local set="$1" reps="$2"; shift 2
  mkdir -p "$batch/$set"
  for ((rep = 1; rep <= reps; rep++)); do
    local phase; phase="$(awk -v k="$rep" -v n="$reps" 'BEGIN { printf "%.3f", (k - 1) / n * 1.3 }')"
    for entry in "$@"; do
      IFS='|' read -r name init opts <<< "$entry"
      for ka in off on; do
        for app in naive graceful; do
          echo "== $set/$name-ka-$ka-$app-r$rep" >&2
          # shellcheck disable=SC2086  # opts: harness options, split on purpose
          python3 "$rollout/harness.py" --init "$init" --app "$app" --keepalive "$ka" \
            --phase "$phase" $opts --out "$batch/$set/$name-ka-$ka-$app-r$rep" \
            --label "$set-ka-$ka/$name-$app-r$rep" >> "$batch/runs.md"
        done
      done
    done
  done
}

for set in ${SETS:-proxy appcheck peers}; do
  case "$set" in
    proxy) run_set proxy "${REPS:-3}" "drainit-proxy|$proxy|--check-path /health" ;;
    proxy-1s) run_set proxy-1s "${BASE_REPS:-1}" "drainit-proxy-1s|${proxy/--pre-drain-delay 3s/--pre-drain-delay 1s}|--check-path /health" ;;
    appcheck) run_set appcheck "${BASE_REPS:-1}" "drainit-probe|$probe|--check-target app" ;;
    peers) run_set peers "${BASE_REPS:-1}" "none|none|" "tini|tini --|" ;;
    *) echo "rollout-proxy: unknown set '$set'" >&2; exit 64 ;;
  esac
done
python3 "$rollout/report.py" "$batch" > "$batch/tables.md"
echo "tables: $batch/tables.md" >&2
