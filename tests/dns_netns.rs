//! EgressFirewall dnsName and nodeSelector rules against a real DNS server (dnsmasq,
//! which egressd does not control) in the external host's namespace (root required).

mod netns;

use std::time::Duration;

use netns::{Dnsmasq, Topology, tcp, wait_for};

const DNS: &str = "203.0.113.2";

fn firewall() -> String {
    [
        "  - type: Allow\n    to: {dnsName: API.Example.COM}\n    ports: [{protocol: TCP, port: 8080}]\n",
        "  - type: Deny\n    to: {cidrSelector: 0.0.0.0/0}\n",
        "  - type: Deny\n    to: {cidrSelector: \"::/0\"}\n",
    ]
    .concat()
}

#[test]
fn dns_rules_follow_answers_keep_last_good_and_expire_in_the_kernel() {
    let t = Topology::new(&["team-a"]);
    let hosts = t.dir.path().join("hosts");
    std::fs::write(&hosts, "192.0.2.10 api.example.com\n2001:db8:ff:1::10 api.example.com\n").unwrap();
    let mut dns = Dnsmasq::start(&t.ext, DNS, hosts, 1);
    t.set_firewall("team-a", &firewall());
    let agent = t.start_agent_with("agent", &["--dns-server", DNS, "--dns-grace-secs", "30"]);
    let p0 = &t.pods[0];

    // Resolved before the first apply: allowed by (upper-case) name, v4 and v6.
    assert!(tcp(p0, "192.0.2.10", 8080).is_some(), "allowed by name (v4):\n{}", agent.log_text());
    assert!(tcp(p0, "2001:db8:ff:1::10", 8080).is_some(), "allowed by name (v6):\n{}", t.node.nft_list());
    assert_eq!(tcp(p0, "198.51.100.10", 8080), None, "other addresses denied");
    assert_eq!(tcp(p0, "192.0.2.10", 9090), None, "other ports denied");
    // The name's slot of the shared set: its tag, then the address.
    let table = t.node.exec(&["nft", "list", "set", "inet", "egressd", "dns-v4"]);
    let [slot, _] = egressd::compile::dns_slots("api.example.com.");
    assert!(
        table.contains(&format!("{} timeout 35s expires", slot.key("192.0.2.10".parse().unwrap()))),
        "kernel-side timeout (TTL 1 → 5 s floor + 30 s grace):\n{table}"
    );

    // The answer changes: the new address is allowed within TTL + floor.
    dns.set_hosts("198.51.100.10 api.example.com\n2001:db8:ff:1::10 api.example.com\n");
    let took = wait_for(Duration::from_secs(8), || tcp(p0, "198.51.100.10", 8080).is_some());
    assert!(took.is_some(), "new address not allowed within TTL + floor:\n{}", agent.log_text());
    assert_eq!(tcp(p0, "192.0.2.10", 8080), None, "old address no longer allowed");

    // Server down: the last good addresses stay (and their kernel timeouts are refreshed).
    dns.stop();
    let failed = wait_for(Duration::from_secs(20), || agent.log_text().contains("DNS resolution failed"));
    assert!(failed.is_some(), "{}", agent.log_text());
    assert!(tcp(p0, "198.51.100.10", 8080).is_some(), "last good address kept while the server is down");
    // The status file is rewritten after the failed round is handled, a moment after
    // its log line.
    let status_text = || {
        let status = std::process::Command::new(netns::egressd_bin())
            .args(["status", "--state-dir", t.dir.path().join("state").to_str().unwrap()])
            .output()
            .unwrap();
        String::from_utf8_lossy(&status.stdout).into_owned()
    };
    let noted =
        wait_for(Duration::from_secs(5), || status_text().contains("dnsName api.example.com.: resolution failing"));
    let text = status_text();
    assert!(noted.is_some(), "{text}");
    assert!(text.contains("EgressFirewall team-a/default\tapplied"), "{text}");
}

