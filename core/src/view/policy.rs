//! The controller layer: wire objects → validated policy egressd can act on.
//!
//! The apiserver stores more than the reference controller accepts (a `cidrSelector` of
//! `1.2.3./32`, an egress IP with nine groups). These conversions reject such objects
//! with the reference's wording where it has one, naming the field. The CRD's loosely
//! anchored patterns also admit values the reference reads in its own way: a rule `type`
//! other than exactly `Allow` denies, a port entry whose protocol is not exactly `TCP`,
//! `UDP` or `SCTP` is skipped. egressd does the same and says so in the status, never
//! reading such a value in a way that allows more than the reference would.

use std::net::{IpAddr, Ipv6Addr};
use std::str::FromStr;

use ipnet::IpNet;

use super::selector::Selector;
use crate::api::schema::parse_go_cidr;
use crate::api::types::{CloudPrivateIPConfig, EgressFirewall, EgressIP, EgressQoS};

/// The reference's limit on EgressFirewall rules per object.
pub(crate) const MAX_FIREWALL_RULES: usize = 8000;
/// The reference's limit on EgressQoS rules per object.
pub(crate) const MAX_QOS_RULES: usize = 1000;
/// The only object name the reference acts on for EgressFirewall and EgressQoS.
pub(crate) const SINGLETON_NAME: &str = "default";

/// Allow or deny.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Action {
    /// Let the traffic through.
    Allow,
    /// Drop it.
    Deny,
}

/// A transport protocol a port rule may name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
pub enum Protocol {
    /// TCP.
    Tcp,
    /// UDP.
    Udp,
    /// SCTP.
    Sctp,
}

impl Protocol {
    /// The nft keyword.
    pub fn nft(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
            Protocol::Sctp => "sctp",
        }
    }

    /// The protocol of an nft keyword ([`Protocol::nft`]).
    pub fn from_nft(word: &str) -> Option<Self> {
        [Protocol::Tcp, Protocol::Udp, Protocol::Sctp].into_iter().find(|p| p.nft() == word)
    }

    /// The IP protocol number.
    pub fn number(self) -> u8 {
        match self {
            Protocol::Tcp => 6,
            Protocol::Udp => 17,
            Protocol::Sctp => 132,
        }
    }
}

/// A rule's protocol/port pairs: a set (sorted, each pair once), kept inline up to four
/// pairs. A `BTreeSet` allocated a 64-byte node for every rule with a port (a third of
/// the rules at 100k, 2 MB); almost every rule names at most a few ports.
#[derive(Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Ports(smallvec::SmallVec<[(Protocol, u16); 4]>);

impl Ports {
    /// Add a pair (no effect when present).
    pub fn insert(&mut self, pair: (Protocol, u16)) {
        if let Err(at) = self.0.binary_search(&pair) {
            self.0.insert(at, pair);
        }
    }

    /// Whether `pair` is one of them.
    pub fn contains(&self, pair: &(Protocol, u16)) -> bool {
        self.0.binary_search(pair).is_ok()
    }

    /// The pairs in order.
    pub fn iter(&self) -> std::slice::Iter<'_, (Protocol, u16)> {
        self.0.iter()
    }

    /// The smallest pair.
    pub fn first(&self) -> Option<&(Protocol, u16)> {
        self.0.first()
    }

    /// How many pairs.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there is none (the rule matches every port).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl std::fmt::Debug for Ports {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.iter()).finish()
    }
}

impl FromIterator<(Protocol, u16)> for Ports {
    fn from_iter<I: IntoIterator<Item = (Protocol, u16)>>(iter: I) -> Self {
        let mut pairs: smallvec::SmallVec<[(Protocol, u16); 4]> = iter.into_iter().collect();
        pairs.sort_unstable();
        pairs.dedup();
        Self(pairs)
    }
}

impl<'a> IntoIterator for &'a Ports {
    type Item = &'a (Protocol, u16);
    type IntoIter = std::slice::Iter<'a, (Protocol, u16)>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

/// A sequence, as the `BTreeSet` it replaces was (saved last good versions stay readable).
impl serde::Serialize for Ports {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.iter())
    }
}

impl<'de> serde::Deserialize<'de> for Ports {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Ok(Vec::<(Protocol, u16)>::deserialize(deserializer)?.into_iter().collect())
    }
}

