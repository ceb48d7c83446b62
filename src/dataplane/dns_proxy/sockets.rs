//! The proxy's sockets: transparent (`IP_TRANSPARENT`) listeners and answer sockets,
//! a datagram received with its original destination.

use super::*;

/// Whether `ip` is an address of this host (a plain bind to it works): a DNS server
/// there (a node-local cache) is never taken — binding its port 53 first would keep the
/// server from starting.
pub(super) fn is_local(ip: IpAddr) -> bool {
    std::net::UdpSocket::bind(SocketAddr::new(ip, 0)).is_ok()
}

/// The UDP socket answers leave from: bound to `server`:53 (a foreign address), its
/// packets carrying `mark`. Nothing is received on it (tproxy hands queries to the
/// listener).
pub(super) fn transparent_udp(server: IpAddr, mark: u32) -> std::io::Result<std::net::UdpSocket> {
    let (s, _) = transparent(server.is_ipv6(), false)?;
    s.set_mark(mark)?;
    s.set_nonblocking(true)?;
    s.bind(&SocketAddr::new(server, 53).into())?;
    Ok(s.into())
}

/// A transparent (`IP_TRANSPARENT`: it may hold a foreign address) UDP or TCP socket of
/// one family, IPv6 only for IPv6, and that family's unspecified address.
pub(super) fn transparent(v6: bool, tcp: bool) -> std::io::Result<(socket2::Socket, IpAddr)> {
    let (domain, any) = if v6 {
        (socket2::Domain::IPV6, IpAddr::V6(Ipv6Addr::UNSPECIFIED))
    } else {
        (socket2::Domain::IPV4, IpAddr::V4(Ipv4Addr::UNSPECIFIED))
    };
    let s = if tcp {
        socket2::Socket::new(domain, socket2::Type::STREAM, Some(socket2::Protocol::TCP))?
    } else {
        socket2::Socket::new(domain, socket2::Type::DGRAM, Some(socket2::Protocol::UDP))?
    };
    if v6 {
        s.set_only_v6(true)?;
        s.set_ip_transparent_v6(true)?;
    } else {
        s.set_ip_transparent_v4(true)?;
    }
    Ok((s, any))
}

/// The transparent UDP listener of a family on `port`: `tproxy` hands it the taken
/// queries, each with its original destination (`IP_ORIGDSTADDR`).
pub(super) fn transparent_udp_listener(v6: bool, port: u16) -> std::io::Result<std::net::UdpSocket> {
    let (s, any) = transparent(v6, false)?;
    if v6 {
        nix::sys::socket::setsockopt(&s, nix::sys::socket::sockopt::Ipv6OrigDstAddr, &true)?;
    } else {
        nix::sys::socket::setsockopt(&s, nix::sys::socket::sockopt::Ipv4OrigDstAddr, &true)?;
    }
    nix::sys::socket::setsockopt(&s, nix::sys::socket::sockopt::ReceiveTimestampns, &true)?;
    s.set_reuse_address(true)?;
    s.set_recv_buffer_size(4 << 20)?;
    s.set_nonblocking(true)?;
    s.bind(&SocketAddr::new(any, port).into())?;
    Ok(s.into())
}

/// Receive one datagram: its length, sender, original destination and time waited.
pub(super) fn recv_orig(fd: std::os::fd::RawFd, buf: &mut [u8]) -> std::io::Result<Received> {
    use nix::sys::socket::{ControlMessageOwned, MsgFlags, SockaddrStorage, recvmsg};
    let mut iov = [std::io::IoSliceMut::new(buf)];
    let mut cmsg = nix::cmsg_space!(libc::sockaddr_in6, nix::sys::time::TimeSpec);
    let msg = recvmsg::<SockaddrStorage>(fd, &mut iov, Some(&mut cmsg), MsgFlags::empty())?;
    let from = msg
        .address
        .and_then(|a| {
            a.as_sockaddr_in()
                .map(|v4| SocketAddr::from(std::net::SocketAddrV4::from(*v4)))
                .or_else(|| a.as_sockaddr_in6().map(|v6| SocketAddr::from(std::net::SocketAddrV6::from(*v6))))
        })
        .ok_or_else(|| std::io::Error::other("a datagram without its sender"))?;
    let mut orig = None;
    let mut waited = None;
    for c in msg.cmsgs()? {
        match c {
            ControlMessageOwned::ScmTimestampns(at) => {
                let at = std::time::UNIX_EPOCH + Duration::from(at);
                waited = std::time::SystemTime::now().duration_since(at).ok();
            }
            ControlMessageOwned::Ipv4OrigDstAddr(a) => {
                let ip = Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr));
                orig = Some(SocketAddr::new(ip.into(), u16::from_be(a.sin_port)));
            }
            ControlMessageOwned::Ipv6OrigDstAddr(a) => {
                let ip = Ipv6Addr::from(a.sin6_addr.s6_addr);
                orig = Some(SocketAddr::new(ip.into(), u16::from_be(a.sin6_port)));
            }
            _ => {}
        }
    }
    Ok(Received { len: msg.bytes, from, orig, waited })
}

/// A datagram [`recv_orig`] read.
pub(super) struct Received {
    /// Its length.
    pub(super) len: usize,
    /// Its sender.
    pub(super) from: SocketAddr,
    /// Its original destination.
    pub(super) orig: Option<SocketAddr>,
    /// How long it waited in the kernel (its receive timestamp to now).
    pub(super) waited: Option<Duration>,
}

/// The transparent TCP listener of a family on `port` (its SYN-ACKs and the accepted
/// connections' packets carry `mark`).
pub(super) fn transparent_listener(v6: bool, port: u16, mark: u32) -> std::io::Result<std::net::TcpListener> {
    let (s, any) = transparent(v6, true)?;
    s.set_reuse_address(true)?;
    s.set_mark(mark)?;
    s.set_nonblocking(true)?;
    s.bind(&SocketAddr::new(any, port).into())?;
    s.listen(1024)?;
    Ok(s.into())
}
