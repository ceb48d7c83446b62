//! The plan of a netlink sync, pure: [`between`] the owned state read from the kernel
//! ([`NetState`]) and the desired one ([`NetDesired`]), the steps that make the first the
//! second, in the order they must be taken. The driver
//! ([`crate::dataplane::netlink::Netlink::sync`]) reads the state, takes the steps and
//! does nothing else.
//!
//! Order: rules out first, routes next, addresses last (nothing ever routes to an
//! address or table that is gone); additions in the reverse order; the tunnel device
//! before the routes through it, or, when nothing wants it, last. Entries already as
//! desired get no step, so a restart causes no flap.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use super::{MarkRule, NetDesired, NextHop};

/// The owned state found in the kernel.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NetState {
    /// Owned addresses → (link index, prefix length).
    pub addresses: BTreeMap<IpAddr, (u32, u8)>,
    /// Owned default routes: (table, IPv6) → next hops.
    pub routes: BTreeMap<(u32, bool), Vec<NextHop>>,
    /// Owned rules.
    pub rules: BTreeSet<MarkRule>,
}

/// One step of a sync.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Remove an owned rule.
    RemoveRule(MarkRule),
    /// Remove the owned default route of (table, IPv6).
    RemoveRoute(u32, bool),
    /// Remove an owned address from its link (with the prefix length it has there).
    RemoveAddress(IpAddr, u32, u8),
    /// Add an address to a link (index, name), as a host address.
    AddAddress(IpAddr, u32, String),
    /// Bring the tunnel device to what is desired (`desired.tunnel`: none removes it).
    Tunnel,
    /// Add or replace the default route of (table, IPv6).
    SetRoute(u32, bool, Vec<NextHop>),
    /// Add a rule.
    AddRule(MarkRule),
}

/// The prefix length of a host address: /32 or /128.
pub fn host_prefix(ip: IpAddr) -> u8 {
    if ip.is_ipv4() { 32 } else { 128 }
}