/// A DNS name of a rule: lowercase, absolute (trailing dot removed for display), maybe
/// a one-label wildcard.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct DnsName {
    /// The name without the `*.` prefix and without a trailing dot, lowercase.
    pub base: String,
    /// Whether it was `*.base`.
    pub wildcard: bool,
}

impl std::fmt::Display for DnsName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.wildcard { write!(f, "*.{}", self.base) } else { f.write_str(&self.base) }
    }
}

/// Where an EgressFirewall rule points. The rarer targets are boxed, so a rule is the
/// size of a CIDR rule (56 bytes instead of 64).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Target {
    /// A canonical CIDR (host bits cleared).
    Cidr(IpNet),
    /// A DNS name.
    Dns(Box<DnsName>),
    /// The node IPs of nodes matching the selector.
    Nodes(Box<Selector>),
}

/// One validated EgressFirewall rule.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FirewallRule {
    /// Allow or deny.
    pub action: Action,
    /// The destination.
    pub target: Target,
    /// Protocol/port pairs, OR-ed; empty means all traffic.
    pub ports: Ports,
}

/// The validated EgressFirewall of one namespace.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FirewallPolicy {
    /// The namespace it applies to.
    pub namespace: String,
    /// The rules, in order.
    pub rules: Vec<FirewallRule>,
    /// Values the CRD admits that egressd, like the reference, reads in the restrictive
    /// way (a `type` other than `Allow` denies, unknown protocols are skipped).
    #[serde(default)]
    pub warnings: Vec<String>,
    /// Audit mode (annotation [`AUDIT_ANNOTATION`] `"true"`): Deny rules log and count,
    /// nothing is dropped.
    #[serde(default)]
    pub audit: bool,
}

/// The EgressFirewall annotation that turns on audit mode.
pub const AUDIT_ANNOTATION: &str = "egressd.io/audit";

/// One validated EgressQoS rule.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct QosRule {
    /// The DSCP value, 0–63.
    pub dscp: u8,
    /// Destination; `None` = every destination.
    pub dst: Option<IpNet>,
    /// Pods of the namespace; `None` = all.
    pub pods: Option<Selector>,
}

/// The validated EgressQoS of one namespace.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct QosPolicy {
    /// The namespace.
    pub namespace: String,
    /// The rules, in order.
    pub rules: Vec<QosRule>,
}

/// A validated EgressIP.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct EgressIpPolicy {
    /// Object name.
    pub name: String,
    /// The egress addresses.
    pub ips: Vec<IpAddr>,
    /// Namespaces selected.
    pub namespaces: Selector,
    /// Pods selected in them.
    pub pods: Selector,
    /// Placement from `status.items`: (address, node); items whose address is no longer
    /// in `ips` are kept (unused by the node side) for the leader to remove.
    pub placement: Vec<(IpAddr, String)>,
    /// Creation time (seconds since the epoch) for tie-breaking, when known.
    pub created: Option<i64>,
}

/// A validated CloudPrivateIPConfig.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CloudPrivateIp {
    /// The IP named by the object.
    pub ip: IpAddr,
    /// The node requested in `spec.node`.
    pub node: Option<String>,
    /// `status.node`: where the IP is (or was last) assigned.
    #[serde(default)]
    pub status_node: Option<String>,
    /// The `Assigned` condition: (status, reason, message).
    #[serde(default)]
    pub assigned: Option<(String, String, String)>,
    /// Marked for deletion (`metadata.deletionTimestamp`).
    #[serde(default)]
    pub deleting: bool,
    /// Carries the controller's finalizer ([`CLOUD_FINALIZER`]).
    #[serde(default)]
    pub finalizer: bool,
    /// The EgressIP that asked for it (annotation [`CLOUD_OWNER_ANNOTATION`]).
    #[serde(default)]
    pub owner: Option<String>,
}

/// The finalizer of the CloudPrivateIPConfig controller: a delete releases the IP first.
pub const CLOUD_FINALIZER: &str = "cloudprivateipconfig.cloud.network.openshift.io/finalizer";
/// The annotation naming the EgressIP a CloudPrivateIPConfig was created for (the
/// reference's owner reference).
pub const CLOUD_OWNER_ANNOTATION: &str = "k8s.ovn.org/egressip-owner-ref";

