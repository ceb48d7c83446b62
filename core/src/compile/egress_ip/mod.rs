//! EgressIP → nft chains and the netlink state (addresses, policy rules, routes) of one
//! node, given where each egress IP is placed (`status.items`).
//!
//! * **Selection**: a pod (per the pod-identity rule) belongs to the first EgressIP —
//!   oldest, then by name — whose `namespaceSelector` matches its namespace and whose
//!   `podSelector` (absent = all) matches the pod. Any later match is a standby.
//! * **Hosting** (an item names this node): the address is added as /32 or /128 to the
//!   up link whose subnet contains it (longest prefix), and `egress-snat` (postrouting,
//!   `srcnat - 1`, before the CNI's masquerade) SNATs every selected pod of that
//!   EgressIP — local ones and those steered here from other nodes — to it.
//! * **Steering** (this node hosts no IP of the pod's family): `egress-steer`
//!   (prerouting, `dstnat + 10`, after kube-proxy's DNAT) sets our mark bits on the
//!   original-direction packets of *local* selected pods to destinations outside the
//!   cluster, service and node ranges; a policy rule sends marked packets to our routing
//!   table, whose default route goes via the hosting node(s), multipath when several.
//!   `egress-snat` gives packets whose next hop is a hosting node a null SNAT, so the
//!   CNI's masquerade never rewrites them; a marked packet routed anywhere else (its
//!   route missing) is left to the normal SNAT, never sent out with the pod's address.
//! * **No hosting node**: normal SNAT (as the reference does), or a drop with
//!   `--egress-ip-fail-closed`.
//! * **Conflicts**, reported and not applied: an egress IP equal to a node address, the
//!   same IP in two EgressIPs (the younger loses it), an IP no local link can host, an
//!   address no host may take (loopback, link-local, multicast, unspecified, broadcast)
//!   or the gateway of one of this node's links.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use compact_str::format_compact;
use ipnet::IpNet;

use super::tunnel::{self, TunnelPlan};
use super::{NodeConfig, ObjectStatus, Outcome};
use crate::net::{
    EgressIpMode, EgressSettings, HostLinks, MarkRule, NetDesired, NextHop, Transport, tunnel_key, tunnel_mac,
};
use crate::nft::rule::{AddrField, Cmp, Direction, Family, MarkOf, Match, Rule, Statement, Verdict};
use crate::nft::{Chain, Hook, Key, KeyType, Set, Table, Value, chain_name};
use crate::view::ClusterView;
use crate::view::policy::EgressIpPolicy;

mod output;
use output::*;

/// The prerouting chain that marks local pods' packets for steering.
pub const STEER_CHAIN: &str = "egress-steer";
/// The postrouting NAT chain (SNAT to hosted egress IPs, null SNAT of steered packets).
pub const SNAT_CHAIN: &str = "egress-snat";
/// The postrouting filter chain that drops steered connections routed elsewhere.
pub(crate) const GUARD_CHAIN: &str = "egress-guard";
const EXEMPT_V4: &str = "eip-exempt-v4";
const EXEMPT_V6: &str = "eip-exempt-v6";
const STEER_V4: &str = "eip-steer-v4";
const STEER_V6: &str = "eip-steer-v6";
const SNAT_V4: &str = "eip-snat-v4";
const SNAT_V6: &str = "eip-snat-v6";
const GATEWAYS_V4: &str = "eip-gateways-v4";
const GATEWAYS_V6: &str = "eip-gateways-v6";
const DROP_CHAIN: &str = "eip-drop";

/// The label every namespace carries (added by the API server since 1.21; added here for
/// manifests and older servers).
const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

/// A namespace's labels as EgressIP namespace selectors see them (with
/// `kubernetes.io/metadata.name`).
pub fn namespace_labels(view: &ClusterView, ns: &str) -> std::collections::BTreeMap<String, String> {
    let mut labels = view.namespaces.get(ns).map(|n| n.labels.clone()).unwrap_or_default();
    labels.entry(NAMESPACE_NAME_LABEL.to_string()).or_insert_with(|| ns.to_string());
    labels
}

/// What one EgressIP does on this node, before pods are assigned.
struct Plan<'a> {
    entry: &'a crate::view::Entry<EgressIpPolicy>,
    policy: &'a EgressIpPolicy,
    /// Hosted here, per family (first of each family).
    hosted: [Option<IpAddr>; 2],
    /// Hosting nodes elsewhere, per family.
    remote: [Vec<NextHop>; 2],
    problems: Vec<String>,
    /// Problems every node sees alike (an IP that is a node's address, or claimed by an
    /// older EgressIP): reported, but the leader's Events tell them, not every node.
    cluster_problems: Vec<String>,
    /// Listed, claimable IPs that no `status.items` entry places (the cluster's
    /// placement leader has not, or cannot): reported, but not this node's problem.
    unplaced: Vec<IpAddr>,
    hosted_list: Vec<(IpAddr, String)>,
    remote_nodes: BTreeSet<String>,
    /// Local pods selected, steered and left to the fallback, as (namespace, name).
    selected_local: BTreeSet<(&'a str, &'a str)>,
    steered: BTreeSet<(&'a str, &'a str)>,
    snat_here: BTreeSet<(&'a str, &'a str)>,
    fallback: BTreeSet<(&'a str, &'a str)>,
}

fn fam(ip: IpAddr) -> usize {
    usize::from(ip.is_ipv6())
}

fn ip_chain(prefix: &str, ip: IpAddr) -> String {
    chain_name(prefix, &ip.to_string().replace(['.', ':'], "-"))
}

fn mark_statement(settings: &EgressSettings, k: u32) -> Rule {
    Rule::new().then(Statement::SetMark { of: MarkOf::Packet, keep: !settings.mark_mask, or: settings.mark(k) })
}

/// What every phase reads: the view, this node, its links, and the addresses that can
/// never be egress IPs.
struct Ctx<'a> {
    view: &'a ClusterView,
    node: &'a NodeConfig,
    host: &'a HostLinks,
    /// Every node's addresses (and this node's links').
    node_addrs: BTreeSet<IpAddr>,
    /// This node's own addresses.
    my_addrs: BTreeSet<IpAddr>,
    /// Who owns each IP: the oldest EgressIP naming it.
    ip_owner: BTreeMap<IpAddr, &'a str>,
    /// This node's address per family: the source of packets it sends through the tunnel.
    tunnel_addr: [Option<IpAddr>; 2],
    /// The egress IP each tunnel key names on each hosting node: (node, IPv6, key) → the
    /// first placed IP with that key (oldest EgressIP first).
    key_owner: BTreeMap<(&'a str, bool, u32), IpAddr>,
    /// This node's `spec.providerID` names a filtering cloud.
    me_cloud: bool,
}

/// A next-hop set (IPv6, hops) and the mark/table index it gets.
type HopSets = BTreeMap<(bool, Vec<NextHop>), u32>;

/// What assigning the pods produced.
struct Assigned {
    steer: [Set; 2],
    snat: [Set; 2],
    snat_chains: BTreeSet<IpAddr>,
    drop_used: bool,
    /// Some pods could not be steered: more next-hop sets than marks.
    overflow: bool,
}

