//! egressd's table as nf_tables netlink messages, for sending it without an `nft`
//! process: [`replace_messages`] (a full replace) and [`delta_messages`] (the change
//! [`super::diff`] would script), which [`crate::dataplane::elements::ElementWriter`]
//! sends with the elements as one transaction, and [`creation_messages`] (a table the
//! kernel does not have yet), which it may send in several.
//!
//! The compiler builds rules as typed values ([`super::rule::Rule`], one variant per
//! phrase of the vocabulary below); [`encode`] turns one into the kernel expressions
//! `nft` 1.0.6 would generate for it — the same expressions, registers, lengths and
//! byte order, so `nft list` shows a table sent this way exactly as one `nft -f` loaded
//! (checked against `nft --debug=netlink` in the tests, which read the rendered text
//! back with [`parse`], and by listing both in a network namespace in
//! `tests/wire_netns.rs`). The one value it does not encode, an anonymous set of
//! addresses ([`Unencodable::Unwritten`]), is an error naming the rule: the caller then
//! sends the table through `nft`.
//!
//! The vocabulary: `meta nfproto ipv4|ipv6`; `ip|ip6 saddr|daddr` followed by `@set`,
//! `!= @set`, `and <mask> @set`, `vmap @map`, an address or a prefix; `tcp|udp|sctp dport <n>`; `meta
//! l4proto <proto>`, `meta l4proto { <proto>, … }` and then `th sport|dport <n>`; `ct
//! direction original|reply`; `ct state new|established`; `ct original proto-dst <n>`; `ct original
//! ip|ip6 saddr|daddr @set`; `fib saddr . iif oif missing`; a tagged lookup (`numgen
//! random mod 1 offset <hi> . numgen random mod 1 offset <lo> . ip|ip6 daddr @set`, see
//! [`super::Slot`]); `ip|ip6 dscp set <n>`; `limit rate [over] <n>/second burst <n>
//! packets`; `log prefix "<text>" group <n> [queue-threshold <n>]`; `counter`; `counter
//! name "<name>"`; `accept`, `drop`, `return`, `jump <chain>`, `goto <chain>`; `comment
//! "<text>"` last; EgressIP's `meta mark set meta mark and <m> or <v>`, `ct mark set ct
//! mark or <v>`, `meta|ct mark and <m> ==|!= <v>`; the firewall's verified flows' `ct mark
//! and <m> [or <v>] @set`, `ct mark set ct mark and <m> or <v>`; `rt ip|ip6 nexthop [!=] @set`, `snat
//! ip|ip6 to <address>|ip saddr|ip6 saddr`; the DNS proxy's `tproxy ip|ip6 to :<port>` and `notrack`;
//! the EgressIP tunnel's `@th,<offset>,<bits> <value>` (byte-aligned), `tcp flags syn` and `tcp
//! option maxseg size set rt mtu`. That is every rule egressd writes.

use super::{KeyType, Set, Table};

mod encode;
mod expr;
pub use encode::Unencodable;
pub(crate) use encode::encode;
use expr::*;

/// Read one rule of the compiler's vocabulary (module docs) as kernel expressions (the
/// tests' way from rendered text to what the netlink path sends).
pub(crate) fn parse(rule: &str) -> Result<KernelRule, WireError> {
    let typed: super::rule::Rule = rule.parse().map_err(WireError::Read)?;
    encode(&typed).map_err(WireError::Encode)
}

/// What the netlink path does not write (the caller then sends the table through `nft`),
/// naming the chain, rule or set.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// A rule the encoder refuses.
    #[error("chain {chain} rule {index} ({rule}): {source}")]
    Rule {
        /// The chain.
        chain: String,
        /// The rule's position in it.
        index: usize,
        /// The rule's text.
        rule: String,
        /// Why.
        source: Unencodable,
    },
    /// A base chain's hook or priority.
    #[error("chain {chain}: {source}")]
    Hook {
        /// The chain.
        chain: String,
        /// Why.
        source: super::HookError,
    },
    /// A set declaration.
    #[error("set {set}: {why}")]
    Set {
        /// The set.
        set: String,
        /// What it declares.
        why: &'static str,
    },
    /// An element its set cannot hold ([`super::Key::fits`]).
    #[error("an element the netlink path does not write")]
    Element,
    /// Rule text that is not of the vocabulary ([`parse`], for the tests).
    #[error("{0}")]
    Read(super::rule::ParseError),
    /// A rule the encoder refuses ([`parse`], for the tests).
    #[error("{0}")]
    Encode(Unencodable),
}

