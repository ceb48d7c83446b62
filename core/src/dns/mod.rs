//! DNS names of EgressFirewall rules, the pure part: the refresh schedule ([`DnsTracker`]:
//! the clock is a parameter), snooping targets and DNS message parsing. Resolution
//! itself is the agent's (`egressd::dns::resolver`).
//!
//! Schedule (linkerd2-proxy's `minimum_ttl` idea: never spin on tiny TTLs):
//! * an answer is re-resolved when its TTL expires, but never sooner than [`FLOOR`]
//!   (TTL 0 → 5 s);
//! * an authoritative "no such name / no records" answer is an answer with no
//!   addresses, re-asked after its negative TTL (same floor);
//! * a failure (timeout, SERVFAIL, unreachable server) keeps the last good addresses and
//!   retries every [`FLOOR`] for [`FAST_RETRIES`] attempts, then doubles the interval up
//!   to [`MAX_BACKOFF`].
//!
//! A name used by several rules or namespaces is tracked — and resolved — once.

pub mod snoop;
pub mod targets;

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// Which address families to ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Families {
    /// Query A records.
    pub v4: bool,
    /// Query AAAA records.
    pub v6: bool,
}

/// Shortest interval between two resolutions of one name.
pub(crate) const FLOOR: Duration = Duration::from_secs(5);
/// Longest TTL egressd honours (1 day): a longer one is cut to this, so an answer never
/// pins an address for years and the kernel timeout (TTL + grace) always fits nft's range.
pub(crate) const MAX_TTL: Duration = Duration::from_secs(24 * 3600);
/// How long an answer with `ttl` stays valid for egressd: [`FLOOR`] ..= [`MAX_TTL`].
pub(crate) fn effective_ttl(ttl: Duration) -> Duration {
    ttl.clamp(FLOOR, MAX_TTL)
}

/// The kernel timeout of a DNS address: its effective TTL plus the grace.
pub(crate) fn element_timeout(ttl: Duration, grace: Duration) -> Duration {
    effective_ttl(ttl).saturating_add(grace)
}

/// Failures retried at [`FLOOR`] before backing off.
pub const FAST_RETRIES: u32 = 10;
/// Longest retry interval after repeated failures.
pub(crate) const MAX_BACKOFF: Duration = Duration::from_secs(120);

/// The addresses of one name and how long they are valid.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Resolved {
    /// A and AAAA addresses (only the families asked for).
    pub addresses: BTreeSet<IpAddr>,
    /// The smallest TTL of the answer (the negative TTL for "no records").
    pub ttl: Duration,
}

/// The current addresses of every tracked name (input of the compile step).
pub type DnsAnswers = BTreeMap<String, Resolved>;

/// One name's state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NameState {
    /// Last good answer, if any yet.
    pub last: Option<Resolved>,
    /// When to resolve next.
    pub next: Instant,
    /// Consecutive failures.
    pub failures: u32,
    /// The last failure's message.
    pub last_error: Option<String>,
}

/// Which names to resolve when.
#[derive(Debug)]
pub struct DnsTracker {
    names: BTreeMap<String, NameState>,
    /// Answers' TTLs are cut to this (`--dns-max-ttl-secs`, at most [`MAX_TTL`]).
    max_ttl: Duration,
}

/// The retry interval after `failures` consecutive failures.
pub fn backoff(failures: u32) -> Duration {
    if failures <= FAST_RETRIES {
        FLOOR
    } else {
        let doublings = (failures - FAST_RETRIES).min(16);
        FLOOR.saturating_mul(1 << doublings).min(MAX_BACKOFF)
    }
}

impl DnsTracker {
    /// An empty tracker honouring TTLs up to [`MAX_TTL`].
    #[cfg(test)]
    pub(crate) fn new() -> Self {
        Self::with_max_ttl(MAX_TTL)
    }

    /// A tracker that cuts TTLs to `max_ttl` (besides [`MAX_TTL`]).
    pub fn with_max_ttl(max_ttl: Duration) -> Self {
        Self { names: BTreeMap::new(), max_ttl }
    }

    /// Track exactly `names`: new ones are due at once, dropped ones are forgotten.
    pub fn set_names(&mut self, names: &BTreeSet<String>, now: Instant) {
        self.names.retain(|n, _| names.contains(n));
        for n in names {
            self.names.entry(n.clone()).or_insert(NameState { last: None, next: now, failures: 0, last_error: None });
        }
    }

    /// Names due for resolution at `now`.
    pub fn due(&self, now: Instant) -> Vec<String> {
        self.names.iter().filter(|(_, s)| s.next <= now).map(|(n, _)| n.clone()).collect()
    }

    /// When the next name falls due.
    pub fn next_due(&self) -> Option<Instant> {
        self.names.values().map(|s| s.next).min()
    }

