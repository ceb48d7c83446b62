//! DNS snooping: learning the addresses of `dnsName` rules from the answers local pods
//! actually receive (a wildcard like `*.example.com` cannot be resolved in advance, and
//! round-robin or geo DNS can answer a pod differently than egressd's own lookup).
//!
//! The kernel copies (nft `log group`, NFLOG) the pods' DNS queries and the answers to
//! them; nothing is queued or held, so DNS traffic is never delayed, dropped or
//! altered. This module is the pure part: parsing a copied packet (IPv4/IPv6, UDP/TCP),
//! the DNS message (hickory-proto) and the trust rules:
//!
//! * the nft rules only copy packets of flows a snooped pod opened to a configured DNS
//!   server (`ct original daddr`), in the original direction (queries) or the reply
//!   direction (answers); answers of other servers and answer-shaped packets that open
//!   no flow of the pod are copied with their own tag only to be counted;
//! * an answer counts only when a query with the same pod address and port, server
//!   address, transaction id, name and type was seen (within [`QUERY_LIFETIME`]); the
//!   query is consumed by its answer;
//! * CNAME chains inside the answer are followed from the question name; every name of
//!   the chain is matched against the rules, each address gets the smallest TTL on its
//!   way.
//!
//! TCP: a segment carrying one whole length-prefixed message is parsed; a message split
//! over several segments (answers larger than one segment) is skipped and counted.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::{Duration, Instant};

use hickory_proto::op::{Message, MessageType};
use hickory_proto::rr::{RData, RecordType};

/// How long a query waits for its answer.
pub(crate) const QUERY_LIFETIME: Duration = Duration::from_secs(30);
/// At most this many queries wait at once (the oldest are dropped beyond it).
pub(crate) const MAX_PENDING: usize = 65_536;

/// A transport header and payload of a copied packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet<'a> {
    /// Source address.
    pub src: IpAddr,
    /// Destination address.
    pub dst: IpAddr,
    /// Source port.
    pub sport: u16,
    /// Destination port.
    pub dport: u16,
    /// TCP (else UDP).
    pub tcp: bool,
    /// Transport payload.
    pub payload: &'a [u8],
}

/// Why a copied packet was not used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Ignored {
    /// Not a parsable IP/UDP/TCP packet or DNS message.
    Malformed,
    /// A TCP segment without one whole DNS message.
    TcpPartial,
    /// An answer from a server that is not configured.
    Untrusted,
    /// An answer-shaped packet outside any flow a pod opened.
    Untracked,
    /// An answer without a matching query (id, name, type, addresses, ports).
    Unmatched,
    /// A well-formed answer without A/AAAA records for the question.
    NoAddresses,
}

impl Ignored {
    /// Label value for metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Ignored::Malformed => "malformed",
            Ignored::TcpPartial => "tcp_partial",
            Ignored::Untrusted => "untrusted",
            Ignored::Untracked => "untracked",
            Ignored::Unmatched => "unmatched",
            Ignored::NoAddresses => "no_addresses",
        }
    }
}

fn be16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*b.get(at)?, *b.get(at + 1)?]))
}

