//! egressd's table as nf_tables netlink messages, for sending it without an `nft`
//! process: [`replace_messages`] (a full replace) and [`delta_messages`] (the change
//! [`super::diff`] would script), which [`crate::dataplane::elements::ElementWriter`]
//! sends with the elements as one transaction.
//!
//! The compiler writes rules as nft statements from a small vocabulary (see
//! [`super`]); [`parse`] reads that vocabulary back into the kernel expressions `nft`
//! 1.0.6 would generate for it — the same expressions, registers, lengths and byte
//! order, so `nft list` shows a table sent this way exactly as one `nft -f` loaded
//! (checked against `nft --debug=netlink` in the tests, and by listing both in a
//! network namespace in `tests/wire_netns.rs`). A statement outside the vocabulary is
//! an error naming it: the caller then sends the table through `nft` as before.
//!
//! The vocabulary: `meta nfproto ipv4|ipv6`; `ip|ip6 saddr|daddr` followed by `@set`,
//! `!= @set`, `vmap @map`, an address or a prefix; `tcp|udp|sctp dport <n>`; `ct
//! direction original|reply`; a tagged lookup (`numgen random mod 1 offset <hi> .
//! numgen random mod 1 offset <lo> . ip|ip6 daddr @set`, see [`super::Slot`]);
//! `counter`; `counter name "<name>"`; `accept`, `drop`, `return`, `jump <chain>`,
//! `goto <chain>`; `comment "<text>"` last.

use std::fmt;
use std::net::IpAddr;

use super::{Hook, KeyType, Set, Table};

/// `NFT_REG_1`: the 16-byte register nft uses for single values.
const REG_1: u32 = 1;
/// `NFT_REG32_01`: the second 4-byte register (a concatenation's second part).
const REG32_01: u32 = 9;
/// `NFT_REG32_02`.
const REG32_02: u32 = 10;

const META_NFPROTO: u32 = 15;
const META_L4PROTO: u32 = 16;
const CT_DIRECTION: u32 = 1;
const PAYLOAD_NETWORK: u32 = 1;
const PAYLOAD_TRANSPORT: u32 = 2;
const NFPROTO_IPV4: u8 = 2;
const NFPROTO_IPV6: u8 = 10;

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
    /// `ct load <key> => reg`.
    Ct { key: u32, dreg: u32 },
    /// `payload load <len>b @ <base> header + <offset> => reg`.
    Payload { base: u32, offset: u32, len: u32, dreg: u32 },
    /// `cmp eq reg <data>`.
    Cmp { sreg: u32, data: Vec<u8> },
    /// `bitwise reg = (reg & mask) ^ xor`.
    Bitwise { reg: u32, mask: Vec<u8>, xor: Vec<u8> },
    /// `lookup reg set <set>` (its verdict into the verdict register for a map,
    /// inverted for `!=`); `anon`: the rule's anonymous set of this index (named
    /// `__set%d`, referred to by its id in the transaction).
    Lookup { set: String, sreg: u32, verdict: bool, invert: bool, anon: Option<usize> },
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
pub(crate) struct Rule {
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
const UDATA_ICMPV6_TYPE: &[u8] =
    &[0, 4, 2, 0, 0, 0, 3, 20, 0, 4, 7, 0, 0, 0, 1, 12, 0, 4, 14, 0, 0, 0, 1, 4, 1, 0, 0, 0];
const UDATA_PROTO_PORT: &[u8] = &[
    0, 4, 0, 0, 0, 0, 3, 46, 0, 4, 13, 0, 0, 0, 1, 38, 0, 14, 0, 4, 9, 0, 0, 0, 1, 6, 0, 4, 16, 0, 0, 0, 1, 20, 0, 4,
    7, 0, 0, 0, 1, 12, 0, 4, 11, 0, 0, 0, 1, 4, 2, 0, 0, 0,
];

/// The items of a `{ a, b . c, … }` list starting at `w[at]` (`{`), and the index
/// after its `}`.
fn braced<'a>(w: &[&'a str], at: usize) -> Result<(Vec<Vec<&'a str>>, usize), String> {
    if w.get(at) != Some(&"{") {
        return Err("`{ … }` expected".into());
    }
    let mut items = vec![Vec::new()];
    let mut i = at + 1;
    loop {
        match w.get(i) {
            None => return Err("an unterminated `{ … }`".into()),
            Some(&"}") => break,
            Some(word) => {
                let (word, last) = match word.strip_suffix(',') {
                    Some(x) => (x, true),
                    None => (*word, false),
                };
                if word != "." {
                    items.last_mut().ok_or("empty")?.push(word);
                }
                if last {
                    items.push(Vec::new());
                }
            }
        }
        i += 1;
    }
    if items.iter().any(|x| x.is_empty()) {
        return Err("an empty item in `{ … }`".into());
    }
    Ok((items, i + 1))
}

/// Split a rule into words, a `"…"` string (without escapes: the compiler writes none)
/// being one word with its quotes.
fn words(rule: &str) -> Result<Vec<&str>, String> {
    let mut out = Vec::new();
    let mut rest = rule.trim_start();
    while !rest.is_empty() {
        let end = if let Some(quoted) = rest.strip_prefix('"') {
            match quoted.find('"') {
                Some(i) => i + 2,
                None => return Err("an unterminated string".into()),
            }
        } else {
            rest.find(char::is_whitespace).unwrap_or(rest.len())
        };
        out.push(&rest[..end]);
        rest = rest[end..].trim_start();
    }
    Ok(out)
}

