//! egressd's typed model of the netlink state it owns on a node — egress addresses,
//! policy-routing rules, routes in its own tables — and of the links it reads: the twin
//! of [`crate::nft`]. The compile step produces a [`NetDesired`] from the view and the
//! [`HostLinks`]; the netlink driver ([`crate::dataplane::netlink`]) reads the links and
//! makes the kernel match, taking the steps of [`plan::between`]. Neither knows the other.

pub mod plan;

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use ipnet::IpNet;

/// How egressd marks and routes steered packets. Everything it creates is found again by
/// these values (rule priority, table range, route protocol, address protocol).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EgressSettings {
    /// The mark bits egressd owns; other bits of the packet mark are left alone.
    pub mark_mask: u32,
    /// Routing tables `table_base + 1 ..= table_base + tables` are egressd's.
    pub table_base: u32,
    /// Number of routing tables (and mark values) egressd may use.
    pub tables: u32,
    /// Priority of egressd's policy-routing rules.
    pub rule_priority: u32,
    /// Route protocol number of egressd's routes.
    pub route_protocol: u8,
    /// Address protocol (`IFA_PROTO`) tagging egressd's addresses.
    pub address_protocol: u8,
    /// Drop selected pods' outside traffic when no node hosts an IP of their EgressIP.
    pub fail_closed: bool,
    /// The kernel tags addresses with their owner (`IFA_PROTO`, Linux ≥ 6.1): without it
    /// egressd could not find the addresses it added again, so it hosts none.
    pub address_tags: bool,
    /// How long to listen for another host answering for an egress IP before hosting it
    /// (ARP probe / neighbour solicitation; zero: no probe).
    pub dad_wait: std::time::Duration,
    /// Who assigns egress IPs to nodes' links (`--egress-ip-mode`).
    pub mode: EgressIpMode,
    /// How steered packets reach a hosting node (`--egress-ip-transport`).
    pub transport: Transport,
    /// The UDP port of the encapsulated path (`--egress-ip-vxlan-port`).
    pub vxlan_port: u16,
}

/// How a steering node's packets reach the hosting node (`--egress-ip-transport`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Transport {
    /// Direct when the hosting node's address is on a shared link and no cloud fabric
    /// filters (not `--egress-ip-mode cloud`, no cloud `spec.providerID` on either
    /// node); VXLAN otherwise.
    #[default]
    Auto,
    /// Always as an on-link next hop, with the pod's own source address (one L2
    /// segment, nothing filtering).
    Direct,
    /// Always encapsulated in VXLAN between the two nodes' own addresses.
    Vxlan,
}

/// The device egressd's encapsulated path uses (`vxlan external`: one device, every
/// tunnel key).
pub const TUNNEL_DEVICE: &str = "egressd-vx";
/// The default UDP port of the encapsulated path: not VXLAN's 4789 (Calico, Cilium and
/// OVN-Kubernetes' VXLAN mode), nor the kernel's 8472 (flannel).
pub const DEFAULT_VXLAN_PORT: u16 = 4800;
/// The tunnel key of return traffic (replies going back to the steering node).
pub const REPLY_KEY: u32 = 0;

/// How egress IPs get to nodes (`--egress-ip-mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EgressIpMode {
    /// The leader writes `status.items`; CloudPrivateIPConfigs are only validated.
    #[default]
    Direct,
    /// The leader asks a cloud network controller for each IP (one
    /// CloudPrivateIPConfig per placed IP) and publishes an item once it is assigned.
    Cloud,
    /// As `Cloud`, and egressd is that controller: the node named in a
    /// CloudPrivateIPConfig's `spec.node` puts the IP on its matching link.
    CloudLocal,
}

impl EgressIpMode {
    /// CloudPrivateIPConfigs carry the placement.
    pub fn cloud(self) -> bool {
        self != Self::Direct
    }
}

impl Default for EgressSettings {
    fn default() -> Self {
        Self {
            mark_mask: 0x00ff_0000,
            table_base: 7470,
            tables: 255,
            rule_priority: 5470,
            route_protocol: 0xe9,
            address_protocol: 0xe9,
            fail_closed: false,
            address_tags: true,
            dad_wait: std::time::Duration::from_millis(200),
            mode: EgressIpMode::Direct,
            transport: Transport::Auto,
            vxlan_port: DEFAULT_VXLAN_PORT,
        }
    }
}

/// The lowest `--egress-ip-table-base`: egressd's tables start above the kernel's own
/// (253 default, 254 main, 255 local).
pub const MIN_TABLE_BASE: u32 = 255;
/// The highest `--egress-ip-table-base`: base + 255 stays below `u32::MAX` (never wraps).
pub const MAX_TABLE_BASE: u32 = u32::MAX - 256;
/// Packet-mark bits kube-proxy uses (0x4000 masquerade, 0x8000 drop); egressd's mask
/// must not touch them.
pub(crate) const KUBE_PROXY_MARKS: u32 = 0x0000_c000;

