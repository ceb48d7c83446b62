//! The firewall's rules: the base chain, and a namespace chain's rules from its
//! policy — merged runs, flattened segments, logged and `dnsName` rules — with the
//! kernel memory each encoding would take, which picks between them.

use std::collections::BTreeSet;

use compact_str::format_compact;
use ipnet::IpNet;

use super::*;

/// The base chain: prerouting at priority filter, which every packet a pod sends
/// passes whether it is forwarded or delivered to the node itself. One base chain (not
/// forward and input): the kernel validates the table from every base chain whenever a
/// `jump` element or a rule is added (bench/FINDINGS.md).
pub const FIREWALL_CHAIN: &str = "firewall";
pub(super) const CLUSTER_V4: &str = "cluster-v4";
pub(super) const CLUSTER_V6: &str = "cluster-v6";
/// Local pods' addresses → their namespace's number ([`super::numbers`]), as a packet
/// priority (`type ipv4_addr : classid`): a data map, so a pod added, moved or removed
/// is an element the kernel does not validate the table for.
pub(super) const PODS_V4: &str = "fw-pods-v4";
pub(super) const PODS_V6: &str = "fw-pods-v6";
/// A namespace's number → `jump` to its chain: one element per namespace with local
/// pods and a policy (`type classid : verdict`).
pub const NAMESPACES: &str = "fw-namespaces";

/// Most cluster and Service ranges of one family compared in the base chain's own rules;
/// a family with more has them in the interval set `cluster-v4` / `cluster-v6`.
/// Every packet passes these rules: comparing a prefix costs it less than an interval
/// set lookup (bench/FINDINGS.md, "2026-11-25 (fifth)").
pub(super) const INLINE_EXEMPT: usize = 2;

/// The exempt (cluster and Service) ranges, and the base chain's rules accepting them.
/// The exempt (cluster and Service) ranges, and the base chain's rules accepting them
/// (with verified connections: marking them, in `fw-mark`).
pub(super) fn exempt_rules(node: &NodeConfig, table: &mut Table) -> (Vec<IpNet>, Vec<Rule>) {
    let merged = node.exempt_ranges();
    let verdict = if node.verified_mark_mask != 0 { mark_verdict() } else { Verdict::Accept };
    let mut rules = Vec::new();
    for (family, v4, name) in [(Family::V4, true, CLUSTER_V4), (Family::V6, false, CLUSTER_V6)] {
        let nets: Vec<&IpNet> = merged.iter().filter(|n| n.addr().is_ipv4() == v4).collect();
        if nets.len() <= INLINE_EXEMPT {
            rules.extend(nets.iter().map(|n| Rule::new().when(addr_match(family, [*n])).verdict(verdict.clone())));
        } else {
            let mut set = Set::new(if v4 { KeyType::Ipv4 } else { KeyType::Ipv6 }, true);
            set.elements = nets.iter().map(|n| (Key::Net(**n), Value::None)).collect();
            table.sets.insert(name.into(), set);
            rules.push(Rule::new().when(Match::daddr_in(family, name)).verdict(verdict.clone()));
        }
    }
    (merged, rules)
}

/// How the base chain hands a packet it accepts to the marking rules.
pub(super) fn mark_verdict() -> Verdict {
    Verdict::goto(crate::nft::verified::CHAIN)
}

