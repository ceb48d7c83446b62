//! What DNS snooping matches answers against, as the compile step produces it and the
//! NFLOG listener ([`crate::dataplane::nflog`]) reads it: the settings, the log prefixes
//! of the copies, and per namespace the `dnsName` rules with their sets.

use std::net::IpAddr;

/// Snooping settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnoopSettings {
    /// The NFLOG group the copies go to.
    pub group: u16,
    /// Trusted DNS server addresses (as the pods address them).
    pub servers: Vec<IpAddr>,
    /// Most copies per second of queries, and of answers (each class on its own);
    /// packets beyond it are not copied (counted in `egressd_dns_snoop_dropped`).
    pub rate: u32,
}

/// The DNS proxy's kernel side (`--dns-mode proxy`, [`crate::dataplane::dns_proxy`]):
/// pods' queries to a trusted server are taken (nft `tproxy`) by egressd's sockets
/// while the server's element of the guard set [`PROXY_GUARD_SETS`] lives; egressd
/// refreshes it, so a stopped or hung proxy stops taking queries within
/// [`PROXY_GUARD_TIMEOUT`] and they go to the server directly (and are snooped).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DnsProxySettings {
    /// The port of the transparent TCP listener (UDP queries are taken by one socket
    /// per server, bound to the server's address and port 53).
    pub port: u16,
    /// Two contiguous mark bits: the lower routes a taken query to this host
    /// ([`DnsProxySettings::intercept_mark`]), the upper tags the proxy's own answers
    /// ([`DnsProxySettings::answer_mark`]) so snooping does not copy them.
    pub mark_mask: u32,
    /// The routing table holding `local default dev lo` for taken queries.
    pub table: u32,
    /// The priority of the rule `fwmark <intercept>/<intercept> lookup <table>`.
    pub rule_priority: u32,
    /// The protocol of the table's route (egressd's, as EgressIP's routes).
    pub route_protocol: u8,
}

/// The default [`DnsProxySettings::port`].
pub const DEFAULT_PROXY_PORT: u16 = 53053;
/// The default [`DnsProxySettings::mark_mask`]: clear of kube-proxy (0xc000), Cilium
/// (0x0f00), Calico (0xffff0000) and egressd's own EgressIP default (0x00ff0000).
pub const DEFAULT_PROXY_MARK_MASK: u32 = 0x0000_3000;
/// The guard sets (tagged like the `dnsName` sets, tag [`PROXY_GUARD_TAG`]): one element
/// per server whose queries are taken.
pub const PROXY_GUARD_SETS: [&str; 2] = ["dns-proxy-v4", "dns-proxy-v6"];
/// The guard elements' tag.
pub const PROXY_GUARD_TAG: u64 = 0;
/// How long a guard element lives unless refreshed.
pub const PROXY_GUARD_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);
/// How often the proxy refreshes its guard elements.
pub const PROXY_GUARD_REFRESH: std::time::Duration = std::time::Duration::from_millis(250);

impl DnsProxySettings {
    /// Settings with the defaults for the tables and rules of `egress`.
    pub fn new(port: u16, mark_mask: u32, egress: &crate::net::EgressSettings) -> Self {
        // Below EgressIP's rules (a taken query is delivered here, never steered) and
        // on the table just below EgressIP's range (never one of its own).
        Self {
            port,
            mark_mask,
            table: egress.table_base,
            rule_priority: egress.rule_priority.saturating_sub(1),
            route_protocol: egress.route_protocol,
        }
    }

    /// Check a mark mask: exactly two contiguous bits, clear of kube-proxy's and of `others`.
    pub fn check_mark_mask(mask: u32, others: &[(&str, u32)]) -> Result<(), String> {
        if mask.count_ones() != 2 || (mask >> mask.trailing_zeros()) != 0b11 {
            return Err(format!("{mask:#010x}: two contiguous bits expected (e.g. 0x00003000)"));
        }
        if mask & 0xc000 != 0 {
            return Err(format!("{mask:#010x} overlaps kube-proxy's mark bits 0x0000c000"));
        }
        for (name, other) in others {
            if mask & other != 0 {
                return Err(format!("{mask:#010x} overlaps {name} {other:#010x}"));
            }
        }
        Ok(())
    }

