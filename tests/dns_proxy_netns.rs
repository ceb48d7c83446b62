//! The DNS proxy (`--dns-mode proxy`, root required): a pod's answer is released only
//! once the kernel allows the addresses it teaches, so its first connection right after
//! its own lookup is never dropped; if egressd is killed or hangs, pods' DNS goes to the
//! server directly within a second or two.
//!
//! The server (in the external host's namespace, 203.0.113.2:53, UDP and TCP) answers
//! every `*.fresh.example.com` query with an address nobody was told before
//! (192.0.2.0/24 and 2001:db8:ff:100::/64, all of which the external host accepts), so
//! only the pod's own answer can open the connection.

mod netns;

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use hickory_proto::op::{Edns, Message, MessageType, Query, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA};
use hickory_proto::rr::{Name, RData, Record, RecordType};
use netns::{Netns, Topology, http_get, wait_for};

const SERVER: &str = "203.0.113.2";

/// The fresh addresses and the answers of the test server.
struct Server {
    next: AtomicU32,
    /// Queries for `silent.example.com` are not answered.
    answered: AtomicU32,
}

impl Server {
    fn answer(&self, query: &Message, udp: bool) -> Option<Message> {
        let q = query.queries.first()?;
        let name = q.name.to_ascii().to_lowercase();
        if name.starts_with("silent.") {
            return None;
        }
        let mut a = Message::response(query.metadata.id, query.metadata.op_code);
        a.metadata.recursion_desired = query.metadata.recursion_desired;
        a.add_query(q.clone());
        let rec = |data: RData| Record::from_rdata(q.name.clone(), 60, data);
        if name.ends_with(".fresh.example.com.") {
            let n = self.next.fetch_add(1, Ordering::SeqCst);
            match q.query_type {
                RecordType::A => a.add_answer(rec(RData::A(A(Ipv4Addr::new(192, 0, 2, 1 + (n % 250) as u8))))),
                _ => a.add_answer(rec(RData::AAAA(AAAA(Ipv6Addr::new(
                    0x2001,
                    0xdb8,
                    0xff,
                    0x100,
                    0,
                    0,
                    (n >> 16) as u16,
                    n as u16 + 1,
                ))))),
            };
        } else if name == "big.example.com." {
            // 40 A records: more than 512 bytes.
            let edns_size = query.edns.as_ref().map(|e| e.max_payload()).unwrap_or(512);
            if udp && edns_size < 1024 {
                a.metadata.truncation = true;
            } else {
                for i in 0..40u8 {
                    a.add_answer(rec(RData::A(A(Ipv4Addr::new(198, 51, 100, 150 + i)))));
                }
            }
            if let Some(e) = &query.edns {
                let mut edns = Edns::new();
                edns.set_max_payload(e.max_payload());
                a.set_edns(edns);
            }
        } else {
            a.metadata.response_code = ResponseCode::NXDomain;
        }
        self.answered.fetch_add(1, Ordering::SeqCst);
        Some(a)
    }

    /// Serve UDP and TCP on SERVER:53 in `ns`.
    fn start(ns: &Netns) -> Arc<Self> {
        Self::start_at(ns, SERVER)
    }

    /// Serve UDP and TCP on `address`:53 in `ns`.
    fn start_at(ns: &Netns, address: &'static str) -> Arc<Self> {
        let server = Arc::new(Self { next: AtomicU32::new(0), answered: AtomicU32::new(0) });
        let (udp, tcp) = ns.run(move || {
            (
                UdpSocket::bind((address, 53)).expect("bind udp 53"),
                TcpListener::bind((address, 53)).expect("bind tcp 53"),
            )
        });
        let s = server.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok((n, from)) = udp.recv_from(&mut buf) {
                let Ok(q) = Message::from_vec(&buf[..n]) else { continue };
                if let Some(a) = s.answer(&q, true) {
                    let _ = udp.send_to(&a.to_vec().unwrap(), from);
                }
            }
        });
        let s = server.clone();
        std::thread::spawn(move || {
            for mut c in tcp.incoming().flatten() {
                let s = s.clone();
                std::thread::spawn(move || {
                    loop {
                        let mut len = [0u8; 2];
                        if c.read_exact(&mut len).is_err() {
                            return;
                        }
                        let mut body = vec![0u8; usize::from(u16::from_be_bytes(len))];
                        if c.read_exact(&mut body).is_err() {
                            return;
                        }
                        let Ok(q) = Message::from_vec(&body) else { return };
                        if let Some(a) = s.answer(&q, false) {
                            let bytes = a.to_vec().unwrap();
                            let mut framed = (bytes.len() as u16).to_be_bytes().to_vec();
                            framed.extend(bytes);
                            if c.write_all(&framed).is_err() {
                                return;
                            }
                        }
                    }
                });
            }
        });
        server
    }
}

/// The external host accepts every fresh address (AnyIP), the node routes them there.
fn fresh_addresses_reachable(t: &Topology) {
    t.ext.ip(&["route", "add", "local", "192.0.2.0/24", "dev", "lo"]);
    t.ext.ip(&["route", "add", "local", "198.51.100.128/25", "dev", "lo"]);
    t.ext.ip(&["-6", "route", "add", "local", "2001:db8:ff:100::/64", "dev", "lo"]);
    t.node.ip(&["-6", "route", "add", "2001:db8:ff:100::/64", "via", "2001:db8:ff::2"]);
}

fn query(id: u16, name: &str, rtype: RecordType, edns: Option<u16>) -> Vec<u8> {
    let mut m = Message::query();
    m.metadata.id = id;
    m.metadata.recursion_desired = true;
    m.add_query(Query::query(Name::from_ascii(name).unwrap(), rtype));
    if let Some(size) = edns {
        let mut e = Edns::new();
        e.set_max_payload(size);
        m.set_edns(e);
    }
    m.to_vec().unwrap()
}

/// Ask over UDP from a socket of its own: (answer, the address it came from).
fn ask_udp(bytes: &[u8], timeout: Duration) -> Option<(Message, SocketAddr, u16)> {
    ask_udp_to(SERVER, bytes, timeout)
}

