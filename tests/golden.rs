//! Golden files for the compile step: each `tests/golden/<case>/` holds a `manifests/`
//! directory, an `args` file (`node-name:`, `cluster-cidr:`, `service-cidr:`) and
//! `expected.txt`, exactly what `egressd render` prints for them.
//!
//! And for `egressd explain`: each `tests/golden-explain/<case>/` holds `manifests/`,
//! `args`, `dns` (what the agent resolved and what the kernel's sets hold) and `queries`
//! (one `egressd explain` command line each); `expected.txt` is every query followed by
//! what explain prints for it.
//!
//! Regenerate after an intended change, then review the diff like code:
//!
//! ```sh
//! EGRESSD_UPDATE_GOLDEN=1 cargo test --test golden
//! ```

#[path = "support/golden_case.rs"]
mod golden_case;

use std::path::Path;

use egressd::agent::render_manifests;
use egressd::compile::NodeConfig;
use golden_case::{case_inputs, node_config};

/// Compare `got` with the case's `expected.txt` (or write it when updating).
fn compare(case: &Path, got: &str, update: bool, failures: &mut Vec<String>) {
    let expected_path = case.join("expected.txt");
    if update {
        std::fs::write(&expected_path, got).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&expected_path).unwrap_or_default();
    if got != expected {
        failures.push(format!("{}:\n--- expected\n{expected}\n+++ got\n{got}", case.display()));
    }
}

#[test]
fn rendered_output_matches_golden_files() {
    let root = Path::new("tests/golden");
    let update = std::env::var_os("EGRESSD_UPDATE_GOLDEN").is_some();
    let mut cases: Vec<_> =
        std::fs::read_dir(root).unwrap().map(|e| e.unwrap().path()).filter(|p| p.is_dir()).collect();
    cases.sort();
    assert!(cases.len() >= 3, "golden cases missing");
    let mut failures = Vec::new();
    for case in cases {
        let (node, links) = case_inputs(&case);
        let got = render_manifests(&case.join("manifests"), &node, &links).unwrap();
        compare(&case, &got, update, &mut failures);
    }
    assert!(failures.is_empty(), "golden mismatch (EGRESSD_UPDATE_GOLDEN=1 to regenerate):\n{}", failures.join("\n"));
}

/// `dns` lines: `resolved NAME ADDR...` (the agent's answers) and `kernel NAME ADDR...`
/// (the kernel's set); no line of a kind: not known.
fn dns_knowledge(text: &str) -> egressd::explain::DnsKnowledge {
    let mut k = egressd::explain::DnsKnowledge::default();
    for line in text.lines().filter(|l| !l.trim().is_empty() && !l.starts_with('#')) {
        let words: Vec<&str> = line.split_whitespace().collect();
        let addrs: std::collections::BTreeSet<std::net::IpAddr> =
            words[2..].iter().map(|a| a.parse().unwrap()).collect();
        match words[0] {
            "resolved" => {
                let r = egressd::dns::Resolved { addresses: addrs, ttl: std::time::Duration::from_secs(30) };
                k.resolved.get_or_insert_default().insert(words[1].to_string(), r);
            }
            "kernel" => {
                k.kernel.get_or_insert_default().insert(words[1].to_string(), addrs);
            }
            other => panic!("unknown dns line kind {other}"),
        }
    }
    k
}

/// One query line: `--pod NS/NAME | --src IP`, `--to DEST`, optional `-o json`.
fn explain_line(
    line: &str,
    view: &egressd::view::ClusterView,
    node: &NodeConfig,
    dns: &egressd::explain::DnsKnowledge,
) -> String {
    let words: Vec<&str> = line.split_whitespace().collect();
    let arg = |flag: &str| words.iter().position(|w| *w == flag).map(|i| words[i + 1]);
    let query =
        egressd::explain::Query::parse(arg("--pod"), arg("--src").map(|s| s.parse().unwrap()), arg("--to").unwrap());
    match query.and_then(|q| egressd::explain::explain(view, node, dns, &q)) {
        Err(e) => format!("error: {e}\n"),
        Ok(e) if arg("-o") == Some("json") => format!("{}\n", serde_json::to_string_pretty(&e).unwrap()),
        Ok(e) => e.to_string(),
    }
}

#[test]
fn explain_output_matches_golden_files() {
    let root = Path::new("tests/golden-explain");
    let update = std::env::var_os("EGRESSD_UPDATE_GOLDEN").is_some();
    let mut cases: Vec<_> =
        std::fs::read_dir(root).unwrap().map(|e| e.unwrap().path()).filter(|p| p.is_dir()).collect();
    cases.sort();
    assert!(cases.len() >= 2, "golden cases missing");
    let mut failures = Vec::new();
    for case in cases {
        let node = node_config(&std::fs::read_to_string(case.join("args")).unwrap());
        let dns = dns_knowledge(&std::fs::read_to_string(case.join("dns")).unwrap());
        let mut source = egressd::source::manifests::ManifestSource::new(case.join("manifests"));
        let report = source.load().unwrap();
        assert!(report.errors.is_empty(), "{}: {:?}", case.display(), report.errors);
        let mut got = String::new();
        for line in std::fs::read_to_string(case.join("queries")).unwrap().lines() {
            if line.trim().is_empty() || line.starts_with('#') {
                continue;
            }
            got.push_str(&format!("$ egressd explain {line}\n{}\n", explain_line(line, source.view(), &node, &dns)));
        }
        compare(&case, &got, update, &mut failures);
    }
    assert!(failures.is_empty(), "golden mismatch (EGRESSD_UPDATE_GOLDEN=1 to regenerate):\n{}", failures.join("\n"));
}
