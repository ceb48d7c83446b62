//! `egressd explain`: what happens to one connection from a pod — which EgressFirewall
//! rule decides it, which EgressQoS rule marks it, whether an EgressIP gives it a fixed
//! source address and where that is hosted.
//!
//! [`explain`] is pure and reads the same [`ClusterView`] and [`NodeConfig`] as the
//! compile step, replaying its decisions for one packet in Rust (first match, the same
//! exemptions, the same pod-identity and EgressIP selection rules). The netns test
//! `tests/explain_netns.rs` checks its verdicts against what real packets get.
//! What a `dnsName` currently holds comes from outside ([`DnsKnowledge`]): the agent's
//! resolved answers and the kernel's sets (which also hold what snooping learned).
//!
//! The agent crate's `explain::socket` lets `egressd explain` ask the running agent (its
//! view, its answers); `explain::kernel` fills a [`KernelCheck`] from the live table.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use crate::compile::{NodeConfig, absolute, ip_owners, namespace_labels, oldest_first};
use crate::dns::DnsAnswers;
use crate::view::policy::{Action, FirewallRule, Protocol, QosRule, Target};
use crate::view::{ClusterView, PodInfo};

mod answer;
pub use answer::{
    DnsAddress, DnsDetail, EgressIpAnswer, Explanation, FirewallAnswer, KernelCheck, QosAnswer, RuleRef, Verdict,
};

/// Where the connection comes from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum From {
    /// A pod, `namespace/name`.
    Pod {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
    },
    /// A source address (a pod's, usually).
    Ip(IpAddr),
}

/// Why the command line does not name one connection ([`Query::parse`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QueryError {
    /// `--pod` is not `NAMESPACE/NAME`.
    #[error("--pod {0:?}: expected NAMESPACE/NAME")]
    Pod(String),
    /// Neither or both of `--pod` and `--src`.
    #[error("give one of --pod NAMESPACE/NAME or --src IP")]
    Source,
    /// `--to` is not `IP[:PORT[/PROTOCOL]]`.
    #[error("--to {given:?}: {why} (expected IP[:PORT[/tcp|udp|sctp]], IPv6 as [IP]:PORT)")]
    Destination {
        /// What was given.
        given: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// The pod is not in the view.
    #[error("pod {namespace}/{name} is not known (no such pod in the view)")]
    UnknownPod {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
    },
}

/// One connection to explain.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Query {
    /// The source.
    pub from: From,
    /// The destination address.
    pub to: IpAddr,
    /// Transport protocol and destination port, when given.
    pub port: Option<(Protocol, u16)>,
}

impl Query {
    /// `--pod NAMESPACE/NAME` or `--src IP`, and `--to IP[:PORT[/tcp|udp|sctp]]`
    /// (IPv6 with a port in brackets: `[2001:db8::1]:443/tcp`; the protocol defaults
    /// to tcp).
    pub fn parse(pod: Option<&str>, src: Option<IpAddr>, to: &str) -> Result<Self, QueryError> {
        let from = match (pod, src) {
            (Some(p), None) => {
                let (namespace, name) = p
                    .split_once('/')
                    .filter(|(ns, n)| !ns.is_empty() && !n.is_empty() && !n.contains('/'))
                    .ok_or_else(|| QueryError::Pod(p.into()))?;
                From::Pod { namespace: namespace.into(), name: name.into() }
            }
            (None, Some(ip)) => From::Ip(ip),
            _ => return Err(QueryError::Source),
        };
        let (to, port) = parse_destination(to)?;
        Ok(Self { from, to, port })
    }

    /// The destination as given: `192.0.2.1:443/tcp`, `[2001:db8::1]:53/udp`, `192.0.2.1`.
    pub fn destination(&self) -> String {
        match (self.to, self.port) {
            (ip, None) => ip.to_string(),
            (IpAddr::V4(ip), Some((p, port))) => format!("{ip}:{port}/{}", p.nft()),
            (IpAddr::V6(ip), Some((p, port))) => format!("[{ip}]:{port}/{}", p.nft()),
        }
    }
}

