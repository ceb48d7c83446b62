//! EgressIP across three node namespaces, each running its own egressd on one shared
//! manifests directory (static placement in `status.items`), root required.
//!
//! ```text
//!            lan (bridge br0): 198.19.0.0/24, 2001:db8:0:1::/64
//!   ┌───────────────┬───────────────┬───────────────┬────────────────────────────────┐
//!  node-a .1 / ::1  node-b .2 / ::2  node-c .3 / ::3  ext .254 / ::fe  (lo: 203.0.113.10,
//!   │ pods 198.18.1.x  │ 198.18.2.x     │ 198.18.3.x                     2001:db8:ff::10)
//!   │ 2001:db8:1:1x::  │ 2001:db8:1:2x:: │ 2001:db8:1:3x::
//! ```
//! Pods are routed (host-gw: each node routes the others' pod ranges via their node
//! address); every node has a CNI-style masquerade of pod traffic leaving the cluster;
//! the external host reports each connection's source address, has no route to the pod
//! ranges and counts, in its input hook, packets with a pod source address.

mod netns;

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::time::Duration;

use netns::{Agent, Netns, addr, require_root, serve, tcp, veth, wait_for};

const EXT_V4: &str = "203.0.113.10";
const EXT_V6: &str = "2001:db8:ff::10";
const EIP_B: &str = "198.19.0.100";
const EIP_C: &str = "198.19.0.101";
const EIP6_B: &str = "2001:db8:0:1::100";
const ECHO_PORT: u16 = 7000;
const UDP_PORT: u16 = 5353;

struct Node {
    ns: Netns,
    name: String,
    pods: Vec<Netns>,
    agent: Option<Agent>,
}

struct Cluster {
    _lan: Netns,
    _lan2: Option<Netns>,
    nodes: Vec<Node>,
    ext: Netns,
    dir: tempfile::TempDir,
}

fn node_v4(n: usize) -> String {
    format!("198.19.0.{}", n + 1)
}

fn node_v6(n: usize) -> String {
    format!("2001:db8:0:1::{}", n + 1)
}

fn pod_v4(n: usize, i: usize) -> String {
    format!("198.18.{}.{}", n + 1, 4 * i + 2)
}

fn pod_v6(n: usize, i: usize) -> String {
    format!("2001:db8:1:{}{}::2", n + 1, i)
}

