//! The compiled table is accepted by the kernel: random EgressFirewalls (CIDR,
//! nodeSelector and `dnsName` rules with ports, both families, logged and audited
//! namespaces) and an EgressQoS, compiled and checked with `nft -c` in a network
//! namespace (root required). What the rules do to packets is checked by the netns
//! tests (`tests/explain_netns.rs`: random rules against real packets).

mod netns;

use egressd::api::parse::{Parsed, parse_document, split_documents, yaml_to_value};
use egressd::compile::{NodeConfig, compile};
use egressd::dns::targets::SnoopSettings;
use egressd::dns::{DnsAnswers, Resolved};
use egressd::view::ClusterView;
use netns::Netns;
use proptest::prelude::*;

fn pick<T: Clone + std::fmt::Debug + 'static>(items: &[T]) -> impl Strategy<Value = T> + use<T> {
    proptest::sample::select(items.to_vec())
}

fn rule() -> impl Strategy<Value = String> {
    let to = prop_oneof![
        4 => pick(&["192.0.2.0/24", "192.0.2.0/25", "192.0.2.128/25", "198.51.100.7/32", "0.0.0.0/0", "::/0", "2001:db8::/64", "2001:db8::/65"])
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
    (
        proptest::collection::vec(rule(), 0..14),
        proptest::collection::vec(rule(), 0..6),
        pick(&["", "  annotations: {k8s.ovn.org/acl-logging: '{\"deny\": \"alert\", \"allow\": \"info\"}'}\n"]),
        pick(&["", ", annotations: {egressd.io/audit: \"true\"}"]),
    )
        .prop_map(|(a, b, logging, audit)| {
            let fw = |ns: &str, rules: &[String], extra: &str| {
                format!(
                    "---\napiVersion: k8s.ovn.org/v1\nkind: EgressFirewall\nmetadata: {{name: default, namespace: {ns}{extra}}}\nspec:\n  egress:{}",
                    if rules.is_empty() { " []\n".to_string() } else { format!("\n{}", rules.concat()) }
                )
            };
            format!(
                "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: a\n{logging}\
                 ---\napiVersion: v1\nkind: Node\nmetadata: {{name: gw, labels: {{role: gw}}}}\nstatus: {{addresses: [{{type: InternalIP, address: 203.0.113.2}}, {{type: InternalIP, address: \"2001:db8:ff::2\"}}]}}\n\
                 ---\napiVersion: v1\nkind: Pod\nmetadata: {{name: p, namespace: a}}\nspec: {{nodeName: n1}}\nstatus: {{phase: Running, podIPs: [{{ip: 198.18.1.2}}, {{ip: \"2001:db8:1::2\"}}]}}\n\
                 ---\napiVersion: v1\nkind: Pod\nmetadata: {{name: q, namespace: b}}\nspec: {{nodeName: n1}}\nstatus: {{phase: Running, podIPs: [{{ip: 198.18.1.3}}]}}\n\
                 ---\napiVersion: k8s.ovn.org/v1\nkind: EgressQoS\nmetadata: {{name: default, namespace: b}}\nspec:\n  egress:\n  - {{dscp: 46, dstCIDR: 192.0.2.0/24}}\n{}{}",
                fw("a", &a, ""),
                fw("b", &b, audit)
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

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    #[test]
    fn compiled_tables_pass_nft_check(docs in documents(), snoop in any::<bool>()) {
        netns::require_root();
        let node = NodeConfig::new("n1", vec!["198.18.0.0/16".parse().unwrap(), "2001:db8:1::/48".parse().unwrap()])
            .with_snoop(snoop.then(|| SnoopSettings { group: 4747, servers: vec![], rate: 10_000 }));
        let resolved = Resolved {
            addresses: ["192.0.2.7", "2001:db8::7"].iter().map(|a| a.parse().unwrap()).collect(),
            ttl: std::time::Duration::from_secs(30),
        };
        let dns = DnsAnswers::from([("api.example.com.".to_string(), resolved)]);
        let table = compile(&view(&docs), &node, &dns).table;
        let ns = Netns::new("enc");
        let script = std::env::temp_dir().join(format!("egressd-enc-{}.nft", std::process::id()));
        std::fs::write(&script, table.render()).unwrap();
        let (ok, out) = ns.try_exec(&["nft", "-c", "-f", script.to_str().unwrap()]);
        let _ = std::fs::remove_file(&script);
        prop_assert!(ok, "nft -c refused the table:\n{}\n{}", out, table.render());
    }
}
