//! Prometheus metrics (prometheus-client, OpenMetrics text). Label values are from fixed
//! sets only (kind, validity, sync type, DNS result): no per-pod, per-object or
//! error-text labels, so the number of series is bounded.

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Full replace or delta.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelValue)]
pub enum SyncType {
    /// The whole table in one transaction.
    Full,
    /// Only the difference.
    Partial,
}

/// `type` label of sync metrics.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SyncLabels {
    /// Full or partial.
    pub r#type: SyncType,
}

/// `phase` label of `egressd_sync_phase_seconds`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabels {
    /// `compile`, `diff` (egressd's own work), `netlink`, `nft` (the kernel's; `nft`
    /// includes the nft program's own time).
    pub phase: String,
}

/// `kind` and `valid` labels of the object gauge.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ObjectLabels {
    /// EgressFirewall, EgressQoS, EgressIP, CloudPrivateIPConfig, Pod, Node, Namespace.
    pub kind: String,
    /// "true" or "false".
    pub valid: String,
}

/// DNS lookup outcome.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelValue)]
pub enum DnsResult {
    /// Addresses (or an authoritative empty answer).
    Ok,
    /// No answer: timeout, SERVFAIL, unreachable server.
    Error,
}

/// Labels of `egressd_dns_snooped`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SnoopLabels {
    /// `learned` (addresses added), `query`, or why a copy was ignored (`malformed`,
    /// `tcp_partial`, `untrusted`, `untracked`, `spoofed`, `unmatched`,
    /// `pod_pending_full`, `no_addresses`, `kernel_error`), or `dropped` (copies lost in
    /// a full receive buffer).
    pub result: String,
}

/// Labels of `egressd_acl_log`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AclLabels {
    /// `allow`, `deny` or `audit`.
    pub verdict: String,
}

/// Labels of `egressd_firewall_namespace_packets`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NamespaceVerdictLabels {
    /// The namespace (only namespaces with ACL logging: bounded by what operators annotate).
    pub namespace: String,
    /// `allow`, `deny` or `audit`.
    pub verdict: String,
}

/// Labels of `egressd_dns_proxied`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProxyLabels {
    /// `udp` or `tcp`.
    pub transport: &'static str,
    /// `answered` (released to the pod after the kernel took what it teaches), `busy`
    /// (a bound: the pod's or all pods' waiting queries, TCP connections), `overloaded`
    /// (the guard was let expire), `released` (a server whose address became this
    /// node's), `not_taken` (reached the proxy's port without being handed over),
    /// `upstream_timeout`, `upstream_error`, `pod_gone` (the answer could not be sent).
    pub result: &'static str,
}

/// Labels of `egressd_dns_snoop_dropped`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SnoopDropLabels {
    /// Which bound dropped something: `pending_evicted` (oldest waiting query forgotten),
    /// `tcp_flows_evicted`, `cname_chain_cut`, `learned_full` (address not remembered:
    /// the listener's memory or the name's share of its set is full), `set_full` (the
    /// kernel set refused it), `copies_over_rate_<class>` (copies the nft rate limit
    /// did not send; class `query`, `answer`, `untrusted`, `untracked`, `spoofed`).
    pub reason: String,
}

/// Labels of `egressd_egress_ip_tunnel_dropped`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TunnelDropLabels {
    /// `foreign_source` (not from a cluster node's address) or `unknown_key` (a key
    /// this node hosts no egress IP for).
    pub reason: String,
}

/// Labels of `egressd_kind_unavailable`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    /// The kind (one of the seven watched).
    pub kind: String,
    /// `missing` (not served) or `forbidden`.
    pub reason: String,
}

/// Labels of `egressd_watch_events`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct WatchEventLabels {
    /// The kind (one of the seven watched).
    pub(crate) kind: String,
    /// `apply` (an object added or changed), `delete`, `relist` (a list began) or
    /// `listed` (an object of a list).
    pub(crate) event: &'static str,
}

/// Labels of `egressd_drift_repairs`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct DriftLabels {
    /// `nft` (the table replaced) or `netlink` (addresses, rules or routes restored).
    pub(crate) what: String,
}

/// Labels of `egressd_admission_reviews` (`--role controller --webhook-listen`).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AdmissionLabels {
    /// `node` (the node identity) or `other` (anyone else: always allowed).
    pub caller: String,
    /// `allowed` or `denied`.
    pub verdict: String,
}

/// `result` label of DNS lookups.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DnsLabels {
    /// Outcome.
    pub result: DnsResult,
}

