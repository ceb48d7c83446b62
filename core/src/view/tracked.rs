//! A map of the view whose changes are journaled: read it as the `BTreeMap` it
//! dereferences to; change it through its own methods, which record each key they touch.
//! A compile cache that remembers [`Tracked::stamp`] asks [`Tracked::touched_since`]
//! which keys may differ since then, instead of looking at every entry.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};

/// Stamps come from one process-wide counter: a stamp is never shared by two different
/// contents (a clone keeps its original's stamp until either changes).
static NEXT_STAMP: AtomicU64 = AtomicU64::new(1);

/// The most changes the journal keeps (a caller further behind looks at every entry).
const JOURNAL: usize = 1024;

/// A `BTreeMap<String, V>` with a journal of the keys its changes touched.
#[derive(Debug, Clone)]
pub struct Tracked<V> {
    map: BTreeMap<String, V>,
    /// Changes with every change; 0 for a new, empty map.
    stamp: u64,
    /// The stamp before the oldest change kept.
    base: u64,
    /// Recent changes: the stamp each gave and the key it touched.
    journal: VecDeque<(u64, String)>,
}

impl<V> Default for Tracked<V> {
    fn default() -> Self {
        Self { map: BTreeMap::new(), stamp: 0, base: 0, journal: VecDeque::new() }
    }
}

/// Equal maps are equal, whatever their history.
impl<V: PartialEq> PartialEq for Tracked<V> {
    fn eq(&self, other: &Self) -> bool {
        self.map == other.map
    }
}

impl<V: Eq> Eq for Tracked<V> {}

impl<V> std::ops::Deref for Tracked<V> {
    type Target = BTreeMap<String, V>;

    fn deref(&self) -> &Self::Target {
        &self.map
    }
}

impl<'a, V> IntoIterator for &'a Tracked<V> {
    type Item = (&'a String, &'a V);
    type IntoIter = std::collections::btree_map::Iter<'a, String, V>;

    fn into_iter(self) -> Self::IntoIter {
        self.map.iter()
    }
}

impl<V> FromIterator<(String, V)> for Tracked<V> {
    fn from_iter<I: IntoIterator<Item = (String, V)>>(iter: I) -> Self {
        let mut out = Self::default();
        for (k, v) in iter {
            out.insert(k, v);
        }
        out
    }
}

impl<V> Tracked<V> {
    fn touch(&mut self, key: &str) {
        let before = self.stamp;
        self.stamp = NEXT_STAMP.fetch_add(1, Ordering::Relaxed);
        if self.journal.is_empty() {
            self.base = before;
        }
        self.journal.push_back((self.stamp, key.to_string()));
        while self.journal.len() > JOURNAL {
            if let Some((dropped, _)) = self.journal.pop_front() {
                self.base = dropped;
            }
        }
    }

    /// A number that changes with every change, and is never the same for two different
    /// contents of maps that changed (see [`NEXT_STAMP`]).
    pub fn stamp(&self) -> u64 {
        self.stamp
    }

    /// The keys whose entries may differ from when the map had stamp `since` (a
    /// superset: every key a change touched), or `None` when that is not known (a stamp
    /// this map never had, or too far back): then look at every entry.
    pub fn touched_since(&self, since: u64) -> Option<BTreeSet<&str>> {
        if since == self.stamp {
            return Some(BTreeSet::new());
        }
        let known = since == self.base || self.journal.iter().any(|(s, _)| *s == since);
        known.then(|| self.journal.iter().filter(|(s, _)| *s > since).map(|(_, k)| k.as_str()).collect())
    }

    /// Insert `value` under `key`; returns what was there.
    pub fn insert(&mut self, key: String, value: V) -> Option<V> {
        self.touch(&key);
        self.map.insert(key, value)
    }

    /// Remove `key`; returns what was there.
    pub fn remove(&mut self, key: &str) -> Option<V> {
        let old = self.map.remove(key);
        if old.is_some() {
            self.touch(key);
        }
        old
    }

    /// The entry of `key` to change (counted as changed).
    pub fn get_mut(&mut self, key: &str) -> Option<&mut V> {
        if self.map.contains_key(key) {
            self.touch(key);
        }
        self.map.get_mut(key)
    }

    /// The entry of `key` to change, made with `make` when there is none (counted as
    /// changed).
    pub fn get_or_insert_with(&mut self, key: String, make: impl FnOnce() -> V) -> &mut V {
        self.touch(&key);
        self.map.entry(key).or_insert_with(make)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u8, u8),
        Remove(u8),
        Set(u8, u8),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0u8..6, 0u8..3).prop_map(|(k, v)| Op::Insert(k, v)),
            (0u8..6).prop_map(Op::Remove),
            (0u8..6, 0u8..3).prop_map(|(k, v)| Op::Set(k, v)),
        ]
    }

    proptest! {
        /// For every earlier state, `touched_since` covers every key whose entry differs
        /// now, or says it does not know (only when further back than the journal).
        #[test]
        fn touched_since_covers_every_difference(ops in proptest::collection::vec(op(), 0..40), fork in 0usize..40) {
            let mut m: Tracked<u8> = Tracked::default();
            let mut history: Vec<(u64, BTreeMap<String, u8>)> = vec![(m.stamp(), BTreeMap::clone(&m))];
            let mut other = None;
            for (i, op) in ops.iter().enumerate() {
                match op {
                    Op::Insert(k, v) => { m.insert(k.to_string(), *v); }
                    Op::Remove(k) => { m.remove(&k.to_string()); }
                    Op::Set(k, v) => { if let Some(e) = m.get_mut(&k.to_string()) { *e = *v; } }
                }
                history.push((m.stamp(), BTreeMap::clone(&m)));
                if i == fork {
                    other = Some(m.clone());
                }
            }
            for (stamp, then) in &history {
                let touched = m.touched_since(*stamp).expect("within the journal");
                let keys: BTreeSet<&String> = then.keys().chain(m.keys()).collect();
                for k in keys {
                    if then.get(k) != m.get(k) {
                        prop_assert!(touched.contains(k.as_str()), "{k} differs since {stamp}, not listed");
                    }
                }
            }
            // A clone that went another way never shares a stamp with this one (unless
            // neither changed since the fork).
            if let Some(mut o) = other {
                o.insert("x".into(), 9);
                prop_assert_ne!(o.stamp(), m.stamp());
                prop_assert!(m.touched_since(o.stamp()).is_none());
            }
        }
    }

    #[test]
    fn too_far_back_is_unknown() {
        let mut m: Tracked<u8> = Tracked::default();
        m.insert("a".into(), 1);
        let early = m.stamp();
        for i in 0..=JOURNAL {
            m.insert(format!("k{i}"), 1);
        }
        assert!(m.touched_since(early).is_none());
        assert_eq!(m.touched_since(m.stamp()).map(|t| t.len()), Some(0));
        // A stamp from nowhere.
        assert!(m.touched_since(u64::MAX).is_none());
    }
}