/// The base chain: (with verified connections, first: an established connection
/// verified under the current policy generation passes), replies pass, the exempt
/// ranges pass, then each pod's namespace chain; (with verified connections, what
/// passes is marked verified in `fw-mark`). Every packet entering the node walks it,
/// so what IPv4 packets never match comes after their verdict.
pub(super) fn base_chain(exempt: Vec<Rule>, verified_mask: u32) -> Chain {
    let mut rules = Vec::new();
    // First: the packets of a verified connection — most packets — pay this one rule.
    if verified_mask != 0 {
        rules.push(crate::nft::verified::fast_path(verified_mask));
    }
    rules.push(Rule::new().when(Match::CtDirection(Direction::Reply)).verdict(Verdict::Accept));
    rules.extend(exempt);
    // A local pod's packet: its namespace's number borrows the packet's priority (0 on
    // a packet from a veth: the kernel's `dev_forward_skb` clears it) to pick the
    // chain, whose first rule puts the 0 back ([`priority_restored`]). nft 1.0.6 has
    // no other way to chain two lookups in one rule that it can list.
    let pods = |family, map: &str| {
        Rule::new()
            .then(Statement::PriorityFromMap { family, field: AddrField::Saddr, map: map.into() })
            .verdict(Verdict::PriorityMap(NAMESPACES.into()))
    };
    rules.push(pods(Family::V4, PODS_V4));
    // Neighbour discovery to the node must never be filtered (ARP is not seen by inet
    // hooks at all).
    use crate::nft::rule::Icmpv6Type as T;
    let discovery = vec![T::RouterSolicit, T::RouterAdvert, T::NeighborSolicit, T::NeighborAdvert, T::Redirect];
    rules.push(Rule::new().when(Match::Icmpv6Types(discovery)).verdict(Verdict::Accept));
    rules.push(pods(Family::V6, PODS_V6));
    // What the namespace chains returned (allowed) or let through, and what no chain
    // looked at: accepted, the connection marked verified.
    if verified_mask != 0 {
        rules.push(Rule::new().verdict(mark_verdict()));
    }
    Chain::base(Hook { chain_type: "filter", hook: "prerouting", priority: "filter" }, rules)
}

/// A namespace chain's first rule: the packet's priority, which the base chain set to
/// the namespace's number to reach the chain, back to the 0 it arrived with.
pub(super) fn priority_restored() -> Rule {
    Rule::new().then(Statement::PriorityNone)
}

pub(super) fn proto(p: Protocol) -> Proto {
    match p {
        Protocol::Tcp => Proto::Tcp,
        Protocol::Udp => Proto::Udp,
        Protocol::Sctp => Proto::Sctp,
    }
}

/// The match of a rule's ports (`None`: any port).
pub(super) fn ports_match(ports: &Ports) -> Option<Match> {
    match (ports.first(), ports.len()) {
        (None, _) => None,
        (Some((p, port)), 1) => Some(Match::Dport(proto(*p), *port)),
        _ => Some(Match::ProtoPortIn(ports.iter().map(|(p, port)| (proto(*p), *port)).collect())),
    }
}

/// The match of a destination among `addrs` (one: compared; more: an anonymous set).
pub(super) fn addr_match<'a>(family: Family, addrs: impl IntoIterator<Item = &'a IpNet>) -> Match {
    let mut nets: Vec<IpNet> = addrs.into_iter().copied().collect();
    match (nets.pop(), nets.is_empty()) {
        (Some(net), true) => Match::Addr { family, field: AddrField::Daddr, net },
        (last, _) => {
            nets.extend(last);
            Match::AddrAnyOf { family, field: AddrField::Daddr, nets }
        }
    }
}

/// A rule's tail after its destination: its ports, counters, verdict and comment.
pub(super) fn counted(dst: Match, ports: Option<&Match>, total: &str, verdict: Verdict, comment: Name) -> Rule {
    let mut r = Rule::new().when(dst);
    r.matches.extend(ports.cloned());
    r.then(Statement::NamedCounter(total.into())).then(Statement::Counter).verdict(verdict).comment(comment)
}

