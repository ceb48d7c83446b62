//! The kernel's side of a rule: nf_tables expressions ([`Expr`]), a rule as them
//! ([`KernelRule`]) with its anonymous sets, their netlink attributes, and their text as
//! `nft --debug=netlink` prints it (what the tests compare).

use std::fmt;

use super::*;

/// `NFT_RT_TCPMSS`.
pub(super) const RT_TCPMSS: u32 = 3;
/// `NFT_BYTEORDER_HTON`.
pub(super) const BYTEORDER_HTON: u32 = 1;
/// `NFT_EXTHDR_OP_TCPOPT`.
pub(super) const EXTHDR_OP_TCPOPT: u32 = 1;
/// TCP option kind 2, the maximum segment size.
pub(super) const TCPOPT_MAXSEG: u8 = 2;

/// `NFT_REG_1`: the 16-byte register nft uses for single values.
pub(super) const REG_1: u32 = 1;
/// `NFT_REG_VERDICT`: where a verdict map's lookup puts its verdict.
pub(super) const REG_VERDICT: u32 = 0;
/// `NFT_REG32_01`: the second 4-byte register (a concatenation's second part).
pub(super) const REG32_01: u32 = 9;
/// `NFT_REG32_02`.
pub(super) const REG32_02: u32 = 10;

pub(super) const META_MARK: u32 = 3;
pub(super) const META_PRIORITY: u32 = 2;
pub(super) const META_NFPROTO: u32 = 15;
pub(super) const META_L4PROTO: u32 = 16;
pub(super) const CT_STATE: u32 = 0;
pub(super) const CT_DIRECTION: u32 = 1;
pub(super) const CT_MARK: u32 = 3;
pub(super) const CT_PROTO_DST: u32 = 12;
/// `NFT_CT_SRC_IP`; `DST_IP`, `SRC_IP6`, `DST_IP6` follow.
pub(super) const CT_SRC_IP: u32 = 19;
/// `NF_CT_STATE_BIT(IP_CT_NEW)`.
pub(super) const CT_STATE_NEW: u8 = 8;
/// `NF_CT_STATE_BIT(IP_CT_ESTABLISHED)`.
pub(super) const CT_STATE_ESTABLISHED: u8 = 2;
/// `NFTA_FIB_F_SADDR | NFTA_FIB_F_IIF | NFTA_FIB_F_PRESENT`, result `NFT_FIB_RESULT_OIF`.
pub(super) const FIB_SADDR_IIF_PRESENT: u32 = 0x29;
pub(super) const FIB_RESULT_OIF: u32 = 1;
pub(super) const PAYLOAD_NETWORK: u32 = 1;
pub(super) const PAYLOAD_TRANSPORT: u32 = 2;
pub(super) const NFPROTO_IPV4: u8 = 2;
pub(super) const NFPROTO_IPV6: u8 = 10;

/// A verdict's code (`NF_DROP`, `NF_ACCEPT`, `NFT_JUMP`, `NFT_GOTO`, `NFT_RETURN`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Code {
    Drop,
    Accept,
    Jump,
    Goto,
    Return,
}

impl Code {
    fn value(self) -> i32 {
        match self {
            Code::Drop => 0,
            Code::Accept => 1,
            Code::Jump => -3,
            Code::Goto => -4,
            Code::Return => -5,
        }
    }
}

