#!/usr/bin/env bash
# Benchmark: the first full sync (compile + one nft transaction) of R EgressFirewall rules
# over NS namespaces with P local pods, then single changes at that scale — one rule
# edited, one pod added, one namespace's firewall replaced, one node's label changed —
# each timed by egressd's own "dataplane in sync" log line: from the change being seen
# (the directory watch's event) to the kernel's ack (seen_ms; the full sync: compile +
# nft, elapsed_ms), split into compile, diff and nft on stderr. Also the
# agent's RSS. Every hundredth namespace allows ten cluster nodes by label (a nodeSelector
# rule in the middle of its list), so the label change moves a node's address in or out
# of ten namespaces' rules. Then the idle CPU (the agent and the nft runs it waited for)
# over IDLE=20 seconds without changes. Needs root.
#
#   bench/full-sync.sh        # NS=1000 RULES=100 (100k rules) PODS=10000
set -euo pipefail
cd "$(dirname "$0")/.."
NSN=${NS:-1000} RULES=${RULES:-100} PODS=${PODS:-10000}
# Root is needed (network namespaces, nftables): as root it runs as is; otherwise it
# re-runs itself with sudo (keeping PATH, so cargo is found).
if [ "$(id -u)" != 0 ]; then
  command -v sudo >/dev/null || { echo "$0: needs root, and sudo is not installed: run it as root" >&2; exit 1; }
  exec sudo env "PATH=$PATH" "$(realpath "$0")" "$@"
