//! The pure compile step: `(ClusterView, NodeConfig) -> Desired`.
//!
//! No I/O, no clock: the same inputs always give the same output, which the golden
//! tests under `tests/golden/` pin down. Invalid objects compile to a status error and
//! nothing else; their last good version (kept by the view) is what gets compiled.

mod boxes;
mod egress_ip;
mod firewall;
mod pod_maps;
mod qos;
#[cfg(test)]
mod rule_strategies;
mod runs;
mod snoop_copies;
mod status;
mod tunnel;

use ipnet::IpNet;

use crate::dns::DnsAnswers;
use crate::dns::targets::{SnoopSettings, SnoopTargets};
use crate::net::{EgressSettings, HostLinks, NetDesired};
use crate::nft::Table;
use crate::view::{ClusterView, PodInfo};

pub use egress_ip::{SNAT_CHAIN, STEER_CHAIN};
pub use egress_ip::{ip_owners, namespace_labels, oldest_first};
pub use firewall::ACL_OVER;
pub use firewall::absolute;
pub use firewall::{
    DNS_SETS, DnsNamesCache, FIREWALL_CHAIN, NAMESPACES as FIREWALL_NAMESPACES, dns_names, dns_rule_names, dns_slots,
    wildcard_slots,
};
pub use qos::QOS_CHAIN;
pub use snoop_copies::snooped_namespaces;
pub use status::QOS_CONDITION_PREFIX;
pub use status::{
    FIREWALL_APPLIED, FIREWALL_NOT_APPLIED, ObjectStatus, Outcome, QOS_APPLIED, QOS_NOT_APPLIED, StatusCondition,
    condition_node, parse_message,
};

/// What egressd knows about the node it runs on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeConfig {
    /// This node's name (`spec.nodeName` of its pods).
    pub node_name: String,
    /// Pod network ranges (destinations inside the cluster are exempt from the firewall).
    pub cluster_cidrs: Vec<IpNet>,
    /// Service ranges (also exempt).
    pub service_cidrs: Vec<IpNet>,
    /// Name of the nft table egressd owns.
    pub table_name: String,
    /// Added to a resolved address's lifetime for its kernel-side timeout.
    pub dns_grace: std::time::Duration,
    /// Longest DNS TTL honoured (resolved and snooped answers), at most [`crate::dns::MAX_TTL`].
    pub dns_max_ttl: std::time::Duration,
    /// EgressIP marks, tables and ownership tags.
    pub egress: EgressSettings,
    /// DNS snooping (`None`: off, and wildcard `dnsName` rules cannot be enforced).
    pub snoop: Option<SnoopSettings>,
    /// The DNS proxy's kernel side (`--dns-mode proxy`; `None`: snooping alone). Used
    /// only with [`NodeConfig::snoop`].
    pub dns_proxy: Option<crate::dns::targets::DnsProxySettings>,
    /// ACL logging and audit mode: where verdicts are copied to.
    pub acl_log: AclLogSettings,
    /// The conntrack mark bits holding the firewall's policy generation of a verified
    /// connection (its later packets skip the rules while the policy stays the same);
    /// 0: every packet walks the rules. See [`DEFAULT_VERIFIED_MARK_MASK`].
    pub verified_mark_mask: u32,
}

/// The default conntrack mark bits of verified connections: twelve generations in
/// three groups, one walk of the conntrack table per four changes
/// ([`crate::nft::verified::groups`]).
pub const DEFAULT_VERIFIED_MARK_MASK: u32 = 0x0f00_0000;

/// Where logged EgressFirewall verdicts go (namespaces with `k8s.ovn.org/acl-logging`,
/// EgressFirewalls in audit mode).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AclLogSettings {
    /// The NFLOG group egressd reads them from.
    pub group: u16,
    /// Most new connections logged per second and rule (the kernel's `limit`).
    pub rate: u32,
}

/// The default NFLOG group of ACL logging (DNS snooping uses 4747).
pub const DEFAULT_ACL_LOG_GROUP: u16 = 4748;
/// The default rate limit of ACL logging, per rule.
pub const DEFAULT_ACL_LOG_RATE: u32 = 20;