pub(super) fn compile(
    view: &ClusterView,
    node: &NodeConfig,
    host: &HostLinks,
    owners: &crate::view::Owners,
    table: &mut Table,
    net: &mut NetDesired,
    statuses: &mut Vec<ObjectStatus>,
) {
    let ordered = oldest_first(view);
    if ordered.is_empty() {
        return;
    }
    let ctx = context(view, node, host, &ordered);
    let mut plans: Vec<Plan> =
        ordered.iter().filter_map(|e| e.policy.as_ref().map(|p| place(&ctx, e, p, net))).collect();
    let via = own_link_routes(&mut plans, host, net);
    let hop_sets = number_hop_sets(&plans, &via, &node.egress);
    let assigned = assign_pods(&ctx, &mut plans, owners, &via, &hop_sets);
    emit_routes(&node.egress, &hop_sets, &via, table, net);
    let tunnel_plan = tunnel_plan(&ctx, &plans, &hop_sets);
    for ip in tunnel::overflow(&node.egress, &tunnel_plan) {
        if let Some(plan) = plans.iter_mut().find(|p| p.hosted.contains(&Some(ip))) {
            plan.problems.push(format!(
                "egress IP {ip}: node {} hosts more egress IPs than the mark bits below the tunnel bit can number; other nodes' pods are not SNATed to it (widen --egress-ip-mark-mask)",
                node.node_name
            ));
        }
    }
    let tunnel_snat = tunnel::emit(&node.egress, &tunnel_plan, table, net);
    let tables = Tables {
        steer: assigned.steer,
        snat: assigned.snat,
        snat_chains: &assigned.snat_chains,
        drop_used: assigned.drop_used,
        tunnel_snat,
    };
    emit_tables(&ctx, tables, table);
    for plan in &plans {
        statuses.push(plan_status(plan, assigned.overflow, node));
    }
    for e in ordered.iter().filter(|e| e.policy.is_none()) {
        let error = e.error.clone().unwrap_or_default();
        statuses.push(ObjectStatus::new(e.key.clone(), &node.node_name, Outcome::Failed(error)));
    }
}

/// The EgressIPs, oldest first (known creation times first), then by name: the order in
/// which they claim IPs and pods.
pub fn oldest_first(view: &ClusterView) -> Vec<&crate::view::Entry<EgressIpPolicy>> {
    let mut ordered: Vec<_> = view.egress_ips.values().collect();
    ordered.sort_by(|a, b| {
        let created = |e: &&crate::view::Entry<EgressIpPolicy>| e.policy.as_ref().and_then(|p| p.created);
        (created(a).is_none(), created(a), &a.key.name).cmp(&(created(b).is_none(), created(b), &b.key.name))
    });
    ordered
}

fn context<'a>(
    view: &'a ClusterView,
    node: &'a NodeConfig,
    host: &'a HostLinks,
    ordered: &[&'a crate::view::Entry<EgressIpPolicy>],
) -> Ctx<'a> {
    let mut node_addrs: BTreeSet<IpAddr> = host.addresses().collect();
    node_addrs.extend(view.nodes.values().flat_map(|n| n.addresses.iter().copied()));
    let me = node.node_name.as_str();
    let my_addrs: BTreeSet<IpAddr> =
        host.addresses().chain(view.nodes.get(me).into_iter().flat_map(|n| n.addresses.iter().copied())).collect();
    let ip_owner = ip_owners(ordered);
    let mut key_owner = BTreeMap::new();
    for p in ordered.iter().filter_map(|e| e.policy.as_ref()) {
        for (ip, at) in &p.placement {
            if ip_owner.get(ip) == Some(&p.name.as_str()) {
                key_owner.entry((at.as_str(), ip.is_ipv6(), tunnel_key(*ip))).or_insert(*ip);
            }
        }
    }
    let tunnel_addr = [0, 1].map(|f| {
        let listed = view.nodes.get(me).and_then(|n| n.addresses.iter().copied().find(|a| fam(*a) == f));
        listed.or_else(|| {
            let link = host.default_link[f].and_then(|i| host.links.iter().find(|l| l.index == i))?;
            link.addrs.iter().map(IpNet::addr).find(|a| fam(*a) == f && unusable(*a, host).is_none())
        })
    });
    let me_cloud = view.nodes.get(me).is_some_and(|n| n.cloud);
    Ctx { view, node, host, node_addrs, my_addrs, ip_owner, tunnel_addr, key_owner, me_cloud }
}

/// A node's tunnel identity address: its first IPv4 address, else its first IPv6 one.
fn identity(addresses: &[IpAddr]) -> Option<IpAddr> {
    addresses.iter().find(|a| a.is_ipv4()).or_else(|| addresses.first()).copied()
}

/// What the tunnel needs: the egress IPs hosted here (their keys free of collisions),
/// the hosting nodes steered to through it, the peers and this node's addresses.
fn tunnel_plan(ctx: &Ctx, plans: &[Plan], hop_sets: &HopSets) -> TunnelPlan {
    let me = ctx.node.node_name.as_str();
    let mut hosted: Vec<(IpAddr, u32)> = plans
        .iter()
        .flat_map(|p| p.hosted_list.iter().map(|(ip, _)| *ip))
        .filter(|ip| ctx.key_owner.get(&(me, ip.is_ipv6(), tunnel_key(*ip))) == Some(ip))
        .map(|ip| (ip, tunnel_key(ip)))
        .collect();
    hosted.sort();
    let mut steer_gateways = [BTreeSet::new(), BTreeSet::new()];
    for (v6, hops) in hop_sets.keys() {
        for hop in hops.iter().filter(|h| h.key.is_some()) {
            steer_gateways[usize::from(*v6)].insert(hop.gateway);
        }
    }
    let settings = &ctx.node.egress;
    let mut peers = BTreeSet::new();
    let mut tunnelled = BTreeMap::new();
    for (name, info) in &ctx.view.nodes {
        if name == me {
            continue;
        }
        let Some(id) = identity(&info.addresses) else { continue };
        // A peer reaches this node through the tunnel as `steering_hop` decides on its
        // side: always with vxlan or where a cloud filters, else when this node is not on
        // a shared link (nodes on one subnet see each other on-link).
        let filtered = cloud_filters(ctx, info);
        for a in info.addresses.iter().filter(|a| !ctx.my_addrs.contains(a)) {
            peers.insert(*a);
            let steered_to = steer_gateways[fam(*a)].contains(a);
            if steered_to || settings.transport == Transport::Vxlan || filtered || ctx.host.link_for(*a).is_none() {
                tunnelled.insert(*a, tunnel_mac(id));
            }
        }
    }
    let my_id = ctx.view.nodes.get(me).and_then(|n| identity(&n.addresses));
    let mac = tunnel_mac(my_id.or(ctx.tunnel_addr[0]).or(ctx.tunnel_addr[1]).unwrap_or(IpAddr::from([0, 0, 0, 0])));
    TunnelPlan {
        hosted,
        steer_gateways,
        self_addr: ctx.tunnel_addr,
        my_addrs: ctx.my_addrs.clone(),
        peers,
        tunnelled,
        mac,
        standby: ctx.view.needs_cluster_pods(me),
    }
}

/// Who owns each egress IP: the oldest EgressIP naming it (`ordered` oldest first).
pub fn ip_owners<'a>(ordered: &[&'a crate::view::Entry<EgressIpPolicy>]) -> BTreeMap<IpAddr, &'a str> {
    let mut ip_owner: BTreeMap<IpAddr, &str> = BTreeMap::new();
    for p in ordered.iter().filter_map(|e| e.policy.as_ref()) {
        for ip in &p.ips {
            ip_owner.entry(*ip).or_insert(p.name.as_str());
        }
    }
    ip_owner
}

/// Hosting: where each IP of one EgressIP is placed — on this node (the address goes on
/// the up link whose subnet contains it) or elsewhere (the next hops to steer to) — and
/// the conflicts that keep an IP out.
fn place<'a>(
    ctx: &Ctx<'a>,
    entry: &'a crate::view::Entry<EgressIpPolicy>,
    policy: &'a EgressIpPolicy,
    net: &mut NetDesired,
) -> Plan<'a> {
    let mut plan = Plan {
        entry,
        policy,
        hosted: [None, None],
        remote: [Vec::new(), Vec::new()],
        problems: Vec::new(),
        cluster_problems: Vec::new(),
        unplaced: Vec::new(),
        hosted_list: Vec::new(),
        remote_nodes: BTreeSet::new(),
        selected_local: BTreeSet::new(),
        steered: BTreeSet::new(),
        snat_here: BTreeSet::new(),
        fallback: BTreeSet::new(),
    };
    claims(ctx, policy, &mut plan);
    let mut seen = BTreeSet::new();
    for (ip, host_node) in &policy.placement {
        if ctx.node_addrs.contains(ip)
            || unusable(*ip, ctx.host).is_some()
            || ctx.ip_owner.get(ip) != Some(&policy.name.as_str())
            || !seen.insert(*ip)
        {
            continue;
        }
        if *host_node == ctx.node.node_name {
            host_here(ctx, *ip, &mut plan, net);
            continue;
        }
        match steering_hop(ctx, *ip, host_node) {
            Ok(hop) => {
                let hops = &mut plan.remote[fam(*ip)];
                if !hops.contains(&hop) {
                    hops.push(hop);
                }
                plan.remote_nodes.insert(host_node.clone());
            }
            Err(problem) => plan.problems.push(problem),
        }
    }
    for hops in &mut plan.remote {
        hops.sort();
    }
    plan
}