impl CloudPrivateIp {
    /// The controller reported the IP assigned to `node` (status.node = spec.node = node,
    /// `Assigned` True).
    pub fn assigned_to(&self, node: &str) -> bool {
        self.node.as_deref() == Some(node)
            && self.status_node.as_deref() == Some(node)
            && self.assigned.as_ref().is_some_and(|(s, _, _)| s == "True")
    }

    /// The controller reported an error for the current request.
    pub fn failed(&self) -> bool {
        self.assigned.as_ref().is_some_and(|(_, r, _)| r == "CloudResponseError")
    }
}

/// The CloudPrivateIPConfig name of `ip`: IPv4 as is, IPv6 fully expanded with `.` for
/// `:` (`2001.0db8.00ff.0000.0000.0000.0000.0054`).
pub fn cloud_private_ip_name(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => v6.segments().iter().map(|s| format!("{s:04x}")).collect::<Vec<_>>().join("."),
    }
}

/// Outcome of converting one object.
pub(crate) type Conversion<T> = Result<T, PolicyError>;

/// A conversion failure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PolicyError {
    /// The object is valid but not one egressd acts on (name is not `default`).
    Ignored(String),
    /// The object is invalid; the message names the field.
    Invalid(String),
}

fn invalid<T>(msg: String) -> Conversion<T> {
    Err(PolicyError::Invalid(msg))
}

fn parse_selector(
    sel: &k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector,
    path: &str,
) -> Conversion<Selector> {
    Selector::parse(sel, path).map_err(PolicyError::Invalid)
}

/// Parse a CIDR as the reference does (Go `net.ParseCIDR`) and clear host bits.
pub(crate) fn canonical_cidr(s: &str) -> Option<IpNet> {
    let (ip, len) = parse_go_cidr(s)?;
    IpNet::new(ip, len).ok().map(|n| n.trunc())
}

/// Normalise a dnsName: lowercase, trailing dot dropped, `*.` split off.
pub(crate) fn normalise_dns_name(s: &str) -> DnsName {
    let lower = s.to_ascii_lowercase();
    let trimmed = lower.strip_suffix('.').unwrap_or(&lower);
    match trimmed.strip_prefix("*.") {
        Some(base) => DnsName { base: base.to_string(), wildcard: true },
        None => DnsName { base: trimmed.to_string(), wildcard: false },
    }
}

/// Convert an EgressFirewall.
pub fn firewall_policy(ef: &EgressFirewall) -> Conversion<FirewallPolicy> {
    let namespace = ef.metadata.namespace.clone().unwrap_or_default();
    let name = ef.metadata.name.as_deref().unwrap_or_default();
    if name != SINGLETON_NAME {
        return Err(PolicyError::Ignored(format!(
            "EgressFirewall {namespace}/{name} ignored: only the object named \"default\" is used"
        )));
    }
    let egress = &ef.spec.egress;
    if egress.len() > MAX_FIREWALL_RULES {
        return invalid(format!(
            "egressFirewall for namespace {namespace} has too many rules, max allowed number is {MAX_FIREWALL_RULES}"
        ));
    }
    let mut rules = Vec::with_capacity(egress.len());
    let mut warnings = Vec::new();
    for (i, rule) in egress.iter().enumerate() {
        let path = format!("spec.egress[{i}]");
        // The CRD's loosely anchored pattern admits `Allowed`, `xDeny`, ...; the reference
        // treats every type but exactly `Allow` as deny, and so does egressd (warned).
        let action = match rule.rule_type.as_str() {
            "Allow" => Action::Allow,
            "Deny" => Action::Deny,
            other => {
                warnings.push(format!(
                    "{path}.type: {other:?} is neither \"Allow\" nor \"Deny\": treated as Deny, as OVN-Kubernetes does"
                ));
                Action::Deny
            }
        };
        let target = firewall_target(&rule.to, &path)?;
        let (ports, unknown) = firewall_ports(rule.ports.iter().flatten(), &path, &mut warnings)?;
        if unknown > 0 && ports.is_empty() {
            if action == Action::Allow {
                warnings.push(format!("{path}: no known protocol left: the Allow rule is not used"));
                continue;
            }
            warnings.push(format!("{path}: no known protocol left: the Deny rule applies to every port"));
        }
        rules.push(FirewallRule { action, target, ports });
    }
    let audit = ef.metadata.annotations.as_ref().and_then(|a| a.get(AUDIT_ANNOTATION)).is_some_and(|v| v == "true");
    Ok(FirewallPolicy { namespace, rules, warnings, audit })
}

