//! The netlink driver for EgressIP: egress addresses on links, policy-routing rules and
//! the routes of egressd's tables.
//!
//! Ownership: an address is egressd's when its `IFA_PROTO` is the configured protocol
//! (Linux ≥ 6.1 keeps it); a rule when its priority is egressd's and its table is in
//! egressd's range; a route when its protocol is egressd's and its table is in the
//! range. Nothing else is ever changed or removed.
//!
//! Sync reads the owned state back from the kernel (a dump costs ~2 ms) and takes the
//! steps of [`crate::net::plan::between`]: removes what is not desired, adds what is
//! missing and replaces routes whose next hops differ; correct entries are never
//! touched, so a restart causes no flap.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use futures::TryStreamExt;
use ipnet::IpNet;
use netlink_packet_route::AddressFamily;
use netlink_packet_route::address::{AddressAttribute, AddressFlags, AddressMessage, AddressProtocol};
use netlink_packet_route::link::{LinkAttribute, LinkFlags, LinkMessage};
use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteFlags, RouteHeader, RouteMessage, RouteNextHop, RouteNextHopFlags,
    RouteProtocol, RouteScope,
};
use netlink_packet_route::rule::{RuleAction, RuleAttribute, RuleMessage};
use rtnetlink::{Handle, IpVersion, RouteMessageBuilder};

pub use super::route_msg::NetError;
use super::route_msg::{encap, err, next_hops, route_table};
use crate::net::plan::{NetState, Step, between, host_prefix};
use crate::net::{EgressSettings, HostLink, HostLinks, MarkRule, NetDesired, NextHop, TUNNEL_DEVICE};

/// What a sync changed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NetChanges {
    /// Addresses added: (address, link index, link name) — to be announced.
    pub added: Vec<(IpAddr, u32, String)>,
    /// Addresses not added: another host answered the duplicate address probe.
    pub conflicts: Vec<IpAddr>,
    /// Owned addresses removed.
    pub removed: Vec<IpAddr>,
    /// Rules and routes added, replaced or removed.
    pub routing: usize,
    /// The changes restored what egressd had established for the same desired state
    /// (someone else changed it): a repair, not a change of policy.
    pub repaired: bool,
}

impl NetChanges {
    /// Nothing changed.
    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.removed.is_empty() && self.routing == 0 && self.conflicts.is_empty()
    }
}

/// The netlink side of the dataplane.
#[derive(Clone)]
pub struct Netlink {
    handle: Handle,
    settings: EgressSettings,
    /// What the last successful sync left in the kernel.
    synced: std::sync::Arc<std::sync::Mutex<Option<NetDesired>>>,
    /// Egress IPs another host answered for: address → (who, link index, link name,
    /// when last probed).
    conflicts: std::sync::Arc<std::sync::Mutex<BTreeMap<IpAddr, Conflict>>>,
    /// What [`Netlink::forget_synced`] forgot: a sync of the same desired state that
    /// changes anything is a repair.
    forgotten: std::sync::Arc<std::sync::Mutex<Option<NetDesired>>>,
    /// The port of the socket egressd's requests go through: the kernel names it in the
    /// notifications of the changes they make.
    port: u32,
    /// The links as last read, and what tells whether they changed since
    /// ([`super::route_events::LinksWatch`]); `None` without one (every read dumps).
    links: std::sync::Arc<std::sync::Mutex<Option<LinksCache>>>,
}

/// [`Netlink::links`]' cache.
struct LinksCache {
    watch: super::route_events::LinksWatch,
    /// The links and default links last read (their conflicts are computed anew).
    last: Option<(Vec<HostLink>, [Option<u32>; 2])>,
    /// Reads dump until then: [`LINKS_SETTLE`] after the last notification that touched
    /// the links.
    settle_until: Option<std::time::Instant>,
    settle: std::time::Duration,
    /// How many times the links were dumped.
    dumps: u64,
}