#[test]
fn node_selector_rules_follow_node_labels_and_addresses() {
    let t = Topology::new(&["team-a"]);
    let node = |labels: &str, addrs: &[&str]| {
        let list: Vec<String> = addrs.iter().map(|a| format!("  - {{type: InternalIP, address: \"{a}\"}}\n")).collect();
        t.write_manifest(
            "node-db.yaml",
            &format!(
                "apiVersion: v1\nkind: Node\nmetadata: {{name: node-db, labels: {labels}}}\nstatus:\n  addresses:\n{}",
                list.concat()
            ),
        );
    };
    node("{role: db}", &["192.0.2.10"]);
    t.set_firewall(
        "team-a",
        "  - type: Allow\n    to: {nodeSelector: {matchLabels: {role: db}}}\n    ports: [{protocol: TCP, port: 8080}]\n  - type: Deny\n    to: {cidrSelector: 0.0.0.0/0}\n  - type: Deny\n    to: {cidrSelector: \"::/0\"}\n",
    );
    let agent = t.start_agent("agent");
    let p0 = &t.pods[0];
    assert!(tcp(p0, "192.0.2.10", 8080).is_some(), "selected node's address allowed:\n{}", agent.log_text());
    assert_eq!(tcp(p0, "198.51.100.10", 8080), None);

    node("{role: web}", &["192.0.2.10"]);
    assert!(wait_for(Duration::from_secs(5), || tcp(p0, "192.0.2.10", 8080).is_none()).is_some(), "label change");

    node("{role: db}", &["198.51.100.10", "2001:db8:ff:1::10"]);
    assert!(wait_for(Duration::from_secs(5), || tcp(p0, "198.51.100.10", 8080).is_some()).is_some(), "address change");
    assert_eq!(tcp(p0, "192.0.2.10", 8080), None, "old address removed");
    assert!(tcp(p0, "2001:db8:ff:1::10", 8080).is_some(), "IPv6 node address");

    t.remove_manifest("node-db.yaml");
    assert!(wait_for(Duration::from_secs(5), || tcp(p0, "198.51.100.10", 8080).is_none()).is_some(), "node deleted");
}

/// With the DNS server blackholed (packets dropped, so every query runs into its
/// timeout, 8 s here), a new pod and an edited firewall still reach the kernel well
/// within half that: resolution runs beside the agent loop, never in front of it. (The
/// bound is generous for a loaded machine; a change waiting behind a query would take
/// up to the whole timeout.)
#[test]
fn a_dns_outage_never_delays_other_changes() {
    let t = Topology::new(&["team-a"]);
    let hosts = t.dir.path().join("hosts");
    std::fs::write(&hosts, "192.0.2.10 api.example.com\n2001:db8:ff:1::10 api.example.com\n").unwrap();
    let _dns = Dnsmasq::start(&t.ext, DNS, hosts, 1);
    t.set_firewall("team-a", &firewall());
    let query_timeout = Duration::from_secs(8);
    let timeout_ms = query_timeout.as_millis().to_string();
    let agent = t.start_agent_with("agent", &["--dns-server", DNS, "--dns-timeout-ms", &timeout_ms]);
    assert!(tcp(&t.pods[0], "192.0.2.10", 8080).is_some(), "resolved at start:\n{}", agent.log_text());

    // Blackhole the server: queries are dropped, not refused.
    t.ext.exec(&["nft", "add", "table", "inet", "blackhole"]);
    t.ext.exec(&["nft", "add", "chain", "inet", "blackhole", "in", "{ type filter hook input priority -300 ; }"]);
    t.ext.exec(&["nft", "add", "rule", "inet", "blackhole", "in", "meta l4proto { tcp, udp } th dport 53 drop"]);
    let failing = wait_for(query_timeout * 4, || agent.log_text().contains("DNS resolution failed"));
    assert!(failing.is_some(), "{}", agent.log_text());

    // Changes every 0.7 s for ~9 s: some land while a query hangs in its timeout.
    let mut slowest = Duration::ZERO;
    for k in 0..13u32 {
        let ip = format!("198.18.2.{}", k + 10);
        t.write_manifest(
            &format!("extra-pod-{k}.yaml"),
            &format!(
                "apiVersion: v1\nkind: Pod\nmetadata: {{name: extra-{k}, namespace: team-a}}\nspec: {{nodeName: node-a}}\nstatus:\n  phase: Running\n  podIPs: [{{ip: {ip}}}]\n"
            ),
        );
        let rule = format!("198.51.100.{}", k + 20);
        t.set_firewall("team-a", &format!("  - {{type: Deny, to: {{cidrSelector: {rule}/32}}}}\n{}", firewall()));
        let took = wait_for(query_timeout + Duration::from_secs(2), || {
            let ruleset = t.node.nft_list();
            // The rule's address is an element of the namespace's run set.
            let element = [format!("{rule},"), format!("{rule} ")].iter().any(|e| ruleset.contains(e.as_str()));
            // The pod's address maps to its namespace's number, which jumps to its chain.
            let number = ruleset.split(&format!("{ip} : ")).nth(1).and_then(|rest| rest.split([',', ' ']).next());
            number.is_some_and(|n| ruleset.contains(&format!("{n} : jump fw-team-a"))) && element
        });
        let took = took.unwrap_or_else(|| panic!("change {k} not applied within 10 s:\n{}", agent.log_text()));
        slowest = slowest.max(took);
        std::thread::sleep(Duration::from_millis(700));
    }
    assert!(slowest < query_timeout / 2, "a change waited {slowest:?} behind DNS:\n{}", agent.log_text());
    // The last good addresses are still allowed.
    assert!(tcp(&t.pods[0], "192.0.2.10", 8080).is_some(), "last good address kept");
}