/// Every metric egressd exports, under the `egressd_` prefix.
pub struct Metrics {
    registry: Registry,
    /// Time to compile and apply, by sync type (seconds).
    pub sync_duration: Family<SyncLabels, Histogram>,
    /// Time of each sync by phase: egressd's own work vs the kernel's.
    pub sync_phase_duration: Family<PhaseLabels, Histogram>,
    /// Syncs that nft rejected.
    pub sync_failures: Counter,
    /// Objects in the view, by kind and validity.
    pub objects: Family<ObjectLabels, Gauge>,
    /// Rules in egressd's table.
    pub rules: Gauge,
    /// Set and map elements in egressd's table.
    pub elements: Gauge,
    /// DNS lookups by result.
    pub dns_lookups: Family<DnsLabels, Counter>,
    /// DNS names tracked.
    pub dns_names: Gauge,
    /// Egress IPs hosted on this node.
    pub egress_ips_hosted: Gauge,
    /// Snooped DNS packets by outcome.
    pub dns_snooped: Family<SnoopLabels, Counter>,
    /// What DNS snooping's bounds dropped, by bound.
    pub dns_snoop_dropped: Family<SnoopDropLabels, Counter>,
    /// `egressd_egress_ip_tunnel_dropped`.
    pub tunnel_dropped: Family<TunnelDropLabels, Counter>,
    /// Pods' DNS queries the DNS proxy took, by transport and outcome.
    pub dns_proxied: Family<ProxyLabels, Counter>,
    /// How long the DNS proxy held answers (the upstream answer's arrival to its release
    /// to the pod: parsing, and the kernel taking the addresses it teaches).
    pub dns_proxy_hold: Histogram,
    /// EgressFirewall verdicts logged (ACL logging, audit mode), by verdict.
    pub acl_log: Family<AclLabels, Counter>,
    /// Logged connections the log rules' rate limit held back.
    pub acl_log_dropped: Counter,
    /// Packets decided by EgressFirewall rules on this node, by verdict.
    pub firewall_packets: Family<AclLabels, Counter>,
    /// The same for namespaces with ACL logging, by namespace and verdict.
    pub firewall_namespace_packets: Family<NamespaceVerdictLabels, Counter>,
    /// Unix time of the last successful sync.
    pub last_sync_timestamp: Gauge,
    /// 1 for a kind that cannot be listed (treated as empty), by kind and reason.
    pub kind_unavailable: Family<KindLabels, Gauge>,
    /// Changes by someone else to what egressd owns, undone.
    pub(crate) drift_repairs: Family<DriftLabels, Counter>,
    /// Admission reviews the controller's webhook answered, by caller and verdict.
    pub admission_reviews: Family<AdmissionLabels, Counter>,
    /// Watch events received from the API server, by kind and event.
    pub(crate) watch_events: Family<WatchEventLabels, Counter>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Default for Metrics {
    /// Every metric registered with its help text: a table, kept whole (ARCHITECTURE.md,
    /// units).
    fn default() -> Self {
        let mut registry = Registry::with_prefix("egressd");
        let sync_duration = Family::<SyncLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.001, 2.0, 14))
        });
        let sync_phase_duration = Family::<PhaseLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.0001, 2.0, 18))
        });
        let m = Self {
            sync_duration,
            sync_phase_duration,
            sync_failures: Counter::default(),
            objects: Family::default(),
            rules: Gauge::default(),
            elements: Gauge::default(),
            dns_lookups: Family::default(),
            dns_snooped: Family::default(),
            dns_snoop_dropped: Family::default(),
            tunnel_dropped: Family::default(),
            dns_proxied: Family::default(),
            dns_proxy_hold: Histogram::new(exponential_buckets(0.000_01, 2.0, 16)),
            acl_log: Family::default(),
            acl_log_dropped: Counter::default(),
            firewall_packets: Family::default(),
            firewall_namespace_packets: Family::default(),
            dns_names: Gauge::default(),
            egress_ips_hosted: Gauge::default(),
            last_sync_timestamp: Gauge::default(),
            kind_unavailable: Family::default(),
            drift_repairs: Family::default(),
            admission_reviews: Family::default(),
            watch_events: Family::default(),
            registry: Registry::default(),
        };
        registry.register("sync_duration_seconds", "Compile and apply time of a sync", m.sync_duration.clone());
        registry.register(
            "sync_phase_seconds",
            "Time of each sync by phase: compile and diff (egressd's own work), netlink and nft (the kernel's, nft with the nft program)",
            m.sync_phase_duration.clone(),
        );
        registry.register("sync_failures", "Syncs nft rejected", m.sync_failures.clone());
        registry.register("objects", "Objects in the cluster view by kind and validity", m.objects.clone());
        registry.register("nft_rules", "Rules in egressd's nft table", m.rules.clone());
        registry.register("nft_elements", "Set and map elements in egressd's nft table", m.elements.clone());
        registry.register("dns_lookups", "DNS lookups by result", m.dns_lookups.clone());
        registry.register("dns_names", "DNS names tracked", m.dns_names.clone());
        registry.register("egress_ips_hosted", "Egress IPs hosted on this node", m.egress_ips_hosted.clone());
        registry.register("dns_snooped", "Copied DNS packets of pods by outcome", m.dns_snooped.clone());
        registry.register("dns_proxied", "Pods' DNS queries the DNS proxy took, by outcome", m.dns_proxied.clone());
        registry.register(
            "dns_proxy_hold_seconds",
            "How long the DNS proxy held an answer until the kernel took what it teaches",
            m.dns_proxy_hold.clone(),
        );
        registry.register(
            "dns_snoop_dropped",
            "What DNS snooping's bounds dropped (queries, streams, CNAME links, learned addresses, copies), by bound",
            m.dns_snoop_dropped.clone(),
        );
        registry.register(
            "egress_ip_tunnel_dropped",
            "Encapsulated packets the EgressIP tunnel refused, by reason (foreign_source: not from a node; unknown_key: no egress IP hosted here has the key)",
            m.tunnel_dropped.clone(),
        );
        registry.register(
            "acl_log",
            "EgressFirewall verdicts logged (ACL logging, audit mode), by verdict",
            m.acl_log.clone(),
        );
        registry.register(
            "acl_log_dropped",
            "Logged connections the log rules' rate limit held back (not logged)",
            m.acl_log_dropped.clone(),
        );
        registry.register(
            "firewall_packets",
            "Packets decided by EgressFirewall rules on this node, by verdict (allow, deny, audit)",
            m.firewall_packets.clone(),
        );
        registry.register(
            "firewall_namespace_packets",
            "Packets decided by EgressFirewall rules on this node, by namespace and verdict: only namespaces with the k8s.ovn.org/acl-logging annotation (others are in egressd_firewall_packets)",
            m.firewall_namespace_packets.clone(),
        );
        registry.register(
            "last_sync_timestamp_seconds",
            "Unix time of the last successful sync",
            m.last_sync_timestamp.clone(),
        );
        registry.register(
            "kind_unavailable",
            "1 for a kind that cannot be listed (CRD missing or forbidden) and is treated as empty",
            m.kind_unavailable.clone(),
        );
        registry.register(
            "drift_repairs",
            "Changes by someone else to egressd's table (nft) or its addresses, rules and routes (netlink), undone",
            m.drift_repairs.clone(),
        );
        registry.register(
            "admission_reviews",
            "Admission reviews the controller's webhook answered, by caller (node: the node identity; other) and verdict",
            m.admission_reviews.clone(),
        );
        registry.register(
            "watch_events",
            "Watch events and listed objects received from the API server, by kind and event (apply: added or changed; delete; relist: a list began; listed: an object of a list); bookmarks are not counted",
            m.watch_events.clone(),
        );
        Self { registry, ..m }
    }
}

impl Metrics {
    /// The OpenMetrics text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }

    /// Update the object gauges: (kind, valid, invalid) per kind.
    pub(crate) fn observe_objects(&self, counts: &[(crate::api::Kind, usize, usize)]) {
        for (kind, valid, invalid) in counts {
            for (is_valid, n) in [(true, valid), (false, invalid)] {
                if !is_valid && !kind.is_custom() {
                    continue;
                }
                let labels = ObjectLabels { kind: kind.to_string(), valid: is_valid.to_string() };
                self.objects.get_or_create(&labels).set(i64::try_from(*n).unwrap_or(i64::MAX));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposition_names_and_bounded_labels() {
        let m = Metrics::default();
        m.sync_duration.get_or_create(&SyncLabels { r#type: SyncType::Full }).observe(0.02);
        m.rules.set(7);
        m.dns_lookups.get_or_create(&DnsLabels { result: DnsResult::Error }).inc();
        let text = m.encode();
        assert!(text.contains("egressd_sync_duration_seconds_count{type=\"Full\"} 1"), "{text}");
        assert!(text.contains("egressd_nft_rules 7"), "{text}");
        assert!(text.contains("egressd_dns_lookups_total{result=\"Error\"} 1"), "{text}");
    }
}
