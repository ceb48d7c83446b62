//! What an agent starts beside its loop ([`Agent::start`]): the DNS worker, the
//! listeners (ACL logging, DNS snooping, the DNS proxy, the explain socket), the drift
//! watch, and the last good versions an earlier run saved. Each that cannot start is
//! logged and left out; the agent runs without it.

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

/// The DNS worker (names are resolved in the background: applying the view never waits
/// for DNS), after its first round: at start-up only, the first answers get one query
/// timeout to arrive, so Allow rules by name hold their addresses in the first table
/// when the server answers.
pub(super) async fn start_dns(config: &RunConfig, names: &BTreeSet<String>) -> Option<DnsWorker> {
    let resolver = match DnsResolver::new(&config.dns_servers, config.dns_timeout) {
        Ok(r) => r,
        Err(e) => {
            tracing::error!(error = %e, "dnsName rules cannot be resolved");
            return None;
        }
    };
    let families = config.node.families();
    let telemetry = config.telemetry.clone();
    let mut dns = DnsWorker::start(resolver, families, names.clone(), config.node.dns_max_ttl, telemetry);
    if !names.is_empty() && dns.first_round(config.dns_timeout).await.is_none() {
        tracing::warn!("DNS answers are late; applying without them (they follow as their own change)");
    }
    Some(dns)
}

/// The ACL logging listener.
pub(super) fn start_acl_log(config: &RunConfig) -> Option<crate::dataplane::acl_log::AclHandle> {
    let group = config.node.acl_log.group;
    match crate::dataplane::acl_log::AclHandle::start(group, config.acl_log_file.clone(), config.telemetry.clone()) {
        Ok(h) => Some(h),
        Err(e) => {
            tracing::warn!(group, error = %e, "ACL logging unavailable (NFLOG group in use?)");
            None
        }
    }
}

/// Last good versions of invalid objects, saved by an earlier run: a restart keeps
/// filtering with them instead of failing open.
pub(super) fn saved_last_good(config: &RunConfig) -> crate::view::last_good::LastGood {
    match config.state_dir.as_deref().map(crate::state::load_last_good) {
        Some(Ok(s)) => s,
        Some(Err(e)) => {
            tracing::warn!(error = %e, "saved last good versions not used");
            Default::default()
        }
        None => Default::default(),
    }
}

/// The watch of changes others make to what egressd owns (its own netlink socket's
/// messages left out); the syncer tells it when a change is egressd's own.
pub(super) fn start_drift_watch<B: NftBackend>(
    config: &RunConfig,
    net: Option<&Netlink>,
    syncer: &mut NftSyncer<B>,
) -> Option<tokio::sync::mpsc::UnboundedReceiver<crate::dataplane::drift::Drift>> {
    let route_filter =
        crate::dataplane::drift::RouteFilter { own_port: net.map(Netlink::port), settings: config.node.egress.clone() };
    match crate::dataplane::drift::start(&config.node.table_name, route_filter) {
        Ok((rx, quiet)) => {
            syncer.set_quiet(Box::new(quiet));
            Some(rx)
        }
        Err(e) => {
            tracing::warn!(error = %e, "changes by others are found by the periodic check only");
            None
        }
    }
}

/// The `egressd explain` socket in the state directory.
pub(super) fn listen_explain(
    config: &RunConfig,
) -> Option<tokio::sync::mpsc::Receiver<crate::explain::socket::Request>> {
    match config.state_dir.as_deref().map(crate::explain::socket::listen) {
        Some(Ok(rx)) => Some(rx),
        Some(Err(e)) => {
            tracing::warn!(error = %e, "`egressd explain` cannot ask this agent (its socket could not be created)");
            None
        }
        None => None,
    }
}
