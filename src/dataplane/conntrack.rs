//! Conntrack entries egressd changes (ctnetlink):
//!
//! * forgetting the connections of an egress IP that left this node: their entries
//!   would otherwise keep translating packets to an address the node no longer has
//!   until they time out. Entries whose reply goes to the address (SNATed to it) are
//!   dumped and deleted by their original tuple;
//! * clearing a verified-connection generation from the marks before it is used again
//!   ([`clear_marks`], see [`crate::nft::verified`]).

use std::io;
use std::net::IpAddr;

use netlink_packet_core::{NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST, NetlinkHeader, NetlinkMessage, NetlinkPayload};
use netlink_packet_netfilter::conntrack::{ConntrackAttribute, ConntrackMessage, IPTuple, Tuple};
use netlink_packet_netfilter::{NetfilterHeader, NetfilterMessage, NetfilterMessageInner, NetfilterProtoFamily};
use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_NETFILTER};

fn family(ip: IpAddr) -> NetfilterProtoFamily {
    if ip.is_ipv4() { NetfilterProtoFamily::IPv4 } else { NetfilterProtoFamily::IPv6 }
}

fn send(socket: &Socket, flags: u16, ip: IpAddr, message: ConntrackMessage) -> io::Result<()> {
    send_family(socket, flags, family(ip), message)
}

fn send_family(socket: &Socket, flags: u16, family: NetfilterProtoFamily, message: ConntrackMessage) -> io::Result<()> {
    let mut header = NetlinkHeader::default();
    header.flags = flags;
    let mut packet = NetlinkMessage::new(
        header,
        NetlinkPayload::from(NetfilterMessage::new(NetfilterHeader::new(family, 0, 0), message)),
    );
    packet.finalize();
    let mut buf = vec![0; packet.buffer_len()];
    packet.serialize(&mut buf[..]);
    socket.send(&buf, 0)?;
    Ok(())
}

/// Read messages until the end of a dump or an acknowledgement; `each` sees the
/// conntrack entries.
fn receive(socket: &Socket, mut each: impl FnMut(Vec<ConntrackAttribute>)) -> io::Result<()> {
    let mut buf = vec![0u8; 1 << 16];
    super::recv_until(socket, &mut buf, |msg| match msg.payload {
        NetlinkPayload::Done(_) => Some(Ok(())),
        NetlinkPayload::Error(e) => Some(super::ack(e.code).map(drop)),
        NetlinkPayload::InnerMessage(NetfilterMessage {
            inner: NetfilterMessageInner::Conntrack(ConntrackMessage::New(attrs)),
            ..
        }) => {
            each(attrs);
            None
        }
        _ => None,
    })
}

/// An address of an entry: of its original tuple or its reply tuple, the source or
/// the destination.
fn tuple_address(attrs: &[ConntrackAttribute], reply: bool, source: bool) -> Option<IpAddr> {
    attrs.iter().find_map(|a| match a {
        ConntrackAttribute::CtaTupleOrig(tuple) if !reply => ip_of(tuple, source),
        ConntrackAttribute::CtaTupleReply(tuple) if reply => ip_of(tuple, source),
        _ => None,
    })
}

fn ip_of(tuple: &[Tuple], source: bool) -> Option<IpAddr> {
    tuple.iter().find_map(|t| match t {
        Tuple::Ip(ips) => ips.iter().find_map(|i| match i {
            IPTuple::SourceAddress(s) if source => Some(*s),
            IPTuple::DestinationAddress(d) if !source => Some(*d),
            _ => None,
        }),
        _ => None,
    })
}

fn open() -> io::Result<Socket> {
    let mut socket = Socket::new(NETLINK_NETFILTER)?;
    socket.bind_auto()?;
    socket.connect(&SocketAddr::new(0, 0))?;
    Ok(socket)
}

/// The original tuples of the conntrack entries whose replies go to `ip`.
fn originals(socket: &Socket, ip: IpAddr) -> io::Result<Vec<ConntrackAttribute>> {
    send(socket, NLM_F_REQUEST | NLM_F_DUMP, ip, ConntrackMessage::Get(vec![]))?;
    let mut originals = Vec::new();
    receive(socket, |attrs| {
        if tuple_address(&attrs, true, false) == Some(ip) {
            originals.extend(attrs.into_iter().filter(|a| matches!(a, ConntrackAttribute::CtaTupleOrig(_))));
        }
    })?;
    Ok(originals)
}

/// How many conntrack entries have replies going to `ip` (SNATed to it).
pub fn count(ip: IpAddr) -> io::Result<usize> {
    Ok(originals(&open()?, ip)?.len())
}

/// Delete every conntrack entry whose replies go to `ip`; returns how many.
pub(crate) fn forget(ip: IpAddr) -> io::Result<usize> {
    let socket = open()?;
    let originals = originals(&socket, ip)?;
    let count = originals.len();
    for orig in originals {
        send(&socket, NLM_F_REQUEST | NLM_F_ACK, ip, ConntrackMessage::Delete(vec![orig]))?;
        receive(&socket, |_| {})?;
    }
    Ok(count)
}

/// `CTA_MARK_MASK`: with `CTA_MARK`, filters a dump (entries whose mark under the mask
/// equals it) and, in an update, keeps the bits outside the mask.
const CTA_MARK_MASK: u16 = 21;
/// `CTA_ZONE`: an entry's zone, part of what finds it.
const CTA_ZONE: u16 = 18;

/// Clear the bits `clear` of the mark of every conntrack entry (both families) whose
/// mark under `mask` is `value`; returns how many it found. The kernel filters the
/// dump; each entry is then updated by its original tuple (an entry gone meanwhile is
/// skipped).
pub(crate) fn clear_marks(mask: u32, value: u32, clear: u32) -> io::Result<usize> {
    use netlink_packet_core::{DefaultNla, Nla};
    let socket = open()?;
    let mask_nla = |m: u32| ConntrackAttribute::Other(DefaultNla::new(CTA_MARK_MASK, m.to_be_bytes().to_vec()));
    let filter = vec![ConntrackAttribute::CtaMark(value), mask_nla(mask)];
    send_family(&socket, NLM_F_REQUEST | NLM_F_DUMP, NetfilterProtoFamily::Unspec, ConntrackMessage::Get(filter))?;
    let mut found = Vec::new();
    receive(&socket, |attrs| {
        let Some(source) = tuple_address(&attrs, false, true) else { return };
        let key: Vec<ConntrackAttribute> = attrs
            .into_iter()
            .filter(|a| match a {
                ConntrackAttribute::CtaTupleOrig(_) => true,
                ConntrackAttribute::Other(nla) => nla.kind() == CTA_ZONE,
                _ => false,
            })
            .collect();
        found.push((source, key));
    })?;
    let count = found.len();
    for (source, mut key) in found {
        key.push(ConntrackAttribute::CtaMark(0));
        key.push(mask_nla(clear));
        send(&socket, NLM_F_REQUEST | NLM_F_ACK, source, ConntrackMessage::New(key))?;
        // An entry gone meanwhile (ENOENT) needs nothing.
        receive(&socket, |_| {})?;
    }
    Ok(count)
}