impl Default for AclLogSettings {
    fn default() -> Self {
        Self { group: DEFAULT_ACL_LOG_GROUP, rate: DEFAULT_ACL_LOG_RATE }
    }
}

impl NodeConfig {
    /// Node `node_name` with pod ranges `cluster_cidrs` and every other setting at its
    /// default (no Service ranges, table `egressd`, the default DNS grace, default EgressIP
    /// settings, DNS snooping off); the `with_*` methods change one each.
    pub fn new(node_name: impl Into<String>, cluster_cidrs: Vec<IpNet>) -> Self {
        Self {
            node_name: node_name.into(),
            cluster_cidrs,
            service_cidrs: Vec::new(),
            table_name: "egressd".into(),
            dns_grace: DEFAULT_DNS_GRACE,
            dns_max_ttl: crate::dns::MAX_TTL,
            egress: EgressSettings::default(),
            snoop: None,
            dns_proxy: None,
            acl_log: AclLogSettings::default(),
            verified_mark_mask: DEFAULT_VERIFIED_MARK_MASK,
        }
    }

    /// With the DNS proxy (`None`: snooping alone).
    pub fn with_dns_proxy(mut self, proxy: Option<crate::dns::targets::DnsProxySettings>) -> Self {
        self.dns_proxy = proxy;
        self
    }

    /// With other conntrack mark bits for verified connections (0: none).
    pub fn with_verified_mark_mask(mut self, mask: u32) -> Self {
        self.verified_mark_mask = mask;
        self
    }

    /// With ACL logging settings.
    pub fn with_acl_log(mut self, acl_log: AclLogSettings) -> Self {
        self.acl_log = acl_log;
        self
    }

    /// With Service ranges.
    pub fn with_service_cidrs(mut self, service_cidrs: Vec<IpNet>) -> Self {
        self.service_cidrs = service_cidrs;
        self
    }

    /// With another table name.
    pub fn with_table(mut self, table_name: impl Into<String>) -> Self {
        self.table_name = table_name.into();
        self
    }

    /// With another DNS grace.
    pub fn with_dns_grace(mut self, dns_grace: std::time::Duration) -> Self {
        self.dns_grace = dns_grace;
        self
    }

    /// With another longest DNS TTL (cut to [`crate::dns::MAX_TTL`] and at least
    /// [`crate::dns::FLOOR`]).
    pub fn with_dns_max_ttl(mut self, max_ttl: std::time::Duration) -> Self {
        self.dns_max_ttl = max_ttl.clamp(crate::dns::FLOOR, crate::dns::MAX_TTL);
        self
    }

    /// With EgressIP settings.
    pub fn with_egress(mut self, egress: EgressSettings) -> Self {
        self.egress = egress;
        self
    }

    /// With DNS snooping on (`Some`) or off.
    pub fn with_snoop(mut self, snoop: Option<SnoopSettings>) -> Self {
        self.snoop = snoop;
        self
    }

    /// Whether `pod` runs on this node (`spec.nodeName`).
    pub fn is_local(&self, pod: &PodInfo) -> bool {
        pod.node.as_deref() == Some(self.node_name.as_str())
    }

    /// The cluster and Service ranges, host bits cleared, overlaps merged (the kernel
    /// rejects overlapping interval elements): destinations never filtered, steered or
    /// learned from DNS.
    pub fn exempt_ranges(&self) -> Vec<IpNet> {
        let all: Vec<IpNet> = self.cluster_cidrs.iter().chain(&self.service_cidrs).map(IpNet::trunc).collect();
        IpNet::aggregate(&all)
    }

    /// The DNS record families to ask for: A when an IPv4 cluster range is configured,
    /// AAAA when an IPv6 one is.
    pub fn families(&self) -> crate::dns::Families {
        crate::dns::Families {
            v4: self.cluster_cidrs.iter().any(|n| n.addr().is_ipv4()),
            v6: self.cluster_cidrs.iter().any(|n| n.addr().is_ipv6()),
        }
    }
}

