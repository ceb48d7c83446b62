//! The AWS provider (`--egress-ip-mode cloud --cloud-provider aws`): the placement leader
//! is the CloudPrivateIPConfig controller and assigns each config's IP to the primary
//! network interface of its node's instance in EC2.
//!
//! * [`ec2`]: the EC2 calls; [`credentials`]: the credential chain.
//! * This module (pure): what EC2 says of each node ([`Inventory`]), the capacity
//!   annotation ([`ipconfig_annotation`]) and the decision for one config ([`decide`]).
//! * [`controller`]: the task that describes, decides, calls and writes.
//!
//! The node side is unchanged from `cloud` mode: once a config reports `Assigned=True`
//! on its node, the leader publishes the EgressIP's item and that node hosts the IP.

pub mod controller;
pub mod credentials;
pub mod ec2;
pub(crate) mod http;

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use ipnet::IpNet;
use serde_json::json;

use crate::placement::cloud::ConfigStatus;
use crate::view::policy::CloudPrivateIp;

/// The Node annotation the cloud controller publishes (the reference's name and shape):
/// `[{"interface": "eni-…", "ifaddr": {"ipv4": CIDR, "ipv6": CIDR}, "capacity": {"ipv4": N, "ipv6": N}}]`.
pub use crate::view::CLOUD_IPCONFIG_ANNOTATION as IPCONFIG_ANNOTATION;

/// `aws:///<zone>/<instance-id>` → (zone, instance id). The zone may be missing
/// (`aws:///i-…`).
pub fn parse_provider_id(id: &str) -> Option<(Option<String>, String)> {
    let rest = id.strip_prefix("aws://")?.trim_start_matches('/');
    let mut parts: Vec<&str> = rest.split('/').filter(|p| !p.is_empty()).collect();
    let instance = parts.pop().filter(|i| i.starts_with("i-"))?.to_string();
    Some((parts.first().map(|z| z.to_string()), instance))
}

/// The region of a zone: `us-east-1a` → `us-east-1`, `us-west-2-lax-1a` → `us-west-2`,
/// `us-gov-west-1b` → `us-gov-west-1`.
pub fn region_of_zone(zone: &str) -> Option<String> {
    let parts: Vec<&str> = zone.split('-').collect();
    let i = parts.iter().position(|p| p.starts_with(|c: char| c.is_ascii_digit()))?;
    let digits: String = parts[i].chars().take_while(char::is_ascii_digit).collect();
    (i > 0).then(|| format!("{}-{digits}", parts[..i].join("-")))
}

/// What EC2 says of one node's instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeCloud {
    /// `i-…`.
    pub instance: String,
    /// Its primary interface, `eni-…`.
    pub interface: String,
    /// The interface's subnet's CIDRs (IPv4 first): an egress IP must lie in one.
    pub subnets: Vec<IpNet>,
    /// Every address on the interface now.
    pub addresses: BTreeSet<IpAddr>,
    /// Addresses per interface of the instance type: (IPv4, IPv6).
    pub limits: (u32, u32),
}

/// Free slots for egress IPs on a node, per family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capacity {
    /// IPv4 slots.
    pub ipv4: u32,
    /// IPv6 slots.
    pub ipv6: u32,
}

impl NodeCloud {
    /// The type's limit minus the addresses in use that are not CloudPrivateIPConfigs'
    /// (the primary address, and anything others added): what egress IPs may use,
    /// those placed already included.
    pub fn capacity(&self, config_ips: &BTreeSet<IpAddr>) -> Capacity {
        let others = |v6: bool| {
            let n = self.addresses.iter().filter(|a| a.is_ipv6() == v6 && !config_ips.contains(a)).count();
            u32::try_from(n).unwrap_or(u32::MAX)
        };
        Capacity { ipv4: self.limits.0.saturating_sub(others(false)), ipv6: self.limits.1.saturating_sub(others(true)) }
    }
}

/// EC2's view of the cluster's nodes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Inventory {
    /// By node name.
    pub nodes: BTreeMap<String, NodeCloud>,
    /// Nodes without one, and why (no AWS providerID, instance not found, no interface).
    pub missing: BTreeMap<String, String>,
}

