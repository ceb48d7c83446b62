//! The bad-input matrix (`tests/conformance/hostile/`): invalid or hostile objects of the
//! four kinds and of Nodes, Pods and Namespaces, each with the layer that refuses it and
//! the message egressd gives (`# layer:`, `# expect:` headers; `\t` stands for a tab).
//! Each is loaded next to a valid namespace policy, alone and all together: the expected
//! message appears (in the object's status, or in the problems for objects without
//! one), the valid policy applies, nothing panics. That an invalid edit never loses the
//! version applied before is proven for every kind by `tests/incremental.rs`.

use std::path::{Path, PathBuf};

use egressd::compile::NodeConfig;
use egressd::net::HostLinks;

struct Case {
    name: String,
    layer: String,
    expect: String,
    body: String,
}

/// The objects too large to keep in the repository, written here.
fn generated(name: &str) -> String {
    let annotation = format!("  annotations:\n    huge: \"{}\"\n", "x".repeat(1 << 20));
    match name {
        "egressfirewall-9000-rules" => {
            let mut s = String::from(
                "apiVersion: k8s.ovn.org/v1\nkind: EgressFirewall\nmetadata: {name: default, namespace: h01}\nspec:\n  egress:\n",
            );
            for i in 0..9000 {
                s.push_str(&format!("  - type: Deny\n    to: {{cidrSelector: 198.51.100.{}/32}}\n", i % 256));
            }
            s
        }
        "egressfirewall-1mb-annotation" => format!(
            "apiVersion: k8s.ovn.org/v1\nkind: EgressFirewall\nmetadata:\n  name: default\n  namespace: h14\n{annotation}spec:\n  egress:\n  - type: Deny\n    to: {{cidrSelector: 198.51.100.0/24}}\n"
        ),
        "pod-1mb-annotation" => format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p-ann\n  namespace: h24\n{annotation}spec: {{nodeName: node-a}}\nstatus:\n  phase: Running\n  podIPs: [{{ip: 198.18.1.10}}]\n"
        ),
        other => panic!("hostile/{other}.yaml says it is generated, but nothing generates it"),
    }
}

fn cases() -> Vec<Case> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/conformance/hostile");
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    paths.sort();
    let mut out = Vec::new();
    for path in paths.into_iter().filter(|p| p.extension().is_some_and(|x| x == "yaml")) {
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        let text = std::fs::read_to_string(&path).unwrap();
        let header = |key: &str| text.lines().find_map(|l| l.strip_prefix(key)).map(str::to_string);
        let layer = header("# layer: ").unwrap_or_else(|| panic!("{name}: no layer"));
        let expect = header("# expect: ").unwrap_or_else(|| panic!("{name}: no expect")).replace("\\t", "\t");
        let body = if header("# generated: ").is_some() { generated(&name) } else { text };
        out.push(Case { name, layer, expect, body });
    }
    out
}

const BASELINE: &str = "apiVersion: v1\nkind: Node\nmetadata: {name: node-a}\nstatus:\n  addresses: [{type: InternalIP, address: 198.19.0.1}]\n\
---\napiVersion: v1\nkind: Namespace\nmetadata: {name: ok}\n\
---\napiVersion: v1\nkind: Pod\nmetadata: {name: p-ok, namespace: ok}\nspec: {nodeName: node-a}\nstatus:\n  phase: Running\n  podIPs: [{ip: 198.18.9.2}]\n\
---\napiVersion: k8s.ovn.org/v1\nkind: EgressFirewall\nmetadata: {name: default, namespace: ok}\nspec:\n  egress:\n  - type: Deny\n    to: {cidrSelector: 203.0.113.0/24}\n";

fn render(files: &[(&str, &str)]) -> String {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("baseline.yaml"), BASELINE).unwrap();
    for (name, body) in files {
        std::fs::write(dir.path().join(format!("{name}.yaml")), body).unwrap();
    }
    let node = NodeConfig::new("node-a", vec!["198.18.0.0/16".parse().unwrap()]);
    egressd::agent::render_manifests(dir.path(), &node, &HostLinks::default()).expect("the directory is readable")
}

fn assert_baseline_applies(out: &str, context: &str) {
    assert!(out.contains("EgressFirewall ok/default\tapplied"), "{context}: the valid policy did not apply:\n{out}");
    assert!(
        out.contains("ip daddr 203.0.113.0/24 counter name \"fw-deny\" counter drop"),
        "{context}: the valid rule is missing:\n{out}"
    );
    assert!(jumps_to(out, "198.18.9.2", "fw-ok"), "{context}: the valid pod is not policed:\n{out}");
}

/// Whether the table text maps the pod address `ip` to its namespace's number and
/// that number to `jump <chain>` (the `fw-pods` and `fw-namespaces` maps).
fn jumps_to(table: &str, ip: &str, chain: &str) -> bool {
    let number = table.split(&format!("{ip} : ")).nth(1).and_then(|rest| rest.split([',', ' ']).next());
    number.is_some_and(|n| table.contains(&format!("{n} : jump {chain}")))
}

#[test]
fn the_matrix_has_forty_cases_over_every_kind_and_layer() {
    let cases = cases();
    assert!(cases.len() >= 40, "{} cases", cases.len());
    for prefix in
        ["egressfirewall-", "egressqos-", "egressip-", "cloudprivateipconfig-", "pod-", "namespace-", "document-"]
    {
        assert!(cases.iter().any(|c| c.name.starts_with(prefix)), "no {prefix} case");
    }
    for c in &cases {
        assert!(
            [
                "manifests",
                "apiserver-discovery",
                "apiserver-schema",
                "apiserver-validation",
                "controller",
                "node",
                "accepted"
            ]
            .contains(&c.layer.as_str()),
            "{}: unknown layer {}",
            c.name,
            c.layer
        );
    }
}

#[test]
fn each_hostile_object_alone_gets_its_message_and_the_valid_policy_applies() {
    for c in cases() {
        let out = render(&[(&c.name, &c.body)]);
        assert!(out.contains(&c.expect), "{} ({}): expected {:?} in:\n{}", c.name, c.layer, c.expect, tail(&out));
        assert_baseline_applies(&out, &c.name);
    }
}

#[test]
fn all_hostile_objects_together_leave_the_valid_policy_in_place() {
    let cases = cases();
    let files: Vec<(&str, &str)> = cases.iter().map(|c| (c.name.as_str(), c.body.as_str())).collect();
    let out = render(&files);
    for c in &cases {
        assert!(out.contains(&c.expect), "{}: expected {:?} among all:\n{}", c.name, c.expect, tail(&out));
    }
    assert_baseline_applies(&out, "all together");
}

fn tail(out: &str) -> &str {
    out.find("# status").map_or(out, |i| &out[i..])
}