fn quoted(word: Option<&&str>) -> Result<String, String> {
    match word {
        Some(w) if w.len() >= 2 && w.starts_with('"') && w.ends_with('"') => Ok(w[1..w.len() - 1].to_string()),
        _ => Err("a string in quotes expected".into()),
    }
}

fn set_name(word: Option<&&str>) -> Result<String, String> {
    match word.and_then(|w| w.strip_prefix('@')) {
        Some(name) if !name.is_empty() => Ok(name.to_string()),
        _ => Err("a set (`@name`) expected".into()),
    }
}

/// The family check `nft` puts before a match of `family` in an `inet` table, unless
/// the rule has established it.
fn require_family(exprs: &mut Vec<Expr>, known: &mut Option<u8>, family: u8) -> Result<(), String> {
    match *known {
        Some(f) if f == family => Ok(()),
        Some(_) => Err("matches of both IPv4 and IPv6 in one rule".into()),
        None => {
            exprs.push(Expr::Meta { key: META_NFPROTO, dreg: REG_1 });
            exprs.push(Expr::Cmp { sreg: REG_1, data: vec![family] });
            *known = Some(family);
            Ok(())
        }
    }
}

/// The expressions of an address or prefix match, as nft generates them: a prefix on
/// a byte boundary compares only its bytes, any other (and `/0`) masks the address.
fn address_match(exprs: &mut Vec<Expr>, offset: u32, text: &str, v6: bool) -> Result<(), String> {
    let (addr, len): (IpAddr, u8) = match text.split_once('/') {
        Some((a, l)) => (
            a.parse().map_err(|_| format!("`{text}`: not an address"))?,
            l.parse().map_err(|_| format!("`{text}`: not a prefix"))?,
        ),
        None => {
            let a: IpAddr = text.parse().map_err(|_| format!("`{text}`: not an address"))?;
            (a, if a.is_ipv6() { 128 } else { 32 })
        }
    };
    if addr.is_ipv6() != v6 {
        return Err(format!("`{text}`: the wrong address family"));
    }
    let bytes = match addr {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    };
    let full = bytes.len() as u32;
    if u32::from(len) > full * 8 {
        return Err(format!("`{text}`: prefix too long"));
    }
    let mut mask = vec![0u8; bytes.len()];
    for (i, m) in mask.iter_mut().enumerate() {
        let bits = (usize::from(len)).saturating_sub(i * 8).min(8);
        *m = if bits == 0 { 0 } else { 0xffu8 << (8 - bits) };
    }
    let net: Vec<u8> = bytes.iter().zip(&mask).map(|(b, m)| b & m).collect();
    if net != bytes {
        return Err(format!("`{text}`: host bits set"));
    }
    if len > 0 && len % 8 == 0 {
        let n = u32::from(len) / 8;
        exprs.push(Expr::Payload { base: PAYLOAD_NETWORK, offset, len: n, dreg: REG_1 });
        exprs.push(Expr::Cmp { sreg: REG_1, data: net[..n as usize].to_vec() });
    } else {
        exprs.push(Expr::Payload { base: PAYLOAD_NETWORK, offset, len: full, dreg: REG_1 });
        exprs.push(Expr::Bitwise { reg: REG_1, mask, xor: vec![0; bytes.len()] });
        exprs.push(Expr::Cmp { sreg: REG_1, data: net });
    }
    Ok(())
}

