//! Verified connections: the firewall's fast path for the packets of a connection after
//! its first.
//!
//! What the base chain accepts — an allow of a namespace chain returns to it (instead of
//! accepting), what falls through a namespace chain, the exempt (cluster) ranges — goes
//! to `fw-mark`, which writes the policy's current *generation* into the connection's
//! conntrack mark (the bits of a mask, `--firewall-verified-mark-mask`; other bits are
//! kept), and the base chain's first rule accepts an established connection whose mark
//! holds the current generation (replies too: they share the entry):
//!
//! ```text
//! set fw-epoch { type mark; elements = { 0x04000000 } }        # the current generation
//! chain firewall {
//!     ct state established ct mark and 0x0f000000 @fw-epoch accept
//!     ct direction reply accept
//!     ip daddr 198.18.0.0/15 goto fw-mark
//!     ip saddr vmap @fw-pods-v4; …; ip6 saddr vmap @fw-pods-v6
//!     goto fw-mark
//! }
//! chain fw-mark {
//!     ct mark and 0x00000000 or 0x04000000 @fw-epoch ct mark set ct mark and 0xf0ffffff or 0x04000000 accept
//!     … one rule per generation value
//! }
//! ```
//!
//! (`ct mark and 0 or <v>` is the constant `<v>`: the one rule whose value is the
//! current generation marks.) `fw-mark` is reached from the base chain only, never from
//! the namespace chains: the kernel re-validates the table through every jump when a
//! change adds one (a pod's map element), and a chain every allow jumped to was walked
//! a thousand times at 100k rules (+1 ms per such change, measured).
//! Every change of what the fast path stands for (what the base chain reaches:
//! [`reached`]) moves the generation in the same transaction — an element of
//! `fw-epoch`, so the kernel re-validates nothing — and every established connection's
//! next packet walks the rules again, as OVN evaluates its ACLs on every packet. A
//! change of EgressIP's or EgressQoS's chains and sets alone ([`outside`]) keeps the
//! generation: their base chains see every packet anyway. Before a value is current
//! again, conntrack entries still carrying it are cleared
//! ([`crate::dataplane::verified::Generations`]): an old verdict never passes for a
//! new one. The compile leaves `fw-epoch` empty (nothing is verified); the syncer
//! stamps the generation it applies.

use super::rule::{CtState, MarkOf, Match, Rule, Statement, Verdict};
use super::{Key, Set, Table, Value};

/// The chain marking what the base chain accepts.
pub const CHAIN: &str = "fw-mark";
/// The set holding the current generation's mark value.
pub const EPOCH_SET: &str = "fw-epoch";

/// Generation values cleared from conntrack together: the entries whose mark under
/// `mask` is `value` (one dump the kernel filters, one walk of its conntrack table).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Group {
    /// The bits telling the groups apart.
    pub mask: u32,
    /// This group's value of them.
    pub value: u32,
}

/// The generation values of a mask, shifted into it, in the order they are used, in
/// three groups told apart by the field's top two bits (with two bits, each value is
/// its own group). A group is cleared in one walk of the kernel's conntrack table
/// (~10 ms of a core here, whatever the number of entries: the walk is over its
/// 262,144 buckets), so with four bits one walk serves four changes.
pub fn groups(mask: u32) -> Vec<(Group, Vec<u32>)> {
    if mask == 0 {
        return Vec::new();
    }
    let shift = mask.trailing_zeros();
    let low = mask.count_ones().saturating_sub(2);
    let top = shift + low;
    (1..=3u32)
        .map(|g| {
            let group = Group { mask: 0b11 << top, value: g << top };
            (group, (0..1u32 << low).map(|x| group.value | (x << shift)).collect())
        })
        .collect()
}

/// The generation values of a mask in the order they are used ([`groups`]); 0 is
/// "not verified".
pub fn values(mask: u32) -> impl Iterator<Item = u32> {
    groups(mask).into_iter().flat_map(|(_, values)| values)
}

/// Check a verified-connections mask: 0 (off), or at least two contiguous bits (three
/// generations: the current, the one before it whose packets may still be in flight,
/// and the next, cleared beforehand) clear of `others` (EgressIP's conntrack mark bits).
pub fn check_mask(mask: u32, others: u32) -> Result<(), String> {
    if mask == 0 {
        return Ok(());
    }
    let shifted = mask >> mask.trailing_zeros();
    if shifted & shifted.wrapping_add(1) != 0 {
        return Err(format!("{mask:#010x}: the bits must be contiguous (e.g. 0x03000000)"));
    }
    if shifted < 3 {
        return Err(format!("{mask:#010x}: at least two bits are needed (three generations)"));
    }
    if mask & others != 0 {
        return Err(format!("{mask:#010x} overlaps the EgressIP mark bits {others:#010x}"));
    }
    Ok(())
}

