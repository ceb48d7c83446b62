//! Probing for another host that uses an address (duplicate address detection before
//! hosting an egress IP: an ARP probe — sender address 0.0.0.0, RFC 5227 — or a
//! neighbour solicitation for it, then listening for a bounded time), and announcing an
//! address that moved to this node: a gratuitous ARP request (sender =
//! target = the address, broadcast) for IPv4, an unsolicited neighbour advertisement with
//! the Override flag to all-nodes for IPv6. Neighbours update an existing entry to this
//! node's MAC; no maintained crate does this, so it is the few lines below.
//!
//! IPv4 needs an `AF_PACKET` socket addressed by a `sockaddr_ll`, which no safe API
//! builds: that is the one `unsafe` block of the crate. IPv6 uses a raw ICMPv6 socket
//! through socket2 (hop limit 255 as RFC 4861 requires; the kernel fills the checksum).

#![allow(unsafe_code)]

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddrV6};
use std::time::Duration;

use socket2::{Domain, Protocol, Socket, Type};

const ETH_P_ARP: u16 = 0x0806;

/// The MAC address of a link, from sysfs.
pub(crate) fn link_mac(link_name: &str) -> io::Result<[u8; 6]> {
    let text = std::fs::read_to_string(format!("/sys/class/net/{link_name}/address"))?;
    let mut mac = [0u8; 6];
    let parts: Vec<&str> = text.trim().split(':').collect();
    if parts.len() != 6 {
        return Err(io::Error::new(io::ErrorKind::InvalidData, format!("{link_name}: no Ethernet address")));
    }
    for (byte, part) in mac.iter_mut().zip(parts) {
        *byte = u8::from_str_radix(part, 16).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    }
    Ok(mac)
}

/// The gratuitous ARP request frame for `ip` from `mac`.
pub(crate) fn garp_frame(ip: Ipv4Addr, mac: [u8; 6]) -> Vec<u8> {
    let mut f = Vec::with_capacity(42);
    f.extend_from_slice(&[0xff; 6]); // destination: broadcast
    f.extend_from_slice(&mac);
    f.extend_from_slice(&ETH_P_ARP.to_be_bytes());
    f.extend_from_slice(&[0x00, 0x01, 0x08, 0x00, 6, 4, 0x00, 0x01]); // Ethernet, IPv4, request
    f.extend_from_slice(&mac);
    f.extend_from_slice(&ip.octets());
    f.extend_from_slice(&[0; 6]);
    f.extend_from_slice(&ip.octets());
    f
}

/// The ICMPv6 neighbour advertisement for `ip` from `mac` (Override set, Solicited not).
pub(crate) fn unsolicited_na(ip: Ipv6Addr, mac: [u8; 6]) -> Vec<u8> {
    let mut p = Vec::with_capacity(32);
    p.extend_from_slice(&[136, 0, 0, 0]); // type, code, checksum (kernel)
    p.extend_from_slice(&[0x20, 0, 0, 0]); // flags: Override
    p.extend_from_slice(&ip.octets());
    p.extend_from_slice(&[2, 1]); // option: target link-layer address, 8 bytes
    p.extend_from_slice(&mac);
    p
}

/// The link-layer socket address of `ifindex` with broadcast as destination.
fn ll_broadcast(ifindex: u32) -> io::Result<socket2::SockAddr> {
    let ifindex = i32::try_from(ifindex).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    // SAFETY: `try_init` hands us zeroed storage large enough for any socket address and
    // a length to set; we write a `sockaddr_ll`, which fits, and report its size.
    let ((), addr) = unsafe {
        socket2::SockAddr::try_init(|storage, len| {
            let mut ll: libc::sockaddr_ll = std::mem::zeroed();
            ll.sll_family = libc::AF_PACKET as u16;
            ll.sll_protocol = ETH_P_ARP.to_be();
            ll.sll_ifindex = ifindex;
            ll.sll_halen = 6;
            ll.sll_addr[..6].copy_from_slice(&[0xff; 6]);
            storage.cast::<libc::sockaddr_ll>().write(ll);
            *len = std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t;
            Ok(())
        })?
    };
    Ok(addr)
}

fn arp_socket() -> io::Result<Socket> {
    Socket::new(Domain::PACKET, Type::RAW, Some(Protocol::from(i32::from(ETH_P_ARP.to_be()))))
}

fn send_garp(ip: Ipv4Addr, ifindex: u32, mac: [u8; 6]) -> io::Result<()> {
    arp_socket()?.send_to(&garp_frame(ip, mac), &ll_broadcast(ifindex)?)?;
    Ok(())
}