impl Cluster {
    /// Three nodes; `pods[n]` = (namespace, labels) of the pods of node n.
    fn new(pods: &[&[(&str, &str)]; 3]) -> Self {
        require_root();
        let lan = Netns::new("lan");
        lan.ip(&["link", "add", "br0", "type", "bridge"]);
        lan.ip(&["link", "set", "br0", "up"]);
        let ext = Netns::new("eipext");
        veth(&lan, "x", &ext, "eth0");
        lan.ip(&["link", "set", "x", "master", "br0"]);
        addr(&ext, "eth0", "198.19.0.254/24");
        addr(&ext, "eth0", "2001:db8:0:1::fe/64");
        addr(&ext, "lo", &format!("{EXT_V4}/32"));
        addr(&ext, "lo", &format!("{EXT_V6}/128"));
        ext.exec(&[
            "nft",
            "add table inet probe; add chain inet probe in { type filter hook input priority 0; }; \
             add rule inet probe in ip saddr 198.18.0.0/16 counter; \
             add rule inet probe in ip6 saddr 2001:db8:1::/48 counter",
        ]);
        serve(&ext, &[8080], &[]);
        echo_server(&ext);
        udp_echo_server(&ext);

        let names = ["node-a", "node-b", "node-c"];
        let mut nodes = Vec::new();
        for (n, name) in names.iter().enumerate() {
            let ns = Netns::new(&name.replace("node-", "n"));
            ns.sysctl("net.ipv4.ip_forward", "1");
            ns.sysctl("net.ipv6.conf.all.forwarding", "1");
            ns.sysctl("net.ipv4.fib_multipath_hash_policy", "1");
            ns.sysctl("net.ipv6.fib_multipath_hash_policy", "1");
            let port = format!("p{n}");
            veth(&ns, "eth0", &lan, &port);
            lan.ip(&["link", "set", &port, "master", "br0"]);
            addr(&ns, "eth0", &format!("{}/24", node_v4(n)));
            addr(&ns, "eth0", &format!("{}/64", node_v6(n)));
            ns.ip(&["route", "add", "203.0.113.0/24", "via", "198.19.0.254"]);
            ns.ip(&["-6", "route", "add", "2001:db8:ff::/64", "via", "2001:db8:0:1::fe"]);
            for m in (0..3).filter(|m| *m != n) {
                ns.ip(&["route", "add", &format!("198.18.{}.0/24", m + 1), "via", &node_v4(m)]);
                ns.ip(&["-6", "route", "add", &format!("2001:db8:1:{}0::/60", m + 1), "via", &node_v6(m)]);
            }
            // The CNI's masquerade of pod traffic leaving the cluster.
            ns.exec(&[
                "nft",
                "add table inet cni; add chain inet cni post { type nat hook postrouting priority srcnat; }; \
                 add rule inet cni post ip saddr 198.18.0.0/16 ip daddr != 198.18.0.0/16 masquerade; \
                 add rule inet cni post ip6 saddr 2001:db8:1::/48 ip6 daddr != 2001:db8:1::/48 masquerade",
            ]);
            let mut node_pods = Vec::new();
            for i in 0..pods[n].len() {
                let pod = Netns::new(&format!("n{n}p{i}"));
                let dev = format!("vp{i}");
                veth(&ns, &dev, &pod, "eth0");
                addr(&ns, &dev, &format!("198.18.{}.{}/30", n + 1, 4 * i + 1));
                addr(&ns, &dev, &format!("2001:db8:1:{}{}::1/64", n + 1, i));
                addr(&pod, "eth0", &format!("{}/30", pod_v4(n, i)));
                addr(&pod, "eth0", &format!("{}/64", pod_v6(n, i)));
                pod.ip(&["route", "add", "default", "via", &format!("198.18.{}.{}", n + 1, 4 * i + 1)]);
                pod.ip(&["-6", "route", "add", "default", "via", &format!("2001:db8:1:{}{}::1", n + 1, i)]);
                serve(&pod, &[8080], &[]);
                node_pods.push(pod);
            }
            serve(&ns, &[8080], &[]);
            nodes.push(Node { ns, name: name.to_string(), pods: node_pods, agent: None });
        }

        let dir = tempfile::tempdir().unwrap();
        let mut cluster = String::new();
        for (n, name) in names.iter().enumerate() {
            cluster.push_str(&format!(
                "---\napiVersion: v1\nkind: Node\nmetadata: {{name: {name}}}\nstatus:\n  addresses:\n  - {{type: InternalIP, address: {}}}\n  - {{type: InternalIP, address: \"{}\"}}\n",
                node_v4(n),
                node_v6(n)
            ));
            for (i, (namespace, labels)) in pods[n].iter().enumerate() {
                cluster.push_str(&format!(
                    "---\napiVersion: v1\nkind: Pod\nmetadata: {{name: {name}-pod{i}, namespace: {namespace}, labels: {labels}}}\n\
                     spec: {{nodeName: {name}}}\nstatus:\n  phase: Running\n  podIPs: [{{ip: {}}}, {{ip: \"{}\"}}]\n",
                    pod_v4(n, i),
                    pod_v6(n, i)
                ));
            }
        }
        cluster.push_str(
            "---\napiVersion: v1\nkind: Namespace\nmetadata: {name: prod, labels: {team: prod}}\n\
             ---\napiVersion: v1\nkind: Namespace\nmetadata: {name: dev, labels: {team: dev}}\n",
        );
        std::fs::write(dir.path().join("cluster.yaml"), cluster).unwrap();
        Self { _lan: lan, _lan2: None, nodes, ext, dir }
    }

    /// A second segment 198.51.100.0/24 between node-b (eth1, .2) and the external host
    /// (eth1, .254); node-b's preferred default route stays on eth0, a second one with a
    /// higher metric goes via eth1. The external host counts, per incoming link, packets
    /// from 198.51.100.100.
    fn second_link_on_b(&mut self) {
        let lan2 = Netns::new("lan2");
        lan2.ip(&["link", "add", "br0", "type", "bridge"]);
        lan2.ip(&["link", "set", "br0", "up"]);
        veth(&lan2, "x", &self.ext, "eth1");
        veth(&lan2, "pb", &self.nodes[1].ns, "eth1");
        for port in ["x", "pb"] {
            lan2.ip(&["link", "set", port, "master", "br0"]);
        }
        addr(&self.ext, "eth1", "198.51.100.254/24");
        let b = &self.nodes[1].ns;
        addr(b, "eth1", "198.51.100.2/24");
        b.ip(&["route", "add", "default", "via", "198.19.0.254", "dev", "eth0"]);
        b.ip(&["route", "add", "default", "via", "198.51.100.254", "dev", "eth1", "metric", "100"]);
        self.ext.exec(&[
            "nft",
            "add table inet links; add chain inet links in { type filter hook input priority 0; }; \
             add rule inet links in iifname eth0 ip saddr 198.51.100.100 counter; \
             add rule inet links in iifname eth1 ip saddr 198.51.100.100 counter",
        ]);
        self._lan2 = Some(lan2);
    }