/// The problems of `policy`'s IPs that keep them out wherever they are placed, and the
/// claimable IPs no node is placed on yet.
fn claims(ctx: &Ctx, policy: &EgressIpPolicy, plan: &mut Plan) {
    for ip in &policy.ips {
        if let Some(why) = unusable(*ip, ctx.host) {
            plan.problems.push(format!("egress IP {ip} is {why}; not used"));
        } else if ctx.node_addrs.contains(ip) {
            plan.cluster_problems.push(format!("egress IP {ip} is the address of a node; not used"));
        } else if let Some(owner) = ctx.ip_owner.get(ip).filter(|o| **o != policy.name) {
            plan.cluster_problems
                .push(format!("egress IP {ip} is also claimed by the older EgressIP {owner}; not used"));
        }
    }
    for ip in &policy.ips {
        let claimable = unusable(*ip, ctx.host).is_none()
            && !ctx.node_addrs.contains(ip)
            && ctx.ip_owner.get(ip) == Some(&policy.name.as_str());
        if claimable && !policy.placement.iter().any(|(p, _)| p == ip) {
            plan.unplaced.push(*ip);
        }
    }
}

/// Host `ip`, placed on this node: on the up link whose subnet contains it, unless
/// another host answers for it, the kernel cannot tag it, or this node already hosts an
/// IP of the same EgressIP and family.
fn host_here(ctx: &Ctx, ip: IpAddr, plan: &mut Plan, net: &mut NetDesired) {
    let me = ctx.node.node_name.as_str();
    let f = fam(ip);
    if let Some(who) = ctx.host.conflicts.get(&ip) {
        plan.problems.push(format!(
            "egress IP {ip} is in use by another host ({who}): it answered the duplicate address probe; not hosted on node {me}"
        ));
        return;
    }
    if !ctx.node.egress.address_tags {
        plan.problems.push(format!(
            "egress IP {ip} cannot be hosted on node {me}: its kernel cannot tag addresses (IFA_PROTO, Linux 6.1 or later), so egressd could not find them again; not hosted"
        ));
        return;
    }
    match ctx.host.link_for(ip) {
        None => plan
            .problems
            .push(format!("egress IP {ip} cannot be hosted on node {me}: no up link has a subnet containing it")),
        Some(_) if plan.hosted[f].is_some() => plan.problems.push(format!(
            "egress IP {ip}: node {me} already hosts another IP of this EgressIP in its family; not hosted"
        )),
        Some(link) => {
            plan.hosted[f] = Some(ip);
            plan.hosted_list.push((ip, link.name.clone()));
            net.addresses.insert(ip, (link.index, link.name.clone()));
        }
    }
}

/// Whether a cloud's fabric filters between this node and `peer` (either is a cloud
/// instance, or a cloud network controller assigns the IPs: `cloud` mode), so that
/// `auto` steers through the tunnel even on a shared link.
fn cloud_filters(ctx: &Ctx, peer: &crate::view::NodeInfo) -> bool {
    ctx.node.egress.mode == EgressIpMode::Cloud || peer.cloud || ctx.me_cloud
}

/// How this node reaches `host_node` for egress IP `ip`: on-link or through the tunnel
/// (`--egress-ip-transport`), or why it cannot.
fn steering_hop(ctx: &Ctx, ip: IpAddr, host_node: &str) -> Result<NextHop, String> {
    let me = ctx.node.node_name.as_str();
    let settings = &ctx.node.egress;
    let family = if ip.is_ipv6() { "IPv6" } else { "IPv4" };
    let Some(info) = ctx.view.nodes.get(host_node) else {
        return Err(format!("egress IP {ip} is placed on node {host_node}, which is unknown; not steered to it"));
    };
    let theirs = || info.addresses.iter().filter(|a| a.is_ipv6() == ip.is_ipv6() && !ctx.my_addrs.contains(a));
    let direct = theirs().find_map(|a| ctx.host.link_for(*a).map(|link| NextHop::direct(*a, link.index)));
    let tunnel = settings.tunnel_bit().and(ctx.tunnel_addr[fam(ip)]).and(theirs().next()).map(|a| NextHop {
        gateway: *a,
        link: 0,
        key: Some(tunnel_key(ip)),
    });
    let filtered = cloud_filters(ctx, info);
    let hop = match settings.transport {
        Transport::Direct => direct,
        Transport::Vxlan => tunnel,
        Transport::Auto if filtered => tunnel.or(direct),
        Transport::Auto => direct.or(tunnel),
    };
    let Some(hop) = hop else {
        return Err(match settings.transport {
            Transport::Direct => format!(
                "egress IP {ip} is placed on node {host_node}, which has no {family} address on a link shared with node {me}; not steered to it"
            ),
            _ if theirs().next().is_none() => {
                format!(
                    "egress IP {ip} is placed on node {host_node}, which has no {family} address; not steered to it"
                )
            }
            _ if settings.tunnel_bit().is_none() => format!(
                "egress IP {ip} is placed on node {host_node}, not reachable on a shared link, and --egress-ip-mark-mask has no room for the tunnel bit; not steered to it"
            ),
            _ => format!(
                "egress IP {ip} is placed on node {host_node}, but node {me} has no {family} address to send through the tunnel from; not steered to it"
            ),
        });
    };
    if let Some(key) = hop.key
        && let Some(other) = ctx.key_owner.get(&(host_node, ip.is_ipv6(), key)).filter(|o| **o != ip)
    {
        return Err(format!(
            "egress IP {ip} has the tunnel key {key} of egress IP {other}, also placed on node {host_node}; not steered to it"
        ));
    }
    Ok(hop)
}

/// `--egress-ip-mode cloud-local`: this node is the CloudPrivateIPConfig controller for
/// the configs naming it in `spec.node`. It hosts the IP (on the up link whose subnet
/// contains it, like an egress IP) while the config is not being deleted and no other
/// node still holds it (`status.node` empty or this node) — so a move releases on the
/// old node before the new one adds. Statuses: applied (hosted here), failed (why not),
/// or ignored (another node's).
pub(super) fn cloud_local(
    view: &ClusterView,
    node: &NodeConfig,
    host: &HostLinks,
    net: &mut NetDesired,
    statuses: &mut Vec<ObjectStatus>,
) {
    let me = node.node_name.as_str();
    let node_addrs: BTreeSet<IpAddr> =
        host.addresses().chain(view.nodes.values().flat_map(|n| n.addresses.iter().copied())).collect();
    for e in view.cloud_ips.values() {
        let Some(p) = &e.policy else {
            let error = e.error.clone().unwrap_or_default();
            statuses.push(ObjectStatus::new(e.key.clone(), me, Outcome::Failed(error)));
            continue;
        };
        let ip = p.ip;
        let mine = p.node.as_deref() == Some(me) && p.status_node.as_deref().is_none_or(|n| n == me) && !p.deleting;
        let outcome = if !mine {
            let why = match (&p.node, &p.status_node) {
                _ if p.deleting => "being deleted".to_string(),
                (Some(n), Some(s)) if n == me => format!("waiting for node {s} to release it"),
                (Some(n), _) => format!("assigned to node {n}"),
                (None, _) => "no node requested".to_string(),
            };
            Outcome::Ignored(format!("{me}: CloudPrivateIPConfig {ip} {why}; not hosted here"))
        } else if let Some(why) = unusable(ip, host) {
            Outcome::Failed(format!("{ip} is {why}; not hosted"))
        } else if node_addrs.contains(&ip) {
            Outcome::Failed(format!("{ip} is the address of a node; not hosted"))
        } else if let Some(who) = host.conflicts.get(&ip) {
            Outcome::Failed(format!("{ip} is in use by another host ({who}); not hosted on node {me}"))
        } else if !node.egress.address_tags {
            Outcome::Failed(format!(
                "{ip} cannot be hosted on node {me}: its kernel cannot tag addresses (IFA_PROTO, Linux 6.1 or later)"
            ))
        } else if let Some(link) = host.link_for(ip) {
            net.addresses.insert(ip, (link.index, link.name.clone()));
            statuses.push(
                ObjectStatus::new(e.key.clone(), me, Outcome::Applied)
                    .with_detail(format!("hosts {ip} on {}", link.name)),
            );
            continue;
        } else {
            Outcome::Failed(format!("{ip} cannot be hosted on node {me}: no up link has a subnet containing it"))
        };
        statuses.push(ObjectStatus::new(e.key.clone(), me, outcome));
    }
}

