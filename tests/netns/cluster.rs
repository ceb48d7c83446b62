//! A three-node cluster in network namespaces for the EgressIP tests (manifests and
//! Kubernetes mode): a bridge, three nodes with routed pods, an external host.
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

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::time::Duration;

use super::{Agent, Netns, addr, require_root, serve, tcp, veth, wait_for};

pub const EXT_V4: &str = "203.0.113.10";
pub const EXT_V6: &str = "2001:db8:ff::10";
pub const EIP_B: &str = "198.19.0.100";
pub const EIP_C: &str = "198.19.0.101";
pub const EIP6_B: &str = "2001:db8:0:1::100";
pub const ECHO_PORT: u16 = 7000;
pub const UDP_PORT: u16 = 5353;

pub struct Node {
    pub ns: Netns,
    pub name: String,
    pub pods: Vec<Netns>,
    pub agent: Option<Agent>,
}

pub struct Cluster {
    pub _lan: Netns,
    pub _lan2: Option<Netns>,
    pub nodes: Vec<Node>,
    pub ext: Netns,
    pub dir: tempfile::TempDir,
}

pub fn node_v4(n: usize) -> String {
    format!("198.19.0.{}", n + 1)
}

pub fn node_v6(n: usize) -> String {
    format!("2001:db8:0:1::{}", n + 1)
}

pub fn pod_v4(n: usize, i: usize) -> String {
    format!("198.18.{}.{}", n + 1, 4 * i + 2)
}

pub fn pod_v6(n: usize, i: usize) -> String {
    format!("2001:db8:1:{}{}::2", n + 1, i)
}

impl Cluster {
    /// Three nodes; `pods[n]` = (namespace, labels) of the pods of node n.
    pub fn new(pods: &[&[(&str, &str)]; 3]) -> Self {
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
            cni_masquerade(&ns);
            let mut node_pods = Vec::new();
            for i in 0..pods[n].len() {
                let pod = add_pod(&ns, &format!("n{n}p{i}"), n, i);
                serve(&pod, &[8080], &[]);
                node_pods.push(pod);
            }
            serve(&ns, &[8080], &[]);
            nodes.push(Node { ns, name: name.to_string(), pods: node_pods, agent: None });
        }

