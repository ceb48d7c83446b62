//! `egressd run --role controller`: the cluster-wide work, under an identity node agents
//! do not hold, and without a dataplane.
//!
//! The view is compiled as for a node that hosts nothing: what the leader reports of an
//! EgressFirewall or EgressQoS depends on the object and the cluster only, which every
//! node compiles alike, so the controller's compile reports what the nodes' would. Its
//! statuses go to the sinks — the status writer and placement, each acting only while
//! this process holds the leader Lease. Nothing touches the kernel.

use std::future::Future;

use super::{AgentError, RunConfig};
use crate::api::Kind;
use crate::compile::CompileCache;
use crate::net::HostLinks;
use crate::source::ViewSource;
use crate::status::StatusSink;

/// Compile the view at every change and hand the result to `sink`, until `shutdown`.
pub async fn run_controller<S: ViewSource, K: StatusSink>(
    config: RunConfig,
    mut source: S,
    mut sink: K,
    shutdown: impl Future<Output = ()>,
) -> Result<(), AgentError> {
    tokio::pin!(shutdown);
    let mut cache = CompileCache::default();
    let (dns, links) = (crate::dns::DnsAnswers::default(), HostLinks::default());
    let mut changed = true;
    loop {
        if changed {
            let view = source.view();
            let mut desired = tokio::task::block_in_place(|| {
                crate::compile::compile_cached(view, &config.node, &dns, &links, &mut cache)
            });
            // What a node alone says of an EgressIP (hosting it, steering its pods from
            // its links) means nothing here: a process without links would report every
            // placed IP as not steered. Only the cluster-wide problems stay.
            desired.statuses.retain(|s| s.key.kind != Kind::EgressIP || s.cluster_only);
            sink.applied(view, &desired, None);
            // Ready once the view is compiled: there is no dataplane to wait for.
            config.telemetry.health.set_synced(true);
            tracing::debug!(statuses = desired.statuses.len(), "view compiled for the cluster-wide work");
        }
        tokio::select! {
            c = source.next_change() => changed = c,
            _ = &mut shutdown => return Ok(()),
        }
    }
}
