//! EgressIP's encapsulated path: the nft chains and netlink state that carry a steered
//! pod's packets to the hosting node inside VXLAN between the two nodes' own addresses,
//! with the egress IP's identity in the VXLAN network identifier (its tunnel key).
//!
//! * **Steering node**: a next-hop set through the tunnel routes (its table, as on
//!   L2) `via <hosting node> dev egressd-vx onlink encap ip id <key> dst <hosting node>`;
//!   `egress-snat` gives those packets the node's own address (so every packet on the
//!   wire, inner and outer, has a node's source), and the mark is cleared in postrouting
//!   (the outer packet's route lookup would otherwise loop into the tunnel).
//! * **Hosting node**: `egress-tunnel-in` reads the outer packet — only from a cluster
//!   node's address, to this node's, on the port — and marks it with the tunnel bit and
//!   the number of the hosted egress IP its key names (the mark survives decapsulation);
//!   a key not hosted here, or a source that is not a node, is dropped and counted.
//!   `egress-snat` SNATs by that mark; the connection keeps the tunnel bit in its ct mark,
//!   so replies (de-NATed to the steering node's address) are marked again and routed
//!   back through the tunnel by the tunnel table's return route to that node (key
//!   [`REPLY_KEY`]).
//! * **MSS**: a TCP SYN of a marked connection is clamped to the route's MTU, both ways.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use crate::net::{EgressSettings, MarkRule, NetDesired, REPLY_KEY, TunnelDesired};
use crate::nft::rule::{AddrField, Cmp, CtState, Direction, Family, MarkOf, Match, Proto, Rule, Statement, Verdict};
use crate::nft::{Chain, Hook, Key, KeyType, Set, Table, Value};

/// The prerouting chain that reads the outer packets.
pub(super) const TUNNEL_IN_CHAIN: &str = "egress-tunnel-in";
/// The prerouting chain that keeps the tunnel bit on connections and their replies.
pub(super) const TUNNEL_CHAIN: &str = "egress-tunnel";
/// The forward chain that clamps the MSS of marked connections.
pub(super) const TUNNEL_MSS_CHAIN: &str = "egress-tunnel-mss";
const PEERS: [&str; 2] = ["eip-peers-v4", "eip-peers-v6"];
const SELF: [&str; 2] = ["eip-self-v4", "eip-self-v6"];
/// Next hops reached through the tunnel (their connections get the node's address).
pub(super) const TUNNEL_GATEWAYS: [&str; 2] = ["eip-tunnel-gw-v4", "eip-tunnel-gw-v6"];

/// What the tunnel needs from the EgressIP compile.
pub(super) struct TunnelPlan {
    /// Egress IPs hosted here that steering nodes reach through the tunnel, with their
    /// keys (already free of key collisions), in a stable order.
    pub hosted: Vec<(IpAddr, u32)>,
    /// Hosting nodes' addresses this node steers to through the tunnel, per family.
    pub steer_gateways: [BTreeSet<IpAddr>; 2],
    /// This node's address per family (the source of steered packets).
    pub self_addr: [Option<IpAddr>; 2],
    /// This node's addresses (where outer packets arrive).
    pub my_addrs: BTreeSet<IpAddr>,
    /// Every other node's address (the tunnel accepts outer packets from these only).
    pub peers: BTreeSet<IpAddr>,
    /// The peers tunnelled packets are exchanged with (of `peers`): those this node
    /// steers to through the tunnel, and those that reach it through the tunnel (not on a
    /// shared link, or a cloud filters, or `--egress-ip-transport vxlan`). They get a
    /// neighbour entry, and a return route while this node hosts or may host.
    pub tunnelled: BTreeMap<IpAddr, [u8; 6]>,
    /// This node's tunnel device's Ethernet address.
    pub mac: [u8; 6],
    /// This node may be given an egress IP (it is egress-assignable while an EgressIP
    /// exists, or hosts one): its per-peer entries are kept ready, so that being placed
    /// or taking over costs no netlink work per peer.
    pub standby: bool,
}

fn family(ip: IpAddr) -> usize {
    usize::from(ip.is_ipv6())
}

