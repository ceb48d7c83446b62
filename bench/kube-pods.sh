#!/usr/bin/env bash
# Benchmark: egressd following a cluster with N pods (default 10 000) over 100 nodes, with
# addresses, in 1,000 namespaces each with an EgressFirewall (10 rules), against
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
# The workload the docs describe: N pods over 100 nodes (this agent is node-0: N/100
# local), each Running with an IPv4 and an IPv6 address, in 1,000 namespaces (fewer when
# N is small), each with an EgressFirewall of 10 rules.
NSN=$(( N < 1000 ? (N < 10 ? 1 : N / 10) : 1000 ))
python3 - "$N" "$NSN" "$WORK" <<'PY'
import json, sys
n, nsn, work = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
objs = []
for k in range(nsn):
    objs.append({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": f"ns{k}", "labels": {"team": f"t{k % 10}"}}})
    egress = [{"type": "Allow", "to": {"cidrSelector": f"{100 + r}.{k // 256}.{k % 256}.0/24"},
               **({"ports": [{"protocol": "TCP", "port": 443}]} if r % 3 == 0 else {})} for r in range(9)]
    egress.append({"type": "Deny", "to": {"cidrSelector": "0.0.0.0/0"}})
    objs.append({"apiVersion": "k8s.ovn.org/v1", "kind": "EgressFirewall",
                 "metadata": {"name": "default", "namespace": f"ns{k}"}, "spec": {"egress": egress}})
json.dump({"apiVersion": "v1", "kind": "List", "items": objs}, open(f"{work}/policy.json", "w"))
pods = []
for i in range(n):
    pods.append({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": f"p{i}", "namespace": f"ns{i % nsn}", "labels": {"app": f"a{i % 50}", "tier": "web"}},
        "spec": {"nodeName": f"node-{i % 100}", "containers": [{"name": "c", "image": "example.invalid/c"}]}})
json.dump({"apiVersion": "v1", "kind": "List", "items": pods}, open(f"{work}/pods.json", "w"))
PY
k create -f "$WORK/policy.json" >/dev/null
start=$(date +%s)
k create -f "$WORK/pods.json" >/dev/null
# Their addresses: the status subresource, 16 writes at a time (kubectl would take an hour).
ip netns exec "$NS" python3 - "$WORK/kube/env" "$N" "$NSN" <<'PY'
import concurrent.futures, json, ssl, sys, urllib.request
env = dict(l.strip().split("=", 1) for l in open(sys.argv[1]) if "=" in l)
n, nsn = int(sys.argv[2]), int(sys.argv[3])
ctx = ssl._create_unverified_context()
def patch(i):
    node, j = i % 100, i // 100
    v4, v6 = f"198.18.{node}.{j % 250 + 1}", f"2001:db8:1:{node:x}::{j + 1:x}"
    body = json.dumps({"status": {"phase": "Running", "podIP": v4, "podIPs": [{"ip": v4}, {"ip": v6}]}}).encode()
    req = urllib.request.Request(f"{env['KUBE_URL']}/api/v1/namespaces/ns{i % nsn}/pods/p{i}/status", data=body,
        method="PATCH", headers={"Authorization": f"Bearer {env['ADMIN_TOKEN']}",
                                 "Content-Type": "application/merge-patch+json"})
    urllib.request.urlopen(req, context=ctx, timeout=30).read()
with concurrent.futures.ThreadPoolExecutor(16) as ex:
    list(ex.map(patch, range(n)))
PY
echo "created $N pods with addresses, $NSN namespaces with EgressFirewalls, in $(( $(date +%s) - start )) s" >&2
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
rules=$(grep "dataplane in sync" "$WORK/log" | head -1 | grep -o ' rules=[0-9]*' | cut -d= -f2)
printf '| %s pods over 100 nodes, %s namespaces with EgressFirewalls (%s, %s nft rules) | %.1f s to first sync | RSS %s MiB (peak %s MiB) |\n' \
  "$N" "$NSN" "$pods" "$rules" "$(echo "$t1 - $t0" | bc)" "$((rss / 1024))" "$((hwm / 1024))"