fn ask_udp_to(server: &str, bytes: &[u8], timeout: Duration) -> Option<(Message, SocketAddr, u16)> {
    let s = UdpSocket::bind("0.0.0.0:0").ok()?;
    s.set_read_timeout(Some(timeout)).ok()?;
    s.send_to(bytes, (server, 53)).ok()?;
    let mut buf = [0u8; 4096];
    let (n, from) = s.recv_from(&mut buf).ok()?;
    Some((Message::from_vec(&buf[..n]).ok()?, from, n as u16))
}

fn ask_tcp(bytes: &[u8]) -> Option<Message> {
    ask_tcp_to((SERVER, 53).into_sock(), bytes)
}

fn ask_tcp_to(to: SocketAddr, bytes: &[u8]) -> Option<Message> {
    let mut s = TcpStream::connect_timeout(&to, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    let mut framed = (bytes.len() as u16).to_be_bytes().to_vec();
    framed.extend(bytes);
    s.write_all(&framed).ok()?;
    let mut len = [0u8; 2];
    s.read_exact(&mut len).ok()?;
    let mut body = vec![0u8; usize::from(u16::from_be_bytes(len))];
    s.read_exact(&mut body).ok()?;
    Message::from_vec(&body).ok()
}

trait IntoSock {
    fn into_sock(self) -> SocketAddr;
}

impl IntoSock for (&str, u16) {
    fn into_sock(self) -> SocketAddr {
        SocketAddr::new(self.0.parse().unwrap(), self.1)
    }
}

fn addresses(m: &Message) -> Vec<IpAddr> {
    netns::dns_addresses(m)
}

/// An nft duration (`1s`, `812ms`, `2m3s4ms`) in milliseconds.
fn nft_duration_ms(text: &str) -> Option<u64> {
    let (mut total, mut number, mut unit) = (0, String::new(), String::new());
    let mut flush = |number: &mut String, unit: &mut String| -> Option<()> {
        let n: u64 = number.parse().ok()?;
        total += n * match unit.as_str() {
            "d" => 86_400_000,
            "h" => 3_600_000,
            "m" => 60_000,
            "s" => 1000,
            "ms" => 1,
            _ => return None,
        };
        number.clear();
        unit.clear();
        Some(())
    };
    for c in text.chars() {
        if c.is_ascii_digit() {
            if !unit.is_empty() {
                flush(&mut number, &mut unit)?;
            }
            number.push(c);
        } else {
            unit.push(c);
        }
    }
    flush(&mut number, &mut unit)?;
    Some(total)
}

fn metric(t: &Topology, line_start: &str) -> u64 {
    let body = http_get(&t.node, "127.0.0.1:9780", "/metrics").map(|(_, b)| b).unwrap_or_default();
    body.lines()
        .filter(|l| l.starts_with(line_start))
        .filter_map(|l| l.split_whitespace().last()?.parse::<u64>().ok())
        .sum()
}

fn proxied(t: &Topology, transport: &str) -> u64 {
    metric(t, &format!("egressd_dns_proxied_total{{transport=\"{transport}\",result=\"answered\"}}"))
}

/// A pod of namespace team-a allowed TCP 8080 to `*.fresh.example.com` only (and DNS).
fn policed(t: &Topology) {
    fresh_addresses_reachable(t);
    t.set_firewall(
        "team-a",
        &[
            "  - type: Allow\n    to: {dnsName: \"*.fresh.example.com\"}\n    ports: [{protocol: TCP, port: 8080}]\n",
            "  - type: Allow\n    to: {dnsName: \"big.example.com\"}\n    ports: [{protocol: TCP, port: 8080}]\n",
            "  - type: Allow\n    to: {cidrSelector: 203.0.113.2/32}\n    ports: [{protocol: UDP, port: 53}, {protocol: TCP, port: 53}]\n",
            "  - type: Deny\n    to: {cidrSelector: 0.0.0.0/0}\n",
            "  - type: Deny\n    to: {cidrSelector: \"::/0\"}\n",
        ]
        .concat(),
    );
}

const AGENT_ARGS: [&str; 4] = ["--dns-server", SERVER, "--cluster-dns", SERVER];

/// `rounds` times from `pod`: resolve a fresh name (AAAA, or A with `v4`) and connect to
/// its address at once (300 ms: a dropped SYN is retransmitted only after 1 s). Returns
/// the connections that failed.
fn resolve_and_connect(pod: &Netns, rounds: u32, v4: bool, start: u32) -> Vec<String> {
    pod.run(move || {
        let mut failed = Vec::new();
        for i in start..start + rounds {
            let rtype = if v4 { RecordType::A } else { RecordType::AAAA };
            let name = format!("n{i}.fresh.example.com.");
            let Some((answer, _, _)) = ask_udp(&query(i as u16, &name, rtype, None), Duration::from_secs(2)) else {
                failed.push(format!("{name}: no answer"));
                continue;
            };
            let Some(ip) = addresses(&answer).first().copied() else {
                failed.push(format!("{name}: no address"));
                continue;
            };
            if TcpStream::connect_timeout(&SocketAddr::new(ip, 8080), Duration::from_millis(300)).is_err() {
                failed.push(format!("{name} -> {ip}: connection dropped"));
            }
        }
        failed
    })
}

#[test]
fn a_pods_first_connection_after_its_own_lookup_is_never_dropped() {
    let t = Topology::new(&["team-a"]);
    let _server = Server::start(&t.ext);
    policed(&t);
    let agent = t.start_agent_with("agent", &AGENT_ARGS);
    let p0 = &t.pods[0];
    let ready = wait_for(Duration::from_secs(5), || {
        resolve_and_connect(p0, 1, false, 1_000_000).is_empty() && proxied(&t, "udp") >= 1
    });
    assert!(ready.is_some(), "the proxy does not answer:\n{}\n{}", t.node.nft_list(), agent.log_text());
    let failed = resolve_and_connect(p0, 1000, false, 0);
    assert!(
        failed.is_empty(),
        "{} of 1000 IPv6 first connections failed: {:?}",
        failed.len(),
        &failed[..failed.len().min(5)]
    );
    let failed = resolve_and_connect(p0, 200, true, 2000);
    assert!(
        failed.is_empty(),
        "{} of 200 IPv4 first connections failed: {:?}",
        failed.len(),
        &failed[..failed.len().min(5)]
    );
    assert!(proxied(&t, "udp") >= 1200, "the answers did not pass the proxy: {}", proxied(&t, "udp"));
    // Nothing else is let through: an address the pod was not told stays closed.
    let closed = p0.run(|| {
        TcpStream::connect_timeout(&"[2001:db8:ff:100::ffff:ffff]:8080".parse().unwrap(), Duration::from_millis(300))
            .is_err()
    });
    assert!(closed, "an address no answer taught is open");
    assert_eq!(agent.nft_fallbacks(), Vec::<String>::new(), "every sync in-process");
}

#[test]
fn without_the_proxy_a_slow_snoop_loses_first_connections() {
    // The same pod and server, snooping alone, with the listener slowed down by 20 ms
    // per answer: the pod is faster, so its first connections are dropped. (This is
    // the race the proxy closes; the test shows the check above can fail.)
    let t = Topology::new(&["team-a"]);
    let _server = Server::start(&t.ext);
    policed(&t);
    let mut args = AGENT_ARGS.to_vec();
    args.extend(["--dns-mode", "snoop"]);
    let agent = t.start_agent_env("agent", &args, &[("EGRESSD_TEST_SNOOP_DELAY_MS", "20")]);
    let failed = resolve_and_connect(&t.pods[0], 50, false, 0);
    assert!(
        failed.len() >= 10,
        "only {} of 50 dropped with a 20 ms snooping delay:\n{}",
        failed.len(),
        agent.log_text()
    );
    assert_eq!(proxied(&t, "udp"), 0, "snoop mode proxied");
}

#[test]
fn udp_and_tcp_truncation_edns_ids_and_ports_pass_unchanged() {
    let t = Topology::new(&["team-a", "team-a"]);
    let _server = Server::start(&t.ext);
    policed(&t);
    let agent = t.start_agent_with("agent", &AGENT_ARGS);
    let p0 = &t.pods[0];
    let ready = wait_for(Duration::from_secs(5), || {
        resolve_and_connect(p0, 1, true, 500_000).is_empty() && proxied(&t, "udp") >= 1
    });
    assert!(ready.is_some(), "the proxy does not answer:\n{}", agent.log_text());

    let (a, from, id, port_kept) = p0.run(|| {
        let s = UdpSocket::bind("0.0.0.0:0").unwrap();
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        s.send_to(&query(0xbeef, "x1.fresh.example.com.", RecordType::A, None), (SERVER, 53)).unwrap();
        let mut buf = [0u8; 4096];
        let (n, from) = s.recv_from(&mut buf).unwrap();
        let m = Message::from_vec(&buf[..n]).unwrap();
        let id = m.metadata.id;
        (m, from, id, true)
    });
    assert_eq!(id, 0xbeef, "the query id changed");
    assert!(port_kept);
    assert_eq!(from, SocketAddr::new(SERVER.parse().unwrap(), 53), "the answer did not come from the server's address");
    assert_eq!(a.metadata.message_type, MessageType::Response);

    // Truncated over UDP without EDNS0; the pod retries over TCP and gets it whole.
    let before_tcp = proxied(&t, "tcp");
    let (tc, whole) = p0.run(|| {
        let (tc, _, _) = ask_udp(&query(7, "big.example.com.", RecordType::A, None), Duration::from_secs(2)).unwrap();
        (tc, ask_tcp(&query(8, "big.example.com.", RecordType::A, None)).unwrap())
    });
    assert!(tc.metadata.truncation, "the TC bit was lost");
    assert_eq!(addresses(&whole).len(), 40, "the TCP answer is not whole");
    assert!(proxied(&t, "tcp") > before_tcp, "the TCP query did not pass the proxy");
    // What the TCP answer taught is allowed.
    let open = p0.run(|| {
        TcpStream::connect_timeout(&"198.51.100.189:8080".parse().unwrap(), Duration::from_millis(300)).is_ok()
    });
    assert!(open, "an address of the TCP answer is not allowed");

    // EDNS0 4096 over UDP: the large answer passes whole, with its OPT record.
    let (big, _, size) =
        p0.run(|| ask_udp(&query(9, "big.example.com.", RecordType::A, Some(4096)), Duration::from_secs(2)).unwrap());
    assert!(!big.metadata.truncation && addresses(&big).len() == 40 && size > 512, "EDNS0 answer of {size} bytes");
    assert_eq!(big.edns.as_ref().map(|e| e.max_payload()), Some(4096));

    // A flood of queries the server never answers: one pod is held to its bound, the
    // proxy keeps answering the others.
    let flooded = p0.run(|| {
        let s = UdpSocket::bind("0.0.0.0:0").unwrap();
        for i in 0..3000u16 {
            let _ = s.send_to(&query(i, "silent.example.com.", RecordType::A, None), (SERVER, 53));
        }
        true
    });
    assert!(flooded);
    let busy = wait_for(Duration::from_secs(3), || {
        metric(&t, "egressd_dns_proxied_total{transport=\"udp\",result=\"busy\"}") > 0
    });
    assert!(
        busy.is_some(),
        "the flood was not bounded:\n{}",
        http_get(&t.node, "127.0.0.1:9780", "/metrics").map(|(_, b)| b).unwrap_or_default()
    );
    let t0 = Instant::now();
    let other = resolve_and_connect(&t.pods[1], 20, true, 600_000);
    assert!(other.is_empty(), "another pod's DNS suffered from the flood: {other:?}");
    assert!(t0.elapsed() < Duration::from_secs(2), "another pod waited {:?}", t0.elapsed());
    // The flooding pod itself is held to its bound while its queries wait.
    let flooder = resolve_and_connect(&t.pods[0], 1, true, 700_000);
    assert_eq!(flooder.len(), 1, "the flooding pod was not bounded");
}

/// The proxy relays only what tproxy hands it: a pod (or a process on the node) that
/// connects to the proxy's own port gets nothing, over TCP or UDP.
#[test]
fn a_query_sent_to_the_proxys_own_port_gets_no_answer() {
    let t = Topology::new(&["team-a"]);
    let _server = Server::start(&t.ext);
    policed(&t);
    let agent = t.start_agent_with("agent", &AGENT_ARGS);
    let ready = wait_for(Duration::from_secs(5), || {
        resolve_and_connect(&t.pods[0], 1, true, 800_000).is_empty() && proxied(&t, "udp") >= 1
    });
    assert!(ready.is_some(), "the proxy does not answer:\n{}", agent.log_text());
    let not_taken = |transport: &str| {
        metric(&t, &format!("egressd_dns_proxied_total{{transport=\"{transport}\",result=\"not_taken\"}}"))
    };
    let (tcp_before, udp_before) = (not_taken("tcp"), not_taken("udp"));
    let q = query(5, "x2.fresh.example.com.", RecordType::A, None);
    let port = "53053";
    let (q2, q3) = (q.clone(), q.clone());
    let from_pod = t.pods[0].run(move || {
        let node: SocketAddr = format!("198.18.1.1:{port}").parse().unwrap();
        let tcp = ask_tcp_to(node, &q2);
        let s = UdpSocket::bind("0.0.0.0:0").unwrap();
        s.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
        s.send_to(&q2, node).unwrap();
        let mut buf = [0u8; 4096];
        (tcp, s.recv_from(&mut buf).ok().map(|(n, _)| n))
    });
    assert!(from_pod.0.is_none() && from_pod.1.is_none(), "the proxy answered a pod on its own port: {from_pod:?}");
    let local: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    assert!(t.node.run(move || ask_tcp_to(local, &q3)).is_none(), "the proxy answered on the node's loopback");
    // They reached the proxy, which closed them (not a port nobody listens on).
    let counted =
        wait_for(Duration::from_secs(3), || not_taken("tcp") >= tcp_before + 2 && not_taken("udp") > udp_before);
    assert!(counted.is_some(), "tcp {tcp_before} → {}, udp {udp_before} → {}", not_taken("tcp"), not_taken("udp"));
}

#[test]
fn pods_dns_survives_a_killed_or_hung_proxy_and_a_restart_resumes_it() {
    let t = Topology::new(&["team-a"]);
    let server = Server::start(&t.ext);
    policed(&t);
    let mut agent = t.start_agent_with("agent", &AGENT_ARGS);
    let p0 = &t.pods[0];
    let ready = wait_for(Duration::from_secs(5), || {
        resolve_and_connect(p0, 1, true, 700_000).is_empty() && proxied(&t, "udp") >= 1
    });
    assert!(ready.is_some(), "the proxy does not answer:\n{}", agent.log_text());

    // While egressd runs, its guard never comes near its expiry (refreshed every 250 ms
    // to a full second; the kernel keeps an element's expiry on a plain re-add).
    for _ in 0..12 {
        let listed = t.node.exec(&["nft", "list", "set", "inet", "egressd", "dns-proxy-v4"]);
        let left_ms = listed.split("expires ").nth(1).and_then(|r| nft_duration_ms(r.split_whitespace().next()?));
        assert!(left_ms.is_some_and(|ms| ms >= 500), "the guard is about to expire:\n{listed}");
        std::thread::sleep(Duration::from_millis(200));
    }

    // The pod asks in a loop (500 ms per try, as a resolver's first timeout would be).
    let stop = Arc::new(AtomicBool::new(false));
    let answers = Arc::new(std::sync::Mutex::new(Vec::<Instant>::new()));
    let (s2, a2) = (stop.clone(), answers.clone());
    let looping = p0.run(move || {
        std::thread::spawn(move || {
            let mut i = 0u16;
            while !s2.load(Ordering::SeqCst) {
                i = i.wrapping_add(1);
                if ask_udp(&query(i, "loop.fresh.example.com.", RecordType::A, None), Duration::from_millis(500))
                    .is_some()
                {
                    a2.lock().unwrap().push(Instant::now());
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    });
    let answered_after = |at: Instant| answers.lock().unwrap().iter().any(|t| *t > at);

    // Hung (SIGSTOP): the guard expires, queries go to the server directly.
    let pid = nix::unistd::Pid::from_raw(agent.pid() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
    let hung_at = Instant::now();
    std::thread::sleep(Duration::from_millis(100));
    let resumed = wait_for(Duration::from_secs(3), || answered_after(hung_at + Duration::from_millis(100)));
    let hung_for = hung_at.elapsed();
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).unwrap();
    assert!(resumed.is_some() && hung_for < Duration::from_secs(3), "no answer while egressd was stopped");
    // Proxied again once it runs.
    let before = proxied(&t, "udp");
    assert!(
        wait_for(Duration::from_secs(3), || proxied(&t, "udp") > before).is_some(),
        "proxying did not resume after SIGCONT"
    );

    // Killed: its sockets are gone, queries go direct at once.
    agent.kill();
    let killed_at = Instant::now();
    let served_before = server.answered.load(Ordering::SeqCst);
    // (An answer the proxy had already sent may arrive after the kill: the server must
    // also have answered anew, directly, for the pods' DNS to count as working.)
    let direct = wait_for(Duration::from_secs(2), || {
        answered_after(killed_at) && server.answered.load(Ordering::SeqCst) > served_before
    });
    assert!(direct.is_some(), "pods' DNS did not work within 2 s of egressd being killed");

    // Restarted: proxying resumes.
    let _agent = t.start_agent_with("agent2", &AGENT_ARGS);
    assert!(
        wait_for(Duration::from_secs(5), || proxied(&t, "udp") >= 1).is_some(),
        "the restarted agent does not proxy"
    );
    stop.store(true, Ordering::SeqCst);
    looping.join().unwrap();
    let gaps: Vec<Duration> = answers.lock().unwrap().windows(2).map(|w| w[1] - w[0]).collect();
    let worst = gaps.iter().max().copied().unwrap_or_default();
    assert!(worst < Duration::from_secs(3), "pods' DNS was out for {worst:?}");
}

/// The cluster DNS Service address.
const VIP: &str = "198.19.0.10";

/// kube-proxy's part, in a table of its own: the Service address [`VIP`]:53 translated
/// to the server, for pods (prerouting) and for the node (output).
fn kube_proxy(t: &Topology) {
    let rules = format!(
        "table ip kubeproxy {{\n chain pre {{ type nat hook prerouting priority dstnat; ip daddr {VIP} udp dport 53 dnat to {SERVER}:53; ip daddr {VIP} tcp dport 53 dnat to {SERVER}:53; }}\n chain out {{ type nat hook output priority -100; ip daddr {VIP} udp dport 53 dnat to {SERVER}:53; ip daddr {VIP} tcp dport 53 dnat to {SERVER}:53; }}\n}}\n"
    );
    let file = t.dir.path().join("kubeproxy.nft");
    std::fs::write(&file, rules).unwrap();
    t.node.exec(&["nft", "-f", file.to_str().unwrap()]);
    // A node has a route for Service addresses (its default route): the output DNAT
    // comes after the route lookup.
    t.node.ip(&["route", "add", "198.19.0.0/16", "via", SERVER]);
}

#[test]
fn a_cluster_dns_service_address_behind_kube_proxys_dnat_is_proxied() {
    let t = Topology::new(&["team-a"]);
    let _server = Server::start(&t.ext);
    policed(&t);
    kube_proxy(&t);
    let agent = t.start_agent_with("agent", &["--dns-server", VIP, "--cluster-dns", VIP]);
    let p0 = &t.pods[0];
    let ask_connect = move |i: u32| -> Result<SocketAddr, String> {
        let (answer, from, _) = ask_udp_to(
            VIP,
            &query(i as u16, &format!("v{i}.fresh.example.com."), RecordType::A, None),
            Duration::from_secs(2),
        )
        .ok_or("no answer")?;
        let ip = addresses(&answer).first().copied().ok_or("no address")?;
        TcpStream::connect_timeout(&SocketAddr::new(ip, 8080), Duration::from_millis(300))
            .map_err(|e| format!("{ip}: {e}"))?;
        Ok(from)
    };
    let mut last = Ok("0.0.0.0:0".parse().unwrap());
    let ready = wait_for(Duration::from_secs(5), || {
        last = p0.run(move || ask_connect(0));
        last.is_ok() && proxied(&t, "udp") >= 1
    });
    assert!(
        ready.is_some(),
        "the Service address is not proxied ({last:?}, {} proxied):\n{}\n{}",
        proxied(&t, "udp"),
        t.node.nft_list(),
        agent.log_text()
    );
    // Every answer must come from VIP:53, in every round. A round whose 200 queries all
    // passed the proxy must have lost no connection; one where a starved debug build let
    // the guard expire (queries then go direct and are only snooped, by design) is asked
    // again, up to three rounds.
    let vip: SocketAddr = format!("{VIP}:53").parse().unwrap();
    let mut all_proxied = false;
    for round in 0..3u32 {
        let before = proxied(&t, "udp");
        let first = 1 + round * 200;
        let results: Vec<Result<SocketAddr, String>> = p0.run(move || (first..first + 200).map(ask_connect).collect());
        let elsewhere: Vec<(usize, &SocketAddr)> = results
            .iter()
            .enumerate()
            .filter_map(|(i, r)| r.as_ref().ok().filter(|from| **from != vip).map(|f| (i + 1, f)))
            .collect();
        assert!(
            elsewhere.is_empty(),
            "{} answers did not come from the Service address (query number, source): {elsewhere:?}\n{}\n{}",
            elsewhere.len(),
            t.node.nft_list(),
            agent.log_text()
        );
        if proxied(&t, "udp") >= before + 200 {
            let failed: Vec<&String> = results.iter().filter_map(|r| r.as_ref().err()).collect();
            assert!(failed.is_empty(), "{} of 200 failed: {:?}", failed.len(), &failed[..failed.len().min(5)]);
            all_proxied = true;
            break;
        }
    }
    assert!(all_proxied, "in three rounds the queries never all passed the proxy:\n{}", agent.log_text());
}

#[test]
fn an_answer_through_the_proxy_comes_from_the_service_address_whatever_port_asked_before() {
    // A pod asked the Service address directly from port P (egressd not running:
    // kube-proxy's DNAT made a conntrack entry pod:P -> VIP:53 that lives on); asked
    // again from P through the proxy, the answer must still come from VIP:53.
    let t = Topology::new(&["team-a"]);
    let _server = Server::start(&t.ext);
    policed(&t);
    kube_proxy(&t);
    let p0 = &t.pods[0];
    let ask_from = |port: u16, i: u16| -> Option<SocketAddr> {
        p0.run(move || {
            let s = UdpSocket::bind(("0.0.0.0", port)).ok()?;
            s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
            s.send_to(&query(i, &format!("p{i}.fresh.example.com."), RecordType::A, None), (VIP, 53)).ok()?;
            let mut buf = [0u8; 4096];
            s.recv_from(&mut buf).ok().map(|(_, from)| from)
        })
    };
    let ports: Vec<u16> = (41_000..41_010).collect();
    for (i, port) in ports.iter().enumerate() {
        assert!(ask_from(*port, i as u16).is_some(), "no direct answer before egressd started");
    }
    let agent = t.start_agent_with("agent", &["--dns-server", VIP, "--cluster-dns", VIP]);
    let ready = wait_for(Duration::from_secs(5), || ask_from(40_999, 100).is_some() && proxied(&t, "udp") >= 1);
    assert!(ready.is_some(), "the Service address is not proxied:\n{}", agent.log_text());
    let vip: SocketAddr = format!("{VIP}:53").parse().unwrap();
    // Every answer must come from VIP:53, proxied or not. A round where the proxy did
    // not take every query (a starved debug build on a loaded machine lets its guard
    // expire: they go direct, by design) is asked again, up to five rounds.
    let mut all_proxied = false;
    for round in 0..5u16 {
        let before = proxied(&t, "udp");
        let sources: Vec<Option<SocketAddr>> =
            ports.iter().enumerate().map(|(i, p)| ask_from(*p, 200 + round * 20 + i as u16)).collect();
        assert!(sources.iter().all(|s| *s == Some(vip)), "answers came from {sources:?}, not {vip}");
        if proxied(&t, "udp") >= before + ports.len() as u64 {
            all_proxied = true;
            break;
        }
    }
    assert!(all_proxied, "in five rounds the queries never all passed the proxy:\n{}", agent.log_text());
}

#[test]
fn a_dns_server_on_the_node_is_not_taken_and_stays_snooped() {
    // A node-local cache at the node's own address: the proxy leaves it alone, whether it
    // starts before egressd or after (binding its port 53 first would keep it from
    // starting), and its answers are snooped.
    let t = Topology::new(&["team-a"]);
    let hosts = t.dir.path().join("hosts");
    std::fs::write(&hosts, "192.0.2.10 local.example.com\n").unwrap();
    t.set_firewall(
        "team-a",
        &[
            "  - type: Allow\n    to: {dnsName: \"*.example.com\"}\n    ports: [{protocol: TCP, port: 8080}]\n",
            "  - type: Allow\n    to: {cidrSelector: 203.0.113.1/32}\n    ports: [{protocol: UDP, port: 53}]\n",
            "  - type: Deny\n    to: {cidrSelector: 0.0.0.0/0}\n",
        ]
        .concat(),
    );
    let agent = t.start_agent_with("agent", &["--dns-server", "203.0.113.1"]);
    assert!(agent.log_text().contains("a server on this node is not taken"), "{}", agent.log_text());
    // Started after egressd: its port is free.
    let _dns = netns::Dnsmasq::start(&t.node, "203.0.113.1", hosts, 60);
    let p0 = &t.pods[0];
    let asked = p0.run(|| {
        ask_udp_to("203.0.113.1", &query(1, "local.example.com.", RecordType::A, None), Duration::from_secs(2))
    });
    assert!(asked.is_some_and(|(m, _, _)| addresses(&m).len() == 1), "the node-local server does not answer");
    let open = wait_for(Duration::from_secs(2), || netns::tcp(p0, "192.0.2.10", 8080).is_some());
    assert!(open.is_some(), "the snooped answer did not open the rule:\n{}", agent.log_text());
    assert_eq!(proxied(&t, "udp"), 0, "a node-local server's query was proxied");
}

#[test]
fn an_overloaded_proxy_lets_queries_go_direct_and_takes_them_again_after() {
    // One pod sends ~100,000 queries a second for 3 s without waiting for answers (more
    // than this debug build's proxy can work off): the proxy lets its guard expire, new
    // queries go to the server directly, another pod's lookups keep working; afterwards
    // the proxy takes queries again.
    let t = Topology::new(&["team-a", "team-a"]);
    let _server = Server::start(&t.ext);
    policed(&t);
    let agent = t.start_agent_with("agent", &AGENT_ARGS);
    let ready = wait_for(Duration::from_secs(5), || {
        resolve_and_connect(&t.pods[1], 1, true, 900_000).is_empty() && proxied(&t, "udp") >= 1
    });
    assert!(ready.is_some(), "the proxy does not answer:\n{}", agent.log_text());
    let stop = Arc::new(AtomicBool::new(false));
    let s2 = stop.clone();
    let flood = t.pods[0].run(move || {
        std::thread::spawn(move || {
            let sockets: Vec<UdpSocket> = (0..64).map(|_| UdpSocket::bind("0.0.0.0:0").unwrap()).collect();
            let mut i = 0u32;
            let start = Instant::now();
            while !s2.load(Ordering::SeqCst) && start.elapsed() < Duration::from_secs(3) {
                for _ in 0..1000 {
                    i += 1;
                    let q = query(i as u16, &format!("f{i}.other.org."), RecordType::A, None);
                    let _ = sockets[i as usize % 64].send_to(&q, (SERVER, 53));
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        })
    });
    // Another pod asks once every 100 ms meanwhile (a fresh name each time).
    let mut answered = Vec::new();
    let started = Instant::now();
    let mut i = 0;
    while started.elapsed() < Duration::from_secs(3) {
        i += 1;
        let name = format!("o{i}.fresh.example.com.");
        let ok = t.pods[1]
            .run(move || ask_udp(&query(i as u16, &name, RecordType::A, None), Duration::from_millis(500)).is_some());
        if ok {
            answered.push(started.elapsed());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    stop.store(true, Ordering::SeqCst);
    flood.join().unwrap();
    let overloaded = metric(&t, "egressd_dns_proxied_total{transport=\"udp\",result=\"overloaded\"}");
    assert!(
        overloaded >= 1,
        "the proxy was never overloaded (the flood is too small for this test):\n{}",
        agent.log_text().lines().filter(|l| !l.contains("DEBUG")).collect::<Vec<_>>().join("\n")
    );
    let mut gaps: Vec<Duration> = answered.windows(2).map(|w| w[1] - w[0]).collect();
    gaps.push(answered.first().copied().unwrap_or(Duration::from_secs(3)));
    let worst = gaps.into_iter().max().unwrap_or_default();
    assert!(
        worst < Duration::from_millis(2500),
        "another pod's DNS was out for {worst:?} during the flood ({} answers)",
        answered.len()
    );
    // Caught up: taken again. The flood's backlog is still being answered for a while
    // (those answers count as proxied too): wait for the catch-up and for the count to
    // stop moving before asking whether the other pod's query is proxied.
    let quiet_log = || agent.log_text().lines().filter(|l| !l.contains("DEBUG")).collect::<Vec<_>>().join("\n");
    let caught_up = wait_for(Duration::from_secs(10), || agent.log_text().contains("DNS proxy caught up"));
    assert!(caught_up.is_some(), "no catch-up logged:\n{}", quiet_log());
    let settled = wait_for(Duration::from_secs(10), || {
        let a = proxied(&t, "udp");
        std::thread::sleep(Duration::from_millis(300));
        proxied(&t, "udp") == a
    });
    assert!(settled.is_some(), "the flood's backlog is still being answered 10 s after the catch-up");
    let mut round = 950_000;
    let again = wait_for(Duration::from_secs(5), || {
        round += 1;
        let before = proxied(&t, "udp");
        resolve_and_connect(&t.pods[1], 1, true, round).is_empty() && proxied(&t, "udp") > before
    });
    assert!(again.is_some(), "the proxy did not take queries again after the flood:\n{}", quiet_log());
}

#[test]
fn queries_to_an_ipv6_server_are_proxied_over_udp_and_tcp() {
    const SERVER6: &str = "2001:db8:ff::2";
    let t = Topology::new(&["team-a"]);
    let _server = Server::start_at(&t.ext, SERVER6);
    fresh_addresses_reachable(&t);
    t.set_firewall(
        "team-a",
        &[
            "  - type: Allow\n    to: {dnsName: \"*.fresh.example.com\"}\n    ports: [{protocol: TCP, port: 8080}]\n",
            "  - type: Allow\n    to: {cidrSelector: 2001:db8:ff::2/128}\n    ports: [{protocol: UDP, port: 53}, {protocol: TCP, port: 53}]\n",
            "  - type: Deny\n    to: {cidrSelector: 0.0.0.0/0}\n",
            "  - type: Deny\n    to: {cidrSelector: \"::/0\"}\n",
        ]
        .concat(),
    );
    let agent = t.start_agent_with("agent", &["--dns-server", SERVER6, "--cluster-dns", SERVER6]);
    let target: SocketAddr = format!("[{SERVER6}]:53").parse().unwrap();
    let udp_round = move |i: u32| -> Result<(), String> {
        let s = UdpSocket::bind("[::]:0").map_err(|e| e.to_string())?;
        s.set_read_timeout(Some(Duration::from_secs(2))).map_err(|e| e.to_string())?;
        s.send_to(&query(i as u16, &format!("s{i}.fresh.example.com."), RecordType::AAAA, None), target)
            .map_err(|e| e.to_string())?;
        let mut buf = [0u8; 1500];
        let (n, from) = s.recv_from(&mut buf).map_err(|e| format!("no answer: {e}"))?;
        if from != target {
            return Err(format!("answer from {from}"));
        }
        let m = Message::from_vec(&buf[..n]).map_err(|e| e.to_string())?;
        let ip = addresses(&m).first().copied().ok_or("no address")?;
        TcpStream::connect_timeout(&SocketAddr::new(ip, 8080), Duration::from_millis(300))
            .map(|_| ())
            .map_err(|e| format!("{ip}: {e}"))
    };
    let p0 = &t.pods[0];
    let ready = wait_for(Duration::from_secs(5), || p0.run(move || udp_round(0)).is_ok() && proxied(&t, "udp") >= 1);
    assert!(ready.is_some(), "IPv6 queries are not proxied:\n{}\n{}", t.node.nft_list(), agent.log_text());
    let failed: Vec<String> = p0.run(move || (1..=300).filter_map(|i| udp_round(i).err()).collect());
    assert!(failed.is_empty(), "{} of 300 failed: {:?}", failed.len(), &failed[..failed.len().min(5)]);
    // TCP over IPv6: the answer arrives whole, and what it teaches is allowed.
    let tcp = p0.run(move || -> Result<(), String> {
        let mut c = TcpStream::connect_timeout(&target, Duration::from_secs(2)).map_err(|e| e.to_string())?;
        c.set_read_timeout(Some(Duration::from_secs(2))).map_err(|e| e.to_string())?;
        let q = query(77, "t1.fresh.example.com.", RecordType::AAAA, None);
        let mut framed = (q.len() as u16).to_be_bytes().to_vec();
        framed.extend(q);
        c.write_all(&framed).map_err(|e| e.to_string())?;
        let mut len = [0u8; 2];
        c.read_exact(&mut len).map_err(|e| e.to_string())?;
        let mut body = vec![0u8; usize::from(u16::from_be_bytes(len))];
        c.read_exact(&mut body).map_err(|e| e.to_string())?;
        let m = Message::from_vec(&body).map_err(|e| e.to_string())?;
        let ip = addresses(&m).first().copied().ok_or("no address")?;
        TcpStream::connect_timeout(&SocketAddr::new(ip, 8080), Duration::from_millis(300))
            .map(|_| ())
            .map_err(|e| format!("{ip}: {e}"))
    });
    assert_eq!(tcp, Ok(()), "IPv6 over TCP");
    assert!(
        proxied(&t, "tcp") >= 1 && proxied(&t, "udp") >= 300,
        "tcp {} udp {}",
        proxied(&t, "tcp"),
        proxied(&t, "udp")
    );
}

#[test]
fn a_server_address_that_becomes_the_nodes_is_released_for_its_own_server() {
    // A node-local DNS cache (169.254.20.10 in NodeLocal DNSCache) adds its address to the
    // node when it starts, maybe after egressd took that address's queries: egressd lets
    // go (its answer socket held the address's port 53), the cache binds, answers, and its
    // answers are snooped.
    const LOCAL_DNS: &str = "192.0.2.53";
    let t = Topology::new(&["team-a"]);
    let hosts = t.dir.path().join("hosts");
    std::fs::write(&hosts, "192.0.2.10 cache.example.com\n").unwrap();
    t.set_firewall(
        "team-a",
        &[
            "  - type: Allow\n    to: {dnsName: \"*.example.com\"}\n    ports: [{protocol: TCP, port: 8080}]\n",
            "  - type: Allow\n    to: {cidrSelector: 192.0.2.53/32}\n    ports: [{protocol: UDP, port: 53}]\n",
            "  - type: Deny\n    to: {cidrSelector: 0.0.0.0/0}\n",
        ]
        .concat(),
    );
    let agent = t.start_agent_with("agent", &["--dns-server", LOCAL_DNS, "--cluster-dns", LOCAL_DNS]);
    let taken = wait_for(Duration::from_secs(3), || t.node.nft_list().contains(&format!("0 . 0 . {LOCAL_DNS}")));
    assert!(taken.is_some(), "the server was not taken at first:\n{}", t.node.nft_list());
    // The cache starts: its address first, then its server.
    t.node.ip(&["addr", "add", &format!("{LOCAL_DNS}/32"), "dev", "lo"]);
    let released = wait_for(Duration::from_secs(2), || agent.log_text().contains("its queries are left to it"));
    assert!(released.is_some(), "the address was not released:\n{}", agent.log_text());
    let _cache = netns::Dnsmasq::start(&t.node, LOCAL_DNS, hosts, 60);
    let p0 = &t.pods[0];
    let answer =
        p0.run(|| ask_udp_to(LOCAL_DNS, &query(5, "cache.example.com.", RecordType::A, None), Duration::from_secs(2)));
    assert_eq!(
        answer.map(|(m, from, _)| (addresses(&m), from)),
        Some((vec!["192.0.2.10".parse::<IpAddr>().unwrap()], format!("{LOCAL_DNS}:53").parse().unwrap())),
        "the node's own server does not answer:\n{}",
        agent.log_text()
    );
    let open = wait_for(Duration::from_secs(2), || netns::tcp(p0, "192.0.2.10", 8080).is_some());
    assert!(open.is_some(), "the snooped answer did not open the rule");
    assert!(!t.node.nft_list().contains(&format!("0 . 0 . {LOCAL_DNS}")), "its guard element is still there");
}

#[test]
fn the_proxy_never_answers_a_query_the_pods_policy_denies() {
    // team-a may not reach the server at all: its query, taken by the proxy, is still
    // judged by the firewall (the proxy is no way around it) and never answered.
    let t = Topology::new(&["team-a", "team-b"]);
    let server = Server::start(&t.ext);
    fresh_addresses_reachable(&t);
    let rules = |dns: &str| {
        [
            "  - type: Allow\n    to: {dnsName: \"*.fresh.example.com\"}\n    ports: [{protocol: TCP, port: 8080}]\n",
            dns,
            "  - type: Deny\n    to: {cidrSelector: 0.0.0.0/0}\n",
        ]
        .concat()
    };
    t.set_firewall("team-a", &rules(""));
    t.set_firewall(
        "team-b",
        &rules("  - type: Allow\n    to: {cidrSelector: 203.0.113.2/32}\n    ports: [{protocol: UDP, port: 53}]\n"),
    );
    let agent = t.start_agent_with("agent", &AGENT_ARGS);
    // team-b's query is proxied: the proxy is on for both namespaces' pods.
    let ready = wait_for(Duration::from_secs(5), || {
        resolve_and_connect(&t.pods[1], 1, true, 800_000).is_empty() && proxied(&t, "udp") >= 1
    });
    assert!(ready.is_some(), "the proxy does not answer team-b:\n{}", agent.log_text());
    let served = server.answered.load(Ordering::SeqCst);
    let proxied_before = proxied(&t, "udp");
    let denied = t.pods[0].run(|| {
        (0..20)
            .filter(|i| {
                ask_udp(&query(*i, "d.fresh.example.com.", RecordType::A, None), Duration::from_millis(300)).is_some()
            })
            .count()
    });
    assert_eq!(denied, 0, "a query team-a's policy denies was answered");
    assert_eq!(server.answered.load(Ordering::SeqCst), served, "the server saw team-a's denied queries");
    assert_eq!(proxied(&t, "udp"), proxied_before, "the proxy answered a denied query");
}

#[test]
fn the_proxy_works_with_the_shipped_capabilities_only() {
    // The systemd unit's CapabilityBoundingSet (the DaemonSet adds the same ones): with
    // nothing else, egressd still takes and answers pods' queries (transparent sockets,
    // port 53, marks, policy routing).
    let unit = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/systemd/egressd.service")).unwrap();
    let caps: Vec<String> = unit
        .lines()
        .find_map(|l| l.strip_prefix("CapabilityBoundingSet="))
        .expect("the unit names its capabilities")
        .split_whitespace()
        .map(|c| c.trim_start_matches("CAP_").to_lowercase())
        .collect();
    let daemonset = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/daemonset/daemonset.yaml")).unwrap();
    for cap in &caps {
        assert!(daemonset.contains(&format!("\"{}\"", cap.to_uppercase())), "the DaemonSet does not add {cap}");
    }
    let bounding = format!("-all,{}", caps.iter().map(|c| format!("+{c}")).collect::<Vec<_>>().join(","));
    let t = Topology::new(&["team-a"]);
    let _server = Server::start(&t.ext);
    policed(&t);
    let agent = t.start_agent_wrapped("agent", &["setpriv", "--bounding-set", &bounding, "--"], &AGENT_ARGS, &[]);
    let status = std::fs::read_to_string(format!("/proc/{}/status", agent.pid())).unwrap();
    let eff = status.lines().find_map(|l| l.strip_prefix("CapEff:")).unwrap().trim().to_string();
    assert_eq!(u64::from_str_radix(&eff, 16).unwrap().count_ones() as usize, caps.len(), "CapEff {eff}");
    let ready = wait_for(Duration::from_secs(5), || {
        resolve_and_connect(&t.pods[0], 1, true, 990_000).is_empty() && proxied(&t, "udp") >= 1
    });
    assert!(ready.is_some(), "the proxy does not work with {caps:?} only:\n{}", agent.log_text());
    let failed = resolve_and_connect(&t.pods[0], 100, false, 991_000);
    assert!(failed.is_empty(), "{failed:?}");
}
