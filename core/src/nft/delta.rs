//! Element-only changes between two tables, typed: what the steady state mostly is (a
//! pod added or gone, a DNS answer, an EgressIP's pods). When nothing but elements of
//! existing sets and maps differ, [`ElementDelta::between`] gives them as typed values
//! that the netlink path ([`crate::dataplane::elements`]) sends without an `nft`
//! process (which would first read the whole table into its cache), and
//! [`ElementDelta::script`] renders the very text [`super::diff`] would send.

use std::net::IpAddr;
use std::time::Duration;

use compact_str::ToCompactString;

use super::{FAMILY, Set, Slot, Table, Text};

/// What one element carries besides its key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ElementValue {
    /// Nothing (a plain set).
    None,
    /// The element's timeout (a timeout set).
    Timeout(Duration),
    /// `jump <chain>` (a verdict map).
    Jump(String),
    /// A range of an interval set: the key is the network's first address, this its
    /// prefix length (`addr/len`; the kernel stores its start and the address after its
    /// end, see [`crate::dataplane::elements`]).
    Prefix(u8),
}

/// An element's key: an address (after its slot's tag in a tagged set) or a mark
/// (`type mark`, host byte order in the kernel).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ElementKey {
    /// An address.
    Ip(IpAddr),
    /// A mark value (`0x01000000`).
    Mark(u32),
    /// A transport protocol number, a destination port and a prefix's first address
    /// (its length is the element's [`ElementValue::Prefix`]), in a ported set
    /// ([`super::KeyType::PortIpv4`]).
    Port(u8, u16, IpAddr),
}

impl From<IpAddr> for ElementKey {
    fn from(ip: IpAddr) -> Self {
        ElementKey::Ip(ip)
    }
}

impl ElementKey {
    /// The key as nft text, after `tag` in a tagged set.
    fn text(self, tag: Option<u64>) -> Text {
        match (self, tag) {
            (ElementKey::Ip(ip), Some(tag)) => Slot::tagged_key(tag, ip),
            (ElementKey::Ip(ip), None) => ip.to_compact_string(),
            (ElementKey::Mark(m), _) => compact_str::format_compact!("{m:#010x}"),
            (ElementKey::Port(proto, port, ip), _) => compact_str::format_compact!("{proto} . {port} . {ip}"),
        }
    }
}

/// Elements of one set or map (of one [`Slot`] of a tagged set).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetElements {
    /// The set's name.
    pub set: String,
    /// In a tagged set, the tag every key of these elements starts with.
    pub tag: Option<u64>,
    /// Keys and values, in key order (as nft text would list them).
    pub elements: Vec<(ElementKey, ElementValue)>,
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
            // A slot's keys are next to each other, from its prefix on.
            let prefix = slot.key_prefix();
            let items: Vec<(&Text, &Text)> =
                set.elements.range(prefix.clone()..).take_while(|(k, _)| k.starts_with(prefix.as_str())).collect();
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
                let items: Vec<String> = list
                    .elements
                    .iter()
                    .map(|(key, v)| (key.text(list.tag), v))
                    .map(|(k, v)| match v {
                        ElementValue::Prefix(len) => format!("{k}/{len}"),
                        _ if !values => k.to_string(),
                        ElementValue::None => k.to_string(),
                        ElementValue::Timeout(t) => format!("{k} timeout {}s", t.as_secs()),
                        ElementValue::Jump(chain) => format!("{k} : jump {chain}"),
                    })
                    .collect();
                out.push_str(&format!("{verb} element {FAMILY} {table} {} {{ {} }}\n", list.set, items.join(", ")));
            }
        }
        out
    }
}

/// The elements to delete from `before` and to add from `after`, in key order, in one
/// walk over both (sorted) element maps. As in `diff`: in a timeout set a changed value
/// is a new timeout, which re-adding sets, so only elements that are gone are deleted.
#[allow(clippy::type_complexity)]
fn changes<'a>(before: &'a Set, after: &'a Set) -> (Vec<(&'a Text, &'a Text)>, Vec<(&'a Text, &'a Text)>) {
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

/// `items` of `set` typed, appended to `list` as one [`SetElements`] per tag (a tagged
/// set's items of one tag are next to each other); `None` when one cannot be typed.
fn push_typed(list: &mut Vec<SetElements>, name: &str, set: &Set, items: Vec<(&Text, &Text)>) -> Option<()> {
    let start = list.len();
    for (k, v) in items {
        let (tag, key, value) = typed(set, k, v)?;
        let ours = list.len() > start;
        match list.last_mut() {
            Some(last) if ours && last.tag == tag => last.elements.push((key, value)),
            _ => list.push(SetElements { set: name.to_string(), tag, elements: vec![(key, value)] }),
        }
    }
    Some(())
}