/// One kernel expression of a rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Expr {
    /// `meta load <key> => reg`.
    Meta { key: u32, dreg: u32 },
    /// `ct load <key> => reg`, of the connection's `dir` (0 original, 1 reply) when given.
    Ct { key: u32, dreg: u32, dir: Option<u8> },
    /// `payload load <len>b @ <base> header + <offset> => reg`.
    Payload { base: u32, offset: u32, len: u32, dreg: u32 },
    /// `cmp eq reg <data>`.
    Cmp { sreg: u32, data: Vec<u8> },
    /// `cmp neq reg <data>`.
    Neq { sreg: u32, data: Vec<u8> },
    /// `payload write reg => <len>b @ <base> header + <offset>`, the checksum at
    /// `csum_offset` updated when `csum_type` is 1 (inet).
    PayloadWrite { base: u32, offset: u32, len: u32, sreg: u32, csum_type: u32, csum_offset: u32 },
    /// `limit rate [over] <rate>/second burst <burst> packets`.
    Limit { rate: u64, burst: u32, over: bool },
    /// `log prefix "<prefix>" group <group> [queue-threshold <q>]`.
    Log { prefix: String, group: u16, qthreshold: Option<u16> },
    /// `fib saddr . iif oif present => reg` (0 when the source is not routed back
    /// through the input interface).
    Fib { dreg: u32 },
    /// `meta set <key> with reg`.
    MetaSet { key: u32, sreg: u32 },
    /// `ct set <key> with reg`.
    CtSet { key: u32, sreg: u32 },
    /// `rt load nexthop4|nexthop6 => reg`.
    Rt { v6: bool, dreg: u32 },
    /// `immediate reg <data>` (a value, not a verdict).
    Immediate { dreg: u32, data: Vec<u8> },
    /// `nat snat ip|ip6 addr_min reg`.
    Snat { v6: bool, sreg: u32 },
    /// `tproxy ip|ip6 port reg` (the packet's own destination address).
    Tproxy { v6: bool, port_reg: u32 },
    /// `notrack`.
    Notrack,
    /// `rt load tcpmss => reg` (the route's MTU less the IP and TCP headers).
    RtMss { dreg: u32 },
    /// `byteorder reg = hton(reg, 2, len)`: a 16-bit value to network order (`len` 2),
    /// or, as nft writes it before an interval concatenation, a `meta l4proto` byte
    /// (`len` 1: no 16-bit unit to swap, a no-op kept to match nft).
    Hton16 { reg: u32, len: u32 },
    /// `exthdr write tcpopt reg => 2b @ 2 + 2`: the MSS option's value.
    MssWrite { sreg: u32 },
    /// `bitwise reg = (reg & mask) ^ xor`.
    Bitwise { reg: u32, mask: Vec<u8>, xor: Vec<u8> },
    /// `lookup reg set <set>` (for a map, what the key maps to into `dreg`: the
    /// verdict register for a verdict map; inverted for `!=`); `anon`: the rule's
    /// anonymous set of this index (named `__set%d`, referred to by its id in the
    /// transaction).
    Lookup { set: String, sreg: u32, dreg: Option<u32>, invert: bool, anon: Option<usize> },
    /// `numgen reg = random mod 1 offset <offset>` (a constant, see [`super::Slot`]).
    Numgen { dreg: u32, offset: u32 },
    /// An anonymous counter.
    Counter,
    /// A reference to a named counter.
    CounterRef(String),
    /// `immediate reg 0 <verdict>`.
    Verdict(Code, Option<String>),
}

/// A rule as kernel expressions and its comment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KernelRule {
    /// The expressions in order.
    pub exprs: Vec<Expr>,
    /// `comment "…"`.
    pub comment: Option<String>,
    /// The rule's anonymous sets (`{ … }`), created with it.
    pub anon: Vec<AnonSet>,
}

/// An anonymous constant set of a rule (`icmpv6 type { … }`, `meta l4proto . th dport
/// { … }`), declared as nft declares it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AnonSet {
    /// The key's data type id.
    pub key_type: u32,
    /// The key's length in bytes.
    pub key_len: u32,
    /// nft's userdata for the key (byte order, `typeof`).
    pub udata: &'static [u8],
    /// The keys, in the order written.
    pub elements: Vec<Vec<u8>>,
}

/// Userdata of `icmpv6 type { … }` and `meta l4proto . th dport { … }` sets, as nft
/// 1.0.6 sends it.
pub(super) const UDATA_ICMPV6_TYPE: &[u8] =
    &[0, 4, 2, 0, 0, 0, 3, 20, 0, 4, 7, 0, 0, 0, 1, 12, 0, 4, 14, 0, 0, 0, 1, 4, 1, 0, 0, 0];
/// Userdata of a `meta l4proto { … }` set.
pub(super) const UDATA_L4PROTO: &[u8] = &[0, 4, 1, 0, 0, 0, 3, 14, 0, 4, 9, 0, 0, 0, 1, 6, 0, 4, 16, 0, 0, 0];
pub(super) const UDATA_PROTO_PORT: &[u8] = &[
    0, 4, 0, 0, 0, 0, 3, 46, 0, 4, 13, 0, 0, 0, 1, 38, 0, 14, 0, 4, 9, 0, 0, 0, 1, 6, 0, 4, 16, 0, 0, 0, 1, 20, 0, 4,
    7, 0, 0, 0, 1, 12, 0, 4, 11, 0, 0, 0, 1, 4, 2, 0, 0, 0,
];