fn parse_destination(s: &str) -> Result<(IpAddr, Option<(Protocol, u16)>), QueryError> {
    let bad = |why: &'static str| QueryError::Destination { given: s.into(), why };
    let (ip, rest) = if let Some(inner) = s.strip_prefix('[') {
        let (ip, rest) = inner.split_once(']').ok_or_else(|| bad("missing ']'"))?;
        let rest = match rest {
            "" => None,
            r => Some(r.strip_prefix(':').ok_or_else(|| bad("expected ':' after ']'"))?),
        };
        (ip, rest)
    } else if s.matches(':').count() > 1 {
        (s, None)
    } else {
        match s.split_once(':') {
            Some((ip, rest)) => (ip, Some(rest)),
            None => (s, None),
        }
    };
    let ip: IpAddr = ip.parse().map_err(|_| bad("not an IP address"))?;
    let Some(rest) = rest else { return Ok((ip, None)) };
    let (port, proto) = rest.split_once('/').unwrap_or((rest, "tcp"));
    let port: u16 = port.parse().ok().filter(|p| *p > 0).ok_or_else(|| bad("the port is not 1-65535"))?;
    let proto = match proto.to_ascii_lowercase().as_str() {
        "tcp" => Protocol::Tcp,
        "udp" => Protocol::Udp,
        "sctp" => Protocol::Sctp,
        _ => return Err(bad("the protocol is not tcp, udp or sctp")),
    };
    Ok((ip, Some((proto, port))))
}

/// What is known about the current addresses of `dnsName` rules.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DnsKnowledge {
    /// The agent's resolved answers, by absolute name (`None`: not known here).
    pub resolved: Option<DnsAnswers>,
    /// The addresses in the kernel's sets, by absolute name: resolved and snooped
    /// (`None`: not read).
    pub kernel: Option<BTreeMap<String, BTreeSet<IpAddr>>>,
}

/// A rule as written in `spec.egress`.
pub fn describe_rule(rule: &FirewallRule) -> String {
    let to = match &rule.target {
        Target::Cidr(net) => format!("cidrSelector {net}"),
        Target::Dns(name) => format!("dnsName {name}"),
        Target::Nodes(sel) => format!("nodeSelector {sel}"),
    };
    let action = match rule.action {
        Action::Allow => "Allow",
        Action::Deny => "Deny",
    };
    if rule.ports.is_empty() {
        format!("{action} to {to}")
    } else {
        let ports: Vec<String> =
            rule.ports.iter().map(|(p, port)| format!("{}/{port}", p.nft().to_uppercase())).collect();
        format!("{action} to {to} ports {}", ports.join(", "))
    }
}

fn describe_qos(rule: &QosRule) -> String {
    let mut s = format!("dscp {}", rule.dscp);
    if let Some(dst) = rule.dst {
        s.push_str(&format!(", dstCIDR {dst}"));
    }
    if let Some(sel) = &rule.pods {
        s.push_str(&format!(", podSelector {sel}"));
    }
    s
}

/// The absolute names of the `dnsName` rules that could decide `query` (those of the
/// source pod's namespace): what to read from the kernel before [`explain`].
pub fn dns_names(view: &ClusterView, query: &Query) -> Vec<String> {
    let owners = view.pods.owners();
    let Some(pod) = source_pod(view, owners, query).ok().flatten() else { return Vec::new() };
    let Some(policy) = view.firewalls.get(&pod.namespace).and_then(|e| e.policy.as_ref()) else { return Vec::new() };
    let names: BTreeSet<String> = policy
        .rules
        .iter()
        .filter_map(|r| match &r.target {
            Target::Dns(n) => Some(absolute(n)),
            _ => None,
        })
        .collect();
    names.into_iter().collect()
}

