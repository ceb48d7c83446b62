//! Set and map elements as typed values: a [`Key`] (an address, a prefix, a tagged
//! address, a mark, a protocol-port-prefix) and a [`Value`] (nothing, a timeout, a
//! jump). Their nft text is their `Display`, read back by `FromStr` (tests; `read` checks
//! the element against a set's declaration too). The netlink path takes them as they are
//! ([`super::delta`]), so no element is parsed back from text.

use std::fmt;
use std::net::IpAddr;
use std::time::Duration;

use ipnet::IpNet;

use super::rule::Name;
use super::{KeyType, Set};

use crate::view::policy::Protocol;

/// An element's key. Which variant a set holds follows from its declaration
/// ([`Key::fits`]); the order (derived) groups a tagged set's keys by tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Key {
    /// An address (`ipv4_addr`/`ipv6_addr` sets and maps without `flags interval`).
    Addr(IpAddr),
    /// A prefix (`flags interval`): `192.0.2.0/24`, host bits clear.
    Net(IpNet),
    /// A tag and an address in a shared tagged set ([`super::Slot`]): `<hi> . <lo> . <ip>`.
    Tagged(Tag, IpAddr),
    /// A mark (`type mark`): `0x01000000`.
    Mark(u32),
    /// A protocol, a destination port and a prefix ([`KeyType::PortIpv4`]):
    /// `tcp . 443 . 192.0.2.0/24`.
    Ported(Protocol, u16, IpNet),
    /// A packet priority (`type classid`): `<major>:<minor>` in hex, as nft prints it
    /// ([`classid`]).
    Classid(u32),
}

/// A [`super::Slot`]'s 64-bit tag as its two 32-bit halves (`hi`, `lo`: the two
/// `numgen` constants), so that a key is 4-byte aligned (28 bytes, not 32). Ordered as
/// the number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Tag([u32; 2]);

impl Tag {
    /// The tag as a number.
    pub fn get(self) -> u64 {
        (u64::from(self.0[0]) << 32) | u64::from(self.0[1])
    }
}

impl From<u64> for Tag {
    fn from(tag: u64) -> Self {
        Tag([(tag >> 32) as u32, tag as u32])
    }
}

/// What an element carries besides its key.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Value {
    /// Nothing (a plain set).
    #[default]
    None,
    /// `timeout <n>s` (a timeout set). The text has whole seconds; the netlink path
    /// sends milliseconds (DNS snooping's elements, [`super::delta`]).
    Timeout(Duration),
    /// `jump <chain>` (a verdict map).
    Jump(Name),
    /// A packet priority (a map to `classid`): `<major>:<minor>` ([`classid`]).
    Classid(u32),
}

/// A `classid` as nft prints it: `none` (0), `root` (`0xffffffff`), else the major and
/// minor numbers in hex, `<major>:<minor>`.
pub fn classid(v: u32) -> String {
    match v {
        0 => "none".into(),
        u32::MAX => "root".into(),
        v => format!("{:x}:{:x}", v >> 16, v & 0xffff),
    }
}

/// A `classid` from its printed form ([`classid`]).
fn read_classid(text: &str) -> Option<u32> {
    match text {
        "none" => Some(0),
        "root" => Some(u32::MAX),
        _ => {
            let (major, minor) = text.split_once(':')?;
            Some(
                (u32::from(u16::from_str_radix(major, 16).ok()?) << 16)
                    | u32::from(u16::from_str_radix(minor, 16).ok()?),
            )
        }
    }
}

impl From<IpAddr> for Key {
    fn from(ip: IpAddr) -> Self {
        Key::Addr(ip)
    }
}

impl From<IpNet> for Key {
    fn from(net: IpNet) -> Self {
        Key::Net(net)
    }
}

impl Key {
    /// `ip` after `tag` in a tagged set.
    pub fn tagged(tag: u64, ip: IpAddr) -> Self {
        Key::Tagged(tag.into(), ip)
    }