    /// Packets from 198.51.100.100 the external host received on (eth0, eth1).
    fn second_link_packets(&self) -> (u64, u64) {
        let text = self.ext.exec(&["nft", "list", "table", "inet", "links"]);
        let counts: Vec<u64> = text
            .split("packets ")
            .skip(1)
            .map(|s| s.split_whitespace().next().unwrap().parse::<u64>().unwrap())
            .collect();
        (counts[0], counts[1])
    }

    fn write(&self, name: &str, body: &str) {
        let tmp = self.dir.path().join(format!(".{name}.tmp"));
        std::fs::write(&tmp, body).unwrap();
        std::fs::rename(&tmp, self.dir.path().join(name)).unwrap();
    }

    /// The EgressIP `name` selecting namespaces `team: prod` (and pods `app: web` when
    /// `web_only`), with `ips` and placement `items` (ip, node).
    fn egress_ip(&self, name: &str, ips: &[&str], items: &[(&str, &str)], web_only: bool) {
        let mut body = format!(
            "apiVersion: k8s.ovn.org/v1\nkind: EgressIP\nmetadata: {{name: {name}}}\nspec:\n  egressIPs: [{}]\n  namespaceSelector: {{matchLabels: {{team: prod}}}}\n",
            ips.iter().map(|i| format!("\"{i}\"")).collect::<Vec<_>>().join(", ")
        );
        if web_only {
            body.push_str("  podSelector: {matchLabels: {app: web}}\n");
        }
        if !items.is_empty() {
            body.push_str("status:\n  items:\n");
            for (ip, node) in items {
                body.push_str(&format!("  - {{egressIP: \"{ip}\", node: {node}}}\n"));
            }
        }
        self.write(&format!("egressip-{name}.yaml"), &body);
    }

    fn start(&mut self, n: usize, extra: &[&str]) {
        let dir = self.dir.path().to_str().unwrap().to_string();
        let node = &mut self.nodes[n];
        let state = self.dir.path().join(format!("state-{}", node.name));
        let state = state.to_str().unwrap().to_string();
        let health = format!("127.0.0.1:{}", 9780 + n);
        let mut args = vec![
            "run",
            "--manifests",
            &dir,
            "--node-name",
            &node.name,
            "--cluster-cidr",
            "198.18.0.0/16",
            "--cluster-cidr",
            "2001:db8:1::/48",
            "--state-dir",
            &state,
            "--health-addr",
            &health,
            "--debounce-ms",
            "50",
        ];
        args.extend_from_slice(extra);
        let log = self.dir.path().join(format!("{}-{}.log", node.name, std::process::id()));
        let agent = Agent::start(&node.ns, &args, log);
        let synced = wait_for(Duration::from_secs(10), || agent.log_text().contains("dataplane in sync"));
        assert!(synced.is_some(), "egressd on {} did not sync:\n{}", node.name, agent.log_text());
        node.agent = Some(agent);
    }

    fn start_all(&mut self) {
        for n in 0..3 {
            self.start(n, &[]);
        }
    }

    fn status(&self, n: usize) -> String {
        let path = self.dir.path().join(format!("state-{}", self.nodes[n].name)).join("status");
        std::fs::read_to_string(path).unwrap_or_default()
    }

    /// Whether node n's status file comes to contain `needle` (it is written right
    /// after each sync).
    fn status_shows(&self, n: usize, needle: &str) -> bool {
        wait_for(Duration::from_secs(5), || self.status(n).contains(needle)).is_some()
    }

    fn logs(&self) -> String {
        self.nodes
            .iter()
            .map(|n| format!("--- {}\n{}", n.name, n.agent.as_ref().map(Agent::log_text).unwrap_or_default()))
            .collect()
    }

    /// Packets the external host received with a pod source address.
    fn pod_sourced_packets(&self) -> u64 {
        let text = self.ext.exec(&["nft", "list", "table", "inet", "probe"]);
        text.split("packets ").skip(1).map(|s| s.split_whitespace().next().unwrap().parse::<u64>().unwrap()).sum()
    }

