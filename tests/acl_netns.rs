//! ACL logging (namespace annotation `k8s.ovn.org/acl-logging`) and audit mode
//! (`egressd.io/audit: "true"` on an EgressFirewall), with the real binary in a node
//! namespace (root required). Topology: `netns::Topology`, pod0 in team-a, pod1 in team-b.

mod netns;

use std::time::Duration;

use netns::{Topology, tcp, wait_for};

fn status_file(t: &Topology) -> String {
    std::fs::read_to_string(t.dir.path().join("state").join("status")).unwrap_or_default()
}

fn events(path: &std::path::Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path).unwrap_or_default().lines().filter_map(|l| serde_json::from_str(l).ok()).collect()
}

fn has(events: &[serde_json::Value], want: &serde_json::Value) -> bool {
    let want = want.as_object().unwrap();
    events.iter().any(|e| want.iter().all(|(k, v)| &e[k] == v))
}

#[test]
fn verdicts_are_logged_as_asked_and_audit_mode_drops_nothing() {
    let t = Topology::new(&["team-a", "team-b"]);
    t.write_manifest(
        "namespaces.yaml",
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: team-a\n  annotations: {k8s.ovn.org/acl-logging: '{\"deny\": \"alert\", \"allow\": \"notice\"}'}\n\
         ---\napiVersion: v1\nkind: Namespace\nmetadata: {name: team-b}\n",
    );
    t.set_firewall(
        "team-a",
        "  - {type: Allow, to: {cidrSelector: 192.0.2.0/24}, ports: [{protocol: TCP, port: 8080}]}\n  - {type: Deny, to: {cidrSelector: 203.0.113.0/24}}\n",
    );
    t.write_manifest(
        "firewall-team-b.yaml",
        "apiVersion: k8s.ovn.org/v1\nkind: EgressFirewall\nmetadata: {name: default, namespace: team-b, annotations: {egressd.io/audit: \"true\"}}\n\
         spec:\n  egress:\n  - {type: Deny, to: {cidrSelector: 203.0.113.0/24}}\n",
    );
    let file = t.dir.path().join("acl.log");
    let agent = t.start_agent_with("agent", &["--acl-log-file", file.to_str().unwrap()]);
    let (p0, p1) = (&t.pods[0], &t.pods[1]);

    // team-a: the allowed connection and the denied one are logged with their rule.
    assert!(tcp(p0, "192.0.2.10", 8080).is_some(), "allowed");
    assert_eq!(tcp(p0, "203.0.113.2", 8080), None, "denied");
    let allow = serde_json::json!({"namespace": "team-a", "pod": "team-a/pod0", "rule": 0, "verdict": "allow",
        "severity": "notice", "protocol": "tcp", "src": "198.18.1.2", "dst": "192.0.2.10", "dport": 8080});
    let deny = serde_json::json!({"namespace": "team-a", "pod": "team-a/pod0", "rule": 1, "verdict": "deny",
        "severity": "alert", "protocol": "tcp", "dst": "203.0.113.2", "dport": 8080});
    let logged = wait_for(Duration::from_secs(5), || has(&events(&file), &allow) && has(&events(&file), &deny));
    assert!(logged.is_some(), "{:?}\n{}", events(&file), agent.log_text());
    assert!(agent.log_text().contains("egress firewall verdict"), "also in the log");

    // team-b, audit mode: the connection its Deny would drop goes through, and the log
    // names the rule that would have dropped it.
    assert_eq!(tcp(p1, "203.0.113.2", 8080).as_deref(), Some("198.18.1.6"), "audit mode drops nothing");
    let audit = serde_json::json!({"namespace": "team-b", "pod": "team-b/pod1", "rule": 0, "verdict": "audit",
        "dst": "203.0.113.2", "dport": 8080});
    assert!(wait_for(Duration::from_secs(5), || has(&events(&file), &audit)).is_some(), "{:?}", events(&file));
    let status = status_file(&t);
    assert!(
        status.contains(
            "node-a: EgressFirewall Rules applied (audit mode: Deny rules log and count, nothing is dropped)"
        ),
        "{status}"
    );
    // One connection, one line (only new connections are logged).
    let before = events(&file).len();
    assert!(tcp(p0, "192.0.2.10", 8080).is_some());
    assert!(wait_for(Duration::from_secs(3), || events(&file).len() == before + 1).is_some(), "{:?}", events(&file));

    // Rule hits as metrics: node totals by verdict for every namespace, per-namespace
    // series only for the namespace with ACL logging (read every 5 s).
    let metric = |text: &str, series: &str| -> u64 {
        text.lines().find_map(|l| l.strip_prefix(series)?.trim().parse::<f64>().ok()).unwrap_or(0.0) as u64
    };
    let mut last = String::new();
    let counted = wait_for(Duration::from_secs(12), || {
        last = netns::http_get(&t.node, "127.0.0.1:9780", "/metrics").map(|(_, b)| b).unwrap_or_default();
        metric(&last, "egressd_firewall_namespace_packets_total{namespace=\"team-a\",verdict=\"deny\"}") >= 1
            && metric(&last, "egressd_firewall_namespace_packets_total{namespace=\"team-a\",verdict=\"allow\"}") >= 1
            && metric(&last, "egressd_firewall_packets_total{verdict=\"audit\"}") >= 1
            && metric(&last, "egressd_firewall_packets_total{verdict=\"deny\"}") >= 1
    });
    assert!(counted.is_some(), "{last}");
    assert!(!last.contains("namespace=\"team-b\""), "team-b has no ACL logging: no series of its own\n{last}");
    assert_eq!(agent.nft_fallbacks(), Vec::<String>::new(), "every sync in-process");

    // An annotation that is not JSON: a warning in the status, and nothing logged.
    t.write_manifest(
        "namespaces.yaml",
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: team-a\n  annotations: {k8s.ovn.org/acl-logging: 'deny=alert'}\n\
         ---\napiVersion: v1\nkind: Namespace\nmetadata: {name: team-b}\n",
    );
    let warned = wait_for(Duration::from_secs(5), || {
        status_file(&t).contains("warning: namespace annotation k8s.ovn.org/acl-logging: invalid JSON")
    });
    assert!(warned.is_some(), "{}", status_file(&t));
    let before = events(&file).len();
    assert_eq!(tcp(p0, "203.0.113.2", 8080), None, "still denied");
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(events(&file).len(), before, "not logged any more: {:?}", events(&file));
}
