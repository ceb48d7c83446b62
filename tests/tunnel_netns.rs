//! EgressIP on a routed network (`netns::routed`): nodes in two subnets behind a router
//! that drops pod sources as a cloud VPC does. Steering across subnets goes through
//! egressd's VXLAN tunnel; on the shared subnet, `auto` stays direct. Root required.

mod netns;

use std::time::Duration;

use netns::routed::*;
use netns::{tcp, wait_for};

/// node-a: a prod pod; node-b: a prod pod; node-c (the other subnet): a prod pod and a
/// dev pod.
const PODS: [&[(&str, &str)]; 3] =
    [&[("prod", "{app: web}")], &[("prod", "{app: web}")], &[("prod", "{app: web}"), ("dev", "{app: web}")]];

fn source(c: &Routed, n: usize, i: usize) -> Option<String> {
    tcp(&c.nodes[n].pods[i], EXT, 8080)
}

#[test]
fn pods_in_another_subnet_leave_as_the_egress_ip_through_the_tunnel() {
    let mut c = Routed::new(&PODS);
    c.egress_ip("web", &[EIP, EIP6], &[(EIP, "node-b"), (EIP6, "node-b")]);
    c.start_all(&[]);
    assert!(wait_for(Duration::from_secs(5), || c.has_addr(1, EIP) && c.has_addr(1, EIP6)).is_some(), "{}", c.logs());
    let logs = || c.logs();
    // The other subnet: through the tunnel.
    let got = wait_for(Duration::from_secs(5), || source(&c, 2, 0).as_deref() == Some(EIP));
    assert!(got.is_some(), "pod on node-c: {:?}\n{}", source(&c, 2, 0), logs());
    // The shared subnet (direct) and the hosting node.
    assert_eq!(source(&c, 0, 0).as_deref(), Some(EIP), "pod on node-a\n{}", logs());
    assert_eq!(source(&c, 1, 0).as_deref(), Some(EIP), "pod on node-b");
    // IPv6 too (inner and outer IPv6), from the other subnet and the shared one.
    let got6 = wait_for(Duration::from_secs(5), || tcp(&c.nodes[2].pods[0], EXT6, 8080).as_deref() == Some(EIP6));
    assert!(got6.is_some(), "pod on node-c, IPv6: {:?}\n{}", tcp(&c.nodes[2].pods[0], EXT6, 8080), logs());
    assert_eq!(tcp(&c.nodes[0].pods[0], EXT6, 8080).as_deref(), Some(EIP6), "pod on node-a, IPv6");
    // Not selected: the node's own address.
    assert_eq!(source(&c, 2, 1), Some(node_ip(2)), "unselected pod on node-c");
    assert_eq!(tcp(&c.nodes[2].pods[1], EXT6, 8080), Some(node_ip6(2)), "unselected pod on node-c, IPv6");
    // node-c steers through the tunnel, node-a on its link.
    let routes_c = c.nodes[2].ns.ip(&["route", "show", "table", "all", "proto", "233"]);
    assert!(routes_c.contains("encap ip id 1245540") && routes_c.contains("dev egressd-vx"), "{routes_c}");
    assert!(routes_c.contains("encap ip6 id 256 "), "the IPv6 egress IP's key, outer IPv6: {routes_c}");
    let routes_a = c.nodes[0].ns.ip(&["route", "show", "table", "all", "proto", "233"]);
    assert!(routes_a.contains("via 198.19.1.2 dev eth0") && !routes_a.contains("encap"), "{routes_a}");
    assert!(!c.nodes[0].ns.ip(&["-o", "link"]).contains("egressd-vx"), "node-a uses no tunnel");

    // First, before any path MTU is learnt: the SYN of a steered connection was clamped to the tunnel's MTU (1450 - 40, less
    // the timestamp option), not to the pod's 1500; on node-a's direct path it was not.
    let clamped = server_mss(&c.nodes[2].pods[0]);
    assert!(clamped.is_some_and(|m| m <= 1410), "MSS through the tunnel: {clamped:?}");
    let direct = server_mss(&c.nodes[0].pods[0]);
    assert!(direct.is_some_and(|m| m > 1410), "MSS on the direct path: {direct:?}");
    // Full-size TCP both ways over the tunnel (1450-byte MTU): 2 MB up and down.
    assert_eq!(upload(&c.nodes[2].pods[0], 2_000_000), Some(2_000_000), "upload\n{}", logs());
    assert_eq!(download(&c.nodes[2].pods[0], 2_000_000), 2_000_000, "download");

    // Nothing with a pod source, or to a pod, crossed the router.
    let (pod_sources, foreign, to_pods) = c.vpc_drops();
    assert_eq!((pod_sources, foreign, to_pods), (0, 0, 0), "the VPC dropped packets\n{}", logs());
    assert!(c.status(2).contains("1 steered"), "{}", c.status(2));
    for n in 0..3 {
        let fallbacks = c.nodes[n].agent.as_ref().unwrap().nft_fallbacks();
        assert!(fallbacks.is_empty(), "node {n} synced through nft: {fallbacks:?}");
    }

    // A stopped agent leaves the dataplane in place; `egressd cleanup` removes the tunnel
    // (device, its neighbours and routes, the tunnel table's rules) with the rest.
    c.nodes[1].agent.take().unwrap().stop();
    assert!(c.nodes[1].ns.ip(&["-o", "link"]).contains("egressd-vx"), "left in place on stop");
    let (ok, out) = c.nodes[1].ns.try_exec(&[netns::egressd_bin().to_str().unwrap(), "cleanup"]);
    assert!(ok, "{out}");
    assert!(!c.nodes[1].ns.ip(&["-o", "link"]).contains("egressd-vx"));
    let left = c.nodes[1].ns.ip(&["route", "show", "table", "all", "proto", "233"])
        + &c.nodes[1].ns.ip(&["-6", "rule"])
        + &c.nodes[1].ns.ip(&["rule"]);
    assert!(!left.contains("7725") && !left.contains("egressd-vx"), "{left}");
}

