//! The routing that delivers taken queries to this host: a policy rule on the intercept
//! mark to the proxy's table, with a local default route in it; and its removal
//! (`egressd cleanup`).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::dataplane::route_msg::{NetError, err};
use crate::dns::targets::DnsProxySettings;

/// Why the proxy's routing could not be set up or removed.
#[derive(Debug, thiserror::Error)]
pub enum RoutingError {
    /// No route netlink socket.
    #[error("route netlink: {0}")]
    Connect(#[from] std::io::Error),
    /// A request failed.
    #[error(transparent)]
    Netlink(#[from] NetError),
}

/// The policy rule and local route that deliver taken queries to this host.
pub(super) async fn routing(settings: &DnsProxySettings) -> Result<(), RoutingError> {
    let (connection, handle, _) = rtnetlink::new_connection()?;
    tokio::spawn(connection);
    install_routing(&handle, settings).await.map_err(err("installing the DNS proxy's rule and local route"))?;
    Ok(())
}

async fn install_routing(handle: &rtnetlink::Handle, settings: &DnsProxySettings) -> Result<(), rtnetlink::Error> {
    use futures::TryStreamExt;
    use netlink_packet_route::route::{RouteProtocol, RouteType};
    use netlink_packet_route::rule::{RuleAction, RuleAttribute};
    let mark = settings.intercept_mark();
    let lo = handle.link().get().match_name("lo").execute().try_next().await?.map(|l| l.header.index).unwrap_or(1);
    for version in [rtnetlink::IpVersion::V4, rtnetlink::IpVersion::V6] {
        let v6 = version == rtnetlink::IpVersion::V6;
        let mut exists = false;
        let mut rules = handle.rule().get(version).execute();
        while let Some(msg) = rules.try_next().await? {
            let attr = |f: &dyn Fn(&RuleAttribute) -> bool| msg.attributes.iter().any(f);
            exists |= attr(&|a| *a == RuleAttribute::Priority(settings.rule_priority))
                && attr(&|a| *a == RuleAttribute::FwMark(mark))
                && attr(&|a| *a == RuleAttribute::Table(settings.table));
        }
        if !exists {
            let mut req = handle.rule().add().fw_mark(mark).table_id(settings.table).priority(settings.rule_priority);
            req.message_mut().attributes.push(RuleAttribute::FwMask(mark));
            if v6 {
                req.v6().action(RuleAction::ToTable).execute().await?;
            } else {
                req.v4().action(RuleAction::ToTable).execute().await?;
            }
        }
        let any: IpAddr = if v6 { Ipv6Addr::UNSPECIFIED.into() } else { Ipv4Addr::UNSPECIFIED.into() };
        let mut route = rtnetlink::RouteMessageBuilder::<IpAddr>::new()
            .destination_prefix(any, 0)
            .map_err(|_| rtnetlink::Error::RequestFailed)?
            .table_id(settings.table)
            .kind(RouteType::Local)
            .protocol(RouteProtocol::from(settings.route_protocol))
            .output_interface(lo)
            .build();
        route.header.scope = netlink_packet_route::route::RouteScope::Host;
        handle.route().add(route).replace().execute().await?;
    }
    Ok(())
}

/// Remove the DNS proxy's policy rules and local routes (`egressd cleanup`): the rules of
/// its priority to its table and the routes of its table with egressd's protocol, for
/// the tables and priorities `egress` gives ([`DnsProxySettings::new`]). Returns how
/// many were removed.
pub async fn cleanup(egress: &crate::net::EgressSettings) -> Result<usize, RoutingError> {
    use futures::TryStreamExt;
    use netlink_packet_route::rule::RuleAttribute;
    let settings = DnsProxySettings::new(0, 0, egress);
    let (connection, handle, _) = rtnetlink::new_connection()?;
    tokio::spawn(connection);
    let mut removed = 0;
    for v6 in [false, true] {
        let version = if v6 { rtnetlink::IpVersion::V6 } else { rtnetlink::IpVersion::V4 };
        let mut rules = handle.rule().get(version).execute();
        let mut found = Vec::new();
        while let Some(msg) = rules.try_next().await.map_err(err("listing policy rules"))? {
            let has = |a: RuleAttribute| msg.attributes.contains(&a);
            if has(RuleAttribute::Priority(settings.rule_priority)) && has(RuleAttribute::Table(settings.table)) {
                found.push(msg);
            }
        }
        for msg in found {
            handle.rule().del(msg).execute().await.map_err(err("deleting the DNS proxy's policy rule"))?;
            removed += 1;
        }
        let filter = if v6 {
            rtnetlink::RouteMessageBuilder::<Ipv6Addr>::new().table_id(settings.table).build()
        } else {
            rtnetlink::RouteMessageBuilder::<Ipv4Addr>::new().table_id(settings.table).build()
        };
        let mut routes = handle.route().get(filter).execute();
        let mut found = Vec::new();
        while let Some(msg) = routes.try_next().await.map_err(err("listing the DNS proxy's routes"))? {
            let table = msg
                .attributes
                .iter()
                .find_map(|a| match a {
                    netlink_packet_route::route::RouteAttribute::Table(t) => Some(*t),
                    _ => None,
                })
                .unwrap_or(u32::from(msg.header.table));
            if table == settings.table && u8::from(msg.header.protocol) == settings.route_protocol {
                found.push(msg);
            }
        }
        for msg in found {
            handle.route().del(msg).execute().await.map_err(err("deleting the DNS proxy's route"))?;
            removed += 1;
        }
    }
    Ok(removed)
}