/// Parse an IPv4 or IPv6 packet carrying UDP or TCP (no IPv6 extension headers).
pub fn parse_packet(b: &[u8]) -> Result<Packet<'_>, Ignored> {
    let version = b.first().ok_or(Ignored::Malformed)? >> 4;
    let (src, dst, proto, l4) = match version {
        4 => {
            let ihl = usize::from(b[0] & 0x0f) * 4;
            let total = usize::from(be16(b, 2).ok_or(Ignored::Malformed)?);
            if ihl < 20 || b.len() < ihl || total < ihl {
                return Err(Ignored::Malformed);
            }
            let end = total.min(b.len());
            let src: [u8; 4] = b[12..16].try_into().map_err(|_| Ignored::Malformed)?;
            let dst: [u8; 4] = b[16..20].try_into().map_err(|_| Ignored::Malformed)?;
            (IpAddr::V4(Ipv4Addr::from(src)), IpAddr::V4(Ipv4Addr::from(dst)), b[9], &b[ihl..end])
        }
        6 => {
            if b.len() < 40 {
                return Err(Ignored::Malformed);
            }
            let len = usize::from(be16(b, 4).ok_or(Ignored::Malformed)?);
            let end = (40 + len).min(b.len());
            let src: [u8; 16] = b[8..24].try_into().map_err(|_| Ignored::Malformed)?;
            let dst: [u8; 16] = b[24..40].try_into().map_err(|_| Ignored::Malformed)?;
            (IpAddr::V6(Ipv6Addr::from(src)), IpAddr::V6(Ipv6Addr::from(dst)), b[6], &b[40..end])
        }
        _ => return Err(Ignored::Malformed),
    };
    let sport = be16(l4, 0).ok_or(Ignored::Malformed)?;
    let dport = be16(l4, 2).ok_or(Ignored::Malformed)?;
    match proto {
        17 => {
            let payload = l4.get(8..).ok_or(Ignored::Malformed)?;
            Ok(Packet { src, dst, sport, dport, tcp: false, payload })
        }
        6 => {
            let offset = usize::from(*l4.get(12).ok_or(Ignored::Malformed)? >> 4) * 4;
            if offset < 20 {
                return Err(Ignored::Malformed);
            }
            let payload = l4.get(offset..).ok_or(Ignored::Malformed)?;
            Ok(Packet { src, dst, sport, dport, tcp: true, payload })
        }
        _ => Err(Ignored::Malformed),
    }
}

/// The DNS message of a packet: UDP payload, or one whole length-prefixed TCP message.
/// `Ok(None)` for an empty TCP segment (a bare ACK).
pub fn dns_message(p: &Packet) -> Result<Option<Message>, Ignored> {
    let bytes = if p.tcp {
        if p.payload.is_empty() {
            return Ok(None);
        }
        let len = usize::from(be16(p.payload, 0).ok_or(Ignored::TcpPartial)?);
        match p.payload.get(2..) {
            Some(rest) if rest.len() == len => rest,
            _ => return Err(Ignored::TcpPartial),
        }
    } else {
        p.payload
    };
    Message::from_vec(bytes).map(Some).map_err(|_| Ignored::Malformed)
}

/// A name as rules are matched: lowercase, no trailing dot.
fn normal(name: &hickory_proto::rr::Name) -> String {
    let s = name.to_lowercase().to_ascii();
    s.strip_suffix('.').unwrap_or(&s).to_string()
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct QueryKey {
    pod: IpAddr,
    pod_port: u16,
    server: IpAddr,
    id: u16,
}

/// One learned address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Learned {
    /// The pod that received the answer.
    pub pod: IpAddr,
    /// The names of the chain (question first, then CNAME targets), normalised.
    pub names: Vec<String>,
    /// The address.
    pub address: IpAddr,
    /// Smallest TTL on the way from the question to the address.
    pub ttl: Duration,
}

/// The query tracker: pending queries and their answers.
#[derive(Debug, Default)]
pub struct Snooper {
    pending: HashMap<QueryKey, (String, RecordType, Instant)>,
}

impl Snooper {
    /// An empty tracker.
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of queries waiting for an answer.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    fn expire(&mut self, now: Instant) {
        self.pending.retain(|_, (_, _, at)| now.duration_since(*at) < QUERY_LIFETIME);
    }

    /// A query a pod sent (copied in the original direction).
    pub fn query(&mut self, p: &Packet, msg: &Message, now: Instant) -> Result<(), Ignored> {
        if msg.metadata.message_type != MessageType::Query {
            return Err(Ignored::Malformed);
        }
        let [q] = msg.queries.as_slice() else { return Err(Ignored::Malformed) };
        if self.pending.len() >= MAX_PENDING {
            self.expire(now);
            if self.pending.len() >= MAX_PENDING {
                return Err(Ignored::Unmatched);
            }
        }
        let key = QueryKey { pod: p.src, pod_port: p.sport, server: p.dst, id: msg.metadata.id };
        self.pending.insert(key, (normal(&q.name), q.query_type, now));
        Ok(())
    }