/// How long after a notification that touched the links every read dumps them again.
/// The kernel may send the notification before the rest of the same change (a link
/// set down sends its notification, then flushes its IPv4 routes without one): a read
/// racing with that change could see half of it, and the reads that follow (the drift
/// check, 20 ms after the notification, is one) correct it.
pub const LINKS_SETTLE: std::time::Duration = std::time::Duration::from_secs(1);

#[derive(Debug, Clone)]
struct Conflict {
    who: String,
    link: (u32, String),
    probed: std::time::Instant,
}

/// The shortest listening time of a repeated probe (also when probing is off: an address
/// once found in use is only taken after a probe nobody answers).
const DEFAULT_REPROBE_WAIT: std::time::Duration = std::time::Duration::from_millis(200);

/// How often an address another host answered for is probed again.
pub(crate) const REPROBE: std::time::Duration = std::time::Duration::from_secs(2);

/// Probe `ip` on a link (blocking, in the blocking pool): `Some(description of the other
/// host)` when one answered. A probe that cannot be sent (a link without an Ethernet
/// address, say) finds no conflict.
async fn probe(ip: IpAddr, link: u32, name: &str, wait: std::time::Duration) -> Option<String> {
    let link_name = name.to_string();
    let probed = tokio::task::spawn_blocking(move || crate::dataplane::announce::probe(ip, link, &link_name, wait));
    match probed.await {
        Ok(Ok(Some(mac))) => Some(format!("MAC {} on link {name}", crate::dataplane::announce::mac_text(mac))),
        Ok(Ok(None)) => None,
        Ok(Err(e)) => {
            tracing::debug!(%ip, link = name, error = %e, "duplicate address probe not sent");
            None
        }
        Err(_) => None,
    }
}

impl Netlink {
    /// Open a route netlink socket (its connection task runs on the current runtime).
    pub fn connect(settings: EgressSettings) -> std::io::Result<Self> {
        use netlink_sys::AsyncSocket;
        let (mut connection, handle, _) = rtnetlink::new_connection()?;
        let port = connection.socket_mut().socket_mut().bind_auto()?.port_number();
        tokio::spawn(connection);
        let links = match super::route_events::LinksWatch::open() {
            Ok(watch) => Some(LinksCache { watch, last: None, settle_until: None, settle: LINKS_SETTLE, dumps: 0 }),
            Err(e) => {
                tracing::warn!(error = %e, "no link notifications: the links are dumped before every compile");
                None
            }
        };
        Ok(Self {
            handle,
            settings,
            synced: Default::default(),
            conflicts: Default::default(),
            forgotten: Default::default(),
            port,
            links: std::sync::Arc::new(std::sync::Mutex::new(links)),
        })
    }

    /// How many times [`Netlink::links`] dumped the links (`None`: it always does).
    pub fn links_dumps(&self) -> Option<u64> {
        self.links.lock().ok()?.as_ref().map(|c| c.dumps)
    }

    /// Set how long after a notification every read of the links dumps them
    /// ([`LINKS_SETTLE`]); tests set zero to compare each cached read with a fresh one.
    #[doc(hidden)]
    pub fn set_links_settle(&self, settle: std::time::Duration) {
        if let Ok(mut guard) = self.links.lock()
            && let Some(cache) = guard.as_mut()
        {
            cache.settle = settle;
        }
    }

    /// The port of the socket egressd's requests go through.
    pub(crate) fn port(&self) -> u32 {
        self.port
    }

