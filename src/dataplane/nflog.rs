//! The DNS snooping listener: a thread reading the NFLOG group the snoop rules copy to,
//! matching answers to queries ([`super::snoop`]), and adding what a pod learned to the
//! sets of its namespace's matching `dnsName` rules at once, in-process
//! ([`crate::dataplane::elements`]). It holds nothing back: the kernel already
//! delivered the packet when the copy is read.
//!
//! What it added is remembered until it expires, so a full table replace holds it from
//! its transaction on ([`SnoopHandle::kept`]); deltas never touch these elements.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

use netlink_packet_core::{NetlinkMessage, NetlinkPayload};
use netlink_packet_netfilter::nflog::{ConfigCmd, ConfigFlags, ConfigMode, PacketNla, ULogMessage, config_request};
use netlink_packet_netfilter::{NetfilterMessage, NetfilterMessageInner, NetfilterProtoFamily};
use netlink_sys::{Socket, protocols::NETLINK_NETFILTER};

use crate::dataplane::elements::{Element, ElementWriter, by_set};
use crate::dns::snoop::{Dropped, Ignored, Snooper, parse_packet};
use crate::dns::targets::{
    PREFIX_ANSWER, PREFIX_QUERY, PREFIX_SPOOFED, PREFIX_UNTRACKED, PREFIX_UNTRUSTED, SnoopTargets,
};
use crate::nft::Slot;
use crate::telemetry::metrics::{Metrics, SnoopDropLabels, SnoopLabels};

/// Expired entries are pruned when the memory of learned elements reaches a power of
/// two at least this large (so pruning costs O(1) amortised).
const PRUNE_AT: usize = 1024;
/// Most learned elements remembered (all sets): ~100 bytes each.
pub(crate) const MAX_LEARNED: usize = 262_144;
/// Most learned elements of one name (one [`Slot`]): half of what a name could have
/// when it had its own set ([`crate::nft::TIMEOUT_SET_SIZE`]), leaving room beside them
/// for the most addresses one resolution can bring.
pub(crate) const MAX_LEARNED_PER_NAME: usize = crate::nft::TIMEOUT_SET_SIZE / 2;

/// Elements the listener added: (slot, address) → when they expire in the kernel, and
/// how many each slot has.
#[derive(Debug, Default)]
struct Learned {
    until: HashMap<(Slot, IpAddr), Instant>,
    per_slot: HashMap<Slot, usize>,
}

impl Learned {
    /// Forget what has expired (or, with `keep`, what is in slots no longer wanted).
    fn retain(&mut self, mut keep: impl FnMut(&Slot, Instant) -> bool) {
        self.until.retain(|(slot, _), until| keep(slot, *until));
        self.per_slot.clear();
        for (slot, _) in self.until.keys() {
            *self.per_slot.entry(*slot).or_default() += 1;
        }
    }

    /// The elements that fit (refreshing a remembered one always does); the others are
    /// counted in `refused`.
    fn admit(&mut self, elements: Vec<Element>, now: Instant, refused: &mut u64) -> Vec<Element> {
        if self.until.len() >= PRUNE_AT && self.until.len().is_power_of_two() {
            self.retain(|_, until| until > now);
        }
        let mut out = Vec::with_capacity(elements.len());
        let mut total = self.until.len();
        let mut added: HashMap<Slot, usize> = HashMap::new();
        for e in &elements {
            let known = self.until.contains_key(&(e.0, e.1));
            let in_set = self.per_slot.get(&e.0).copied().unwrap_or(0) + added.get(&e.0).copied().unwrap_or(0);
            if !known && (total >= MAX_LEARNED || in_set >= MAX_LEARNED_PER_NAME) {
                *refused += 1;
                continue;
            }
            if !known {
                total += 1;
                *added.entry(e.0).or_default() += 1;
            }
            out.push(*e);
        }
        out
    }

    /// Of what an answer taught, what to write: the elements that fit ([`Learned::admit`])
    /// less those the kernel holds with at least their timeout less `slack` left.
    fn worth_writing(
        &mut self,
        elements: Vec<Element>,
        now: Instant,
        slack: std::time::Duration,
        refused: &mut u64,
    ) -> Vec<Element> {
        let admitted = self.admit(elements, now, refused);
        admitted.into_iter().filter(|e| !self.fresh(e, now, slack)).collect()
    }