/// Whether a kernel of release `release` (`/proc/sys/kernel/osrelease`, e.g.
/// `6.18.44-…`) tags addresses with `IFA_PROTO` (Linux ≥ 6.1). An unreadable release
/// counts as yes (the kernel is then trusted, as before the check).
pub fn kernel_tags_addresses(release: &str) -> bool {
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    let major: Option<u32> = parts.next().and_then(|p| p.parse().ok());
    let minor: Option<u32> = parts.next().and_then(|p| p.parse().ok());
    match (major, minor) {
        (Some(major), Some(minor)) => (major, minor) >= (6, 1),
        _ => true,
    }
}

impl EgressSettings {
    /// Check a mark mask: non-zero, contiguous (the mark values are counted inside it)
    /// and clear of kube-proxy's bits. The error says why.
    pub fn check_mark_mask(mask: u32) -> Result<(), String> {
        if mask == 0 {
            return Err("must not be 0".into());
        }
        let shifted = mask >> mask.trailing_zeros();
        if shifted & shifted.wrapping_add(1) != 0 {
            return Err(format!("{mask:#010x}: the bits must be contiguous (e.g. 0x00ff0000)"));
        }
        if mask & KUBE_PROXY_MARKS != 0 {
            return Err(format!(
                "{mask:#010x} overlaps kube-proxy's mark bits {KUBE_PROXY_MARKS:#010x} (0x4000 masquerade, 0x8000 drop)"
            ));
        }
        Ok(())
    }

    /// The mark value for routing table index `k` (1-based), shifted into the mask.
    pub fn mark(&self, k: u32) -> u32 {
        k.checked_shl(self.mark_mask.trailing_zeros()).unwrap_or(0) & self.mark_mask
    }

    /// How many distinct mark values the mask and table range allow for next-hop sets.
    /// When the encapsulated path may be used, the mask's top bit is the tunnel's
    /// ([`Self::tunnel_bit`]) and the sets count in the bits below it.
    pub(crate) fn capacity(&self) -> u32 {
        let values = self.mark_mask.checked_shr(self.mark_mask.trailing_zeros()).unwrap_or(0);
        let values = if self.tunnel_bit().is_some() { values >> 1 } else { values };
        values.min(self.tables.saturating_sub(u32::from(self.tunnel_bit().is_some())))
    }

    /// The mark bit of tunnelled packets (the mask's top bit), when the transport may
    /// encapsulate and the mask has room for it (two bits or more).
    pub fn tunnel_bit(&self) -> Option<u32> {
        if self.transport == Transport::Direct || self.mark_mask.count_ones() < 2 {
            return None;
        }
        Some(1u32 << (31 - self.mark_mask.leading_zeros()))
    }

    /// The mark of a packet that arrived through the tunnel with hosted key number `j`
    /// (0: return traffic): the tunnel bit and `j` below it.
    pub fn tunnel_mark(&self, j: u32) -> Option<u32> {
        let bit = self.tunnel_bit()?;
        Some(bit | (self.mark(j) & (bit - 1)))
    }

    /// The routing table of tunnelled packets: return routes to every peer node.
    pub fn tunnel_table(&self) -> u32 {
        self.table_base.saturating_add(self.tables)
    }

    /// Whether `table` is in egressd's range.
    pub fn owns_table(&self, table: u32) -> bool {
        table > self.table_base && table <= self.table_base.saturating_add(self.tables)
    }
}

/// One network link of this node as egressd sees it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HostLink {
    /// Interface index.
    pub index: u32,
    /// Interface name.
    pub name: String,
    /// Administratively and operationally up (or at least not down).
    pub up: bool,
    /// Its addresses with prefix length, without the ones egressd added.
    pub addrs: Vec<IpNet>,
    /// Gateways of the main table's default routes through this link (any metric).
    pub gateways: Vec<IpAddr>,
}

/// The node's links (read by the netlink driver before each compile).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HostLinks {
    /// The links.
    pub links: Vec<HostLink>,
    /// The link of the main table's preferred default route: [IPv4, IPv6].
    pub default_link: [Option<u32>; 2],
    /// Egress IPs another host answered the duplicate address probe for (not hosted
    /// here until a later probe goes unanswered): address → who answered, on which link.
    pub conflicts: std::collections::BTreeMap<IpAddr, String>,
}

