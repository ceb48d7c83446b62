//! Wire types of the four custom resources, exactly as the reference serves them.
//!
//! Field names follow the upstream JSON (`egressIPs`, `egressIP`, `dstCIDR`), which serde's
//! camelCase renaming would get wrong, so those are renamed explicitly. Values are kept
//! as the API stores them (strings stay strings): the API server accepts more than egressd
//! can act on, and [`crate::view::policy`] turns these into validated policy, reporting
//! what it cannot use.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube_derive::CustomResource;
use serde::{Deserialize, Serialize};

/// EgressFirewall spec: the ordered rules of one namespace.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(crates(kube_core = "::kube_core"))]
#[kube(
    group = "k8s.ovn.org",
    version = "v1",
    kind = "EgressFirewall",
    namespaced,
    status = "EgressFirewallStatus",
    schema = "disabled"
)]
pub struct EgressFirewallSpec {
    /// The rules, evaluated in order; the first match decides.
    pub egress: Vec<EgressFirewallRule>,
}

/// One EgressFirewall rule.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct EgressFirewallRule {
    /// `Allow` or `Deny` (the CRD pattern is looser; see the policy layer).
    #[serde(rename = "type")]
    pub rule_type: String,
    /// Where the traffic goes.
    pub to: EgressFirewallDestination,
    /// Ports and protocols; empty means all traffic.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ports: Option<Vec<EgressFirewallPort>>,
}

/// The destination of an EgressFirewall rule: exactly one field is set.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct EgressFirewallDestination {
    /// A CIDR (host bits allowed, as Go's `net.ParseCIDR`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cidr_selector: Option<String>,
    /// A DNS name, optionally `*.` wildcard.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dns_name: Option<String>,
    /// The node IPs of the matching nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<LabelSelector>,
}

/// One port of an EgressFirewall rule.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct EgressFirewallPort {
    /// `TCP`, `UDP` or `SCTP`.
    pub protocol: String,
    /// 1–65535.
    pub port: i64,
}

/// EgressFirewall status: an aggregate plus one message per node.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct EgressFirewallStatus {
    /// `EgressFirewall Rules applied` or `EgressFirewall Rules not correctly applied`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    /// `<node>: EgressFirewall Rules applied`, one per node (list-type set).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub messages: Vec<String>,
}

/// EgressQoS spec: DSCP marking rules of one namespace.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(crates(kube_core = "::kube_core"))]
#[kube(
    group = "k8s.ovn.org",
    version = "v1",
    kind = "EgressQoS",
    plural = "egressqoses",
    namespaced,
    status = "EgressQoSStatus",
    schema = "disabled"
)]
pub struct EgressQoSSpec {
    /// The rules, evaluated in order.
    pub egress: Vec<EgressQoSRule>,
}

/// One EgressQoS rule.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct EgressQoSRule {
    /// 0–63.
    pub dscp: i64,
    /// Destination CIDR; absent means every destination.
    #[serde(rename = "dstCIDR", default, skip_serializing_if = "Option::is_none")]
    pub dst_cidr: Option<String>,
    /// Pods of the namespace; absent means all of them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_selector: Option<LabelSelector>,
}

/// EgressQoS status: aggregate plus `Ready-In-Zone-<node>` conditions.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct EgressQoSStatus {
    /// Aggregate status text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    /// Per-node conditions (list-type map keyed by `type`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// EgressIP spec: which pods leave with which source addresses.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(crates(kube_core = "::kube_core"))]
#[kube(group = "k8s.ovn.org", version = "v1", kind = "EgressIP", status = "EgressIPStatus", schema = "disabled")]
#[serde(rename_all = "camelCase")]
pub struct EgressIPSpec {
    /// The egress addresses (IPv4 and/or IPv6, as strings: the CRD has no format).
    #[serde(rename = "egressIPs")]
    pub egress_ips: Vec<String>,
    /// Namespaces whose pods are selected.
    pub namespace_selector: LabelSelector,
    /// Pods within those namespaces; absent means all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_selector: Option<LabelSelector>,
}

/// EgressIP status: where each address is hosted.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct EgressIPStatus {
    /// One item per placed address.
    pub items: Vec<EgressIPStatusItem>,
}

/// One placed egress IP.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct EgressIPStatusItem {
    /// The address.
    #[serde(rename = "egressIP")]
    pub egress_ip: String,
    /// The node hosting it.
    pub node: String,
}

/// CloudPrivateIPConfig spec: the node a private IP should be assigned to. The object's
/// name is the IP (IPv6 fully expanded with dots instead of colons).
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[kube(crates(kube_core = "::kube_core"))]
#[kube(
    group = "cloud.network.openshift.io",
    version = "v1",
    kind = "CloudPrivateIPConfig",
    status = "CloudPrivateIPConfigStatus",
    schema = "disabled"
)]
pub struct CloudPrivateIPConfigSpec {
    /// The node name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
}

/// CloudPrivateIPConfig status.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct CloudPrivateIPConfigStatus {
    /// The node the IP is assigned to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// `Assigned` condition.
    #[serde(default)]
    pub conditions: Vec<Condition>,
}
