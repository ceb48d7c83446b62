//! The agent's netlink side: checking and repairing what egressd owns, reading the
//! links, acting on what a sync changed.

use super::*;

/// One netlink check: `true` when the links changed and they matter (some EgressIP
/// exists: links decide what is hosted) — recompile; otherwise owned state that drifted
/// from `desired` is repaired in place. Without EgressIPs the links are not even read,
/// so pods' veths coming and going cost no recompile.
pub(super) async fn check_net(
    net: &Netlink,
    desired: &Desired,
    last_links: &mut Option<HostLinks>,
    links_matter: bool,
    metrics: &crate::telemetry::metrics::Metrics,
) -> bool {
    if !links_matter {
        *last_links = None;
    } else if let Some(links) = read_links(net).await
        && last_links.as_ref() != Some(&links)
    {
        let first = last_links.is_none();
        *last_links = Some(links);
        if !first {
            tracing::info!("links or their addresses changed; recompiling");
            // The recompile's sync must read the kernel back: a change of egressd's own
            // state noticed together with the links' (one notification) is repaired too.
            net.forget_synced();
        }
        return !first;
    }
    match net.sync(&desired.net).await {
        Ok(changes) if !changes.is_empty() => {
            tracing::warn!(
                added = changes.added.len(),
                removed = changes.removed.len(),
                routing = changes.routing,
                "egressd's addresses, rules or routes were changed by someone else; restored"
            );
            let labels = crate::telemetry::metrics::DriftLabels { what: "netlink".into() };
            metrics.drift_repairs.get_or_create(&labels).inc();
            for (ip, index, link) in changes.added {
                crate::dataplane::announce::announce_repeatedly(ip, index, link);
            }
        }
        Ok(_) => {}
        Err(e) => tracing::warn!(error = %e, "netlink repair failed"),
    }
    false
}

async fn read_links(net: &Netlink) -> Option<HostLinks> {
    match net.links().await {
        Ok(l) => Some(l),
        Err(e) => {
            tracing::warn!(error = %e, "netlink check failed");
            None
        }
    }
}

/// Log (and act on) what a netlink sync changed: connections of removed addresses are
/// forgotten, added ones announced.
pub(super) async fn report_net_changes(changes: &crate::dataplane::netlink::NetChanges) {
    if changes.repaired {
        tracing::warn!(
            added = changes.added.len(),
            removed = changes.removed.len(),
            routing = changes.routing,
            "egressd's addresses, rules or routes were changed by someone else; restored (with a link change)"
        );
    }
    for ip in &changes.removed {
        let ip = *ip;
        match tokio::task::spawn_blocking(move || crate::dataplane::conntrack::forget(ip)).await {
            Ok(Ok(n)) => tracing::info!(%ip, connections = n, "egress IP removed from this node"),
            Ok(Err(e)) => tracing::warn!(%ip, error = %e, "egress IP removed; its connections not forgotten"),
            Err(_) => {}
        }
    }
    for (ip, index, link) in &changes.added {
        tracing::info!(%ip, %link, "egress IP added to this node; announcing it");
        crate::dataplane::announce::announce_repeatedly(*ip, *index, link.clone());
    }
    if changes.routing > 0 {
        tracing::info!(changes = changes.routing, "egress IP rules and routes updated");
    }
}
