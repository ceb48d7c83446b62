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
//! * answers copied from the pod-facing side (a pod forging the server's address, caught
//!   by the nft reverse-path check `fib saddr . iif oif missing`) carry their own tag
//!   and are only counted (`spoofed`).
//!
//! TCP: an answer is parsed only at a message boundary of the server's byte stream. The
//! boundary is known from the server's SYN-ACK (its initial sequence number) and each
//! message's length prefix; a segment that does not hold the next boundary, or a message
//! that does not end in the segment holding its start, is not parsed (`tcp_partial`) —
//! so a pod shaping segment boundaries (its receive window, a zone it owns) cannot get
//! bytes from the middle of a message read as an answer. The boundary still moves past
//! a skipped message, so the answers after it are read.
//!
//! Bounds (each counted in [`Dropped`] when it bites): [`MAX_PENDING`] waiting queries
//! (the oldest is forgotten), [`MAX_PENDING_PER_POD`] per pod (newer ones are not
//! tracked), expiry after [`QUERY_LIFETIME`] in O(1) amortised (oldest first, no scan),
//! [`MAX_TCP_FLOWS`] TCP streams, CNAME chains of at most [`MAX_CNAME_CHAIN`] links
//! followed in linear time.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::{Duration, Instant};

use hickory_proto::op::{Message, MessageType};
use hickory_proto::rr::{RData, RecordType};
use lru::LruCache;

/// How long a query waits for its answer.
pub(crate) const QUERY_LIFETIME: Duration = Duration::from_secs(30);
/// At most this many queries wait at once (the oldest is forgotten beyond it).
pub(crate) const MAX_PENDING: usize = 65_536;
/// At most this many queries of one pod wait at once (more are not tracked).
pub(crate) const MAX_PENDING_PER_POD: usize = 512;
/// TCP DNS streams whose message boundary is tracked (least recently used forgotten).
pub(crate) const MAX_TCP_FLOWS: usize = 16_384;
/// Longest CNAME chain followed from the question name.
pub(crate) const MAX_CNAME_CHAIN: usize = 16;

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
    /// TCP sequence number (0 for UDP).
    pub seq: u32,
    /// TCP SYN flag.
    pub syn: bool,
    /// Transport payload.
    pub payload: &'a [u8],
}

/// Why a copied packet was not used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Ignored {
    /// Not a parsable IP/UDP/TCP packet or DNS message.
    Malformed,
    /// A TCP segment without a whole DNS message at a known message boundary.
    TcpPartial,
    /// An answer from a server that is not configured.
    Untrusted,
    /// An answer-shaped packet outside any flow a pod opened.
    Untracked,
    /// An answer that entered the node from the pod-facing side (failed the reverse-path
    /// check): forged by a pod.
    Spoofed,
    /// An answer without a matching query (id, name, type, addresses, ports).
    Unmatched,
    /// A query not tracked: its pod has [`MAX_PENDING_PER_POD`] queries waiting.
    PodPendingFull,
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
            Ignored::Spoofed => "spoofed",
            Ignored::Unmatched => "unmatched",
            Ignored::PodPendingFull => "pod_pending_full",
            Ignored::NoAddresses => "no_addresses",
        }
    }
}

fn be16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*b.get(at)?, *b.get(at + 1)?]))
}

fn be32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_be_bytes([*b.get(at)?, *b.get(at + 1)?, *b.get(at + 2)?, *b.get(at + 3)?]))
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
            Ok(Packet { src, dst, sport, dport, tcp: false, seq: 0, syn: false, payload })
        }
        6 => {
            let offset = usize::from(*l4.get(12).ok_or(Ignored::Malformed)? >> 4) * 4;
            if offset < 20 {
                return Err(Ignored::Malformed);
            }
            let payload = l4.get(offset..).ok_or(Ignored::Malformed)?;
            let seq = be32(l4, 4).ok_or(Ignored::Malformed)?;
            let syn = l4.get(13).ok_or(Ignored::Malformed)? & 0x02 != 0;
            Ok(Packet { src, dst, sport, dport, tcp: true, seq, syn, payload })
        }
        _ => Err(Ignored::Malformed),
    }
}

