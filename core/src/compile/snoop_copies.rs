//! DNS snooping → nft: copy (NFLOG, `log group`) the DNS queries of local pods in
//! namespaces with `dnsName` rules and the answers they get, and nothing else. Copying
//! never holds, drops or changes a packet.
//!
//! * `dns-snoop` (forward), `dns-snoop-in` (input: queries to a DNS server on this
//!   node) and `dns-snoop-out` (output: its answers), priority `filter - 5`: an
//!   answer-shaped packet (source port 53) that opens a flow toward a snooped pod is
//!   copied with prefix `dns-x` (counted, never used); on forward, an answer to a snooped
//!   pod that fails the reverse-path check (`fib saddr . iif oif missing`: it came in
//!   from where the server's address is not routed, i.e. a pod forged it) is copied
//!   with prefix `dns-s` (counted, never used); packets of flows whose original
//!   destination port is 53 go to `dns-snoop-check`.
//! * `dns-snoop-check`: queries (original direction) from `@snoop-pods` to
//!   `@dns-servers` → `dns-q`; answers (reply direction) to `@snoop-pods` of flows whose
//!   original destination was in `@dns-servers` → `dns-a`; other answers to snooped pods
//!   → `dns-u` (untrusted: counted, never used). `ct original daddr` is the address the
//!   pod asked (a Service VIP before kube-proxy's DNAT), so the cluster DNS Service
//!   address is what `--cluster-dns` names.
//! * every copy goes through `dns-copy-<class>`: `limit rate over` the class's rate
//!   (`--dns-snoop-rate` for queries and answers, [`COUNTED_ONLY_RATE`] for the
//!   counted-only classes) is counted in the named counter `snoop-over-<class>` and not
//!   copied, so a flood from port 53 cannot keep the listener busy.

use std::collections::BTreeSet;

use compact_str::format_compact;

use super::NodeConfig;
use crate::dns::targets::{
    COUNTED_ONLY_RATE, PREFIX_ANSWER, PREFIX_QUERY, PREFIX_SPOOFED, PREFIX_UNTRACKED, PREFIX_UNTRUSTED, SnoopName,
    SnoopSettings, SnoopTargets,
};
use crate::nft::rule::{AddrField, Direction, Family, MarkOf, Match, PortField, Proto, Rule, Statement, Verdict};
use crate::nft::{Chain, Hook, Key, KeyType, Set, Table, Value};
use crate::view::ClusterView;
use crate::view::policy::{FirewallPolicy, Target};

/// Namespaces whose EgressFirewall has a `dnsName` rule.
pub fn snooped_namespaces(view: &ClusterView) -> BTreeSet<&str> {
    view.firewalls
        .values()
        .filter_map(|e| e.policy.as_ref())
        .filter(|p| p.rules.iter().any(|r| matches!(r.target, Target::Dns(_))))
        .map(|p| p.namespace.as_str())
        .collect()
}

/// The copy rules and sets, for the snooped pods of `targets` (its namespaces are
/// [`snooped_namespaces`]).
pub(super) fn compile(node: &NodeConfig, targets: &SnoopTargets, table: &mut Table) {
    let Some(settings) = &node.snoop else { return };
    if targets.names.is_empty() {
        return;
    }
    sets(settings, targets, table);
    copy_chains(settings, table);
    table.chains.insert("dns-snoop-check".into(), check_chain());
    table.chains.insert("dns-snoop".into(), base_chain(node, "forward"));
    table.chains.insert("dns-snoop-in".into(), base_chain(node, "input"));
    table.chains.insert("dns-snoop-out".into(), base_chain(node, "output"));
    if let Some(proxy) = &node.dns_proxy {
        proxy_intercept(proxy, table);
    }
}

