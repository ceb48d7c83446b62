//! Leader election with a coordination.k8s.io/v1 Lease: get, then create or update with
//! the read `resourceVersion` (a 409 Conflict means another agent won the race).
//!
//! Guarantees: [`Leadership::is_leader`] turns false as soon as a renewal finds another
//! holder, and at the latest `duration` after the last successful renewal was sent when
//! the API cannot be reached — before any other agent can take over (they count
//! `duration` from when they observe that renewal, see [`decide`]). Leader work checks it
//! right before each write, so losing the lease stops leader work at once. Nodes' clocks
//! may disagree by any amount: no `renewTime` is compared with a local clock.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::Client;
use kube::api::{Api, PostParams};

/// Lease settings.
#[derive(Debug, Clone)]
pub struct LeaseConfig {
    /// Namespace of the Lease.
    pub namespace: String,
    /// Name of the Lease.
    pub name: String,
    /// This agent's identity (its node name).
    pub identity: String,
    /// How long a lease is valid without renewal.
    pub duration: Duration,
    /// How often the holder renews (and others retry).
    pub renew_every: Duration,
}

/// Shared view of whether this agent leads: true only until the deadline of its last
/// successful renewal (counted from when that renewal was *sent*), so a leader that cannot
/// renew stops leader work on its own before any other agent may take over.
#[derive(Debug, Clone, Default)]
pub struct Leadership(Arc<Mutex<Option<Instant>>>);

impl Leadership {
    /// Whether this agent holds the lease now.
    pub(crate) fn is_leader(&self) -> bool {
        self.0.lock().map(|u| u.is_some_and(|until| Instant::now() < until)).unwrap_or(false)
    }

    /// Leader until `until` (`None`: not leader).
    fn set(&self, until: Option<Instant>, identity: &str) {
        let was = self.is_leader();
        if let Ok(mut u) = self.0.lock() {
            *u = until;
        }
        let now = self.is_leader();
        if was != now {
            if now {
                tracing::info!(identity, "acquired the leader lease");
            } else {
                tracing::warn!(identity, "lost the leader lease; leader work stops");
            }
        }
    }
}

fn now() -> MicroTime {
    MicroTime(jiff::Timestamp::now())
}

/// What this agent last saw of another holder's lease, and when (by its own clock).
///
/// The client-go rule: a lease held by someone else has expired only when its record has
/// not changed for `leaseDurationSeconds` *as observed locally*. The holder's
/// `renewTime` is never compared with the local clock, so clock skew between nodes can
/// neither shorten a valid lease (two leaders) nor lengthen an expired one.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Observed {
    record: Option<LeaseSpec>,
    since: Option<Instant>,
}

/// What to do after reading the lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Another agent holds a lease that is still valid: wait.
    Wait,
    /// Write the lease as ours (renewal, or take-over when `take_over`).
    Claim {
        /// Whether the holder changes (acquireTime and leaseTransitions move).
        take_over: bool,
    },
}

/// Decide from the stored lease spec, what was observed before, and the local clock.
pub(crate) fn decide(
    spec: &LeaseSpec,
    identity: &str,
    observed: &mut Observed,
    now: Instant,
    duration: Duration,
) -> Decision {
    let holder = spec.holder_identity.clone().unwrap_or_default();
    if holder == identity {
        *observed = Observed::default();
        return Decision::Claim { take_over: false };
    }
    if holder.is_empty() {
        return Decision::Claim { take_over: true };
    }
    if observed.record.as_ref() != Some(spec) {
        observed.record = Some(spec.clone());
        observed.since = Some(now);
    }
    let valid =
        spec.lease_duration_seconds.and_then(|s| u64::try_from(s).ok()).map(Duration::from_secs).unwrap_or(duration);
    match observed.since {
        Some(since) if now.saturating_duration_since(since) <= valid => Decision::Wait,
        _ => Decision::Claim { take_over: true },
    }
}

/// Write the lease as ours after `decision`.
fn claim(spec: &mut LeaseSpec, identity: &str, secs: i32, take_over: bool) {
    if take_over {
        spec.holder_identity = Some(identity.to_string());
        spec.acquire_time = Some(now());
        // Saturating: a counter at i32::MAX stays there instead of overflowing.
        spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0).saturating_add(1));
    }
    spec.renew_time = Some(now());
    spec.lease_duration_seconds = Some(secs);
}

