//! EgressIP placement: which node hosts each egress IP (`status.items`), decided by the
//! leader as the reference's cluster manager does, and the health checks that let it
//! move an IP off a node that died.
//!
//! * [`plan`] (pure): the desired items of every EgressIP and the Events to record.
//! * [`health`]: the endpoint every agent serves (`--egress-ip-health-port`) and the
//!   leader's prober.
//! * [`controller`]: the task — every agent publishes its links' subnets on its Node
//!   (or its pod, which [`relay`] copies onto the Node); the leader probes, plans and
//!   writes `status.items`.

pub mod allocators;
pub mod cloud;
pub mod controller;
pub mod health;
pub mod relay;

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use ipnet::IpNet;

use crate::net::tunnel_key;
use crate::view::{EGRESS_ASSIGNABLE_LABEL, NodeInfo};

/// What the leader knows of one node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// Its addresses (no egress IP may equal one).
    pub addresses: Vec<IpAddr>,
    /// The subnets its egressd published (an IP it may host lies in one of them).
    pub subnets: Vec<IpNet>,
    /// Labelled `k8s.ovn.org/egress-assignable` and Ready.
    pub labelled_ready: bool,
    /// What the leader's probe says.
    pub reach: Reach,
    /// How many egress IPs the cloud lets it hold (its cloud controller's
    /// `cloud.network.openshift.io/egress-ipconfig`; `None`: no limit).
    pub capacity: Option<Capacity>,
}

/// A node's slots for egress IPs, as its cloud controller publishes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Capacity {
    /// IPv4 egress IPs.
    pub ipv4: Option<u32>,
    /// IPv6 egress IPs.
    pub ipv6: Option<u32>,
    /// Both families together.
    pub any: Option<u32>,
}

impl Capacity {
    /// Room for one more of `ip`'s family, holding `v4` and `v6` now.
    fn room(&self, ip: IpAddr, v4: u32, v6: u32) -> bool {
        let family = if ip.is_ipv6() { self.ipv6.is_none_or(|c| v6 < c) } else { self.ipv4.is_none_or(|c| v4 < c) };
        family && self.any.is_none_or(|c| v4 + v6 < c)
    }
}

/// The leader's probe verdict on a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reach {
    /// Not probed yet (a new leader): existing placements stay, nothing new goes there.
    Unknown,
    /// The last probe was answered.
    Up,
    /// `--egress-ip-probe-misses` probes in a row went unanswered.
    Down,
}

impl Candidate {
    /// From the view's node and the probe verdict.
    /// A cloud controller's annotation, where there is one, gives the subnets (the
    /// cloud's rule: an egress IP lies in the subnet of the node's interface) and the
    /// capacity.
    pub fn new(node: &NodeInfo, reach: Reach) -> Self {
        let (subnets, capacity) = match &node.cloud_ipconfig {
            Some(c) => (c.subnets.clone(), Some(Capacity { ipv4: c.ipv4, ipv6: c.ipv6, any: c.any })),
            None => (node.egress_subnets.clone(), None),
        };
        Self {
            addresses: node.addresses.clone(),
            subnets,
            labelled_ready: node.ready && node.labels.contains_key(EGRESS_ASSIGNABLE_LABEL),
            reach,
            capacity,
        }
    }

    /// May host a new egress IP.
    fn assignable(&self) -> bool {
        self.labelled_ready && self.reach == Reach::Up
    }

    /// May keep the egress IPs it hosts (a new leader has not probed it yet).
    fn keeps(&self) -> bool {
        self.labelled_ready && self.reach != Reach::Down
    }

    fn can_host(&self, ip: IpAddr) -> bool {
        self.subnets.iter().any(|n| n.contains(&ip))
    }

    /// May keep hosting `ip`: nothing published yet (an agent that has not read its
    /// links, or an older one) counts as able, so a new leader never drops items only
    /// because the annotations are not there yet.
    fn may_keep(&self, ip: IpAddr) -> bool {
        self.keeps() && (self.subnets.is_empty() || self.can_host(ip))
    }
}

/// One EgressIP as the planner sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// Object name.
    pub name: String,
    /// `spec.egressIPs`, in order, parsed.
    pub ips: Vec<IpAddr>,
    /// `status.items` now: (IP, node).
    pub items: Vec<(IpAddr, String)>,
}

