//! The DNS race, measured for `--dns-mode snoop` and `--dns-mode proxy` (root;
//! `sudo cargo bench --bench snoop_race`, also run by `bench/run.sh`).
//!
//! Snooping never holds an answer: the pod has it as soon as the kernel forwards it, and
//! egressd adds the learned address to the rule's set a little later. The proxy holds
//! the answer until the kernel took the address. Per mode this measures
//!
//! 1. the time from the DNS server sending an answer (timestamp taken right before
//!    `send_to`) to the address being in the kernel set (polled with `GETSETELEM` from
//!    the node's namespace), over `N` answers with fresh addresses;
//! 2. "immediate" connects — the pod connects the moment it has the answer, a fresh
//!    address each time — whose first SYN arrives before the address and is dropped by
//!    the deny-all rule (the connect then waits for the kernel's 1 s SYN retransmission;
//!    detected as a connect not done within 300 ms). `CONNECTS_SNOOP` (default 2,000)
//!    and `CONNECTS_PROXY` (default 100,000; the goal is 0 lost) of them.
//!
//! Topology: tests/netns (node running egressd, a pod, the external host); the DNS
//! server is a small UDP responder in the external host answering AAAA for
//! `q<i>.example.com` with `2001:db8:ff:2::<i>` (each answer a new address, so each
//! measurement is a real set addition; TTL 5 s and `--dns-grace-secs 1`, so 100,000
//! fresh addresses stay within the set's bounds); the external host accepts the whole /64.

#[path = "../tests/netns/mod.rs"]
mod netns;

use std::net::{IpAddr, Ipv6Addr, SocketAddr, TcpStream, UdpSocket};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hickory_proto::op::{Message, MessageType, Query};
use hickory_proto::rr::rdata::AAAA;
use hickory_proto::rr::{Name, RData, Record, RecordType};

const DNS: &str = "203.0.113.2";

fn address(i: u32) -> Ipv6Addr {
    Ipv6Addr::new(0x2001, 0xdb8, 0xff, 2, 0, 0, (i >> 16) as u16, i as u16)
}

fn env(name: &str, default: u32) -> u32 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// The responder: answers `q<i>.example.com` AAAA with `address(i)`, recording when
/// each answer was sent.
fn responder(ns: &netns::Netns, sent: Arc<Mutex<Vec<(u32, Instant)>>>) {
    let socket = ns.run(|| UdpSocket::bind((DNS, 53)).expect("bind dns"));
    std::thread::spawn(move || {
        let mut buf = [0u8; 1500];
        while let Ok((n, from)) = socket.recv_from(&mut buf) {
            let Ok(q) = Message::from_vec(&buf[..n]) else { continue };
            let Some(query) = q.queries.first() else { continue };
            let name = query.name.to_ascii();
            let Some(i) = name.strip_prefix('q').and_then(|s| s.split('.').next()).and_then(|s| s.parse().ok()) else {
                continue;
            };
            let mut a = Message::query();
            a.metadata.id = q.metadata.id;
            a.metadata.message_type = MessageType::Response;
            a.add_query(query.clone());
            a.add_answer(Record::from_rdata(query.name.clone(), 5, RData::AAAA(AAAA(address(i)))));
            let bytes = a.to_vec().expect("encode");
            // Recorded before sending: the pod (and egressd) may see the answer before
            // this thread runs again.
            sent.lock().expect("lock").push((i, Instant::now()));
            let _ = socket.send_to(&bytes, from);
        }
    });
}