    /// Record a resolution. Returns whether the name's addresses changed.
    pub fn record(&mut self, name: &str, result: Result<Resolved, String>, now: Instant) -> bool {
        let Some(state) = self.names.get_mut(name) else { return false };
        match result {
            Ok(mut resolved) => {
                resolved.ttl = resolved.ttl.min(self.max_ttl);
                state.next = now + effective_ttl(resolved.ttl);
                state.failures = 0;
                state.last_error = None;
                let changed = state.last.as_ref().map(|l| &l.addresses) != Some(&resolved.addresses);
                state.last = Some(resolved);
                changed
            }
            Err(e) => {
                state.failures += 1;
                state.next = now + backoff(state.failures);
                state.last_error = Some(e);
                false
            }
        }
    }

    /// The state of one name.
    pub fn state(&self, name: &str) -> Option<&NameState> {
        self.names.get(name)
    }

    /// Number of names tracked.
    pub fn len(&self) -> usize {
        self.names.len()
    }

    /// Whether no name is tracked.
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// Every name with a good answer, and its addresses (the last good ones while the
    /// server fails).
    pub fn answers(&self) -> DnsAnswers {
        self.names.iter().filter_map(|(n, s)| s.last.clone().map(|r| (n.clone(), r))).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ans(ips: &[&str], ttl: u64) -> Result<Resolved, String> {
        Ok(Resolved { addresses: ips.iter().map(|s| s.parse().unwrap()).collect(), ttl: Duration::from_secs(ttl) })
    }

    fn names(n: &[&str]) -> BTreeSet<String> {
        n.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn refresh_at_ttl_with_a_floor() {
        let t0 = Instant::now();
        let mut t = DnsTracker::new();
        t.set_names(&names(&["a.example."]), t0);
        assert_eq!(t.due(t0), vec!["a.example."]);
        assert!(t.record("a.example.", ans(&["192.0.2.1"], 300), t0));
        assert_eq!(t.next_due(), Some(t0 + Duration::from_secs(300)));
        assert!(t.due(t0 + Duration::from_secs(299)).is_empty());
        assert_eq!(t.due(t0 + Duration::from_secs(300)).len(), 1);
        // TTL below the floor, and TTL 0: 5 s.
        assert!(!t.record("a.example.", ans(&["192.0.2.1"], 1), t0));
        assert_eq!(t.next_due(), Some(t0 + FLOOR));
        t.record("a.example.", ans(&["192.0.2.1"], 0), t0);
        assert_eq!(t.next_due(), Some(t0 + FLOOR));
    }

    #[test]
    fn failures_keep_last_good_and_back_off_to_a_cap() {
        let t0 = Instant::now();
        let mut t = DnsTracker::new();
        t.set_names(&names(&["a.example."]), t0);
        t.record("a.example.", ans(&["192.0.2.1"], 60), t0);
        let mut now = t0;
        let mut intervals = Vec::new();
        for _ in 0..16 {
            assert!(!t.record("a.example.", Err("timeout".into()), now));
            let next = t.next_due().unwrap();
            intervals.push((next - now).as_secs());
            now = next;
        }
        assert_eq!(intervals, vec![5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 10, 20, 40, 80, 120, 120]);
        assert_eq!(t.answers()["a.example."].addresses.len(), 1, "last good addresses kept");
        assert_eq!(t.state("a.example.").unwrap().last_error.as_deref(), Some("timeout"));
        // Recovery resets the backoff.
        t.record("a.example.", ans(&["192.0.2.2"], 30), now);
        assert_eq!(t.next_due(), Some(now + Duration::from_secs(30)));
        assert_eq!(t.state("a.example.").unwrap().failures, 0);
    }

    #[test]
    fn nxdomain_is_an_answer_without_addresses() {
        let t0 = Instant::now();
        let mut t = DnsTracker::new();
        t.set_names(&names(&["gone.example."]), t0);
        t.record("gone.example.", ans(&["192.0.2.1"], 60), t0);
        // Authoritative "no such name" with negative TTL 30: addresses removed.
        assert!(t.record("gone.example.", ans(&[], 30), t0));
        assert!(t.answers()["gone.example."].addresses.is_empty());
        assert_eq!(t.next_due(), Some(t0 + Duration::from_secs(30)));
    }

    #[test]
    fn a_shared_name_is_tracked_once_and_dropped_names_are_forgotten() {
        let t0 = Instant::now();
        let mut t = DnsTracker::new();
        let mut set = names(&["a.example.", "b.example."]);
        set.insert("a.example.".into());
        t.set_names(&set, t0);
        assert_eq!(t.len(), 2);
        assert_eq!(t.due(t0).len(), 2);
        t.set_names(&names(&["b.example."]), t0);
        assert_eq!(t.due(t0), vec!["b.example."]);
    }
}
