#!/usr/bin/env bash
# Benchmark: forwarding cost. Small UDP packets (64-byte payload, iperf3 3.12 from
# Debian, client pinned to CPU 0, server to CPU 1) from a pod namespace through a node
# namespace to an external host, received packets per second, under these set-ups,
# alternating, RUNS times each:
#   none      no egress policy at all (and no conntrack)
#   none-ct   no egress policy, conntrack loaded: one `ct state invalid drop` rule in
#             forward, the node as kube-proxy leaves it
#   egressd   egressd with NS x RULES EgressFirewall rules (100k), all Allow but the
#             last, the pod's traffic allowed by rule POS of its namespace (same-action
#             runs merge: one set lookup whatever POS is)
#   egressd-alt  the same with Allow and Deny alternating (nothing merges: rule POS is
#             reached after POS-1 rules, the worst case)
#   egressd-runs  runs of five same-action rules of five prefix lengths, actions
#             alternating between runs: merged, each run would need an interval set,
#             so the compile flattens the namespace into disjoint pieces (at most two
#             lookups here whatever POS is: compile/boxes.rs)
#   ipt-1k    the same decision as linear iptables-nft rules in FORWARD: 1 000 rules
#             (other pods' rules first), the approach older agents take, walked by
#             every packet (no ESTABLISHED accept first: the per-packet cost)
#   ipt-10k   the same with 10 000 rules
#   ipt-1k-est, ipt-10k-est  the same after `-m conntrack --ctstate ESTABLISHED,RELATED
#             -j ACCEPT`, as such rule sets are usually written: the fair comparison
#             with egressd's verified connections
#   egressd-nofast, egressd-alt-nofast, egressd-runs-nofast  the same with verified
#             connections off
#             (`--firewall-verified-mark-mask 0`): every packet walks the rules
# What a run measures (LOAD=):
#   pps       (default) the UDP flood above: one long-lived flow, so with verified
#             connections only its first packet walks the rules
#   tcp       new TCP connections per second: connect, then close with a reset, one at
#             a time from many source ports (bench/connload.rs): every connection's SYN
#             walks the rules (its ACK and reset too with verified connections off)
#   udp       new UDP flows per second: a new socket (source port) per datagram, its
#             echo awaited: every flow's first packet walks the rules
# REWALK=N (with LOAD=tcp): afterwards, N connections are held open through egressd-alt
# (running, fast path on, then off); a round writes one byte on each, then reads every
# echo. The writes' time is what the path costs the pod's CPU (each packet crosses the
# node in the sender's softirq); the whole round is bound by the echo server on the
# other CPU. Reported, median of ROUNDS: the writes steady, and right after a policy
# change (another namespace's rule edited: every change moves the verified generation,
# so each open connection's next packet walks its rules again).
# Needs root, iperf3, iptables (nft backend), nftables: bench/prereqs.sh installs them.
#
#   bench/forwarding.sh     # RUNS=5 SECS=5 NS=1000 RULES=100 POS=50 LOAD=pps
#   CONFIGS="none none-ct egressd" bench/forwarding.sh   # a subset of the set-ups (with
#                                                        # none and none-ct: the ratios)
#   LOAD=tcp REWALK=10000 CONFIGS="none-ct egressd-alt egressd-alt-nofast" bench/forwarding.sh
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-5} SECS=${SECS:-5} NSN=${NS:-1000} RULES=${RULES:-100} POS=${POS:-50}
LOAD=${LOAD:-pps} REWALK=${REWALK:-0} ROUNDS=${ROUNDS:-11}
case "$LOAD" in pps|tcp|udp) ;; *) echo "$0: LOAD must be pps, tcp or udp" >&2; exit 1 ;; esac
# Rule RULES is the final Deny of every namespace: the pod's Allow is one of 1 .. RULES-1.
if [ "$POS" -lt 1 ] || [ "$POS" -ge "$RULES" ]; then
  echo "$0: POS must be 1 .. $((RULES - 1)) (rule $RULES is the final Deny)" >&2; exit 1
