//! Consecutive EgressFirewall rules with the same action, merged into as few nft rules
//! as their ports allow.
//!
//! First match makes a run of same-action rules order-free: whichever of them matches,
//! the verdict is the same. So a run becomes one nft rule per family and port set — its
//! destinations one (anonymous, interval) set lookup, overlaps aggregated — instead of
//! one rule per EgressFirewall rule: a packet pays a lookup per run, not a comparison per
//! rule, and the kernel creates and validates far fewer rules. Runs end at a rule of the
//! other action and at a `dnsName` rule (its addresses live in their own set and change
//! without recompiling). Namespaces whose verdicts are logged (ACL logging, audit mode)
//! are not merged: their log lines name the rule.
//!
//! [`merge`] is pure; the property test below checks that for random rule lists and
//! random packets the merged statements give the first-match verdict of the rules.

use std::collections::{BTreeMap, BTreeSet};

use ipnet::IpNet;

use crate::view::policy::{Action, Ports};

/// One static rule (CIDR or nodeSelector, its addresses resolved) as the merge sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct StaticRule {
    /// Index in `spec.egress`.
    pub index: usize,
    /// Allow or Deny.
    pub action: Action,
    /// Destinations (empty: the rule matches nothing, e.g. a nodeSelector without nodes).
    pub targets: BTreeSet<IpNet>,
    /// Protocol/port pairs, OR-ed; empty: every packet.
    pub ports: Ports,
}

/// One nft rule of a run: destinations of one family, one port set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Match {
    /// IPv4 destinations (else IPv6).
    pub v4: bool,
    /// Destinations, aggregated (no overlaps, adjacent prefixes joined).
    pub addrs: Vec<IpNet>,
    /// Destinations as listed, without those inside another ([`by_length`] groups them).
    pub listed: Vec<IpNet>,
    /// Protocol/port pairs; empty: every packet.
    pub ports: Ports,
}

/// A run of consecutive same-action rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Run {
    /// First and last rule index in the run.
    pub first: usize,
    /// Last rule index.
    pub last: usize,
    /// The run's action.
    pub action: Action,
    /// Its nft rules, portless first, IPv4 before IPv6.
    pub matches: Vec<Match>,
}

impl Run {
    /// The rule comment: `egress[i]`, or `egress[i..j]` for a run of several rules.
    pub(super) fn comment(&self) -> crate::nft::rule::Name {
        comment(self.first, self.last)
    }
}

/// Merge consecutive same-action rules (rules without targets are left out: they match
/// nothing and do not break a run).
pub(super) fn merge(rules: &[StaticRule]) -> Vec<Run> {
    type Groups = BTreeMap<Ports, [Vec<IpNet>; 2]>;
    let mut runs: Vec<(usize, usize, Action, Groups)> = Vec::new();
    for r in rules.iter().filter(|r| !r.targets.is_empty()) {
        match runs.last_mut() {
            Some(run) if run.2 == r.action => run.1 = r.index,
            _ => runs.push((r.index, r.index, r.action, Groups::new())),
        }
        let Some(run) = runs.last_mut() else { continue };
        let group = run.3.entry(r.ports.clone()).or_default();
        for t in &r.targets {
            group[usize::from(t.addr().is_ipv6())].push(*t);
        }
    }
    runs.into_iter()
        .map(|(first, last, action, groups)| {
            let mut matches = Vec::new();
            for (ports, [v4, v6]) in groups {
                for (is_v4, addrs) in [(true, v4), (false, v6)] {
                    if !addrs.is_empty() {
                        matches.push(Match {
                            v4: is_v4,
                            addrs: IpNet::aggregate(&addrs),
                            listed: outermost(addrs),
                            ports: ports.clone(),
                        });
                    }
                }
            }
            Run { first, last, action, matches }
        })
        .collect()
}

/// `nets` without the prefixes inside another of them (and without duplicates), sorted.
fn outermost(mut nets: Vec<IpNet>) -> Vec<IpNet> {
    // By network address, a prefix before the longer ones it contains.
    nets.iter_mut().for_each(|n| *n = n.trunc());
    nets.sort();
    let mut out: Vec<IpNet> = Vec::with_capacity(nets.len());
    for n in nets {
        // Sorted, a prefix containing `n` is the last one kept, if any is.
        if !out.last().is_some_and(|last| last.contains(&n)) {
            out.push(n);
        }
    }
    out
}

/// Most prefix lengths a match's destinations may have to be looked up by length.
pub(super) const MAX_LENGTHS: usize = 2;

/// A match's destinations (`listed`) by prefix length, for one exact-match lookup of
/// the masked destination address per length (a hash set: cheaper per packet than an
/// interval set lookup, bench/FINDINGS.md), or `None` when they have more than
/// [`MAX_LENGTHS`] lengths (then one interval set holds them all).
pub(super) fn by_length(listed: &[IpNet]) -> Option<BTreeMap<u8, Vec<IpNet>>> {
    let mut groups: BTreeMap<u8, Vec<IpNet>> = BTreeMap::new();
    for n in listed {
        groups.entry(n.prefix_len()).or_default().push(*n);
    }
    (groups.len() <= MAX_LENGTHS).then_some(groups)
}

