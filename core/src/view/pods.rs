//! The view's pods and the owner of every pod IP, kept up to date with each change.
//!
//! The pod-identity rule decides which pod owns an address ([`Pods::owners`]): among
//! pods that count ([`PodInfo::counts`]), the newest claim wins (an older pod still
//! listing the IP is the stale one), ties go to the smaller `namespace/name`. Every
//! compile reads the owners of all pods; computing them from the pods took a sort of
//! every claim per compile (about 1 ms at 10k pods). Here a change moves only its own
//! claims, and the owners are a map that is already there. The property test below
//! checks the kept index against the rule applied to the pods from scratch.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::{IpClash, Owners, PodInfo};

/// A pod's key: (namespace, name).
pub type PodKey = (String, String);

/// The pods of the view, by (namespace, name), with the index of the addresses they
/// claim. Read it as the map it dereferences to; change it through the view, which keeps
/// the index.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pods {
    by_key: BTreeMap<PodKey, Arc<PodInfo>>,
    /// The winning claim of every address claimed by a pod that counts.
    owners: Owners,
    /// Every claim of an address claimed more than once, winner first.
    contested: BTreeMap<IpAddr, Vec<Arc<PodInfo>>>,
    stamp: Stamp,
    /// The addresses each recent change touched, for [`Pods::touched_since`].
    journal: Journal,
}

/// The addresses recent changes touched (all addresses of the pod before and after the
/// change: a superset of the addresses whose owner changed), each change under the
/// stamp it gave, after `base`, the stamp they start from. Bounded: when it is full, the
/// oldest changes are dropped and `base` moves on. Not part of equality.
#[derive(Debug, Clone, Default)]
struct Journal {
    base: u64,
    changes: std::collections::VecDeque<(u64, Vec<IpAddr>)>,
    addresses: usize,
}

/// The most changes, and addresses, the journal keeps (a caller further behind walks
/// all owners).
const JOURNAL_CHANGES: usize = 1024;
const JOURNAL_ADDRESSES: usize = 4096;

impl Journal {
    fn push(&mut self, stamp: u64, touched: Vec<IpAddr>) {
        self.addresses += touched.len();
        self.changes.push_back((stamp, touched));
        while self.changes.len() > JOURNAL_CHANGES || self.addresses > JOURNAL_ADDRESSES {
            let Some((dropped, ips)) = self.changes.pop_front() else { break };
            self.base = dropped;
            self.addresses -= ips.len();
        }
    }
}

impl PartialEq for Journal {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for Journal {}

/// Changes with every change of the pods, and is never the same for two different sets
/// of pods (numbers come from one process-wide counter; a clone keeps its original's
/// number until either changes). Compile caches use it to skip work over all pods when
/// none changed. Not part of equality: two views with equal pods are equal.
#[derive(Debug, Clone, Copy, Default)]
struct Stamp(u64);

impl PartialEq for Stamp {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for Stamp {}

static NEXT_STAMP: AtomicU64 = AtomicU64::new(1);

impl std::ops::Deref for Pods {
    type Target = BTreeMap<PodKey, Arc<PodInfo>>;

    fn deref(&self) -> &Self::Target {
        &self.by_key
    }
}

/// Whether claim `a` wins over claim `b` of the same address: the newer pod, then the
/// smaller `namespace/name`.
fn precedence(a: &PodInfo, b: &PodInfo) -> std::cmp::Ordering {
    b.created.cmp(&a.created).then_with(|| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)))
}

impl Pods {
    /// Put `pod` under `key` (`None`: remove it); returns whether anything changed.
    pub(crate) fn set(&mut self, key: PodKey, pod: Option<PodInfo>) -> bool {
        if self.by_key.get(&key).map(|p| &**p) == pod.as_ref() {
            return false;
        }
        let mut touched: Vec<IpAddr> = Vec::new();
        if let Some(old) = self.by_key.remove(&key) {
            self.unclaim(&old);
            touched.extend(&old.ips);
        }
        if let Some(pod) = pod {
            let pod = Arc::new(pod);
            self.claim(&pod);
            touched.extend(&pod.ips);
            self.by_key.insert(key, pod);
        }
        self.stamp = Stamp(NEXT_STAMP.fetch_add(1, Ordering::Relaxed));
        self.journal.push(self.stamp.0, touched);
        true
    }

