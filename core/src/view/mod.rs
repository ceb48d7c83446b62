//! The cluster view: every object this node needs, already validated into egressd's own
//! types, plus the pod-identity rule every feature shares.
//!
//! Sources ([`crate::source`]) feed it with [`ClusterView::upsert`],
//! [`ClusterView::remove`] and [`ClusterView::reject`]; the compile step reads it. A
//! policy object that fails validation keeps its last good version here (so nothing
//! already applied is lost) together with the error, which becomes its status.

pub mod last_good;
pub mod observed;
pub mod pods;
pub mod policy;
pub mod selector;
pub mod tracked;

pub use tracked::Tracked;

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::str::FromStr;

use k8s_openapi::api::core::v1::{Node, Pod};

use crate::api::{Kind, Object, ObjectKey};
use policy::{CloudPrivateIp, EgressIpPolicy, FirewallPolicy, PolicyError, QosPolicy};

/// A policy object as the view holds it: the last version that validated, and the
/// current problem, if any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry<T> {
    /// The object's identity.
    pub key: ObjectKey,
    /// The last version that validated (what the dataplane uses). Shared: an unchanged
    /// policy stays the same allocation, so comparing it with a cached copy costs a
    /// pointer comparison.
    pub policy: Option<std::sync::Arc<T>>,
    /// Why the current version is not used, naming the field.
    pub error: Option<String>,
}

/// A namespace's labels.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct NamespaceInfo {
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// ACL logging of the namespace's EgressFirewall verdicts (annotation
    /// [`ACL_LOGGING_ANNOTATION`]): `Err` names what is wrong with the annotation.
    #[serde(default)]
    pub acl_logging: Option<Result<AclLogging, String>>,
}

/// The namespace annotation of the reference's ACL logging:
/// `{"deny": "alert", "allow": "notice"}`.
pub const ACL_LOGGING_ANNOTATION: &str = "k8s.ovn.org/acl-logging";

/// The severities the reference accepts (OVN's log levels).
pub const ACL_SEVERITIES: [&str; 5] = ["alert", "warning", "notice", "info", "debug"];

/// What a namespace's ACL logging asks for: the severity of each verdict logged.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct AclLogging {
    /// Severity for denied connections (`None`: not logged).
    pub deny: Option<String>,
    /// Severity for allowed connections (`None`: not logged).
    pub allow: Option<String>,
}

impl AclLogging {
    /// Read the annotation's value as the reference does: JSON with optional `deny` and
    /// `allow` severities; an unknown severity turns that verdict's logging off (with
    /// the reason), invalid JSON turns all of it off.
    pub fn parse(value: &str) -> Result<Self, String> {
        #[derive(serde::Deserialize)]
        struct Raw {
            deny: Option<String>,
            allow: Option<String>,
        }
        let raw: Raw = serde_json::from_str(value).map_err(|e| format!("invalid JSON ({e}): no ACL logging"))?;
        let check = |v: Option<String>, what: &str| -> Result<Option<String>, String> {
            match v {
                Some(s) if !ACL_SEVERITIES.contains(&s.as_str()) => {
                    Err(format!("{what}: {s:?} is not a severity ({}): no ACL logging", ACL_SEVERITIES.join(", ")))
                }
                other => Ok(other),
            }
        };
        Ok(Self { deny: check(raw.deny, "deny")?, allow: check(raw.allow, "allow")? })
    }
}

/// The fields of a pod egressd uses (and nothing else, to keep memory small).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PodInfo {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// `spec.nodeName`.
    pub node: Option<String>,
    /// `spec.hostNetwork`.
    pub host_network: bool,
    /// `status.phase`.
    pub phase: Option<String>,
    /// `status.podIPs` (or `status.podIP`), parsed.
    pub ips: Vec<IpAddr>,
    /// Creation time, seconds since the epoch.
    pub created: Option<i64>,
}

impl PodInfo {
    /// The pod-identity rule: a pod counts when it is scheduled, not hostNetwork, not
    /// finished (Succeeded/Failed) and has IPs.
    pub fn counts(&self) -> bool {
        self.node.as_deref().is_some_and(|n| !n.is_empty())
            && !self.host_network
            && !matches!(self.phase.as_deref(), Some("Succeeded" | "Failed"))
            && !self.ips.is_empty()
    }

