//! Every cache and incremental path gives exactly what a fresh start gives, for random
//! sequences of changes of every kind:
//!
//! * the compile cache (namespace chains reused across compiles): after each change,
//!   the cached compile equals a compile with an empty cache;
//! * the manifests source (parse cache per file, view updated per changed object):
//!   after each change of the directory, the view (also when only the file a watch event
//!   names is read again) equals the view of a fresh source reading the same directory — which, like a restarted agent, gets the last good
//!   versions of invalid objects from the saved state.
//!
//! * partial pod knowledge: a node whose agent follows only its own pods (the Kubernetes
//!   source's field-selected watch, widened to every pod while the node needs them,
//!   [`ClusterView::needs_cluster_pods`]) compiles, through the cache, exactly what a
//!   fresh compile of the whole cluster gives.
//!
//! Changes: Namespaces (labels), Nodes (labels, addresses), Pods (labels, node, IPs,
//! phase), the four custom resources (valid, invalid, ignored), DNS answers, the node's
//! links, removals.

use std::collections::BTreeMap;

use egressd::api::ObjectKey;
use egressd::api::parse::{Parsed, parse_document, split_documents, yaml_to_value};
use egressd::compile::{CompileCache, DnsNamesCache, NodeConfig, compile_cached, dns_names};
use egressd::dns::targets::SnoopSettings;
use egressd::dns::{DnsAnswers, Resolved};
use egressd::net::{HostLink, HostLinks};
use egressd::nft::verified;
use egressd::source::manifests::ManifestSource;
use egressd::view::ClusterView;
use proptest::prelude::*;

fn pick<T: Clone + std::fmt::Debug + 'static>(items: &[T]) -> impl Strategy<Value = T> + use<T> {
    proptest::sample::select(items.to_vec())
}

/// The namespaces of pods, Namespaces and EgressFirewalls: the last two have the same
/// FNV-1a hash, the firewall's first choice of their number, so one of them takes
/// another while both have a policy, and its number moves when the other's goes.
const NAMESPACES: [&str; 4] = ["a", "b", "c693596", "c1170850"];

