//! Element maps keyed by local pod addresses (the firewall's `fw-pods-*` verdict maps),
//! kept across compiles and patched where the pods changed: one pod added at 10k pods
//! writes one element instead of rebuilding and formatting ten thousand, and an
//! unchanged map is the previous allocation (which the element delta skips).
//!
//! The output never depends on the cache: after [`PodMaps::update`] the maps hold
//! exactly the wanted elements, whatever they held before (`tests/incremental.rs`
//! checks the cached compile against a fresh one).

use std::collections::BTreeMap;
use std::net::IpAddr;

use crate::nft::{Elements, Key, Text, Value};

/// An IPv4 and an IPv6 element map and the `address → owner` pairs they were rendered
/// from.
#[derive(Debug, Default)]
pub(crate) struct PodMaps {
    by_ip: BTreeMap<IpAddr, Text>,
    /// How many addresses each owner has.
    per_owner: BTreeMap<Text, usize>,
    /// Owners that got their first element or lost their last one since
    /// [`PodMaps::presence_changed`] was last asked.
    flipped: Vec<Text>,
    v4: Buffered,
    v6: Buffered,
}

/// A changed element (`None`: removed).
type Patch = Vec<(Key, Option<Value>)>;

/// An element map handed out as a shared snapshot and changed without copying it: the
/// snapshot before the current one, which nobody else holds any more once the syncer has
/// moved on (the table it belonged to is dropped), is brought up to date by replaying
/// the patch that made the current one, then the new patch, and becomes the next
/// snapshot. Copying the whole map (10k elements) per pod added cost more than the rest
/// of the compile. Should the old snapshot still be held, writing to it copies it first
/// (`Arc::make_mut`): slower, never wrong. A big patch (the first build, a full sync) is
/// not kept; the spare is then a private copy of the new map, made during that build, so
/// the first single change after a full sync does not copy the map either (one more map
/// in memory: 10k elements, ~0.6 MB, no allocation per element).
#[derive(Debug, Default)]
struct Buffered {
    current: Elements,
    /// `current` before the patch that made it, and that patch.
    spare: Option<(Elements, Patch)>,
}

/// The largest patch [`Buffered`] keeps to replay (small in unit tests, so that their
/// random updates take both ways).
const KEPT_PATCH: usize = if cfg!(test) { 3 } else { 1024 };

impl Buffered {
    fn apply(&mut self, patch: Patch) {
        if patch.is_empty() {
            return;
        }
        let (mut next, replay) = match self.spare.take() {
            Some((spare, last)) => (spare, last),
            None => (self.current.clone(), Vec::new()),
        };
        for (key, value) in replay.into_iter().chain(patch.iter().cloned()) {
            match value {
                Some(v) => next.insert(key, v),
                None => next.remove(&key),
            };
        }
        let previous = std::mem::replace(&mut self.current, next);
        self.spare = if patch.len() <= KEPT_PATCH {
            Some((previous, patch))
        } else {
            drop(previous);
            Some((Elements::from(BTreeMap::clone(&self.current)), Vec::new()))
        };
    }
}

impl PodMaps {
    /// Make the maps hold one element per `(address, owner)` of `wanted` (in address
    /// order, each address once), valued `value(owner)`; only differences are written.
    /// Returns the IPv4 and the IPv6 map.
    pub(crate) fn update<'a>(
        &mut self,
        wanted: impl IntoIterator<Item = (IpAddr, &'a str)>,
        value: impl Fn(&str) -> Value,
    ) -> (Elements, Elements) {
        let mut gone = Vec::new();
        let mut set = Vec::new();
        let mut old = self.by_ip.iter().peekable();
        for (ip, owner) in wanted {
            loop {
                match old.peek() {
                    Some((o, _)) if **o < ip => {
                        gone.push(**o);
                        old.next();
                    }
                    _ => break,
                }
            }
            match old.peek() {
                Some((o, v)) if **o == ip => {
                    if v.as_str() != owner {
                        set.push((ip, owner));
                    }
                    old.next();
                }
                _ => set.push((ip, owner)),
            }
        }
        gone.extend(old.map(|(ip, _)| *ip));
        self.write(gone, set, value)
    }

    /// Make the elements of the addresses `touched` hold what it says for each (its
    /// owner, or `None`: no element), leaving every other address as it is: the update
    /// when the caller knows which addresses may have changed (the view's journal,
    /// [`crate::view::pods::Pods::touched_since`]), without a walk over all of them.
    pub(crate) fn patch<'a>(
        &mut self,
        touched: impl IntoIterator<Item = (IpAddr, Option<&'a str>)>,
        value: impl Fn(&str) -> Value,
    ) -> (Elements, Elements) {
        let (mut gone, mut set) = (Vec::new(), Vec::new());
        for (ip, owner) in touched {
            match (self.by_ip.get(&ip), owner) {
                (Some(_), None) => gone.push(ip),
                (Some(had), Some(owner)) if had.as_str() == owner => {}
                (_, Some(owner)) => set.push((ip, owner)),
                (None, None) => {}
            }
        }
        self.write(gone, set, value)
    }

