//! A rule of egressd's table as a typed value: matches, then statements, then at most
//! one verdict, and a comment — one variant for each phrase of the vocabulary the
//! compiler writes (listed in [`super::wire`]).
//!
//! [`Rule`]'s `Display` is the nft syntax (`egressd render`, the goldens, the `nft`
//! fallback) and its `FromStr` reads that syntax back; [`super::wire`] encodes a value
//! as kernel expressions. A value that prints the text `t` reads back from `t`, and
//! reading the compiler's text prints it unchanged (the tests check both).

use std::fmt;
use std::net::IpAddr;

use ipnet::IpNet;

mod read;
pub use read::parse_all;

/// A name or text in a rule (a set, chain or counter name, a comment, a log prefix):
/// inline up to 24 bytes, as most are, so building a rule allocates little.
pub type Name = compact_str::CompactString;

/// A rule's matches: most rules have one or two, held inline (one allocation per rule:
/// a chain of 100k rules costs ~1.8 times its text, bench/FINDINGS.md).
pub type Matches = smallvec::SmallVec<[Match; 2]>;

/// A rule's statements, inline up to two (a counter and a named counter).
pub type Statements = smallvec::SmallVec<[Statement; 2]>;

/// A rule: `matches`, `statements`, `verdict`, `comment`, written in that order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Rule {
    /// What a packet must match, in order.
    pub matches: Matches,
    /// What is done to a matching packet, in order.
    pub statements: Statements,
    /// Where it goes then (none: on to the next rule).
    pub verdict: Option<Verdict>,
    /// `comment "…"` (no `"` inside).
    pub comment: Option<Name>,
}

/// An address family's keyword: `ip` or `ip6`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// `ip`.
    V4,
    /// `ip6`.
    V6,
}

/// `saddr` or `daddr`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddrField {
    /// The source address.
    Saddr,
    /// The destination address.
    Daddr,
}

/// `sport` or `dport`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PortField {
    /// The source port.
    Sport,
    /// The destination port.
    Dport,
}

/// A transport protocol with ports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Proto {
    /// `tcp`.
    Tcp,
    /// `udp`.
    Udp,
    /// `sctp`.
    Sctp,
}

/// The packet's mark (`meta`) or its connection's (`ct`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MarkOf {
    /// `meta mark`.
    Packet,
    /// `ct mark`.
    Conn,
}

/// `==` or `!=`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cmp {
    /// `==`.
    Eq,
    /// `!=`.
    Neq,
}

/// A connection's direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// `original`.
    Original,
    /// `reply`.
    Reply,
}

/// The connection states the compiler matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CtState {
    /// `new`.
    New,
    /// `established`.
    Established,
}

/// The ICMPv6 types of neighbour discovery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Icmpv6Type {
    /// `nd-router-solicit` (133).
    RouterSolicit,
    /// `nd-router-advert` (134).
    RouterAdvert,
    /// `nd-neighbor-solicit` (135).
    NeighborSolicit,
    /// `nd-neighbor-advert` (136).
    NeighborAdvert,
    /// `nd-redirect` (137).
    Redirect,
}

