//! One apply: the desired state compiled from the view, synced to the kernel (netlink,
//! then nft, then what snooping learned), with where its time went.

use std::collections::BTreeSet;
use std::time::Duration;

use crate::compile::{Desired, NodeConfig};
use crate::dataplane::netlink::Netlink;
use crate::dataplane::nft_sync::{NftBackend, NftSyncer, SyncKind};
use crate::dns::DnsAnswers;
use crate::net::HostLinks;
use crate::view::ClusterView;

use super::{SyncError, links_matter, report_net_changes};

/// What [`apply_once`] writes to: the nft table, the netlink state (addresses, rules,
/// routes) when there is a netlink handle, and the DNS snooping listener's learned
/// addresses, which a full replace keeps.
pub(crate) struct Kernel<'a, B> {
    pub syncer: &'a mut NftSyncer<B>,
    pub net: Option<&'a Netlink>,
    pub snoop: Option<&'a crate::dataplane::nflog::SnoopHandle>,
}

/// Compile and sync once: netlink state first (addresses, rules, routes), then the nft
/// table; returns the statuses with kernel failures folded in, and the links the
/// compile used when it read them (what later link checks compare against).
pub(crate) async fn apply_once<B: NftBackend>(
    view: &ClusterView,
    node: &NodeConfig,
    dns: &DnsAnswers,
    kernel: Kernel<'_, B>,
    cache: &mut crate::compile::CompileCache,
    seen: Option<std::time::Instant>,
) -> (Desired, Result<SyncKind, SyncError>, Option<HostLinks>, Phases) {
    let Kernel { syncer, net, snoop } = kernel;
    let started = std::time::Instant::now();
    let mut phases = Phases::default();
    let mut host = HostLinks::default();
    let mut links_read = false;
    let mut net_error: Option<SyncError> = None;
    let wants_net = links_matter(view, node);
    // The links matter to EgressIP only (compile reads them for nothing else).
    if let Some(net) = net.filter(|_| wants_net) {
        let t = std::time::Instant::now();
        match net.links().await {
            Ok(h) => {
                host = h;
                links_read = true;
            }
            Err(e) => net_error = Some(e.into()),
        }
        phases.netlink += t.elapsed();
    }
    let t = std::time::Instant::now();
    let mut desired = tokio::task::block_in_place(|| crate::compile::compile_cached(view, node, dns, &host, cache));
    phases.compile += t.elapsed();
    // At most twice: when another host answers for an address about to be added, the
    // links (with that conflict) are read again and the node compiled without it.
    for attempt in 0..2 {
        let Some(net) = net else {
            if wants_net {
                net_error = Some(SyncError::NoNetlink);
            }
            break;
        };
        if net_error.is_some() {
            break;
        }
        let t = std::time::Instant::now();
        let synced = net.sync_if_changed(&desired.net).await;
        phases.netlink += t.elapsed();
        match synced {
            Ok(changes) => {
                report_net_changes(&changes).await;
                if changes.conflicts.is_empty() || attempt == 1 {
                    break;
                }
                let t = std::time::Instant::now();
                match net.links().await {
                    Ok(h) => host = h,
                    Err(e) => net_error = Some(e.into()),
                }
                phases.netlink += t.elapsed();
                let t = std::time::Instant::now();
                desired = tokio::task::block_in_place(|| crate::compile::compile_cached(view, node, dns, &host, cache));
                phases.compile += t.elapsed();
            }
            Err(e) => net_error = Some(e.into()),
        }
    }
    if let Some(e) = &net_error {
        tracing::error!(error = %e, "netlink sync failed; will retry");
        let net_kinds = [crate::api::Kind::EgressIP, crate::api::Kind::CloudPrivateIPConfig];
        for s in desired.statuses.iter_mut().filter(|s| net_kinds.contains(&s.key.kind)) {
            s.fail(&format!("kernel error: {e}"));
        }
    }
    let result = sync_nft(syncer, snoop, &mut desired, &mut phases);
    report(&mut desired, &result, started, seen, &phases);
    let result = match (result, net_error) {
        (Ok(_), Some(e)) => Err(e),
        (r, _) => r,
    };
    (desired, result, links_read.then_some(host), phases)
}

/// Sync the nft table to `desired` (a full replace keeps what DNS snooping learned, which
/// the table does not hold, in its transaction); the time of the nft program and the
/// kernel, and of egressd's diff, into `phases`.
fn sync_nft<B: NftBackend>(
    syncer: &mut NftSyncer<B>,
    snoop: Option<&crate::dataplane::nflog::SnoopHandle>,
    desired: &mut Desired,
    phases: &mut Phases,
) -> Result<SyncKind, SyncError> {
    let t = std::time::Instant::now();
    let mut kept = 0;
    let keep = || {
        let mut slots: BTreeSet<crate::nft::Slot> =
            desired.snoop.names.values().flatten().flat_map(|n| n.slots).flatten().collect();
        // The DNS proxy's guard elements too: a replace must not send queries direct.
        slots.extend([false, true].map(crate::dns::targets::DnsProxySettings::guard_slot));
        let elements = snoop.map(|h| h.kept(&slots)).unwrap_or_default();
        kept = elements.len();
        elements
    };
    let result = tokio::task::block_in_place(|| syncer.sync_keeping(&mut desired.table, keep)).map_err(SyncError::from);
    if kept > 0 && result.is_ok() {
        tracing::info!(elements = kept, "learned DNS addresses kept through a full sync");
    }
    phases.nft = syncer.backend_time();
    phases.diff = t.elapsed().saturating_sub(phases.nft);
    result
}

/// Log the sync's outcome and where its time went (a failed one fails every status).
fn report(
    desired: &mut Desired,
    result: &Result<SyncKind, SyncError>,
    started: std::time::Instant,
    seen: Option<std::time::Instant>,
    phases: &Phases,
) {
    let ms = |d: Duration| (d.as_secs_f64() * 1e4).round() / 10.0;
    match result {
        Ok(kind) => tracing::info!(
            sync = ?kind,
            rules = desired.table.rule_count(),
            elements = desired.table.element_count(),
            egress_ips_hosted = desired.net.addresses.len(),
            elapsed_ms = started.elapsed().as_millis() as u64,
            // From the source seeing the change (a watch event arriving) to the kernel's
            // ack: the source's reading and the agent's work before the compile too.
            seen_ms = seen.map(|s| ms(s.elapsed())),
            compile_ms = ms(phases.compile),
            diff_ms = ms(phases.diff),
            netlink_ms = ms(phases.netlink),
            nft_ms = ms(phases.nft),
            "dataplane in sync"
        ),
        Err(e) => {
            tracing::error!(error = %e, "nft sync failed; will retry in full");
            for s in &mut desired.statuses {
                s.fail(&format!("kernel error: {e}"));
            }
        }
    }
}

/// Where one sync's time went: egressd's own work (`compile`, `diff`: the delta and its
/// script) and the kernel's (`netlink`; `nft`: the `nft` program and the kernel).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Phases {
    pub(super) compile: Duration,
    pub(super) diff: Duration,
    pub(super) netlink: Duration,
    pub(super) nft: Duration,
}