/// Compile one rule into nft statements (one per address family it touches). Returns
/// an error for targets this version cannot enforce.
pub(super) fn rule_statements(
    index: usize,
    rule: &FirewallRule,
    log: &LogSpec,
    ctx: &Ctx,
    verified: bool,
) -> Result<Vec<Rule>, String> {
    // Audit mode: a Deny counts and accepts (first match stays final: nothing after it
    // is evaluated, as if it had dropped).
    let (verdict, total) = match rule.action {
        // A `dnsName` destination can leave its set without a change of the table (a
        // timeout): such a connection is never marked verified.
        Action::Allow => (allow_verdict(verified && !matches!(rule.target, Target::Dns(_))), "fw-allow"),
        Action::Deny if log.audit => (Verdict::Accept, "fw-audit"),
        Action::Deny => (Verdict::Drop, "fw-deny"),
    };
    let ports = ports_match(&rule.ports);
    // Logged verdicts: the first packet of each new connection is copied to NFLOG
    // first (a rule without a verdict), at most `rate` per second per rule; what the
    // limit holds back is counted in `acl-over`.
    let logged = match rule.action {
        Action::Allow => log.allow.as_deref().map(|sev| ("allow", sev)),
        Action::Deny if log.audit => Some(("audit", log.deny.as_deref().unwrap_or("warning"))),
        Action::Deny => log.deny.as_deref().map(|sev| ("deny", sev)),
    };
    // The rules of one destination match: (the log copy and its overflow count, then)
    // the rule's own counter (`egressd status --counters`, `explain --kernel`) and the
    // node's total by verdict (`egressd_firewall_packets`).
    let with_match = |dst: Match| -> Vec<Rule> {
        let mut out = Vec::new();
        if let Some((what, sev)) = logged {
            let s = &ctx.node.acl_log;
            let new = Rule::new().when(dst.clone()).when_some(ports.clone()).when(Match::CtState(CtState::New));
            let limit = |over| Statement::Limit { rate: s.rate.into(), burst: s.rate, over };
            let prefix = format_compact!("acl {} {index} {what} {sev} ", log.namespace);
            out.push(new.clone().then(limit(false)).then(Statement::Log {
                prefix,
                group: s.group,
                queue_threshold: None,
            }));
            out.push(new.then(limit(true)).then(Statement::NamedCounter(ACL_OVER.into())));
        }
        out.push(counted(dst, ports.as_ref(), total, verdict.clone(), format_compact!("egress[{index}]")));
        out
    };
    let targets: BTreeSet<IpNet> = match &rule.target {
        Target::Cidr(_) | Target::Nodes(_) => static_targets(rule, ctx).unwrap_or_default(),
        Target::Dns(name) if name.wildcard && ctx.node.snoop.is_none() => {
            return Err(format!(
                "spec.egress[{index}].to.dnsName: {name}: wildcard DNS names need DNS snooping, which is off (--no-dns-snoop) or unavailable (see the log)"
            ));
        }
        Target::Dns(name) => {
            // Each family in use always references its set (filled by the compile, for
            // every chain, from the current answers), so address changes are element
            // updates and never change a rule.
            let r = DnsRef::of(name);
            return Ok(dns_families(ctx, &r).flat_map(|(family, _, slot)| with_match(slot.matched(family))).collect());
        }
    };
    let mut out = Vec::new();
    for (family, v4) in [(Family::V4, true), (Family::V6, false)] {
        let addrs: BTreeSet<IpNet> = targets.iter().filter(|n| n.addr().is_ipv4() == v4).copied().collect();
        if addrs.is_empty() {
            continue;
        }
        out.extend(with_match(addr_match(family, &addrs)));
    }
    Ok(out)
}

/// An allow's verdict: `return` (the base chain marks the connection verified under
/// the current policy generation and accepts, [`crate::nft::verified`]) where the
/// chain may, else `accept`.
pub(super) fn allow_verdict(verified: bool) -> Verdict {
    if verified { Verdict::Return } else { Verdict::Accept }
}

/// Whether a namespace's allowed connections may be marked verified: the fast path is
/// on, and no Deny rule's destinations can grow without a change of the table (a
/// `dnsName` answer learned by DNS snooping goes straight into its set, and must reach
/// the connections already allowed).
pub(super) fn may_verify(policy: &FirewallPolicy, node: &NodeConfig) -> bool {
    node.verified_mark_mask != 0
        && !(node.snoop.is_some()
            && policy.rules.iter().any(|r| r.action == Action::Deny && matches!(r.target, Target::Dns(_))))
}

