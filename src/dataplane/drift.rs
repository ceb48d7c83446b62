//! Drift: egressd's kernel state changed by someone else.
//!
//! * **nftables**: a thread subscribed to nf_tables change notifications
//!   (`NFNLGRP_NFTABLES`) follows each transaction: its object messages name the table
//!   they touch, and the closing `NEWGEN` message names the process that committed it
//!   (`NFTA_GEN_PROC_PID`). A transaction that touched egressd's table (family `inet`)
//!   and was committed by anyone but this agent or an `nft` process it started
//!   ([`super::nft_run::is_own`]) — `nft flush ruleset` by a distribution's
//!   nftables.service, an administrator, another agent — is reported, and the agent
//!   replaces its table in full. Changes to other tables are left alone. A kernel that
//!   does not name the committing process makes detection impossible; that is logged
//!   once and nothing is reported (the periodic full check stays the safety net).
//!   During egressd's own full replace the watch leaves the notification group (the
//!   kernel builds a notification per rule and set element for every listener: a
//!   third of a 100k-rule replace) and compares the ruleset's generation id before and
//!   after instead ([`QuietWatch`]): anything beyond egressd's own commits is reported
//!   as drift, and the replace that follows keeps listening (so a busy neighbour, such
//!   as kube-proxy committing often, costs at most one extra replace, never a loop).
//! * **netlink**: a thread subscribed to link, address, route and rule notifications
//!   (`RTNLGRP_*`) reports a change that touches the links or what egressd owns
//!   ([`super::route_events::touches`]); the agent then compares what it owns with what
//!   it wants and repairs it (the same check as the periodic one), so an owned address
//!   deleted by hand comes back at once. Changes egressd's own netlink socket made (the
//!   kernel names its port in their notifications) and routes of other tables (a pod's
//!   veth route) are not reported.
//!
//! Both send on a channel; the agent coalesces bursts.

use std::io;

use netlink_sys::{Socket, protocols::NETLINK_NETFILTER, protocols::NETLINK_ROUTE};
use tokio::sync::mpsc;

use super::route_events::{messages, touches};

/// `NFNLGRP_NFTABLES`.
const NFNLGRP_NFTABLES: u32 = 7;
/// The nf_tables subsystem id in a netfilter message type.
const NFNL_SUBSYS_NFTABLES: u16 = 10;
/// `NFT_MSG_NEWGEN`.
const NFT_MSG_NEWGEN: u16 = 15;
/// `NFTA_GEN_PROC_PID`.
const NFTA_GEN_PROC_PID: u16 = 2;
/// `NFTA_GEN_PROC_NAME`.
const NFTA_GEN_PROC_NAME: u16 = 3;
/// `NFPROTO_INET`.
const NFPROTO_INET: u8 = 1;
/// `NLMSG_HDRLEN` and the `nfgenmsg` that follows it.
const NLMSG_HDRLEN: usize = 16;
const NFGENMSG_LEN: usize = 4;

/// What changed behind egressd's back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Drift {
    /// egressd's nft table, by this process (pid, name).
    Nft { pid: u32, process: String },
    /// Addresses, routes or rules (someone's; the agent checks what it owns).
    Netlink,
}

/// The attributes of one nf_tables message: (type, payload).
fn attributes(mut b: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        if b.len() < 4 {
            return None;
        }
        let len = usize::from(u16::from_ne_bytes([b[0], b[1]]));
        let kind = u16::from_ne_bytes([b[2], b[3]]) & 0x3fff;
        if len < 4 || len > b.len() {
            return None;
        }
        let payload = &b[4..len];
        b = &b[len.next_multiple_of(4).min(b.len())..];
        Some((kind, payload))
    })
}

fn c_string(b: &[u8]) -> &[u8] {
    b.split(|c| *c == 0).next().unwrap_or(b)
}

/// Follows nf_tables transactions message by message.
#[derive(Debug, Default)]
pub(crate) struct Transactions {
    /// The current transaction touched the watched table.
    touched: bool,
}

