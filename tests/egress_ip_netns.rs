//! EgressIP across three node namespaces (`netns::cluster`), each running its own
//! egressd on one shared manifests directory (static placement in `status.items`), root
//! required.

mod netns;

use std::time::Duration;

use netns::cluster::*;
use std::io::Write;

use netns::{addr, tcp, wait_for};

const PODS: [&[(&str, &str)]; 3] = [
    &[("prod", "{app: web}"), ("dev", "{app: web}"), ("prod", "{app: db}")],
    &[("prod", "{app: web}")],
    &[("prod", "{app: web}")],
];

#[test]
fn selected_pods_leave_as_the_egress_ip_from_every_node() {
    let mut c = Cluster::new(&PODS);
    c.egress_ip("web", &[EIP_B, EIP6_B], &[(EIP_B, "node-b"), (EIP6_B, "node-b")], true);
    c.start_all();
    let logs = || c.logs();
    assert!(wait_for(Duration::from_secs(5), || c.has_addr(1, EIP_B)).is_some(), "hosted on B\n{}", logs());
    assert!(c.has_addr(1, EIP6_B), "v6 hosted on B");
    assert!(!c.has_addr(0, EIP_B) && !c.has_addr(2, EIP_B), "only on B");

    let a = &c.nodes[0];
    // Selected pod on A: steered to B, leaves as the egress IP.
    assert_eq!(tcp(&a.pods[0], EXT_V4, 8080).as_deref(), Some(EIP_B), "selected pod on A\n{}", logs());
    assert_eq!(tcp(&a.pods[0], EXT_V6, 8080).as_deref(), Some(EIP6_B), "selected pod on A, IPv6\n{}", logs());
    // Unselected: other namespace, and same namespace without the label.
    assert_eq!(tcp(&a.pods[1], EXT_V4, 8080), Some(node_v4(0)), "other namespace: A's own SNAT");
    assert_eq!(tcp(&a.pods[2], EXT_V4, 8080), Some(node_v4(0)), "other label: A's own SNAT");
    assert_eq!(tcp(&a.pods[2], EXT_V6, 8080), Some(node_v6(0)), "other label, IPv6");
    // Selected pod on the hosting node and on the third node.
    assert_eq!(tcp(&c.nodes[1].pods[0], EXT_V4, 8080).as_deref(), Some(EIP_B), "selected pod on B");
    assert_eq!(tcp(&c.nodes[1].pods[0], EXT_V6, 8080).as_deref(), Some(EIP6_B), "selected pod on B, IPv6");
    assert_eq!(tcp(&c.nodes[2].pods[0], EXT_V4, 8080).as_deref(), Some(EIP_B), "selected pod on C");
    // In-cluster traffic is never steered or rewritten.
    assert_eq!(tcp(&a.pods[0], &pod_v4(1, 0), 8080), Some(pod_v4(0, 0)), "pod → pod");
    assert_eq!(tcp(&a.pods[0], &pod_v6(2, 0), 8080), Some(pod_v6(0, 0)), "pod → pod, IPv6");
    assert_eq!(tcp(&a.pods[0], &node_v4(2), 8080), Some(node_v4(0)), "pod → node: as without egressd (CNI SNAT)");
    assert_eq!(tcp(&a.pods[0], &node_v4(0), 8080), Some(pod_v4(0, 0)), "pod → own node");

    assert!(
        c.status_shows(
            0,
            "EgressIP web\tapplied\tnode-a: EgressIP applied: hosts no egress IP (elsewhere: node-b); 1 local pods selected: 0 SNATed here, 1 steered"
        ),
        "{}",
        c.status(0)
    );
    assert!(
        c.status_shows(1, "node-b: EgressIP applied: hosts 198.19.0.100 on eth0, 2001:db8:0:1::100 on eth0"),
        "{}",
        c.status(1)
    );
    assert_eq!(c.pod_sourced_packets(), 0, "a pod address reached the external host");
    let metrics =
        netns::http_get(&c.nodes[1].ns, "127.0.0.1:9781", "/metrics").map(|(_, body)| body).unwrap_or_default();
    assert!(metrics.contains("egressd_egress_ips_hosted 2"), "{metrics}");
    assert!(!logs().contains("through nft"), "every sync in-process:\n{}", logs());
}

