//! Route netlink notifications, read so that dumps are spared when nothing they read
//! changed.
//!
//! * [`touches`]: what one notification can change of what egressd reads — the links
//!   ([`super::netlink::Netlink::links`]: every link but egressd's tunnel device, the
//!   addresses that are not egressd's, the main table's default routes) and egressd's
//!   own state (its addresses, rules, and the routes of its tables). A notification
//!   that answers a request of egressd's own netlink socket (the kernel puts the
//!   requester's port in it) is egressd's own change, not drift. What cannot be read
//!   touches both.
//! * [`LinksWatch`]: a socket subscribed to link, address and route notifications,
//!   drained before each read of the links. The kernel queues most notifications before
//!   the change's system call returns, so when nothing that touches the links is
//!   queued, the links read last are the kernel's now, and the dumps are skipped. One
//!   exception: an IPv6 address is announced from the kernel's address work, shortly
//!   after the call returned (seen once in CI: a read in between missed the address).
//!   That notification, when it comes, is what the drift watch ([`super::drift`])
//!   reports too: the agent reads again, and that read dumps. A lost notification (a
//!   full receive buffer) counts as a change.

use std::io;

use netlink_packet_core::{NetlinkMessage, NetlinkPayload};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_packet_route::address::AddressAttribute;
use netlink_packet_route::link::LinkAttribute;
use netlink_packet_route::route::RouteHeader;
use netlink_sys::{Socket, protocols::NETLINK_ROUTE};

use crate::net::{EgressSettings, TUNNEL_DEVICE};

/// Route groups: links, IPv4/IPv6 addresses, routes and rules.
pub(crate) const GROUPS: [u32; 7] = [
    1,  // RTNLGRP_LINK
    5,  // RTNLGRP_IPV4_IFADDR
    7,  // RTNLGRP_IPV4_ROUTE
    8,  // RTNLGRP_IPV4_RULE
    9,  // RTNLGRP_IPV6_IFADDR
    11, // RTNLGRP_IPV6_ROUTE
    19, // RTNLGRP_IPV6_RULE
];

/// The groups of what [`super::netlink::Netlink::links`] reads (no rules).
const LINK_GROUPS: [u32; 5] = [1, 5, 7, 9, 11];

/// What one notification can change.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Touches {
    /// The links, their addresses (egressd's left out) or the main table's default
    /// routes.
    pub links: bool,
    /// egressd's addresses, rules or routes, or its tunnel device — changed by someone
    /// else (not a request of `own_port`).
    pub owned: bool,
}

impl Touches {
    const ALL: Touches = Touches { links: true, owned: true };

    /// Either.
    pub(crate) fn any(self) -> bool {
        self.links || self.owned
    }
}

/// What the netlink message `msg` (header included) can change. `own_port`: the port
/// of egressd's netlink socket (`None`: every change is someone else's).
pub(crate) fn touches(msg: &[u8], own_port: Option<u32>, settings: &EgressSettings) -> Touches {
    let Ok(msg) = NetlinkMessage::<RouteNetlinkMessage>::deserialize(msg) else { return Touches::ALL };
    let foreign = own_port.is_none_or(|p| p != msg.header.port_number);
    let NetlinkPayload::InnerMessage(inner) = msg.payload else { return Touches::ALL };
    match inner {
        RouteNetlinkMessage::NewLink(l) | RouteNetlinkMessage::DelLink(l) => {
            let tunnel = l.attributes.iter().any(|a| matches!(a, LinkAttribute::IfName(n) if n == TUNNEL_DEVICE));
            Touches { links: !tunnel, owned: tunnel && foreign }
        }
        RouteNetlinkMessage::NewAddress(a) | RouteNetlinkMessage::DelAddress(a) => {
            let own = a
                .attributes
                .iter()
                .any(|x| matches!(x, AddressAttribute::Protocol(p) if u8::from(*p) == settings.address_protocol));
            Touches { links: !own, owned: own && foreign }
        }
        RouteNetlinkMessage::NewRoute(r) | RouteNetlinkMessage::DelRoute(r) => {
            let table = super::route_msg::route_table(&r);
            Touches {
                links: table == u32::from(RouteHeader::RT_TABLE_MAIN) && r.header.destination_prefix_length == 0,
                owned: settings.owns_table(table) && foreign,
            }
        }
        RouteNetlinkMessage::NewRule(_) | RouteNetlinkMessage::DelRule(_) => Touches { links: false, owned: foreign },
        _ => Touches::ALL,
    }
}