/// The annotation's value for one node.
pub fn ipconfig_annotation(node: &NodeCloud, config_ips: &BTreeSet<IpAddr>) -> String {
    let cap = node.capacity(config_ips);
    let mut ifaddr = serde_json::Map::new();
    if let Some(n) = node.subnets.iter().find(|n| matches!(n, IpNet::V4(_))) {
        ifaddr.insert("ipv4".into(), json!(n.to_string()));
    }
    if let Some(n) = node.subnets.iter().find(|n| matches!(n, IpNet::V6(_))) {
        ifaddr.insert("ipv6".into(), json!(n.to_string()));
    }
    json!([{ "interface": node.interface, "ifaddr": ifaddr, "capacity": { "ipv4": cap.ipv4, "ipv6": cap.ipv6 } }])
        .to_string()
}

/// One EC2 call the controller makes for a config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Call {
    /// Assign the IP to the node's interface; IPv4 `reassign`: take it from the node
    /// that has it, in the same call.
    Assign {
        /// The node.
        node: String,
        /// Its interface.
        interface: String,
        /// The address.
        ip: IpAddr,
        /// Take it from another interface.
        reassign: bool,
    },
    /// Release the IP from the node's interface.
    Unassign {
        /// The node.
        node: String,
        /// Its interface.
        interface: String,
        /// The address.
        ip: IpAddr,
    },
}

/// What the controller does for one config now: the finalizer (`Some(true)` add,
/// `Some(false)` remove), at most one EC2 call, the status to write.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Decision {
    /// Finalizer change.
    pub finalizer: Option<bool>,
    /// EC2 call.
    pub call: Option<Call>,
    /// Status to write (`None`: keep).
    pub status: Option<ConfigStatus>,
}

fn error(message: String) -> ConfigStatus {
    ConfigStatus { node: None, status: "False", reason: crate::placement::cloud::ERROR, message }
}