/// The ARP probe frame for `ip` from `mac` (sender address 0.0.0.0: it claims nothing).
pub(crate) fn arp_probe_frame(ip: Ipv4Addr, mac: [u8; 6]) -> Vec<u8> {
    let mut f = garp_frame(ip, mac);
    f[28..32].copy_from_slice(&[0; 4]);
    f
}

/// Whether an ARP frame shows another host (not `mac`) using `ip`: it answers for it or
/// claims it (sender address `ip`), or probes for it at the same time (RFC 5227 2.1.1).
/// Returns that host's MAC.
pub(crate) fn arp_conflict(frame: &[u8], ip: Ipv4Addr, mac: [u8; 6]) -> Option<[u8; 6]> {
    if frame.len() < 42 || frame[12..14] != ETH_P_ARP.to_be_bytes() || frame[14..20] != [0, 1, 8, 0, 6, 4] {
        return None;
    }
    let sha: [u8; 6] = frame[22..28].try_into().ok()?;
    let spa = Ipv4Addr::new(frame[28], frame[29], frame[30], frame[31]);
    let tpa = Ipv4Addr::new(frame[38], frame[39], frame[40], frame[41]);
    let op = u16::from_be_bytes([frame[20], frame[21]]);
    let probing = op == 1 && spa.is_unspecified() && tpa == ip;
    (sha != mac && (spa == ip || probing)).then_some(sha)
}

fn probe_v4(ip: Ipv4Addr, ifindex: u32, mac: [u8; 6], wait: Duration) -> io::Result<Option<[u8; 6]>> {
    let socket = arp_socket()?;
    let link = ll_broadcast(ifindex)?;
    socket.bind(&link)?;
    socket.send_to(&arp_probe_frame(ip, mac), &link)?;
    listen(&socket, wait, |frame| arp_conflict(frame, ip, mac))
}

/// The neighbour solicitation for `ip` (with our link-layer address).
pub(crate) fn neighbour_solicitation(ip: Ipv6Addr, mac: [u8; 6]) -> Vec<u8> {
    let mut p = Vec::with_capacity(32);
    p.extend_from_slice(&[135, 0, 0, 0, 0, 0, 0, 0]); // type, code, checksum (kernel), reserved
    p.extend_from_slice(&ip.octets());
    p.extend_from_slice(&[1, 1]); // option: source link-layer address, 8 bytes
    p.extend_from_slice(&mac);
    p
}

/// Whether an ICMPv6 message is a neighbour advertisement for `ip`.
pub(crate) fn na_for(msg: &[u8], ip: Ipv6Addr) -> bool {
    msg.len() >= 24 && msg[0] == 136 && msg[8..24] == ip.octets()
}

fn probe_v6(ip: Ipv6Addr, ifindex: u32, link_name: &str, mac: [u8; 6], wait: Duration) -> io::Result<Option<[u8; 6]>> {
    let socket = Socket::new(Domain::IPV6, Type::RAW, Some(Protocol::ICMPV6))?;
    socket.set_multicast_hops_v6(255)?;
    socket.set_unicast_hops_v6(255)?;
    socket.set_multicast_if_v6(ifindex)?;
    socket.bind_device(Some(link_name.as_bytes()))?;
    let o = ip.octets();
    let solicited = Ipv6Addr::from([0xff, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0xff, o[13], o[14], o[15]]);
    socket.send_to(&neighbour_solicitation(ip, mac), &SocketAddrV6::new(solicited, 0, 0, ifindex).into())?;
    listen(&socket, wait, |msg| {
        if !na_for(msg, ip) {
            return None;
        }
        // The target link-layer address option, when present.
        let mut other = [0u8; 6];
        if msg.len() >= 32 && msg[24] == 2 && msg[25] == 1 {
            other.copy_from_slice(&msg[26..32]);
        }
        (other != mac).then_some(other)
    })
}

