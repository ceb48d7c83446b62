#!/usr/bin/env bash
# Benchmark: the first full sync (compile + one nft transaction) of R EgressFirewall rules
# over NS namespaces with P local pods, then single changes at that scale — one rule
# edited, one pod added, one namespace's firewall replaced, one node's label changed —
# each made REPEAT=11 times (toggled back and forth; a new pod each time) and timed by
# egressd's own "dataplane in sync" log line: from the change being seen (the directory
# watch's event) to the kernel's ack (seen_ms; the full sync: compile + nft, elapsed_ms),
# and as a user waits: from the file's rename to that line (the debounce included; median
# and p99 of the REPEAT changes).
# A step reports the median and the range (one change on this 2-core VM varies by 2x);
# the medians of its compile, diff and nft parts go to stderr. Also the
# agent's RSS. Every hundredth namespace allows ten cluster nodes by label (a nodeSelector
# rule in the middle of its list), so the label change moves a node's address in or out
# of ten namespaces' rules. Then drift: another process flushes one namespace's chain
# (`nft flush chain`), 5 times, timed from just before that nft command starts to the
# sync line of egressd's repair (a full replace; the promise is "within a second").
# The kernel memory the table takes (charged to the agent's memory cgroup) after the first
# sync, and the most the cgroup held by then (the agent's memory, the kernel's copy of a
# batch being taken, the table: what a pod's memory limit must allow). Then the idle CPU
# (the agent and the nft runs it waited for) over IDLE=20 seconds without changes. Then a
# restart (RESTART=0: none): the agent stopped, its table left in place as at every stop,
# and started again in a cgroup of its own (a new pod of the DaemonSet): start → its first
# sync, the new process's peak RSS and its cgroup's peak. Needs root.
#
#   bench/full-sync.sh        # NS=1000 RULES=100 (100k rules) PODS=10000
#   EDIT_TO=100.0.207.0/24 bench/full-sync.sh   # the edited rule's new destination (default
#     100.0.7.128/25: a prefix length its run lacks, so a set and a rule are added; a /24
#     not in the run is an element change)
#   SHAPE=interleaved bench/full-sync.sh   # the rules' shape: friendly (default: 99 Allow
#     rules, a third ported, then Deny all), interleaved (Allow and Deny at random, every
#     rule ported from five common ports, /8–/32 and IPv6 /32–/128 mixed), worst
#     (strictly alternating actions, every rule its own port: nothing merges), sets (runs
#     of five same-port rules of mixed lengths, actions alternating: a set per run)
#   STEPS="edit" PERF_OUT=/tmp/perf.data bench/full-sync.sh   # only these change steps
#     (of: edit pod replace label drift; the others print "—"), e.g. to profile one of them
#   WRAP="heaptrack -o /tmp/ht" STEPS=none bench/full-sync.sh   # the agent run under this
#     command from its start (a profiler: the row's RSS and CPU are then the wrapper's)
set -euo pipefail
cd "$(dirname "$0")/.."
NSN=${NS:-1000} RULES=${RULES:-100} PODS=${PODS:-10000} REPEAT=${REPEAT:-11} SHAPE=${SHAPE:-friendly}
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
NET="egfs$$" WORK=$(mktemp -d) AGENT=""
cleanup() {
  set +e
  if [ -n "$AGENT" ]; then
    kill -TERM "$AGENT"
    # Under WRAP the agent is the wrapper's child, stopped by its command line (the
    # wrapper ends with it).
    [ -n "${WRAP:-}" ] && pkill -TERM -f -- "--manifests $WORK/m "
    wait "$AGENT"
  fi
  cp "$WORK/log" "${BENCH_LOG:-/tmp/egressd-full-sync.log}"
  ip netns del "$NET"; rm -rf "$WORK"
  # A cgroup is removed once its last process has left it (a moment after it exits).
  for cg in $CGS; do for _ in 1 2 3 4 5; do sleep 0.5; rmdir "$cg" && break; done; done
} 2>/dev/null
trap cleanup EXIT
ip netns add "$NET"; ip -n "$NET" link set lo up
mkdir "$WORK/m"
python3 - "$NSN" "$RULES" "$PODS" "$WORK/m" "${EDIT_TO:-100.0.7.128/25}" "$SHAPE" <<'PY'
import ipaddress, random, sys
ns, rules, pods, out, edit_to, shape = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5], sys.argv[6]
def friendly(n, variant):
    # 99 Allow rules (a third with port 443), then one Deny of everything.
    lines = []
    for r in range(rules - 1):
        a, b = 100 + (r + variant) % 100, (r // 100) % 256
        ports = "\n    ports: [{protocol: TCP, port: 443}]" if r % 3 == 0 else ""
        if n % 100 == 0 and r == rules // 2:
            lines.append("  - type: Allow\n    to: {nodeSelector: {matchLabels: {role: egress}}}")
            continue
        lines.append(f"  - type: Allow\n    to: {{cidrSelector: {a}.{b}.{n % 256}.0/24}}{ports}")
    return lines
def runs_of_five(n, variant):
    # Runs of five same-action, same-port IPv4 rules of mixed lengths, actions
    # alternating between runs: every run needs a set of its own (the most sets a rule
    # list can make: one per five rules).
    rnd = random.Random(n * 1000 + variant)
    lines = []
    for r in range(rules - 1):
        action = ("Allow", "Deny")[(r // 5) % 2]
        cidr = str(ipaddress.ip_network((rnd.getrandbits(32), rnd.randint(8, 32)), strict=False))
        lines.append(f"  - type: {action}\n    to: {{cidrSelector: {cidr}}}\n    ports: [{{protocol: TCP, port: {1000 + r // 5}}}]")
    return lines
def mixed(n, variant, alternate):
    # Allow and Deny interleaved, every rule with a port, prefixes /8../32 (IPv4) and
    # /32../128 (IPv6, one rule in five). interleaved: actions at random, ports from five
    # common ones (short runs that still merge: many small sets); worst: actions
    # alternating, every rule its own port (nothing merges).
    rnd = random.Random(n * 1000 + variant)
    lines = []
    for r in range(rules - 1):
        if n % 100 == 0 and r == rules // 2:
            lines.append("  - type: Allow\n    to: {nodeSelector: {matchLabels: {role: egress}}}")
            continue
        action = ("Allow", "Deny")[r % 2] if alternate else rnd.choice(("Allow", "Deny"))
        if rnd.random() < 0.2:
            base = ipaddress.IPv6Address((0x20010DB8 << 96) | rnd.getrandbits(96))
            cidr = str(ipaddress.ip_network((base, rnd.randint(32, 128)), strict=False))
        else:
            cidr = str(ipaddress.ip_network((rnd.getrandbits(32), rnd.randint(8, 32)), strict=False))
        if alternate:
            proto, port = rnd.choice(("TCP", "UDP")), 1000 + r
        else:
            proto, port = rnd.choice((("TCP", 443), ("TCP", 80), ("TCP", 8080), ("UDP", 53), ("TCP", 22)))
        lines.append(f"  - type: {action}\n    to: {{cidrSelector: {cidr}}}\n    ports: [{{protocol: {proto}, port: {port}}}]")
    return lines
def firewall(n, variant=0):
    head = f"apiVersion: k8s.ovn.org/v1\nkind: EgressFirewall\nmetadata: {{name: default, namespace: ns{n}}}\nspec:\n  egress:"
    body = {"friendly": lambda: friendly(n, variant), "interleaved": lambda: mixed(n, variant, False),
            "worst": lambda: mixed(n, variant, True), "sets": lambda: runs_of_five(n, variant)}[shape]()
    return "\n".join([head] + body + ["  - type: Deny\n    to: {cidrSelector: 0.0.0.0/0}"]) + "\n"
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
if shape == "friendly":
    edited = firewall(7).replace("100.0.7.0/24", edit_to, 1)
else:
    # One rule's destination changes (a new prefix length in its namespace).
    text = firewall(7)
    i = text.index("cidrSelector: ", text.index("cidrSelector: ") + 1) + len("cidrSelector: ")
    j = text.index("}", i)
    edited = text[:i] + ("198.51.100.128/25" if ":" not in text[i:j] else "2001:db8:ffff::/49") + text[j:]
open(f"{out}/../edit-rule.yaml", "w").write(edited)
open(f"{out}/../replace-ns.yaml", "w").write(firewall(8, variant=50))
PY
# The agent runs in a memory cgroup of its own: what the kernel keeps for the table
# (nf_tables allocations are charged to the process that makes them) is read from it.
CG="" CGS=""
new_cgroup() { # NAME: CG becomes a new memory cgroup (empty without one)
  CG=""
  for base in /sys/fs/cgroup/memory /sys/fs/cgroup; do
    if [ -w "$base" ] && { [ -e "$base/memory.kmem.usage_in_bytes" ] || [ -e "$base/cgroup.subtree_control" ]; }; then
      CG="$base/egressd-bench-$$-$1"; mkdir -p "$CG" 2>/dev/null || CG=""; break
    fi
  done
  CGS="$CGS $CG"
}
new_cgroup first
cgroup_peak_mib() { # the most the agent's cgroup has held, MiB: the process's memory, the
  # kernel's copy of a batch being taken, the table (— without one)
  if [ -e "$CG/memory.peak" ]; then echo $(( $(cat "$CG/memory.peak") / 1048576 ))
  elif [ -e "$CG/memory.max_usage_in_bytes" ]; then echo $(( $(cat "$CG/memory.max_usage_in_bytes") / 1048576 ))
  else echo "—"; fi
}
kernel_mib() { # what the kernel keeps charged to the agent's cgroup, MiB (— without one)
  if [ -z "$CG" ]; then echo "—"
  elif [ -e "$CG/memory.kmem.usage_in_bytes" ]; then echo $(( $(cat "$CG/memory.kmem.usage_in_bytes") / 1048576 ))
  else awk '$1 == "kernel" || ($1 == "slab" && !k) { k = $2 } END { printf "%d", k / 1048576 }' "$CG/memory.stat"; fi
}
start_agent() { # AGENT: the agent started in the cgroup CG (under WRAP when set), logging to $WORK/log
  NO_COLOR=1 CG="$CG" sh -c '[ -n "$CG" ] && echo $$ >"$CG/cgroup.procs"; exec "$@"' sh \
    ip netns exec "$NET" ${WRAP:-} "$BIN" run --manifests "$WORK/m" --node-name bench --cluster-cidr 198.18.0.0/15 \
    --state-dir "$WORK/state" --health-addr 127.0.0.1:9798 2>>"$WORK/log" &
  AGENT=$!
}
started_ns=$(date +%s%N)
start_agent
syncs() { grep -c "dataplane in sync" "$WORK/log" || true; }
wait_sync() { # N: wait for the N-th sync line
  for _ in $(seq 1200); do [ "$(syncs)" -ge "$1" ] && break; sleep 0.05; done
}
value() { # N KEY: KEY's value in the N-th sync line
  grep "dataplane in sync" "$WORK/log" | sed -n "${1}p" | grep -o "$2=[0-9.]*" | cut -d= -f2
}
median() { sort -g | awk '{ v[NR] = $1 } END { printf "%.1f", NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
# One long-lived process renames, noting the time right before each rename (a `date`
# before an `mv` counted mv's start-up, and a process per change competed with egressd
# for the CPU while it exited).
coproc RENAMER { python3 -u -c '
import os, sys, time
for line in sys.stdin:
    src, dst = line.rstrip("\n").split("\t")
    t = time.time_ns()
    os.rename(src, dst)
    print(t, flush=True)
'; }
put() { # FILE NAME: replace m/NAME with FILE at once (as kubectl-less users and ConfigMaps
  # do), noting the rename's time (what a user's change waits from)
  local t
  cp "$1" "$WORK/m/.tmp"
  printf '%s\t%s\n' "$WORK/m/.tmp" "$WORK/m/$2" >&"${RENAMER[1]}"
  read -r t <&"${RENAMER[0]}"
  echo "$t" >>"$WORK/puts"
}
at_ns() { # N: the time of the N-th sync line (its log timestamp: the kernel has acked)
  date -d "$(grep "dataplane in sync" "$WORK/log" | sed -n "${1}p" | cut -d' ' -f1)" +%s%N
}
p99() { sort -g | awk '{ v[NR] = $1 } END { i = int(NR * 0.99); if (i < NR * 0.99) i++; printf "%.1f", v[i] }'; }
n=1
step() { # LABEL CHANGE: run CHANGE I for I in 1..REPEAT, one sync each; RESULT: the
  # median seen_ms and its range (not printed: a subshell would lose the count n); the
  # medians of the parts to stderr
  local first=$((n + 1)) i
  : >"$WORK/puts"
  for i in $(seq "$REPEAT"); do
    "$2" "$i"; n=$((n + 1)); wait_sync "$n"; sleep 0.2
  done
  local seen; seen=$(for i in $(seq "$first" "$n"); do value "$i" seen_ms; done)
  # From the rename to the kernel's ack: the debounce and the directory watch included.
  local e2e; e2e=$(for i in $(seq "$first" "$n"); do
    echo "$(at_ns "$i") $(sed -n "$((i - first + 1))p" "$WORK/puts")"; done | awk '{ printf "%.1f\n", ($1 - $2) / 1e6 }')
  RESULT=$(printf '%s %s ms (%s–%s) [rename → ack: median %s ms, p99 %s ms of %s]' "$1" "$(echo "$seen" | median)" \
    "$(echo "$seen" | sort -g | head -n1)" "$(echo "$seen" | sort -g | tail -n1)" "$(echo "$e2e" | median)" "$(echo "$e2e" | p99)" "$REPEAT")
  printf '%s: median seen_ms=%s' "$1" "$(echo "$seen" | median)" >&2
  for k in compile_ms diff_ms nft_ms; do
    printf ' %s=%s' "$k" "$(for i in $(seq "$first" "$n"); do value "$i" "$k"; done | median)" >&2
  done
  echo >&2
}
wait_sync 1
ready_ms=$(( ($(date +%s%N) - started_ns) / 1000000 ))
full=$(value 1 elapsed_ms)
grep "dataplane in sync" "$WORK/log" | head -n 1 | grep -o 'elapsed_ms=.*nft_ms=[0-9.]*' >&2 || true
rss=$(awk '/VmRSS/ { print $2 }' "/proc/$AGENT/status")
hwm_start=$(awk '/VmHWM/ { print $2 }' "/proc/$AGENT/status")
anon=$(awk '/RssAnon/ { print $2 }' "/proc/$AGENT/status")
kernel_first=$(kernel_mib)
cgroup_first=$(cgroup_peak_mib)
rules_applied=$(ip netns exec "$NET" nft -a list table inet egressd | grep -c 'comment "egress\[' || true)
sleep 1
# PERF_OUT=file: the change steps recorded with perf (call graphs) into that file.
PERF=""
if [ -n "${PERF_OUT:-}" ]; then
  perf record -q -F "${PERF_FREQ:-20000}" ${PERF_CALLGRAPH:--g} -p "$AGENT" -o "$PERF_OUT" 2>/dev/null & PERF=$!
  sleep 1
fi
for f in fw-7.yaml fw-8.yaml nodes.yaml; do cp "$WORK/m/$f" "$WORK/orig-$f"; done
toggle() { # CHANGED I NAME: odd I puts the changed version of NAME, even I the original
  if [ $(($2 % 2)) = 1 ]; then put "$WORK/$1" "$3"; else put "$WORK/orig-$3" "$3"; fi
}
edit_rule() { toggle edit-rule.yaml "$1" fw-7.yaml; }
add_pod() {
  printf -- '---\napiVersion: v1\nkind: Pod\nmetadata: {name: extra%d, namespace: ns%d}\nspec: {nodeName: bench}\nstatus: {phase: Running, podIP: 198.19.255.%d}\n' \
    "$1" "$((9 + $1))" "$1" >"$WORK/pod.yaml"
  put "$WORK/pod.yaml" "extra-pod-$1.yaml"
}
replace_ns() { toggle replace-ns.yaml "$1" fw-8.yaml; }
label_node() { toggle label-node.yaml "$1" nodes.yaml; }
wanted() { case " ${STEPS:-edit pod replace label drift} " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
edit="—" pod="—" replace="—" label="—"
if wanted edit; then step "one rule edited" edit_rule; edit=$RESULT; fi
if wanted pod; then step "one pod added" add_pod; pod=$RESULT; fi
if wanted replace; then step "one namespace replaced" replace_ns; replace=$RESULT; fi
if wanted label; then step "one node label changed" label_node; label=$RESULT; fi
drift="—"
if wanted drift; then
  # Another process flushes a chain: egressd replaces its table. Timed from just before
  # the nft command to the repair's sync line.
  d=()
  for i in 1 2 3 4 5; do
    before=$(syncs); t=$(date +%s%N)
    ip netns exec "$NET" nft flush chain inet egressd fw-ns7
    wait_sync $((before + 1))
    [ "$(syncs)" -gt "$before" ] || { echo "drift not repaired within 60 s" >&2; exit 1; }
    n=$(syncs)
    d+=("$(( ($(at_ns "$n") - t) / 1000000 ))")
    sleep 0.5
  done
  drift="drift repaired $(printf '%s\n' "${d[@]}" | median) ms ($(printf '%s\n' "${d[@]}" | sort -g | head -n1)–$(printf '%s\n' "${d[@]}" | sort -g | tail -n1))"
fi
if [ -n "$PERF" ]; then kill -INT "$PERF"; wait "$PERF" || true; fi
# Idle CPU: the agent and the processes it ran (waited-for children: its nft runs) over
# IDLE seconds with nothing changing, in % of one core.
ticks() { awk '{ print $14 + $15 + $16 + $17 }' "/proc/$AGENT/stat"; }
sleep 1
t0=$(ticks); sleep "${IDLE:-20}"; t1=$(ticks)
hwm=$(awk '/VmHWM/ { print $2 }' "/proc/$AGENT/status")
idle=$(awk -v a="$t0" -v b="$t1" -v hz="$(getconf CLK_TCK)" -v s="${IDLE:-20}" 'BEGIN { printf "%.2f", (b - a) / hz / s * 100 }')
# A restart (RESTART=0: none): the agent stopped (its table stays, as at every stop) and
# started again over its table, in a memory cgroup of its own (a new pod of the
# DaemonSet): from its start to its first sync, its peak RSS, its cgroup's peak.
restart="—"
if [ "${RESTART:-1}" = 1 ] && [ -z "${WRAP:-}" ]; then
  kill -TERM "$AGENT"
  # A stop is part of what a restart does: one that fails fails the bench.
  stopped=0; wait "$AGENT" || stopped=$?
  [ "$stopped" = 0 ] || { echo "the agent exited with $stopped when stopped with SIGTERM" >&2; exit 1; }
  before=$(syncs)
  new_cgroup restart
  t=$(date +%s%N)
  start_agent
  wait_sync $((before + 1))
  [ "$(syncs)" -gt "$before" ] || { echo "the restarted agent did not sync within 60 s" >&2; exit 1; }
  restart="restart over the table: ready $(( ($(date +%s%N) - t) / 1000000 )) ms, full sync $(value "$((before + 1))" elapsed_ms) ms, peak $(( $(awk '/VmHWM/ { print $2 }' "/proc/$AGENT/status") / 1024 )) MiB, cgroup peak $(cgroup_peak_mib) MiB"
fi
echo "| $((NSN * RULES)) rules ($SHAPE), $NSN namespaces, $PODS local pods ($rules_applied nft rules) | full sync ${full} ms, start → ready ${ready_ms} ms | ${edit} | ${pod} | ${replace} | ${label} | ${drift} | RSS $((rss / 1024)) MiB after the first sync (heap $((anon / 1024)) MiB, the rest mapped code), peak $((hwm_start / 1024)) MiB at start, $((hwm / 1024)) MiB over the run; kernel ${kernel_first} MiB, cgroup peak ${cgroup_first} MiB | idle CPU ${idle} % | ${restart} |"