/// The reported scenario: Nodes and the EgressFirewall in one manifest file, node-b's
/// label edited in place with `sed -i`: its address leaves the namespace chain.
#[test]
fn node_selector_rules_follow_a_label_edit_in_a_shared_file() {
    let t = Topology::new(&["team-a"]);
    let file = t.manifests().join("all.yaml");
    std::fs::write(
        &file,
        "apiVersion: v1\nkind: Node\nmetadata:\n  name: node-b\n  labels:\n    role: worker\nstatus:\n  addresses:\n  - {type: InternalIP, address: 192.0.2.10}\n\
         ---\napiVersion: v1\nkind: Node\nmetadata:\n  name: node-c\n  labels:\n    role: infra\nstatus:\n  addresses:\n  - {type: InternalIP, address: 198.51.100.10}\n\
         ---\napiVersion: k8s.ovn.org/v1\nkind: EgressFirewall\nmetadata: {name: default, namespace: team-a}\nspec:\n  egress:\n  \
         - type: Allow\n    to:\n      nodeSelector:\n        matchLabels: {role: worker}\n  - type: Deny\n    to: {cidrSelector: 0.0.0.0/0}\n",
    )
    .unwrap();
    let agent = t.start_agent("agent");
    let p0 = &t.pods[0];
    assert!(tcp(p0, "192.0.2.10", 8080).is_some(), "worker node allowed:\n{}", agent.log_text());
    assert_eq!(tcp(p0, "198.51.100.10", 8080), None);
    assert!(t.node.exec(&["nft", "list", "chain", "inet", "egressd", "fw-team-a"]).contains("ip daddr 192.0.2.10 "));

    // node-b's label only (the selector keeps `role: worker`).
    netns::sh(&["sed", "-i", "0,/    role: worker/s//    role: db/", file.to_str().unwrap()]);
    let gone = wait_for(Duration::from_secs(2), || {
        !t.node.exec(&["nft", "list", "table", "inet", "egressd"]).contains("192.0.2.10")
    });
    assert!(gone.is_some(), "stale node address kept:\n{}", t.node.nft_list());
    assert_eq!(tcp(p0, "192.0.2.10", 8080), None);
    // And back, then node-c becomes a worker.
    netns::sh(&["sed", "-i", "0,/    role: db/s//    role: worker/", file.to_str().unwrap()]);
    netns::sh(&["sed", "-i", "0,/    role: infra/s//    role: worker/", file.to_str().unwrap()]);
    let both = wait_for(Duration::from_secs(2), || {
        tcp(p0, "192.0.2.10", 8080).is_some() && tcp(p0, "198.51.100.10", 8080).is_some()
    });
    assert!(both.is_some(), "{}", t.node.nft_list());
}