/// A match: the packet goes on to the next one only when it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs, reason = "a variant's doc is its syntax, which names its fields")]
pub enum Match {
    /// `meta nfproto ipv4|ipv6`.
    Nfproto(Family),
    /// `ip|ip6 saddr|daddr <address or prefix>` (a full-length prefix is written as
    /// its address).
    Addr { family: Family, field: AddrField, net: IpNet },
    /// `ip|ip6 saddr|daddr { <address or prefix>, … }`: any of them (an anonymous
    /// interval set, which only the `nft` program writes).
    AddrAnyOf { family: Family, field: AddrField, nets: Vec<IpNet> },
    /// `ip|ip6 saddr|daddr [!=] @set`.
    AddrIn { family: Family, field: AddrField, set: Name, negated: bool },
    /// `ip|ip6 saddr|daddr and <mask> @set`: the address masked, looked up.
    AddrMaskedIn { family: Family, field: AddrField, mask: IpAddr, set: Name },
    /// `meta l4proto <proto>`.
    Proto(Proto),
    /// `meta l4proto { <proto>, … }`.
    ProtoIn(Vec<Proto>),
    /// `tcp|udp|sctp dport <port>`.
    Dport(Proto, u16),
    /// `meta l4proto . th dport { <proto> . <port>, … }`.
    ProtoPortIn(Vec<(Proto, u16)>),
    /// `meta l4proto . th dport . ip|ip6 daddr @set` (an interval concatenation).
    ProtoPortAddrIn { family: Family, set: Name },
    /// `th sport|dport <port>`, after a protocol match.
    ThPort(PortField, u16),
    /// `@th,<bit offset>,<bits> <value>`: raw transport header bits.
    ThBits { offset: u32, bits: u32, value: u32 },
    /// `tcp flags syn`: the SYN bit set.
    TcpSyn,
    /// `icmpv6 type { <type>, … }`.
    Icmpv6Types(Vec<Icmpv6Type>),
    /// `meta|ct mark and <mask> ==|!= <value>`.
    Mark { of: MarkOf, mask: u32, cmp: Cmp, value: u32 },
    /// `ct mark and <mask> [or <bits>] @set`.
    CtMarkIn { mask: u32, or: Option<u32>, set: Name },
    /// `ct state new|established`.
    CtState(CtState),
    /// `ct direction original|reply`.
    CtDirection(Direction),
    /// `ct original proto-dst <port>`.
    CtOriginalProtoDst(u16),
    /// `ct original ip|ip6 saddr|daddr @set`.
    CtOriginalAddrIn { family: Family, field: AddrField, set: Name },
    /// `rt ip|ip6 nexthop [!=] @set`.
    RtNexthopIn { family: Family, set: Name, negated: bool },
    /// `fib saddr . iif oif missing`: the source is not routed back through the input
    /// interface.
    FibSaddrIifMissing,
    /// `numgen random mod 1 offset <hi> . numgen random mod 1 offset <lo> . ip|ip6 daddr
    /// @set`: the destination in one tag's share of a shared set ([`super::Slot`]).
    TaggedIn { tag: u64, family: Family, set: Name },
}

/// A statement: done to the packet, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs, reason = "a variant's doc is its syntax, which names its fields")]
pub enum Statement {
    /// `ip|ip6 dscp set <0-63>`.
    Dscp(Family, u8),
    /// `meta|ct mark set meta|ct mark and <keep> or <bits>` (the same mark both sides).
    SetMark { of: MarkOf, keep: u32, or: u32 },
    /// `ct mark set ct mark or <bits>`.
    CtMarkOr(u32),
    /// `tcp option maxseg size set rt mtu`, after a TCP match.
    MssToRoute,
    /// `notrack`.
    Notrack,
    /// `tproxy ip|ip6 to :<port>`, after a protocol match.
    Tproxy(Family, u16),
    /// `snat ip|ip6 to <address>`.
    SnatTo(IpAddr),
    /// `snat ip|ip6 to ip|ip6 saddr`: the source address kept, the connection NATed.
    SnatToSaddr(Family),
    /// `limit rate [over] <n>/second burst <n> packets`.
    Limit { rate: u64, burst: u32, over: bool },
    /// `log prefix "<prefix>" group <n> [queue-threshold <n>]`.
    Log { prefix: Name, group: u16, queue_threshold: Option<u16> },
    /// `counter`.
    Counter,
    /// `counter name "<name>"`.
    NamedCounter(Name),
    /// `meta priority set ip|ip6 saddr|daddr map @map`: the packet's priority set to
    /// what the address maps to (no element: the rule goes no further).
    PriorityFromMap { family: Family, field: AddrField, map: Name },
    /// `meta priority set none`: the packet's priority back to 0.
    PriorityNone,
}

/// A verdict: where the packet goes.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs, reason = "a variant's doc is its syntax, which names its fields")]
pub enum Verdict {
    /// `accept`.
    Accept,
    /// `drop`.
    Drop,
    /// `return`.
    Return,
    /// `jump <chain>`.
    Jump(Name),
    /// `goto <chain>`.
    Goto(Name),
    /// `ip|ip6 saddr|daddr vmap @map`: the verdict the address maps to.
    Map { family: Family, field: AddrField, map: Name },
    /// `meta priority vmap @map`: the verdict the packet's priority maps to.
    PriorityMap(Name),
}