/// A VXLAN packet with `key` and a junk inner frame, sent from `from` to node-b's port.
fn forge(from: &netns::Netns, key: u32) {
    let k = key.to_be_bytes();
    let mut packet = vec![0x08, 0, 0, 0, k[1], k[2], k[3], 0];
    packet.extend_from_slice(&[0u8; 60]);
    from.run(move || {
        let s = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
        for _ in 0..3 {
            s.send_to(&packet, (node_ip(1).as_str(), 4800)).unwrap();
        }
    });
}

/// node-b's tunnel counters: (foreign sources, unknown keys).
fn tunnel_drops(c: &Routed) -> (u64, u64) {
    let count = |name: &str| {
        let text = c.nodes[1].ns.exec(&["nft", "list", "counter", "inet", "egressd", name]);
        counters(&text).first().copied().unwrap_or(0)
    };
    (count("eip-tunnel-foreign-source"), count("eip-tunnel-unknown-key"))
}

/// node-b's `egressd_egress_ip_tunnel_dropped_total` for `reason`.
fn tunnel_metric(c: &Routed, reason: &str) -> Option<u64> {
    let (_, body) = netns::http_get(&c.nodes[1].ns, "127.0.0.1:9781", "/metrics")?;
    let needle = format!("egressd_egress_ip_tunnel_dropped_total{{reason=\"{reason}\"}} ");
    body.lines().find_map(|l| l.strip_prefix(&needle)?.trim().parse().ok())
}

