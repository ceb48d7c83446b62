//! A namespace's ordered static rules as disjoint destination prefixes (issue #39).
//!
//! First match over (protocol, port, destination) flattened: every prefix of the
//! result belongs to one rule — the first that matches each packet falling in it — and
//! no two prefixes of one lookup overlap, so the order of the rules is no longer needed
//! and a chain can look the packet up in two sets per family (one of allowed, one of
//! denied prefixes) instead of walking one rule per policy rule. Elements are what
//! nf_tables loads linearly and changes without re-validating the table
//! (bench/FINDINGS.md, "2026-11-27 (later)", finding 3); but a concatenated interval
//! set costs the kernel ~120 KB however few its elements, so the firewall compile
//! flattens a segment only where that costs the kernel less than its merged runs
//! (`firewall::segment_statements`; "2026-11-27 (fourth)").
//!
//! Two kinds of prefixes:
//!
//! * **ported**: `protocol . port . prefix`, from rules with ports. Looked up first
//!   (`meta l4proto . th dport . ip daddr @set`). Each is its rule's destination less
//!   every earlier rule's of the same protocol and port, and less every earlier portless
//!   rule's (which decides first for those packets).
//! * **portless**: `prefix`, from rules without ports, less the earlier portless
//!   rules'. Looked up after the ported ones, by destination only, so a packet without a
//!   transport header (which `th dport` cannot load) is still decided by them. A portless
//!   prefix need not be cut by an earlier ported rule: a packet that rule matches is
//!   decided by the ported lookup before.
//!
//! [`flatten`] is pure; the property test below checks that for random rule lists and
//! random packets the two lookups give the first-match verdict of the rules.

use ipnet::IpNet;

use super::runs::StaticRule;
use crate::view::policy::{Action, Protocol};

/// One disjoint prefix and the rule that decides it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Piece {
    /// The destinations.
    pub net: IpNet,
    /// The deciding rule's action.
    pub action: Action,
    /// The deciding rule's index in `spec.egress`.
    pub index: usize,
}

/// The flattened rules of one family.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Boxes {
    /// Ported pieces: protocol, port and prefix (disjoint per protocol and port).
    pub ported: Vec<(Protocol, u16, Piece)>,
    /// Portless pieces (disjoint).
    pub portless: Vec<Piece>,
}

impl Boxes {
    /// Whether nothing is left (the rules match nothing of this family).
    #[cfg(test)]
    fn is_empty(&self) -> bool {
        self.ported.is_empty() && self.portless.is_empty()
    }
}

/// `a` less `b`: `a` itself when they do not overlap, nothing when `b` holds `a`, else
/// the prefixes that `a` splits into around `b` (one per length between them).
fn minus(a: IpNet, b: IpNet) -> Vec<IpNet> {
    if b.contains(&a) {
        return Vec::new();
    }
    if !a.contains(&b) {
        return vec![a];
    }
    let mut out = Vec::with_capacity(usize::from(b.prefix_len() - a.prefix_len()));
    for len in a.prefix_len() + 1..=b.prefix_len() {
        // The half at this length that does not hold `b`.
        let Ok(inside) = IpNet::new(b.addr(), len).map(|n| n.trunc()) else { continue };
        let Some(parent) = inside.supernet() else { continue };
        if let Ok(mut halves) = parent.subnets(len) {
            out.extend(halves.find(|h| *h != inside));
        }
    }
    out
}

/// `net` less every prefix of `taken`.
fn remaining<'a>(net: IpNet, taken: impl Iterator<Item = &'a IpNet>) -> Vec<IpNet> {
    let mut pieces = vec![net];
    for t in taken {
        if pieces.is_empty() {
            break;
        }
        if !pieces.iter().any(|p| p.contains(t) || t.contains(p)) {
            continue;
        }
        pieces = pieces.into_iter().flat_map(|p| minus(p, *t)).collect();
    }
    pieces
}

