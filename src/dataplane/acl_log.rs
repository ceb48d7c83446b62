//! ACL logging: a thread reading the NFLOG group the EgressFirewall log rules copy the
//! first packet of each logged connection to (namespaces annotated
//! `k8s.ovn.org/acl-logging`, EgressFirewalls in audit mode), written as structured log
//! lines (target `egressd::acl`) and, with `--acl-log-file`, as JSON lines to a file
//! rotated at 10 MiB (one old file kept, `.1`).
//!
//! The copy's prefix names what the compile step knew — `acl <namespace> <rule index>
//! <allow|deny|audit> <severity>` —; the packet gives the 5-tuple; the pod comes from
//! the pod map the agent hands over after each sync (this node's pods by address).

use std::collections::HashMap;
use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use netlink_sys::Socket;

use crate::telemetry::metrics::{AclLabels, Metrics};

/// A log file is rotated when it reaches this size.
const ROTATE_AT: u64 = 10 << 20;

/// One logged verdict.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub(crate) struct AclEvent {
    /// The pod's namespace (the EgressFirewall's).
    pub namespace: String,
    /// The pod (`?` when its address is not a known local pod).
    pub pod: String,
    /// The rule's index in `spec.egress`.
    pub rule: usize,
    /// `allow`, `deny`, or `audit` (a Deny in audit mode: would have been dropped).
    pub verdict: String,
    /// The severity the namespace asked for.
    pub severity: String,
    /// `tcp`, `udp`, `sctp`, `icmp`, … or the protocol number.
    pub protocol: String,
    /// Source address and port (0 without ports).
    pub src: IpAddr,
    pub sport: u16,
    /// Destination address and port.
    pub dst: IpAddr,
    pub dport: u16,
}

/// Parse one copy: its prefix and the packet (from the IP header on).
pub(crate) fn parse(prefix: &str, packet: &[u8], pods: &HashMap<IpAddr, String>) -> Option<AclEvent> {
    let mut words = prefix.split_whitespace();
    if words.next()? != "acl" {
        return None;
    }
    let namespace = words.next()?.to_string();
    let rule = words.next()?.parse().ok()?;
    let verdict = words.next()?.to_string();
    let severity = words.next()?.to_string();
    let (proto, src, dst, l4) = match packet.first()? >> 4 {
        4 => {
            let ihl = usize::from(packet.first()? & 0x0f) * 4;
            let src = Ipv4Addr::from(<[u8; 4]>::try_from(packet.get(12..16)?).ok()?);
            let dst = Ipv4Addr::from(<[u8; 4]>::try_from(packet.get(16..20)?).ok()?);
            (*packet.get(9)?, IpAddr::V4(src), IpAddr::V4(dst), packet.get(ihl..))
        }
        6 => {
            let src = Ipv6Addr::from(<[u8; 16]>::try_from(packet.get(8..24)?).ok()?);
            let dst = Ipv6Addr::from(<[u8; 16]>::try_from(packet.get(24..40)?).ok()?);
            (*packet.get(6)?, IpAddr::V6(src), IpAddr::V6(dst), packet.get(40..))
        }
        _ => return None,
    };
    let (protocol, ports) = match proto {
        6 => ("tcp".to_string(), true),
        17 => ("udp".to_string(), true),
        132 => ("sctp".to_string(), true),
        1 => ("icmp".to_string(), false),
        58 => ("icmpv6".to_string(), false),
        n => (n.to_string(), false),
    };
    let (sport, dport) = match l4.filter(|_| ports).and_then(|l| l.get(..4)) {
        Some(p) => (u16::from_be_bytes([p[0], p[1]]), u16::from_be_bytes([p[2], p[3]])),
        None => (0, 0),
    };
    let pod = pods.get(&src).cloned().unwrap_or_else(|| "?".into());
    Some(AclEvent { namespace, pod, rule, verdict, severity, protocol, src, sport, dst, dport })
}

/// The pods the listener names (this node's, by address), replaced after each sync.
#[derive(Debug, Clone, Default)]
pub(crate) struct AclHandle {
    pods: Arc<RwLock<Arc<HashMap<IpAddr, String>>>>,
}

impl AclHandle {
    /// Bind NFLOG `group` and start the listener thread.
    pub(crate) fn start(
        group: u16,
        file: Option<PathBuf>,
        metrics: Arc<crate::telemetry::Telemetry>,
    ) -> std::io::Result<Self> {
        let socket = super::nflog::bind(group)?;
        let handle = Self::default();
        let h = handle.clone();
        std::thread::Builder::new().name("egressd-acl-log".into()).spawn(move || {
            let _span = tracing::info_span!("acl_log", group).entered();
            h.run(socket, file, &metrics.metrics);
        })?;
        Ok(handle)
    }

    /// This node's pods by address.
    pub(crate) fn update(&self, pods: HashMap<IpAddr, String>) {
        if let Ok(mut p) = self.pods.write()
            && **p != pods
        {
            *p = Arc::new(pods);
        }
    }

