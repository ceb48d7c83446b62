//! Element-only changes between two tables, typed: what the steady state mostly is (a
//! pod added or gone, a DNS answer, an EgressIP's pods). When nothing but elements of
//! existing sets and maps differ, [`ElementDelta::between`] gives them as typed values
//! that the netlink path ([`crate::dataplane::elements`]) sends without an `nft`
//! process (which would first read the whole table into its cache), and
//! [`ElementDelta::script`] renders the very text [`super::diff`] would send.

use super::{FAMILY, Key, Set, Slot, Table, Value};

/// Elements of one set or map, each one the set can hold ([`Key::fits`],
/// [`Value::fits`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetElements {
    /// The set's name.
    pub set: String,
    /// Keys and values, in key order.
    pub elements: Vec<(Key, Value)>,
}

/// Element deletions and additions that turn one table into another, in one
/// transaction: deletions first (a map element whose verdict changes is deleted and
/// added again), then additions.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ElementDelta {
    /// Elements to delete, by set (values are what was applied).
    pub delete: Vec<SetElements>,
    /// Elements to add, by set.
    pub add: Vec<SetElements>,
}

impl ElementDelta {
    /// The element changes from `old` to `new`, or `None` when anything else differs
    /// (the table's name, chains or rules, which sets exist or how they are declared)
    /// or a changed set cannot be expressed as typed elements (a key or value not in
    /// the canonical form the compiler writes). Equal tables give an
    /// empty delta.
    pub fn between(old: &Table, new: &Table) -> Option<Self> {
        Self::of_elements(&super::Comparison::of(old, new))
    }

    /// [`ElementDelta::between`] of the compared tables.
    pub fn of_elements(c: &super::Comparison<'_>) -> Option<Self> {
        use itertools::EitherOrBoth::Both;
        if !c.elements_only() {
            return None;
        }
        let mut delta = Self::default();
        for pair in &c.sets {
            let Both((name, before), (_, after)) = pair else { return None };
            let (gone, added) = changes(before, after);
            if gone.is_empty() && added.is_empty() {
                continue;
            }
            for (list, items, set) in [(&mut delta.delete, gone, *before), (&mut delta.add, added, *after)] {
                push_typed(list, name, set, items)?;
            }
        }
        Some(delta)
    }

    /// Re-adding every element of the `slots` of `table`'s tagged timeout sets, which
    /// restarts their kernel timeouts. Sets that do not exist, have no timeout or no
    /// elements of a slot are skipped; `None` when an element cannot be typed.
    pub fn refresh(table: &Table, slots: &[Slot]) -> Option<Self> {
        let mut delta = Self::default();
        for slot in slots {
            let Some(set) = table.sets.get(slot.set).filter(|s| s.timeout && !s.interval && s.key.is_tagged()) else {
                continue;
            };
            // A slot's keys are next to each other.
            let items: Vec<(&Key, &Value)> = set.elements.range(slot.keys()).collect();
            push_typed(&mut delta.add, slot.set, set, items)?;
        }
        Some(delta)
    }

    /// The element changes within a change of chains, rules or sets from `old` to
    /// `new`: in sets of both tables what changed, in sets only `new` has every
    /// element — what [`super::diff`] sends between its chain and set changes. `None`
    /// when an element cannot be typed or a set of both tables is declared differently.
    pub fn of_sets(c: &super::Comparison<'_>) -> Option<Self> {
        use itertools::EitherOrBoth::{Both, Left, Right};
        let mut delta = Self::default();
        for pair in &c.sets {
            match pair {
                Both((_, before), (_, after)) if !same_declaration(before, after) => return None,
                Both((name, before), (_, after)) => {
                    let (gone, added) = changes(before, after);
                    push_typed(&mut delta.delete, name, before, gone)?;
                    push_typed(&mut delta.add, name, after, added)?;
                }
                Right((name, after)) => push_typed(&mut delta.add, name, after, after.elements.iter().collect())?,
                Left(_) => {}
            }
        }
        Some(delta)
    }

    /// Whether there is nothing to change.
    pub fn is_empty(&self) -> bool {
        self.delete.is_empty() && self.add.is_empty()
    }

