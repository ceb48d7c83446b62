//! EgressFirewall enforced by a real egressd process on a node namespace, with pods and
//! an external host in their own namespaces (root required).
//!
//! Topology (one per test, removed on drop):
//!
//! ```text
//!  pod0 198.18.1.2/30 2001:db8:1:1::2/64 ──┐
//!  pod1 198.18.1.6/30 2001:db8:1:2::2/64 ──┤ node (egressd)  eth-ext 203.0.113.1/24 ── ext 203.0.113.2/24
//!  pod2 198.18.1.10/30 2001:db8:1:3::2/64 ─┘                 2001:db8:ff::1/64         2001:db8:ff::2/64
//!                                                                                       192.0.2.10, 198.51.100.10,
//!                                                                                       2001:db8:ff:1::10
//! ```
//! pod0 and pod1 are in namespace `team-a`, pod2 in `team-b`.

mod netns;

use std::net::UdpSocket;
use std::time::Duration;

use netns::{Netns, Topology, pod_v4, pod_v6, tcp, udp, wait_for};

fn rule(kind: &str, to: &str, ports: &[(&str, u16)]) -> String {
    let mut s = format!("  - type: {kind}\n    to: {{{to}}}\n");
    if !ports.is_empty() {
        s.push_str("    ports:\n");
        for (proto, port) in ports {
            s.push_str(&format!("    - {{protocol: {proto}, port: {port}}}\n"));
        }
    }
    s
}