/// The DNS message of a UDP packet.
pub fn dns_message(p: &Packet) -> Result<Message, Ignored> {
    Message::from_vec(p.payload).map_err(|_| Ignored::Malformed)
}

/// The whole length-prefixed messages of a TCP payload from its start (a pod's own
/// queries: their framing is the pod's business, they teach nothing by themselves).
fn tcp_messages(payload: &[u8]) -> Result<Vec<Message>, Ignored> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < payload.len() {
        let len = usize::from(be16(payload, at).ok_or(Ignored::TcpPartial)?);
        let body = payload.get(at + 2..at + 2 + len).ok_or(Ignored::TcpPartial)?;
        out.push(Message::from_vec(body).map_err(|_| Ignored::Malformed)?);
        at += 2 + len;
    }
    Ok(out)
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

#[derive(Debug, Clone)]
struct PendingQuery {
    name: String,
    rtype: RecordType,
    at: Instant,
}

/// A TCP stream from a server to a pod.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct FlowKey {
    pod: IpAddr,
    pod_port: u16,
    server: IpAddr,
    server_port: u16,
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

/// What the bounds dropped so far (monotonic counters).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Dropped {
    /// Waiting queries forgotten to make room (oldest first) at [`MAX_PENDING`].
    pub pending_evicted: u64,
    /// TCP streams forgotten (least recently used) at [`MAX_TCP_FLOWS`].
    pub tcp_flows_evicted: u64,
    /// CNAME chains cut at [`MAX_CNAME_CHAIN`].
    pub cname_chains_cut: u64,
}

/// An LRU cache of at most `cap` entries that allocates as it fills (`LruCache::new`
/// would reserve room for all of them up front: megabytes on a node that never snoops
/// a query).
#[derive(Debug)]
struct Bounded<K: std::hash::Hash + Eq, V> {
    inner: LruCache<K, V>,
    cap: usize,
}

impl<K: std::hash::Hash + Eq, V> Bounded<K, V> {
    fn new(cap: usize) -> Self {
        Self { inner: LruCache::unbounded(), cap: cap.max(1) }
    }

    /// As `LruCache::push`: the replaced entry of the same key, or the least recently
    /// used one evicted to make room.
    fn push(&mut self, key: K, value: V) -> Option<(K, V)> {
        if self.inner.contains(&key) {
            return self.inner.push(key, value);
        }
        let evicted = if self.inner.len() >= self.cap { self.inner.pop_lru() } else { None };
        self.inner.push(key, value);
        evicted
    }

    /// As `LruCache::put`.
    fn put(&mut self, key: K, value: V) {
        self.push(key, value);
    }
}

impl<K: std::hash::Hash + Eq, V> std::ops::Deref for Bounded<K, V> {
    type Target = LruCache<K, V>;
    fn deref(&self) -> &Self::Target {
        &self.inner
    }
}

impl<K: std::hash::Hash + Eq, V> std::ops::DerefMut for Bounded<K, V> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.inner
    }
}

/// The query tracker: pending queries, TCP message boundaries, and the answers.
#[derive(Debug)]
pub struct Snooper {
    pending: Bounded<QueryKey, PendingQuery>,
    per_pod: HashMap<IpAddr, usize>,
    /// Server→pod TCP streams: the sequence number where the next message starts.
    flows: Bounded<FlowKey, u32>,
    dropped: Dropped,
}

impl Default for Snooper {
    fn default() -> Self {
        Self::with_limits(MAX_PENDING, MAX_TCP_FLOWS)
    }
}

impl Snooper {
    /// An empty tracker.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty tracker with other bounds (tests).
    pub fn with_limits(pending: usize, flows: usize) -> Self {
        Self {
            pending: Bounded::new(pending),
            per_pod: HashMap::new(),
            flows: Bounded::new(flows),
            dropped: Dropped::default(),
        }
    }

    /// Number of queries waiting for an answer.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// What the bounds dropped so far.
    pub fn dropped(&self) -> Dropped {
        self.dropped
    }

