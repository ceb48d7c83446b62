//! What the DNS proxy costs (root; `sudo cargo bench --bench dns_proxy`, also run by
//! `bench/run.sh`): per mode (`snoop`: pods ask the server directly, answers copied;
//! `proxy`: answers held until the kernel took what they teach)
//!
//! 1. latency of one query at a low rate (one pod asking in sequence, `LATENCY_QUERIES`
//!    queries), p50 and p99, as the pod measures it (send → answer);
//! 2. throughput: `CLIENTS` sockets in the pod, each asking again as soon as it has an
//!    answer (closed loop), for `SECS` seconds: answered queries per second, and the
//!    agent's CPU (utime + stime from /proc) per 1,000 queries per second.
//!
//! Workloads, both parts: every query is for a name a wildcard `dnsName` rule of the
//! pod's namespace matches (`q<i>.<a|b|c|d>.example.com`, four rules). `pool`: every
//! answer carries one of 16,384 addresses, TTL 300 s (a repeated address already in the
//! kernel with over half its grace left costs no kernel write); `fresh`: every answer a
//! new address, TTL 5 s, `--dns-grace-secs 1` (a kernel write per answer: the proxy's
//! worst case; the short timeout keeps the sets under their bounds). Rows: snoop with
//! `pool`, proxy with `pool`, proxy with `fresh`. Topology: tests/netns (node running
//! egressd, one pod, the external host with the DNS server: two threads answering UDP
//! on one socket).

#[path = "../tests/netns/mod.rs"]
mod netns;

