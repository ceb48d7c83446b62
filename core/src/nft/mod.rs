//! egressd's own typed model of its nftables table, its rendering to nft syntax, and the
//! difference between two versions of it as one atomic nft script.
//!
//! Rules are typed values ([`rule::Rule`]: matches, statements, a verdict) built only
//! from validated values (addresses, ports, protocols, chain names from
//! [`chain_name`]); their nft syntax is their `Display`, so no user string reaches nft
//! syntax unchecked, and the netlink path encodes the values ([`wire`]).

pub mod delta;
mod diff;
pub mod element;
mod render;
pub mod rule;
pub mod verified;
pub mod wire;

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};

pub use diff::diff;
pub use element::{Key, Value};

/// The kernel expressions of `rule` as `nft --debug=netlink` prints them, or why the
/// netlink path does not write it ([`wire`]; the tests compare them with nft's).
pub fn wire_debug(rule: &str) -> Result<Vec<String>, wire::WireError> {
    Ok(wire::parse(rule)?.exprs.iter().map(|e| e.to_string()).collect())
}

/// The address family of the table: `inet` covers IPv4 and IPv6 in one table.
pub const FAMILY: &str = "inet";

/// Named counters declared in every table: what DNS snooping's copy rate limits held
/// back, by class ([`crate::compile`]'s `dns-copy-<class>` chains), read by the agent
/// for `egressd_dns_snoop_dropped`; what ACL logging's limits held back (`acl-over`,
/// for `egressd_acl_log_dropped`); and the packets every EgressFirewall rule decided, by
/// verdict (`fw-allow`, `fw-deny`, `fw-audit`: `egressd_firewall_packets`); the EgressIP
/// tunnel's drops (`eip-tunnel-<reason>`: `egressd_egress_ip_tunnel_dropped`). Constant,
/// so a delta never adds or removes them.
pub(crate) const COUNTERS: [&str; 11] = [
    "snoop-over-query",
    "snoop-over-answer",
    "snoop-over-untrusted",
    "snoop-over-untracked",
    "snoop-over-spoofed",
    "acl-over",
    "fw-allow",
    "fw-deny",
    "fw-audit",
    "eip-tunnel-foreign-source",
    "eip-tunnel-unknown-key",
];

/// The `size` of timeout sets (the DNS sets): the kernel refuses elements beyond it.
/// Room for what resolution brings (a 64 KiB DNS answer holds < 4,100 addresses per
/// family) beside what snooping may learn ([`crate::dataplane::nflog`] keeps at most
/// half of it per set).
pub const TIMEOUT_SET_SIZE: usize = 65_536;

/// The `size` of a shared tagged set ([`Slot`]): every DNS name's addresses of one
/// family are in it. A cap only (the kernel's hash table grows with its elements).
pub(crate) const SHARED_SET_SIZE: usize = 1 << 20;

/// The key type of a set or map.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyType {
    /// `ipv4_addr`.
    Ipv4,
    /// `ipv6_addr`.
    Ipv6,
    /// A 64-bit tag and an IPv4 address ([`Slot`]).
    TaggedIpv4,
    /// A 64-bit tag and an IPv6 address ([`Slot`]).
    TaggedIpv6,
    /// `mark` (a conntrack or packet mark).
    Mark,
    /// A transport protocol, a destination port and an IPv4 prefix (interval:
    /// `tcp . 443 . 192.0.2.0/24`), for the ported pieces of flattened rules
    /// (`compile/boxes.rs`).
    PortIpv4,
    /// The same with an IPv6 prefix.
    PortIpv6,
    /// `classid` (a packet priority, `meta priority`): the firewall's namespace numbers.
    Classid,
}

