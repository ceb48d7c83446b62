//! Status reporting to the API: per-node statuses written with server-side apply (one
//! field manager per node, as the reference does), cluster-wide aggregates and clean-up
//! by the leader ([`crate::leader`] elects it), Events for rejected input ([`writer`]).

pub mod file;
pub mod writer;

use crate::compile::Desired;
use crate::view::ClusterView;

/// Receives each compiled state after it was applied (the Kubernetes status writer).
pub trait StatusSink {
    /// `desired` was just applied (or failed to apply: its statuses say so).
    fn applied(&mut self, view: &ClusterView, desired: &Desired);
}

/// No sink (manifests mode: the status file is all).
impl StatusSink for () {
    fn applied(&mut self, _: &ClusterView, _: &Desired) {}
}
