#!/usr/bin/env bash
# Benchmark: N dnsName rules (distinct names) refreshed at their TTLs — CPU and memory
# used by egressd. A node namespace runs the release build of egressd; a DNS namespace
# runs dnsmasq answering every name with TTL $TTL. Needs root, dnsmasq-base, nftables.
#
#   bench/dns-refresh.sh            # N=10000 TTL=30 DURATION=120
#
# Prints one Markdown table row: names, TTL, the first sync (the sync's own time and the
# nft part of it; goal < 1 s), queries answered, CPU %, RSS.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${N:-10000} TTL=${TTL:-30} DURATION=${DURATION:-120}
# Root is needed (network namespaces, nftables): as root it runs as is; otherwise it
# re-runs itself with sudo (keeping PATH, so cargo is found).
if [ "$(id -u)" != 0 ]; then
  command -v sudo >/dev/null || { echo "$0: needs root, and sudo is not installed: run it as root" >&2; exit 1; }
  exec sudo env "PATH=$PATH" "$(realpath "$0")" "$@"
fi
bench/prereqs.sh base
# QUICK=1 (bench/quick.sh, CI): the debug build, so a broken benchmark fails fast.
PROFILE=release; [ -n "${QUICK:-}" ] && PROFILE=debug
cargo build --locked -q --bin egressd $([ "$PROFILE" = release ] && echo --release)
BIN="${CARGO_TARGET_DIR:-target}/$PROFILE/egressd"

P="egdb$$" WORK=$(mktemp -d) AGENT="" DNSPID=""
cleanup() {
  set +e
  [ -n "$AGENT" ] && kill -TERM "$AGENT" && wait "$AGENT"
  cp "$WORK/log" "${BENCH_LOG:-/tmp/egressd-bench.log}"
  [ -n "$DNSPID" ] && kill "$DNSPID" && wait "$DNSPID"
  ip netns del "$P-node"; ip netns del "$P-dns"; rm -rf "$WORK"
} 2>/dev/null
trap cleanup EXIT
ip netns add "$P-node"; ip netns add "$P-dns"
ip link add "$P-a" type veth peer name "$P-b"
ip link set "$P-a" netns "$P-node" name eth0; ip link set "$P-b" netns "$P-dns" name eth0
ip -n "$P-node" addr add 203.0.113.1/24 dev eth0; ip -n "$P-dns" addr add 203.0.113.2/24 dev eth0
for ns in "$P-node" "$P-dns"; do ip -n "$ns" link set eth0 up; ip -n "$ns" link set lo up; done

mkdir "$WORK/m"
awk -v n="$N" 'BEGIN { for (i = 0; i < n; i++) printf "192.0.2.%d n%d.bench.example\n", i % 250 + 1, i }' >"$WORK/hosts"
per=5000; namespaces=$(( (N + per - 1) / per ))
for ((k = 0; k < namespaces; k++)); do
  {
    printf 'apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: b%d}\nspec: {nodeName: bench}\nstatus: {podIP: 198.18.1.%d}\n---\n' "$k" "$((k + 1))"
    printf 'apiVersion: k8s.ovn.org/v1\nkind: EgressFirewall\nmetadata: {name: default, namespace: b%d}\nspec:\n  egress:\n' "$k"
    awk -v lo=$((k * per)) -v hi=$(( (k + 1) * per < N ? (k + 1) * per : N )) \
      'BEGIN { for (i = lo; i < hi; i++) printf "  - {type: Allow, to: {dnsName: n%d.bench.example}}\n", i }'
  } >"$WORK/m/b$k.yaml"
done

ip netns exec "$P-dns" dnsmasq --keep-in-foreground --no-resolv --no-hosts --addn-hosts="$WORK/hosts" \
  --local-ttl="$TTL" --listen-address=203.0.113.2 --bind-interfaces --user=root --conf-file=/dev/null \
  --pid-file= --cache-size=0 --dns-forward-max=1000 --log-facility=/dev/null &
DNSPID=$!
sleep 1
started=$(date +%s.%N)
NO_COLOR=1 ip netns exec "$P-node" "$BIN" run --manifests "$WORK/m" --node-name bench --cluster-cidr 198.18.0.0/16 \
  --dns-server 203.0.113.2 --state-dir "$WORK/state" 2>"$WORK/log" &
AGENT=$!
for _ in $(seq 600); do grep -q "dataplane in sync" "$WORK/log" && break; sleep 0.1; done
grep -q "dataplane in sync" "$WORK/log" || { tail "$WORK/log"; exit 1; }
ready=$(echo "$started $(date +%s.%N)" | awk '{ printf "%.1f", $2 - $1 }')
first=$(grep -m1 "dataplane in sync" "$WORK/log")
field() { echo "$first" | grep -o "$1=[0-9.]*" | cut -d= -f2; }
first_sync="$(field elapsed_ms) ms (nft $(field nft_ms) ms), ready ${ready} s after start"
elements=$(ip netns exec "$P-node" nft list table inet egressd | grep -c "timeout" || true)

ticks() { awk '{ print $14 + $15 }' "/proc/$AGENT/stat"; }
lookups() {
  ip netns exec "$P-node" python3 -c 'import urllib.request as u; print(u.urlopen("http://127.0.0.1:9780/metrics").read().decode())' \
    | awk '/^egressd_dns_lookups_total/ { n += $NF } END { print n + 0 }'
}
hz=$(getconf CLK_TCK)
l0=$(lookups); t0=$(ticks); s0=$(date +%s.%N)
sleep "$DURATION"
t1=$(ticks); s1=$(date +%s.%N); l1=$(lookups)
rss=$(awk '/VmRSS/ { print $2 }' "/proc/$AGENT/status")
cpu=$(echo "$t0 $t1 $s0 $s1 $hz" | awk '{ printf "%.2f", ($2 - $1) / $5 / ($4 - $3) * 100 }')
expected=$(( N * DURATION / (TTL < 5 ? 5 : TTL) ))
printf '| %s names, TTL %ss | %s | %s s | %s lookups (expected ~%s) | %s%% of one core | %s MiB |\n' \
  "$N" "$TTL" "$first_sync" "$DURATION" "$((l1 - l0))" "$expected" "$cpu" "$((rss / 1024))"
echo "(set lines with a timeout in the kernel table after start: $elements)" >&2