impl KeyType {
    fn nft(self) -> &'static str {
        match self {
            KeyType::Ipv4 => "type ipv4_addr",
            KeyType::Ipv6 => "type ipv6_addr",
            KeyType::TaggedIpv4 => "typeof numgen random mod 1 . numgen random mod 1 . ip daddr",
            KeyType::TaggedIpv6 => "typeof numgen random mod 1 . numgen random mod 1 . ip6 daddr",
            KeyType::Mark => "type mark",
            KeyType::PortIpv4 => "typeof meta l4proto . th dport . ip daddr",
            KeyType::PortIpv6 => "typeof meta l4proto . th dport . ip6 daddr",
            KeyType::Classid => "type classid",
        }
    }

    /// Whether the key's address is IPv6.
    pub(crate) fn is_v6(self) -> bool {
        matches!(self, KeyType::Ipv6 | KeyType::TaggedIpv6 | KeyType::PortIpv6)
    }

    /// Whether keys are a protocol, a port and a prefix ([`KeyType::PortIpv4`]).
    pub(crate) fn is_ported(self) -> bool {
        matches!(self, KeyType::PortIpv4 | KeyType::PortIpv6)
    }

    /// Whether keys carry a [`Slot`] tag before the address.
    pub(crate) fn is_tagged(self) -> bool {
        matches!(self, KeyType::TaggedIpv4 | KeyType::TaggedIpv6)
    }
}

/// One owner's share of a set that many share: the set, and the 64-bit tag that every
/// key of that owner starts with. A rule matches its share with the tag as a constant
/// before the address (`numgen random mod 1 offset <hi> . numgen random mod 1 offset
/// <lo> . ip daddr @set`: `numgen ... mod 1` is always 0, plus the offset; nft 1.0.6 has
/// no other way to put a constant in a lookup key).
///
/// Why: nf_tables finds a set by name with a linear scan of the table's sets, for every
/// rule, element list and set it is sent, so one set per DNS name made a first sync with
/// 10,000 names cost seconds of kernel time. Shared by tag, the names are two sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Slot {
    /// The shared set.
    pub set: &'static str,
    /// The owner's tag.
    pub tag: u64,
}

impl Slot {
    /// The tag's two 32-bit halves, as the two `numgen` constants.
    fn halves(self) -> (u32, u32) {
        ((self.tag >> 32) as u32, self.tag as u32)
    }

    /// The element key of `ip` in this slot.
    pub fn key(self, ip: std::net::IpAddr) -> Key {
        Key::tagged(self.tag, ip)
    }

    /// The keys of this slot, in a set's (ordered) elements: they are next to each other.
    pub(crate) fn keys(self) -> std::ops::RangeInclusive<Key> {
        let first = Key::tagged(self.tag, std::net::Ipv4Addr::UNSPECIFIED.into());
        let last = Key::tagged(self.tag, std::net::Ipv6Addr::from(u128::MAX).into());
        first..=last
    }

    /// The match of a packet's destination in this slot.
    pub fn matched(self, family: rule::Family) -> rule::Match {
        rule::Match::TaggedIn { tag: self.tag, family, set: self.set.into() }
    }

    /// The match of a packet's destination in this slot (`family` `ip` or `ip6`).
    pub fn matches(self, family: &str) -> String {
        let (hi, lo) = self.halves();
        format!("numgen random mod 1 offset {hi} . numgen random mod 1 offset {lo} . {family} daddr @{}", self.set)
    }

    /// The kernel's key bytes: the two halves as the registers hold them (host byte
    /// order, as `numgen` writes them), then the address.
    pub fn key_bytes(tag: u64, ip: std::net::IpAddr) -> Vec<u8> {
        let mut out = Vec::with_capacity(24);
        out.extend(((tag >> 32) as u32).to_ne_bytes());
        out.extend((tag as u32).to_ne_bytes());
        match ip {
            std::net::IpAddr::V4(v4) => out.extend(v4.octets()),
            std::net::IpAddr::V6(v6) => out.extend(v6.octets()),
        }
        out
    }

    /// A tag and address from kernel key bytes ([`Slot::key_bytes`]).
    pub fn from_key_bytes(bytes: &[u8]) -> Option<(u64, std::net::IpAddr)> {
        let (hi, rest) = bytes.split_first_chunk::<4>()?;
        let (lo, addr) = rest.split_first_chunk::<4>()?;
        let tag = (u64::from(u32::from_ne_bytes(*hi)) << 32) | u64::from(u32::from_ne_bytes(*lo));
        let ip = match addr.len() {
            4 => std::net::IpAddr::from(<[u8; 4]>::try_from(addr).ok()?),
            16 => std::net::IpAddr::from(<[u8; 16]>::try_from(addr).ok()?),
            _ => return None,
        };
        Some((tag, ip))
    }
}