/// The largest `--dns-grace-secs` (7 days): with a TTL capped at [`crate::dns::MAX_TTL`]
/// the kernel timeout stays far below what nft accepts.
pub const MAX_DNS_GRACE_SECS: u64 = 7 * 24 * 3600;

/// The default [`NodeConfig::dns_grace`].
pub const DEFAULT_DNS_GRACE: std::time::Duration = std::time::Duration::from_secs(300);

/// The desired dataplane state and the statuses that go with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Desired {
    /// The nft table.
    pub table: std::sync::Arc<Table>,
    /// Addresses, policy rules and routes (EgressIP).
    pub net: NetDesired,
    /// What DNS snooping matches answers against.
    pub snoop: SnoopTargets,
    /// Per-object status, sorted by object key.
    pub statuses: Vec<ObjectStatus>,
    /// Problems that belong to no single object (pod IP clashes).
    pub warnings: Vec<String>,
}

/// What one compile can reuse from the previous one. The output never depends on it:
/// an entry is used only when the input that produced it is equal — a namespace's
/// policy, logging and local pods, the nodes' version for nodeSelector rules, and the
/// node's settings (a different [`NodeConfig`] empties the cache). The property test in
/// `tests/incremental.rs` checks it against a fresh compile.
#[derive(Debug, Default)]
pub struct CompileCache {
    node: Option<NodeConfig>,
    firewall: firewall::FirewallCache,
    snoop_names: snoop_copies::NamesCache,
    /// This node's pods' addresses outside the cluster ranges (warnings), as of the pods' stamp.
    outside: Option<(u64, std::collections::BTreeMap<std::net::IpAddr, String>)>,
}

/// Compile the view for this node, with the current addresses of DNS names and no
/// knowledge of the node's links (no egress IP can be hosted).
pub fn compile(view: &ClusterView, node: &NodeConfig, dns: &DnsAnswers) -> Desired {
    compile_cached(view, node, dns, &HostLinks::default(), &mut CompileCache::default())
}

/// [`compile`] with the node's links, reusing the namespace chains of the previous
/// compile where their policy is unchanged (the agent keeps one cache for its lifetime).
pub fn compile_cached(
    view: &ClusterView,
    node: &NodeConfig,
    dns: &DnsAnswers,
    host: &HostLinks,
    cache: &mut CompileCache,
) -> Desired {
    if cache.node.as_ref() != Some(node) {
        *cache = CompileCache { node: Some(node.clone()), ..CompileCache::default() };
    }
    let mut table = Table::new(node.table_name.clone());
    let mut net = NetDesired::default();
    let mut statuses = Vec::new();
    let mut warnings = Vec::new();

    // Each node reports the clashes of its own pods (other nodes' pods may not be in
    // its view).
    let (owners, clashes) = view.pod_ip_owners(|p| node.is_local(p));
    for c in &clashes {
        warnings.push(format!(
            "pod IP {} is claimed by {} and {}; {} keeps it",
            c.ip,
            c.winner,
            c.losers.join(", "),
            c.winner
        ));
    }

    // A pod address outside the configured pod ranges is still policed (dropping it
    // could leave a pod's traffic unfiltered when a range is missing from the flags),
    // but it points at a wrong --cluster-cidr or a wrong pod status.
    if !node.cluster_cidrs.is_empty() {
        warnings.extend(outside_ranges(view, node, owners, &mut cache.outside).values().cloned());
    }
    firewall::compile(view, node, dns, owners, &mut table, &mut statuses, &mut cache.firewall);
    qos::compile(view, node, owners, &mut table, &mut statuses);
    egress_ip::compile(view, node, host, owners, &mut table, &mut net, &mut statuses);
    let snoop = snoop_copies::targets(view, node, owners, &mut cache.snoop_names);
    snoop_copies::compile(node, &snoop, &mut table);

    for (key, reason) in &view.ignored {
        statuses.push(ObjectStatus::new(key.clone(), &node.node_name, Outcome::Ignored(reason.clone())));
    }
    if node.egress.mode == crate::net::EgressIpMode::CloudLocal {
        egress_ip::cloud_local(view, node, host, &mut net, &mut statuses);
    } else {
        statuses.extend(view.cloud_ips.values().map(|e| {
            let outcome = e.error.clone().map_or(Outcome::Validated, Outcome::Failed);
            ObjectStatus::new(e.key.clone(), &node.node_name, outcome)
        }));
    }
    statuses.sort_by(|a, b| a.key.cmp(&b.key));
    Desired { table: std::sync::Arc::new(table), net, snoop, statuses, warnings }
}

