#!/usr/bin/env bash
# Start a throw-away etcd + kube-apiserver (1.20.2, built by build-apiserver.sh) on
# 127.0.0.1 for tests, with static-token authentication and RBAC authorization:
#
#   tests/kube/apiserver.sh start DIR [PORT]   # prints nothing; writes DIR/env
#   tests/kube/apiserver.sh stop DIR
#
# DIR/env holds KUBE_URL, ADMIN_TOKEN, EGRESSD_TOKEN, ETCD_URL, ETCD_PID, APISERVER_PID.
# Tokens: `admin` (group system:masters) and the ServiceAccount identities
# system:serviceaccount:egressd:egressd (node agents) and
# system:serviceaccount:egressd:egressd-controller (the controller of the split layout,
# daemonset/modes/split), bound only to the RBAC in daemonset/. DIR/kubeconfig-admin,
# DIR/kubeconfig-egressd and DIR/kubeconfig-egressd-controller are ready-made
# kubeconfigs. There is no controller-manager, scheduler or kubelet.
#
#   BIND        address kube-apiserver listens on (default 127.0.0.1)
#   KUBE_HOST   address written into the egressd kubeconfigs (default: BIND, or 127.0.0.1)
set -euo pipefail
cmd=$1 dir=$2 port=${3:-}
here=$(cd "$(dirname "$0")" && pwd)

# Free ports below the kernel's ephemeral range (32768-60999): a port the kernel hands
# out (port 0) may be taken again by an outgoing connection (kube-apiserver's to etcd)
# before the server binds it ("bind: address already in use", seen once in CI).
# free_ports N [TAKEN...]: N distinct free ports, none of TAKEN (picked one call at a
# time, two could be the same port: etcd then held kube-apiserver's, seen once in CI).
free_ports() {
  python3 - "$@" <<'PY'
import random, socket, sys
n, taken = int(sys.argv[1]), {int(p) for p in sys.argv[2:]}
for _ in range(500 * max(n, 1)):
    if n == 0:
        break
    p = random.randrange(20000, 32000)
    if p in taken:
        continue
    s = socket.socket()
    try:
        s.bind(("0.0.0.0", p))
    except OSError:
        continue
    finally:
        s.close()
    print(p)
    taken.add(p)
    n -= 1
else:
    raise SystemExit("no free port in 20000-32000")
PY
}

start_apiserver() { # DIR: start kube-apiserver with the saved arguments, record its PID
  mapfile -t args <"$1/apiserver.args"
  "$(cat "$1/apiserver.bin")" "${args[@]}" >>"$1/apiserver.log" 2>&1 &
  echo $! >"$1/apiserver.pid"
}

wait_ready() { # DIR
  for _ in $(seq 300); do
    if kubectl --kubeconfig "$1/kubeconfig-admin" get --raw /readyz >/dev/null 2>&1; then return 0; fi
    kill -0 "$(cat "$1/apiserver.pid")" 2>/dev/null || { tail -20 "$1/apiserver.log" >&2; return 1; }
    sleep 0.2
  done
  echo "apiserver.sh: kube-apiserver not ready" >&2; tail -20 "$1/apiserver.log" >&2; return 1
}

case "$cmd" in
start)
  bin=$("$here/build-apiserver.sh")
  mkdir -p "$dir"
  [ -n "$port" ] || port=$(free_ports 1)
  read -r etcd_port peer_port <<<"$(free_ports 2 "$port" | tr '\n' ' ')"
  admin=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
  agent=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
  controller=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
  {
    printf '%s,admin,admin,system:masters\n' "$admin"
    printf '%s,system:serviceaccount:egressd:egressd,sa-egressd,"system:serviceaccounts,system:serviceaccounts:egressd,system:authenticated"\n' "$agent"
    printf '%s,system:serviceaccount:egressd:egressd-controller,sa-egressd-controller,"system:serviceaccounts,system:serviceaccounts:egressd,system:authenticated"\n' "$controller"
  } >"$dir/tokens.csv"
  [ -f "$dir/sa.key" ] || openssl genrsa -out "$dir/sa.key" 2048 2>/dev/null
  etcd --data-dir "$dir/etcd" --listen-client-urls "http://127.0.0.1:$etcd_port" \
    --advertise-client-urls "http://127.0.0.1:$etcd_port" --listen-peer-urls "http://127.0.0.1:$peer_port" \
    --initial-advertise-peer-urls "http://127.0.0.1:$peer_port" --initial-cluster "default=http://127.0.0.1:$peer_port" \
    >"$dir/etcd.log" 2>&1 &
  etcd_pid=$!
  bind=${BIND:-127.0.0.1}
  host=${KUBE_HOST:-$bind}; [ "$host" = 0.0.0.0 ] && host=127.0.0.1
  cat >"$dir/apiserver.args" <<ARGS