/// What one notification means.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Seen {
    /// Nothing to report.
    Nothing,
    /// A transaction that touched the table was committed by (pid, process name).
    Committed(u32, String),
    /// A transaction that touched the table was committed, by an unknown process.
    Unknown,
}

impl Transactions {
    /// Feed one netlink message (header included); `table` is egressd's.
    pub(crate) fn feed(&mut self, msg: &[u8], table: &str) -> Seen {
        if msg.len() < NLMSG_HDRLEN + NFGENMSG_LEN {
            return Seen::Nothing;
        }
        let kind = u16::from_ne_bytes([msg[4], msg[5]]);
        if kind >> 8 != NFNL_SUBSYS_NFTABLES {
            return Seen::Nothing;
        }
        let family = msg[NLMSG_HDRLEN];
        let attrs = &msg[NLMSG_HDRLEN + NFGENMSG_LEN..];
        if kind & 0xff == NFT_MSG_NEWGEN {
            let touched = std::mem::take(&mut self.touched);
            if !touched {
                return Seen::Nothing;
            }
            let mut pid = None;
            let mut name = String::new();
            for (t, v) in attributes(attrs) {
                match t {
                    NFTA_GEN_PROC_PID if v.len() == 4 => pid = Some(u32::from_be_bytes([v[0], v[1], v[2], v[3]])),
                    NFTA_GEN_PROC_NAME => name = String::from_utf8_lossy(c_string(v)).into_owned(),
                    _ => {}
                }
            }
            return match pid {
                Some(p) => Seen::Committed(p, name),
                None => Seen::Unknown,
            };
        }
        // Every object message carries its table's name as attribute 1.
        if family == NFPROTO_INET && attributes(attrs).any(|(t, v)| t == 1 && c_string(v) == table.as_bytes()) {
            self.touched = true;
        }
        Seen::Nothing
    }
}

/// Whether a committer is egressd itself: by PID where the kernel's PIDs are ours to
/// compare, else by name (egressd's `nft` runs and threads are named `egressd…`), which
/// also holds in a container without the host's PID namespace.
fn is_own(pid: u32, process: &str) -> bool {
    super::nft_run::is_own(pid) || super::nft_run::is_own_name(process)
}

/// The drift watch's side of a full replace ([`super::nft_sync::QuietReplace`]).
pub(crate) struct QuietWatch {
    socket: std::sync::Arc<Socket>,
    table: String,
    tx: mpsc::UnboundedSender<Drift>,
    /// The last quiet replace saw someone else's commit: listen through the next one.
    listen_next: bool,
}

impl QuietWatch {
    fn generation(&self) -> io::Result<u32> {
        super::elements::ElementWriter::open(&self.table)?.generation()
    }

    fn report(&mut self, what: String) {
        self.listen_next = true;
        let _ = self.tx.send(Drift::Nft { pid: 0, process: what });
    }
}

/// The generation id a ruleset at `before` has after `own` more commits of egressd's.
fn expected_generation(before: u32, own: u64) -> u32 {
    before.wrapping_add(own as u32)
}

impl super::nft_sync::QuietReplace for QuietWatch {
    fn before(&mut self) -> Option<(u32, u64)> {
        if std::mem::take(&mut self.listen_next) {
            return None;
        }
        // The generation first, then leave: a commit in between is both seen and
        // counted (one replace too many at worst, never one missed).
        let generation = self.generation().ok()?;
        let own = super::elements::own_commits();
        self.socket.drop_membership(NFNLGRP_NFTABLES).ok()?;
        Some((generation, own))
    }

    fn after(&mut self, before: Option<(u32, u64)>, committed: bool) {
        let Some((generation, own)) = before else { return };
        // Back in first, then the generation (the same reasoning).
        if let Err(e) = self.socket.add_membership(NFNLGRP_NFTABLES) {
            tracing::error!(error = %e, "cannot listen to nf_tables notifications again; drift of the table goes unnoticed");
            return;
        }
        let own = super::elements::own_commits().saturating_sub(own) + u64::from(committed);
        match self.generation() {
            Ok(now) if now == expected_generation(generation, own) => {}
            Ok(now) => self.report(format!(
                "unknown ({} other nf_tables commit(s) while egressd replaced its table)",
                now.wrapping_sub(expected_generation(generation, own))
            )),
            Err(e) => self.report(format!("unknown (ruleset generation unreadable after a replace: {e})")),
        }
    }
}

