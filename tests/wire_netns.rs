//! The table sent over nf_tables netlink without `nft` (`ElementWriter::replace`, the
//! agent's full sync) is the table `nft -f` loads from the rendered script (root
//! required): random EgressFirewalls (CIDR, nodeSelector and `dnsName` rules, both
//! families, ports, pods in both families), compiled, sent one way in one
//! network namespace and the other way in another, then compared as `nft -j list`
//! shows them (rules expression for expression, sets with their elements, chains with
//! their hooks). A table the kernel does not have is created in stages (here down to a
//! transaction per rule) and lists the same; one that exists is replaced in one
//! transaction. What the netlink path does not write is refused before anything is
//! sent, and a batch the kernel refuses names the message it refused and changes
//! nothing (a table refused while it was created in stages is deleted again).

#[path = "support/golden_case.rs"]
mod golden_case;
mod netns;

use egressd::api::parse::{Parsed, parse_document, split_documents, yaml_to_value};
use egressd::compile::{NodeConfig, compile};
use egressd::dataplane::elements::ElementWriter;
use egressd::dns::{DnsAnswers, Resolved};
use egressd::nft::rule::parse_all;
use egressd::nft::{Chain, Table};
use egressd::view::ClusterView;
use netns::Netns;
use proptest::prelude::*;
use std::collections::BTreeMap;

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
    ns.run(move || ElementWriter::open(&table.name)?.replace(&table, &[]))
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

/// Send `table` over netlink in `ns` with `stage_bytes` per transaction of a table
/// created in stages; how many transactions committed (the ruleset's generations).
fn replace_staged(ns: &Netns, table: Table, stage_bytes: usize) -> std::io::Result<u32> {
    ns.run(move || {
        let mut writer = ElementWriter::open(&table.name)?.with_stage_bytes(stage_bytes);
        let before = writer.generation()?;
        writer.replace(&table, &[])?;
        Ok(writer.generation()?.wrapping_sub(before))
    })
}

/// The rules of `table`'s regular chains.
fn regular_rules(table: &Table) -> u32 {
    table.chains.values().filter(|c| c.hook.is_none()).map(|c| c.rules.len() as u32).sum()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    /// A new table created in stages, here a transaction per regular chain's rule (the
    /// agent's first sync of a large table), lists as the one `nft` loads; a table that
    /// exists is still replaced in one transaction.
    #[test]
    fn a_table_created_in_stages_lists_as_the_one_nft_loads(docs in documents()) {
        netns::require_root();
        let node = NodeConfig::new("n1", vec!["198.18.0.0/16".parse().unwrap(), "2001:db8:1::/48".parse().unwrap()]);
        let table: Table = (*compile(&view(&docs), &node, &DnsAnswers::new()).table).clone();
        let (wire, text) = (Netns::new("wire-staged"), Netns::new("text-staged"));
        let commits = replace_staged(&wire, table.clone(), 1);
        prop_assert!(commits.is_ok(), "staged creation failed: {:?}\n{}", commits, table.render());
        // The first transaction ends with the first regular rule, each rule after it is
        // one, and the base chains are the last.
        prop_assert_eq!(commits.unwrap(), regular_rules(&table) + 1, "{}", table.render());
        nft_load(&text, &table);
        prop_assert_eq!(wire.table_json("egressd"), text.table_json("egressd"), "{}", table.render());
        prop_assert_eq!(replace_staged(&wire, table.clone(), 1).unwrap(), 1, "an existing table: one transaction");
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
            move || ElementWriter::open("egressd")?.apply_changes(&egressd::nft::Comparison::of(&old, &new))
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
            parse_all(["ip daddr 192.0.2.0/24 counter accept", "ip daddr { 192.0.2.1, 192.0.2.3 } accept"]).unwrap(),
        ),
    );
    let err = replace(&ns, table).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::Unsupported);
    assert!(err.to_string().contains("chain a rule 1 (ip daddr { 192.0.2.1, 192.0.2.3 } accept)"), "{err}");
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
            parse_all(["ip daddr 192.0.2.0/24 counter accept"]).unwrap(),
        ),
    );
    replace(&ns, good.clone()).unwrap();
    let before = ns.table_json("egressd");
    let mut bad = good.clone();
    bad.chains.insert(
        "b".into(),
        Chain::base(
            egressd::nft::Hook { chain_type: "filter", hook: "forward", priority: "filter" },
            parse_all(["ip daddr @missing accept"]).unwrap(),
        ),
    );
    let err = replace(&ns, bad).unwrap_err();
    assert!(err.to_string().contains("chain b rule 0 (ip daddr @missing accept)"), "{err}");
    assert_eq!(ns.table_json("egressd"), before, "the refused transaction changed nothing");
    // The socket is usable again after the error (its replies were all read).
    assert!(replace(&ns, good).is_ok());
}