fn namespace() -> impl Strategy<Value = String> {
    // ACL logging annotations too: they change the namespace's chain (log rules).
    let logging = pick(&["", r#"{"deny": "alert"}"#, r#"{"deny": "info", "allow": "notice"}"#, "not json"]);
    (pick(&NAMESPACES), pick(&["", "team: x", "team: y"]), logging).prop_map(|(name, label, logging)| {
        format!(
            "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {name}\n  labels: {{kubernetes.io/metadata.name: {name}{}}}\n{}",
            if label.is_empty() { String::new() } else { format!(", {label}") },
            if logging.is_empty() {
                String::new()
            } else {
                format!("  annotations: {{k8s.ovn.org/acl-logging: '{logging}'}}\n")
            }
        )
    })
}

fn node() -> impl Strategy<Value = String> {
    (
        pick(&["n1", "n2"]),
        pick(&["{}", "{role: web}", "{role: db}"]),
        proptest::sample::subsequence(vec!["192.0.2.101", "192.0.2.102", "198.51.100.7", "2001:db8::101"], 0..=2),
        any::<bool>(),
    )
        .prop_map(|(name, labels, addrs, ready)| {
            let addrs: String =
                addrs.iter().map(|a| format!("  - {{type: InternalIP, address: \"{a}\"}}\n")).collect();
            let ready = if ready { "True" } else { "False" };
            format!(
                "apiVersion: v1\nkind: Node\nmetadata: {{name: {name}, labels: {labels}}}\nstatus:\n  conditions: [{{type: Ready, status: \"{ready}\"}}]\n  addresses:\n{addrs}"
            )
        })
}

fn pod() -> impl Strategy<Value = String> {
    (
        pick(&["p0", "p1", "p2", "p3"]),
        pick(&NAMESPACES),
        pick(&["{app: web}", "{app: db}", "{}"]),
        pick(&["n1", "n2"]),
        // 198.19.1.1 is outside the cluster ranges (a warning).
        proptest::sample::subsequence(vec!["198.18.1.1", "198.18.1.2", "198.18.1.3", "2001:db8:1::1", "198.19.1.1"], 0..=2),
        pick(&["Running", "Running", "Succeeded"]),
        prop_oneof![9 => Just(false), 1 => Just(true)],
        0i64..3,
    )
        .prop_map(|(name, ns, labels, node, ips, phase, host, created)| {
            let ips: Vec<String> = ips.iter().map(|ip| format!("{{ip: \"{ip}\"}}")).collect();
            format!(
                "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: {ns}, labels: {labels}, creationTimestamp: \"2026-01-0{}T00:00:00Z\"}}\n\
                 spec: {{nodeName: {node}, hostNetwork: {host}}}\nstatus:\n  phase: {phase}\n  podIPs: [{}]\n",
                created + 1,
                ips.join(", ")
            )
        })
}

fn firewall_rule() -> impl Strategy<Value = String> {
    let to = prop_oneof![
        pick(&["192.0.2.0/24", "198.51.100.0/24", "0.0.0.0/0", "::/0", "192.0.2.7/32", "192.0.2.0/33"])
            .prop_map(|c| format!("{{cidrSelector: \"{c}\"}}")),
        pick(&["a.example.com", "B.example.com", "*.example.com"]).prop_map(|d| format!("{{dnsName: \"{d}\"}}")),
        pick(&["web", "db"]).prop_map(|r| format!("{{nodeSelector: {{matchLabels: {{role: {r}}}}}}}")),
    ];
    let ports = pick(&[
        "",
        ", ports: [{protocol: TCP, port: 443}]",
        ", ports: [{protocol: UDP, port: 53}, {protocol: TCPX, port: 80}]",
    ]);
    (pick(&["Allow", "Deny", "Allowed"]), to, ports).prop_map(|(t, to, p)| format!("  - {{type: {t}, to: {to}{p}}}\n"))
}

/// A long list the compile flattens (`compile/boxes.rs`): six runs of five destinations
/// of three prefix lengths (each run would need an interval set), actions alternating,
/// optionally a nodeSelector rule in the middle (its addresses follow the nodes).
fn long_rules() -> impl Strategy<Value = Vec<String>> {
    (0u8..8, any::<bool>(), any::<bool>()).prop_map(|(offset, deny_first, nodes)| {
        let mut rules = Vec::new();
        for run in 0..6u32 {
            let action = if (run % 2 == 0) == deny_first { "Deny" } else { "Allow" };
            for (j, len) in [29u32, 30, 31, 32, 29].into_iter().enumerate() {
                let base = (run * 5 + j as u32) * 8 + u32::from(offset % 2);
                let net =
                    ipnet::Ipv4Net::new(std::net::Ipv4Addr::new(192, 0, 2, base as u8), len as u8).unwrap().trunc();
                rules.push(format!("  - {{type: {action}, to: {{cidrSelector: \"{net}\"}}}}\n"));
            }
            if nodes && run == 2 {
                rules.push("  - {type: Allow, to: {nodeSelector: {matchLabels: {role: web}}}}\n".to_string());
            }
        }
        rules
    })
}

fn firewall() -> impl Strategy<Value = String> {
    (
        pick(&NAMESPACES),
        pick(&["default", "default", "other"]),
        prop_oneof![4 => proptest::collection::vec(firewall_rule(), 0..4), 1 => long_rules()],
        pick(&["", ", annotations: {egressd.io/audit: \"true\"}"]),
    )
        .prop_map(|(ns, name, rules, audit)| {
            format!(
                "apiVersion: k8s.ovn.org/v1\nkind: EgressFirewall\nmetadata: {{name: {name}, namespace: {ns}{audit}}}\nspec:\n  egress:{}",
                if rules.is_empty() { " []\n".to_string() } else { format!("\n{}", rules.concat()) }
            )
        })
}

fn qos() -> impl Strategy<Value = String> {
    (
        pick(&["a", "b"]),
        pick(&[0u8, 10, 46, 64]),
        pick(&["", ", dstCIDR: 192.0.2.0/24"]),
        pick(&["", ", podSelector: {matchLabels: {app: web}}"]),
    )
        .prop_map(|(ns, dscp, dst, sel)| {
            format!(
                "apiVersion: k8s.ovn.org/v1\nkind: EgressQoS\nmetadata: {{name: default, namespace: {ns}}}\nspec:\n  egress:\n  - {{dscp: {dscp}{dst}{sel}}}\n"
            )
        })
}

fn egress_ip() -> impl Strategy<Value = String> {
    (
        pick(&["e1", "e2"]),
        pick(&["198.19.0.50", "198.19.0.51", "192.0.2.101", "198.19.0.50.1"]),
        pick(&["a", "b"]),
        pick(&["", "\n  podSelector: {matchLabels: {app: web}}"]),
        pick(&["", "n1", "n2"]),
        0i64..3,
    )
        .prop_map(|(name, ip, ns, pods, host, created)| {
            let status =
                if host.is_empty() { String::new() } else { format!("status:\n  items: [{{egressIP: \"{ip}\", node: {host}}}]\n") };
            format!(
                "apiVersion: k8s.ovn.org/v1\nkind: EgressIP\nmetadata: {{name: {name}, creationTimestamp: \"2026-01-0{}T00:00:00Z\"}}\nspec:\n  egressIPs: [\"{ip}\"]\n  \
                 namespaceSelector: {{matchLabels: {{kubernetes.io/metadata.name: {ns}}}}}{pods}\n{status}",
                created + 1
            )
        })
}

fn cloud_ip() -> impl Strategy<Value = String> {
    (pick(&["198.19.0.50", "198.19.0.51"]), pick(&["n1", "n2"])).prop_map(|(ip, node)| {
        format!(
            "apiVersion: cloud.network.openshift.io/v1\nkind: CloudPrivateIPConfig\nmetadata: {{name: \"{ip}\"}}\nspec: {{node: {node}}}\n"
        )
    })
}

/// One document of any kind.
fn document() -> impl Strategy<Value = String> {
    prop_oneof![
        2 => namespace(),
        2 => node(),
        4 => pod(),
        4 => firewall(),
        2 => qos(),
        2 => egress_ip(),
        1 => cloud_ip(),
    ]
}

/// Not YAML: the file's objects cannot be told (the source keeps what it had from it).
const NOT_YAML: &str = "key: [unclosed\n";

/// A document of a manifest file: an object, or (rarer) not YAML, a kind egressd does
/// not read, a document its schema rejects.
fn file_document() -> impl Strategy<Value = String> {
    prop_oneof![
        16 => document(),
        1 => Just(NOT_YAML.to_string()),
        1 => Just("apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d, namespace: a}\n".to_string()),
        1 => pick(&["a", "b"]).prop_map(|ns| format!(
            "apiVersion: k8s.ovn.org/v1\nkind: EgressFirewall\nmetadata: {{name: default, namespace: {ns}}}\nspec:\n  egress: not-a-list\n"
        )),
    ]
}

fn key_of(doc: &str) -> Option<ObjectKey> {
    let (_, _, text) = split_documents(doc).into_iter().next()?;
    match parse_document(&yaml_to_value(&text).ok()?, "default", true) {
        Ok(Parsed::Object(o)) => Some(o.key()),
        Ok(Parsed::Ignored { .. }) => None,
        Err(e) => e.key,
    }
}

#[derive(Debug, Clone)]
enum Change {
    /// Add or replace the object of this document.
    Put(String),
    /// Remove the object of this document.
    Remove(String),
    /// New answers for a name.
    Dns(String, Vec<String>),
    /// The node's links (index into [`links`]).
    Links(usize),
}

fn change() -> impl Strategy<Value = Change> {
    prop_oneof![
        6 => document().prop_map(Change::Put),
        2 => document().prop_map(Change::Remove),
        2 => (
            pick(&["a.example.com.", "b.example.com."]),
            proptest::sample::subsequence(vec!["192.0.2.10", "192.0.2.11", "198.18.9.9", "2001:db8::10"], 0..=3)
        )
            .prop_map(|(n, a)| Change::Dns(n.to_string(), a.into_iter().map(String::from).collect())),
        1 => (0usize..3).prop_map(Change::Links),
    ]
}

fn links(choice: usize) -> HostLinks {
    let link = |addrs: &[&str]| HostLink {
        index: 2,
        name: "eth0".into(),
        up: true,
        addrs: addrs.iter().map(|a| a.parse().unwrap()).collect(),
        gateways: vec!["198.19.0.254".parse().unwrap()],
    };
    match choice {
        0 => HostLinks::default(),
        1 => HostLinks { links: vec![link(&["198.19.0.1/24"])], default_link: [Some(2), None], ..Default::default() },
        _ => HostLinks {
            links: vec![link(&["198.19.0.1/24", "192.0.2.101/24"])],
            default_link: [Some(2), None],
            ..Default::default()
        },
    }
}

fn node_config(snoop: bool) -> NodeConfig {
    NodeConfig::new("n1", vec!["198.18.0.0/16".parse().unwrap(), "2001:db8:1::/48".parse().unwrap()])
        .with_service_cidrs(vec!["198.19.128.0/17".parse().unwrap()])
        .with_snoop(snoop.then(|| SnoopSettings {
            group: 4747,
            servers: vec!["192.0.2.53".parse().unwrap()],
            rate: 10_000,
        }))
}

/// A DNS answer with these addresses.
fn answer(addrs: &[String]) -> Resolved {
    Resolved { addresses: addrs.iter().map(|a| a.parse().unwrap()).collect(), ttl: std::time::Duration::from_secs(30) }
}

/// Apply a document to a view as a source does (rejected documents keep the last good
/// version of their object).
fn put(view: &mut ClusterView, doc: &str) {
    for (_, _, text) in split_documents(doc) {
        match parse_document(&yaml_to_value(&text).expect("generated YAML"), "default", true) {
            Ok(Parsed::Object(o)) => {
                view.upsert(&o);
            }
            Ok(Parsed::Ignored { .. }) => {}
            Err(e) => {
                if let Some(key) = e.key {
                    view.reject(&key, e.violations.join("; "));
                }
            }
        }
    }
}

proptest! {
    #[test]
    fn the_compile_cache_gives_what_a_fresh_compile_gives(
        changes in proptest::collection::vec(change(), 1..24),
        snoop in any::<bool>(),
    ) {
        let node = node_config(snoop);
        let mut view = ClusterView::default();
        let mut dns = DnsAnswers::new();
        let mut host = HostLinks::default();
        let mut cache = CompileCache::default();
        let mut names = DnsNamesCache::default();
        for (step, c) in changes.iter().enumerate() {
            match c {
                Change::Put(doc) => put(&mut view, doc),
                Change::Remove(doc) => {
                    if let Some(key) = key_of(doc) {
                        view.remove(&key);
                    }
                }
                Change::Dns(name, addrs) => {
                    dns.insert(name.clone(), answer(addrs));
                }
                Change::Links(i) => host = links(*i),
            }
            let cached = compile_cached(&view, &node, &dns, &host, &mut cache);
            let fresh = compile_cached(&view, &node, &dns, &host, &mut CompileCache::default());
            // What a change may alter and keep verified connections' generation
            // (EgressIP, EgressQoS) is never reached from the fast path.
            let reached = verified::reached(&fresh.table);
            let leaks: Vec<&String> = reached.iter().filter(|n| verified::outside(n)).collect();
            prop_assert!(leaks.is_empty(), "step {}: the fast path reaches {:?}", step, leaks);
            if fresh.table.chains.contains_key("firewall") {
                prop_assert!(reached.contains(verified::CHAIN), "step {}: {:?}", step, reached);
            }
            prop_assert_eq!(cached, fresh, "step {}: {:?}", step, c);
            prop_assert_eq!(names.names(&view), dns_names(&view), "DNS names, step {}: {:?}", step, c);
        }
    }
}

/// Pods of node n2 get addresses of their own (nodes have disjoint pod ranges): an
/// address claimed by pods of two nodes is the one case where a node's own pods decide
/// otherwise than the whole cluster (the node's claim is the one it sees; see
/// docs/design/kubernetes.md, "Pods an agent follows").
fn own_range(doc: &str) -> String {
    if doc.contains("kind: Pod") && doc.contains("nodeName: n2") {
        doc.replace("198.18.1.", "198.18.2.")
            .replace("2001:db8:1::", "2001:db8:1:2::")
            .replace("198.19.1.", "198.19.2.")
    } else {
        doc.to_string()
    }
}

proptest! {
    #[test]
    fn a_node_following_its_own_pods_compiles_what_the_whole_cluster_gives(
        changes in proptest::collection::vec(change(), 1..24),
        snoop in any::<bool>(),
    ) {
        let node = node_config(snoop);
        let mut full = ClusterView::default();
        let mut partial = ClusterView::default();
        // The current document of every pod of the cluster (to widen the partial view).
        let mut pods: BTreeMap<ObjectKey, String> = BTreeMap::new();
        let mut wide = false;
        let mut dns = DnsAnswers::new();
        let mut host = HostLinks::default();
        let mut cache = CompileCache::default();
        for (step, c) in changes.iter().enumerate() {
            let local = |doc: &str| doc.contains("nodeName: n1");
            match c {
                Change::Put(doc) => {
                    let doc = own_range(doc);
                    put(&mut full, &doc);
                    match key_of(&doc).filter(|k| k.kind == egressd::api::Kind::Pod) {
                        Some(key) => {
                            pods.insert(key.clone(), doc.clone());
                            if wide || local(&doc) {
                                put(&mut partial, &doc);
                            } else {
                                // Out of the watch's selection: the watch says deleted.
                                partial.remove(&key);
                            }
                        }
                        None => put(&mut partial, &doc),
                    }
                }
                Change::Remove(doc) => {
                    if let Some(key) = key_of(doc) {
                        full.remove(&key);
                        partial.remove(&key);
                        pods.remove(&key);
                    }
                }
                Change::Dns(name, addrs) => {
                    dns.insert(name.clone(), answer(addrs));
                }
                Change::Links(i) => host = links(*i),
            }
            // The source replaces its pod watch when the need changes; the new list
            // replaces the pods.
            let need = partial.needs_cluster_pods("n1");
            prop_assert_eq!(need, full.needs_cluster_pods("n1"));
            if need != wide {
                wide = need;
                for (key, doc) in &pods {
                    if wide {
                        put(&mut partial, doc);
                    } else if !local(doc) {
                        partial.remove(key);
                    }
                }
            }
            let cached = compile_cached(&partial, &node, &dns, &host, &mut cache);
            let fresh = compile_cached(&full, &node, &dns, &host, &mut CompileCache::default());
            prop_assert_eq!(cached, fresh, "step {} (cluster pods followed: {}): {:?}", step, wide, c);
        }
    }
}

/// The files of a directory state: file name → documents.
type Files = BTreeMap<usize, Vec<String>>;

#[derive(Debug, Clone)]
enum FileChange {
    /// Write file `n` with these documents (in place, or by rename as editors do).
    Write(usize, Vec<String>, bool),
    /// Edit one document of file `n` in place (like `sed -i` on one object).
    Edit(usize, usize, String),
    /// Delete file `n`.
    Delete(usize),
}

fn file_change() -> impl Strategy<Value = FileChange> {
    prop_oneof![
        4 => (0usize..3, proptest::collection::vec(file_document(), 0..5), any::<bool>())
            .prop_map(|(n, d, r)| FileChange::Write(n, d, r)),
        4 => (0usize..3, 0usize..5, file_document()).prop_map(|(n, i, d)| FileChange::Edit(n, i, d)),
        1 => (0usize..3).prop_map(FileChange::Delete),
    ]
}

fn write_file(dir: &std::path::Path, n: usize, docs: &[String], rename: bool) {
    let text: String = docs.iter().map(|d| format!("---\n{d}")).collect();
    let path = dir.join(format!("f{n}.yaml"));
    if rename {
        let tmp = dir.join(format!(".f{n}.yaml.tmp"));
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, &path).unwrap();
    } else {
        std::fs::write(&path, text).unwrap();
    }
}

proptest! {
    #[test]
    fn the_manifests_source_gives_what_a_fresh_start_gives(
        changes in proptest::collection::vec(file_change(), 1..16),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let mut files: Files = BTreeMap::new();
        let mut source = ManifestSource::new(dir.path());
        source.load().unwrap();
        // Reads only the file a watch event would name.
        let mut watched = ManifestSource::new(dir.path());
        watched.load().unwrap();
        for (step, c) in changes.iter().enumerate() {
            let named = match c {
                FileChange::Write(n, ..) | FileChange::Edit(n, ..) | FileChange::Delete(n) => {
                    dir.path().join(format!("f{n}.yaml"))
                }
            };
            match c {
                FileChange::Write(n, docs, rename) => {
                    write_file(dir.path(), *n, docs, *rename);
                    files.insert(*n, docs.clone());
                }
                FileChange::Edit(n, i, doc) => {
                    let docs = files.entry(*n).or_default();
                    if docs.is_empty() {
                        docs.push(doc.clone());
                    } else {
                        let i = i % docs.len();
                        docs[i] = doc.clone();
                    }
                    let docs = docs.clone();
                    write_file(dir.path(), *n, &docs, true);
                }
                FileChange::Delete(n) => {
                    if files.remove(n).is_some() {
                        std::fs::remove_file(dir.path().join(format!("f{n}.yaml"))).unwrap();
                    }
                }
            }
            let full = source.load().unwrap();
            let part = watched.load_changed(&std::collections::BTreeSet::from([named])).unwrap();
            prop_assert_eq!(source.view(), watched.view(), "step {}: {:?}: reading the named file only", step, c);
            prop_assert_eq!(full, part, "step {}: {:?}: the report of reading the named file only", step, c);
            // A restarted agent: a fresh source, plus the last good versions the running
            // one would have saved. Not while a file is not YAML: the running source
            // keeps the objects it had from it, which a fresh start cannot know.
            if files.values().flatten().any(|d| d == NOT_YAML) {
                continue;
            }
            let mut fresh = ManifestSource::new(dir.path());
            fresh.load().unwrap();
            fresh.view_mut().adopt_last_good(&source.view().kept_last_good());
            prop_assert_eq!(source.view(), fresh.view(), "step {}: {:?}", step, c);
            // And what both compile to is the same.
            let node = node_config(true);
            let a = compile_cached(source.view(), &node, &DnsAnswers::new(), &links(1), &mut CompileCache::default());
            let b = compile_cached(fresh.view(), &node, &DnsAnswers::new(), &links(1), &mut CompileCache::default());
            prop_assert_eq!(a, b);
        }
    }
}
