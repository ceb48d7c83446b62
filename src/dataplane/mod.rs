//! Drivers that make the kernel match the desired state.
//!
//! * [`nft`]: the nftables driver — one owned table, changed only in atomic
//!   transactions, deltas in steady state.

pub mod nft;
