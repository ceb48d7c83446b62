//! A routed three-node cluster for the EgressIP tunnel tests: two subnets behind a
//! router that behaves as a cloud VPC does — it forwards only packets whose source is
//! a node's (or an egress IP of the node subnets) or the external network's, and none
//! to pod addresses. Nothing with a pod source crosses it.
//!
//! ```text
//!   subnet A (bridge): 198.19.1.0/24        subnet B: 198.19.2.0/24     external: 192.0.2.0/24
//!   2001:db8:0:a::/64                       2001:db8:0:b::/64           2001:db8:ff::/64
//!   node-a .1   node-b .2   router .254 ─── router .254 ── node-c .3    router .254 ── ext .10
//!   pods 198.18.1.x  198.18.2.x                        198.18.3.x
//!   2001:db8:1:1x::  2001:db8:1:2x::                   2001:db8:1:3x::
//! ```
//! Nodes filter reverse paths strictly (`rp_filter` 1, as some distributions do).
//! Pods are routed host-gw between node-a and node-b (one subnet), never across the
//! router (it drops them): only EgressIP's tunnel carries pod traffic across subnets. Every node masquerades pod traffic leaving the
//! cluster, as a CNI does. The external host runs the source-echo server (port 8080)
//! and a byte counter (port 9000) for the MTU test.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use super::cluster::{
    Node, add_pod, cluster_manifest, cni_masquerade, egress_ip_manifest, start_manifests_agent, write_manifest,
};
use super::{Agent, Netns, addr, require_root, serve, veth};

pub const EXT: &str = "192.0.2.10";
pub const EXT6: &str = "2001:db8:ff::10";
pub const EIP: &str = "198.19.1.100";
pub const EIP6: &str = "2001:db8:0:a::100";
pub const SINK_PORT: u16 = 9000;

pub struct Routed {
    pub lan: Netns,
    pub router: Netns,
    pub nodes: Vec<Node>,
    pub ext: Netns,
    pub dir: tempfile::TempDir,
}

pub fn node_ip(n: usize) -> String {
    if n < 2 { format!("198.19.1.{}", n + 1) } else { format!("198.19.2.{}", n + 1) }
}

pub fn node_ip6(n: usize) -> String {
    if n < 2 { format!("2001:db8:0:a::{}", n + 1) } else { format!("2001:db8:0:b::{}", n + 1) }
}

pub use super::cluster::{pod_v4 as pod_ip, pod_v6 as pod_ip6};