#[test]
fn a_table_created_in_stages_and_refused_is_deleted() {
    netns::require_root();
    let ns = Netns::new("wire-staged-refused");
    let hook = egressd::nft::Hook { chain_type: "filter", hook: "forward", priority: "filter" };
    let mut table = Table::new("egressd");
    table.chains.insert(
        "fw-a".into(),
        Chain::regular(parse_all(["ip daddr 192.0.2.0/24 counter accept", "ip daddr 192.0.2.7 counter drop"]).unwrap()),
    );
    table.chains.insert("a".into(), Chain::base(hook, parse_all(["jump fw-a", "ip daddr @missing accept"]).unwrap()));
    let err = replace_staged(&ns, table, 1).unwrap_err();
    assert!(err.to_string().contains("chain a rule 1 (ip daddr @missing accept)"), "{err}");
    // Two transactions of regular rules had committed: the partial table is gone.
    assert!(!ns.has_table("egressd"), "{}", ns.nft_list());
}

/// The rules of a rendered table, by chain, in order (hook lines left out).
fn rendered_rules(text: &str) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut chain: Option<String> = None;
    for line in text.lines() {
        if let Some(name) = line.strip_prefix("\tchain ").and_then(|l| l.strip_suffix(" {")) {
            chain = Some(name.to_string());
            out.entry(name.to_string()).or_default();
        } else if line == "\t}" {
            chain = None;
        } else if let (Some(c), Some(rule)) = (&chain, line.strip_prefix("\t\t"))
            && !rule.starts_with("type ")
        {
            out.get_mut(c).unwrap().push(rule.to_string());
        }
    }
    out
}

/// The expressions `nft --debug=netlink` generates for each rule of the script `text`
/// (checked, not loaded, in `ns`), by chain, in order.
fn nft_expressions(ns: &Netns, text: &str) -> BTreeMap<String, Vec<Vec<String>>> {
    let script = std::env::temp_dir().join(format!("egressd-wire-debug-{}.nft", std::process::id()));
    std::fs::write(&script, text).unwrap();
    let out = ns.exec(&["nft", "--debug=netlink", "-c", "-f", script.to_str().unwrap()]);
    let _ = std::fs::remove_file(&script);
    // nft prints each rule as `inet <table> <chain>` and its expressions.
    let mut printed: BTreeMap<String, Vec<Vec<String>>> = BTreeMap::new();
    let mut last: Option<String> = None;
    for line in out.lines() {
        if let Some(chain) = line.strip_prefix("inet egressd ") {
            printed.entry(chain.to_string()).or_default().push(Vec::new());
            last = Some(chain.to_string());
        } else if line.starts_with("  [")
            && let Some(rule) = last.as_ref().and_then(|c| printed.get_mut(c)).and_then(|r| r.last_mut())
        {
            rule.push(line.trim().to_string());
        } else if !line.starts_with("  ") {
            last = None;
        }
    }
    printed
}

