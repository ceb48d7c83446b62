#!/usr/bin/env bash
# Benchmark: egressd's memory following a cluster with N pods (default 10 000), against
# the test kube-apiserver (tests/kube/apiserver.sh) with etcd; egressd, the API server and
# etcd share one throw-away network namespace. Needs root, kubectl, the cached
# kube-apiserver (tests/kube/build-apiserver.sh).
#
#   bench/kube-pods.sh          # N=10000
#
# Prints one Markdown table row: pods, time to the first sync, RSS after it.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${N:-10000}
# Root is needed (network namespaces, nftables): as root it runs as is; otherwise it
# re-runs itself with sudo (keeping PATH, so cargo is found).
if [ "$(id -u)" != 0 ]; then
  command -v sudo >/dev/null || { echo "$0: needs root, and sudo is not installed: run it as root" >&2; exit 1; }
  exec sudo env "PATH=$PATH" "$(realpath "$0")" "$@"
fi
bench/prereqs.sh kube
# QUICK=1 (bench/quick.sh, CI): the debug build, so a broken benchmark fails fast.
PROFILE=release; [ -n "${QUICK:-}" ] && PROFILE=debug
cargo build --locked -q --bin egressd $([ "$PROFILE" = release ] && echo --release)
BIN="$(cd "${CARGO_TARGET_DIR:-target}" && pwd)/$PROFILE/egressd"
NS="egkb$$" WORK=$(mktemp -d) AGENT=""
cleanup() {
  set +e
  [ -n "$AGENT" ] && kill -TERM "$AGENT" && wait "$AGENT"
  ip netns exec "$NS" tests/kube/apiserver.sh stop "$WORK/kube"
  ip netns del "$NS"; rm -rf "$WORK"
} 2>/dev/null
trap cleanup EXIT
ip netns add "$NS"; ip -n "$NS" link set lo up
ip netns exec "$NS" tests/kube/apiserver.sh start "$WORK/kube" >/dev/null
k() { ip netns exec "$NS" kubectl --kubeconfig "$WORK/kube/kubeconfig-admin" "$@"; }
k apply -f daemonset/crds/crds.yaml -f daemonset/rbac.yaml >/dev/null
k create namespace load >/dev/null
# Pods as the API stores them: 16 nodes' worth, each with labels and two IPs.
python3 - "$N" >"$WORK/pods.json" <<'PY'
import json, sys
n = int(sys.argv[1])
items = []
for i in range(n):
    items.append({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": f"p{i}", "namespace": "load", "labels": {"app": f"a{i % 50}", "tier": "web"}},
        "spec": {"nodeName": f"node-{i % 16}", "containers": [{"name": "c", "image": "example.invalid/c"}]}})
print(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
PY
start=$(date +%s)
k create -f "$WORK/pods.json" >/dev/null
echo "created $N pods in $(( $(date +%s) - start )) s" >&2
t0=$(date +%s.%N)
NO_COLOR=1 ip netns exec "$NS" "$BIN" run --kubeconfig "$WORK/kube/kubeconfig-egressd" --node-name node-0 \
  --cluster-cidr 198.18.0.0/15 --state-dir "$WORK/state" --health-addr 127.0.0.1:9799 2>"$WORK/log" &
AGENT=$!
for _ in $(seq 1200); do grep -q "dataplane in sync" "$WORK/log" && break; sleep 0.1; done
grep -q "dataplane in sync" "$WORK/log" || { tail "$WORK/log"; exit 1; }
t1=$(date +%s.%N)
sleep 5
rss=$(awk '/VmRSS/ { print $2 }' "/proc/$AGENT/status")
hwm=$(awk '/VmHWM/ { print $2 }' "/proc/$AGENT/status")
pods=$(grep -o 'pods=[0-9]*' "$WORK/log" | head -1)
printf '| %s pods (%s) | %.1f s to first sync | RSS %s MiB (peak %s MiB) |\n' \
  "$N" "$pods" "$(echo "$t1 - $t0" | bc)" "$((rss / 1024))" "$((hwm / 1024))"