// --- netlink attributes -----------------------------------------------------------

const NLA_F_NESTED: u16 = 0x8000;

/// Append attribute `ty` with `value` (padded to 4 bytes).
pub fn put(out: &mut Vec<u8>, ty: u16, value: &[u8]) {
    let len = 4 + value.len();
    out.extend((len as u16).to_ne_bytes());
    out.extend(ty.to_ne_bytes());
    out.extend(value);
    out.resize(out.len() + (len.next_multiple_of(4) - len), 0);
}

/// Append a string attribute (NUL-terminated).
pub fn put_str(out: &mut Vec<u8>, ty: u16, value: &str) {
    let mut v = Vec::with_capacity(value.len() + 1);
    v.extend(value.as_bytes());
    v.push(0);
    put(out, ty, &v);
}

/// Append a big-endian u32 attribute.
pub fn put_u32(out: &mut Vec<u8>, ty: u16, value: u32) {
    put(out, ty, &value.to_be_bytes());
}

/// Append a nested attribute whose contents `inner` writes.
pub fn nest(out: &mut Vec<u8>, ty: u16, inner: impl FnOnce(&mut Vec<u8>)) {
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

// --- the table's messages ---------------------------------------------------------

/// `NFT_MSG_*` types (the subsystem byte is added by the sender).
pub const MSG_NEWTABLE: u16 = 0;
/// `NFT_MSG_DELTABLE`.
pub const MSG_DELTABLE: u16 = 2;
pub(crate) const MSG_NEWCHAIN: u16 = 3;
pub(crate) const MSG_DELCHAIN: u16 = 5;
/// `NFT_MSG_NEWRULE`.
pub const MSG_NEWRULE: u16 = 6;
pub(crate) const MSG_DELRULE: u16 = 8;
pub(crate) const MSG_DELSET: u16 = 11;
pub(crate) const MSG_NEWSET: u16 = 9;
pub(crate) const MSG_NEWSETELEM: u16 = 12;
pub(crate) const MSG_NEWOBJ: u16 = 18;

/// One nf_tables message of a batch: type, whether it creates (`NLM_F_CREATE`) and
/// appends (`NLM_F_APPEND`), its attributes, and what it is (for error messages).
#[derive(Debug, Clone)]
pub struct Message {
    /// The nf_tables message type (`MSG_NEWRULE`, ...).
    pub kind: u16,
    /// `NLM_F_CREATE`.
    pub create: bool,
    /// `NLM_F_APPEND`.
    pub append: bool,
    /// The attributes, encoded.
    pub body: Vec<u8>,
    /// What it is, for an error naming it.
    pub what: What,
    /// For a named set's `NEWSET`: its name and transaction id (its elements may then
    /// follow by id, see the agent's `dataplane::elements`).
    pub new_set: Option<(String, u32)>,
}

/// What a message is, for the error that names a message the kernel refused. A rule's
/// is its chain's rule list and index, written out only when an error names it: a
/// replace of 100k rules kept a 250-byte description per rule alive until the kernel
/// answered (bench/FINDINGS.md, "peak RSS").
#[derive(Debug, Clone)]
pub enum What {
    /// Described already.
    Text(String),
    /// Rule `index` of `rules`, the rule list of `chain`.
    Rule {
        /// The chain.
        chain: super::Text,
        /// Its rules.
        rules: std::sync::Arc<Vec<super::rule::Rule>>,
        /// This rule's index in them.
        index: usize,
    },
}

impl std::fmt::Display for What {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            What::Text(t) => f.write_str(t),
            What::Rule { chain, rules, index } => {
                let text = rules.get(*index).map(ToString::to_string).unwrap_or_default();
                write!(f, "chain {chain} rule {index} ({text})")
            }
        }
    }
}

impl From<String> for What {
    fn from(text: String) -> Self {
        What::Text(text)
    }
}