/// Compare the netlink path's expressions with nft's for every rule of the rendered
/// table `text` it writes; the rules it refuses, as `chain: rule`.
fn compare_expressions(ns: &Netns, text: &str) -> (usize, Vec<String>) {
    let printed = nft_expressions(ns, text);
    let (mut compared, mut refused) = (0, Vec::new());
    for (chain, rules) in rendered_rules(text) {
        let theirs = printed.get(&chain).cloned().unwrap_or_default();
        assert_eq!(theirs.len(), rules.len(), "chain {chain}: nft printed {theirs:?}\n{text}");
        for (rule, nft) in rules.iter().zip(theirs) {
            match egressd::nft::wire_debug(rule) {
                Ok(ours) => {
                    assert_eq!(ours, nft, "chain {chain}: {rule}");
                    compared += 1;
                }
                Err(_) => refused.push(format!("{chain}: {rule}")),
            }
        }
    }
    (compared, refused)
}

/// Every rule shape the compiler writes for EgressFirewall (CIDR, nodeSelector,
/// `dnsName`, ports, ACL logging), DNS snooping, EgressQoS and EgressIP is written as `nft`
/// writes it: `nft --debug=netlink` prints the expressions it generates for the
/// rendered table, and the netlink path's are compared rule for rule. The golden
/// tables' rules too (EgressIP's marks, steering and NAT among them): none is refused.
#[test]
fn expressions_are_the_ones_nft_generates() {
    netns::require_root();
    let ns = Netns::new("wire-debug");
    let docs = [
        "apiVersion: v1\nkind: Node\nmetadata: {name: gw, labels: {role: gw}}\nstatus: {addresses: [{type: InternalIP, address: 203.0.113.2}]}",
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: b\n  annotations: {k8s.ovn.org/acl-logging: '{\"deny\": \"alert\", \"allow\": \"notice\"}'}",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: a, labels: {app: web}}\nspec: {nodeName: n1}\nstatus: {phase: Running, podIPs: [{ip: 198.18.1.2}, {ip: \"2001:db8:1::2\"}]}",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: q, namespace: b}\nspec: {nodeName: n1}\nstatus: {phase: Running, podIPs: [{ip: 198.18.1.3}]}",
        "apiVersion: k8s.ovn.org/v1\nkind: EgressFirewall\nmetadata: {name: default, namespace: a}\nspec:\n  egress:\n  - {type: Allow, to: {cidrSelector: 192.0.2.0/25}, ports: [{protocol: TCP, port: 443}]}\n  - {type: Deny, to: {cidrSelector: 198.51.100.0/24}}\n  - {type: Allow, to: {dnsName: api.example.com}, ports: [{protocol: UDP, port: 53}]}\n  - {type: Allow, to: {dnsName: \"*.example.com\"}}\n  - {type: Allow, to: {cidrSelector: 203.0.113.0/24}, ports: [{protocol: UDP, port: 53}, {protocol: TCP, port: 53}]}\n  - {type: Allow, to: {nodeSelector: {matchLabels: {role: gw}}}}\n  - {type: Deny, to: {cidrSelector: \"2001:db8::/32\"}}\n  - {type: Deny, to: {cidrSelector: 0.0.0.0/0}}",
        "apiVersion: k8s.ovn.org/v1\nkind: EgressFirewall\nmetadata: {name: default, namespace: b}\nspec:\n  egress:\n  - {type: Allow, to: {cidrSelector: 192.0.2.0/24}, ports: [{protocol: TCP, port: 80}]}\n  - {type: Deny, to: {cidrSelector: 0.0.0.0/0}}",
        "apiVersion: k8s.ovn.org/v1\nkind: EgressQoS\nmetadata: {name: default, namespace: a}\nspec:\n  egress:\n  - {dscp: 46, dstCIDR: 203.0.113.0/24, podSelector: {matchLabels: {app: web}}}\n  - {dscp: 30, dstCIDR: \"2001:db8:ff::/64\"}\n  - {dscp: 10}",
    ]
    .join("\n---\n");
    let mut node = NodeConfig::new("n1", vec!["198.18.0.0/16".parse().unwrap(), "2001:db8:1::/48".parse().unwrap()]);
    node.snoop = Some(egressd::dns::targets::SnoopSettings {
        group: 4747,
        servers: vec!["198.18.0.10".parse().unwrap(), "2001:db8:1::10".parse().unwrap()],
        rate: 10_000,
    });
    let table = compile(&view(&docs), &node, &DnsAnswers::new()).table;
    let text = table.render();
    for shape in [
        "log prefix",
        "limit rate over",
        "ip dscp set",
        "ip6 dscp set",
        "fib saddr",
        "ct original",
        "th sport",
        "meta priority set ip6 saddr map",
        "meta priority vmap",
        "meta priority set none",
    ] {
        assert!(text.contains(shape), "the table has `{shape}`: {text}");
    }
    let (compared, refused) = compare_expressions(&ns, &text);
    assert!(refused.is_empty(), "refused: {refused:#?}");
    assert!(compared >= 40, "{compared} rules compared: {text}");

    let mut refused_golden = Vec::new();
    for case in std::fs::read_dir("tests/golden").unwrap() {
        let expected = std::fs::read_to_string(case.unwrap().path().join("expected.txt")).unwrap();
        let table = expected.split("\n# ").next().unwrap().to_string() + "\n";
        let (n, refused) = compare_expressions(&ns, &table);
        assert!(n > 0, "{table}");
        refused_golden.extend(refused);
    }
    assert!(refused_golden.is_empty(), "refused: {refused_golden:#?}");
}