--etcd-servers=http://127.0.0.1:$etcd_port
--bind-address=$bind
--secure-port=$port
--cert-dir=$dir/certs
--token-auth-file=$dir/tokens.csv
--authorization-mode=RBAC
--service-account-key-file=$dir/sa.key
--service-account-signing-key-file=$dir/sa.key
--service-account-issuer=https://egressd.test
--service-cluster-ip-range=198.19.0.0/16
--disable-admission-plugins=ServiceAccount
--enable-priority-and-fairness=false
ARGS
  # In a namespace without a default route the apiserver cannot guess its address.
  echo "--advertise-address=$host" >>"$dir/apiserver.args"
  echo "$bin" >"$dir/apiserver.bin"
  start_apiserver "$dir"
  api_pid=$(cat "$dir/apiserver.pid")
  cat >"$dir/env" <<ENV
KUBE_URL=https://127.0.0.1:$port
ADMIN_TOKEN=$admin
EGRESSD_TOKEN=$agent
ETCD_URL=http://127.0.0.1:$etcd_port
PORT=$port
ETCD_PID=$etcd_pid
APISERVER_PID=$api_pid
ENV
  for who in admin egressd egressd-controller; do
    token=$admin server=127.0.0.1
    [ "$who" = egressd ] && token=$agent server=$host
    [ "$who" = egressd-controller ] && token=$controller server=$host
    cat >"$dir/kubeconfig-$who" <<KC
apiVersion: v1
kind: Config
clusters:
- name: test
  cluster: {server: "https://$server:$port", insecure-skip-tls-verify: true}
users:
- name: $who
  user: {token: "$token"}
contexts:
- name: test
  context: {cluster: test, user: $who}
current-context: test
KC
  done
  wait_ready "$dir"
  ;;
restart-apiserver)
  # Stop kube-apiserver (etcd keeps running) and start it again on the same port.
  pid=$(cat "$dir/apiserver.pid")
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  [ "${4:-}" = "--down-seconds" ] && sleep "${5:-0}"
  start_apiserver "$dir"
  wait_ready "$dir"
  ;;
stop-apiserver)
  pid=$(cat "$dir/apiserver.pid"); kill "$pid" 2>/dev/null || true
  for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid" 2>/dev/null || true; fi
  ;;
start-apiserver)
  start_apiserver "$dir"; wait_ready "$dir"
  ;;
compact)
  # Compact etcd to its current revision: older resourceVersions answer 410 Gone.
  # shellcheck disable=SC1091
  . "$dir/env"
  python3 - "$ETCD_URL" <<'PY'
import json, sys, urllib.request
url = sys.argv[1]
def post(path, body):
    req = urllib.request.Request(url + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(req))
rev = int(post("/v3/kv/range", {"key": "AA=="})["header"]["revision"])
post("/v3/kv/compaction", {"revision": rev, "physical": True})
print(rev)
PY
  ;;
stop)
  # shellcheck disable=SC1091
  . "$dir/env"
  api=$(cat "$dir/apiserver.pid" 2>/dev/null || echo "$APISERVER_PID")
  kill "$api" "$ETCD_PID" 2>/dev/null || true
  for _ in $(seq 50); do kill -0 "$api" 2>/dev/null || kill -0 "$ETCD_PID" 2>/dev/null || break; sleep 0.1; done
  # Still there after 5 s (an apiserver whose etcd is gone can take half a minute to
  # finish its graceful shutdown, outliving the test and overlapping the next one).
  for p in "$api" "$ETCD_PID"; do kill -0 "$p" 2>/dev/null && kill -KILL "$p" 2>/dev/null; done
  true
  ;;
*) echo "usage: $0 start|stop|restart-apiserver|stop-apiserver|start-apiserver|compact DIR [PORT]" >&2; exit 2 ;;
esac
