//! egressd's own typed model of its nftables table, its rendering to nft syntax, and the
//! difference between two versions of it as one atomic nft script.
//!
//! Rules are stored as nft statements built only from validated, typed values
//! (addresses, ports, protocol keywords, chain names from [`chain_name`]); no user
//! string reaches nft syntax unchecked.

pub mod delta;
mod diff;
mod render;

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};

pub use diff::diff;

/// The address family of the table: `inet` covers IPv4 and IPv6 in one table.
pub(crate) const FAMILY: &str = "inet";

/// Named counters declared in every table: what DNS snooping's copy rate limits held
/// back, by class ([`crate::compile`]'s `dns-copy-<class>` chains), read by the agent
/// for `egressd_dns_snoop_dropped`; what ACL logging's limits held back (`acl-over`,
/// for `egressd_acl_log_dropped`); and the packets every EgressFirewall rule decided, by
/// verdict (`fw-allow`, `fw-deny`, `fw-audit`: `egressd_firewall_packets`). Constant, so
/// a delta never adds or removes them.
pub(crate) const COUNTERS: [&str; 9] = [
    "snoop-over-query",
    "snoop-over-answer",
    "snoop-over-untrusted",
    "snoop-over-untracked",
    "snoop-over-spoofed",
    "acl-over",
    "fw-allow",
    "fw-deny",
    "fw-audit",
];

/// The `size` of timeout sets (the DNS sets): the kernel refuses elements beyond it.
/// Room for what resolution brings (a 64 KiB DNS answer holds < 4,100 addresses per
/// family) beside what snooping may learn ([`crate::dataplane::nflog`] keeps at most
/// half of it per set).
pub(crate) const TIMEOUT_SET_SIZE: usize = 65_536;

/// The key type of a set or map.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyType {
    /// `ipv4_addr`.
    Ipv4,
    /// `ipv6_addr`.
    Ipv6,
}

impl KeyType {
    fn nft(self) -> &'static str {
        match self {
            KeyType::Ipv4 => "ipv4_addr",
            KeyType::Ipv6 => "ipv6_addr",
        }
    }
}

/// A named set (`value == None` for every element) or verdict map.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Set {
    /// Key type.
    pub key: KeyType,
    /// `true` for a verdict map (`type K : verdict`).
    pub verdict_map: bool,
    /// `flags interval` (prefixes as elements).
    pub interval: bool,
    /// `flags timeout`: elements carry `timeout <n>s` and leave the kernel by themselves
    /// unless refreshed.
    pub timeout: bool,
    /// Elements: key → verdict (maps), `timeout <n>s` (timeout sets) or empty string.
    pub elements: Elements,
}

/// An element's key or value as nft text (`198.51.100.0/24`, `jump fw-a`, `timeout 35s`).
/// Inline up to 24 bytes (every IPv4 key and prefix, most values), so a set of 100k
/// ranges costs no allocation per element: the keys and values were a third of the
/// agent's heap at 100k rules as `String`s.
pub type Text = compact_str::CompactString;

/// A set's elements, shared: cloning a set (or the table holding it) costs a pointer,
/// and an element map carried over unchanged from the previous compile is the same
/// allocation, which [`delta::ElementDelta::between`] skips without comparing its elements.
/// Reads go through `Deref`; the first write to a shared map copies it (`Arc::make_mut`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Elements(std::sync::Arc<BTreeMap<Text, Text>>);

impl Elements {
    /// Whether `self` and `other` are the same allocation (then they are equal).
    pub fn same(&self, other: &Elements) -> bool {
        std::sync::Arc::ptr_eq(&self.0, &other.0)
    }
}

