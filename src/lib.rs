//! egressd: a per-node agent that applies Kubernetes egress policy to the node's kernel.
//!
//! The pipeline, one module each (see ARCHITECTURE.md):
//! [`api`] (wire types, CRDs, schema) → [`source`] (manifests directory, Kubernetes) →
//! [`view`] (the cluster view: validated policy, pods, nodes) → [`compile`] (pure:
//! view → desired dataplane state) → [`nft`] (the table model, rendering, diffs) →
//! [`dataplane`] (drivers that make the kernel match) → [`status`] (per-object outcome),
//! wired together by [`agent`]. [`explain`] replays the compile step's decisions for
//! one connection (`egressd explain`).
#![deny(unsafe_code)]
#![warn(missing_docs)]
#![warn(unreachable_pub)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used, clippy::panic))]

pub mod agent;
pub mod api;
pub mod aws;
pub mod compile;
pub mod dataplane;
pub mod dns;
pub mod explain;
pub mod leader;
pub mod net;
pub mod nft;
pub mod placement;
pub mod source;
pub mod state;
pub mod status;
pub mod telemetry;
pub mod view;