/// Read one rule of the compiler's vocabulary (module docs) as kernel expressions.
pub(crate) fn parse(rule: &str) -> Result<Rule, String> {
    let w = words(rule)?;
    let mut exprs = Vec::new();
    let mut family: Option<u8> = None;
    let mut l4: Option<u8> = None;
    let mut comment = None;
    let mut anon: Vec<AnonSet> = Vec::new();
    let mut i = 0;
    let num = |s: Option<&&str>| -> Result<u32, String> {
        s.and_then(|s| s.parse().ok()).ok_or_else(|| "a number expected".to_string())
    };
    while i < w.len() {
        if comment.is_some() {
            return Err(format!("`{}` after the comment", w[i]));
        }
        match w[i] {
            "meta" if w.get(i + 1) == Some(&"nfproto") => {
                let f = match w.get(i + 2) {
                    Some(&"ipv4") => NFPROTO_IPV4,
                    Some(&"ipv6") => NFPROTO_IPV6,
                    _ => return Err("`meta nfproto` of ipv4 or ipv6 expected".into()),
                };
                if family.is_some() {
                    return Err("`meta nfproto` after the family is known".into());
                }
                require_family(&mut exprs, &mut family, f)?;
                i += 3;
            }
            fam @ ("ip" | "ip6") => {
                let v6 = fam == "ip6";
                require_family(&mut exprs, &mut family, if v6 { NFPROTO_IPV6 } else { NFPROTO_IPV4 })?;
                let offset = match (w.get(i + 1), v6) {
                    (Some(&"saddr"), false) => 12,
                    (Some(&"daddr"), false) => 16,
                    (Some(&"saddr"), true) => 8,
                    (Some(&"daddr"), true) => 24,
                    _ => return Err(format!("`{fam} {}` is not handled", w.get(i + 1).unwrap_or(&""))),
                };
                let len = if v6 { 16 } else { 4 };
                // `@set`, `!= @set` or `vmap @map`: the address looked up.
                let lookup = match w.get(i + 2) {
                    Some(s) if s.starts_with('@') => Some((false, false, 3)),
                    Some(&"!=") => Some((true, false, 4)),
                    Some(&"vmap") => Some((false, true, 4)),
                    _ => None,
                };
                if let Some((invert, verdict, words)) = lookup {
                    exprs.push(Expr::Payload { base: PAYLOAD_NETWORK, offset, len, dreg: REG_1 });
                    let set = set_name(w.get(i + words - 1))?;
                    exprs.push(Expr::Lookup { set, sreg: REG_1, verdict, invert, anon: None });
                    i += words;
                    continue;
                }
                match w.get(i + 2) {
                    Some(a) if a.starts_with(|c: char| c.is_ascii_hexdigit() || c == ':') => {
                        address_match(&mut exprs, offset, a, v6)?;
                        i += 3;
                    }
                    other => return Err(format!("`{fam} …` followed by `{}` is not handled", other.unwrap_or(&""))),
                }
            }
            proto @ ("tcp" | "udp" | "sctp") => {
                if w.get(i + 1) != Some(&"dport") {
                    return Err(format!("`{proto} {}` is not handled", w.get(i + 1).unwrap_or(&"")));
                }
                let port = u16::try_from(num(w.get(i + 2))?).map_err(|_| "a port above 65535".to_string())?;
                let p = match proto {
                    "tcp" => 6,
                    "udp" => 17,
                    _ => 132,
                };
                if l4.is_some() {
                    return Err("two transport protocols in one rule".into());
                }
                exprs.push(Expr::Meta { key: META_L4PROTO, dreg: REG_1 });
                exprs.push(Expr::Cmp { sreg: REG_1, data: vec![p] });
                l4 = Some(p);
                exprs.push(Expr::Payload { base: PAYLOAD_TRANSPORT, offset: 2, len: 2, dreg: REG_1 });
                exprs.push(Expr::Cmp { sreg: REG_1, data: port.to_be_bytes().to_vec() });
                i += 3;
            }
            "icmpv6" if w.get(i + 1) == Some(&"type") => {
                let (items, next) = braced(&w, i + 2)?;
                let mut elements = Vec::new();
                for item in items {
                    let t: u8 = match item[..] {
                        ["nd-router-solicit"] => 133,
                        ["nd-router-advert"] => 134,
                        ["nd-neighbor-solicit"] => 135,
                        ["nd-neighbor-advert"] => 136,
                        ["nd-redirect"] => 137,
                        _ => return Err(format!("icmpv6 type {item:?} is not handled")),
                    };
                    elements.push(vec![t]);
                }
                require_family(&mut exprs, &mut family, NFPROTO_IPV6)?;
                if l4.is_some() {
                    return Err("two transport protocols in one rule".into());
                }
                exprs.push(Expr::Meta { key: META_L4PROTO, dreg: REG_1 });
                exprs.push(Expr::Cmp { sreg: REG_1, data: vec![58] });
                l4 = Some(58);
                exprs.push(Expr::Payload { base: PAYLOAD_TRANSPORT, offset: 0, len: 1, dreg: REG_1 });
                exprs.push(Expr::Lookup {
                    set: "__set%d".into(),
                    sreg: REG_1,
                    verdict: false,
                    invert: false,
                    anon: Some(anon.len()),
                });
                anon.push(AnonSet { key_type: 29, key_len: 1, udata: UDATA_ICMPV6_TYPE, elements });
                i = next;
            }
            "meta" if w.get(i + 1..i + 5) == Some(&["l4proto", ".", "th", "dport"][..]) => {
                let (items, next) = braced(&w, i + 5)?;
                let mut elements = Vec::new();
                for item in items {
                    let [proto, port] = item[..] else {
                        return Err(format!("`{item:?}`: a protocol . port pair expected"));
                    };
                    let p: u8 = match proto {
                        "tcp" => 6,
                        "udp" => 17,
                        "sctp" => 132,
                        _ => return Err(format!("protocol {proto} is not handled")),
                    };
                    let port: u16 = port.parse().map_err(|_| format!("`{port}`: not a port"))?;
                    let mut key = vec![p, 0, 0, 0];
                    key.extend(port.to_be_bytes());
                    key.extend([0, 0]);
                    elements.push(key);
                }
                if l4.is_some() {
                    return Err("two transport protocols in one rule".into());
                }
                l4 = Some(0);
                exprs.push(Expr::Meta { key: META_L4PROTO, dreg: REG_1 });
                exprs.push(Expr::Payload { base: PAYLOAD_TRANSPORT, offset: 2, len: 2, dreg: REG32_01 });
                exprs.push(Expr::Lookup {
                    set: "__set%d".into(),
                    sreg: REG_1,
                    verdict: false,
                    invert: false,
                    anon: Some(anon.len()),
                });
                anon.push(AnonSet { key_type: 0x30d, key_len: 8, udata: UDATA_PROTO_PORT, elements });
                i = next;
            }
            "ct" if w.get(i + 1) == Some(&"direction") => {
                let d = match w.get(i + 2) {
                    Some(&"original") => 0,
                    Some(&"reply") => 1,
                    _ => return Err("`ct direction` of original or reply expected".into()),
                };
                exprs.push(Expr::Ct { key: CT_DIRECTION, dreg: REG_1 });
                exprs.push(Expr::Cmp { sreg: REG_1, data: vec![d] });
                i += 3;
            }
            "numgen" => {
                // numgen random mod 1 offset H . numgen random mod 1 offset L . ip daddr @set
                let shape = |at: usize| {
                    w.get(at..at + 5) == Some(&["numgen", "random", "mod", "1", "offset"][..])
                        && w.get(at + 6) == Some(&".")
                };
                if !shape(i) || !shape(i + 7) {
                    return Err("only the tagged lookup `numgen random mod 1 offset …` is handled".into());
                }
                let (hi, lo) = (num(w.get(i + 5))?, num(w.get(i + 12))?);
                let v6 = match w.get(i + 14) {
                    Some(&"ip") => false,
                    Some(&"ip6") => true,
                    _ => return Err("a tagged lookup of `ip daddr` or `ip6 daddr` expected".into()),
                };
                if w.get(i + 15) != Some(&"daddr") {
                    return Err("a tagged lookup of `ip daddr` or `ip6 daddr` expected".into());
                }
                let set = set_name(w.get(i + 16))?;
                require_family(&mut exprs, &mut family, if v6 { NFPROTO_IPV6 } else { NFPROTO_IPV4 })?;
                exprs.push(Expr::Numgen { dreg: REG_1, offset: hi });
                exprs.push(Expr::Numgen { dreg: REG32_01, offset: lo });
                exprs.push(Expr::Payload {
                    base: PAYLOAD_NETWORK,
                    offset: if v6 { 24 } else { 16 },
                    len: if v6 { 16 } else { 4 },
                    dreg: REG32_02,
                });
                exprs.push(Expr::Lookup { set, sreg: REG_1, verdict: false, invert: false, anon: None });
                i += 17;
            }
            "counter" if w.get(i + 1) == Some(&"name") => {
                exprs.push(Expr::CounterRef(quoted(w.get(i + 2))?));
                i += 3;
            }
            "counter" => {
                exprs.push(Expr::Counter);
                i += 1;
            }
            v @ ("accept" | "drop" | "return") => {
                let code = match v {
                    "accept" => Code::Accept,
                    "drop" => Code::Drop,
                    _ => Code::Return,
                };
                exprs.push(Expr::Verdict(code, None));
                i += 1;
            }
            v @ ("jump" | "goto") => {
                let chain = w.get(i + 1).filter(|c| !c.starts_with('"')).ok_or("a chain expected")?;
                exprs.push(Expr::Verdict(if v == "jump" { Code::Jump } else { Code::Goto }, Some(chain.to_string())));
                i += 2;
            }
            "comment" => {
                comment = Some(quoted(w.get(i + 1))?);
                i += 2;
            }
            other => return Err(format!("`{other}` is not handled")),
        }
        if matches!(exprs.last(), Some(Expr::Verdict(..))) && i < w.len() && w[i] != "comment" {
            return Err(format!("`{}` after the verdict", w[i]));
        }
    }
    Ok(Rule { exprs, comment, anon })
}