impl Expr {
    fn name(&self) -> &'static str {
        match self {
            Expr::Meta { .. } => "meta",
            Expr::Ct { .. } => "ct",
            Expr::Neq { .. } => "cmp",
            Expr::PayloadWrite { .. } => "payload",
            Expr::Limit { .. } => "limit",
            Expr::Log { .. } => "log",
            Expr::Fib { .. } => "fib",
            Expr::MetaSet { .. } => "meta",
            Expr::CtSet { .. } => "ct",
            Expr::Rt { .. } => "rt",
            Expr::Immediate { .. } => "immediate",
            Expr::Snat { .. } => "nat",
            Expr::Tproxy { .. } => "tproxy",
            Expr::Notrack => "notrack",
            Expr::RtMss { .. } => "rt",
            Expr::Hton16 { .. } => "byteorder",
            Expr::MssWrite { .. } => "exthdr",
            Expr::Payload { .. } => "payload",
            Expr::Cmp { .. } => "cmp",
            Expr::Bitwise { .. } => "bitwise",
            Expr::Lookup { .. } => "lookup",
            Expr::Numgen { .. } => "numgen",
            Expr::Counter => "counter",
            Expr::CounterRef(_) => "objref",
            Expr::Verdict(..) => "immediate",
        }
    }

    /// The expression's `NFTA_EXPR_DATA` contents, attribute for attribute as nft
    /// 1.0.6 (libnftnl) sends them. One arm per expression: a table, kept whole
    /// (ARCHITECTURE.md, units).
    fn data(&self, out: &mut Vec<u8>, anon_ids: &[u32]) {
        match self {
            Expr::Meta { key, dreg } => {
                put_u32(out, 2, *key);
                put_u32(out, 1, *dreg);
            }
            Expr::Ct { key, dreg, dir } => {
                put_u32(out, 2, *key);
                put_u32(out, 1, *dreg);
                if let Some(dir) = dir {
                    put(out, 3, &[*dir]);
                }
            }
            Expr::Neq { sreg, data } => {
                put_u32(out, 1, *sreg);
                put_u32(out, 2, 1);
                put_data(out, 3, data);
            }
            Expr::PayloadWrite { base, offset, len, sreg, csum_type, csum_offset } => {
                put_u32(out, 5, *sreg);
                put_u32(out, 2, *base);
                put_u32(out, 3, *offset);
                put_u32(out, 4, *len);
                if *csum_type != 0 {
                    put_u32(out, 6, *csum_type);
                    put_u32(out, 7, *csum_offset);
                }
            }
            Expr::Limit { rate, burst, over } => {
                put(out, 1, &rate.to_be_bytes());
                put(out, 2, &1u64.to_be_bytes());
                put_u32(out, 3, *burst);
                put_u32(out, 4, 0);
                put_u32(out, 5, u32::from(*over));
            }
            Expr::Log { prefix, group, qthreshold } => {
                put_str(out, 2, prefix);
                put(out, 1, &group.to_be_bytes());
                if let Some(q) = qthreshold {
                    put(out, 4, &q.to_be_bytes());
                }
            }
            Expr::Fib { dreg } => {
                put_u32(out, 3, FIB_SADDR_IIF_PRESENT);
                put_u32(out, 2, FIB_RESULT_OIF);
                put_u32(out, 1, *dreg);
            }
            Expr::MetaSet { key, sreg } => {
                put_u32(out, 2, *key);
                put_u32(out, 3, *sreg);
            }
            Expr::CtSet { key, sreg } => {
                put_u32(out, 2, *key);
                put_u32(out, 4, *sreg);
            }
            Expr::Rt { v6, dreg } => {
                put_u32(out, 2, if *v6 { 2 } else { 1 });
                put_u32(out, 1, *dreg);
            }
            Expr::RtMss { dreg } => {
                put_u32(out, 2, RT_TCPMSS);
                put_u32(out, 1, *dreg);
            }
            Expr::Hton16 { reg, len } => {
                put_u32(out, 1, *reg);
                put_u32(out, 2, *reg);
                put_u32(out, 3, BYTEORDER_HTON);
                put_u32(out, 4, *len);
                put_u32(out, 5, 2);
            }
            Expr::MssWrite { sreg } => {
                put(out, 2, &[TCPOPT_MAXSEG]);
                put_u32(out, 3, 2);
                put_u32(out, 4, 2);
                put_u32(out, 6, EXTHDR_OP_TCPOPT);
                put_u32(out, 7, *sreg);
            }
            Expr::Immediate { dreg, data } => {
                put_u32(out, 1, *dreg);
                put_data(out, 2, data);
            }
            Expr::Snat { v6, sreg } => {
                put_u32(out, 1, 0);
                put_u32(out, 2, u32::from(if *v6 { NFPROTO_IPV6 } else { NFPROTO_IPV4 }));
                put_u32(out, 3, *sreg);
            }
            Expr::Notrack => {}
            Expr::Tproxy { v6, port_reg } => {
                // NFTA_TPROXY_FAMILY, NFTA_TPROXY_REG_PORT (no address register).
                put_u32(out, 1, u32::from(if *v6 { NFPROTO_IPV6 } else { NFPROTO_IPV4 }));
                put_u32(out, 3, *port_reg);
            }
            Expr::Payload { base, offset, len, dreg } => {
                put_u32(out, 1, *dreg);
                put_u32(out, 2, *base);
                put_u32(out, 3, *offset);
                put_u32(out, 4, *len);
            }
            Expr::Cmp { sreg, data } => {
                put_u32(out, 1, *sreg);
                put_u32(out, 2, 0);
                put_data(out, 3, data);
            }
            Expr::Bitwise { reg, mask, xor } => {
                put_u32(out, 1, *reg);
                put_u32(out, 2, *reg);
                put_u32(out, 3, mask.len() as u32);
                put_data(out, 4, mask);
                put_data(out, 5, xor);
            }
            Expr::Lookup { set, sreg, dreg, invert, anon } => {
                put_u32(out, 2, *sreg);
                if let Some(dreg) = dreg {
                    put_u32(out, 3, *dreg);
                }
                put_str(out, 1, set);
                if let Some(id) = anon.and_then(|a| anon_ids.get(a)) {
                    put_u32(out, 4, *id);
                }
                if *invert {
                    put_u32(out, 5, 1);
                }
            }
            Expr::Numgen { dreg, offset } => {
                put_u32(out, 1, *dreg);
                put_u32(out, 2, 1);
                put_u32(out, 3, 1);
                // nft leaves the offset out when it is 0 (the kernel's default).
                if *offset != 0 {
                    put_u32(out, 4, *offset);
                }
            }
            Expr::Counter => {
                put(out, 1, &0u64.to_be_bytes());
                put(out, 2, &0u64.to_be_bytes());
            }
            Expr::CounterRef(name) => {
                put_u32(out, 1, 1);
                put_str(out, 2, name);
            }
            Expr::Verdict(code, chain) => {
                put_u32(out, 1, 0);
                nest(out, 2, |o| {
                    nest(o, 2, |o| {
                        put(o, 1, &code.value().to_be_bytes());
                        if let Some(chain) = chain {
                            put_str(o, 2, chain);
                        }
                    })
                });
            }
        }
    }
}

