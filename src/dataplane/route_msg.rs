//! Route netlink messages read and written the same way by every part of the driver:
//! the error type, a route's table, its next hops (a hop through egressd's tunnel read
//! as the model writes it) and the `encap` attributes of a route through the tunnel.

use std::net::IpAddr;

use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteIp6Tunnel, RouteIp6TunnelFlags, RouteIpTunnel, RouteIpTunnelFlags,
    RouteLwEnCapType, RouteLwTunnelEncap, RouteMessage,
};

use crate::net::NextHop;

/// A netlink failure, with what was being done.
#[derive(Debug, thiserror::Error)]
#[error("{action}: {source}")]
pub struct NetError {
    action: String,
    #[source]
    source: rtnetlink::Error,
}

pub(super) fn err(action: impl Into<String>) -> impl FnOnce(rtnetlink::Error) -> NetError {
    let action = action.into();
    move |source| NetError { action, source }
}

/// The table of a route (the attribute, else the header's 8 bits).
pub(super) fn route_table(msg: &RouteMessage) -> u32 {
    msg.attributes
        .iter()
        .find_map(|a| if let RouteAttribute::Table(t) = a { Some(*t) } else { None })
        .unwrap_or(u32::from(msg.header.table))
}

fn route_ip(addr: &RouteAddress) -> Option<IpAddr> {
    match addr {
        RouteAddress::Inet(v4) => Some(IpAddr::V4(*v4)),
        RouteAddress::Inet6(v6) => Some(IpAddr::V6(*v6)),
        _ => None,
    }
}

/// The tunnel key of a route or next hop's `encap ip|ip6 id <key>`.
fn encap_key(attributes: &[RouteAttribute]) -> Option<u32> {
    attributes.iter().find_map(|a| match a {
        RouteAttribute::Encap(encaps) => encaps.iter().find_map(|e| match e {
            RouteLwTunnelEncap::Ip(RouteIpTunnel::Id(id)) | RouteLwTunnelEncap::Ip6(RouteIp6Tunnel::Id(id)) => {
                u32::try_from(*id).ok()
            }
            _ => None,
        }),
        _ => None,
    })
}

/// The next hops of a route; a hop through the tunnel device (index `tunnel`) with a
/// key is read as the model writes it (link 0).
pub(super) fn next_hops(msg: &RouteMessage, tunnel: Option<u32>) -> Vec<NextHop> {
    let mut gateway = None;
    let mut oif = 0;
    let mut out = Vec::new();
    let hop = |gateway: IpAddr, link: u32, attributes: &[RouteAttribute]| {
        let key = encap_key(attributes).filter(|_| Some(link) == tunnel);
        NextHop { gateway, link: if key.is_some() { 0 } else { link }, key }
    };
    for a in &msg.attributes {
        match a {
            RouteAttribute::Gateway(g) => gateway = route_ip(g),
            RouteAttribute::Oif(i) => oif = *i,
            RouteAttribute::MultiPath(hops) => {
                for h in hops {
                    let gw = h.attributes.iter().find_map(|a| match a {
                        RouteAttribute::Gateway(g) => route_ip(g),
                        _ => None,
                    });
                    if let Some(gw) = gw {
                        out.push(hop(gw, h.interface_index, &h.attributes));
                    }
                }
            }
            _ => {}
        }
    }
    if let Some(gw) = gateway {
        out.push(hop(gw, oif, &msg.attributes));
    }
    out
}

/// `encap ip|ip6 id <key> dst <dst> csum` (the outer header's family is the
/// destination's). `csum`: the outer UDP checksum is computed — without it a metadata
/// VXLAN device sends none, which IPv6 receivers drop (`Udp6InCsumErrors`).
/// `src`: the outer source (this node's address of the family), when known.
pub(super) fn encap(key: u32, dst: IpAddr, local: &[Option<IpAddr>; 2]) -> [RouteAttribute; 2] {
    match dst {
        IpAddr::V4(v4) => {
            let mut e = vec![
                RouteLwTunnelEncap::Ip(RouteIpTunnel::Id(u64::from(key))),
                RouteLwTunnelEncap::Ip(RouteIpTunnel::Destination(v4)),
                RouteLwTunnelEncap::Ip(RouteIpTunnel::Flags(RouteIpTunnelFlags::Checksum)),
            ];
            if let Some(IpAddr::V4(src)) = local[0] {
                e.push(RouteLwTunnelEncap::Ip(RouteIpTunnel::Source(src)));
            }
            [RouteAttribute::EncapType(RouteLwEnCapType::Ip), RouteAttribute::Encap(e)]
        }
        IpAddr::V6(v6) => {
            let mut e = vec![
                RouteLwTunnelEncap::Ip6(RouteIp6Tunnel::Id(u64::from(key))),
                RouteLwTunnelEncap::Ip6(RouteIp6Tunnel::Destination(v6)),
                RouteLwTunnelEncap::Ip6(RouteIp6Tunnel::Flags(RouteIp6TunnelFlags::Checksum)),
            ];
            if let Some(IpAddr::V6(src)) = local[1] {
                e.push(RouteLwTunnelEncap::Ip6(RouteIp6Tunnel::Source(src)));
            }
            [RouteAttribute::EncapType(RouteLwEnCapType::Ip6), RouteAttribute::Encap(e)]
        }
    }
}
