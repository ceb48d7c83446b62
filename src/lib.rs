//! egressd: a per-node agent that applies Kubernetes egress policy to the node's kernel.
//!
//! The pipeline (see ARCHITECTURE.md): [`api`] (wire types, CRDs, schema) → [`source`]
//! (manifests directory, Kubernetes) → [`view`] (the cluster view: validated policy,
//! pods, nodes) → [`compile`] (pure: view → desired dataplane state) → [`nft`] and
//! [`net`] (the models, rendering, diffs, plans) → [`dataplane`] (drivers that make the
//! kernel match) → [`status`] (per-object outcome), wired together by [`agent`].
//! [`explain`] replays the compile step's decisions for one connection.
//!
//! The pure stages — [`api`], [`view`], [`compile`], [`nft`], [`net`] and the pure parts
//! of [`dns`] and [`explain`] — are the crate `egressd_core` (no async runtime, no sockets, no
//! filesystem), re-exported here under the same paths; this crate does the I/O.
#![deny(unsafe_code)]
#![warn(missing_docs)]
#![warn(unreachable_pub)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used, clippy::panic))]

pub use egressd_core::{api, compile, net, nft, view};

pub mod admission;
pub mod agent;
pub mod aws;
pub mod dataplane;
pub mod dns;
pub mod explain;
pub mod leader;
pub mod placement;
pub mod source;
pub mod state;
pub mod status;
pub mod telemetry;