#[test]
fn rules_allow_deny_by_cidr_port_and_order_v4_and_v6() {
    let t = Topology::new(&["team-a", "team-a", "team-b"]);
    let rules = [
        rule("Allow", "cidrSelector: 192.0.2.0/24", &[("TCP", 8080)]),
        rule("Allow", "cidrSelector: 198.51.100.10/32", &[("UDP", 5353)]),
        rule("Deny", "cidrSelector: 192.0.2.10/32", &[]),
        rule("Allow", "cidrSelector: \"2001:db8:ff:1::/64\"", &[("TCP", 8080), ("UDP", 5353)]),
        rule("Deny", "cidrSelector: 0.0.0.0/0", &[]),
        rule("Deny", "cidrSelector: \"::/0\"", &[]),
    ]
    .concat();
    t.set_firewall("team-a", &rules);
    // Another table's chain right after egressd's on the same hook counts the pods'
    // packets, and every packet whose priority is not 0: egressd borrows a pod's packet
    // priority to reach its namespace's chain and must give it back.
    t.node.exec(&[
        "nft",
        "add table inet observer; add counter inet observer seen; add counter inet observer borrowed; \
         add chain inet observer pre { type filter hook prerouting priority 10; }; \
         add rule inet observer pre ip saddr 198.18.1.0/24 counter name seen; \
         add rule inet observer pre ip6 saddr 2001:db8:1::/48 counter name seen; \
         add rule inet observer pre meta priority != none counter name borrowed",
    ]);
    let mut agent = t.start_agent("agent");
    let (p0, p1, p2) = (&t.pods[0], &t.pods[1], &t.pods[2]);

    // Allow with a port: the allowed port passes, another port falls to the Deny below.
    assert_eq!(tcp(p0, "192.0.2.10", 8080).as_deref(), Some("198.18.1.2"), "allowed TCP port");
    assert_eq!(tcp(p0, "192.0.2.10", 9090), None, "other port: rule order → Deny 192.0.2.10");
    // UDP port match, and protocol mismatch.
    assert!(udp(p0, "198.51.100.10", 5353).is_some(), "allowed UDP port");
    assert_eq!(tcp(p0, "198.51.100.10", 8080), None, "TCP to a UDP-only allow → deny-all");
    assert_eq!(udp(p0, "192.0.2.10", 5353), None, "UDP not allowed by a TCP rule");
    // Deny-all catches the rest.
    assert_eq!(tcp(p0, "203.0.113.2", 8080), None, "deny-all v4");
    // IPv6.
    assert!(tcp(p0, "2001:db8:ff:1::10", 8080).is_some(), "allowed v6 TCP");
    assert!(udp(p0, "2001:db8:ff:1::10", 5353).is_some(), "allowed v6 UDP");
    assert_eq!(tcp(p0, "2001:db8:ff::2", 8080), None, "deny-all v6");
    // Same namespace, another pod: same policy.
    assert_eq!(tcp(p1, "203.0.113.2", 8080), None, "second pod of team-a");
    // No EgressFirewall in team-b: default allow.
    assert!(tcp(p2, "203.0.113.2", 8080).is_some(), "team-b allowed by default");
    assert!(tcp(p2, "2001:db8:ff::2", 8080).is_some(), "team-b v6 allowed by default");
    // Pod ↔ pod is inside the cluster: never filtered.
    assert!(tcp(p0, &pod_v4(1), 8080).is_some(), "pod→pod v4");
    assert!(tcp(p0, &pod_v6(2), 8080).is_some(), "pod→pod v6");
    // Inbound connections to a pod under deny-all: replies pass.
    assert_eq!(tcp(&t.ext, &pod_v4(0), 8080).as_deref(), Some("203.0.113.2"), "inbound v4");
    assert!(tcp(&t.ext, &pod_v6(0), 8080).is_some(), "inbound v6");
    // The node's own address is outside the cluster: filtered in the input hook.
    assert_eq!(tcp(p0, "203.0.113.1", 8080), None, "pod → node address denied");
    assert!(tcp(p2, "203.0.113.1", 8080).is_some(), "team-b → node address allowed");
    // The pods' packets passed egressd's namespace chains with their priority given back.
    let counters = t.node.exec(&["nft", "list", "counters", "table", "inet", "observer"]);
    let packets = |name: &str| -> u64 {
        let block = counters.split(&format!("counter {name} {{")).nth(1).unwrap_or_default();
        block.split_whitespace().nth(1).and_then(|n| n.parse().ok()).unwrap_or_else(|| panic!("{counters}"))
    };
    assert!(packets("seen") > 20, "{counters}");
    assert_eq!(packets("borrowed"), 0, "packets left egressd's chain with a priority: {counters}");
    // The running agent's status, as `egressd status` shows it.
    let status = std::process::Command::new(netns::egressd_bin())
        .args(["status", "--state-dir", t.dir.path().join("state").to_str().unwrap()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(status.status.success(), "{}", String::from_utf8_lossy(&status.stderr));
    assert!(text.starts_with("# egressd on node node-a at ") && text.contains(": dataplane in sync"), "{text}");
    assert!(text.contains("EgressFirewall team-a/default\tapplied\tnode-a: EgressFirewall Rules applied"), "{text}");
    // Neighbour discovery and ARP keep working under deny-all (the connections above
    // needed them); the node still reaches the pod.
    assert!(tcp(&t.node, &pod_v6(0), 8080).is_some(), "node → pod v6");
    // Once the agent is gone, `egressd status` says so instead of "in sync" alone.
    assert_eq!(agent.stop(), Some(0));
    let status = std::process::Command::new(netns::egressd_bin())
        .args(["status", "--state-dir", t.dir.path().join("state").to_str().unwrap()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&status.stdout);
    assert_eq!(status.status.code(), Some(3), "{text}");
    assert!(text.starts_with("# egressd is NOT running: the agent that wrote this report (pid "), "{text}");
}

/// A socket created in `ns`, kept open so later packets belong to the same flow.
fn udp_flow(ns: &Netns) -> UdpSocket {
    ns.run(|| {
        let s = UdpSocket::bind("0.0.0.0:0").unwrap();
        s.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
        s
    })
}

fn flow_answers(s: &UdpSocket, to: &str) -> bool {
    let _ = s.send_to(b"ping", to);
    let mut buf = [0u8; 64];
    s.recv_from(&mut buf).is_ok()
}

#[test]
fn edits_reach_the_kernel_within_a_second_and_hit_existing_flows() {
    let t = Topology::new(&["team-a"]);
    t.set_firewall("team-a", &rule("Allow", "cidrSelector: 0.0.0.0/0", &[]));
    let agent = t.start_agent("agent");
    let p0 = &t.pods[0];
    let flow = udp_flow(p0);
    assert!(flow_answers(&flow, "203.0.113.2:5353"), "flow works before the edit");

    t.set_firewall("team-a", &rule("Deny", "cidrSelector: 203.0.113.0/24", &[]));
    let took = wait_for(Duration::from_secs(1), || !flow_answers(&flow, "203.0.113.2:5353"));
    assert!(took.is_some(), "Deny not applied to the existing flow within 1 s:\n{}", agent.log_text());
    assert!(tcp(p0, "192.0.2.10", 8080).is_some(), "other destinations unaffected");

    // Deleting the EgressFirewall removes its policy.
    t.remove_firewall("team-a");
    let took = wait_for(Duration::from_secs(1), || flow_answers(&flow, "203.0.113.2:5353"));
    assert!(took.is_some(), "deletion not applied within 1 s:\n{}", agent.log_text());
    let table = t.node.exec(&["nft", "list", "table", "inet", "egressd"]);
    assert!(!table.contains("fw-team-a"), "namespace chain left behind:\n{table}");

    // A bad edit keeps the last good policy and reports the field.
    t.set_firewall("team-a", &rule("Deny", "cidrSelector: 203.0.113.0/24", &[]));
    assert!(wait_for(Duration::from_secs(1), || !flow_answers(&flow, "203.0.113.2:5353")).is_some());
    t.set_firewall("team-a", &rule("Deny", "cidrSelector: 203.0.113.0/33", &[]));
    let reported = wait_for(Duration::from_secs(2), || {
        agent.log_text().contains("spec.egress[0].to.cidrSelector: invalid CIDR address: 203.0.113.0/33")
    });
    assert!(reported.is_some(), "bad edit not reported:\n{}", agent.log_text());
    assert!(!flow_answers(&flow, "203.0.113.2:5353"), "last good policy must stay applied");
}

#[test]
fn restart_keeps_policy_with_no_window_and_cleanup_removes_only_our_table() {
    let t = Topology::new(&["team-a"]);
    t.set_firewall("team-a", &rule("Deny", "cidrSelector: 203.0.113.2/32", &[]));
    // Somebody else's table in the node namespace: egressd must never touch it.
    t.node.exec(&["nft", "add", "table", "inet", "other"]);
    t.node.exec(&[
        "nft",
        "add",
        "chain",
        "inet",
        "other",
        "keep",
        "{ type filter hook forward priority 10; policy accept; }",
    ]);
    t.node.exec(&["nft", "add", "rule", "inet", "other", "keep", "counter"]);

    let mut agent = t.start_agent("first");
    let p0 = &t.pods[0];
    assert_eq!(tcp(p0, "203.0.113.2", 8080), None);

    // Probe the denied destination continuously through stop and restart.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let leaks = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let probes = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let prober = {
        let (stop, leaks, probes) = (stop.clone(), leaks.clone(), probes.clone());
        let flow = udp_flow(p0);
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                if flow_answers(&flow, "203.0.113.2:5353") {
                    leaks.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                }
                probes.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
        })
    };
    assert_eq!(agent.stop(), Some(0), "SIGTERM exits 0:\n{}", agent.log_text());
    assert!(t.node.has_table("egressd"), "dataplane must stay after SIGTERM");
    std::thread::sleep(Duration::from_millis(500));
    let second = t.start_agent("second");
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    prober.join().unwrap();
    assert!(probes.load(std::sync::atomic::Ordering::SeqCst) >= 3, "prober did not run");
    assert_eq!(leaks.load(std::sync::atomic::Ordering::SeqCst), 0, "packets passed during restart");
    assert_eq!(tcp(p0, "203.0.113.2", 8080), None, "policy after restart");
    drop(second);

    // cleanup: our table gone, the other table intact, traffic back to default.
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", &t.node.name])
        .arg(netns::egressd_bin())
        .arg("cleanup")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let ruleset = t.node.nft_list();
    assert!(!ruleset.contains("table inet egressd"), "{ruleset}");
    assert!(
        ruleset.contains("table inet other") && ruleset.contains("chain keep") && ruleset.contains("counter"),
        "{ruleset}"
    );
    assert!(tcp(p0, "203.0.113.2", 8080).is_some(), "no policy after cleanup");
    // cleanup twice is fine.
    let again = std::process::Command::new("ip")
        .args(["netns", "exec", &t.node.name])
        .arg(netns::egressd_bin())
        .arg("cleanup")
        .status()
        .unwrap();
    assert!(again.success());
}