    /// Extract the fields egressd uses from a Pod.
    pub(crate) fn from_pod(pod: &Pod) -> Self {
        let spec = pod.spec.as_ref();
        let status = pod.status.as_ref();
        let mut ips: Vec<IpAddr> = status
            .and_then(|s| s.pod_ips.as_ref())
            .map(|v| v.iter().filter_map(|p| IpAddr::from_str(&p.ip).ok()).collect())
            .unwrap_or_default();
        if ips.is_empty()
            && let Some(ip) = status.and_then(|s| s.pod_ip.as_deref()).and_then(|s| IpAddr::from_str(s).ok())
        {
            ips.push(ip);
        }
        ips.dedup();
        Self {
            namespace: pod.metadata.namespace.clone().unwrap_or_default(),
            name: pod.metadata.name.clone().unwrap_or_default(),
            labels: pod.metadata.labels.clone().unwrap_or_default(),
            node: spec.and_then(|s| s.node_name.clone()),
            host_network: spec.and_then(|s| s.host_network).unwrap_or(false),
            phase: status.and_then(|s| s.phase.clone()),
            ips,
            created: pod.metadata.creation_timestamp.as_ref().map(|t| t.0.as_second()),
        }
    }
}

/// The fields of a node egressd uses.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct NodeInfo {
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// InternalIP and ExternalIP addresses.
    pub addresses: Vec<IpAddr>,
    /// Whether the Ready condition is True.
    pub ready: bool,
    /// The subnets of the node's up links, as its egressd publishes them in the
    /// [`EGRESS_SUBNETS_ANNOTATION`] (where the placement leader may put egress IPs).
    #[serde(default)]
    pub egress_subnets: Vec<ipnet::IpNet>,
    /// `spec.providerID` names a cloud whose fabric drops packets with a source that is
    /// not the instance's (AWS, GCP, Azure): steering to or from it is encapsulated.
    #[serde(default)]
    pub cloud: bool,
    /// `spec.providerID` (the AWS provider finds the node's instance by it).
    #[serde(default)]
    pub provider_id: Option<String>,
    /// The cloud controller's [`CLOUD_IPCONFIG_ANNOTATION`], read: where and how many
    /// egress IPs the cloud lets this node hold.
    #[serde(default)]
    pub cloud_ipconfig: Option<CloudIpConfig>,
    /// The same annotation's text (the controller writes it only when it differs).
    #[serde(default)]
    pub cloud_ipconfig_raw: Option<String>,
}

/// The Node annotation a cloud network controller publishes (OpenShift's
/// cloud-network-config-controller, egressd's AWS provider): the node's interface, its
/// subnets and its free slots for egress IPs, e.g.
/// `[{"interface":"eni-1","ifaddr":{"ipv4":"198.19.0.0/24"},"capacity":{"ipv4":14,"ipv6":15}}]`
/// (`"capacity":{"ip":N}` on clouds that count both families together).
pub const CLOUD_IPCONFIG_ANNOTATION: &str = "cloud.network.openshift.io/egress-ipconfig";

/// [`CLOUD_IPCONFIG_ANNOTATION`], read.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct CloudIpConfig {
    /// `ifaddr`: the subnets an egress IP of this node must lie in.
    pub subnets: Vec<ipnet::IpNet>,
    /// `capacity.ipv4`.
    pub ipv4: Option<u32>,
    /// `capacity.ipv6`.
    pub ipv6: Option<u32>,
    /// `capacity.ip` (both families).
    pub any: Option<u32>,
}

impl CloudIpConfig {
    /// Read the annotation (its first interface); `None` when unreadable.
    pub fn parse(text: &str) -> Option<Self> {
        let v: serde_json::Value = serde_json::from_str(text).ok()?;
        let first = v.as_array()?.first()?;
        let subnets = ["ipv4", "ipv6"]
            .iter()
            .filter_map(|f| first["ifaddr"][f].as_str()?.parse::<ipnet::IpNet>().ok().map(|n| n.trunc()))
            .collect();
        let cap = |f: &str| first["capacity"][f].as_u64().map(|n| u32::try_from(n).unwrap_or(u32::MAX));
        Some(Self { subnets, ipv4: cap("ipv4"), ipv6: cap("ipv6"), any: cap("ip") })
    }
}

/// `spec.providerID` prefixes of clouds whose networks check source addresses.
const FILTERING_CLOUDS: [&str; 3] = ["aws://", "gce://", "azure://"];

