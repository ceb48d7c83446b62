//! The table sent over nf_tables netlink without `nft` (`ElementWriter::replace`, the
//! agent's full sync) is the table `nft -f` loads from the rendered script (root
//! required): random EgressFirewalls (CIDR, nodeSelector and `dnsName` rules, both
//! families, ports, pods in both families), compiled, sent one way in one
//! network namespace and the other way in another, then compared as `nft -j list`
//! shows them (rules expression for expression, sets with their elements, chains with
//! their hooks). What the netlink path does not write is refused before anything is
//! sent, and a batch the kernel refuses names the message it refused and changes
//! nothing.

mod netns;

use egressd::api::parse::{Parsed, parse_document, split_documents, yaml_to_value};
use egressd::compile::{NodeConfig, compile};
use egressd::dataplane::elements::ElementWriter;
use egressd::dns::{DnsAnswers, Resolved};
use egressd::nft::{Chain, Table};
use egressd::view::ClusterView;
use netns::Netns;
use proptest::prelude::*;

fn pick<T: Clone + std::fmt::Debug + 'static>(items: &[T]) -> impl Strategy<Value = T> + use<T> {
    proptest::sample::select(items.to_vec())
}

fn rule() -> impl Strategy<Value = String> {
    let to = prop_oneof![
        4 => pick(&["192.0.2.0/24", "192.0.2.0/25", "192.0.2.128/25", "198.51.100.7/32", "203.0.113.0/24", "0.0.0.0/0",
                    "::/0", "2001:db8::/64", "2001:db8::/65", "2001:db8:1::/48"])
            .prop_map(|c| format!("{{cidrSelector: \"{c}\"}}")),
        1 => pick(&["api.example.com", "*.example.com"]).prop_map(|d| format!("{{dnsName: \"{d}\"}}")),
        1 => Just("{nodeSelector: {matchLabels: {role: gw}}}".to_string()),
    ];
    let ports = pick(&[
        "",
        "",
        ", ports: [{protocol: TCP, port: 443}]",
        ", ports: [{protocol: UDP, port: 53}, {protocol: TCP, port: 53}]",
        ", ports: [{protocol: SCTP, port: 9}]",
    ]);
    (pick(&["Allow", "Deny"]), to, ports).prop_map(|(t, to, p)| format!("  - {{type: {t}, to: {to}{p}}}\n"))
}

fn documents() -> impl Strategy<Value = String> {
    (proptest::collection::vec(rule(), 0..14), proptest::collection::vec(rule(), 0..6)).prop_map(|(a, b)| {
        let fw = |ns: &str, rules: &[String]| {
            format!(
                "---\napiVersion: k8s.ovn.org/v1\nkind: EgressFirewall\nmetadata: {{name: default, namespace: {ns}}}\nspec:\n  egress:{}",
                if rules.is_empty() { " []\n".to_string() } else { format!("\n{}", rules.concat()) }
            )
        };
        format!(
            "apiVersion: v1\nkind: Node\nmetadata: {{name: gw, labels: {{role: gw}}}}\nstatus: {{addresses: [{{type: InternalIP, address: 203.0.113.2}}, {{type: InternalIP, address: \"2001:db8:ff::2\"}}]}}\n\
             ---\napiVersion: v1\nkind: Pod\nmetadata: {{name: p, namespace: a}}\nspec: {{nodeName: n1}}\nstatus: {{phase: Running, podIPs: [{{ip: 198.18.1.2}}, {{ip: \"2001:db8:1::2\"}}]}}\n\
             ---\napiVersion: v1\nkind: Pod\nmetadata: {{name: q, namespace: b}}\nspec: {{nodeName: n1}}\nstatus: {{phase: Running, podIPs: [{{ip: 198.18.1.3}}]}}\n{}{}",
            fw("a", &a),
            fw("b", &b)
        )
    })
}

fn view(docs: &str) -> ClusterView {
    let mut v = ClusterView::default();
    for (_, _, text) in split_documents(docs) {
        if let Ok(Parsed::Object(o)) = parse_document(&yaml_to_value(&text).expect("generated YAML"), "default", true) {
            v.upsert(&o);
        }
    }
    v
}

/// A listing without the order of its objects (what a change in place adds is listed
/// after what was there; a fresh load lists in the script's order) but with each
/// chain's rules in order.
fn in_any_order(mut v: serde_json::Value) -> serde_json::Value {
    if let Some(items) = v["nftables"].as_array_mut() {
        let (mut rules, mut others): (Vec<_>, Vec<_>) = items.drain(..).partition(|i| i.get("rule").is_some());
        others.sort_by_key(|i| i.to_string());
        rules.sort_by_key(|r| r["rule"]["chain"].to_string());
        items.extend(others);
        items.extend(rules);
    }
    v
}