fi
# Root is needed (network namespaces, nftables): as root it runs as is; otherwise it
# re-runs itself with sudo (keeping PATH, so cargo is found).
if [ "$(id -u)" != 0 ]; then
  command -v sudo >/dev/null || { echo "$0: needs root, and sudo is not installed: run it as root" >&2; exit 1; }
  exec sudo env "PATH=$PATH" "$(realpath "$0")" "$@"
fi
bench/prereqs.sh base
# QUICK=1 (bench/quick.sh, CI): the debug build, so a broken benchmark fails fast.
PROFILE=release; [ -n "${QUICK:-}" ] && PROFILE=debug
cargo build --locked -q --bin egressd --example connload $([ "$PROFILE" = release ] && echo --release)
BIN="$(cd "${CARGO_TARGET_DIR:-target}" && pwd)/$PROFILE/egressd"
LOADGEN="$(cd "${CARGO_TARGET_DIR:-target}" && pwd)/$PROFILE/examples/connload"
P="egfw$$" WORK=$(mktemp -d) AGENT="" SERVER="" CONNSERVER="" HOLDER=""
NODE="$P-node" POD="$P-pod" EXT="$P-ext"
cleanup() {
  set +e
  [ -n "$AGENT" ] && kill -TERM "$AGENT" && wait "$AGENT"
  [ -n "$SERVER" ] && kill "$SERVER" && wait "$SERVER"
  [ -n "$CONNSERVER" ] && kill "$CONNSERVER" && wait "$CONNSERVER"
  [ -n "$HOLDER" ] && kill "$HOLDER" && wait "$HOLDER"
  for ns in "$NODE" "$POD" "$EXT"; do ip netns del "$ns"; done
  rm -rf "$WORK"
} 2>/dev/null
trap cleanup EXIT
for ns in "$NODE" "$POD" "$EXT"; do ip netns add "$ns"; ip -n "$ns" link set lo up; done
link() { ip link add "$P-a" type veth peer name "$P-b"; ip link set "$P-a" netns "$1" name "$2"; ip link set "$P-b" netns "$3" name "$4"; ip -n "$1" link set "$2" up; ip -n "$3" link set "$4" up; }
link "$NODE" vpod "$POD" eth0
link "$NODE" eth-ext "$EXT" eth0
ip -n "$NODE" addr add 198.18.0.1/24 dev vpod; ip -n "$POD" addr add 198.18.0.2/24 dev eth0
ip -n "$POD" route add default via 198.18.0.1
ip -n "$NODE" addr add 203.0.113.1/24 dev eth-ext; ip -n "$EXT" addr add 203.0.113.2/24 dev eth0
ip -n "$EXT" route add 198.18.0.0/15 via 203.0.113.1
ip netns exec "$NODE" sysctl -qw net.ipv4.ip_forward=1

