//! EgressIP's output: the routes and mark rules of the next-hop sets, the sets and
//! base chains (exempt destinations, steering, SNAT, the guard), and each EgressIP's
//! status text on this node.

use super::*;

/// One mark chain, table and rule per next-hop set, whether or not a local pod uses it
/// now, so pods coming and going (and label changes) are element updates only.
pub(super) fn emit_routes(
    settings: &EgressSettings,
    hop_sets: &HopSets,
    via: &BTreeMap<IpAddr, Vec<NextHop>>,
    table: &mut Table,
    net: &mut NetDesired,
) {
    let mut gateways = [Set::new(KeyType::Ipv4, false), Set::new(KeyType::Ipv6, false)];
    for ((v6, hops), k) in hop_sets {
        table.chains.insert(format_compact!("eip-mark-{k}"), Chain::regular([mark_statement(settings, *k)]));
        let table_id = settings.table_base + k;
        net.routes.insert((table_id, *v6), hops.clone());
        net.rules.insert(MarkRule {
            v6: *v6,
            mark: settings.mark(*k),
            mask: settings.mark_mask,
            table: table_id,
            priority: settings.rule_priority,
        });
        if !via.values().any(|v| v == hops) {
            // Next hops that are nodes: packets routed to them get the null SNAT.
            for hop in hops.iter().filter(|h| h.key.is_none()) {
                gateways[usize::from(*v6)].elements.insert(Key::Addr(hop.gateway), Value::None);
            }
        }
    }
    let [g4, g6] = gateways;
    table.sets.insert(GATEWAYS_V4.into(), g4);
    table.sets.insert(GATEWAYS_V6.into(), g6);
}

/// What [`emit_tables`] writes besides the exempt destinations.
pub(super) struct Tables<'a> {
    pub(super) steer: [Set; 2],
    pub(super) snat: [Set; 2],
    pub(super) snat_chains: &'a BTreeSet<IpAddr>,
    pub(super) drop_used: bool,
    /// SNAT rules of the tunnel (before the null SNAT of on-link steering), when it is in
    /// use: then egressd's mark bits are also cleared in postrouting.
    pub(super) tunnel_snat: Option<Vec<Rule>>,
}

/// `ip daddr @eip-exempt-v4 return` and its IPv6 twin.
pub(super) fn exempt_returns() -> Vec<Rule> {
    [(Family::V4, EXEMPT_V4), (Family::V6, EXEMPT_V6)]
        .map(|(family, set)| Rule::new().when(Match::daddr_in(family, set)).verdict(Verdict::Return))
        .to_vec()
}

/// `ip saddr vmap @<v4>` and `ip6 saddr vmap @<v6>`.
pub(super) fn saddr_maps([v4, v6]: [&str; 2]) -> Vec<Rule> {
    [(Family::V4, v4), (Family::V6, v6)]
        .map(|(family, map)| Rule::new().verdict(Verdict::Map { family, field: AddrField::Saddr, map: map.into() }))
        .to_vec()
}

/// The sets and base chains: exempt destinations, steering, SNAT, the guard.
pub(super) fn emit_tables(ctx: &Ctx, t: Tables, table: &mut Table) {
    let Tables { steer, snat, snat_chains, drop_used, tunnel_snat } = t;
    let tunnel_on = tunnel_snat.is_some();
    let settings = &ctx.node.egress;
    // Destinations never steered nor SNATed to an egress IP: cluster, services, nodes.
    let mut exempt_nets = ctx.node.exempt_ranges();
    exempt_nets.extend(ctx.node_addrs.iter().map(|a| IpNet::from(*a)));
    let mut exempt = [Set::new(KeyType::Ipv4, true), Set::new(KeyType::Ipv6, true)];
    for n in IpNet::aggregate(&exempt_nets) {
        exempt[fam(n.addr())].elements.insert(Key::Net(n), Value::None);
    }

    let [e4, e6] = exempt;
    table.sets.insert(EXEMPT_V4.into(), e4);
    table.sets.insert(EXEMPT_V6.into(), e6);
    let [s4, s6] = steer;
    table.sets.insert(STEER_V4.into(), s4);
    table.sets.insert(STEER_V6.into(), s6);
    let [n4, n6] = snat;
    table.sets.insert(SNAT_V4.into(), n4);
    table.sets.insert(SNAT_V6.into(), n6);
    if drop_used {
        table
            .chains
            .insert(DROP_CHAIN.into(), Chain::regular([Rule::new().then(Statement::Counter).verdict(Verdict::Drop)]));
    }
    for ip in snat_chains {
        let snat = Rule::new().then(Statement::SnatTo(*ip));
        table.chains.insert(ip_chain("eip-snat", *ip).into(), Chain::regular([snat]));
    }
    table.chains.insert(
        STEER_CHAIN.into(),
        Chain::base(
            Hook { chain_type: "filter", hook: "prerouting", priority: "dstnat + 10" },
            [
                vec![Rule::new().when(Match::CtDirection(Direction::Reply)).verdict(Verdict::Return)],
                exempt_returns(),
                saddr_maps([STEER_V4, STEER_V6]),
            ]
            .concat(),
        ),
    );
    table.chains.insert(
        SNAT_CHAIN.into(),
        Chain::base(
            Hook { chain_type: "nat", hook: "postrouting", priority: "srcnat - 1" },
            snat_rules(settings, tunnel_snat),
        ),
    );
    table.chains.insert(
        GUARD_CHAIN.into(),
        Chain::base(
            Hook { chain_type: "filter", hook: "postrouting", priority: "srcnat + 1" },
            guard_rules(settings, tunnel_on),
        ),
    );
}

