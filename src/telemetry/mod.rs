//! What egressd tells about itself: Prometheus metrics ([`metrics`]), prerequisite
//! checks ([`prereq`]) and the health listener serving `/healthz`, `/readyz` and
//! `/metrics` ([`server`]).

pub mod memory;
pub mod metrics;
pub mod prereq;
pub mod server;

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use prereq::Check;

/// Readiness state: the first complete sync was applied, and the prerequisites hold.
#[derive(Debug, Default)]
pub struct Health {
    synced: AtomicBool,
    checks: Mutex<Vec<Check>>,
    kinds: Mutex<Vec<UnavailableKind>>,
    /// Parts of egressd that stopped for good (component → why): not alive.
    dead: Mutex<std::collections::BTreeMap<&'static str, String>>,
    /// When the sync under way started.
    sync_started: Mutex<Option<std::time::Instant>>,
}

/// A sync (compile, netlink, nft) taking longer than this is stuck: `/healthz` fails, so
/// the agent is restarted (each `nft` run is bounded by 30 s).
pub(crate) const STUCK_SYNC: std::time::Duration = std::time::Duration::from_secs(120);

/// Marks `component` dead in [`Health`] when dropped — when the thread holding it
/// returns or panics.
pub(crate) struct DeadOnExit {
    pub(crate) telemetry: std::sync::Arc<Telemetry>,
    pub(crate) component: &'static str,
}

impl Drop for DeadOnExit {
    fn drop(&mut self) {
        let why = if std::thread::panicking() { "panicked" } else { "stopped" };
        tracing::error!(component = self.component, "{why}; /healthz fails from now on");
        self.telemetry.health.set_dead(self.component, why);
    }
}

/// A kind the source cannot list (Kubernetes mode).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct UnavailableKind {
    /// The kind.
    pub kind: String,
    /// Whether it keeps the agent from being ready (forbidden: yes; a CRD that is not
    /// installed — OpenShift's CloudPrivateIPConfig on other clusters — no).
    pub blocking: bool,
    /// Why.
    pub reason: String,
}

impl Health {
    /// Record that a sync succeeded (or failed).
    pub(crate) fn set_synced(&self, ok: bool) {
        self.synced.store(ok, Ordering::SeqCst);
    }

    /// Replace the prerequisite check results.
    pub fn set_checks(&self, checks: Vec<Check>) {
        if let Ok(mut c) = self.checks.lock() {
            *c = checks;
        }
    }

    /// `component` stopped for good.
    pub(crate) fn set_dead(&self, component: &'static str, why: &str) {
        if let Ok(mut d) = self.dead.lock() {
            d.insert(component, why.to_string());
        }
    }

    /// A sync starts (`true`) or ended (`false`).
    pub(crate) fn set_syncing(&self, syncing: bool) {
        if let Ok(mut s) = self.sync_started.lock() {
            *s = syncing.then(std::time::Instant::now);
        }
    }

    /// `Ok(())` while every part of egressd works, else what does not (`/healthz`).
    pub fn liveness(&self) -> Result<(), Vec<String>> {
        self.liveness_at(std::time::Instant::now())
    }

    fn liveness_at(&self, now: std::time::Instant) -> Result<(), Vec<String>> {
        let mut reasons: Vec<String> =
            self.dead.lock().map(|d| d.iter().map(|(c, why)| format!("{c}: {why}")).collect()).unwrap_or_default();
        if let Ok(Some(started)) = self.sync_started.lock().map(|s| *s) {
            let running = now.saturating_duration_since(started);
            if running > STUCK_SYNC {
                reasons.push(format!("sync: running for {} s (stuck)", running.as_secs()));
            }
        }
        if reasons.is_empty() { Ok(()) } else { Err(reasons) }
    }

    /// Replace the kinds that cannot be listed.
    pub(crate) fn set_unavailable_kinds(&self, kinds: Vec<UnavailableKind>) {
        if let Ok(mut k) = self.kinds.lock() {
            *k = kinds;
        }
    }