    /// Whether the kernel holds `e` with at least its timeout less `slack` left.
    fn fresh(&self, e: &Element, now: Instant, slack: std::time::Duration) -> bool {
        let (slot, ip, timeout) = e;
        self.until.get(&(*slot, *ip)).is_some_and(|until| *until >= now + timeout.saturating_sub(slack))
    }

    /// Remember elements the kernel took.
    fn remember(&mut self, elements: &[Element], now: Instant) {
        for (slot, ip, timeout) in elements {
            if self.until.insert((*slot, *ip), now + *timeout).is_none() {
                *self.per_slot.entry(*slot).or_default() += 1;
            }
        }
    }
}

/// The running listener.
#[derive(Clone)]
pub(crate) struct SnoopHandle {
    targets: Arc<RwLock<Arc<SnoopTargets>>>,
    learned: Arc<Mutex<Learned>>,
    table: String,
}

fn count(metrics: &Metrics, result: &str) {
    metrics.dns_snooped.get_or_create(&SnoopLabels { result: result.to_string() }).inc();
}

fn count_dropped(metrics: &Metrics, reason: &str, n: u64) {
    if n > 0 {
        metrics.dns_snoop_dropped.get_or_create(&SnoopDropLabels { reason: reason.to_string() }).inc_by(n);
    }
}

/// Each NFLOG copy of one datagram read from a bound group: its log prefix and the
/// packet (from the IP header on). Copies without either are skipped.
pub(crate) fn each_copy(buf: &[u8], mut f: impl FnMut(&str, &[u8])) {
    let mut offset = 0;
    while offset < buf.len() {
        let Ok(msg) = NetlinkMessage::<NetfilterMessage>::deserialize(&buf[offset..]) else { break };
        let len = msg.header.length as usize;
        if let NetlinkPayload::InnerMessage(NetfilterMessage {
            inner: NetfilterMessageInner::ULog(ULogMessage::Packet(nlas)),
            ..
        }) = &msg.payload
        {
            let mut prefix = None;
            let mut payload = None;
            for nla in nlas {
                match nla {
                    PacketNla::Prefix(p) => prefix = p.to_str().ok(),
                    PacketNla::Payload(p) => payload = Some(p.as_slice()),
                    _ => {}
                }
            }
            if let (Some(prefix), Some(payload)) = (prefix, payload) {
                f(prefix, payload);
            }
        }
        if len == 0 {
            break;
        }
        offset += len;
    }
}

pub(crate) fn bind(group: u16) -> std::io::Result<Socket> {
    let mut socket = Socket::new(NETLINK_NETFILTER)?;
    socket.bind_auto()?;
    let mut buf = vec![0u8; 4096];
    for msg in [
        config_request(
            NetfilterProtoFamily::Unspec,
            group,
            vec![ConfigCmd::Bind.into(), ConfigMode::PACKET_MAX.into()],
        ),
        config_request(
            NetfilterProtoFamily::Unspec,
            group,
            vec![netlink_packet_netfilter::nflog::ConfigNla::QThresh(1), ConfigFlags::SEQ_GLOBAL.into()],
        ),
    ] {
        let mut out = vec![0; msg.header.length as usize];
        msg.serialize(&mut out[..]);
        socket.send(&out, 0)?;
        let size = socket.recv(&mut &mut buf[..], 0)?;
        let reply = NetlinkMessage::<NetfilterMessage>::deserialize(&buf[..size])
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string()))?;
        if let NetlinkPayload::Error(e) = reply.payload
            && let Some(code) = e.code
        {
            return Err(std::io::Error::from_raw_os_error(-code.get()));
        }
    }
    // Copies arrive in bursts; a large receive buffer keeps them from being dropped.
    socket.set_rx_buf_sz(4 << 20)?;
    Ok(socket)
}

