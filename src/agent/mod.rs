//! Wiring: source → view → compile → dataplane, in a loop, until shutdown.
//!
//! Guarantees of [`run`]:
//! * Nothing is applied before the source has delivered a complete view (for the
//!   manifests source: one full read of the directory). No transient "no policy" state.
//! * Every change (debounced directory events, and a periodic resync that also catches
//!   missed events) is recompiled and synced as a delta.
//! * On shutdown the dataplane is left exactly as it is: policy keeps holding while the
//!   agent restarts. `egressd cleanup` is the explicit way to remove it.

mod apply;
mod controller;
mod counters;
mod drift;
mod net;
mod render;
mod services;

use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use std::collections::BTreeSet;
use std::net::IpAddr;

use crate::compile::{Desired, DnsNamesCache, NodeConfig, ObjectStatus, Outcome, dns_slots};
use crate::dataplane::netlink::Netlink;
use crate::dataplane::nft_run::NftError;
use crate::dataplane::nft_sync::{NftBackend, NftSyncer, SyncKind};
use crate::dns::DnsTracker;
use crate::dns::resolver::DnsResolver;
use crate::dns::worker::{DnsRound, DnsWorker};
use crate::net::HostLinks;
use crate::source::ViewSource;
use crate::source::manifests::SourceError;
use crate::status::StatusSink;
use crate::view::ClusterView;

pub(crate) use apply::{Kernel, Phases, apply_once};
use counters::COUNTERS_EVERY;
use drift::next_drift;
use net::{check_net, report_net_changes};
pub use render::{compile_manifests, render_manifests};
use services::{
    listen_explain, saved_last_good, start_acl_log, start_dns, start_dns_proxy, start_drift_watch, start_snooping,
};