    /// The node's links with their addresses, egressd's own addresses left out. Read
    /// from the kernel when a notification since the last read says they may have
    /// changed ([`super::route_events`]); the conflicts are computed anew each time.
    pub async fn links(&self) -> Result<HostLinks, NetError> {
        let cached = match self.links.lock() {
            Ok(mut guard) => match guard.as_mut() {
                Some(cache) => {
                    let now = std::time::Instant::now();
                    if cache.watch.changed(&self.settings) {
                        cache.settle_until = Some(now + cache.settle);
                        cache.last = None;
                    } else if cache.settle_until.is_some_and(|t| now < t) {
                        cache.last = None;
                    }
                    cache.last.clone()
                }
                None => None,
            },
            Err(_) => None,
        };
        let (links, default_link) = match cached {
            Some(last) => last,
            None => {
                let read = self.read_links().await?;
                if let Ok(mut guard) = self.links.lock()
                    && let Some(cache) = guard.as_mut()
                {
                    cache.last = Some(read.clone());
                    cache.dumps += 1;
                }
                read
            }
        };
        Ok(HostLinks { links, default_link, conflicts: self.recheck_conflicts().await })
    }

    /// Dump the links, their addresses (egressd's left out) and the main table's default
    /// routes.
    async fn read_links(&self) -> Result<(Vec<HostLink>, [Option<u32>; 2]), NetError> {
        let mut links: Vec<HostLink> = Vec::new();
        let mut stream = self.handle.link().get().execute();
        while let Some(msg) = stream.try_next().await.map_err(err("listing links"))? {
            let name = msg
                .attributes
                .iter()
                .find_map(|a| if let LinkAttribute::IfName(n) = a { Some(n.clone()) } else { None })
                .unwrap_or_default();
            // egressd's own tunnel device is no link of the node's (its changes are
            // egressd's doing; nothing is hosted or routed by its addresses).
            if name == TUNNEL_DEVICE {
                continue;
            }
            let flags = msg.header.flags;
            links.push(HostLink {
                index: msg.header.index,
                name,
                up: flags.contains(LinkFlags::Up) && flags.contains(LinkFlags::Running),
                addrs: Vec::new(),
                gateways: Vec::new(),
            });
        }
        let mut stream = self.handle.address().get().execute();
        while let Some(msg) = stream.try_next().await.map_err(err("listing addresses"))? {
            if self.owned_address(&msg) {
                continue;
            }
            let Some(ip) = address_of(&msg) else { continue };
            let Ok(net) = IpNet::new(ip, msg.header.prefix_len) else { continue };
            if let Some(link) = links.iter_mut().find(|l| l.index == msg.header.index) {
                link.addrs.push(net);
            }
        }
        // Default routes of the main table: each link's gateways, and the preferred link.
        let mut default_link = [None, None];
        for (f, v6) in [(0, false), (1, true)] {
            let query = if v6 {
                RouteMessageBuilder::<Ipv6Addr>::new().build()
            } else {
                RouteMessageBuilder::<Ipv4Addr>::new().build()
            };
            let mut best: Option<(u32, u32)> = None;
            let mut stream = self.handle.route().get(query).execute();
            while let Some(msg) = stream.try_next().await.map_err(err("listing routes"))? {
                if route_table(&msg) != u32::from(RouteHeader::RT_TABLE_MAIN)
                    || msg.header.destination_prefix_length != 0
                {
                    continue;
                }
                let metric = msg
                    .attributes
                    .iter()
                    .find_map(|a| if let RouteAttribute::Priority(p) = a { Some(*p) } else { None })
                    .unwrap_or(0);
                for hop in next_hops(&msg, None) {
                    if let Some(link) = links.iter_mut().find(|l| l.index == hop.link)
                        && !link.gateways.contains(&hop.gateway)
                    {
                        link.gateways.push(hop.gateway);
                    }
                    if best.is_none_or(|(m, _)| metric < m) {
                        best = Some((metric, hop.link));
                    }
                }
            }
            default_link[f] = best.map(|(_, link)| link);
        }
        Ok((links, default_link))
    }

    fn owned_address(&self, msg: &AddressMessage) -> bool {
        msg.attributes
            .iter()
            .any(|a| matches!(a, AddressAttribute::Protocol(p) if u8::from(*p) == self.settings.address_protocol))
    }