impl Routed {
    /// Three nodes; `pods[n]` = (namespace, labels) of node n's pods.
    pub fn new(pods: &[&[(&str, &str)]; 3]) -> Self {
        require_root();
        let router = Netns::new("vpc");
        router.sysctl("net.ipv4.ip_forward", "1");
        router.sysctl("net.ipv6.conf.all.forwarding", "1");
        let lan = Netns::new("lana");
        lan.ip(&["link", "add", "br0", "type", "bridge"]);
        lan.ip(&["link", "set", "br0", "up"]);
        veth(&router, "ra", &lan, "r");
        lan.ip(&["link", "set", "r", "master", "br0"]);
        addr(&router, "ra", "198.19.1.254/24");
        addr(&router, "ra", "2001:db8:0:a::fe/64");
        let ext = Netns::new("rext");
        veth(&router, "rx", &ext, "eth0");
        addr(&router, "rx", "192.0.2.254/24");
        addr(&router, "rx", "2001:db8:ff::fe/64");
        addr(&ext, "eth0", &format!("{EXT}/24"));
        addr(&ext, "eth0", &format!("{EXT6}/64"));
        ext.ip(&["route", "add", "default", "via", "192.0.2.254"]);
        ext.ip(&["-6", "route", "add", "default", "via", "2001:db8:ff::fe"]);
        // The VPC: only node (and egress IP) sources from the node subnets, nothing to pods.
        router.exec(&[
            "nft",
            "add table inet vpc; add chain inet vpc filt { type filter hook forward priority 0; }; \
             add rule inet vpc filt ip saddr 198.18.0.0/16 counter drop; \
             add rule inet vpc filt iifname { ra, rb } ip saddr != { 198.19.1.0/24, 198.19.2.0/24 } counter drop; \
             add rule inet vpc filt ip daddr 198.18.0.0/16 counter drop; \
             add rule inet vpc filt ip6 saddr 2001:db8:1::/48 counter drop; \
             add rule inet vpc filt iifname { ra, rb } ip6 saddr != { 2001:db8:0:a::/64, 2001:db8:0:b::/64, fe80::/10 } counter drop; \
             add rule inet vpc filt ip6 daddr 2001:db8:1::/48 counter drop",
        ]);
        serve(&ext, &[8080], &[8081]);
        sink_server(&ext);

        let names = ["node-a", "node-b", "node-c"];
        let mut nodes = Vec::new();
        for (n, name) in names.iter().enumerate() {
            let ns = Netns::new(&format!("r{}", &name[5..]));
            ns.sysctl("net.ipv4.ip_forward", "1");
            ns.sysctl("net.ipv6.conf.all.forwarding", "1");
            // Strict reverse-path filtering, as some distributions default to: replies
            // arriving through the tunnel must pass it.
            ns.sysctl("net.ipv4.conf.all.rp_filter", "1");
            ns.sysctl("net.ipv4.conf.default.rp_filter", "1");
            if n < 2 {
                let port = format!("p{n}");
                veth(&ns, "eth0", &lan, &port);
                lan.ip(&["link", "set", &port, "master", "br0"]);
                addr(&ns, "eth0", &format!("{}/24", node_ip(n)));
                addr(&ns, "eth0", &format!("{}/64", node_ip6(n)));
                ns.ip(&["route", "add", "default", "via", "198.19.1.254"]);
                ns.ip(&["-6", "route", "add", "default", "via", "2001:db8:0:a::fe"]);
            } else {
                veth(&ns, "eth0", &router, "rb");
                addr(&router, "rb", "198.19.2.254/24");
                addr(&router, "rb", "2001:db8:0:b::fe/64");
                addr(&ns, "eth0", &format!("{}/24", node_ip(n)));
                addr(&ns, "eth0", &format!("{}/64", node_ip6(n)));
                ns.ip(&["route", "add", "default", "via", "198.19.2.254"]);
                ns.ip(&["-6", "route", "add", "default", "via", "2001:db8:0:b::fe"]);
            }
            if n < 2 {
                // host-gw on the shared subnet: the other node's pods via that node.
                let m = 1 - n;
                ns.ip(&["route", "add", &format!("198.18.{}.0/24", m + 1), "via", &node_ip(m)]);
                ns.ip(&["-6", "route", "add", &format!("2001:db8:1:{}0::/60", m + 1), "via", &node_ip6(m)]);
            }
            cni_masquerade(&ns);
            let node_pods = (0..pods[n].len()).map(|i| add_pod(&ns, &format!("r{n}p{i}"), n, i)).collect();
            nodes.push(Node { ns, name: name.to_string(), pods: node_pods, agent: None });
        }

        let dir = tempfile::tempdir().unwrap();
        let cluster =
            cluster_manifest(&names, |n| [node_ip(n), node_ip6(n)], pods, |n, i| [pod_ip(n, i), pod_ip6(n, i)]);
        std::fs::write(dir.path().join("cluster.yaml"), cluster).unwrap();
        Self { lan, router, nodes, ext, dir }
    }

    /// Bring node `n`'s uplink back with what the kernel dropped while it was down.
    pub fn uplink_up(&self, n: usize) {
        let ns = &self.nodes[n].ns;
        ns.ip(&["link", "set", "eth0", "up"]);
        ns.ip(&["addr", "replace", &format!("{}/24", node_ip(n)), "dev", "eth0"]);
        ns.ip(&["addr", "replace", &format!("{}/64", node_ip6(n)), "dev", "eth0"]);
        let (gw, gw6) = if n < 2 { ("198.19.1.254", "2001:db8:0:a::fe") } else { ("198.19.2.254", "2001:db8:0:b::fe") };
        ns.ip(&["route", "replace", "default", "via", gw]);
        ns.ip(&["-6", "route", "replace", "default", "via", gw6]);
        if n < 2 {
            let m = 1 - n;
            ns.ip(&["route", "replace", &format!("198.18.{}.0/24", m + 1), "via", &node_ip(m)]);
            ns.ip(&["-6", "route", "replace", &format!("2001:db8:1:{}0::/60", m + 1), "via", &node_ip6(m)]);
        }
    }

    pub fn write(&self, name: &str, body: &str) {
        write_manifest(self.dir.path(), name, body);
    }

    /// The EgressIP `name` selecting namespace `team: prod`, with `ips` placed per `items`.
    pub fn egress_ip(&self, name: &str, ips: &[&str], items: &[(&str, &str)]) {
        self.write(&format!("egressip-{name}.yaml"), &egress_ip_manifest(name, ips, items, false));
    }