/// Every golden table (firewall, DNS snooping, EgressQoS, EgressIP's marks, steering and
/// NAT chains, ACL-free and logged) sent over netlink lists as `nft -f` loads it, as a
/// full replace and as the change from the previous case's table.
#[test]
fn golden_tables_sent_over_netlink_list_as_nft_loads_them() {
    netns::require_root();
    let mut cases: Vec<_> = std::fs::read_dir("tests/golden").unwrap().map(|e| e.unwrap().path()).collect();
    cases.sort();
    let (wire, delta, text) = (Netns::new("wire-golden"), Netns::new("delta-golden"), Netns::new("text-golden"));
    let mut previous: Option<Table> = None;
    // Changes that add a base chain without replacing the table (EgressIP's chains when
    // the first EgressIP appears): the sequence must hold at least one.
    let mut base_added_in_place = 0;
    for case in cases {
        let (node, links) = golden_case::case_inputs(&case);
        let (desired, _) = egressd::agent::compile_manifests(&case.join("manifests"), &node, &links).unwrap();
        let table: Table = (*desired.table).clone();
        let sent = replace(&wire, table.clone());
        assert!(sent.is_ok(), "{}: netlink replace failed: {sent:?}", case.display());
        let changed = match previous.replace(table.clone()) {
            None => replace(&delta, table.clone()),
            Some(old) => delta.run({
                let new = table.clone();
                let c = egressd::nft::Comparison::of(&old, &new);
                let added = new.chains.iter().any(|(n, ch)| ch.hook.is_some() && !old.chains.contains_key(n));
                if added && !c.needs_replace() {
                    base_added_in_place += 1;
                }
                move || ElementWriter::open("egressd")?.apply_changes(&egressd::nft::Comparison::of(&old, &new))
            }),
        };
        assert!(changed.is_ok(), "{}: netlink change failed: {changed:?}", case.display());
        text.exec(&["nft", "flush", "ruleset"]);
        nft_load(&text, &table);
        let loaded = text.table_json("egressd");
        assert_eq!(wire.table_json("egressd"), loaded, "{}", case.display());
        assert_eq!(in_any_order(delta.table_json("egressd")), in_any_order(loaded), "{} (change)", case.display());
    }
    assert!(base_added_in_place > 0, "no change between golden cases adds a base chain in place");
}
