#!/usr/bin/env bash
# What the benchmarks need on a fresh Debian machine, installed when missing (root):
# nft, ip, iperf3, iptables-nft (forwarding baselines), bc, taskset, dnsmasq (DNS
# refresh), python3 (workload generators), strace (jump-elements.sh); kubectl and the test kube-apiserver for the
# Kubernetes benchmarks (`all`, or `kube`). Sourced or run:
#
#   bench/prereqs.sh [base|kube|all]     # default: all
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
want=${1:-all}
missing=()
need() { command -v "$1" >/dev/null || missing+=("$2"); }
need nft nftables
need ip iproute2
need iperf3 iperf3
need iptables-nft-restore iptables
need bc bc
need taskset util-linux
need dnsmasq dnsmasq-base
need python3 python3
need strace strace
if [ ${#missing[@]} -gt 0 ]; then
  echo "bench: installing ${missing[*]}" >&2
  apt-get update -qq
  # iperf3 asks whether to start a daemon: no.
  echo "iperf3 iperf3/start_daemon boolean false" | debconf-set-selections 2>/dev/null || true
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
if [ "$want" = all ] || [ "$want" = kube ]; then
  command -v kubectl >/dev/null || { echo "bench: kubectl is required for the Kubernetes benchmarks" >&2; exit 1; }
  tests/kube/build-apiserver.sh >/dev/null
fi