    /// The mark of a taken query (routes it to this host).
    pub fn intercept_mark(&self) -> u32 {
        self.mark_mask & self.mark_mask.wrapping_neg()
    }

    /// The mark of the proxy's own answers to pods.
    pub fn answer_mark(&self) -> u32 {
        self.mark_mask & !self.intercept_mark()
    }

    /// The guard slot of a family's set.
    pub fn guard_slot(v6: bool) -> crate::nft::Slot {
        crate::nft::Slot { set: PROXY_GUARD_SETS[usize::from(v6)], tag: PROXY_GUARD_TAG }
    }
}

/// The default [`SnoopSettings::rate`].
pub const DEFAULT_SNOOP_RATE: u32 = 10_000;
/// Most copies per second of each class that is only counted (untrusted, untracked and
/// spoofed answers): a flood of answer-shaped packets costs the listener nothing more.
pub(crate) const COUNTED_ONLY_RATE: u32 = 200;

/// The prefixes of the copies.
pub const PREFIX_QUERY: &str = "dns-q";
/// Answers from a trusted server.
pub const PREFIX_ANSWER: &str = "dns-a";
/// Answers from any other server.
pub const PREFIX_UNTRUSTED: &str = "dns-u";
/// Answer-shaped packets outside any flow a pod opened.
pub const PREFIX_UNTRACKED: &str = "dns-x";
/// Answers from a trusted server's address that entered from the pod-facing side.
pub const PREFIX_SPOOFED: &str = "dns-s";

/// One `dnsName` of a namespace, as the snooping listener matches it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnoopName {
    /// Normalised base name.
    pub base: String,
    /// `*.base`.
    pub wildcard: bool,
    /// Its slots of the shared DNS sets: IPv4, IPv6 (`None` for a family not in use).
    pub slots: [Option<crate::nft::Slot>; 2],
}

/// What the snooping listener needs to know, rebuilt after every compile.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SnoopTargets {
    /// Local snooped pods → namespace.
    pub pods: std::collections::HashMap<IpAddr, String>,
    /// Namespace → its `dnsName` rules.
    pub names: std::collections::HashMap<String, Vec<SnoopName>>,
    /// Learned addresses inside these (cluster, Service) ranges are not added.
    pub exempt: Vec<ipnet::IpNet>,
    /// Added to the answer's TTL (floor 5 s) for the kernel timeout.
    pub grace: std::time::Duration,
    /// Answers' TTLs are cut to this (`--dns-max-ttl-secs`).
    pub max_ttl: std::time::Duration,
}

