//! Status reporting to the API: every node's status entries and the aggregates, written
//! by the leader ([`crate::leader`] elects it) with server-side apply, a node's own
//! kernel errors by that node, clean-up, Events for rejected input ([`writer`]).

pub mod file;
pub mod writer;

/// The field manager of the leader's status writes.
pub const LEADER_MANAGER: &str = "egressd-leader";

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