fi
bench/prereqs.sh base
cargo build --release --locked -q --bin egressd
BIN="${CARGO_TARGET_DIR:-target}/release/egressd"
NET="egfs$$" WORK=$(mktemp -d) AGENT=""
cleanup() {
  set +e
  [ -n "$AGENT" ] && kill -TERM "$AGENT" && wait "$AGENT"
  ip netns del "$NET"; rm -rf "$WORK"
} 2>/dev/null
trap cleanup EXIT
ip netns add "$NET"; ip -n "$NET" link set lo up
mkdir "$WORK/m"
python3 - "$NSN" "$RULES" "$PODS" "$WORK/m" <<'PY'
import sys
ns, rules, pods, out = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
def firewall(n, variant=0):
    lines = [f"apiVersion: k8s.ovn.org/v1\nkind: EgressFirewall\nmetadata: {{name: default, namespace: ns{n}}}\nspec:\n  egress:"]
    for r in range(rules - 1):
        a, b = 100 + (r + variant) % 100, (r // 100) % 256
        ports = "\n    ports: [{protocol: TCP, port: 443}]" if r % 3 == 0 else ""
        if n % 100 == 0 and r == rules // 2:
            lines.append("  - type: Allow\n    to: {nodeSelector: {matchLabels: {role: egress}}}")
            continue
        lines.append(f"  - type: Allow\n    to: {{cidrSelector: {a}.{b}.{n % 256}.0/24}}{ports}")
    lines.append("  - type: Deny\n    to: {cidrSelector: 0.0.0.0/0}")
    return "\n".join(lines) + "\n"
for n in range(ns):
    open(f"{out}/fw-{n}.yaml", "w").write(firewall(n))
with open(f"{out}/pods.yaml", "w") as f:
    for p in range(pods):
        f.write(f"---\napiVersion: v1\nkind: Pod\nmetadata: {{name: p{p}, namespace: ns{p % ns}}}\nspec: {{nodeName: bench}}\n"
                f"status: {{phase: Running, podIP: 198.18.{p // 250}.{p % 250 + 1}}}\n")
def nodes(egress):
    return "".join(f"---\napiVersion: v1\nkind: Node\nmetadata: {{name: node{i}, labels: {{role: {'egress' if i in egress else 'none'}}}}}\n"
                   f"status: {{addresses: [{{type: InternalIP, address: 203.0.113.{i + 1}}}]}}\n" for i in range(10))
open(f"{out}/nodes.yaml", "w").write(nodes({0, 2, 4, 6, 8}))
open(f"{out}/../label-node.yaml", "w").write(nodes({0, 1, 2, 4, 6, 8}))
open(f"{out}/../edit-rule.yaml", "w").write(firewall(7).replace("100.0.7.0/24", "100.0.7.128/25", 1))
open(f"{out}/../replace-ns.yaml", "w").write(firewall(8, variant=50))
PY
NO_COLOR=1 ip netns exec "$NET" "$BIN" run --manifests "$WORK/m" --node-name bench --cluster-cidr 198.18.0.0/15 \
  --state-dir "$WORK/state" --health-addr 127.0.0.1:9798 2>"$WORK/log" &
AGENT=$!
syncs() { grep -c "dataplane in sync" "$WORK/log" || true; }
wait_sync() { # N: wait for the N-th sync line, print its seen_ms (from the change being
  # seen to the kernel's ack), rounded, or for the first sync (no change) its elapsed_ms
  for _ in $(seq 1200); do [ "$(syncs)" -ge "$1" ] && break; sleep 0.05; done
  line=$(grep "dataplane in sync" "$WORK/log" | sed -n "${1}p")
  seen=$(echo "$line" | grep -o 'seen_ms=[0-9.]*' | cut -d= -f2)
  if [ -n "$seen" ]; then printf '%.0f\n' "$seen"; else echo "$line" | grep -o 'elapsed_ms=[0-9]*' | cut -d= -f2; fi
}
full=$(wait_sync 1)
rss=$(awk '/VmRSS/ { print $2 }' "/proc/$AGENT/status")
anon=$(awk '/RssAnon/ { print $2 }' "/proc/$AGENT/status")
rules_applied=$(ip netns exec "$NET" nft -a list table inet egressd | grep -c 'comment "egress\[' || true)
sleep 1
cp "$WORK/edit-rule.yaml" "$WORK/m/.tmp" && mv "$WORK/m/.tmp" "$WORK/m/fw-7.yaml"
edit=$(wait_sync 2)
printf -- '---\napiVersion: v1\nkind: Pod\nmetadata: {name: extra, namespace: ns9}\nspec: {nodeName: bench}\nstatus: {phase: Running, podIP: 198.19.255.1}\n' >"$WORK/m/.tmp" && mv "$WORK/m/.tmp" "$WORK/m/extra-pod.yaml"
pod=$(wait_sync 3)
cp "$WORK/replace-ns.yaml" "$WORK/m/.tmp" && mv "$WORK/m/.tmp" "$WORK/m/fw-8.yaml"
replace=$(wait_sync 4)
cp "$WORK/label-node.yaml" "$WORK/m/.tmp" && mv "$WORK/m/.tmp" "$WORK/m/nodes.yaml"
label=$(wait_sync 5)
# Idle CPU: the agent and the processes it ran (waited-for children: its nft runs) over
# IDLE seconds with nothing changing, in % of one core.
ticks() { awk '{ print $14 + $15 + $16 + $17 }' "/proc/$AGENT/stat"; }
sleep 1
t0=$(ticks); sleep "${IDLE:-20}"; t1=$(ticks)
idle=$(awk -v a="$t0" -v b="$t1" -v hz="$(getconf CLK_TCK)" -v s="${IDLE:-20}" 'BEGIN { printf "%.2f", (b - a) / hz / s * 100 }')
# Where each sync's time went (egressd's compile and diff vs netlink and nft), to stderr.
grep "dataplane in sync" "$WORK/log" | head -n 5 | grep -o 'elapsed_ms=[0-9]* \(seen_ms=[0-9.]* \)\?compile_ms=[0-9.]* diff_ms=[0-9.]* netlink_ms=[0-9.]* nft_ms=[0-9.]*' >&2 || true
echo "| $((NSN * RULES)) rules, $NSN namespaces, $PODS local pods ($rules_applied nft rules) | full sync ${full} ms | one rule edited ${edit} ms | one pod added ${pod} ms | one namespace replaced ${replace} ms | one node label changed ${label} ms | RSS $((rss / 1024)) MiB (heap $((anon / 1024)) MiB, the rest mapped code) | idle CPU ${idle} % |"