/// The destination of EgressFirewall rule `path`: exactly one of its selectors.
fn firewall_target(to: &crate::api::types::EgressFirewallDestination, path: &str) -> Conversion<Target> {
    let set = [to.cidr_selector.is_some(), to.dns_name.is_some(), to.node_selector.is_some()];
    if set.iter().filter(|b| **b).count() != 1 {
        return invalid(format!(
            "{path}.to: Invalid value: exactly one of cidrSelector, dnsName and nodeSelector must be set"
        ));
    }
    if let Some(cidr) = &to.cidr_selector {
        match canonical_cidr(cidr) {
            Some(net) => Ok(Target::Cidr(net)),
            None => invalid(format!("{path}.to.cidrSelector: invalid CIDR address: {cidr}")),
        }
    } else if let Some(dns) = &to.dns_name {
        Ok(Target::Dns(Box::new(normalise_dns_name(dns))))
    } else if let Some(sel) = &to.node_selector {
        Ok(Target::Nodes(Box::new(parse_selector(sel, &format!("{path}.to.nodeSelector"))?)))
    } else {
        invalid(format!("{path}.to: Required value"))
    }
}

/// The ports of EgressFirewall rule `path`, and how many entries were skipped for an
/// unknown protocol. The CRD admits `TCPX`, `xUDPx`, ...; the reference skips such
/// entries. So does egressd (warned); a rule left with none of its ports is kept only
/// when it denies (then on every port), so nothing is ever allowed by accident.
fn firewall_ports<'a>(
    entries: impl Iterator<Item = &'a crate::api::types::EgressFirewallPort>,
    path: &str,
    warnings: &mut Vec<String>,
) -> Conversion<(Ports, usize)> {
    let mut ports = Ports::default();
    let mut unknown = 0;
    for (j, p) in entries.enumerate() {
        let protocol = match p.protocol.as_str() {
            "TCP" => Protocol::Tcp,
            "UDP" => Protocol::Udp,
            "SCTP" => Protocol::Sctp,
            other => {
                warnings.push(format!(
                    "{path}.ports[{j}].protocol: {other:?} is not \"TCP\", \"UDP\" or \"SCTP\": entry skipped"
                ));
                unknown += 1;
                continue;
            }
        };
        let port = match u16::try_from(p.port) {
            Ok(port) if port >= 1 => port,
            _ => {
                return invalid(format!(
                    "{path}.ports[{j}].port: Invalid value: {}: must be between 1 and 65535",
                    p.port
                ));
            }
        };
        ports.insert((protocol, port));
    }
    Ok((ports, unknown))
}

/// Convert an EgressQoS.
pub fn qos_policy(q: &EgressQoS) -> Conversion<QosPolicy> {
    let namespace = q.metadata.namespace.clone().unwrap_or_default();
    let name = q.metadata.name.as_deref().unwrap_or_default();
    if name != SINGLETON_NAME {
        return Err(PolicyError::Ignored(format!(
            "EgressQoS {namespace}/{name} ignored: only the object named \"default\" is used"
        )));
    }
    let egress = &q.spec.egress;
    if egress.len() > MAX_QOS_RULES {
        return invalid(format!("cannot create EgressQoS with {} rules - maximum is {MAX_QOS_RULES}", egress.len()));
    }
    let mut rules = Vec::with_capacity(egress.len());
    for (i, rule) in egress.iter().enumerate() {
        let path = format!("spec.egress[{i}]");
        let dscp = match u8::try_from(rule.dscp) {
            Ok(d) if d <= 63 => d,
            _ => {
                return invalid(format!("{path}.dscp: Invalid value: {}: must be between 0 and 63", rule.dscp));
            }
        };
        let dst = match &rule.dst_cidr {
            None => None,
            Some(s) => match canonical_cidr(s) {
                Some(net) => Some(net),
                None => {
                    return invalid(format!("{path}.dstCIDR: Invalid value: {s:?}: must be a CIDR"));
                }
            },
        };
        let pods = match &rule.pod_selector {
            None => None,
            Some(sel) => Some(parse_selector(sel, &format!("{path}.podSelector"))?),
        };
        rules.push(QosRule { dscp, dst, pods });
    }
    Ok(QosPolicy { namespace, rules })
}