impl std::ops::Deref for Elements {
    type Target = BTreeMap<Text, Text>;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl std::ops::DerefMut for Elements {
    fn deref_mut(&mut self) -> &mut Self::Target {
        std::sync::Arc::make_mut(&mut self.0)
    }
}

impl From<BTreeMap<Text, Text>> for Elements {
    fn from(map: BTreeMap<Text, Text>) -> Self {
        Self(std::sync::Arc::new(map))
    }
}

impl FromIterator<(Text, Text)> for Elements {
    fn from_iter<I: IntoIterator<Item = (Text, Text)>>(iter: I) -> Self {
        Self(std::sync::Arc::new(iter.into_iter().collect()))
    }
}

impl<'a> IntoIterator for &'a Elements {
    type Item = (&'a Text, &'a Text);
    type IntoIter = std::collections::btree_map::Iter<'a, Text, Text>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

impl Set {
    /// An empty plain set.
    pub fn new(key: KeyType, interval: bool) -> Self {
        Self { key, verdict_map: false, interval, timeout: false, elements: Elements::default() }
    }

    /// An empty set whose elements time out.
    pub(crate) fn with_timeout(key: KeyType) -> Self {
        Self { key, verdict_map: false, interval: false, timeout: true, elements: Elements::default() }
    }

    /// An empty verdict map.
    pub(crate) fn verdict_map(key: KeyType) -> Self {
        Self { key, verdict_map: true, interval: false, timeout: false, elements: Elements::default() }
    }

    fn declaration(&self) -> String {
        let ty = if self.verdict_map {
            format!("type {} : verdict;", self.key.nft())
        } else {
            format!("type {};", self.key.nft())
        };
        match (self.interval, self.timeout) {
            (true, true) => format!("{ty} flags interval,timeout;"),
            (true, false) => format!("{ty} flags interval;"),
            (false, true) => format!("{ty} flags timeout; size {TIMEOUT_SET_SIZE};"),
            (false, false) => ty,
        }
    }

    fn keyword(&self) -> &'static str {
        if self.verdict_map { "map" } else { "set" }
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
    /// Rules in order, as nft statements.
    pub rules: std::sync::Arc<Vec<String>>,
}

impl Chain {
    /// A regular chain with `rules`.
    pub(crate) fn regular(rules: Vec<String>) -> Self {
        Self { hook: None, rules: std::sync::Arc::new(rules) }
    }

    /// A base chain on `hook` with `rules`.
    pub fn base(hook: Hook, rules: Vec<String>) -> Self {
        Self { hook: Some(hook), rules: std::sync::Arc::new(rules) }
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
    pub(crate) fn rule_count(&self) -> usize {
        self.chains.values().map(|c| c.rules.len()).sum()
    }

    /// Number of elements in all sets and maps.
    pub(crate) fn element_count(&self) -> usize {
        self.sets.values().map(|s| s.elements.len()).sum()
    }

    /// The whole table as an nft script block (what `egressd render` prints).
    pub fn render(&self) -> String {
        render::table_block(self)
    }

    /// A script that atomically replaces whatever table of this name exists with this
    /// one (`add` makes the `delete` safe when none exists).
    pub(crate) fn replace_script(&self) -> String {
        format!("add table {FAMILY} {name}\ndelete table {FAMILY} {name}\n{}", self.render(), name = self.name)
    }

    /// A script that removes the table if it exists.
    pub(crate) fn delete_script(name: &str) -> String {
        format!("add table {FAMILY} {name}\ndelete table {FAMILY} {name}\n")
    }
}

/// A readable, nft-safe chain or set name `prefix-<id>` when `id` is a DNS label
/// (namespace names are), else `prefix-h<hash>`.
pub(crate) fn chain_name(prefix: &str, id: &str) -> String {
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

/// A readable set name `prefix-<name>` for a DNS name (lowercase letters, digits, `-`
/// and `.` are valid in nft identifiers), else `prefix-h<hash>`.
pub(crate) fn set_name(prefix: &str, name: &str) -> String {
    let readable = !name.is_empty()
        && name.len() <= 200
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && name.starts_with(|c: char| c.is_ascii_alphanumeric());
    if readable { format!("{prefix}-{name}") } else { chain_name(prefix, &format!("\u{0}{name}")) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chain_names_are_readable_or_hashed() {
        assert_eq!(chain_name("fw", "team-a"), "fw-team-a");
        let hashed = chain_name("fw", "Not A Label; drop");
        assert!(hashed.starts_with("fw-h") && hashed.len() == 20, "{hashed}");
        assert_ne!(chain_name("fw", "x.y"), chain_name("fw", "x_y"));
    }
}