fn ask(pod: &netns::Netns, i: u32) -> Option<Ipv6Addr> {
    pod.run(move || ask_here(i))
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

/// One mode's figures: the row of the table.
fn measure(mode: &str, n: u32, connects: u32) -> String {
    let t = netns::Topology::new(&["team-a"]);
    t.ext.ip(&["-6", "route", "add", "local", "2001:db8:ff:2::/64", "dev", "lo"]);
    t.node.ip(&["-6", "route", "add", "2001:db8:ff:2::/64", "via", "2001:db8:ff::2"]);
    netns::serve(&t.ext, &[8443], &[]);
    let sent = Arc::new(Mutex::new(Vec::new()));
    responder(&t.ext, sent.clone());
    t.set_firewall(
        "team-a",
        &[
            "  - type: Allow\n    to: {dnsName: \"*.example.com\"}\n    ports: [{protocol: TCP, port: 8443}]\n",
            "  - type: Allow\n    to: {cidrSelector: 203.0.113.2/32}\n    ports: [{protocol: UDP, port: 53}]\n",
            "  - type: Deny\n    to: {cidrSelector: \"::/0\"}\n",
        ]
        .concat(),
    );
    let agent = t.start_agent_with(
        mode,
        &["--dns-server", DNS, "--cluster-dns", DNS, "--dns-mode", mode, "--dns-grace-secs", "1"],
    );
    // The status line follows the first sync's line: waited for, not read at once (a
    // loaded CI machine wrote it a moment later).
    let applied =
        netns::wait_for(Duration::from_secs(10), || agent.log_text().contains("EgressFirewall Rules applied"));
    assert!(applied.is_some(), "{}", agent.log_text());
    // The proxy's guard element is written within 250 ms of the first sync.
    std::thread::sleep(Duration::from_millis(500));
    let pod = &t.pods[0];

    // 1. Answer sent → address in the set.
    let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
    let (seen_tx, seen_rx) = std::sync::mpsc::channel::<(u32, Instant)>();
    let node_ns = format!("/run/netns/{}", t.node.name);
    let wanted: Arc<Mutex<Option<u32>>> = Arc::new(Mutex::new(None));
    let w = wanted.clone();
    let poller = std::thread::spawn(move || {
        let file = std::fs::File::open(&node_ns).expect("netns");
        nix::sched::setns(file, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
        let mut writer = egressd::dataplane::elements::ElementWriter::open("egressd").expect("netlink");
        let [_, slot] = egressd::compile::dns_slots("*.example.com.");
        loop {
            if stop_rx.try_recv().is_ok() {
                return;
            }
            let Some(i) = *w.lock().expect("lock") else {
                std::thread::yield_now();
                continue;
            };
            if writer.contains(slot.set, Some(slot.tag), IpAddr::V6(address(i))).unwrap_or(false) {
                let at = Instant::now();
                let mut current = w.lock().expect("lock");
                if *current == Some(i) {
                    *current = None;
                }
                drop(current);
                let _ = seen_tx.send((i, at));
            }
        }
    });
    let mut latencies = Vec::new();
    for i in 1..=n {
        *wanted.lock().expect("lock") = Some(i);
        if ask(pod, i).is_none() {
            eprintln!("{mode}: no answer for q{i}");
            continue;
        }
        if let Ok((j, at)) = seen_rx.recv_timeout(Duration::from_secs(2)) {
            let sent_at = sent.lock().expect("lock").iter().find(|(k, _)| *k == j).map(|(_, t)| *t);
            if let Some(s) = sent_at {
                latencies.push(at.saturating_duration_since(s));
            }
        } else {
            eprintln!("{mode}: q{i}: address never appeared");
        }
    }
    let _ = stop_tx.send(());
    let _ = poller.join();
    latencies.sort();
    sent.lock().expect("lock").clear();

    // 2. Immediate connects (fresh addresses again), in the pod's namespace in one go.
    let started = Instant::now();
    let (lost, unanswered) = pod.run(move || {
        let (mut lost, mut unanswered) = (0u32, 0u32);
        for k in 1..=connects {
            let i = 100_000 + k;
            let Some(addr) = ask_here(i) else {
                unanswered += 1;
                continue;
            };
            let ok = TcpStream::connect_timeout(&SocketAddr::new(IpAddr::V6(addr), 8443), Duration::from_millis(300))
                .is_ok();
            if !ok {
                lost += 1;
            }
        }
        (lost, unanswered)
    });
    let took = started.elapsed();
    let metrics = netns::http_get(&t.node, "127.0.0.1:9780", "/metrics").map(|(_, b)| b).unwrap_or_default();
    for line in metrics.lines().filter(|l| l.starts_with("egressd_dns_snooped") || l.starts_with("egressd_dns_proxied"))
    {
        eprintln!("{mode}: {line}");
    }
    let ms = |d: Duration| format!("{:.3} ms", d.as_secs_f64() * 1000.0);
    format!(
        "| {mode} | {} | {} | {} | {} | {} | {lost} of {connects} ({:.3} %), {unanswered} unanswered, {:.0} s |",
        latencies.len(),
        ms(percentile(&latencies, 0.5)),
        ms(percentile(&latencies, 0.9)),
        ms(percentile(&latencies, 0.99)),
        ms(latencies.last().copied().unwrap_or_default()),
        100.0 * f64::from(lost) / f64::from(connects.max(1)),
        took.as_secs_f64()
    )
}

/// [`ask`] from the calling thread's namespace.
fn ask_here(i: u32) -> Option<Ipv6Addr> {
    let mut m = Message::query();
    m.metadata.id = i as u16;
    m.add_query(Query::query(Name::from_ascii(format!("q{i}.example.com.")).ok()?, RecordType::AAAA));
    let bytes = m.to_vec().ok()?;
    let s = UdpSocket::bind("[::]:0").ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    s.send_to(&bytes, SocketAddr::new(DNS.parse().ok()?, 53)).ok()?;
    let mut buf = [0u8; 1500];
    let (n, _) = s.recv_from(&mut buf).ok()?;
    let msg = Message::from_vec(&buf[..n]).ok()?;
    msg.answers.iter().find_map(|r| if let RData::AAAA(a) = &r.data { Some(a.0) } else { None })
}

fn main() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("snoop_race: needs root (network namespaces); skipped");
        return;
    }
    let n = env("N", 300);
    let modes = std::env::var("MODES").unwrap_or_else(|_| "snoop proxy".into());
    let mut rows = Vec::new();
    for mode in modes.split_whitespace() {
        let connects = if mode == "proxy" { env("CONNECTS_PROXY", 100_000) } else { env("CONNECTS_SNOOP", 2_000) };
        rows.push(measure(mode, n, connects));
    }
    println!(
        "| mode | answers | answer sent → in set, median (goal < 1 ms) | p90 | p99 | max | immediate connects losing the race (goal 0 for proxy) |"
    );
    println!("|---|---|---|---|---|---|---|");
    for row in rows {
        println!("{row}");
    }
}