/// Why `ip` can never be an egress IP: an address no host may take as its own source
/// (loopback, link-local, multicast, unspecified, IPv4 broadcast), or the gateway of one
/// of this node's links (taking it would hijack the segment's router).
fn unusable(ip: IpAddr, host: &HostLinks) -> Option<String> {
    let class = match ip {
        IpAddr::V4(v4) if v4.is_loopback() => Some("a loopback address"),
        IpAddr::V6(v6) if v6.is_loopback() => Some("a loopback address"),
        IpAddr::V4(v4) if v4.is_link_local() => Some("a link-local address"),
        IpAddr::V6(v6) if v6.is_unicast_link_local() => Some("a link-local address"),
        _ if ip.is_multicast() => Some("a multicast address"),
        _ if ip.is_unspecified() => Some("the unspecified address"),
        IpAddr::V4(v4) if v4.is_broadcast() => Some("the broadcast address"),
        _ => None,
    };
    if let Some(c) = class {
        return Some(c.to_string());
    }
    host.links.iter().find(|l| l.gateways.contains(&ip)).map(|l| format!("the gateway of link {} on this node", l.name))
}

/// A hosted address on a link other than the default route's: its traffic leaves by
/// that link's own default gateway (through one of our tables), or is reported.
fn own_link_routes(plans: &mut [Plan], host: &HostLinks, net: &NetDesired) -> BTreeMap<IpAddr, Vec<NextHop>> {
    let mut via: BTreeMap<IpAddr, Vec<NextHop>> = BTreeMap::new();
    for plan in plans {
        for (f, hosted) in plan.hosted.iter().enumerate() {
            let Some(ip) = hosted else { continue };
            let Some((index, name)) = net.addresses.get(ip) else { continue };
            if host.default_link[f].is_none_or(|d| d == *index) {
                continue;
            }
            let gateway = host
                .links
                .iter()
                .find(|l| l.index == *index)
                .and_then(|l| l.gateways.iter().find(|g| g.is_ipv6() == ip.is_ipv6()));
            match gateway {
                Some(g) => {
                    via.insert(*ip, vec![NextHop::direct(*g, *index)]);
                }
                None => plan.problems.push(format!(
                    "egress IP {ip} is on {name}, which is not the default route's link and has no default route of its own: its traffic leaves by the main table"
                )),
            }
        }
    }
    via
}

/// Next-hop numbering: distinct next-hop sets get a mark and a table each, in a stable
/// order, as many as the mark mask allows.
fn number_hop_sets(plans: &[Plan], via: &BTreeMap<IpAddr, Vec<NextHop>>, settings: &EgressSettings) -> HopSets {
    let mut hop_sets: BTreeSet<(bool, Vec<NextHop>)> = BTreeSet::new();
    for plan in plans {
        for (f, hops) in plan.remote.iter().enumerate() {
            if !hops.is_empty() && plan.hosted[f].is_none() {
                hop_sets.insert((f == 1, hops.clone()));
            }
        }
    }
    for (ip, hops) in via {
        hop_sets.insert((ip.is_ipv6(), hops.clone()));
    }
    let mut set_index = HopSets::new();
    for (i, key) in hop_sets.into_iter().enumerate() {
        let k = u32::try_from(i + 1).unwrap_or(u32::MAX);
        if k > settings.capacity() {
            continue;
        }
        set_index.insert(key, k);
    }
    set_index
}

/// A wanted namespace's labels, and the owned addresses of its pods with their owner.
type Candidates<'v> = (BTreeMap<String, String>, Vec<(IpAddr, &'v crate::view::PodInfo)>);

/// The owned addresses of the pods in namespaces that `wanted` (some EgressIP's
/// namespaceSelector) takes, one group per namespace, with its labels. Only those pods
/// can be selected, so the pods of other namespaces are not walked: on a node that
/// follows the whole cluster's pods (an egress IP's host), most of them.
fn candidates<'v>(
    view: &'v ClusterView,
    owners: &'v crate::view::Owners,
    wanted: impl Fn(&BTreeMap<String, String>) -> bool,
) -> Vec<Candidates<'v>> {
    let pods = &*view.pods;
    let mut out = Vec::new();
    let mut next = pods.keys().next().map(|(ns, _)| ns.clone());
    while let Some(ns) = next {
        // Every key of a later namespace sorts at or after `ns` + NUL.
        let after = (format!("{ns}\0"), String::new());
        let labels = namespace_labels(view, &ns);
        if wanted(&labels) {
            let mut addresses = Vec::new();
            for pod in pods.range((ns.clone(), String::new())..after.clone()).map(|(_, pod)| pod) {
                for (i, ip) in pod.ips.iter().enumerate() {
                    if pod.ips[..i].contains(ip) {
                        continue; // listed twice: one address
                    }
                    if let Some(owner) = owners.get(ip).filter(|o| o.namespace == pod.namespace && o.name == pod.name) {
                        addresses.push((*ip, &**owner));
                    }
                }
            }
            out.push((labels, addresses));
        }
        next = pods.range(after..).next().map(|((ns, _), _)| ns.clone());
    }
    out
}

