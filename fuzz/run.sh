#!/usr/bin/env bash
# Fuzz the DNS snooping parser (packet → DNS message → query/answer matching → CNAME
# chains) with libFuzzer through cargo-fuzz. Not part of CI (it runs for minutes).
#
#   cargo install cargo-fuzz        # once
#   fuzz/run.sh [SECONDS]           # default 660 (the ≥ 10 minute bar)
#
# cargo-fuzz needs nightly compiler flags; on the stable toolchain RUSTC_BOOTSTRAP=1
# enables them. Seeds come from `cargo test --lib write_fuzz_seeds -- --ignored`; a
# crash leaves its input in fuzz/artifacts/snoop_packet/.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-660}
cargo test --lib write_fuzz_seeds -- --ignored >/dev/null
mkdir -p fuzz/corpus/snoop_packet
cd fuzz
RUSTC_BOOTSTRAP=1 cargo fuzz run snoop_packet corpus/snoop_packet seeds -- \
  -max_total_time="$secs" -max_len=4096 -rss_limit_mb=1024 -print_final_stats=1
