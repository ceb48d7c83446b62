//! EgressIP placement by the leader, against the real test API server: three nodes
//! (`netns::cluster`), each running egressd in Kubernetes mode; the API server runs in
//! the external host's namespace, reached by the nodes over the LAN. node-a starts first
//! and leads; node-b and node-c are labelled `k8s.ovn.org/egress-assignable`. Root
//! required.
//!
//! `failover_bench` (ignored here; `bench/failover.sh` runs it) measures the failover
//! time docs/egressip.md and bench/RESULTS.md give.

mod netns;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use netns::cluster::*;
use netns::kube::*;
use netns::{Agent, failover, tcp, wait_for};

const API_HOST: &str = "198.19.0.254";
const V6_EIP: &str = "2001:db8:0:1::100";
const LABEL: &str = "k8s.ovn.org/egress-assignable";

/// Pods: node-a has a prod web pod; node-b and node-c one each.
const PODS: [&[(&str, &str)]; 3] = [&[("prod", "{app: web}")], &[("prod", "{app: web}")], &[("prod", "{app: web}")]];

struct Kube {
    c: Cluster,
    dir: PathBuf,
}

fn new_cluster() -> Kube {
    let c = Cluster::new(&PODS);
    let dir = c.dir.path().join("kube");
    Kube { c, dir }
}

/// Declare the nodes (b and c labelled), the namespace and the pods.
fn declare(api: &ApiServer, c: &Cluster) {
    let names: Vec<&str> = c.nodes.iter().map(|n| n.name.as_str()).collect();
    let pods: Vec<usize> = c.nodes.iter().map(|n| n.pods.len()).collect();
    declare_egress_cluster(
        api,
        &names,
        &pods,
        |n| n > 0,
        |n| vec![node_v4(n), node_v6(n)],
        |n, i| [pod_v4(n, i), pod_v6(n, i)],
    );
}

fn set_ready(api: &ApiServer, name: &str, n: usize, ready: bool) {
    node_status(api, name, &[&node_v4(n), &node_v6(n)], ready);
}

/// Start egressd in Kubernetes mode on node `n`.
fn start(k: &Kube, api: &ApiServer, n: usize) -> Agent {
    start_with(k, api, n, &[])
}

fn start_with(k: &Kube, api: &ApiServer, n: usize, extra: &[&str]) -> Agent {
    let node = &k.c.nodes[n];
    let health = format!("127.0.0.1:{}", 9780 + n);
    start_kube_agent(&node.ns, api, k.c.dir.path(), &node.name, &health, &["198.18.0.0/16", "2001:db8:1::/48"], extra)
}

fn start_all(k: &Kube, api: &ApiServer) -> Vec<Option<Agent>> {
    start_all_with(k, api, &[])
}

fn start_all_with(k: &Kube, api: &ApiServer, extra: &[&str]) -> Vec<Option<Agent>> {
    let a = start_with(k, api, 0, extra);
    assert!(wait_for(Duration::from_secs(10), || holder(api) == "node-a").is_some(), "node-a never led");
    vec![Some(a), Some(start_with(k, api, 1, extra)), Some(start_with(k, api, 2, extra))]
}

/// Who holds the leader Lease.
fn holder(api: &ApiServer) -> String {
    api.get(&["lease", "egressd-leader", "-n", "egressd", "-o", "jsonpath={.spec.holderIdentity}"])
}

fn node_index(name: &str) -> usize {
    ["node-a", "node-b", "node-c"].iter().position(|n| *n == name).unwrap()
}

fn logs(agents: &[Option<Agent>]) -> String {
    agents.iter().flatten().map(|a| format!("--- {}\n{}", a.log.display(), a.log_text())).collect()
}