#[test]
fn two_hosts_spread_flows_each_flow_sticks() {
    let mut c = Cluster::new(&PODS);
    c.egress_ip("web", &[EIP_B, EIP_C], &[(EIP_B, "node-b"), (EIP_C, "node-c")], true);
    c.start_all();
    assert!(wait_for(Duration::from_secs(5), || c.has_addr(2, EIP_C)).is_some(), "{}", c.logs());
    let pod = &c.nodes[0].pods[0];
    let mut sources = std::collections::BTreeSet::new();
    for port in 0..24u16 {
        let seen = udp_flow(pod, EXT_V4, 40000 + port, 4);
        assert_eq!(
            seen.len(),
            4,
            "flow {port} lost replies\n{}\n{}\n{}\n{}",
            c.nodes[0].ns.ip(&["route", "show", "table", "all", "proto", "233"]),
            c.nodes[0].ns.ip(&["rule"]),
            c.nodes[1].ns.nft_list(),
            c.logs(),
        );
        assert!(seen.iter().all(|s| *s == seen[0]), "flow {port} switched paths: {seen:?}");
        assert!(seen[0] == EIP_B || seen[0] == EIP_C, "flow {port} left as {}", seen[0]);
        sources.insert(seen[0].clone());
    }
    assert_eq!(sources.len(), 2, "24 flows all took one path: {sources:?}");
    assert_eq!(c.pod_sourced_packets(), 0);
}