// --- netlink attributes -----------------------------------------------------------

const NLA_F_NESTED: u16 = 0x8000;

/// Append attribute `ty` with `value` (padded to 4 bytes).
pub(crate) fn put(out: &mut Vec<u8>, ty: u16, value: &[u8]) {
    let len = 4 + value.len();
    out.extend((len as u16).to_ne_bytes());
    out.extend(ty.to_ne_bytes());
    out.extend(value);
    out.resize(out.len() + (len.next_multiple_of(4) - len), 0);
}

/// Append a string attribute (NUL-terminated).
pub(crate) fn put_str(out: &mut Vec<u8>, ty: u16, value: &str) {
    let mut v = Vec::with_capacity(value.len() + 1);
    v.extend(value.as_bytes());
    v.push(0);
    put(out, ty, &v);
}

/// Append a big-endian u32 attribute.
pub(crate) fn put_u32(out: &mut Vec<u8>, ty: u16, value: u32) {
    put(out, ty, &value.to_be_bytes());
}

/// Append a nested attribute whose contents `inner` writes.
pub(crate) fn nest(out: &mut Vec<u8>, ty: u16, inner: impl FnOnce(&mut Vec<u8>)) {
    let start = out.len();
    out.extend([0u8; 4]);
    inner(out);
    let len = out.len() - start;
    out[start..start + 2].copy_from_slice(&(len as u16).to_ne_bytes());
    out[start + 2..start + 4].copy_from_slice(&(ty | NLA_F_NESTED).to_ne_bytes());
}

/// `NFTA_DATA_VALUE` inside a nest of type `ty`.
fn put_data(out: &mut Vec<u8>, ty: u16, data: &[u8]) {
    nest(out, ty, |o| put(o, 1, data));
}

