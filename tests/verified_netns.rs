//! Verified connections (the firewall's fast path, `--firewall-verified-mark-mask`) with
//! a real egressd on a node namespace (root required): an allowed connection's packets
//! after its first skip the rules, every change of the firewall sends them through the
//! rules again (a change of what they walk anyway, EgressQoS, does not), and
//! a generation is never reused while a connection still carries it.
//!
//! Topology: `netns::Topology` (pod0 in `team-a`, the external host 203.0.113.2).

mod netns;

use std::net::UdpSocket;
use std::time::Duration;

use netns::{Topology, wait_for};

const EXT: &str = "203.0.113.2:5353";

fn allow_ext_then(extra: &str) -> String {
    format!(
        "  - type: Allow\n    to: {{cidrSelector: 203.0.113.0/24}}\n{extra}  - type: Deny\n    to: {{cidrSelector: 0.0.0.0/0}}\n"
    )
}

/// The external host's /26 allowed with four more /26s (`second` and three fixed), then
/// Deny all: five destinations of one length are one rule and a hash set of networks
/// (more than `INLINE_MAX`), so an edit of `second` changes elements only and the rule
/// keeps its counter.
fn allow_five(second: &str) -> String {
    let nets = ["203.0.113.0/26", second, "198.51.100.64/26", "198.51.100.128/26", "198.51.100.192/26"];
    let allows: String = nets.iter().map(|n| format!("  - type: Allow\n    to: {{cidrSelector: {n}}}\n")).collect();
    format!("{allows}  - type: Deny\n    to: {{cidrSelector: 0.0.0.0/0}}\n")
}

fn flow(t: &Topology) -> UdpSocket {
    t.pods[0].run(|| UdpSocket::bind("0.0.0.0:0").unwrap())
}

/// Whether a datagram of the flow is answered within `within` (the server answers the
/// source address). Answers still queued from earlier datagrams are read first, so a
/// late one is not taken for this one's.
fn echoed(s: &UdpSocket, within: Duration) -> bool {
    let mut buf = [0u8; 64];
    s.set_nonblocking(true).unwrap();
    while s.recv_from(&mut buf).is_ok() {}
    s.set_nonblocking(false).unwrap();
    s.set_read_timeout(Some(within)).unwrap();
    let _ = s.send_to(b"ping", EXT);
    s.recv_from(&mut buf).is_ok()
}

/// Allowed: the answer comes (3 s for a loaded machine; it takes well under 1 ms).
fn answers(s: &UdpSocket) -> bool {
    echoed(s, Duration::from_secs(3))
}

/// Blocked: no answer within 1 s.
fn silent(s: &UdpSocket) -> bool {
    !echoed(s, Duration::from_secs(1))
}

/// The packets counted by the rule commented `egress[<index>` of team-a's chain.
fn rule_packets(t: &Topology, index: usize) -> u64 {
    let chain = t.node.exec(&["nft", "list", "chain", "inet", "egressd", "fw-team-a"]);
    let line = chain
        .lines()
        .find(|l| l.contains(&format!("comment \"egress[{index}")))
        .unwrap_or_else(|| panic!("no rule egress[{index}]:\n{chain}"));
    let at = line.rfind("counter packets ").unwrap_or_else(|| panic!("no counter: {line}"));
    line[at + "counter packets ".len()..].split(' ').next().unwrap().parse().unwrap()
}

/// Write team-a's firewall and wait until the kernel's chain shows `marker` (each
/// edit then is one sync, one generation).
fn edit(t: &Topology, rules: &str, marker: &str) {
    t.set_firewall("team-a", rules);
    let applied =
        wait_for(Duration::from_secs(5), || t.node.exec(&["nft", "list", "table", "inet", "egressd"]).contains(marker));
    assert!(applied.is_some(), "edit with {marker} not applied");
}