/// What a map's keys map to (a plain set: nothing).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Data {
    /// A plain set.
    #[default]
    None,
    /// A verdict map (`type K : verdict`): elements `jump <chain>`.
    Verdict,
    /// A data map to a packet priority (`type K : classid`): elements [`Value::Classid`].
    Classid,
}

/// A named set (`value == None` for every element) or map.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Set {
    /// Key type.
    pub key: KeyType,
    /// What the keys map to (a plain set: [`Data::None`]).
    pub data: Data,
    /// `flags interval` (prefixes as elements).
    pub interval: bool,
    /// `flags timeout`: elements carry `timeout <n>s` and leave the kernel by themselves
    /// unless refreshed.
    pub timeout: bool,
    /// Elements: key → a jump (maps), a timeout (timeout sets) or nothing.
    pub elements: Elements,
}

/// A set's or chain's name: inline up to 24 bytes, so a table of 100k sets and chains
/// costs no allocation per name.
pub type Text = compact_str::CompactString;

/// A set's elements, shared: cloning a set (or the table holding it) costs a pointer,
/// and an element map carried over unchanged from the previous compile is the same
/// allocation, which [`delta::ElementDelta::between`] skips without comparing its elements.
/// Reads go through `Deref`; the first write to a shared map copies it (`Arc::make_mut`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Elements(std::sync::Arc<BTreeMap<Key, Value>>);

impl Elements {
    /// Whether `self` and `other` are the same allocation (then they are equal).
    pub fn same(&self, other: &Elements) -> bool {
        std::sync::Arc::ptr_eq(&self.0, &other.0)
    }
}

impl std::ops::Deref for Elements {
    type Target = BTreeMap<Key, Value>;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl std::ops::DerefMut for Elements {
    fn deref_mut(&mut self) -> &mut Self::Target {
        std::sync::Arc::make_mut(&mut self.0)
    }
}

impl From<BTreeMap<Key, Value>> for Elements {
    fn from(map: BTreeMap<Key, Value>) -> Self {
        Self(std::sync::Arc::new(map))
    }
}

impl FromIterator<(Key, Value)> for Elements {
    fn from_iter<I: IntoIterator<Item = (Key, Value)>>(iter: I) -> Self {
        Self(std::sync::Arc::new(iter.into_iter().collect()))
    }
}

impl<'a> IntoIterator for &'a Elements {
    type Item = (&'a Key, &'a Value);
    type IntoIter = std::collections::btree_map::Iter<'a, Key, Value>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

impl Set {
    /// An empty plain set.
    pub fn new(key: KeyType, interval: bool) -> Self {
        Self { key, data: Data::None, interval, timeout: false, elements: Elements::default() }
    }

    /// An empty set whose elements time out.
    pub fn with_timeout(key: KeyType) -> Self {
        Self { key, data: Data::None, interval: false, timeout: true, elements: Elements::default() }
    }

    /// An empty verdict map.
    pub(crate) fn verdict_map(key: KeyType) -> Self {
        Self { key, data: Data::Verdict, interval: false, timeout: false, elements: Elements::default() }
    }

    /// An empty map to packet priorities (`type K : classid`).
    pub(crate) fn classid_map(key: KeyType) -> Self {
        Self { key, data: Data::Classid, interval: false, timeout: false, elements: Elements::default() }
    }

    /// Whether it is a verdict map (its elements jump to chains).
    pub fn is_verdict_map(&self) -> bool {
        self.data == Data::Verdict
    }

    fn declaration(&self) -> String {
        let ty = match self.data {
            Data::None => format!("{};", self.key.nft()),
            Data::Verdict => format!("{} : verdict;", self.key.nft()),
            Data::Classid => format!("{} : classid;", self.key.nft()),
        };
        let size = if self.key.is_tagged() { SHARED_SET_SIZE } else { TIMEOUT_SET_SIZE };
        match (self.interval, self.timeout) {
            (true, true) => format!("{ty} flags interval,timeout;"),
            (true, false) => format!("{ty} flags interval;"),
            (false, true) => format!("{ty} flags timeout; size {size};"),
            (false, false) => ty,
        }
    }

    fn keyword(&self) -> &'static str {
        if self.data == Data::None { "set" } else { "map" }
    }
}

/// A base chain's hook.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hook {
    /// `filter`, `nat` or `route`.
    pub chain_type: &'static str,
    /// `prerouting`, `input`, `forward`, `output`, `postrouting`.
    pub hook: &'static str,
    /// Priority expression (`filter`, `mangle`, `srcnat - 1`, `dstnat + 10`).
    pub priority: &'static str,
}

