//! EgressFirewall → nft.
//!
//! Layout (see docs/design/packet-path.md):
//!
//! * `firewall` (prerouting, priority filter: after conntrack and DNAT, before the
//!   routing decision, so it sees both the pods' forwarded traffic and their traffic to
//!   this node's own addresses), only while some EgressFirewall exists:
//!   replies pass (`ct direction reply`), cluster and service destinations pass, then
//!   `ip saddr vmap @fw-pods-v4` / `ip6 saddr vmap @fw-pods-v6` jump to the pod's
//!   namespace chain. Per-packet cost: two set lookups and one map lookup, whatever the
//!   number of namespaces and pods. With verified connections, first of all an
//!   established connection verified under the current policy generation is accepted
//!   (one lookup in `fw-epoch`; [`crate::nft::verified`]), and what the chain accepts
//!   (exempt, allowed, let through) goes to `fw-mark`, which marks it verified.
//! * `fw-<namespace>`: the namespace's rules in order; the first match accepts or
//!   drops; no match returns to the base chain, whose policy is accept. Consecutive
//!   CIDR/nodeSelector rules with the same action are one nft rule per family and port
//!   set ([`super::runs`]; not in chains that log), commented `egress[i..j]`, its
//!   destinations (more than [`INLINE_MAX`]) in named sets of the namespace
//!   (`fw-<namespace>-h4-<k>`, ... [`set_name`]): a changed destination is an element
//!   change, sent without re-validating the table. A segment whose runs would need
//!   many named sets is flattened instead ([`super::boxes`], [`segment_statements`]):
//!   its rules as disjoint pieces in at most four lookups per family.
//!   With verified connections an allow returns to the base chain, which has the
//!   connection marked verified and accepts it, except for `dnsName` destinations and in
//!   namespaces with a Deny by name that DNS snooping feeds (their sets change without
//!   a change of the table): those accept, and their chain ends in `accept`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use compact_str::{ToCompactString, format_compact};
use ipnet::IpNet;

use super::{NodeConfig, ObjectStatus, Outcome};
use crate::dns::{DnsAnswers, element_timeout};
use crate::nft::rule::{AddrField, CtState, Direction, Family, Match, Name, Proto, Rule, Statement, Verdict};
use crate::nft::{Chain, Hook, KeyType, Set, Slot, Table, Text, chain_name};
use crate::view::policy::{Action, DnsName, FirewallPolicy, FirewallRule, Ports, Protocol, Target};
use crate::view::{ACL_LOGGING_ANNOTATION, ClusterView};

/// What rule compilation reads besides the rule.
struct Ctx<'a> {
    view: &'a ClusterView,
    node: &'a NodeConfig,
    dns: &'a DnsAnswers,
    /// Cluster and Service ranges: resolved addresses inside them are dropped.
    exempt: Vec<IpNet>,
    /// The version of the view's nodes (their [`crate::view::Tracked::stamp`]).
    nodes_epoch: u64,
}

/// The absolute name egressd resolves for a rule name (`*.base.` for a wildcard, which
/// is never resolved, only learned by snooping).
pub fn absolute(name: &DnsName) -> String {
    if name.wildcard { format!("*.{}.", name.base) } else { format!("{}.", name.base) }
}

/// The shared sets of every DNS name's addresses: IPv4, IPv6 ([`Slot`]).
pub const DNS_SETS: [&str; 2] = ["dns-v4", "dns-v6"];

