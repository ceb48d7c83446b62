//! A golden case's inputs (`tests/golden/<case>/args` and `links`) as the node's
//! settings and links: shared by the golden tests and the netlink tests that load the
//! golden tables.

use egressd::compile::NodeConfig;
use egressd::net::{HostLink, HostLinks};
use ipnet::IpNet;

/// The node's links, one per line: `INDEX NAME up|down ADDR/LEN... [gw GATEWAY] [default]`.
pub fn host_links(text: &str) -> HostLinks {
    let mut host = HostLinks::default();
    for line in text.lines().filter(|l| !l.trim().is_empty() && !l.starts_with('#')) {
        let words: Vec<&str> = line.split_whitespace().collect();
        let mut link = HostLink {
            index: words[0].parse().unwrap(),
            name: words[1].to_string(),
            up: words[2] == "up",
            ..Default::default()
        };
        let mut rest = words[3..].iter();
        while let Some(w) = rest.next() {
            match *w {
                "gw" => link.gateways.push(rest.next().unwrap().parse().unwrap()),
                "default" => {
                    host.default_link = [Some(link.index), Some(link.index)];
                }
                addr => link.addrs.push(addr.parse().unwrap()),
            }
        }
        host.links.push(link);
    }
    host
}

pub fn node_config(args: &str) -> NodeConfig {
    let mut node = NodeConfig::new("", vec![]);
    let mut snoop = true;
    let cidrs = |v: &str| -> Vec<IpNet> { v.split(',').map(|c| c.trim().parse().unwrap()).collect() };
    for line in args.lines().filter(|l| !l.trim().is_empty()) {
        let (k, v) = line.split_once(':').unwrap();
        match k.trim() {
            "node-name" => node.node_name = v.trim().to_string(),
            "cluster-cidr" => node.cluster_cidrs = cidrs(v),
            "service-cidr" => node.service_cidrs = cidrs(v),
            "cluster-dns" => {
                let servers = v.split(',').map(|c| c.trim().parse().unwrap()).collect();
                node.snoop = Some(egressd::dns::targets::SnoopSettings { group: 4747, servers, rate: 10_000 });
            }
            "no-dns-snoop" => snoop = false,
            "dns-mode" => {}
            "fail-closed" => node.egress.fail_closed = true,
            other => panic!("unknown key {other} in args"),
        }
    }
    // As `egressd run`: snooping on unless switched off.
    if snoop && node.snoop.is_none() {
        node.snoop = Some(egressd::dns::targets::SnoopSettings { group: 4747, servers: vec![], rate: 10_000 });
    }
    if !snoop {
        node.snoop = None;
    }
    // As `egressd run`: the DNS proxy on (--dns-mode proxy) with its defaults.
    if node.snoop.is_some() && !args.lines().any(|l| l.trim() == "dns-mode: snoop") {
        node.dns_proxy = Some(egressd::dns::targets::DnsProxySettings::new(
            egressd::dns::targets::DEFAULT_PROXY_PORT,
            egressd::dns::targets::DEFAULT_PROXY_MARK_MASK,
            &node.egress,
        ));
    }
    node
}

/// The case's node settings and links (no `links` file: none).
pub fn case_inputs(case: &std::path::Path) -> (NodeConfig, HostLinks) {
    let args = std::fs::read_to_string(case.join("args")).unwrap();
    let links = std::fs::read_to_string(case.join("links")).map(|t| host_links(&t)).unwrap_or_default();
    (node_config(&args), links)
}
