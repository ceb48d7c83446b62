#!/usr/bin/env bash
# Start a throw-away etcd + kube-apiserver (1.20.2, built by build-apiserver.sh) on
# 127.0.0.1 for tests, with static-token authentication and RBAC authorization:
#
#   tests/kube/apiserver.sh start DIR [PORT]   # prints nothing; writes DIR/env
#   tests/kube/apiserver.sh stop DIR
#
# DIR/env holds KUBE_URL, ADMIN_TOKEN, EGRESSD_TOKEN, ETCD_URL, ETCD_PID, APISERVER_PID.
# Tokens: `admin` (group system:masters) and the ServiceAccount identity
# system:serviceaccount:egressd:egressd (bound only to the RBAC in daemonset/).
# DIR/kubeconfig-admin and DIR/kubeconfig-egressd are ready-made kubeconfigs. There is
# no controller-manager, scheduler or kubelet.
set -euo pipefail
cmd=$1 dir=$2 port=${3:-}
here=$(cd "$(dirname "$0")" && pwd)

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

case "$cmd" in
start)
  bin=$("$here/build-apiserver.sh")
  mkdir -p "$dir"
  [ -n "$port" ] || port=$(free_port)
  etcd_port=$(free_port); peer_port=$(free_port)
  admin=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
  agent=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
  printf '%s,admin,admin,system:masters\n%s,system:serviceaccount:egressd:egressd,sa-egressd,"system:serviceaccounts,system:serviceaccounts:egressd,system:authenticated"\n' "$admin" "$agent" >"$dir/tokens.csv"
  [ -f "$dir/sa.key" ] || openssl genrsa -out "$dir/sa.key" 2048 2>/dev/null
  etcd --data-dir "$dir/etcd" --listen-client-urls "http://127.0.0.1:$etcd_port" \
    --advertise-client-urls "http://127.0.0.1:$etcd_port" --listen-peer-urls "http://127.0.0.1:$peer_port" \
    --initial-advertise-peer-urls "http://127.0.0.1:$peer_port" --initial-cluster "default=http://127.0.0.1:$peer_port" \
    >"$dir/etcd.log" 2>&1 &
  etcd_pid=$!
  "$bin" --etcd-servers "http://127.0.0.1:$etcd_port" --bind-address 127.0.0.1 --secure-port "$port" \
    --cert-dir "$dir/certs" --token-auth-file "$dir/tokens.csv" --authorization-mode RBAC \
    --service-account-key-file "$dir/sa.key" --service-account-signing-key-file "$dir/sa.key" \
    --service-account-issuer https://egressd.test --service-cluster-ip-range 198.19.0.0/16 \
    --disable-admission-plugins ServiceAccount --allow-privileged=true --insecure-port 0 \
    --enable-priority-and-fairness=false \
    >"$dir/apiserver.log" 2>&1 &
  api_pid=$!
  cat >"$dir/env" <<ENV
KUBE_URL=https://127.0.0.1:$port
ADMIN_TOKEN=$admin
EGRESSD_TOKEN=$agent
ETCD_URL=http://127.0.0.1:$etcd_port
ETCD_PID=$etcd_pid
APISERVER_PID=$api_pid
ENV
  for who in admin egressd; do
    token=$admin; [ "$who" = egressd ] && token=$agent
    cat >"$dir/kubeconfig-$who" <<KC
apiVersion: v1
kind: Config
clusters:
- name: test
  cluster: {server: "https://127.0.0.1:$port", insecure-skip-tls-verify: true}
users:
- name: $who
  user: {token: "$token"}
contexts:
- name: test
  context: {cluster: test, user: $who}
current-context: test
KC
  done
  for _ in $(seq 300); do
    if kubectl --kubeconfig "$dir/kubeconfig-admin" get --raw /readyz >/dev/null 2>&1; then exit 0; fi
    kill -0 "$api_pid" 2>/dev/null || { tail -20 "$dir/apiserver.log" >&2; exit 1; }
    sleep 0.2
  done
  echo "apiserver.sh: kube-apiserver not ready" >&2; tail -20 "$dir/apiserver.log" >&2; exit 1
  ;;
stop)
  # shellcheck disable=SC1091
  . "$dir/env"
  kill "$APISERVER_PID" "$ETCD_PID" 2>/dev/null || true
  for _ in $(seq 50); do kill -0 "$APISERVER_PID" 2>/dev/null || kill -0 "$ETCD_PID" 2>/dev/null || break; sleep 0.1; done
  ;;
*) echo "usage: $0 start|stop DIR [PORT]" >&2; exit 2 ;;
esac
