//! Random static rules and packets for the property tests of [`super::runs`] and
//! [`super::boxes`], and the reference they are checked against: the first rule that
//! matches decides.

use std::net::IpAddr;

use ipnet::IpNet;
use proptest::prelude::*;

use super::runs::StaticRule;
use crate::view::policy::{Action, Protocol};

/// The first rule of `rules` that a packet to `dst` (with its protocol and destination
/// port, when it has one) matches.
pub(super) fn first_match(rules: &[StaticRule], dst: IpAddr, port: Option<(Protocol, u16)>) -> Option<&StaticRule> {
    rules.iter().find(|r| {
        r.targets.iter().any(|n| n.contains(&dst)) && (r.ports.is_empty() || port.is_some_and(|p| r.ports.contains(&p)))
    })
}

/// Destinations that nest and overlap: prefixes of two /24s, wide IPv4 prefixes (/0–/24
/// around x.51.100.0), the IPv4 and IPv6 default routes, IPv6 prefixes of a /112.
pub(super) fn net() -> impl Strategy<Value = IpNet> {
    prop_oneof![
        (0u32..16, 24u8..=32)
            .prop_map(|(x, len)| IpNet::new(IpAddr::from([192, 0, 2, (x * 16) as u8]), len).unwrap().trunc()),
        (0u8..=255, 20u8..=32).prop_map(|(x, len)| IpNet::new(IpAddr::from([198, 51, 100, x]), len).unwrap().trunc()),
        (0u8..=255, 0u8..=24).prop_map(|(x, len)| IpNet::new(IpAddr::from([x, 51, 100, 0]), len).unwrap().trunc()),
        Just("0.0.0.0/0".parse().unwrap()),
        (0u16..64, 112u8..=128).prop_map(|(x, len)| IpNet::new(
            IpAddr::from([0x2001, 0xdb8, 0, 0, 0, 0, 0, x * 4]),
            len
        )
        .unwrap()
        .trunc()),
        Just("::/0".parse().unwrap()),
    ]
}

/// A protocol and port of three each.
pub(super) fn port() -> impl Strategy<Value = (Protocol, u16)> {
    (
        prop_oneof![Just(Protocol::Tcp), Just(Protocol::Udp), Just(Protocol::Sctp)],
        prop_oneof![Just(53u16), Just(80), Just(443)],
    )
}

/// Up to `max` rules of random action, up to three destinations and up to two ports.
pub(super) fn rules(max: usize) -> impl Strategy<Value = Vec<StaticRule>> {
    prop::collection::vec(
        (
            prop_oneof![Just(Action::Allow), Just(Action::Deny)],
            prop::collection::btree_set(net(), 0..4),
            prop::collection::btree_set(port(), 0..3),
        ),
        0..max,
    )
    .prop_map(|v| {
        v.into_iter()
            .enumerate()
            .map(|(index, (action, targets, ports))| StaticRule {
                index,
                action,
                targets,
                ports: ports.into_iter().collect(),
            })
            .collect()
    })
}

/// A packet's destination (in and around the rules' destinations) and its protocol and
/// port, or none (a packet without a port).
pub(super) fn packet() -> impl Strategy<Value = (IpAddr, Option<(Protocol, u16)>)> {
    let v4 = (0u8..=255, prop_oneof![Just([192u8, 0, 2]), Just([198, 51, 100]), Just([203, 0, 113])])
        .prop_map(|(x, p)| IpAddr::from([p[0], p[1], p[2], x]));
    let v4_wide = (0u8..=255, 0u8..=255).prop_map(|(a, b)| IpAddr::from([a, 51, 100, b]));
    let v6 = (0u16..300).prop_map(|x| IpAddr::from([0x2001, 0xdb8, 0, 0, 0, 0, 0, x]));
    (prop_oneof![v4, v4_wide, v6], prop::option::of(port()))
}
