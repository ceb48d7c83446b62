//! The netlink side of EgressIP's encapsulated path ([`crate::net::TunnelDesired`]): one
//! `vxlan external` device named [`TUNNEL_DEVICE`] (every key on one UDP port; the key
//! and the outer destination come from each route's `encap`), its permanent neighbours
//! (each peer node's address → that node's device address, so no ARP ever crosses the
//! tunnel) and the return routes of the tunnel table.
//!
//! Ownership: the device by its name (egressd creates it and removes it once nothing
//! uses it: its neighbours and routes go with it), the return routes by table and
//! protocol as every other route of egressd.
//!
//! The device gets `169.254.233.233/32` (scope link) and `rp_filter` 2, loose (set over
//! netlink): Linux's reverse path filter drops every packet arriving on a device
//! without an IPv4 address whenever the filter is on, and a strict filter drops the
//! replies arriving through the tunnel (their source is routed elsewhere). The kernel
//! applies the larger of the device's and `all`'s value, so loose holds whatever `all`
//! is.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use futures::{StreamExt, TryStreamExt};
use netlink_packet_route::AddressFamily;
use netlink_packet_route::address::{AddressAttribute, AddressScope};
use netlink_packet_route::link::{
    AfSpecInet, AfSpecUnspec, InetDevConf, InfoData, InfoKind, InfoVxlan, LinkAttribute, LinkFlags, LinkInfo,
    LinkMessage,
};
use netlink_packet_route::neighbour::{NeighbourAddress, NeighbourAttribute, NeighbourMessage, NeighbourState};
use netlink_packet_route::route::{RouteAddress, RouteAttribute, RouteMessage, RouteProtocol, RouteScope};
use rtnetlink::{Handle, IpVersion, LinkUnspec, LinkVxlan, RouteMessageBuilder};

use super::route_msg::{NetError, encap, err, next_hops};
use crate::net::{EgressSettings, REPLY_KEY, TUNNEL_DEVICE, TunnelDesired};

/// The device's IPv4 address (see the module's documentation).
pub(crate) const DEVICE_ADDRESS: Ipv4Addr = Ipv4Addr::new(169, 254, 233, 233);
/// Outer headers: Ethernet 14 + VXLAN 8 + UDP 8 + IPv4 20 (IPv6 40).
const OVERHEAD_V4: u32 = 50;
const OVERHEAD_V6: u32 = 70;

fn missing(e: &rtnetlink::Error) -> bool {
    matches!(e, rtnetlink::Error::NetlinkError(m) if m.raw_code() == -libc::ENODEV)
}

/// The tunnel device's link, if it exists.
pub(crate) async fn device(handle: &Handle) -> Result<Option<LinkMessage>, NetError> {
    let mut stream = handle.link().get().match_name(TUNNEL_DEVICE.to_string()).execute();
    match stream.try_next().await {
        Ok(msg) => Ok(msg),
        Err(e) if missing(&e) => Ok(None),
        Err(e) => Err(err(format!("reading link {TUNNEL_DEVICE}"))(e)),
    }
}

/// Whether an existing device is egressd's tunnel as configured: VXLAN, external, on `port`.
fn is_ours(msg: &LinkMessage, port: u16) -> bool {
    let info = msg.attributes.iter().find_map(|a| if let LinkAttribute::LinkInfo(i) = a { Some(i) } else { None });
    let Some(info) = info else { return false };
    let vxlan = info.iter().any(|i| matches!(i, LinkInfo::Kind(InfoKind::Vxlan)));
    let data = info.iter().find_map(|i| if let LinkInfo::Data(InfoData::Vxlan(d)) = i { Some(d) } else { None });
    vxlan
        && data.is_some_and(|d| {
            d.iter().any(|x| matches!(x, InfoVxlan::CollectMetadata(true)))
                && d.iter().any(|x| matches!(x, InfoVxlan::Port(p) if *p == port))
        })
}