    fn run(&self, socket: Socket, file: Option<PathBuf>, metrics: &Metrics) {
        let mut out = file.map(LogFile::new);
        let mut buf = vec![0u8; 1 << 16];
        loop {
            let size = match socket.recv(&mut &mut buf[..], 0) {
                Ok(n) => n,
                Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {
                    tracing::warn!("ACL logging: copies were lost (receive buffer full)");
                    continue;
                }
                Err(e) => {
                    tracing::error!(error = %e, "ACL logging stopped");
                    return;
                }
            };
            let pods = self.pods.read().map(|p| Arc::clone(&p)).unwrap_or_default();
            super::nflog::each_copy(&buf[..size], |prefix, payload| {
                if let Some(event) = parse(prefix, payload, &pods) {
                    emit(&event);
                    metrics.acl_log.get_or_create(&AclLabels { verdict: event.verdict.clone() }).inc();
                    if let Some(f) = &mut out {
                        f.write(&event);
                    }
                }
            });
        }
    }
}

/// One structured log line, at the level the severity maps to.
fn emit(e: &AclEvent) {
    macro_rules! line {
        ($level:ident) => {
            tracing::$level!(
                target: "egressd::acl",
                namespace = %e.namespace, pod = %e.pod, rule = e.rule, verdict = %e.verdict,
                severity = %e.severity, protocol = %e.protocol, src = %e.src, sport = e.sport,
                dst = %e.dst, dport = e.dport,
                "egress firewall verdict"
            )
        };
    }
    match e.severity.as_str() {
        "alert" | "warning" => line!(warn),
        "debug" => line!(debug),
        _ => line!(info),
    }
}

/// `--acl-log-file`: JSON lines, rotated at [`ROTATE_AT`].
struct LogFile {
    path: PathBuf,
    file: Option<std::fs::File>,
}

impl LogFile {
    fn new(path: PathBuf) -> Self {
        Self { path, file: None }
    }

    fn write(&mut self, e: &AclEvent) {
        let time = jiff::Timestamp::now().to_string();
        let Ok(mut line) = serde_json::to_value(e) else { return };
        line["time"] = serde_json::Value::String(time);
        if std::fs::metadata(&self.path).is_ok_and(|m| m.len() >= ROTATE_AT) {
            self.file = None;
            let _ = std::fs::rename(&self.path, self.path.with_extension("1"));
        }
        if self.file.is_none() {
            match std::fs::OpenOptions::new().create(true).append(true).open(&self.path) {
                Ok(f) => self.file = Some(f),
                Err(e) => {
                    tracing::warn!(path = %self.path.display(), error = %e, "ACL log file not writable");
                    return;
                }
            }
        }
        if let Some(f) = &mut self.file
            && writeln!(f, "{line}").is_err()
        {
            self.file = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_is_read_back_as_its_rule_verdict_and_five_tuple() {
        // IPv4 TCP 198.18.1.2:40000 → 203.0.113.2:8080.
        let mut p = vec![0x45, 0, 0, 40, 0, 0, 0, 0, 64, 6, 0, 0, 198, 18, 1, 2, 203, 0, 113, 2];
        p.extend([0x9c, 0x40, 0x1f, 0x90, 0, 0, 0, 0]);
        let pods = HashMap::from([("198.18.1.2".parse().unwrap(), "team-a/pod0".to_string())]);
        let e = parse("acl team-a 1 deny alert ", &p, &pods).unwrap();
        assert_eq!((e.namespace.as_str(), e.pod.as_str(), e.rule), ("team-a", "team-a/pod0", 1));
        assert_eq!((e.verdict.as_str(), e.severity.as_str(), e.protocol.as_str()), ("deny", "alert", "tcp"));
        assert_eq!((e.sport, e.dst.to_string().as_str(), e.dport), (40000, "203.0.113.2", 8080));
        // IPv6 UDP, unknown pod.
        let mut p6 = vec![0x60, 0, 0, 0, 0, 8, 17, 64];
        p6.extend("2001:db8:1::2".parse::<Ipv6Addr>().unwrap().octets());
        p6.extend("2001:db8:ff::10".parse::<Ipv6Addr>().unwrap().octets());
        p6.extend([0x13, 0x88, 0x00, 0x35, 0, 8, 0, 0]);
        let e = parse("acl b 0 allow notice ", &p6, &HashMap::new()).unwrap();
        assert_eq!((e.pod.as_str(), e.protocol.as_str(), e.dport), ("?", "udp", 53));
        assert!(parse("dns-q", &p, &pods).is_none(), "another prefix");
        assert!(parse("acl x", &p, &pods).is_none(), "cut prefix");
    }

    #[test]
    fn the_file_rotates() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("acl.log");
        std::fs::write(&path, vec![b'x'; ROTATE_AT as usize]).unwrap();
        let mut f = LogFile::new(path.clone());
        let e = AclEvent {
            namespace: "a".into(),
            pod: "a/p".into(),
            rule: 0,
            verdict: "deny".into(),
            severity: "alert".into(),
            protocol: "tcp".into(),
            src: "198.18.1.2".parse().unwrap(),
            sport: 1,
            dst: "203.0.113.2".parse().unwrap(),
            dport: 2,
        };
        f.write(&e);
        f.write(&e);
        assert_eq!(std::fs::metadata(path.with_extension("1")).unwrap().len(), ROTATE_AT, "the full file kept as .1");
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), 2, "a fresh file after the rotation: {text}");
        assert!(text.contains("\"verdict\":\"deny\"") && text.contains("\"time\":"), "{text}");
    }
}