/// The destinations of a CIDR or nodeSelector rule (`None` for a `dnsName` rule).
pub(super) fn static_targets(rule: &FirewallRule, ctx: &Ctx) -> Option<BTreeSet<IpNet>> {
    match &rule.target {
        Target::Cidr(net) => Some(BTreeSet::from([*net])),
        Target::Nodes(sel) => Some(
            ctx.view
                .nodes
                .values()
                .filter(|n| sel.matches(&n.labels))
                .flat_map(|n| n.addresses.iter().map(|a| IpNet::from(*a)))
                .collect(),
        ),
        Target::Dns(_) => None,
    }
}

/// The name of a chain's next run set of this kind: `<chain>-h4-<k>` (hash, IPv4),
/// `-h6-`, `-r4-`, `-r6-` (interval), numbered per kind. A name always has the same
/// declaration, so an edit that changes the kinds a chain uses creates and deletes sets
/// and changes elements; a set changing its declaration under one name would make the
/// change a full replace (12.7 s at 100k interleaved rules, bench/FINDINGS.md).
pub(super) fn set_name(chain: &str, sets: &[(Text, Set)], key: KeyType, interval: bool) -> String {
    let k = sets.iter().filter(|(_, s)| s.key == key && s.interval == interval).count();
    let family = if key.is_v6() { 6 } else { 4 };
    format!("{chain}-{}{family}-{k}", if interval { "r" } else { "h" })
}

/// Most destinations of a merged match compared in rules (one rule each) rather than
/// looked up in a set.
pub(super) const INLINE_MAX: usize = 4;

/// The nft rules of merged runs ([`crate::compile::runs`]): one per family and port set, with
/// the run's counter and comment, its destinations (more than one) in named sets of the
/// namespace ([`set_name`], added to `sets`) when there are more than [`INLINE_MAX`]
/// (else one rule each): of one or two prefix lengths, a hash set of networks per
/// length (`<chain>-h4-<k>`) and a rule looking up the masked destination in it
/// (`ip daddr and 255.255.255.0 @fw-ns-h4-0`); of more, one interval set
/// (`<chain>-r4-<k>`). The chain's shape then depends on the actions, port sets and prefix lengths:
/// editing a destination of a merged run (same length), or a node's addresses, changes
/// elements, not rules, and the kernel re-validates nothing.
pub(super) fn run_statements(
    runs: &[crate::compile::runs::Run],
    chain: &str,
    sets: &mut Vec<(Text, Set)>,
    verified: bool,
) -> Vec<Rule> {
    let mut out = Vec::new();
    for run in runs {
        let (verdict, total) = match run.action {
            Action::Allow => (allow_verdict(verified), "fw-allow"),
            Action::Deny => (Verdict::Drop, "fw-deny"),
        };
        for m in &run.matches {
            let family = if m.v4 { Family::V4 } else { Family::V6 };
            let key = if m.v4 { KeyType::Ipv4 } else { KeyType::Ipv6 };
            let mut matched = Vec::new();
            if m.listed.len() <= INLINE_MAX {
                // A few destinations are compared in rules, one each: a set per match
                // would make the kernel, which finds sets by name in a list, quadratic
                // in the rules when actions interleave (25k sets: 13 s to load 100k
                // rules, bench/FINDINGS.md).
                matched.extend(m.listed.iter().map(|n| addr_match(family, [n])));
            } else if let Some(groups) = crate::compile::runs::by_length(&m.listed) {
                // Destinations of one or two prefix lengths: per length, the destination
                // masked to it looked up among the networks (a hash set).
                for (len, nets) in groups {
                    let name = set_name(chain, sets, key, false);
                    let elements = nets.iter().map(|n| (Key::Addr(n.network()), Value::None)).collect();
                    sets.push((name.as_str().into(), Set { elements, ..Set::new(key, false) }));
                    let full = if m.v4 { 32 } else { 128 };
                    matched.push(match nets.first() {
                        Some(n) if len < full => {
                            Match::AddrMaskedIn { family, field: AddrField::Daddr, mask: n.netmask(), set: name.into() }
                        }
                        _ => Match::daddr_in(family, name),
                    });
                }
            } else {
                let name = set_name(chain, sets, key, true);
                // Collected, not inserted one by one: built from sorted keys, the map's
                // nodes are full (a third less memory at 100k ranges).
                let elements = m.addrs.iter().map(|n| (Key::Net(*n), Value::None)).collect();
                sets.push((name.as_str().into(), Set { elements, ..Set::new(key, true) }));
                matched.push(Match::daddr_in(family, name));
            }
            let ports = ports_match(&m.ports);
            for matched in matched {
                out.push(counted(matched, ports.as_ref(), total, verdict.clone(), run.comment()));
            }
        }
    }
    out
}