    /// How many elements are deleted and added.
    pub fn len(&self) -> usize {
        self.delete.iter().chain(&self.add).map(|s| s.elements.len()).sum()
    }

    /// The same change as an nft script for table `table` (the text [`super::diff`]
    /// sends for it).
    pub fn script(&self, table: &str) -> String {
        let mut out = String::new();
        for (verb, lists, values) in [("delete", &self.delete, false), ("add", &self.add, true)] {
            for list in lists {
                let items = list.elements.iter().map(|(k, v)| (k, if values { v } else { &Value::None }));
                let items = super::render::elements(items);
                out.push_str(&format!("{verb} element {FAMILY} {table} {} {{ {items} }}\n", list.set));
            }
        }
        out
    }
}

/// The elements to delete from `before` and to add from `after`, in key order, in one
/// walk over both (sorted) element maps. As in `diff`: in a timeout set a changed value
/// is a new timeout, which re-adding sets, so only elements that are gone are deleted.
#[allow(clippy::type_complexity)]
fn changes<'a>(before: &'a Set, after: &'a Set) -> (Vec<(&'a Key, &'a Value)>, Vec<(&'a Key, &'a Value)>) {
    use std::cmp::Ordering;
    let (mut gone, mut added) = (Vec::new(), Vec::new());
    if before.elements.same(&after.elements) {
        return (gone, added);
    }
    let mut old = before.elements.iter().peekable();
    let mut new = after.elements.iter().peekable();
    loop {
        match (old.peek(), new.peek()) {
            (None, None) => break,
            (Some(&o), None) => {
                gone.push(o);
                old.next();
            }
            (None, Some(&n)) => {
                added.push(n);
                new.next();
            }
            (Some(&o), Some(&n)) => match o.0.cmp(n.0) {
                Ordering::Less => {
                    gone.push(o);
                    old.next();
                }
                Ordering::Greater => {
                    added.push(n);
                    new.next();
                }
                Ordering::Equal => {
                    if o.1 != n.1 {
                        if !after.timeout {
                            gone.push(o);
                        }
                        added.push(n);
                    }
                    old.next();
                    new.next();
                }
            },
        }
    }
    (gone, added)
}

/// `items` of `set` appended to `list` as one [`SetElements`]; `None` when the set
/// cannot hold one of them.
fn push_typed(list: &mut Vec<SetElements>, name: &str, set: &Set, items: Vec<(&Key, &Value)>) -> Option<()> {
    if items.is_empty() {
        return Some(());
    }
    let elements = items
        .into_iter()
        .map(|(k, v)| (k.fits(set) && v.fits(set)).then(|| (*k, v.clone())))
        .collect::<Option<Vec<_>>>()?;
    list.push(SetElements { set: name.to_string(), elements });
    Some(())
}