#[test]
fn moving_an_item_moves_address_announcement_and_traffic() {
    let mut c = Cluster::new(&PODS);
    c.egress_ip("web", &[EIP_B, EIP6_B], &[(EIP_B, "node-b"), (EIP6_B, "node-b")], true);
    c.start_all();
    let pod = &c.nodes[0].pods[0];
    assert!(wait_source(pod, EXT_V4, EIP_B), "{}", c.logs());
    assert!(wait_source(pod, EXT_V6, EIP6_B), "{}", c.logs());
    assert_eq!(c.ext_neighbour(EIP_B), Some(c.mac(1)), "ext reached B for the egress IP");
    assert_eq!(c.ext_neighbour(EIP6_B), Some(c.mac(1)), "ext reached B for the IPv6 egress IP");
    let mut flow = Flow::open(pod, EXT_V4);
    assert_eq!(flow.ask().as_deref(), Some(EIP_B));
    let eip: std::net::IpAddr = EIP_B.parse().unwrap();
    assert!(c.nodes[1].ns.run(move || egressd::dataplane::conntrack::count(eip).unwrap()) > 0, "B tracks the flow");

    c.egress_ip("web", &[EIP_B, EIP6_B], &[(EIP_B, "node-c"), (EIP6_B, "node-c")], true);
    assert!(
        wait_for(Duration::from_secs(5), || c.has_addr(2, EIP_B) && c.has_addr(2, EIP6_B) && !c.has_addr(1, EIP_B))
            .is_some(),
        "{}",
        c.logs()
    );
    assert!(!c.has_addr(1, EIP6_B), "IPv6 address left B");
    let left = wait_for(Duration::from_secs(3), || {
        c.nodes[1].ns.run(move || egressd::dataplane::conntrack::count(eip).unwrap()) == 0
    });
    assert!(left.is_some(), "B still tracks connections of the egress IP it gave up");
    // An established connection may break here or, when C's conntrack picks it up
    // mid-stream and its SNAT keeps the source port, go on: neither is promised.
    let _ = flow.ask();
    // The gratuitous ARP and the unsolicited NA update the external host's entries.
    let c_mac = c.mac(2);
    for ip in [EIP_B, EIP6_B] {
        assert!(
            wait_for(Duration::from_secs(3), || c.ext_neighbour(ip).as_deref() == Some(c_mac.as_str())).is_some(),
            "neighbour entry of {ip} still {:?}, C is {c_mac}",
            c.ext_neighbour(ip)
        );
    }
    // New connections leave through C: A routes the marked packets to C, and only C
    // has the address that the replies come back to.
    let pod = &c.nodes[0].pods[0];
    assert!(wait_source(pod, EXT_V4, EIP_B), "after the move\n{}", c.logs());
    assert!(wait_source(pod, EXT_V6, EIP6_B), "after the move, IPv6\n{}", c.logs());
    let routes = c.nodes[0].ns.ip(&["route", "show", "table", "all", "proto", "233"]);
    assert!(routes.contains("via 198.19.0.3") && !routes.contains("via 198.19.0.2"), "{routes}");
    let c_rules = c.nodes[2].ns.exec(&["nft", "list", "chain", "inet", "egressd", "eip-snat-198-19-0-100"]);
    assert!(c_rules.contains("snat ip to 198.19.0.100"), "{c_rules}");
    assert!(!c.nodes[1].ns.exec(&["nft", "list", "table", "inet", "egressd"]).contains("eip-snat-198-19-0-100"));

    // No hosting node: the node's normal SNAT. A connection steered until now keeps
    // its (null) NAT binding on A, so its next packets must not go out directly with
    // the pod's address: they are dropped.
    let mut steered = Flow::open(&c.nodes[0].pods[0], EXT_V4);
    assert_eq!(steered.ask().as_deref(), Some(EIP_B));
    c.egress_ip("web", &[EIP_B, EIP6_B], &[], true);
    assert!(wait_source(&c.nodes[0].pods[0], EXT_V4, &node_v4(0)), "fallback\n{}", c.logs());
    assert!(wait_source(&c.nodes[0].pods[0], EXT_V6, &node_v6(0)), "fallback, IPv6\n{}", c.logs());
    assert!(wait_for(Duration::from_secs(5), || !c.has_addr(2, EIP_B)).is_some());
    let _ = steered.writer.write_all(b"after the fallback\n");
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(c.pod_sourced_packets(), 0, "a steered connection leaked the pod's address after the fallback");
    let guard = c.nodes[0].ns.exec(&["nft", "list", "chain", "inet", "egressd", "egress-guard"]);
    let dropped: u64 = guard
        .lines()
        .find(|l| l.contains("nfproto ipv4"))
        .and_then(|l| l.split("packets ").nth(1)?.split_whitespace().next()?.parse().ok())
        .unwrap_or(0);
    assert!(dropped > 0, "the guard saw nothing:\n{guard}");
}