    fn has_addr(&self, n: usize, ip: &str) -> bool {
        self.nodes[n].ns.ip(&["-o", "addr", "show", "dev", "eth0"]).contains(&format!(" {ip}/"))
    }

    fn mac(&self, n: usize) -> String {
        let out = self.nodes[n].ns.ip(&["-o", "link", "show", "dev", "eth0"]);
        out.split("link/ether ").nth(1).unwrap().split_whitespace().next().unwrap().to_string()
    }

    /// The external host's neighbour entry for `ip`: its MAC, if any.
    fn ext_neighbour(&self, ip: &str) -> Option<String> {
        let out = self.ext.ip(&["neigh", "show", ip]);
        out.split("lladdr ").nth(1).map(|s| s.split_whitespace().next().unwrap().to_string())
    }
}

/// A TCP server that answers every line with the connection's source address.
fn echo_server(ns: &Netns) {
    let listener = ns.run(|| TcpListener::bind(("::", ECHO_PORT)).expect("bind echo"));
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let peer = stream.peer_addr().map(|a| a.ip().to_canonical().to_string()).unwrap_or_default();
                let mut writer = stream.try_clone().unwrap();
                for line in BufReader::new(stream).lines() {
                    if line.is_err() || writer.write_all(format!("{peer}\n").as_bytes()).is_err() {
                        break;
                    }
                }
            });
        }
    });
}

/// A UDP server bound to the external address itself (a wildcard-bound one would answer
/// from the address of its route back, which NAT does not map): echoes the source.
fn udp_echo_server(ns: &Netns) {
    let socket = ns.run(|| UdpSocket::bind((EXT_V4, UDP_PORT)).expect("bind udp"));
    std::thread::spawn(move || {
        let mut buf = [0u8; 1500];
        while let Ok((_, from)) = socket.recv_from(&mut buf) {
            let _ = socket.send_to(from.ip().to_string().as_bytes(), from);
        }
    });
}

/// A long-lived connection from a pod to the echo server.
struct Flow {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

impl Flow {
    fn open(pod: &Netns, ip: &str) -> Self {
        let target = SocketAddr::new(ip.parse().unwrap(), ECHO_PORT);
        let stream = pod.run(move || TcpStream::connect_timeout(&target, Duration::from_secs(2)).expect("connect"));
        stream.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        Self { reader: BufReader::new(stream.try_clone().unwrap()), writer: stream }
    }

    /// Send a line; the source address the server saw, or None when the flow broke.
    fn ask(&mut self) -> Option<String> {
        self.writer.write_all(b"hello\n").ok()?;
        let mut line = String::new();
        match self.reader.read_line(&mut line) {
            Ok(n) if n > 0 => Some(line.trim().to_string()),
            _ => None,
        }
    }
}

/// UDP from `pod` with a fixed source port: the sources the server saw for `count`
/// packets of that one flow.
fn udp_flow(pod: &Netns, ip: &str, src_port: u16, count: usize) -> Vec<String> {
    let target = SocketAddr::new(ip.parse().unwrap(), UDP_PORT);
    pod.run(move || {
        let bind: SocketAddr = format!("0.0.0.0:{src_port}").parse().unwrap();
        let s = UdpSocket::bind(bind).unwrap();
        s.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
        let mut seen = Vec::new();
        for _ in 0..count {
            s.send_to(b"ping", target).unwrap();
            let mut buf = [0u8; 128];
            if let Ok((n, _)) = s.recv_from(&mut buf) {
                seen.push(String::from_utf8_lossy(&buf[..n]).into_owned());
            }
        }
        seen
    })
}

fn wait_source(pod: &Netns, ip: &str, want: &str) -> bool {
    wait_for(Duration::from_secs(5), || tcp(pod, ip, 8080).as_deref() == Some(want)).is_some()
}

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
    assert!(wait_for(Duration::from_secs(8), || c.has_addr(2, EIP_B)).is_some(), "C hosts after the move");
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
        wait_for(Duration::from_secs(1), || c.has_addr(2, EIP_B) && c.nodes[0].ns.ip(&["rule"]).contains("5470:"))
            .is_some(),
        "drift not restored within 1 s\n{}",
        c.logs()
    );
    assert!(c.nodes[2].agent.as_ref().unwrap().log_text().contains("changed by someone else; restored"));

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