/// A hook or priority egressd does not write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HookError {
    /// Not one of the five netfilter hooks.
    #[error("hook {0}")]
    Hook(&'static str),
    /// Not a priority keyword, a number, or a keyword plus or minus a number.
    #[error("priority {0}")]
    Priority(&'static str),
}

impl Hook {
    /// The hook's number and numeric priority, as the kernel knows them (an error names
    /// a hook or priority egressd does not write).
    pub(crate) fn numbers(&self) -> Result<(u32, i32), HookError> {
        let number = match self.hook {
            "prerouting" => 0,
            "input" => 1,
            "forward" => 2,
            "output" => 3,
            "postrouting" => 4,
            other => return Err(HookError::Hook(other)),
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
        let p = self.priority;
        let priority = match p.split_once(' ') {
            None => base(p),
            Some((name, rest)) => match rest.split_once(' ') {
                Some(("+", n)) => base(name).zip(n.parse::<i32>().ok()).map(|(b, n)| b + n),
                Some(("-", n)) => base(name).zip(n.parse::<i32>().ok()).map(|(b, n)| b - n),
                _ => None,
            },
        }
        .ok_or(HookError::Priority(p))?;
        Ok((number, priority))
    }

    /// Where the kernel runs the chain: [`Self::numbers`], `None` when unreadable.
    pub(crate) fn position(&self) -> Option<(u32, i32)> {
        self.numbers().ok()
    }

    /// The base chain's declaration as nft reads it.
    pub(crate) fn declaration(&self) -> String {
        format!("type {} hook {} priority {}; policy accept;", self.chain_type, self.hook, self.priority)
    }
}

/// A chain: a base chain when `hook` is set (policy always accept: egressd never drops
/// what it has no rule for).
///
/// The rules are shared (`Arc`): an unchanged chain is the same allocation in the applied
/// and the desired table, so cloning a table and comparing unchanged chains costs a
/// pointer, not their rules.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Chain {
    /// The hook, for base chains.
    pub hook: Option<Hook>,
    /// Rules in order.
    pub rules: std::sync::Arc<Vec<rule::Rule>>,
}

impl Chain {
    /// A regular chain with `rules`.
    pub fn regular(rules: impl IntoIterator<Item = rule::Rule>) -> Self {
        Self { hook: None, rules: std::sync::Arc::new(rules.into_iter().collect()) }
    }

    /// The rules as nft text.
    pub fn texts(&self) -> Vec<String> {
        self.rules.iter().map(ToString::to_string).collect()
    }

    /// A base chain on `hook` with `rules`.
    pub fn base(hook: Hook, rules: impl IntoIterator<Item = rule::Rule>) -> Self {
        Self { hook: Some(hook), rules: std::sync::Arc::new(rules.into_iter().collect()) }
    }

    /// A regular chain of rules written as nft text (tests and tools: a text outside
    /// the vocabulary is an error).
    pub fn parsed<'a>(rules: impl IntoIterator<Item = &'a str>) -> Result<Self, rule::ParseError> {
        Ok(Self::regular(rule::parse_all(rules)?))
    }
}

/// The whole table egressd owns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Table {
    /// Table name (the agent owns exactly this table).
    pub name: String,
    /// Sets and maps by name.
    pub sets: BTreeMap<Text, Set>,
    /// Chains by name.
    pub chains: BTreeMap<Text, Chain>,
}

impl Table {
    /// An empty table.
    pub fn new(name: impl Into<String>) -> Self {
        Self { name: name.into(), sets: BTreeMap::new(), chains: BTreeMap::new() }
    }

    /// Number of rules in all chains.
    pub fn rule_count(&self) -> usize {
        self.chains.values().map(|c| c.rules.len()).sum()
    }

    /// Number of elements in all sets and maps.
    pub fn element_count(&self) -> usize {
        self.sets.values().map(|s| s.elements.len()).sum()
    }

    /// The whole table as an nft script block (what `egressd render` prints).
    pub fn render(&self) -> String {
        render::table_block(self)
    }

    /// A script that atomically replaces whatever table of this name exists with this
    /// one (`add` makes the `delete` safe when none exists).
    pub fn replace_script(&self) -> String {
        format!("add table {FAMILY} {name}\ndelete table {FAMILY} {name}\n{}", self.render(), name = self.name)
    }