        let dir = tempfile::tempdir().unwrap();
        let cluster = cluster_manifest(&names, |n| [node_v4(n), node_v6(n)], pods, |n, i| [pod_v4(n, i), pod_v6(n, i)]);
        std::fs::write(dir.path().join("cluster.yaml"), cluster).unwrap();
        Self { _lan: lan, _lan2: None, nodes, ext, dir }
    }

    /// Bring node `n`'s uplink back up with what the kernel dropped while it was down:
    /// its IPv6 address and the routes via the LAN.
    pub fn uplink_up(&self, n: usize) {
        let ns = &self.nodes[n].ns;
        ns.ip(&["link", "set", "eth0", "up"]);
        ns.ip(&["addr", "replace", &format!("{}/24", node_v4(n)), "dev", "eth0"]);
        ns.ip(&["addr", "replace", &format!("{}/64", node_v6(n)), "dev", "eth0"]);
        ns.ip(&["route", "replace", "203.0.113.0/24", "via", "198.19.0.254"]);
        ns.ip(&["-6", "route", "replace", "2001:db8:ff::/64", "via", "2001:db8:0:1::fe"]);
        for m in (0..3).filter(|m| *m != n) {
            ns.ip(&["route", "replace", &format!("198.18.{}.0/24", m + 1), "via", &node_v4(m)]);
            ns.ip(&["-6", "route", "replace", &format!("2001:db8:1:{}0::/60", m + 1), "via", &node_v6(m)]);
        }
    }

    /// A second segment 198.51.100.0/24 between node-b (eth1, .2) and the external host
    /// (eth1, .254); node-b's preferred default route stays on eth0, a second one with a
    /// higher metric goes via eth1. The external host counts, per incoming link, packets
    /// from 198.51.100.100.
    pub fn second_link_on_b(&mut self) {
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
    pub fn second_link_packets(&self) -> (u64, u64) {
        let text = self.ext.exec(&["nft", "list", "table", "inet", "links"]);
        let counts: Vec<u64> = text
            .split("packets ")
            .skip(1)
            .map(|s| s.split_whitespace().next().unwrap().parse::<u64>().unwrap())
            .collect();
        (counts[0], counts[1])
    }

    pub fn write(&self, name: &str, body: &str) {
        write_manifest(self.dir.path(), name, body);
    }

    /// The EgressIP `name` selecting namespaces `team: prod` (and pods `app: web` when
    /// `web_only`), with `ips` and placement `items` (ip, node).
    pub fn egress_ip(&self, name: &str, ips: &[&str], items: &[(&str, &str)], web_only: bool) {
        self.write(&format!("egressip-{name}.yaml"), &egress_ip_manifest(name, ips, items, web_only));
    }

    pub fn start(&mut self, n: usize, extra: &[&str]) {
        let node = &mut self.nodes[n];
        let cidrs = ["198.18.0.0/16", "2001:db8:1::/48"];
        node.agent = Some(start_manifests_agent(&node.ns, self.dir.path(), &node.name, n, &cidrs, extra));
    }

    pub fn start_all(&mut self) {
        for n in 0..3 {
            self.start(n, &[]);
        }
    }

    pub fn status(&self, n: usize) -> String {
        let path = self.dir.path().join(format!("state-{}", self.nodes[n].name)).join("status");
        std::fs::read_to_string(path).unwrap_or_default()
    }

    /// Whether node n's status file comes to contain `needle` (it is written right
    /// after each sync).
    pub fn status_shows(&self, n: usize, needle: &str) -> bool {
        wait_for(Duration::from_secs(5), || self.status(n).contains(needle)).is_some()
    }

    pub fn logs(&self) -> String {
        self.nodes
            .iter()
            .map(|n| format!("--- {}\n{}", n.name, n.agent.as_ref().map(Agent::log_text).unwrap_or_default()))
            .collect()
    }

    /// Packets the external host received with a pod source address.
    pub fn pod_sourced_packets(&self) -> u64 {
        let text = self.ext.exec(&["nft", "list", "table", "inet", "probe"]);
        text.split("packets ").skip(1).map(|s| s.split_whitespace().next().unwrap().parse::<u64>().unwrap()).sum()
    }

    pub fn has_addr(&self, n: usize, ip: &str) -> bool {
        self.nodes[n].ns.ip(&["-o", "addr", "show", "dev", "eth0"]).contains(&format!(" {ip}/"))
    }

    pub fn mac(&self, n: usize) -> String {
        let out = self.nodes[n].ns.ip(&["-o", "link", "show", "dev", "eth0"]);
        out.split("link/ether ").nth(1).unwrap().split_whitespace().next().unwrap().to_string()
    }

    /// The external host's neighbour entry for `ip`: its MAC, if any.
    pub fn ext_neighbour(&self, ip: &str) -> Option<String> {
        let out = self.ext.ip(&["neigh", "show", ip]);
        out.split("lladdr ").nth(1).map(|s| s.split_whitespace().next().unwrap().to_string())
    }
}

/// The CNI's masquerade of pod traffic leaving the cluster, on a node.
pub fn cni_masquerade(node: &Netns) {
    node.exec(&[
        "nft",
        "add table inet cni; add chain inet cni post { type nat hook postrouting priority srcnat; }; \
         add rule inet cni post ip saddr 198.18.0.0/16 ip daddr != 198.18.0.0/16 masquerade; \
         add rule inet cni post ip6 saddr 2001:db8:1::/48 ip6 daddr != 2001:db8:1::/48 masquerade",
    ]);
}

/// Pod `i` of node `n`: a namespace `role` wired to the node by a veth (`vp<i>` on the
/// node), addressed [`pod_v4`]/[`pod_v6`] with the node's end as its default gateway.
pub fn add_pod(node: &Netns, role: &str, n: usize, i: usize) -> Netns {
    let pod = Netns::new(role);
    let dev = format!("vp{i}");
    veth(node, &dev, &pod, "eth0");
    addr(node, &dev, &format!("198.18.{}.{}/30", n + 1, 4 * i + 1));
    addr(node, &dev, &format!("2001:db8:1:{}{}::1/64", n + 1, i));
    addr(&pod, "eth0", &format!("{}/30", pod_v4(n, i)));
    addr(&pod, "eth0", &format!("{}/64", pod_v6(n, i)));
    pod.ip(&["route", "add", "default", "via", &format!("198.18.{}.{}", n + 1, 4 * i + 1)]);
    pod.ip(&["-6", "route", "add", "default", "via", &format!("2001:db8:1:{}{}::1", n + 1, i)]);
    pod
}

