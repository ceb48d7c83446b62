#!/usr/bin/env bash
# egressd demo: a node, two pods and an "internet" host in network namespaces; egressd
# enforces examples/manifests/ on the node; connections are tried and shown as allowed
# or denied; then the EgressFirewall is edited live. Everything is removed at the end,
# also on failure or Ctrl-C. Needs root. Installs nftables, iproute2 and python3 with apt
# when missing, and builds egressd with cargo.
#
#   examples/demo.sh
#
# Addresses: 198.18.0.0/15 for the node's pods, documentation ranges for the outside.
set -euo pipefail

cd "$(dirname "$0")/.."
# Root is needed (network namespaces, nftables): as root it runs as is; otherwise it
# re-runs itself with sudo (keeping PATH, so cargo is found).
if [ "$(id -u)" != 0 ]; then
  command -v sudo >/dev/null || { echo "$0: needs root, and sudo is not installed: run it as root" >&2; exit 1; }
  exec sudo env "PATH=$PATH" "$(realpath "$0")" "$@"
fi

missing=()
command -v nft >/dev/null || missing+=(nftables)
command -v ip >/dev/null || missing+=(iproute2)
command -v python3 >/dev/null || missing+=(python3)
if [ ${#missing[@]} -gt 0 ]; then
  echo "== installing ${missing[*]}"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

echo "== building egressd"
cargo build --locked -q --bin egressd
BIN="${CARGO_TARGET_DIR:-target}/debug/egressd"

P="egdemo$$"
NODE="$P-node" WEB="$P-web" BATCH="$P-batch" EXT="$P-ext"
WORK=$(mktemp -d)
EGRESSD_PID="" SERVER_PID="" WEB_SERVER_PID="" BATCH_SERVER_PID=""

cleanup() {
  set +e
  [ -n "$EGRESSD_PID" ] && kill -TERM "$EGRESSD_PID" 2>/dev/null && wait "$EGRESSD_PID" 2>/dev/null
  for pid in $SERVER_PID $WEB_SERVER_PID $BATCH_SERVER_PID; do kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null; done
  ip netns exec "$NODE" "$BIN" cleanup >/dev/null 2>&1
  for ns in "$NODE" "$WEB" "$BATCH" "$EXT"; do ip netns del "$ns" 2>/dev/null; done
  rm -rf "$WORK"
}
trap cleanup EXIT INT TERM

echo "== building the topology"
for ns in "$NODE" "$WEB" "$BATCH" "$EXT"; do
  ip netns add "$ns"
  ip -n "$ns" link set lo up
done
ip netns exec "$NODE" sysctl -qw net.ipv4.ip_forward=1 net.ipv6.conf.all.forwarding=1

link() { # link NS_A IF_A NS_B IF_B
  ip link add "$P-a" type veth peer name "$P-b"
  ip link set "$P-a" netns "$1" name "$2"
  ip link set "$P-b" netns "$3" name "$4"
  # no duplicate address detection: it delays IPv6 neighbour discovery by ~1 s
  ip netns exec "$1" sysctl -qw "net.ipv6.conf.$2.accept_dad=0"
  ip netns exec "$3" sysctl -qw "net.ipv6.conf.$4.accept_dad=0"
  ip -n "$1" link set "$2" up
  ip -n "$3" link set "$4" up
}
link "$NODE" eth-ext "$EXT" eth0
ip -n "$NODE" addr add 203.0.113.1/24 dev eth-ext
ip -n "$NODE" addr add 2001:db8:ff::1/64 dev eth-ext nodad
for a in 203.0.113.2/24 192.0.2.10/32 198.51.100.53/32; do ip -n "$EXT" addr add "$a" dev eth0; done
ip -n "$EXT" addr add 2001:db8:ff::2/64 dev eth0 nodad
ip -n "$EXT" route add 198.18.0.0/15 via 203.0.113.1
ip -n "$EXT" -6 route add 2001:db8:1::/48 via 2001:db8:ff::1
ip -n "$NODE" route add 192.0.2.0/24 via 203.0.113.2
ip -n "$NODE" route add 198.51.100.0/24 via 203.0.113.2

pod() { # pod NS DEV INDEX  (pod i: 198.18.1.(4i+2)/30, 2001:db8:1:(i+1)::2/64)
  link "$NODE" "$2" "$1" eth0
  ip -n "$NODE" addr add "198.18.1.$((4 * $3 + 1))/30" dev "$2"
  ip -n "$NODE" addr add "2001:db8:1:$(($3 + 1))::1/64" dev "$2" nodad
  ip -n "$1" addr add "198.18.1.$((4 * $3 + 2))/30" dev eth0
  ip -n "$1" addr add "2001:db8:1:$(($3 + 1))::2/64" dev eth0 nodad
  ip -n "$1" route add default via "198.18.1.$((4 * $3 + 1))"
  ip -n "$1" -6 route add default via "2001:db8:1:$(($3 + 1))::1"
}
pod "$WEB" vweb 0
pod "$BATCH" vbatch 1

# The "internet": TCP 80 and 443 answer with a greeting, UDP 53 echoes.
cat >"$WORK/server.py" <<'PY'
import socket, sys, threading
# argv: READY_FILE ADDRESS... (UDP binds each address so replies come from it)
ready, addrs = sys.argv[1], sys.argv[2:]
def udp(s):
    while True:
        data, peer = s.recvfrom(1500); s.sendto(b"hello\n", peer)
listeners = []
for port in (80, 443):
    s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    s.bind(("::", port)); s.listen(16); listeners.append(s)
for a in addrs:
    s = socket.socket(socket.AF_INET6 if ":" in a else socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((a, 53))
    threading.Thread(target=udp, args=(s,), daemon=True).start()
def serve(s):
    while True:
        c, _ = s.accept(); c.sendall(b"hello\n"); c.close()
for s in listeners:
    threading.Thread(target=serve, args=(s,), daemon=True).start()
# TCP 8080 answers with the address the connection came from.
w = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
w.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
w.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
w.bind(("::", 8080)); w.listen(16)
def whoami(s):
    while True:
        c, peer = s.accept(); c.sendall((peer[0].removeprefix("::ffff:") + "\n").encode()); c.close()
threading.Thread(target=whoami, args=(w,), daemon=True).start()
open(ready, "w").close()
threading.Event().wait()
PY
ip netns exec "$EXT" python3 "$WORK/server.py" "$WORK/ready-ext" 203.0.113.2 192.0.2.10 198.51.100.53 2001:db8:ff::2 &
SERVER_PID=$!
# The pods serve TCP 80 too: inbound and in-cluster connections are never filtered.
ip netns exec "$WEB" python3 "$WORK/server.py" "$WORK/ready-web" &
WEB_SERVER_PID=$!
ip netns exec "$BATCH" python3 "$WORK/server.py" "$WORK/ready-batch" &
BATCH_SERVER_PID=$!
for _ in $(seq 100); do [ -e "$WORK/ready-ext" ] && [ -e "$WORK/ready-web" ] && [ -e "$WORK/ready-batch" ] && break; sleep 0.1; done

cp examples/manifests/*.yaml "$WORK/"
mkdir "$WORK/manifests" && mv "$WORK"/*.yaml "$WORK/manifests/"

echo "== starting egressd on the node"
NO_COLOR=1 ip netns exec "$NODE" "$BIN" run --manifests "$WORK/manifests" --node-name demo-node \
  --cluster-cidr 198.18.0.0/16 --cluster-cidr 2001:db8:1::/48 --service-cidr 198.19.0.0/16 \
  2>"$WORK/egressd.log" &
EGRESSD_PID=$!   # `ip netns exec` execs in place: this is egressd's own PID
for _ in $(seq 100); do grep -q "dataplane in sync" "$WORK/egressd.log" && break; sleep 0.1; done
grep -q "dataplane in sync" "$WORK/egressd.log" || { cat "$WORK/egressd.log"; exit 1; }

tcp_ok() { ip netns exec "$1" timeout 2 bash -c "exec 3<>/dev/tcp/$2/$3 && read -r -t 1 line <&3" 2>/dev/null; }
udp_ok() { # dd reads a whole datagram (bash read takes one byte and drops the rest)
  [ -n "$(ip netns exec "$1" timeout 2 bash -c "exec 3<>/dev/udp/$2/$3 && echo ping >&3 && timeout 1 dd bs=512 count=1 status=none <&3" 2>/dev/null)" ]
}
probe() { # probe LABEL KIND NS ADDR PORT EXPECT
  local got
  if "$2_ok" "$3" "$4" "$5"; then got=allowed; else got=denied; fi
  printf '  %-44s %-8s %s\n' "$1" "$got" "$([ "$got" = "$6" ] && echo "(as the policy says)" || echo "(UNEXPECTED: policy says $6)")"
  [ "$got" = "$6" ] || FAILED=1
}
FAILED=0

show() {
  probe "shop/web → 192.0.2.10:443 tcp"        tcp "$WEB" 192.0.2.10 443 "$1"
  probe "shop/web → 192.0.2.10:80 tcp"         tcp "$WEB" 192.0.2.10 80 "$2"
  probe "shop/web → 198.51.100.53:53 udp"      udp "$WEB" 198.51.100.53 53 allowed
  probe "shop/web → 203.0.113.2:80 tcp"        tcp "$WEB" 203.0.113.2 80 "$3"
  probe "shop/web → [2001:db8:ff::2]:80 tcp"   tcp "$WEB" 2001:db8:ff::2 80 denied
  probe "analytics/batch → 203.0.113.2:80 tcp" tcp "$BATCH" 203.0.113.2 80 allowed
  probe "analytics/batch → [2001:db8:ff::2]:80" tcp "$BATCH" 2001:db8:ff::2 80 allowed
  probe "internet → shop/web:80 (inbound)"     tcp "$EXT" 198.18.1.2 80 allowed
  probe "shop/web → batch:80 (in-cluster)"       tcp "$WEB" 198.18.1.6 80 allowed
}

echo
echo "== connections under examples/manifests/egressfirewall-shop.yaml"
show allowed denied denied
echo
echo "== EgressIP (examples/manifests/egressip-analytics.yaml): source address seen by the internet"
source_of() { ip netns exec "$1" timeout 2 bash -c "exec 3<>/dev/tcp/$2/8080 && read -r -t 1 line <&3 && echo \$line" 2>/dev/null; }
for _ in $(seq 20); do [ "$(source_of "$BATCH" 203.0.113.2)" = 203.0.113.50 ] && break; sleep 0.1; done
for p in "analytics/batch $BATCH 203.0.113.50"; do
  set -- $p
  got=$(source_of "$2" 203.0.113.2)
  printf '  %-44s %-14s %s\n' "$1 → 203.0.113.2:8080 leaves as" "$got" "$([ "$got" = "$3" ] && echo "(as the policy says)" || echo "(UNEXPECTED: policy says $3)")"
  [ "$got" = "$3" ] || FAILED=1
done
ip -n "$NODE" -br addr show dev eth-ext
echo
echo "== egressd's nft table on the node"
ip netns exec "$NODE" nft list table inet egressd | sed -n '/chain fw-shop/,/}/p;/map fw-pods-v4/,/}/p'

echo
echo "== live edit: allow shop → 203.0.113.0/24 tcp 80 (first rule)"
python3 - "$WORK/manifests/egressfirewall-shop.yaml" <<'PY'
import sys
p = sys.argv[1]
s = open(p).read()
s = s.replace("  egress:\n", "  egress:\n  - type: Allow\n    to:\n      cidrSelector: 203.0.113.0/24\n    ports:\n    - protocol: TCP\n      port: 80\n", 1)
open(p + ".tmp", "w").write(s)
PY
mv "$WORK/manifests/egressfirewall-shop.yaml.tmp" "$WORK/manifests/egressfirewall-shop.yaml"
sleep 1
show allowed denied allowed

echo
echo "== egressd's log"
sed 's/^/  /' "$WORK/egressd.log" | grep -v "nft found" | tail -n 8
echo
if [ "$FAILED" = 0 ]; then echo "== demo OK; cleaning up"; else echo "== demo found unexpected results" >&2; exit 1; fi