/// Whether a packet to `dst` (with its protocol and destination port, when it has one)
/// matches `m`, as the kernel evaluates the rendered rule.
#[cfg(test)]
fn matches(m: &Match, dst: std::net::IpAddr, port: Option<(crate::view::policy::Protocol, u16)>) -> bool {
    m.v4 == dst.is_ipv4()
        && m.addrs.iter().any(|n| n.contains(&dst))
        && (m.ports.is_empty() || port.is_some_and(|p| m.ports.contains(&p)))
}

/// The comment of the rules `first..=last` merged: `egress[<first>]` or
/// `egress[<first>..<last>]`.
pub(super) fn comment(first: usize, last: usize) -> crate::nft::rule::Name {
    if first == last {
        compact_str::format_compact!("egress[{first}]")
    } else {
        compact_str::format_compact!("egress[{first}..{last}]")
    }
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use super::*;
    use crate::compile::rule_strategies::{first_match, net, packet, rules};
    use crate::view::policy::Protocol;
    use proptest::prelude::*;

    /// The merged runs, evaluated as the chain does.
    fn merged(runs: &[Run], dst: IpAddr, port: Option<(Protocol, u16)>) -> Option<Action> {
        runs.iter().find(|r| r.matches.iter().any(|m| matches(m, dst, port))).map(|r| r.action)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        #[test]
        fn merged_runs_give_the_first_match_verdict(rules in rules(12), packets in prop::collection::vec(packet(), 1..40)) {
            let runs = merge(&rules);
            for (dst, port) in packets {
                let first = first_match(&rules, dst, port).map(|r| r.action);
                prop_assert_eq!(merged(&runs, dst, port), first, "{} {:?}\n{:?}", dst, port, runs);
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        /// The lookups by length (the destination masked to each length, looked up
        /// exactly among that length's networks) match what the destinations contain.
        #[test]
        fn lookups_by_length_match_the_destinations(
            nets in prop_oneof![
                prop::collection::vec(net(), 1..8),
                // At most two lengths, so the lookups by length are taken.
                prop::collection::vec(
                    (0u8..=255, prop_oneof![Just(24u8), Just(30)])
                        .prop_map(|(x, len)| IpNet::new(IpAddr::from([198, 51, 100, x]), len).unwrap().trunc()),
                    1..12,
                ),
                prop::collection::vec(
                    (0u16..300, prop_oneof![Just(120u8), Just(128)])
                        .prop_map(|(x, len)| IpNet::new(IpAddr::from([0x2001, 0xdb8, 0, 0, 0, 0, 0, x]), len).unwrap().trunc()),
                    1..12,
                ),
            ],
            packets in prop::collection::vec(packet(), 1..40),
        ) {
            let listed = outermost(nets.clone());
            for w in listed.windows(2) {
                prop_assert!(!w[0].contains(&w[1]) && !w[1].contains(&w[0]), "{:?}", listed);
            }
            if let Some(groups) = by_length(&listed) {
                prop_assert!(groups.len() <= MAX_LENGTHS);
                for (dst, _) in packets {
                    let looked_up = groups.iter().any(|(len, nets)| {
                        IpNet::new(dst, *len).is_ok_and(|masked| nets.iter().any(|n| n.network() == masked.network()))
                    });
                    prop_assert_eq!(looked_up, nets.iter().any(|n| n.contains(&dst)), "{} {:?}", dst, groups);
                }
            }
        }
    }

    #[test]
    fn same_action_rules_become_one_rule_per_family_and_port_set() {
        let r = |index, action, t: &[&str], ports: &[(Protocol, u16)]| StaticRule {
            index,
            action,
            targets: t.iter().map(|s| s.parse().unwrap()).collect(),
            ports: ports.iter().copied().collect(),
        };
        let runs = merge(&[
            r(0, Action::Allow, &["192.0.2.0/25"], &[]),
            r(1, Action::Allow, &["192.0.2.128/25", "2001:db8::/64"], &[]),
            r(2, Action::Allow, &["198.51.100.0/24"], &[(Protocol::Tcp, 443)]),
            r(3, Action::Allow, &[], &[]),
            r(4, Action::Deny, &["0.0.0.0/0"], &[]),
        ]);
        assert_eq!(runs.len(), 2);
        assert_eq!(runs[0].comment(), "egress[0..2]");
        assert_eq!(runs[1].comment(), "egress[4]");
        let addrs: Vec<String> = runs[0].matches.iter().map(|m| format!("{:?} {:?}", m.addrs, m.ports)).collect();
        assert_eq!(addrs, ["[192.0.2.0/24] {}", "[2001:db8::/64] {}", "[198.51.100.0/24] {(Tcp, 443)}"], "aggregated");
    }
}