impl SnoopHandle {
    /// Bind NFLOG `group` and start the listener thread for the `inet` table `table`.
    pub(crate) fn start(group: u16, table: &str, telemetry: Arc<crate::telemetry::Telemetry>) -> std::io::Result<Self> {
        let socket = bind(group)?;
        let writer = ElementWriter::open(table)?;
        let handle = Self {
            targets: Arc::new(RwLock::new(Arc::new(SnoopTargets::default()))),
            learned: Arc::new(Mutex::new(Learned::default())),
            table: table.to_string(),
        };
        let h = handle.clone();
        std::thread::Builder::new().name("egressd-snoop".into()).spawn(move || {
            let _span = tracing::info_span!("dns_snoop", group).entered();
            // The listener never returns while egressd works: if it does (or panics),
            // /healthz fails and the agent is restarted.
            let _alive = crate::telemetry::DeadOnExit { telemetry: telemetry.clone(), component: "dns_snoop" };
            h.run(socket, writer, &telemetry.metrics)
        })?;
        Ok(handle)
    }

    /// Replace what answers are matched against (after each compile).
    pub(crate) fn update(&self, targets: SnoopTargets) {
        if let Ok(mut t) = self.targets.write()
            && **t != targets
        {
            *t = Arc::new(targets);
        }
    }

    /// Read back what a previous run learned into `slots` (before the first full sync
    /// replaces the table), so the replace keeps it ([`SnoopHandle::kept`]); returns how many.
    /// Each slot comes with the set an older egressd kept its addresses in (one set per
    /// name), read back into the slot as well.
    pub(crate) fn recover(&self, slots: &std::collections::BTreeMap<Slot, String>) -> std::io::Result<usize> {
        let mut writer = ElementWriter::open(&self.table)?;
        let now = Instant::now();
        let mut n = 0;
        let Ok(mut learned) = self.learned.lock() else { return Ok(0) };
        let sets: std::collections::BTreeSet<&'static str> = slots.keys().map(|s| s.set).collect();
        let mut found: Vec<Vec<Element>> = Vec::new();
        for set in sets {
            found.push(
                writer
                    .dump(set)?
                    .into_iter()
                    .filter_map(|(tag, ip, left)| Some((Slot { set, tag: tag? }, ip, left)))
                    .filter(|(slot, _, _)| slots.contains_key(slot))
                    .collect(),
            );
        }
        for (slot, legacy) in slots {
            let old = writer.dump(legacy)?.into_iter().filter(|(tag, _, _)| tag.is_none());
            found.push(old.map(|(_, ip, left)| (*slot, ip, left)).collect());
        }
        for found in found {
            let mut refused = 0;
            let found = learned.admit(found, now, &mut refused);
            learned.remember(&found, now);
            n += found.len();
        }
        Ok(n)
    }

    /// Every learned element that has not expired, with the time it has left, for a
    /// full table replace to hold from its transaction on (it empties the sets);
    /// elements of slots no rule uses any more are forgotten.
    pub(crate) fn kept(&self, slots: &std::collections::BTreeSet<Slot>) -> Vec<Element> {
        let now = Instant::now();
        let Ok(mut learned) = self.learned.lock() else { return Vec::new() };
        learned.retain(|slot, until| until > now && slots.contains(slot));
        learned.until.iter().map(|((slot, ip), until)| (*slot, *ip, until.duration_since(now))).collect()
    }

    fn run(&self, socket: Socket, mut writer: ElementWriter, metrics: &Metrics) {
        let mut snooper = Snooper::new();
        let mut reported = Dropped::default();
        let mut buf = vec![0u8; 1 << 17];
        loop {
            let size = match socket.recv(&mut &mut buf[..], 0) {
                Ok(n) => n,
                Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {
                    tracing::warn!("DNS snooping: copies were dropped (receive buffer full)");
                    count(metrics, "dropped");
                    continue;
                }
                Err(e) => {
                    tracing::error!(error = %e, "DNS snooping stopped");
                    return;
                }
            };
            each_copy(&buf[..size], |prefix, payload| {
                self.packet(prefix, payload, &mut snooper, &mut writer, metrics);
                let now = snooper.dropped();
                if now != reported {
                    count_dropped(metrics, "pending_evicted", now.pending_evicted - reported.pending_evicted);
                    count_dropped(metrics, "tcp_flows_evicted", now.tcp_flows_evicted - reported.tcp_flows_evicted);
                    count_dropped(metrics, "cname_chain_cut", now.cname_chains_cut - reported.cname_chains_cut);
                    reported = now;
                }
            });
        }
    }

