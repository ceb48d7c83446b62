//! What egressd tells about itself: Prometheus metrics ([`metrics`]), prerequisite
//! checks ([`prereq`]) and the health listener serving `/healthz`, `/readyz` and
//! `/metrics` ([`server`]).

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

    /// Replace the kinds that cannot be listed.
    pub(crate) fn set_unavailable_kinds(&self, kinds: Vec<UnavailableKind>) {
        if let Ok(mut k) = self.kinds.lock() {
            *k = kinds;
        }
    }

    /// What does not block readiness but should be seen (kinds treated as empty).
    pub(crate) fn notes(&self) -> Vec<String> {
        self.kinds
            .lock()
            .map(|k| k.iter().filter(|k| !k.blocking).map(|k| format!("{}: {}", k.kind, k.reason)).collect())
            .unwrap_or_default()
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
        assert_eq!(h.notes(), vec!["CloudPrivateIPConfig: not served".to_string()]);
    }
}