/// The snooped pods' and the trusted servers' addresses, by family.
fn sets(settings: &SnoopSettings, targets: &SnoopTargets, table: &mut Table) {
    let mut pods = [Set::new(KeyType::Ipv4, false), Set::new(KeyType::Ipv6, false)];
    for ip in targets.pods.keys() {
        pods[usize::from(ip.is_ipv6())].elements.insert(Key::Addr(*ip), Value::None);
    }
    let mut servers = [Set::new(KeyType::Ipv4, false), Set::new(KeyType::Ipv6, false)];
    for ip in &settings.servers {
        servers[usize::from(ip.is_ipv6())].elements.insert(Key::Addr(*ip), Value::None);
    }
    let [p4, p6] = pods;
    table.sets.insert("snoop-pods-v4".into(), p4);
    table.sets.insert("snoop-pods-v6".into(), p6);
    let [s4, s6] = servers;
    table.sets.insert("dns-servers-v4".into(), s4);
    table.sets.insert("dns-servers-v6".into(), s6);
}

/// One chain per class of copy: a rate limit (what it holds back is counted in a named
/// counter the agent reads), then the copy. Reached by `goto`, so a packet is copied
/// once at most and the base chain's policy (accept) applies after it.
fn copy_chains(settings: &SnoopSettings, table: &mut Table) {
    let classes = [
        (PREFIX_QUERY, "query", settings.rate),
        (PREFIX_ANSWER, "answer", settings.rate),
        (PREFIX_UNTRUSTED, "untrusted", COUNTED_ONLY_RATE),
        (PREFIX_UNTRACKED, "untracked", COUNTED_ONLY_RATE),
        (PREFIX_SPOOFED, "spoofed", COUNTED_ONLY_RATE),
    ];
    for (prefix, class, rate) in classes {
        table.chains.insert(
            format!("dns-copy-{class}").into(),
            Chain::regular([
                Rule::new()
                    .then(Statement::Limit { rate: rate.into(), burst: rate, over: true })
                    .then(Statement::NamedCounter(copy_counter(class).into()))
                    .verdict(Verdict::Return),
                Rule::new().then(Statement::Log {
                    prefix: prefix.into(),
                    group: settings.group,
                    queue_threshold: Some(1),
                }),
            ]),
        );
    }
}

/// Which class a pod's DNS packet is copied as: a query to a trusted server, an answer
/// from one, or an answer from anyone else.
fn check_chain() -> Chain {
    let mut check = Vec::new();
    for (family, v) in [(Family::V4, "v4"), (Family::V6, "v6")] {
        let servers =
            Match::CtOriginalAddrIn { family, field: AddrField::Daddr, set: format_compact!("dns-servers-{v}") };
        check.push(
            Rule::new()
                .when(Match::CtDirection(Direction::Original))
                .when(Match::saddr_in(family, format_compact!("snoop-pods-{v}")))
                .when(servers.clone())
                .verdict(Verdict::goto("dns-copy-query")),
        );
        check.push(
            Rule::new()
                .when(Match::CtDirection(Direction::Reply))
                .when(Match::daddr_in(family, format_compact!("snoop-pods-{v}")))
                .when(servers)
                .verdict(Verdict::goto("dns-copy-answer")),
        );
        check.push(
            Rule::new()
                .when(Match::CtDirection(Direction::Reply))
                .when(Match::daddr_in(family, format_compact!("snoop-pods-{v}")))
                .verdict(Verdict::goto("dns-copy-untrusted")),
        );
    }
    Chain::regular(check)
}