    fn packet(
        &self,
        prefix: &str,
        payload: &[u8],
        snooper: &mut Snooper,
        writer: &mut ElementWriter,
        metrics: &Metrics,
    ) {
        let now = Instant::now();
        let outcome: Result<Vec<Element>, Ignored> = (|| {
            match prefix {
                PREFIX_UNTRUSTED => return Err(Ignored::Untrusted),
                PREFIX_UNTRACKED => return Err(Ignored::Untracked),
                PREFIX_SPOOFED => return Err(Ignored::Spoofed),
                _ => {}
            }
            let packet = parse_packet(payload)?;
            if prefix == PREFIX_QUERY {
                if snooper.query(&packet, now)? > 0 {
                    count(metrics, "query");
                }
                return Ok(Vec::new());
            }
            if prefix != PREFIX_ANSWER {
                return Err(Ignored::Malformed);
            }
            let learned = snooper.answer(&packet, now)?;
            if let Some(delay) = Self::test_delay() {
                std::thread::sleep(delay);
            }
            Ok(self.elements(&learned))
        })();
        match outcome {
            Ok(elements) => self.commit(elements, now, writer, metrics),
            Err(why) => {
                count(metrics, why.as_str());
                tracing::debug!(reason = why.as_str(), "DNS copy ignored");
            }
        }
    }

    /// The elements a pod's answer teaches ([`SnoopTargets::elements`] of what
    /// [`Snooper::answer`] returned).
    pub(crate) fn elements(&self, learned: &[crate::dns::snoop::Learned]) -> Vec<Element> {
        let targets = self.targets.read().map(|t| t.clone()).unwrap_or_default();
        targets.elements(learned)
    }

    /// Add what an answer taught to the kernel within the bounds, and remember it:
    /// returns once the kernel acknowledged the transaction (or refused it).
    ///
    /// An element the kernel holds with at least its new timeout less half the grace
    /// left is not written again (as resolved names' timeouts are restarted only when
    /// half the grace is used up): the pod's copy of the answer expires a half grace
    /// before the element at the earliest. Such an answer costs no kernel transaction.
    pub(crate) fn commit(&self, elements: Vec<Element>, now: Instant, writer: &mut ElementWriter, metrics: &Metrics) {
        let mut refused = 0;
        let half_grace = self.targets.read().map(|t| t.grace / 2).unwrap_or_default();
        let elements = match self.learned.lock() {
            Ok(mut learned) => learned.worth_writing(elements, now, half_grace, &mut refused),
            Err(_) => elements,
        };
        count_dropped(metrics, "learned_full", refused);
        if elements.is_empty() {
            return;
        }
        match writer.add(&elements) {
            Ok(()) => {
                count(metrics, "learned");
                if let Ok(mut learned) = self.learned.lock() {
                    learned.remember(&elements, now);
                }
                for (slot, ip, timeout) in &elements {
                    tracing::debug!(set = slot.set, tag = slot.tag, address = %ip, timeout_s = timeout.as_secs(), "learned from a pod's DNS answer");
                }
            }
            Err(e) if e.raw_os_error() == Some(libc::ENFILE) => {
                count_dropped(metrics, "set_full", elements.len() as u64);
                tracing::warn!("DNS snooping: a set is full (its size), learned addresses not added");
            }
            Err(e) => {
                count(metrics, "kernel_error");
                tracing::warn!(error = %e, "DNS snooping: adding learned addresses failed");
            }
        }
    }

    /// Refresh the DNS proxy's guard elements (kept through full replaces like what
    /// was learned). Elements still in the set are deleted and added again in one
    /// transaction — a new expiry on every kernel, with no moment without them (an add
    /// alone restarts an element's clock only where the kernel updates elements,
    /// Linux ≥ 6.10); `alive`: whether they are there (else, or when the delete finds
    /// one gone, they are added).
    pub(crate) fn refresh_guard(
        &self,
        elements: &[Element],
        alive: bool,
        writer: &mut ElementWriter,
    ) -> std::io::Result<()> {
        let list = by_set(elements);
        let delta =
            crate::nft::delta::ElementDelta { delete: if alive { list.clone() } else { Vec::new() }, add: list };
        match writer.apply(&delta) {
            Err(e) if alive && e.raw_os_error() == Some(libc::ENOENT) => writer.add(elements)?,
            other => other?,
        }
        if let Ok(mut learned) = self.learned.lock() {
            learned.remember(elements, Instant::now());
        }
        Ok(())
    }