impl SnoopTargets {
    /// The set elements an answer a pod received teaches: each learned address goes to
    /// the sets of the `dnsName` rules **of the pod's own namespace** that match a name
    /// of its chain, with the answer's TTL (capped, plus the grace) as timeout.
    /// Addresses of the cluster's own ranges, and pods not snooped, teach nothing.
    ///
    /// The slots are per name, shared by every namespace with a rule for that name: an
    /// answer a pod of one namespace received also serves another namespace's rule for
    /// the same name, but never a name its own namespace has no rule for.
    pub fn elements(&self, learned: &[super::snoop::Learned]) -> Vec<(crate::nft::Slot, IpAddr, std::time::Duration)> {
        let mut out = Vec::new();
        for l in learned {
            let Some(namespace) = self.pods.get(&l.pod) else { continue };
            if self.exempt.iter().any(|n| n.contains(&l.address)) {
                continue;
            }
            let timeout = super::element_timeout(l.ttl.min(self.max_ttl), self.grace);
            for name in self.names.get(namespace).into_iter().flatten() {
                if !l.names.iter().any(|n| super::snoop::name_matches(&name.base, name.wildcard, n)) {
                    continue;
                }
                if let Some(slot) = name.slots[usize::from(l.address.is_ipv6())] {
                    out.push((slot, l.address, timeout));
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dns::snoop::Learned;
    use std::time::Duration;

    fn slot(set: &'static str, tag: u64) -> crate::nft::Slot {
        crate::nft::Slot { set, tag }
    }

    fn name(base: &str, wildcard: bool, tag: u64) -> SnoopName {
        SnoopName { base: base.into(), wildcard, slots: [Some(slot("v4", tag)), Some(slot("v6", tag))] }
    }

    #[test]
    fn the_proxy_mark_mask_is_two_bits_clear_of_the_others() {
        let egress = crate::net::EgressSettings::default();
        let p = DnsProxySettings::new(53053, DEFAULT_PROXY_MARK_MASK, &egress);
        assert_eq!((p.intercept_mark(), p.answer_mark()), (0x1000, 0x2000));
        assert_eq!((p.table, p.rule_priority), (egress.table_base, egress.rule_priority - 1));
        assert!(!egress.owns_table(p.table), "the proxy's table is one of EgressIP's");
        let others = [("--egress-ip-mark-mask", egress.mark_mask)];
        assert!(DnsProxySettings::check_mark_mask(DEFAULT_PROXY_MARK_MASK, &others).is_ok());
        assert!(DnsProxySettings::check_mark_mask(DEFAULT_PROXY_MARK_MASK, &[]).is_ok());
        for bad in [0x1000, 0x7000, 0x5000, 0] {
            assert!(
                DnsProxySettings::check_mark_mask(bad, &others).unwrap_err().contains("two contiguous bits"),
                "{bad:#x}"
            );
        }
        assert!(DnsProxySettings::check_mark_mask(0xc000, &others).unwrap_err().contains("kube-proxy"));
        assert!(DnsProxySettings::check_mark_mask(0x0003_0000, &others).unwrap_err().contains("--egress-ip-mark-mask"));
        let high = DnsProxySettings::new(1, 0xc000_0000, &egress);
        assert_eq!((high.intercept_mark(), high.answer_mark()), (0x4000_0000, 0x8000_0000));
    }

    #[test]
    fn a_pod_only_teaches_names_its_own_namespace_allows() {
        let mut t = SnoopTargets { grace: Duration::from_secs(5), max_ttl: crate::dns::MAX_TTL, ..Default::default() };
        t.exempt = vec!["198.18.0.0/15".parse().unwrap()];
        t.pods.insert("198.18.1.1".parse().unwrap(), "team-a".into());
        t.pods.insert("198.18.1.2".parse().unwrap(), "team-b".into());
        t.names.insert("team-a".into(), vec![name("api.example.com", false, 1)]);
        t.names.insert("team-b".into(), vec![name("api.example.com", false, 1), name("example.org", true, 2)]);
        let learn = |pod: &str, names: &[&str], address: &str, ttl: u64| Learned {
            pod: pod.parse().unwrap(),
            names: names.iter().map(|n| n.to_string()).collect(),
            address: address.parse().unwrap(),
            ttl: Duration::from_secs(ttl),
        };
        // A pod of team-a answering for a name only team-b allows: nothing, whatever
        // the answer claims (here a CNAME chain that ends in team-b's wildcard).
        assert!(t.elements(&[learn("198.18.1.1", &["x.example.org"], "192.0.2.1", 60)]).is_empty());
        assert!(t.elements(&[learn("198.18.1.1", &["evil.example.net", "x.example.org"], "192.0.2.1", 60)]).is_empty());
        // Its own name: the shared set of that name (which team-b's rule uses as well).
        assert_eq!(
            t.elements(&[learn("198.18.1.1", &["api.example.com"], "192.0.2.2", 60)]),
            vec![(slot("v4", 1), "192.0.2.2".parse().unwrap(), Duration::from_secs(65))]
        );
        // team-b's pod: both of its names, per family.
        assert_eq!(
            t.elements(&[learn("198.18.1.2", &["x.example.org"], "2001:db8::1", 10)]),
            vec![(slot("v6", 2), "2001:db8::1".parse().unwrap(), Duration::from_secs(15))]
        );
        // Unknown pods, the cluster's own addresses: nothing. Huge TTLs are capped.
        assert!(t.elements(&[learn("198.18.1.9", &["api.example.com"], "192.0.2.2", 60)]).is_empty());
        assert!(t.elements(&[learn("198.18.1.1", &["api.example.com"], "198.18.0.9", 60)]).is_empty());
        let capped = t.elements(&[learn("198.18.1.1", &["api.example.com"], "192.0.2.2", u32::MAX as u64)]);
        assert_eq!(capped[0].2, crate::dns::MAX_TTL + Duration::from_secs(5));
    }
}