/// One address dump: the links carrying a global, non-host address, and whether the
/// device (index `tunnel`) has [`DEVICE_ADDRESS`].
async fn addresses(handle: &Handle, tunnel: u32) -> Result<(BTreeSet<u32>, bool), NetError> {
    let mut with_address = BTreeSet::new();
    let mut device_has = false;
    let mut stream = handle.address().get().execute();
    while let Some(msg) = stream.try_next().await.map_err(err("listing addresses"))? {
        let global = msg.header.scope == AddressScope::Universe;
        if global && msg.header.prefix_len < if msg.header.family == AddressFamily::Inet { 32 } else { 128 } {
            with_address.insert(msg.header.index);
        }
        device_has |= msg.header.index == tunnel
            && msg
                .attributes
                .iter()
                .any(|a| matches!(a, AddressAttribute::Address(IpAddr::V4(v4)) if *v4 == DEVICE_ADDRESS));
    }
    Ok((with_address, device_has))
}

/// The smallest MTU of the node's other up links among `with_address`: what the outer
/// packets cross.
async fn underlay_mtu(handle: &Handle, tunnel: u32, with_address: &BTreeSet<u32>) -> Result<u32, NetError> {
    let mut mtu: Option<u32> = None;
    let mut stream = handle.link().get().execute();
    while let Some(msg) = stream.try_next().await.map_err(err("listing links"))? {
        let index = msg.header.index;
        let up = msg.header.flags.contains(LinkFlags::Up);
        if index == tunnel || !up || msg.header.flags.contains(LinkFlags::Loopback) || !with_address.contains(&index) {
            continue;
        }
        if let Some(m) = msg.attributes.iter().find_map(|a| if let LinkAttribute::Mtu(m) = a { Some(*m) } else { None })
        {
            mtu = Some(mtu.map_or(m, |x| x.min(m)));
        }
    }
    Ok(mtu.unwrap_or(1500))
}

/// The device's `rp_filter` (`net.ipv4.conf.egressd-vx.rp_filter`), read from the link.
fn rp_filter(msg: &LinkMessage) -> Option<i32> {
    msg.attributes.iter().find_map(|a| match a {
        LinkAttribute::AfSpecUnspec(specs) => specs.iter().find_map(|s| match s {
            AfSpecUnspec::Inet(inet) => inet.iter().find_map(|i| match i {
                AfSpecInet::DevConf(conf) => Some(conf.rp_filter),
                _ => None,
            }),
            _ => None,
        }),
        _ => None,
    })
}

/// `rp_filter` loose: the kernel applies the larger of the device's and `all`'s value,
/// so loose holds even where `all` is strict (1), which would drop every reply arriving
/// through the tunnel (their source is routed elsewhere). Set over netlink (no /proc/sys
/// write: it works in a container whose /proc/sys is read-only).
const LOOSE: i32 = 2;

/// Make the tunnel device, its neighbours and return routes match `desired`; `None`
/// removes the device. `existing`: the device as [`device`] read it. Returns how many
/// changes were made and the device's index (0 without one).
pub(crate) async fn sync(
    handle: &Handle,
    settings: &EgressSettings,
    existing: Option<LinkMessage>,
    desired: Option<&TunnelDesired>,
) -> Result<(usize, u32), NetError> {
    let Some(want) = desired else {
        let Some(dev) = existing else { return Ok((0, 0)) };
        handle.link().del(dev.header.index).execute().await.map_err(err(format!("removing {TUNNEL_DEVICE}")))?;
        return Ok((1, 0));
    };
    let mut changes = 0;
    let dev = match existing {
        Some(dev) if is_ours(&dev, want.port) => dev,
        other => {
            if let Some(dev) = other {
                let index = dev.header.index;
                handle.link().del(index).execute().await.map_err(err(format!("replacing {TUNNEL_DEVICE}")))?;
            }
            let msg = LinkVxlan::new(TUNNEL_DEVICE, 0).port(want.port).collect_metadata(true).learning(false).build();
            handle.link().add(msg).execute().await.map_err(err(format!("adding {TUNNEL_DEVICE}")))?;
            changes += 1;
            device(handle)
                .await?
                .ok_or_else(|| err(format!("adding {TUNNEL_DEVICE}"))(rtnetlink::Error::RequestFailed))?
        }
    };
    let index = dev.header.index;
    let (with_address, has_address) = addresses(handle, index).await?;
    let overhead = if want.peers.keys().any(IpAddr::is_ipv6) { OVERHEAD_V6 } else { OVERHEAD_V4 };
    let mtu = underlay_mtu(handle, index, &with_address).await?.saturating_sub(overhead).max(576);
    let mac =
        dev.attributes.iter().find_map(|a| if let LinkAttribute::Address(m) = a { Some(m.as_slice()) } else { None });
    let cur_mtu = dev.attributes.iter().find_map(|a| if let LinkAttribute::Mtu(m) = a { Some(*m) } else { None });
    let flags = dev.header.flags;
    if mac != Some(&want.mac[..])
        || cur_mtu != Some(mtu)
        || !flags.contains(LinkFlags::Up)
        || !flags.contains(LinkFlags::Noarp)
        || rp_filter(&dev) != Some(LOOSE)
    {
        let mut conf = InetDevConf::default();
        conf.rp_filter = LOOSE;
        let msg = LinkUnspec::new_with_index(index)
            .address(want.mac.to_vec())
            .mtu(mtu)
            .arp(false)
            .up()
            .append_extra_attribute(LinkAttribute::AfSpecUnspec(vec![AfSpecUnspec::Inet(vec![
                AfSpecInet::DevConfRequest(conf),
            ])]))
            .build();
        handle.link().set(msg).execute().await.map_err(err(format!("setting up {TUNNEL_DEVICE}")))?;
        changes += 1;
    }
    if !has_address {
        let mut req = handle.address().add(index, IpAddr::V4(DEVICE_ADDRESS), 32);
        req.message_mut().header.scope = AddressScope::Link;
        req.execute().await.map_err(err(format!("adding {DEVICE_ADDRESS} to {TUNNEL_DEVICE}")))?;
        changes += 1;
    }
    let neighbours = sync_neighbours(handle, index, &want.peers).await?;
    let routes = sync_return_routes(handle, settings, index, want).await?;
    if changes + neighbours + routes > 0 {
        tracing::debug!(device = changes, neighbours, routes, "{TUNNEL_DEVICE} updated");
    }
    Ok((changes + neighbours + routes, index))
}