#[test]
fn restart_keeps_connections_and_removes_stale_state() {
    let mut c = Cluster::new(&PODS);
    c.egress_ip("web", &[EIP_B, EIP6_B], &[(EIP_B, "node-b"), (EIP6_B, "node-b")], true);
    c.start_all();
    assert!(wait_source(&c.nodes[0].pods[0], EXT_V4, EIP_B), "{}", c.logs());
    let mut flow = Flow::open(&c.nodes[0].pods[0], EXT_V4);
    let mut flow6 = Flow::open(&c.nodes[0].pods[0], EXT_V6);
    assert_eq!(flow.ask().as_deref(), Some(EIP_B));
    assert_eq!(flow6.ask().as_deref(), Some(EIP6_B));
    let rules_before = c.nodes[0].ns.ip(&["rule"]);
    let routes_before = c.nodes[0].ns.ip(&["route", "show", "table", "all", "proto", "233"]);
    assert!(routes_before.contains("default via 198.19.0.2"), "{routes_before}");

    // Restart the agents on A and B: established connections go on, nothing flaps.
    for n in [0, 1] {
        c.nodes[n].agent.take().unwrap().stop();
        c.start(n, &[]);
    }
    assert_eq!(flow.ask().as_deref(), Some(EIP_B), "established connection after restart");
    assert_eq!(flow6.ask().as_deref(), Some(EIP6_B), "established IPv6 connection after restart");
    for n in [0, 1] {
        let log = c.nodes[n].agent.as_ref().unwrap().log_text();
        assert!(
            !log.contains("egress IP added") && !log.contains("rules and routes updated"),
            "flap on restart:\n{log}"
        );
    }
    assert_eq!(c.nodes[0].ns.ip(&["rule"]), rules_before);

    // State left by an earlier run that no longer matches is removed at start-up.
    c.nodes[1].agent.take().unwrap().stop();
    c.egress_ip("web", &[EIP_B, EIP6_B], &[(EIP_B, "node-c"), (EIP6_B, "node-c")], true);
    assert!(c.has_addr(1, EIP_B), "a stopped agent leaves its addresses in place");
    c.start(1, &[]);
    assert!(!c.has_addr(1, EIP_B) && !c.has_addr(1, EIP6_B), "stale address removed at start-up");
    // An address of someone else on the same link is never touched.
    c.nodes[1].ns.ip(&["addr", "add", "198.19.0.200/32", "dev", "eth0"]);
    c.nodes[1].agent.take().unwrap().stop();
    c.start(1, &[]);
    assert!(c.has_addr(1, "198.19.0.200"), "foreign address removed");
    assert_eq!(c.pod_sourced_packets(), 0);

    // `egressd cleanup` removes exactly what egressd owns: table, addresses, rules, routes.
    // B (stopped, then restarted) held the address until its restart removed it: C's
    // duplicate address probe found it in use, and C takes it at a later probe (every
    // 2 s while a conflict lasts).
    assert!(
        wait_for(Duration::from_secs(8), || c.has_addr(2, EIP_B)).is_some(),
        "C hosts after the move\n{}",
        c.logs()
    );
    c.nodes[2].ns.ip(&["addr", "add", "198.19.0.201/32", "dev", "eth0"]);
    for n in [0, 1, 2] {
        c.nodes[n].agent.take().map(|mut a| a.stop());
        let (ok, out) = c.nodes[n].ns.try_exec(&[netns::egressd_bin().to_str().unwrap(), "cleanup"]);
        assert!(ok, "cleanup failed: {out}");
        assert!(!c.nodes[n].ns.has_table("egressd"));
        assert_eq!(c.nodes[n].ns.ip(&["route", "show", "table", "all", "proto", "233"]).trim(), "");
        assert!(!c.nodes[n].ns.ip(&["rule"]).contains("fwmark"));
    }
    assert!(!c.has_addr(2, EIP_B) && !c.has_addr(2, EIP6_B), "egress addresses removed");
    assert!(c.has_addr(2, "198.19.0.201") && c.has_addr(2, &node_v4(2)), "other addresses kept");
    assert!(c.nodes[0].ns.ip(&["rule"]).contains("lookup main"), "other rules kept");
}

#[test]
fn conflicts_are_reported_and_not_applied() {
    let mut c = Cluster::new(&PODS);
    // Older object first: "alpha" (by name, both without creation time) keeps EIP_B.
    c.egress_ip("alpha", &[EIP_B], &[(EIP_B, "node-b")], true);
    c.egress_ip(
        "beta",
        &[EIP_B, "198.19.0.3", "192.0.2.77"],
        &[(EIP_B, "node-c"), ("198.19.0.3", "node-c"), ("192.0.2.77", "node-b")],
        false,
    );
    c.start(1, &[]);
    c.start(2, &[]);
    assert!(wait_for(Duration::from_secs(5), || c.has_addr(1, EIP_B)).is_some());
    assert!(!c.has_addr(2, EIP_B), "the younger claim is not applied");
    assert!(!c.has_addr(1, "192.0.2.77"), "an IP no link can host is not added");
    assert!(c.status_shows(1, "192.0.2.77") && c.status_shows(2, "EgressIP beta"), "no status written");
    let b = c.status(1);
    let cs = c.status(2);
    assert!(
        b.contains("egress IP 192.0.2.77 cannot be hosted on node node-b: no up link has a subnet containing it"),
        "{b}"
    );
    assert!(cs.contains("egress IP 198.19.0.100 is also claimed by the older EgressIP alpha; not used"), "{cs}");
    assert!(cs.contains("egress IP 198.19.0.3 is the address of a node; not used"), "{cs}");
    assert!(cs.contains("EgressIP beta\tfailed"), "{cs}");
}

