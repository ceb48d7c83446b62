//! EgressFirewall → nft.
//!
//! Layout (see docs/design/packet-path.md):
//!
//! * `firewall` (prerouting, priority filter: after conntrack and DNAT, before the
//!   routing decision, so it sees both the pods' forwarded traffic and their traffic to
//!   this node's own addresses), only while some EgressFirewall exists:
//!   replies pass (`ct direction reply`), cluster and service destinations pass, then
//!   `meta priority set ip saddr map @fw-pods-v4 meta priority vmap @fw-namespaces`
//!   (and the same for IPv6) jumps to the pod's namespace chain: the pod's address maps
//!   to its namespace's number ([`numbers`]), held for the next lookup in the packet's
//!   priority, and the number to the chain, whose first rule sets the priority back to
//!   0. A pod added or removed is then a data element, which the kernel takes without
//!   validating the table (a `jump` element per pod cost ~190 ns per rule of the table:
//!   21 ms at 100k rules, bench/FINDINGS.md). Per-packet cost: two set lookups and two
//!   map lookups, whatever the number of namespaces and pods. With verified
//!   connections, first of all an established connection verified under the current
//!   policy generation is accepted (one lookup in `fw-epoch`; [`crate::nft::verified`]),
//!   and what the chain accepts (exempt, allowed, let through) goes to `fw-mark`, which
//!   marks it verified.
//! * `fw-<namespace>`: first the priority put back to 0, then the namespace's rules in
//!   order; the first match accepts or drops; no match returns to the base chain,
//!   whose policy is accept. Consecutive
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

use ipnet::IpNet;

use super::{NodeConfig, ObjectStatus, Outcome};
use crate::dns::{DnsAnswers, element_timeout};
use crate::nft::rule::{AddrField, CtState, Direction, Family, Match, Name, Proto, Rule, Statement, Verdict};
use crate::nft::{Chain, Hook, Key, KeyType, Set, Slot, Table, Text, Value, chain_name};
use crate::view::policy::{Action, DnsName, FirewallPolicy, FirewallRule, Ports, Protocol, Target};
use crate::view::{ACL_LOGGING_ANNOTATION, ClusterView};

mod rules;
use rules::*;
pub use rules::{FIREWALL_CHAIN, NAMESPACES};

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
            // Whole seconds, as the table's text has them.
            let secs = element_timeout(resolved.ttl, ctx.node.dns_grace).as_secs();
            let timeout = Value::Timeout(std::time::Duration::from_secs(secs));
            for ip in resolved.addresses.iter().filter(|ip| !ctx.exempt.iter().any(|n| n.contains(*ip))) {
                if ip.is_ipv6() == key.is_v6() {
                    set.elements.insert(slot.key(*ip), timeout.clone());
                }
            }
        }
    }
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
    /// The namespaces' numbers ([`numbers`]) of the policed namespaces in `pods_from`.
    numbers: HashMap<String, u32>,
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
    /// The `fw-namespaces` map's elements: each chain's namespace number → `jump` to it.
    namespaces: crate::nft::Elements,
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
    let mut rules = vec![priority_restored()];
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
    let (v4, v6, renumbered) = pod_maps(view, node, owners, cache);
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

    let out = &mut cache.out;
    let presence = cache.pods.presence_changed();
    let dirty = dirty_namespaces(view, out, &presence, ctx.nodes_epoch);
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
        namespace_part(namespace, entry, logging, present, &ctx, &mut cache.chains, out);
    }
    out.from = Some((view.firewalls.stamp(), view.namespaces.stamp(), ctx.nodes_epoch));
    if !dirty.is_empty() || renumbered {
        let elements: crate::nft::Elements = out
            .parts
            .iter()
            .filter_map(|(ns, part)| Some((Key::Classid(*cache.numbers.get(ns)?), Value::Jump(part.chain.clone()?))))
            .collect();
        if elements != out.namespaces {
            out.namespaces = elements;
        }
    }
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

    table.sets.insert(PODS_V4.into(), Set { elements: v4, ..Set::classid_map(KeyType::Ipv4) });
    table.sets.insert(PODS_V6.into(), Set { elements: v6, ..Set::classid_map(KeyType::Ipv6) });
    let namespaces = out.namespaces.clone();
    table.sets.insert(NAMESPACES.into(), Set { elements: namespaces, ..Set::verdict_map(KeyType::Classid) });
    table.chains.insert(FIREWALL_CHAIN.into(), base_chain(exempt_accepts, node.verified_mark_mask));
    if node.verified_mark_mask != 0 {
        use crate::nft::verified;
        table.sets.insert(verified::EPOCH_SET.into(), Set::new(KeyType::Mark, false));
        table.chains.insert(verified::CHAIN.into(), Chain::regular(verified::marking_rules(node.verified_mark_mask)));
    }
}

