//! One element as the kernel reads it in an element list: its key bytes, a range's end,
//! a ported piece's last key, the timeout or verdict.

use super::*;

/// Append one element (or a range's two kernel elements) to an element list, as the
/// kernel reads it: `NFTA_LIST_ELEM` { key, flags, timeout, expiration, verdict } (values
/// only when adding).
pub(super) fn encode_element(out: &mut Vec<u8>, key: &Key, value: &Value, with_value: bool) {
    use crate::nft::wire::{nest, put, put_str, put_u32};
    const INTERVAL_END: u32 = 1;
    // A ported piece (an interval concatenation): one element, its first key and its
    // last (`NFTA_SET_ELEM_KEY_END`), each field in its own 4-byte register.
    if let Key::Ported(proto, port, net) = *key {
        const KEY_END: u16 = 10;
        nest(out, 1, |o| {
            nest(o, 1, |o| put(o, 1, &key_bytes(key)));
            nest(o, KEY_END, |o| put(o, 1, &ported_bytes(proto, port, net.broadcast())));
        });
        return;
    }
    let one = |out: &mut Vec<u8>, key: &Key, end: bool| {
        nest(out, 1, |o| {
            nest(o, 1, |o| put(o, 1, &key_bytes(key)));
            if end {
                put_u32(o, 3, INTERVAL_END);
            }
            if with_value && !end {
                match value {
                    Value::None => {}
                    Value::Timeout(t) => {
                        // The timeout, and the expiration with it: re-adding an element
                        // the set has restarts its clock only when the expiration is
                        // given (or the timeout differs), as `nft add element … expires`.
                        let ms = u64::try_from(t.as_millis()).unwrap_or(u64::MAX).to_be_bytes();
                        put(o, 4, &ms);
                        put(o, 5, &ms);
                    }
                    // `NFTA_SET_ELEM_DATA` { `NFTA_DATA_VALUE` }: host byte order, as
                    // the register the map's lookup writes holds it.
                    Value::Classid(v) => nest(o, 2, |o| put(o, 1, &v.to_ne_bytes())),
                    Value::Jump(chain) => nest(o, 2, |o| {
                        nest(o, 2, |o| {
                            put(o, 1, &(-3i32).to_be_bytes());
                            put_str(o, 2, chain);
                        })
                    }),
                }
            }
        })
    };
    one(out, key, false);
    // A range: its first address, then (flagged as the end) the address after its last.
    if let Key::Net(net) = *key
        && let Some(after) = after_prefix(net.addr(), net.prefix_len())
    {
        one(out, &Key::Addr(after), true);
    }
}

/// The address right after the prefix `ip/len`, or `None` when it ends the family's
/// address space.
fn after_prefix(ip: IpAddr, len: u8) -> Option<IpAddr> {
    match ip {
        IpAddr::V4(v4) => {
            let host = u32::MAX.checked_shr(u32::from(len)).unwrap_or(0);
            (u32::from(v4) | host).checked_add(1).map(|a| IpAddr::from(std::net::Ipv4Addr::from(a)))
        }
        IpAddr::V6(v6) => {
            let host = u128::MAX.checked_shr(u32::from(len)).unwrap_or(0);
            (u128::from(v6) | host).checked_add(1).map(|a| IpAddr::from(std::net::Ipv6Addr::from(a)))
        }
    }
}

/// A key's bytes as the kernel holds them: an address (after its tag's two halves, in
/// a tagged set; a prefix's first address), a mark or a classid (host byte order, as
/// the registers hold it), a ported key's three 4-byte registers.
pub(super) fn key_bytes(key: &Key) -> Vec<u8> {
    match *key {
        Key::Mark(m) | Key::Classid(m) => m.to_ne_bytes().to_vec(),
        Key::Ported(proto, port, net) => ported_bytes(proto, port, net.addr()),
        Key::Tagged(tag, ip) => Slot::key_bytes(tag.get(), ip),
        Key::Addr(ip) => octets(ip),
        Key::Net(net) => octets(net.addr()),
    }
}

/// A ported key (or a ported range's last key, at its prefix's last address): each
/// field in a 4-byte register — the protocol byte, the port (network order), the
/// address.
fn ported_bytes(proto: crate::view::policy::Protocol, port: u16, ip: IpAddr) -> Vec<u8> {
    let mut out = vec![proto.number(), 0, 0, 0];
    out.extend(port.to_be_bytes());
    out.extend([0, 0]);
    out.extend(octets(ip));
    out
}

fn octets(ip: IpAddr) -> Vec<u8> {
    match ip {
        IpAddr::V4(v4) => v4.octets().to_vec(),
        IpAddr::V6(v6) => v6.octets().to_vec(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_range_ends_at_the_address_after_its_last_one() {
        let after = |ip: &str, len| after_prefix(ip.parse().unwrap(), len).map(|a| a.to_string());
        assert_eq!(after("198.51.100.0", 25).as_deref(), Some("198.51.100.128"));
        assert_eq!(after("203.0.113.7", 32).as_deref(), Some("203.0.113.8"));
        assert_eq!(after("0.0.0.0", 0), None, "the whole space has no end element");
        assert_eq!(after("240.0.0.0", 4), None);
        assert_eq!(after("2001:db8::", 32).as_deref(), Some("2001:db9::"));
        assert_eq!(after("ff00::", 8), None);
        assert_eq!(after("::", 0), None);
    }
}
