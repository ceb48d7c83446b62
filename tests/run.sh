#!/usr/bin/env bash
# The test command (README.md): installs what the tests need on a fresh Debian machine,
# then runs every test. Needs root: the netns tests create network namespaces and
# nftables tables (only inside namespaces they create and remove).
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
command -v dnsmasq >/dev/null || missing+=(dnsmasq-base)
command -v systemd-analyze >/dev/null || missing+=(systemd)
command -v curl >/dev/null || missing+=(curl)
command -v python3 >/dev/null || missing+=(python3 python3-pip)
if [ ${#missing[@]} -gt 0 ]; then
  echo "tests/run.sh: installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# The EC2 API server of tests/aws_netns.rs (moto, with boto3 for the test's own calls).
if ! python3 -c 'import moto.server, boto3' 2>/dev/null; then
  echo "tests/run.sh: installing moto[server] (pip)"
  python3 -m pip install -q 'moto[server]==5.2.1' 2>/dev/null ||
    python3 -m pip install -q --break-system-packages 'moto[server]==5.2.1'
fi

command -v kubectl >/dev/null || { echo "tests/run.sh: kubectl is required (the machine image ships it)" >&2; exit 1; }
# The test kube-apiserver (built once from Debian's kubernetes source, ~10 min, then
# cached in /var/cache/egressd-kube) and etcd.
tests/kube/build-apiserver.sh >/dev/null

# Every shell script of the repository parses (the benchmarks are not run here: a
# missing quote in bench/run.sh once went unnoticed).
if git rev-parse --git-dir >/dev/null 2>&1; then
  git ls-files -z | xargs -0 grep -lZ '^#!/usr/bin/env bash' | xargs -0 -r -n1 bash -n
fi
cargo test --locked --features system "$@"
tests/packaging.sh
# Every benchmark once, small (bench/quick.sh): a benchmark that breaks fails here.
[ $# -gt 0 ] || bench/quick.sh