impl Expr {
    fn name(&self) -> &'static str {
        match self {
            Expr::Meta { .. } => "meta",
            Expr::Ct { .. } => "ct",
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
    /// 1.0.6 (libnftnl) sends them.
    fn data(&self, out: &mut Vec<u8>, anon_ids: &[u32]) {
        match self {
            Expr::Meta { key, dreg } => {
                put_u32(out, 2, *key);
                put_u32(out, 1, *dreg);
            }
            Expr::Ct { key, dreg } => {
                put_u32(out, 2, *key);
                put_u32(out, 1, *dreg);
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
            Expr::Lookup { set, sreg, verdict, invert, anon } => {
                put_u32(out, 2, *sreg);
                if *verdict {
                    put_u32(out, 3, 0);
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
                put_u32(out, 4, *offset);
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

impl Rule {
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

// --- the table's messages ---------------------------------------------------------

/// `NFT_MSG_*` types (the subsystem byte is added by the sender).
pub(crate) const MSG_NEWTABLE: u16 = 0;
pub(crate) const MSG_DELTABLE: u16 = 2;
pub(crate) const MSG_NEWCHAIN: u16 = 3;
pub(crate) const MSG_DELCHAIN: u16 = 5;
pub(crate) const MSG_DELRULE: u16 = 8;
pub(crate) const MSG_DELSET: u16 = 11;
pub(crate) const MSG_NEWRULE: u16 = 6;
pub(crate) const MSG_NEWSET: u16 = 9;
pub(crate) const MSG_NEWSETELEM: u16 = 12;
pub(crate) const MSG_NEWOBJ: u16 = 18;

/// One nf_tables message of a batch: type, whether it creates (`NLM_F_CREATE`) and
/// appends (`NLM_F_APPEND`), its attributes, and what it is (for error messages).
#[derive(Debug, Clone)]
pub(crate) struct Message {
    pub kind: u16,
    pub create: bool,
    pub append: bool,
    pub body: Vec<u8>,
    pub what: String,
    /// For a named set's `NEWSET`: its name and transaction id (its elements may then
    /// follow by id, see [`crate::dataplane::elements`]).
    pub new_set: Option<(String, u32)>,
}

/// The userdata nft 1.0.6 attaches to a set of each kind (key byte order; for maps the
/// data's; for tagged sets the `typeof` expressions), copied from what it sends, so
/// `nft list` shows the set as it declared it.
const UDATA_ADDR: &[u8] = &[0, 4, 2, 0, 0, 0];
const UDATA_ADDR_MAP: &[u8] = &[0, 4, 2, 0, 0, 0, 1, 4, 0, 0, 0, 0, 6, 4, 0, 0, 0, 0];
const UDATA_TAGGED_V4: &[u8] = &[
    0, 4, 0, 0, 0, 0, 3, 86, 0, 4, 13, 0, 0, 0, 1, 78, 0, 26, 0, 4, 23, 0, 0, 0, 1, 18, 0, 4, 1, 0, 0, 0, 1, 4, 1, 0,
    0, 0, 2, 4, 0, 0, 0, 0, 1, 26, 0, 4, 23, 0, 0, 0, 1, 18, 0, 4, 1, 0, 0, 0, 1, 4, 1, 0, 0, 0, 2, 4, 0, 0, 0, 0, 2,
    20, 0, 4, 7, 0, 0, 0, 1, 12, 0, 4, 12, 0, 0, 0, 1, 4, 12, 0, 0, 0,
];
const UDATA_TAGGED_V6: &[u8] = &[
    0, 4, 0, 0, 0, 0, 3, 86, 0, 4, 13, 0, 0, 0, 1, 78, 0, 26, 0, 4, 23, 0, 0, 0, 1, 18, 0, 4, 1, 0, 0, 0, 1, 4, 1, 0,
    0, 0, 2, 4, 0, 0, 0, 0, 1, 26, 0, 4, 23, 0, 0, 0, 1, 18, 0, 4, 1, 0, 0, 0, 1, 4, 1, 0, 0, 0, 2, 4, 0, 0, 0, 0, 2,
    20, 0, 4, 7, 0, 0, 0, 1, 12, 0, 4, 13, 0, 0, 0, 1, 4, 9, 0, 0, 0,
];

/// `NEWSET` attributes of `set` (created empty; its elements are sent after).
fn set_body(table: &str, name: &str, set: &Set, id: u32) -> Result<Vec<u8>, String> {
    const INTERVAL: u32 = 0x4;
    const MAP: u32 = 0x8;
    const TIMEOUT: u32 = 0x10;
    let (key_type, key_len, udata): (u32, u32, &[u8]) = match (set.key, set.verdict_map) {
        (KeyType::Ipv4, false) => (7, 4, UDATA_ADDR),
        (KeyType::Ipv6, false) => (8, 16, UDATA_ADDR),
        (KeyType::Ipv4, true) => (7, 4, UDATA_ADDR_MAP),
        (KeyType::Ipv6, true) => (8, 16, UDATA_ADDR_MAP),
        (KeyType::TaggedIpv4, false) => (0x4107, 12, UDATA_TAGGED_V4),
        (KeyType::TaggedIpv6, false) => (0x4108, 24, UDATA_TAGGED_V6),
        (_, true) => return Err(format!("set {name}: a tagged verdict map")),
    };
    let flags = match (set.interval, set.timeout, set.verdict_map, set.key.is_tagged()) {
        (false, false, false, false) => 0,
        (true, false, false, false) => INTERVAL,
        (false, true, false, _) => TIMEOUT,
        (false, false, true, false) => MAP,
        _ => return Err(format!("set {name}: a declaration the netlink path does not write")),
    };
    let mut b = Vec::new();
    put_str(&mut b, 1, table);
    put_str(&mut b, 2, name);
    put_u32(&mut b, 3, flags);
    put_u32(&mut b, 4, key_type);
    put_u32(&mut b, 5, key_len);
    if set.verdict_map {
        put_u32(&mut b, 6, 0xffff_ff00);
        put_u32(&mut b, 7, 0);
    }
    put_u32(&mut b, 10, id);
    if set.timeout {
        let size = if set.key.is_tagged() { super::SHARED_SET_SIZE } else { super::TIMEOUT_SET_SIZE };
        nest(&mut b, 9, |o| put_u32(o, 1, size as u32));
    }
    put(&mut b, 13, udata);
    Ok(b)
}

/// A hook's number and priority (`filter`, `mangle - 5`, `srcnat + 1`, …).
fn hook_numbers(hook: &Hook) -> Result<(u32, i32), String> {
    let number = match hook.hook {
        "prerouting" => 0,
        "input" => 1,
        "forward" => 2,
        "output" => 3,
        "postrouting" => 4,
        other => return Err(format!("hook {other}")),
    };
    let base = |name: &str| match name {
        "raw" => Some(-300),
        "mangle" => Some(-150),
        "dstnat" => Some(-100),
        "filter" => Some(0),
        "security" => Some(50),
        "srcnat" => Some(100),
        n => n.parse().ok(),
    };
    let p = hook.priority;
    let priority = match p.split_once(' ') {
        None => base(p),
        Some((name, rest)) => match rest.split_once(' ') {
            Some(("+", n)) => base(name).zip(n.parse::<i32>().ok()).map(|(b, n)| b + n),
            Some(("-", n)) => base(name).zip(n.parse::<i32>().ok()).map(|(b, n)| b - n),
            _ => None,
        },
    }
    .ok_or_else(|| format!("priority {p}"))?;
    Ok((number, priority))
}

/// Every message that replaces the kernel's table named like `table` with it, except
/// the elements: the table created (so deleting it cannot fail), deleted and created
/// again, the named counters, the sets, the regular and then the base chains, the
/// rules. The caller adds the elements after these (map elements jump to the chains).
/// An error names what the netlink path cannot write (then `nft` must).
pub(crate) fn replace_messages(table: &Table) -> Result<Vec<Message>, String> {
    let name = table.name.as_str();
    let mut out = Vec::new();
    let mut tbl = Vec::new();
    put_str(&mut tbl, 1, name);
    let mut created = tbl.clone();
    put_u32(&mut created, 2, 0);
    out.push(message(MSG_NEWTABLE, false, created.clone(), format!("table {name}")));
    out.push(message(MSG_DELTABLE, false, tbl, format!("table {name}")));
    out.push(message(MSG_NEWTABLE, false, created, format!("table {name}")));
    for counter in super::COUNTERS {
        let mut b = Vec::new();
        put_str(&mut b, 1, name);
        put_str(&mut b, 2, counter);
        put_u32(&mut b, 3, 1);
        nest(&mut b, 4, |o| {
            put(o, 1, &0u64.to_be_bytes());
            put(o, 2, &0u64.to_be_bytes());
        });
        out.push(message(MSG_NEWOBJ, true, b, format!("counter {counter}")));
    }
    // In `nft`'s order (the rendered block's): plain sets, regular chains, maps (their
    // elements jump to those chains), base chains; `nft list` shows them in it.
    let mut id = 0u32;
    let mut sets = |out: &mut Vec<Message>, maps: bool| -> Result<(), String> {
        for (set_name, set) in table.sets.iter().filter(|(_, s)| s.verdict_map == maps) {
            id += 1;
            out.push(set_message(name, set_name, set, id)?);
        }
        Ok(())
    };
    let regular = table.chains.iter().filter(|(_, c)| c.hook.is_none());
    let base = table.chains.iter().filter(|(_, c)| c.hook.is_some());
    sets(&mut out, false)?;
    for (chain_name, chain) in regular.clone() {
        out.push(chain_message(name, chain_name, chain)?);
    }
    sets(&mut out, true)?;
    for (chain_name, chain) in base.clone() {
        out.push(chain_message(name, chain_name, chain)?);
    }
    for (chain_name, chain) in regular.chain(base) {
        rule_messages(&mut out, name, chain_name, chain, &mut id)?;
    }
    Ok(out)
}

fn message(kind: u16, create: bool, body: Vec<u8>, what: String) -> Message {
    Message { kind, create, append: false, body, what, new_set: None }
}

/// `NEWSET` of `set` (created empty) with transaction id `id`.
fn set_message(table: &str, name: &str, set: &Set, id: u32) -> Result<Message, String> {
    let mut m = message(MSG_NEWSET, true, set_body(table, name, set, id)?, format!("set {name}"));
    m.new_set = Some((name.to_string(), id));
    Ok(m)
}

/// `NEWCHAIN` of `chain` (empty).
fn chain_message(table: &str, name: &str, chain: &super::Chain) -> Result<Message, String> {
    let mut b = Vec::new();
    put_str(&mut b, 1, table);
    put_str(&mut b, 3, name);
    if let Some(hook) = &chain.hook {
        let (number, priority) = hook_numbers(hook).map_err(|e| format!("chain {name}: {e}"))?;
        put_str(&mut b, 7, hook.chain_type);
        put_u32(&mut b, 5, 1);
        nest(&mut b, 4, |o| {
            put_u32(o, 1, number);
            put(o, 2, &priority.to_be_bytes());
        });
    }
    Ok(message(MSG_NEWCHAIN, true, b, format!("chain {name}")))
}

/// A message with the table's and one object's name (`DELRULE` of a whole chain,
/// `DELSET`, `DELCHAIN`).
fn named(kind: u16, table: &str, name_attr: u16, name: &str, what: String) -> Message {
    let mut b = Vec::new();
    put_str(&mut b, 1, table);
    put_str(&mut b, name_attr, name);
    message(kind, false, b, what)
}

/// Append `chain`'s rules (each after its anonymous sets, whose transaction ids count
/// on from `id`).
fn rule_messages(
    out: &mut Vec<Message>,
    table: &str,
    chain_name: &str,
    chain: &super::Chain,
    id: &mut u32,
) -> Result<(), String> {
    for (i, text) in chain.rules.iter().enumerate() {
        let rule = parse(text).map_err(|e| format!("chain {chain_name} rule {i} ({text}): {e}"))?;
        let what = format!("chain {chain_name} rule {i} ({text})");
        let mut ids = Vec::new();
        for set in &rule.anon {
            *id += 1;
            ids.push(*id);
            out.push(message(MSG_NEWSET, true, anon_set_body(table, set, *id), what.clone()));
            out.push(message(MSG_NEWSETELEM, true, anon_elements_body(table, set, *id), what.clone()));
        }
        out.push(Message {
            kind: MSG_NEWRULE,
            create: true,
            append: true,
            body: rule_body(table, chain_name, &rule, &ids),
            what,
            new_set: None,
        });
    }
    Ok(())
}

/// Messages to send before a change's element changes, and after them.
pub(crate) type BeforeAfter = (Vec<Message>, Vec<Message>);

/// The messages of a change from `old` to `new` that [`super::diff`] would send as a
/// script, in its order: `before` the element changes (new chains, new sets, the rules
/// of new or changed regular chains), `after` them (the rules of changed base chains,
/// then what is gone: chains flushed, sets deleted, chains deleted). `None` for a
/// change only a full replace makes (the table's name, a set's declaration, a base
/// chain's hook, a new base chain); an error names what the netlink path does not
/// write.
pub(crate) fn delta_messages(old: &Table, new: &Table) -> Result<Option<BeforeAfter>, String> {
    if super::diff::needs_replace(old, new) {
        return Ok(None);
    }
    let t = new.name.as_str();
    let (mut before, mut after) = (Vec::new(), Vec::new());
    let mut id = 0u32;
    for (name, chain) in new.chains.iter().filter(|(n, _)| !old.chains.contains_key(*n)) {
        before.push(chain_message(t, name, chain)?);
    }
    for (name, set) in new.sets.iter().filter(|(n, _)| !old.sets.contains_key(*n)) {
        id += 1;
        before.push(set_message(t, name, set, id)?);
    }
    for (base, out) in [(false, &mut before), (true, &mut after)] {
        for (name, chain) in new.chains.iter().filter(|(_, c)| c.hook.is_some() == base) {
            let was = old.chains.get(name);
            if was.is_some_and(|b| b.rules == chain.rules) {
                continue;
            }
            if was.is_some() {
                out.push(named(MSG_DELRULE, t, 2, name, format!("chain {name} (flush)")));
            }
            rule_messages(out, t, name, chain, &mut id)?;
        }
    }
    let gone_chains: Vec<&super::Text> = old.chains.keys().filter(|n| !new.chains.contains_key(*n)).collect();
    for name in &gone_chains {
        after.push(named(MSG_DELRULE, t, 2, name, format!("chain {name} (flush)")));
    }
    for name in old.sets.keys().filter(|n| !new.sets.contains_key(*n)) {
        after.push(named(MSG_DELSET, t, 2, name, format!("set {name} (delete)")));
    }
    for name in &gone_chains {
        after.push(named(MSG_DELCHAIN, t, 3, name, format!("chain {name} (delete)")));
    }
    Ok(Some((before, after)))
}

/// `NEWSET` attributes of an anonymous constant set with transaction id `id`.
fn anon_set_body(table: &str, set: &AnonSet, id: u32) -> Vec<u8> {
    const ANONYMOUS_CONSTANT: u32 = 0x3;
    let mut b = Vec::new();
    put_str(&mut b, 1, table);
    put_str(&mut b, 2, "__set%d");
    put_u32(&mut b, 3, ANONYMOUS_CONSTANT);
    put_u32(&mut b, 4, set.key_type);
    put_u32(&mut b, 5, set.key_len);
    put_u32(&mut b, 10, id);
    nest(&mut b, 9, |o| put_u32(o, 1, set.elements.len() as u32));
    put(&mut b, 13, set.udata);
    b
}

/// `NEWSETELEM` attributes: the keys of the anonymous set with transaction id `id`.
fn anon_elements_body(table: &str, set: &AnonSet, id: u32) -> Vec<u8> {
    let mut b = Vec::new();
    put_str(&mut b, 1, table);
    put_str(&mut b, 2, "__set%d");
    put_u32(&mut b, 4, id);
    nest(&mut b, 3, |o| {
        for key in &set.elements {
            nest(o, 1, |o| put_data(o, 1, key));
        }
    });
    b
}

/// `NEWRULE` attributes: `rule` appended to `chain` (its anonymous sets created with
/// the transaction ids `anon_ids`).
pub(crate) fn rule_body(table: &str, chain: &str, rule: &Rule, anon_ids: &[u32]) -> Vec<u8> {
    let mut b = Vec::new();
    put_str(&mut b, 1, table);
    put_str(&mut b, 2, chain);
    nest(&mut b, 4, |o| rule.expressions(o, anon_ids));
    if let Some(u) = rule.userdata() {
        put(&mut b, 7, &u);
    }
    b
}

/// The data of `bytes` as `nft --debug=netlink` prints it: 32-bit words, each read in
/// host (little-endian) order, zero-padded.
fn words_hex(bytes: &[u8]) -> String {
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

/// The expression as `nft --debug=netlink` prints it (the tests compare the two).
impl fmt::Display for Expr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let meta = |k: u32| match k {
            META_NFPROTO => "nfproto",
            META_L4PROTO => "l4proto",
            _ => "?",
        };
        match self {
            Expr::Meta { key, dreg } => write!(f, "[ meta load {} => reg {dreg} ]", meta(*key)),
            Expr::Ct { dreg, .. } => write!(f, "[ ct load direction => reg {dreg} ]"),
            Expr::Payload { base, offset, len, dreg } => {
                let b = if *base == PAYLOAD_NETWORK { "network" } else { "transport" };
                write!(f, "[ payload load {len}b @ {b} header + {offset} => reg {dreg} ]")
            }
            Expr::Cmp { sreg, data } => write!(f, "[ cmp eq reg {sreg} {} ]", words_hex(data)),
            Expr::Bitwise { reg, mask, xor } => {
                write!(f, "[ bitwise reg {reg} = ( reg {reg} & {} ) ^ {} ]", words_hex(mask), words_hex(xor))
            }
            Expr::Lookup { set, sreg, verdict, invert, .. } => {
                write!(f, "[ lookup reg {sreg} set {set}")?;
                if *verdict {
                    write!(f, " dreg 0")?;
                }
                if *invert {
                    write!(f, " 0x1")?;
                }
                write!(f, " ]")
            }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn debug(rule: &str) -> Vec<String> {
        parse(rule).unwrap().exprs.iter().map(|e| e.to_string()).collect()
    }

    #[test]
    fn a_port_match_is_protocol_then_port() {
        assert_eq!(
            debug(r#"ip daddr @r0 tcp dport 443 counter name "fw-allow" counter accept comment "egress[0..98]""#),
            [
                "[ meta load nfproto => reg 1 ]",
                "[ cmp eq reg 1 0x00000002 ]",
                "[ payload load 4b @ network header + 16 => reg 1 ]",
                "[ lookup reg 1 set r0 ]",
                "[ meta load l4proto => reg 1 ]",
                "[ cmp eq reg 1 0x00000006 ]",
                "[ payload load 2b @ transport header + 2 => reg 1 ]",
                "[ cmp eq reg 1 0x0000bb01 ]",
                "[ objref type 1 name fw-allow ]",
                "[ counter pkts 0 bytes 0 ]",
                "[ immediate reg 0 accept ]",
            ]
        );
        assert_eq!(parse(r#"accept comment "egress[3]""#).unwrap().userdata().unwrap(), b"\x00\x0aegress[3]\x00");
    }

    #[test]
    fn prefixes_on_byte_boundaries_compare_their_bytes_others_are_masked() {
        assert_eq!(
            debug("ip daddr 198.51.100.0/24 drop")[2..4],
            ["[ payload load 3b @ network header + 16 => reg 1 ]", "[ cmp eq reg 1 0x006433c6 ]"]
        );
        assert_eq!(
            debug("ip daddr 198.51.100.0/25 drop")[3],
            "[ bitwise reg 1 = ( reg 1 & 0x80ffffff ) ^ 0x00000000 ]"
        );
        assert_eq!(debug("ip daddr 0.0.0.0/0 drop")[3], "[ bitwise reg 1 = ( reg 1 & 0x00000000 ) ^ 0x00000000 ]");
        assert!(parse("ip daddr 198.51.100.1/24 drop").is_err(), "host bits");
        assert!(parse("ip daddr 2001:db8::/32 drop").is_err(), "family");
    }

    #[test]
    fn hook_priorities_are_the_keyword_plus_or_minus_an_offset() {
        let at =
            |hook: &'static str, priority: &'static str| hook_numbers(&Hook { chain_type: "filter", hook, priority });
        assert_eq!(at("forward", "filter"), Ok((2, 0)));
        assert_eq!(at("forward", "mangle"), Ok((2, -150)));
        assert_eq!(at("prerouting", "dstnat + 10"), Ok((0, -90)));
        assert_eq!(at("postrouting", "srcnat - 1"), Ok((4, 99)));
        assert_eq!(at("input", "filter - 5"), Ok((1, -5)));
        assert!(at("forward", "filter * 2").is_err());
        assert!(at("ingress", "filter").is_err());
    }

    #[test]
    fn anonymous_sets_hold_the_listed_keys_in_order() {
        let rule = parse("ip daddr 192.0.2.0/24 meta l4proto . th dport { tcp . 53, udp . 53 } accept").unwrap();
        assert_eq!(rule.anon.len(), 1);
        assert_eq!(rule.anon[0].elements, [vec![6, 0, 0, 0, 0, 53, 0, 0], vec![17, 0, 0, 0, 0, 53, 0, 0]]);
        let icmp = parse("icmpv6 type { nd-router-solicit, nd-redirect } accept").unwrap();
        assert_eq!(icmp.anon[0].elements, [vec![133], vec![137]]);
        assert!(parse("icmpv6 type { echo-request } accept").is_err());
    }

    #[test]
    fn what_is_not_in_the_vocabulary_is_refused_by_name() {
        for rule in [
            "ip daddr @a ip dscp set 8 return",
            "meta l4proto { udp, tcp } accept",
            "snat ip to 192.0.2.1",
            "accept drop",
            r#"comment "x" accept"#,
            "ip daddr @a ip6 daddr @b accept",
        ] {
            assert!(parse(rule).is_err(), "{rule}");
        }
        assert!(parse("log prefix \"x\" drop").unwrap_err().contains("log"));
    }
}
