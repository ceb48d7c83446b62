//! Status reporting to the API: every node's status entries and the aggregates, written
//! by the leader ([`crate::leader`] elects it) with server-side apply, a node's own
//! kernel errors by that node, clean-up, Events for rejected input ([`writer`]).

pub mod board;
pub mod file;
pub mod writer;

/// The field manager of the leader's status writes.
pub const LEADER_MANAGER: &str = "egressd-leader";

/// The zone the leader names in its one entry when it reports for the whole cluster: the
/// reference's own name for its single zone when it runs centralized
/// (`types.OvnDefaultZone`), so statuses read as that mode's do
/// (`global: EgressFirewall Rules applied`, condition `Ready-In-Zone-global`).
pub const GLOBAL_ZONE: &str = "global";

/// Whether the per-node entries of EgressFirewall and EgressQoS statuses name every Ready
/// node or the whole cluster at once.
///
/// The reference writes one entry per zone. In its interconnect mode every node is a zone,
/// so an object holds one entry per node: ~90 bytes per node, which every agent receives
/// with the object it must watch (~135 KiB per object at 1,500 nodes; 50 agents could not
/// list 1,000 such objects: bench/FINDINGS.md "2026-11-27 (seventh)"). In its centralized
/// mode there is one zone, [`GLOBAL_ZONE`]. A node's own kernel error is its own entry in
/// either form.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StatusZones {
    /// Per node while at most [`ZONES_PER_NODE_UP_TO`] nodes are Ready, global above, and
    /// per node again once at most [`ZONES_PER_NODE_AGAIN_AT`] are (so a cluster at the
    /// limit does not rewrite every status at each node that comes and goes).
    #[default]
    Auto,
    /// One entry per Ready node, always.
    PerNode,
    /// One entry, [`GLOBAL_ZONE`], always.
    Global,
}

/// [`StatusZones::Auto`]: the most Ready nodes that still get an entry each.
pub const ZONES_PER_NODE_UP_TO: usize = 100;
/// [`StatusZones::Auto`]: back to entries per node at this many Ready nodes or fewer.
pub const ZONES_PER_NODE_AGAIN_AT: usize = 80;

/// The form of one round of writes: per node or global.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ZoneForm {
    PerNode,
    Global,
}

impl StatusZones {
    /// The form for `ready` Ready nodes, after `previous` (the last round's).
    pub(crate) fn form(self, previous: Option<ZoneForm>, ready: usize) -> ZoneForm {
        match self {
            Self::PerNode => ZoneForm::PerNode,
            Self::Global => ZoneForm::Global,
            Self::Auto if ready > ZONES_PER_NODE_UP_TO => ZoneForm::Global,
            Self::Auto if ready <= ZONES_PER_NODE_AGAIN_AT => ZoneForm::PerNode,
            Self::Auto => previous.unwrap_or(ZoneForm::PerNode),
        }
    }
}

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

/// The Node map the sinks hand their tasks.
pub type NodeMap = std::collections::BTreeMap<String, crate::view::NodeInfo>;

/// The view's nodes as one copy that both sinks and their tasks share, made again only
/// when the nodes changed (their stamp moved): every agent hands a snapshot on at every
/// sync, and on a large cluster the Node map is the biggest part of it. The agent makes
/// one and hands a clone of the handle to each sink.
#[derive(Debug, Default, Clone)]
pub struct SharedNodes(std::sync::Arc<std::sync::Mutex<Option<Stamped>>>);

/// The last copy made, with the nodes' stamp it was made at.
type Stamped = (u64, std::sync::Arc<NodeMap>);

impl SharedNodes {
    /// The nodes of `view` now.
    pub(crate) fn of(&self, view: &ClusterView) -> std::sync::Arc<NodeMap> {
        let stamp = view.nodes.stamp();
        let mut last = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        match &*last {
            Some((at, nodes)) if *at == stamp => nodes.clone(),
            _ => {
                let nodes = std::sync::Arc::new(NodeMap::clone(&view.nodes));
                *last = Some((stamp, nodes.clone()));
                nodes
            }
        }
    }
}

#[cfg(test)]
mod shared_nodes_tests {
    use super::*;

    #[test]
    fn the_nodes_are_copied_only_when_they_changed() {
        let mut view = ClusterView::default();
        view.nodes.insert("n1".into(), crate::view::NodeInfo::default());
        let shared = SharedNodes::default();
        let other_sink = shared.clone();
        let first = shared.of(&view);
        assert!(std::sync::Arc::ptr_eq(&first, &shared.of(&view)), "unchanged nodes: the same copy");
        assert!(std::sync::Arc::ptr_eq(&first, &other_sink.of(&view)), "one copy for both sinks");
        view.nodes.insert("n2".into(), crate::view::NodeInfo::default());
        let second = other_sink.of(&view);
        assert!(!std::sync::Arc::ptr_eq(&first, &second));
        assert!(std::sync::Arc::ptr_eq(&second, &shared.of(&view)), "the other sink gets the new copy");
        assert_eq!(second.keys().collect::<Vec<_>>(), ["n1", "n2"]);
        assert_eq!(*second, std::collections::BTreeMap::clone(&view.nodes));
    }
}