/// The decision for config `c`, from EC2's view (`inv`) and whether a node exists.
/// One call at a time: the next decision sees its effect in EC2 (so `Assigned=True` is
/// written only once EC2 reports the address on the interface).
pub(crate) fn decide(c: &CloudPrivateIp, inv: &Inventory, node_exists: &dyn Fn(&str) -> bool) -> Decision {
    let holders: Vec<(&String, &NodeCloud)> = inv.nodes.iter().filter(|(_, n)| n.addresses.contains(&c.ip)).collect();
    let unassign = |(node, n): (&String, &NodeCloud)| Call::Unassign {
        node: node.clone(),
        interface: n.interface.clone(),
        ip: c.ip,
    };
    if c.deleting {
        return match holders.first() {
            Some(h) => Decision { call: Some(unassign(*h)), ..Decision::default() },
            None => Decision { finalizer: c.finalizer.then_some(false), ..Decision::default() },
        };
    }
    let Some(target) = c.node.as_deref() else { return Decision::default() };
    let keep = |s: ConfigStatus| (!s.matches(c)).then_some(s);
    if !node_exists(target) {
        return Decision {
            status: keep(error(format!("Target node {target:?} does not exist"))),
            ..Decision::default()
        };
    }
    let finalizer = (!c.finalizer).then_some(true);
    let Some(nc) = inv.nodes.get(target) else {
        let why = inv.missing.get(target).cloned().unwrap_or_else(|| "no AWS instance known".into());
        return Decision { finalizer, status: keep(error(format!("node {target:?}: {why}"))), call: None };
    };
    if !nc.subnets.iter().any(|n| n.contains(&c.ip)) {
        let nets: Vec<String> = nc.subnets.iter().map(ToString::to_string).collect();
        let message = format!(
            "IP address {} is not in the subnet of node {target:?}'s interface {} ([{}])",
            c.ip,
            nc.interface,
            nets.join(" ")
        );
        return Decision { finalizer, status: keep(error(message)), call: None };
    }
    let elsewhere = holders.iter().find(|(n, _)| n.as_str() != target).copied();
    let call = match (nc.addresses.contains(&c.ip), elsewhere) {
        // EC2 left it on the interface it came from (a reassignment that did not
        // release it): release it there.
        (true, Some(h)) => Some(unassign(h)),
        (true, None) => {
            let s = ConfigStatus {
                node: Some(target.to_string()),
                status: "True",
                reason: crate::placement::cloud::SUCCESS,
                message: "IP address successfully added".into(),
            };
            return Decision { finalizer, status: keep(s), call: None };
        }
        // IPv6 cannot be reassigned: released first.
        (false, Some(h)) if c.ip.is_ipv6() => Some(unassign(h)),
        (false, h) => Some(Call::Assign {
            node: target.to_string(),
            interface: nc.interface.clone(),
            ip: c.ip,
            reassign: h.is_some(),
        }),
    };
    Decision { finalizer, call, status: None }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn node(eni: &str, addrs: &[&str], limits: (u32, u32)) -> NodeCloud {
        NodeCloud {
            instance: format!("i-{eni}"),
            interface: eni.into(),
            subnets: vec!["198.19.0.0/24".parse().unwrap(), "2001:db8:0:1::/64".parse().unwrap()],
            addresses: addrs.iter().map(|a| ip(a)).collect(),
            limits,
        }
    }

    fn inv(nodes: &[(&str, NodeCloud)]) -> Inventory {
        Inventory { nodes: nodes.iter().map(|(n, c)| (n.to_string(), c.clone())).collect(), missing: BTreeMap::new() }
    }

    fn cfg(ip_: &str, node: Option<&str>) -> CloudPrivateIp {
        CloudPrivateIp {
            ip: ip(ip_),
            node: node.map(String::from),
            status_node: None,
            assigned: None,
            deleting: false,
            finalizer: true,
            owner: Some("e1".into()),
        }
    }

    #[test]
    fn provider_ids_and_zones_name_the_instance_and_the_region() {
        assert_eq!(parse_provider_id("aws:///us-east-1a/i-0abc"), Some((Some("us-east-1a".into()), "i-0abc".into())));
        assert_eq!(parse_provider_id("aws:///i-0abc"), Some((None, "i-0abc".into())));
        assert_eq!(parse_provider_id("gce://p/z/n"), None);
        assert_eq!(parse_provider_id("aws:///us-east-1a/"), None);
        assert_eq!(region_of_zone("us-east-1a").as_deref(), Some("us-east-1"));
        assert_eq!(region_of_zone("us-west-2-lax-1a").as_deref(), Some("us-west-2"));
        assert_eq!(region_of_zone("us-gov-west-1b").as_deref(), Some("us-gov-west-1"));
        assert_eq!(region_of_zone("nowhere"), None);
    }

    #[test]
    fn capacity_is_the_limit_minus_what_others_use_and_egress_ips_do_not_count() {
        // t2.nano: 2 per interface; the primary uses one.
        let n = node("eni-1", &["198.19.0.1", "198.19.0.100", "198.19.0.7", "2001:db8:0:1::9"], (4, 3));
        let configs = BTreeSet::from([ip("198.19.0.100")]);
        // IPv4: 4 − (primary + .7); .100 is an egress IP's. IPv6: 3 − 1.
        assert_eq!(n.capacity(&configs), Capacity { ipv4: 2, ipv6: 2 });
        // Never below zero.
        let full = node("eni-2", &["198.19.0.1", "198.19.0.2", "198.19.0.3"], (2, 0));
        assert_eq!(full.capacity(&BTreeSet::new()), Capacity { ipv4: 0, ipv6: 0 });
        let text = ipconfig_annotation(&n, &configs);
        assert_eq!(
            text,
            r#"[{"capacity":{"ipv4":2,"ipv6":2},"ifaddr":{"ipv4":"198.19.0.0/24","ipv6":"2001:db8:0:1::/64"},"interface":"eni-1"}]"#
        );
    }

    #[test]
    fn a_config_is_assigned_then_reported_once_ec2_shows_it() {
        let exists = |_: &str| true;
        let empty = inv(&[("b", node("eni-b", &["198.19.0.2"], (10, 10)))]);
        let mut c = cfg("198.19.0.100", Some("b"));
        c.finalizer = false;
        let d = decide(&c, &empty, &exists);
        assert_eq!(d.finalizer, Some(true));
        assert_eq!(
            d.call,
            Some(Call::Assign { node: "b".into(), interface: "eni-b".into(), ip: ip("198.19.0.100"), reassign: false })
        );
        assert_eq!(d.status, None, "nothing reported before EC2 shows it");
        let done = inv(&[("b", node("eni-b", &["198.19.0.2", "198.19.0.100"], (10, 10)))]);
        let d = decide(&cfg("198.19.0.100", Some("b")), &done, &exists);
        let s = d.status.unwrap();
        assert_eq!((s.node.as_deref(), s.status, s.reason), (Some("b"), "True", "CloudResponseSuccess"));
        assert_eq!(d.call, None);
    }

    #[test]
    fn a_move_is_one_reassignment_for_ipv4_and_release_then_assign_for_ipv6() {
        let exists = |_: &str| true;
        let two = |b: &[&str], c: &[&str]| inv(&[("b", node("eni-b", b, (10, 10))), ("c", node("eni-c", c, (10, 10)))]);
        let d = decide(&cfg("198.19.0.100", Some("c")), &two(&["198.19.0.100"], &[]), &exists);
        assert_eq!(
            d.call,
            Some(Call::Assign { node: "c".into(), interface: "eni-c".into(), ip: ip("198.19.0.100"), reassign: true })
        );
        // An EC2 that kept it on the old interface too: released there.
        let d = decide(&cfg("198.19.0.100", Some("c")), &two(&["198.19.0.100"], &["198.19.0.100"]), &exists);
        assert_eq!(
            d.call,
            Some(Call::Unassign { node: "b".into(), interface: "eni-b".into(), ip: ip("198.19.0.100") })
        );
        let v6 = "2001:db8:0:1::100";
        let d = decide(&cfg(v6, Some("c")), &two(&[v6], &[]), &exists);
        assert_eq!(d.call, Some(Call::Unassign { node: "b".into(), interface: "eni-b".into(), ip: ip(v6) }));
        let d = decide(&cfg(v6, Some("c")), &two(&[], &[]), &exists);
        assert!(matches!(d.call, Some(Call::Assign { reassign: false, .. })));
    }

    #[test]
    fn deletion_releases_then_lets_go_and_bad_requests_are_errors_without_calls() {
        let exists = |n: &str| n != "gone";
        let held = inv(&[("b", node("eni-b", &["198.19.0.100"], (10, 10)))]);
        let mut c = cfg("198.19.0.100", Some("b"));
        c.deleting = true;
        assert_eq!(
            decide(&c, &held, &exists).call,
            Some(Call::Unassign { node: "b".into(), interface: "eni-b".into(), ip: ip("198.19.0.100") })
        );
        let d = decide(&c, &inv(&[("b", node("eni-b", &[], (10, 10)))]), &exists);
        assert_eq!((d.finalizer, d.call), (Some(false), None));
        // Outside the subnet: an error naming the interface and its subnets, no call.
        let d = decide(&cfg("203.0.113.5", Some("b")), &held, &exists);
        assert_eq!(d.call, None);
        assert_eq!(
            d.status.unwrap().message,
            "IP address 203.0.113.5 is not in the subnet of node \"b\"'s interface eni-b ([198.19.0.0/24 2001:db8:0:1::/64])"
        );
        let d = decide(&cfg("198.19.0.101", Some("gone")), &held, &exists);
        assert_eq!(d.status.unwrap().message, "Target node \"gone\" does not exist");
        let mut missing = held.clone();
        missing.missing.insert("x".into(), "no AWS spec.providerID".into());
        let d = decide(&cfg("198.19.0.101", Some("x")), &missing, &exists);
        assert_eq!(d.status.unwrap().message, "node \"x\": no AWS spec.providerID");
        // An error already written is not written again.
        let mut written = cfg("198.19.0.101", Some("gone"));
        written.assigned =
            Some(("False".into(), "CloudResponseError".into(), "Target node \"gone\" does not exist".into()));
        assert_eq!(decide(&written, &held, &exists).status, None);
    }
}