#[test]
fn forged_tunnel_packets_are_dropped_and_counted_and_failover_crosses_subnets() {
    let mut c = Routed::new(&PODS);
    c.egress_ip("web", &[EIP], &[(EIP, "node-b")]);
    c.start_all(&[]);
    assert!(wait_for(Duration::from_secs(5), || source(&c, 2, 0).as_deref() == Some(EIP)).is_some(), "{}", c.logs());
    assert_eq!(tunnel_drops(&c), (0, 0));
    // The right key from a host that is not a node: dropped as a foreign source.
    forge(&c.ext, 0x13_0164);
    assert!(wait_for(Duration::from_secs(2), || tunnel_drops(&c).0 == 3).is_some(), "{:?}", tunnel_drops(&c));
    // A node sending a key node-b does not host: dropped as unknown.
    forge(&c.nodes[0].ns, 0x12_3456);
    assert!(wait_for(Duration::from_secs(2), || tunnel_drops(&c) == (3, 3)).is_some(), "{:?}", tunnel_drops(&c));
    // Read into the metrics (every 5 s).
    let counted = wait_for(Duration::from_secs(8), || {
        tunnel_metric(&c, "foreign_source") == Some(3) && tunnel_metric(&c, "unknown_key") == Some(3)
    });
    assert!(counted.is_some(), "{:?} {:?}", tunnel_metric(&c, "foreign_source"), tunnel_metric(&c, "unknown_key"));
    assert_eq!(source(&c, 2, 0).as_deref(), Some(EIP), "real traffic still passes");

    // The egress IP moves to node-a (same subnet as node-b, other than node-c's): node-c's
    // pod follows through the tunnel to node-a; node-b's pod is now steered on its link.
    c.egress_ip("web", &[EIP], &[(EIP, "node-a")]);
    assert!(wait_for(Duration::from_secs(5), || c.has_addr(0, EIP) && !c.has_addr(1, EIP)).is_some(), "{}", c.logs());
    let moved = wait_for(Duration::from_secs(5), || {
        source(&c, 2, 0).as_deref() == Some(EIP) && {
            c.nodes[2].ns.ip(&["route", "show", "table", "all", "proto", "233"]).contains("dst 198.19.1.1 ")
        }
    });
    assert!(moved.is_some(), "{}", c.logs());
    assert_eq!(source(&c, 1, 0).as_deref(), Some(EIP), "pod on node-b, steered to node-a");
    assert_eq!(c.vpc_drops(), (0, 0, 0), "the VPC dropped packets\n{}", c.logs());
    // node-b hosts nothing and steers directly: its tunnel device is gone.
    let gone = wait_for(Duration::from_secs(5), || !c.nodes[1].ns.ip(&["-o", "link"]).contains("egressd-vx"));
    assert!(gone.is_some(), "{}", c.nodes[1].ns.ip(&["-o", "link"]));

    // Unplaced: node-c's route through the tunnel and its device go, its pod falls back
    // to the node's own address, and no sync failed on the way.
    c.egress_ip("web", &[EIP], &[]);
    let routes = || c.nodes[2].ns.ip(&["route", "show", "table", "all", "proto", "233"]);
    let fell_back = wait_for(Duration::from_secs(5), || {
        !routes().contains("encap") && !c.nodes[2].ns.ip(&["-o", "link"]).contains("egressd-vx")
    });
    assert!(fell_back.is_some(), "{}\n{}", routes(), c.logs());
    assert_eq!(source(&c, 2, 0), Some(node_ip(2)));
    assert!(!c.logs().contains("netlink sync failed"), "{}", c.logs());
}

#[test]
fn direct_transport_cannot_cross_subnets_and_says_so() {
    let mut c = Routed::new(&PODS);
    c.egress_ip("web", &[EIP], &[(EIP, "node-b")]);
    c.start(1, &[]);
    c.start(2, &["--egress-ip-transport", "direct"]);
    assert!(wait_for(Duration::from_secs(5), || c.has_addr(1, EIP)).is_some(), "{}", c.logs());
    let said = wait_for(Duration::from_secs(5), || {
        c.status(2).contains("placed on node node-b, which has no IPv4 address on a link shared with node node-c")
    });
    assert!(said.is_some(), "{}", c.status(2));
    // Left to the node's own SNAT (the reference's fallback), never sent with its pod source.
    assert_eq!(source(&c, 2, 0), Some(node_ip(2)));
    assert_eq!(c.vpc_drops(), (0, 0, 0));
}
