//! A typed rule ([`crate::nft::rule::Rule`]) as the kernel expressions `nft` 1.0.6
//! generates for it: the same expressions, registers, lengths and byte order, and the
//! family and protocol checks nft adds before a match that needs them.

use std::net::IpAddr;

use super::*;
use crate::nft::rule::{
    self, AddrField, Cmp, CtState, Direction, Family, MarkOf, Match, PortField, Statement, Verdict,
};

/// Why a rule value has no kernel form (each a rule nft refuses too, or would encode
/// otherwise than the rule says).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unencodable {
    /// A match of IPv4 and one of IPv6 in one rule.
    #[error("matches of both IPv4 and IPv6 in one rule")]
    BothFamilies,
    /// `meta nfproto` after a match that set the family.
    #[error("`meta nfproto` after the family is known")]
    FamilyKnown,
    /// Two protocol matches in one rule.
    #[error("two transport protocols in one rule")]
    TwoProtocols,
    /// What needs a transport protocol match before it.
    #[error("`{0}` needs a transport protocol match before it")]
    NoProtocol(&'static str),
    /// `ct original ip|ip6 …` before a match of its family.
    #[error("`ct original {0}` before a match of its family")]
    FamilyUnknown(&'static str),
    /// What only the `nft` program writes.
    #[error("{0} is written by nft, not by the netlink path")]
    Unwritten(&'static str),
    /// A value the phrase cannot hold.
    #[error("{0}")]
    Value(&'static str),
}

/// The expressions of a rule being encoded, with what its matches established.
struct Encoder {
    exprs: Vec<Expr>,
    anon: Vec<AnonSet>,
    family: Option<Family>,
    /// The transport protocol (`Some(0)`: one of a set's).
    l4: Option<u8>,
}

fn nfproto(f: Family) -> u8 {
    match f {
        Family::V4 => NFPROTO_IPV4,
        Family::V6 => NFPROTO_IPV6,
    }
}

/// An address field's offset and length in the network header.
fn addr_at(f: Family, field: AddrField) -> (u32, u32) {
    match (f, field) {
        (Family::V4, AddrField::Saddr) => (12, 4),
        (Family::V4, AddrField::Daddr) => (16, 4),
        (Family::V6, AddrField::Saddr) => (8, 16),
        (Family::V6, AddrField::Daddr) => (24, 16),
    }
}

fn octets(ip: IpAddr) -> Vec<u8> {
    match ip {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    }
}

/// A 32-bit mark as the kernel holds it: host byte order.
fn mark(v: u32) -> Vec<u8> {
    v.to_ne_bytes().to_vec()
}

fn mark_load(of: MarkOf) -> Expr {
    match of {
        MarkOf::Packet => Expr::Meta { key: META_MARK, dreg: REG_1 },
        MarkOf::Conn => Expr::Ct { key: CT_MARK, dreg: REG_1, dir: None },
    }
}

fn lookup(set: &str, invert: bool) -> Expr {
    Expr::Lookup { set: set.to_string(), sreg: REG_1, dreg: None, invert, anon: None }
}

impl Encoder {
    /// The family check `nft` puts before a match of `family` in an `inet` table,
    /// unless the rule has established it.
    fn require_family(&mut self, family: Family) -> Result<(), Unencodable> {
        match self.family {
            Some(f) if f == family => Ok(()),
            Some(_) => Err(Unencodable::BothFamilies),
            None => {
                self.exprs.push(Expr::Meta { key: META_NFPROTO, dreg: REG_1 });
                self.exprs.push(Expr::Cmp { sreg: REG_1, data: vec![nfproto(family)] });
                self.family = Some(family);
                Ok(())
            }
        }
    }

    fn set_l4(&mut self, p: u8) -> Result<(), Unencodable> {
        if self.l4.is_some() {
            return Err(Unencodable::TwoProtocols);
        }
        self.l4 = Some(p);
        Ok(())
    }

    /// `meta l4proto <p>`, as nft generates it (also the dependency of `tcp dport`, …).
    fn l4_match(&mut self, p: u8) -> Result<(), Unencodable> {
        self.set_l4(p)?;
        self.exprs.push(Expr::Meta { key: META_L4PROTO, dreg: REG_1 });
        self.exprs.push(Expr::Cmp { sreg: REG_1, data: vec![p] });
        Ok(())
    }

    fn need_l4(&self, what: &'static str) -> Result<(), Unencodable> {
        if self.l4.is_none() { Err(Unencodable::NoProtocol(what)) } else { Ok(()) }
    }

    /// The transport header's port at `offset` (0 source, 2 destination) equal to `port`.
    fn port_match(&mut self, offset: u32, port: u16) {
        self.exprs.push(Expr::Payload { base: PAYLOAD_TRANSPORT, offset, len: 2, dreg: REG_1 });
        self.exprs.push(Expr::Cmp { sreg: REG_1, data: port.to_be_bytes().to_vec() });
    }

    /// Register 1 looked up in the rule's next anonymous set, `set`.
    fn anon_lookup(&mut self, set: AnonSet) {
        let index = self.anon.len();
        self.exprs.push(Expr::Lookup {
            set: "__set%d".into(),
            sreg: REG_1,
            dreg: None,
            invert: false,
            anon: Some(index),
        });
        self.anon.push(set);
    }

    /// An address field of the family loaded into register 1.
    fn load_addr(&mut self, family: Family, field: AddrField) -> Result<(), Unencodable> {
        self.require_family(family)?;
        let (offset, len) = addr_at(family, field);
        self.exprs.push(Expr::Payload { base: PAYLOAD_NETWORK, offset, len, dreg: REG_1 });
        Ok(())
    }

    /// An address or prefix match, as nft generates it: a prefix on a byte boundary
    /// compares only its bytes, any other (and `/0`) masks the address.
    fn addr_match(&mut self, family: Family, field: AddrField, net: &ipnet::IpNet) -> Result<(), Unencodable> {
        if Family::of(net.addr()) != family {
            return Err(Unencodable::Value("an address of the other family"));
        }
        if net.trunc() != *net {
            return Err(Unencodable::Value("a prefix with host bits set"));
        }
        self.require_family(family)?;
        let (offset, full) = addr_at(family, field);
        let (addr, mask) = (octets(net.addr()), octets(net.netmask()));
        let len = u32::from(net.prefix_len());
        if len > 0 && len % 8 == 0 {
            let n = len / 8;
            self.exprs.push(Expr::Payload { base: PAYLOAD_NETWORK, offset, len: n, dreg: REG_1 });
            self.exprs.push(Expr::Cmp { sreg: REG_1, data: addr[..n as usize].to_vec() });
        } else {
            self.exprs.push(Expr::Payload { base: PAYLOAD_NETWORK, offset, len: full, dreg: REG_1 });
            self.exprs.push(Expr::Bitwise { reg: REG_1, xor: vec![0; mask.len()], mask });
            self.exprs.push(Expr::Cmp { sreg: REG_1, data: addr });
        }
        Ok(())
    }

    /// The expressions of one match. One arm per [`Match`] variant: a table, kept whole
    /// (ARCHITECTURE.md, units).
    fn a_match(&mut self, m: &Match) -> Result<(), Unencodable> {
        let e = &mut self.exprs;
        match m {
            Match::Nfproto(f) => {
                if self.family.is_some() {
                    return Err(Unencodable::FamilyKnown);
                }
                self.require_family(*f)?;
            }
            Match::Addr { family, field, net } => self.addr_match(*family, *field, net)?,
            Match::AddrAnyOf { .. } => return Err(Unencodable::Unwritten("an anonymous set of addresses")),
            Match::AddrIn { family, field, set, negated } => {
                self.load_addr(*family, *field)?;
                self.exprs.push(lookup(set, *negated));
            }
            Match::AddrMaskedIn { family, field, mask, set } => {
                if Family::of(*mask) != *family {
                    return Err(Unencodable::Value("a mask of the other family"));
                }
                self.load_addr(*family, *field)?;
                let mask = octets(*mask);
                self.exprs.push(Expr::Bitwise { reg: REG_1, xor: vec![0; mask.len()], mask });
                self.exprs.push(lookup(set, false));
            }
            Match::Proto(p) => self.l4_match(p.number())?,
            Match::ProtoIn(ps) => {
                self.set_l4(0)?;
                self.exprs.push(Expr::Meta { key: META_L4PROTO, dreg: REG_1 });
                let elements = ps.iter().map(|p| vec![p.number()]).collect();
                self.anon_lookup(AnonSet { key_type: 12, key_len: 1, udata: UDATA_L4PROTO, elements });
            }
            Match::Dport(p, port) => {
                self.l4_match(p.number())?;
                self.port_match(2, *port);
            }
            Match::ProtoPortIn(items) => {
                self.set_l4(0)?;
                self.exprs.push(Expr::Meta { key: META_L4PROTO, dreg: REG_1 });
                self.exprs.push(Expr::Payload { base: PAYLOAD_TRANSPORT, offset: 2, len: 2, dreg: REG32_01 });
                let elements = items
                    .iter()
                    .map(|(p, port)| {
                        let mut key = vec![p.number(), 0, 0, 0];
                        key.extend(port.to_be_bytes());
                        key.extend([0, 0]);
                        key
                    })
                    .collect();
                self.anon_lookup(AnonSet { key_type: 0x30d, key_len: 8, udata: UDATA_PROTO_PORT, elements });
            }
            Match::ProtoPortAddrIn { family, set } => {
                self.require_family(*family)?;
                self.set_l4(0)?;
                let e = &mut self.exprs;
                e.push(Expr::Meta { key: META_L4PROTO, dreg: REG_1 });
                e.push(Expr::Hton16 { reg: REG_1, len: 1 });
                e.push(Expr::Payload { base: PAYLOAD_TRANSPORT, offset: 2, len: 2, dreg: REG32_01 });
                e.push(daddr_load(*family == Family::V6, REG32_02));
                e.push(lookup(set, false));
            }
            Match::ThPort(field, port) => {
                self.need_l4("th")?;
                self.port_match(if *field == PortField::Sport { 0 } else { 2 }, *port);
            }
            Match::ThBits { offset, bits, value } => {
                let (offset, bits, value) = (*offset, *bits, *value);
                if offset % 8 != 0 || bits % 8 != 0 || bits == 0 || bits > 32 {
                    return Err(Unencodable::Value("raw transport bits byte-aligned, up to 32"));
                }
                self.need_l4("@th")?;
                let len = bits / 8;
                if len < 4 && value >> (8 * len) != 0 {
                    return Err(Unencodable::Value("a value wider than its bits"));
                }
                let be = value.to_be_bytes();
                self.exprs.push(Expr::Payload { base: PAYLOAD_TRANSPORT, offset: offset / 8, len, dreg: REG_1 });
                self.exprs.push(Expr::Cmp { sreg: REG_1, data: be[(4 - len as usize)..].to_vec() });
            }
            Match::TcpSyn => {
                self.l4_match(6)?;
                let e = &mut self.exprs;
                e.push(Expr::Payload { base: PAYLOAD_TRANSPORT, offset: 13, len: 1, dreg: REG_1 });
                e.push(Expr::Bitwise { reg: REG_1, mask: vec![0x02], xor: vec![0] });
                e.push(Expr::Neq { sreg: REG_1, data: vec![0] });
            }
            Match::Icmpv6Types(types) => {
                self.require_family(Family::V6)?;
                self.l4_match(58)?;
                self.exprs.push(Expr::Payload { base: PAYLOAD_TRANSPORT, offset: 0, len: 1, dreg: REG_1 });
                let elements = types.iter().map(|t| vec![t.number()]).collect();
                self.anon_lookup(AnonSet { key_type: 29, key_len: 1, udata: UDATA_ICMPV6_TYPE, elements });
            }
            Match::Mark { of, mask, cmp, value } => {
                e.push(mark_load(*of));
                e.push(Expr::Bitwise { reg: REG_1, xor: vec![0; 4], mask: mark(*mask) });
                e.push(match cmp {
                    Cmp::Eq => Expr::Cmp { sreg: REG_1, data: mark(*value) },
                    Cmp::Neq => Expr::Neq { sreg: REG_1, data: mark(*value) },
                });
            }
            Match::CtMarkIn { mask, or, set } => {
                e.push(Expr::Ct { key: CT_MARK, dreg: REG_1, dir: None });
                e.push(Expr::Bitwise { reg: REG_1, mask: mark(*mask), xor: mark(or.unwrap_or(0)) });
                e.push(lookup(set, false));
            }
            Match::CtState(state) => {
                let bit = if *state == CtState::New { CT_STATE_NEW } else { CT_STATE_ESTABLISHED };
                e.push(Expr::Ct { key: CT_STATE, dreg: REG_1, dir: None });
                e.push(Expr::Bitwise { reg: REG_1, mask: vec![bit, 0, 0, 0], xor: vec![0; 4] });
                e.push(Expr::Neq { sreg: REG_1, data: vec![0; 4] });
            }
            Match::CtDirection(d) => {
                e.push(Expr::Ct { key: CT_DIRECTION, dreg: REG_1, dir: None });
                e.push(Expr::Cmp { sreg: REG_1, data: vec![u8::from(*d == Direction::Reply)] });
            }
            Match::CtOriginalProtoDst(port) => {
                self.need_l4("ct original proto-dst")?;
                self.exprs.push(Expr::Ct { key: CT_PROTO_DST, dreg: REG_1, dir: Some(0) });
                self.exprs.push(Expr::Cmp { sreg: REG_1, data: port.to_be_bytes().to_vec() });
            }
            Match::CtOriginalAddrIn { family, field, set } => {
                if self.family != Some(*family) {
                    return Err(Unencodable::FamilyUnknown(if *family == Family::V6 { "ip6" } else { "ip" }));
                }
                let key = CT_SRC_IP + u32::from(*field == AddrField::Daddr) + if *family == Family::V6 { 2 } else { 0 };
                self.exprs.push(Expr::Ct { key, dreg: REG_1, dir: Some(0) });
                self.exprs.push(lookup(set, false));
            }
            Match::RtNexthopIn { family, set, negated } => {
                // No family check: nft adds none.
                e.push(Expr::Rt { v6: *family == Family::V6, dreg: REG_1 });
                e.push(lookup(set, *negated));
            }
            Match::FibSaddrIifMissing => {
                e.push(Expr::Fib { dreg: REG_1 });
                e.push(Expr::Cmp { sreg: REG_1, data: vec![0; 4] });
            }
            Match::TaggedIn { tag, family, set } => {
                self.require_family(*family)?;
                let e = &mut self.exprs;
                e.push(Expr::Numgen { dreg: REG_1, offset: (tag >> 32) as u32 });
                e.push(Expr::Numgen { dreg: REG32_01, offset: *tag as u32 });
                e.push(daddr_load(*family == Family::V6, REG32_02));
                e.push(lookup(set, false));
            }
        }
        Ok(())
    }

    fn a_statement(&mut self, s: &Statement) -> Result<(), Unencodable> {
        match s {
            Statement::Dscp(family, d) => {
                // The header's first two bytes rewritten with the six DSCP bits
                // replaced (IPv4: the second byte's top six, checksum updated; IPv6: the
                // traffic class straddles the two bytes).
                if *d >= 64 {
                    return Err(Unencodable::Value("a DSCP of 0-63"));
                }
                self.require_family(*family)?;
                let (mask, xor, csum_type, csum_offset) = match family {
                    Family::V6 => (vec![0xf0, 0x3f], vec![d >> 2, (d & 3) << 6], 0, 0),
                    Family::V4 => (vec![0xff, 0x03], vec![0, d << 2], 1, 10),
                };
                let e = &mut self.exprs;
                e.push(Expr::Payload { base: PAYLOAD_NETWORK, offset: 0, len: 2, dreg: REG_1 });
                e.push(Expr::Bitwise { reg: REG_1, mask, xor });
                e.push(Expr::PayloadWrite {
                    base: PAYLOAD_NETWORK,
                    offset: 0,
                    len: 2,
                    sreg: REG_1,
                    csum_type,
                    csum_offset,
                });
            }
            Statement::SetMark { of, keep, or } => {
                self.exprs.push(mark_load(*of));
                self.exprs.push(Expr::Bitwise { reg: REG_1, mask: mark(*keep), xor: mark(*or) });
                self.exprs.push(match of {
                    MarkOf::Packet => Expr::MetaSet { key: META_MARK, sreg: REG_1 },
                    MarkOf::Conn => Expr::CtSet { key: CT_MARK, sreg: REG_1 },
                });
            }
            Statement::CtMarkOr(bits) => {
                self.exprs.push(Expr::Ct { key: CT_MARK, dreg: REG_1, dir: None });
                self.exprs.push(Expr::Bitwise { reg: REG_1, mask: mark(!bits), xor: mark(*bits) });
                self.exprs.push(Expr::CtSet { key: CT_MARK, sreg: REG_1 });
            }
            Statement::MssToRoute => {
                if self.l4 != Some(6) {
                    return Err(Unencodable::NoProtocol("tcp option maxseg size set rt mtu"));
                }
                self.exprs.push(Expr::RtMss { dreg: REG_1 });
                self.exprs.push(Expr::Hton16 { reg: REG_1, len: 2 });
                self.exprs.push(Expr::MssWrite { sreg: REG_1 });
            }
            Statement::Notrack => self.exprs.push(Expr::Notrack),
            Statement::Tproxy(family, port) => {
                self.need_l4("tproxy")?;
                self.require_family(*family)?;
                self.exprs.push(Expr::Immediate { dreg: REG_1, data: port.to_be_bytes().to_vec() });
                self.exprs.push(Expr::Tproxy { v6: *family == Family::V6, port_reg: REG_1 });
            }
            Statement::SnatTo(ip) => {
                let family = Family::of(*ip);
                if self.family.is_some_and(|f| f != family) {
                    return Err(Unencodable::BothFamilies);
                }
                self.exprs.push(Expr::Immediate { dreg: REG_1, data: octets(*ip) });
                self.exprs.push(Expr::Snat { v6: family == Family::V6, sreg: REG_1 });
            }
            Statement::SnatToSaddr(family) => {
                self.load_addr(*family, AddrField::Saddr)?;
                self.exprs.push(Expr::Snat { v6: *family == Family::V6, sreg: REG_1 });
            }
            Statement::Limit { rate, burst, over } => {
                self.exprs.push(Expr::Limit { rate: *rate, burst: *burst, over: *over })
            }
            Statement::Log { prefix, group, queue_threshold } => {
                self.exprs.push(Expr::Log { prefix: prefix.to_string(), group: *group, qthreshold: *queue_threshold })
            }
            Statement::Counter => self.exprs.push(Expr::Counter),
            Statement::NamedCounter(name) => self.exprs.push(Expr::CounterRef(name.to_string())),
            Statement::PriorityFromMap { family, field, map } => {
                self.load_addr(*family, *field)?;
                self.exprs.push(Expr::Lookup {
                    set: map.to_string(),
                    sreg: REG_1,
                    dreg: Some(REG_1),
                    invert: false,
                    anon: None,
                });
                self.exprs.push(Expr::MetaSet { key: META_PRIORITY, sreg: REG_1 });
            }
            Statement::PriorityNone => {
                self.exprs.push(Expr::Immediate { dreg: REG_1, data: 0u32.to_ne_bytes().to_vec() });
                self.exprs.push(Expr::MetaSet { key: META_PRIORITY, sreg: REG_1 });
            }
        }
        Ok(())
    }

    fn verdict(&mut self, v: &Verdict) -> Result<(), Unencodable> {
        let expr = match v {
            Verdict::Accept => Expr::Verdict(Code::Accept, None),
            Verdict::Drop => Expr::Verdict(Code::Drop, None),
            Verdict::Return => Expr::Verdict(Code::Return, None),
            Verdict::Jump(chain) => Expr::Verdict(Code::Jump, Some(chain.to_string())),
            Verdict::Goto(chain) => Expr::Verdict(Code::Goto, Some(chain.to_string())),
            Verdict::Map { family, field, map } => {
                self.load_addr(*family, *field)?;
                Expr::Lookup { set: map.to_string(), sreg: REG_1, dreg: Some(REG_VERDICT), invert: false, anon: None }
            }
            Verdict::PriorityMap(map) => {
                self.exprs.push(Expr::Meta { key: META_PRIORITY, dreg: REG_1 });
                Expr::Lookup { set: map.to_string(), sreg: REG_1, dreg: Some(REG_VERDICT), invert: false, anon: None }
            }
        };
        self.exprs.push(expr);
        Ok(())
    }
}

/// The kernel expressions of `rule`, as `nft` 1.0.6 generates them.
pub(crate) fn encode(rule: &rule::Rule) -> Result<KernelRule, Unencodable> {
    let mut enc = Encoder { exprs: Vec::new(), anon: Vec::new(), family: None, l4: None };
    for m in &rule.matches {
        enc.a_match(m)?;
    }
    for s in &rule.statements {
        enc.a_statement(s)?;
    }
    if let Some(v) = &rule.verdict {
        enc.verdict(v)?;
    }
    Ok(KernelRule { exprs: enc.exprs, comment: rule.comment.as_ref().map(ToString::to_string), anon: enc.anon })
}