/// The manifests of a cluster of `names`: each Node with its two addresses, its pods
/// (`pods[n]` = (namespace, labels)) with theirs, and the namespaces `prod` (`team:
/// prod`) and `dev` (`team: dev`).
pub fn cluster_manifest(
    names: &[&str],
    node_addrs: impl Fn(usize) -> [String; 2],
    pods: &[&[(&str, &str)]; 3],
    pod_addrs: impl Fn(usize, usize) -> [String; 2],
) -> String {
    let mut cluster = String::new();
    for (n, name) in names.iter().enumerate() {
        let [v4, v6] = node_addrs(n);
        cluster.push_str(&format!(
            "---\napiVersion: v1\nkind: Node\nmetadata: {{name: {name}}}\nstatus:\n  addresses:\n  - {{type: InternalIP, address: {v4}}}\n  - {{type: InternalIP, address: \"{v6}\"}}\n"
        ));
        for (i, (namespace, labels)) in pods[n].iter().enumerate() {
            let [p4, p6] = pod_addrs(n, i);
            cluster.push_str(&format!(
                "---\napiVersion: v1\nkind: Pod\nmetadata: {{name: {name}-pod{i}, namespace: {namespace}, labels: {labels}}}\n\
                 spec: {{nodeName: {name}}}\nstatus:\n  phase: Running\n  podIPs: [{{ip: {p4}}}, {{ip: \"{p6}\"}}]\n"
            ));
        }
    }
    cluster.push_str(
        "---\napiVersion: v1\nkind: Namespace\nmetadata: {name: prod, labels: {team: prod}}\n\
         ---\napiVersion: v1\nkind: Namespace\nmetadata: {name: dev, labels: {team: dev}}\n",
    );
    cluster
}

/// Write a manifest into `dir` atomically (the agent never reads half a file).
pub fn write_manifest(dir: &std::path::Path, name: &str, body: &str) {
    let tmp = dir.join(format!(".{name}.tmp"));
    std::fs::write(&tmp, body).unwrap();
    std::fs::rename(&tmp, dir.join(name)).unwrap();
}

/// The EgressIP `name` selecting namespaces `team: prod` (and pods `app: web` when
/// `web_only`), with `ips` and placement `items` (ip, node).
pub fn egress_ip_manifest(name: &str, ips: &[&str], items: &[(&str, &str)], web_only: bool) -> String {
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
    body
}

/// egressd on node `n` (named `name`, in `ns`) following the manifests in `dir`, its
/// state in `dir/state-<name>`, health on 127.0.0.1:978n; returns once it synced.
pub fn start_manifests_agent(
    ns: &Netns,
    dir: &std::path::Path,
    name: &str,
    n: usize,
    cluster_cidrs: &[&str],
    extra: &[&str],
) -> Agent {
    let manifests = dir.to_str().unwrap().to_string();
    let state = dir.join(format!("state-{name}")).to_str().unwrap().to_string();
    let health = format!("127.0.0.1:{}", 9780 + n);
    let mut args = vec!["run", "--manifests", &manifests, "--node-name", name];
    for cidr in cluster_cidrs {
        args.extend(["--cluster-cidr", cidr]);
    }
    args.extend(["--state-dir", &state, "--health-addr", &health, "--debounce-ms", "50"]);
    args.extend_from_slice(extra);
    let log = dir.join(format!("{name}-{}.log", std::process::id()));
    let agent = Agent::start(ns, &args, log);
    let synced = wait_for(Duration::from_secs(10), || agent.log_text().contains("dataplane in sync"));
    assert!(synced.is_some(), "egressd on {name} did not sync:\n{}", agent.log_text());
    agent
}

/// A TCP server that answers every line with the connection's source address.
pub fn echo_server(ns: &Netns) {
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
pub fn udp_echo_server(ns: &Netns) {
    let socket = ns.run(|| UdpSocket::bind((EXT_V4, UDP_PORT)).expect("bind udp"));
    std::thread::spawn(move || {
        let mut buf = [0u8; 1500];
        while let Ok((_, from)) = socket.recv_from(&mut buf) {
            let _ = socket.send_to(from.ip().to_string().as_bytes(), from);
        }
    });
}

/// A long-lived connection from a pod to the echo server.
pub struct Flow {
    pub reader: BufReader<TcpStream>,
    pub writer: TcpStream,
}

impl Flow {
    pub fn open(pod: &Netns, ip: &str) -> Self {
        let target = SocketAddr::new(ip.parse().unwrap(), ECHO_PORT);
        let stream = pod.run(move || TcpStream::connect_timeout(&target, Duration::from_secs(2)).expect("connect"));
        stream.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        Self { reader: BufReader::new(stream.try_clone().unwrap()), writer: stream }
    }

    /// Send a line; the source address the server saw, or None when the flow broke.
    pub fn ask(&mut self) -> Option<String> {
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
pub fn udp_flow(pod: &Netns, ip: &str, src_port: u16, count: usize) -> Vec<String> {
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

pub fn wait_source(pod: &Netns, ip: &str, want: &str) -> bool {
    wait_for(Duration::from_secs(5), || tcp(pod, ip, 8080).as_deref() == Some(want)).is_some()
}