/// What the kernel keeps per object, in bytes, measured on this project's test kernel
/// (6.18: tables loaded in a memory cgroup, bench/FINDINGS.md "2026-11-27 (fourth)"): a
/// rule; a named hash set and each element; an interval (rbtree) set and each prefix;
/// and a concatenated interval set (pipapo), which for a small set keeps a 256-bucket
/// lookup table per byte of its key however few its elements (~113 KB for `meta
/// l4proto . th dport . ip daddr`, ~300 KB with `ip6 daddr`), and each element.
pub(super) const RULE_BYTES: usize = 1_000;
pub(super) const HASH_SET_BYTES: usize = 700;
pub(super) const HASH_ELEMENT_BYTES: usize = 70;
pub(super) const INTERVAL_SET_BYTES: usize = 16_500;
pub(super) const INTERVAL_ELEMENT_BYTES: usize = 140;
pub(super) const PIPAPO_KEY_BYTE_BYTES: usize = 16_000;
pub(super) const PIPAPO_ELEMENT_BYTES: usize = 100;

/// The kernel memory [`run_statements`] would take for `runs`.
pub(super) fn run_cost(runs: &[crate::compile::runs::Run]) -> usize {
    runs.iter()
        .flat_map(|run| &run.matches)
        .map(|m| {
            if m.listed.len() <= INLINE_MAX {
                m.listed.len() * RULE_BYTES
            } else if let Some(groups) = crate::compile::runs::by_length(&m.listed) {
                groups.len() * (RULE_BYTES + HASH_SET_BYTES) + m.listed.len() * HASH_ELEMENT_BYTES
            } else {
                RULE_BYTES + INTERVAL_SET_BYTES + m.addrs.len() * INTERVAL_ELEMENT_BYTES
            }
        })
        .sum()
}

/// The kernel memory [`box_statements`] would take for `boxes` (IPv4, IPv6).
pub(super) fn box_cost(boxes: &[crate::compile::boxes::Boxes; 2]) -> usize {
    let mut cost = 0;
    for (b, address_bytes) in boxes.iter().zip([4, 16]) {
        for action in [Action::Allow, Action::Deny] {
            let ported = b.ported.iter().filter(|(_, _, p)| p.action == action).count();
            if ported > 0 {
                // Protocol (1 byte), port (2), address.
                cost += RULE_BYTES + PIPAPO_KEY_BYTE_BYTES * (3 + address_bytes) + ported * PIPAPO_ELEMENT_BYTES;
            }
            let portless = b.portless.iter().filter(|p| p.action == action).count();
            if portless > 0 {
                cost += RULE_BYTES + INTERVAL_SET_BYTES + portless * INTERVAL_ELEMENT_BYTES;
            }
        }
    }
    cost
}