# egressd manifests: NS namespaces x RULES rules; the pod is in ns0, whose rule POS
# allows 203.0.113.0/24 (rules before it are CIDRs that do not match).
mkdir "$WORK/m"
mkdir "$WORK/m-alt" "$WORK/m-runs"
python3 - "$NSN" "$RULES" "$POS" "$WORK" <<'PY'
import sys
ns, rules, pos, work = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
for out, shape in ((f"{work}/m", "allow"), (f"{work}/m-alt", "alt"), (f"{work}/m-runs", "runs")):
  for n in range(ns):
    lines = [f"apiVersion: k8s.ovn.org/v1\nkind: EgressFirewall\nmetadata: {{name: default, namespace: ns{n}}}\nspec:\n  egress:"]
    for r in range(rules - 1):
        length = 22 + r % 5 if shape == "runs" else 24
        cidr = "203.0.113.0/24" if (n == 0 and r == pos - 1) else f"{100 + r % 100}.{(r // 100) % 256}.{n % 256}.0/{length}"
        if length < 24:
            cidr = f"{100 + r % 100}.{(r // 100) % 256}.0.0/{length}"
        deny = {"allow": False, "alt": r % 2 == 1, "runs": (r // 5) % 2 == 1}[shape]
        action = "Allow" if (cidr.startswith("203.") or not deny) else "Deny"
        lines.append(f"  - {{type: {action}, to: {{cidrSelector: {cidr}}}}}")
    lines.append("  - {type: Deny, to: {cidrSelector: 0.0.0.0/0}}")
    open(f"{out}/fw-{n}.yaml", "w").write("\n".join(lines) + "\n")
for out in (f"{work}/m", f"{work}/m-alt", f"{work}/m-runs"):
  with open(f"{out}/pods.yaml", "w") as f:
    f.write("apiVersion: v1\nkind: Pod\nmetadata: {name: bench, namespace: ns0}\nspec: {nodeName: bench}\nstatus: {phase: Running, podIP: 198.18.0.2}\n")
    for p in range(1, 10000):
      f.write(f"---\napiVersion: v1\nkind: Pod\nmetadata: {{name: p{p}, namespace: ns{p % ns}}}\nspec: {{nodeName: bench}}\n"
              f"status: {{phase: Running, podIP: 198.18.{1 + p // 250}.{p % 250 + 1}}}\n")
PY
# iptables-nft baselines: N rules, the matching one last (other pods' rules first).
ipt_rules() { # N [est]: with "est", an ESTABLISHED,RELATED accept first
  { echo "*filter"; echo ":FORWARD ACCEPT [0:0]"
    [ "${2:-}" = est ] && echo "-A FORWARD -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT"
    for ((i = 1; i < $1; i++)); do echo "-A FORWARD -s 198.19.$((i / 250)).$((i % 250 + 1))/32 -d 100.$((i % 256)).0.0/24 -j ACCEPT"; done
    echo "-A FORWARD -s 198.18.0.2/32 -d 203.0.113.0/24 -j ACCEPT"; echo "COMMIT"; } >"$WORK/ipt-$1${2:+-$2}"
}
ipt_rules 1000; ipt_rules 10000; ipt_rules 1000 est; ipt_rules 10000 est

ip netns exec "$EXT" taskset -c 1 iperf3 -s -p 5201 >/dev/null 2>&1 &
SERVER=$!
# Held connections need a descriptor each, on both ends.
ulimit -n $((REWALK + 4096))
ip netns exec "$EXT" taskset -c 1 "$LOADGEN" serve 203.0.113.2:5301 &
CONNSERVER=$!
# New flows: source ports from the whole range, and conntrack entries of closed ones
# (TCP after a reset: 10 s; UDP unreplied 30 s) gone soon enough not to fill the table.
ip netns exec "$POD" sysctl -qw net.ipv4.ip_local_port_range="1024 65535"
ip netns exec "$NODE" sysctl -qw net.netfilter.nf_conntrack_udp_timeout=2 net.netfilter.nf_conntrack_udp_timeout_stream=2 \
  net.netfilter.nf_conntrack_tcp_timeout_close=1
sleep 0.5
measure() { # LOAD's figure: per second
  case "$LOAD" in
    tcp|udp) local out failed
      read -r out failed < <(ip netns exec "$POD" taskset -c 0 "$LOADGEN" "$LOAD" 203.0.113.2:5301 "$SECS")
      [ "${failed:-1}" -gt "$((out * SECS / 100))" ] && echo "$LOAD: $failed of $((out * SECS)) failed" >&2
      echo "$out"; return 0 ;;
  esac
  # received packets per second; a run iperf3 reports as failed (the server
  # still busy with the previous one) is repeated, at most 3 times
  local out
  for _ in 1 2 3; do
    if out=$(ip netns exec "$POD" taskset -c 0 iperf3 -c 203.0.113.2 -p 5201 -u -b 0 -l 64 -t "$SECS" --json 2>/dev/null \
      | python3 -c 'import json,sys
r = json.load(sys.stdin)
if "error" in r or "sum" not in r.get("end", {}):
    sys.exit("iperf3: " + r.get("error", "no result"))
e = r["end"]["sum"]; print(int((e["packets"] - e["lost_packets"]) / e["seconds"]))'); then
      echo "$out"; return 0
    fi
    sleep 1
  done
  echo "iperf3 failed 3 times" >&2; return 1
}
start_agent() { # config: egressd running with its table in sync
  local dir="$WORK/m" extra=()
  case "$1" in *-alt*) dir="$WORK/m-alt" ;; *-runs*) dir="$WORK/m-runs" ;; esac
  case "$1" in *-nofast) extra=(--firewall-verified-mark-mask 0) ;; esac
  NO_COLOR=1 ip netns exec "$NODE" "$BIN" run --manifests "$dir" --node-name bench --cluster-cidr 198.18.0.0/15 \
    --state-dir "$WORK/state" --health-addr 127.0.0.1:9797 "${extra[@]}" 2>"$WORK/log" &
  AGENT=$!
  for _ in $(seq 600); do grep -q "dataplane in sync" "$WORK/log" && break; sleep 0.1; done
  if ! kill -0 "$AGENT" 2>/dev/null; then echo "egressd exited:" >&2; tail -5 "$WORK/log" >&2; exit 1; fi
  # Measuring before the table is in place would measure no policy at all.
  if ! grep -q "dataplane in sync" "$WORK/log"; then
    echo "$1: egressd did not sync within 60 s:" >&2; tail -5 "$WORK/log" >&2; exit 1
  fi
}
stop_agent() { kill -TERM "$AGENT"; wait "$AGENT" || true; AGENT=""; }
setup() { # config
  ip netns exec "$NODE" nft flush ruleset
  case "$1" in
    none) ;;
    none-ct) printf 'table inet kp {\n chain forward {\n  type filter hook forward priority 0; policy accept;\n  ct state invalid drop\n }\n}\n' \
      | ip netns exec "$NODE" nft -f - ;;
    egressd*) start_agent "$1"; stop_agent ;;   # the table stays after SIGTERM
    ipt-1k) ip netns exec "$NODE" iptables-nft-restore <"$WORK/ipt-1000" ;;
    ipt-10k) ip netns exec "$NODE" iptables-nft-restore <"$WORK/ipt-10000" ;;
    ipt-1k-est) ip netns exec "$NODE" iptables-nft-restore <"$WORK/ipt-1000-est" ;;
    ipt-10k-est) ip netns exec "$NODE" iptables-nft-restore <"$WORK/ipt-10000-est" ;;
  esac
}
declare -A results
read -r -a configs <<<"${CONFIGS:-none none-ct egressd egressd-alt ipt-1k ipt-10k ipt-1k-est ipt-10k-est}"
for ((run = 1; run <= RUNS; run++)); do
  for c in "${configs[@]}"; do
    setup "$c"
    results[$c]="${results[$c]:-} $(measure)"
  done