    /// An answer to a pod (copied in the reply direction from a trusted server): the
    /// addresses it teaches, or why it teaches nothing.
    pub fn answer(&mut self, p: &Packet, msg: &Message, now: Instant) -> Result<Vec<Learned>, Ignored> {
        if msg.metadata.message_type != MessageType::Response {
            return Err(Ignored::Malformed);
        }
        let key = QueryKey { pod: p.dst, pod_port: p.dport, server: p.src, id: msg.metadata.id };
        let Some((qname, qtype, at)) = self.pending.get(&key).cloned() else { return Err(Ignored::Unmatched) };
        if now.duration_since(at) >= QUERY_LIFETIME {
            self.pending.remove(&key);
            return Err(Ignored::Unmatched);
        }
        let [q] = msg.queries.as_slice() else { return Err(Ignored::Unmatched) };
        if normal(&q.name) != qname || q.query_type != qtype {
            return Err(Ignored::Unmatched);
        }
        self.pending.remove(&key);
        let learned = follow(&qname, msg, p.dst);
        if learned.is_empty() { Err(Ignored::NoAddresses) } else { Ok(learned) }
    }
}

/// Follow the CNAME chain from `qname` through the answer section; every A/AAAA record
/// of a name on the chain is learned with the smallest TTL on its way.
fn follow(qname: &str, msg: &Message, pod: IpAddr) -> Vec<Learned> {
    // chain: (name, smallest TTL to reach it)
    let mut chain: Vec<(String, u32)> = vec![(qname.to_string(), u32::MAX)];
    // Bounded: each pass adds at least one new name, at most one per record.
    for _ in 0..msg.answers.len() {
        let mut grew = false;
        for r in &msg.answers {
            if let RData::CNAME(target) = &r.data {
                let owner = normal(&r.name);
                let Some(ttl) = chain.iter().find(|(n, _)| *n == owner).map(|(_, t)| *t) else { continue };
                let target = normal(&target.0);
                if !chain.iter().any(|(n, _)| *n == target) {
                    chain.push((target, ttl.min(r.ttl)));
                    grew = true;
                }
            }
        }
        if !grew {
            break;
        }
    }
    let names: Vec<String> = chain.iter().map(|(n, _)| n.clone()).collect();
    let mut out = Vec::new();
    for r in &msg.answers {
        let address = match &r.data {
            RData::A(a) => IpAddr::V4(a.0),
            RData::AAAA(a) => IpAddr::V6(a.0),
            _ => continue,
        };
        let owner = normal(&r.name);
        if let Some((_, ttl)) = chain.iter().find(|(n, _)| *n == owner) {
            out.push(Learned {
                pod,
                names: names.clone(),
                address,
                ttl: Duration::from_secs(u64::from((*ttl).min(r.ttl))),
            });
        }
    }
    out
}