/// The Node annotation in which each agent publishes its links' subnets: a JSON list of
/// CIDRs, e.g. `["198.19.0.0/24","2001:db8:0:1::/64"]`.
pub const EGRESS_SUBNETS_ANNOTATION: &str = "egressd.io/egress-subnets";

/// The Node label that makes a node eligible to host egress IPs (any value), as the
/// reference's `k8s.ovn.org/egress-assignable`.
pub const EGRESS_ASSIGNABLE_LABEL: &str = "k8s.ovn.org/egress-assignable";

impl NodeInfo {
    /// Extract the fields egressd uses from a Node.
    pub(crate) fn from_node(node: &Node) -> Self {
        let status = node.status.as_ref();
        let mut addresses: Vec<IpAddr> = status
            .and_then(|s| s.addresses.as_ref())
            .map(|v| {
                v.iter()
                    .filter(|a| a.type_ == "InternalIP" || a.type_ == "ExternalIP")
                    .filter_map(|a| IpAddr::from_str(&a.address).ok())
                    .collect()
            })
            .unwrap_or_default();
        addresses.sort();
        addresses.dedup();
        let ready = status
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        // A malformed annotation counts as no subnets (the node hosts nothing new); it is
        // written by egressd only.
        let egress_subnets = node
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(EGRESS_SUBNETS_ANNOTATION))
            .and_then(|v| serde_json::from_str::<Vec<ipnet::IpNet>>(v).ok())
            .map(|v| v.into_iter().map(|n| n.trunc()).collect())
            .unwrap_or_default();
        let provider_id = node.spec.as_ref().and_then(|s| s.provider_id.clone()).filter(|p| !p.is_empty());
        let cloud = provider_id.as_deref().is_some_and(|p| FILTERING_CLOUDS.iter().any(|c| p.starts_with(c)));
        let cloud_ipconfig_raw =
            node.metadata.annotations.as_ref().and_then(|a| a.get(CLOUD_IPCONFIG_ANNOTATION)).cloned();
        let cloud_ipconfig = cloud_ipconfig_raw.as_deref().and_then(CloudIpConfig::parse);
        Self {
            labels: node.metadata.labels.clone().unwrap_or_default(),
            addresses,
            ready,
            egress_subnets,
            cloud,
            provider_id,
            cloud_ipconfig,
            cloud_ipconfig_raw,
        }
    }
}

/// The owner of every pod IP ([`ClusterView::pod_ip_owners`]).
pub type Owners = BTreeMap<IpAddr, std::sync::Arc<PodInfo>>;

/// Two or more live pods claiming one IP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct IpClash {
    /// The address.
    pub ip: IpAddr,
    /// The pod that keeps it (`namespace/name`).
    pub winner: String,
    /// The others (`namespace/name`).
    pub losers: Vec<String>,
}

/// Everything the compile step needs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterView {
    /// Namespaces by name.
    pub namespaces: Tracked<NamespaceInfo>,
    /// Pods by (namespace, name), and the owner of each pod IP (changed through the
    /// view, which keeps that index).
    pub pods: pods::Pods,
    /// Nodes by name.
    pub nodes: Tracked<NodeInfo>,
    /// EgressFirewalls by namespace (only the one named `default`).
    pub firewalls: Tracked<Entry<FirewallPolicy>>,
    /// EgressQoS by namespace (only the one named `default`).
    pub qos: Tracked<Entry<QosPolicy>>,
    /// EgressIPs by name.
    pub egress_ips: Tracked<Entry<EgressIpPolicy>>,
    /// CloudPrivateIPConfigs by name.
    pub cloud_ips: Tracked<Entry<CloudPrivateIp>>,
    /// Objects that are valid but not acted on, with the reason.
    pub ignored: BTreeMap<ObjectKey, String>,
    /// Namespaces, Pods and Nodes whose current version was rejected (a manifest with
    /// a schema error): the previous version, if any, stays in use.
    pub rejected_core: std::collections::BTreeSet<ObjectKey>,
}

/// Store a conversion result; returns whether the entry changed.
fn put<T: PartialEq>(map: &mut Tracked<Entry<T>>, id: String, key: ObjectKey, result: Result<T, String>) -> bool {
    let entry = map.get_or_insert_with(id, || Entry { key: key.clone(), policy: None, error: None });
    let mut changed = entry.key != key;
    entry.key = key;
    match result {
        Ok(p) => {
            // An equal policy keeps its allocation (see `Entry::policy`).
            if entry.policy.as_deref() != Some(&p) {
                entry.policy = Some(std::sync::Arc::new(p));
                changed = true;
            }
            changed |= entry.error.is_some();
            entry.error = None;
        }
        Err(e) => {
            changed |= entry.error.as_ref() != Some(&e);
            entry.error = Some(e);
        }
    }
    changed
}