/// Read from `socket` until `wait` is over or `conflict` finds one.
fn listen(
    socket: &Socket,
    wait: Duration,
    mut conflict: impl FnMut(&[u8]) -> Option<[u8; 6]>,
) -> io::Result<Option<[u8; 6]>> {
    let deadline = std::time::Instant::now() + wait;
    let mut buf = [0u8; 1500];
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return Ok(None);
        }
        socket.set_read_timeout(Some(left))?;
        match std::io::Read::read(&mut &*socket, &mut buf) {
            Ok(n) => {
                if let Some(mac) = conflict(&buf[..n]) {
                    return Ok(Some(mac));
                }
            }
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => return Ok(None),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// Whether another host uses `ip` on the link: probe and listen for `wait`. Returns
/// the other host's MAC address (zero when an IPv6 answer did not carry it).
pub(crate) fn probe(ip: IpAddr, ifindex: u32, link_name: &str, wait: Duration) -> io::Result<Option<[u8; 6]>> {
    let mac = link_mac(link_name)?;
    match ip {
        IpAddr::V4(v4) => probe_v4(v4, ifindex, mac, wait),
        IpAddr::V6(v6) => probe_v6(v6, ifindex, link_name, mac, wait),
    }
}

pub(crate) use crate::net::mac_text;

fn send_na(ip: Ipv6Addr, ifindex: u32, link_name: &str, mac: [u8; 6]) -> io::Result<()> {
    let socket = Socket::new(Domain::IPV6, Type::RAW, Some(Protocol::ICMPV6))?;
    socket.set_multicast_hops_v6(255)?;
    socket.set_unicast_hops_v6(255)?;
    socket.set_multicast_if_v6(ifindex)?;
    socket.bind_device(Some(link_name.as_bytes()))?;
    let all_nodes = SocketAddrV6::new(Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1), 0, 0, ifindex);
    socket.send_to(&unsolicited_na(ip, mac), &all_nodes.into())?;
    Ok(())
}

/// Announce `ip` once on the link.
pub(crate) fn announce(ip: IpAddr, ifindex: u32, link_name: &str) -> io::Result<()> {
    let mac = link_mac(link_name)?;
    match ip {
        IpAddr::V4(v4) => send_garp(v4, ifindex, mac),
        IpAddr::V6(v6) => send_na(v6, ifindex, link_name, mac),
    }
}

/// Announce `ip` three times over two seconds (neighbours ignore repeats within their
/// lock time, one second by default on Linux), in the background.
pub(crate) fn announce_repeatedly(ip: IpAddr, ifindex: u32, link_name: String) {
    let span = tracing::info_span!("announce", %ip);
    let task = async move {
        for i in 0..3 {
            if i > 0 {
                tokio::time::sleep(std::time::Duration::from_millis(1000)).await;
            }
            let name = link_name.clone();
            match tokio::task::spawn_blocking(move || announce(ip, ifindex, &name)).await {
                Ok(Ok(())) => tracing::debug!(%ip, link = %link_name, "announced"),
                Ok(Err(e)) => {
                    tracing::warn!(%ip, link = %link_name, error = %e, "announcing the egress IP failed");
                    return;
                }
                Err(_) => return,
            }
        }
    };
    tokio::spawn(tracing::Instrument::instrument(task, span));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_carry_the_address_and_mac() {
        let mac = [2, 0, 0, 0, 0, 9];
        let f = garp_frame(Ipv4Addr::new(198, 18, 0, 100), mac);
        assert_eq!(f.len(), 42);
        assert_eq!(&f[12..14], &[0x08, 0x06]);
        assert_eq!(&f[22..28], &mac, "sender MAC");
        assert_eq!(&f[28..32], &[198, 18, 0, 100], "sender IP");
        assert_eq!(&f[38..42], &[198, 18, 0, 100], "target IP = sender IP");
        let na = unsolicited_na("2001:db8::64".parse().unwrap(), mac);
        assert_eq!(na[0], 136);
        assert_eq!(na[4] & 0x20, 0x20, "override");
        assert_eq!(na[4] & 0x40, 0, "not solicited");
        assert_eq!(&na[26..32], &mac);
    }

    #[test]
    fn probes_and_conflicts() {
        let (ours, theirs) = ([2, 0, 0, 0, 0, 9], [2, 0, 0, 0, 0, 7]);
        let ip = Ipv4Addr::new(198, 18, 0, 100);
        let probe = arp_probe_frame(ip, ours);
        assert_eq!(&probe[28..32], &[0, 0, 0, 0], "a probe claims nothing");
        assert_eq!(arp_conflict(&probe, ip, ours), None, "our own probe");
        assert_eq!(arp_conflict(&arp_probe_frame(ip, theirs), ip, ours), Some(theirs), "a simultaneous probe");
        let mut reply = garp_frame(ip, theirs);
        reply[21] = 2;
        assert_eq!(arp_conflict(&reply, ip, ours), Some(theirs), "an answer");
        assert_eq!(
            arp_conflict(&garp_frame(Ipv4Addr::new(198, 18, 0, 101), theirs), ip, ours),
            None,
            "another address"
        );
        assert_eq!(arp_conflict(&reply[..30], ip, ours), None, "short");
        let v6: Ipv6Addr = "2001:db8::64".parse().unwrap();
        let ns = neighbour_solicitation(v6, ours);
        assert_eq!((ns[0], &ns[8..24]), (135, &v6.octets()[..]));
        assert!(na_for(&unsolicited_na(v6, theirs), v6));
        assert!(!na_for(&ns, v6));
        assert_eq!(mac_text(theirs), "02:00:00:00:00:07");
    }
}
