//! `egressd explain` against real packets: random EgressFirewalls on a node namespace
//! (root required), a few hundred random (pod, destination, port) triples, and for each
//! the verdict the running agent explains (asked on its socket) must be what the packet
//! gets — delivered (an answer, a refusal) or dropped (silence). Then `--kernel`: the
//! deciding rule's counter moves when the connection is retried, and
//! `egressd status --counters` lists the rule.
//!
//! Topology: `netns::Topology` with four pods (team-a ×2, team-b (audit mode in round 2), team-c
//! without an EgressFirewall); the external host answers on every address of
//! 192.0.2.0/24, 198.51.100.0/24 and 2001:db8:ff:1::/64 (local routes), and a Node `gw`
//! has its address 203.0.113.2 (for nodeSelector rules).

mod netns;

use std::io::ErrorKind;
use std::net::{IpAddr, SocketAddr, TcpStream, UdpSocket};
use std::time::Duration;

use egressd::explain::{Query, Verdict};
use egressd::view::policy::Protocol;
use netns::{Netns, Topology, egressd_bin, wait_for};

/// xorshift64*: reproducible randomness without a dependency (the seed is printed).
struct Rng(u64);

impl Rng {
    /// A well-mixed start for any seed (small seeds give correlated xorshift runs).
    fn new(seed: u64) -> Self {
        let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        Self((z ^ (z >> 31)) | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

const PODS: [(&str, &str); 4] = [("team-a", "{app: web}"), ("team-a", "{app: db}"), ("team-b", "{}"), ("team-c", "{}")];
const PORTS: [(Protocol, u16); 5] =
    [(Protocol::Tcp, 8080), (Protocol::Tcp, 443), (Protocol::Udp, 53), (Protocol::Udp, 9999), (Protocol::Tcp, 9090)];

/// A random address inside `net` (v4 /24 or v6 /64 pools).
fn address_in(rng: &mut Rng, net: ipnet::IpNet) -> IpAddr {
    match net {
        ipnet::IpNet::V4(n) => {
            let host_bits = 32 - u32::from(n.prefix_len());
            let offset = if host_bits == 0 { 0 } else { (rng.next() as u32) & ((1u32 << host_bits) - 1) };
            IpAddr::V4((u32::from(n.network()) | offset).into())
        }
        ipnet::IpNet::V6(n) => {
            let host_bits = 128 - u32::from(n.prefix_len());
            let r = (u128::from(rng.next()) << 64) | u128::from(rng.next());
            let offset = if host_bits == 0 { 0 } else { r & ((1u128 << host_bits) - 1) };
            IpAddr::V6((u128::from(n.network()) | offset).into())
        }
    }
}

/// A random CIDR inside one of the external pools.
fn random_cidr(rng: &mut Rng) -> ipnet::IpNet {
    let pools: [ipnet::IpNet; 3] =
        ["192.0.2.0/24".parse().unwrap(), "198.51.100.0/24".parse().unwrap(), "2001:db8:ff:1::/64".parse().unwrap()];
    let pool = *rng.pick(&pools);
    let len = match pool {
        ipnet::IpNet::V4(_) => *rng.pick(&[24u8, 25, 26, 28, 30, 32]),
        ipnet::IpNet::V6(_) => *rng.pick(&[64u8, 96, 120, 126, 128]),
    };
    let addr = address_in(rng, pool);
    ipnet::IpNet::new(addr, len).unwrap().trunc()
}

/// Many IPv4 rules: runs of five same-action rules with one port set and distinct
/// destinations, actions alternating between runs (every run a named set of its own:
/// the kernel keeps less of the list flattened into pieces, `compile/boxes.rs`), runs
/// overlapping each other.
fn many_rules(rng: &mut Rng) -> (String, Vec<ipnet::IpNet>) {
    let mut yaml = String::new();
    let mut cidrs = Vec::new();
    // One /24 of sixteen blocks and two ports: runs overlap often.
    let pools = ["192.0.2.0"];
    for run in 0..20 + rng.below(4) {
        let action = if run % 2 == 0 { "Allow" } else { "Deny" };
        let ports = match rng.below(3) {
            0 => String::new(),
            _ => {
                let (p, port) = *rng.pick(&PORTS[1..3]);
                format!(", ports: [{{protocol: {}, port: {port}}}]", if p == Protocol::Tcp { "TCP" } else { "UDP" })
            }
        };
        let mut blocks: Vec<usize> = (0..16).collect();
        for _ in 0..5 {
            let b = blocks.remove(rng.below(blocks.len()));
            let base: IpAddr = pools[b / 16].parse().unwrap();
            let IpAddr::V4(v4) = base else { unreachable!() };
            let addr = IpAddr::V4((u32::from(v4) + 16 * (b as u32 % 16)).into());
            let c = ipnet::IpNet::new(addr, *rng.pick(&[28u8, 29, 30, 32])).unwrap().trunc();
            cidrs.push(c);
            yaml.push_str(&format!("  - {{type: {action}, to: {{cidrSelector: \"{c}\"}}{ports}}}\n"));
        }
    }
    // No deny-all after them: what matches nothing is allowed (a deny-all would be
    // flattened into the pieces the runs leave, which costs more than the runs).
    (yaml, cidrs)
}

/// A random rule list (YAML lines) and the CIDRs it names: 3–10 rules.
fn random_rules(rng: &mut Rng) -> (String, Vec<ipnet::IpNet>) {
    let mut yaml = String::new();
    let mut cidrs = Vec::new();
    for _ in 0..3 + rng.below(8) {
        let action = if rng.below(5) < 3 { "Allow" } else { "Deny" };
        let to = match rng.below(20) {
            0 | 1 => "nodeSelector: {matchLabels: {role: gw}}".to_string(),
            2 => "cidrSelector: 0.0.0.0/0".to_string(),
            3 => "cidrSelector: \"::/0\"".to_string(),
            _ => {
                let c = random_cidr(rng);
                cidrs.push(c);
                format!("cidrSelector: \"{c}\"")
            }
        };
        let mut ports = Vec::new();
        if rng.below(2) == 0 {
            for _ in 0..1 + rng.below(2) {
                let (p, port) = *rng.pick(&PORTS[1..3]);
                let p = if p == Protocol::Tcp { "TCP" } else { "UDP" };
                ports.push(format!("{{protocol: {p}, port: {port}}}"));
            }
        }
        let ports = if ports.is_empty() { String::new() } else { format!(", ports: [{}]", ports.join(", ")) };
        yaml.push_str(&format!("  - {{type: {action}, to: {{{to}}}{ports}}}\n"));
    }
    // Most EgressFirewalls end in a deny-all.
    if rng.below(4) != 0 {
        yaml.push_str("  - {type: Deny, to: {cidrSelector: 0.0.0.0/0}}\n");
    }
    if rng.below(4) != 0 {
        yaml.push_str("  - {type: Deny, to: {cidrSelector: \"::/0\"}}\n");
    }
    (yaml, cidrs)
}

/// What the packet gets: `Some(true)` delivered (answered or refused), `Some(false)`
/// dropped (no answer in time), `None` something else (an error to report).
fn probe(ns: &Netns, to: IpAddr, proto: Protocol, port: u16) -> Result<bool, String> {
    let target = SocketAddr::new(to, port);
    ns.run(move || match proto {
        Protocol::Tcp => match TcpStream::connect_timeout(&target, Duration::from_millis(600)) {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == ErrorKind::ConnectionRefused => Ok(true),
            Err(e) if e.kind() == ErrorKind::TimedOut || e.kind() == ErrorKind::WouldBlock => Ok(false),
            Err(e) => Err(format!("tcp {target}: {e}")),
        },
        _ => {
            let bind: SocketAddr = if to.is_ipv4() { "0.0.0.0:0".parse().unwrap() } else { "[::]:0".parse().unwrap() };
            let s = UdpSocket::bind(bind).map_err(|e| e.to_string())?;
            s.connect(target).map_err(|e| e.to_string())?;
            s.set_read_timeout(Some(Duration::from_millis(600))).map_err(|e| e.to_string())?;
            s.send(b"probe").map_err(|e| e.to_string())?;
            let mut buf = [0u8; 64];
            match s.recv(&mut buf) {
                Ok(_) => Ok(true),
                Err(e) if e.kind() == ErrorKind::ConnectionRefused => Ok(true),
                Err(e) if e.kind() == ErrorKind::TimedOut || e.kind() == ErrorKind::WouldBlock => Ok(false),
                Err(e) => Err(format!("udp {target}: {e}")),
            }
        }
    })
}

struct Triple {
    pod: usize,
    to: IpAddr,
    proto: Protocol,
    port: u16,
}

fn random_triples(rng: &mut Rng, n: usize, cidrs: &[Vec<ipnet::IpNet>]) -> Vec<Triple> {
    (0..n)
        .map(|_| {
            // team-c (no EgressFirewall) less often: it allows everything.
            let pod = [0, 0, 1, 1, 2, 2, 2, 3][rng.below(8)];
            let to = match rng.below(10) {
                0 => "203.0.113.2".parse().unwrap(),
                1..=5 if !cidrs[pod].is_empty() => {
                    let c = *rng.pick(&cidrs[pod]);
                    address_in(rng, c)
                }
                _ => {
                    let c = random_cidr(rng);
                    address_in(rng, c)
                }
            };
            let (proto, port) = *rng.pick(&PORTS);
            Triple { pod, to, proto, port }
        })
        .collect()
}

fn syncs(agent: &netns::Agent) -> usize {
    agent.log_text().matches("dataplane in sync").count()
}

#[test]
fn explained_verdicts_are_what_packets_get() {
    let t = Topology::with_pods(&PODS);
    // The external host answers on whole ranges; its ICMP errors are not rate limited.
    for range in ["192.0.2.0/24", "198.51.100.0/24"] {
        t.ext.ip(&["route", "add", "local", range, "dev", "lo"]);
    }
    t.ext.ip(&["-6", "route", "add", "local", "2001:db8:ff:1::/64", "dev", "lo"]);
    t.ext.sysctl("net.ipv4.icmp_ratelimit", "0");
    t.ext.sysctl("net.ipv4.icmp_msgs_per_sec", "100000");
    t.ext.sysctl("net.ipv6.icmp.ratelimit", "0");
    t.write_manifest(
        "nodes.yaml",
        "apiVersion: v1\nkind: Node\nmetadata: {name: gw, labels: {role: gw}}\nstatus: {addresses: [{type: InternalIP, address: 203.0.113.2}]}\n",
    );
    let mut agent = t.start_agent("agent");
    let state = t.dir.path().join("state");
    let seed: u64 = std::env::var("EGRESSD_EXPLAIN_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x5eed_e991);
    eprintln!("seed {seed} (EGRESSD_EXPLAIN_SEED reproduces a run)");
    let mut rng = Rng::new(seed);
    let mut mismatches = Vec::new();
    let mut checked = 0;
    let (mut allowed, mut dropped) = (0, 0);
    // Round 2 (last: the `--kernel` checks below read its chain) has long rule lists,
    // flattened.
    for round in 0..3 {
        let rules = |rng: &mut Rng| if round == 2 { many_rules(rng) } else { random_rules(rng) };
        let (rules_a, cidrs_a) = rules(&mut rng);
        let (rules_b, cidrs_b) = rules(&mut rng);
        let before = syncs(&agent);
        // team-b audits in the second round only.
        let audit = if round == 1 { ", annotations: {egressd.io/audit: \"true\"}" } else { "" };
        t.write_manifest(
            "firewalls.yaml",
            &format!(
                "apiVersion: k8s.ovn.org/v1\nkind: EgressFirewall\nmetadata: {{name: default, namespace: team-a}}\nspec:\n  egress:\n{rules_a}\
                 ---\napiVersion: k8s.ovn.org/v1\nkind: EgressFirewall\nmetadata: {{name: default, namespace: team-b{audit}}}\nspec:\n  egress:\n{rules_b}"
            ),
        );
        assert!(
            wait_for(Duration::from_secs(10), || syncs(&agent) > before).is_some(),
            "round {round}: the new rules were not applied:\n{}",
            agent.log_text()
        );
        if round == 2 {
            let table = t.node.nft_list();
            assert!(table.contains("meta l4proto . th dport . ip daddr @fw-team-a-s0-"), "not flattened:\n{table}");
        }
        let cidrs = [cidrs_a.clone(), cidrs_a, cidrs_b, Vec::new()];
        let triples = random_triples(&mut rng, 160, &cidrs);
        // Probe 16 at a time (a dropped probe waits for its timeout).
        let results: Vec<Result<bool, String>> = std::thread::scope(|s| {
            let handles: Vec<_> = triples
                .chunks(triples.len().div_ceil(16))
                .map(|chunk| {
                    s.spawn(|| {
                        chunk.iter().map(|tr| probe(&t.pods[tr.pod], tr.to, tr.proto, tr.port)).collect::<Vec<_>>()
                    })
                })
                .collect();
            handles.into_iter().flat_map(|h| h.join().unwrap()).collect()
        });
        for (tr, got) in triples.iter().zip(results) {
            let pod = format!("{}/pod{}", PODS[tr.pod].0, tr.pod);
            let to = match tr.to {
                IpAddr::V4(a) => format!("{a}:{}/{}", tr.port, tr.proto.nft()),
                IpAddr::V6(a) => format!("[{a}]:{}/{}", tr.port, tr.proto.nft()),
            };
            let q = Query::parse(Some(&pod), None, &to).unwrap();
            let e = egressd::explain::socket::ask(&state, &q, Duration::from_secs(5)).unwrap();
            let explained = e.firewall.verdict == Verdict::Allowed;
            checked += 1;
            if explained {
                allowed += 1
            } else {
                dropped += 1
            }
            match got {
                Ok(delivered) if delivered == explained => {}
                other => mismatches.push(format!("round {round}: {pod} → {to}: packet {other:?}, explain:\n{e}")),
            }
        }
        if !mismatches.is_empty() {
            mismatches.push(format!("round {round} rules:\n{}", rules_text(&t)));
        }
    }
    eprintln!("{checked} triples: {allowed} explained allowed, {dropped} dropped");
    assert!(allowed > 30 && dropped > 30, "the random rules should both allow and drop: {allowed}/{dropped}");
    assert!(mismatches.is_empty(), "{} of {checked} mismatches:\n{}", mismatches.len(), mismatches.join("\n"));

    // --kernel: find a triple decided by a rule and retry it; the rule's counter moves.
    let bin = egressd_bin();
    let state_arg = state.to_str().unwrap().to_string();
    let explain = |to: &str, extra: &[&str]| -> String {
        let mut args = vec![
            bin.to_str().unwrap(),
            "explain",
            "--state-dir",
            &state_arg,
            "--pod",
            "team-a/pod0",
            "--to",
            to,
            "--kernel",
        ];
        args.extend_from_slice(extra);
        t.node.exec(&args)
    };
    let explain_json = |to: &str| -> serde_json::Value {
        let out = explain(to, &["-o", "json"]);
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
    };
    let to = (0..64)
        .map(|i| format!("192.0.2.{}:8080/tcp", 1 + 4 * i))
        .chain((0..64).map(|i| format!("198.51.100.{}:8080/tcp", 1 + 4 * i)))
        .find(|to| !explain_json(to)["firewall"]["rule"].is_null())
        .expect("some v4 destination is decided by a rule of team-a");
    let first = explain_json(&to);
    assert_eq!(first["kernel"]["pod_in_map"], serde_json::json!(true), "{first:#}");
    assert_eq!(first["kernel"]["problems"], serde_json::json!([]), "{first:#}");
    let before = first["kernel"]["rule_counter"][0].as_u64().expect("a counter");
    let addr: IpAddr = to.split(':').next().unwrap().parse().unwrap();
    let _ = probe(&t.pods[0], addr, Protocol::Tcp, 8080);
    let after = explain_json(&to)["kernel"]["rule_counter"][0].as_u64().unwrap();
    assert!(after > before, "the rule's counter did not move: {before} → {after} ({to})");
    let index = first["firewall"]["rule"]["index"].as_u64().unwrap();
    let text = t.node.exec(&[bin.to_str().unwrap(), "status", "--state-dir", &state_arg, "--counters"]);
    assert!(text.contains("# rule counters (kernel, table inet egressd)"), "{text}");
    // The rule's line: `egress[i]`, or `egress[a..b]` for a merged run holding it.
    let holds = |rules: &str| match rules.split_once("..") {
        Some((a, b)) => (a.parse::<u64>().unwrap()..=b.parse::<u64>().unwrap()).contains(&index),
        None => rules.parse::<u64>().unwrap() == index,
    };
    // The lines of the lookups of the rule's verdict holding it (flattened, its ported
    // and its portless pieces' lookups may both span the index; the allowed and the
    // denied pieces' lookups too), summed.
    let verdict = if first["firewall"]["verdict"] == "allowed" { "accept" } else { "drop" };
    let packets: u64 = text
        .lines()
        .filter_map(|l| {
            let (rules, rest) = l.strip_prefix("fw-team-a\tegress[")?.split_once(']')?;
            let mut cols = rest.strip_prefix('\t')?.split('\t');
            (holds(rules) && cols.next() == Some(verdict)).then(|| cols.next()?.parse::<u64>().ok()).flatten()
        })
        .sum();
    assert!(packets >= after, "rule {index}: {packets} < {after}:\n{text}");
    // The text form names the rule and the counter.
    let text = explain(&to, &[]);
    assert!(text.contains(&format!("EgressFirewall team-a/default rule {index}")), "{text}");
    assert!(text.contains("the deciding rule's counter:"), "{text}");
    assert!(text.contains("the pod's address is in the fw-pods map"), "{text}");
    agent.stop();
    // The pod's element holds its namespace's number; without the number's element in
    // `fw-namespaces` its traffic reaches no chain, and the check says so.
    let pods = t.node.exec(&["nft", "list", "map", "inet", "egressd", "fw-pods-v4"]);
    let number = pods.split("198.18.1.2 : ").nth(1).and_then(|r| r.split([',', ' ', '\n']).next()).expect(&pods);
    t.node.exec(&["nft", "delete", "element", "inet", "egressd", "fw-namespaces", &format!("{{ {number} }}")]);
    // The agent is gone: explained from the manifests, with its settings.
    let manifests = t.manifests();
    let mut args = vec![bin.to_str().unwrap(), "explain", "--manifests", manifests.to_str().unwrap()];
    args.extend_from_slice(&netns::NODE_ARGS);
    args.extend_from_slice(&["--pod", "team-a/pod0", "--to", &to, "--kernel", "-o", "json"]);
    let out = t.node.exec(&args);
    let broken: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(broken["kernel"]["pod_in_map"], serde_json::json!(false), "{broken:#}");
    let problems = broken["kernel"]["problems"].to_string();
    assert!(
        problems.contains(&format!("maps to {number} in fw-pods-v4, which fw-namespaces sends nowhere")),
        "{problems}"
    );
}

fn rules_text(t: &Topology) -> String {
    std::fs::read_to_string(t.manifests().join("firewalls.yaml")).unwrap_or_default()
}
