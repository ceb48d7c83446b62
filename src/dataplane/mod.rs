//! Drivers that make the kernel match the desired state.
//!
//! * [`nft`]: the nftables driver — one owned table, changed only in atomic
//!   transactions, deltas in steady state.
//! * [`netlink`]: egress addresses, policy-routing rules and routes (EgressIP).
//! * [`announce`]: gratuitous ARP / unsolicited neighbour advertisements.

pub mod announce;
pub mod netlink;
pub mod nft;