/// Each netlink message of one datagram.
pub(crate) fn messages(buf: &[u8]) -> impl Iterator<Item = &[u8]> {
    const NLMSG_HDRLEN: usize = 16;
    let mut rest = buf;
    std::iter::from_fn(move || {
        if rest.len() < NLMSG_HDRLEN {
            return None;
        }
        let len = u32::from_ne_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
        if len < NLMSG_HDRLEN || len > rest.len() {
            return None;
        }
        let msg = &rest[..len];
        rest = &rest[len.next_multiple_of(4).min(rest.len())..];
        Some(msg)
    })
}

/// Whether the links changed since the last [`LinksWatch::changed`]: see the module
/// documentation.
pub(crate) struct LinksWatch {
    socket: Socket,
    buf: Vec<u8>,
}

impl LinksWatch {
    /// Subscribe (in the caller's network namespace).
    pub(crate) fn open() -> io::Result<Self> {
        let mut socket = Socket::new(NETLINK_ROUTE)?;
        socket.bind_auto()?;
        for g in LINK_GROUPS {
            socket.add_membership(g)?;
        }
        socket.set_non_blocking(true)?;
        Ok(Self { socket, buf: vec![0u8; 1 << 16] })
    }

    /// Read every queued notification: `true` when one touches the links, one was lost,
    /// or the socket cannot be read.
    pub(crate) fn changed(&mut self, settings: &EgressSettings) -> bool {
        let mut changed = false;
        loop {
            match self.socket.recv(&mut &mut self.buf[..], libc::MSG_DONTWAIT) {
                Ok(0) => return changed,
                Ok(n) => changed |= messages(&self.buf[..n]).any(|m| touches(m, None, settings).links),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return changed,
                Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => changed = true,
                Err(_) => return true,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use netlink_packet_core::NetlinkHeader;
    use netlink_packet_route::address::{AddressMessage, AddressProtocol};
    use netlink_packet_route::link::LinkMessage;
    use netlink_packet_route::route::{RouteAttribute, RouteMessage, RouteProtocol};
    use netlink_packet_route::rule::RuleMessage;

    fn bytes(port: u32, inner: RouteNetlinkMessage) -> Vec<u8> {
        let mut header = NetlinkHeader::default();
        header.port_number = port;
        let mut m = NetlinkMessage::new(header, NetlinkPayload::InnerMessage(inner));
        m.finalize();
        let mut buf = vec![0; m.buffer_len()];
        m.serialize(&mut buf);
        buf
    }

    fn route(table: u32, dst_len: u8) -> RouteMessage {
        let mut r = RouteMessage::default();
        r.header.table = 0;
        r.header.destination_prefix_length = dst_len;
        r.header.protocol = RouteProtocol::Static;
        r.attributes.push(RouteAttribute::Table(table));
        r
    }

    fn address(protocol: u8) -> AddressMessage {
        let mut a = AddressMessage::default();
        a.attributes.push(AddressAttribute::Protocol(AddressProtocol::from(protocol)));
        a
    }

    fn link(name: &str) -> LinkMessage {
        let mut l = LinkMessage::default();
        l.attributes.push(LinkAttribute::IfName(name.into()));
        l
    }

    #[test]
    fn a_notification_touches_what_its_object_is_read_for() {
        let s = EgressSettings::default();
        let own = Some(77);
        let ours = s.table_base + 1;
        let t = |port: u32, m: RouteNetlinkMessage| touches(&bytes(port, m), own, &s);
        let (links, owned, both, none) = (
            Touches { links: true, owned: false },
            Touches { links: false, owned: true },
            Touches::ALL,
            Touches::default(),
        );
        // Links: every one but the tunnel device, whoever changed it.
        assert_eq!(t(77, RouteNetlinkMessage::NewLink(link("eth0"))), links);
        assert_eq!(t(0, RouteNetlinkMessage::DelLink(link("veth1"))), links);
        assert_eq!(t(0, RouteNetlinkMessage::NewLink(link(TUNNEL_DEVICE))), owned);
        assert_eq!(t(77, RouteNetlinkMessage::NewLink(link(TUNNEL_DEVICE))), none);
        // Addresses: the node's touch the links; egressd's are drift unless its own.
        assert_eq!(t(0, RouteNetlinkMessage::NewAddress(address(2))), links);
        assert_eq!(t(0, RouteNetlinkMessage::DelAddress(address(s.address_protocol))), owned);
        assert_eq!(t(77, RouteNetlinkMessage::NewAddress(address(s.address_protocol))), none);
        // Routes: the main table's default routes touch the links; egressd's tables'
        // routes are drift unless its own; other routes touch nothing.
        assert_eq!(t(77, RouteNetlinkMessage::NewRoute(route(254, 0))), links);
        assert_eq!(t(0, RouteNetlinkMessage::NewRoute(route(254, 24))), none);
        assert_eq!(t(0, RouteNetlinkMessage::NewRoute(route(255, 32))), none);
        assert_eq!(t(0, RouteNetlinkMessage::DelRoute(route(ours, 0))), owned);
        assert_eq!(t(77, RouteNetlinkMessage::NewRoute(route(ours, 0))), none);
        // Rules: drift unless its own.
        assert_eq!(t(0, RouteNetlinkMessage::NewRule(RuleMessage::default())), owned);
        assert_eq!(t(77, RouteNetlinkMessage::DelRule(RuleMessage::default())), none);
        // Without a port of its own, nothing is egressd's own change.
        assert_eq!(touches(&bytes(77, RouteNetlinkMessage::NewRule(RuleMessage::default())), None, &s), owned);
        // What cannot be read touches both.
        assert_eq!(touches(&[1, 2, 3], own, &s), both);
    }

    #[test]
    #[cfg_attr(not(feature = "system"), ignore = "needs root (a network namespace): `--features system`, tests/run.sh")]
    fn the_kernel_names_the_requesters_port_in_the_notifications_of_its_changes() {
        // What tells egressd's own changes from drift: its address, rule and route
        // changes come back with its socket's port; the same changes by `ip` do not.
        assert!(nix::unistd::geteuid().is_root(), "needs root (network namespaces)");
        std::thread::spawn(|| {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
            let ip = |args: &[&str]| assert!(std::process::Command::new("ip").args(args).status().unwrap().success());
            ip(&["link", "set", "lo", "up"]);
            ip(&["link", "add", "ega", "type", "veth", "peer", "name", "egb"]);
            ip(&["link", "set", "ega", "up"]);
            ip(&["link", "set", "egb", "up"]);
            ip(&["addr", "add", "198.18.0.1/24", "dev", "ega"]);
            let a = nix::net::if_::if_nametoindex("ega").unwrap();
            let settings = EgressSettings::default();
            let table = settings.table_base + 1;
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            runtime.block_on(async {
                let net = super::super::netlink::Netlink::connect(settings.clone()).unwrap();
                let mut watch = Socket::new(NETLINK_ROUTE).unwrap();
                watch.bind_auto().unwrap();
                for g in GROUPS {
                    watch.add_membership(g).unwrap();
                }
                watch.set_non_blocking(true).unwrap();
                let drained = |watch: &mut Socket| {
                    let mut buf = vec![0u8; 1 << 16];
                    let mut all = Vec::new();
                    while let Ok(n) = watch.recv(&mut &mut buf[..], libc::MSG_DONTWAIT) {
                        all.extend(messages(&buf[..n]).map(|m| touches(m, Some(net.port()), &settings)));
                    }
                    all
                };
                // egressd's: an address, a rule and a route of its own, through its socket.
                let mut desired = crate::net::NetDesired::default();
                desired.addresses.insert("127.0.0.9".parse().unwrap(), (1, "lo".into()));
                desired.rules.insert(crate::net::MarkRule {
                    v6: false,
                    mark: 0x100,
                    mask: 0x100,
                    table,
                    priority: settings.rule_priority,
                });
                desired
                    .routes
                    .insert((table, false), vec![crate::net::NextHop::direct("198.18.0.2".parse().unwrap(), a)]);
                let changes = net.sync(&desired).await.unwrap();
                assert!(!changes.is_empty(), "{changes:?}");
                let own = drained(&mut watch);
                assert!(own.len() >= 3, "{own:?}");
                assert!(own.iter().all(|t| !t.owned), "egressd's own changes read as drift: {own:?}");
                // The same kind of changes by someone else.
                ip(&[
                    "rule",
                    "add",
                    "fwmark",
                    "0x200",
                    "table",
                    &table.to_string(),
                    "priority",
                    &settings.rule_priority.to_string(),
                ]);
                ip(&["route", "add", "203.0.113.0/24", "dev", "lo", "table", &table.to_string()]);
                let foreign = drained(&mut watch);
                assert_eq!(foreign.len(), 2, "{foreign:?}");
                assert!(foreign.iter().all(|t| t.owned), "someone else's changes not read as drift: {foreign:?}");
            });
        })
        .join()
        .unwrap();
    }
}
