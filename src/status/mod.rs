//! Status reporting to the API: per-node statuses written with server-side apply (one
//! field manager per node, as the reference does), cluster-wide aggregates and clean-up
//! by the leader ([`lease`]), Events for rejected input ([`writer`]).

pub mod lease;
pub mod writer;