fn neighbour_entry(msg: &NeighbourMessage) -> Option<(IpAddr, Vec<u8>)> {
    let ip = msg.attributes.iter().find_map(|a| match a {
        NeighbourAttribute::Destination(NeighbourAddress::Inet(v4)) => Some(IpAddr::V4(*v4)),
        NeighbourAttribute::Destination(NeighbourAddress::Inet6(v6)) => Some(IpAddr::V6(*v6)),
        _ => None,
    })?;
    let mac = msg
        .attributes
        .iter()
        .find_map(|a| if let NeighbourAttribute::LinkLayerAddress(m) = a { Some(m.clone()) } else { None })
        .unwrap_or_default();
    Some((ip, mac))
}

/// Netlink requests in flight at once for the per-peer entries.
const IN_FLIGHT: usize = 64;

/// Send `requests` with up to [`IN_FLIGHT`] awaiting their acks at once; how many were
/// acked. One by one, the 1,500 neighbours and 1,500 return routes a host installs for a
/// 1,500-node cluster took 535 ms (~180 µs a round trip; bench/FINDINGS.md "2026-11-27
/// (seventh)"). The entries are independent of each other; the first error is returned
/// (what was applied stays, and the next sync compares again).
async fn pipelined<F>(requests: impl Iterator<Item = F>) -> Result<usize, NetError>
where
    F: std::future::Future<Output = Result<(), NetError>>,
{
    futures::stream::iter(requests).buffer_unordered(IN_FLIGHT).try_fold(0, |n, ()| async move { Ok(n + 1) }).await
}

async fn sync_neighbours(handle: &Handle, index: u32, peers: &BTreeMap<IpAddr, [u8; 6]>) -> Result<usize, NetError> {
    let mut current: BTreeMap<IpAddr, (Vec<u8>, NeighbourMessage)> = BTreeMap::new();
    let mut stream = handle.neighbours().get().execute();
    while let Some(msg) = stream.try_next().await.map_err(err("listing neighbours"))? {
        if msg.header.ifindex != index {
            continue;
        }
        // The kernel's own entries (multicast, NOARP) are left alone: only permanent
        // ones are egressd's.
        if msg.header.state != NeighbourState::Permanent {
            continue;
        }
        if let Some((ip, mac)) = neighbour_entry(&msg) {
            current.insert(ip, (mac, msg));
        }
    }
    let stale = current.iter().filter(|(ip, _)| !peers.contains_key(ip)).map(|(ip, (_, msg))| {
        let req = handle.neighbours().del(msg.clone());
        async move { req.execute().await.map_err(err(format!("removing neighbour {ip}"))) }
    });
    let mut changes = pipelined(stale).await?;
    let wanted = peers.iter().filter(|(ip, mac)| current.get(ip).is_none_or(|(m, _)| m.as_slice() != *mac));
    let add = wanted.map(|(ip, mac)| {
        let req =
            handle.neighbours().add(index, *ip).link_layer_address(mac).state(NeighbourState::Permanent).replace();
        async move { req.execute().await.map_err(err(format!("setting neighbour {ip} on {TUNNEL_DEVICE}"))) }
    });
    changes += pipelined(add).await?;
    Ok(changes)
}