/// The nft rules of a segment of static rules (the rules between two `dnsName` rules,
/// `segment` counting them in the chain): merged runs ([`run_statements`]) or, where
/// the kernel keeps less of it, flattened ([`box_statements`]) — a segment whose runs
/// need many interval sets (a run of more than [`INLINE_MAX`] destinations of more than
/// two prefix lengths has its own), or a long portless one. Flattened, an edit of the
/// segment is element changes and a packet meets at most four lookups per family; but
/// each concatenated interval set costs the kernel ~113 KB however few its elements
/// are, so rule lists that merged runs keep in rules stay so (a namespace of 100 ported
/// rules that do not merge: ~100 KB as rules, ~800 KB flattened).
pub(super) fn segment_statements(
    rules: &[crate::compile::runs::StaticRule],
    chain: &str,
    segment: usize,
    sets: &mut Vec<(Text, Set)>,
    verified: bool,
) -> Vec<Rule> {
    let runs = crate::compile::runs::merge(rules);
    let cost = run_cost(&runs);
    // No flattened segment is cheaper than one lookup in one interval set.
    if cost <= RULE_BYTES + INTERVAL_SET_BYTES {
        return run_statements(&runs, chain, sets, verified);
    }
    let boxes = [crate::compile::boxes::flatten(rules, true), crate::compile::boxes::flatten(rules, false)];
    if box_cost(&boxes) < cost {
        box_statements(&boxes, chain, segment, sets, verified)
    } else {
        run_statements(&runs, chain, sets, verified)
    }
}

/// A segment's rules flattened into disjoint pieces ([`crate::compile::boxes`]): per family, the
/// ported pieces of allowed and of denied destinations looked up by protocol, port and
/// destination (`meta l4proto . th dport . ip daddr @<chain>-s<segment>-pa4`, then
/// `-pd4`), then the portless ones by destination (`ip daddr @<chain>-s<segment>-a4`,
/// `-d4`). A packet meets at most four lookups whatever the number of rules, the
/// kernel loads elements (linear in them, no rule per policy rule to validate) and an
/// edit is element changes. Each lookup's rule counts for the rules it holds pieces of
/// (`egress[first..last]`, as a merged run).
pub(super) fn box_statements(
    boxes: &[crate::compile::boxes::Boxes; 2],
    chain: &str,
    segment: usize,
    sets: &mut Vec<(Text, Set)>,
    verified: bool,
) -> Vec<Rule> {
    use crate::compile::boxes::Piece;
    let mut out = Vec::new();
    for (boxes, v4) in boxes.iter().zip([true, false]) {
        let (family, f) = if v4 { (Family::V4, 4) } else { (Family::V6, 6) };
        for (ported, action) in
            [(true, Action::Allow), (true, Action::Deny), (false, Action::Allow), (false, Action::Deny)]
        {
            let pieces: Vec<(Key, &Piece)> = if ported {
                boxes
                    .ported
                    .iter()
                    .filter(|(_, _, p)| p.action == action)
                    .map(|(proto, port, p)| (Key::Ported(*proto, *port, p.net), p))
                    .collect()
            } else {
                boxes.portless.iter().filter(|p| p.action == action).map(|p| (Key::Net(p.net), p)).collect()
            };
            let (Some(first), Some(last)) =
                (pieces.iter().map(|(_, p)| p.index).min(), pieces.iter().map(|(_, p)| p.index).max())
            else {
                continue;
            };
            let kind = match action {
                Action::Allow => 'a',
                Action::Deny => 'd',
            };
            let name = format!("{chain}-s{segment}-{}{kind}{f}", if ported { "p" } else { "" });
            let key = match (ported, v4) {
                (true, true) => KeyType::PortIpv4,
                (true, false) => KeyType::PortIpv6,
                (false, true) => KeyType::Ipv4,
                (false, false) => KeyType::Ipv6,
            };
            let elements = pieces.into_iter().map(|(k, _)| (k, Value::None)).collect();
            sets.push((name.as_str().into(), Set { elements, ..Set::new(key, true) }));
            let (verdict, total) = match action {
                Action::Allow => (allow_verdict(verified), "fw-allow"),
                Action::Deny => (Verdict::Drop, "fw-deny"),
            };
            let lookup = if ported {
                Match::ProtoPortAddrIn { family, set: name.into() }
            } else {
                Match::daddr_in(family, name)
            };
            let comment = crate::compile::runs::comment(first, last);
            out.push(counted(lookup, None, total, verdict, comment));
        }
    }
    out
}
