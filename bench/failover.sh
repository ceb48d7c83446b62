#!/usr/bin/env bash
# Benchmark: EgressIP failover. Three nodes in network namespaces, each running egressd
# (release build) against the test kube-apiserver; node-a leads, node-b and node-c are
# labelled k8s.ovn.org/egress-assignable. RUNS times (default 10): the hosting node dies
# (uplink down, agent SIGKILLed, API objects unchanged) and the time until new
# connections of the pods on node-a and on the surviving node leave as the egress IP
# again is measured; then the dead node comes back (it must drop the address and not
# take it back). Needs root, kubectl, the cached kube-apiserver.
#
#   bench/failover.sh                    # RUNS=10, one L2 segment
#   TOPOLOGY=routed bench/failover.sh    # hosting and steering nodes in different subnets
#   SPLIT=1 bench/failover.sh            # one L2 segment, the split layout: a controller leads, agents
#                                        # run --role node (docs/security.md)
#
# TOPOLOGY=routed: tests/tunnel_kube_netns.rs — node-a and node-b (assignable) in one
# subnet, node-c (the leader, never hosting) in another behind a router that drops pod
# sources; node-c's pod reaches the egress IP only through the VXLAN tunnel, and the
# time is until new connections of node-c's pod and of the surviving node's pod leave
# as the egress IP again.
#
# Prints a Markdown table (one row per run) and a summary line.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" != 0 ]; then
  command -v sudo >/dev/null || { echo "$0: needs root, and sudo is not installed: run it as root" >&2; exit 1; }
  exec sudo env "PATH=$PATH" "$(realpath "$0")" "$@"
fi
bench/prereqs.sh kube
# The test's own output (its log on a failure) is kept in $FAILOVER_LOG.
LOG=${FAILOVER_LOG:-/tmp/egressd-failover-bench.log}
case "${TOPOLOGY:-l2}" in
  l2) TEST=placement_netns BENCH=failover_bench ;;
  routed) TEST=tunnel_kube_netns BENCH=tunnel_failover_bench ;;
  *) echo "$0: TOPOLOGY must be l2 or routed" >&2; exit 2 ;;
esac
# QUICK=1 (bench/quick.sh, CI): the debug build.
RUNS=${RUNS:-10} cargo test $([ -n "${QUICK:-}" ] || echo --release) --locked -q --features system --test "$TEST" "$BENCH" -- --ignored --nocapture 2>"$LOG" \
  | grep -E '^\||^failover over' || { echo "$0: the failover bench failed; its output is in $LOG" >&2; exit 1; }