fn status_text(t: &Topology) -> String {
    let out = std::process::Command::new(netns::egressd_bin())
        .args(["status", "--state-dir", t.dir.path().join("state").to_str().unwrap()])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The last good version of an object that is now invalid is saved in the state
/// directory: after a restart the namespace is still filtered by it (not fail-open).
#[test]
fn an_invalid_object_keeps_its_last_good_version_across_restarts() {
    let t = Topology::new(&["team-a"]);
    let p0 = &t.pods[0];
    t.set_firewall("team-a", "  - {type: Deny, to: {cidrSelector: 203.0.113.0/24}}\n");
    let mut agent = t.start_agent("first");
    assert_eq!(tcp(p0, "203.0.113.2", 8080), None, "{}", agent.log_text());

    t.set_firewall("team-a", "  - {type: Deny, to: {cidrSelector: 203.0.113.0/33}}\n");
    let reported = wait_for(Duration::from_secs(5), || status_text(&t).contains("203.0.113.0/33"));
    assert!(reported.is_some(), "{}", status_text(&t));
    assert_eq!(tcp(p0, "203.0.113.2", 8080), None, "last good version kept while running");
    let saved = t.dir.path().join("state/last-good.json");
    let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&saved).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o600);
    assert_eq!(agent.stop(), Some(0));

    // A new agent reads only the invalid version from the manifests.
    let agent = t.start_agent("second");
    assert_eq!(tcp(p0, "203.0.113.2", 8080), None, "restart failed open:\n{}", agent.log_text());
    assert!(agent.log_text().contains("last good version saved before the restart"), "{}", agent.log_text());
    let text = status_text(&t);
    assert!(text.contains("EgressFirewall team-a/default\tfailed"), "{text}");

    // Fixed: the new version applies and nothing is saved any more.
    t.set_firewall("team-a", "  - {type: Deny, to: {cidrSelector: 192.0.2.0/24}}\n");
    let fixed = wait_for(Duration::from_secs(5), || tcp(p0, "203.0.113.2", 8080).is_some());
    assert!(fixed.is_some(), "{}", agent.log_text());
    assert_eq!(tcp(p0, "192.0.2.10", 8080), None);
    let cleared = wait_for(Duration::from_secs(5), || {
        std::fs::read_to_string(&saved).is_ok_and(|s| s.contains("\"objects\": []"))
    });
    assert!(cleared.is_some(), "{}", std::fs::read_to_string(&saved).unwrap_or_default());
}

