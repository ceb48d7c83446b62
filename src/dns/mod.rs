//! DNS names of EgressFirewall rules, the agent's side: [`resolver`] (hickory-resolver,
//! cache off) and [`worker`] (the background task that resolves due names). The pure
//! parts — the refresh schedule, snooping targets, message parsing — are
//! `egressd_core::dns`, re-exported here.

pub use egressd_core::dns::*;

pub mod resolver;
pub mod worker;
