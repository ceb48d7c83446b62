//! The health listener of a running agent: /healthz, /readyz with named reasons, the
//! prerequisite checks (and --manage-sysctls), /metrics moving with the work done.

mod netns;

use std::time::Duration;

use netns::{Topology, http_get, wait_for};

const HEALTH: &str = "127.0.0.1:9780";

fn metric(body: &str, name: &str) -> f64 {
    body.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{name} not in:\n{body}"))
}

#[test]
fn readiness_names_missing_prerequisites_and_metrics_follow_the_work() {
    let t = Topology::new(&["team-a"]);
    t.set_firewall("team-a", "  - {type: Deny, to: {cidrSelector: 203.0.113.0/24}}\n");
    // A node without forwarding: alive but not ready, with the reason.
    t.node.sysctl("net.ipv4.ip_forward", "0");
    let mut agent = t.start_agent("first");
    let (code, body) = http_get(&t.node, HEALTH, "/healthz").expect("healthz");
    assert_eq!((code, body.as_str()), (200, "ok\n"));
    let (code, body) = http_get(&t.node, HEALTH, "/readyz").unwrap();
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("net.ipv4.ip_forward: is 0, needs 1"), "{body}");
    assert!(agent.log_text().contains("prerequisite NOT met"), "{}", agent.log_text());
    assert_eq!(agent.stop(), Some(0));

    // --manage-sysctls fixes it: ready.
    let agent = t.start_agent_with("second", &["--manage-sysctls"]);
    let ready =
        wait_for(Duration::from_secs(5), || http_get(&t.node, HEALTH, "/readyz").is_some_and(|(c, _)| c == 200));
    assert!(ready.is_some(), "{:?}\n{}", http_get(&t.node, HEALTH, "/readyz"), agent.log_text());
    assert_eq!(t.node.exec(&["sysctl", "-n", "net.ipv4.ip_forward"]).trim(), "1");

    // Metrics move with the work done.
    let (_, m) = http_get(&t.node, HEALTH, "/metrics").unwrap();
    let rules = metric(&m, "egressd_nft_rules");
    assert!(rules > 0.0);
    assert_eq!(metric(&m, "egressd_sync_duration_seconds_count{type=\"Full\"}"), 1.0);
    assert_eq!(metric(&m, "egressd_objects{kind=\"EgressFirewall\",valid=\"true\"}"), 1.0);
    assert!(metric(&m, "egressd_last_sync_timestamp_seconds") > 1.7e9);
    t.set_firewall(
        "team-a",
        "  - {type: Deny, to: {cidrSelector: 203.0.113.0/24}}\n  - {type: Allow, to: {cidrSelector: 192.0.2.0/24}}\n",
    );
    let moved = wait_for(Duration::from_secs(3), || {
        let (_, m) = http_get(&t.node, HEALTH, "/metrics").unwrap();
        m.contains("egressd_sync_duration_seconds_count{type=\"Partial\"} 1")
            && metric(&m, "egressd_nft_rules") == rules + 1.0
    });
    assert!(moved.is_some(), "{}", http_get(&t.node, HEALTH, "/metrics").unwrap().1);
    // An invalid version counts as invalid (the last good one stays applied).
    t.set_firewall("team-a", "  - {type: Deny, to: {cidrSelector: 203.0.113.0/33}}\n");
    let invalid = wait_for(Duration::from_secs(3), || {
        let (_, m) = http_get(&t.node, HEALTH, "/metrics").unwrap();
        m.contains("egressd_objects{kind=\"EgressFirewall\",valid=\"false\"} 1")
    });
    assert!(invalid.is_some());
}
