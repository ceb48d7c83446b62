#!/usr/bin/env bash
# Build kube-apiserver 1.20.2 from Debian's `kubernetes` source package and cache the
# binary outside the repository (nothing else can be downloaded on this machine kind).
# Prints the binary's path. Reuses the cached binary when it is there.
#
#   EGRESSD_KUBE_CACHE  cache directory (default /var/cache/egressd-kube)
#
# Also installs etcd-server (the API server's store) and the build tools.
set -euo pipefail
CACHE="${EGRESSD_KUBE_CACHE:-/var/cache/egressd-kube}"
BIN="$CACHE/kube-apiserver"

install_pkgs() {
  local missing=()
  for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "build-apiserver: installing ${missing[*]}" >&2
    apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
}

install_pkgs etcd-server openssl
if [ -x "$BIN" ] && "$BIN" --version >/dev/null 2>&1; then
  echo "$BIN"
  exit 0
fi

install_pkgs golang-go rsync golang-github-modern-go-reflect2-dev dpkg-dev openssl
mkdir -p "$CACHE"
SRC_LIST=/etc/apt/sources.list.d/egressd-deb-src.sources
if ! apt-get source --print-uris kubernetes >/dev/null 2>&1 || ! grep -rqs "deb-src" /etc/apt/sources.list.d/ /etc/apt/sources.list; then
  cat >"$SRC_LIST" <<'SRC'
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
  apt-get update -qq >&2
fi

WORK="$CACHE/src"
rm -rf "$WORK" && mkdir -p "$WORK"
cd "$WORK"
echo "build-apiserver: fetching the kubernetes source package" >&2
apt-get source --download-only kubernetes >&2
dpkg-source --no-check -x kubernetes_*.dsc kubernetes >&2
cd kubernetes
# The vendored reflect2 1.0.1 crashes under Go >= 1.18; Debian ships a fixed one.
rm -rf vendor/github.com/modern-go/reflect2
cp -r /usr/share/gocode/src/github.com/modern-go/reflect2 vendor/github.com/modern-go/reflect2
# GOPATH layout as in debian/rules: the tree must live at k8s.io/kubernetes.
GOPATH_DIR="$WORK/gopath"
mkdir -p "$GOPATH_DIR/src/k8s.io"
ln -sfn "$WORK/kubernetes" "$GOPATH_DIR/src/k8s.io/kubernetes"
cd "$GOPATH_DIR/src/k8s.io/kubernetes"
echo "build-apiserver: building (about 12 minutes)" >&2
export GOPATH="$GOPATH_DIR" GO111MODULE=off GOFLAGS=-mod=vendor GOCACHE="$CACHE/gocache"
export KUBE_GIT_VERSION=v1.20.2 KUBE_GIT_TREE_STATE=clean
make WHAT=cmd/kube-apiserver >&2
cp _output/local/go/bin/kube-apiserver "$BIN" 2>/dev/null || cp _output/bin/kube-apiserver "$BIN"
rm -rf "$WORK"
echo "$BIN"
