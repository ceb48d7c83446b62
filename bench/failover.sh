#!/usr/bin/env bash
# Benchmark: EgressIP failover. Three nodes in network namespaces, each running egressd
# (release build) against the test kube-apiserver; node-a leads, node-b and node-c are
# labelled k8s.ovn.org/egress-assignable. RUNS times (default 10): the hosting node dies
# (uplink down, agent SIGKILLed, API objects unchanged) and the time until new
# connections of the pods on node-a and on the surviving node leave as the egress IP
# again is measured; then the dead node comes back (it must drop the address and not
# take it back). Needs root, kubectl, the cached kube-apiserver.
#
#   bench/failover.sh           # RUNS=10
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
RUNS=${RUNS:-10} cargo test --release --locked -q --test placement_netns failover_bench -- --ignored --nocapture 2>"$LOG" \
  | grep -E '^\||^failover over' || { echo "$0: the failover bench failed; its output is in $LOG" >&2; exit 1; }