    /// Whether a set declared as `set` may hold this key: the variant its key type and
    /// flags call for, of its family, a prefix with its host bits clear.
    pub fn fits(&self, set: &Set) -> bool {
        let family = |ip: IpAddr| ip.is_ipv6() == set.key.is_v6();
        match *self {
            Key::Mark(_) => set.key == KeyType::Mark && !set.interval,
            Key::Classid(_) => set.key == KeyType::Classid && !set.interval,
            Key::Ported(_, _, net) => set.key.is_ported() && set.interval && net.trunc() == net && family(net.addr()),
            Key::Net(net) => {
                matches!(set.key, KeyType::Ipv4 | KeyType::Ipv6)
                    && set.interval
                    && net.trunc() == net
                    && family(net.addr())
            }
            Key::Addr(ip) => matches!(set.key, KeyType::Ipv4 | KeyType::Ipv6) && !set.interval && family(ip),
            Key::Tagged(_, ip) => set.key.is_tagged() && !set.interval && family(ip),
        }
    }
}

impl Value {
    /// Whether a set declared as `set` may hold this value: a jump in a verdict map, a
    /// priority in a map to `classid`, a timeout in a timeout set, nothing in any other.
    pub fn fits(&self, set: &Set) -> bool {
        use super::Data;
        match self {
            Value::Jump(chain) => set.data == Data::Verdict && !chain.is_empty(),
            Value::Classid(_) => set.data == Data::Classid,
            Value::Timeout(_) => set.timeout && set.data == Data::None,
            Value::None => set.data == Data::None && !set.timeout,
        }
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Key::Addr(ip) => write!(f, "{ip}"),
            Key::Net(net) => write!(f, "{net}"),
            Key::Tagged(Tag([hi, lo]), ip) => write!(f, "{hi} . {lo} . {ip}"),
            Key::Mark(m) => write!(f, "{m:#010x}"),
            Key::Ported(proto, port, net) => write!(f, "{} . {port} . {net}", proto.nft()),
            Key::Classid(v) => write!(f, "{}", classid(*v)),
        }
    }
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::None => Ok(()),
            Value::Timeout(t) => write!(f, "timeout {}s", t.as_secs()),
            Value::Jump(chain) => write!(f, "jump {chain}"),
            Value::Classid(v) => write!(f, "{}", classid(*v)),
        }
    }
}

/// An element of `set` from its nft text, as [`Key`] and [`Value`] print it (the
/// canonical form only: `None` for any other text, or for one the set cannot hold).
#[cfg(test)]
pub(crate) fn read(set: &Set, key: &str, value: &str) -> Option<(Key, Value)> {
    let value: Value = value.parse().ok()?;
    Some((read_key(set, key)?, value)).filter(|(_, v)| v.fits(set))
}

/// A key of `set` from its nft text ([`read`], the key alone).
#[cfg(test)]
pub(crate) fn read_key(set: &Set, text: &str) -> Option<Key> {
    text.parse::<Key>().ok().filter(|k| k.fits(set))
}

/// Why a text is not an element's key or value as egressd writes them.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not an element {what} as egressd writes one: {text:?}")]
pub struct ParseError {
    /// `key` or `value`.
    pub what: &'static str,
    /// The text.
    pub text: String,
}

impl std::str::FromStr for Key {
    type Err = ParseError;

    /// A key from its text: each variant's text has its own shape (`a . b . c` with a
    /// number or a protocol first, `0x…`, a prefix with `/`, an address), canonical only.
    fn from_str(text: &str) -> Result<Self, ParseError> {
        let key = || -> Option<Key> {
            let parts: Vec<&str> = text.split(" . ").collect();
            Some(match parts[..] {
                [proto, port, net] if Protocol::from_nft(proto).is_some() => {
                    Key::Ported(Protocol::from_nft(proto)?, port.parse().ok()?, net.parse().ok()?)
                }
                [hi, lo, ip] => {
                    let (hi, lo): (u32, u32) = (hi.parse().ok()?, lo.parse().ok()?);
                    Key::Tagged(Tag([hi, lo]), ip.parse().ok()?)
                }
                [mark] if mark.starts_with("0x") => Key::Mark(u32::from_str_radix(&mark[2..], 16).ok()?),
                [net] if net.contains('/') => Key::Net(net.parse().ok()?),
                [id @ ("none" | "root")] => Key::Classid(read_classid(id)?),
                [id] if id.contains(':') && id.parse::<IpAddr>().is_err() => Key::Classid(read_classid(id)?),
                [ip] => Key::Addr(ip.parse().ok()?),
                _ => return None,
            })
        };
        key().filter(|k| k.to_string() == text).ok_or_else(|| ParseError { what: "key", text: text.into() })
    }
}