    fn forget(&mut self, pod: IpAddr) {
        if let Some(n) = self.per_pod.get_mut(&pod) {
            *n -= 1;
            if *n == 0 {
                self.per_pod.remove(&pod);
            }
        }
    }

    /// Drop expired queries, oldest first: every query is dropped once, so this costs
    /// O(1) amortised per query and never scans.
    fn expire(&mut self, now: Instant) {
        while let Some((_, q)) = self.pending.peek_lru() {
            if now.duration_since(q.at) < QUERY_LIFETIME {
                break;
            }
            if let Some((key, _)) = self.pending.pop_lru() {
                self.forget(key.pod);
            }
        }
    }

    /// A query a pod sent (copied in the original direction): UDP, or the whole
    /// messages of a TCP segment. Returns how many were tracked.
    pub fn query(&mut self, p: &Packet, now: Instant) -> Result<usize, Ignored> {
        if !p.tcp {
            self.query_message(p, &dns_message(p)?, now)?;
            return Ok(1);
        }
        let messages = tcp_messages(p.payload)?;
        for m in &messages {
            self.query_message(p, m, now)?;
        }
        Ok(messages.len())
    }

    /// One query message.
    pub fn query_message(&mut self, p: &Packet, msg: &Message, now: Instant) -> Result<(), Ignored> {
        if msg.metadata.message_type != MessageType::Query {
            return Err(Ignored::Malformed);
        }
        let [q] = msg.queries.as_slice() else { return Err(Ignored::Malformed) };
        self.expire(now);
        let key = QueryKey { pod: p.src, pod_port: p.sport, server: p.dst, id: msg.metadata.id };
        let value = PendingQuery { name: normal(&q.name), rtype: q.query_type, at: now };
        if self.pending.contains(&key) {
            // The same query again (a retry): it waits anew.
            self.pending.put(key, value);
            return Ok(());
        }
        if self.per_pod.get(&p.src).copied().unwrap_or(0) >= MAX_PENDING_PER_POD {
            return Err(Ignored::PodPendingFull);
        }
        *self.per_pod.entry(p.src).or_default() += 1;
        if let Some((evicted, _)) = self.pending.push(key, value) {
            self.dropped.pending_evicted += 1;
            self.forget(evicted.pod);
        }
        Ok(())
    }

    /// An answer to a pod (copied in the reply direction from a trusted server): the
    /// addresses it teaches, or why it teaches nothing. TCP segments are read at the
    /// stream's message boundaries only (see the module documentation).
    pub fn answer(&mut self, p: &Packet, now: Instant) -> Result<Vec<Learned>, Ignored> {
        if !p.tcp {
            return self.answer_message(p, &dns_message(p)?, now);
        }
        let flow = FlowKey { pod: p.dst, pod_port: p.dport, server: p.src, server_port: p.sport };
        if p.syn {
            // The server's SYN-ACK: its first byte of data is the first boundary.
            if let Some((old, _)) = self.flows.push(flow.clone(), p.seq.wrapping_add(1))
                && old != flow
            {
                self.dropped.tcp_flows_evicted += 1;
            }
            return Ok(Vec::new());
        }
        if p.payload.is_empty() {
            return Ok(Vec::new());
        }
        let Some(next) = self.flows.get(&flow).copied() else { return Err(Ignored::TcpPartial) };
        let start = next.wrapping_sub(p.seq) as usize;
        if start >= p.payload.len() {
            // The boundary is not in this segment: a continuation, a retransmission,
            // or bytes after a gap in what was copied.
            return Err(Ignored::TcpPartial);
        }
        let mut at = start;
        let mut learned = Vec::new();
        let mut why = None;
        while at < p.payload.len() {
            let Some(len) = be16(p.payload, at).map(usize::from) else {
                // The length prefix itself is split: the boundaries are lost.
                self.flows.pop(&flow);
                return if learned.is_empty() { Err(why.unwrap_or(Ignored::TcpPartial)) } else { Ok(learned) };
            };
            let end = at + 2 + len;
            let Some(body) = p.payload.get(at + 2..end) else {
                // The message ends in a later segment: skipped, but the next boundary
                // is known.
                why = Some(Ignored::TcpPartial);
                at = end;
                break;
            };
            match Message::from_vec(body).map_err(|_| Ignored::Malformed).and_then(|m| self.answer_message(p, &m, now))
            {
                Ok(l) => learned.extend(l),
                Err(e) => why = Some(e),
            }
            at = end;
        }
        let boundary = p.seq.wrapping_add(u32::try_from(at).unwrap_or(u32::MAX));
        self.flows.put(flow, boundary);
        if learned.is_empty() { Err(why.unwrap_or(Ignored::NoAddresses)) } else { Ok(learned) }
    }

