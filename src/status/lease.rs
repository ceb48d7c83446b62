//! Leader election with a coordination.k8s.io/v1 Lease: get, then create or update with
//! the read `resourceVersion` (a 409 Conflict means another agent won the race).
//!
//! Guarantees: [`Leadership::is_leader`] turns false as soon as a renewal finds another
//! holder, and no later than `duration` after the last successful renewal when the API
//! cannot be reached — leader work checks it right before each write, so losing the lease
//! stops leader work at once.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

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

/// Shared view of whether this agent leads.
#[derive(Debug, Clone, Default)]
pub struct Leadership(Arc<AtomicBool>);

impl Leadership {
    /// Whether this agent holds the lease now.
    pub fn is_leader(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }

    fn set(&self, leader: bool, identity: &str) {
        if self.0.swap(leader, Ordering::SeqCst) != leader {
            if leader {
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

/// One attempt: `Ok(true)` when this agent holds the lease afterwards.
async fn attempt(api: &Api<Lease>, cfg: &LeaseConfig) -> Result<bool, kube::Error> {
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
    let holder = spec.holder_identity.clone().unwrap_or_default();
    let expired = spec.renew_time.as_ref().is_none_or(|t| {
        let valid = i64::from(spec.lease_duration_seconds.unwrap_or(secs));
        t.0.as_second() + valid < jiff::Timestamp::now().as_second()
    });
    if holder != cfg.identity {
        if !expired && !holder.is_empty() {
            return Ok(false);
        }
        spec.holder_identity = Some(cfg.identity.clone());
        spec.acquire_time = Some(now());
        spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
    }
    spec.renew_time = Some(now());
    spec.lease_duration_seconds = Some(secs);
    match api.replace(&cfg.name, &PostParams::default(), &lease).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
        Err(e) => Err(e),
    }
}

/// Run the election until the task is dropped.
pub async fn run(client: Client, cfg: LeaseConfig, leadership: Leadership) {
    let api: Api<Lease> = Api::namespaced(client, &cfg.namespace);
    let mut last_renewal: Option<tokio::time::Instant> = None;
    loop {
        match attempt(&api, &cfg).await {
            Ok(true) => {
                last_renewal = Some(tokio::time::Instant::now());
                leadership.set(true, &cfg.identity);
            }
            Ok(false) => {
                last_renewal = None;
                leadership.set(false, &cfg.identity);
            }
            Err(e) => {
                tracing::debug!(error = %e, "lease renewal failed");
                if last_renewal.is_none_or(|t| t.elapsed() >= cfg.duration) {
                    leadership.set(false, &cfg.identity);
                }
            }
        }
        tokio::time::sleep(cfg.renew_every).await;
    }
}