/// Selection: each pod belongs to the first EgressIP selecting it; hosted here → SNAT,
/// hosted elsewhere → steered (local pods), hosted nowhere → the fallback.
fn assign_pods<'a>(
    ctx: &Ctx<'a>,
    plans: &mut [Plan<'a>],
    owners: &'a crate::view::Owners,
    via: &BTreeMap<IpAddr, Vec<NextHop>>,
    hop_sets: &HopSets,
) -> Assigned {
    let settings = &ctx.node.egress;
    let mut a = Assigned {
        steer: [Set::verdict_map(KeyType::Ipv4), Set::verdict_map(KeyType::Ipv6)],
        snat: [Set::verdict_map(KeyType::Ipv4), Set::verdict_map(KeyType::Ipv6)],
        snat_chains: BTreeSet::new(),
        drop_used: false,
        overflow: false,
    };
    let wanted = |labels: &BTreeMap<String, String>| plans.iter().any(|p| p.policy.namespaces.matches(labels));
    let groups = candidates(ctx.view, owners, wanted);
    for (labels, ip, pod) in groups.iter().flat_map(|(labels, a)| a.iter().map(move |(ip, pod)| (labels, ip, *pod))) {
        let Some(plan) =
            plans.iter_mut().find(|p| p.policy.namespaces.matches(labels) && p.policy.pods.matches(&pod.labels))
        else {
            continue;
        };
        let f = fam(*ip);
        let local = ctx.node.is_local(pod);
        let id = (pod.namespace.as_str(), pod.name.as_str());
        if local {
            plan.selected_local.insert(id);
        }
        // An EgressIP without an address of this family leaves that family alone.
        if !plan.policy.ips.iter().any(|e| fam(*e) == f) {
            continue;
        }
        if let Some(egress_ip) = plan.hosted[f] {
            if local {
                plan.snat_here.insert(id);
            }
            a.snat[f].elements.insert(Key::Addr(*ip), Value::Jump(ip_chain("eip-snat", egress_ip).into()));
            a.snat_chains.insert(egress_ip);
            // Out of the address's own link: mark for its table (pods of other nodes too,
            // whose packets are leaving the cluster here, not going back).
            if let Some(k) = via.get(&egress_ip).and_then(|hops| hop_sets.get(&(f == 1, hops.clone()))) {
                a.steer[f].elements.insert(Key::Addr(*ip), Value::Jump(format_compact!("eip-mark-{k}")));
            }
            continue;
        }
        if !local {
            continue;
        }
        match hop_sets.get(&(f == 1, plan.remote[f].clone())) {
            Some(k) if !plan.remote[f].is_empty() => {
                a.steer[f].elements.insert(Key::Addr(*ip), Value::Jump(format_compact!("eip-mark-{k}")));
                plan.steered.insert(id);
            }
            Some(_) | None => {
                if !plan.remote[f].is_empty() {
                    a.overflow = true;
                }
                plan.fallback.insert(id);
                if settings.fail_closed {
                    a.steer[f].elements.insert(Key::Addr(*ip), Value::Jump(DROP_CHAIN.into()));
                    a.drop_used = true;
                }
            }
        }
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::parse::{Parsed, parse_document, split_documents, yaml_to_value};
    use crate::compile::{CompileCache, compile_cached};
    use crate::dns::DnsAnswers;
    use crate::net::HostLink;

    proptest::proptest! {
        /// The candidates are exactly the owned addresses whose pod's namespace is
        /// wanted: what walking every owner and skipping the other namespaces gives.
        /// Namespace names that prefix one another check the step to the next namespace.
        #[test]
        fn candidates_are_the_owners_of_the_wanted_namespaces(
            pods in proptest::collection::vec((0usize..5, 0usize..3, proptest::collection::vec(0u8..6, 0..3), proptest::bool::ANY, 0i64..3), 0..25),
            teams in proptest::collection::vec(proptest::option::of(0u8..2), 5),
            wanted_team in 0u8..2,
        ) {
            const NAMESPACES: [&str; 5] = ["a", "a-b", "ab", "b", "ba"];
            let mut v = ClusterView::default();
            for (ns, team) in NAMESPACES.iter().zip(&teams) {
                if let Some(team) = team {
                    let labels = BTreeMap::from([("team".to_string(), team.to_string())]);
                    v.namespaces.insert(ns.to_string(), crate::view::NamespaceInfo { labels, ..Default::default() });
                }
            }
            for (ns, name, ips, running, created) in pods {
                let info = crate::view::PodInfo {
                    namespace: NAMESPACES[ns].into(),
                    name: format!("p{name}"),
                    labels: BTreeMap::new(),
                    node: Some("n1".into()),
                    host_network: false,
                    phase: Some(if running { "Running" } else { "Succeeded" }.into()),
                    ips: ips.into_iter().map(|i| IpAddr::from([198, 18, 0, i])).collect(),
                    created: Some(created),
                };
                v.pods.set((info.namespace.clone(), info.name.clone()), Some(info));
            }
            let wanted = |labels: &BTreeMap<String, String>| {
                labels.get("team") == Some(&wanted_team.to_string()) || labels.get(NAMESPACE_NAME_LABEL).map(String::as_str) == Some("ab")
            };
            let mut got: Vec<(IpAddr, String, String)> = Vec::new();
            for (labels, addresses) in candidates(&v, v.pods.owners(), wanted) {
                for (ip, pod) in addresses {
                    assert_eq!(labels, namespace_labels(&v, &pod.namespace));
                    got.push((ip, pod.namespace.clone(), pod.name.clone()));
                }
            }
            got.sort();
            let mut expected: Vec<(IpAddr, String, String)> = v
                .pods
                .owners()
                .iter()
                .filter(|(_, p)| wanted(&namespace_labels(&v, &p.namespace)))
                .map(|(ip, p)| (*ip, p.namespace.clone(), p.name.clone()))
                .collect();
            expected.sort();
            proptest::prop_assert_eq!(got, expected);
        }
    }

    fn view(docs: &str) -> ClusterView {
        let mut v = ClusterView::default();
        for (_, _, text) in split_documents(docs) {
            let Ok(Parsed::Object(o)) = parse_document(&yaml_to_value(&text).unwrap(), "default", false) else {
                panic!("bad test document: {text}");
            };
            v.upsert(&o);
        }
        v
    }

    fn node(name: &str, fail_closed: bool) -> NodeConfig {
        NodeConfig::new(name, vec!["198.18.0.0/16".parse().unwrap()])
            .with_egress(EgressSettings { fail_closed, ..Default::default() })
    }

    fn host(addr: &str) -> HostLinks {
        HostLinks {
            links: vec![
                HostLink {
                    index: 1,
                    name: "lo".into(),
                    up: true,
                    addrs: vec!["127.0.0.1/8".parse().unwrap()],
                    ..Default::default()
                },
                HostLink {
                    index: 2,
                    name: "eth0".into(),
                    up: true,
                    addrs: vec![addr.parse().unwrap()],
                    ..Default::default()
                },
                HostLink {
                    index: 3,
                    name: "eth1".into(),
                    up: false,
                    addrs: vec!["192.0.2.1/24".parse().unwrap()],
                    ..Default::default()
                },
            ],
            default_link: [Some(2), None],
            ..Default::default()
        }
    }

    const CLUSTER: &str = "apiVersion: v1\nkind: Node\nmetadata: {name: a}\nstatus: {addresses: [{type: InternalIP, address: 198.19.0.1}]}\n\
---\napiVersion: v1\nkind: Node\nmetadata: {name: b}\nstatus: {addresses: [{type: InternalIP, address: 198.19.0.2}]}\n\
---\napiVersion: v1\nkind: Node\nmetadata: {name: c}\nstatus: {addresses: [{type: InternalIP, address: 198.19.0.3}]}\n\
---\napiVersion: v1\nkind: Namespace\nmetadata: {name: prod, labels: {team: prod}}\n\
---\napiVersion: v1\nkind: Pod\nmetadata: {name: p1, namespace: prod, labels: {app: web}}\nspec: {nodeName: a}\nstatus: {podIP: 198.18.1.2}\n\
---\napiVersion: v1\nkind: Pod\nmetadata: {name: p2, namespace: prod, labels: {app: db}}\nspec: {nodeName: a}\nstatus: {podIP: 198.18.1.6}\n\
---\napiVersion: v1\nkind: Pod\nmetadata: {name: p3, namespace: prod, labels: {app: web}}\nspec: {nodeName: b}\nstatus: {podIP: 198.18.2.2}\n";

    fn eip(name: &str, created: &str, ips: &[&str], items: &[(&str, &str)], selector: &str) -> String {
        let mut s = format!(
            "---\napiVersion: k8s.ovn.org/v1\nkind: EgressIP\nmetadata: {{name: {name}, creationTimestamp: \"{created}\"}}\nspec:\n  egressIPs: [{}]\n  namespaceSelector: {{matchLabels: {{team: prod}}}}\n  podSelector: {selector}\n",
            ips.join(", ")
        );
        if !items.is_empty() {
            s.push_str("status:\n  items:\n");
            for (ip, n) in items {
                s.push_str(&format!("  - {{egressIP: {ip}, node: {n}}}\n"));
            }
        }
        s
    }

    fn run(docs: &str, me: &str, addr: &str, fail_closed: bool) -> crate::compile::Desired {
        run_on(docs, me, &host(addr), fail_closed)
    }

    fn run_on(docs: &str, me: &str, links: &HostLinks, fail_closed: bool) -> crate::compile::Desired {
        compile_cached(&view(docs), &node(me, fail_closed), &DnsAnswers::new(), links, &mut CompileCache::default())
    }

    fn elements(d: &crate::compile::Desired, set: &str) -> Vec<(String, String)> {
        d.table.sets[set].elements.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn oldest_egress_ip_wins_a_pod_and_the_other_is_standby() {
        let web = eip(
            "web",
            "2024-01-01T00:00:00Z",
            &["198.19.0.100"],
            &[("198.19.0.100", "b")],
            "{matchLabels: {app: web}}",
        );
        let all = eip("all", "2025-01-01T00:00:00Z", &["198.19.0.101"], &[("198.19.0.101", "c")], "{}");
        let d = run(&format!("{CLUSTER}{web}{all}"), "a", "198.19.0.1/24", false);
        // p1 (web) → the older "web" (via b, mark 1); p2 (db) only matches "all" (via c, mark 2).
        assert_eq!(
            elements(&d, STEER_V4),
            vec![("198.18.1.2".into(), "jump eip-mark-1".into()), ("198.18.1.6".into(), "jump eip-mark-2".into())]
        );
        let hop = |ip: &str| NextHop::direct(ip.parse().unwrap(), 2);
        assert_eq!(d.net.routes[&(7471, false)], vec![hop("198.19.0.2")]);
        assert_eq!(d.net.routes[&(7472, false)], vec![hop("198.19.0.3")]);
        assert_eq!(
            d.net.rules.iter().map(|r| (r.mark, r.mask, r.table)).collect::<Vec<_>>(),
            vec![(0x10000, 0xff0000, 7471), (0x20000, 0xff0000, 7472)]
        );
        assert!(d.net.addresses.is_empty(), "a hosts nothing");
        // "web" goes away: its pod falls to the standby.
        let d = run(&format!("{CLUSTER}{all}"), "a", "198.19.0.1/24", false);
        assert_eq!(elements(&d, STEER_V4).len(), 2);
        assert!(elements(&d, STEER_V4).iter().all(|(_, v)| v == "jump eip-mark-1"));
    }

    #[test]
    fn the_hosting_node_adds_the_address_and_snats_every_selected_pod() {
        let web = eip(
            "web",
            "2024-01-01T00:00:00Z",
            &["198.19.0.100"],
            &[("198.19.0.100", "b")],
            "{matchLabels: {app: web}}",
        );
        let d = run(&format!("{CLUSTER}{web}"), "b", "198.19.0.2/24", false);
        assert_eq!(d.net.addresses.get(&"198.19.0.100".parse().unwrap()), Some(&(2, "eth0".to_string())));
        assert_eq!(
            elements(&d, SNAT_V4),
            vec![
                ("198.18.1.2".into(), "jump eip-snat-198-19-0-100".into()),
                ("198.18.2.2".into(), "jump eip-snat-198-19-0-100".into())
            ]
        );
        assert!(d.table.sets[STEER_V4].elements.is_empty(), "nothing steered from the hosting node");
        assert_eq!(*d.table.chains["eip-snat-198-19-0-100"].rules, vec!["snat ip to 198.19.0.100".to_string()]);
        assert!(d.net.routes.is_empty());
        // Ready to receive through the tunnel: only the tunnel bit's rules, return routes.
        let tunnel = EgressSettings::default().tunnel_table();
        assert!(d.net.rules.iter().all(|r| r.table == tunnel && r.mask == 0x0080_0000), "{:?}", d.net.rules);
        assert!(d.net.tunnel.as_ref().is_some_and(|t| t.return_routes));
    }

    #[test]
    fn an_address_off_the_default_link_routes_by_its_own_link() {
        let web = eip(
            "web",
            "2024-01-01T00:00:00Z",
            &["198.51.100.100"],
            &[("198.51.100.100", "b")],
            "{matchLabels: {app: web}}",
        );
        let mut links = host("198.19.0.2/24");
        links.links[2] = HostLink {
            index: 3,
            name: "eth1".into(),
            up: true,
            addrs: vec!["198.51.100.2/24".parse().unwrap()],
            gateways: vec!["198.51.100.254".parse().unwrap()],
        };
        let d = run_on(&format!("{CLUSTER}{web}"), "b", &links, false);
        assert_eq!(d.net.addresses.get(&"198.51.100.100".parse().unwrap()), Some(&(3, "eth1".to_string())));
        // Every selected pod (this node's and the steered ones) is marked for eth1's table.
        assert_eq!(
            elements(&d, STEER_V4),
            vec![("198.18.1.2".into(), "jump eip-mark-1".into()), ("198.18.2.2".into(), "jump eip-mark-1".into())]
        );
        assert_eq!(d.net.routes[&(7471, false)], vec![NextHop::direct("198.51.100.254".parse().unwrap(), 3)]);
        assert!(d.table.sets[GATEWAYS_V4].elements.is_empty(), "the link's gateway is no node: no null SNAT");
        // Without a default route on that link: reported, traffic by the main table.
        links.links[2].gateways.clear();
        let d = run_on(&format!("{CLUSTER}{web}"), "b", &links, false);
        assert!(d.table.sets[STEER_V4].elements.is_empty());
        assert!(
            d.statuses[0].message().contains("is on eth1, which is not the default route's link"),
            "{}",
            d.statuses[0].message()
        );
    }

    #[test]
    fn several_hosting_nodes_make_one_multipath_route() {
        let two = eip(
            "two",
            "2024-01-01T00:00:00Z",
            &["198.19.0.100", "198.19.0.101"],
            &[("198.19.0.101", "c"), ("198.19.0.100", "b")],
            "{}",
        );
        let d = run(&format!("{CLUSTER}{two}"), "a", "198.19.0.1/24", false);
        let hops: Vec<String> = d.net.routes[&(7471, false)].iter().map(|h| h.gateway.to_string()).collect();
        assert_eq!(hops, vec!["198.19.0.2", "198.19.0.3"]);
        assert_eq!(d.table.sets[GATEWAYS_V4].elements.len(), 2);
    }

    #[test]
    fn conflicts_are_reported_and_not_applied() {
        let old = eip("old", "2024-01-01T00:00:00Z", &["198.19.0.100"], &[("198.19.0.100", "b")], "{}");
        let young = eip(
            "young",
            "2025-01-01T00:00:00Z",
            &["198.19.0.100", "198.19.0.3", "203.0.113.9"],
            &[("198.19.0.100", "b"), ("198.19.0.3", "b"), ("203.0.113.9", "b")],
            "{}",
        );
        let d = run(&format!("{CLUSTER}{old}{young}"), "b", "198.19.0.2/24", false);
        assert_eq!(d.net.addresses.keys().map(ToString::to_string).collect::<Vec<_>>(), vec!["198.19.0.100"]);
        let status = |name: &str| d.statuses.iter().find(|s| s.key.name == name).unwrap().clone();
        assert_eq!(status("old").outcome, Outcome::Applied);
        let young = status("young");
        assert!(matches!(young.outcome, Outcome::Failed(_)));
        for expected in [
            "egress IP 198.19.0.100 is also claimed by the older EgressIP old; not used",
            "egress IP 198.19.0.3 is the address of a node; not used",
            "egress IP 203.0.113.9 cannot be hosted on node b: no up link has a subnet containing it",
        ] {
            assert!(young.message().contains(expected), "{expected}\nin {}", young.message());
        }
        // A down link never hosts; an unknown node is reported where it matters.
        let down = eip("down", "2024-01-01T00:00:00Z", &["192.0.2.5"], &[("192.0.2.5", "b")], "{}");
        let d = run(&format!("{CLUSTER}{down}"), "b", "198.19.0.2/24", false);
        assert!(d.net.addresses.is_empty());
        let ghost = eip("ghost", "2024-01-01T00:00:00Z", &["198.19.0.100"], &[("198.19.0.100", "z")], "{}");
        let d = run(&format!("{CLUSTER}{ghost}"), "a", "198.19.0.1/24", false);
        assert!(d.statuses[0].message().contains("placed on node z, which is unknown"), "{}", d.statuses[0].message());
    }

    #[test]
    fn an_address_another_host_answered_for_is_not_hosted() {
        let e = eip("e", "2024-01-01T00:00:00Z", &["198.19.0.100"], &[("198.19.0.100", "b")], "{}");
        let mut host = host("198.19.0.2/24");
        host.conflicts.insert("198.19.0.100".parse().unwrap(), "MAC 02:00:00:00:00:07 on link eth0".into());
        let d = compile_cached(
            &view(&format!("{CLUSTER}{e}")),
            &node("b", false),
            &DnsAnswers::new(),
            &host,
            &mut CompileCache::default(),
        );
        assert!(d.net.addresses.is_empty(), "{:?}", d.net.addresses);
        assert!(
            d.statuses[0].message().contains(
                "egress IP 198.19.0.100 is in use by another host (MAC 02:00:00:00:00:07 on link eth0): it answered the duplicate address probe; not hosted on node b"
            ),
            "{}",
            d.statuses[0].message()
        );
        assert_ne!(d.statuses[0].outcome, Outcome::Applied);
    }

    #[test]
    fn a_kernel_without_address_tags_hosts_nothing() {
        let e = eip("e", "2024-01-01T00:00:00Z", &["198.19.0.100"], &[("198.19.0.100", "b")], "{}");
        let mut node = node("b", false);
        node.egress.address_tags = false;
        let d = compile_cached(
            &view(&format!("{CLUSTER}{e}")),
            &node,
            &DnsAnswers::new(),
            &host("198.19.0.2/24"),
            &mut CompileCache::default(),
        );
        assert!(d.net.addresses.is_empty());
        assert!(
            d.statuses[0].message().contains("its kernel cannot tag addresses (IFA_PROTO"),
            "{}",
            d.statuses[0].message()
        );
        // Steering to another node needs no address here.
        let elsewhere = eip("e", "2024-01-01T00:00:00Z", &["198.19.0.100"], &[("198.19.0.100", "c")], "{}");
        let mut a = node.clone();
        a.node_name = "a".into();
        let d = compile_cached(
            &view(&format!("{CLUSTER}{elsewhere}")),
            &a,
            &DnsAnswers::new(),
            &host("198.19.0.1/24"),
            &mut CompileCache::default(),
        );
        assert_eq!(d.statuses[0].outcome, Outcome::Applied, "{}", d.statuses[0].message());
    }

    #[test]
    fn addresses_no_host_may_take_are_refused() {
        let mut links = host("198.19.0.2/24");
        links.links[1].gateways.push("198.19.0.254".parse().unwrap());
        for (ip, why) in [
            ("127.0.0.5", "a loopback address"),
            ("169.254.1.1", "a link-local address"),
            ("224.0.0.5", "a multicast address"),
            ("255.255.255.255", "the broadcast address"),
            ("198.19.0.254", "the gateway of link eth0 on this node"),
            ("fe80::5", "a link-local address"),
            ("ff02::1", "a multicast address"),
        ] {
            let e = eip("e", "2024-01-01T00:00:00Z", &[ip], &[(ip, "b")], "{}");
            let d = run_on(&format!("{CLUSTER}{e}"), "b", &links, false);
            assert!(d.net.addresses.is_empty(), "{ip} hosted");
            let s = d.statuses.iter().find(|s| s.key.name == "e");
            // The controller layer may already refuse some of them (then no plan at all).
            if let Some(s) = s.filter(|s| !s.message().contains("unable to parse")) {
                assert!(s.message().contains(&format!("egress IP {ip} is {why}; not used")), "{ip}: {}", s.message());
            }
        }
    }

    #[test]
    fn no_hosting_node_falls_back_or_drops_when_fail_closed() {
        let web = eip("web", "2024-01-01T00:00:00Z", &["198.19.0.100"], &[], "{matchLabels: {app: web}}");
        let open = run(&format!("{CLUSTER}{web}"), "a", "198.19.0.1/24", false);
        assert!(open.table.sets[STEER_V4].elements.is_empty());
        assert!(open.statuses[0].message().contains("1 with the node's own SNAT"), "{}", open.statuses[0].message());
        let closed = run(&format!("{CLUSTER}{web}"), "a", "198.19.0.1/24", true);
        assert_eq!(elements(&closed, STEER_V4), vec![("198.18.1.2".into(), "jump eip-drop".into())]);
        assert_eq!(*closed.table.chains[DROP_CHAIN].rules, vec!["counter drop".to_string()]);
    }

    #[test]
    fn a_family_without_egress_ips_is_left_alone_even_fail_closed() {
        let dual = CLUSTER
            .replace("status: {podIP: 198.18.1.2}", "status: {podIPs: [{ip: 198.18.1.2}, {ip: \"2001:db8:1::2\"}]}");
        let web = eip("web", "2024-01-01T00:00:00Z", &["198.19.0.100"], &[], "{matchLabels: {app: web}}");
        let d = run(&format!("{dual}{web}"), "a", "198.19.0.1/24", true);
        assert_eq!(elements(&d, STEER_V4).len(), 1, "IPv4 dropped (fail-closed)");
        assert!(d.table.sets[STEER_V6].elements.is_empty(), "IPv6 untouched: the EgressIP has no IPv6 address");
        assert!(
            d.statuses[0].message().contains("1 local pods selected: 0 SNATed here, 0 steered, 1 dropped"),
            "{}",
            d.statuses[0].message()
        );
    }

    #[test]
    fn pod_and_label_changes_are_element_updates_only() {
        let web = eip(
            "web",
            "2024-01-01T00:00:00Z",
            &["198.19.0.100"],
            &[("198.19.0.100", "b")],
            "{matchLabels: {app: web}}",
        );
        let before = run(&format!("{CLUSTER}{web}"), "a", "198.19.0.1/24", false);
        let new_pod = "---\napiVersion: v1\nkind: Pod\nmetadata: {name: p9, namespace: prod, labels: {app: web}}\nspec: {nodeName: a}\nstatus: {podIP: 198.18.1.10}\n";
        let after = run(&format!("{CLUSTER}{new_pod}{web}"), "a", "198.19.0.1/24", false);
        assert_eq!(
            crate::nft::diff(&before.table, &after.table).unwrap(),
            "add element inet egressd eip-steer-v4 { 198.18.1.10 : jump eip-mark-1 }\n"
        );
        assert_eq!(before.net, after.net, "no netlink change for a pod");
        let relabelled = CLUSTER
            .replace("name: p1, namespace: prod, labels: {app: web}", "name: p1, namespace: prod, labels: {app: db}");
        let after = run(&format!("{relabelled}{web}"), "a", "198.19.0.1/24", false);
        assert_eq!(
            crate::nft::diff(&before.table, &after.table).unwrap(),
            "delete element inet egressd eip-steer-v4 { 198.18.1.2 }\n"
        );
    }

    fn run_with(docs: &str, me: &str, addr: &str, transport: Transport) -> crate::compile::Desired {
        let node = NodeConfig::new(me, vec!["198.18.0.0/16".parse().unwrap()])
            .with_egress(EgressSettings { transport, ..Default::default() });
        compile_cached(&view(docs), &node, &DnsAnswers::new(), &host(addr), &mut CompileCache::default())
    }

    fn status_of<'d>(d: &'d crate::compile::Desired, name: &str) -> &'d ObjectStatus {
        d.statuses.iter().find(|s| s.key.name == name).unwrap()
    }

    #[test]
    fn an_assignable_node_keeps_the_tunnels_per_peer_entries_ready_while_an_egress_ip_exists() {
        let labelled = CLUSTER
            .replace("metadata: {name: c}", "metadata: {name: c, labels: {k8s.ovn.org/egress-assignable: \"\"}}");
        let web = eip("web", "2024-01-01T00:00:00Z", &["198.19.0.100"], &[("198.19.0.100", "b")], "{}");
        let tunnel_of = |docs: &str| run(docs, "c", "198.19.0.3/24", false).net.tunnel;
        // c hosts nothing and steers nothing (no pods): ready to be given the egress IP.
        // In another subnet than a and b, they would reach it through the tunnel: a
        // neighbour and a return route each.
        let far = run(&format!("{labelled}{web}"), "c", "198.51.100.3/24", false).net.tunnel;
        assert!(
            far.as_ref().is_some_and(|t| t.return_routes && t.peers.len() == 2),
            "an assignable node while an EgressIP exists: {far:?}"
        );
        // On their subnet they would steer to it on-link: no per-peer entry.
        let near = tunnel_of(&format!("{labelled}{web}"));
        assert!(near.as_ref().is_some_and(|t| t.return_routes && t.peers.is_empty()), "{near:?}");
        // With --egress-ip-transport vxlan every peer tunnels, shared link or not.
        let vxlan = run_with(&format!("{labelled}{web}"), "c", "198.19.0.3/24", Transport::Vxlan).net.tunnel;
        assert!(vxlan.as_ref().is_some_and(|t| t.peers.len() == 2), "{vxlan:?}");
        // Not assignable, or no EgressIP: nothing.
        assert_eq!(tunnel_of(&format!("{CLUSTER}{web}")), None);
        assert_eq!(tunnel_of(&labelled), None);
    }

    #[test]
    fn the_transport_is_direct_on_a_shared_link_and_the_tunnel_elsewhere_or_where_a_cloud_filters() {
        let web = eip("web", "2024-01-01T00:00:00Z", &["198.19.0.100"], &[("198.19.0.100", "b")], "{}");
        let docs = format!("{CLUSTER}{web}");
        let hops = |d: &crate::compile::Desired| d.net.routes.get(&(7471, false)).cloned().unwrap_or_default();
        let key = tunnel_key("198.19.0.100".parse().unwrap());
        let tunnel = vec![NextHop { gateway: "198.19.0.2".parse().unwrap(), link: 0, key: Some(key) }];
        let direct = vec![NextHop::direct("198.19.0.2".parse().unwrap(), 2)];
        // auto: b is on a's link → direct; a in another subnet → the tunnel.
        assert_eq!(hops(&run_with(&docs, "a", "198.19.0.1/24", Transport::Auto)), direct);
        let far = run_with(&docs, "a", "198.51.100.1/24", Transport::Auto);
        assert_eq!(hops(&far), tunnel);
        assert!(far.net.tunnel.as_ref().is_some_and(|t| !t.return_routes && t.peers.len() == 2));
        assert!(far.table.chains.contains_key("egress-tunnel-in"));
        // The packets get a's own address (its InternalIP), not the pod's.
        assert!(
            far.table.chains["egress-snat"]
                .texts()
                .iter()
                .any(|r| r.contains("rt ip nexthop @eip-tunnel-gw-v4") && r.ends_with("snat ip to 198.19.0.1")),
            "{:?}",
            far.table.chains["egress-snat"].rules
        );
        assert!(far.table.sets["eip-gateways-v4"].elements.is_empty(), "no null SNAT through the tunnel");
        // vxlan: the tunnel even on a shared link; direct: never, and says why.
        assert_eq!(hops(&run_with(&docs, "a", "198.19.0.1/24", Transport::Vxlan)), tunnel);
        let no_route = run_with(&docs, "a", "198.51.100.1/24", Transport::Direct);
        assert!(hops(&no_route).is_empty());
        assert!(
            matches!(&status_of(&no_route, "web").outcome, Outcome::Failed(m) if m.contains("no IPv4 address on a link shared with node a")),
            "{:?}",
            status_of(&no_route, "web")
        );
        // A cloud node (its providerID) is reached through the tunnel even on a shared link.
        let cloud = docs
            .replace("metadata: {name: b}\n", "metadata: {name: b}\nspec: {providerID: \"aws:///us-east-1a/i-0b\"}\n");
        assert_ne!(cloud, docs);
        assert_eq!(hops(&run_with(&cloud, "a", "198.19.0.1/24", Transport::Auto)), tunnel);
    }

    #[test]
    fn the_hosting_node_numbers_its_keys_and_refuses_a_colliding_one() {
        // 198.19.0.100 and 199.19.0.100 share their low 24 bits: one key on node b.
        let web = eip("web", "2024-01-01T00:00:00Z", &["198.19.0.100"], &[("198.19.0.100", "b")], "{}");
        let late = eip("late", "2025-01-01T00:00:00Z", &["199.19.0.100"], &[("199.19.0.100", "b")], "{}");
        let docs = format!("{CLUSTER}{web}{late}");
        let key = tunnel_key("198.19.0.100".parse().unwrap());
        assert_eq!(key, tunnel_key("199.19.0.100".parse().unwrap()));
        let far = run_with(&docs, "a", "198.51.100.1/24", Transport::Auto);
        assert!(
            matches!(&status_of(&far, "late").outcome, Outcome::Failed(m) if m.contains(&format!("has the tunnel key {key} of egress IP 198.19.0.100"))),
            "{:?}",
            status_of(&far, "late")
        );
        assert!(matches!(status_of(&far, "web").outcome, Outcome::Applied), "{:?}", status_of(&far, "web"));
        // On b: the first IP's key is read into mark 1 (under the tunnel bit) and SNATed.
        let links = HostLinks {
            links: vec![HostLink {
                index: 2,
                name: "eth0".into(),
                up: true,
                addrs: vec!["198.19.0.2/24".parse().unwrap(), "199.19.0.2/24".parse().unwrap()],
                ..Default::default()
            }],
            default_link: [Some(2), None],
            ..Default::default()
        };
        let b = run_on(&docs, "b", &links, false);
        let rx = &b.table.chains["egress-tunnel-in"].texts();
        assert!(
            rx.iter().any(|r| r.contains(&format!("@th,96,24 {key} ")) && r.contains("or 0x00810000 accept")),
            "{rx:?}"
        );
        assert_eq!(rx.iter().filter(|r| r.contains("@th,96,24")).count(), 1, "one key, once: {rx:?}");
        let snat = &b.table.chains["egress-snat"].rules;
        assert!(
            snat.iter().any(|r| r == "meta mark and 0x00ff0000 == 0x00810000 counter snat ip to 198.19.0.100"),
            "{snat:?}"
        );
        assert!(b.net.tunnel.as_ref().is_some_and(|t| t.return_routes));
    }

    #[test]
    fn tunnel_keys_are_the_low_24_bits_of_the_address() {
        for (ip, key) in [
            ("198.19.1.100", 0x13_0164),
            ("203.0.113.7", 0x00_7107),
            ("2001:db8::1:2:3", 0x02_0003),
            ("198.0.0.0", 0xff_ffff),
        ] {
            assert_eq!(tunnel_key(ip.parse().unwrap()), key, "{ip}");
        }
        assert_ne!(tunnel_mac("198.19.1.1".parse().unwrap()), tunnel_mac("198.19.1.2".parse().unwrap()));
        assert_eq!(tunnel_mac("198.19.1.2".parse().unwrap()), [0x02, 0xe9, 198, 19, 1, 2]);
        assert_ne!(tunnel_mac("2001:db8::1".parse().unwrap()), tunnel_mac("2001:db8:1::1".parse().unwrap()));
    }

    #[test]
    fn marks_stay_inside_the_mask() {
        let s = EgressSettings { mark_mask: 0x0000_f000, transport: Transport::Direct, ..Default::default() };
        assert_eq!(s.mark(1), 0x1000);
        assert_eq!(s.mark(15), 0xf000);
        assert_eq!(s.capacity(), 15);
        assert_eq!(s.tunnel_bit(), None);
        // With the tunnel possible, its bit is the mask's top one and sets count below it.
        let t = EgressSettings { mark_mask: 0x0000_f000, ..Default::default() };
        assert_eq!((t.tunnel_bit(), t.capacity()), (Some(0x8000), 7));
        assert_eq!((t.tunnel_mark(0), t.tunnel_mark(3)), (Some(0x8000), Some(0xb000)));
        assert!((1..=t.capacity()).all(|k| t.mark(k) & 0x8000 == 0));
        let one_bit = EgressSettings { mark_mask: 0x0001_0000, ..Default::default() };
        assert_eq!((one_bit.tunnel_bit(), one_bit.capacity()), (None, 1));
        assert_eq!(mark_statement(&s, 2).to_string(), "meta mark set meta mark and 0xffff0fff or 0x00002000");
        assert!(s.owns_table(7471) && !s.owns_table(7470) && !s.owns_table(7470 + 256));
    }
}