/// Whether two sets are declared alike (key, kind, flags): else only a new set, which
/// means a full replace of the table, changes one into the other.
pub(super) fn same_declaration(a: &Set, b: &Set) -> bool {
    a.key == b.key && a.data == b.data && a.interval == b.interval && a.timeout == b.timeout
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;
    use std::time::Duration;

    use super::*;
    use crate::nft::{Chain, KeyType};

    fn slot(tag: u64) -> Slot {
        Slot { set: "dns6-x", tag }
    }

    fn table() -> Table {
        let mut t = Table::new("egressd");
        let mut pods = Set::verdict_map(KeyType::Ipv4);
        pods.elements.insert("198.18.1.2".parse().unwrap(), "jump fw-a".parse().unwrap());
        t.sets.insert("fw-pods-v4".into(), pods);
        let mut dns = Set::with_timeout(KeyType::TaggedIpv6);
        dns.elements.insert(slot(1).key("2001:db8::1".parse().unwrap()), "timeout 300s".parse().unwrap());
        dns.elements.insert(slot(4_294_967_297).key("2001:db8::9".parse().unwrap()), "timeout 300s".parse().unwrap());
        t.sets.insert("dns6-x".into(), dns);
        let mut exempt = Set::new(KeyType::Ipv4, true);
        exempt.elements.insert("198.18.0.0/15".parse().unwrap(), Value::None);
        t.sets.insert("exempt-v4".into(), exempt);
        t.chains.insert("fw-a".into(), Chain::parsed(["counter drop"]).unwrap());
        t.chains.insert("fw-b".into(), Chain::parsed(["counter accept"]).unwrap());
        t
    }

    #[test]
    fn a_changed_verdict_is_deleted_then_added_and_timeouts_are_re_added() {
        let old = table();
        let mut new = table();
        new.sets
            .get_mut("fw-pods-v4")
            .unwrap()
            .elements
            .insert("198.18.1.2".parse().unwrap(), "jump fw-b".parse().unwrap());
        new.sets
            .get_mut("fw-pods-v4")
            .unwrap()
            .elements
            .insert("198.18.1.3".parse().unwrap(), "jump fw-a".parse().unwrap());
        let dns = &mut new.sets.get_mut("dns6-x").unwrap().elements;
        dns.insert("0 . 1 . 2001:db8::1".parse().unwrap(), "timeout 310s".parse().unwrap());
        dns.insert("0 . 1 . 2001:db8::2".parse().unwrap(), "timeout 310s".parse().unwrap());
        dns.insert("1 . 1 . 2001:db8::3".parse().unwrap(), "timeout 310s".parse().unwrap());
        let delta = ElementDelta::between(&old, &new).unwrap();
        assert_eq!(
            delta.delete,
            vec![SetElements {
                set: "fw-pods-v4".into(),
                elements: vec![("198.18.1.2".parse().unwrap(), Value::Jump("fw-a".into()))]
            }]
        );
        let sets: Vec<_> = delta.add.iter().map(|l| (l.set.as_str(), l.elements.len())).collect();
        assert_eq!(sets, [("dns6-x", 3), ("fw-pods-v4", 2)]);
        assert_eq!(delta.len(), 6);
        assert_eq!(
            delta.script("egressd"),
            "delete element inet egressd fw-pods-v4 { 198.18.1.2 }\n\
             add element inet egressd dns6-x { 0 . 1 . 2001:db8::1 timeout 310s, 0 . 1 . 2001:db8::2 timeout 310s, 1 . 1 . 2001:db8::3 timeout 310s }\n\
             add element inet egressd fw-pods-v4 { 198.18.1.2 : jump fw-b, 198.18.1.3 : jump fw-a }\n"
        );
        assert!(ElementDelta::between(&old, &old).unwrap().is_empty());
    }

    #[test]
    fn anything_but_typed_elements_of_existing_sets_is_not_a_delta() {
        let old = table();
        // Rules.
        let mut new = table();
        new.chains.insert("fw-a".into(), Chain::parsed(["counter accept"]).unwrap());
        assert_eq!(ElementDelta::between(&old, &new), None);
        // A set's flags.
        let mut new = table();
        new.sets.get_mut("dns6-x").unwrap().timeout = false;
        assert_eq!(ElementDelta::between(&old, &new), None);
        // A key or value the set cannot hold: of the other family, of another key type,
        // a prefix with host bits set, a value of another kind of set. (Text that is
        // not an element's canonical form cannot become a key at all: element.rs.)
        let ip = |s: &str| -> IpAddr { s.parse().unwrap() };
        let net = |s: &str| -> ipnet::IpNet { s.parse().unwrap() };
        let jump = Value::Jump("fw-a".into());
        for (set, key, value) in [
            ("fw-pods-v4", Key::Addr(ip("2001:db8::2")), jump.clone()),
            ("fw-pods-v4", Key::tagged(1, ip("198.18.1.9")), jump.clone()),
            ("fw-pods-v4", Key::Addr(ip("198.18.1.9")), Value::None),
            ("fw-pods-v4", Key::Addr(ip("198.18.1.9")), Value::Timeout(Duration::from_secs(1))),
            ("fw-pods-v4", Key::Net(net("198.18.1.0/24")), jump.clone()),
            ("dns6-x", Key::Addr(ip("2001:db8::2")), Value::Timeout(Duration::from_secs(1))),
            ("dns6-x", Key::tagged(1, ip("192.0.2.1")), Value::Timeout(Duration::from_secs(1))),
            ("dns6-x", Key::tagged(1, ip("2001:db8::3")), Value::None),
            ("dns6-x", Key::tagged(1, ip("2001:db8::3")), jump.clone()),
            ("exempt-v4", Key::Net(net("192.0.2.1/24")), Value::None),
            ("exempt-v4", Key::Net(net("192.0.2.0/24")), Value::Timeout(Duration::from_secs(1))),
            ("exempt-v4", Key::Net(net("2001:db8::/32")), Value::None),
            ("exempt-v4", Key::Addr(ip("192.0.2.7")), Value::None),
            ("exempt-v4", Key::Mark(7), Value::None),
        ] {
            let mut new = table();
            new.sets.get_mut(set).unwrap().elements.insert(key, value.clone());
            assert_eq!(ElementDelta::between(&old, &new), None, "{set} {key:?} {value:?}");
        }
    }

    #[test]
    fn ranges_of_interval_sets_are_typed_prefixes() {
        let old = table();
        let mut new = table();
        let exempt = new.sets.get_mut("exempt-v4").unwrap();
        exempt.elements.remove(&"198.18.0.0/15".parse().unwrap());
        exempt.elements.insert("192.0.2.0/24".parse().unwrap(), Value::None);
        exempt.elements.insert("203.0.113.7/32".parse().unwrap(), Value::None);
        let delta = ElementDelta::between(&old, &new).unwrap();
        assert_eq!(delta.delete[0].elements, vec![("198.18.0.0/15".parse().unwrap(), Value::None)]);
        assert_eq!(
            delta.script("egressd"),
            "delete element inet egressd exempt-v4 { 198.18.0.0/15 }\n\
             add element inet egressd exempt-v4 { 192.0.2.0/24, 203.0.113.7/32 }\n"
        );
    }

    #[test]
    fn refresh_re_adds_every_element_of_the_slots_and_no_other() {
        let mut t = table();
        let dns = &mut t.sets.get_mut("dns6-x").unwrap().elements;
        // Tag 1's keys start "0 . 1 . ", as tag 4294967297's start "1 . 1 . ", and tag
        // 12's "0 . 12 . ": none of the others is tag 1's.
        dns.insert(slot(12).key("2001:db8::5".parse().unwrap()), "timeout 300s".parse().unwrap());
        dns.insert(slot(1).key("2001:db8::4".parse().unwrap()), "timeout 30s".parse().unwrap());
        let gone = Slot { set: "gone", tag: 1 };
        let pods = Slot { set: "fw-pods-v4", tag: 1 };
        let delta = ElementDelta::refresh(&t, &[slot(1), pods, gone, slot(99)]).unwrap();
        assert_eq!(
            delta.script("egressd"),
            "add element inet egressd dns6-x { 0 . 1 . 2001:db8::1 timeout 300s, 0 . 1 . 2001:db8::4 timeout 30s }\n"
        );
    }

    #[test]
    fn slot_keys_round_trip_through_text_and_kernel_bytes() {
        for (tag, ip) in [(0u64, "192.0.2.1"), (u64::MAX, "2001:db8::1"), (0x1234_5678_9abc_def0, "198.51.100.7")] {
            let ip: IpAddr = ip.parse().unwrap();
            let key = Slot { set: "s", tag }.key(ip);
            assert_eq!(key.to_string().parse::<Key>(), Ok(key), "{key}");
            assert_eq!(Slot::from_key_bytes(&Slot::key_bytes(tag, ip)), Some((tag, ip)));
        }
        // The halves are what nft prints for the two numgen constants.
        assert_eq!(
            Slot { set: "s", tag: 0x1_0000_0002 }.key("192.0.2.1".parse().unwrap()).to_string(),
            "1 . 2 . 192.0.2.1"
        );
        assert_eq!(
            Slot { set: "dns-v4", tag: 0x1_0000_0002 }.matches("ip"),
            "numgen random mod 1 offset 1 . numgen random mod 1 offset 2 . ip daddr @dns-v4"
        );
    }
}
