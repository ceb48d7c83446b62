#!/usr/bin/env bash
# Benchmark: many real egressd agents against one real API server (issue #42).
#
# Workload (written down beside every figure, bench/FINDINGS.md):
# - the test kube-apiserver (1.20, tests/kube/apiserver.sh) with etcd in its own network
#   namespace, on a bridge; AGENTS agents (default "10 50 100", one run each), each in
#   its own network namespace on that bridge, as node-0 … node-(N-1), in Kubernetes mode
#   (leader election, status writes, the real RBAC identity of daemonset/rbac.yaml);
# - a cluster of PODS pods (default 150 000) on PODS/LOCAL nodes (LOCAL = 100 pods per
#   node, Ready, with an InternalIP): the pods of nodes without an agent exist only as
#   API objects. Every pod has an address (status written through the API);
# - NAMESPACES namespaces (default 1,000), each with a 10-rule EgressFirewall (9 Allow,
#   a third of them port 443, then Deny 0.0.0.0/0); pod j of node k is in
#   ns((k·LOCAL + j) mod NAMESPACES), and pod 0 of every node is in ns0 (labelled
#   `eip: "yes"`), whose EgressFirewall also allows `nodeSelector: bench/role=edge`;
# - node-1 is labelled k8s.ovn.org/egress-assignable: the one agent that may host an
#   egress IP (so it follows every pod of the cluster, ISSUE #42's exception).
#
# Then, CHANGES times each (default 10), timed from the API server's acknowledgement of
# the write to each affected node's "dataplane in sync" line (after the kernel's ack),
# p50/p99 and max over every (change, node) pair, and node-1's max apart (one node in N:
# a p99 over 100 nodes leaves out its samples, the ones a user waits for when it hosts):
#   firewall edit   a rule of ns0's EgressFirewall replaced (every agent has a pod in ns0)
#   pod added       a pod created on node-(i mod N), then its address written (timed:
#                   the write that matters); only that node is affected
#   node label      the last node's bench/role=edge label toggled (ns0's nodeSelector
#                   rule: every agent)
#   egress IP       an EgressIP for ns0's `eip: "yes"` pods created, placed by the leader
#                   on node-1 (timed from the create's ack to each node's last sync
#                   within 2 s of the placement: the whole path), then deleted: every
#                   agent (steering, or hosting)
#   egress IP beside another   the same while another EgressIP (selecting no pod) is
#                   placed on node-1: a cluster that uses EgressIPs
# Also per N: agents' RSS (current and peak, max and median, the host node-1 apart),
# idle CPU over 10 s, and from the API server's /metrics per change: watch events sent
# (all kinds, and Pod alone; bookmarks included: each watch gets one a minute, and the
# agents' minutes line up as they start together) and writes (excluding Leases), and its
# RSS; the watch events the agents received per change and the objects they listed
# (egressd_watch_events_total: no bookmarks); and the CPU each
# change costs (from the write to 1.5 s after the last node's sync, the idle rate taken
# out): all agents' user and system time, and the API server's — with N agents on two
# cores, the latency's tail is mostly this work queued behind itself.
#
#   bench/cluster-scale.sh                              # AGENTS="10 50 100" PODS=150000
#   AGENTS=3 PODS=600 NAMESPACES=20 CHANGES=3 QUICK=1 bench/cluster-scale.sh   # CI
#   KEEP=1 …                                            # keep the agents' logs (and, when
#                                                         no agent follows a change,
#                                                         WORK/stall: the bench's own
#                                                         watch, the API server's watch
#                                                         counters, each agent's threads)
#   KEEP=1 HEAPTRACK_AGENT=2 …                          # node-2 under heaptrack (its RSS
#                                                         is then not measured)
#
# Prints one Markdown table row per N.
set -euo pipefail
cd "$(dirname "$0")/.."
AGENTS=${AGENTS:-"10 50 100"} PODS=${PODS:-150000} LOCAL=${LOCAL:-100} NAMESPACES=${NAMESPACES:-1000}
CHANGES=${CHANGES:-10}
if [ "$(id -u)" != 0 ]; then
  command -v sudo >/dev/null || { echo "$0: needs root, and sudo is not installed: run it as root" >&2; exit 1; }
  exec sudo env "PATH=$PATH" "$(realpath "$0")" "$@"
