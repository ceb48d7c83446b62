//! Forgetting the connections of an egress IP that left this node (ctnetlink): their
//! conntrack entries would otherwise keep translating packets to an address the node no
//! longer has until they time out. Entries whose reply goes to the address (SNATed to
//! it) are dumped and deleted by their original tuple.

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
    let mut header = NetlinkHeader::default();
    header.flags = flags;
    let mut packet = NetlinkMessage::new(
        header,
        NetlinkPayload::from(NetfilterMessage::new(NetfilterHeader::new(family(ip), 0, 0), message)),
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

fn reply_destination(attrs: &[ConntrackAttribute]) -> Option<IpAddr> {
    attrs.iter().find_map(|a| match a {
        ConntrackAttribute::CtaTupleReply(tuple) => tuple.iter().find_map(|t| match t {
            Tuple::Ip(ips) => ips.iter().find_map(|i| match i {
                IPTuple::DestinationAddress(d) => Some(*d),
                _ => None,
            }),
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
        if reply_destination(&attrs) == Some(ip) {
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