    /// What does not block readiness but should be seen: informational checks that do
    /// not hold (a kernel that cannot host egress IPs, say) and kinds treated as empty.
    pub(crate) fn notes(&self) -> Vec<String> {
        let mut notes: Vec<String> = self
            .checks
            .lock()
            .map(|c| c.iter().filter(|c| !c.required && !c.ok).map(|c| format!("{}: {}", c.name, c.detail)).collect())
            .unwrap_or_default();
        if let Ok(k) = self.kinds.lock() {
            notes.extend(k.iter().filter(|k| !k.blocking).map(|k| format!("{}: {}", k.kind, k.reason)));
        }
        notes
    }

    /// `Ok(())` when ready, else the named reasons.
    pub(crate) fn readiness(&self) -> Result<(), Vec<String>> {
        let mut reasons = Vec::new();
        if !self.synced.load(Ordering::SeqCst) {
            reasons.push("dataplane: no complete sync applied yet (or the last one failed)".to_string());
        }
        if let Ok(checks) = self.checks.lock() {
            reasons.extend(checks.iter().filter(|c| c.required && !c.ok).map(|c| format!("{}: {}", c.name, c.detail)));
        }
        if let Ok(kinds) = self.kinds.lock() {
            reasons.extend(kinds.iter().filter(|k| k.blocking).map(|k| format!("{}: {}", k.kind, k.reason)));
        }
        if reasons.is_empty() { Ok(()) } else { Err(reasons) }
    }
}

/// Metrics and health, shared by the agent loop and the listener.
#[derive(Debug, Default)]
pub struct Telemetry {
    /// The metrics.
    pub metrics: metrics::Metrics,
    /// Readiness.
    pub health: Health,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_only_after_a_sync_with_required_checks_passing() {
        let h = Health::default();
        assert!(h.readiness().is_err());
        h.set_synced(true);
        assert!(h.readiness().is_ok());
        h.set_checks(vec![Check {
            name: "net.ipv4.ip_forward".into(),
            ok: false,
            required: true,
            detail: "is 0, needs 1".into(),
        }]);
        assert_eq!(h.readiness(), Err(vec!["net.ipv4.ip_forward: is 0, needs 1".to_string()]));
        h.set_checks(vec![Check { name: "info".into(), ok: false, required: false, detail: "x".into() }]);
        assert!(h.readiness().is_ok(), "informational checks do not block readiness");
        h.set_unavailable_kinds(vec![
            UnavailableKind { kind: "CloudPrivateIPConfig".into(), blocking: false, reason: "not served".into() },
            UnavailableKind { kind: "EgressQoS".into(), blocking: true, reason: "forbidden".into() },
        ]);
        assert_eq!(h.readiness(), Err(vec!["EgressQoS: forbidden".to_string()]));
        assert_eq!(h.notes(), vec!["info: x".to_string(), "CloudPrivateIPConfig: not served".to_string()]);
    }

    #[test]
    fn alive_until_a_part_dies_or_a_sync_is_stuck() {
        let t = std::sync::Arc::new(Telemetry::default());
        assert!(t.health.liveness().is_ok());
        t.health.set_syncing(true);
        let later = std::time::Instant::now() + STUCK_SYNC + std::time::Duration::from_secs(1);
        let stuck = t.health.liveness_at(later).unwrap_err();
        assert!(stuck[0].starts_with("sync: running for"), "{stuck:?}");
        t.health.set_syncing(false);
        assert!(t.health.liveness_at(later).is_ok(), "a finished sync is not stuck");
        // A thread holding the guard panics: dead.
        let telemetry = t.clone();
        let _ = std::thread::spawn(move || {
            let _guard = DeadOnExit { telemetry, component: "dns_snoop" };
            panic!("test");
        })
        .join();
        assert_eq!(t.health.liveness(), Err(vec!["dns_snoop: panicked".to_string()]));
    }
}