/// Why a text is not a rule of the vocabulary: the word where reading stopped (empty
/// at the end) and what was expected there.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("at `{word}`: {expected} expected")]
pub struct ParseError {
    /// The word.
    pub word: String,
    /// What the vocabulary has there.
    pub expected: &'static str,
}

impl Rule {
    /// An empty rule (no match, no statement, no verdict).
    pub fn new() -> Self {
        Self::default()
    }

    /// With `m` as its next match.
    pub fn when(mut self, m: Match) -> Self {
        self.matches.push(m);
        self
    }

    /// With `m`, if any, as its next match.
    pub fn when_some(mut self, m: Option<Match>) -> Self {
        self.matches.extend(m);
        self
    }

    /// With `s` as its next statement.
    pub fn then(mut self, s: Statement) -> Self {
        self.statements.push(s);
        self
    }

    /// With the verdict `v`.
    pub fn verdict(mut self, v: Verdict) -> Self {
        self.verdict = Some(v);
        self
    }

    /// The sets, maps and chains the rule names (`@set`, `vmap @map`, `jump` and
    /// `goto` targets), in order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        let sets = self.matches.iter().filter_map(|m| match m {
            Match::AddrIn { set, .. }
            | Match::AddrMaskedIn { set, .. }
            | Match::ProtoPortAddrIn { set, .. }
            | Match::CtMarkIn { set, .. }
            | Match::CtOriginalAddrIn { set, .. }
            | Match::RtNexthopIn { set, .. }
            | Match::TaggedIn { set, .. } => Some(set.as_str()),
            _ => None,
        });
        let maps = self.statements.iter().filter_map(|s| match s {
            Statement::PriorityFromMap { map, .. } => Some(map.as_str()),
            _ => None,
        });
        let verdict = match &self.verdict {
            Some(Verdict::Jump(c) | Verdict::Goto(c)) => Some(c.as_str()),
            Some(Verdict::Map { map, .. } | Verdict::PriorityMap(map)) => Some(map.as_str()),
            _ => None,
        };
        sets.chain(maps).chain(verdict)
    }

    /// With the comment `c` (no `"` inside).
    pub fn comment(mut self, c: impl Into<Name>) -> Self {
        self.comment = Some(c.into());
        self
    }
}

impl Match {
    /// `ip|ip6 saddr @set`.
    pub fn saddr_in(family: Family, set: impl Into<Name>) -> Self {
        Match::AddrIn { family, field: AddrField::Saddr, set: set.into(), negated: false }
    }

    /// `ip|ip6 daddr @set`.
    pub fn daddr_in(family: Family, set: impl Into<Name>) -> Self {
        Match::AddrIn { family, field: AddrField::Daddr, set: set.into(), negated: false }
    }

    /// `meta|ct mark and <mask> != 0x00000000`: some bit of `mask` set.
    pub fn mark_any(of: MarkOf, mask: u32) -> Self {
        Match::Mark { of, mask, cmp: Cmp::Neq, value: 0 }
    }
}

impl Verdict {
    /// `jump <chain>`.
    pub fn jump(chain: impl Into<Name>) -> Self {
        Verdict::Jump(chain.into())
    }

    /// `goto <chain>`.
    pub fn goto(chain: impl Into<Name>) -> Self {
        Verdict::Goto(chain.into())
    }
}

impl Family {
    /// Of an address.
    pub fn of(ip: IpAddr) -> Self {
        if ip.is_ipv6() { Family::V6 } else { Family::V4 }
    }

    /// The nft keyword (`ip`, `ip6`).
    pub fn word(self) -> &'static str {
        match self {
            Family::V4 => "ip",
            Family::V6 => "ip6",
        }
    }
}

impl Proto {
    /// The nft keyword.
    pub fn word(self) -> &'static str {
        match self {
            Proto::Tcp => "tcp",
            Proto::Udp => "udp",
            Proto::Sctp => "sctp",
        }
    }

    /// The IP protocol number.
    pub fn number(self) -> u8 {
        match self {
            Proto::Tcp => 6,
            Proto::Udp => 17,
            Proto::Sctp => 132,
        }
    }

    pub(super) fn from_word(w: &str) -> Option<Self> {
        match w {
            "tcp" => Some(Proto::Tcp),
            "udp" => Some(Proto::Udp),
            "sctp" => Some(Proto::Sctp),
            _ => None,
        }
    }
}