impl HostLinks {
    /// The up link whose subnet contains `ip`, longest prefix first; host routes
    /// (/32, /128) and IPv6 link-local subnets never count.
    pub(crate) fn link_for(&self, ip: IpAddr) -> Option<&HostLink> {
        let mut best: Option<(u8, &HostLink)> = None;
        for link in self.links.iter().filter(|l| l.up) {
            for net in &link.addrs {
                if net.prefix_len() == net.max_prefix_len() || is_link_local(net.addr()) || !net.contains(&ip) {
                    continue;
                }
                if best
                    .is_none_or(|(len, b)| net.prefix_len() > len || (net.prefix_len() == len && link.index < b.index))
                {
                    best = Some((net.prefix_len(), link));
                }
            }
        }
        best.map(|(_, l)| l)
    }

    /// Every address of every link.
    pub fn addresses(&self) -> impl Iterator<Item = IpAddr> + '_ {
        self.links.iter().flat_map(|l| l.addrs.iter().map(IpNet::addr))
    }
}

/// `aa:bb:cc:dd:ee:ff`.
pub fn mac_text(mac: [u8; 6]) -> String {
    mac.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":")
}

fn is_link_local(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_link_local(),
        IpAddr::V6(v6) => v6.segments()[0] & 0xffc0 == 0xfe80,
    }
}

/// One next hop of a steering route.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NextHop {
    /// The hosting node's address.
    pub gateway: IpAddr,
    /// The link it is reached on (0 with `key`: the tunnel device).
    pub link: u32,
    /// Through the tunnel device with this key (the egress IP's), to `gateway`.
    pub key: Option<u32>,
}

impl NextHop {
    /// An on-link next hop.
    pub fn direct(gateway: IpAddr, link: u32) -> Self {
        Self { gateway, link, key: None }
    }
}

/// The tunnel key of an egress IP: its low 24 bits (the VXLAN network identifier's
/// width), never [`REPLY_KEY`]. The same on every node and across restarts, for as
/// long as the IP exists; two egress IPs of one family whose low 24 bits are equal
/// cannot both be reached through the tunnel on one node (reported).
pub fn tunnel_key(ip: IpAddr) -> u32 {
    let low = match ip {
        IpAddr::V4(v4) => u32::from(v4) & 0x00ff_ffff,
        IpAddr::V6(v6) => (u128::from(v6) & 0x00ff_ffff) as u32,
    };
    if low == REPLY_KEY { 0x00ff_ffff } else { low }
}

/// The tunnel device's Ethernet address on the node whose tunnel address is `ip`: the
/// receiving device accepts frames to its own address only, and drops frames from it
/// (a loop), so each node's differs and every peer can compute it.
pub fn tunnel_mac(ip: IpAddr) -> [u8; 6] {
    let tail = match ip {
        IpAddr::V4(v4) => v4.octets(),
        IpAddr::V6(v6) => {
            // FNV-1a of the 16 bytes.
            let mut h: u32 = 0x811c_9dc5;
            for b in v6.octets() {
                h = (h ^ u32::from(b)).wrapping_mul(0x0100_0193);
            }
            h.to_be_bytes()
        }
    };
    [0x02, if ip.is_ipv4() { 0xe9 } else { 0xea }, tail[0], tail[1], tail[2], tail[3]]
}

/// The encapsulated path on this node: the device, its peers and return routes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TunnelDesired {
    /// UDP port.
    pub port: u16,
    /// This node's device address ([`tunnel_mac`] of its tunnel address).
    pub mac: [u8; 6],
    /// The outer source per family (this node's address): never left to the kernel's
    /// choice, which may pick a hosted egress IP that peers do not accept.
    pub local: [Option<IpAddr>; 2],
    /// The peer node addresses tunnelled packets are exchanged with → their device's
    /// Ethernet address (permanent neighbours). A peer on a shared link, with no cloud
    /// filtering, steers on-link and has none.
    pub peers: BTreeMap<IpAddr, [u8; 6]>,
    /// Return routes (this node hosts an egress IP reached through the tunnel): each
    /// peer address through the tunnel, in the tunnel table.
    pub return_routes: bool,
}

/// A policy-routing rule: packets with `mark` (under `mask`) look up `table`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MarkRule {
    /// IPv6 (else IPv4).
    pub v6: bool,
    /// Mark value.
    pub mark: u32,
    /// Mask.
    pub mask: u32,
    /// Routing table.
    pub table: u32,
    /// Priority.
    pub priority: u32,
}

/// The netlink state egressd wants on this node.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NetDesired {
    /// Egress IPs hosted here → (link index, link name).
    pub addresses: BTreeMap<IpAddr, (u32, String)>,
    /// Default routes of egressd's tables: (table, IPv6) → next hops.
    pub routes: BTreeMap<(u32, bool), Vec<NextHop>>,
    /// Policy-routing rules.
    pub rules: BTreeSet<MarkRule>,
    /// The encapsulated path, when anything uses it.
    pub tunnel: Option<TunnelDesired>,
}