/// The `fw-pods` maps: local pods (by the pod-identity rule) of namespaces with a
/// firewall policy map to their namespace's number. With the same policed namespaces,
/// only the addresses the pod changes since the last compile touched can differ (none:
/// the maps as they are); else every owner, and the numbers are made again (`true` when
/// one of them changed: every element is then written again).
fn pod_maps(
    view: &ClusterView,
    node: &NodeConfig,
    owners: &crate::view::Owners,
    cache: &mut FirewallCache,
) -> (crate::nft::Elements, crate::nft::Elements, bool) {
    let mut policed: Vec<&str> = Vec::with_capacity(view.firewalls.len());
    policed.extend(view.firewalls.iter().filter(|(_, e)| e.policy.is_some()).map(|(ns, _)| ns.as_str()));
    let stamp = view.pods.stamp();
    let same_namespaces =
        matches!(&cache.pods_from, Some((_, p)) if p.iter().map(String::as_str).eq(policed.iter().copied()));
    let mut renumbered = false;
    if !same_namespaces {
        let fresh = numbers(&policed);
        // A namespace whose number moved (another took it first): every pod's element
        // is made again.
        renumbered = fresh.iter().any(|(ns, n)| cache.numbers.get(ns).is_some_and(|old| old != n));
        if renumbered {
            cache.pods = super::pod_maps::PodMaps::default();
        }
        cache.numbers = fresh;
    }
    let numbers = &cache.numbers;
    let value = |ns: &str| Value::Classid(numbers.get(ns).copied().unwrap_or_default());
    let touched = match &cache.pods_from {
        Some((s, _)) if same_namespaces => view.pods.touched_since(*s),
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
            let maps = cache.pods.patch(wanted, value);
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
            let maps = cache.pods.update(wanted, value);
            cache.pods_from = Some((stamp, policed.iter().map(|ns| ns.to_string()).collect()));
            maps
        }
    };
    (v4, v6, renumbered)
}

/// Each policed namespace's number, the key from its pods to its chain: a 32-bit hash
/// of its name (FNV-1a), so that it stays the same while namespaces come and go; on a
/// collision, the next free number, the namespaces taken in name order (so the numbers
/// are a function of the set of namespaces alone). Never 0 (a packet's priority when no
/// pod's number is set) nor `0xffffffff` (`root`).
fn numbers(policed: &[&str]) -> HashMap<String, u32> {
    let mut sorted = policed.to_vec();
    sorted.sort_unstable();
    let mut taken = std::collections::HashSet::with_capacity(sorted.len());
    let mut out = HashMap::with_capacity(sorted.len());
    for ns in sorted {
        let mut n = fnv1a(ns);
        while n == 0 || n == u32::MAX || !taken.insert(n) {
            n = n.wrapping_add(1);
        }
        out.insert(ns.to_string(), n);
    }
    out
}

/// The 32-bit FNV-1a hash of a name.
fn fnv1a(name: &str) -> u32 {
    name.bytes().fold(0x811c_9dc5, |h, b| (h ^ u32::from(b)).wrapping_mul(0x0100_0193))
}

/// The namespaces whose inputs may differ since the last compile: those the view's
/// journals list (their EgressFirewall, their Namespace), those whose local pods came
/// or went (`presence`), and, when the nodes changed, those with nodeSelector rules.
/// Unknown (the first compile, a journal too far behind): every namespace.
fn dirty_namespaces(view: &ClusterView, out: &Output, presence: &[Text], nodes_epoch: u64) -> BTreeSet<String> {
    let dirty: Option<BTreeSet<String>> = out.from.and_then(|(fw, ns, nodes)| {
        let mut dirty: BTreeSet<String> = view.firewalls.touched_since(fw)?.into_iter().map(str::to_string).collect();
        dirty.extend(view.namespaces.touched_since(ns)?.into_iter().map(str::to_string));
        dirty.extend(presence.iter().map(|t| t.to_string()));
        if nodes != nodes_epoch {
            dirty.extend(out.reads_nodes.iter().cloned());
        }
        Some(dirty)
    });
    dirty.unwrap_or_else(|| view.firewalls.keys().chain(out.parts.keys()).cloned().collect())
}

/// `namespace`'s part of the output made anew: its chain and sets (only with local pods,
/// `present`), its status, what it read.
fn namespace_part(
    namespace: &str,
    entry: &crate::view::Entry<FirewallPolicy>,
    logging: Option<&Result<crate::view::AclLogging, String>>,
    present: bool,
    ctx: &Ctx,
    chains: &mut ChainCache,
    out: &mut Output,
) {
    out.forget(namespace);
    let mut problems: Vec<String> = entry.error.iter().cloned().collect();
    let (mut chain, mut sets, mut nodes_epoch, mut dns) = (None, Vec::new(), None, Vec::new());
    if let Some(policy) = &entry.policy {
        let compiled = namespace_chain(policy, ctx, chains);
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
    let mut status = ObjectStatus::new(entry.key.clone(), &ctx.node.node_name, outcome).with_warnings(warnings);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespace_numbers_are_distinct_and_follow_the_set_of_namespaces_alone() {
        // Two names of one hash (found by search): the first in name order keeps it.
        let (a, b) = ("c1170850", "c693596");
        assert_eq!(fnv1a(a), fnv1a(b));
        let both = numbers(&[b, a, "team-a"]);
        assert_eq!(both[a], fnv1a(a));
        assert_eq!(both[b], fnv1a(a) + 1);
        assert_eq!(both["team-a"], fnv1a("team-a"));
        assert_eq!(numbers(&[a, "team-a", b]), both, "the order given does not matter");
        // Without the first, the second takes its own hash.
        assert_eq!(numbers(&[b])[b], fnv1a(b));
    }
}