/// An Event the leader records on an EgressIP (reasons and wording of the reference's
/// cluster manager).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct PlacementEvent {
    /// The EgressIP.
    pub name: String,
    /// `NoMatchingNodeFound`, `UnassignedRequest`, `UnsupportedRequest`,
    /// `EgressIPConflict`.
    pub reason: &'static str,
    /// The message.
    pub message: String,
}

/// The planner's answer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Placement {
    /// Desired `status.items` of every request, by name, in `spec.egressIPs` order.
    pub items: BTreeMap<String, Vec<(IpAddr, String)>>,
    /// Events to record.
    pub events: Vec<PlacementEvent>,
}

fn event(name: &str, reason: &'static str, message: String) -> PlacementEvent {
    PlacementEvent { name: name.to_string(), reason, message }
}

/// Place every egress IP. `requests` come oldest first (the order in which EgressIPs
/// claim IPs, as on the node side). Rules, as the reference's cluster manager:
/// * an existing item stays while its node may keep it (labelled, Ready, not found dead
///   by the probe), its subnet still holds the IP, the IP is still listed and claimed by
///   this EgressIP, and is no node's address — no churn, no move back on recovery;
/// * at most one IP of an EgressIP per node (across families);
/// * a new IP goes to the least loaded assignable node (fewest egress IPs in all, then
///   by name) whose subnets contain it and that hosts no IP of its family with the same
///   tunnel key ([`crate::net::tunnel_key`]: the key names the IP on its node), and that
///   has room for one more of its family (the cloud's [`Capacity`], where a cloud
///   controller publishes one; IPs kept count, and stay even above it);
/// * an IP equal to a node address is never placed (`EgressIPConflict`), nor an IP an
///   older EgressIP lists (`UnsupportedRequest`).
pub fn plan(requests: &[Request], nodes: &BTreeMap<String, Candidate>) -> Placement {
    plan_with(requests, nodes, &BTreeMap::new())
}

/// [`plan`], with the addresses neighbouring allocators hold ([`allocators`]): such an IP
/// is neither placed nor kept (`EgressIPConflict`, naming the holder).
pub fn plan_with(
    requests: &[Request],
    nodes: &BTreeMap<String, Candidate>,
    held: &BTreeMap<IpAddr, String>,
) -> Placement {
    let node_of_addr: BTreeMap<IpAddr, &str> =
        nodes.iter().flat_map(|(n, c)| c.addresses.iter().map(move |a| (*a, n.as_str()))).collect();
    // Who may use each IP: the oldest EgressIP listing it.
    let mut claimant: BTreeMap<IpAddr, &str> = BTreeMap::new();
    for r in requests {
        for ip in &r.ips {
            claimant.entry(*ip).or_insert(r.name.as_str());
        }
    }
    // Pass 1: what stays.
    let (mut placed, mut load) = kept(requests, nodes, held, &claimant, &node_of_addr);
    // Every placed IP's tunnel key per node (see `crate::net::tunnel_key`).
    let mut placed_keys: BTreeSet<(&str, bool, u32)> =
        placed.values().flat_map(|m| m.iter().map(|(ip, n)| (*n, ip.is_ipv6(), tunnel_key(*ip)))).collect();
    // Egress IPs per node and family (against the cloud's capacity; kept ones count,
    // and are kept even above it).
    let mut held_by: BTreeMap<(&str, bool), u32> = BTreeMap::new();
    for m in placed.values() {
        for (ip, n) in m {
            *held_by.entry((*n, ip.is_ipv6())).or_default() += 1;
        }
    }
    // Pass 2: the IPs without a node.
    let assignable: Vec<&str> = nodes.iter().filter(|(_, c)| c.assignable()).map(|(n, _)| n.as_str()).collect();
    let mut events = Vec::new();
    let mut out = BTreeMap::new();
    for r in requests {
        let mut mine = placed.remove(r.name.as_str()).unwrap_or_default();
        let missing: Vec<IpAddr> = r.ips.iter().copied().filter(|ip| !mine.contains_key(ip)).collect();
        if !missing.is_empty() && assignable.is_empty() {
            events.push(event(
                &r.name,
                "NoMatchingNodeFound",
                format!(
                    "no assignable nodes for EgressIP: {}, please tag at least one node with label: {EGRESS_ASSIGNABLE_LABEL}",
                    r.name
                ),
            ));
        } else {
            for ip in missing {
                if let Some((reason, message)) = conflict(r, ip, requests, &claimant, &node_of_addr, held) {
                    events.push(event(&r.name, reason, message));
                    continue;
                }
                let used: BTreeSet<&str> = mine.values().copied().collect();
                // Never two IPs with one tunnel key on a node: the key names the IP there
                // (`placed_keys` holds what stays and what this pass placed so far).
                let key_taken = |n: &str| placed_keys.contains(&(n, ip.is_ipv6(), tunnel_key(ip)));
                let room = |n: &str| {
                    let count = |v6: bool| held_by.get(&(n, v6)).copied().unwrap_or(0);
                    nodes[n].capacity.is_none_or(|c| c.room(ip, count(false), count(true)))
                };
                let best = assignable
                    .iter()
                    .filter(|n| !used.contains(**n) && nodes[**n].can_host(ip) && !key_taken(n) && room(n))
                    .min_by_key(|n| (load.get(**n).copied().unwrap_or(0), **n));
                if let Some(n) = best {
                    mine.insert(ip, n);
                    placed_keys.insert((n, ip.is_ipv6(), tunnel_key(ip)));
                    *held_by.entry((n, ip.is_ipv6())).or_default() += 1;
                    *load.entry(n).or_default() += 1;
                }
            }
            events.extend(shortfall(r, mine.len()));
        }
        let items = r.ips.iter().filter_map(|ip| mine.get(ip).map(|n| (*ip, n.to_string()))).collect();
        out.insert(r.name.clone(), items);
    }
    Placement { items: out, events }
}

