#!/usr/bin/env bash
# What the kernel spends adding one set element, by the element's kind (issue #39, the
# Kubernetes "pod added" figure): a jump element of a verdict map (egressd's pod maps
# before fdb0216; EgressQoS's and EgressIP's still), a pod element of the firewall's
# layout since (address -> namespace number as a classid, looked up by the base chain
# and jumped by through a verdict map of one element per namespace), a data map element
# (address -> mark), a plain set element; in a table of NS chains of RULES rules each
# (alternating accept/drop, each rule its own port) whose base chain looks the pod maps
# up, each holding PODS elements. Timed as the `sendmsg` of nft's batch
# (`strace -T`): the kernel processes the batch, commit included, inside that call.
# Root; it runs in a network namespace of its own, deleted at the end.
#
#   bench/jump-elements.sh                          # NS=1000 RULES=100 PODS=20000
#   NS=1000 RULES=10 PODS=20000 bench/jump-elements.sh   # another table size
set -euo pipefail
if [ -z "${JUMP_INSIDE:-}" ]; then
  cd "$(dirname "$0")/.."
  bench/prereqs.sh base
  ns="egjump$$"
  ip netns add "$ns"
  trap 'ip netns del "$ns"' EXIT
  JUMP_INSIDE=1 ip netns exec "$ns" "$(realpath "$0")"
  exit
fi
NS=${NS:-1000} RULES=${RULES:-100} PODS=${PODS:-20000}
f=$(mktemp) g=$(mktemp)
trap 'rm -f "$f" "$g"' EXIT
{
echo "table inet t {"
for i in $(seq 0 $((NS-1))); do
  echo " chain ns$i {"
  for r in $(seq 0 $((RULES-1))); do
    a=$(( (r % 2) ))
    v=accept; [ $a = 1 ] && v=drop
    echo "  ip daddr 203.0.113.$((r % 250)) tcp dport $((1000 + r)) $v"
  done
  echo " }"
done
echo " map pods { type ipv4_addr : verdict; }"
echo " map podns { type ipv4_addr : mark; }"
echo " map podnumber { type ipv4_addr : classid; }"
echo " map namespaces { type classid : verdict; elements = {"
for i in $(seq 0 $((NS-1))); do echo "  0:$(printf %x $((i + 1))) : jump ns$i,"; done
echo " } }"
echo " set plain { type ipv4_addr; }"
echo " chain base { type filter hook forward priority 0; ip saddr vmap @pods;"
echo "  meta priority set ip saddr map @podnumber meta priority vmap @namespaces; }"
echo "}"
} > $f
nft -f $f
{
echo "add element inet t pods {"
for p in $(seq 0 $((PODS-1))); do echo "198.18.$((p / 250)).$((p % 250 + 1)) : jump ns$((p % NS)),"; done
echo "}"
echo "add element inet t podns {"
for p in $(seq 0 $((PODS-1))); do echo "198.18.$((p / 250)).$((p % 250 + 1)) : $((p % NS)),"; done
echo "}"
echo "add element inet t podnumber {"
for p in $(seq 0 $((PODS-1))); do echo "198.18.$((p / 250)).$((p % 250 + 1)) : 0:$(printf %x $((p % NS + 1))),"; done
echo "}"
} > $g
nft -f $g
t() { strace -f -T -e trace=sendmsg nft "$@" 2>&1 | awk -F'<' '/sendmsg/ {gsub(">","",$NF); s+=$NF} END {printf "%.2f ms\n", s*1000}'; }
echo "| element added | kernel time (${NS} chains × ${RULES} rules, ${PODS} jump elements) |"
echo "|---|---|"
for k in 1 2 3; do
  echo "| jump element | $(t add element inet t pods "{ 198.19.0.$k : jump ns7 }") |"
  echo "| pod element, namespace-number layout (\`address : classid\`) | $(t add element inet t podnumber "{ 198.19.0.$k : 0:8 }") |"
  echo "| data map element | $(t add element inet t podns "{ 198.19.0.$k : 7 }") |"
  echo "| plain set element | $(t add element inet t plain "{ 198.19.0.$k }") |"
done
