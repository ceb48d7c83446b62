//! Drivers that make the kernel match the desired state.
//!
//! * [`nft_sync`]: the nftables driver — one owned table, changed only in atomic
//!   transactions, deltas in steady state — over an [`nft_sync::NftBackend`];
//!   [`nft_cli`]: the agent's backend (netlink, else the `nft` program);
//!   [`nft_run`]: the `nft` program's runs (bounded, named, told apart from drift).
//! * [`netlink`]: egress addresses, policy-routing rules and routes (EgressIP).
//! * [`announce`]: gratuitous ARP / unsolicited neighbour advertisements.
//! * [`conntrack`]: forgetting the connections of an egress IP that left the node.
//! * [`elements`]: in-process set element additions (the DNS snooping fast path).
//! * `drift`: notices changes to egressd's table, addresses, rules and routes made by
//!   anyone else (nf_tables and rtnetlink notifications).
//! * `route_events`: what a route netlink notification can change; the links read
//!   again only after one that touches them.
//! * [`nflog`]: the DNS snooping listener — reads the kernel's NFLOG copies of pods' DNS
//!   packets and adds learned addresses through [`elements`].
//! * [`rule_counters`]: per-rule counters read back (`egressd status --counters`,
//!   `egressd explain --kernel`, per-namespace metrics).

pub(crate) mod acl_log;
pub mod announce;
pub mod conntrack;
pub mod dns_proxy;
pub(crate) mod drift;
pub mod elements;
pub mod netlink;
pub mod nflog;
pub mod nft_cli;
pub mod nft_run;
pub mod nft_sync;
pub(crate) mod route_events;
pub(crate) mod route_msg;
pub mod rule_counters;
pub(crate) mod tunnel;
pub mod verified;

/// Read netfilter netlink messages from `socket` (as many datagrams as needed) and hand
/// each to `each` until it returns a result.
pub(crate) fn recv_until<R>(
    socket: &netlink_sys::Socket,
    buf: &mut [u8],
    mut each: impl FnMut(
        netlink_packet_core::NetlinkMessage<netlink_packet_netfilter::NetfilterMessage>,
    ) -> Option<std::io::Result<R>>,
) -> std::io::Result<R> {
    loop {
        let size = socket.recv(&mut &mut buf[..], 0)?;
        let mut offset = 0;
        while offset < size {
            let msg = netlink_packet_core::NetlinkMessage::<netlink_packet_netfilter::NetfilterMessage>::deserialize(
                &buf[offset..size],
            )
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string()))?;
            let len = msg.header.length as usize;
            if let Some(result) = each(msg) {
                return result;
            }
            if len == 0 {
                break;
            }
            offset += len;
        }
    }
}

/// The outcome of a netlink error message: `Ok(true)` for an acknowledgement,
/// `Ok(false)` for "no such entry", else the OS error.
pub(crate) fn ack(code: Option<std::num::NonZeroI32>) -> std::io::Result<bool> {
    match code {
        None => Ok(true),
        Some(c) if c.get() == -libc::ENOENT => Ok(false),
        Some(c) => Err(std::io::Error::from_raw_os_error(-c.get())),
    }
}