    /// A script that removes the table if it exists.
    pub fn delete_script(name: &str) -> String {
        format!("add table {FAMILY} {name}\ndelete table {FAMILY} {name}\n")
    }
}

/// One name of two tables' sets or chains, met walking both in name order: only in
/// the old table (`Left`), only in the new one (`Right`), or in both.
pub(crate) type Paired<'a, V> = itertools::EitherOrBoth<(&'a Text, &'a V), (&'a Text, &'a V)>;

/// The name of a paired entry, from whichever table holds it.
fn paired_name<'a, V>(p: &Paired<'a, V>) -> &'a str {
    use itertools::EitherOrBoth::{Both, Left, Right};
    let (Left((n, _)) | Right((n, _)) | Both((n, _), _)) = p;
    n.as_str()
}

/// The entries of `old` and `new` side by side in name order, in one pass over both
/// (no lookup by name: a change's comparison of two 100k-rule tables is linear).
pub(crate) fn paired<'a, V>(
    old: &'a BTreeMap<Text, V>,
    new: &'a BTreeMap<Text, V>,
) -> impl Iterator<Item = Paired<'a, V>> {
    itertools::merge_join_by(old, new, |a, b| a.0.cmp(b.0))
}

/// What differs between two tables, found in one pass over their name-sorted sets and
/// chains: what every kind of sync (nothing, element changes, a delta, a full replace)
/// is decided and built from, so a change compares the tables once.
#[derive(Debug)]
pub struct Comparison<'a> {
    /// The table the kernel holds.
    pub old: &'a Table,
    /// The table it should hold.
    pub new: &'a Table,
    /// Sets only in one of them, or in both and not equal (declaration or elements),
    /// in name order.
    pub(crate) sets: Vec<Paired<'a, Set>>,
    /// Chains only in one of them, or in both with another hook or other rules, in
    /// name order.
    pub(crate) chains: Vec<Paired<'a, Chain>>,
}

impl<'a> Comparison<'a> {
    /// Compare `old` with `new`.
    pub fn of(old: &'a Table, new: &'a Table) -> Self {
        use itertools::EitherOrBoth::Both;
        let sets = paired(&old.sets, &new.sets).filter(|p| !matches!(p, Both((_, a), (_, b)) if a == b)).collect();
        let chains =
            paired(&old.chains, &new.chains).filter(|p| !matches!(p, Both((_, a), (_, b)) if a == b)).collect();
        Self { old, new, sets, chains }
    }

    /// Whether the tables are equal.
    pub fn is_empty(&self) -> bool {
        self.old.name == self.new.name && self.sets.is_empty() && self.chains.is_empty()
    }

    /// Whether the one difference is in the set `name`.
    pub fn only_sets(&self, name: &str) -> bool {
        self.old.name == self.new.name
            && self.chains.is_empty()
            && self.sets.len() == 1
            && self.sets.iter().all(|p| paired_name(p) == name)
    }

    /// Whether every set and chain that differs has a name `keep` accepts (and the
    /// tables' names are equal).
    pub fn only_names(&self, keep: impl Fn(&str) -> bool) -> bool {
        self.old.name == self.new.name
            && self.sets.iter().all(|p| keep(paired_name(p)))
            && self.chains.iter().all(|p| keep(paired_name(p)))
    }

    /// Whether only elements of sets both tables declare alike differ.
    pub fn elements_only(&self) -> bool {
        use itertools::EitherOrBoth::Both;
        self.old.name == self.new.name
            && self.chains.is_empty()
            && self.sets.iter().all(|p| matches!(p, Both((_, a), (_, b)) if delta::same_declaration(a, b)))
    }

    /// Whether turning `old` into `new` takes a full replace of the table: its name
    /// changed, a set of both is declared differently, a base chain's hook changed, or
    /// a new base chain shares its hook and priority with another base chain.
    ///
    /// The kernel runs base chains of one hook and priority in the order they were
    /// registered: a full replace registers them in name order, a change would register
    /// the new one last. A new base chain with a hook and priority of its own (the
    /// EgressIP chains when the first EgressIP appears) is added by a change: the order
    /// cannot differ from a fresh start's.
    pub fn needs_replace(&self) -> bool {
        use itertools::EitherOrBoth::{Both, Left, Right};
        self.old.name != self.new.name
            || self.sets.iter().any(|p| matches!(p, Both((_, a), (_, b)) if !delta::same_declaration(a, b)))
            || self.chains.iter().any(|p| match p {
                Both((_, c), (_, nc)) => nc.hook != c.hook,
                Right((name, c)) => c.hook.as_ref().is_some_and(|h| self.shares_hook(name, h)),
                Left(_) => false,
            })
    }