/// Flatten `rules` (in order) for one family (`v4`): see the module's documentation.
pub(super) fn flatten(rules: &[StaticRule], v4: bool) -> Boxes {
    let mut out = Boxes::default();
    for r in rules {
        for net in r.targets.iter().map(IpNet::trunc).filter(|n| n.addr().is_ipv4() == v4) {
            if r.ports.is_empty() {
                let pieces = remaining(net, out.portless.iter().map(|p| &p.net));
                out.portless.extend(pieces.into_iter().map(|net| Piece { net, action: r.action, index: r.index }));
                continue;
            }
            for (proto, port) in r.ports.iter().copied() {
                let same_key = out.ported.iter().filter(|(p, q, _)| (*p, *q) == (proto, port)).map(|(_, _, x)| &x.net);
                let earlier = out.portless.iter().map(|p| &p.net).chain(same_key);
                let pieces: Vec<IpNet> = remaining(net, earlier);
                out.ported.extend(
                    pieces.into_iter().map(|net| (proto, port, Piece { net, action: r.action, index: r.index })),
                );
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::net::IpAddr;

    use super::*;
    use crate::compile::rule_strategies::{first_match, packet, rules};
    use proptest::prelude::*;

    /// The two lookups, as the chain makes them: ported first (only a packet with a
    /// port can match one), then portless.
    fn looked_up(b: &Boxes, dst: IpAddr, port: Option<(Protocol, u16)>) -> Option<(Action, usize)> {
        let ported = port.and_then(|(proto, n)| {
            b.ported.iter().find(|(p, q, x)| (*p, *q) == (proto, n) && x.net.contains(&dst)).map(|(_, _, x)| x)
        });
        ported.or_else(|| b.portless.iter().find(|x| x.net.contains(&dst))).map(|x| (x.action, x.index))
    }

    /// No two pieces of one lookup overlap (the kernel refuses overlapping elements).
    fn disjoint(nets: &[IpNet]) -> bool {
        let mut sorted: Vec<IpNet> = nets.to_vec();
        sorted.sort();
        sorted.windows(2).all(|w| !w[0].contains(&w[1]) && !w[1].contains(&w[0]))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(3000))]
        #[test]
        fn the_lookups_give_the_first_match_verdict_and_rule(
            rules in rules(16),
            packets in prop::collection::vec(packet(), 1..40),
        ) {
            let [v4, v6] = [flatten(&rules, true), flatten(&rules, false)];
            for b in [&v4, &v6] {
                prop_assert!(disjoint(&b.portless.iter().map(|p| p.net).collect::<Vec<_>>()), "{:?}", b);
                let keys: BTreeSet<(Protocol, u16)> = b.ported.iter().map(|(p, q, _)| (*p, *q)).collect();
                for k in keys {
                    let nets: Vec<IpNet> = b.ported.iter().filter(|(p, q, _)| (*p, *q) == k).map(|x| x.2.net).collect();
                    prop_assert!(disjoint(&nets), "{:?} {:?}", k, b);
                }
            }
            for (dst, port) in packets {
                let b = if dst.is_ipv4() { &v4 } else { &v6 };
                let first = first_match(&rules, dst, port).map(|r| (r.action, r.index));
                prop_assert_eq!(looked_up(b, dst, port), first, "{} {:?}\n{:?}", dst, port, b);
            }
        }
    }

    #[test]
    fn a_prefix_less_a_prefix_inside_it_is_one_prefix_per_length_between() {
        let a: IpNet = "198.51.100.0/24".parse().unwrap();
        let b: IpNet = "198.51.100.64/27".parse().unwrap();
        let got = minus(a, b);
        let want: Vec<IpNet> =
            ["198.51.100.128/25", "198.51.100.0/26", "198.51.100.96/27"].iter().map(|s| s.parse().unwrap()).collect();
        assert_eq!(got, want);
        assert_eq!(minus(b, a), Vec::<IpNet>::new());
        assert_eq!(minus(a, "192.0.2.0/24".parse().unwrap()), vec![a]);
    }

    #[test]
    fn a_ported_rule_after_a_portless_one_keeps_only_what_the_portless_one_leaves() {
        let rule = |index, action, net: &str, ports: &[(Protocol, u16)]| StaticRule {
            index,
            action,
            targets: BTreeSet::from([net.parse().unwrap()]),
            ports: ports.iter().copied().collect(),
        };
        let rules = [
            rule(0, Action::Deny, "198.51.100.0/25", &[]),
            rule(1, Action::Allow, "198.51.100.0/24", &[(Protocol::Tcp, 443)]),
            rule(2, Action::Deny, "0.0.0.0/0", &[]),
        ];
        let b = flatten(&rules, true);
        assert_eq!(
            b.ported,
            vec![(
                Protocol::Tcp,
                443,
                Piece { net: "198.51.100.128/25".parse().unwrap(), action: Action::Allow, index: 1 }
            )]
        );
        assert_eq!(b.portless.len(), 1 + 25, "{:?}", b.portless);
        assert!(flatten(&rules, false).is_empty());
    }
}