/// Errors that stop the agent.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The source failed as a whole.
    #[error(transparent)]
    Source(#[from] SourceError),
    /// The Kubernetes client could not be set up.
    #[error("kubernetes: {0}")]
    Kube(#[from] crate::source::kube::ClientError),
    /// A setting cannot be used (an address that cannot be bound, say).
    #[error("{0}")]
    Config(String),
}

/// Why the kernel does not match the desired state after a sync (retried at every
/// wake).
#[derive(Debug, thiserror::Error)]
pub(crate) enum SyncError {
    /// The nft transaction failed.
    #[error(transparent)]
    Nft(#[from] NftError),
    /// The netlink half (EgressIP addresses, rules, routes) failed; the nft table itself
    /// may be in sync.
    #[error("netlink: {0}")]
    Netlink(#[from] crate::dataplane::netlink::NetError),
    /// EgressIPs exist but there is no netlink connection.
    #[error("netlink: no connection")]
    NoNetlink,
}

/// Settings of the agent loop.
#[derive(Debug, Clone)]
pub struct RunConfig {
    /// This node.
    pub node: NodeConfig,
    /// Where the status file is written after every sync (`egressd status` reads it).
    pub state_dir: Option<PathBuf>,
    /// DNS servers for dnsName rules; empty = the name servers of /etc/resolv.conf.
    pub dns_servers: Vec<IpAddr>,
    /// Timeout of one DNS query.
    pub dns_timeout: Duration,
    /// Metrics and readiness.
    pub telemetry: std::sync::Arc<crate::telemetry::Telemetry>,
    /// How often links are checked for changes and owned netlink state for drift.
    pub net_check: Duration,
    /// ACL logging also to this file (JSON lines, rotated).
    pub acl_log_file: Option<PathBuf>,
}

fn record_sync(
    t: &crate::telemetry::Telemetry,
    view: &ClusterView,
    desired: &Desired,
    result: &Result<SyncKind, SyncError>,
    elapsed: Duration,
    phases: Phases,
) {
    use crate::telemetry::metrics::{PhaseLabels, SyncLabels, SyncType};
    let m = &t.metrics;
    match result {
        Ok(kind) => {
            let r#type = if *kind == SyncKind::Full { SyncType::Full } else { SyncType::Partial };
            if *kind != SyncKind::Unchanged {
                m.sync_duration.get_or_create(&SyncLabels { r#type }).observe(elapsed.as_secs_f64());
            }
            let all =
                [("compile", phases.compile), ("diff", phases.diff), ("netlink", phases.netlink), ("nft", phases.nft)];
            for (phase, d) in all {
                m.sync_phase_duration.get_or_create(&PhaseLabels { phase: phase.into() }).observe(d.as_secs_f64());
            }
            m.last_sync_timestamp.set(jiff::Timestamp::now().as_second());
            t.health.set_synced(true);
        }
        Err(_) => {
            m.sync_failures.inc();
            t.health.set_synced(false);
        }
    }
    m.rules.set(i64::try_from(desired.table.rule_count()).unwrap_or(i64::MAX));
    m.elements.set(i64::try_from(desired.table.element_count()).unwrap_or(i64::MAX));
    m.egress_ips_hosted.set(i64::try_from(desired.net.addresses.len()).unwrap_or(i64::MAX));
    m.observe_objects(&view.object_counts());
}

/// The next round of the background resolver (never, without one).
async fn next_round(dns: &mut Option<DnsWorker>) -> DnsRound {
    match dns {
        Some(d) => d.next_round().await,
        None => std::future::pending().await,
    }
}

/// Names that have never resolved, with the reason (for the status problems).
fn dns_problems(tracker: &DnsTracker, names: &BTreeSet<String>) -> Vec<String> {
    names
        .iter()
        .filter_map(|n| {
            let s = tracker.state(n)?;
            match (&s.last, &s.last_error) {
                (None, Some(e)) => Some(format!("dnsName {n}: no addresses yet: {e}")),
                (Some(_), Some(e)) => {
                    Some(format!("dnsName {n}: resolution failing ({e}); keeping the last good addresses"))
                }
                _ => None,
            }
        })
        .collect()
}

/// Write the status file; `statuses` is `desired`'s statuses as rendered.
fn publish(
    config: &RunConfig,
    desired: &Desired,
    statuses: &str,
    sync: &Result<SyncKind, SyncError>,
    problems: &[String],
) {
    let Some(dir) = &config.state_dir else { return };
    let error = sync.as_ref().err().map(|e| e as &dyn std::fmt::Display);
    let report = crate::status::file::report(&config.node, desired, statuses, error, problems);
    if let Err(e) = crate::status::file::write(dir, &report) {
        tracing::warn!(dir = %dir.display(), error = %e, "cannot write the status file");
    }
}

/// This node's pods by address, for the ACL log lines — only while some namespace logs
/// (or some EgressFirewall audits): otherwise nothing is copied and the map stays empty.
fn logged_pods(view: &ClusterView, node: &NodeConfig) -> std::collections::HashMap<IpAddr, String> {
    let logging = view.namespaces.values().any(|n| matches!(n.acl_logging, Some(Ok(_))))
        || view.firewalls.values().any(|e| e.policy.as_ref().is_some_and(|p| p.audit));
    if !logging {
        return Default::default();
    }
    let owners = view.pods.owners();
    owners
        .iter()
        .filter(|(_, p)| node.is_local(p))
        .map(|(ip, p)| (*ip, format!("{}/{}", p.namespace, p.name)))
        .collect()
}

/// Whether the node's links are an input of the compile step: some EgressIP exists, or
/// egressd hosts CloudPrivateIPConfigs itself (`cloud-local`).
fn links_matter(view: &ClusterView, node: &NodeConfig) -> bool {
    !view.egress_ips.is_empty()
        || (node.egress.mode == crate::net::EgressIpMode::CloudLocal && !view.cloud_ips.is_empty())
}

/// The statuses of `new` that `old` does not hold as they are. Both are sorted by key,
/// as the compile step gives them: one lookup each, not a scan of `old` (a thousand
/// EgressFirewalls made that a million comparisons per change).
fn changed_statuses<'a>(old: &'a [ObjectStatus], new: &'a [ObjectStatus]) -> impl Iterator<Item = &'a ObjectStatus> {
    new.iter().filter(|s| {
        // Equal keys are next to each other: any of them may be the same status.
        let first = old.partition_point(|o| o.key < s.key);
        !old[first..].iter().take_while(|o| o.key == s.key).any(|o| o == *s)
    })
}

/// The view's warnings of `now` that `before` did not have: each is logged once, when it
/// appears (a wrong `--cluster-cidr` gives one per pod, and logging them all at every
/// sync took a third of a busy agent's CPU); `egressd render` lists them all.
fn new_warnings<'a>(before: &[String], now: &'a [String]) -> Vec<&'a str> {
    if before == now {
        return Vec::new();
    }
    let before: std::collections::HashSet<&str> = before.iter().map(String::as_str).collect();
    now.iter().map(String::as_str).filter(|w| !before.contains(w)).collect()
}

fn log_status_changes(old: &[ObjectStatus], new: &[ObjectStatus]) {
    for s in changed_statuses(old, new) {
        match &s.outcome {
            Outcome::Failed(_) => tracing::warn!(object = %s.key, status = %s.message(), "status"),
            _ => tracing::info!(object = %s.key, status = %s.message(), "status"),
        }
    }
}

/// The agent: one node's source, dataplane and status, and what it last applied.
///
/// [`Agent::start`] sets up (DNS worker, netlink, snooping listener, saved last good
/// versions) and applies the first complete view; [`Agent::run`] then waits for changes
/// of the source, DNS rounds and netlink checks, and after each calls
/// [`Agent::on_change`] / [`Agent::apply`] / [`Agent::refresh_dns`].
pub struct Agent<S, B, K> {
    config: RunConfig,
    source: S,
    syncer: NftSyncer<B>,
    sink: K,
    dns: Option<DnsWorker>,
    /// The DNS names of the current view.
    names: BTreeSet<String>,
    /// Them by namespace and policy version (a change reads only changed policies).
    names_cache: DnsNamesCache,
    net: Option<Netlink>,
    snoop: Option<crate::dataplane::nflog::SnoopHandle>,
    cache: crate::compile::CompileCache,
    /// Last good versions as saved in the state directory.
    saved: crate::view::last_good::LastGood,
    /// What was last applied, and how that went.
    desired: Desired,
    last_result: Result<SyncKind, SyncError>,
    /// Problems last published in the status file.
    problems: Vec<String>,
    /// `desired`'s statuses as the status file shows them, rendered again only when
    /// they change (a thousand lines at every sync were a tenth of an agent's work).
    statuses_text: Option<String>,
    /// When each name's kernel timeouts were last restarted: a restart is needed only
    /// when half the grace is used up (each costs a set lookup in the kernel).
    refreshed: std::collections::HashMap<String, tokio::time::Instant>,
    /// The kernel counters as last read (named counters, and per-namespace sums).
    copy_counts: std::collections::HashMap<String, u64>,
    last_links: Option<HostLinks>,
    /// When held-back egress IPs were last probed again from the run loop: the next
    /// probe waits at least [`REPROBE_GAP`] even when a probe could not run (links
    /// unreadable, or no EgressIP left), so the loop never spins.
    reprobed: tokio::time::Instant,
    /// When the oldest change of the source not applied yet was seen.
    seen: Option<std::time::Instant>,
    /// The ACL logging listener.
    acl: Option<crate::dataplane::acl_log::AclHandle>,
    /// Changes made by someone else to what egressd owns.
    drift: Option<tokio::sync::mpsc::UnboundedReceiver<crate::dataplane::drift::Drift>>,
    /// When the table was last replaced because of drift: a fight with another writer
    /// (or egressd's own changes taken for someone else's) is stopped, not fed.
    drift_replaces: std::collections::VecDeque<tokio::time::Instant>,
    /// `egressd explain` queries (the socket in the state directory).
    queries: Option<tokio::sync::mpsc::Receiver<crate::explain::socket::Request>>,
}

impl<S: ViewSource, B: NftBackend, K: StatusSink> Agent<S, B, K> {
    /// Set up and apply the source's first complete view.
    pub async fn start(mut config: RunConfig, source: S, mut syncer: NftSyncer<B>, sink: K) -> Self {
        let mut names_cache = DnsNamesCache::default();
        let names = names_cache.names(source.view());
        let dns = start_dns(&config, &names).await;
        let net = match Netlink::connect(config.node.egress.clone()) {
            Ok(n) => Some(n),
            Err(e) => {
                tracing::error!(error = %e, "no netlink socket: EgressIP cannot be applied");
                None
            }
        };
        let acl = start_acl_log(&config);
        let snoop = start_snooping(&config, source.view());
        if snoop.is_none() {
            // Without a listener nothing fills the wildcard sets: say so in the statuses.
            config.node.snoop = None;
        }
        if !start_dns_proxy(&config, snoop.as_ref()) {
            config.node.dns_proxy = None;
        }
        let saved = saved_last_good(&config);
        let last_links = match &net {
            Some(n) => n.links().await.ok(),
            None => None,
        };
        let drift = start_drift_watch(&config, net.as_ref(), &mut syncer);
        let queries = listen_explain(&config);
        let empty = Desired {
            table: std::sync::Arc::new(crate::nft::Table::new(config.node.table_name.clone())),
            net: Default::default(),
            snoop: Default::default(),
            statuses: Vec::new(),
            warnings: Vec::new(),
        };
        let mut agent = Self {
            config,
            source,
            syncer,
            sink,
            dns,
            names,
            net,
            snoop,
            acl,
            copy_counts: Default::default(),
            cache: Default::default(),
            names_cache,
            saved,
            desired: empty,
            last_result: Ok(SyncKind::Unchanged),
            problems: Vec::new(),
            statuses_text: None,
            refreshed: Default::default(),
            last_links,
            reprobed: tokio::time::Instant::now(),
            seen: None,
            drift,
            drift_replaces: Default::default(),
            queries,
        };
        agent.apply().await;
        agent.publish_if_changed(true);
        agent
    }

    /// The source changed: follow its DNS names. Returns whether it must be applied.
    pub(crate) fn on_change(&mut self, changed: bool) -> bool {
        if changed {
            self.names = self.names_cache.names(self.source.view());
            if let Some(d) = &self.dns {
                d.set_names(&self.names);
            }
        }
        changed
    }

    /// Compile the current view and make the kernel match it; then the snooping
    /// listener, the saved last good versions, the metrics and the status sink follow.
    pub async fn apply(&mut self) {
        if self.source.view_mut().adopt_last_good(&self.saved) {
            tracing::info!("invalid objects keep the last good version saved before the restart");
        }
        let seen = self.seen.take();
        let view = self.source.view();
        let answers = self.dns.as_ref().map(DnsWorker::answers).unwrap_or_default();
        let started = std::time::Instant::now();
        self.config.telemetry.health.set_syncing(true);
        let kernel = Kernel { syncer: &mut self.syncer, net: self.net.as_ref(), snoop: self.snoop.as_ref() };
        let (desired, result, links, phases) =
            apply_once(view, &self.config.node, &answers, kernel, &mut self.cache, seen).await;
        if links.is_some() {
            self.last_links = links;
        }
        self.config.telemetry.health.set_syncing(false);
        let telemetry = &self.config.telemetry;
        record_sync(telemetry, view, &desired, &result, started.elapsed(), phases);
        if let Some(h) = &self.snoop {
            h.update(desired.snoop.clone());
        }
        let tracked = self.dns.as_ref().map_or(0, |d| d.with_tracker(DnsTracker::len));
        telemetry.metrics.dns_names.set(i64::try_from(tracked).unwrap_or(i64::MAX));
        let kept = view.kept_last_good();
        if let Some(dir) = self.config.state_dir.as_deref().filter(|_| kept != self.saved) {
            match crate::state::save_last_good(dir, &kept) {
                Ok(()) => self.saved = kept,
                Err(e) => tracing::warn!(dir = %dir.display(), error = %e, "last good versions not saved"),
            }
        }
        log_status_changes(&self.desired.statuses, &desired.statuses);
        for w in new_warnings(&self.desired.warnings, &desired.warnings) {
            tracing::warn!(warning = %w, "cluster view");
        }
        if matches!(result, Ok(SyncKind::Full)) {
            // A full replace wrote every element with a fresh timeout.
            let now = tokio::time::Instant::now();
            self.refreshed = self.names.iter().map(|n| (n.clone(), now)).collect();
        }
        if self.desired.statuses != desired.statuses {
            self.statuses_text = None;
        }
        self.desired = desired;
        self.last_result = result;
        if let Some(acl) = &self.acl {
            acl.update(logged_pods(self.source.view(), &self.config.node));
        }
        self.sink.applied(self.source.view(), &self.desired, self.last_links.as_ref());
        if matches!(self.last_result, Ok(SyncKind::Full)) {
            // A full sync follows a burst (the first load parsed every manifest; the
            // replace rendered the whole table): give what it freed back to the kernel.
            crate::telemetry::memory::release_freed();
        }
    }

    /// Restart the kernel timeouts of the names a DNS round attempted, where half the
    /// grace is used up (a failing server keeps the last good addresses alive).
    pub(crate) fn refresh_dns(&mut self, attempted: Vec<String>) {
        let now = tokio::time::Instant::now();
        let every = self.config.node.dns_grace / 2;
        let stale: Vec<String> = attempted
            .into_iter()
            .filter(|n| self.refreshed.get(n).is_none_or(|t| now.duration_since(*t) >= every))
            .collect();
        if stale.is_empty() {
            return;
        }
        let slots: Vec<crate::nft::Slot> = stale.iter().flat_map(|n| dns_slots(n)).collect();
        match tokio::task::block_in_place(|| self.syncer.refresh_timeouts(&slots)) {
            Ok(_) => self.refreshed.extend(stale.into_iter().map(|n| (n, now))),
            Err(e) => {
                tracing::warn!(error = %e, "refreshing DNS element timeouts failed; next sync replaces the table")
            }
        }
    }

    /// The netlink check ([`check_net`]); the links matter while some EgressIP exists.
    async fn check_net(&mut self) -> bool {
        let Some(n) = &self.net else { return false };
        let links_matter = links_matter(self.source.view(), &self.config.node);
        check_net(n, &self.desired, &mut self.last_links, links_matter, &self.config.telemetry.metrics).await
    }

    /// Answer an `egressd explain` query with the current view, the resolved answers and
    /// the kernel's `dnsName` sets (which hold what snooping learned too).
    fn explain(&self, query: &crate::explain::Query) -> Result<crate::explain::Explanation, String> {
        let view = self.source.view();
        let names = crate::explain::dns_names(view, query);
        let table = &self.config.node.table_name;
        let kernel = match tokio::task::block_in_place(|| crate::explain::kernel::dns_sets(table, &names)) {
            Ok(k) => Some(k),
            Err(e) => {
                tracing::warn!(error = %e, "explain: the dnsName sets could not be read");
                None
            }
        };
        let dns = crate::explain::DnsKnowledge {
            resolved: Some(self.dns.as_ref().map(DnsWorker::answers).unwrap_or_default()),
            kernel,
        };
        crate::explain::explain(view, &self.config.node, &dns, query).map_err(|e| e.to_string())
    }

    /// Write the status file when something was applied or the problems changed.
    fn publish_if_changed(&mut self, applied: bool) {
        let problems = [self.source.problems(), self.dns_problems()].concat();
        if applied || problems != self.problems {
            self.problems = problems;
            let statuses =
                self.statuses_text.get_or_insert_with(|| crate::compile::render_statuses(&self.desired.statuses));
            publish(&self.config, &self.desired, statuses, &self.last_result, &self.problems);
        }
    }

    fn dns_problems(&self) -> Vec<String> {
        self.dns.as_ref().map(|d| d.with_tracker(|t| dns_problems(t, &self.names))).unwrap_or_default()
    }

    /// What was last applied.
    #[cfg(test)]
    fn desired(&self) -> &Desired {
        &self.desired
    }

    /// How the last sync went.
    #[cfg(test)]
    fn last_result(&self) -> &Result<SyncKind, SyncError> {
        &self.last_result
    }

    /// The nft syncer (tests read the recording backend).
    #[cfg(test)]
    fn syncer(&self) -> &NftSyncer<B> {
        &self.syncer
    }

    /// Run until `shutdown` completes: on every change of the source, DNS round and
    /// netlink check, apply what changed.
    pub async fn run(mut self, shutdown: impl Future<Output = ()>) {
        // The netlink state is checked on its own every `net_check`: links or their
        // addresses changed → recompile; owned addresses, rules or routes changed by
        // someone → repaired.
        let mut net_check = tokio::time::interval(self.config.net_check);
        net_check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        net_check.tick().await;
        let mut counters = tokio::time::interval(COUNTERS_EVERY);
        counters.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tokio::pin!(shutdown);
        loop {
            // A failed sync is retried at every wake.
            let mut changed = self.last_result.is_err();
            let mut attempted = Vec::new();
            let reprobe = self
                .net
                .as_ref()
                .and_then(Netlink::next_reprobe)
                .map(|due| tokio::time::Instant::from_std(due).max(self.reprobed + REPROBE_GAP));
            tokio::select! {
                _ = &mut shutdown => break,
                c = self.source.next_change() => {
                    if c {
                        self.seen = self.seen.or(self.source.seen_at());
                    }
                    changed |= self.on_change(c);
                }
                round = next_round(&mut self.dns) => {
                    changed |= round.changed;
                    attempted = round.attempted;
                }
                _ = net_check.tick() => changed |= self.check_net().await,
                first = next_drift(&mut self.drift) => changed |= self.on_drift(first).await,
                _ = counters.tick(), if self.reads_counters() => self.read_counters(),
                Some((query, reply)) = next_query(&mut self.queries) => {
                    let _ = reply.send(self.explain(&query));
                }
                // An address another host answered for is probed again soon, so it is
                // taken within seconds once that host lets go (a deadline, not a sleep
                // restarted at every wake: other events must not postpone it).
                _ = tokio::time::sleep_until(reprobe.unwrap_or_else(tokio::time::Instant::now)),
                    if reprobe.is_some() => {
                    self.reprobed = tokio::time::Instant::now();
                    changed |= self.check_net().await;
                }
            }
            if changed {
                self.apply().await;
            }
            self.publish_if_changed(changed);
            self.refresh_dns(attempted);
        }
        tracing::info!("shutting down; the dataplane stays in place");
    }
}

/// The next `egressd explain` query (never, without the socket).
async fn next_query(
    queries: &mut Option<tokio::sync::mpsc::Receiver<crate::explain::socket::Request>>,
) -> Option<crate::explain::socket::Request> {
    match queries {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

/// The shortest gap between two probes of held-back egress IPs from the run loop.
const REPROBE_GAP: Duration = Duration::from_millis(500);

pub use controller::run_controller;

/// Run until `shutdown` completes: resolve DNS names, compile, sync, report; again on
/// every change of the source and whenever a DNS name falls due.
pub async fn run<S: ViewSource, B: NftBackend, K: StatusSink>(
    config: RunConfig,
    source: S,
    syncer: NftSyncer<B>,
    sink: K,
    shutdown: impl Future<Output = ()>,
) -> Result<(), AgentError> {
    Agent::start(config, source, syncer, sink).await.run(shutdown).await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::parse::{Parsed, parse_document, split_documents, yaml_to_value};
    use crate::dataplane::nft_sync::RecordingBackend;

    #[test]
    fn only_changed_statuses_are_logged() {
        use crate::api::{Kind, ObjectKey};
        let st = |ns: &str, outcome: Outcome| {
            ObjectStatus::new(ObjectKey::new(Kind::EgressFirewall, ns, "default"), "n1", outcome)
        };
        let old = vec![st("a", Outcome::Applied), st("b", Outcome::Applied), st("c", Outcome::Failed("x".into()))];
        let new = vec![
            st("a", Outcome::Applied),
            st("b", Outcome::Failed("y".into())),
            st("c", Outcome::Failed("x".into())),
            st("d", Outcome::Applied),
        ];
        let changed: Vec<&str> = changed_statuses(&old, &new).map(|s| s.key.namespace.as_str()).collect();
        assert_eq!(changed, ["b", "d"]);
        assert_eq!(changed_statuses(&new, &new).count(), 0);
    }

    /// A source whose view the test sets.
    struct FakeSource {
        view: ClusterView,
    }

    impl ViewSource for FakeSource {
        fn view(&self) -> &ClusterView {
            &self.view
        }
        fn view_mut(&mut self) -> &mut ClusterView {
            &mut self.view
        }
        fn problems(&self) -> Vec<String> {
            Vec::new()
        }
        async fn next_change(&mut self) -> bool {
            std::future::pending().await
        }
    }

    fn view(docs: &str) -> ClusterView {
        let mut v = ClusterView::default();
        for (_, _, text) in split_documents(docs) {
            let Ok(Parsed::Object(o)) = parse_document(&yaml_to_value(&text).unwrap(), "default", true) else {
                panic!("bad test document: {text}");
            };
            v.upsert(&o);
        }
        v
    }

    const FIREWALL: &str = "apiVersion: k8s.ovn.org/v1\nkind: EgressFirewall\nmetadata: {name: default, namespace: a}\nspec:\n  egress:\n  - {type: Deny, to: {cidrSelector: 192.0.2.0/24}}\n";

    fn pod(name: &str, ip: &str) -> String {
        format!(
            "---\napiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: a}}\nspec: {{nodeName: n1}}\nstatus: {{podIP: {ip}}}\n"
        )
    }

    async fn agent(docs: &str, backend: RecordingBackend) -> Agent<FakeSource, RecordingBackend, ()> {
        let config = RunConfig {
            node: NodeConfig::new("n1", vec!["198.18.0.0/16".parse().unwrap()]),
            state_dir: None,
            dns_servers: vec!["127.0.0.1".parse().unwrap()],
            dns_timeout: Duration::from_millis(100),
            telemetry: Default::default(),
            net_check: Duration::from_secs(10),
            acl_log_file: None,
        };
        Agent::start(config, FakeSource { view: view(docs) }, NftSyncer::new(backend), ()).await
    }

    #[test]
    fn a_warning_is_logged_when_it_appears_not_at_every_sync() {
        let w = |ws: &[&str]| ws.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let (a, ab) = (w(&["pod IP a"]), w(&["pod IP a", "pod IP b"]));
        assert_eq!(new_warnings(&[], &a), ["pod IP a"]);
        assert!(new_warnings(&a, &a).is_empty(), "the same warnings again: nothing logged");
        assert_eq!(new_warnings(&a, &ab), ["pod IP b"]);
        assert!(new_warnings(&ab, &a).is_empty(), "a warning gone: nothing logged");
        assert_eq!(new_warnings(&ab, &w(&["pod IP c"])), ["pod IP c"]);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn the_first_apply_replaces_the_table_then_changes_are_deltas() {
        let mut a = agent(&format!("{FIREWALL}{}", pod("p1", "198.18.1.1")), RecordingBackend::default()).await;
        let scripts = &a.syncer().backend().scripts;
        assert_eq!(scripts.len(), 1);
        assert!(scripts[0].starts_with("add table inet egressd\ndelete table inet egressd\n"), "{}", scripts[0]);
        assert!(matches!(a.last_result(), Ok(SyncKind::Full)));
        assert_eq!(a.desired().statuses[0].outcome, Outcome::Applied);

        // A new pod: one element, nothing else.
        a.source.view = view(&format!("{FIREWALL}{}{}", pod("p1", "198.18.1.1"), pod("p2", "198.18.1.2")));
        assert!(a.on_change(true));
        a.apply().await;
        // Its element maps it to its namespace's number, the key of `fw-a` in `fw-namespaces`.
        let number = a.desired().table.sets["fw-namespaces"].elements.keys().next().map(ToString::to_string);
        assert_eq!(
            a.syncer().backend().scripts[1],
            format!("add element inet egressd fw-pods-v4 {{ 198.18.1.2 : {} }}\n", number.unwrap_or_default())
        );
        // The same view again sends nothing.
        a.apply().await;
        assert_eq!(a.syncer().backend().scripts.len(), 2);
        assert!(matches!(a.last_result(), Ok(SyncKind::Unchanged)));
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_failed_sync_is_reported_in_the_statuses_and_retried_in_full() {
        let mut a = agent(&format!("{FIREWALL}{}", pod("p1", "198.18.1.1")), RecordingBackend::default()).await;
        a.source.view = view(&format!("{FIREWALL}{}{}", pod("p1", "198.18.1.1"), pod("p2", "198.18.1.2")));
        a.on_change(true);
        // The delta fails, then the full replace it falls back to fails too.
        a.syncer.backend_mut().fail_next = 2;
        a.apply().await;
        assert!(a.last_result().is_err());
        match &a.desired().statuses[0].outcome {
            Outcome::Failed(reason) => assert!(reason.contains("kernel error"), "{reason}"),
            other => panic!("{other:?}"),
        }
        assert!(a.desired().statuses[0].message().contains("EgressFirewall Rules not correctly applied: kernel error"));
        // The next wake retries: a full replace, and the status is applied again.
        a.apply().await;
        assert!(matches!(a.last_result(), Ok(SyncKind::Full)));
        assert_eq!(a.desired().statuses[0].outcome, Outcome::Applied);
        assert!(a.syncer().backend().scripts.last().unwrap().starts_with("add table"));
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn the_status_files_lines_are_always_what_the_statuses_render_to() {
        let mut a = agent(&format!("{FIREWALL}{}", pod("p1", "198.18.1.1")), RecordingBackend::default()).await;
        let fresh =
            |a: &Agent<FakeSource, RecordingBackend, ()>| crate::compile::render_statuses(&a.desired().statuses);
        assert_eq!(a.statuses_text.as_deref(), Some(fresh(&a).as_str()));
        // A failed sync changes the statuses; the retry changes them back; a pod and an
        // unchanged view change nothing in them.
        a.source.view = view(&format!("{FIREWALL}{}{}", pod("p1", "198.18.1.1"), pod("p2", "198.18.1.2")));
        a.syncer.backend_mut().fail_next = 2;
        for _ in 0..3 {
            a.apply().await;
            a.publish_if_changed(true);
            assert_eq!(a.statuses_text.as_deref(), Some(fresh(&a).as_str()));
        }
    }
}