    /// The addresses touched since the pods had stamp `since` (every address whose owner
    /// may differ from then), or `None` when that is not known (a stamp these pods never
    /// had, or too far back): then look at all owners.
    pub(crate) fn touched_since(&self, since: u64) -> Option<std::collections::BTreeSet<IpAddr>> {
        if since == self.stamp.0 {
            return Some(Default::default());
        }
        let known = since == self.journal.base || self.journal.changes.iter().any(|(s, _)| *s == since);
        known.then(|| {
            self.journal.changes.iter().filter(|(s, _)| *s > since).flat_map(|(_, ips)| ips.iter().copied()).collect()
        })
    }

    /// Add `pod` (unless `key` has one already); returns whether it was added.
    pub(crate) fn set_if_absent(&mut self, key: PodKey, pod: &PodInfo) -> bool {
        !self.by_key.contains_key(&key) && self.set(key, Some(pod.clone()))
    }

    /// The owner of every pod IP.
    pub fn owners(&self) -> &Owners {
        &self.owners
    }

    /// Addresses claimed by more than one pod, one of them `involving`, and who keeps
    /// them.
    pub(crate) fn clashes(&self, involving: impl Fn(&PodInfo) -> bool) -> Vec<IpClash> {
        let name = |p: &PodInfo| format!("{}/{}", p.namespace, p.name);
        self.contested
            .iter()
            .filter(|(_, claims)| claims.iter().any(|p| involving(p)))
            .map(|(ip, claims)| IpClash {
                ip: *ip,
                winner: name(&claims[0]),
                losers: claims[1..].iter().map(|p| name(p)).collect(),
            })
            .collect()
    }

    /// A number that changes whenever the pods change (see [`Stamp`]).
    pub(crate) fn stamp(&self) -> u64 {
        self.stamp.0
    }

    fn claim(&mut self, pod: &Arc<PodInfo>) {
        if !pod.counts() {
            return;
        }
        for ip in &pod.ips {
            let claims = match (self.contested.get_mut(ip), self.owners.get(ip)) {
                (Some(claims), _) => claims,
                (None, Some(owner)) => {
                    let first = owner.clone();
                    self.contested.entry(*ip).or_insert_with(|| vec![first])
                }
                (None, None) => {
                    self.owners.insert(*ip, pod.clone());
                    continue;
                }
            };
            let at = claims.partition_point(|c| precedence(c, pod).is_lt());
            claims.insert(at, pod.clone());
            self.owners.insert(*ip, claims[0].clone());
        }
    }