    /// The NFLOG listener's test delay (`EGRESSD_TEST_SNOOP_DELAY_MS`): the time
    /// between reading an answer's copy and adding what it teaches, to show in tests
    /// that a pod faster than snooping loses its first connection.
    fn test_delay() -> Option<std::time::Duration> {
        static DELAY: std::sync::OnceLock<Option<std::time::Duration>> = std::sync::OnceLock::new();
        *DELAY.get_or_init(|| {
            std::env::var("EGRESSD_TEST_SNOOP_DELAY_MS").ok()?.parse().ok().map(std::time::Duration::from_millis)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::time::Duration;

    proptest! {
        /// Answers at random times, for a few addresses, with random timeouts: what the
        /// kernel holds (only what was written, at the time it was written) always covers
        /// each answer for its timeout less half the grace, and the memory the full
        /// replaces keep from is exactly the kernel's.
        #[test]
        fn skipped_writes_still_cover_every_answer(
            steps in proptest::collection::vec((0u64..400, 0usize..3, prop::sample::select(vec![5u64, 65, 305, 3600])), 1..60)
        ) {
            let slot = Slot { set: "dns-v4", tag: 1 };
            let ips: [IpAddr; 3] = ["192.0.2.1".parse().unwrap(), "192.0.2.2".parse().unwrap(), "2001:db8::1".parse().unwrap()];
            let half_grace = Duration::from_secs(150);
            let t0 = Instant::now();
            let mut now = t0;
            let mut learned = Learned::default();
            let mut kernel: HashMap<IpAddr, Instant> = HashMap::new();
            for (advance, which, timeout) in steps {
                now += Duration::from_secs(advance);
                let e = (slot, ips[which], Duration::from_secs(timeout));
                let mut refused = 0;
                let written = learned.worth_writing(vec![e], now, half_grace, &mut refused);
                prop_assert_eq!(refused, 0);
                for (_, ip, t) in &written {
                    kernel.insert(*ip, now + *t);
                }
                learned.remember(&written, now);
                let held = kernel.get(&ips[which]).copied();
                prop_assert!(
                    held.is_some_and(|until| until >= now + e.2.saturating_sub(half_grace)),
                    "answer for {:?} with timeout {:?} at +{:?} not covered: kernel {:?}",
                    ips[which], e.2, now - t0, held.map(|u| u - t0)
                );
                for (ip, until) in &kernel {
                    prop_assert_eq!(learned.until.get(&(slot, *ip)), Some(until));
                }
            }
        }
    }

    #[test]
    fn an_element_is_written_again_only_once_half_the_grace_is_used_up() {
        let slot = Slot { set: "dns-v4", tag: 7 };
        let ip: IpAddr = "192.0.2.1".parse().unwrap();
        let t0 = Instant::now();
        let mut learned = Learned::default();
        let (timeout, half_grace) = (Duration::from_secs(360), Duration::from_secs(150));
        let e = (slot, ip, timeout);
        assert!(!learned.fresh(&e, t0, half_grace), "an element never written is not fresh");
        learned.remember(&[e], t0);
        // 100 s later: 260 s left ≥ 360 − 150: no write needed.
        assert!(learned.fresh(&e, t0 + Duration::from_secs(100), half_grace));
        assert!(learned.fresh(&e, t0 + Duration::from_secs(150), half_grace));
        // 151 s later: 209 s left < 210: written again.
        assert!(!learned.fresh(&e, t0 + Duration::from_secs(151), half_grace));
        // A longer timeout than the one remembered (a larger TTL) is written at once.
        assert!(!learned.fresh(&(slot, ip, Duration::from_secs(3600)), t0, half_grace));
        // Another address, or the same in another slot: not fresh.
        assert!(!learned.fresh(&(slot, "192.0.2.2".parse().unwrap(), timeout), t0, half_grace));
        assert!(!learned.fresh(&(Slot { set: "dns-v4", tag: 8 }, ip, timeout), t0, half_grace));
    }
}