/// `type` values the CRD admits besides Allow/Deny deny, as in the reference, with a
/// warning in the status.
#[test]
fn a_type_other_than_allow_denies_with_a_warning() {
    let t = Topology::new(&["team-a"]);
    let p0 = &t.pods[0];
    t.set_firewall("team-a", "  - {type: Allowed, to: {cidrSelector: 203.0.113.0/24}}\n");
    let agent = t.start_agent("agent");
    assert_eq!(tcp(p0, "203.0.113.2", 8080), None, "{}", agent.log_text());
    assert!(tcp(p0, "192.0.2.10", 8080).is_some());
    let text = status_text(&t);
    assert!(
        text.contains("EgressFirewall team-a/default\tapplied\tnode-a: EgressFirewall Rules applied (warning: spec.egress[0].type: \"Allowed\" is neither"),
        "{text}"
    );
}

/// Someone else flushes the ruleset, deletes egressd's table or edits a rule of it:
/// egressd replaces its table at once (within a second is the promise, measured by
/// `bench/full-sync.sh`; the bound here is generous for a loaded machine); changes to
/// other tables are left alone.
#[test]
fn changes_to_the_table_by_others_are_undone_at_once() {
    let t = Topology::new(&["team-a"]);
    let p0 = &t.pods[0];
    t.set_firewall("team-a", "  - {type: Deny, to: {cidrSelector: 203.0.113.0/24}}\n");
    let agent = t.start_agent("agent");
    assert_eq!(tcp(p0, "203.0.113.2", 8080), None);
    let intact = || {
        let (ok, text) = t.node.try_exec(&["nft", "list", "chain", "inet", "egressd", "fw-team-a"]);
        ok && text.contains("ip daddr 203.0.113.0/24 counter")
    };
    let repairs = || agent.log_text().matches("was changed by another process").count();

    let cases: [&[&str]; 4] = [
        &["nft", "flush", "ruleset"],
        &["nft", "delete", "table", "inet", "egressd"],
        &["nft", "flush", "chain", "inet", "egressd", "fw-team-a"],
        &["nft", "add", "rule", "inet", "egressd", "fw-team-a", "counter", "accept"],
    ];
    let mut slowest = Duration::ZERO;
    for (i, cmd) in cases.iter().enumerate() {
        let before = repairs();
        t.node.exec(cmd);
        let back = wait_for(Duration::from_secs(5), || {
            intact()
                && !t
                    .node
                    .exec(&["nft", "list", "chain", "inet", "egressd", "fw-team-a"])
                    .contains("counter packets 0 bytes 0 accept")
                && repairs() > before
        });
        let took = back.unwrap_or_else(|| panic!("{cmd:?} not undone:\n{}\n{}", t.node.nft_list(), agent.log_text()));
        slowest = slowest.max(took);
        assert_eq!(tcp(p0, "203.0.113.2", 8080), None, "case {i}: policy holds again");
    }
    assert!(slowest < Duration::from_secs(3), "a repair took {slowest:?}");

    // Another table is none of egressd's business.
    let before = repairs();
    t.node.exec(&["nft", "add", "table", "inet", "someone-else"]);
    t.node.exec(&["nft", "add", "chain", "inet", "someone-else", "c"]);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(repairs(), before, "{}", agent.log_text());
    assert!(t.node.has_table("someone-else"));
    let (_, metrics) = netns::http_get(&t.node, "127.0.0.1:9780", "/metrics").unwrap();
    assert!(metrics.contains("egressd_drift_repairs_total{what=\"nft\"} 4"), "{metrics}");

    // egressd's own changes carry its name in the kernel's notifications (so they are
    // told apart even where PIDs cannot be compared), and are never taken for drift.
    let monitor = std::process::Command::new("ip")
        .args(["netns", "exec", &t.node.name, "timeout", "3", "nft", "monitor"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let before = repairs();
    t.set_firewall("team-a", "  - {type: Deny, to: {cidrSelector: 192.0.2.0/24}}\n");
    let out = monitor.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    // (An element change is egressd's own netlink batch, `egressd`; a rule change the
    // `nft` it runs, `egressd-nft`.)
    assert!(text.contains("by process") && text.contains("(egressd"), "{text}");
    assert_eq!(repairs(), before, "own change taken for drift:\n{}", agent.log_text());
}