/// Whether two sets are declared alike (key, kind, flags): else only a new set, which
/// means a full replace of the table, changes one into the other.
pub(super) fn same_declaration(a: &Set, b: &Set) -> bool {
    a.key == b.key && a.verdict_map == b.verdict_map && a.interval == b.interval && a.timeout == b.timeout
}

/// An element of `set` as the compiler writes it (`ip.to_string()` keys of the set's
/// family, after `<hi> . <lo> . ` in a tagged set; values `""`, `timeout <n>s` or
/// `jump <chain>` as the set's kind requires; a mark as `0x%08x` in a plain mark set),
/// typed; `None` for anything else.
fn typed(set: &Set, key: &str, value: &str) -> Option<(Option<u64>, ElementKey, ElementValue)> {
    if set.key == super::KeyType::Mark {
        let mark = u32::from_str_radix(key.strip_prefix("0x")?, 16).ok()?;
        let plain = !set.interval && !set.timeout && !set.verdict_map && value.is_empty();
        return (plain && format!("{mark:#010x}") == key).then_some((None, ElementKey::Mark(mark), ElementValue::None));
    }
    if set.key.is_ported() {
        // `<protocol> . <port> . addr/len`, as the compiler writes it.
        let mut parts = key.split(" . ");
        let (proto, port, net) = (parts.next()?, parts.next()?, parts.next()?);
        let proto = crate::view::policy::Protocol::from_nft(proto)?;
        let port: u16 = port.parse().ok()?;
        let net: ipnet::IpNet = net.parse().ok()?;
        if parts.next().is_some()
            || !set.interval
            || set.verdict_map
            || set.timeout
            || !value.is_empty()
            || net.trunc() != net
            || net.addr().is_ipv6() != set.key.is_v6()
        {
            return None;
        }
        return Some((
            None,
            ElementKey::Port(proto.number(), port, net.addr()),
            ElementValue::Prefix(net.prefix_len()),
        ));
    }
    if set.interval {
        // `addr/len`, host bits clear, as `IpNet` writes it.
        let net: ipnet::IpNet = key.parse().ok()?;
        if set.verdict_map
            || set.timeout
            || set.key.is_tagged()
            || !value.is_empty()
            || net.trunc() != net
            || net.to_string() != key
        {
            return None;
        }
        return (net.addr().is_ipv6() == set.key.is_v6()).then_some((
            None,
            net.addr().into(),
            ElementValue::Prefix(net.prefix_len()),
        ));
    }
    let (tag, ip) = if set.key.is_tagged() {
        let (tag, ip) = Slot::parse_key(key)?;
        (Some(tag), ip)
    } else {
        let ip: IpAddr = key.parse().ok()?;
        if ip.to_string() != key {
            return None;
        }
        (None, ip)
    };
    if ip.is_ipv6() != set.key.is_v6() {
        return None;
    }
    let value = if set.verdict_map {
        let chain = value.strip_prefix("jump ")?;
        if chain.is_empty() || !chain.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
        {
            return None;
        }
        ElementValue::Jump(chain.to_string())
    } else if set.timeout {
        let secs: u64 = value.strip_prefix("timeout ")?.strip_suffix('s')?.parse().ok()?;
        if format!("timeout {secs}s") != value {
            return None;
        }
        ElementValue::Timeout(Duration::from_secs(secs))
    } else if value.is_empty() {
        ElementValue::None
    } else {
        return None;
    };
    Some((tag, ip.into(), value))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nft::{Chain, KeyType};

    fn slot(tag: u64) -> Slot {
        Slot { set: "dns6-x", tag }
    }

    fn table() -> Table {
        let mut t = Table::new("egressd");
        let mut pods = Set::verdict_map(KeyType::Ipv4);
        pods.elements.insert("198.18.1.2".into(), "jump fw-a".into());
        t.sets.insert("fw-pods-v4".into(), pods);
        let mut dns = Set::with_timeout(KeyType::TaggedIpv6);
        dns.elements.insert(slot(1).key("2001:db8::1".parse().unwrap()), "timeout 300s".into());
        dns.elements.insert(slot(4_294_967_297).key("2001:db8::9".parse().unwrap()), "timeout 300s".into());
        t.sets.insert("dns6-x".into(), dns);
        let mut exempt = Set::new(KeyType::Ipv4, true);
        exempt.elements.insert("198.18.0.0/15".into(), Text::default());
        t.sets.insert("exempt-v4".into(), exempt);
        t.chains.insert("fw-a".into(), Chain::parsed(["counter drop"]).unwrap());
        t.chains.insert("fw-b".into(), Chain::parsed(["counter accept"]).unwrap());
        t
    }

    #[test]
    fn a_changed_verdict_is_deleted_then_added_and_timeouts_are_re_added() {
        let old = table();
        let mut new = table();
        new.sets.get_mut("fw-pods-v4").unwrap().elements.insert("198.18.1.2".into(), "jump fw-b".into());
        new.sets.get_mut("fw-pods-v4").unwrap().elements.insert("198.18.1.3".into(), "jump fw-a".into());
        let dns = &mut new.sets.get_mut("dns6-x").unwrap().elements;
        dns.insert("0 . 1 . 2001:db8::1".into(), "timeout 310s".into());
        dns.insert("0 . 1 . 2001:db8::2".into(), "timeout 310s".into());
        dns.insert("1 . 1 . 2001:db8::3".into(), "timeout 310s".into());
        let delta = ElementDelta::between(&old, &new).unwrap();
        assert_eq!(
            delta.delete,
            vec![SetElements {
                set: "fw-pods-v4".into(),
                tag: None,
                elements: vec![(ElementKey::Ip("198.18.1.2".parse().unwrap()), ElementValue::Jump("fw-a".into()))]
            }]
        );
        // A tagged set's additions: one list per tag.
        let tags: Vec<_> = delta.add.iter().map(|l| (l.set.as_str(), l.tag, l.elements.len())).collect();
        assert_eq!(tags, [("dns6-x", Some(1), 2), ("dns6-x", Some(4_294_967_297), 1), ("fw-pods-v4", None, 2)]);
        assert_eq!(delta.len(), 6);
        assert_eq!(
            delta.script("egressd"),
            "delete element inet egressd fw-pods-v4 { 198.18.1.2 }\n\
             add element inet egressd dns6-x { 0 . 1 . 2001:db8::1 timeout 310s, 0 . 1 . 2001:db8::2 timeout 310s }\n\
             add element inet egressd dns6-x { 1 . 1 . 2001:db8::3 timeout 310s }\n\
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
        // A key of the other family, a key not in canonical form, an odd value.
        for (set, key, value) in [
            ("fw-pods-v4", "2001:db8::2", "jump fw-a"),
            ("dns6-x", "0 . 1 . 2001:DB8::2", "timeout 1s"),
            ("dns6-x", "2001:db8::2", "timeout 1s"),
            ("dns6-x", "0 . 1 . 192.0.2.1", "timeout 1s"),
            ("dns6-x", "00 . 1 . 2001:db8::2", "timeout 1s"),
            ("dns6-x", "0 . 4294967296 . 2001:db8::2", "timeout 1s"),
            ("fw-pods-v4", "198.18.1.9", "accept"),
            ("fw-pods-v4", "0 . 1 . 198.18.1.9", "jump fw-a"),
            ("dns6-x", "0 . 1 . 2001:db8::3", "timeout 1m"),
            ("exempt-v4", "192.0.2.1/24", ""),
            ("exempt-v4", "192.0.2.0/24", "timeout 1s"),
            ("exempt-v4", "2001:db8::/32", ""),
            ("exempt-v4", "192.0.2.7", ""),
        ] {
            let mut new = table();
            new.sets.get_mut(set).unwrap().elements.insert(key.into(), value.into());
            assert_eq!(ElementDelta::between(&old, &new), None, "{set} {key} {value}");
        }
    }

    #[test]
    fn ranges_of_interval_sets_are_typed_prefixes() {
        let old = table();
        let mut new = table();
        let exempt = new.sets.get_mut("exempt-v4").unwrap();
        exempt.elements.remove("198.18.0.0/15");
        exempt.elements.insert("192.0.2.0/24".into(), Text::default());
        exempt.elements.insert("203.0.113.7/32".into(), Text::default());
        let delta = ElementDelta::between(&old, &new).unwrap();
        assert_eq!(
            delta.delete[0].elements,
            vec![(ElementKey::Ip("198.18.0.0".parse().unwrap()), ElementValue::Prefix(15))]
        );
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
        dns.insert(slot(12).key("2001:db8::5".parse().unwrap()), "timeout 300s".into());
        dns.insert(slot(1).key("2001:db8::4".parse().unwrap()), "timeout 30s".into());
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
            assert_eq!(Slot::parse_key(&key), Some((tag, ip)), "{key}");
            assert_eq!(Slot::from_key_bytes(&Slot::key_bytes(tag, ip)), Some((tag, ip)));
        }
        // The halves are what nft prints for the two numgen constants.
        assert_eq!(Slot { set: "s", tag: 0x1_0000_0002 }.key("192.0.2.1".parse().unwrap()), "1 . 2 . 192.0.2.1");
        assert_eq!(
            Slot { set: "dns-v4", tag: 0x1_0000_0002 }.matches("ip"),
            "numgen random mod 1 offset 1 . numgen random mod 1 offset 2 . ip daddr @dns-v4"
        );
    }
}