    /// Remove the elements of `gone`, set those of `set`.
    fn write(
        &mut self,
        gone: Vec<IpAddr>,
        set: Vec<(IpAddr, &str)>,
        value: impl Fn(&str) -> Value,
    ) -> (Elements, Elements) {
        let mut patches: [Patch; 2] = Default::default();
        for ip in gone {
            if let Some(owner) = self.by_ip.remove(&ip) {
                self.forget(&owner);
            }
            patches[usize::from(ip.is_ipv6())].push((Key::Addr(ip), None));
        }
        for (ip, owner) in set {
            patches[usize::from(ip.is_ipv6())].push((Key::Addr(ip), Some(value(owner))));
            let count = self.per_owner.entry(owner.into()).or_default();
            if *count == 0 {
                self.flipped.push(owner.into());
            }
            *count += 1;
            if let Some(before) = self.by_ip.insert(ip, owner.into()) {
                self.forget(&before);
            }
        }
        let [p4, p6] = patches;
        self.v4.apply(p4);
        self.v6.apply(p6);
        self.maps()
    }

    /// The IPv4 and the IPv6 map as the last update left them.
    pub(crate) fn maps(&self) -> (Elements, Elements) {
        (self.v4.current.clone(), self.v6.current.clone())
    }

    /// Whether `owner` has an element.
    pub(crate) fn has(&self, owner: &str) -> bool {
        self.per_owner.contains_key(owner)
    }

    /// The owners whose [`PodMaps::has`] may have changed since this was last asked.
    pub(crate) fn presence_changed(&mut self) -> Vec<Text> {
        std::mem::take(&mut self.flipped)
    }

    fn forget(&mut self, owner: &str) {
        if let Some(n) = self.per_owner.get_mut(owner) {
            *n -= 1;
            if *n == 0 {
                self.per_owner.remove(owner);
                self.flipped.push(owner.into());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn fresh(wanted: &BTreeMap<IpAddr, String>) -> (BTreeMap<Key, Value>, BTreeMap<Key, Value>) {
        let mut out = (BTreeMap::new(), BTreeMap::new());
        for (ip, owner) in wanted {
            let m = if ip.is_ipv4() { &mut out.0 } else { &mut out.1 };
            m.insert(Key::Addr(*ip), jump(owner));
        }
        out
    }

    fn jump(owner: &str) -> Value {
        Value::Jump(format!("fw-{owner}").into())
    }

    fn wanted() -> impl Strategy<Value = BTreeMap<IpAddr, String>> {
        let ip = prop_oneof![
            (0u8..12).prop_map(|i| IpAddr::from([198, 18, 0, i])),
            (0u16..6).prop_map(|i| IpAddr::from([0x2001, 0xdb8, 0, 0, 0, 0, 0, i])),
        ];
        proptest::collection::btree_map(
            ip,
            proptest::sample::select(vec!["a".to_string(), "b".into(), "c".into()]),
            0..10,
        )
    }

    proptest! {
        /// Any sequence of wanted maps, each given whole or as the addresses that changed:
        /// after each update the maps are exactly what a fresh build gives, and every map handed out earlier and still held is as it
        /// was (whether the caller dropped the previous ones or kept them).
        #[test]
        fn patched_maps_equal_fresh_ones(
            steps in proptest::collection::vec((wanted(), any::<bool>(), 0u8..3), 1..12),
        ) {
            let mut maps = PodMaps::default();
            let mut held = Vec::new();
            let mut before = BTreeMap::new();
            for (w, keep, how) in &steps {
                let value = jump;
                let (v4, v6) = match how {
                    // Every wanted address at once.
                    0 => maps.update(w.iter().map(|(ip, o)| (*ip, o.as_str())), value),
                    // Only the addresses that changed, or (2) every address either had.
                    _ => {
                        let touched: std::collections::BTreeSet<IpAddr> = before
                            .keys()
                            .chain(w.keys())
                            .filter(|ip| *how == 2 || before.get(*ip) != w.get(*ip))
                            .copied()
                            .collect();
                        maps.patch(touched.into_iter().map(|ip| (ip, w.get(&ip).map(String::as_str))), value)
                    }
                };
                before = w.clone();
                let (f4, f6) = fresh(w);
                prop_assert_eq!(&*v4, &f4);
                prop_assert_eq!(&*v6, &f6);
                for owner in ["a", "b", "c"] {
                    prop_assert_eq!(maps.has(owner), w.values().any(|o| o == owner));
                }
                if *keep {
                    held.push(((v4, v6), (f4, f6)));
                }
                for ((v4, v6), (f4, f6)) in &held {
                    prop_assert_eq!(&**v4, f4);
                    prop_assert_eq!(&**v6, f6);
                }
            }
        }
    }

    #[test]
    fn an_unchanged_map_is_the_same_allocation() {
        let mut maps = PodMaps::default();
        let w = [(IpAddr::from([198, 18, 0, 1]), "a")];
        let (first, _) = maps.update(w, jump);
        let (again, _) = maps.update(w, jump);
        assert!(first.same(&again));
        let (moved, _) = maps.update([(IpAddr::from([198, 18, 0, 1]), "b")], jump);
        assert!(!first.same(&moved));
        let key = Key::Addr(IpAddr::from([198, 18, 0, 1]));
        assert_eq!(moved.get(&key), Some(&jump("b")));
        assert_eq!(first.get(&key), Some(&jump("a")), "the earlier map is untouched");
    }
}