/// The steps from `current` to `desired`.
pub fn between(current: &NetState, desired: &NetDesired) -> Vec<Step> {
    let mut steps = Vec::new();
    steps.extend(current.rules.difference(&desired.rules).map(|r| Step::RemoveRule(*r)));
    steps.extend(
        current
            .routes
            .keys()
            .filter(|k| !desired.routes.contains_key(k))
            .map(|(table, v6)| Step::RemoveRoute(*table, *v6)),
    );
    for (ip, (link, prefix)) in &current.addresses {
        let wanted = desired.addresses.get(ip).map(|(l, _)| *l);
        if wanted != Some(*link) || *prefix != host_prefix(*ip) {
            steps.push(Step::RemoveAddress(*ip, *link, *prefix));
        }
    }
    for (ip, (link, name)) in &desired.addresses {
        if current.addresses.get(ip) != Some(&(*link, host_prefix(*ip))) {
            steps.push(Step::AddAddress(*ip, *link, name.clone()));
        }
    }
    if desired.tunnel.is_some() {
        steps.push(Step::Tunnel);
    }
    for (key, hops) in &desired.routes {
        if current.routes.get(key) != Some(hops) {
            steps.push(Step::SetRoute(key.0, key.1, hops.clone()));
        }
    }
    steps.extend(desired.rules.difference(&current.rules).map(|r| Step::AddRule(*r)));
    if desired.tunnel.is_none() {
        steps.push(Step::Tunnel);
    }
    steps
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// What the kernel holds after `steps` (the tunnel device aside).
    fn apply(mut state: NetState, steps: &[Step]) -> NetState {
        for step in steps {
            match step {
                Step::RemoveRule(r) => assert!(state.rules.remove(r), "{r:?} removed but not there"),
                Step::RemoveRoute(t, v6) => assert!(state.routes.remove(&(*t, *v6)).is_some()),
                Step::RemoveAddress(ip, link, prefix) => {
                    assert_eq!(state.addresses.remove(ip), Some((*link, *prefix)), "{ip} removed as it is not")
                }
                Step::AddAddress(ip, link, _) => {
                    assert!(state.addresses.insert(*ip, (*link, host_prefix(*ip))).is_none(), "{ip} added over itself")
                }
                Step::Tunnel => {}
                Step::SetRoute(t, v6, hops) => {
                    state.routes.insert((*t, *v6), hops.clone());
                }
                Step::AddRule(r) => assert!(state.rules.insert(*r), "{r:?} added twice"),
            }
        }
        state
    }

    fn as_state(d: &NetDesired) -> NetState {
        NetState {
            addresses: d.addresses.iter().map(|(ip, (link, _))| (*ip, (*link, host_prefix(*ip)))).collect(),
            routes: d.routes.clone(),
            rules: d.rules.clone(),
        }
    }

    fn ip() -> impl Strategy<Value = IpAddr> {
        prop_oneof![
            (0u8..4).prop_map(|i| IpAddr::from([198, 18, 0, 100 + i])),
            (0u16..4).prop_map(|i| IpAddr::from([0x2001, 0xdb8, 0, 0, 0, 0, 0, 0x100 + i])),
        ]
    }

    fn rule() -> impl Strategy<Value = MarkRule> {
        (any::<bool>(), 0u32..3, 0u32..3).prop_map(|(v6, mark, table)| MarkRule {
            v6,
            mark: (mark + 1) << 16,
            mask: 0x00ff_0000,
            table: 7471 + table,
            priority: 5470,
        })
    }

    fn hops() -> impl Strategy<Value = Vec<NextHop>> {
        prop::collection::vec(
            (0u8..3, 1u32..3, prop::option::of(1u32..3)).prop_map(|(g, link, key)| NextHop {
                gateway: IpAddr::from([198, 18, 1, g]),
                link: if key.is_some() { 0 } else { link },
                key,
            }),
            1..3,
        )
    }

    fn routes() -> impl Strategy<Value = BTreeMap<(u32, bool), Vec<NextHop>>> {
        prop::collection::btree_map((7471u32..7474, any::<bool>()), hops(), 0..4)
    }

    fn desired() -> impl Strategy<Value = NetDesired> {
        (
            prop::collection::btree_map(ip(), (1u32..3).prop_map(|l| (l, format!("eth{l}"))), 0..4),
            routes(),
            prop::collection::btree_set(rule(), 0..4),
            any::<bool>(),
        )
            .prop_map(|(addresses, routes, rules, tunnel)| NetDesired {
                addresses,
                routes,
                rules,
                tunnel: tunnel.then(Default::default),
            })
    }

    fn current() -> impl Strategy<Value = NetState> {
        (
            // Prefix lengths other than a host's: someone changed an owned address.
            prop::collection::btree_map(ip(), (1u32..3, prop_oneof![Just(0u8), Just(24), Just(32), Just(128)]), 0..4),
            routes(),
            prop::collection::btree_set(rule(), 0..4),
        )
            .prop_map(|(addresses, routes, rules)| NetState {
                addresses: addresses
                    .into_iter()
                    .map(|(ip, (link, p))| (ip, (link, if p == 0 { host_prefix(ip) } else { p })))
                    .collect(),
                routes,
                rules,
            })
    }

    proptest! {
        /// The plan makes any owned state the desired one, each step valid where it is
        /// taken (nothing removed that is not there, nothing added twice), touches nothing
        /// already as desired, and from the desired state plans nothing but the tunnel.
        #[test]
        fn the_plan_takes_any_state_to_the_desired_one_and_touches_nothing_correct(
            current in current(),
            desired in desired(),
        ) {
            let steps = between(&current, &desired);
            prop_assert_eq!(apply(current.clone(), &steps), as_state(&desired));
            prop_assert_eq!(steps.iter().filter(|s| **s == Step::Tunnel).count(), 1);
            for step in &steps {
                match step {
                    Step::SetRoute(t, v6, hops) => prop_assert_ne!(current.routes.get(&(*t, *v6)), Some(hops)),
                    Step::AddAddress(ip, link, _) => {
                        prop_assert_ne!(current.addresses.get(ip), Some(&(*link, host_prefix(*ip))))
                    }
                    Step::RemoveAddress(ip, link, prefix) => prop_assert!(
                        desired.addresses.get(ip).map(|(l, _)| *l) != Some(*link) || *prefix != host_prefix(*ip)
                    ),
                    _ => {}
                }
            }
            prop_assert_eq!(between(&as_state(&desired), &desired), vec![Step::Tunnel]);
        }

        /// Removals come before additions of their kind's dependants: every rule, route
        /// and address removal precedes every address addition, the tunnel precedes the
        /// routes when it is wanted, and rules are added last but for the tunnel's removal.
        #[test]
        fn removals_first_then_addresses_tunnel_routes_rules(current in current(), desired in desired()) {
            let steps = between(&current, &desired);
            let rank = |s: &Step| match s {
                Step::RemoveRule(_) => 0,
                Step::RemoveRoute(..) => 1,
                Step::RemoveAddress(..) => 2,
                Step::AddAddress(..) => 3,
                Step::Tunnel if desired.tunnel.is_some() => 4,
                Step::SetRoute(..) => 5,
                Step::AddRule(_) => 6,
                Step::Tunnel => 7,
            };
            let ranks: Vec<u8> = steps.iter().map(rank).collect();
            prop_assert!(ranks.windows(2).all(|w| w[0] <= w[1]), "{:?}", steps);
        }
    }
}