/// Send `table` over netlink in `ns`.
fn replace(ns: &Netns, table: Table) -> std::io::Result<()> {
    ns.run(move || ElementWriter::open(&table.name)?.replace(&table))
}

/// Load `table` with `nft -f` in `ns`.
fn nft_load(ns: &Netns, table: &Table) {
    let script = std::env::temp_dir().join(format!("egressd-wire-{}-{}.nft", std::process::id(), ns.name));
    std::fs::write(&script, table.render()).unwrap();
    let (ok, out) = ns.try_exec(&["nft", "-f", script.to_str().unwrap()]);
    let _ = std::fs::remove_file(&script);
    assert!(ok, "nft -f refused the table:\n{out}\n{}", table.render());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(40))]
    #[test]
    fn a_table_sent_over_netlink_lists_as_the_one_nft_loads(docs in documents(), twice in any::<bool>()) {
        netns::require_root();
        let node = NodeConfig::new("n1", vec!["198.18.0.0/16".parse().unwrap(), "2001:db8:1::/48".parse().unwrap()]);
        let resolved = Resolved {
            addresses: ["192.0.2.7", "192.0.2.9", "2001:db8::7"].iter().map(|a| a.parse().unwrap()).collect(),
            ttl: std::time::Duration::from_secs(3000),
        };
        let dns = DnsAnswers::from([("api.example.com.".to_string(), resolved)]);
        let table: Table = (*compile(&view(&docs), &node, &dns).table).clone();
        let (wire, text) = (Netns::new("wire"), Netns::new("text"));
        if twice {
            // Replacing a table that exists (the agent's resync) gives the same.
            replace(&wire, table.clone()).unwrap();
        }
        let sent = replace(&wire, table.clone());
        prop_assert!(sent.is_ok(), "netlink replace failed: {:?}\n{}", sent, table.render());
        nft_load(&text, &table);
        prop_assert_eq!(wire.table_json("egressd"), text.table_json("egressd"), "{}", table.render());
    }
}

/// The handle of table `inet <name>` (a full replace makes a new table, with a new
/// handle; a change in place keeps it).
fn table_handle(ns: &Netns, name: &str) -> u64 {
    let v: serde_json::Value =
        serde_json::from_str(&ns.exec(&["nft", "-j", "list", "table", "inet", name])).expect("nft -j");
    v["nftables"]
        .as_array()
        .and_then(|items| items.iter().find_map(|i| i["table"]["handle"].as_u64()))
        .expect("a table handle")
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(40))]
    /// A change between two compiled tables sent over netlink in place (new, changed
    /// and removed namespaces' chains, rules and sets, pod map elements) gives the
    /// table `nft` loads afresh.
    #[test]
    fn a_change_sent_over_netlink_gives_the_table_nft_loads(first in documents(), second in documents()) {
        netns::require_root();
        let node = NodeConfig::new("n1", vec!["198.18.0.0/16".parse().unwrap(), "2001:db8:1::/48".parse().unwrap()]);
        let old: Table = (*compile(&view(&first), &node, &DnsAnswers::new()).table).clone();
        // Namespace `b` gone in the second table (its chain and sets deleted).
        let second = second.replace("namespace: b", "namespace: c");
        let new: Table = (*compile(&view(&second), &node, &DnsAnswers::new()).table).clone();
        let (wire, text) = (Netns::new("wire-delta"), Netns::new("text-delta"));
        replace(&wire, old.clone()).unwrap();
        let handle = table_handle(&wire, "egressd");
        let sent = wire.run({
            let (old, new) = (old.clone(), new.clone());
            move || ElementWriter::open("egressd")?.apply_changes(&old, &new)
        });
        prop_assert!(sent.is_ok(), "netlink change failed: {:?}\n{}\n{}", sent, old.render(), new.render());
        // In place unless nft too would replace the table (a set's declaration changed).
        let structural = egressd::nft::diff(&old, &new).is_some_and(|script| script.contains("delete table"));
        prop_assert_eq!(table_handle(&wire, "egressd") == handle, !structural, "changed in place iff not structural");
        nft_load(&text, &new);
        prop_assert_eq!(
            in_any_order(wire.table_json("egressd")),
            in_any_order(text.table_json("egressd")),
            "{}\n{}",
            old.render(),
            new.render()
        );
    }
}

#[test]
fn what_the_netlink_path_does_not_write_is_refused_before_sending() {
    netns::require_root();
    let ns = Netns::new("wire-unsupported");
    let mut table = Table::new("egressd");
    table.chains.insert(
        "a".into(),
        Chain::base(
            egressd::nft::Hook { chain_type: "filter", hook: "forward", priority: "filter" },
            vec!["ip daddr 192.0.2.0/24 counter accept".into(), "ip dscp set 8 accept".into()],
        ),
    );
    let err = replace(&ns, table).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::Unsupported);
    assert!(err.to_string().contains("chain a rule 1 (ip dscp set 8 accept)"), "{err}");
    assert!(!ns.has_table("egressd"), "nothing was sent");
}