#[test]
fn fail_closed_drops_when_no_node_hosts() {
    let mut c = Cluster::new(&PODS);
    c.egress_ip("web", &[EIP_B], &[], true);
    c.start(0, &["--egress-ip-fail-closed"]);
    let pod = &c.nodes[0].pods[0];
    assert_eq!(tcp(pod, EXT_V4, 8080), None, "fail-closed: dropped");
    assert_eq!(tcp(&c.nodes[0].pods[2], EXT_V4, 8080), Some(node_v4(0)), "unselected pod unaffected");
    assert_eq!(tcp(pod, &pod_v4(1, 0), 8080), Some(pod_v4(0, 0)), "in-cluster traffic unaffected");
    assert!(c.status_shows(0, "1 dropped (no hosting node)"), "{}", c.status(0));
}

#[test]
fn an_address_on_a_second_link_leaves_by_that_link() {
    let mut c = Cluster::new(&PODS);
    c.second_link_on_b();
    c.egress_ip("web", &["198.51.100.100"], &[("198.51.100.100", "node-b")], true);
    c.start_all();
    assert!(
        wait_for(Duration::from_secs(5), || c.nodes[1]
            .ns
            .ip(&["-o", "addr", "show", "dev", "eth1"])
            .contains(" 198.51.100.100/"))
        .is_some(),
        "{}",
        c.logs()
    );
    // From A (steered to B over eth0, then out of eth1) and from B itself.
    assert!(wait_source(&c.nodes[0].pods[0], EXT_V4, "198.51.100.100"), "{}", c.logs());
    assert_eq!(tcp(&c.nodes[1].pods[0], EXT_V4, 8080).as_deref(), Some("198.51.100.100"));
    let (eth0, eth1) = c.second_link_packets();
    assert!(eth1 > 0 && eth0 == 0, "egress IP traffic arrived on eth0 {eth0} times, on eth1 {eth1} times");
    // Unselected pods keep the default route and the node's address.
    assert_eq!(tcp(&c.nodes[0].pods[2], EXT_V4, 8080), Some(node_v4(0)));
    assert!(c.status_shows(1, "EgressIP web\tapplied"), "{}", c.status(1));
    assert_eq!(c.pod_sourced_packets(), 0);
}

