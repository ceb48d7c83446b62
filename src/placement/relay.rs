//! The controller's copy of node agents' subnets (the split layout: node credentials
//! write no Node, docs/security.md).
//!
//! Node agents started with `--subnets-on pod` publish their hosting subnets
//! ([`EGRESS_SUBNETS_ANNOTATION`]) on their own pod; the admission webhook lets a node
//! agent change only that annotation of only its own pod ([`crate::admission`]). The
//! controller watches the node agents' pods (its namespace, `--node-agent-selector`)
//! and writes each pod's annotation onto the Node its pod runs on, when the Node's
//! differs (every replica does; the second finds nothing to write). Placement then reads
//! the Nodes as in the single-identity layout.

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use serde_json::json;

use crate::view::EGRESS_SUBNETS_ANNOTATION;

/// Start the copy: pods of `namespace` matching the label `selector`.
pub fn start(client: Client, namespace: String, selector: String) {
    let span = tracing::info_span!("subnets_relay", %namespace, %selector);
    tokio::spawn(tracing::Instrument::instrument(run(client, namespace, selector), span));
}

async fn run(client: Client, namespace: String, selector: String) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    let nodes: Api<Node> = Api::all(client);
    let stream = watcher::watcher(pods, watcher::Config::default().labels(&selector)).default_backoff();
    futures::pin_mut!(stream);
    while let Some(event) = stream.next().await {
        let pod = match event {
            Ok(Event::Apply(pod) | Event::InitApply(pod)) => pod,
            Ok(_) => continue,
            Err(e) => {
                tracing::warn!(error = %e, "watching the node agents' pods");
                continue;
            }
        };
        let Some((node, subnets)) = published(&pod) else { continue };
        if let Err(e) = copy(&nodes, &node, &subnets).await {
            tracing::warn!(%node, error = %e, "node egress subnets not copied onto the Node; at the next change of the pod");
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