/// The base chain at `hook` (`forward`, `input`, `output`) that sends DNS packets of
/// snooped pods to [`check_chain`], and what is not tracked or spoofed to their copies.
fn base_chain(node: &NodeConfig, hook: &'static str) -> Chain {
    let mut rules = Vec::new();
    if let Some(proxy) = &node.dns_proxy
        && hook != "forward"
    {
        // The proxy's traffic is not copied: a taken query passes input with the
        // intercept mark, the proxy's answer passes output with the answer mark;
        // the proxy reads both itself.
        rules.push(Rule::new().when(Match::mark_any(MarkOf::Packet, proxy.mark_mask)).verdict(Verdict::Return));
    }
    for (family, v) in [(Family::V4, "v4"), (Family::V6, "v6")] {
        rules.push(
            Rule::new()
                .when(Match::ProtoIn(vec![Proto::Udp, Proto::Tcp]))
                .when(Match::ThPort(PortField::Sport, 53))
                .when(Match::CtDirection(Direction::Original))
                .when(Match::daddr_in(family, format_compact!("snoop-pods-{v}")))
                .verdict(Verdict::goto("dns-copy-untracked")),
        );
    }
    if hook == "forward" {
        // Anti-spoofing: an answer to a pod that entered from where the server's
        // address is not routed (a pod forging the server's address into its own
        // flow) fails the reverse-path lookup. (`iif` exists on forward and input
        // only; answers of a server on the node itself come through output.)
        for (family, v) in [(Family::V4, "v4"), (Family::V6, "v6")] {
            for proto in [Proto::Udp, Proto::Tcp] {
                rules.push(
                    Rule::new()
                        .when(Match::Proto(proto))
                        .when(Match::CtOriginalProtoDst(53))
                        .when(Match::CtDirection(Direction::Reply))
                        .when(Match::daddr_in(family, format_compact!("snoop-pods-{v}")))
                        .when(Match::FibSaddrIifMissing)
                        .verdict(Verdict::goto("dns-copy-spoofed")),
                );
            }
        }
    }
    for proto in [Proto::Udp, Proto::Tcp] {
        rules.push(
            Rule::new()
                .when(Match::Proto(proto))
                .when(Match::CtOriginalProtoDst(53))
                .verdict(Verdict::jump("dns-snoop-check")),
        );
    }
    Chain::base(Hook { chain_type: "filter", hook, priority: "filter - 5" }, rules)
}

/// The DNS proxy's intercept (`--dns-mode proxy`): a snooped pod's query (UDP and TCP
/// port 53) to a server whose guard element lives is taken by egressd's transparent
/// socket (`tproxy`, priority mangle: before the firewall's prerouting chain, which still
/// judges the query) and marked, so the proxy's rule routes it to this host. No socket
/// (egressd stopped) or no guard element (egressd hung): the rule does not match and the
/// query goes to the server, copied by the snoop rules above. Nothing is translated, so
/// no conntrack entry binds a pod's flow to the proxy.
///
/// The same queries are not tracked (`dns-proxy-raw`, priority raw): no NAT applies to
/// them, so the proxy sees the address the pod asked (a cluster DNS Service address
/// stays itself instead of becoming the endpoint kube-proxy's DNAT would pick) and its
/// answer leaves from that address. A query the guard lets pass to `notrack` but whose
/// socket is gone (egressd killed less than a second ago) goes out untranslated; the
/// pod's retry, after the guard expired, is translated again.
///
/// The proxy's answers are not tracked either (`dns-proxy-answers`, output, priority
/// raw; they carry the answer mark): a pod that asked from the same port before, when
/// its query went to the server directly (egressd stopped, the guard expired), left a
/// conntrack entry `pod:port -> address:53` that kube-proxy's DNAT translated. A tracked
/// answer `address:53 -> pod:port` would clash with it, and the kernel's NAT would
/// give the answer another source port, which the pod's resolver drops.
fn proxy_intercept(proxy: &crate::dns::targets::DnsProxySettings, table: &mut Table) {
    let mark = proxy.intercept_mark();
    let mut rules = Vec::new();
    let mut raw = Vec::new();
    for (v6, family, v) in [(false, Family::V4, "v4"), (true, Family::V6, "v6")] {
        let guard = crate::dns::targets::DnsProxySettings::guard_slot(v6);
        table
            .sets
            .insert(guard.set.into(), Set::with_timeout(if v6 { KeyType::TaggedIpv6 } else { KeyType::TaggedIpv4 }));
        for proto in [Proto::Udp, Proto::Tcp] {
            let taken = Rule::new()
                .when(Match::saddr_in(family, format_compact!("snoop-pods-{v}")))
                .when(guard.matched(family))
                .when(Match::Dport(proto, 53));
            raw.push(taken.clone().then(Statement::Notrack));
            rules.push(
                taken
                    .then(Statement::Tproxy(family, proxy.port))
                    .then(Statement::SetMark { of: MarkOf::Packet, keep: !mark, or: mark })
                    .verdict(Verdict::Accept),
            );
        }
    }
    table.chains.insert(
        "dns-proxy-raw".into(),
        Chain::base(Hook { chain_type: "filter", hook: "prerouting", priority: "raw" }, raw),
    );
    table.chains.insert(
        "dns-proxy".into(),
        Chain::base(Hook { chain_type: "filter", hook: "prerouting", priority: "mangle" }, rules),
    );
    table.chains.insert(
        "dns-proxy-answers".into(),
        Chain::base(
            Hook { chain_type: "filter", hook: "output", priority: "raw" },
            [Rule::new().when(Match::mark_any(MarkOf::Packet, proxy.answer_mark())).then(Statement::Notrack)],
        ),
    );
}