done
stats() { echo "$1" | tr ' ' '\n' | grep . | sort -n | awk '{ a[NR] = $1 } END { m = (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2; printf "%d %d %d", m, a[1], a[NR] }'; }
base=0 base_ct=0
[ -n "${results[none]:-}" ] && read -r base _ _ <<<"$(stats "${results[none]}")"
[ -n "${results[none-ct]:-}" ] && read -r base_ct _ _ <<<"$(stats "${results[none-ct]}")"
ratio() { [ "$2" = 0 ] && echo "—" || printf '%.2f' "$(echo "$1 / $2" | bc -l)"; }
unit=$(case "$LOAD" in pps) echo "pps" ;; tcp) echo "connections/s" ;; udp) echo "flows/s" ;; esac)
echo "| setup | median $unit | min–max | ratio to none | ratio to none-ct |"
echo "|---|---|---|---|---|"
for c in "${configs[@]}"; do
  read -r med lo hi <<<"$(stats "${results[$c]}")"
  printf '| %s | %d | %d–%d | %s | %s |\n' "$c" "$med" "$lo" "$hi" "$(ratio "$med" "$base")" "$(ratio "$med" "$base_ct")"
done
if [ "$REWALK" -gt 0 ]; then
  # Held connections: a round before any change is steady (each connection verified),
  # a round right after a change pays each connection's walk of its rules again.
  sed 's#100\.0\.1\.0/24#100.0.1.0/25#' "$WORK/m-alt/fw-1.yaml" >"$WORK/fw-1-edited.yaml"
  cp "$WORK/m-alt/fw-1.yaml" "$WORK/fw-1-orig.yaml"
  syncs() { grep -c "dataplane in sync" "$WORK/log" || true; }
  # (coproc descriptors exist only in this shell, not in a $(...) or a pipeline)
  round() { echo >&"${COPROC[1]}"; read -r ROUND WRITES <&"${COPROC[0]}"; }
  echo
  echo "Re-walk: $REWALK open TCP connections of the pod, its rule at position $POS of ns0 (Allow and Deny alternating); one byte written on each (the writes' time: the path's cost on the pod's CPU), then every echo read (the round); median of $ROUNDS rounds, and of $ROUNDS changes (ns1's first rule edited)."
  echo
  echo "| set-up | writes, steady | writes right after a change | a change's cost per open connection | round, steady | round after a change |"
  echo "|---|---|---|---|---|---|"
  for c in egressd-alt egressd-alt-nofast; do
    ip netns exec "$NODE" nft flush ruleset
    start_agent "$c"
    coproc ip netns exec "$POD" taskset -c 0 "$LOADGEN" hold 203.0.113.2:5301 "$REWALK"
    HOLDER=$COPROC_PID
    read -r ready <&"${COPROC[0]}"
    [ "$ready" = ready ] || { echo "connload hold: $ready" >&2; exit 1; }
    for _ in 1 2 3; do round; done
    : >"$WORK/steady"; : >"$WORK/after"; : >"$WORK/steady-round"; : >"$WORK/after-round"
    for _ in $(seq "$ROUNDS"); do round; echo "$WRITES" >>"$WORK/steady"; echo "$ROUND" >>"$WORK/steady-round"; done
    for _ in $(seq "$ROUNDS"); do
      n=$(syncs)
      src="$WORK/fw-1-edited.yaml"; cmp -s "$src" "$WORK/m-alt/fw-1.yaml" && src="$WORK/fw-1-orig.yaml"
      cp "$src" "$WORK/m-alt/.tmp" && mv "$WORK/m-alt/.tmp" "$WORK/m-alt/fw-1.yaml"
      for _ in $(seq 400); do [ "$(syncs)" -gt "$n" ] && break; sleep 0.01; done
      [ "$(syncs)" -gt "$n" ] || { echo "$c: the change was not applied within 4 s" >&2; exit 1; }
      sleep 0.2   # egressd idle again: the round pays the re-walk, not its CPU
      round; echo "$WRITES" >>"$WORK/after"; echo "$ROUND" >>"$WORK/after-round"
    done
    median() { local m; read -r m _ _ <<<"$(stats "$(cat "$1")")"; echo "$m"; }   # of a file's numbers
    steady=$(median "$WORK/steady") after=$(median "$WORK/after")
    exec {COPROC[1]}>&-
    wait "$HOLDER" || true; HOLDER=""
    stop_agent
    printf '| %s | %d µs | %d µs | %.0f ns | %d µs | %d µs |\n' "$c" "$steady" "$after" \
      "$(echo "($after - $steady) * 1000 / $REWALK" | bc -l)" "$(median "$WORK/steady-round")" "$(median "$WORK/after-round")"
  done
fi