/// Convert an EgressIP.
pub fn egress_ip_policy(e: &EgressIP) -> Conversion<EgressIpPolicy> {
    let name = e.metadata.name.clone().unwrap_or_default();
    let mut ips = Vec::new();
    for ip in &e.spec.egress_ips {
        match IpAddr::from_str(ip) {
            Ok(addr) if !ips.contains(&addr) => ips.push(addr),
            Ok(_) => {}
            Err(_) => {
                return invalid(format!("spec.egressIPs: unable to parse provided EgressIP: {ip}, invalid"));
            }
        }
    }
    let namespaces = parse_selector(&e.spec.namespace_selector, "spec.namespaceSelector")?;
    let pods = match &e.spec.pod_selector {
        Some(sel) => parse_selector(sel, "spec.podSelector")?,
        None => Selector::everything(),
    };
    let mut placement = Vec::new();
    for (i, item) in e.status.iter().flat_map(|s| s.items.iter()).enumerate() {
        let Ok(addr) = IpAddr::from_str(&item.egress_ip) else {
            return invalid(format!(
                "status.items[{i}].egressIP: unable to parse provided EgressIP: {}, invalid",
                item.egress_ip
            ));
        };
        // An item whose IP left spec.egressIPs is kept here (the node side never uses
        // it: only listed IPs are claimed) so that the placement leader sees it and
        // removes it; rejecting the object would keep the old IP hosted.
        placement.push((addr, item.node.clone()));
    }
    let created = e.metadata.creation_timestamp.as_ref().map(|t| t.0.as_second());
    Ok(EgressIpPolicy { name, ips, namespaces, pods, placement, created })
}

/// The IP a CloudPrivateIPConfig name stands for: dotted IPv4, or IPv6 fully expanded
/// with dots in place of colons.
pub fn cloud_private_ip_from_name(name: &str) -> Option<IpAddr> {
    if let Ok(ip) = std::net::Ipv4Addr::from_str(name) {
        return Some(IpAddr::V4(ip));
    }
    let groups: Vec<&str> = name.split('.').collect();
    if groups.len() == 8 && groups.iter().all(|g| g.len() == 4) {
        return Ipv6Addr::from_str(&groups.join(":")).ok().map(IpAddr::V6);
    }
    None
}