/// What the netlink watch reports: changes that touch the links or egressd's state,
/// other than those of egressd's socket at `own_port`.
pub(crate) struct RouteFilter {
    /// The port of egressd's netlink socket ([`super::netlink::Netlink::port`]).
    pub own_port: Option<u32>,
    pub settings: crate::net::EgressSettings,
}

/// Start both watches (in the caller's network namespace); drift arrives on the
/// returned channel. The [`QuietWatch`] goes to the nft syncer.
pub(crate) fn start(table: &str, route: RouteFilter) -> io::Result<(mpsc::UnboundedReceiver<Drift>, QuietWatch)> {
    let (tx, rx) = mpsc::unbounded_channel();
    let mut nft = Socket::new(NETLINK_NETFILTER)?;
    nft.bind_auto()?;
    nft.add_membership(NFNLGRP_NFTABLES)?;
    notification_buffer(&nft);
    let nft = std::sync::Arc::new(nft);
    let quiet = QuietWatch { socket: nft.clone(), table: table.to_string(), tx: tx.clone(), listen_next: false };
    let mut route_socket = Socket::new(NETLINK_ROUTE)?;
    route_socket.bind_auto()?;
    for g in super::route_events::GROUPS {
        route_socket.add_membership(g)?;
    }
    let table = table.to_string();
    let nft_tx = tx.clone();
    std::thread::Builder::new().name("drift-nft".into()).spawn(move || {
        let _span = tracing::info_span!("drift_nft").entered();
        watch_nft(&nft, &table, &nft_tx);
    })?;
    std::thread::Builder::new().name("drift-netlink".into()).spawn(move || {
        let _span = tracing::info_span!("drift_netlink").entered();
        watch_route(&route_socket, &route, &tx);
    })?;
    Ok((rx, quiet))
}

/// Receive buffer of the nf_tables notification socket. The kernel sends one
/// notification per set element: a start-up replace followed by putting back thousands
/// of learned DNS addresses overran the default buffer (~200 KB), and an overrun means
/// a second full replace, during which those addresses are missing again. 16 MB holds
/// well over 50,000 notifications.
const NOTIFICATION_BUFFER: usize = 16 << 20;

/// Enlarge `socket`'s receive buffer: beyond `rmem_max` where allowed (CAP_NET_ADMIN,
/// which egressd has), else as far as `rmem_max` lets.
fn notification_buffer(socket: &Socket) {
    use nix::sys::socket::{setsockopt, sockopt};
    if setsockopt(socket, sockopt::RcvBufForce, &NOTIFICATION_BUFFER).is_err()
        && let Err(e) = socket2::SockRef::from(socket).set_recv_buffer_size(NOTIFICATION_BUFFER)
    {
        tracing::warn!(error = %e, "nf_tables notification buffer not enlarged; large syncs may overrun it");
    }
}

fn watch_nft(socket: &Socket, table: &str, tx: &mpsc::UnboundedSender<Drift>) {
    let mut buf = vec![0u8; 1 << 20];
    let mut tx_state = Transactions::default();
    let mut warned = false;
    loop {
        let n = match socket.recv(&mut &mut buf[..], 0) {
            Ok(n) => n,
            Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {
                // Notifications were lost: whatever happened, check in full.
                tracing::warn!("nf_tables notifications overran; replacing the table to be sure");
                tx_state = Transactions::default();
                if tx.send(Drift::Nft { pid: 0, process: "unknown (notifications lost)".into() }).is_err() {
                    return;
                }
                continue;
            }
            Err(e) => {
                tracing::error!(error = %e, "nf_tables notifications unreadable; drift of the table goes unnoticed");
                return;
            }
        };
        for msg in messages(&buf[..n]) {
            let drift = match tx_state.feed(msg, table) {
                Seen::Committed(pid, process) if !is_own(pid, &process) => Drift::Nft { pid, process },
                Seen::Unknown if !warned => {
                    warned = true;
                    tracing::warn!(
                        "this kernel does not name who changes nf_tables; drift is found by the periodic check only"
                    );
                    continue;
                }
                _ => continue,
            };
            if tx.send(drift).is_err() {
                return;
            }
        }
    }
}