/// The pod the source names, or `Err` with why it is not policed.
fn source_pod<'a>(
    view: &'a ClusterView,
    owners: &'a crate::view::Owners,
    query: &Query,
) -> Result<Option<&'a PodInfo>, String> {
    match &query.from {
        From::Ip(ip) => Ok(owners.get(ip).map(|p| &**p)),
        From::Pod { namespace, name } => {
            let pod = view
                .pods
                .get(&(namespace.clone(), name.clone()))
                .ok_or_else(|| format!("pod {namespace}/{name} is not known"))?;
            if !pod.counts() {
                let why = if pod.host_network {
                    "it uses the host network"
                } else if matches!(pod.phase.as_deref(), Some("Succeeded" | "Failed")) {
                    "it has finished"
                } else if pod.node.as_deref().is_none_or(str::is_empty) {
                    "it is not scheduled"
                } else {
                    "it has no IP yet"
                };
                return Err(format!("pod {namespace}/{name} is not policed: {why}"));
            }
            Ok(Some(pod))
        }
    }
}

/// Explain `query` on `view` as the node `node` compiles it, with what is known of DNS.
/// `Err` when the pod named is not known.
pub fn explain(
    view: &ClusterView,
    node: &NodeConfig,
    dns: &DnsKnowledge,
    query: &Query,
) -> Result<Explanation, QueryError> {
    if let From::Pod { namespace, name } = &query.from
        && !view.pods.contains_key(&(namespace.clone(), name.clone()))
    {
        return Err(QueryError::UnknownPod { namespace: namespace.clone(), name: name.clone() });
    }
    Ok(explain_known(view, node, dns, query))
}

fn explain_known(view: &ClusterView, node: &NodeConfig, dns: &DnsKnowledge, query: &Query) -> Explanation {
    let owners = view.pods.owners();
    let destination = query.destination();
    let given = match query.from {
        From::Ip(ip) => Some(ip),
        From::Pod { .. } => None,
    };
    let pod = match source_pod(view, owners, query) {
        Ok(p) => p,
        Err(why) => {
            let mut e = unpoliced(node, destination, None, given, &why);
            if let From::Pod { namespace, name } = &query.from {
                e.pod = Some(format!("{namespace}/{name}"));
                e.node = view.pods.get(&(namespace.clone(), name.clone())).and_then(|p| p.node.clone());
            }
            return e;
        }
    };
    let v4 = query.to.is_ipv4();
    let source = match (&query.from, pod) {
        (From::Ip(ip), _) => Some(*ip),
        (From::Pod { .. }, Some(p)) => {
            // The pod's own address of the destination's family, as the pod-identity rule
            // gives it (an address claimed by a newer pod is not this pod's).
            p.ips.iter().copied().find(|ip| ip.is_ipv4() == v4 && owners.get(ip).is_some_and(|o| std::ptr::eq(&**o, p)))
        }
        (From::Pod { .. }, None) => None,
    };
    let Some(src) = source else {
        let why = format!("the pod has no IPv{} address of its own", if v4 { 4 } else { 6 });
        return unpoliced(node, destination, pod, given, &why);
    };
    if src.is_ipv4() != v4 {
        return unpoliced(
            node,
            destination,
            pod,
            given,
            "the source and destination are of different address families",
        );
    }
    let Some(pod) = pod.or_else(|| owners.get(&src).map(|p| &**p)) else {
        let why = format!("no pod egressd knows has the address {src}: not policed");
        return unpoliced(node, destination, None, given, &why);
    };
    Explanation {
        pod: Some(format!("{}/{}", pod.namespace, pod.name)),
        source: Some(src),
        node: pod.node.clone(),
        destination,
        firewall: firewall(view, node, dns, pod, query),
        qos: qos(view, pod, query),
        egress_ip: egress_ip(view, node, pod, query),
        here: node.node_name.clone(),
        table: node.table_name.clone(),
        kernel: None,
    }
}