/// The userdata nft 1.0.6 attaches to a set of each kind (key byte order; for maps the
/// data's; for tagged sets the `typeof` expressions), copied from what it sends, so
/// `nft list` shows the set as it declared it.
const UDATA_ADDR: &[u8] = &[0, 4, 2, 0, 0, 0];
/// A `type mark` set's: host byte order.
const UDATA_MARK: &[u8] = &[0, 4, 1, 0, 0, 0];
const UDATA_ADDR_MAP: &[u8] = &[0, 4, 2, 0, 0, 0, 1, 4, 0, 0, 0, 0, 6, 4, 0, 0, 0, 0];
/// An address map to `classid`: the key in network byte order, the data in host order.
const UDATA_ADDR_CLASSID_MAP: &[u8] = &[0, 4, 2, 0, 0, 0, 1, 4, 1, 0, 0, 0, 6, 4, 0, 0, 0, 0];
/// A `classid` verdict map: the key in host byte order.
const UDATA_CLASSID_VERDICT_MAP: &[u8] = &[0, 4, 1, 0, 0, 0, 1, 4, 0, 0, 0, 0, 6, 4, 0, 0, 0, 0];
/// nft's `classid` data type id.
const TYPE_CLASSID: u32 = 23;
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

/// Userdata of `typeof meta l4proto . th dport . ip daddr` sets, as nft 1.0.6 sends it.
const UDATA_PORT_V4: &[u8] = &[
    0, 4, 0, 0, 0, 0, 3, 68, 0, 4, 13, 0, 0, 0, 1, 60, 0, 14, 0, 4, 9, 0, 0, 0, 1, 6, 0, 4, 16, 0, 0, 0, 1, 20, 0, 4,
    7, 0, 0, 0, 1, 12, 0, 4, 11, 0, 0, 0, 1, 4, 2, 0, 0, 0, 2, 20, 0, 4, 7, 0, 0, 0, 1, 12, 0, 4, 12, 0, 0, 0, 1, 4,
    12, 0, 0, 0,
];
/// The same with `ip6 daddr`.
const UDATA_PORT_V6: &[u8] = &[
    0, 4, 0, 0, 0, 0, 3, 68, 0, 4, 13, 0, 0, 0, 1, 60, 0, 14, 0, 4, 9, 0, 0, 0, 1, 6, 0, 4, 16, 0, 0, 0, 1, 20, 0, 4,
    7, 0, 0, 0, 1, 12, 0, 4, 11, 0, 0, 0, 1, 4, 2, 0, 0, 0, 2, 20, 0, 4, 7, 0, 0, 0, 1, 12, 0, 4, 13, 0, 0, 0, 1, 4, 9,
    0, 0, 0,
];

/// `payload load` of the destination address (IPv4 or IPv6) into `dreg`.
fn daddr_load(v6: bool, dreg: u32) -> Expr {
    Expr::Payload { base: PAYLOAD_NETWORK, offset: if v6 { 24 } else { 16 }, len: if v6 { 16 } else { 4 }, dreg }
}