    /// egressd's state in the kernel.
    /// `tunnel`: the tunnel device's index, if it exists (its hops read as the model's).
    pub(crate) async fn owned(&self, tunnel: Option<u32>) -> Result<NetState, NetError> {
        let mut state = NetState::default();
        let mut stream = self.handle.address().get().execute();
        while let Some(msg) = stream.try_next().await.map_err(err("listing addresses"))? {
            if self.owned_address(&msg)
                && let Some(ip) = address_of(&msg)
            {
                state.addresses.insert(ip, (msg.header.index, msg.header.prefix_len));
            }
        }
        for version in [IpVersion::V4, IpVersion::V6] {
            let v6 = version == IpVersion::V6;
            let mut stream = self.handle.rule().get(version).execute();
            while let Some(msg) = stream.try_next().await.map_err(err("listing rules"))? {
                if let Some(rule) = self.owned_rule(&msg, v6) {
                    state.rules.insert(rule);
                }
            }
            let query = if v6 {
                RouteMessageBuilder::<Ipv6Addr>::new().build()
            } else {
                RouteMessageBuilder::<Ipv4Addr>::new().build()
            };
            let mut stream = self.handle.route().get(query).execute();
            while let Some(msg) = stream.try_next().await.map_err(err("listing routes"))? {
                if u8::from(msg.header.protocol) != self.settings.route_protocol {
                    continue;
                }
                let table = route_table(&msg);
                if !self.settings.owns_table(table) || table == self.settings.tunnel_table() {
                    continue;
                }
                state.routes.entry((table, v6)).or_default().extend(next_hops(&msg, tunnel));
            }
        }
        for hops in state.routes.values_mut() {
            hops.sort();
        }
        Ok(state)
    }

    fn owned_rule(&self, msg: &RuleMessage, v6: bool) -> Option<MarkRule> {
        let mut rule = MarkRule { v6, mark: 0, mask: u32::MAX, table: u32::from(msg.header.table), priority: 0 };
        for a in &msg.attributes {
            match a {
                RuleAttribute::Priority(p) => rule.priority = *p,
                RuleAttribute::FwMark(m) => rule.mark = *m,
                RuleAttribute::FwMask(m) => rule.mask = *m,
                RuleAttribute::Table(t) => rule.table = *t,
                _ => {}
            }
        }
        (rule.priority == self.settings.rule_priority && self.settings.owns_table(rule.table)).then_some(rule)
    }

    /// Forget what the last sync established: the next [`Netlink::sync_if_changed`]
    /// reads the kernel back.
    pub(crate) fn forget_synced(&self) {
        let last = self.synced.lock().ok().and_then(|mut s| s.take());
        if let (Some(last), Ok(mut f)) = (last, self.forgotten.lock()) {
            *f = Some(last);
        }
    }

    /// [`Netlink::sync`] unless the last successful sync already established `desired`:
    /// every apply calls this, and most applies (pod churn) change no netlink state. Drift
    /// is found by the periodic [`Netlink::sync`].
    pub(crate) async fn sync_if_changed(&self, desired: &NetDesired) -> Result<NetChanges, NetError> {
        if self.synced.lock().is_ok_and(|s| s.as_ref() == Some(desired)) {
            return Ok(NetChanges::default());
        }
        let forgotten = self.forgotten.lock().ok().and_then(|mut f| f.take());
        let mut changes = self.sync(desired).await?;
        changes.repaired = forgotten.as_ref() == Some(desired) && !changes.is_empty();
        Ok(changes)
    }

    /// When the earliest held-back address is due to be probed again ([`REPROBE`] after
    /// its last probe); `None` without conflicts. An absolute time, so that the agent's
    /// other wake-ups do not push it back.
    pub(crate) fn next_reprobe(&self) -> Option<std::time::Instant> {
        let conflicts = self.conflicts.lock().ok()?;
        conflicts.values().map(|c| c.probed + REPROBE).min()
    }