fn unpoliced(
    node: &NodeConfig,
    destination: String,
    pod: Option<&PodInfo>,
    source: Option<IpAddr>,
    why: &str,
) -> Explanation {
    Explanation {
        pod: pod.map(|p| format!("{}/{}", p.namespace, p.name)),
        source,
        node: pod.and_then(|p| p.node.clone()),
        destination,
        firewall: FirewallAnswer {
            verdict: Verdict::Allowed,
            reason: format!("not filtered: {why}"),
            rule: None,
            audit: false,
            dns: Vec::new(),
            notes: Vec::new(),
            chain: None,
        },
        qos: None,
        egress_ip: EgressIpAnswer {
            egress_ip: None,
            hosts: Vec::new(),
            source: None,
            reason: format!("no EgressIP applies: {why}"),
            dropped: false,
        },
        here: node.node_name.clone(),
        table: node.table_name.clone(),
        kernel: None,
    }
}

fn firewall(view: &ClusterView, node: &NodeConfig, dns: &DnsKnowledge, pod: &PodInfo, q: &Query) -> FirewallAnswer {
    let mut answer = FirewallAnswer {
        verdict: Verdict::Allowed,
        reason: String::new(),
        rule: None,
        audit: false,
        dns: Vec::new(),
        notes: Vec::new(),
        chain: None,
    };
    let entry = view.firewalls.get(&pod.namespace);
    if entry.is_some_and(|e| e.policy.is_some()) {
        answer.chain = Some(crate::nft::chain_name("fw", &pod.namespace));
    }
    if let Some(range) = node.cluster_cidrs.iter().find(|n| n.contains(&q.to)) {
        answer.reason = format!("exempt: {} is in the cluster range {range} (never filtered)", q.to);
        return answer;
    }
    if let Some(range) = node.service_cidrs.iter().find(|n| n.contains(&q.to)) {
        answer.reason = format!("exempt: {} is in the Service range {range} (never filtered)", q.to);
        return answer;
    }
    let Some(entry) = entry else {
        answer.reason = format!("no EgressFirewall in namespace {}: allowed", pod.namespace);
        return answer;
    };
    let object = entry.key.to_string();
    if let Some(e) = &entry.error {
        answer.notes.push(match entry.policy {
            Some(_) => format!("{object} is invalid ({e}); its last good version applies"),
            None => format!("{object} is invalid ({e}) and has no good version: nothing is filtered"),
        });
    }
    let Some(policy) = &entry.policy else {
        answer.reason = format!("{object} is not applied: allowed");
        return answer;
    };
    for (index, rule) in policy.rules.iter().enumerate() {
        if !rule_matches(view, node, dns, index, rule, q, &mut answer) {
            continue;
        }
        let written = describe_rule(rule);
        answer.rule = Some(RuleRef { object: object.clone(), index, rule: written.clone() });
        (answer.verdict, answer.reason) = match rule.action {
            Action::Allow => (Verdict::Allowed, format!("allowed by {object} rule {index}: {written}")),
            Action::Deny if policy.audit => {
                answer.audit = true;
                (
                    Verdict::Allowed,
                    format!("allowed (audit mode): {object} rule {index} would drop it: {written}; logged and counted"),
                )
            }
            Action::Deny => (Verdict::Dropped, format!("dropped by {object} rule {index}: {written}")),
        };
        return answer;
    }
    answer.reason = format!("no rule of {object} matched: allowed");
    answer
}