/// The base chain's fast path: an established connection verified under the current
/// generation.
pub fn fast_path(mask: u32) -> Rule {
    Rule::new()
        .when(Match::CtState(CtState::Established))
        .when(Match::CtMarkIn { mask, or: None, set: EPOCH_SET.into() })
        .verdict(Verdict::Accept)
}

/// The rules of [`CHAIN`]: one per generation value, marking the connection when it
/// is the current one.
pub fn marking_rules(mask: u32) -> Vec<Rule> {
    values(mask)
        .map(|v| {
            Rule::new()
                .when(Match::CtMarkIn { mask: 0, or: Some(v), set: EPOCH_SET.into() })
                .then(Statement::SetMark { of: MarkOf::Conn, keep: !mask, or: v })
                .verdict(Verdict::Accept)
        })
        .collect()
}

/// Set `table`'s current generation (its only `fw-epoch` element) to `value`, or to
/// none; a table without the set is left alone.
pub fn stamp(table: &mut Table, value: Option<u32>) {
    let Some(set) = table.sets.get_mut(EPOCH_SET) else { return };
    let elements: std::collections::BTreeMap<Key, Value> =
        value.map(|v| (Key::Mark(v), Value::None)).into_iter().collect();
    *set = Set { elements: elements.into(), ..set.clone() };
}

/// The generation `table` holds (its `fw-epoch` element).
pub fn stamped(table: &Table) -> Option<u32> {
    let set = table.sets.get(EPOCH_SET)?;
    match set.elements.keys().next()? {
        Key::Mark(mark) => Some(*mark),
        _ => None,
    }
}

/// The name prefixes of the table's parts that a verified connection's packets still
/// walk (EgressIP's `eip-` sets and `egress-` chains, EgressQoS's `qos` chains and
/// sets): base chains of their own that the firewall's base chain never reaches
/// ([`reached`]; tests/incremental.rs checks it over random policies). A change of
/// these alone leaves every verdict the fast path stands for as it was: it keeps the
/// generation, and open connections do not walk the rules again.
const OUTSIDE: [&str; 3] = ["eip-", "egress-", "qos"];

/// Whether the set or chain `name` is one of the parts a verified connection's
/// packets walk anyway ([`OUTSIDE`]); any other name is taken to decide verdicts.
pub fn outside(name: &str) -> bool {
    OUTSIDE.iter().any(|p| name.starts_with(p))
}