#[test]
fn drift_is_restored_and_link_changes_are_followed() {
    let mut c = Cluster::new(&PODS);
    c.second_link_on_b();
    c.egress_ip("web", &[EIP_B, "198.51.100.100"], &[(EIP_B, "node-c"), ("198.51.100.100", "node-b")], true);
    // The periodic check is far away: what follows is noticed by notifications.
    for n in 0..3 {
        c.start(n, &["--net-check-secs", "600"]);
    }
    let on_eth1 = |c: &Cluster| c.nodes[1].ns.ip(&["-o", "addr", "show", "dev", "eth1"]).contains(" 198.51.100.100/");
    assert!(wait_for(Duration::from_secs(5), || on_eth1(&c) && c.has_addr(2, EIP_B)).is_some(), "{}", c.logs());

    // Someone removes egressd's address on C and its rule on A: both come back.
    c.nodes[2].ns.ip(&["addr", "del", &format!("{EIP_B}/32"), "dev", "eth0"]);
    let rule = c.nodes[0].ns.ip(&["rule"]);
    assert!(rule.contains("5470:"), "{rule}");
    c.nodes[0].ns.ip(&["rule", "del", "priority", "5470"]);
    assert!(
        wait_for(Duration::from_secs(5), || c.has_addr(2, EIP_B) && c.nodes[0].ns.ip(&["rule"]).contains("5470:"))
            .is_some(),
        "drift not restored within 5 s\n{}",
        c.logs()
    );
    // The log line follows the rest of the sync (the address is back first).
    let log_c = || c.nodes[2].agent.as_ref().unwrap().log_text();
    let said = wait_for(Duration::from_secs(5), || log_c().contains("changed by someone else; restored"));
    assert!(said.is_some(), "{}", log_c());

    // The address goes together with a link change (one burst of notifications): the
    // recompile the link change causes reads the kernel back and repairs too.
    let restored = |c: &Cluster| {
        c.nodes[2].agent.as_ref().unwrap().log_text().matches("changed by someone else; restored").count()
    };
    let before = restored(&c);
    c.nodes[2].ns.exec(&[
        "sh",
        "-c",
        &format!("ip addr add 198.18.3.99/32 dev vp0 && ip addr del {EIP_B}/32 dev eth0"),
    ]);
    let back = wait_for(Duration::from_secs(5), || c.has_addr(2, EIP_B) && restored(&c) > before);
    assert!(back.is_some(), "not restored with a link change\n{}", c.nodes[2].agent.as_ref().unwrap().log_text());

    // B's eth1 goes down: the address cannot be hosted there any more and is removed,
    // reported; back up, it returns.
    c.nodes[1].ns.ip(&["link", "set", "eth1", "down"]);
    let reported = wait_for(Duration::from_secs(5), || {
        c.status(1).contains("egress IP 198.51.100.100 cannot be hosted on node node-b") && !on_eth1(&c)
    });
    assert!(reported.is_some(), "{}\n{}", c.status(1), c.logs());
    c.nodes[1].ns.ip(&["link", "set", "eth1", "up"]);
    assert!(wait_for(Duration::from_secs(5), || on_eth1(&c)).is_some(), "{}", c.logs());
    // The link's default route went with it; the agent reports that until it is back.
    let no_route = wait_for(Duration::from_secs(5), || c.status(1).contains("has no default route of its own"));
    assert!(no_route.is_some(), "{}", c.status(1));
    c.nodes[1].ns.ip(&["route", "add", "default", "via", "198.51.100.254", "dev", "eth1", "metric", "100"]);
    assert!(
        wait_for(Duration::from_secs(5), || c.status(1).contains("EgressIP web\tapplied")).is_some(),
        "{}",
        c.status(1)
    );
}

#[test]
fn an_address_another_host_answers_for_is_not_taken() {
    // The external host on the segment already uses EIP_B and EIP6_B: the duplicate
    // address probe (ARP probe / neighbour solicitation) finds it, node-b does not take
    // the addresses and says why; once the other host lets go, node-b takes them.
    let mut c = Cluster::new(&PODS);
    addr(&c.ext, "eth0", &format!("{EIP_B}/24"));
    c.ext.ip(&["addr", "add", &format!("{EIP6_B}/64"), "dev", "eth0", "nodad"]);
    c.egress_ip("web", &[EIP_B, EIP6_B], &[(EIP_B, "node-b"), (EIP6_B, "node-b")], true);
    c.start(1, &["--net-check-secs", "2"]);
    let conflict = |ip: &str| format!("egress IP {ip} is in use by another host (MAC ");
    let reported = wait_for(Duration::from_secs(5), || {
        let s = c.status(1);
        s.contains(&conflict(EIP_B)) && s.contains(&conflict(EIP6_B))
    });
    assert!(reported.is_some(), "{}\n{}", c.status(1), c.logs());
    assert!(!c.has_addr(1, EIP_B) && !c.has_addr(1, EIP6_B), "taken although in use");
    let status = c.status(1);
    assert!(status.contains("EgressIP web\tfailed"), "{status}");
    assert!(status.contains("answered the duplicate address probe; not hosted on node node-b"), "{status}");

    // The other host lets go: the next probes go unanswered and node-b hosts them.
    c.ext.ip(&["addr", "del", &format!("{EIP_B}/24"), "dev", "eth0"]);
    c.ext.ip(&["addr", "del", &format!("{EIP6_B}/64"), "dev", "eth0"]);
    let taken = wait_for(Duration::from_secs(30), || c.has_addr(1, EIP_B) && c.has_addr(1, EIP6_B));
    assert!(taken.is_some(), "{}\n{}", c.status(1), c.logs());
    assert!(
        wait_for(Duration::from_secs(5), || c.status_shows(1, "EgressIP web\tapplied")).is_some(),
        "{}",
        c.status(1)
    );
}

