//! EgressQoS → nft: DSCP marks on local pods' traffic.
//!
//! * `qos` (forward, priority mangle; only while some EgressQoS exists): `ip saddr vmap @qos-pods-v4` /
//!   `ip6 saddr vmap @qos-pods-v6` → `jump qos-<namespace>` for pods of this node in a
//!   namespace with an EgressQoS. Cost per packet: one map lookup, whatever the number
//!   of namespaces.
//! * `qos-<namespace>`: one rule per EgressQoS rule and family, in order; the first match sets
//!   the DSCP and returns, so later rules never override it; no match leaves it as is.
//!   A rule with a `podSelector` matches `ip saddr @qos-<namespace>-<i>-v4` (and `-v6`),
//!   named sets of the selected local pods, so pod and label changes touch elements only.
//! * Every destination is marked, in-cluster ones included (the reference marks pod↔pod
//!   traffic too). Pods on one bridge reach each other without the forward hook unless
//!   `br_netfilter` is on: such traffic is then not marked.

use std::collections::BTreeMap;
use std::net::IpAddr;

use super::{NodeConfig, ObjectStatus, Outcome};
use crate::nft::rule::{AddrField, Family, Match, Rule, Statement, Verdict};
use crate::nft::{Chain, Hook, Key, KeyType, Set, Table, Value, chain_name};
use crate::view::policy::QosRule;
use crate::view::{ClusterView, PodInfo};

/// The forward-hook base chain that marks.
pub const QOS_CHAIN: &str = "qos";
const PODS_V4: &str = "qos-pods-v4";
const PODS_V6: &str = "qos-pods-v6";

fn rule_statements(index: usize, rule: &QosRule, pod_sets: Option<(&str, &str)>) -> Vec<Rule> {
    let mut out = Vec::new();
    for family in [Family::V4, Family::V6] {
        let v4 = family == Family::V4;
        let mut r = Rule::new().when(Match::Nfproto(family));
        if let Some((s4, s6)) = pod_sets {
            r = r.when(Match::saddr_in(family, if v4 { s4 } else { s6 }));
        }
        match rule.dst {
            Some(net) if net.addr().is_ipv4() != v4 => continue,
            Some(net) => r = r.when(Match::Addr { family, field: AddrField::Daddr, net }),
            None => {}
        }
        out.push(
            r.then(Statement::Dscp(family, rule.dscp))
                .then(Statement::Counter)
                .verdict(Verdict::Return)
                .comment(compact_str::format_compact!("egress[{index}]")),
        );
    }
    out
}

pub(super) fn compile(
    view: &ClusterView,
    node: &NodeConfig,
    owners: &crate::view::Owners,
    table: &mut Table,
    statuses: &mut Vec<ObjectStatus>,
) {
    // No EgressQoS, no hook: packets pay nothing for an empty policy.
    if view.qos.is_empty() {
        return;
    }
    let mut pods_v4 = Set::verdict_map(KeyType::Ipv4);
    let mut pods_v6 = Set::verdict_map(KeyType::Ipv6);
    let mut local: BTreeMap<&str, Vec<(IpAddr, &PodInfo)>> = BTreeMap::new();
    for (ip, pod) in owners {
        if node.is_local(pod) {
            local.entry(pod.namespace.as_str()).or_default().push((*ip, pod));
        }
    }

    for (namespace, entry) in &view.qos {
        if let (Some(policy), Some(pods)) = (&entry.policy, local.get(namespace.as_str())) {
            let name = chain_name("qos", namespace);
            let mut rules = Vec::new();
            for (i, rule) in policy.rules.iter().enumerate() {
                let sets = rule.pods.as_ref().map(|selector| {
                    let (s4, s6) = (format!("{name}-{i}-v4"), format!("{name}-{i}-v6"));
                    let mut set4 = Set::new(KeyType::Ipv4, false);
                    let mut set6 = Set::new(KeyType::Ipv6, false);
                    for (ip, _) in pods.iter().filter(|(_, p)| selector.matches(&p.labels)) {
                        let set = if ip.is_ipv4() { &mut set4 } else { &mut set6 };
                        set.elements.insert(Key::Addr(*ip), Value::None);
                    }
                    table.sets.insert(s4.as_str().into(), set4);
                    table.sets.insert(s6.as_str().into(), set6);
                    (s4, s6)
                });
                rules.extend(rule_statements(i, rule, sets.as_ref().map(|(a, b)| (a.as_str(), b.as_str()))));
            }
            for (ip, _) in pods {
                let map = if ip.is_ipv4() { &mut pods_v4 } else { &mut pods_v6 };
                map.elements.insert(Key::Addr(*ip), Value::Jump(name.as_str().into()));
            }
            table.chains.insert(name.into(), Chain::regular(rules));
        }
        let outcome = entry.error.clone().map_or(Outcome::Applied, Outcome::Failed);
        statuses.push(ObjectStatus::new(entry.key.clone(), &node.node_name, outcome));
    }

    table.sets.insert(PODS_V4.into(), pods_v4);
    table.sets.insert(PODS_V6.into(), pods_v6);
    table.chains.insert(
        QOS_CHAIN.into(),
        Chain::base(
            Hook { chain_type: "filter", hook: "forward", priority: "mangle" },
            [(Family::V4, PODS_V4), (Family::V6, PODS_V6)].map(|(family, map)| {
                Rule::new().verdict(Verdict::Map { family, field: AddrField::Saddr, map: map.into() })
            }),
        ),
    );
}
