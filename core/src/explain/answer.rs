//! The answer to a [`super::Query`]: its parts (firewall, EgressQoS, EgressIP, the
//! kernel cross-check), serialised for the socket and printed for the terminal.

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

/// The firewall's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// The packet goes on.
    Allowed,
    /// The packet is dropped.
    Dropped,
}

/// The rule that decided, marked or selected.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuleRef {
    /// `namespace/name` of the object.
    pub object: String,
    /// The rule's index in `spec.egress`.
    pub index: usize,
    /// The rule as written.
    pub rule: String,
}

/// An address of a `dnsName` and where it came from (`resolved`, `snooped`, or
/// `kernel` when the agent's answers are not known).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DnsAddress {
    /// The address.
    pub address: IpAddr,
    /// `resolved`, `snooped` or `kernel`.
    pub origin: String,
}

/// A `dnsName` rule looked at on the way to the verdict.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DnsDetail {
    /// The rule's index.
    pub index: usize,
    /// The name as written.
    pub name: String,
    /// Its addresses of the destination's family (`None`: not known here).
    pub addresses: Option<Vec<DnsAddress>>,
}

/// The EgressFirewall part.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FirewallAnswer {
    /// Allowed or dropped.
    pub verdict: Verdict,
    /// Why, in one line.
    pub reason: String,
    /// The deciding rule, when one matched.
    pub rule: Option<RuleRef>,
    /// Whether the deciding rule is a Deny in audit mode (logged and counted, not dropped).
    pub audit: bool,
    /// The `dnsName` rules evaluated up to the decision.
    pub dns: Vec<DnsDetail>,
    /// Rules passed over for another reason than not matching (not enforced, no port given, ...).
    pub notes: Vec<String>,
    /// The namespace's chain, when its EgressFirewall is applied (the pod's address is
    /// then in the `fw-pods` map on its node).
    pub chain: Option<String>,
}

/// The EgressQoS part: the rule that marks, and the DSCP.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QosAnswer {
    /// The DSCP value set.
    pub dscp: u8,
    /// The rule.
    pub rule: RuleRef,
}

/// The EgressIP part.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EgressIpAnswer {
    /// The EgressIP that selects the pod, if any.
    pub egress_ip: Option<String>,
    /// Its IPs of the destination's family placed on nodes, as (address, node).
    pub hosts: Vec<(IpAddr, String)>,
    /// The source address the packet leaves the cluster with, as text (an address, or
    /// "its node's address"), or `None` when it does not leave (dropped, exempt).
    pub source: Option<String>,
    /// Why, in one line.
    pub reason: String,
    /// Dropped because no node hosts its EgressIP (`--egress-ip-fail-closed`).
    #[serde(default)]
    pub dropped: bool,
}

/// The answer to a [`Query`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Explanation {
    /// The pod, `namespace/name`, when one owns the source address.
    pub pod: Option<String>,
    /// The source address.
    pub source: Option<IpAddr>,
    /// The node the pod runs on (where its rules are enforced).
    pub node: Option<String>,
    /// The destination as given.
    pub destination: String,
    /// The EgressFirewall verdict.
    pub firewall: FirewallAnswer,
    /// The DSCP mark, if any rule marks it.
    pub qos: Option<QosAnswer>,
    /// The EgressIP outcome.
    pub egress_ip: EgressIpAnswer,
    /// The node this was explained for (the agent's, or `--node-name`) and its nft
    /// table (for `--kernel`).
    pub here: String,
    /// The nft table enforcing it.
    pub table: String,
    /// The kernel cross-check (`--kernel`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel: Option<KernelCheck>,
}

impl std::fmt::Display for Explanation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let from = match (&self.pod, self.source) {
            (Some(p), Some(ip)) => format!("{p} ({ip})"),
            (Some(p), None) => p.clone(),
            (None, Some(ip)) => ip.to_string(),
            (None, None) => "?".into(),
        };
        let on = self.node.as_deref().map(|n| format!(", node {n}")).unwrap_or_default();
        writeln!(f, "connection  {from}{on} → {}", self.destination)?;
        let fw = &self.firewall;
        let verdict = match fw.verdict {
            Verdict::Allowed => "ALLOWED",
            Verdict::Dropped => "DROPPED",
        };
        writeln!(f, "firewall    {verdict}: {}", fw.reason)?;
        for d in &fw.dns {
            let addrs = match &d.addresses {
                None => "addresses not known here (ask the running agent, or add --kernel)".to_string(),
                Some(a) if a.is_empty() => "no addresses of this family".to_string(),
                Some(a) => a.iter().map(|a| format!("{} ({})", a.address, a.origin)).collect::<Vec<_>>().join(", "),
            };
            writeln!(f, "            rule {} dnsName {}: {addrs}", d.index, d.name)?;
        }
        for n in &fw.notes {
            writeln!(f, "            note: {n}")?;
        }
        match &self.qos {
            Some(q) => {
                writeln!(f, "qos         DSCP {} by {} rule {}: {}", q.dscp, q.rule.object, q.rule.index, q.rule.rule)?
            }
            None => writeln!(f, "qos         not marked (no EgressQoS rule matches)")?,
        }
        let eip = &self.egress_ip;
        writeln!(f, "egress ip   {}", eip.reason)?;
        match (&eip.source, fw.verdict) {
            (_, Verdict::Dropped) => writeln!(f, "source      none: the firewall drops it on the pod's node")?,
            (None, Verdict::Allowed) if eip.dropped => {
                writeln!(f, "source      none: dropped on the pod's node (--egress-ip-fail-closed)")?
            }
            (Some(s), Verdict::Allowed) => writeln!(f, "source      leaves the cluster with {s}")?,
            (None, Verdict::Allowed) => {}
        }
        if let Some(k) = &self.kernel {
            write!(f, "{k}")?;
        }
        Ok(())
    }
}

/// What the kernel shows for one explanation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelCheck {
    /// The node this was read on.
    pub node: String,
    /// Whether the pod's address is in the `fw-pods` map, which leads (by its
    /// namespace's number, `fw-namespaces`) to its namespace's chain (`None`: not looked
    /// up).
    pub pod_in_map: Option<bool>,
    /// The deciding rule's counter: (packets, bytes).
    pub rule_counter: Option<(u64, u64)>,
    /// The rules sharing that counter (a merged run of same-action rules), first and last.
    #[serde(default)]
    pub shared: Option<(usize, usize)>,
    /// What disagrees with the explanation, or could not be read.
    pub problems: Vec<String>,
}

impl std::fmt::Display for KernelCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.pod_in_map {
            Some(true) => writeln!(f, "kernel      node {}: the pod's address is in the fw-pods map", self.node)?,
            Some(false) => writeln!(
                f,
                "kernel      node {}: the pod's address does NOT reach its chain (fw-pods, fw-namespaces)",
                self.node
            )?,
            None => writeln!(f, "kernel      node {}", self.node)?,
        }
        if let Some((packets, bytes)) = self.rule_counter {
            writeln!(
                f,
                "            the deciding rule's counter: {packets} packets, {bytes} bytes (retry the connection: it moves)"
            )?;
        }
        if let Some((first, last)) = self.shared {
            writeln!(f, "            (rules {first}..{last} have the same action and share one nft rule and counter)")?;
        }
        for p in &self.problems {
            writeln!(f, "            problem: {p}")?;
        }
        Ok(())
    }
}