/// The SNAT rules of the tunnel, which go in `egress-snat` before the null SNAT of
/// on-link steering.
fn snat_rules(settings: &EgressSettings, plan: &TunnelPlan) -> Vec<Rule> {
    let m = settings.mark_mask;
    let mut rules = Vec::new();
    for (j, (ip, _)) in numbered(settings, plan) {
        let Some(mark) = settings.tunnel_mark(j) else { continue };
        rules.push(
            Rule::new()
                .when(Match::Mark { of: MarkOf::Packet, mask: m, cmp: Cmp::Eq, value: mark })
                .then(Statement::Counter)
                .then(Statement::SnatTo(*ip)),
        );
    }
    for (f, (family, name)) in
        [(Family::V4, TUNNEL_GATEWAYS[0]), (Family::V6, TUNNEL_GATEWAYS[1])].into_iter().enumerate()
    {
        if let Some(me) = plan.self_addr[f].filter(|_| !plan.steer_gateways[f].is_empty()) {
            rules.push(
                Rule::new()
                    .when(Match::mark_any(MarkOf::Packet, m))
                    .when(Match::RtNexthopIn { family, set: name.into(), negated: false })
                    .then(Statement::Counter)
                    .then(Statement::SnatTo(me)),
            );
        }
    }
    rules
}

/// The hosted egress IPs with their mark numbers (1, 2, …, as many as the bits below
/// the tunnel bit allow).
fn numbered<'a>(settings: &EgressSettings, plan: &'a TunnelPlan) -> impl Iterator<Item = (u32, &'a (IpAddr, u32))> {
    let room =
        settings.tunnel_bit().map(|bit| (bit >> settings.mark_mask.trailing_zeros()).saturating_sub(1)).unwrap_or(0);
    (1..=room).zip(plan.hosted.iter())
}

/// Egress IPs hosted here beyond the marks' room: not reachable through the tunnel.
pub(super) fn overflow(settings: &EgressSettings, plan: &TunnelPlan) -> Vec<IpAddr> {
    let used = numbered(settings, plan).count();
    plan.hosted.iter().skip(used).map(|(ip, _)| *ip).collect()
}

/// The tunnel's chains, sets, rules and netlink state, and its SNAT rules for
/// `egress-snat`; `None` (nothing) when it is not in use.
pub(super) fn emit(
    settings: &EgressSettings,
    plan: &TunnelPlan,
    table: &mut Table,
    net: &mut NetDesired,
) -> Option<Vec<Rule>> {
    let bit = settings.tunnel_bit()?;
    let steering = plan.steer_gateways.iter().any(|g| !g.is_empty());
    if !steering && plan.hosted.is_empty() && !plan.standby {
        return None;
    }
    sets(plan, table);
    let rx = receive_rules(settings, plan, bit, steering);
    chains(settings, bit, rx, table);
    for v6 in [false, true] {
        net.rules.insert(MarkRule {
            v6,
            mark: bit,
            mask: bit,
            table: settings.tunnel_table(),
            priority: settings.rule_priority,
        });
    }
    net.tunnel = Some(TunnelDesired {
        port: settings.vxlan_port,
        mac: plan.mac,
        local: plan.self_addr,
        peers: plan.tunnelled.clone(),
        // A host's replies go back through the tunnel. An egress-assignable node keeps
        // the routes while any EgressIP exists: one route and one neighbour per tunnelled
        // peer (at 1,500 peers ~0.6 s of netlink on a busy node), which would otherwise be
        // paid at each placement and failover (bench/FINDINGS.md "2026-11-29 (fourth)").
        return_routes: !plan.hosted.is_empty() || plan.standby,
    });
    Some(snat_rules(settings, plan))
}

/// The peers' and this node's addresses, and the gateways steered to, by family.
fn sets(plan: &TunnelPlan, table: &mut Table) {
    let mut peers = [Set::new(KeyType::Ipv4, false), Set::new(KeyType::Ipv6, false)];
    for ip in &plan.peers {
        peers[family(*ip)].elements.insert(Key::Addr(*ip), Value::None);
    }
    let mut mine = [Set::new(KeyType::Ipv4, false), Set::new(KeyType::Ipv6, false)];
    for ip in &plan.my_addrs {
        mine[family(*ip)].elements.insert(Key::Addr(*ip), Value::None);
    }
    let mut gateways = [Set::new(KeyType::Ipv4, false), Set::new(KeyType::Ipv6, false)];
    for (f, set) in plan.steer_gateways.iter().enumerate() {
        for ip in set {
            gateways[f].elements.insert(Key::Addr(*ip), Value::None);
        }
    }
    let [p4, p6] = peers;
    let [s4, s6] = mine;
    let [g4, g6] = gateways;
    for (name, set) in [(PEERS[0], p4), (PEERS[1], p6), (SELF[0], s4), (SELF[1], s6)] {
        table.sets.insert(name.into(), set);
    }
    table.sets.insert(TUNNEL_GATEWAYS[0].into(), g4);
    table.sets.insert(TUNNEL_GATEWAYS[1].into(), g6);
}

