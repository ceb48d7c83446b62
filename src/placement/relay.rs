//! The controller's copy of node agents' subnets (the split layout: node credentials
//! write no Node, docs/security.md).
//!
//! Node agents started with `--subnets-on pod` publish their hosting subnets
//! ([`EGRESS_SUBNETS_ANNOTATION`]) on their own pod; the admission webhook lets a node
//! agent change only that annotation of only its own pod ([`crate::admission`]). The
//! controller watches the node agents' pods (its namespace, `--node-agent-selector`)
//! and, while it leads (cluster-wide work, like every other write of the controller),
//! writes each pod's annotation onto the Node its pod runs on when the Node's differs.
//! What it confirmed is remembered until it stops leading, so a Node is read once per
//! change of its pod's annotation; a replica that starts leading goes over every pod.
//! Placement then reads the Nodes as in the single-identity layout.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use serde_json::json;

use crate::leader::Leadership;
use crate::view::EGRESS_SUBNETS_ANNOTATION;

/// How often a leader goes over the pods whose annotation it has not confirmed on
/// their Node (a failed write, a pod seen while another replica led).
const RETRY: Duration = Duration::from_secs(2);

/// Start the copy: pods of `namespace` matching the label `selector`.
pub fn start(client: Client, namespace: String, selector: String, leadership: Leadership) {
    let span = tracing::info_span!("subnets_relay", %namespace, %selector);
    tokio::spawn(tracing::Instrument::instrument(run(client, namespace, selector, leadership), span));
}

async fn run(client: Client, namespace: String, selector: String, leadership: Leadership) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    let nodes: Api<Node> = Api::all(client);
    let stream = watcher::watcher(pods, watcher::Config::default().labels(&selector)).default_backoff();
    futures::pin_mut!(stream);
    // Node → the subnets its agent's pod publishes, and what this leader confirmed.
    let (mut latest, mut confirmed) = (BTreeMap::<String, String>::new(), BTreeMap::<String, String>::new());
    let mut retry = tokio::time::interval(RETRY);
    retry.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            event = stream.next() => match event {
                None => return,
                Some(Ok(Event::Apply(pod) | Event::InitApply(pod))) => {
                    if let Some((node, subnets)) = published(&pod) {
                        latest.insert(node, subnets);
                    }
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => tracing::warn!(error = %e, "watching the node agents' pods"),
            },
            _ = retry.tick() => {}
        }
        if !leadership.is_leader() {
            confirmed.clear();
            continue;
        }
        for (node, subnets) in &latest {
            if confirmed.get(node) == Some(subnets) {
                continue;
            }
            match copy(&nodes, node, subnets).await {
                Ok(()) => drop(confirmed.insert(node.clone(), subnets.clone())),
                Err(e) => tracing::warn!(%node, error = %e, "node egress subnets not copied onto the Node; retrying"),
            }
        }
    }
}

/// A pod's node and the subnets it published.
fn published(pod: &Pod) -> Option<(String, String)> {
    let node = pod.spec.as_ref()?.node_name.clone().filter(|n| !n.is_empty())?;
    let subnets = pod.metadata.annotations.as_ref()?.get(EGRESS_SUBNETS_ANNOTATION)?.clone();
    Some((node, subnets))
}

/// Write `subnets` as the Node's annotation unless it already is.
async fn copy(nodes: &Api<Node>, node: &str, subnets: &str) -> Result<(), kube::Error> {
    let Some(current) = nodes.get_opt(node).await? else { return Ok(()) };
    let annotations = current.metadata.annotations.unwrap_or_default();
    if annotations.get(EGRESS_SUBNETS_ANNOTATION).map(String::as_str) == Some(subnets) {
        return Ok(());
    }
    let patch = json!({ "metadata": { "annotations": { EGRESS_SUBNETS_ANNOTATION: subnets } } });
    nodes.patch(node, &PatchParams::default(), &Patch::Merge(&patch)).await?;
    tracing::info!(%node, %subnets, "copied a node's egress subnets onto its Node");
    Ok(())
}