#[test]
fn a_refused_batch_names_the_message_and_changes_nothing() {
    netns::require_root();
    let ns = Netns::new("wire-refused");
    let mut good = Table::new("egressd");
    good.chains.insert(
        "a".into(),
        Chain::base(
            egressd::nft::Hook { chain_type: "filter", hook: "forward", priority: "filter" },
            vec!["ip daddr 192.0.2.0/24 counter accept".into()],
        ),
    );
    replace(&ns, good.clone()).unwrap();
    let before = ns.table_json("egressd");
    let mut bad = good.clone();
    bad.chains.insert(
        "b".into(),
        Chain::base(
            egressd::nft::Hook { chain_type: "filter", hook: "forward", priority: "filter" },
            vec!["ip daddr @missing accept".into()],
        ),
    );
    let err = replace(&ns, bad).unwrap_err();
    assert!(err.to_string().contains("chain b rule 0 (ip daddr @missing accept)"), "{err}");
    assert_eq!(ns.table_json("egressd"), before, "the refused transaction changed nothing");
    // The socket is usable again after the error (its replies were all read).
    assert!(replace(&ns, good).is_ok());
}

/// Every rule shape of the golden tables that the netlink path writes is written as
/// `nft` writes it: `nft --debug=netlink` prints the expressions it generates for the
/// rendered table, chain by chain and rule by rule.
#[test]
fn expressions_are_the_ones_nft_generates() {
    netns::require_root();
    let ns = Netns::new("wire-debug");
    let docs = [
        "apiVersion: v1\nkind: Node\nmetadata: {name: gw, labels: {role: gw}}\nstatus: {addresses: [{type: InternalIP, address: 203.0.113.2}]}",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: a}\nspec: {nodeName: n1}\nstatus: {phase: Running, podIPs: [{ip: 198.18.1.2}, {ip: \"2001:db8:1::2\"}]}",
        "apiVersion: k8s.ovn.org/v1\nkind: EgressFirewall\nmetadata: {name: default, namespace: a}\nspec:\n  egress:\n  - {type: Allow, to: {cidrSelector: 192.0.2.0/25}, ports: [{protocol: TCP, port: 443}]}\n  - {type: Deny, to: {cidrSelector: 198.51.100.0/24}}\n  - {type: Allow, to: {dnsName: api.example.com}, ports: [{protocol: UDP, port: 53}]}\n  - {type: Allow, to: {cidrSelector: 203.0.113.0/24}, ports: [{protocol: UDP, port: 53}, {protocol: TCP, port: 53}]}\n  - {type: Allow, to: {nodeSelector: {matchLabels: {role: gw}}}}\n  - {type: Deny, to: {cidrSelector: \"2001:db8::/32\"}}\n  - {type: Deny, to: {cidrSelector: 0.0.0.0/0}}",
    ]
    .join("\n---\n");
    let docs = docs.as_str();
    let node = NodeConfig::new("n1", vec!["198.18.0.0/16".parse().unwrap(), "2001:db8:1::/48".parse().unwrap()]);
    let table = compile(&view(docs), &node, &DnsAnswers::new()).table;
    let script = std::env::temp_dir().join(format!("egressd-wire-debug-{}.nft", std::process::id()));
    std::fs::write(&script, table.render()).unwrap();
    let out = ns.exec(&["nft", "--debug=netlink", "-c", "-f", script.to_str().unwrap()]);
    let _ = std::fs::remove_file(&script);
    // nft prints each rule as `inet <table> <chain>` and its expressions, in the
    // order of the script (regular chains, then base chains, each in name order).
    let mut printed: Vec<(String, Vec<String>)> = Vec::new();
    for line in out.lines() {
        if let Some(chain) = line.strip_prefix("inet egressd ") {
            printed.push((chain.to_string(), Vec::new()));
        } else if line.starts_with("  [")
            && let Some(last) = printed.last_mut()
        {
            last.1.push(line.trim().to_string());
        }
    }
    let regular = table.chains.iter().filter(|(_, c)| c.hook.is_none());
    let base = table.chains.iter().filter(|(_, c)| c.hook.is_some());
    let ours: Vec<(String, Vec<String>)> = regular
        .chain(base)
        .flat_map(|(name, c)| c.rules.iter().map(move |r| (name.to_string(), egressd::nft::wire_debug(r).unwrap())))
        .collect();
    assert!(ours.len() >= 8, "the table has rules of every kind: {}", table.render());
    assert_eq!(ours, printed, "{}", table.render());
}