/// Convert a CloudPrivateIPConfig.
pub fn cloud_private_ip(c: &CloudPrivateIPConfig) -> Conversion<CloudPrivateIp> {
    let name = c.metadata.name.as_deref().unwrap_or_default();
    let Some(ip) = cloud_private_ip_from_name(name) else {
        return invalid(format!(
            "metadata.name: Invalid value: {name:?}: must be an IPv4 address or a fully expanded IPv6 address with '.' for ':'"
        ));
    };
    let status = c.status.as_ref();
    let assigned = status
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Assigned"))
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()));
    Ok(CloudPrivateIp {
        ip,
        node: c.spec.node.clone().filter(|n| !n.is_empty()),
        status_node: status.and_then(|s| s.node.clone()).filter(|n| !n.is_empty()),
        assigned,
        deleting: c.metadata.deletion_timestamp.is_some(),
        finalizer: c.metadata.finalizers.iter().flatten().any(|f| f == CLOUD_FINALIZER),
        owner: c.metadata.annotations.as_ref().and_then(|a| a.get(CLOUD_OWNER_ANNOTATION)).cloned(),
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// `Ports` is the set it replaced: the same pairs in the same order whatever the
        /// input order and repeats, built at once or pair by pair, the same JSON (saved
        /// last good versions), read back unchanged, and ordered as the sets were (the
        /// order of a run's port groups in the table).
        #[test]
        fn ports_behave_as_the_btree_set(
            a in proptest::collection::vec((prop_oneof![Just(Protocol::Tcp), Just(Protocol::Udp), Just(Protocol::Sctp)], 1u16..6), 0..9),
            b in proptest::collection::vec((prop_oneof![Just(Protocol::Tcp), Just(Protocol::Udp)], 1u16..4), 0..4),
        ) {
            let set: BTreeSet<(Protocol, u16)> = a.iter().copied().collect();
            let ports: Ports = a.iter().copied().collect();
            let mut one_by_one = Ports::default();
            for p in &a {
                one_by_one.insert(*p);
            }
            prop_assert_eq!(&ports, &one_by_one);
            prop_assert_eq!(ports.iter().copied().collect::<Vec<_>>(), set.iter().copied().collect::<Vec<_>>());
            prop_assert_eq!((ports.len(), ports.first(), ports.is_empty()), (set.len(), set.first(), set.is_empty()));
            for p in a.iter().chain(&b) {
                prop_assert_eq!(ports.contains(p), set.contains(p));
            }
            let json = serde_json::to_string(&ports).unwrap();
            prop_assert_eq!(&json, &serde_json::to_string(&set).unwrap());
            prop_assert_eq!(serde_json::from_str::<Ports>(&serde_json::to_string(&a).unwrap()).unwrap(), ports.clone());
            let (set_b, ports_b): (BTreeSet<_>, Ports) = (b.iter().copied().collect(), b.iter().copied().collect());
            prop_assert_eq!(ports.cmp(&ports_b), set.cmp(&set_b));
        }
    }

    #[test]
    fn cidrs_are_canonical() {
        assert_eq!(canonical_cidr("1.2.3.4/24").unwrap().to_string(), "1.2.3.0/24");
        assert_eq!(canonical_cidr("2001:db8::1/32").unwrap().to_string(), "2001:db8::/32");
        assert!(canonical_cidr("1.2.3./32").is_none());
    }

    #[test]
    fn dns_names_are_normalised() {
        assert_eq!(normalise_dns_name("WWW.Example.COM."), DnsName { base: "www.example.com".into(), wildcard: false });
        assert_eq!(normalise_dns_name("*.Example.com").to_string(), "*.example.com");
    }

    fn firewall(name: &str, rules: usize) -> EgressFirewall {
        use crate::api::types::{EgressFirewallDestination, EgressFirewallRule, EgressFirewallSpec};
        let rule = EgressFirewallRule {
            rule_type: "Deny".into(),
            to: EgressFirewallDestination { cidr_selector: Some("192.0.2.0/24".into()), ..Default::default() },
            ports: None,
        };
        let mut ef = EgressFirewall::new(name, EgressFirewallSpec { egress: vec![rule; rules] });
        ef.metadata.namespace = Some("team-a".into());
        ef
    }

    #[test]
    fn firewall_rule_limit_and_name() {
        assert_eq!(firewall_policy(&firewall("default", MAX_FIREWALL_RULES)).unwrap().rules.len(), 8000);
        assert_eq!(
            firewall_policy(&firewall("default", MAX_FIREWALL_RULES + 1)),
            Err(PolicyError::Invalid(
                "egressFirewall for namespace team-a has too many rules, max allowed number is 8000".into()
            ))
        );
        assert!(
            matches!(firewall_policy(&firewall("other", 1)), Err(PolicyError::Ignored(m)) if m.contains("only the object named \"default\""))
        );
    }

    #[test]
    fn qos_rule_limit() {
        use crate::api::types::{EgressQoSRule, EgressQoSSpec};
        let rule = EgressQoSRule { dscp: 10, dst_cidr: None, pod_selector: None };
        let mut q = EgressQoS::new("default", EgressQoSSpec { egress: vec![rule; MAX_QOS_RULES + 1] });
        q.metadata.namespace = Some("a".into());
        assert_eq!(
            qos_policy(&q),
            Err(PolicyError::Invalid("cannot create EgressQoS with 1001 rules - maximum is 1000".into()))
        );
    }

    #[test]
    fn cloud_ip_names() {
        assert_eq!(cloud_private_ip_from_name("192.168.172.12").unwrap().to_string(), "192.168.172.12");
        assert_eq!(
            cloud_private_ip_from_name("fc00.f853.0ccd.e793.0000.0000.0000.0054").unwrap().to_string(),
            "fc00:f853:ccd:e793::54"
        );
        assert!(cloud_private_ip_from_name("fc00.f853.ccd.e793.0.0.0.54").is_none());
    }
}
