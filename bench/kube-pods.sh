#!/usr/bin/env bash
# Benchmark: egressd following a cluster with N pods (default 10 000) over NODES nodes
# (default 100), with addresses, in 1,000 namespaces each with an EgressFirewall (RULES
# rules, default 10: RULES-1 Allow, a third with port 443, then Deny all), against the
# test kube-apiserver (tests/kube/apiserver.sh) with etcd; egressd, the API server and
# etcd share one throw-away network namespace. egressd is node-0: N/NODES local pods,
# and only namespaces with local pods have chains. Needs root, kubectl, the cached
# kube-apiserver (tests/kube/build-apiserver.sh).
#
# Then, CHANGES times each (default 50), what a user of Kubernetes mode waits for
# (bench/kube-changes.py): from the API server's acknowledgement of a write (the
# response read by the writer) to egressd's "dataplane in sync" line (the kernel's ack):
#   rule edited   one rule of ns0's EgressFirewall changed (a JSON patch)
#   pod added     a pod on node-0 created, then its address written (the status patch:
#                 the write that matters to egressd, timed)
#
#   bench/kube-pods.sh                      # N=10000 NODES=100 RULES=10 CHANGES=50
#   NODES=1 RULES=100 bench/kube-pods.sh    # 100k rules, every pod local
#   HEAPTRACK_OUT=/tmp/ht CHANGES=0 …       # egressd under heaptrack (the row's RSS is
#                                           # then the wrapper's: read heaptrack's peak)
#
# Prints one Markdown table row: pods, time to the first sync, RSS after it, the change
# latencies (median and p99).
set -euo pipefail
cd "$(dirname "$0")/.."
N=${N:-10000} NODES=${NODES:-100} RULES=${RULES:-10} CHANGES=${CHANGES:-50}
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
  # pkill -P: egressd under heaptrack is the wrapper's child.
  [ -n "$AGENT" ] && { pkill -TERM -P "$AGENT"; kill -TERM "$AGENT"; wait "$AGENT"; }
  ip netns exec "$NS" tests/kube/apiserver.sh stop "$WORK/kube"
  ip netns del "$NS"; rm -rf "$WORK"
} 2>/dev/null
trap cleanup EXIT
ip netns add "$NS"; ip -n "$NS" link set lo up
ip netns exec "$NS" tests/kube/apiserver.sh start "$WORK/kube" >/dev/null
k() { ip netns exec "$NS" kubectl --kubeconfig "$WORK/kube/kubeconfig-admin" "$@"; }
k apply -f daemonset/crds/crds.yaml -f daemonset/rbac.yaml >/dev/null
# The workload the docs describe: N pods over NODES nodes (this agent is node-0:
# N/NODES local), each Running with an IPv4 and an IPv6 address, in 1,000 namespaces
# (fewer when N is small), each with an EgressFirewall of RULES rules.
NSN=$(( N < 1000 ? (N < 10 ? 1 : N / 10) : 1000 ))
python3 - "$N" "$NSN" "$WORK" "$RULES" "$NODES" <<'PY'
import json, sys
n, nsn, work, rules, nodes = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
objs = []
for k in range(nsn):
    objs.append({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": f"ns{k}", "labels": {"team": f"t{k % 10}"}}})
    egress = [{"type": "Allow", "to": {"cidrSelector": f"{100 + r % 100}.{r // 100}.{k % 256}.0/24"},
               **({"ports": [{"protocol": "TCP", "port": 443}]} if r % 3 == 0 else {})} for r in range(rules - 1)]
    egress.append({"type": "Deny", "to": {"cidrSelector": "0.0.0.0/0"}})
    objs.append({"apiVersion": "k8s.ovn.org/v1", "kind": "EgressFirewall",
                 "metadata": {"name": "default", "namespace": f"ns{k}"}, "spec": {"egress": egress}})
json.dump({"apiVersion": "v1", "kind": "List", "items": objs}, open(f"{work}/policy.json", "w"))
pods = []
for i in range(n):
    pods.append({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": f"p{i}", "namespace": f"ns{i % nsn}", "labels": {"app": f"a{i % 50}", "tier": "web"}},
        "spec": {"nodeName": f"node-{i % nodes}", "containers": [{"name": "c", "image": "example.invalid/c"}]}})
json.dump({"apiVersion": "v1", "kind": "List", "items": pods}, open(f"{work}/pods.json", "w"))
PY
k create -f "$WORK/policy.json" >/dev/null
start=$(date +%s)
k create -f "$WORK/pods.json" >/dev/null
# Their addresses: the status subresource, 16 writes at a time (kubectl would take an hour).
ip netns exec "$NS" python3 - "$WORK/kube/env" "$N" "$NSN" <<'PY'
import concurrent.futures, ipaddress, json, ssl, sys, urllib.request
env = dict(l.strip().split("=", 1) for l in open(sys.argv[1]) if "=" in l)
n, nsn = int(sys.argv[2]), int(sys.argv[3])
ctx = ssl._create_unverified_context()
def patch(i):
    # Addresses unique over the cluster, whatever the number of nodes.
    v4, v6 = str(ipaddress.ip_address("198.18.0.1") + i), f"2001:db8:1::{i + 1:x}"
    body = json.dumps({"status": {"phase": "Running", "podIP": v4, "podIPs": [{"ip": v4}, {"ip": v6}]}}).encode()
    req = urllib.request.Request(f"{env['KUBE_URL']}/api/v1/namespaces/ns{i % nsn}/pods/p{i}/status", data=body,
        method="PATCH", headers={"Authorization": f"Bearer {env['ADMIN_TOKEN']}",
                                 "Content-Type": "application/merge-patch+json"})
    urllib.request.urlopen(req, context=ctx, timeout=30).read()
with concurrent.futures.ThreadPoolExecutor(16) as ex:
    list(ex.map(patch, range(n)))
PY
echo "created $N pods over $NODES nodes with addresses, $NSN namespaces with EgressFirewalls, in $(( $(date +%s) - start )) s" >&2
t0=$(date +%s.%N)
W=""; [ -n "${HEAPTRACK_OUT:-}" ] && W="heaptrack -o $HEAPTRACK_OUT"
NO_COLOR=1 ip netns exec "$NS" $W "$BIN" run --kubeconfig "$WORK/kube/kubeconfig-egressd" --node-name node-0 \
  --cluster-cidr 198.18.0.0/15 --cluster-cidr 2001:db8:1::/48 --state-dir "$WORK/state" --health-addr 127.0.0.1:9799 2>"$WORK/log" &
AGENT=$!
for _ in $(seq 1200); do grep -q "dataplane in sync" "$WORK/log" && break; sleep 0.1; done
grep -q "dataplane in sync" "$WORK/log" || { tail "$WORK/log"; exit 1; }
t1=$(date +%s.%N)
sleep 5
rss=$(awk '/VmRSS/ { print $2 }' "/proc/$AGENT/status")
hwm=$(awk '/VmHWM/ { print $2 }' "/proc/$AGENT/status")
pods=$(grep -o 'pods=[0-9]*' "$WORK/log" | head -1)
rules=$(grep "dataplane in sync" "$WORK/log" | head -1 | grep -o ' rules=[0-9]*' | cut -d= -f2)
latency="—"
[ "$CHANGES" -gt 0 ] && latency=$(ip netns exec "$NS" bench/kube-changes.py "$WORK/kube/env" "$WORK/log" "$CHANGES")
printf '| %s pods over %s nodes, %s namespaces with %s-rule EgressFirewalls (%s, %s nft rules) | %.1f s to first sync | RSS %s MiB (peak %s MiB) | %s |\n' \
  "$N" "$NODES" "$NSN" "$RULES" "$pods" "$rules" "$(echo "$t1 - $t0" | bc)" "$((rss / 1024))" "$((hwm / 1024))" "$latency"