    /// The conflicts, each probed again once [`REPROBE`] has passed: an address nobody
    /// answers for any more is forgotten (and may be hosted).
    async fn recheck_conflicts(&self) -> BTreeMap<IpAddr, String> {
        let due: Vec<(IpAddr, Conflict)> = match self.conflicts.lock() {
            Ok(c) => c.iter().filter(|(_, c)| c.probed.elapsed() >= REPROBE).map(|(ip, c)| (*ip, c.clone())).collect(),
            Err(_) => Vec::new(),
        };
        for (ip, c) in due {
            let answer = probe(ip, c.link.0, &c.link.1, self.settings.dad_wait.max(DEFAULT_REPROBE_WAIT)).await;
            if let Ok(mut conflicts) = self.conflicts.lock() {
                match answer {
                    Some(who) => {
                        conflicts.insert(ip, Conflict { who, probed: std::time::Instant::now(), ..c });
                    }
                    None => {
                        tracing::info!(%ip, "no other host answers for the egress IP any more");
                        conflicts.remove(&ip);
                    }
                }
            }
        }
        self.conflicts.lock().map(|c| c.iter().map(|(ip, c)| (*ip, c.who.clone())).collect()).unwrap_or_default()
    }

    /// Make the kernel's owned state equal `desired` (reads the owned state back first).
    pub async fn sync(&self, desired: &NetDesired) -> Result<NetChanges, NetError> {
        if let Ok(mut s) = self.synced.lock() {
            *s = None;
        }
        // The tunnel device, read once: its hops are read as the model's, then it is synced.
        let mut tunnel = super::tunnel::device(&self.handle).await?;
        let current = self.owned(tunnel.as_ref().map(|d| d.header.index)).await?;
        let mut changes = NetChanges::default();
        // Through the tunnel device (its index) from this node's addresses, once synced.
        let mut through = TunnelEnd::default();
        for step in between(&current, desired) {
            self.take(step, desired, &mut tunnel, &mut through, &mut changes).await?;
        }
        if changes.conflicts.is_empty()
            && let Ok(mut s) = self.synced.lock()
        {
            *s = Some(desired.clone());
        }
        Ok(changes)
    }

    /// Take one step of [`between`]'s plan, counting what it changed in `changes`.
    async fn take(
        &self,
        step: Step,
        desired: &NetDesired,
        tunnel: &mut Option<LinkMessage>,
        through: &mut TunnelEnd,
        changes: &mut NetChanges,
    ) -> Result<(), NetError> {
        match step {
            Step::RemoveRule(rule) => {
                self.handle
                    .rule()
                    .del(rule_message(&rule))
                    .execute()
                    .await
                    .map_err(err(format!("removing {rule:?}")))?;
                changes.routing += 1;
            }
            Step::RemoveRoute(table, v6) => {
                // By table, family and protocol only: the kernel matches any next hop
                // given (an encap to the letter), and egressd's table has one default route.
                let msg = route_message(table, v6, &[], self.settings.route_protocol, TunnelEnd::default());
                self.handle
                    .route()
                    .del(msg)
                    .execute()
                    .await
                    .map_err(err(format!("removing route in table {table}")))?;
                changes.routing += 1;
            }
            Step::RemoveAddress(ip, link, prefix) => {
                let msg = address_message(ip, link, prefix, self.settings.address_protocol);
                self.handle.address().del(msg).execute().await.map_err(err(format!("removing address {ip}")))?;
                changes.removed.push(ip);
            }
            Step::AddAddress(ip, link, name) => self.add_address(ip, link, name, changes).await?,
            Step::Tunnel => {
                // The device (and its neighbours and return routes) before the routes
                // through it; removed once nothing routes through it.
                let (n, index) =
                    super::tunnel::sync(&self.handle, &self.settings, tunnel.take(), desired.tunnel.as_ref()).await?;
                changes.routing += n;
                let local = desired.tunnel.as_ref().map(|t| t.local).unwrap_or_default();
                *through = TunnelEnd { index, local };
            }
            Step::SetRoute(table, v6, hops) => {
                let msg = route_message(table, v6, &hops, self.settings.route_protocol, *through);
                self.handle
                    .route()
                    .add(msg)
                    .replace()
                    .execute()
                    .await
                    .map_err(err(format!("setting the route of table {table}")))?;
                changes.routing += 1;
            }
            Step::AddRule(rule) => {
                self.add_rule(&rule).await?;
                changes.routing += 1;
            }
        }
        Ok(())
    }