/// The named counter of the copies of `class` the rate limit held back (declared in
/// every table: [`crate::nft::COUNTERS`]).
pub(crate) fn copy_counter(class: &str) -> String {
    format!("snoop-over-{class}")
}

/// The `dnsName` rules of each namespace's policy as the listener matches them, by
/// namespace, kept with the policy version they were read from (an unchanged policy is
/// the same allocation: no walk over its rules), and the namespaces that have any: a
/// change looks only at the namespaces the view's journal lists.
#[derive(Debug, Default)]
pub(super) struct NamesCache {
    by_namespace: std::collections::HashMap<String, (std::sync::Arc<FirewallPolicy>, Vec<SnoopName>)>,
    /// What [`SnoopTargets::names`] is: the namespaces with `dnsName` rules.
    names: std::collections::HashMap<String, Vec<SnoopName>>,
    /// The stamp of the view's EgressFirewalls this was made from.
    from: Option<u64>,
}

/// The `dnsName` rules of `policy` as the listener matches them, each once.
fn snoop_names(policy: &FirewallPolicy, families: crate::dns::Families) -> Vec<SnoopName> {
    let mut names = Vec::new();
    for rule in &policy.rules {
        if let Target::Dns(name) = &rule.target {
            let [s4, s6] = super::dns_slots(&super::firewall::absolute(name));
            let entry = SnoopName {
                base: name.base.clone(),
                wildcard: name.wildcard,
                slots: [families.v4.then_some(s4), families.v6.then_some(s6)],
            };
            if !names.contains(&entry) {
                names.push(entry);
            }
        }
    }
    names
}

/// The listener's view of `view` on this node.
pub(crate) fn targets(
    view: &ClusterView,
    node: &NodeConfig,
    owners: &crate::view::Owners,
    cache: &mut NamesCache,
) -> SnoopTargets {
    let mut t = SnoopTargets {
        exempt: node.exempt_ranges(),
        grace: node.dns_grace,
        max_ttl: node.dns_max_ttl,
        ..Default::default()
    };
    if node.snoop.is_none() {
        return t;
    }
    let families = node.families();
    let touched: Vec<String> = match cache.from.and_then(|s| view.firewalls.touched_since(s)) {
        Some(touched) => touched.into_iter().map(str::to_string).collect(),
        None => view.firewalls.keys().chain(cache.by_namespace.keys()).cloned().collect(),
    };
    for ns in touched {
        let Some(policy) = view.firewalls.get(&ns).and_then(|e| e.policy.clone()) else {
            cache.by_namespace.remove(&ns);
            cache.names.remove(&ns);
            continue;
        };
        let names = match cache.by_namespace.get(&ns) {
            Some((read, names)) if std::sync::Arc::ptr_eq(read, &policy) => names.clone(),
            _ => snoop_names(&policy, families),
        };
        if names.is_empty() {
            cache.names.remove(&ns);
        } else {
            cache.names.insert(ns.clone(), names.clone());
        }
        cache.by_namespace.insert(ns, (policy, names));
    }
    cache.from = Some(view.firewalls.stamp());
    t.names.clone_from(&cache.names);
    if t.names.is_empty() {
        return t;
    }
    for (ip, pod) in owners {
        if t.names.contains_key(&pod.namespace) && node.is_local(pod) {
            t.pods.insert(*ip, pod.namespace.clone());
        }
    }
    t
}