/// Pass 1 of [`plan_with`]: the items that stay where they are (still listed, claimed
/// by this EgressIP, no node's or allocator's address, on a node that may keep it, one
/// per node), by EgressIP; and how many each node keeps.
#[allow(clippy::type_complexity)]
fn kept<'a>(
    requests: &'a [Request],
    nodes: &BTreeMap<String, Candidate>,
    held: &BTreeMap<IpAddr, String>,
    claimant: &BTreeMap<IpAddr, &str>,
    node_of_addr: &BTreeMap<IpAddr, &str>,
) -> (BTreeMap<&'a str, BTreeMap<IpAddr, &'a str>>, BTreeMap<&'a str, usize>) {
    let mut load: BTreeMap<&str, usize> = BTreeMap::new();
    let mut placed: BTreeMap<&str, BTreeMap<IpAddr, &str>> = BTreeMap::new();
    for r in requests {
        let mine = placed.entry(r.name.as_str()).or_default();
        let mut used: BTreeSet<&str> = BTreeSet::new();
        for (ip, node) in &r.items {
            let keep = r.ips.contains(ip)
                && claimant.get(ip) == Some(&r.name.as_str())
                && !node_of_addr.contains_key(ip)
                && !held.contains_key(ip)
                && !mine.contains_key(ip)
                && nodes.get(node).is_some_and(|c| c.may_keep(*ip))
                && used.insert(node.as_str());
            if keep {
                mine.insert(*ip, node.as_str());
                *load.entry(node.as_str()).or_default() += 1;
            }
        }
    }
    (placed, load)
}

/// The event when `r` got fewer of its IPs placed (`placed`) than it lists: none at
/// all, or not all.
fn shortfall(r: &Request, placed: usize) -> Option<PlacementEvent> {
    if !r.ips.is_empty() && placed == 0 {
        let list: Vec<String> = r.ips.iter().map(ToString::to_string).collect();
        return Some(event(
            &r.name,
            "NoMatchingNodeFound",
            format!(
                "No matching nodes found, which can host any of the egress IPs: [{}] for object EgressIP: {}",
                list.join(" "),
                r.name
            ),
        ));
    }
    (placed < r.ips.len()).then(|| {
        event(
            &r.name,
            "UnassignedRequest",
            format!("Not all egress IPs for EgressIP: {} could be assigned, please tag more nodes", r.name),
        )
    })
}