/// Where the addresses of an (absolute) rule name are: its slots of the shared DNS sets,
/// IPv4, then IPv6. The tag is the first 64 bits of the name's SHA-256: the same on
/// every node and after every restart, with no table of names to keep; a wildcard
/// (`*.example.com.`) is another name than its base, so the two never share. Two names
/// sharing a tag would share addresses: with 64 bits that takes ~2^32 names for an
/// accidental pair, and ~2^64 tries to make a name that meets a given one.
pub fn dns_slots(name: &str) -> [Slot; 2] {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(name.as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    let tag = u64::from_be_bytes(first);
    [Slot { set: DNS_SETS[0], tag }, Slot { set: DNS_SETS[1], tag }]
}

/// Every `dnsName` of the firewall policies of `view`, with repeats.
pub fn dns_rule_names(view: &ClusterView) -> impl Iterator<Item = &DnsName> {
    view.firewalls.values().filter_map(|e| e.policy.as_ref()).flat_map(|p| p.rules.iter()).filter_map(|r| {
        match &r.target {
            Target::Dns(name) => Some(&**name),
            _ => None,
        }
    })
}

/// Every DNS name the firewall policies of `view` use (resolved once each, whichever
/// rules and namespaces share it). Wildcards are not resolvable and not included.
pub fn dns_names(view: &ClusterView) -> BTreeSet<String> {
    dns_rule_names(view).filter(|n| !n.wildcard).map(absolute).collect()
}

/// [`dns_names`] kept per namespace with the policy version it was read from, and
/// counted by name: a change looks only at the namespaces the view's journal lists
/// (an unchanged policy is the same allocation), not at every policy. Gives exactly what
/// [`dns_names`] gives (tests/incremental.rs).
#[derive(Debug, Default)]
pub struct DnsNamesCache {
    by_namespace: HashMap<String, (Arc<FirewallPolicy>, Vec<String>)>,
    /// Each name and how many namespaces' policies have it.
    counts: BTreeMap<String, usize>,
    /// The stamp of the view's EgressFirewalls this was made from.
    from: Option<u64>,
}

impl DnsNamesCache {
    /// Every resolvable DNS name the firewall policies of `view` use.
    pub fn names(&mut self, view: &ClusterView) -> BTreeSet<String> {
        let touched: Vec<String> = match self.from.and_then(|s| view.firewalls.touched_since(s)) {
            Some(touched) => touched.into_iter().map(str::to_string).collect(),
            None => {
                self.counts.clear();
                let mut kept = std::mem::take(&mut self.by_namespace);
                // Read again, but a policy of the same version keeps its names.
                for (ns, entry) in &view.firewalls {
                    if let Some(policy) = &entry.policy
                        && let Some((read, names)) = kept.remove(ns).filter(|(read, _)| Arc::ptr_eq(read, policy))
                    {
                        self.add(ns.clone(), read, names);
                    }
                }
                view.firewalls.keys().filter(|ns| !self.by_namespace.contains_key(*ns)).cloned().collect()
            }
        };
        for ns in touched {
            let policy = view.firewalls.get(&ns).and_then(|e| e.policy.clone());
            let old = self.by_namespace.remove(&ns);
            let names = match (&old, &policy) {
                (Some((read, names)), Some(policy)) if Arc::ptr_eq(read, policy) => names.clone(),
                _ => policy.as_deref().map(names_of).unwrap_or_default(),
            };
            for name in old.into_iter().flat_map(|(_, names)| names) {
                if let Some(n) = self.counts.get_mut(&name) {
                    *n -= 1;
                    if *n == 0 {
                        self.counts.remove(&name);
                    }
                }
            }
            if let Some(policy) = policy {
                self.add(ns, policy, names);
            }
        }
        self.from = Some(view.firewalls.stamp());
        self.counts.keys().cloned().collect()
    }

    fn add(&mut self, namespace: String, policy: Arc<FirewallPolicy>, names: Vec<String>) {
        for name in &names {
            *self.counts.entry(name.clone()).or_default() += 1;
        }
        self.by_namespace.insert(namespace, (policy, names));
    }
}

/// The resolvable names of `policy`'s `dnsName` rules, sorted, each once.
fn names_of(policy: &FirewallPolicy) -> Vec<String> {
    let mut names: Vec<String> = policy
        .rules
        .iter()
        .filter_map(|r| match &r.target {
            Target::Dns(n) if !n.wildcard => Some(absolute(n)),
            _ => None,
        })
        .collect();
    names.sort_unstable();
    names.dedup();
    names
}

/// The slots of the wildcard `dnsName` rules of `view` (filled only by snooping), each
/// with the set an egressd before the shared sets kept it in (`dnsw4-<base>`,
/// `dnsw6-<base>`, or `-h<hash>` for a base that is not a readable nft name): at
/// start-up, what an older version learned is read back from there too, so an upgrade
/// loses none of it.
pub fn wildcard_slots(view: &ClusterView) -> BTreeMap<Slot, String> {
    let mut out = BTreeMap::new();
    for name in dns_rule_names(view).filter(|n| n.wildcard) {
        let slots = dns_slots(&absolute(name));
        let readable = !name.base.is_empty()
            && name.base.len() <= 200
            && name.base.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
            && name.base.starts_with(|c: char| c.is_ascii_alphanumeric());
        for (slot, prefix) in slots.into_iter().zip(["dnsw4", "dnsw6"]) {
            let legacy = if readable {
                format!("{prefix}-{}", name.base)
            } else {
                chain_name(prefix, &format!("\u{0}{}", name.base))
            };
            out.insert(slot, legacy);
        }
    }
    out
}

/// A `dnsName` rule's name as its compiled chain keeps it: absolute (what the answers
/// are keyed by) and its slots, so that filling its sets at every compile neither
/// formats nor hashes the name again.
#[derive(Debug, Clone)]
struct DnsRef {
    absolute: String,
    slots: [Slot; 2],
}

impl DnsRef {
    fn of(name: &DnsName) -> Self {
        let absolute = absolute(name);
        let slots = dns_slots(&absolute);
        Self { absolute, slots }
    }
}

/// The address families in use: the rule's family keyword, its key type, its slot.
fn dns_families(ctx: &Ctx, r: &DnsRef) -> impl Iterator<Item = (Family, KeyType, Slot)> {
    let families = ctx.node.families();
    let wanted = [(Family::V4, families.v4, KeyType::TaggedIpv4), (Family::V6, families.v6, KeyType::TaggedIpv6)];
    wanted
        .into_iter()
        .zip(r.slots)
        .filter(|((_, used, _), _)| *used)
        .map(|((family, _, key), slot)| (family, key, slot))
}

/// Put the resolved addresses of `r` in its slots of the shared DNS timeout sets, one
/// per address family in use (a set is made when a name first needs it, so a rule's set
/// always exists). Two sets for all names on purpose: nf_tables finds a set by name with
/// a linear scan, so every set costs on every later command (see bench/FINDINGS.md).
fn fill_dns_sets(ctx: &Ctx, r: &DnsRef, table: &mut Table) {
    let resolved = ctx.dns.get(&r.absolute);
    for (_, key, slot) in dns_families(ctx, r) {
        let set = table.sets.entry(slot.set.into()).or_insert_with(|| Set::with_timeout(key));
        if let Some(resolved) = resolved {
            // Kernel-side expiry: the agent refreshes these while it runs; if it is
            // gone for long, stale addresses leave by themselves.
            let timeout = format_compact!("timeout {}s", element_timeout(resolved.ttl, ctx.node.dns_grace).as_secs());
            for ip in resolved.addresses.iter().filter(|ip| !ctx.exempt.iter().any(|n| n.contains(*ip))) {
                if ip.is_ipv6() == key.is_v6() {
                    set.elements.insert(slot.key(*ip), timeout.clone());
                }
            }
        }
    }
}

/// The base chain: prerouting at priority filter, which every packet a pod sends
/// passes whether it is forwarded or delivered to the node itself. One base chain (not
/// forward and input) because the kernel re-validates a verdict map once per base
/// chain referring to it whenever a `jump` element is added: a pod's cost (bench/FINDINGS.md).
pub const FIREWALL_CHAIN: &str = "firewall";
const CLUSTER_V4: &str = "cluster-v4";
const CLUSTER_V6: &str = "cluster-v6";
const PODS_V4: &str = "fw-pods-v4";
const PODS_V6: &str = "fw-pods-v6";

/// Most cluster and Service ranges of one family compared in the base chain's own rules;
/// a family with more has them in the interval set `cluster-v4` / `cluster-v6`.
/// Every packet passes these rules: comparing a prefix costs it less than an interval
/// set lookup (bench/FINDINGS.md, "2026-11-25 (fifth)").
const INLINE_EXEMPT: usize = 2;

/// The exempt (cluster and Service) ranges, and the base chain's rules accepting them.
/// The exempt (cluster and Service) ranges, and the base chain's rules accepting them
/// (with verified connections: marking them, in `fw-mark`).
fn exempt_rules(node: &NodeConfig, table: &mut Table) -> (Vec<IpNet>, Vec<Rule>) {
    let merged = node.exempt_ranges();
    let verdict = if node.verified_mark_mask != 0 { mark_verdict() } else { Verdict::Accept };
    let mut rules = Vec::new();
    for (family, v4, name) in [(Family::V4, true, CLUSTER_V4), (Family::V6, false, CLUSTER_V6)] {
        let nets: Vec<&IpNet> = merged.iter().filter(|n| n.addr().is_ipv4() == v4).collect();
        if nets.len() <= INLINE_EXEMPT {
            rules.extend(nets.iter().map(|n| Rule::new().when(addr_match(family, [*n])).verdict(verdict.clone())));
        } else {
            let mut set = Set::new(if v4 { KeyType::Ipv4 } else { KeyType::Ipv6 }, true);
            set.elements = nets.iter().map(|n| (n.to_compact_string(), Text::default())).collect();
            table.sets.insert(name.into(), set);
            rules.push(Rule::new().when(Match::daddr_in(family, name)).verdict(verdict.clone()));
        }
    }
    (merged, rules)
}

/// How the base chain hands a packet it accepts to the marking rules.
fn mark_verdict() -> Verdict {
    Verdict::goto(crate::nft::verified::CHAIN)
}

/// The base chain: (with verified connections, first: an established connection
/// verified under the current policy generation passes), replies pass, the exempt
/// ranges pass, then each pod's namespace chain; (with verified connections, what
/// passes is marked verified in `fw-mark`). Every packet entering the node walks it,
/// so what IPv4 packets never match comes after their verdict.
fn base_chain(exempt: Vec<Rule>, verified_mask: u32) -> Chain {
    let mut rules = Vec::new();
    // First: the packets of a verified connection — most packets — pay this one rule.
    if verified_mask != 0 {
        rules.push(crate::nft::verified::fast_path(verified_mask));
    }
    rules.push(Rule::new().when(Match::CtDirection(Direction::Reply)).verdict(Verdict::Accept));
    rules.extend(exempt);
    let pods =
        |family, map: &str| Rule::new().verdict(Verdict::Map { family, field: AddrField::Saddr, map: map.into() });
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

fn proto(p: Protocol) -> Proto {
    match p {
        Protocol::Tcp => Proto::Tcp,
        Protocol::Udp => Proto::Udp,
        Protocol::Sctp => Proto::Sctp,
    }
}

/// The match of a rule's ports (`None`: any port).
fn ports_match(ports: &Ports) -> Option<Match> {
    match (ports.first(), ports.len()) {
        (None, _) => None,
        (Some((p, port)), 1) => Some(Match::Dport(proto(*p), *port)),
        _ => Some(Match::ProtoPortIn(ports.iter().map(|(p, port)| (proto(*p), *port)).collect())),
    }
}

/// The match of a destination among `addrs` (one: compared; more: an anonymous set).
fn addr_match<'a>(family: Family, addrs: impl IntoIterator<Item = &'a IpNet>) -> Match {
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
fn counted(dst: Match, ports: Option<&Match>, total: &str, verdict: Verdict, comment: Name) -> Rule {
    let mut r = Rule::new().when(dst);
    r.matches.extend(ports.cloned());
    r.then(Statement::NamedCounter(total.into())).then(Statement::Counter).verdict(verdict).comment(comment)
}

/// Compile one rule into nft statements (one per address family it touches). Returns
/// an error for targets this version cannot enforce.
fn rule_statements(
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
fn allow_verdict(verified: bool) -> Verdict {
    if verified { Verdict::Return } else { Verdict::Accept }
}

/// Whether a namespace's allowed connections may be marked verified: the fast path is
/// on, and no Deny rule's destinations can grow without a change of the table (a
/// `dnsName` answer learned by DNS snooping goes straight into its set, and must reach
/// the connections already allowed).
fn may_verify(policy: &FirewallPolicy, node: &NodeConfig) -> bool {
    node.verified_mark_mask != 0
        && !(node.snoop.is_some()
            && policy.rules.iter().any(|r| r.action == Action::Deny && matches!(r.target, Target::Dns(_))))
}

/// The destinations of a CIDR or nodeSelector rule (`None` for a `dnsName` rule).
fn static_targets(rule: &FirewallRule, ctx: &Ctx) -> Option<BTreeSet<IpNet>> {
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
fn set_name(chain: &str, sets: &[(Text, Set)], key: KeyType, interval: bool) -> String {
    let k = sets.iter().filter(|(_, s)| s.key == key && s.interval == interval).count();
    let family = if key.is_v6() { 6 } else { 4 };
    format!("{chain}-{}{family}-{k}", if interval { "r" } else { "h" })
}

/// Most destinations of a merged match compared in rules (one rule each) rather than
/// looked up in a set.
const INLINE_MAX: usize = 4;

/// The nft rules of merged runs ([`super::runs`]): one per family and port set, with
/// the run's counter and comment, its destinations (more than one) in named sets of the
/// namespace ([`set_name`], added to `sets`) when there are more than [`INLINE_MAX`]
/// (else one rule each): of one or two prefix lengths, a hash set of networks per
/// length (`<chain>-h4-<k>`) and a rule looking up the masked destination in it
/// (`ip daddr and 255.255.255.0 @fw-ns-h4-0`); of more, one interval set
/// (`<chain>-r4-<k>`). The chain's shape then depends on the actions, port sets and prefix lengths:
/// editing a destination of a merged run (same length), or a node's addresses, changes
/// elements, not rules, and the kernel re-validates nothing.
fn run_statements(runs: &[super::runs::Run], chain: &str, sets: &mut Vec<(Text, Set)>, verified: bool) -> Vec<Rule> {
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
            } else if let Some(groups) = super::runs::by_length(&m.listed) {
                // Destinations of one or two prefix lengths: per length, the destination
                // masked to it looked up among the networks (a hash set).
                for (len, nets) in groups {
                    let name = set_name(chain, sets, key, false);
                    let elements = nets.iter().map(|n| (n.network().to_compact_string(), Text::default())).collect();
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
                let elements = m.addrs.iter().map(|n| (n.to_compact_string(), Text::default())).collect();
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
const RULE_BYTES: usize = 1_000;
const HASH_SET_BYTES: usize = 700;
const HASH_ELEMENT_BYTES: usize = 70;
const INTERVAL_SET_BYTES: usize = 16_500;
const INTERVAL_ELEMENT_BYTES: usize = 140;
const PIPAPO_KEY_BYTE_BYTES: usize = 16_000;
const PIPAPO_ELEMENT_BYTES: usize = 100;

/// The kernel memory [`run_statements`] would take for `runs`.
fn run_cost(runs: &[super::runs::Run]) -> usize {
    runs.iter()
        .flat_map(|run| &run.matches)
        .map(|m| {
            if m.listed.len() <= INLINE_MAX {
                m.listed.len() * RULE_BYTES
            } else if let Some(groups) = super::runs::by_length(&m.listed) {
                groups.len() * (RULE_BYTES + HASH_SET_BYTES) + m.listed.len() * HASH_ELEMENT_BYTES
            } else {
                RULE_BYTES + INTERVAL_SET_BYTES + m.addrs.len() * INTERVAL_ELEMENT_BYTES
            }
        })
        .sum()
}

/// The kernel memory [`box_statements`] would take for `boxes` (IPv4, IPv6).
fn box_cost(boxes: &[super::boxes::Boxes; 2]) -> usize {
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
fn segment_statements(
    rules: &[super::runs::StaticRule],
    chain: &str,
    segment: usize,
    sets: &mut Vec<(Text, Set)>,
    verified: bool,
) -> Vec<Rule> {
    let runs = super::runs::merge(rules);
    let cost = run_cost(&runs);
    // No flattened segment is cheaper than one lookup in one interval set.
    if cost <= RULE_BYTES + INTERVAL_SET_BYTES {
        return run_statements(&runs, chain, sets, verified);
    }
    let boxes = [super::boxes::flatten(rules, true), super::boxes::flatten(rules, false)];
    if box_cost(&boxes) < cost {
        box_statements(&boxes, chain, segment, sets, verified)
    } else {
        run_statements(&runs, chain, sets, verified)
    }
}

/// A segment's rules flattened into disjoint pieces ([`super::boxes`]): per family, the
/// ported pieces of allowed and of denied destinations looked up by protocol, port and
/// destination (`meta l4proto . th dport . ip daddr @<chain>-s<segment>-pa4`, then
/// `-pd4`), then the portless ones by destination (`ip daddr @<chain>-s<segment>-a4`,
/// `-d4`). A packet meets at most four lookups whatever the number of rules, the
/// kernel loads elements (linear in them, no rule per policy rule to validate) and an
/// edit is element changes. Each lookup's rule counts for the rules it holds pieces of
/// (`egress[first..last]`, as a merged run).
fn box_statements(
    boxes: &[super::boxes::Boxes; 2],
    chain: &str,
    segment: usize,
    sets: &mut Vec<(Text, Set)>,
    verified: bool,
) -> Vec<Rule> {
    use super::boxes::Piece;
    let mut out = Vec::new();
    for (boxes, v4) in boxes.iter().zip([true, false]) {
        let (family, f) = if v4 { (Family::V4, 4) } else { (Family::V6, 6) };
        for (ported, action) in
            [(true, Action::Allow), (true, Action::Deny), (false, Action::Allow), (false, Action::Deny)]
        {
            let pieces: Vec<(Text, &Piece)> = if ported {
                boxes
                    .ported
                    .iter()
                    .filter(|(_, _, p)| p.action == action)
                    .map(|(proto, port, p)| (format_compact!("{} . {port} . {}", proto.nft(), p.net), p))
                    .collect()
            } else {
                boxes.portless.iter().filter(|p| p.action == action).map(|p| (p.net.to_compact_string(), p)).collect()
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
            let elements = pieces.into_iter().map(|(k, _)| (k, Text::default())).collect();
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
            let comment = super::runs::comment(first, last);
            out.push(counted(lookup, None, total, verdict, comment));
        }
    }
    out
}

/// The named counter of log copies the rate limit held back.
pub const ACL_OVER: &str = "acl-over";

/// What a namespace chain logs: the namespace's ACL logging and the EgressFirewall's
/// audit mode (part of the cache key: a changed annotation recompiles the chain).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct LogSpec {
    namespace: String,
    allow: Option<String>,
    deny: Option<String>,
    audit: bool,
}

impl LogSpec {
    /// Whether `LogSpec::of(policy, view)` would be `self` (without making it).
    fn is(&self, policy: &FirewallPolicy, view: &ClusterView) -> bool {
        let logging =
            view.namespaces.get(&policy.namespace).and_then(|n| n.acl_logging.as_ref()).and_then(|l| l.as_ref().ok());
        self.namespace == policy.namespace
            && self.audit == policy.audit
            && self.allow.as_ref() == logging.and_then(|l| l.allow.as_ref())
            && self.deny.as_ref() == logging.and_then(|l| l.deny.as_ref())
    }

    fn of(policy: &FirewallPolicy, view: &ClusterView) -> Self {
        let logging = view.namespaces.get(&policy.namespace).and_then(|n| n.acl_logging.clone()).and_then(Result::ok);
        Self {
            namespace: policy.namespace.clone(),
            allow: logging.as_ref().and_then(|l| l.allow.clone()),
            deny: logging.and_then(|l| l.deny),
            audit: policy.audit,
        }
    }
}

/// A compiled namespace chain: its rules, the named sets of its merged runs, the
/// errors of rules it could not compile, and what the next compile checks to reuse it.
#[derive(Debug, Clone)]
struct Compiled {
    chain: Chain,
    sets: Vec<(Text, Set)>,
    errors: Vec<String>,
    /// Made with `nodeSelector` rules from the nodes of this version ([`Ctx::nodes_epoch`])
    /// (`None`: the policy has none, the nodes do not matter).
    nodes_epoch: Option<u64>,
    /// The names of the policy's `dnsName` rules that compiled to a rule (their sets are
    /// filled from the current answers at every compile).
    dns: Vec<DnsRef>,
}

/// A namespace chain of the previous compile, with what it was made from.
#[derive(Debug)]
struct Cached {
    /// The policy: the view's shared copy, so that an unchanged policy is recognised by
    /// a pointer comparison.
    policy: std::sync::Arc<FirewallPolicy>,
    log: LogSpec,
    compiled: Compiled,
}

/// Compiled namespace chains of the previous compile, by namespace: reused when the
/// policy is equal (and, with a nodeSelector rule, the nodes are as they were then).
type ChainCache = std::collections::HashMap<String, Cached>;

/// What the firewall reuses from the previous compile: namespace chains, and the pod
/// verdict maps (patched per changed pod, [`super::pod_maps`]).
#[derive(Debug, Default)]
pub(crate) struct FirewallCache {
    chains: ChainCache,
    /// The namespaces' part of the last output, patched where a namespace's inputs changed.
    out: Output,
    pods: super::pod_maps::PodMaps,
    /// What the pod maps were last made from: the pods' stamp and the namespaces with a
    /// policy. The same again, the maps are too, without a walk over every pod; with the
    /// same namespaces, only the addresses the pods' journal lists since that stamp are
    /// looked at.
    pods_from: Option<(u64, Vec<String>)>,
}

/// The namespace chains and run sets of the last compile and, by namespace, what made
/// them: a compile touches only namespaces whose inputs may differ (the view's journals
/// say which; without them, every namespace is looked at), then copies the maps into the
/// table (no lookup or insert per unchanged namespace).
#[derive(Debug, Default)]
struct Output {
    chains: BTreeMap<Text, Chain>,
    sets: BTreeMap<Text, Set>,
    /// By namespace (each boxed: parts move between maps).
    parts: BTreeMap<String, Box<Part>>,
    /// The parts' statuses, in namespace order: what every compile reports.
    statuses: Vec<ObjectStatus>,
    /// The namespaces whose part has `dnsName` rules (their sets are made anew from the
    /// current answers at every compile).
    dns: BTreeSet<String>,
    /// The namespaces whose part was made from the nodes (`nodeSelector` rules).
    reads_nodes: BTreeSet<String>,
    /// What this was made from: the stamps of the view's firewalls and namespaces and
    /// the nodes' version (`None`: not known, look at every namespace).
    from: Option<(u64, u64, u64)>,
}

/// One namespace's part of [`Output`] and its inputs: its EgressFirewall entry, its
/// logging annotation, whether it has local pods (only then its chain and sets are in the
/// table) and, with nodeSelector rules, the nodes' version. The same inputs give the same
/// part; only its DNS sets are made anew (from the current answers) every time.
#[derive(Debug)]
struct Part {
    key: crate::api::ObjectKey,
    policy: Option<Arc<FirewallPolicy>>,
    error: Option<String>,
    logging: Option<Result<crate::view::AclLogging, String>>,
    present: bool,
    nodes_epoch: Option<u64>,
    /// What it put in [`Output`]: its chain's name and its sets' names.
    chain: Option<Text>,
    sets: Vec<Text>,
    /// Its chain's `dnsName` names ([`Compiled::dns`]).
    dns: Vec<DnsRef>,
}

impl Output {
    /// Take `namespace`'s part out, and what it put in the maps.
    fn forget(&mut self, namespace: &str) -> Option<Box<Part>> {
        let part = self.parts.remove(namespace)?;
        if let Some(chain) = &part.chain {
            self.chains.remove(chain);
        }
        for set in &part.sets {
            self.sets.remove(set);
        }
        self.dns.remove(namespace);
        self.reads_nodes.remove(namespace);
        Some(part)
    }

    /// Put `namespace`'s (new or kept) part in.
    fn keep(&mut self, namespace: &str, part: Box<Part>) {
        if !part.dns.is_empty() {
            self.dns.insert(namespace.to_string());
        }
        if part.nodes_epoch.is_some() {
            self.reads_nodes.insert(namespace.to_string());
        }
        self.parts.insert(namespace.to_string(), part);
    }

    /// Set (`None`: remove) `namespace`'s status.
    fn set_status(&mut self, namespace: &str, status: Option<ObjectStatus>) {
        let at = self.statuses.binary_search_by(|s| s.key.namespace.as_str().cmp(namespace));
        match (at, status) {
            (Ok(i), Some(s)) => self.statuses[i] = s,
            (Ok(i), None) => {
                self.statuses.remove(i);
            }
            (Err(i), Some(s)) => self.statuses.insert(i, s),
            (Err(_), None) => {}
        }
    }
}

impl Part {
    fn same(
        &self,
        entry: &crate::view::Entry<FirewallPolicy>,
        logging: Option<&Result<crate::view::AclLogging, String>>,
        present: bool,
        nodes_epoch: u64,
    ) -> bool {
        let same_policy = match (&self.policy, &entry.policy) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            (None, None) => true,
            _ => false,
        };
        same_policy
            && self.present == present
            && self.nodes_epoch.is_none_or(|e| e == nodes_epoch)
            && self.error == entry.error
            && self.logging.as_ref() == logging
            && self.key == entry.key
    }
}

fn namespace_chain(policy: &std::sync::Arc<FirewallPolicy>, ctx: &Ctx, cache: &mut ChainCache) -> Compiled {
    // A chain reads its policy, the namespace's logging settings and, with nodeSelector
    // rules, the nodes. The same version as last time: no look at its rules.
    let nodes_same = |cached: &Cached| cached.compiled.nodes_epoch.is_none_or(|e| e == ctx.nodes_epoch);
    if let Some(cached) = cache.get(&policy.namespace)
        && std::sync::Arc::ptr_eq(&cached.policy, policy)
        && nodes_same(cached)
        && cached.log.is(policy, ctx.view)
    {
        return cached.compiled.clone();
    }
    let reads_nodes = policy.rules.iter().any(|r| matches!(r.target, Target::Nodes(_)));
    let log = LogSpec::of(policy, ctx.view);
    if let Some(cached) = cache.get_mut(&policy.namespace)
        && *cached.policy == **policy
        && nodes_same(cached)
        && cached.log == log
    {
        // An equal copy (the object written again unchanged): kept for the next time.
        cached.policy = policy.clone();
        return cached.compiled.clone();
    }
    let name = chain_name("fw", &policy.namespace);
    let mut rules = Vec::new();
    let mut errors = Vec::new();
    let mut sets = Vec::new();
    // Runs of same-action CIDR/nodeSelector rules are merged, unless the chain logs (its
    // lines name the rule).
    let merged = log.allow.is_none() && log.deny.is_none() && !log.audit;
    let mut pending = Vec::new();
    let mut segment = 0;
    let verified = may_verify(policy, ctx.node);
    for (i, rule) in policy.rules.iter().enumerate() {
        if merged && let Some(targets) = static_targets(rule, ctx) {
            let ports = rule.ports.clone();
            pending.push(super::runs::StaticRule { index: i, action: rule.action, targets, ports });
            continue;
        }
        rules.extend(segment_statements(&pending, &name, segment, &mut sets, verified));
        segment += 1;
        pending.clear();
        match rule_statements(i, rule, &log, ctx, verified) {
            Ok(stmts) => rules.extend(stmts),
            Err(e) => errors.push(e),
        }
    }
    rules.extend(segment_statements(&pending, &name, segment, &mut sets, verified));
    if ctx.node.verified_mark_mask != 0 && !verified {
        // What falls through would be marked verified by the base chain.
        rules.push(Rule::new().verdict(Verdict::Accept));
    }
    let dns = policy.rules.iter().filter_map(|r| match &r.target {
        Target::Dns(name) if !name.wildcard || ctx.node.snoop.is_some() => Some(DnsRef::of(name)),
        _ => None,
    });
    let compiled = Compiled {
        chain: Chain::regular(rules),
        sets,
        errors,
        nodes_epoch: reads_nodes.then_some(ctx.nodes_epoch),
        dns: dns.collect(),
    };
    let cached = Cached { policy: policy.clone(), log, compiled: compiled.clone() };
    cache.insert(policy.namespace.clone(), cached);
    compiled
}

#[allow(clippy::too_many_arguments)]
pub(super) fn compile(
    view: &ClusterView,
    node: &NodeConfig,
    dns: &DnsAnswers,
    owners: &crate::view::Owners,
    table: &mut Table,
    statuses: &mut Vec<ObjectStatus>,
    cache: &mut FirewallCache,
) {
    // Chains of namespaces without a policy any more are dropped when there are more
    // cached than policies (an entry is only used for its own namespace: one left over
    // never changes the output, and this keeps the cache within the view's size).
    if cache.chains.len() > view.firewalls.len() {
        cache.chains.retain(|ns, _| view.firewalls.contains_key(ns));
    }
    // Local pods (by the pod-identity rule) of namespaces with a firewall policy jump to
    // their namespace's chain.
    let mut policed: Vec<&str> = Vec::with_capacity(view.firewalls.len());
    policed.extend(view.firewalls.iter().filter(|(_, e)| e.policy.is_some()).map(|(ns, _)| ns.as_str()));
    let stamp = view.pods.stamp();
    let jump = |ns: &str| format_compact!("jump {}", chain_name("fw", ns));
    // With the same policed namespaces, only the addresses the pod changes since the
    // last compile touched can differ (none: the maps as they are); else every owner.
    let touched = match &cache.pods_from {
        Some((s, p)) if p.iter().map(String::as_str).eq(policed.iter().copied()) => view.pods.touched_since(*s),
        _ => None,
    };
    let (v4, v6) = match touched {
        Some(touched) if touched.is_empty() => cache.pods.maps(),
        Some(touched) => {
            let wanted = touched.into_iter().map(|ip| {
                let pod = owners
                    .get(&ip)
                    .filter(|pod| policed.binary_search(&pod.namespace.as_str()).is_ok() && node.is_local(pod));
                (ip, pod.map(|pod| pod.namespace.as_str()))
            });
            let maps = cache.pods.patch(wanted, jump);
            if let Some((s, _)) = &mut cache.pods_from {
                *s = stamp;
            }
            maps
        }
        None => {
            let lookup: std::collections::HashSet<&str> = policed.iter().copied().collect();
            let wanted = owners
                .iter()
                .filter(|(_, pod)| lookup.contains(pod.namespace.as_str()) && node.is_local(pod))
                .map(|(ip, pod)| (*ip, pod.namespace.as_str()));
            let maps = cache.pods.update(wanted, jump);
            cache.pods_from = Some((stamp, policed.iter().map(|ns| ns.to_string()).collect()));
            maps
        }
    };
    // No EgressFirewall, no hook: packets pay nothing for an empty policy.
    if view.firewalls.is_empty() {
        cache.out = Output::default();
        return;
    }
    let (exempt, exempt_accepts) = exempt_rules(node, table);
    // The nodes' version is the view's stamp of its nodes (new with every change, never
    // the same for different nodes): chains with nodeSelector rules are reused while it
    // stays the same.
    let ctx = Ctx { view, node, dns, exempt, nodes_epoch: view.nodes.stamp() };

    // The namespaces whose inputs may differ since the last compile: those the view's
    // journals list (their EgressFirewall, their Namespace), those whose local pods came
    // or went, and, when the nodes changed, those with nodeSelector rules. Unknown (the
    // first compile, a journal too far behind): every namespace.
    let out = &mut cache.out;
    let presence = cache.pods.presence_changed();
    let dirty: Option<BTreeSet<String>> = out.from.and_then(|(fw, ns, nodes)| {
        let mut dirty: BTreeSet<String> = view.firewalls.touched_since(fw)?.into_iter().map(str::to_string).collect();
        dirty.extend(view.namespaces.touched_since(ns)?.into_iter().map(str::to_string));
        dirty.extend(presence.iter().map(|t| t.to_string()));
        if nodes != ctx.nodes_epoch {
            dirty.extend(out.reads_nodes.iter().cloned());
        }
        Some(dirty)
    });
    let dirty = dirty.unwrap_or_else(|| view.firewalls.keys().chain(out.parts.keys()).cloned().collect());
    for namespace in &dirty {
        let Some(entry) = view.firewalls.get(namespace) else {
            out.forget(namespace);
            out.set_status(namespace, None);
            continue;
        };
        let logging = view.namespaces.get(namespace).and_then(|n| n.acl_logging.as_ref());
        let present = cache.pods.has(namespace);
        if out.parts.get(namespace).is_some_and(|p| p.same(entry, logging, present, ctx.nodes_epoch)) {
            continue;
        }
        out.forget(namespace);
        let mut problems: Vec<String> = entry.error.iter().cloned().collect();
        let (mut chain, mut sets, mut nodes_epoch, mut dns) = (None, Vec::new(), None, Vec::new());
        if let Some(policy) = &entry.policy {
            let compiled = namespace_chain(policy, &ctx, &mut cache.chains);
            problems.extend(compiled.errors);
            (nodes_epoch, dns) = (compiled.nodes_epoch, compiled.dns);
            // Only namespaces with local pods have their chain (and its sets) here.
            if present {
                let name: Text = chain_name("fw", namespace).into();
                out.chains.insert(name.clone(), compiled.chain);
                sets = compiled.sets.iter().map(|(name, _)| name.clone()).collect();
                out.sets.extend(compiled.sets);
                chain = Some(name);
            }
        }
        let mut warnings = entry.policy.as_ref().map(|p| p.warnings.clone()).unwrap_or_default();
        if let Some(Err(e)) = logging {
            warnings.push(format!("namespace annotation {ACL_LOGGING_ANNOTATION}: {e}"));
        }
        let outcome = if problems.is_empty() { Outcome::Applied } else { Outcome::Failed(problems.join("; ")) };
        let mut status = ObjectStatus::new(entry.key.clone(), &node.node_name, outcome).with_warnings(warnings);
        if entry.policy.as_ref().is_some_and(|p| p.audit) {
            status = status.with_detail("audit mode: Deny rules log and count, nothing is dropped".into());
        }
        out.set_status(namespace, Some(status));
        let part = Part {
            key: entry.key.clone(),
            policy: entry.policy.clone(),
            error: entry.error.clone(),
            logging: logging.cloned(),
            present,
            nodes_epoch,
            chain,
            sets,
            dns,
        };
        out.keep(namespace, Box::new(part));
    }
    out.from = Some((view.firewalls.stamp(), view.namespaces.stamp(), ctx.nodes_epoch));
    statuses.extend(out.statuses.iter().cloned());
    // The DNS sets of every namespace with dnsName rules, from the current answers.
    for part in out.dns.iter().filter_map(|ns| out.parts.get(ns)) {
        for r in &part.dns {
            fill_dns_sets(&ctx, r, table);
        }
    }
    // The kept maps, with what the walk added (the DNS and cluster sets) merged in.
    let mut sets = out.sets.clone();
    sets.append(&mut table.sets);
    table.sets = sets;
    let mut chains = out.chains.clone();
    chains.append(&mut table.chains);
    table.chains = chains;

    table.sets.insert(PODS_V4.into(), Set { elements: v4, ..Set::verdict_map(KeyType::Ipv4) });
    table.sets.insert(PODS_V6.into(), Set { elements: v6, ..Set::verdict_map(KeyType::Ipv6) });
    table.chains.insert(FIREWALL_CHAIN.into(), base_chain(exempt_accepts, node.verified_mark_mask));
    if node.verified_mark_mask != 0 {
        use crate::nft::verified;
        table.sets.insert(verified::EPOCH_SET.into(), Set::new(KeyType::Mark, false));
        table.chains.insert(verified::CHAIN.into(), Chain::regular(verified::marking_rules(node.verified_mark_mask)));
    }
}