fn events(api: &ApiServer) -> String {
    api.get(&["events", "-n", "default", "-o", r#"jsonpath={range .items[*]}{.reason}: {.message}{"\n"}{end}"#])
}

#[test]
fn the_leader_places_spreads_and_follows_labels_readiness_and_spec_edits() {
    let k = new_cluster();
    let api = ApiServer::start(&k.c.ext, k.dir.clone(), API_HOST);
    declare(&api, &k.c);
    let agents = start_all(&k, &api);
    let dump = |what: &str| format!("{what}\n{}\n{}", api.get(&["egressip", "-o", "yaml"]), logs(&agents));

    // Two IPs of one EgressIP, IPv4 and IPv6: one per node, on the two labelled nodes.
    egress_ip(&api, "e1", &[EIP_B, V6_EIP]);
    let placed = wait_for(Duration::from_secs(15), || items(&api, "e1").len() == 2);
    assert!(placed.is_some(), "{}", dump("e1 not placed"));
    let e1 = items(&api, "e1");
    let hosts: Vec<&str> = e1.iter().map(|(_, n)| n.as_str()).collect();
    assert!(hosts.contains(&"node-b") && hosts.contains(&"node-c"), "one per node, never node-a: {e1:?}");
    for (ip, node) in &e1 {
        let n = node_index(node);
        assert!(wait_for(Duration::from_secs(5), || k.c.has_addr(n, ip)).is_some(), "{ip} on {node}");
    }
    // The unlabelled leader's pod leaves as the IPv4 egress IP (steered to its host).
    let a_pod = &k.c.nodes[0].pods[0];
    let v4 = wait_for(Duration::from_secs(5), || tcp(a_pod, EXT_V4, 8080).as_deref() == Some(EIP_B));
    assert!(v4.is_some(), "{}", dump("pod on node-a not SNATed to the egress IP"));
    let v6 = wait_for(Duration::from_secs(5), || tcp(a_pod, EXT_V6, 8080).as_deref() == Some(V6_EIP));
    assert!(v6.is_some(), "{}", dump("IPv6 pod on node-a not SNATed to the egress IP"));
    // The nodes published their subnets.
    let ann = api.get(&["node", "node-b", "-o", r#"jsonpath={.metadata.annotations.egressd\.io/egress-subnets}"#]);
    assert_eq!(ann, r#"["198.19.0.0/24","2001:db8:0:1::/64"]"#);

    // A second EgressIP goes to the least loaded node (a tie: by name, node-b).
    egress_ip(&api, "e2", &[EIP_C]);
    assert!(wait_for(Duration::from_secs(10), || items(&api, "e2").len() == 1).is_some(), "{}", dump("e2"));
    assert_eq!(items(&api, "e2"), vec![(EIP_C.to_string(), "node-b".to_string())]);
    // Stable: nothing moves while nothing changes.
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(items(&api, "e1"), e1);
    assert_eq!(items(&api, "e2"), vec![(EIP_C.to_string(), "node-b".to_string())]);

    // Conflicts: a node's address, and an IP an older EgressIP has.
    egress_ip(&api, "e3", &[&node_v4(1)]);
    egress_ip(&api, "e4", &[EIP_C]);
    let conflict = wait_for(Duration::from_secs(10), || {
        let ev = events(&api);
        ev.contains("EgressIPConflict: Egress IP e3 with IP 198.19.0.2 is conflicting with a host (node-b) IP address")
            && ev.contains(&format!(
                "UnsupportedRequest: IP: \"{EIP_C}\" for EgressIP: e4 is already allocated for EgressIP: e2 on node-b"
            ))
    });
    assert!(conflict.is_some(), "{}\n{}", events(&api), logs(&agents));
    assert!(items(&api, "e3").is_empty() && items(&api, "e4").is_empty());

    // The label leaves node-b: e2 moves to node-c; e1's IP there has nowhere to go (node-c
    // holds e1's other IP): unassigned, with the reference's Event.
    let (b_ip, _) = e1.iter().find(|(_, n)| n == "node-b").unwrap().clone();
    let (ok, out) = api.kubectl(&["label", "node", "node-b", &format!("{LABEL}-")], "");
    assert!(ok, "{out}");
    let moved =
        wait_for(Duration::from_secs(5), || items(&api, "e2") == vec![(EIP_C.to_string(), "node-c".to_string())]);
    assert!(moved.is_some(), "{}", dump("e2 not moved within 5 s of the label removal"));
    assert!(wait_for(Duration::from_secs(5), || items(&api, "e1").len() == 1).is_some(), "{}", dump("e1"));
    assert!(wait_for(Duration::from_secs(5), || !k.c.has_addr(1, &b_ip) && !k.c.has_addr(1, EIP_C)).is_some());
    assert!(wait_for(Duration::from_secs(5), || k.c.has_addr(2, EIP_C)).is_some(), "e2 hosted on node-c");
    let unassigned = wait_for(Duration::from_secs(5), || {
        events(&api)
            .contains("UnassignedRequest: Not all egress IPs for EgressIP: e1 could be assigned, please tag more nodes")
    });
    assert!(unassigned.is_some(), "{}", events(&api));

    // Labelled again: e1's missing IP goes there; e2 stays where it is now.
    let (ok, out) = api.kubectl(&["label", "node", "node-b", &format!("{LABEL}=")], "");
    assert!(ok, "{out}");
    assert!(wait_for(Duration::from_secs(5), || items(&api, "e1") == e1).is_some(), "{}", dump("e1 back"));
    assert_eq!(items(&api, "e2"), vec![(EIP_C.to_string(), "node-c".to_string())], "no move back");

    // node-c NotReady: e2 moves to node-b within 5 s.
    set_ready(&api, "node-c", 2, false);
    let moved =
        wait_for(Duration::from_secs(5), || items(&api, "e2") == vec![(EIP_C.to_string(), "node-b".to_string())]);
    assert!(moved.is_some(), "{}", dump("e2 not moved off the NotReady node"));

    // A spec edit drops e1's IPv4 address: its item goes, and so does the address.
    let v4_host = e1.iter().find(|(i, _)| i == EIP_B).unwrap().1.clone();
    egress_ip(&api, "e1", &[V6_EIP]);
    let dropped = wait_for(Duration::from_secs(5), || items(&api, "e1").iter().all(|(i, _)| i != EIP_B));
    assert!(dropped.is_some(), "{}", dump("the dropped IP kept its item"));
    let n = node_index(&v4_host);
    assert!(
        wait_for(Duration::from_secs(5), || !k.c.has_addr(n, EIP_B)).is_some(),
        "address of the dropped IP removed"
    );
}

/// One new connection from `pod` to the external echo server: the source it saw.
fn quick_source(pod: &netns::Netns) -> Option<String> {
    failover::quick_source(pod, SocketAddr::new(EXT_V4.parse().unwrap(), ECHO_PORT))
}

/// The node hosting `EIP_B` per `status.items`.
fn host_of(api: &ApiServer) -> Option<usize> {
    items(api, "e1").first().map(|(_, n)| node_index(n))
}

/// Kill node `n`: its uplink down and its agent SIGKILLed (API objects unchanged).
fn kill_node(k: &Kube, agents: &mut [Option<Agent>], n: usize) {
    failover::kill_node(&k.c.nodes[n].ns, &mut agents[n]);
}

/// Bring node `n` back: uplink up, agent restarted.
fn revive_node(k: &Kube, api: &ApiServer, agents: &mut [Option<Agent>], n: usize) {
    k.c.uplink_up(n);
    agents[n] = Some(start(k, api, n));
}

/// From the kill to the first new connection of node-a's pod (node-a never hosts) and of
/// the surviving node's pod leaving as the egress IP.
fn measure_failover(k: &Kube, agents: &mut [Option<Agent>], host: usize) -> Option<Duration> {
    let other = if host == 1 { 2 } else { 1 };
    let t0 = Instant::now();
    kill_node(k, agents, host);
    let pods = [&k.c.nodes[0].pods[0], &k.c.nodes[other].pods[0]];
    failover::until_all_leave_as(&pods, SocketAddr::new(EXT_V4.parse().unwrap(), ECHO_PORT), EIP_B, t0)
}

/// EgressIP `e1` of `EIP_B`, placed on node-b (the first labelled node by name) and used
/// by node-a's pod, which is returned.
fn e1_on_node_b<'k>(k: &'k Kube, api: &ApiServer) -> &'k netns::Netns {
    egress_ip(api, "e1", &[EIP_B]);
    assert!(wait_for(Duration::from_secs(15), || host_of(api) == Some(1)).is_some(), "e1 on node-b (by name)");
    let a_pod = &k.c.nodes[0].pods[0];
    assert!(wait_for(Duration::from_secs(5), || quick_source(a_pod).as_deref() == Some(EIP_B)).is_some());
    a_pod
}

#[test]
fn a_dead_node_loses_its_egress_ip_a_recovered_one_does_not_take_it_back_and_a_new_leader_adopts() {
    let k = new_cluster();
    let api = ApiServer::start(&k.c.ext, k.dir.clone(), API_HOST);
    declare(&api, &k.c);
    let mut agents = start_all(&k, &api);
    let a_pod = e1_on_node_b(&k, &api);

    // node-c, assignable and hosting nothing, has the tunnel ready; on this one segment
    // the other nodes steer to it on-link, so it keeps no per-peer route.
    let ready = || k.c.nodes[2].ns.ip(&["-o", "link"]).contains("egressd-vx");
    assert!(wait_for(Duration::from_secs(5), ready).is_some(), "{}", k.c.nodes[2].ns.ip(&["-o", "link"]));
    let routes = k.c.nodes[2].ns.ip(&["route", "show", "table", "all", "proto", "233"]);
    assert!(!routes.contains("dev egressd-vx"), "{routes}");

    // node-b dies: its egress IP moves to node-c, whose announcement the router follows.
    let took = measure_failover(&k, &mut agents, 1);
    assert!(took.is_some_and(|t| t < Duration::from_secs(5)), "failover took {took:?}\n{}", logs(&agents));
    assert_eq!(host_of(&api), Some(2));
    assert!(k.c.has_addr(2, EIP_B));
    assert_eq!(k.c.ext_neighbour(EIP_B), Some(k.c.mac(2)), "the router follows the new host");

    // node-b comes back: the stale address is removed at start-up, nothing moves back.
    revive_node(&k, &api, &mut agents, 1);
    assert!(wait_for(Duration::from_secs(5), || !k.c.has_addr(1, EIP_B)).is_some(), "stale address removed");
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(host_of(&api), Some(2), "no move back on recovery");
    assert_eq!(k.c.ext_neighbour(EIP_B), Some(k.c.mac(2)));
    let target = SocketAddr::new(EXT_V4.parse().unwrap(), ECHO_PORT);
    assert_eq!(failover::source_within(a_pod, target, Duration::from_secs(3)).as_deref(), Some(EIP_B));

    // The leader dies (SIGKILL, link up): another agent takes the lease and adopts the
    // placement as it is.
    if let Some(mut a) = agents[0].take() {
        a.kill();
    }
    let new_leader = wait_for(Duration::from_secs(15), || matches!(holder(&api).as_str(), "node-b" | "node-c"));
    assert!(new_leader.is_some(), "no new leader: {}", holder(&api));
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(host_of(&api), Some(2), "the new leader keeps the placement\n{}", logs(&agents));

    // Then the host dies too: the new leader moves the IP to node-b (whichever leads,
    // a dead leader's lease expires first).
    kill_node(&k, &mut agents, 2);
    let moved = wait_for(Duration::from_secs(15), || host_of(&api) == Some(1) && k.c.has_addr(1, EIP_B));
    assert!(moved.is_some(), "{}\n{}", api.get(&["egressip", "-o", "yaml"]), logs(&agents));
    let b_pod = &k.c.nodes[1].pods[0];
    let local = wait_for(Duration::from_secs(5), || quick_source(b_pod).as_deref() == Some(EIP_B));
    assert!(
        local.is_some(),
        "node-b's own pod: {:?}; router's entry {:?} (node-b {}, node-c {})\n{}\n{}",
        tcp(b_pod, EXT_V4, 8080),
        k.c.ext_neighbour(EIP_B),
        k.c.mac(1),
        k.c.mac(2),
        k.c.nodes[1].ns.exec(&["sh", "-c", "nft list table inet egressd | grep -A3 'eip-snat-v4 {'; ip rule; ip route show table all proto 233; ip -o addr"]),
        agents[1].as_ref().map(|a| a.log_text().lines().filter(|l| l.contains("EgressIP") || l.contains("host") || l.contains("placement") || l.contains("lease")).collect::<Vec<_>>().join("\n")).unwrap_or_default(),
    );
}

/// The failover figure: RUNS (default 10) kills of the hosting node (never the leader),
/// each followed by its recovery; prints a table. `bench/failover.sh` runs it. With
/// SPLIT=1 the split layout's controller leads and the agents run `--role node`.
#[test]
#[ignore = "a benchmark: run by bench/failover.sh"]
fn failover_bench() {
    let runs: usize = std::env::var("RUNS").ok().and_then(|r| r.parse().ok()).unwrap_or(10);
    let split = std::env::var("SPLIT").is_ok_and(|s| s == "1");
    let k = new_cluster();
    let api = ApiServer::start(&k.c.ext, k.dir.clone(), API_HOST);
    declare(&api, &k.c);
    let (controller, mut agents) = if split {
        let (controller, agents) = start_split(&k, &api, &[], &[]);
        (Some(controller), agents)
    } else {
        (None, start_all(&k, &api))
    };
    let node_args: Vec<Vec<String>> = (0..3).map(|n| if split { node_role(&k, &api, n) } else { Vec::new() }).collect();
    egress_ip(&api, "e1", &[EIP_B]);
    assert!(wait_for(Duration::from_secs(15), || host_of(&api).is_some()).is_some());
    let a_pod = &k.c.nodes[0].pods[0];
    assert!(wait_for(Duration::from_secs(5), || quick_source(a_pod).as_deref() == Some(EIP_B)).is_some());
    let mut times = Vec::new();
    failover::print_header();
    for run in 1..=runs {
        let host = host_of(&api).unwrap();
        let took = measure_failover(&k, &mut agents, host).unwrap_or_else(|| panic!("run {run}: no failover"));
        let new = host_of(&api).unwrap();
        println!("| {run} | {} | {} | {} |", k.c.nodes[host].name, k.c.nodes[new].name, took.as_millis());
        times.push(took);
        // Counted before the revival: the leader may see it answer before start() returns.
        let seen = failover::reachable_count(controller.as_ref().or(agents[0].as_ref()));
        k.c.uplink_up(host);
        let extra: Vec<&str> = node_args[host].iter().map(String::as_str).collect();
        agents[host] = Some(start_with(&k, &api, host, &extra));
        assert!(wait_for(Duration::from_secs(5), || !k.c.has_addr(host, EIP_B)).is_some());
        failover::leader_sees_it_again(controller.as_ref().or(agents[0].as_ref()), seen);
    }
    failover::print_summary(times);
}

fn apply_mode_rbac(api: &ApiServer, files: &[&str]) {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("daemonset/modes");
    for f in files {
        api.apply(&std::fs::read_to_string(root.join(f)).unwrap());
    }
}

const FINALIZER: &str = "cloudprivateipconfig.cloud.network.openshift.io/finalizer";

#[test]
fn cloud_local_assigns_moves_and_releases_cloud_private_ip_configs() {
    cloud_local_flow(false);
}

/// The same under the split layout: the controller does the leader's part (configs
/// created, moved, deleted; statuses for nodes that cannot), node agents theirs.
#[test]
fn cloud_local_works_under_the_split_layout() {
    cloud_local_flow(true);
}

fn cloud_local_flow(split: bool) {
    let k = new_cluster();
    let api = ApiServer::start(&k.c.ext, k.dir.clone(), API_HOST);
    declare(&api, &k.c);
    let mode = ["--egress-ip-mode", "cloud-local"];
    let (controller, mut agents) = if split {
        let (controller, agents) = start_split(&k, &api, &["daemonset/modes/cloud-local"], &mode);
        (Some(controller), agents)
    } else {
        apply_mode_rbac(&api, &["cloud/rbac.yaml", "cloud-local/rbac.yaml"]);
        (None, start_all_with(&k, &api, &mode))
    };
    let dump = |what: &str| {
        format!(
            "{what}\n{}\n{}\n--- controller\n{}\n{}",
            api.get(&["cloudprivateipconfig", "-o", "yaml"]),
            api.get(&["egressip", "-o", "yaml"]),
            controller.as_ref().map(Agent::log_text).unwrap_or_default(),
            logs(&agents)
        )
    };

    // Placed on node-b: the config is created, node-b adds the IP and reports it, the
    // item follows, traffic uses it.
    egress_ip(&api, "e1", &[EIP_B]);
    let assigned = format!("node-b|node-b|True|CloudResponseSuccess|IP address successfully added|[\"{FINALIZER}\"]");
    assert!(
        wait_for(Duration::from_secs(15), || config(&api, EIP_B) == assigned).is_some(),
        "{}",
        dump("not assigned")
    );
    assert!(wait_for(Duration::from_secs(5), || items(&api, "e1") == vec![(EIP_B.into(), "node-b".into())]).is_some());
    assert!(k.c.has_addr(1, EIP_B));
    let a_pod = &k.c.nodes[0].pods[0];
    assert!(wait_for(Duration::from_secs(5), || tcp(a_pod, EXT_V4, 8080).as_deref() == Some(EIP_B)).is_some());

    // Moved: node-b loses the label; it releases first, node-c adds.
    let (ok, out) = api.kubectl(&["label", "node", "node-b", &format!("{LABEL}-")], "");
    assert!(ok, "{out}");
    let moved = format!("node-c|node-c|True|CloudResponseSuccess|IP address successfully added|[\"{FINALIZER}\"]");
    assert!(wait_for(Duration::from_secs(15), || config(&api, EIP_B) == moved).is_some(), "{}", dump("not moved"));
    assert!(wait_for(Duration::from_secs(5), || items(&api, "e1") == vec![(EIP_B.into(), "node-c".into())]).is_some());
    assert!(!k.c.has_addr(1, EIP_B) && k.c.has_addr(2, EIP_B));
    assert!(wait_for(Duration::from_secs(5), || tcp(a_pod, EXT_V4, 8080).as_deref() == Some(EIP_B)).is_some());

    // IPv6: the config's name is the fully expanded address with dots.
    egress_ip(&api, "e2", &[V6_EIP]);
    let v6_name = "2001.0db8.0000.0001.0000.0000.0000.0100";
    let v6 = wait_for(Duration::from_secs(15), || {
        config(&api, v6_name).starts_with("node-c|node-c|True|CloudResponseSuccess")
    });
    assert!(v6.is_some(), "{}", dump("IPv6 config"));
    assert!(wait_for(Duration::from_secs(5), || k.c.has_addr(2, V6_EIP)).is_some());

    // Deleted EgressIP: its config is deleted; the finalizer holds it until node-c has
    // released the address.
    let (ok, out) = api.kubectl(&["delete", "egressip", "e1"], "");
    assert!(ok, "{out}");
    assert!(wait_for(Duration::from_secs(15), || config(&api, EIP_B).is_empty()).is_some(), "{}", dump("not deleted"));
    assert!(!k.c.has_addr(2, EIP_B), "released before the config went away");
    assert!(k.c.has_addr(2, V6_EIP), "the other config is untouched");

    // A config naming no node: the reference's error.
    api.apply("apiVersion: cloud.network.openshift.io/v1\nkind: CloudPrivateIPConfig\nmetadata: {name: 198.19.0.150}\nspec: {node: node-x}\n");
    let error = wait_for(Duration::from_secs(10), || {
        config(&api, "198.19.0.150") == "node-x||False|CloudResponseError|Target node \"node-x\" does not exist|"
    });
    assert!(error.is_some(), "{}", dump("no error for an unknown node"));

    // The holder dies (node-c: link down, agent killed): the leader releases the config
    // on its behalf and node-b, labelled again, takes it.
    let (ok, out) = api.kubectl(&["label", "node", "node-b", &format!("{LABEL}=")], "");
    assert!(ok, "{out}");
    kill_node(&k, &mut agents, 2);
    let taken = wait_for(Duration::from_secs(15), || {
        config(&api, v6_name).starts_with("node-b|node-b|True|CloudResponseSuccess") && k.c.has_addr(1, V6_EIP)
    });
    assert!(taken.is_some(), "{}", {
        let dump = format!("{}\n{}", api.get(&["cloudprivateipconfig", "-o", "yaml"]), logs(&agents));
        dump
    });
    assert!(wait_for(Duration::from_secs(5), || items(&api, "e2") == vec![(V6_EIP.into(), "node-b".into())]).is_some());
}

#[test]
fn cloud_mode_waits_for_the_cloud_controller_before_hosting() {
    cloud_flow(false);
}

/// The same under the split layout: the controller creates and deletes the configs.
#[test]
fn cloud_mode_works_under_the_split_layout() {
    cloud_flow(true);
}

fn cloud_flow(split: bool) {
    let k = new_cluster();
    let api = ApiServer::start(&k.c.ext, k.dir.clone(), API_HOST);
    declare(&api, &k.c);
    let mode = ["--egress-ip-mode", "cloud"];
    let (controller, agents) = if split {
        let (controller, agents) = start_split(&k, &api, &["daemonset/modes/cloud"], &mode);
        (Some(controller), agents)
    } else {
        apply_mode_rbac(&api, &["cloud/rbac.yaml"]);
        (None, start_all_with(&k, &api, &mode))
    };
    let logs = |agents: &[Option<Agent>]| {
        format!("--- controller\n{}\n{}", controller.as_ref().map(Agent::log_text).unwrap_or_default(), logs(agents))
    };
    egress_ip(&api, "e1", &[EIP_B]);
    let requested = wait_for(Duration::from_secs(15), || config(&api, EIP_B) == "node-b|||||");
    assert!(requested.is_some(), "{}\n{}", config(&api, EIP_B), logs(&agents));
    std::thread::sleep(Duration::from_secs(2));
    assert!(items(&api, "e1").is_empty(), "no item before the cloud assigned it");
    assert!(!k.c.has_addr(1, EIP_B), "not hosted before the cloud assigned it");
    // The cloud network controller (this test) assigns it.
    api.patch_status(
        "cloudprivateipconfig",
        EIP_B,
        None,
        r#"{"status":{"node":"node-b","conditions":[{"type":"Assigned","status":"True","reason":"CloudResponseSuccess","message":"IP address successfully added","lastTransitionTime":"2026-01-01T00:00:00Z"}]}}"#,
    );
    assert!(wait_for(Duration::from_secs(10), || items(&api, "e1") == vec![(EIP_B.into(), "node-b".into())]).is_some());
    assert!(wait_for(Duration::from_secs(5), || k.c.has_addr(1, EIP_B)).is_some(), "hosted once assigned");
    // The EgressIP goes: so does its config.
    let (ok, out) = api.kubectl(&["delete", "egressip", "e1"], "");
    assert!(ok, "{out}");
    assert!(wait_for(Duration::from_secs(10), || config(&api, EIP_B).is_empty()).is_some(), "{}", logs(&agents));
}

/// Addresses whereabouts (IPPool) or an IPAMClaim allocated are never placed: an
/// `EgressIPConflict` Event names the holder; once released, the IP is placed. Without
/// those CRDs (every other test here) nothing is read and nothing fails.
#[test]
fn an_ip_another_allocator_holds_is_not_placed_and_the_event_names_the_holder() {
    let k = new_cluster();
    let api = ApiServer::start(&k.c.ext, k.dir.clone(), API_HOST);
    declare(&api, &k.c);
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    api.apply(&std::fs::read_to_string(root.join("tests/kube/allocator-crds.yaml")).unwrap());
    let served = wait_for(Duration::from_secs(10), || {
        api.kubectl(&["get", "ippools", "-A"], "").0 && api.kubectl(&["get", "ipamclaims", "-A"], "").0
    });
    assert!(served.is_some(), "allocator CRDs not served");
    // whereabouts gave EIP_B (offset 100 in 198.19.0.0/24) to a pod; an IPAMClaim holds EIP_C.
    api.apply(
        "apiVersion: whereabouts.cni.cncf.io/v1alpha1\nkind: IPPool\nmetadata: {name: lan-pool, namespace: default}\n\
         spec:\n  range: 198.19.0.0/24\n  allocations:\n    \"100\": {id: c0ffee, podref: default/db-0}\n",
    );
    api.apply(
        "apiVersion: k8s.cni.cncf.io/v1alpha1\nkind: IPAMClaim\nmetadata: {name: vm-a.net1, namespace: default}\n\
         spec: {network: lan, interface: net1}\n",
    );
    api.patch_status(
        "ipamclaim",
        "vm-a.net1",
        Some("default"),
        &format!(r#"{{"status":{{"ips":["{EIP_C}/24"],"ownerPod":{{"name":"virt-launcher-a"}}}}}}"#),
    );
    let agents = start_all(&k, &api);
    egress_ip(&api, "e1", &[EIP_B]);
    egress_ip(&api, "e2", &[EIP_C]);
    let told = wait_for(Duration::from_secs(15), || {
        let e = events(&api);
        e.contains(&format!("EgressIPConflict: Egress IP e1 with IP {EIP_B} is conflicting with an address allocated by IPPool default/lan-pool (pod default/db-0)"))
            && e.contains(&format!("EgressIPConflict: Egress IP e2 with IP {EIP_C} is conflicting with an address allocated by IPAMClaim default/vm-a.net1 (pod default/virt-launcher-a)"))
    });
    assert!(told.is_some(), "{}\n{}", events(&api), logs(&agents));
    assert!(items(&api, "e1").is_empty() && items(&api, "e2").is_empty());
    assert!(!k.c.has_addr(1, EIP_B) && !k.c.has_addr(2, EIP_B));
    // The pool lets the address go: e1 is placed (within the leader's list interval).
    api.kubectl(&["delete", "ippool", "lan-pool", "-n", "default"], "");
    let placed = wait_for(Duration::from_secs(15), || items(&api, "e1").len() == 1);
    assert!(placed.is_some(), "{}", logs(&agents));
    assert!(items(&api, "e2").is_empty(), "the claim still holds EIP_C");
}

/// The controller's identity in the Lease (a Deployment's pod name).
const CONTROLLER: &str = "egressd-controller-0";

/// `egressd run --role controller` in the external host's namespace (beside the API
/// server, reaching the nodes' health ports over the LAN), as the split layout's
/// controller identity: no dataplane there.
/// The split layout: the base and the kustomize directories `modes` (from the
/// repository's root) with the split component applied, the controller started with
/// `extra` (it leads before this returns), and the three agents with `extra` and
/// `--role node`.
fn start_split(k: &Kube, api: &ApiServer, modes: &[&str], extra: &[&str]) -> (Agent, Vec<Option<Agent>>) {
    let resources: Vec<&str> = ["daemonset"].into_iter().chain(modes.iter().copied()).collect();
    apply_overlay(api, &k.dir.join("split"), &resources, &["daemonset/modes/split"]);
    let controller = start_controller_with(k, api, extra);
    let agents = (0..3)
        .map(|n| {
            let node = node_role(k, api, n);
            let args: Vec<&str> = extra.iter().copied().chain(node.iter().map(String::as_str)).collect();
            Some(start_with(k, api, n, &args))
        })
        .collect();
    (controller, agents)
}

/// The split layout's node agent on node `n`: `--role node`, its subnets on its own pod,
/// with a token bound to that pod (the webhook checks its writes).
fn node_role(k: &Kube, api: &ApiServer, n: usize) -> Vec<String> {
    let pod = bind_node_agent(api, &k.c.nodes[n].name);
    ["--role", "node", "--subnets-on", "pod", "--pod-name", &pod].map(String::from).to_vec()
}

/// Where the controller serves the admission webhook (in the API server's namespace).
const WEBHOOK_PORT: u16 = 9443;

fn start_controller(k: &Kube, api: &ApiServer) -> Agent {
    start_controller_with(k, api, &[])
}

fn start_controller_with(k: &Kube, api: &ApiServer, extra: &[&str]) -> Agent {
    webhook_at(api, WEBHOOK_PORT);
    let webhook = format!("127.0.0.1:{WEBHOOK_PORT}");
    let kubeconfig = api.kubeconfig_controller();
    let state = k.c.dir.path().join("state-controller");
    let mut args = vec![
        "run",
        "--role",
        "controller",
        "--kubeconfig",
        &kubeconfig,
        "--node-name",
        CONTROLLER,
        "--cluster-cidr",
        "198.18.0.0/16",
        "--cluster-cidr",
        "2001:db8:1::/48",
        "--lease-duration-secs",
        "3",
        "--lease-renew-secs",
        "1",
        "--state-dir",
        state.to_str().unwrap(),
        "--health-addr",
        "127.0.0.1:9799",
        "--webhook-listen",
        &webhook,
        "--webhook-host",
        "127.0.0.1",
    ];
    args.extend_from_slice(extra);
    let controller = Agent::start(&k.c.ext, &args, k.c.dir.path().join("controller.log"));
    let led = wait_for(Duration::from_secs(20), || holder(api) == CONTROLLER);
    assert!(led.is_some(), "the controller never led ({}):\n{}", holder(api), controller.log_text());
    controller
}

/// Two identities (issue #41): the controller (`--role controller`, no dataplane)
/// holds the Lease and does the cluster-wide work; node agents (`--role node`) never
/// campaign. Placement, steering, the statuses' aggregate and failover work as with
/// agents that lead.
#[test]
fn a_controller_places_and_fails_over_while_node_agents_never_lead() {
    let k = new_cluster();
    let api = ApiServer::start(&k.c.ext, k.dir.clone(), API_HOST);
    declare(&api, &k.c);
    // The split layout's RBAC: node credentials cannot update EgressIPs nor the Lease.
    let (controller, mut agents) = start_split(&k, &api, &[], &[]);
    let all_logs = |agents: &[Option<Agent>]| format!("--- controller\n{}\n{}", controller.log_text(), logs(agents));

    // Placement by the controller: node-b (labelled, first by name); node-a's pod is
    // steered to it.
    egress_ip(&api, "e1", &[EIP_B]);
    let placed = wait_for(Duration::from_secs(15), || host_of(&api) == Some(1) && k.c.has_addr(1, EIP_B));
    assert!(placed.is_some(), "{}\n{}", api.get(&["egressip", "-o", "yaml"]), all_logs(&agents));
    let a_pod = &k.c.nodes[0].pods[0];
    assert!(wait_for(Duration::from_secs(5), || quick_source(a_pod).as_deref() == Some(EIP_B)).is_some());
    // The controller hosts and steers nothing: it reports no problem of its own.
    let all_events =
        || api.get(&["events", "-A", "-o", r#"jsonpath={range .items[*]}{.reason}: {.message}{"\n"}{end}"#]);
    assert!(!all_events().contains(CONTROLLER), "{}", all_events());

    // The aggregate of an EgressFirewall's status, one entry per Ready node, written by
    // the controller (the nodes agree and write nothing).
    api.apply(
        "apiVersion: k8s.ovn.org/v1\nkind: EgressFirewall\nmetadata: {name: default, namespace: prod}\n\
         spec:\n  egress:\n  - {type: Allow, to: {cidrSelector: 203.0.113.0/24}}\n",
    );
    let messages = || api.get(&["egressfirewall", "default", "-n", "prod", "-o", "jsonpath={.status.messages}"]);
    let written = wait_for(Duration::from_secs(15), || {
        let m = messages();
        ["node-a", "node-b", "node-c"].iter().all(|n| m.contains(&format!("{n}: EgressFirewall Rules applied")))
    });
    assert!(written.is_some(), "{}\n{}", messages(), all_logs(&agents));

    // node-b dies: the controller moves its egress IP to node-c.
    let took = measure_failover(&k, &mut agents, 1);
    assert!(took.is_some_and(|t| t < Duration::from_secs(5)), "failover took {took:?}\n{}", all_logs(&agents));
    assert_eq!(host_of(&api), Some(2));

    // No node agent ever campaigned: the Lease stayed the controller's.
    assert_eq!(holder(&api), CONTROLLER);
    for a in agents.iter().flatten() {
        assert!(a.log_text().contains("not campaigning for the Lease"), "{}", a.log_text());
    }
    assert!(!controller.log_text().contains("dataplane in sync"), "the controller has no dataplane");
    assert!(!all_events().contains(CONTROLLER), "{}", all_events());

    // The controller, and with it the admission webhook, gone: node agents' shared writes
    // are refused (a_node_agent_writes_only_what_is_its_own_nodes), every node's
    // dataplane goes on.
    let mut controller = controller;
    controller.kill();
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(quick_source(a_pod).as_deref(), Some(EIP_B), "node-a's pod, the controller gone");
    assert!(k.c.has_addr(2, EIP_B), "the egress IP on node-c, the controller gone");
}

/// Moving a running cluster from one identity to two (docs/install.md): the split's RBAC
/// applied under running `--role all` agents, the controller started, the agents rolled
/// to `--role node` one by one. The placement never moves, pods keep leaving as the
/// egress IP, the Lease ends with the controller, and failover works afterwards.
#[test]
fn moving_to_two_identities_keeps_the_placement_and_hands_the_lease_to_the_controller() {
    let k = new_cluster();
    let api = ApiServer::start(&k.c.ext, k.dir.clone(), API_HOST);
    declare(&api, &k.c);
    let mut agents = start_all(&k, &api);
    let a_pod = e1_on_node_b(&k, &api);

    // The shipped example overlay, applied under running agents.
    let split = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/kustomize-split");
    let (ok, out) = api.kubectl(&["apply", "-k", split.to_str().unwrap()], "");
    assert!(ok, "{out}");
    // It leads (asserted within 20 s) once the old leader's Lease, no longer renewable,
    // has expired.
    let controller = start_controller(&k, &api);
    // The nodes that do not host first: nothing moves. Then the host, whose restart
    // the controller may take for a failure (as any agent's restart on a host).
    for n in [0, 2, 1] {
        if let Some(mut a) = agents[n].take() {
            a.kill();
        }
        let node = node_role(&k, &api, n);
        agents[n] = Some(start_with(&k, &api, n, &node.iter().map(String::as_str).collect::<Vec<_>>()));
        if n != 1 {
            assert_eq!(host_of(&api), Some(1), "the placement moved while node {n} rolled");
            assert_eq!(quick_source(a_pod).as_deref(), Some(EIP_B), "node-a's pod while node {n} rolled");
        }
    }
    let steered = wait_for(Duration::from_secs(10), || {
        host_of(&api).is_some_and(|h| h != 0 && k.c.has_addr(h, EIP_B)) && quick_source(a_pod).as_deref() == Some(EIP_B)
    });
    assert!(steered.is_some(), "after the roll: {:?}\n{}", host_of(&api), logs(&agents));
    assert_eq!(holder(&api), CONTROLLER);

    let host = host_of(&api).unwrap();
    let took = measure_failover(&k, &mut agents, host);
    let all = format!("--- controller\n{}\n{}", controller.log_text(), logs(&agents));
    assert!(took.is_some_and(|t| t < Duration::from_secs(5)), "failover took {took:?}\n{all}");
    assert_eq!(host_of(&api), Some(3 - host), "moved to the other labelled node");
}

/// `kubectl` as node `node`'s agent (its pod-bound token: [`bind_node_agent`]).
fn as_node(api: &ApiServer, node: &str, args: &[&str]) -> (bool, String) {
    kubectl_as(api, &api.dir.join(format!("kubeconfig-egressd-{node}")), args)
}

fn kubectl_as(api: &ApiServer, kubeconfig: &std::path::Path, args: &[&str]) -> (bool, String) {
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", &api.ns.name, "kubectl", "--kubeconfig"])
        .arg(kubeconfig)
        .args(args)
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

/// Per-node enforcement (issue #41): with node-b's credentials (a token bound to the
/// egressd pod on node-b) every write that is not node-b's own is refused — by RBAC
/// (Nodes, EgressIPs, the Lease) or by the controller's admission webhook (another pod,
/// another node's status entry, another node's CloudPrivateIPConfig) — and node-b's own
/// writes pass. With the webhook down, node-b's shared writes are refused (fail closed)
/// while the administrator's writes elsewhere are not.
#[test]
fn a_node_agent_writes_only_what_is_its_own_nodes() {
    let k = new_cluster();
    let api = ApiServer::start(&k.c.ext, k.dir.clone(), API_HOST);
    declare(&api, &k.c);
    let resources = ["daemonset", "daemonset/modes/cloud-local"];
    apply_overlay(&api, &k.dir.join("split"), &resources, &["daemonset/modes/split"]);
    let mut controller = start_controller(&k, &api);
    let (b_pod, c_pod) = (bind_node_agent(&api, "node-b"), bind_node_agent(&api, "node-c"));
    egress_ip(&api, "e1", &[EIP_B]);
    api.apply(
        "apiVersion: k8s.ovn.org/v1\nkind: EgressFirewall\nmetadata: {name: default, namespace: prod}\n\
         spec:\n  egress:\n  - {type: Allow, to: {cidrSelector: 203.0.113.0/24}}\n",
    );
    let messages = || api.get(&["egressfirewall", "default", "-n", "prod", "-o", "jsonpath={.status.messages}"]);
    let applied = |n: &str| format!("{n}: EgressFirewall Rules applied");
    let written = wait_for(Duration::from_secs(15), || {
        let m = messages();
        ["node-a", "node-b", "node-c"].iter().all(|n| m.contains(&applied(n)))
    });
    assert!(written.is_some(), "{}\n{}", messages(), controller.log_text());
    // node-c's CloudPrivateIPConfig, with egressd's finalizer.
    api.apply(&format!(
        "apiVersion: cloud.network.openshift.io/v1\nkind: CloudPrivateIPConfig\n\
         metadata: {{name: 198.18.9.9, finalizers: [{FINALIZER}]}}\nspec: {{node: node-c}}\n"
    ));
    let b = |args: &[&str]| as_node(&api, "node-b", args);
    // Refused by RBAC, or by the webhook with its reason.
    let refused = |what: &str, (ok, out): (bool, String)| {
        assert!(!ok && out.contains("forbidden"), "{what}: not refused by RBAC\n{out}")
    };
    let denied = |what: &str, (ok, out): (bool, String)| {
        assert!(
            !ok && out.contains("egressd node agent of node \"node-b\""),
            "{what}: not denied by the webhook\n{out}"
        )
    };
    let allowed =
        |what: &str, (ok, out): (bool, String)| assert!(ok, "{what}: refused\n{out}\n{}", controller.log_text());
    let merge = |kind: &str, name: &str, ns: &str, patch: &str, sub: &str| {
        let mut args = vec!["patch", kind, name, "--type=merge", "-p", patch];
        if !ns.is_empty() {
            args.extend(["-n", ns]);
        }
        if !sub.is_empty() {
            args.push(sub);
        }
        b(&args)
    };
    let subnets = |v: &str| format!(r#"{{"metadata":{{"annotations":{{"egressd.io/egress-subnets":"[\"{v}\"]"}}}}}}"#);

    // RBAC: no Node, no EgressIP, no Lease.
    refused("patch node-c", merge("node", "node-c", "", &subnets("198.18.3.0/24"), ""));
    refused("label node-b", b(&["label", "node", "node-b", "k8s.ovn.org/egress-assignable-"]));
    refused("taint node-b", b(&["taint", "node", "node-b", "x=y:NoSchedule"]));
    refused(
        "EgressIP status.items",
        merge("egressip", "e1", "", r#"{"status":{"items":[{"egressIP":"198.18.0.250","node":"node-b"}]}}"#, ""),
    );
    refused("the Lease", merge("lease", "egressd-leader", "egressd", r#"{"spec":{"holderIdentity":"node-b"}}"#, ""));
    // The webhook: only its own pod's annotation ...
    allowed("its own pod's subnets", merge("pod", &b_pod, "egressd", &subnets("198.18.2.0/24"), ""));
    denied("node-c's pod", merge("pod", &c_pod, "egressd", &subnets("198.18.2.0/24"), ""));
    denied("its own pod's label", merge("pod", &b_pod, "egressd", r#"{"metadata":{"labels":{"x":"y"}}}"#, ""));
    // ... its own status entry, never node-c's ...
    let with = |b_entry: &str, c_entry: &str| {
        format!(r#"{{"status":{{"messages":["{}","{b_entry}","{c_entry}"]}}}}"#, applied("node-a"))
    };
    let failed = |n: &str| format!("{n}: EgressFirewall Rules not correctly applied: forged");
    denied(
        "node-c's status entry",
        merge(
            "egressfirewall",
            "default",
            "prod",
            &with(&applied("node-b"), &failed("node-c")),
            "--subresource=status",
        ),
    );
    allowed(
        "its own status entry",
        merge(
            "egressfirewall",
            "default",
            "prod",
            &with(&failed("node-b"), &applied("node-c")),
            "--subresource=status",
        ),
    );
    // ... and not another node's CloudPrivateIPConfig.
    denied(
        "node-c's config's finalizer",
        merge("cloudprivateipconfig", "198.18.9.9", "", r#"{"metadata":{"finalizers":null}}"#, ""),
    );
    denied(
        "node-c's config's status",
        merge(
            "cloudprivateipconfig",
            "198.18.9.9",
            "",
            r#"{"status":{"node":"node-b","conditions":[]}}"#,
            "--subresource=status",
        ),
    );
    assert!(
        api.get(&["cloudprivateipconfig", "198.18.9.9", "-o", "jsonpath={.metadata.finalizers}"]).contains(FINALIZER)
    );
    // A token bound to no pod (the static token of the node identity) speaks for no node.
    let unbound = std::path::PathBuf::from(api.kubeconfig_egressd());
    let patch = subnets("198.18.2.0/24");
    let (ok, out) =
        kubectl_as(&api, &unbound, &["patch", "pod", &b_pod, "-n", "egressd", "--type=merge", "-p", &patch]);
    assert!(!ok && out.contains("bound to its pod"), "{out}");

    // The controller counts what it answered.
    let (_, metrics) = netns::http_get(&k.c.ext, "127.0.0.1:9799", "/metrics").unwrap();
    for verdict in ["allowed", "denied"] {
        let line = format!(r#"egressd_admission_reviews_total{{caller="node",verdict="{verdict}"}}"#);
        assert!(metrics.contains(&line), "{line}\n{metrics}");
    }

    // The webhook down: node-b's shared writes are refused; the administrator's writes
    // outside egressd's own objects are not.
    controller.kill();
    let down = |what: &str, (ok, out): (bool, String)| {
        assert!(!ok && out.contains("failed calling webhook"), "{what}: not refused for want of the webhook\n{out}")
    };
    down("its own pod, webhook down", merge("pod", &b_pod, "egressd", &subnets("198.18.4.0/24"), ""));
    down(
        "its own status entry, webhook down",
        merge(
            "egressfirewall",
            "default",
            "prod",
            &with(&applied("node-b"), &applied("node-c")),
            "--subresource=status",
        ),
    );
    let (ok, out) = api.kubectl(&["label", "node", "node-b", "example=1"], "");
    assert!(ok, "admin label, webhook down: {out}");
    let (ok, out) = api.kubectl(&["annotate", "pod", "node-a-pod0", "-n", "prod", "example=1"], "");
    assert!(ok, "admin pod annotation, webhook down: {out}");
    let (ok, out) = api.kubectl(
        &[
            "patch",
            "egressfirewall",
            "default",
            "-n",
            "prod",
            "--type=merge",
            "-p",
            r#"{"spec":{"egress":[{"type":"Deny","to":{"cidrSelector":"0.0.0.0/0"}}]}}"#,
        ],
        "",
    );
    assert!(ok, "admin EgressFirewall spec, webhook down: {out}");
}