/// The warnings for this node's pods' addresses outside the cluster ranges (each node
/// reports its own pods; other nodes' pods may not be in its view), by address: patched for
/// the addresses the pods' journal lists since the stamp `kept` was made at (each
/// address's warning depends on its owner only), made anew when it does not reach back.
fn outside_ranges<'a>(
    view: &ClusterView,
    node: &NodeConfig,
    owners: &crate::view::Owners,
    kept: &'a mut Option<(u64, std::collections::BTreeMap<std::net::IpAddr, String>)>,
) -> &'a std::collections::BTreeMap<std::net::IpAddr, String> {
    let warning = |ip: &std::net::IpAddr| {
        let pod = owners.get(ip).filter(|p| node.is_local(p))?;
        (!node.cluster_cidrs.iter().any(|n| n.contains(ip))).then(|| {
            format!("pod IP {ip} of {}/{} is outside the cluster ranges (--cluster-cidr)", pod.namespace, pod.name)
        })
    };
    let stamp = view.pods.stamp();
    let touched = kept.as_ref().and_then(|(since, _)| view.pods.touched_since(*since));
    let (at, warnings) = match (kept.take(), touched) {
        (Some((_, mut warnings)), Some(touched)) => {
            for ip in touched {
                match warning(&ip) {
                    Some(w) => warnings.insert(ip, w),
                    None => warnings.remove(&ip),
                };
            }
            (stamp, warnings)
        }
        _ => (stamp, owners.keys().filter_map(|ip| Some((*ip, warning(ip)?))).collect()),
    };
    &kept.insert((at, warnings)).1
}