/// One attempt: `Ok(true)` when this agent holds the lease afterwards.
async fn attempt(api: &Api<Lease>, cfg: &LeaseConfig, observed: &mut Observed) -> Result<bool, kube::Error> {
    let secs = i32::try_from(cfg.duration.as_secs()).unwrap_or(i32::MAX).max(1);
    let Some(mut lease) = api.get_opt(&cfg.name).await? else {
        let lease = Lease {
            metadata: ObjectMeta { name: Some(cfg.name.clone()), ..Default::default() },
            spec: Some(LeaseSpec {
                holder_identity: Some(cfg.identity.clone()),
                lease_duration_seconds: Some(secs),
                acquire_time: Some(now()),
                renew_time: Some(now()),
                lease_transitions: Some(0),
                ..Default::default()
            }),
        };
        return match api.create(&PostParams::default(), &lease).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
            Err(e) => Err(e),
        };
    };
    let spec = lease.spec.get_or_insert_with(Default::default);
    match decide(spec, &cfg.identity, observed, Instant::now(), cfg.duration) {
        Decision::Wait => return Ok(false),
        Decision::Claim { take_over } => claim(spec, &cfg.identity, secs, take_over),
    }
    match api.replace(&cfg.name, &PostParams::default(), &lease).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
        Err(e) => Err(e),
    }
}

/// Run the election until the task is dropped.
pub async fn run(client: Client, cfg: LeaseConfig, leadership: Leadership) {
    let api: Api<Lease> = Api::namespaced(client, &cfg.namespace);
    let mut observed = Observed::default();
    loop {
        // The lease is ours for `duration` from when the renewal was sent (the others
        // count from when they see it, which is later).
        let sent = Instant::now();
        match attempt(&api, &cfg, &mut observed).await {
            Ok(true) => leadership.set(Some(sent + cfg.duration), &cfg.identity),
            Ok(false) => leadership.set(None, &cfg.identity),
            Err(e) => tracing::debug!(error = %e, "lease renewal failed; leadership ends at its deadline"),
        }
        tokio::time::sleep(cfg.renew_every).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(holder: &str, renew_offset_secs: i64, transitions: i32) -> LeaseSpec {
        let t = jiff::Timestamp::now().checked_add(jiff::SignedDuration::from_secs(renew_offset_secs)).unwrap();
        LeaseSpec {
            holder_identity: Some(holder.into()),
            lease_duration_seconds: Some(15),
            renew_time: Some(MicroTime(t)),
            lease_transitions: Some(transitions),
            ..Default::default()
        }
    }

    const D: Duration = Duration::from_secs(15);

    #[test]
    fn a_renewing_holder_is_never_taken_over_whatever_its_clock_says() {
        // The holder's clock runs 30 s behind or ahead of ours: its renewTime looks
        // expired (or far in the future), but it keeps renewing.
        for skew in [-30, 30] {
            let mut observed = Observed::default();
            let t0 = Instant::now();
            for i in 0..20u64 {
                let s = spec("b", skew + i as i64 * 5, 0);
                let now = t0 + Duration::from_secs(i * 5);
                assert_eq!(decide(&s, "a", &mut observed, now, D), Decision::Wait, "skew {skew}, step {i}");
            }
        }
    }

    #[test]
    fn a_silent_holder_is_taken_over_after_the_duration_observed_locally() {
        let mut observed = Observed::default();
        let t0 = Instant::now();
        // Far in the future by its clock: still expires by ours.
        let s = spec("b", 3600, 3);
        assert_eq!(decide(&s, "a", &mut observed, t0, D), Decision::Wait);
        assert_eq!(decide(&s, "a", &mut observed, t0 + Duration::from_secs(14), D), Decision::Wait);
        assert_eq!(
            decide(&s, "a", &mut observed, t0 + Duration::from_secs(16), D),
            Decision::Claim { take_over: true }
        );
        // Long expired by its clock: first seen now, so a full duration is waited.
        let mut fresh = Observed::default();
        let old = spec("b", -3600, 3);
        assert_eq!(decide(&old, "a", &mut fresh, t0, D), Decision::Wait);
        assert_eq!(decide(&old, "a", &mut fresh, t0 + Duration::from_secs(16), D), Decision::Claim { take_over: true });
    }

    #[test]
    fn own_or_empty_leases_are_claimed_and_transitions_saturate() {
        let mut observed = Observed::default();
        assert_eq!(
            decide(&spec("a", 0, 0), "a", &mut observed, Instant::now(), D),
            Decision::Claim { take_over: false }
        );
        assert_eq!(decide(&spec("", 0, 0), "a", &mut observed, Instant::now(), D), Decision::Claim { take_over: true });
        let mut s = spec("b", 0, i32::MAX);
        claim(&mut s, "a", 15, true);
        assert_eq!(s.lease_transitions, Some(i32::MAX));
        assert_eq!(s.holder_identity.as_deref(), Some("a"));
    }

    #[test]
    fn leadership_ends_at_its_deadline() {
        let l = Leadership::default();
        assert!(!l.is_leader());
        l.set(Some(Instant::now() + Duration::from_secs(60)), "a");
        assert!(l.is_leader());
        l.set(Some(Instant::now() - Duration::from_millis(1)), "a");
        assert!(!l.is_leader(), "a renewal that is too old no longer makes a leader");
        l.set(None, "a");
        assert!(!l.is_leader());
    }
}