use std::net::{IpAddr, Ipv6Addr, SocketAddr, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hickory_proto::op::{Message, MessageType, Query};
use hickory_proto::rr::rdata::AAAA;
use hickory_proto::rr::{Name, RData, Record, RecordType};

const DNS: &str = "203.0.113.2";
const POOL: u32 = 16_384;

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Answers `q<i>.<x>.example.com` AAAA: with `fresh`, address `i` (TTL 5 s), else an
/// address of the pool (TTL 300 s).
fn responder(ns: &netns::Netns, fresh: bool) {
    let socket = ns.run(|| UdpSocket::bind((DNS, 53)).expect("bind dns"));
    for _ in 0..2 {
        let socket = socket.try_clone().expect("clone");
        std::thread::spawn(move || {
            let mut buf = [0u8; 1500];
            while let Ok((n, from)) = socket.recv_from(&mut buf) {
                let Ok(q) = Message::from_vec(&buf[..n]) else { continue };
                let Some(query) = q.queries.first() else { continue };
                let name = query.name.to_ascii();
                let i: u32 =
                    name.strip_prefix('q').and_then(|s| s.split('.').next()).and_then(|s| s.parse().ok()).unwrap_or(0);
                let mut a = Message::query();
                a.metadata.id = q.metadata.id;
                a.metadata.message_type = MessageType::Response;
                a.add_query(query.clone());
                let (ip, ttl) = if fresh {
                    (Ipv6Addr::new(0x2001, 0xdb8, 0xff, 3, 0, 1, (i >> 16) as u16, i as u16), 5)
                } else {
                    (Ipv6Addr::new(0x2001, 0xdb8, 0xff, 3, 0, 0, 0, (i % POOL) as u16 + 1), 300)
                };
                a.add_answer(Record::from_rdata(query.name.clone(), ttl, RData::AAAA(AAAA(ip))));
                let _ = socket.send_to(&a.to_vec().expect("encode"), from);
            }
        });
    }
}

fn query(i: u32) -> Vec<u8> {
    let mut m = Message::query();
    m.metadata.id = i as u16;
    let zone = ["a", "b", "c", "d"][i as usize % 4];
    m.add_query(Query::query(Name::from_ascii(format!("q{i}.{zone}.example.com.")).expect("name"), RecordType::AAAA));
    m.to_vec().expect("encode")
}

/// Ask on `s` and wait for the answer with the same id.
fn ask(s: &UdpSocket, i: u32) -> bool {
    let target = SocketAddr::new(IpAddr::V4(DNS.parse().expect("addr")), 53);
    if s.send_to(&query(i), target).is_err() {
        return false;
    }
    let mut buf = [0u8; 1500];
    loop {
        match s.recv_from(&mut buf) {
            Ok((n, _)) if n >= 2 && u16::from_be_bytes([buf[0], buf[1]]) == i as u16 => return true,
            Ok(_) => continue,
            Err(_) => return false,
        }
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[(((sorted.len() - 1) as f64) * p).round() as usize]
}

/// The agent's CPU time so far (utime + stime).
fn cpu(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat.rsplit_once(')').map(|(_, r)| r.split_whitespace().collect()).unwrap_or_default();
    let ticks: u64 = fields.get(11..13).map(|f| f.iter().filter_map(|v| v.parse::<u64>().ok()).sum()).unwrap_or(0);
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).ok().flatten().unwrap_or(100) as u64;
    Duration::from_millis(ticks * 1000 / hz)
}

/// The agent's resident memory, current and peak (VmRSS, VmHWM), in MiB.
fn memory(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib = |key: &str| -> u64 {
        status.lines().find_map(|l| l.strip_prefix(key)?.split_whitespace().next()?.parse().ok()).unwrap_or(0)
    };
    (kib("VmRSS:") / 1024, kib("VmHWM:") / 1024)
}

struct Row {
    mode: &'static str,
    workload: &'static str,
    p50: Duration,
    p99: Duration,
    qps: f64,
    lost: u64,
    cpu_per_kqps: f64,
    /// The agent's RSS after the run and its peak, MiB.
    rss: (u64, u64),
}

fn measure(mode: &'static str, fresh: bool, latency_queries: u32, clients: u32, secs: u64) -> Row {
    let t = netns::Topology::new(&["team-a"]);
    t.ext.ip(&["-6", "route", "add", "local", "2001:db8:ff:3::/64", "dev", "lo"]);
    t.node.ip(&["-6", "route", "add", "2001:db8:ff:3::/64", "via", "2001:db8:ff::2"]);
    responder(&t.ext, fresh);
    t.set_firewall(
        "team-a",
        &[
            "  - type: Allow\n    to: {dnsName: \"*.a.example.com\"}\n    ports: [{protocol: TCP, port: 8443}]\n",
            "  - type: Allow\n    to: {dnsName: \"*.b.example.com\"}\n    ports: [{protocol: TCP, port: 8443}]\n",
            "  - type: Allow\n    to: {dnsName: \"*.c.example.com\"}\n    ports: [{protocol: TCP, port: 8443}]\n",
            "  - type: Allow\n    to: {dnsName: \"*.d.example.com\"}\n    ports: [{protocol: TCP, port: 8443}]\n",
            "  - type: Allow\n    to: {cidrSelector: 203.0.113.2/32}\n    ports: [{protocol: UDP, port: 53}]\n",
            "  - type: Deny\n    to: {cidrSelector: \"::/0\"}\n",
        ]
        .concat(),
    );
    let mut args = vec!["--dns-server", DNS, "--cluster-dns", DNS, "--dns-mode", mode];
    if fresh {
        args.extend(["--dns-grace-secs", "1"]);
    }
    let agent = t.start_agent_with(mode, &args);
    let pod = &t.pods[0];
    // Ready: the proxy's guard is in place (or snooping is on) and answers flow.
    std::thread::sleep(Duration::from_millis(500));

    // 1. Latency, one query at a time.
    let mut latencies: Vec<Duration> = pod.run(move || {
        let s = UdpSocket::bind("0.0.0.0:0").expect("bind");
        s.set_read_timeout(Some(Duration::from_secs(1))).expect("timeout");
        (0..latency_queries)
            .filter_map(|i| {
                let start = Instant::now();
                ask(&s, i).then(|| start.elapsed())
            })
            .collect()
    });
    latencies.sort();

    // 2. Throughput, closed loop.
    let stop = Arc::new(AtomicBool::new(false));
    let answered = Arc::new(AtomicU64::new(0));
    let lost = Arc::new(AtomicU64::new(0));
    let cpu_before = cpu(agent.pid());
    let started = Instant::now();
    let threads: Vec<_> = (0..clients)
        .map(|c| {
            let (stop, answered, lost) = (stop.clone(), answered.clone(), lost.clone());
            pod.run(move || {
                std::thread::spawn(move || {
                    let s = UdpSocket::bind("0.0.0.0:0").expect("bind");
                    s.set_read_timeout(Some(Duration::from_millis(500))).expect("timeout");
                    let mut i = c * 1_000_000;
                    while !stop.load(Ordering::Relaxed) {
                        i += 1;
                        if ask(&s, i) {
                            answered.fetch_add(1, Ordering::Relaxed);
                        } else {
                            lost.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                })
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs(secs));
    stop.store(true, Ordering::Relaxed);
    let elapsed = started.elapsed();
    let cpu_used = cpu(agent.pid()).saturating_sub(cpu_before);
    for th in threads {
        let _ = th.join();
    }
    let qps = answered.load(Ordering::Relaxed) as f64 / elapsed.as_secs_f64();
    let rss = memory(agent.pid());
    let metrics = netns::http_get(&t.node, "127.0.0.1:9780", "/metrics").map(|(_, b)| b).unwrap_or_default();
    for line in
        metrics.lines().filter(|l| l.starts_with("egressd_dns_proxied") || l.starts_with("egressd_dns_snoop_dropped"))
    {
        eprintln!("{mode}: {line}");
    }
    let core_share = cpu_used.as_secs_f64() / elapsed.as_secs_f64();
    Row {
        mode,
        workload: if fresh { "fresh" } else { "pool" },
        p50: percentile(&latencies, 0.5),
        p99: percentile(&latencies, 0.99),
        qps,
        lost: lost.load(Ordering::Relaxed),
        cpu_per_kqps: if qps > 0.0 { 100.0 * core_share / (qps / 1000.0) } else { 0.0 },
        rss,
    }
}

fn main() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("dns_proxy: needs root (network namespaces); skipped");
        return;
    }
    let latency_queries = env("LATENCY_QUERIES", 5000) as u32;
    let clients = env("CLIENTS", 32) as u32;
    let secs = env("SECS", 5);
    let rows: Vec<Row> = [("snoop", false), ("proxy", false), ("proxy", true)]
        .into_iter()
        .map(|(m, fresh)| measure(m, fresh, latency_queries, clients, secs))
        .collect();
    let ms = |d: Duration| format!("{:.3} ms", d.as_secs_f64() * 1000.0);
    println!(
        "| mode | answers | query p50 | query p99 | queries/s, {clients} clients (goal ≥ 20,000 for proxy) | unanswered in 500 ms | agent CPU per 1,000 qps | agent RSS now / peak |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for r in &rows {
        println!(
            "| {} | {} | {} | {} | {:.0} | {} | {:.1} % of a core | {} / {} MiB |",
            r.mode,
            r.workload,
            ms(r.p50),
            ms(r.p99),
            r.qps,
            r.lost,
            r.cpu_per_kqps,
            r.rss.0,
            r.rss.1
        );
    }
    if let [snoop, proxy, _] = &rows[..] {
        let added = |a: Duration, b: Duration| (a.as_secs_f64() - b.as_secs_f64()) * 1000.0;
        println!();
        println!(
            "Added by the proxy (pool): p50 {:.3} ms (goal < 0.2 ms), p99 {:.3} ms; {latency_queries} sequential queries per row, then {secs} s of {clients} closed-loop clients.",
            added(proxy.p50, snoop.p50),
            added(proxy.p99, snoop.p99)
        );
    }
}