    /// Add egress IP `ip` to link `link` (`name`), tagged, unless another host answers
    /// the duplicate address probe for it (then it is a conflict).
    async fn add_address(&self, ip: IpAddr, link: u32, name: String, changes: &mut NetChanges) -> Result<(), NetError> {
        if !self.settings.dad_wait.is_zero()
            && let Some(who) = probe(ip, link, &name, self.settings.dad_wait).await
        {
            tracing::warn!(%ip, %who, "another host answers for the egress IP; not taking it");
            if let Ok(mut c) = self.conflicts.lock() {
                c.insert(ip, Conflict { who, link: (link, name), probed: std::time::Instant::now() });
            }
            changes.conflicts.push(ip);
            return Ok(());
        }
        let mut req = self.handle.address().add(link, ip, host_prefix(ip));
        let msg = req.message_mut();
        msg.attributes.push(AddressAttribute::Protocol(AddressProtocol::from(self.settings.address_protocol)));
        if ip.is_ipv6() {
            msg.attributes.push(AddressAttribute::Flags(AddressFlags::Nodad));
        }
        req.execute().await.map_err(err(format!("adding address {ip} to {name}")))?;
        changes.added.push((ip, link, name));
        Ok(())
    }

    /// Add policy-routing rule `rule`, with egressd's protocol.
    async fn add_rule(&self, rule: &MarkRule) -> Result<(), NetError> {
        let mut req = self.handle.rule().add().fw_mark(rule.mark).table_id(rule.table).priority(rule.priority);
        req.message_mut().attributes.push(RuleAttribute::FwMask(rule.mask));
        req.message_mut().attributes.push(RuleAttribute::Protocol(RouteProtocol::from(self.settings.route_protocol)));
        let result = if rule.v6 {
            req.v6().action(RuleAction::ToTable).execute().await
        } else {
            req.v4().action(RuleAction::ToTable).execute().await
        };
        result.map_err(err(format!("adding {rule:?}")))
    }

    /// Remove everything egressd owns; returns how many entries were removed.
    pub async fn cleanup(&self) -> Result<usize, NetError> {
        let changes = self.sync(&NetDesired::default()).await?;
        Ok(changes.removed.len() + changes.routing)
    }
}

fn address_of(msg: &AddressMessage) -> Option<IpAddr> {
    let local = msg.attributes.iter().find_map(|a| if let AddressAttribute::Local(ip) = a { Some(*ip) } else { None });
    local.or_else(|| {
        msg.attributes.iter().find_map(|a| if let AddressAttribute::Address(ip) = a { Some(*ip) } else { None })
    })
}

/// The tunnel device's index and this node's outer source addresses, for routes through it.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct TunnelEnd {
    pub index: u32,
    pub local: [Option<IpAddr>; 2],
}

