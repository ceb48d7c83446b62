//! egressd's pure core: everything between the objects a source reads and the kernel
//! state a driver writes, with no I/O — no async runtime, no sockets, no filesystem, no
//! clock it does not get as a parameter. The agent crate (`egressd`) reads, writes and
//! schedules; this crate decides. Its dependencies are all it can name, so the compiler
//! keeps it that way.
//!
//! [`api`] (wire types, CRDs, schema) → [`view`] (the cluster view: validated policy,
//! pods, nodes) → [`compile`] (view → desired dataplane state) → [`nft`] (the table
//! model, rendering, diffs, the netlink encoding) and [`net`] (the netlink model and the
//! plan of a sync); [`dns`] (the refresh schedule, snooping targets, DNS message parsing);
//! [`explain`] (the compile step's decisions replayed for one connection).
#![deny(unsafe_code)]
#![warn(missing_docs)]
#![warn(unreachable_pub)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used, clippy::panic))]

pub mod admission;
pub mod api;
pub mod compile;
pub mod dns;
pub mod explain;
pub mod net;
pub mod nft;
pub mod view;