/// The SNAT chain: exempt destinations return; the tunnel's SNAT; a null SNAT (and the
/// connection marked) for what is routed to a hosting node; the SNAT maps by source.
fn snat_rules(settings: &EgressSettings, tunnel_snat: Option<Vec<Rule>>) -> Vec<Rule> {
    let m = settings.mark_mask;
    let mut snat_rules = exempt_returns();
    snat_rules.extend(tunnel_snat.into_iter().flatten());
    for (family, gateways) in [(Family::V4, GATEWAYS_V4), (Family::V6, GATEWAYS_V6)] {
        snat_rules.push(
            Rule::new()
                .when(Match::mark_any(MarkOf::Packet, m))
                .when(Match::RtNexthopIn { family, set: gateways.into(), negated: false })
                .then(Statement::CtMarkOr(m))
                .then(Statement::Counter)
                .then(Statement::SnatToSaddr(family)),
        );
    }
    snat_rules.extend(saddr_maps([SNAT_V4, SNAT_V6]));
    snat_rules
}

/// The guard: a connection that got the null SNAT keeps the pod's address for its
/// lifetime (NAT is decided once per connection): if its packets are later routed
/// anywhere but to a hosting node (its EgressIP went away, a route is missing), they
/// would leave with the pod's address. They are dropped instead.
fn guard_rules(settings: &EgressSettings, tunnel_on: bool) -> Vec<Rule> {
    let m = settings.mark_mask;
    let mut guard: Vec<Rule> = [(Family::V4, GATEWAYS_V4), (Family::V6, GATEWAYS_V6)]
        .into_iter()
        .map(|(family, gateways)| {
            Rule::new()
                .when(Match::CtDirection(Direction::Original))
                .when(Match::Mark { of: MarkOf::Conn, mask: m, cmp: Cmp::Eq, value: m })
                .when(Match::Nfproto(family))
                .when(Match::RtNexthopIn { family, set: gateways.into(), negated: true })
                .then(Statement::Counter)
                .verdict(Verdict::Drop)
        })
        .collect();
    if tunnel_on {
        guard.push(tunnel::clear_mark_rule(settings));
    }
    guard
}

/// The status text of one EgressIP on this node: its problems, and what the node does
/// with it (addresses hosted, pods selected, SNATed, steered, left to the fallback).
pub(super) fn plan_status(plan: &Plan, overflow: bool, node: &NodeConfig) -> ObjectStatus {
    let settings = &node.egress;
    let e = plan.entry;
    let mut problems = plan.problems.clone();
    if let Some(err) = &e.error {
        problems.insert(0, format!("{err} (the last valid version is applied)"));
    }
    if overflow && !plan.fallback.is_empty() && !plan.remote.iter().all(Vec::is_empty) {
        problems.push(format!(
            "more than {} distinct sets of hosting nodes: some pods are not steered (widen --egress-ip-mark-mask)",
            settings.capacity()
        ));
    }
    let hosted = if plan.hosted_list.is_empty() {
        "hosts no egress IP".to_string()
    } else {
        let list: Vec<String> = plan.hosted_list.iter().map(|(ip, link)| format!("{ip} on {link}")).collect();
        format!("hosts {}", list.join(", "))
    };
    let remote = if plan.remote_nodes.is_empty() {
        String::new()
    } else {
        format!(" (elsewhere: {})", plan.remote_nodes.iter().cloned().collect::<Vec<_>>().join(", "))
    };
    let fallback = if plan.fallback.is_empty() {
        String::new()
    } else if settings.fail_closed {
        format!(", {} dropped (no hosting node)", plan.fallback.len())
    } else {
        format!(", {} with the node's own SNAT (no hosting node)", plan.fallback.len())
    };
    let summary = format!(
        "{hosted}{remote}; {} local pods selected: {} SNATed here, {} steered{fallback}",
        plan.selected_local.len(),
        plan.snat_here.len(),
        plan.steered.len()
    );
    // Unplaced IPs: the object is not fully applied, but no node can do anything about
    // it (the leader reports it once, as Events): not a problem of this node.
    let cluster_only = problems.is_empty() && !(plan.unplaced.is_empty() && plan.cluster_problems.is_empty());
    let at = usize::from(e.error.is_some());
    problems.splice(at..at, plan.cluster_problems.iter().cloned());
    if !plan.unplaced.is_empty() {
        let list: Vec<String> = plan.unplaced.iter().map(ToString::to_string).collect();
        problems.push(format!("egress IP {} not assigned to any node (no status.items entry)", list.join(", ")));
    }
    let outcome = if problems.is_empty() { Outcome::Applied } else { Outcome::Failed(problems.join("; ")) };
    let mut status = ObjectStatus::new(e.key.clone(), &node.node_name, outcome).with_detail(summary);
    status.cluster_only = cluster_only;
    status
}