/// The chains and sets whose contents decide what the fast path accepts: the base
/// chains holding it (a rule reading [`EPOCH_SET`]) and everything their rules, and
/// the maps they read, jump or go to or look up, transitively.
pub fn reached(table: &Table) -> std::collections::BTreeSet<String> {
    let mut seen = std::collections::BTreeSet::new();
    let mut todo: Vec<String> = table
        .chains
        .iter()
        .filter(|(_, c)| c.hook.is_some() && c.rules.iter().any(|r| r.names().any(|n| n == EPOCH_SET)))
        .map(|(n, _)| n.to_string())
        .collect();
    while let Some(name) = todo.pop() {
        if !seen.insert(name.clone()) {
            continue;
        }
        if let Some(chain) = table.chains.get(name.as_str()) {
            todo.extend(chain.rules.iter().flat_map(|r| r.names()).map(str::to_string));
        } else if let Some(set) = table.sets.get(name.as_str()) {
            // A verdict map's values: `jump <chain>`.
            todo.extend(set.elements.values().filter_map(|v| match v {
                super::Value::Jump(chain) => Some(chain.to_string()),
                _ => None,
            }));
        }
    }
    seen
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_fill_the_mask_and_masks_are_checked() {
        assert_eq!(values(0x0300_0000).collect::<Vec<_>>(), [0x0100_0000, 0x0200_0000, 0x0300_0000]);
        let g = groups(0x0f00_0000);
        assert_eq!(g.len(), 3);
        assert_eq!(
            g[0],
            (Group { mask: 0x0c00_0000, value: 0x0400_0000 }, vec![0x0400_0000, 0x0500_0000, 0x0600_0000, 0x0700_0000])
        );
        assert_eq!(g[2].1, [0x0c00_0000, 0x0d00_0000, 0x0e00_0000, 0x0f00_0000]);
        for (group, values) in groups(0x0000_01f0) {
            assert!(values.iter().all(|v| v & group.mask == group.value && v & !0x1f0 == 0), "{group:?} {values:?}");
        }
        assert_eq!(values(0x0000_0070).count(), 6);
        assert_eq!(values(0).count(), 0);
        assert!(check_mask(0, 0x00ff_0000).is_ok());
        assert!(check_mask(0x0300_0000, 0x00ff_0000).is_ok());
        assert!(check_mask(0x0100_0000, 0).unwrap_err().contains("two bits"));
        assert!(check_mask(0x0500_0000, 0).unwrap_err().contains("contiguous"));
        assert!(check_mask(0x0003_0000, 0x00ff_0000).unwrap_err().contains("EgressIP"));
    }

    #[test]
    fn a_stamp_is_the_epoch_sets_only_element() {
        let mut t = Table::new("t");
        stamp(&mut t, Some(0x0100_0000));
        assert!(t.sets.is_empty(), "no set, nothing stamped");
        t.sets.insert(EPOCH_SET.into(), Set::new(super::super::KeyType::Mark, false));
        assert_eq!(stamped(&t), None);
        stamp(&mut t, Some(0x0200_0000));
        assert_eq!(stamped(&t), Some(0x0200_0000));
        assert_eq!(t.sets[EPOCH_SET].elements.len(), 1);
        stamp(&mut t, Some(0x0100_0000));
        assert_eq!(stamped(&t), Some(0x0100_0000));
        assert_eq!(t.sets[EPOCH_SET].elements.len(), 1);
        stamp(&mut t, None);
        assert_eq!(stamped(&t), None);
    }

    #[test]
    fn what_the_fast_path_reaches_is_followed_through_rules_and_maps() {
        use super::super::{Chain, Hook, KeyType};
        let hook = |h| Hook { chain_type: "filter", hook: h, priority: "filter" };
        let mut t = Table::new("t");
        t.sets.insert(EPOCH_SET.into(), Set::new(KeyType::Mark, false));
        let mut pods = Set::new(KeyType::Ipv4, false);
        pods.data = crate::nft::Data::Verdict;
        pods.elements = [("198.18.0.2".parse().unwrap(), "jump fw-a".parse().unwrap())].into_iter().collect();
        t.sets.insert("fw-pods-v4".into(), pods);
        t.sets.insert("fw-a-s0".into(), Set::new(KeyType::Ipv4, false));
        t.sets.insert("eip-exempt-v4".into(), Set::new(KeyType::Ipv4, false));
        let mut to_b = Set::new(KeyType::Ipv4, false);
        to_b.data = crate::nft::Data::Verdict;
        to_b.elements = [("192.0.2.1".parse().unwrap(), "jump fw-b".parse().unwrap())].into_iter().collect();
        t.sets.insert("fw-a-m".into(), to_b);
        let parsed = |rules: &[&str]| rules.iter().map(|r| r.parse().unwrap()).collect::<Vec<Rule>>();
        let mut firewall = vec![fast_path(0x0300_0000)];
        firewall.extend(parsed(&["ip saddr vmap @fw-pods-v4", "goto fw-mark"]));
        t.chains.insert("firewall".into(), Chain::base(hook("prerouting"), firewall));
        t.chains.insert("fw-mark".into(), Chain::regular(marking_rules(0x0300_0000)));
        t.chains.insert("fw-a".into(), Chain::parsed(["ip daddr @fw-a-s0 accept", "ip daddr vmap @fw-a-m"]).unwrap());
        t.chains.insert("fw-b".into(), Chain::parsed(["drop"]).unwrap());
        t.chains.insert(
            "egress-snat".into(),
            Chain::base(hook("postrouting"), parsed(&["ip daddr @eip-exempt-v4 return", "jump fw-b"])),
        );
        let reached = reached(&t);
        assert_eq!(
            reached.iter().map(String::as_str).collect::<Vec<_>>(),
            ["firewall", "fw-a", "fw-a-m", "fw-a-s0", "fw-b", "fw-epoch", "fw-mark", "fw-pods-v4"]
        );
        assert!(reached.iter().all(|n| !outside(n)));
        assert!(outside("eip-exempt-v4") && outside("egress-snat") && outside("qos-media") && outside("qos"));
        assert!(!outside("fw-a") && !outside("firewall") && !outside("dns-v4") && !outside(EPOCH_SET));
    }
}