/// Whether rule `index` matches, as the compiled chain does; notes rules that are not
/// enforced or cannot be decided here.
fn rule_matches(
    view: &ClusterView,
    node: &NodeConfig,
    dns: &DnsKnowledge,
    index: usize,
    rule: &FirewallRule,
    q: &Query,
    answer: &mut FirewallAnswer,
) -> bool {
    let v4 = q.to.is_ipv4();
    let target = match &rule.target {
        Target::Cidr(net) => net.addr().is_ipv4() == v4 && net.contains(&q.to),
        Target::Nodes(sel) => {
            view.nodes.values().filter(|n| sel.matches(&n.labels)).any(|n| n.addresses.contains(&q.to))
        }
        Target::Dns(name) if name.wildcard && node.snoop.is_none() => {
            answer.notes.push(format!("rule {index} ({name}) is not enforced: wildcard names need DNS snooping"));
            false
        }
        Target::Dns(name) => {
            let absolute = absolute(name);
            let addresses = dns_addresses(dns, &absolute, v4, node);
            let hit = addresses.as_ref().is_some_and(|a| a.iter().any(|a| a.address == q.to));
            answer.dns.push(DnsDetail { index, name: name.to_string(), addresses });
            hit
        }
    };
    if !target || rule.ports.is_empty() {
        return target;
    }
    match q.port {
        Some(p) => rule.ports.contains(&p),
        None => {
            answer.notes.push(format!("rule {index} matches only some ports and no port was given: not counted"));
            false
        }
    }
}

/// The addresses a name's set holds for one family (resolved minus the exempt ranges,
/// as compiled, plus what the kernel has), with their origin.
fn dns_addresses(dns: &DnsKnowledge, name: &str, v4: bool, node: &NodeConfig) -> Option<Vec<DnsAddress>> {
    if dns.resolved.is_none() && dns.kernel.is_none() {
        return None;
    }
    let exempt = node.exempt_ranges();
    let resolved: BTreeSet<IpAddr> = dns
        .resolved
        .as_ref()
        .and_then(|r| r.get(name))
        .map(|r| r.addresses.iter().copied().filter(|ip| !exempt.iter().any(|n| n.contains(ip))).collect())
        .unwrap_or_default();
    let kernel = dns.kernel.as_ref().and_then(|k| k.get(name)).cloned().unwrap_or_default();
    let all: BTreeSet<IpAddr> = resolved.iter().chain(&kernel).copied().filter(|ip| ip.is_ipv4() == v4).collect();
    Some(
        all.into_iter()
            .map(|address| {
                let origin = if resolved.contains(&address) {
                    "resolved"
                } else if dns.resolved.is_some() {
                    "snooped"
                } else {
                    "kernel"
                };
                DnsAddress { address, origin: origin.into() }
            })
            .collect(),
    )
}

fn qos(view: &ClusterView, pod: &PodInfo, q: &Query) -> Option<QosAnswer> {
    let entry = view.qos.get(&pod.namespace)?;
    let policy = entry.policy.as_ref()?;
    let v4 = q.to.is_ipv4();
    policy.rules.iter().enumerate().find_map(|(index, rule)| {
        let dst = rule.dst.is_none_or(|n: IpNet| n.addr().is_ipv4() == v4 && n.contains(&q.to));
        let pods = rule.pods.as_ref().is_none_or(|s| s.matches(&pod.labels));
        (dst && pods).then(|| QosAnswer {
            dscp: rule.dscp,
            rule: RuleRef { object: entry.key.to_string(), index, rule: describe_qos(rule) },
        })
    })
}