    /// One answer message.
    pub fn answer_message(&mut self, p: &Packet, msg: &Message, now: Instant) -> Result<Vec<Learned>, Ignored> {
        if msg.metadata.message_type != MessageType::Response {
            return Err(Ignored::Malformed);
        }
        let key = QueryKey { pod: p.dst, pod_port: p.dport, server: p.src, id: msg.metadata.id };
        let Some(waiting) = self.pending.peek(&key) else { return Err(Ignored::Unmatched) };
        if now.duration_since(waiting.at) >= QUERY_LIFETIME {
            self.pending.pop(&key);
            self.forget(key.pod);
            return Err(Ignored::Unmatched);
        }
        let [q] = msg.queries.as_slice() else { return Err(Ignored::Unmatched) };
        if normal(&q.name) != waiting.name || q.query_type != waiting.rtype {
            return Err(Ignored::Unmatched);
        }
        let qname = waiting.name.clone();
        self.pending.pop(&key);
        self.forget(key.pod);
        let (learned, cut) = follow(&qname, msg, p.dst);
        if cut {
            self.dropped.cname_chains_cut += 1;
        }
        if learned.is_empty() { Err(Ignored::NoAddresses) } else { Ok(learned) }
    }
}

/// Follow the CNAME chain from `qname` through the answer section (at most
/// [`MAX_CNAME_CHAIN`] links, linear in the answer's size); every A/AAAA record of a
/// name on the chain is learned with the smallest TTL on its way. Also says whether the
/// chain was cut.
fn follow(qname: &str, msg: &Message, pod: IpAddr) -> (Vec<Learned>, bool) {
    // owner → (target, TTL) of the first CNAME record of each owner.
    let mut cnames: HashMap<String, (String, u32)> = HashMap::new();
    for r in &msg.answers {
        if let RData::CNAME(target) = &r.data {
            cnames.entry(normal(&r.name)).or_insert_with(|| (normal(&target.0), r.ttl));
        }
    }
    // chain: (name, smallest TTL to reach it); at most MAX_CNAME_CHAIN + 1 names, so
    // the loop check below is bounded by a constant.
    let mut chain: Vec<(String, u32)> = vec![(qname.to_string(), u32::MAX)];
    let mut cut = false;
    while let Some((last, ttl)) = chain.last().cloned()
        && let Some((target, link_ttl)) = cnames.get(&last)
    {
        if chain.iter().any(|(n, _)| n == target) {
            break; // a loop
        }
        if chain.len() > MAX_CNAME_CHAIN {
            cut = true;
            break;
        }
        chain.push((target.clone(), ttl.min(*link_ttl)));
    }
    let names: Vec<String> = chain.iter().map(|(n, _)| n.clone()).collect();
    let on_chain: HashMap<&str, u32> = chain.iter().map(|(n, t)| (n.as_str(), *t)).collect();
    let mut out = Vec::new();
    for r in &msg.answers {
        let address = match &r.data {
            RData::A(a) => IpAddr::V4(a.0),
            RData::AAAA(a) => IpAddr::V6(a.0),
            _ => continue,
        };
        if let Some(ttl) = on_chain.get(normal(&r.name).as_str()) {
            out.push(Learned {
                pod,
                names: names.clone(),
                address,
                ttl: Duration::from_secs(u64::from((*ttl).min(r.ttl))),
            });
        }
    }
    (out, cut)
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

    #[test]
    fn a_bounded_cache_replaces_and_evicts_as_lru_does() {
        let mut b = Bounded::new(2);
        assert_eq!(b.push(1, "a"), None);
        assert_eq!(b.push(2, "b"), None);
        assert_eq!(b.push(1, "c"), Some((1, "a")), "the same key: replaced, and now the most recent");
        assert_eq!(b.push(3, "d"), Some((2, "b")), "full: the least recently used goes");
        assert_eq!(b.len(), 2);
        b.put(4, "e");
        assert_eq!(b.peek(&1), None);
        assert_eq!(b.peek(&3), Some(&"d"));
    }
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
        s.query(&qp, now).unwrap();
        let ab = udp_packet(DNS, 53, POD, 40000, &a.to_vec().unwrap());
        let ap = parse_packet(&ab).unwrap();
        s.answer(&ap, now)
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
        assert_eq!(s.answer(&ap, Instant::now()), Err(Ignored::Unmatched));
        // The right one, once.
        let ok = exchange(&mut s, &q, &response(7, "a.example.com.", RecordType::AAAA, aaaa.clone())).unwrap();
        assert_eq!(ok[0].address, "2001:db8::7".parse::<IpAddr>().unwrap());
        assert_eq!(s.answer(&ap, Instant::now()), Err(Ignored::Unmatched), "replay");
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

    fn framed(m: &Message) -> Vec<u8> {
        let b = m.to_vec().unwrap();
        let mut out = (b.len() as u16).to_be_bytes().to_vec();
        out.extend_from_slice(&b);
        out
    }

    fn tcp<'a>(from_server: bool, seq: u32, syn: bool, payload: &'a [u8]) -> Packet<'a> {
        let (pod, dns): (IpAddr, IpAddr) = (POD.parse().unwrap(), DNS.parse().unwrap());
        let (src, dst, sport, dport) = if from_server { (dns, pod, 53, 40000) } else { (pod, dns, 40000, 53) };
        Packet { src, dst, sport, dport, tcp: true, seq, syn, payload }
    }

    fn a_answer(id: u16, q: &str, ip: &str) -> Message {
        response(id, q, RecordType::A, vec![Record::from_rdata(name(q), 60, RData::A(A(ip.parse().unwrap())))])
    }

    #[test]
    fn tcp_answers_count_only_at_message_boundaries_of_the_stream() {
        let now = Instant::now();
        const ISN: u32 = u32::MAX - 10; // sequence numbers wrap inside the stream
        let mut s = Snooper::new();
        let q1 = framed(&query(1, "a.example.com.", RecordType::A));
        let q2 = framed(&query(2, "b.example.com.", RecordType::A));
        let mut both = q1.clone();
        both.extend_from_slice(&q2);
        assert_eq!(s.query(&tcp(false, 1, false, &both), now), Ok(2), "pipelined queries");
        // Without the server's SYN-ACK no boundary is known: nothing counts.
        let a1 = framed(&a_answer(1, "a.example.com.", "192.0.2.1"));
        assert_eq!(s.answer(&tcp(true, ISN.wrapping_add(1), false, &a1), now), Err(Ignored::TcpPartial));
        assert_eq!(s.answer(&tcp(true, ISN, true, &[]), now), Ok(Vec::new()));

        // A forged message hidden inside the first answer (a TXT-like blob a pod's zone
        // controls): sent by the server in segments a pod shaped so that one segment
        // starts with the blob. Only the boundary counts.
        let hidden = framed(&a_answer(2, "b.example.com.", "192.0.2.66"));
        let mut carrier = a_answer(1, "a.example.com.", "192.0.2.1");
        carrier.add_additional(Record::from_rdata(
            name("x.example.com."),
            60,
            RData::NULL(hickory_proto::rr::rdata::NULL::with(hidden.clone())),
        ));
        let carrier = framed(&carrier);
        let at = carrier.windows(hidden.len()).position(|w| w == hidden.as_slice()).unwrap();
        let seq0 = ISN.wrapping_add(1);
        // Segment 1: the carrier up to the blob: its message does not end here.
        assert_eq!(s.answer(&tcp(true, seq0, false, &carrier[..at]), now), Err(Ignored::TcpPartial));
        // Segment 2 starts with the blob — [len][whole message] — but is no boundary.
        let rest = &carrier[at..];
        assert_eq!(
            s.answer(&tcp(true, seq0.wrapping_add(at as u32), false, rest), now),
            Err(Ignored::TcpPartial),
            "bytes inside a message are never read as an answer"
        );
        assert_eq!(s.pending(), 2, "neither query was answered");

        // The real answer to query 2 starts at the next boundary, after the skipped
        // message, in a segment that also carries the tail of nothing else.
        let a2 = framed(&a_answer(2, "b.example.com.", "192.0.2.2"));
        let seq2 = seq0.wrapping_add(carrier.len() as u32);
        let learned = s.answer(&tcp(true, seq2, false, &a2), now).unwrap();
        assert_eq!(learned[0].address, "192.0.2.2".parse::<IpAddr>().unwrap());
        // A retransmission of a segment already read is not read again.
        assert_eq!(s.answer(&tcp(true, seq2, false, &a2), now), Err(Ignored::TcpPartial));

        // A boundary in the middle of a segment (the tail of one message, then a whole
        // one) is found.
        let mut s = Snooper::new();
        s.query(&tcp(false, 1, false, &q1), now).unwrap();
        s.query(&tcp(false, 1, false, &q2), now).unwrap();
        s.answer(&tcp(true, 99, true, &[]), now).unwrap();
        let mut stream = a1.clone();
        stream.extend_from_slice(&a2);
        assert_eq!(s.answer(&tcp(true, 100, false, &stream[..5]), now), Err(Ignored::TcpPartial));
        let learned = s.answer(&tcp(true, 105, false, &stream[5..]), now).unwrap();
        assert_eq!(learned.len(), 1, "only the message that starts in this segment: {learned:?}");
        assert_eq!(learned[0].address, "192.0.2.2".parse::<IpAddr>().unwrap());
    }

    #[test]
    fn garbage_is_malformed() {
        for junk in [&[][..], &[0x45][..], &[0x60; 39][..], &[0x45, 0, 0, 20, 0, 0, 0, 0, 64, 17][..]] {
            assert_eq!(parse_packet(junk).err(), Some(Ignored::Malformed));
        }
        let bad_dns = udp_packet(DNS, 53, POD, 1, &[1, 2, 3]);
        assert_eq!(dns_message(&parse_packet(&bad_dns).unwrap()).err(), Some(Ignored::Malformed));
    }

    #[test]
    fn pending_queries_are_bounded_per_pod_and_in_all() {
        let now = Instant::now();
        let ask = |s: &mut Snooper, pod: &str, port: u16, id: u16, at: Instant| {
            let b = udp_packet(pod, port, DNS, 53, &query(id, "a.example.com.", RecordType::A).to_vec().unwrap());
            s.query(&parse_packet(&b).unwrap(), at)
        };
        // Per pod: the pod's queries beyond the cap are not tracked; another pod's are.
        let mut s = Snooper::new();
        for i in 0..MAX_PENDING_PER_POD {
            ask(&mut s, POD, 1000 + i as u16, 1, now).unwrap();
        }
        assert_eq!(ask(&mut s, POD, 999, 1, now), Err(Ignored::PodPendingFull));
        assert_eq!(ask(&mut s, "198.18.1.3", 999, 1, now), Ok(1));
        // Once the pod's queries expired it may ask again (expiry needs no scan).
        assert_eq!(ask(&mut s, POD, 999, 1, now + QUERY_LIFETIME), Ok(1));
        assert_eq!(s.pending(), 1, "the expired ones are gone");

        // In all: the oldest query is forgotten for a new one, and counted.
        let mut s = Snooper::with_limits(4, 4);
        for (i, pod) in ["198.18.1.1", "198.18.1.2", "198.18.1.3", "198.18.1.4", "198.18.1.5"].iter().enumerate() {
            ask(&mut s, pod, 1, 1, now + Duration::from_millis(i as u64)).unwrap();
        }
        assert_eq!(s.pending(), 4);
        assert_eq!(s.dropped().pending_evicted, 1);
        // The first pod's query is the one gone: its answer no longer matches.
        let a = udp_packet(DNS, 53, "198.18.1.1", 1, &a_answer(1, "a.example.com.", "192.0.2.1").to_vec().unwrap());
        assert_eq!(s.answer(&parse_packet(&a).unwrap(), now), Err(Ignored::Unmatched));
        let a = udp_packet(DNS, 53, "198.18.1.5", 1, &a_answer(1, "a.example.com.", "192.0.2.1").to_vec().unwrap());
        assert!(s.answer(&parse_packet(&a).unwrap(), now).is_ok());
        assert_eq!(s.per_pod.len(), 3, "per-pod counts follow evictions and answers: {:?}", s.per_pod);
    }

    #[test]
    fn cname_chains_are_cut_and_loops_end() {
        let mut answers = Vec::new();
        let link = |i: usize| format!("n{i}.example.com.");
        for i in 0..40 {
            answers.push(Record::from_rdata(name(&link(i)), 60, RData::CNAME(CNAME(name(&link(i + 1))))));
        }
        answers.push(Record::from_rdata(name(&link(40)), 60, RData::A(A("192.0.2.40".parse().unwrap()))));
        answers.push(Record::from_rdata(name(&link(3)), 60, RData::A(A("192.0.2.3".parse().unwrap()))));
        let mut s = Snooper::new();
        let learned = exchange(
            &mut s,
            &query(5, &link(0), RecordType::A),
            &response(5, &link(0), RecordType::A, answers.clone()),
        )
        .unwrap();
        assert_eq!(learned.len(), 1, "only the address within the first {MAX_CNAME_CHAIN} links");
        assert_eq!(learned[0].names.len(), MAX_CNAME_CHAIN + 1);
        assert_eq!(s.dropped().cname_chains_cut, 1);
        // A loop ends without a cut.
        let looped = vec![
            Record::from_rdata(name("a.example.com."), 60, RData::CNAME(CNAME(name("b.example.com.")))),
            Record::from_rdata(name("b.example.com."), 60, RData::CNAME(CNAME(name("a.example.com.")))),
            Record::from_rdata(name("b.example.com."), 60, RData::A(A("192.0.2.9".parse().unwrap()))),
        ];
        let mut s = Snooper::new();
        let learned = exchange(
            &mut s,
            &query(6, "a.example.com.", RecordType::A),
            &response(6, "a.example.com.", RecordType::A, looped),
        )
        .unwrap();
        assert_eq!(learned.len(), 1);
        assert_eq!(s.dropped().cname_chains_cut, 0);
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
            if let Ok(p) = parse_packet(&b) {
                let _ = snooper.query(&p, now);
                let reply = Packet { src: p.dst, dst: p.src, sport: p.dport, dport: p.sport, ..p.clone() };
                let _ = snooper.answer(&reply, now);
                let synced = Packet { syn: true, payload: &[], ..reply.clone() };
                let _ = snooper.answer(&synced, now);
                let _ = snooper.answer(&Packet { seq: reply.seq.wrapping_add(1), ..reply.clone() }, now);
                if let Ok(mut m) = dns_message(&p) {
                    m.metadata.message_type = MessageType::Query;
                    let _ = snooper.query_message(&p, &m, now);
                    m.metadata.message_type = MessageType::Response;
                    let _ = snooper.answer_message(&reply, &m, now);
                }
            }
        }
    }

    /// Writes the fuzz target's seed corpus (`fuzz/seeds/`): valid queries and answers
    /// (CNAME chain, AAAA, TCP framing). Run by `fuzz/run.sh`.
    #[test]
    #[ignore = "writes fuzz/seeds; run by fuzz/run.sh"]
    fn write_fuzz_seeds() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/seeds");
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