impl std::str::FromStr for Value {
    type Err = ParseError;

    /// A value from its text (empty, `jump <chain>`, `timeout <n>s`, a classid),
    /// canonical only.
    fn from_str(text: &str) -> Result<Self, ParseError> {
        let value = || -> Option<Value> {
            if text.is_empty() {
                return Some(Value::None);
            }
            if let Some(chain) = text.strip_prefix("jump ") {
                let name = |b: u8| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.';
                return (!chain.is_empty() && chain.bytes().all(name)).then(|| Value::Jump(chain.into()));
            }
            if let Some(v) = read_classid(text) {
                return Some(Value::Classid(v));
            }
            let secs = text.strip_prefix("timeout ")?.strip_suffix('s')?.parse().ok()?;
            Some(Value::Timeout(Duration::from_secs(secs)))
        };
        value().filter(|v| v.to_string() == text).ok_or_else(|| ParseError { what: "value", text: text.into() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sets() -> Vec<Set> {
        let mut out = Vec::new();
        for key in [
            KeyType::Ipv4,
            KeyType::Ipv6,
            KeyType::TaggedIpv4,
            KeyType::TaggedIpv6,
            KeyType::Mark,
            KeyType::PortIpv4,
            KeyType::PortIpv6,
            KeyType::Classid,
        ] {
            out.extend([
                Set::new(key, false),
                Set::new(key, true),
                Set::with_timeout(key),
                Set::verdict_map(key),
                Set::classid_map(key),
            ]);
        }
        out
    }

    #[test]
    fn keys_and_values_print_as_nft_writes_them() {
        let net: IpNet = "192.0.2.0/24".parse().unwrap();
        assert_eq!(Key::tagged(0x1_0000_0002, "192.0.2.1".parse().unwrap()).to_string(), "1 . 2 . 192.0.2.1");
        assert_eq!(Key::Mark(0x0100_0000).to_string(), "0x01000000");
        assert_eq!(Key::Ported(Protocol::Tcp, 443, net).to_string(), "tcp . 443 . 192.0.2.0/24");
        assert_eq!(Key::Net(net).to_string(), "192.0.2.0/24");
        assert_eq!(Key::Addr("2001:db8::1".parse().unwrap()).to_string(), "2001:db8::1");
        assert_eq!(Value::Timeout(Duration::from_secs(35)).to_string(), "timeout 35s");
        assert_eq!(Value::Jump("fw-a".into()).to_string(), "jump fw-a");
        assert_eq!(Value::None.to_string(), "");
        assert_eq!(Value::Classid(0x1234_abcd).to_string(), "1234:abcd");
        assert_eq!(Value::Classid(1).to_string(), "0:1");
        assert_eq!(Key::Classid(0x0001_0000).to_string(), "1:0");
        assert_eq!(Key::Classid(0).to_string(), "none");
    }

    #[test]
    fn only_the_canonical_text_a_set_can_hold_is_read() {
        let tagged = Set::with_timeout(KeyType::TaggedIpv6);
        let map = Set::verdict_map(KeyType::Ipv4);
        let ranges = Set::new(KeyType::Ipv4, true);
        assert_eq!(
            read(&tagged, "0 . 1 . 2001:db8::2", "timeout 1s"),
            Some((Key::tagged(1, "2001:db8::2".parse().unwrap()), Value::Timeout(Duration::from_secs(1))))
        );
        for (set, key, value) in [
            (&tagged, "0 . 1 . 2001:DB8::2", "timeout 1s"),
            (&tagged, "2001:db8::2", "timeout 1s"),
            (&tagged, "0 . 1 . 192.0.2.1", "timeout 1s"),
            (&tagged, "00 . 1 . 2001:db8::2", "timeout 1s"),
            (&tagged, "0 . 4294967296 . 2001:db8::2", "timeout 1s"),
            (&tagged, "0 . 1 . 2001:db8::3", "timeout 1m"),
            (&tagged, "0 . 1 . 2001:db8::3", ""),
            (&map, "0 . 1 . 198.18.1.9", "jump fw-a"),
            (&map, "198.18.1.9", "jump fw a"),
            (&map, "198.18.1.9", ""),
            (&ranges, "192.0.2.1/24", ""),
            (&ranges, "192.0.2.0/24", "timeout 1s"),
            (&ranges, "192.0.2.1", ""),
        ] {
            assert_eq!(read(set, key, value), None, "{key} {value}");
        }
    }

    fn key() -> impl Strategy<Value = Key> {
        let v4 = any::<[u8; 4]>().prop_map(IpAddr::from);
        let v6 = any::<[u8; 16]>().prop_map(IpAddr::from);
        let ip = prop_oneof![v4, v6];
        let net = (ip.clone(), 0u8..=128).prop_map(|(ip, len)| {
            let len = if ip.is_ipv4() { len % 33 } else { len };
            IpNet::new(ip, len).map(|n| n.trunc()).unwrap()
        });
        let proto = prop_oneof![Just(Protocol::Tcp), Just(Protocol::Udp), Just(Protocol::Sctp)];
        prop_oneof![
            ip.clone().prop_map(Key::Addr),
            net.clone().prop_map(Key::Net),
            (any::<u64>(), ip).prop_map(|(t, ip)| Key::tagged(t, ip)),
            any::<u32>().prop_map(Key::Mark),
            (proto, any::<u16>(), net).prop_map(|(p, port, n)| Key::Ported(p, port, n)),
            any::<u32>().prop_map(Key::Classid),
        ]
    }

    fn value() -> impl Strategy<Value = Value> {
        prop_oneof![
            Just(Value::None),
            any::<u64>().prop_map(|s| Value::Timeout(Duration::from_secs(s))),
            "[a-z][a-z0-9._-]{0,20}".prop_map(|c| Value::Jump(c.into())),
            any::<u32>().prop_map(Value::Classid),
        ]
    }

    proptest! {
        /// Any element a set can hold reads back from its own text, in that set and
        /// in no set declared otherwise.
        #[test]
        fn an_element_reads_back_from_its_text(key in key(), value in value()) {
            for set in sets() {
                let fits = key.fits(&set) && value.fits(&set);
                let back = read(&set, &key.to_string(), &value.to_string());
                prop_assert_eq!(back, fits.then(|| (key, value.clone())), "{} {} in {:?}", key, value, set);
            }
            prop_assert_eq!(key.to_string().parse::<Key>(), Ok(key));
            prop_assert_eq!(value.to_string().parse::<Value>(), Ok(value));
        }
    }

    #[test]
    fn tagged_keys_are_ordered_by_tag_then_address() {
        let a = Key::tagged(2, "192.0.2.9".parse().unwrap());
        let b = Key::tagged(12, "192.0.2.1".parse().unwrap());
        assert!(a < b);
    }
}

#[cfg(test)]
mod size {
    /// An element is at most 52 bytes, none on the heap but a chain name over 24
    /// bytes (as text: 48 bytes inline, but every key or value over 24 bytes — tagged
    /// IPv6 keys, ported IPv6 prefixes, `jump fw-h<16 hex digits>` — on the heap).
    #[test]
    fn an_element_stays_small() {
        let (key, value) = (size_of::<super::Key>(), size_of::<super::Value>());
        assert!(key <= 28 && value <= 24, "key {key} + value {value} bytes");
    }
}