/// Insert `value`; returns whether it differs from what was there.
fn replace<V: PartialEq>(map: &mut Tracked<V>, key: String, value: V) -> bool {
    match map.get(&key) {
        Some(old) if *old == value => false,
        _ => {
            map.insert(key, value);
            true
        }
    }
}

/// One object in the view's own form: what the view keeps of it, converted (and
/// validated) without the view. Much smaller than the object (a parsed Pod is over
/// 2 KB, its [`PodInfo`] a few hundred bytes), so a source can hold many at once.
#[derive(Debug, Clone)]
pub struct Update {
    key: ObjectKey,
    item: Item,
}

#[derive(Debug, Clone)]
enum Item {
    Firewall(Result<FirewallPolicy, PolicyError>),
    Qos(Result<QosPolicy, PolicyError>),
    EgressIp(Result<EgressIpPolicy, PolicyError>),
    CloudIp(Result<CloudPrivateIp, PolicyError>),
    Namespace(NamespaceInfo),
    Pod(PodInfo),
    Node(NodeInfo),
}

impl Update {
    /// `object` in the view's form.
    pub fn of(object: &Object) -> Self {
        let item = match object {
            Object::EgressFirewall(o) => Item::Firewall(policy::firewall_policy(o)),
            Object::EgressQoS(o) => Item::Qos(policy::qos_policy(o)),
            Object::EgressIP(o) => Item::EgressIp(policy::egress_ip_policy(o)),
            Object::CloudPrivateIPConfig(o) => Item::CloudIp(policy::cloud_private_ip(o)),
            Object::Namespace(ns) => {
                let acl_logging = ns
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(ACL_LOGGING_ANNOTATION))
                    .map(|v| AclLogging::parse(v));
                Item::Namespace(NamespaceInfo { labels: ns.metadata.labels.clone().unwrap_or_default(), acl_logging })
            }
            Object::Pod(p) => Item::Pod(PodInfo::from_pod(p)),
            Object::Node(n) => Item::Node(NodeInfo::from_node(n)),
        };
        Self { key: object.key(), item }
    }

    /// The object's key.
    pub fn key(&self) -> &ObjectKey {
        &self.key
    }
}

impl ClusterView {
    /// Whether `node` needs the pods of other nodes: it hosts an egress IP (pods of
    /// other nodes steered to it over a shared link arrive with their own addresses, and
    /// its SNAT map names them), or it may be given one — labelled
    /// [`EGRESS_ASSIGNABLE_LABEL`] while an EgressIP exists —, so that a failover to it
    /// does not wait for a list of the cluster's pods. Every other node's compile reads
    /// only its own pods (firewall, QoS, DNS snooping and steering act on local pods
    /// alone; tests/incremental.rs checks that it gives what the whole cluster gives).
    pub fn needs_cluster_pods(&self, node: &str) -> bool {
        let policies = || self.egress_ips.values().filter_map(|e| e.policy.as_deref());
        let hosts = policies().any(|p| p.placement.iter().any(|(_, n)| n == node));
        let assignable = self.nodes.get(node).is_some_and(|n| n.labels.contains_key(EGRESS_ASSIGNABLE_LABEL));
        hosts || (assignable && policies().next().is_some())
    }

    /// Add or replace an object; returns whether the view changed. A policy object that
    /// fails validation keeps its last good version and records the error.
    pub fn upsert(&mut self, object: &Object) -> bool {
        self.apply(Update::of(object))
    }