fi
bench/prereqs.sh kube
PROFILE=release; [ -n "${QUICK:-}" ] && PROFILE=debug
cargo build --locked -q --bin egressd $([ "$PROFILE" = release ] && echo --release)
BIN="$(cd "${CARGO_TARGET_DIR:-target}" && pwd)/$PROFILE/egressd"
API="egcs$$" WORK=$(mktemp -d) PIDS=() NETNS=()
API_IP=198.19.255.254
stop_agents() {
  # pkill -P: the agent under heaptrack is the wrapper's child.
  for p in "${PIDS[@]}"; do pkill -TERM -P "$p" || true; kill -TERM "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null; done
  local ns
  for ns in "${NETNS[@]}"; do ip netns del "$ns"; done
  PIDS=() NETNS=()
}
cleanup() {
  set +e
  stop_agents
  ip netns exec "$API" tests/kube/apiserver.sh stop "$WORK/kube"
  ip netns del "$API"
  [ -n "${KEEP:-}" ] || rm -rf "$WORK"
} 2>/dev/null
trap cleanup EXIT
[ -z "${KEEP:-}" ] || echo "logs kept in $WORK (WORK/stall: what was seen when no agent followed a change)" >&2
ip netns add "$API"; ip -n "$API" link set lo up
ip -n "$API" link add br0 type bridge; ip -n "$API" link set br0 up
ip -n "$API" addr add "$API_IP/16" dev br0
BIND=0.0.0.0 KUBE_HOST=$API_IP ip netns exec "$API" tests/kube/apiserver.sh start "$WORK/kube" >/dev/null
k() { ip netns exec "$API" kubectl --kubeconfig "$WORK/kube/kubeconfig-admin" "$@"; }
k apply -f daemonset/crds/crds.yaml -f daemonset/rbac.yaml >/dev/null
start=$(date +%s)
ip netns exec "$API" python3 bench/cluster-scale.py populate "$WORK/kube/env" "$PODS" "$LOCAL" "$NAMESPACES"
echo "cluster: $PODS pods on $((PODS / LOCAL)) nodes, $NAMESPACES EgressFirewalls, created in $(( $(date +%s) - start )) s" >&2

# node-i's address on the bridge.
node_ip() { echo "198.19.$(( $1 / 250 )).$(( $1 % 250 + 1 ))"; }
for n in $AGENTS; do
  [ "$n" -le $((PODS / LOCAL)) ] || { echo "AGENTS=$n: more agents than nodes" >&2; exit 1; }
  ip netns exec "$API" python3 bench/cluster-scale.py writes "$WORK/kube/env" >"$WORK/writes"
  for i in $(seq 0 $((n - 1))); do
    ns="egcs$$-$i"
    ip netns add "$ns"; NETNS+=("$ns")
    ip -n "$ns" link set lo up
    ip -n "$API" link add "v$i" type veth peer name eth0 netns "$ns"
    ip -n "$API" link set "v$i" master br0 up
    ip -n "$ns" addr add "$(node_ip "$i")/16" dev eth0; ip -n "$ns" link set eth0 up
    # Each agent in its own memory cgroup would need v1 cgroups; peak RSS is VmHWM.
    W=""; [ "${HEAPTRACK_AGENT:-x}" = "$i" ] && W="heaptrack -o $WORK/heap-$i"
    NO_COLOR=1 ip netns exec "$ns" $W "$BIN" run --kubeconfig "$WORK/kube/kubeconfig-egressd" --node-name "node-$i" \
      --cluster-cidr 198.18.0.0/16 --cluster-cidr 2001:db8:1::/48 --state-dir "$WORK/state-$i" --health-addr 127.0.0.1:9799 \
      --egress-ip-health-port 0 2>"$WORK/log-$i" &
    PIDS+=($!)
  done
  echo "$n agents started" >&2
  ip netns exec "$API" python3 bench/cluster-scale.py measure "$WORK/kube/env" "$WORK" "$n" "$CHANGES" \
    "${PIDS[*]}" "$(sed -n 's/^APISERVER_PID=//p' "$WORK/kube/env")" "$PODS" "$NAMESPACES" "$LOCAL"
  stop_agents
  if [ -n "${KEEP:-}" ]; then mkdir -p "$WORK/n$n"; cp "$WORK"/log-* "$WORK/trace" "$WORK/n$n/" 2>/dev/null || true; fi
done
