//! EgressQoS: DSCP marks read at the external host (root required). The node also
//! masquerades pod traffic like a CNI, to show the mark survives SNAT.

mod netns;

use std::time::Duration;

use netns::{DscpObserver, Topology, pod_v4, udp_send, wait_for};

const EXT4: &str = "203.0.113.2";
const OTHER4: &str = "192.0.2.10";
const EXT6: &str = "2001:db8:ff::2";

fn qos(rules: &str) -> String {
    format!(
        "apiVersion: k8s.ovn.org/v1\nkind: EgressQoS\nmetadata: {{name: default, namespace: media}}\nspec:\n  egress:\n{rules}"
    )
}

const RULES: &str = "  - dscp: 46\n    dstCIDR: 203.0.113.0/24\n    podSelector: {matchLabels: {app: web}}\n  - dscp: 30\n    dstCIDR: \"2001:db8:ff::/64\"\n  - dscp: 10\n    podSelector: {matchExpressions: [{key: app, operator: In, values: [encoder]}]}\n";

/// Send from pod `pod` to `addr` on a fresh port; the DSCP values the receiver saw.
fn probe(t: &Topology, obs: &DscpObserver, port: &mut u16, pod: usize, addr: &str) -> Vec<u8> {
    *port += 1;
    let p = *port;
    udp_send(&t.pods[pod], addr, p);
    let mut seen = Vec::new();
    wait_for(Duration::from_secs(1), || {
        seen = obs.seen(p);
        !seen.is_empty()
    });
    seen
}

/// Probe until the receiver sees `want` (the agent applies edits asynchronously).
fn eventually(t: &Topology, obs: &DscpObserver, port: &mut u16, pod: usize, addr: &str, want: u8) -> Vec<u8> {
    let mut last = Vec::new();
    for _ in 0..10 {
        last = probe(t, obs, port, pod, addr);
        if last == [want] {
            return last;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    last
}

#[test]
fn dscp_marks_follow_rules_pods_labels_edits_and_deletion_v4_and_v6() {
    // pod0 web, pod1 encoder (media); pod2 in another namespace; pod3 declared later.
    let t =
        Topology::with_pods(&[("media", "{app: web}"), ("media", "{app: encoder}"), ("other", "{app: web}"), ("", "")]);
    t.node.exec(&["nft", "add", "table", "ip", "cni"]);
    t.node.exec(&["nft", "add", "chain", "ip", "cni", "post", "{ type nat hook postrouting priority srcnat; }"]);
    t.node.exec(&["nft", "add", "rule", "ip", "cni", "post", "ip saddr 198.18.0.0/16 oifname eth-ext masquerade"]);
    let obs = DscpObserver::install(&t.ext, 7000..=7080);
    let mut port = 7000;
    let agent = t.start_agent("agent");

    // No EgressQoS yet: DSCP untouched.
    assert_eq!(probe(&t, &obs, &mut port, 0, EXT4), vec![0]);

    // EgressQoS created after the pods.
    t.write_manifest("qos.yaml", &qos(RULES));
    assert_eq!(eventually(&t, &obs, &mut port, 0, EXT4, 46), vec![46], "dstCIDR + podSelector:\n{}", agent.log_text());
    assert_eq!(probe(&t, &obs, &mut port, 0, OTHER4), vec![0], "no rule matches: unchanged");
    assert_eq!(probe(&t, &obs, &mut port, 1, EXT4), vec![10], "selector mismatch on rule 0 → rule 2");
    assert_eq!(probe(&t, &obs, &mut port, 0, EXT6), vec![30], "IPv6 dstCIDR rule");
    assert_eq!(probe(&t, &obs, &mut port, 1, EXT6), vec![30], "rule order: rule 1 before rule 2");
    assert_eq!(probe(&t, &obs, &mut port, 2, EXT4), vec![0], "another namespace untouched");
    assert_eq!(probe(&t, &obs, &mut port, 2, EXT6), vec![0], "another namespace untouched (v6)");

    let status = std::process::Command::new(netns::egressd_bin())
        .args(["status", "--state-dir", t.dir.path().join("state").to_str().unwrap()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(
        text.contains(
            "EgressQoS media/default\tapplied\tReady-In-Zone-node-a=True SetupSucceeded: EgressQoS Rules applied"
        ),
        "{text}"
    );

    // A pod created after the EgressQoS.
    t.declare_pod(3, "media", "{app: encoder}");
    assert_eq!(eventually(&t, &obs, &mut port, 3, EXT4, 10), vec![10], "new pod marked");

    // A label change moves a pod between rules.
    t.declare_pod(0, "media", "{app: encoder}");
    assert_eq!(eventually(&t, &obs, &mut port, 0, EXT4, 10), vec![10], "relabelled pod follows rule 2");

    // An edit.
    t.write_manifest("qos.yaml", &qos(&RULES.replace("dscp: 10", "dscp: 12")));
    assert_eq!(eventually(&t, &obs, &mut port, 1, EXT4, 12), vec![12], "edited value");

    // Deletion restores 0.
    t.remove_manifest("qos.yaml");
    assert_eq!(eventually(&t, &obs, &mut port, 1, EXT4, 0), vec![0], "deleted EgressQoS stops marking");
    assert!(!t.node.nft_list().contains("qos-media"), "namespace chain removed");
    assert_eq!(agent.nft_fallbacks(), Vec::<String>::new(), "every sync in-process");
    let _ = pod_v4;
}