    /// Add or replace an object already converted to the view's form ([`Update::of`]);
    /// returns whether the view changed.
    pub fn apply(&mut self, update: Update) -> bool {
        let Update { key, item } = update;
        let was_ignored = self.ignored.remove(&key);
        macro_rules! policy {
            ($map:ident, $id:expr, $conv:expr) => {
                match $conv {
                    Err(PolicyError::Ignored(reason)) => {
                        self.ignored.insert(key.clone(), reason.clone()) != Some(reason)
                    }
                    Ok(p) => put(&mut self.$map, $id, key.clone(), Ok(p)) || was_ignored.is_some(),
                    Err(PolicyError::Invalid(e)) => {
                        put(&mut self.$map, $id, key.clone(), Err(e)) || was_ignored.is_some()
                    }
                }
            };
        }
        match item {
            Item::Firewall(p) => policy!(firewalls, key.namespace.to_string(), p),
            Item::Qos(p) => policy!(qos, key.namespace.to_string(), p),
            Item::EgressIp(p) => policy!(egress_ips, key.name.to_string(), p),
            Item::CloudIp(p) => policy!(cloud_ips, key.name.to_string(), p),
            item @ (Item::Namespace(_) | Item::Pod(_) | Item::Node(_)) if self.rejected_core.remove(&key) => {
                self.apply(Update { key, item });
                true
            }
            Item::Namespace(info) => replace(&mut self.namespaces, key.name.into(), info),
            Item::Pod(info) => self.pods.set((key.namespace.into(), key.name.into()), Some(info)),
            Item::Node(info) => replace(&mut self.nodes, key.name.into(), info),
        }
    }

    /// Record that the current version of `key` was rejected before it could be decoded
    /// (a schema error in a manifest). The last good version stays in use. Returns
    /// whether the view changed.
    pub fn reject(&mut self, key: &ObjectKey, error: String) -> bool {
        let id = match key.kind {
            Kind::EgressFirewall | Kind::EgressQoS => key.namespace.to_string(),
            _ => key.name.to_string(),
        };
        match key.kind {
            Kind::EgressFirewall | Kind::EgressQoS if key.name != policy::SINGLETON_NAME => {
                self.ignored.insert(key.clone(), error.clone()) != Some(error)
            }
            Kind::EgressFirewall => put(&mut self.firewalls, id, key.clone(), Err(error)),
            Kind::EgressQoS => put(&mut self.qos, id, key.clone(), Err(error)),
            Kind::EgressIP => put(&mut self.egress_ips, id, key.clone(), Err(error)),
            Kind::CloudPrivateIPConfig => put(&mut self.cloud_ips, id, key.clone(), Err(error)),
            // Core objects have no status; the source logs the error and the previous
            // version stays in use (saved across restarts like a policy's last good one).
            Kind::Namespace | Kind::Pod | Kind::Node => self.rejected_core.insert(key.clone()),
        }
    }

    /// Remove an object.
    pub fn remove(&mut self, key: &ObjectKey) {
        self.ignored.remove(key);
        self.rejected_core.remove(key);
        let same = |e: &ObjectKey| e == key;
        match key.kind {
            Kind::EgressFirewall => {
                if self.firewalls.get(key.namespace.as_str()).is_some_and(|e| same(&e.key)) {
                    self.firewalls.remove(key.namespace.as_str());
                }
            }
            Kind::EgressQoS => {
                if self.qos.get(key.namespace.as_str()).is_some_and(|e| same(&e.key)) {
                    self.qos.remove(key.namespace.as_str());
                }
            }
            Kind::EgressIP => {
                self.egress_ips.remove(key.name.as_str());
            }
            Kind::CloudPrivateIPConfig => {
                self.cloud_ips.remove(key.name.as_str());
            }
            Kind::Namespace => {
                self.namespaces.remove(key.name.as_str());
            }
            Kind::Pod => {
                self.pods.set((key.namespace.to_string(), key.name.to_string()), None);
            }
            Kind::Node => {
                self.nodes.remove(key.name.as_str());
            }
        }
    }

    /// Objects per kind: (kind, valid, invalid). Core kinds are always valid.
    pub fn object_counts(&self) -> Vec<(Kind, usize, usize)> {
        fn split<T>(entries: &BTreeMap<String, Entry<T>>) -> (usize, usize) {
            let invalid = entries.values().filter(|e| e.error.is_some()).count();
            (entries.len() - invalid, invalid)
        }
        let counts = [
            (Kind::EgressFirewall, split(&self.firewalls)),
            (Kind::EgressQoS, split(&self.qos)),
            (Kind::EgressIP, split(&self.egress_ips)),
            (Kind::CloudPrivateIPConfig, split(&self.cloud_ips)),
            (Kind::Pod, (self.pods.len(), 0)),
            (Kind::Node, (self.nodes.len(), 0)),
            (Kind::Namespace, (self.namespaces.len(), 0)),
        ];
        counts.into_iter().map(|(k, (valid, invalid))| (k, valid, invalid)).collect()
    }