impl Icmpv6Type {
    pub(super) const ALL: [(Icmpv6Type, &'static str, u8); 5] = [
        (Icmpv6Type::RouterSolicit, "nd-router-solicit", 133),
        (Icmpv6Type::RouterAdvert, "nd-router-advert", 134),
        (Icmpv6Type::NeighborSolicit, "nd-neighbor-solicit", 135),
        (Icmpv6Type::NeighborAdvert, "nd-neighbor-advert", 136),
        (Icmpv6Type::Redirect, "nd-redirect", 137),
    ];

    /// The ICMPv6 type number.
    pub fn number(self) -> u8 {
        Self::ALL.iter().find(|(t, ..)| *t == self).map_or(0, |(_, _, n)| *n)
    }

    fn word(self) -> &'static str {
        Self::ALL.iter().find(|(t, ..)| *t == self).map_or("", |(_, w, _)| w)
    }
}

fn mark_word(of: MarkOf) -> &'static str {
    match of {
        MarkOf::Packet => "meta",
        MarkOf::Conn => "ct",
    }
}

fn field_word(f: AddrField) -> &'static str {
    match f {
        AddrField::Saddr => "saddr",
        AddrField::Daddr => "daddr",
    }
}

fn port_word(f: PortField) -> &'static str {
    match f {
        PortField::Sport => "sport",
        PortField::Dport => "dport",
    }
}

/// A list as nft writes it: `{ a, b }`.
fn braced<T>(f: &mut fmt::Formatter<'_>, items: &[T], item: impl Fn(&T) -> String) -> fmt::Result {
    let items: Vec<String> = items.iter().map(item).collect();
    write!(f, "{{ {} }}", items.join(", "))
}

impl fmt::Display for Match {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Match::Nfproto(Family::V4) => write!(f, "meta nfproto ipv4"),
            Match::Nfproto(Family::V6) => write!(f, "meta nfproto ipv6"),
            Match::Addr { family, field, net } if net.prefix_len() == net.max_prefix_len() => {
                write!(f, "{} {} {}", family.word(), field_word(*field), net.addr())
            }
            Match::Addr { family, field, net } => write!(f, "{} {} {net}", family.word(), field_word(*field)),
            Match::AddrAnyOf { family, field, nets } => {
                write!(f, "{} {} ", family.word(), field_word(*field))?;
                braced(
                    f,
                    nets,
                    |n| if n.prefix_len() == n.max_prefix_len() { n.addr().to_string() } else { n.to_string() },
                )
            }
            Match::AddrIn { family, field, set, negated } => {
                let not = if *negated { "!= " } else { "" };
                write!(f, "{} {} {not}@{set}", family.word(), field_word(*field))
            }
            Match::AddrMaskedIn { family, field, mask, set } => {
                write!(f, "{} {} and {mask} @{set}", family.word(), field_word(*field))
            }
            Match::Proto(p) => write!(f, "meta l4proto {}", p.word()),
            Match::ProtoIn(ps) => {
                write!(f, "meta l4proto ")?;
                braced(f, ps, |p| p.word().to_string())
            }
            Match::Dport(p, port) => write!(f, "{} dport {port}", p.word()),
            Match::ProtoPortIn(items) => {
                write!(f, "meta l4proto . th dport ")?;
                braced(f, items, |(p, port)| format!("{} . {port}", p.word()))
            }
            Match::ProtoPortAddrIn { family, set } => {
                write!(f, "meta l4proto . th dport . {} daddr @{set}", family.word())
            }
            Match::ThPort(field, port) => write!(f, "th {} {port}", port_word(*field)),
            Match::ThBits { offset, bits, value } => write!(f, "@th,{offset},{bits} {value}"),
            Match::TcpSyn => write!(f, "tcp flags syn"),
            Match::Icmpv6Types(types) => {
                write!(f, "icmpv6 type ")?;
                braced(f, types, |t| t.word().to_string())
            }
            Match::Mark { of, mask, cmp, value } => {
                let op = if *cmp == Cmp::Eq { "==" } else { "!=" };
                write!(f, "{} mark and {mask:#010x} {op} {value:#010x}", mark_word(*of))
            }
            Match::CtMarkIn { mask, or: None, set } => write!(f, "ct mark and {mask:#010x} @{set}"),
            Match::CtMarkIn { mask, or: Some(or), set } => write!(f, "ct mark and {mask:#010x} or {or:#010x} @{set}"),
            Match::CtState(CtState::New) => write!(f, "ct state new"),
            Match::CtState(CtState::Established) => write!(f, "ct state established"),
            Match::CtDirection(Direction::Original) => write!(f, "ct direction original"),
            Match::CtDirection(Direction::Reply) => write!(f, "ct direction reply"),
            Match::CtOriginalProtoDst(port) => write!(f, "ct original proto-dst {port}"),
            Match::CtOriginalAddrIn { family, field, set } => {
                write!(f, "ct original {} {} @{set}", family.word(), field_word(*field))
            }
            Match::RtNexthopIn { family, set, negated } => {
                let not = if *negated { "!= " } else { "" };
                write!(f, "rt {} nexthop {not}@{set}", family.word())
            }
            Match::FibSaddrIifMissing => write!(f, "fib saddr . iif oif missing"),
            Match::TaggedIn { tag, family, set } => write!(
                f,
                "numgen random mod 1 offset {} . numgen random mod 1 offset {} . {} daddr @{set}",
                tag >> 32,
                *tag as u32,
                family.word()
            ),
        }
    }
}

