//! `egressd explain`, the agent's side: [`socket`] (ask the running agent) and [`kernel`]
//! (cross-check with the live table). The explanation itself is pure:
//! `egressd_core::explain`, re-exported here.

pub use egressd_core::explain::*;

pub mod kernel;
pub mod socket;
