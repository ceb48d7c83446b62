//! Drift: someone else changed what egressd owns. The nft table is replaced in full
//! (at most [`DRIFT_LIMIT`] times per [`DRIFT_WINDOW`]); addresses, rules and routes are
//! checked and repaired.

use super::*;

impl<S: ViewSource, B: NftBackend, K: StatusSink> Agent<S, B, K> {
    /// Someone else changed what egressd owns (a burst is taken together): the nft table
    /// is replaced in full by the next apply (returns `true`); addresses, rules and
    /// routes are checked and repaired now.
    pub(super) async fn on_drift(&mut self, first: crate::dataplane::drift::Drift) -> bool {
        use crate::dataplane::drift::Drift;
        // Let a burst (one transaction, a flapping link) arrive, then take it whole.
        tokio::time::sleep(Duration::from_millis(20)).await;
        let mut all = vec![first];
        if let Some(rx) = &mut self.drift {
            while let Ok(d) = rx.try_recv() {
                all.push(d);
            }
        }
        let mut replace = false;
        let mut check = false;
        for d in all {
            match d {
                Drift::Nft { pid, process } => {
                    if !replace {
                        tracing::warn!(pid, process = %process, table = %self.config.node.table_name, "egressd's nft table was changed by another process; replacing it");
                    }
                    replace = true;
                }
                Drift::Netlink => check = true,
            }
        }
        let mut changed = false;
        let now = tokio::time::Instant::now();
        self.drift_replaces.retain(|t| now.duration_since(*t) < DRIFT_WINDOW);
        if replace && self.drift_replaces.len() >= DRIFT_LIMIT {
            tracing::error!(
                limit = DRIFT_LIMIT,
                window_secs = DRIFT_WINDOW.as_secs(),
                "egressd's table keeps being changed by another process; not replacing it again until the window passes (is another agent managing the same table?)"
            );
            replace = false;
        }
        if replace {
            self.drift_replaces.push_back(now);
            let labels = crate::telemetry::metrics::DriftLabels { what: "nft".into() };
            self.config.telemetry.metrics.drift_repairs.get_or_create(&labels).inc();
            self.syncer.force_full();
            changed = true;
        }
        if check {
            changed |= self.check_net().await;
        }
        changed
    }
}

/// At most this many full replaces because of drift ...
const DRIFT_LIMIT: usize = 5;
/// ... within this window.
const DRIFT_WINDOW: Duration = Duration::from_secs(10);

/// The next drift report (never, without the watches).
pub(super) async fn next_drift(
    drift: &mut Option<tokio::sync::mpsc::UnboundedReceiver<crate::dataplane::drift::Drift>>,
) -> crate::dataplane::drift::Drift {
    match drift {
        Some(rx) => match rx.recv().await {
            Some(d) => d,
            None => std::future::pending().await,
        },
        None => std::future::pending().await,
    }
}