fn watch_route(socket: &Socket, filter: &RouteFilter, tx: &mpsc::UnboundedSender<Drift>) {
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let report = match socket.recv(&mut &mut buf[..], 0) {
            Ok(n) => messages(&buf[..n]).any(|m| touches(m, filter.own_port, &filter.settings).any()),
            // Notifications were lost: whatever happened, check.
            Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => true,
            Err(e) => {
                tracing::error!(error = %e, "netlink notifications unreadable; drift is found by the periodic check only");
                return;
            }
        };
        if report && tx.send(Drift::Netlink).is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn the_notification_socket_holds_tens_of_thousands_of_notifications() {
        let socket = Socket::new(NETLINK_NETFILTER).unwrap();
        notification_buffer(&socket);
        let size: usize = nix::sys::socket::getsockopt(&socket, nix::sys::socket::sockopt::RcvBuf).unwrap();
        // As root (the tests' and egressd's case) rmem_max does not cap it.
        if nix::unistd::geteuid().is_root() {
            assert!(size >= NOTIFICATION_BUFFER, "receive buffer {size}");
        } else {
            assert!(size > 0);
        }
    }
    use super::*;

    fn nla(kind: u16, payload: &[u8]) -> Vec<u8> {
        let len = 4 + payload.len();
        let mut out = Vec::new();
        out.extend_from_slice(&(len as u16).to_ne_bytes());
        out.extend_from_slice(&kind.to_ne_bytes());
        out.extend_from_slice(payload);
        out.resize(len.next_multiple_of(4), 0);
        out
    }

    fn msg(kind: u16, family: u8, attrs: &[Vec<u8>]) -> Vec<u8> {
        let body: Vec<u8> = attrs.concat();
        let len = NLMSG_HDRLEN + NFGENMSG_LEN + body.len();
        let mut out = Vec::new();
        out.extend_from_slice(&(len as u32).to_ne_bytes());
        out.extend_from_slice(&((NFNL_SUBSYS_NFTABLES << 8) | kind).to_ne_bytes());
        // flags, sequence number, port id
        out.extend_from_slice(&[0; 10]);
        out.extend_from_slice(&[family, 0, 0, 0]);
        out.extend_from_slice(&body);
        out
    }

    fn newgen(pid: Option<u32>) -> Vec<u8> {
        let mut attrs = vec![nla(1, &7u32.to_be_bytes())];
        if let Some(p) = pid {
            attrs.push(nla(NFTA_GEN_PROC_PID, &p.to_be_bytes()));
            attrs.push(nla(NFTA_GEN_PROC_NAME, b"nft\0"));
        }
        msg(NFT_MSG_NEWGEN, 0, &attrs)
    }

    #[test]
    fn a_transaction_touching_the_table_is_reported_with_its_committer() {
        let mut t = Transactions::default();
        let delrule = msg(8, NFPROTO_INET, &[nla(1, b"egressd\0"), nla(2, b"fw-a\0")]);
        let other = msg(6, NFPROTO_INET, &[nla(1, b"other\0")]);
        let ip_family = msg(2, 2, &[nla(1, b"egressd\0")]);
        // Another table, or an `ip egressd` table: nothing.
        assert_eq!(t.feed(&other, "egressd"), Seen::Nothing);
        assert_eq!(t.feed(&newgen(Some(42)), "egressd"), Seen::Nothing);
        assert_eq!(t.feed(&ip_family, "egressd"), Seen::Nothing);
        assert_eq!(t.feed(&newgen(Some(42)), "egressd"), Seen::Nothing);
        // Our table: the committer is named at the end of the transaction.
        assert_eq!(t.feed(&other, "egressd"), Seen::Nothing);
        assert_eq!(t.feed(&delrule, "egressd"), Seen::Nothing);
        assert_eq!(t.feed(&newgen(Some(42)), "egressd"), Seen::Committed(42, "nft".into()));
        // Each transaction on its own.
        assert_eq!(t.feed(&newgen(Some(43)), "egressd"), Seen::Nothing);
        assert_eq!(t.feed(&delrule, "egressd"), Seen::Nothing);
        assert_eq!(t.feed(&newgen(None), "egressd"), Seen::Unknown);
        // Truncated or foreign bytes are ignored.
        assert_eq!(t.feed(&delrule[..10], "egressd"), Seen::Nothing);
        let datagram = [delrule.clone(), newgen(Some(5))].concat();
        assert_eq!(messages(&datagram).count(), 2);
    }

    /// In a network namespace of its own (root): the watch leaves the notification group
    /// for a replace, and the generation check reports someone else's commit in that
    /// window — not egressd's own (the replace, netlink element batches) — and listens
    /// through the next replace.
    #[test]
    #[cfg_attr(not(feature = "system"), ignore = "needs root (a network namespace): `--features system`, tests/run.sh")]
    fn a_quiet_replace_still_catches_a_foreign_commit() {
        use crate::dataplane::nft_sync::QuietReplace;
        assert!(nix::unistd::geteuid().is_root(), "needs root (network namespaces)");
        std::thread::spawn(|| {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
            let nft = |script: &str| {
                let mut child = std::process::Command::new("nft")
                    .args(["-f", "-"])
                    .stdin(std::process::Stdio::piped())
                    .spawn()
                    .unwrap();
                std::io::Write::write_all(child.stdin.as_mut().unwrap(), script.as_bytes()).unwrap();
                drop(child.stdin.take());
                assert!(child.wait().unwrap().success(), "{script}");
            };
            let routes = RouteFilter { own_port: None, settings: Default::default() };
            let (mut rx, mut quiet) = start("egressd", routes).unwrap();
            let settle = |rx: &mut mpsc::UnboundedReceiver<Drift>| {
                std::thread::sleep(std::time::Duration::from_millis(200));
                std::iter::from_fn(|| rx.try_recv().ok()).collect::<Vec<_>>()
            };
            // A replace by a process the watch does not know as egressd's (plain `nft`):
            // unheard while quiet, and the generation moved by exactly that commit.
            let before = quiet.before();
            assert!(before.is_some());
            nft("table inet egressd {\n set s { typeof numgen random mod 1 . numgen random mod 1 . ip daddr; flags timeout; }\n}\n");
            quiet.after(before, true);
            assert_eq!(settle(&mut rx), vec![]);
            // Egressd's own element batch during the window counts as its own.
            let before = quiet.before();
            crate::dataplane::elements::ElementWriter::open("egressd")
                .unwrap()
                .add(&[(crate::nft::Slot { set: "s", tag: 7 }, "192.0.2.1".parse().unwrap(), std::time::Duration::from_secs(60))])
                .unwrap();
            quiet.after(before, false);
            assert_eq!(settle(&mut rx), vec![]);
            // Someone else's commit in the window is reported...
            let before = quiet.before();
            nft("add table inet other");
            nft("add set inet egressd u { type ipv4_addr; }");
            quiet.after(before, true);
            let drift = settle(&mut rx);
            assert!(
                matches!(&drift[..], [Drift::Nft { pid: 0, process }] if process.contains("1 other nf_tables commit")),
                "{drift:?}"
            );
            // ...and the next replace listens: a foreign change of the table is seen.
            assert_eq!(quiet.before(), None);
            nft("add set inet egressd t { type ipv4_addr; }");
            assert!(matches!(&settle(&mut rx)[..], [Drift::Nft { pid, .. }] if *pid != 0));
        })
        .join()
        .unwrap();
    }

    #[test]
    fn own_commits_are_known_by_pid_or_by_name() {
        // PIDs that are not ours (another PID namespace's view, say): the name decides.
        let foreign_pid = u32::MAX - 7;
        assert!(is_own(foreign_pid, "egressd-nft"));
        assert!(is_own(foreign_pid, "egressd-snoop"));
        assert!(!is_own(foreign_pid, "nft"));
        assert!(is_own(std::process::id(), "anything"));
    }
}