/// `NEWSET` attributes of `set` (created empty; its elements are sent after).
fn set_body(table: &str, name: &str, set: &Set, id: u32) -> Result<Vec<u8>, WireError> {
    let refused = |why| Err(WireError::Set { set: name.to_string(), why });
    const INTERVAL: u32 = 0x4;
    const MAP: u32 = 0x8;
    const TIMEOUT: u32 = 0x10;
    use super::Data;
    let (key_type, key_len, udata): (u32, u32, &[u8]) = match (set.key, set.data) {
        (KeyType::Ipv4, Data::None) => (7, 4, UDATA_ADDR),
        (KeyType::Ipv6, Data::None) => (8, 16, UDATA_ADDR),
        (KeyType::Ipv4, Data::Verdict) => (7, 4, UDATA_ADDR_MAP),
        (KeyType::Ipv6, Data::Verdict) => (8, 16, UDATA_ADDR_MAP),
        (KeyType::Ipv4, Data::Classid) => (7, 4, UDATA_ADDR_CLASSID_MAP),
        (KeyType::Ipv6, Data::Classid) => (8, 16, UDATA_ADDR_CLASSID_MAP),
        (KeyType::Classid, Data::Verdict) => (TYPE_CLASSID, 4, UDATA_CLASSID_VERDICT_MAP),
        (KeyType::TaggedIpv4, Data::None) => (0x4107, 12, UDATA_TAGGED_V4),
        (KeyType::TaggedIpv6, Data::None) => (0x4108, 24, UDATA_TAGGED_V6),
        (KeyType::Mark, Data::None) => (19, 4, UDATA_MARK),
        (KeyType::PortIpv4, Data::None) => (0xc347, 12, UDATA_PORT_V4),
        (KeyType::PortIpv6, Data::None) => (0xc348, 24, UDATA_PORT_V6),
        _ => return refused("a map keyed or valued otherwise than egressd declares them"),
    };
    const CONCAT: u32 = 0x80;
    let map = set.data != Data::None;
    let flags = match (set.interval, set.timeout, map, set.key.is_tagged()) {
        _ if set.key.is_ported() && set.interval && !set.timeout && !map => INTERVAL | CONCAT,
        _ if set.key.is_ported() => return refused("a ported set is a plain interval set"),
        (false, false, false, false) => 0,
        (true, false, false, false) => INTERVAL,
        (false, true, false, _) => TIMEOUT,
        (false, false, true, false) => MAP,
        _ => return refused("a declaration the netlink path does not write"),
    };
    let mut b = Vec::new();
    put_str(&mut b, 1, table);
    put_str(&mut b, 2, name);
    put_u32(&mut b, 3, flags);
    put_u32(&mut b, 4, key_type);
    put_u32(&mut b, 5, key_len);
    match set.data {
        Data::None => {}
        Data::Verdict => {
            put_u32(&mut b, 6, 0xffff_ff00);
            put_u32(&mut b, 7, 0);
        }
        Data::Classid => {
            put_u32(&mut b, 6, TYPE_CLASSID);
            put_u32(&mut b, 7, 4);
        }
    }
    put_u32(&mut b, 10, id);
    if set.key.is_ported() {
        // The concatenation's fields: protocol, port, address (bytes).
        let address = if set.key.is_v6() { 16 } else { 4 };
        nest(&mut b, 9, |o| {
            nest(o, 2, |o| {
                for len in [1, 2, address] {
                    nest(o, 1, |o| put_u32(o, 1, len));
                }
            })
        });
    }
    if set.timeout {
        let size = if set.key.is_tagged() { super::SHARED_SET_SIZE } else { super::TIMEOUT_SET_SIZE };
        nest(&mut b, 9, |o| put_u32(o, 1, size as u32));
    }
    put(&mut b, 13, udata);
    Ok(b)
}

/// Every message that replaces the kernel's table named like `table` with it, except
/// the elements: the table created (so deleting it cannot fail), deleted, then
/// [`creation_messages`]. The caller adds the elements after their sets' `NEWSET`
/// (map elements jump to the chains). An error names what the netlink path cannot
/// write (then `nft` must).
///
/// Each message goes to `emit` as soon as it is made (a replace of 100k rules builds
/// them into the transaction's buffer one at a time, never all at once).
pub fn replace_messages(table: &Table, emit: &mut dyn FnMut(Message)) -> Result<(), WireError> {
    let name = table.name.as_str();
    let mut tbl = Vec::new();
    put_str(&mut tbl, 1, name);
    let mut created = tbl.clone();
    put_u32(&mut created, 2, 0);
    emit(message(MSG_NEWTABLE, false, created, format!("table {name}")));
    emit(message(MSG_DELTABLE, false, tbl, format!("table {name}")));
    creation_messages(table, &mut |_, m| emit(m))
}

/// Which part of a new table a message of [`creation_messages`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// The table, its named counters, sets, regular chains and maps, all empty.
    Declared,
    /// A rule of a regular chain, or an anonymous set of the rule that follows it.
    Regular,
    /// A base chain or one of its rules: what packets enter the table through.
    Hooked,
}