fn egress_ip(view: &ClusterView, node: &NodeConfig, pod: &PodInfo, q: &Query) -> EgressIpAnswer {
    let mut answer =
        EgressIpAnswer { egress_ip: None, hosts: Vec::new(), source: None, reason: String::new(), dropped: false };
    let labels = namespace_labels(view, &pod.namespace);
    let ordered = oldest_first(view);
    let Some(policy) = ordered
        .iter()
        .filter_map(|e| e.policy.as_ref())
        .find(|p| p.namespaces.matches(&labels) && p.pods.matches(&pod.labels))
    else {
        answer.source = Some("its node's address (the cluster's usual SNAT)".into());
        answer.reason = "no EgressIP selects the pod".into();
        return answer;
    };
    answer.egress_ip = Some(policy.name.clone());
    let name = &policy.name;
    let node_addrs: BTreeSet<IpAddr> = view.nodes.values().flat_map(|n| n.addresses.iter().copied()).collect();
    let exempt = node.exempt_ranges();
    if exempt.iter().any(|n| n.contains(&q.to)) || node_addrs.contains(&q.to) {
        answer.reason = format!(
            "EgressIP {name} selects the pod, but {} is inside the cluster (pods, Services, nodes): not SNATed",
            q.to
        );
        return answer;
    }
    let v4 = q.to.is_ipv4();
    if !policy.ips.iter().any(|ip| ip.is_ipv4() == v4) {
        answer.source = Some("its node's address (the cluster's usual SNAT)".into());
        answer.reason =
            format!("EgressIP {name} has no IPv{} address: this family is left alone", if v4 { 4 } else { 6 });
        return answer;
    }
    // The IPs this EgressIP owns (the oldest EgressIP naming an IP keeps it), placed.
    let owner = ip_owners(&ordered);
    let mut seen = BTreeSet::new();
    for (ip, host) in &policy.placement {
        if ip.is_ipv4() == v4
            && policy.ips.contains(ip)
            && owner.get(ip) == Some(&name.as_str())
            && !node_addrs.contains(ip)
            && seen.insert(*ip)
        {
            answer.hosts.push((*ip, host.clone()));
        }
    }
    let pod_node = pod.node.as_deref().unwrap_or_default();
    if let Some((ip, _)) = answer.hosts.iter().find(|(_, h)| h == pod_node) {
        answer.source = Some(ip.to_string());
        answer.reason = format!("EgressIP {name}: its IP {ip} is on the pod's own node {pod_node}, which SNATs to it");
    } else if let [(ip, host)] = answer.hosts.as_slice() {
        answer.source = Some(ip.to_string());
        answer.reason = format!("EgressIP {name}: steered from node {pod_node} to node {host}, which SNATs to {ip}");
    } else if !answer.hosts.is_empty() {
        let all: Vec<String> = answer.hosts.iter().map(|(ip, h)| format!("{ip} (node {h})")).collect();
        answer.source = Some(format!("one of {} (chosen per connection)", all.join(", ")));
        answer.reason = format!("EgressIP {name}: steered to its hosting nodes over a multipath route");
    } else if node.egress.fail_closed {
        answer.dropped = true;
        answer.reason = format!("EgressIP {name} selects the pod but no node hosts its IPs: dropped (fail-closed)");
    } else {
        answer.source = Some("its node's address (the cluster's usual SNAT)".into());
        answer.reason = format!("EgressIP {name} selects the pod but no node hosts its IPs yet: normal SNAT");
    }
    answer
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn destinations_parse_with_and_without_ports() {
        let q = |to: &str| parse_destination(to);
        assert_eq!(q("192.0.2.1").unwrap(), ("192.0.2.1".parse().unwrap(), None));
        assert_eq!(q("192.0.2.1:443").unwrap().1, Some((Protocol::Tcp, 443)));
        assert_eq!(q("192.0.2.1:53/udp").unwrap().1, Some((Protocol::Udp, 53)));
        assert_eq!(q("192.0.2.1:9/SCTP").unwrap().1, Some((Protocol::Sctp, 9)));
        assert_eq!(q("2001:db8::1").unwrap(), ("2001:db8::1".parse().unwrap(), None));
        assert_eq!(q("[2001:db8::1]:80/tcp").unwrap().1, Some((Protocol::Tcp, 80)));
        assert_eq!(q("[2001:db8::1]").unwrap().1, None);
        for bad in ["192.0.2.1:0", "192.0.2.1:70000", "192.0.2.1:80/icmp", "[2001:db8::1", "nope", "192.0.2.1:x"] {
            assert!(q(bad).is_err(), "{bad}");
        }
        assert!(Query::parse(Some("a"), None, "192.0.2.1").unwrap_err().to_string().contains("NAMESPACE/NAME"));
        assert!(Query::parse(None, None, "192.0.2.1").is_err());
        let q = Query::parse(Some("a/b"), None, "[2001:db8::1]:80").unwrap();
        assert_eq!(q.destination(), "[2001:db8::1]:80/tcp");
    }
}