/// Whether a rule's `dnsName` (normalised base, wildcard flag) matches a normalised
/// name: exactly, or for `*.base` exactly one more label (`a.base`, not `base` nor
/// `a.b.base`), as the reference documents.
pub fn name_matches(base: &str, wildcard: bool, name: &str) -> bool {
    if !wildcard {
        return name == base;
    }
    match name.strip_suffix(base).and_then(|p| p.strip_suffix('.')) {
        Some(label) => !label.is_empty() && !label.contains('.'),
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_proto::op::Query;
    use hickory_proto::rr::rdata::{A, AAAA, CNAME};
    use hickory_proto::rr::{Name, Record};

    fn name(s: &str) -> Name {
        Name::from_ascii(s).unwrap()
    }

    fn query(id: u16, q: &str, t: RecordType) -> Message {
        let mut m = Message::query();
        m.metadata.id = id;
        m.add_query(Query::query(name(q), t));
        m
    }

    fn response(id: u16, q: &str, t: RecordType, answers: Vec<Record>) -> Message {
        let mut m = query(id, q, t);
        m.metadata.message_type = MessageType::Response;
        for a in answers {
            m.add_answer(a);
        }
        m
    }

    fn udp_packet(src: &str, sport: u16, dst: &str, dport: u16, payload: &[u8]) -> Vec<u8> {
        let (s, d): (Ipv4Addr, Ipv4Addr) = (src.parse().unwrap(), dst.parse().unwrap());
        let total = 28 + payload.len();
        let mut b = vec![0x45, 0, (total >> 8) as u8, total as u8, 0, 0, 0, 0, 64, 17, 0, 0];
        b.extend_from_slice(&s.octets());
        b.extend_from_slice(&d.octets());
        b.extend_from_slice(&sport.to_be_bytes());
        b.extend_from_slice(&dport.to_be_bytes());
        b.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
        b.extend_from_slice(&[0, 0]);
        b.extend_from_slice(payload);
        b
    }

    const POD: &str = "198.18.1.2";
    const DNS: &str = "198.19.0.10";

    fn exchange(s: &mut Snooper, q: &Message, a: &Message) -> Result<Vec<Learned>, Ignored> {
        let now = Instant::now();
        let qb = udp_packet(POD, 40000, DNS, 53, &q.to_vec().unwrap());
        let qp = parse_packet(&qb).unwrap();
        s.query(&qp, &dns_message(&qp).unwrap().unwrap(), now).unwrap();
        let ab = udp_packet(DNS, 53, POD, 40000, &a.to_vec().unwrap());
        let ap = parse_packet(&ab).unwrap();
        s.answer(&ap, &dns_message(&ap).unwrap().unwrap(), now)
    }

    #[test]
    fn an_answer_to_a_seen_query_teaches_its_addresses_through_cnames() {
        let mut s = Snooper::new();
        let answers = vec![
            Record::from_rdata(name("a.example.com."), 300, RData::CNAME(CNAME(name("edge.cdn.example.net.")))),
            Record::from_rdata(name("edge.cdn.example.net."), 20, RData::A(A("192.0.2.7".parse().unwrap()))),
            Record::from_rdata(name("unrelated.example.org."), 20, RData::A(A("192.0.2.99".parse().unwrap()))),
        ];
        let learned = exchange(
            &mut s,
            &query(7, "A.Example.com.", RecordType::A),
            &response(7, "a.example.com.", RecordType::A, answers),
        )
        .unwrap();
        assert_eq!(learned.len(), 1, "records off the chain are ignored: {learned:?}");
        assert_eq!(learned[0].names, vec!["a.example.com".to_string(), "edge.cdn.example.net".to_string()]);
        assert_eq!(learned[0].address, "192.0.2.7".parse::<IpAddr>().unwrap());
        assert_eq!(learned[0].ttl, Duration::from_secs(20));
        assert_eq!(learned[0].pod, POD.parse::<IpAddr>().unwrap());
        assert_eq!(s.pending(), 0, "the answer consumed its query");
    }

    #[test]
    fn answers_without_their_query_are_ignored() {
        let mut s = Snooper::new();
        let aaaa =
            vec![Record::from_rdata(name("a.example.com."), 60, RData::AAAA(AAAA("2001:db8::7".parse().unwrap())))];
        let q = query(7, "a.example.com.", RecordType::AAAA);
        // Other id, other name, other type: all unmatched.
        for wrong in [
            response(8, "a.example.com.", RecordType::AAAA, aaaa.clone()),
            response(7, "b.example.com.", RecordType::AAAA, aaaa.clone()),
            response(7, "a.example.com.", RecordType::A, aaaa.clone()),
        ] {
            assert_eq!(exchange(&mut Snooper::new(), &q, &wrong), Err(Ignored::Unmatched));
        }
        // No query at all.
        let ab = udp_packet(
            DNS,
            53,
            POD,
            40000,
            &response(7, "a.example.com.", RecordType::AAAA, aaaa.clone()).to_vec().unwrap(),
        );
        let ap = parse_packet(&ab).unwrap();
        assert_eq!(s.answer(&ap, &dns_message(&ap).unwrap().unwrap(), Instant::now()), Err(Ignored::Unmatched));
        // The right one, once.
        let ok = exchange(&mut s, &q, &response(7, "a.example.com.", RecordType::AAAA, aaaa.clone())).unwrap();
        assert_eq!(ok[0].address, "2001:db8::7".parse::<IpAddr>().unwrap());
        assert_eq!(
            s.answer(&ap, &dns_message(&ap).unwrap().unwrap(), Instant::now()),
            Err(Ignored::Unmatched),
            "replay"
        );
    }

    #[test]
    fn wildcards_match_exactly_one_label() {
        assert!(name_matches("example.com", true, "a.example.com"));
        assert!(!name_matches("example.com", true, "example.com"));
        assert!(!name_matches("example.com", true, "a.b.example.com"));
        assert!(!name_matches("example.com", true, "aexample.com"));
        assert!(name_matches("example.com", false, "example.com"));
        assert!(!name_matches("example.com", false, "a.example.com"));
    }

    #[test]
    fn tcp_needs_one_whole_message_and_garbage_is_malformed() {
        let msg = query(1, "a.example.com.", RecordType::A).to_vec().unwrap();
        let mut framed = (msg.len() as u16).to_be_bytes().to_vec();
        framed.extend_from_slice(&msg);
        let p = Packet {
            src: POD.parse().unwrap(),
            dst: DNS.parse().unwrap(),
            sport: 1,
            dport: 53,
            tcp: true,
            payload: &framed,
        };
        assert!(dns_message(&p).unwrap().is_some());
        let half = Packet { payload: &framed[..framed.len() - 3], ..p.clone() };
        assert_eq!(dns_message(&half).err(), Some(Ignored::TcpPartial));
        let ack = Packet { payload: &[], ..p.clone() };
        assert_eq!(dns_message(&ack), Ok(None));
        for junk in [&[][..], &[0x45][..], &[0x60; 39][..], &[0x45, 0, 0, 20, 0, 0, 0, 0, 64, 17][..]] {
            assert_eq!(parse_packet(junk).err(), Some(Ignored::Malformed));
        }
        let bad_dns = udp_packet(DNS, 53, POD, 1, &[1, 2, 3]);
        assert_eq!(dns_message(&parse_packet(&bad_dns).unwrap()).err(), Some(Ignored::Malformed));
    }
}

#[cfg(test)]
mod fuzz_seeds {
    use super::tests_support::*;
    use super::*;

    /// A stable-toolchain stand-in for the fuzzer in CI: the seeds with random bytes
    /// flipped, truncated and extended, through the whole path; nothing may panic.
    #[test]
    fn mutated_packets_never_panic() {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let seeds = seeds();
        let now = Instant::now();
        for round in 0..50_000u64 {
            let (_, seed) = &seeds[(round % seeds.len() as u64) as usize];
            let mut b = seed.clone();
            for _ in 0..(next() % 8 + 1) {
                let i = (next() as usize) % b.len();
                b[i] = next() as u8;
            }
            match next() % 4 {
                0 => b.truncate((next() as usize) % (b.len() + 1)),
                1 => b.extend((0..next() % 64).map(|_| next() as u8)),
                _ => {}
            }
            let mut snooper = Snooper::new();
            if let Ok(p) = parse_packet(&b)
                && let Ok(Some(mut m)) = dns_message(&p)
            {
                m.metadata.message_type = MessageType::Query;
                let _ = snooper.query(&p, &m, now);
                m.metadata.message_type = MessageType::Response;
                let reply = Packet { src: p.dst, dst: p.src, sport: p.dport, dport: p.sport, ..p.clone() };
                let _ = snooper.answer(&reply, &m, now);
            }
        }
    }

    /// Writes the fuzz target's seed corpus (`fuzz/seeds/`): valid queries and answers
    /// (CNAME chain, AAAA, TCP framing). Run by `fuzz/run.sh`.
    #[test]
    #[ignore = "writes fuzz/seeds; run by fuzz/run.sh"]
    fn write_fuzz_seeds() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds");
        std::fs::create_dir_all(&dir).unwrap();
        for (name, bytes) in seeds() {
            std::fs::write(dir.join(name), bytes).unwrap();
        }
    }
}

