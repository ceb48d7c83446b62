//! Status reporting to the API: per-node statuses written with server-side apply (one
//! field manager per node, as the reference does), cluster-wide aggregates and clean-up
//! by the leader ([`crate::leader`] elects it), Events for rejected input ([`writer`]).

pub mod file;
pub mod writer;

use crate::compile::Desired;
use crate::net::HostLinks;
use crate::view::ClusterView;

/// Receives each compiled state after it was applied (the Kubernetes status writer, the
/// EgressIP placement task).
pub trait StatusSink {
    /// `desired` was just applied (or failed to apply: its statuses say so); `links` are
    /// the node's links the compile read (only while some EgressIP exists).
    fn applied(&mut self, view: &ClusterView, desired: &Desired, links: Option<&HostLinks>);
}

/// No sink (manifests mode: the status file is all).
impl StatusSink for () {
    fn applied(&mut self, _: &ClusterView, _: &Desired, _: Option<&HostLinks>) {}
}

/// Two sinks, fed in turn.
impl<A: StatusSink, B: StatusSink> StatusSink for (A, B) {
    fn applied(&mut self, view: &ClusterView, desired: &Desired, links: Option<&HostLinks>) {
        self.0.applied(view, desired, links);
        self.1.applied(view, desired, links);
    }
}