#[test]
fn a_flapping_uplink_under_a_hosted_egress_ip_is_announced_again() {
    // The segment's router (ext) keeps a stale neighbour entry for the egress IP while
    // node-b's uplink is down; when the link comes back, node-b announces the address
    // again and the router's entry points at node-b, and the pods leave as the egress IP.
    let mut c = Cluster::new(&PODS);
    c.egress_ip("web", &[EIP_B, EIP6_B], &[(EIP_B, "node-b"), (EIP6_B, "node-b")], true);
    c.start(0, &[]);
    c.start(1, &[]);
    let pod = &c.nodes[0].pods[0];
    assert!(wait_source(pod, EXT_V4, EIP_B), "{}", c.logs());
    assert!(wait_source(pod, EXT_V6, EIP6_B), "{}", c.logs());
    let b_mac = c.mac(1);
    for round in 0..3 {
        c.nodes[1].ns.ip(&["link", "set", "eth0", "down"]);
        std::thread::sleep(Duration::from_millis(300));
        // Meanwhile the router's entries go stale (another host answered, say).
        for ip in [EIP_B, EIP6_B] {
            c.ext.ip(&["neigh", "replace", ip, "lladdr", "02:00:00:00:00:99", "dev", "eth0", "nud", "stale"]);
        }
        c.nodes[1].ns.ip(&["link", "set", "eth0", "up"]);
        // The node's own routes through the link went with it: its network manager
        // puts them back (egressd restores only its own).
        // (IPv6 addresses are flushed on link down by default: the node's own is put
        // back by its network manager, the egress IP by egressd.)
        let ns = &c.nodes[1].ns;
        ns.ip(&["-6", "addr", "replace", &format!("{}/64", node_v6(1)), "dev", "eth0", "nodad"]);
        ns.ip(&["route", "replace", "203.0.113.0/24", "via", "198.19.0.254"]);
        let v6_back = wait_for(Duration::from_secs(5), || {
            ns.try_exec(&["ip", "-6", "route", "replace", "2001:db8:ff::/64", "via", "2001:db8:0:1::fe"]).0
        });
        assert!(v6_back.is_some(), "IPv6 on node-b's link did not come back");
        for m in [0, 2] {
            ns.ip(&["route", "replace", &format!("198.18.{}.0/24", m + 1), "via", &node_v4(m)]);
            ns.ip(&["-6", "route", "replace", &format!("2001:db8:1:{}0::/60", m + 1), "via", &node_v6(m)]);
        }
        for ip in [EIP_B, EIP6_B] {
            let announced = wait_for(Duration::from_secs(5), || c.ext_neighbour(ip).as_deref() == Some(b_mac.as_str()));
            assert!(
                announced.is_some(),
                "round {round}: the router's entry for {ip} is {:?}, node-b is {b_mac}\n{}",
                c.ext_neighbour(ip),
                c.logs()
            );
        }
        assert!(wait_source(pod, EXT_V4, EIP_B), "round {round}: after the flap\n{}", c.logs());
        assert!(wait_source(pod, EXT_V6, EIP6_B), "round {round}: after the flap, IPv6\n{}", c.logs());
    }
    assert_eq!(c.pod_sourced_packets(), 0);
}
