//! Drivers that make the kernel match the desired state.
//!
//! * [`nft`]: the nftables driver — one owned table, changed only in atomic
//!   transactions, deltas in steady state.
//! * [`netlink`]: egress addresses, policy-routing rules and routes (EgressIP).
//! * [`announce`]: gratuitous ARP / unsolicited neighbour advertisements.
//! * [`conntrack`]: forgetting the connections of an egress IP that left the node.
//! * [`elements`]: in-process set element additions (the DNS snooping fast path).

pub mod announce;
pub mod conntrack;
pub mod elements;
pub mod netlink;
pub mod nft;
