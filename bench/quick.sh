#!/usr/bin/env bash
# Every benchmark once, small and with the debug build (QUICK=1), so that a benchmark
# that breaks fails CI (tests/run.sh runs this). The figures mean nothing here:
# bench/run.sh gives the real ones. A few minutes; root.
#
#   bench/quick.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export QUICK=1
started=$(date +%s)
for shape in friendly interleaved worst sets; do
  echo "== quick: full-sync.sh SHAPE=$shape" >&2
  SHAPE=$shape NS=10 RULES=10 PODS=10 REPEAT=1 IDLE=1 bench/full-sync.sh | tail -n 1
done
echo "== quick: forwarding.sh" >&2
RUNS=1 SECS=1 NS=10 RULES=10 POS=5 bench/forwarding.sh | tail -n 10
echo "== quick: forwarding.sh LOAD=tcp REWALK, LOAD=udp" >&2
RUNS=1 SECS=1 NS=10 RULES=10 POS=5 LOAD=tcp REWALK=100 ROUNDS=3 CONFIGS="none-ct egressd-alt egressd-alt-nofast" \
  bench/forwarding.sh | tail -n 10
RUNS=1 SECS=1 NS=10 RULES=10 POS=5 LOAD=udp CONFIGS="none-ct egressd-alt egressd-runs" bench/forwarding.sh | tail -n 4
echo "== quick: dns-refresh.sh" >&2
N=20 TTL=5 DURATION=2 bench/dns-refresh.sh | tail -n 1
echo "== quick: kube-pods.sh" >&2
N=50 CHANGES=3 bench/kube-pods.sh | tail -n 1
echo "== quick: cluster-scale.sh" >&2
AGENTS=3 PODS=600 NAMESPACES=20 CHANGES=2 bench/cluster-scale.sh | tail -n 1
echo "== quick: failover.sh (one segment, routed, split layout)" >&2
RUNS=1 bench/failover.sh | tail -n 1
RUNS=1 TOPOLOGY=routed bench/failover.sh | tail -n 1
RUNS=1 SPLIT=1 bench/failover.sh | tail -n 1
echo "== quick: jump-elements.sh" >&2
NS=10 RULES=10 PODS=10 bench/jump-elements.sh | tail -n 1
echo "== quick: cargo benches in test mode (criterion: each benchmark once)" >&2
log=$(mktemp)
if ! N=3 CONNECTS_SNOOP=20 CONNECTS_PROXY=20 LATENCY_QUERIES=50 CLIENTS=2 SECS=1 \
  cargo test --locked -q --benches >"$log" 2>&1; then
  cat "$log" >&2; rm -f "$log"; exit 1
fi
grep -cE '^Success' "$log" | sed 's/^/criterion benchmarks run once: /'; rm -f "$log"
echo "== quick: every benchmark ran, in $(( $(date +%s) - started )) s" >&2