/// Why `ip` of `r` cannot be placed at all: a node's own address, an address a
/// neighbouring allocator holds, or the IP of an older EgressIP (`claimant`); the
/// reference's reason and message.
fn conflict(
    r: &Request,
    ip: IpAddr,
    requests: &[Request],
    claimant: &BTreeMap<IpAddr, &str>,
    node_of_addr: &BTreeMap<IpAddr, &str>,
    held: &BTreeMap<IpAddr, String>,
) -> Option<(&'static str, String)> {
    if let Some(node) = node_of_addr.get(&ip) {
        return Some((
            "EgressIPConflict",
            format!(
                "Egress IP {} with IP {ip} is conflicting with a host ({node}) IP address and will not be assigned",
                r.name
            ),
        ));
    }
    if let Some(holder) = held.get(&ip) {
        return Some((
            "EgressIPConflict",
            format!(
                "Egress IP {} with IP {ip} is conflicting with an address allocated by {holder} and will not be assigned",
                r.name
            ),
        ));
    }
    let other = claimant.get(&ip).filter(|c| **c != r.name)?;
    let on = requests
        .iter()
        .find(|o| o.name == *other)
        .and_then(|o| o.items.iter().find(|(i, _)| *i == ip))
        .map_or("no node", |(_, n)| n.as_str());
    Some((
        "UnsupportedRequest",
        format!("IP: \"{ip}\" for EgressIP: {} is already allocated for EgressIP: {other} on {on}", r.name),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn node(addr: &str, subnets: &[&str], labelled_ready: bool, reach: Reach) -> Candidate {
        Candidate {
            addresses: vec![ip(addr)],
            subnets: subnets.iter().map(|s| s.parse().unwrap()).collect(),
            labelled_ready,
            reach,
            capacity: None,
        }
    }

    /// a, b, c on 198.19.0.0/24 and 2001:db8::/64, all eligible.
    fn three() -> BTreeMap<String, Candidate> {
        let sub = ["198.19.0.0/24", "2001:db8::/64"];
        BTreeMap::from([
            ("a".to_string(), node("198.19.0.1", &sub, true, Reach::Up)),
            ("b".to_string(), node("198.19.0.2", &sub, true, Reach::Up)),
            ("c".to_string(), node("198.19.0.3", &sub, true, Reach::Up)),
        ])
    }

    fn req(name: &str, ips: &[&str], items: &[(&str, &str)]) -> Request {
        Request {
            name: name.into(),
            ips: ips.iter().map(|s| ip(s)).collect(),
            items: items.iter().map(|(i, n)| (ip(i), n.to_string())).collect(),
        }
    }

    fn items(p: &Placement, name: &str) -> Vec<(String, String)> {
        p.items[name].iter().map(|(i, n)| (i.to_string(), n.clone())).collect()
    }

    fn reasons(p: &Placement) -> Vec<&'static str> {
        p.events.iter().map(|e| e.reason).collect()
    }

    #[test]
    fn new_ips_spread_least_loaded_first_one_per_node_across_families() {
        let r = [req("e1", &["198.19.0.100", "2001:db8::100", "198.19.0.101"], &[]), req("e2", &["198.19.0.102"], &[])];
        let p = plan(&r, &three());
        let e1 = items(&p, "e1");
        let nodes: BTreeSet<&str> = e1.iter().map(|(_, n)| n.as_str()).collect();
        assert_eq!(nodes.len(), 3, "one IP of e1 per node, IPv6 included: {e1:?}");
        // Every node has one; e2 goes to the least loaded by name: a.
        assert_eq!(items(&p, "e2"), vec![("198.19.0.102".into(), "a".into())]);
        assert!(p.events.is_empty(), "{:?}", p.events);
    }

    #[test]
    fn existing_items_stay_and_are_not_moved_back_on_recovery() {
        let mut nodes = three();
        // All on b (loaded) — stays there while b is fine, though a and c are empty.
        let r = [
            req("e1", &["198.19.0.100"], &[("198.19.0.100", "b")]),
            req("e2", &["198.19.0.101"], &[("198.19.0.101", "b")]),
        ];
        let p = plan(&r, &nodes);
        assert_eq!(items(&p, "e1"), vec![("198.19.0.100".into(), "b".into())]);
        assert_eq!(items(&p, "e2"), vec![("198.19.0.101".into(), "b".into())]);
        // b dies: both move, to different nodes (least loaded first).
        nodes.get_mut("b").unwrap().reach = Reach::Down;
        let p = plan(&r, &nodes);
        assert_eq!(items(&p, "e1"), vec![("198.19.0.100".into(), "a".into())]);
        assert_eq!(items(&p, "e2"), vec![("198.19.0.101".into(), "c".into())]);
        // b comes back: what moved stays.
        nodes.get_mut("b").unwrap().reach = Reach::Up;
        let moved = [
            req("e1", &["198.19.0.100"], &[("198.19.0.100", "a")]),
            req("e2", &["198.19.0.101"], &[("198.19.0.101", "c")]),
        ];
        assert_eq!(plan(&moved, &nodes).items, p.items);
    }

    #[test]
    fn a_node_loses_its_ips_when_unlabelled_not_ready_deleted_or_its_subnet_goes() {
        let r = [req("e1", &["198.19.0.100"], &[("198.19.0.100", "b")])];
        type Change = Box<dyn Fn(&mut BTreeMap<String, Candidate>)>;
        let cases: Vec<(&str, Change)> = vec![
            ("label removed / NotReady", Box::new(|n| n.get_mut("b").unwrap().labelled_ready = false)),
            ("deleted", Box::new(|n| drop(n.remove("b")))),
            ("subnet gone", Box::new(|n| n.get_mut("b").unwrap().subnets = vec!["198.51.100.0/24".parse().unwrap()])),
        ];
        for (what, change) in cases {
            let mut nodes = three();
            change(&mut nodes);
            assert_eq!(items(&plan(&r, &nodes), "e1"), vec![("198.19.0.100".into(), "a".into())], "{what}");
        }
    }

    #[test]
    fn a_new_leader_keeps_unprobed_placements_but_places_only_on_answering_nodes() {
        let mut nodes = three();
        for c in nodes.values_mut() {
            c.reach = Reach::Unknown;
        }
        // Not yet published subnets count as unknown too: kept.
        nodes.get_mut("c").unwrap().subnets.clear();
        let r = [req("e1", &["198.19.0.100"], &[("198.19.0.100", "c")]), req("e2", &["198.19.0.101"], &[])];
        let p = plan(&r, &nodes);
        assert_eq!(items(&p, "e1"), vec![("198.19.0.100".into(), "c".into())]);
        assert!(items(&p, "e2").is_empty());
        assert_eq!(reasons(&p), vec!["NoMatchingNodeFound"]);
        assert!(p.events[0].message.starts_with("no assignable nodes for EgressIP: e2, please tag"), "{:?}", p.events);
    }

    #[test]
    fn an_ip_dropped_from_the_spec_loses_its_item() {
        let r = [req("e1", &["198.19.0.101"], &[("198.19.0.100", "a"), ("198.19.0.101", "b")])];
        assert_eq!(items(&plan(&r, &three()), "e1"), vec![("198.19.0.101".into(), "b".into())]);
    }

    #[test]
    fn conflicts_produce_the_references_events() {
        let nodes = three();
        // A node's own address.
        let p = plan(&[req("e1", &["198.19.0.2", "198.19.0.100"], &[])], &nodes);
        assert_eq!(reasons(&p), vec!["EgressIPConflict", "UnassignedRequest"]);
        assert_eq!(
            p.events[0].message,
            "Egress IP e1 with IP 198.19.0.2 is conflicting with a host (b) IP address and will not be assigned"
        );
        assert_eq!(p.events[1].message, "Not all egress IPs for EgressIP: e1 could be assigned, please tag more nodes");
        // The same IP in an older EgressIP.
        let p = plan(
            &[
                req("old", &["198.19.0.100"], &[("198.19.0.100", "a")]),
                req("new", &["198.19.0.100"], &[("198.19.0.100", "b")]),
            ],
            &nodes,
        );
        assert!(items(&p, "new").is_empty(), "the younger loses its item");
        assert_eq!(items(&p, "old"), vec![("198.19.0.100".into(), "a".into())]);
        assert_eq!(reasons(&p), vec!["UnsupportedRequest", "NoMatchingNodeFound"]);
        assert_eq!(
            p.events[0].message,
            "IP: \"198.19.0.100\" for EgressIP: new is already allocated for EgressIP: old on a"
        );
        assert_eq!(
            p.events[1].message,
            "No matching nodes found, which can host any of the egress IPs: [198.19.0.100] for object EgressIP: new"
        );
        // No subnet holds it.
        let p = plan(&[req("e1", &["203.0.113.9"], &[])], &nodes);
        assert_eq!(reasons(&p), vec!["NoMatchingNodeFound"]);
        // More IPs than nodes: one per node, the rest unassigned.
        let p = plan(&[req("e1", &["198.19.0.100", "198.19.0.101", "198.19.0.102", "198.19.0.103"], &[])], &nodes);
        assert_eq!(p.items["e1"].len(), 3);
        assert_eq!(reasons(&p), vec!["UnassignedRequest"]);
    }

    /// Planning twice gives the same answer (the leader's writes converge), and a plan
    /// fed back as the current items is kept as is — for random clusters.
    #[test]
    fn an_address_another_allocator_holds_is_neither_placed_nor_kept() {
        let held: BTreeMap<IpAddr, String> =
            [(ip("198.19.0.100"), "IPPool kube-system/pool (pod team/web-0)".to_string())].into();
        let r = req("e1", &["198.19.0.100", "198.19.0.101"], &[("198.19.0.100", "b")]);
        let p = plan_with(&[r], &three(), &held);
        let placed = items(&p, "e1");
        assert!(placed.iter().all(|(i, _)| i != "198.19.0.100"), "{placed:?}");
        assert_eq!(placed.len(), 1);
        assert_eq!(reasons(&p), vec!["EgressIPConflict", "UnassignedRequest"]);
        assert!(
            p.events[0].message.contains("allocated by IPPool kube-system/pool (pod team/web-0)"),
            "{:?}",
            p.events
        );
        // Released by the allocator: placed again.
        let r = req("e1", &["198.19.0.100", "198.19.0.101"], &[]);
        assert_eq!(items(&plan_with(&[r], &three(), &BTreeMap::new()), "e1").len(), 2);
    }

    #[test]
    fn two_ips_with_one_tunnel_key_never_share_a_node() {
        // 198.19.0.100 and 199.19.0.100 share their low 24 bits (the tunnel key).
        let sub = ["198.19.0.0/24", "199.19.0.0/24"];
        let nodes = BTreeMap::from([
            ("a".to_string(), node("198.19.0.1", &sub, true, Reach::Up)),
            ("b".to_string(), node("198.19.0.2", &sub, true, Reach::Up)),
        ]);
        let p =
            plan(&[req("e1", &["198.19.0.100"], &[("198.19.0.100", "a")]), req("e2", &["199.19.0.100"], &[])], &nodes);
        assert_eq!(items(&p, "e2"), vec![("199.19.0.100".to_string(), "b".to_string())], "not next to its twin on a");
        let only_a = BTreeMap::from([("a".to_string(), node("198.19.0.1", &sub, true, Reach::Up))]);
        let p =
            plan(&[req("e1", &["198.19.0.100"], &[("198.19.0.100", "a")]), req("e2", &["199.19.0.100"], &[])], &only_a);
        assert!(items(&p, "e2").is_empty());
        assert_eq!(reasons(&p), vec!["NoMatchingNodeFound"]);
    }

    #[test]
    fn a_cloud_nodes_capacity_and_subnet_bound_what_it_gets_and_kept_ips_stay_above_it() {
        let mut nodes = three();
        let cap = |ipv4, ipv6, any| Some(Capacity { ipv4, ipv6, any });
        nodes.get_mut("a").unwrap().capacity = cap(Some(1), Some(0), None);
        nodes.get_mut("b").unwrap().capacity = cap(Some(1), Some(1), None);
        nodes.get_mut("c").unwrap().capacity = cap(None, None, Some(1));
        // e1 keeps .100 on a; e2's two IPv4 go to b and c (a is full), its IPv6 nowhere:
        // a has no IPv6 slot and b and c have one of e2's IPs each.
        let r = [
            req("e1", &["198.19.0.100"], &[("198.19.0.100", "a")]),
            req("e2", &["198.19.0.101", "198.19.0.102", "2001:db8::100"], &[]),
        ];
        let p = plan(&r, &nodes);
        assert_eq!(items(&p, "e1"), vec![("198.19.0.100".into(), "a".into())]);
        let e2 = items(&p, "e2");
        assert_eq!(e2.len(), 2, "{e2:?}");
        assert!(e2.iter().all(|(_, n)| n != "a"), "a is full: {e2:?}");
        assert_eq!(reasons(&p), vec!["UnassignedRequest"]);
        // Every node full: nothing placed, NoMatchingNodeFound; a kept IP stays above the
        // capacity (a limit lowered later does not move it).
        for c in nodes.values_mut() {
            c.capacity = cap(Some(0), Some(0), None);
        }
        let r = [req("e1", &["198.19.0.100"], &[("198.19.0.100", "a")]), req("e3", &["198.19.0.103"], &[])];
        let p = plan(&r, &nodes);
        assert_eq!(items(&p, "e1"), vec![("198.19.0.100".into(), "a".into())]);
        assert!(items(&p, "e3").is_empty());
        assert_eq!(reasons(&p), vec!["NoMatchingNodeFound"]);
    }

    #[test]
    fn the_cloud_annotation_gives_subnets_and_capacity() {
        let mut info = NodeInfo { ready: true, ..Default::default() };
        info.labels.insert(EGRESS_ASSIGNABLE_LABEL.into(), String::new());
        info.egress_subnets = vec!["198.51.100.0/24".parse().unwrap()];
        info.cloud_ipconfig = crate::view::CloudIpConfig::parse(
            r#"[{"interface":"eni-1","ifaddr":{"ipv4":"198.19.0.0/24","ipv6":"2001:db8::/64"},"capacity":{"ipv4":14,"ipv6":15}}]"#,
        );
        let c = Candidate::new(&info, Reach::Up);
        assert_eq!(c.subnets, vec!["198.19.0.0/24".parse::<IpNet>().unwrap(), "2001:db8::/64".parse().unwrap()]);
        assert_eq!(c.capacity, Some(Capacity { ipv4: Some(14), ipv6: Some(15), any: None }));
        // GCP and Azure count both families together.
        info.cloud_ipconfig = crate::view::CloudIpConfig::parse(
            r#"[{"interface":"nic0","ifaddr":{"ipv4":"198.19.0.0/24"},"capacity":{"ip":9}}]"#,
        );
        assert_eq!(Candidate::new(&info, Reach::Up).capacity, Some(Capacity { ipv4: None, ipv6: None, any: Some(9) }));
        info.cloud_ipconfig = crate::view::CloudIpConfig::parse("not json");
        assert_eq!(Candidate::new(&info, Reach::Up).subnets, vec!["198.51.100.0/24".parse::<IpNet>().unwrap()]);
    }

    #[test]
    fn plans_are_stable_fixed_points() {
        use proptest::prelude::*;
        let strategy = (
            proptest::collection::vec((any::<bool>(), 0u8..3, any::<bool>()), 1..6),
            proptest::collection::vec(proptest::collection::vec((0u8..8, 0u8..7), 0..4), 1..5),
        );
        proptest!(ProptestConfig::with_cases(256), |((nodes_def, eips) in strategy)| {
            let nodes: BTreeMap<String, Candidate> = nodes_def
                .iter()
                .enumerate()
                .map(|(i, (ok, reach, v6))| {
                    let reach = [Reach::Up, Reach::Down, Reach::Unknown][usize::from(*reach)];
                    let mut subnets = vec!["198.19.0.0/24"];
                    if *v6 { subnets.push("2001:db8::/64"); }
                    (format!("n{i}"), node(&format!("198.19.0.{}", i + 1), &subnets, *ok, reach))
                })
                .collect();
            let requests: Vec<Request> = eips
                .iter()
                .enumerate()
                .map(|(k, list)| {
                    let ips: Vec<IpAddr> = list
                        .iter()
                        .map(|(x, _)| if x % 2 == 0 { ip(&format!("198.19.0.{}", 100 + x)) } else { ip(&format!("2001:db8::{x}")) })
                        .collect::<BTreeSet<_>>().into_iter().collect();
                    let items = list.iter().filter(|(_, n)| usize::from(*n) < nodes.len())
                        .map(|(x, n)| (if x % 2 == 0 { ip(&format!("198.19.0.{}", 100 + x)) } else { ip(&format!("2001:db8::{x}")) }, format!("n{n}")))
                        .collect();
                    Request { name: format!("e{k}"), ips, items }
                })
                .collect();
            let first = plan(&requests, &nodes);
            // Invariants: one IP per node per EgressIP, each IP at most once, only on nodes that may hold it.
            let mut all = BTreeSet::new();
            for (name, items) in &first.items {
                let ns: BTreeSet<&String> = items.iter().map(|(_, n)| n).collect();
                prop_assert_eq!(ns.len(), items.len(), "{} has two IPs on one node", name);
                for (i, n) in items {
                    prop_assert!(all.insert(*i), "{} placed twice", i);
                    prop_assert!(nodes[n].may_keep(*i));
                }
            }
            let fed: Vec<Request> = requests
                .iter()
                .map(|r| Request { items: first.items[&r.name].clone(), ..r.clone() })
                .collect();
            let second = plan(&fed, &nodes);
            prop_assert_eq!(&second.items, &first.items);
        });
    }
}