/// Every message that creates `table` (as [`replace_messages`], without the replace),
/// each with its [`Part`], in this order: the table, the named counters, the plain
/// sets, the regular chains, the maps (their elements jump to those chains), the rules
/// of the regular chains, then the base chains with their rules (`nft list` shows
/// chains and sets in this order). Nothing reaches a regular chain before the
/// [`Part::Hooked`] messages, so a caller may commit what it has after any
/// [`Part::Regular`] rule (`MSG_NEWRULE`) and go on in another transaction.
pub fn creation_messages(table: &Table, emit: &mut dyn FnMut(Part, Message)) -> Result<(), WireError> {
    let name = table.name.as_str();
    let mut created = Vec::new();
    put_str(&mut created, 1, name);
    put_u32(&mut created, 2, 0);
    emit(Part::Declared, message(MSG_NEWTABLE, false, created, format!("table {name}")));
    for counter in super::COUNTERS {
        let mut b = Vec::new();
        put_str(&mut b, 1, name);
        put_str(&mut b, 2, counter);
        put_u32(&mut b, 3, 1);
        nest(&mut b, 4, |o| {
            put(o, 1, &0u64.to_be_bytes());
            put(o, 2, &0u64.to_be_bytes());
        });
        emit(Part::Declared, message(MSG_NEWOBJ, true, b, format!("counter {counter}")));
    }
    let mut id = 0u32;
    let mut sets = |emit: &mut dyn FnMut(Part, Message), maps: bool| -> Result<(), WireError> {
        for (set_name, set) in table.sets.iter().filter(|(_, s)| s.is_verdict_map() == maps) {
            id += 1;
            emit(Part::Declared, set_message(name, set_name, set, id)?);
        }
        Ok(())
    };
    let regular = table.chains.iter().filter(|(_, c)| c.hook.is_none());
    let base = table.chains.iter().filter(|(_, c)| c.hook.is_some());
    sets(emit, false)?;
    for (chain_name, chain) in regular.clone() {
        emit(Part::Declared, chain_message(name, chain_name, chain)?);
    }
    sets(emit, true)?;
    for (chain_name, chain) in regular {
        rule_messages(&mut |m| emit(Part::Regular, m), name, chain_name, chain, &mut id)?;
    }
    for (chain_name, chain) in base.clone() {
        emit(Part::Hooked, chain_message(name, chain_name, chain)?);
    }
    for (chain_name, chain) in base {
        rule_messages(&mut |m| emit(Part::Hooked, m), name, chain_name, chain, &mut id)?;
    }
    Ok(())
}

fn message(kind: u16, create: bool, body: Vec<u8>, what: impl Into<What>) -> Message {
    Message { kind, create, append: false, body, what: what.into(), new_set: None }
}

/// `NEWSET` of `set` (created empty) with transaction id `id`.
fn set_message(table: &str, name: &str, set: &Set, id: u32) -> Result<Message, WireError> {
    let mut m = message(MSG_NEWSET, true, set_body(table, name, set, id)?, format!("set {name}"));
    m.new_set = Some((name.to_string(), id));
    Ok(m)
}