    /// Every key of an object currently in the view (ignored objects included).
    pub fn keys(&self) -> Vec<ObjectKey> {
        let mut keys: Vec<ObjectKey> = self.ignored.keys().cloned().collect();
        keys.extend(self.firewalls.values().map(|e| e.key.clone()));
        keys.extend(self.qos.values().map(|e| e.key.clone()));
        keys.extend(self.egress_ips.values().map(|e| e.key.clone()));
        keys.extend(self.cloud_ips.values().map(|e| e.key.clone()));
        keys.extend(self.namespaces.keys().map(|n| ObjectKey::new(Kind::Namespace, "", n.clone())));
        keys.extend(self.pods.keys().map(|(ns, n)| ObjectKey::new(Kind::Pod, ns.clone(), n.clone())));
        keys.extend(self.nodes.keys().map(|n| ObjectKey::new(Kind::Node, "", n.clone())));
        keys
    }

    /// The owner of every pod IP, by the pod-identity rule (see [`pods`]), and the
    /// addresses more than one pod claims, one of them `involving`. Kept with every
    /// change: nothing is computed over all pods here.
    pub(crate) fn pod_ip_owners(&self, involving: impl Fn(&PodInfo) -> bool) -> (&Owners, Vec<IpClash>) {
        (self.pods.owners(), self.pods.clashes(involving))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(ns: &str, name: &str, node: Option<&str>, ips: &[&str], created: i64) -> PodInfo {
        PodInfo {
            namespace: ns.into(),
            name: name.into(),
            labels: BTreeMap::new(),
            node: node.map(String::from),
            host_network: false,
            phase: Some("Running".into()),
            ips: ips.iter().map(|s| s.parse().unwrap()).collect(),
            created: Some(created),
        }
    }

    #[test]
    fn pod_identity_rule() {
        let mut p = pod("a", "p", Some("n1"), &["198.18.1.2"], 1);
        assert!(p.counts());
        p.node = None;
        assert!(!p.counts(), "unscheduled");
        p.node = Some("n1".into());
        p.host_network = true;
        assert!(!p.counts(), "hostNetwork");
        p.host_network = false;
        p.phase = Some("Succeeded".into());
        assert!(!p.counts(), "finished");
        p.phase = Some("Failed".into());
        assert!(!p.counts(), "failed");
        p.phase = Some("Pending".into());
        p.ips.clear();
        assert!(!p.counts(), "no IPs");
    }

    #[test]
    fn upsert_reports_whether_anything_changed() {
        let mut v = ClusterView::default();
        let mut pod = Pod::default();
        pod.metadata.name = Some("p".into());
        pod.metadata.namespace = Some("a".into());
        assert!(v.upsert(&Object::Pod(pod.clone())));
        assert!(!v.upsert(&Object::Pod(pod.clone())), "same object again: no change");
        pod.metadata.labels = Some(BTreeMap::from([("app".into(), "web".into())]));
        assert!(v.upsert(&Object::Pod(pod)));
        let key = ObjectKey::new(Kind::EgressIP, "", "e");
        assert!(v.reject(&key, "bad".into()));
        assert!(!v.reject(&key, "bad".into()), "same error again: no change");
    }

    #[test]
    fn ip_clash_resolves_to_newest_then_name() {
        let mut v = ClusterView::default();
        for p in [
            pod("a", "old", Some("n1"), &["198.18.1.2"], 1),
            pod("b", "new", Some("n1"), &["198.18.1.2"], 5),
            pod("c", "also-new", Some("n1"), &["198.18.1.2"], 5),
            pod("d", "done", Some("n1"), &["198.18.1.3"], 9),
        ] {
            v.pods.set((p.namespace.clone(), p.name.clone()), Some(p));
        }
        let mut done = (*v.pods[&("d".to_string(), "done".to_string())]).clone();
        done.phase = Some("Succeeded".into());
        v.pods.set(("d".into(), "done".into()), Some(done));
        let (owners, clashes) = v.pod_ip_owners(|_| true);
        let ip: IpAddr = "198.18.1.2".parse().unwrap();
        assert_eq!(owners[&ip].name, "new");
        assert!(!owners.contains_key(&"198.18.1.3".parse::<IpAddr>().unwrap()));
        assert_eq!(
            clashes,
            vec![IpClash { ip, winner: "b/new".into(), losers: vec!["c/also-new".into(), "a/old".into()] }]
        );
    }
}
