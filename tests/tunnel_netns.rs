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
    c.egress_ip("web", &[EIP], &[(EIP, "node-b")]);
    c.start_all(&[]);
    assert!(wait_for(Duration::from_secs(5), || c.has_addr(1, EIP)).is_some(), "{}", c.logs());
    let logs = || c.logs();
    // The other subnet: through the tunnel.
    let got = wait_for(Duration::from_secs(5), || source(&c, 2, 0).as_deref() == Some(EIP));
    assert!(got.is_some(), "pod on node-c: {:?}\n{}", source(&c, 2, 0), logs());
    // The shared subnet (direct) and the hosting node.
    assert_eq!(source(&c, 0, 0).as_deref(), Some(EIP), "pod on node-a\n{}", logs());
    assert_eq!(source(&c, 1, 0).as_deref(), Some(EIP), "pod on node-b");
    // Not selected: the node's own address.
    assert_eq!(source(&c, 2, 1), Some(node_ip(2)), "unselected pod on node-c");
    // node-c steers through the tunnel, node-a on its link.
    let routes_c = c.nodes[2].ns.ip(&["route", "show", "table", "all", "proto", "233"]);
    assert!(routes_c.contains("encap ip id 1245540") && routes_c.contains("dev egressd-vx"), "{routes_c}");
    let routes_a = c.nodes[0].ns.ip(&["route", "show", "table", "all", "proto", "233"]);
    assert!(routes_a.contains("via 198.19.1.2 dev eth0") && !routes_a.contains("encap"), "{routes_a}");
    assert!(!c.nodes[0].ns.ip(&["-o", "link"]).contains("egressd-vx"), "node-a uses no tunnel");

    // Full-size TCP both ways over the tunnel (1450-byte MTU): 2 MB up and down.
    assert_eq!(upload(&c.nodes[2].pods[0], 2_000_000), Some(2_000_000), "upload\n{}", logs());
    assert_eq!(download(&c.nodes[2].pods[0], 2_000_000), 2_000_000, "download");
    // The MSS of the steered connections was clamped to the tunnel's MTU.
    let mss = c.nodes[2].ns.exec(&["nft", "list", "chain", "inet", "egressd", "egress-tunnel-mss"]);
    assert!(mss.contains("maxseg size set rt mtu"), "{mss}");

    // Nothing with a pod source, or to a pod, crossed the router.
    let (pod_sources, foreign, to_pods) = c.vpc_drops();
    assert_eq!((pod_sources, foreign, to_pods), (0, 0, 0), "the VPC dropped packets\n{}", logs());
    assert!(c.status(2).contains("1 steered"), "{}", c.status(2));
    for n in 0..3 {
        let fallbacks = c.nodes[n].agent.as_ref().unwrap().nft_fallbacks();
        assert!(fallbacks.is_empty(), "node {n} synced through nft: {fallbacks:?}");
    }
}