/// `NEWCHAIN` of `chain` (empty).
fn chain_message(table: &str, name: &str, chain: &super::Chain) -> Result<Message, WireError> {
    let mut b = Vec::new();
    put_str(&mut b, 1, table);
    put_str(&mut b, 3, name);
    if let Some(hook) = &chain.hook {
        let (number, priority) =
            hook.numbers().map_err(|source| WireError::Hook { chain: name.to_string(), source })?;
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
    emit: &mut dyn FnMut(Message),
    table: &str,
    chain_name: &super::Text,
    chain: &super::Chain,
    id: &mut u32,
) -> Result<(), WireError> {
    for (i, chain_rule) in chain.rules.iter().enumerate() {
        let rule = encode(chain_rule).map_err(|source| WireError::Rule {
            chain: chain_name.to_string(),
            index: i,
            rule: chain_rule.to_string(),
            source,
        })?;
        let what = What::Rule { chain: chain_name.clone(), rules: chain.rules.clone(), index: i };
        let mut ids = Vec::new();
        for set in &rule.anon {
            *id += 1;
            ids.push(*id);
            emit(message(MSG_NEWSET, true, anon_set_body(table, set, *id), what.clone()));
            emit(message(MSG_NEWSETELEM, true, anon_elements_body(table, set, *id), what.clone()));
        }
        emit(Message {
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
/// change only a full replace makes ([`super::Comparison::needs_replace`]); an error
/// names what the netlink path does not write. A new base chain is declared with its
/// hook among the new chains, and gets its rules after the element changes.
pub fn delta_messages(c: &super::Comparison<'_>) -> Result<Option<BeforeAfter>, WireError> {
    use itertools::EitherOrBoth::{Both, Left, Right};
    if c.needs_replace() {
        return Ok(None);
    }
    let t = c.new.name.as_str();
    let (mut before, mut after) = (Vec::new(), Vec::new());
    let mut id = 0u32;
    // What changed, in name order (the comparison's one pass over both tables).
    let (chains, sets) = (&c.chains, &c.sets);
    for (name, chain) in chains.iter().filter_map(|p| p.as_ref().just_right()) {
        before.push(chain_message(t, name, chain)?);
    }
    for (name, set) in sets.iter().filter_map(|p| p.as_ref().just_right()) {
        id += 1;
        before.push(set_message(t, name, set, id)?);
    }
    // Rules of new or changed chains: regular ones before the element changes, base
    // ones after.
    for (base, out) in [(false, &mut before), (true, &mut after)] {
        for pair in chains {
            let (existed, (name, chain)) = match pair {
                Both(_, n) => (true, n),
                Right(n) => (false, n),
                Left(_) => continue,
            };
            if chain.hook.is_some() != base {
                continue;
            }
            if existed {
                out.push(named(MSG_DELRULE, t, 2, name, format!("chain {name} (flush)")));
            }
            rule_messages(&mut |m| out.push(m), t, name, chain, &mut id)?;
        }
    }
    let gone_chains: Vec<&super::Text> =
        chains.iter().filter_map(|p| p.as_ref().just_left().map(|(n, _)| *n)).collect();
    for name in &gone_chains {
        after.push(named(MSG_DELRULE, t, 2, name, format!("chain {name} (flush)")));
    }
    for (name, _) in sets.iter().filter_map(|p| p.as_ref().just_left()) {
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
pub(crate) fn rule_body(table: &str, chain: &str, rule: &KernelRule, anon_ids: &[u32]) -> Vec<u8> {
    let mut b = Vec::new();
    put_str(&mut b, 1, table);
    put_str(&mut b, 2, chain);
    nest(&mut b, 4, |o| rule.expressions(o, anon_ids));
    if let Some(u) = rule.userdata() {
        put(&mut b, 7, &u);
    }
    b
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
    fn a_masked_lookup_is_payload_bitwise_lookup() {
        assert_eq!(
            debug("ip daddr and 255.255.255.0 @a counter accept")[2..5],
            [
                "[ payload load 4b @ network header + 16 => reg 1 ]",
                "[ bitwise reg 1 = ( reg 1 & 0x00ffffff ) ^ 0x00000000 ]",
                "[ lookup reg 1 set a ]",
            ]
        );
        assert_eq!(
            debug("ip6 daddr and ffff:ffff:ffff:ffff:: @b accept")[3],
            "[ bitwise reg 1 = ( reg 1 & 0xffffffff 0xffffffff 0x00000000 0x00000000 ) ^ 0x00000000 0x00000000 0x00000000 0x00000000 ]"
        );
        assert!(parse("ip daddr and ffff:: @a accept").is_err(), "a mask of the other family");
    }

    #[test]
    fn a_ported_lookup_is_the_concatenation_nft_generates() {
        // `nft --debug=netlink` 1.0.6 for `meta l4proto . th dport . ip daddr @s4 counter accept`
        // (and ip6), with `@s4` an interval concatenation.
        for (rule, nfproto, daddr) in [
            ("meta l4proto . th dport . ip daddr @s counter accept", "0x00000002", "4b @ network header + 16"),
            ("meta l4proto . th dport . ip6 daddr @s counter accept", "0x0000000a", "16b @ network header + 24"),
        ] {
            assert_eq!(
                debug(rule),
                [
                    "[ meta load nfproto => reg 1 ]".to_string(),
                    format!("[ cmp eq reg 1 {nfproto} ]"),
                    "[ meta load l4proto => reg 1 ]".to_string(),
                    "[ byteorder reg 1 = hton(reg 1, 2, 1) ]".to_string(),
                    "[ payload load 2b @ transport header + 2 => reg 9 ]".to_string(),
                    format!("[ payload load {daddr} => reg 10 ]"),
                    "[ lookup reg 1 set s ]".to_string(),
                    "[ counter pkts 0 bytes 0 ]".to_string(),
                    "[ immediate reg 0 accept ]".to_string(),
                ]
            );
        }
        assert!(parse("meta l4proto . th dport . ip saddr @s accept").is_err());
    }

    #[test]
    fn hook_priorities_are_the_keyword_plus_or_minus_an_offset() {
        let at = |hook: &'static str, priority: &'static str| {
            super::super::Hook { chain_type: "filter", hook, priority }.numbers()
        };
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
    fn snooping_logging_and_dscp_are_the_expressions_nft_generates() {
        // As `nft --debug=netlink` 1.0.6 prints them (tests/wire_netns.rs compares
        // whole compiled tables the same way).
        assert_eq!(
            debug(r#"limit rate over 100/second burst 100 packets counter name "snoop-over-query" return"#),
            [
                "[ limit rate 100/second burst 100 type packets flags 0x1 ]",
                "[ objref type 1 name snoop-over-query ]",
                "[ immediate reg 0 return ]",
            ]
        );
        assert_eq!(
            debug(r#"log prefix "egressd-dns-q " group 7 queue-threshold 1"#),
            ["[ log prefix egressd-dns-q  group 7 snaplen 0 qthreshold 1 ]"]
        );
        assert_eq!(
            debug(
                "meta l4proto udp ct original proto-dst 53 ct direction reply ip daddr @p fib saddr . iif oif missing goto c"
            )[2..],
            [
                "[ ct load proto_dst => reg 1 , dir original ]",
                "[ cmp eq reg 1 0x00003500 ]",
                "[ ct load direction => reg 1 ]",
                "[ cmp eq reg 1 0x00000001 ]",
                "[ meta load nfproto => reg 1 ]",
                "[ cmp eq reg 1 0x00000002 ]",
                "[ payload load 4b @ network header + 16 => reg 1 ]",
                "[ lookup reg 1 set p ]",
                "[ fib saddr . iif oif present => reg 1 ]",
                "[ cmp eq reg 1 0x00000000 ]",
                "[ immediate reg 0 goto -> c ]",
            ]
        );
        assert_eq!(
            debug("ct direction reply ip6 daddr @p ct original ip6 daddr @s goto c")[6],
            "[ ct load dst_ip6 => reg 1 , dir original ]"
        );
        let l4 = parse("meta l4proto { udp, tcp } th sport 53 accept").unwrap();
        assert_eq!(l4.anon[0].elements, [vec![17], vec![6]]);
        assert_eq!(
            debug("ct state new accept")[..3],
            [
                "[ ct load state => reg 1 ]",
                "[ bitwise reg 1 = ( reg 1 & 0x00000008 ) ^ 0x00000000 ]",
                "[ cmp neq reg 1 0x00000000 ]",
            ]
        );
        assert_eq!(
            debug("meta nfproto ipv4 ip dscp set 46 counter return")[2..5],
            [
                "[ payload load 2b @ network header + 0 => reg 1 ]",
                "[ bitwise reg 1 = ( reg 1 & 0x000003ff ) ^ 0x0000b800 ]",
                "[ payload write reg 1 => 2b @ network header + 0 csum_type 1 csum_off 10 csum_flags 0x0 ]",
            ]
        );
        assert_eq!(
            debug("meta nfproto ipv6 ip6 dscp set 10 counter return")[3],
            "[ bitwise reg 1 = ( reg 1 & 0x00003ff0 ) ^ 0x00008002 ]"
        );
    }

    #[test]
    fn the_pod_dispatch_is_the_expressions_nft_generates() {
        // From `nft --debug=netlink` 1.0.6 for the same rules.
        assert_eq!(
            debug("meta priority set ip saddr map @pods4 meta priority vmap @ns"),
            [
                "[ meta load nfproto => reg 1 ]",
                "[ cmp eq reg 1 0x00000002 ]",
                "[ payload load 4b @ network header + 12 => reg 1 ]",
                "[ lookup reg 1 set pods4 dreg 1 ]",
                "[ meta set priority with reg 1 ]",
                "[ meta load priority => reg 1 ]",
                "[ lookup reg 1 set ns dreg 0 ]",
            ]
        );
        assert_eq!(
            debug("meta priority set ip6 saddr map @pods6 meta priority vmap @ns")[..3],
            [
                "[ meta load nfproto => reg 1 ]",
                "[ cmp eq reg 1 0x0000000a ]",
                "[ payload load 16b @ network header + 8 => reg 1 ]",
            ]
        );
        assert_eq!(
            debug("meta priority set none"),
            ["[ immediate reg 1 0x00000000 ]", "[ meta set priority with reg 1 ]"]
        );
    }

    #[test]
    fn the_dns_proxy_intercept_is_the_expressions_nft_generates() {
        // From `nft --debug=netlink` 1.0.6 for the same rule.
        assert_eq!(
            debug(
                "ip saddr @pods udp dport 53 tproxy ip to :53053 meta mark set meta mark and 0xffffefff or 0x00001000 accept"
            ),
            [
                "[ meta load nfproto => reg 1 ]",
                "[ cmp eq reg 1 0x00000002 ]",
                "[ payload load 4b @ network header + 12 => reg 1 ]",
                "[ lookup reg 1 set pods ]",
                "[ meta load l4proto => reg 1 ]",
                "[ cmp eq reg 1 0x00000011 ]",
                "[ payload load 2b @ transport header + 2 => reg 1 ]",
                "[ cmp eq reg 1 0x00003500 ]",
                "[ immediate reg 1 0x00003dcf ]",
                "[ tproxy ip port reg 1 ]",
                "[ meta load mark => reg 1 ]",
                "[ bitwise reg 1 = ( reg 1 & 0xffffefff ) ^ 0x00001000 ]",
                "[ meta set mark with reg 1 ]",
                "[ immediate reg 0 accept ]",
            ]
        );
        assert_eq!(
            parse("ip saddr 192.0.2.1 tproxy ip to :53"),
            Err(WireError::Encode(Unencodable::NoProtocol("tproxy")))
        );
        assert_eq!(
            debug("ip saddr 198.18.0.1 udp dport 53 notrack")[4..],
            [
                "[ meta load l4proto => reg 1 ]",
                "[ cmp eq reg 1 0x00000011 ]",
                "[ payload load 2b @ transport header + 2 => reg 1 ]",
                "[ cmp eq reg 1 0x00003500 ]",
                "[ notrack ]"
            ]
        );
        assert!(parse("tcp dport 53 tproxy ip to 53").is_err());
    }

    #[test]
    fn egress_ip_marks_and_nat_are_the_expressions_nft_generates() {
        assert_eq!(
            debug("meta mark set meta mark and 0xff00ffff or 0x00010000"),
            [
                "[ meta load mark => reg 1 ]",
                "[ bitwise reg 1 = ( reg 1 & 0xff00ffff ) ^ 0x00010000 ]",
                "[ meta set mark with reg 1 ]",
            ]
        );
        assert_eq!(
            debug("snat ip to 198.19.0.50"),
            ["[ immediate reg 1 0x320013c6 ]", "[ nat snat ip addr_min reg 1 ]"]
        );
        assert_eq!(
            debug("snat ip6 to 2001:db8:19::50")[0],
            "[ immediate reg 1 0xb80d0120 0x00001900 0x00000000 0x50000000 ]"
        );
        assert_eq!(
            debug(
                "meta mark and 0x00ff0000 != 0x00000000 rt ip nexthop @g4 ct mark set ct mark or 0x00ff0000 counter snat ip to ip saddr"
            ),
            [
                "[ meta load mark => reg 1 ]",
                "[ bitwise reg 1 = ( reg 1 & 0x00ff0000 ) ^ 0x00000000 ]",
                "[ cmp neq reg 1 0x00000000 ]",
                "[ rt load nexthop4 => reg 1 ]",
                "[ lookup reg 1 set g4 ]",
                "[ ct load mark => reg 1 ]",
                "[ bitwise reg 1 = ( reg 1 & 0xff00ffff ) ^ 0x00ff0000 ]",
                "[ ct set mark with reg 1 ]",
                "[ counter pkts 0 bytes 0 ]",
                "[ meta load nfproto => reg 1 ]",
                "[ cmp eq reg 1 0x00000002 ]",
                "[ payload load 4b @ network header + 12 => reg 1 ]",
                "[ nat snat ip addr_min reg 1 ]",
            ]
        );
        assert_eq!(
            debug(
                "ct direction original ct mark and 0x00ff0000 == 0x00ff0000 meta nfproto ipv6 rt ip6 nexthop != @g6 counter drop"
            )[2..9],
            [
                "[ ct load mark => reg 1 ]",
                "[ bitwise reg 1 = ( reg 1 & 0x00ff0000 ) ^ 0x00000000 ]",
                "[ cmp eq reg 1 0x00ff0000 ]",
                "[ meta load nfproto => reg 1 ]",
                "[ cmp eq reg 1 0x0000000a ]",
                "[ rt load nexthop6 => reg 1 ]",
                "[ lookup reg 1 set g6 0x1 ]",
            ]
        );
    }

    #[test]
    fn what_is_not_in_the_vocabulary_is_refused_by_name() {
        for rule in [
            "ip daddr @a ip dscp set 64 return",
            "meta l4proto { udp, icmp } accept",
            "th dport 53 accept",
            "ct original ip daddr @s accept",
            "ct state related accept",
            "fib daddr type local accept",
            "limit rate 10/minute accept",
            "dnat ip to 192.0.2.1",
            "snat ip to 2001:db8::1",
            "rt ip6 nexthop 2001:db8::1 accept",
            "meta mark set 0x1",
            "accept drop",
            r#"comment "x" accept"#,
            "ip daddr @a ip6 daddr @b accept",
        ] {
            assert!(parse(rule).is_err(), "{rule}");
        }
        assert!(parse("log prefix \"x\" drop").unwrap_err().to_string().contains("log"));
    }
}
