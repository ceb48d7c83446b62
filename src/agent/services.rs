//! The listeners an agent starts beside its loop when configured: DNS snooping and the
//! DNS proxy.

use super::*;

/// Start the DNS snooping listener when configured, keeping what an earlier run learned
/// for the wildcard sets (filled only by snooping).
pub(super) fn start_snooping(config: &RunConfig, view: &ClusterView) -> Option<crate::dataplane::nflog::SnoopHandle> {
    let settings = config.node.snoop.as_ref()?;
    let handle = match crate::dataplane::nflog::SnoopHandle::start(
        settings.group,
        &config.node.table_name,
        config.telemetry.clone(),
    ) {
        Ok(h) => h,
        Err(e) => {
            tracing::error!(
                group = settings.group,
                error = %e,
                "DNS snooping unavailable; wildcard dnsName rules are reported as not applied"
            );
            return None;
        }
    };
    tracing::info!(group = settings.group, servers = ?settings.servers, "DNS snooping on");
    match handle.recover(&crate::compile::wildcard_slots(view)) {
        Ok(0) => {}
        Ok(n) => tracing::info!(elements = n, "addresses learned by an earlier run kept"),
        Err(e) => tracing::warn!(error = %e, "addresses learned by an earlier run not read back"),
    }
    Some(handle)
}

/// Start the DNS proxy when configured (beside the snooping listener, whose memory of
/// learned addresses it shares); `false`: it is off, and no intercept is compiled.
pub(super) fn start_dns_proxy(config: &RunConfig, snoop: Option<&crate::dataplane::nflog::SnoopHandle>) -> bool {
    let (Some(proxy), Some(settings), Some(handle)) = (config.node.dns_proxy, &config.node.snoop, snoop) else {
        return false;
    };
    match crate::dataplane::dns_proxy::start(
        handle.clone(),
        &settings.servers,
        proxy,
        &config.node.table_name,
        config.telemetry.clone(),
    ) {
        Ok(taken) => {
            tracing::info!(servers = ?taken, port = proxy.port, "DNS proxy started");
            true
        }
        Err(e) => {
            tracing::error!(error = %e, "DNS proxy unavailable; pods' DNS answers are snooped only");
            false
        }
    }
}