impl NetDesired {
    /// The state as text (`egressd render`), empty when there is none: one line per
    /// address, rule and route.
    pub fn render(&self) -> String {
        if self.addresses.is_empty() && self.rules.is_empty() && self.routes.is_empty() && self.tunnel.is_none() {
            return String::new();
        }
        let mut out = String::from("# netlink\n");
        for (ip, (index, link)) in &self.addresses {
            let len = if ip.is_ipv4() { 32 } else { 128 };
            out.push_str(&format!("address {ip}/{len} dev {link} (index {index})\n"));
        }
        for r in &self.rules {
            let family = if r.v6 { "-6" } else { "-4" };
            out.push_str(&format!(
                "rule {family} fwmark {:#x}/{:#x} lookup {} priority {}\n",
                r.mark, r.mask, r.table, r.priority
            ));
        }
        for ((table, v6), hops) in &self.routes {
            let family = if *v6 { "-6" } else { "-4" };
            let via: Vec<String> = hops
                .iter()
                .map(|h| match h.key {
                    Some(key) => format!("via {} dev {TUNNEL_DEVICE} key {key}", h.gateway),
                    None => format!("via {} (index {})", h.gateway, h.link),
                })
                .collect();
            out.push_str(&format!("route {family} default table {table} {}\n", via.join(" ")));
        }
        if let Some(t) = &self.tunnel {
            out.push_str(&format!("tunnel {TUNNEL_DEVICE} vxlan external port {} mac {}\n", t.port, mac_text(t.mac)));
            for (ip, mac) in &t.peers {
                let route = if t.return_routes { " (return route)" } else { "" };
                out.push_str(&format!("tunnel peer {ip} mac {}{route}\n", mac_text(*mac)));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn address_tags_need_linux_6_1() {
        for (release, ok) in [
            ("6.18.44-fc-v669", true),
            ("6.1.0-13-amd64", true),
            ("6.0.19", false),
            ("5.15.0-91-generic", false),
            ("4.19.0", false),
            ("10.0", true),
            ("garbage", true),
        ] {
            assert_eq!(kernel_tags_addresses(release), ok, "{release}");
        }
    }

    #[test]
    fn mark_masks_are_checked_and_table_ids_never_wrap() {
        assert!(EgressSettings::check_mark_mask(0x00ff_0000).is_ok());
        assert!(EgressSettings::check_mark_mask(0x8000_0000).is_ok());
        assert!(EgressSettings::check_mark_mask(0).is_err());
        assert!(EgressSettings::check_mark_mask(0x0001_0100).unwrap_err().contains("contiguous"));
        for kube_proxy in [0x4000, 0x8000, 0xff00, 0xffff_ffff] {
            assert!(EgressSettings::check_mark_mask(kube_proxy).unwrap_err().contains("kube-proxy"), "{kube_proxy:#x}");
        }
        let top = EgressSettings { table_base: MAX_TABLE_BASE, ..Default::default() };
        let ids: Vec<u32> = (1..=top.tables).map(|k| top.table_base + k).collect();
        assert!(ids.iter().all(|t| top.owns_table(*t) && *t > MAX_TABLE_BASE && *t < u32::MAX));
        let bottom = EgressSettings { table_base: MIN_TABLE_BASE, ..Default::default() };
        assert!((1..=bottom.tables).all(|k| !(253..=255).contains(&(bottom.table_base + k))));
    }

    #[test]
    fn link_choice_is_the_longest_prefix_and_ignores_host_and_link_local_routes() {
        let links = HostLinks {
            links: vec![
                HostLink {
                    index: 2,
                    name: "wide".into(),
                    up: true,
                    addrs: vec!["198.19.0.1/16".parse().unwrap()],
                    ..Default::default()
                },
                HostLink {
                    index: 3,
                    name: "narrow".into(),
                    up: true,
                    addrs: vec!["198.19.0.9/24".parse().unwrap(), "fe80::1/64".parse().unwrap()],
                    ..Default::default()
                },
                HostLink {
                    index: 4,
                    name: "host".into(),
                    up: true,
                    addrs: vec!["198.19.0.100/32".parse().unwrap()],
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        assert_eq!(links.link_for("198.19.0.100".parse().unwrap()).map(|l| l.name.as_str()), Some("narrow"));
        assert_eq!(links.link_for("198.19.5.5".parse().unwrap()).map(|l| l.name.as_str()), Some("wide"));
        assert_eq!(links.link_for("fe80::5".parse().unwrap()), None);
    }
}