#[cfg(test)]
mod tests_support {
    use hickory_proto::op::{Message, MessageType, Query};
    use hickory_proto::rr::rdata::{A, AAAA, CNAME};
    use hickory_proto::rr::{Name, RData, Record, RecordType};

    fn ipv4_udp(src: [u8; 4], sport: u16, dst: [u8; 4], dport: u16, payload: &[u8]) -> Vec<u8> {
        let total = 28 + payload.len();
        let mut b = vec![0x45, 0, (total >> 8) as u8, total as u8, 0, 0, 0, 0, 64, 17, 0, 0];
        b.extend_from_slice(&src);
        b.extend_from_slice(&dst);
        b.extend_from_slice(&sport.to_be_bytes());
        b.extend_from_slice(&dport.to_be_bytes());
        b.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
        b.extend_from_slice(&[0, 0]);
        b.extend_from_slice(payload);
        b
    }

    fn ipv6_tcp(src: [u8; 16], dst: [u8; 16], payload: &[u8]) -> Vec<u8> {
        let len = 20 + payload.len();
        let mut b = vec![0x60, 0, 0, 0, (len >> 8) as u8, len as u8, 6, 64];
        b.extend_from_slice(&src);
        b.extend_from_slice(&dst);
        b.extend_from_slice(&53u16.to_be_bytes());
        b.extend_from_slice(&40000u16.to_be_bytes());
        b.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 1, 0x50, 0x18, 0xff, 0xff, 0, 0, 0, 0]);
        b.extend_from_slice(payload);
        b
    }

    /// Seed packets for the fuzz target.
    pub(super) fn seeds() -> Vec<(&'static str, Vec<u8>)> {
        let name = |s: &str| Name::from_ascii(s).unwrap();
        let mut q = Message::query();
        q.metadata.id = 7;
        q.add_query(Query::query(name("a.example.com."), RecordType::A));
        let mut a = q.clone();
        a.metadata.message_type = MessageType::Response;
        a.add_answer(Record::from_rdata(name("a.example.com."), 60, RData::CNAME(CNAME(name("b.cdn.example.net.")))));
        a.add_answer(Record::from_rdata(name("b.cdn.example.net."), 30, RData::A(A("192.0.2.7".parse().unwrap()))));
        let mut a6 = Message::query();
        a6.metadata.id = 9;
        a6.metadata.message_type = MessageType::Response;
        a6.add_query(Query::query(name("a.example.com."), RecordType::AAAA));
        a6.add_answer(Record::from_rdata(
            name("a.example.com."),
            60,
            RData::AAAA(AAAA("2001:db8::7".parse().unwrap())),
        ));
        let a6b = a6.to_vec().unwrap();
        let mut framed = (a6b.len() as u16).to_be_bytes().to_vec();
        framed.extend_from_slice(&a6b);
        let v6 = |last: u8| {
            let mut x = [0u8; 16];
            x[0] = 0x20;
            x[1] = 0x01;
            x[2] = 0x0d;
            x[3] = 0xb8;
            x[15] = last;
            x
        };
        vec![
            ("query-udp4", ipv4_udp([198, 18, 1, 2], 40000, [198, 19, 0, 10], 53, &q.to_vec().unwrap())),
            ("answer-cname-udp4", ipv4_udp([198, 19, 0, 10], 53, [198, 18, 1, 2], 40000, &a.to_vec().unwrap())),
            ("answer-aaaa-tcp6", ipv6_tcp(v6(53), v6(2), &framed)),
        ]
    }
}