    fn unclaim(&mut self, pod: &Arc<PodInfo>) {
        if !pod.counts() {
            return;
        }
        let same = |c: &Arc<PodInfo>| c.namespace == pod.namespace && c.name == pod.name;
        for ip in &pod.ips {
            if let Some(claims) = self.contested.get_mut(ip) {
                claims.retain(|c| !same(c));
                match claims.len() {
                    0 => {
                        self.contested.remove(ip);
                        self.owners.remove(ip);
                    }
                    1 => {
                        let last = claims[0].clone();
                        self.contested.remove(ip);
                        self.owners.insert(*ip, last);
                    }
                    _ => {
                        let first = claims[0].clone();
                        self.owners.insert(*ip, first);
                    }
                }
            } else if self.owners.get(ip).is_some_and(same) {
                self.owners.remove(ip);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The pod-identity rule from scratch: every claim sorted, the first per address wins.
    fn from_scratch(pods: &BTreeMap<PodKey, Arc<PodInfo>>) -> (BTreeMap<IpAddr, PodKey>, Vec<IpClash>) {
        let mut claims: Vec<(IpAddr, &PodInfo)> =
            pods.values().filter(|p| p.counts()).flat_map(|p| p.ips.iter().map(move |ip| (*ip, &**p))).collect();
        claims.sort_by(|(ia, a), (ib, b)| ia.cmp(ib).then_with(|| precedence(a, b)));
        let mut clashes = Vec::new();
        for group in claims.chunk_by(|a, b| a.0 == b.0).filter(|g| g.len() > 1) {
            let name = |p: &PodInfo| format!("{}/{}", p.namespace, p.name);
            clashes.push(IpClash {
                ip: group[0].0,
                winner: name(group[0].1),
                losers: group[1..].iter().map(|(_, p)| name(p)).collect(),
            });
        }
        claims.dedup_by(|later, first| later.0 == first.0);
        (claims.into_iter().map(|(ip, p)| (ip, (p.namespace.clone(), p.name.clone()))).collect(), clashes)
    }

    fn pod() -> impl Strategy<Value = (PodKey, Option<PodInfo>)> {
        let ip = (0u8..5).prop_map(|i| IpAddr::from([198, 18, 0, i]));
        (
            proptest::sample::select(vec!["a", "b"]),
            proptest::sample::select(vec!["p", "q", "r"]),
            proptest::option::weighted(0.8, proptest::collection::vec(ip, 0..3)),
            proptest::option::of(0i64..3),
            any::<bool>(),
            any::<bool>(),
        )
            .prop_map(|(ns, name, ips, created, scheduled, running)| {
                let info = ips.map(|ips| PodInfo {
                    namespace: ns.into(),
                    name: name.into(),
                    labels: BTreeMap::new(),
                    node: scheduled.then(|| "n1".into()),
                    host_network: false,
                    phase: Some(if running { "Running" } else { "Succeeded" }.into()),
                    ips,
                    created,
                });
                ((ns.to_string(), name.to_string()), info)
            })
    }

    proptest! {
        /// Any sequence of pods added, changed and removed: the kept owners and clashes
        /// are the rule applied to the pods from scratch, and the stamp moved exactly
        /// when the pods changed.
        #[test]
        fn kept_owners_equal_the_rule_from_scratch(steps in proptest::collection::vec(pod(), 1..30)) {
            let mut pods = Pods::default();
            let mut history: Vec<(u64, Owners)> = vec![(pods.stamp(), pods.owners().clone())];
            for (key, info) in steps {
                let before = (pods.by_key.clone(), pods.stamp());
                let changed = pods.set(key, info);
                prop_assert_eq!(changed, before.0 != pods.by_key);
                prop_assert_eq!(changed, before.1 != pods.stamp());
                let (owners, clashes) = from_scratch(&pods.by_key);
                let kept: BTreeMap<IpAddr, PodKey> =
                    pods.owners().iter().map(|(ip, p)| (*ip, (p.namespace.clone(), p.name.clone()))).collect();
                prop_assert_eq!(kept, owners);
                prop_assert_eq!(pods.clashes(|_| true), clashes);
                for (ip, owner) in pods.owners() {
                    prop_assert!(owner.ips.contains(ip) && owner.counts());
                    prop_assert!(Arc::ptr_eq(owner, &pods.by_key[&(owner.namespace.clone(), owner.name.clone())]));
                }
                // From every earlier state: each address whose owner is not the same
                // (another pod, or the pod changed) was touched since.
                history.push((pods.stamp(), pods.owners().clone()));
                for (stamp, then) in &history {
                    let touched = pods.touched_since(*stamp);
                    prop_assert!(touched.is_some(), "stamp {} of this history is known", stamp);
                    let touched = touched.unwrap_or_default();
                    for ip in then.keys().chain(pods.owners().keys()) {
                        let same = match (then.get(ip), pods.owners().get(ip)) {
                            (Some(a), Some(b)) => a == b,
                            (None, None) => true,
                            _ => false,
                        };
                        prop_assert!(same || touched.contains(ip), "{} changed owner after {} but is not listed", ip, stamp);
                    }
                }
                prop_assert!(pods.touched_since(pods.stamp()).is_some_and(|t| t.is_empty()));
            }
        }
    }

    #[test]
    fn the_journal_is_bounded_and_says_when_it_does_not_reach_back() {
        let mut pods = Pods::default();
        let first = pods.stamp();
        let mut stamps = Vec::new();
        for i in 0..(JOURNAL_CHANGES as u32 + 10) {
            let ip = IpAddr::from((0xc612_0000u32 + i).to_be_bytes());
            let info = PodInfo {
                namespace: "a".into(),
                name: format!("p{i}"),
                labels: BTreeMap::new(),
                node: Some("n1".into()),
                host_network: false,
                phase: Some("Running".into()),
                ips: vec![ip],
                created: None,
            };
            assert!(pods.set(("a".into(), format!("p{i}")), Some(info)));
            stamps.push(pods.stamp());
        }
        assert!(pods.journal.changes.len() <= JOURNAL_CHANGES && pods.journal.addresses <= JOURNAL_ADDRESSES);
        assert_eq!(pods.touched_since(first), None, "too far back");
        assert_eq!(pods.touched_since(u64::MAX), None, "never these pods' stamp");
        let recent = stamps[stamps.len() - 3];
        assert_eq!(pods.touched_since(recent).map(|t| t.len()), Some(2));
    }
}