    /// Whether a base chain of the new table other than `name` runs at `hook`'s hook
    /// and priority (or either cannot be read).
    fn shares_hook(&self, name: &str, hook: &Hook) -> bool {
        let Some(at) = hook.position() else { return true };
        self.new
            .chains
            .iter()
            .filter(|(n, _)| n.as_str() != name)
            .filter_map(|(_, c)| c.hook.as_ref())
            .any(|h| h.position().is_none_or(|p| p == at))
    }
}

/// A readable, nft-safe chain or set name `prefix-<id>` when `id` is a DNS label
/// (namespace names are), else `prefix-h<hash>`.
pub fn chain_name(prefix: &str, id: &str) -> String {
    let readable = !id.is_empty()
        && id.len() <= 63
        && id.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !id.starts_with('-')
        && !id.ends_with('-');
    if readable {
        format!("{prefix}-{id}")
    } else {
        let digest = Sha256::digest(id.as_bytes());
        let hex: String = digest.iter().take(8).map(|b| format!("{b:02x}")).collect();
        format!("{prefix}-h{hex}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_comparison_tells_each_kind_of_change_apart() {
        let mut old = Table::new("egressd");
        let mut map = Set::verdict_map(KeyType::Ipv4);
        map.elements.insert("198.18.1.2".parse().unwrap(), "jump fw-a".parse().unwrap());
        old.sets.insert("fw-pods-v4".into(), map);
        old.chains.insert("fw-a".into(), Chain::parsed(["counter accept"]).unwrap());
        let hook = Hook { chain_type: "filter", hook: "prerouting", priority: "filter" };
        old.chains.insert(
            "firewall".into(),
            Chain::base(hook.clone(), rule::parse_all(["ip saddr vmap @fw-pods-v4"]).unwrap()),
        );
        let kinds = |new: &Table| {
            let c = Comparison::of(&old, new);
            (c.is_empty(), c.elements_only(), c.needs_replace(), c.sets.len(), c.chains.len())
        };
        assert_eq!(kinds(&old.clone()), (true, true, false, 0, 0));
        let mut element = old.clone();
        element
            .sets
            .get_mut("fw-pods-v4")
            .unwrap()
            .elements
            .insert("198.18.1.3".parse().unwrap(), "jump fw-a".parse().unwrap());
        assert_eq!(kinds(&element), (false, true, false, 1, 0));
        let mut rules = old.clone();
        rules.chains.insert("fw-a".into(), Chain::parsed(["counter drop"]).unwrap());
        assert_eq!(kinds(&rules), (false, false, false, 0, 1));
        let mut new_set = old.clone();
        new_set.sets.insert("fw-a-h0".into(), Set::new(KeyType::Ipv4, false));
        new_set.chains.remove("fw-a");
        assert_eq!(kinds(&new_set), (false, false, false, 1, 1));
        let mut declared = old.clone();
        declared.sets.insert("fw-pods-v4".into(), Set::new(KeyType::Ipv4, true));
        assert_eq!(kinds(&declared), (false, false, true, 1, 0));
        let mut base = old.clone();
        base.chains.insert("qos".into(), Chain::base(hook, Vec::new()));
        assert_eq!(kinds(&base), (false, false, true, 0, 1));
        let renamed = Table { name: "other".into(), ..old.clone() };
        assert_eq!(kinds(&renamed), (false, false, true, 0, 0));
    }

    #[test]
    fn chain_names_are_readable_or_hashed() {
        assert_eq!(chain_name("fw", "team-a"), "fw-team-a");
        let hashed = chain_name("fw", "Not A Label; drop");
        assert!(hashed.starts_with("fw-h") && hashed.len() == 20, "{hashed}");
        assert_ne!(chain_name("fw", "x.y"), chain_name("fw", "x_y"));
    }
}