impl fmt::Display for Statement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Statement::Dscp(family, d) => write!(f, "{} dscp set {d}", family.word()),
            Statement::SetMark { of, keep, or } => {
                let m = mark_word(*of);
                write!(f, "{m} mark set {m} mark and {keep:#010x} or {or:#010x}")
            }
            Statement::CtMarkOr(bits) => write!(f, "ct mark set ct mark or {bits:#010x}"),
            Statement::MssToRoute => write!(f, "tcp option maxseg size set rt mtu"),
            Statement::Notrack => write!(f, "notrack"),
            Statement::Tproxy(family, port) => write!(f, "tproxy {} to :{port}", family.word()),
            Statement::SnatTo(ip) => write!(f, "snat {} to {ip}", Family::of(*ip).word()),
            Statement::SnatToSaddr(family) => write!(f, "snat {0} to {0} saddr", family.word()),
            Statement::Limit { rate, burst, over } => {
                let over = if *over { "over " } else { "" };
                write!(f, "limit rate {over}{rate}/second burst {burst} packets")
            }
            Statement::Log { prefix, group, queue_threshold } => {
                write!(f, "log prefix \"{prefix}\" group {group}")?;
                match queue_threshold {
                    Some(q) => write!(f, " queue-threshold {q}"),
                    None => Ok(()),
                }
            }
            Statement::Counter => write!(f, "counter"),
            Statement::NamedCounter(name) => write!(f, "counter name \"{name}\""),
            Statement::PriorityFromMap { family, field, map } => {
                write!(f, "meta priority set {} {} map @{map}", family.word(), field_word(*field))
            }
            Statement::PriorityNone => write!(f, "meta priority set none"),
        }
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Verdict::Accept => write!(f, "accept"),
            Verdict::Drop => write!(f, "drop"),
            Verdict::Return => write!(f, "return"),
            Verdict::Jump(chain) => write!(f, "jump {chain}"),
            Verdict::Goto(chain) => write!(f, "goto {chain}"),
            Verdict::Map { family, field, map } => write!(f, "{} {} vmap @{map}", family.word(), field_word(*field)),
            Verdict::PriorityMap(map) => write!(f, "meta priority vmap @{map}"),
        }
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut sep = "";
        let mut part = |f: &mut fmt::Formatter<'_>, item: &dyn fmt::Display| {
            let r = write!(f, "{sep}{item}");
            sep = " ";
            r
        };
        for m in &self.matches {
            part(f, m)?;
        }
        for s in &self.statements {
            part(f, s)?;
        }
        if let Some(v) = &self.verdict {
            part(f, v)?;
        }
        if let Some(c) = &self.comment {
            part(f, &format_args!("comment \"{c}\""))?;
        }
        Ok(())
    }
}

