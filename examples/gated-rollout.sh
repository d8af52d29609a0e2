#!/bin/sh
# examples/gated-rollout.sh — a Kubernetes rolling update gated on drainit's own
# exit reports (docs/gate.md, "The fleet gate").
#
#   examples/gated-rollout.sh DEPLOYMENT IMAGE [ALLOW_503_PCT]
#   NAMESPACE=prod CONTAINER=web examples/gated-rollout.sh web registry.example/web:1.1
#
# The pods run drainit with --proxy (examples/kubernetes.yaml, plus
# `--proxy=0.0.0.0:8080=127.0.0.1:8081` with the app on 8081). When the kubelet
# stops an old pod, drainit drains it and prints its exit report, one JSON line
# with the request ledger, as the last line of the container's log. This script:
#
#   1. follows the log of every pod of the old ReplicaSet (`kubectl logs -f` ends
#      when the container exits, so the report line is the last one it prints);
#   2. rolls the Deployment to IMAGE and waits for the rollout;
#   3. adds the previous container's log (`kubectl logs --previous`) of any pod
#      that restarted during the rollout: its drainit drained too;
#   4. runs `drainit-gate check` over all of them: exit 0 only when every old pod
#      left a final report, none exited 2, no request is unknown or abandoned, and
#      the 503 rejections are within ALLOW_503_PCT of the requests;
#   5. on a failing gate, prints the verdict and rolls back (`kubectl rollout undo`).
#
# A pod whose log could not be followed to its end (its node vanished) has no
# report: the gate names it and fails, as a lost ledger should.
set -eu

deploy=${1:?usage: gated-rollout.sh DEPLOYMENT IMAGE [ALLOW_503_PCT]}
image=${2:?usage: gated-rollout.sh DEPLOYMENT IMAGE [ALLOW_503_PCT]}
allow=${3:-0}
ns=${NAMESPACE:-default}
container=${CONTAINER:-$deploy}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

# The Deployment's selector as key=value,… for `kubectl get pods -l`.
selector=$(kubectl -n "$ns" get deployment "$deploy" \
  -o go-template='{{range $k, $v := .spec.selector.matchLabels}}{{$k}}={{$v}},{{end}}')
selector=${selector%,}

old_pods=$(kubectl -n "$ns" get pods -l "$selector" \
  -o jsonpath='{range .items[*]}{.metadata.name}{"\n"}{end}')
[ -n "$old_pods" ] || { echo "no pod matches $selector" >&2; exit 2; }

followers=
for pod in $old_pods; do
  kubectl -n "$ns" logs -f "$pod" -c "$container" >"$dir/$pod.log" 2>/dev/null &
  followers="$followers $!"
done

kubectl -n "$ns" set image "deployment/$deploy" "$container=$image"
kubectl -n "$ns" rollout status "deployment/$deploy" --timeout=15m

# Every old pod has been stopped; its follower ends with its container.
for pid in $followers; do wait "$pid" || true; done

# Containers that restarted during the rollout drained too: their reports are in
# the previous container's log.
for pod in $(kubectl -n "$ns" get pods -l "$selector" \
  -o jsonpath='{range .items[*]}{.metadata.name}{" "}{.status.containerStatuses[0].restartCount}{"\n"}{end}' |
  awk '$2 > 0 {print $1}'); do
  kubectl -n "$ns" logs --previous "$pod" -c "$container" >"$dir/$pod.previous.log" 2>/dev/null || true
done

if drainit-gate check --allow-503 "$allow" --html "gate-$deploy.html" "$dir"/*.log; then
  echo "rollout of $deploy to $image: the gate passes"
else
  echo "rollout of $deploy to $image: the gate FAILS; rolling back" >&2
  kubectl -n "$ns" rollout undo "deployment/$deploy"
  exit 1
fi