impl KernelRule {
    /// The `NFTA_RULE_EXPRESSIONS` contents: one `NFTA_LIST_ELEM` per expression
    /// (the rule's anonymous sets created with the transaction ids `anon_ids`).
    pub(crate) fn expressions(&self, out: &mut Vec<u8>, anon_ids: &[u32]) {
        for e in &self.exprs {
            nest(out, 1, |o| {
                put_str(o, 1, e.name());
                nest(o, 2, |o| e.data(o, anon_ids));
            });
        }
    }

    /// The rule's `NFTA_RULE_USERDATA`: its comment as nft stores it (a TLV of type 0,
    /// the text NUL-terminated), if any.
    pub(crate) fn userdata(&self) -> Option<Vec<u8>> {
        let c = self.comment.as_ref()?;
        let len = u8::try_from(c.len() + 1).ok()?;
        let mut out = vec![0, len];
        out.extend(c.as_bytes());
        out.push(0);
        Some(out)
    }
}

/// The data of `bytes` as `nft --debug=netlink` prints it: 32-bit words, each read in
/// host (little-endian) order, zero-padded.
pub(super) fn words_hex(bytes: &[u8]) -> String {
    bytes
        .chunks(4)
        .map(|c| {
            let mut w = [0u8; 4];
            w[..c.len()].copy_from_slice(c);
            format!("0x{:08x}", u32::from_le_bytes(w))
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The expression as `nft --debug=netlink` prints it (the tests compare the two). One
/// arm per expression: a table, kept whole (ARCHITECTURE.md, units).
impl fmt::Display for Expr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let meta = |k: u32| match k {
            META_NFPROTO => "nfproto",
            META_L4PROTO => "l4proto",
            META_MARK => "mark",
            META_PRIORITY => "priority",
            _ => "?",
        };
        let ct = |k: u32| match k {
            CT_STATE => "state",
            CT_DIRECTION => "direction",
            CT_MARK => "mark",
            CT_PROTO_DST => "proto_dst",
            19 => "src_ip",
            20 => "dst_ip",
            21 => "src_ip6",
            22 => "dst_ip6",
            _ => "?",
        };
        match self {
            Expr::Meta { key, dreg } => write!(f, "[ meta load {} => reg {dreg} ]", meta(*key)),
            Expr::Ct { key, dreg, dir } => {
                write!(f, "[ ct load {} => reg {dreg}", ct(*key))?;
                match dir {
                    Some(0) => write!(f, " , dir original ]"),
                    Some(_) => write!(f, " , dir reply ]"),
                    None => write!(f, " ]"),
                }
            }
            Expr::Neq { sreg, data } => write!(f, "[ cmp neq reg {sreg} {} ]", words_hex(data)),
            Expr::PayloadWrite { base, offset, len, sreg, csum_type, csum_offset } => {
                let b = if *base == PAYLOAD_NETWORK { "network" } else { "transport" };
                write!(
                    f,
                    "[ payload write reg {sreg} => {len}b @ {b} header + {offset} csum_type {csum_type} csum_off {csum_offset} csum_flags 0x0 ]"
                )
            }
            Expr::Limit { rate, burst, over } => {
                write!(f, "[ limit rate {rate}/second burst {burst} type packets flags 0x{} ]", u8::from(*over))
            }
            Expr::Log { prefix, group, qthreshold } => {
                write!(f, "[ log prefix {prefix} group {group} snaplen 0 qthreshold {} ]", qthreshold.unwrap_or(0))
            }
            Expr::Fib { dreg } => write!(f, "[ fib saddr . iif oif present => reg {dreg} ]"),
            Expr::MetaSet { key, sreg } => write!(f, "[ meta set {} with reg {sreg} ]", meta(*key)),
            Expr::CtSet { key, sreg } => write!(f, "[ ct set {} with reg {sreg} ]", ct(*key)),
            Expr::Rt { v6, dreg } => write!(f, "[ rt load nexthop{} => reg {dreg} ]", if *v6 { 6 } else { 4 }),
            Expr::Immediate { dreg, data } => write!(f, "[ immediate reg {dreg} {} ]", words_hex(data)),
            Expr::Snat { v6, sreg } => write!(f, "[ nat snat ip{} addr_min reg {sreg} ]", if *v6 { "6" } else { "" }),
            Expr::Notrack => write!(f, "[ notrack ]"),
            Expr::RtMss { dreg } => write!(f, "[ rt load tcpmss => reg {dreg} ]"),
            Expr::Hton16 { reg, len } => write!(f, "[ byteorder reg {reg} = hton(reg {reg}, 2, {len}) ]"),
            Expr::MssWrite { sreg } => write!(f, "[ exthdr write tcpopt reg {sreg} => 2b @ 2 + 2 ]"),
            Expr::Tproxy { v6, port_reg } => {
                write!(f, "[ tproxy ip{} port reg {port_reg} ]", if *v6 { "6" } else { "" })
            }
            Expr::Payload { base, offset, len, dreg } => {
                let b = if *base == PAYLOAD_NETWORK { "network" } else { "transport" };
                write!(f, "[ payload load {len}b @ {b} header + {offset} => reg {dreg} ]")
            }
            Expr::Cmp { sreg, data } => write!(f, "[ cmp eq reg {sreg} {} ]", words_hex(data)),
            Expr::Bitwise { reg, mask, xor } => {
                write!(f, "[ bitwise reg {reg} = ( reg {reg} & {} ) ^ {} ]", words_hex(mask), words_hex(xor))
            }
            Expr::Lookup { set, sreg, dreg, invert, .. } => {
                write!(f, "[ lookup reg {sreg} set {set}")?;
                if let Some(dreg) = dreg {
                    write!(f, " dreg {dreg}")?;
                }
                if *invert {
                    write!(f, " 0x1")?;
                }
                write!(f, " ]")
            }
            Expr::Numgen { dreg, offset: 0 } => write!(f, "[ numgen reg {dreg} = random mod 1 ]"),
            Expr::Numgen { dreg, offset } => write!(f, "[ numgen reg {dreg} = random mod 1 offset {offset} ]"),
            Expr::Counter => write!(f, "[ counter pkts 0 bytes 0 ]"),
            Expr::CounterRef(name) => write!(f, "[ objref type 1 name {name} ]"),
            Expr::Verdict(code, chain) => {
                let c = match code {
                    Code::Drop => "drop",
                    Code::Accept => "accept",
                    Code::Jump => "jump",
                    Code::Goto => "goto",
                    Code::Return => "return",
                };
                match chain {
                    Some(chain) => write!(f, "[ immediate reg 0 {c} -> {chain} ]"),
                    None => write!(f, "[ immediate reg 0 {c} ]"),
                }
            }
        }
    }
}