/// What arrives on the tunnel's port: from a peer, with a key this node knows (the
/// replies' key when it steers, each hosted egress IP's), marked for its table; anything
/// else dropped and counted.
fn receive_rules(settings: &EgressSettings, plan: &TunnelPlan, bit: u32, steering: bool) -> Vec<Rule> {
    let keep = !settings.mark_mask;
    let port = settings.vxlan_port;
    let reply = settings.tunnel_mark(REPLY_KEY).unwrap_or(bit);
    let mut rx = Vec::new();
    for (f, fam) in [Family::V4, Family::V6].into_iter().enumerate() {
        let (me, peer) = (SELF[f], PEERS[f]);
        let to_me = Match::daddr_in(fam, me);
        let outer = Rule::new().when(to_me.clone()).when(Match::Dport(Proto::Udp, port));
        // The VXLAN network identifier: 24 bits after the UDP header (64 bits) and
        // VXLAN's flags (32).
        let keyed = |key: u32, mark: u32| {
            outer
                .clone()
                .when(Match::ThBits { offset: 96, bits: 24, value: key })
                .then(Statement::SetMark { of: MarkOf::Packet, keep, or: mark })
                .verdict(Verdict::Accept)
        };
        rx.push(
            Rule::new()
                .when(to_me)
                .when(Match::AddrIn { family: fam, field: AddrField::Saddr, set: peer.into(), negated: true })
                .when(Match::Dport(Proto::Udp, port))
                .then(Statement::NamedCounter("eip-tunnel-foreign-source".into()))
                .verdict(Verdict::Drop),
        );
        if steering {
            rx.push(keyed(REPLY_KEY, reply));
        }
        for (j, (eip, key)) in numbered(settings, plan) {
            if family(*eip) != f {
                continue;
            }
            let Some(mark) = settings.tunnel_mark(j) else { continue };
            rx.push(keyed(*key, mark));
        }
        rx.push(outer.then(Statement::NamedCounter("eip-tunnel-unknown-key".into())).verdict(Verdict::Drop));
    }
    rx
}

/// The tunnel's base chains: receiving (`rx`), the connection mark of what came through
/// it, and the MSS clamp of what is sent into it.
fn chains(settings: &EgressSettings, bit: u32, rx: Vec<Rule>, table: &mut Table) {
    let m = settings.mark_mask;
    let keep = !m;
    table.chains.insert(
        TUNNEL_IN_CHAIN.into(),
        Chain::base(Hook { chain_type: "filter", hook: "prerouting", priority: "mangle - 1" }, rx),
    );
    table.chains.insert(
        TUNNEL_CHAIN.into(),
        Chain::base(
            Hook { chain_type: "filter", hook: "prerouting", priority: "mangle" },
            [
                Rule::new()
                    .when(Match::Mark { of: MarkOf::Packet, mask: bit, cmp: Cmp::Eq, value: bit })
                    .when(Match::CtState(CtState::New))
                    .then(Statement::SetMark { of: MarkOf::Conn, keep: !bit, or: bit }),
                Rule::new()
                    .when(Match::CtDirection(Direction::Reply))
                    .when(Match::Mark { of: MarkOf::Conn, mask: bit, cmp: Cmp::Eq, value: bit })
                    .then(Statement::SetMark { of: MarkOf::Packet, keep, or: bit }),
            ],
        ),
    );
    table.chains.insert(
        TUNNEL_MSS_CHAIN.into(),
        Chain::base(
            Hook { chain_type: "filter", hook: "forward", priority: "mangle" },
            [Rule::new().when(Match::mark_any(MarkOf::Packet, m)).when(Match::TcpSyn).then(Statement::MssToRoute)],
        ),
    );
}

/// The postrouting rule that clears egressd's mark bits once the route is chosen (the
/// tunnel device's outer lookup uses the packet's mark).
pub(super) fn clear_mark_rule(settings: &EgressSettings) -> Rule {
    let m = settings.mark_mask;
    Rule::new().when(Match::mark_any(MarkOf::Packet, m)).then(Statement::SetMark {
        of: MarkOf::Packet,
        keep: !m,
        or: 0,
    })
}