    pub fn start(&mut self, n: usize, extra: &[&str]) {
        let node = &mut self.nodes[n];
        let cidrs = ["198.18.0.0/16", "2001:db8:1::/48"];
        node.agent = Some(start_manifests_agent(&node.ns, self.dir.path(), &node.name, n, &cidrs, extra));
    }

    pub fn start_all(&mut self, extra: &[&str]) {
        for n in 0..3 {
            self.start(n, extra);
        }
    }

    pub fn logs(&self) -> String {
        self.nodes
            .iter()
            .map(|n| format!("--- {}\n{}", n.name, n.agent.as_ref().map(Agent::log_text).unwrap_or_default()))
            .collect()
    }

    pub fn status(&self, n: usize) -> String {
        let path = self.dir.path().join(format!("state-{}", self.nodes[n].name)).join("status");
        std::fs::read_to_string(path).unwrap_or_default()
    }

    pub fn has_addr(&self, n: usize, ip: &str) -> bool {
        self.nodes[n].ns.ip(&["-o", "addr", "show", "dev", "eth0"]).contains(&format!(" {ip}/"))
    }

    /// Packets the router dropped, both families: (pod sources, other foreign sources,
    /// to pods).
    pub fn vpc_drops(&self) -> (u64, u64, u64) {
        let text = self.router.exec(&["nft", "list", "chain", "inet", "vpc", "filt"]);
        let c = counters(&text);
        (c[0] + c[3], c[1] + c[4], c[2] + c[5])
    }
}

/// The `packets` numbers of a listing, in order.
pub fn counters(text: &str) -> Vec<u64> {
    text.split("packets ").skip(1).filter_map(|s| s.split_whitespace().next()?.parse().ok()).collect()
}

/// Counts the bytes of each connection and answers with the count when the client
/// stops sending; a connection that sends `get <n>` receives n bytes instead.
fn sink_server(ns: &Netns) {
    let listener = ns.run(|| TcpListener::bind(("0.0.0.0", SINK_PORT)).expect("bind sink"));
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let mut s = stream;
                let mut buf = vec![0u8; 65536];
                let mut total = 0usize;
                let mut first = true;
                loop {
                    let n = match s.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => n,
                    };
                    if first && buf[..n].starts_with(b"mss") {
                        // The connection's MSS as the server sends with it (bounded by
                        // the one the client's SYN advertised).
                        let mss = nix::sys::socket::getsockopt(&s, nix::sys::socket::sockopt::TcpMaxSeg).unwrap_or(0);
                        let _ = s.write_all(mss.to_string().as_bytes());
                        return;
                    }
                    if first && buf[..n].starts_with(b"get ") {
                        let want: usize = String::from_utf8_lossy(&buf[4..n]).trim().parse().unwrap_or(0);
                        let _ = s.write_all(&vec![b'x'; want]);
                        return;
                    }
                    first = false;
                    total += n;
                }
                let _ = s.write_all(total.to_string().as_bytes());
            });
        }
    });
}

/// Send `bytes` from `pod` to the sink; what the sink counted.
pub fn upload(pod: &Netns, bytes: usize) -> Option<usize> {
    let target = SocketAddr::new(EXT.parse().unwrap(), SINK_PORT);
    pod.run(move || {
        let mut s = TcpStream::connect_timeout(&target, Duration::from_secs(2)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
        s.set_write_timeout(Some(Duration::from_secs(10))).ok()?;
        s.write_all(&vec![b'u'; bytes]).ok()?;
        s.shutdown(std::net::Shutdown::Write).ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).ok()?;
        out.trim().parse().ok()
    })
}

/// The MSS the external host sends with on a new connection from `pod`.
pub fn server_mss(pod: &Netns) -> Option<u32> {
    let target = SocketAddr::new(EXT.parse().unwrap(), SINK_PORT);
    pod.run(move || {
        let mut s = TcpStream::connect_timeout(&target, Duration::from_secs(2)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(3))).ok()?;
        s.write_all(b"mss").ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).ok()?;
        out.trim().parse().ok()
    })
}

/// Ask the sink for `bytes`; how many arrived.
pub fn download(pod: &Netns, bytes: usize) -> usize {
    let target = SocketAddr::new(EXT.parse().unwrap(), SINK_PORT);
    pod.run(move || {
        let Ok(mut s) = TcpStream::connect_timeout(&target, Duration::from_secs(2)) else { return 0 };
        let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
        if s.write_all(format!("get {bytes}").as_bytes()).is_err() {
            return 0;
        }
        let mut got = Vec::new();
        let _ = s.read_to_end(&mut got);
        got.len()
    })
}