/// A rule equals a text that prints the same (for tests and tools).
impl PartialEq<str> for Rule {
    fn eq(&self, text: &str) -> bool {
        let printed = self.to_string();
        printed == text
    }
}

impl PartialEq<&str> for Rule {
    fn eq(&self, text: &&str) -> bool {
        *self == **text
    }
}

impl PartialEq<String> for Rule {
    fn eq(&self, text: &String) -> bool {
        *self == *text.as_str()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(text: &str) -> Rule {
        text.parse().unwrap_or_else(|e| panic!("{text}: {e}"))
    }

    #[test]
    fn a_rule_reads_as_matches_statements_verdict_and_comment() {
        let r =
            read(r#"ip daddr 192.0.2.0/24 tcp dport 443 counter name "fw-allow" counter accept comment "egress[0]""#);
        assert_eq!(
            r,
            Rule {
                matches: smallvec::smallvec![
                    Match::Addr { family: Family::V4, field: AddrField::Daddr, net: "192.0.2.0/24".parse().unwrap() },
                    Match::Dport(Proto::Tcp, 443),
                ],
                statements: smallvec::smallvec![Statement::NamedCounter("fw-allow".into()), Statement::Counter],
                verdict: Some(Verdict::Accept),
                comment: Some("egress[0]".into()),
            }
        );
        let tagged = read("numgen random mod 1 offset 3 . numgen random mod 1 offset 4 . ip6 daddr @dns-v6 accept");
        assert_eq!(
            tagged.matches[..],
            [Match::TaggedIn { tag: (3 << 32) | 4, family: Family::V6, set: "dns-v6".into() }]
        );
        assert_eq!(read("ip saddr vmap @pods").verdict.unwrap().to_string(), "ip saddr vmap @pods");
        let dispatch = read("meta priority set ip6 saddr map @pods meta priority vmap @ns");
        assert_eq!(
            dispatch.statements[..],
            [Statement::PriorityFromMap { family: Family::V6, field: AddrField::Saddr, map: "pods".into() }]
        );
        assert_eq!(dispatch.verdict, Some(Verdict::PriorityMap("ns".into())));
        assert_eq!(dispatch.names().collect::<Vec<_>>(), ["pods", "ns"]);
        assert_eq!(read("meta priority set none").statements[..], [Statement::PriorityNone]);
    }

    #[test]
    fn what_is_not_in_the_vocabulary_or_out_of_order_is_refused_where_it_stops() {
        for (text, word) in [
            ("ip daddr 198.51.100.1/24 drop", "198.51.100.1/24"),
            ("ip dscp set 64 return", "64"),
            ("meta l4proto { udp, icmp } accept", "udp icmp"),
            ("ct state related accept", "related"),
            ("fib daddr type local accept", "fib"),
            ("limit rate 10/minute accept", "10/minute"),
            ("dnat ip to 192.0.2.1", "dnat"),
            ("snat ip to 2001:db8::1", "2001:db8::1"),
            ("meta mark set 0x1", "0x1"),
            ("accept drop", "drop"),
            (r#"comment "x" accept"#, "accept"),
            ("counter ip daddr @a accept", "ip"),
            (r#"log prefix "x" drop"#, "drop"),
        ] {
            let err = text.parse::<Rule>().unwrap_err();
            assert_eq!(err.word, word, "{text}: {err}");
        }
    }

    /// Every rule of the golden tables reads back and prints as it was written.
    #[test]
    fn the_compilers_rules_print_as_they_were_written() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/golden");
        let mut seen = 0;
        for case in std::fs::read_dir(dir).unwrap() {
            let text = std::fs::read_to_string(case.unwrap().path().join("expected.txt")).unwrap();
            let mut in_chain = false;
            for line in text.lines() {
                let t = line.trim();
                if t.starts_with("chain ") {
                    in_chain = true;
                } else if t == "}" {
                    in_chain = false;
                } else if in_chain && !t.is_empty() && !t.starts_with("type ") {
                    assert_eq!(read(t).to_string(), t);
                    seen += 1;
                }
            }
        }
        assert!(seen > 100, "only {seen} rules found in the goldens");
    }

    mod printed {
        use super::*;
        use proptest::prelude::*;

        fn family() -> impl Strategy<Value = Family> {
            prop_oneof![Just(Family::V4), Just(Family::V6)]
        }
        fn field() -> impl Strategy<Value = AddrField> {
            prop_oneof![Just(AddrField::Saddr), Just(AddrField::Daddr)]
        }
        fn proto() -> impl Strategy<Value = Proto> {
            prop_oneof![Just(Proto::Tcp), Just(Proto::Udp), Just(Proto::Sctp)]
        }
        fn name() -> impl Strategy<Value = Name> {
            "[a-z][a-z0-9-]{0,12}".prop_map(Name::from)
        }
        fn of() -> impl Strategy<Value = MarkOf> {
            prop_oneof![Just(MarkOf::Packet), Just(MarkOf::Conn)]
        }
        fn net() -> impl Strategy<Value = (Family, IpNet)> {
            prop_oneof![
                (any::<u32>(), 0u8..=32).prop_map(|(a, l)| {
                    let net = IpNet::new(IpAddr::from(a.to_be_bytes()), l).unwrap().trunc();
                    (Family::V4, net)
                }),
                (any::<u128>(), 0u8..=128).prop_map(|(a, l)| {
                    let net = IpNet::new(IpAddr::from(a.to_be_bytes()), l).unwrap().trunc();
                    (Family::V6, net)
                }),
            ]
        }

        fn a_match() -> impl Strategy<Value = Match> {
            prop_oneof![
                family().prop_map(Match::Nfproto),
                (net(), field()).prop_map(|((family, net), field)| Match::Addr { family, field, net }),
                (family(), field(), prop::collection::vec(net(), 1..4)).prop_map(|(family, field, nets)| {
                    let nets: Vec<IpNet> = nets.into_iter().filter(|(f, _)| *f == family).map(|(_, n)| n).collect();
                    let nets = if nets.is_empty() {
                        vec![IpNet::from(if family == Family::V4 {
                            IpAddr::from([192, 0, 2, 1])
                        } else {
                            IpAddr::from([0x2001, 0xdb8, 0, 0, 0, 0, 0, 1])
                        })]
                    } else {
                        nets
                    };
                    Match::AddrAnyOf { family, field, nets }
                }),
                (family(), field(), name(), any::<bool>()).prop_map(|(family, field, set, negated)| Match::AddrIn {
                    family,
                    field,
                    set,
                    negated
                }),
                (net(), field(), name()).prop_map(|((family, net), field, set)| Match::AddrMaskedIn {
                    family,
                    field,
                    mask: net.netmask(),
                    set
                }),
                proto().prop_map(Match::Proto),
                prop::collection::vec(proto(), 1..4).prop_map(Match::ProtoIn),
                (proto(), any::<u16>()).prop_map(|(p, port)| Match::Dport(p, port)),
                prop::collection::vec((proto(), any::<u16>()), 1..4).prop_map(Match::ProtoPortIn),
                (family(), name()).prop_map(|(family, set)| Match::ProtoPortAddrIn { family, set }),
                (prop_oneof![Just(PortField::Sport), Just(PortField::Dport)], any::<u16>())
                    .prop_map(|(f, p)| Match::ThPort(f, p)),
                (any::<u32>(), any::<u32>(), any::<u32>()).prop_map(|(offset, bits, value)| Match::ThBits {
                    offset,
                    bits,
                    value
                }),
                Just(Match::TcpSyn),
                prop::collection::vec(prop::sample::select(Icmpv6Type::ALL.map(|(t, ..)| t).to_vec()), 1..5)
                    .prop_map(Match::Icmpv6Types),
                (of(), any::<u32>(), any::<bool>(), any::<u32>()).prop_map(|(of, mask, eq, value)| Match::Mark {
                    of,
                    mask,
                    cmp: if eq { Cmp::Eq } else { Cmp::Neq },
                    value
                }),
                (any::<u32>(), any::<Option<u32>>(), name()).prop_map(|(mask, or, set)| Match::CtMarkIn {
                    mask,
                    or,
                    set
                }),
                prop_oneof![Just(CtState::New), Just(CtState::Established)].prop_map(Match::CtState),
                prop_oneof![Just(Direction::Original), Just(Direction::Reply)].prop_map(Match::CtDirection),
                any::<u16>().prop_map(Match::CtOriginalProtoDst),
                (family(), field(), name()).prop_map(|(family, field, set)| Match::CtOriginalAddrIn {
                    family,
                    field,
                    set
                }),
                (family(), name(), any::<bool>()).prop_map(|(family, set, negated)| Match::RtNexthopIn {
                    family,
                    set,
                    negated
                }),
                Just(Match::FibSaddrIifMissing),
                (any::<u64>(), family(), name()).prop_map(|(tag, family, set)| Match::TaggedIn { tag, family, set }),
            ]
        }

        fn a_statement() -> impl Strategy<Value = Statement> {
            prop_oneof![
                (family(), 0u8..64).prop_map(|(f, d)| Statement::Dscp(f, d)),
                (of(), any::<u32>(), any::<u32>()).prop_map(|(of, keep, or)| Statement::SetMark { of, keep, or }),
                any::<u32>().prop_map(Statement::CtMarkOr),
                Just(Statement::MssToRoute),
                Just(Statement::Notrack),
                (family(), any::<u16>()).prop_map(|(f, p)| Statement::Tproxy(f, p)),
                net().prop_map(|(_, n)| Statement::SnatTo(n.addr())),
                family().prop_map(Statement::SnatToSaddr),
                (any::<u64>(), any::<u32>(), any::<bool>()).prop_map(|(rate, burst, over)| Statement::Limit {
                    rate,
                    burst,
                    over
                }),
                ("[a-z -]{0,20}".prop_map(Name::from), any::<u16>(), any::<Option<u16>>())
                    .prop_map(|(prefix, group, queue_threshold)| { Statement::Log { prefix, group, queue_threshold } }),
                Just(Statement::Counter),
                name().prop_map(Statement::NamedCounter),
                (family(), field(), name()).prop_map(|(family, field, map)| Statement::PriorityFromMap {
                    family,
                    field,
                    map
                }),
                Just(Statement::PriorityNone),
            ]
        }

        fn a_verdict() -> impl Strategy<Value = Verdict> {
            prop_oneof![
                Just(Verdict::Accept),
                Just(Verdict::Drop),
                Just(Verdict::Return),
                name().prop_map(Verdict::Jump),
                name().prop_map(Verdict::Goto),
                (family(), field(), name()).prop_map(|(family, field, map)| Verdict::Map { family, field, map }),
                name().prop_map(Verdict::PriorityMap),
            ]
        }

        proptest! {
            /// Any rule value prints as text that reads back as the same value.
            #[test]
            fn any_rule_reads_back_from_its_text(
                matches in prop::collection::vec(a_match(), 0..5).prop_map(Matches::from_vec),
                statements in prop::collection::vec(a_statement(), 0..4).prop_map(Statements::from_vec),
                verdict in prop::option::of(a_verdict()),
                comment in prop::option::of("[a-z0-9\\[\\]. -]{0,20}".prop_map(Name::from)),
            ) {
                let rule = Rule { matches, statements, verdict, comment };
                let text = rule.to_string();
                prop_assert_eq!(text.parse::<Rule>(), Ok(rule), "{}", text);
            }
        }
    }
}
#[cfg(test)]
mod sizes {
    use super::*;

    /// A firewall rule (a destination, a port; two counters; a verdict; a comment) is
    /// one allocation of at most 240 bytes once boxed in its chain: no part spills to
    /// the heap.
    #[test]
    fn a_firewall_rule_is_one_small_allocation() {
        let r: Rule =
            r#"ip daddr 192.0.2.0/24 tcp dport 443 counter name "fw-allow" counter drop comment "egress[12..345]""#
                .parse()
                .unwrap();
        assert!(std::mem::size_of::<Rule>() <= 240, "{} bytes", std::mem::size_of::<Rule>());
        assert!(!r.matches.spilled() && !r.statements.spilled());
        let names = [
            r.comment.as_ref(),
            r.statements.iter().find_map(|s| match s {
                Statement::NamedCounter(n) => Some(n),
                _ => None,
            }),
        ];
        assert!(names.iter().flatten().all(|n| !n.is_heap_allocated()));
    }
}