#[test]
fn an_allowed_connection_walks_the_rules_once_per_policy() {
    for (mask, verified) in [(None, true), (Some("0"), false)] {
        let t = Topology::new(&["team-a"]);
        t.set_firewall("team-a", &allow_five("198.51.100.0/26"));
        let extra: Vec<&str> = mask.map(|m| vec!["--firewall-verified-mark-mask", m]).unwrap_or_default();
        let agent = t.start_agent_with("agent", &extra);
        let f = flow(&t);
        for _ in 0..10 {
            assert!(answers(&f), "allowed flow blocked:\n{}", agent.log_text());
        }
        // With the fast path, only the first packet is counted by the allow rule.
        let expected = if verified { 1 } else { 10 };
        assert_eq!(rule_packets(&t, 0), expected, "mask {mask:?}");

        // A change sends the connection through the rules again (one packet more
        // counted), and a Deny of it reaches it.
        edit(&t, &allow_five("192.0.2.0/26"), "192.0.2.0");
        for _ in 0..5 {
            assert!(answers(&f));
        }
        let expected = if verified { 2 } else { 15 };
        assert_eq!(rule_packets(&t, 0), expected, "mask {mask:?} after a change");
        t.set_firewall("team-a", "  - type: Deny\n    to: {cidrSelector: 203.0.113.0/24}\n");
        let denied = wait_for(Duration::from_secs(5), || silent(&f));
        assert!(denied.is_some(), "Deny did not reach the verified connection:\n{}", agent.log_text());
    }
}

#[test]
fn a_change_verified_connections_walk_anyway_keeps_them_verified() {
    // An EgressQoS (its own base chain, which every packet walks) is added and edited:
    // the firewall's verdicts stand, so the verified connection keeps its generation
    // and does not walk the firewall again; a firewall edit after it does.
    let t = Topology::new(&["team-a"]);
    t.set_firewall("team-a", &allow_five("198.51.100.0/26"));
    let agent = t.start_agent("agent");
    let f = flow(&t);
    for _ in 0..3 {
        assert!(answers(&f), "allowed flow blocked:\n{}", agent.log_text());
    }
    assert_eq!(rule_packets(&t, 0), 1, "verified after its first packet");
    // (nft lists the values by name.)
    for (dscp, name) in [(46, "ef"), (10, "af11")] {
        t.write_manifest(
            "qos.yaml",
            &format!(
                "apiVersion: k8s.ovn.org/v1\nkind: EgressQoS\nmetadata: {{name: default, namespace: team-a}}\nspec:\n  egress:\n  - dscp: {dscp}\n    dstCIDR: 192.0.2.0/24\n"
            ),
        );
        let marker = format!("dscp set {name}");
        let applied = wait_for(Duration::from_secs(5), || {
            t.node.exec(&["nft", "list", "table", "inet", "egressd"]).contains(&marker)
        });
        assert!(applied.is_some(), "EgressQoS {dscp} not applied:\n{}", agent.log_text());
        for _ in 0..3 {
            assert!(answers(&f));
        }
        assert_eq!(
            rule_packets(&t, 0),
            1,
            "an EgressQoS change (dscp {dscp}) sent the connection through the firewall"
        );
    }
    edit(&t, &allow_five("192.0.2.0/26"), "192.0.2.0");
    for _ in 0..3 {
        assert!(answers(&f));
    }
    assert_eq!(rule_packets(&t, 0), 2, "a firewall change walks it again");
}

#[test]
fn a_generation_is_cleared_before_it_is_current_again() {
    // Two bits: three generations, each cleared on its own; four bits (the default):
    // twelve, cleared four at a time. After that many changes the first is current
    // again: a connection verified under it and idle since must not pass the Deny the
    // last change brings.
    for (mask, generations) in [("0x03000000", 3), ("0x0f000000", 12)] {
        let t = Topology::new(&["team-a"]);
        t.set_firewall("team-a", &allow_ext_then(""));
        let agent = t.start_agent_with("agent", &["--firewall-verified-mark-mask", mask]);
        let f = flow(&t);
        assert!(answers(&f) && answers(&f), "allowed flow blocked:\n{}", agent.log_text());
        assert_eq!(rule_packets(&t, 0), 1, "verified after its first packet");
        for i in 1..generations {
            let cidr = format!("192.0.2.{}", 100 + i);
            edit(&t, &allow_ext_then(&format!("  - type: Allow\n    to: {{cidrSelector: {cidr}/32}}\n")), &cidr);
        }
        let deny = "  - type: Deny\n    to: {cidrSelector: 203.0.113.2/32}\n  - type: Allow\n    to: {cidrSelector: 0.0.0.0/0}\n";
        edit(&t, deny, "203.0.113.2");
        assert!(
            silent(&f),
            "mask {mask}: a connection verified {generations} changes ago passed the Deny:\n{}",
            agent.log_text()
        );
    }
}