fn route_message(table: u32, v6: bool, hops: &[NextHop], protocol: u8, tunnel: TunnelEnd) -> RouteMessage {
    let mut msg = if v6 {
        RouteMessageBuilder::<Ipv6Addr>::new().table_id(table).protocol(RouteProtocol::from(protocol)).build()
    } else {
        RouteMessageBuilder::<Ipv4Addr>::new().table_id(table).protocol(RouteProtocol::from(protocol)).build()
    };
    msg.header.scope = RouteScope::Universe;
    match hops {
        [] => {}
        [one] => {
            msg.attributes.push(RouteAttribute::Gateway(RouteAddress::from(one.gateway)));
            match one.key {
                Some(key) => {
                    msg.attributes.push(RouteAttribute::Oif(tunnel.index));
                    msg.header.flags |= RouteFlags::Onlink;
                    msg.attributes.extend(encap(key, one.gateway, &tunnel.local));
                }
                None => msg.attributes.push(RouteAttribute::Oif(one.link)),
            }
        }
        many => {
            let built = many
                .iter()
                .map(|h| {
                    let mut attributes = vec![RouteAttribute::Gateway(RouteAddress::from(h.gateway))];
                    let (flags, link) = match h.key {
                        Some(key) => {
                            attributes.extend(encap(key, h.gateway, &tunnel.local));
                            (RouteNextHopFlags::Onlink, tunnel.index)
                        }
                        None => (RouteNextHopFlags::empty(), h.link),
                    };
                    let mut hop = RouteNextHop::default();
                    hop.flags = flags;
                    hop.interface_index = link;
                    hop.attributes = attributes;
                    hop
                })
                .collect();
            msg.attributes.push(RouteAttribute::MultiPath(built));
        }
    }
    msg
}

fn rule_message(rule: &MarkRule) -> RuleMessage {
    let mut msg = RuleMessage::default();
    msg.header.family = if rule.v6 { AddressFamily::Inet6 } else { AddressFamily::Inet };
    msg.header.action = RuleAction::ToTable;
    msg.attributes.push(RuleAttribute::Priority(rule.priority));
    msg.attributes.push(RuleAttribute::FwMark(rule.mark));
    msg.attributes.push(RuleAttribute::FwMask(rule.mask));
    msg.attributes.push(RuleAttribute::Table(rule.table));
    msg
}

fn address_message(ip: IpAddr, link: u32, prefix: u8, protocol: u8) -> AddressMessage {
    let mut msg = AddressMessage::default();
    msg.header.family = if ip.is_ipv6() { AddressFamily::Inet6 } else { AddressFamily::Inet };
    msg.header.prefix_len = prefix;
    msg.header.index = link;
    msg.attributes.push(AddressAttribute::Address(ip));
    if ip.is_ipv4() {
        msg.attributes.push(AddressAttribute::Local(ip));
    }
    msg.attributes.push(AddressAttribute::Protocol(AddressProtocol::from(protocol)));
    msg
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn hop() -> impl Strategy<Value = NextHop> {
        (any::<bool>(), 1u8..250, 1u32..8, prop::option::of(1u32..0x00ff_ffff)).prop_map(|(v6, last, link, key)| {
            let gateway: IpAddr =
                if v6 { format!("2001:db8::{last:x}").parse().unwrap() } else { IpAddr::from([198, 19, 0, last]) };
            // A hop through the tunnel is modelled with link 0.
            NextHop { gateway, link: if key.is_some() { 0 } else { link }, key }
        })
    }

    proptest! {
        /// What a sync writes reads back as the model it was written from — one hop or
        /// several, on links or through the tunnel — so a correct route is never
        /// replaced (no flap on restart, no needless write in the periodic check).
        #[test]
        fn routes_read_back_as_written(v6 in any::<bool>(), hops in prop::collection::btree_set(hop(), 1..4)) {
            let hops: Vec<NextHop> =
                hops.into_iter().filter(|h| h.gateway.is_ipv6() == v6).collect();
            prop_assume!(!hops.is_empty());
            let tunnel = TunnelEnd { index: 42, local: [Some(IpAddr::from([198, 19, 0, 1])), None] };
            let msg = route_message(7471, v6, &hops, 0xe9, tunnel);
            let mut read = next_hops(&msg, Some(42));
            read.sort();
            prop_assert_eq!(read, hops);
        }
    }
}