/// Render statuses as text, one object per line (`egressd render` / `egressd status`).
pub fn render_statuses(statuses: &[ObjectStatus]) -> String {
    let mut out = String::new();
    for s in statuses {
        out.push_str(&format!("{}\t{}\t{}\n", s.key, s.state(), s.message()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::parse::{Parsed, parse_document, yaml_to_value};

    fn view(docs: &str) -> ClusterView {
        let mut v = ClusterView::default();
        for (_, _, text) in crate::api::parse::split_documents(docs) {
            let Ok(Parsed::Object(o)) = parse_document(&yaml_to_value(&text).unwrap(), "default", true) else {
                panic!("bad test document: {text}");
            };
            v.upsert(&o);
        }
        v
    }

    fn node() -> NodeConfig {
        NodeConfig::new("n1", vec!["198.18.0.0/16".parse().unwrap()])
    }

    const POLICY: &str = "apiVersion: k8s.ovn.org/v1\nkind: EgressQoS\nmetadata: {name: default, namespace: a}\nspec:\n  egress:\n  - dscp: 46\n    podSelector: {matchLabels: {app: web}}\n---\napiVersion: k8s.ovn.org/v1\nkind: EgressFirewall\nmetadata: {name: default, namespace: a}\nspec:\n  egress:\n  - {type: Deny, to: {cidrSelector: 192.0.2.0/24}}\n";

    fn pod(name: &str, ip: &str, app: &str) -> String {
        format!(
            "---\napiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: a, labels: {{app: {app}}}}}\nspec: {{nodeName: n1}}\nstatus: {{podIP: {ip}}}\n"
        )
    }

    fn script(before: &str, after: &str) -> String {
        let old = compile(&view(before), &node(), &DnsAnswers::new()).table;
        let new = compile(&view(after), &node(), &DnsAnswers::new()).table;
        crate::nft::diff(&old, &new).unwrap_or_default()
    }

    #[test]
    fn a_new_pod_is_element_additions_only() {
        let before = format!("{POLICY}{}", pod("p1", "198.18.1.1", "web"));
        let after = format!("{before}{}", pod("p2", "198.18.1.2", "web"));
        // The firewall's pod element is the namespace's number, the key of its chain's
        // jump in `fw-namespaces` (no `jump` element: nothing for the kernel to validate).
        let table = compile(&view(&after), &node(), &DnsAnswers::new()).table;
        let jumps = &table.sets["fw-namespaces"].elements;
        assert_eq!(jumps.len(), 1);
        let (number, jump) = jumps.iter().next().unwrap();
        assert_eq!(*jump, crate::nft::Value::Jump("fw-a".into()));
        assert_eq!(
            script(&before, &after),
            format!(
                "add element inet egressd fw-pods-v4 {{ 198.18.1.2 : {number} }}\n\
                 add element inet egressd qos-a-0-v4 {{ 198.18.1.2 }}\n\
                 add element inet egressd qos-pods-v4 {{ 198.18.1.2 : jump qos-a }}\n"
            )
        );
    }

    fn firewall(cidrs: &[&str]) -> String {
        let rules: String = cidrs.iter().map(|c| format!("  - {{type: Allow, to: {{cidrSelector: {c}}}}}\n")).collect();
        format!(
            "apiVersion: k8s.ovn.org/v1\nkind: EgressFirewall\nmetadata: {{name: default, namespace: a}}\nspec:\n  egress:\n{rules}{}",
            pod("p1", "198.18.1.1", "web")
        )
    }

    #[test]
    fn a_run_edited_within_its_prefix_lengths_is_element_changes_and_never_a_full_replace() {
        let five = ["192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24", "198.18.7.0/24", "198.18.8.0/24"];
        let two = firewall(&five);
        // Same length: elements of the run's hash set.
        let mut edited = five;
        edited[1] = "198.18.9.0/24";
        assert_eq!(
            script(&two, &firewall(&edited)),
            "delete element inet egressd fw-a-h4-0 { 198.51.100.0 }\nadd element inet egressd fw-a-h4-0 { 198.18.9.0 }\n"
        );
        // A second length: a set and a rule more; a third: the run becomes one interval
        // set, named apart, so no set changes its declaration (which only a full
        // replace could do); IPv6 sets are named apart from IPv4 ones.
        let mut two_lengths = five;
        two_lengths[1] = "198.51.100.0/25";
        let mut three_lengths = two_lengths;
        three_lengths[2] = "203.0.113.7/32";
        let v6 = ["2001:db8::/64", "2001:db8:1::/64", "2001:db8:2::/64", "2001:db8:3::/64", "2001:db8:4::/64"];
        let (mixed, three, v6) = (firewall(&two_lengths), firewall(&three_lengths), firewall(&v6));
        for (before, after) in [(&two, &mixed), (&mixed, &three), (&three, &two), (&two, &v6), (&v6, &three)] {
            let s = script(before, after);
            assert!(!s.is_empty() && !s.contains("delete table"), "{s}");
        }
        assert!(script(&mixed, &three).contains("add set inet egressd fw-a-r4-0 "), "{}", script(&mixed, &three));
        // A small run keeps its destinations in rules: an edit changes rules, no set.
        let small = firewall(&five[..2]);
        let s = script(&small, &firewall(&edited[..2]));
        assert!(
            !s.contains(" set inet")
                && !s.contains("element")
                && !s.contains("delete table")
                && s.contains("198.18.9.0/24"),
            "{s}"
        );
    }

    #[test]
    fn a_label_change_is_one_element_removal() {
        let before = format!("{POLICY}{}{}", pod("p1", "198.18.1.1", "web"), pod("p2", "198.18.1.2", "web"));
        let after = format!("{POLICY}{}{}", pod("p1", "198.18.1.1", "web"), pod("p2", "198.18.1.2", "db"));
        assert_eq!(script(&before, &after), "delete element inet egressd qos-a-0-v4 { 198.18.1.2 }\n");
    }

    #[test]
    fn the_cache_never_changes_the_output() {
        let mut cache = CompileCache::default();
        let docs = format!("{POLICY}{}{}", pod("p1", "198.18.1.1", "web"), pod("p2", "198.18.1.2", "db"));
        let dns = DnsAnswers::new();
        let first = compile_cached(&view(&docs), &node(), &dns, &HostLinks::default(), &mut cache);
        assert_eq!(first, compile(&view(&docs), &node(), &dns));
        let again = compile_cached(&view(&docs), &node(), &dns, &HostLinks::default(), &mut cache);
        assert_eq!(again, first);
        assert!(std::sync::Arc::ptr_eq(&first.table.chains["fw-a"].rules, &again.table.chains["fw-a"].rules), "reused");
        let edited = docs.replace("192.0.2.0/24", "198.51.100.0/24");
        assert_eq!(
            compile_cached(&view(&edited), &node(), &dns, &HostLinks::default(), &mut cache),
            compile(&view(&edited), &node(), &dns)
        );
    }

    #[test]
    fn a_namespace_number_that_moves_moves_its_pods_elements() {
        // Two namespaces whose names hash alike: while both have a policy the second
        // takes the next number; once the first's policy is gone, its own.
        let docs: String = [("c1170850", "198.18.1.1"), ("c693596", "198.18.1.2")]
            .iter()
            .map(|(ns, ip)| {
                format!(
                    "---\napiVersion: k8s.ovn.org/v1\nkind: EgressFirewall\nmetadata: {{name: default, namespace: {ns}}}\nspec:\n  egress:\n  - {{type: Deny, to: {{cidrSelector: 192.0.2.0/24}}}}\n\
                     ---\napiVersion: v1\nkind: Pod\nmetadata: {{name: p, namespace: {ns}}}\nspec: {{nodeName: n1}}\nstatus: {{podIP: {ip}}}\n"
                )
            })
            .collect();
        let (mut v, dns, mut cache) = (view(&docs), DnsAnswers::new(), CompileCache::default());
        let before = compile_cached(&v, &node(), &dns, &HostLinks::default(), &mut cache);
        let pods = |d: &Desired| {
            d.table.sets["fw-pods-v4"].elements.get(&crate::nft::Key::Addr("198.18.1.2".parse().unwrap())).cloned()
        };
        v.remove(&crate::api::ObjectKey {
            kind: crate::api::Kind::EgressFirewall,
            namespace: "c1170850".into(),
            name: "default".into(),
        });
        let after = compile_cached(&v, &node(), &dns, &HostLinks::default(), &mut cache);
        assert_ne!(pods(&before), pods(&after), "the number moved");
        assert_eq!(after, compile(&v, &node(), &dns));
    }

    #[test]
    fn compile_is_deterministic() {
        let docs = format!("{POLICY}{}{}", pod("p1", "198.18.1.1", "web"), pod("p2", "198.18.1.2", "db"));
        let dns = DnsAnswers::new();
        assert_eq!(compile(&view(&docs), &node(), &dns), compile(&view(&docs), &node(), &dns));
    }

    const DNS_POLICY: &str = "apiVersion: k8s.ovn.org/v1\nkind: EgressFirewall\nmetadata: {name: default, namespace: a}\nspec:\n  egress:\n  - {type: Allow, to: {dnsName: api.example.com}}\n  - {type: Deny, to: {cidrSelector: 0.0.0.0/0}}\n";

    fn answers(ips: &[&str], ttl: u64) -> DnsAnswers {
        let resolved = crate::dns::Resolved {
            addresses: ips.iter().map(|s| s.parse().unwrap()).collect(),
            ttl: std::time::Duration::from_secs(ttl),
        };
        DnsAnswers::from([("api.example.com.".to_string(), resolved)])
    }

    #[test]
    fn dns_addresses_are_timeout_elements_without_cluster_addresses() {
        let docs = format!("{DNS_POLICY}{}", pod("p1", "198.18.1.1", "web"));
        let mut dual = node();
        dual.cluster_cidrs.push("2001:db8:1::/48".parse().unwrap());
        let desired = compile(&view(&docs), &dual, &answers(&["192.0.2.7", "198.18.9.9", "2001:db8::7"], 2));
        assert!(
            !compile(&view(&docs), &node(), &DnsAnswers::new()).table.sets.contains_key("dns-v6"),
            "no IPv6 range: no IPv6 set"
        );
        let [slot4, slot6] = dns_slots("api.example.com.");
        let v4 = &desired.table.sets["dns-v4"];
        assert!(v4.timeout);
        // TTL 2 → floor 5 s, plus the 300 s grace; the in-cluster 198.18.9.9 is dropped.
        let key = slot4.key("192.0.2.7".parse().unwrap());
        assert_eq!(v4.elements.iter().collect::<Vec<_>>(), vec![(&key, &"timeout 305s".parse().unwrap())]);
        assert_eq!(desired.table.sets["dns-v6"].elements.len(), 1);
        let rules = desired.table.chains["fw-a"].texts();
        // First, the priority the base chain borrowed to reach the chain is put back.
        assert_eq!(rules[0], "meta priority set none");
        let rules = &rules[1..];
        assert!(rules[0].starts_with(&format!("{} ", slot4.matches("ip"))), "{rules:?}");
        assert!(rules[1].starts_with(&format!("{} ", slot6.matches("ip6"))), "{rules:?}");
        assert_eq!(dns_names(&view(&docs)).into_iter().collect::<Vec<_>>(), vec!["api.example.com.".to_string()]);
    }

    #[test]
    fn only_allows_whose_destinations_change_with_the_table_mark_connections_verified() {
        let fw = |rules: &str| {
            format!(
                "apiVersion: k8s.ovn.org/v1\nkind: EgressFirewall\nmetadata: {{name: default, namespace: a}}\nspec:\n  egress:\n{rules}{}",
                pod("p1", "198.18.1.1", "web")
            )
        };
        let snoop = Some(crate::dns::targets::SnoopSettings { group: 1, servers: Vec::new(), rate: 100 });
        let chain = |docs: &str, node: &NodeConfig| {
            let t = compile(&view(docs), node, &DnsAnswers::new()).table;
            (t.chains["fw-a"].texts()[1..].to_vec(), t.chains.contains_key(crate::nft::verified::CHAIN))
        };
        let cidr_and_name = fw(
            "  - {type: Allow, to: {cidrSelector: 192.0.2.0/24}}\n  - {type: Allow, to: {dnsName: api.example.com}}\n  - {type: Deny, to: {cidrSelector: 0.0.0.0/0}}\n",
        );
        let (rules, verified) = chain(&cidr_and_name, &node().with_snoop(snoop.clone()));
        assert!(verified);
        assert!(rules[0].starts_with("ip daddr 192.0.2.0/24 ") && rules[0].contains(" return "), "{rules:?}");
        // A name's addresses can leave its set by a timeout: never verified.
        assert!(rules[1].contains("@dns-v4") && rules[1].contains(" accept "), "{rules:?}");
        // A Deny by name, snooped: an answer learned later must reach allowed
        // connections, so nothing in the namespace is verified.
        let deny_name =
            fw("  - {type: Deny, to: {dnsName: evil.example.com}}\n  - {type: Allow, to: {cidrSelector: 0.0.0.0/0}}\n");
        let (rules, _) = chain(&deny_name, &node().with_snoop(snoop));
        assert!(rules.iter().all(|r| !r.contains("return")), "{rules:?}");
        assert_eq!(rules.last().map(String::as_str), Some("accept"), "nothing falls through to be marked");
        // Without snooping its addresses change with the table only.
        let (rules, _) = chain(&deny_name, &node());
        assert!(rules.iter().any(|r| r.contains(" return ")), "{rules:?}");
        // Mask 0: no fast path at all.
        let (rules, verified) = chain(&cidr_and_name, &node().with_verified_mark_mask(0));
        assert!(!verified && rules.iter().all(|r| !r.contains("return") && r != "accept"), "{rules:?}");
        let base = &compile(&view(&cidr_and_name), &node().with_verified_mark_mask(0), &DnsAnswers::new()).table.chains
            ["firewall"];
        assert!(base.texts().iter().all(|r| !r.contains("fw-epoch")), "{:?}", base.rules);
    }

    #[test]
    fn the_dns_proxy_intercept_is_compiled_with_snooping_only() {
        use crate::dns::targets::{DEFAULT_PROXY_MARK_MASK, DnsProxySettings, SnoopSettings};
        let docs = format!("{DNS_POLICY}{}", pod("p1", "198.18.1.1", "web"));
        let snoop = Some(SnoopSettings { group: 1, servers: vec!["203.0.113.2".parse().unwrap()], rate: 100 });
        let proxy = Some(DnsProxySettings::new(53053, DEFAULT_PROXY_MARK_MASK, &EgressSettings::default()));
        let table = |node: NodeConfig| compile(&view(&docs), &node, &DnsAnswers::new()).table;

        let with = table(node().with_snoop(snoop.clone()).with_dns_proxy(proxy));
        let taken = &with.chains["dns-proxy"].texts();
        assert_eq!(taken.len(), 4, "{taken:?}");
        assert!(
            taken.iter().all(|r| r.contains(" dport 53 tproxy ")
                && r.ends_with(" to :53053 meta mark set meta mark and 0xffffefff or 0x00001000 accept")),
            "{taken:?}"
        );
        let raw = &with.chains["dns-proxy-raw"].texts();
        assert!(raw.len() == 4 && raw.iter().all(|r| r.ends_with(" dport 53 notrack")), "{raw:?}");
        for (chain, rules) in [("dns-proxy", taken), ("dns-proxy-raw", raw)] {
            // Only snooped pods' queries to a guarded server.
            assert!(
                rules.iter().all(|r| r.contains("saddr @snoop-pods-v") && r.contains("daddr @dns-proxy-v")),
                "{chain}"
            );
        }
        // The proxy's answers (its mark's upper bit) are not tracked.
        assert_eq!(*with.chains["dns-proxy-answers"].rules, ["meta mark and 0x00002000 != 0x00000000 notrack"]);
        for chain in ["dns-snoop-in", "dns-snoop-out"] {
            assert_eq!(with.chains[chain].rules[0], "meta mark and 0x00003000 != 0x00000000 return", "{chain}");
        }
        assert!(!with.chains["dns-snoop"].texts()[0].contains("mark"), "forward copies what the proxy never sees");
        assert!(with.sets["dns-proxy-v4"].elements.is_empty() && with.sets.contains_key("dns-proxy-v6"));

        // Snooping alone, or the proxy without snooping: no intercept.
        for node in [node().with_snoop(snoop.clone()), node().with_dns_proxy(proxy)] {
            let t = table(node);
            assert!(["dns-proxy", "dns-proxy-raw", "dns-proxy-answers"].iter().all(|c| !t.chains.contains_key(*c)));
            assert!(!t.sets.contains_key("dns-proxy-v4"));
            assert!(t.chains.get("dns-snoop-in").is_none_or(|c| !c.texts()[0].contains("mark")));
        }
    }

    #[test]
    fn dns_changes_touch_elements_only() {
        let docs = format!("{DNS_POLICY}{}", pod("p1", "198.18.1.1", "web"));
        let v = view(&docs);
        let old = compile(&v, &node(), &answers(&["192.0.2.7"], 60)).table;
        let new = compile(&v, &node(), &answers(&["192.0.2.8"], 60)).table;
        // The tag is the first 64 bits of SHA-256("api.example.com."), in two halves.
        assert_eq!(
            crate::nft::diff(&old, &new).unwrap(),
            "delete element inet egressd dns-v4 { 670820034 . 1808457431 . 192.0.2.7 }\n\
             add element inet egressd dns-v4 { 670820034 . 1808457431 . 192.0.2.8 timeout 360s }\n"
        );
    }
}