fn route_destination(msg: &RouteMessage) -> Option<IpAddr> {
    msg.attributes.iter().find_map(|a| match a {
        RouteAttribute::Destination(RouteAddress::Inet(v4)) => Some(IpAddr::V4(*v4)),
        RouteAttribute::Destination(RouteAddress::Inet6(v6)) => Some(IpAddr::V6(*v6)),
        _ => None,
    })
}

fn return_route(table: u32, protocol: u8, index: u32, peer: IpAddr, local: &[Option<IpAddr>; 2]) -> RouteMessage {
    let mut msg = match peer {
        IpAddr::V4(v4) => RouteMessageBuilder::<Ipv4Addr>::new().destination_prefix(v4, 32).build(),
        IpAddr::V6(v6) => RouteMessageBuilder::<Ipv6Addr>::new().destination_prefix(v6, 128).build(),
    };
    msg.header.protocol = RouteProtocol::from(protocol);
    msg.header.scope = RouteScope::Link;
    if table < 256 {
        msg.header.table = u8::try_from(table).unwrap_or(0);
    }
    msg.attributes.push(RouteAttribute::Table(table));
    msg.attributes.push(RouteAttribute::Oif(index));
    msg.attributes.extend(encap(REPLY_KEY, peer, local));
    msg
}

async fn sync_return_routes(
    handle: &Handle,
    settings: &EgressSettings,
    index: u32,
    want: &TunnelDesired,
) -> Result<usize, NetError> {
    let table = settings.tunnel_table();
    let wanted: BTreeSet<IpAddr> =
        if want.return_routes { want.peers.keys().copied().collect() } else { BTreeSet::new() };
    let mut current: BTreeMap<IpAddr, RouteMessage> = BTreeMap::new();
    for version in [IpVersion::V4, IpVersion::V6] {
        let query = if version == IpVersion::V6 {
            RouteMessageBuilder::<Ipv6Addr>::new().build()
        } else {
            RouteMessageBuilder::<Ipv4Addr>::new().build()
        };
        let mut stream = handle.route().get(query).execute();
        while let Some(msg) = stream.try_next().await.map_err(err("listing routes"))? {
            let in_table = msg
                .attributes
                .iter()
                .find_map(|a| if let RouteAttribute::Table(t) = a { Some(*t) } else { None })
                .unwrap_or(u32::from(msg.header.table));
            if in_table != table || u8::from(msg.header.protocol) != settings.route_protocol {
                continue;
            }
            if let Some(dst) = route_destination(&msg) {
                current.insert(dst, msg);
            }
        }
    }
    let stale = current.iter().filter(|(dst, msg)| {
        let right = next_hops(msg, Some(index)).is_empty()
            && msg.attributes.iter().any(|a| matches!(a, RouteAttribute::Oif(i) if *i == index));
        !wanted.contains(*dst) || !right
    });
    let stale = stale.map(|(dst, msg)| {
        let req = handle.route().del(msg.clone());
        async move { req.execute().await.map_err(err(format!("removing return route {dst}"))) }
    });
    let mut changes = pipelined(stale).await?;
    let missing = wanted.iter().filter(|peer| {
        !current
            .get(*peer)
            .is_some_and(|m| m.attributes.iter().any(|a| matches!(a, RouteAttribute::Oif(i) if *i == index)))
    });
    let add = missing.map(|peer| {
        let req = handle.route().add(return_route(table, settings.route_protocol, index, *peer, &want.local)).replace();
        async move { req.execute().await.map_err(err(format!("adding the return route to {peer}"))) }
    });
    changes += pipelined(add).await?;
    Ok(changes)
}
