//! Resolution in the background: one task owns the schedule ([`DnsTracker`]) and the
//! resolver, resolves the names that fall due (several at once), and reports each round
//! to the agent loop, which applies changed answers as a change of their own. Applying
//! the view never waits for DNS: with the server unreachable, pods, policies and nodes
//! still reach the kernel at once, and a name's last good addresses stay.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::{mpsc, watch};

use super::Families;
use super::resolver::DnsResolver;
use super::{DnsAnswers, DnsTracker, FAST_RETRIES, Resolved};
use crate::telemetry::metrics::{DnsLabels, DnsResult, Metrics};

/// How many names are resolved at once.
const DNS_CONCURRENCY: usize = 64;
/// Names due within this window are resolved together (slightly early), so that one
/// round — and one nft transaction refreshing their timeouts — serves them all.
const DNS_BATCH_WINDOW: Duration = Duration::from_secs(1);

/// One finished round of resolutions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DnsRound {
    /// Whether any name's addresses changed (the view must be recompiled).
    pub changed: bool,
    /// The names attempted (their kernel timeouts can be refreshed).
    pub attempted: Vec<String>,
}

/// The agent's handle on the background resolver.
#[derive(Debug)]
pub(crate) struct DnsWorker {
    tracker: Arc<Mutex<DnsTracker>>,
    names: watch::Sender<BTreeSet<String>>,
    rounds: mpsc::Receiver<DnsRound>,
}

impl DnsWorker {
    /// Start resolving `names` (more with [`DnsWorker::set_names`]) on the current runtime.
    pub(crate) fn start(
        resolver: DnsResolver,
        families: Families,
        names: BTreeSet<String>,
        max_ttl: std::time::Duration,
        metrics: Arc<crate::telemetry::Telemetry>,
    ) -> Self {
        let tracker = Arc::new(Mutex::new(DnsTracker::with_max_ttl(max_ttl)));
        let (names_tx, names_rx) = watch::channel(names);
        let (tx, rounds) = mpsc::channel(16);
        let span = tracing::info_span!("dns_resolver");
        tokio::spawn(tracing::Instrument::instrument(
            run(resolver, families, tracker.clone(), names_rx, tx, metrics),
            span,
        ));
        Self { tracker, names: names_tx, rounds }
    }

    /// Track exactly `names` (new ones are resolved at once).
    pub(crate) fn set_names(&self, names: &BTreeSet<String>) {
        self.names.send_if_modified(|current| {
            if current == names {
                false
            } else {
                current.clone_from(names);
                true
            }
        });
    }

    /// The next finished round (pending forever once the task is gone).
    pub(crate) async fn next_round(&mut self) -> DnsRound {
        match self.rounds.recv().await {
            Some(r) => r,
            None => std::future::pending().await,
        }
    }

    /// Wait at most `limit` for the first round (start-up: names that answer quickly are
    /// in the first table; a slow or unreachable server delays it by `limit` at most).
    pub(crate) async fn first_round(&mut self, limit: Duration) -> Option<DnsRound> {
        tokio::time::timeout(limit, self.next_round()).await.ok()
    }

    /// Read the tracker (answers, per-name state).
    pub(crate) fn with_tracker<T>(&self, f: impl FnOnce(&DnsTracker) -> T) -> T {
        match self.tracker.lock() {
            Ok(t) => f(&t),
            Err(poisoned) => f(&poisoned.into_inner()),
        }
    }

    /// The current answers.
    pub(crate) fn answers(&self) -> DnsAnswers {
        self.with_tracker(DnsTracker::answers)
    }
}

fn lock(tracker: &Mutex<DnsTracker>) -> std::sync::MutexGuard<'_, DnsTracker> {
    tracker.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

async fn run(
    resolver: DnsResolver,
    families: Families,
    tracker: Arc<Mutex<DnsTracker>>,
    mut names: watch::Receiver<BTreeSet<String>>,
    tx: mpsc::Sender<DnsRound>,
    telemetry: Arc<crate::telemetry::Telemetry>,
) {
    let now = || tokio::time::Instant::now().into_std();
    lock(&tracker).set_names(&names.borrow_and_update(), now());
    loop {
        let due = lock(&tracker).due(now() + DNS_BATCH_WINDOW);
        if !due.is_empty() {
            let changed = resolve(&resolver, &tracker, families, &due, &telemetry.metrics).await;
            if tx.send(DnsRound { changed, attempted: due }).await.is_err() {
                return;
            }
            continue;
        }
        let wake = lock(&tracker)
            .next_due()
            .map(tokio::time::Instant::from_std)
            .unwrap_or_else(|| tokio::time::Instant::now() + Duration::from_secs(3600));
        tokio::select! {
            r = names.changed() => {
                if r.is_err() {
                    return;
                }
                let current = names.borrow_and_update().clone();
                lock(&tracker).set_names(&current, now());
            }
            _ = tokio::time::sleep_until(wake) => {}
        }
    }
}

/// Resolve `due` (without holding the tracker) and record the results. Returns whether
/// any name's addresses changed.
async fn resolve(
    resolver: &DnsResolver,
    tracker: &Mutex<DnsTracker>,
    families: Families,
    due: &[String],
    metrics: &Metrics,
) -> bool {
    let results: Vec<(String, Result<Resolved, String>)> = futures::stream::iter(due.to_vec())
        .map(|name| async move {
            let r = resolver.resolve(&name, families).await.map_err(|e| e.to_string());
            (name, r)
        })
        .buffer_unordered(DNS_CONCURRENCY)
        .collect()
        .await;
    let now = tokio::time::Instant::now().into_std();
    let mut tracker = lock(tracker);
    let mut changed = false;
    for (name, result) in results {
        let r = if result.is_ok() { DnsResult::Ok } else { DnsResult::Error };
        metrics.dns_lookups.get_or_create(&DnsLabels { result: r }).inc();
        if let Err(e) = &result {
            let failures = tracker.state(&name).map_or(0, |s| s.failures) + 1;
            if failures == 1 || failures == FAST_RETRIES + 1 {
                tracing::warn!(name = %name, failures, error = %e, "DNS resolution failed; keeping the last good addresses");
            } else {
                tracing::debug!(name = %name, failures, error = %e, "DNS resolution failed");
            }
        } else if tracker.state(&name).is_some_and(|s| s.failures > 0) {
            tracing::info!(name = %name, "DNS resolution recovered");
        }
        let addrs = result.as_ref().map(|r| r.addresses.len()).unwrap_or_default();
        if tracker.record(&name, result, now) {
            tracing::info!(name = %name, addresses = addrs, "DNS addresses changed");
            changed = true;
        }
    }
    changed
}
