//! The kernel's counters read into metrics: the named counters (snooping's and ACL
//! logging's rate limits, the firewall's verdict totals, the tunnel's drops) and the
//! rule counters of namespaces with ACL logging.

use super::*;

/// How often the snooping rate limits' counters are read.
pub(super) const COUNTERS_EVERY: Duration = Duration::from_secs(5);

impl<S: ViewSource, B: NftBackend, K: StatusSink> Agent<S, B, K> {
    /// Read the named counters: the copies DNS snooping's rate limits held back
    /// (`snoop-over-<class>`) into `egressd_dns_snoop_dropped`, ACL logging's
    /// (`acl-over`), and the firewall's verdict totals (`fw-<verdict>`) into
    /// `egressd_firewall_packets`; then the rule counters of namespaces with ACL logging
    /// into `egressd_firewall_namespace_packets`. A full replace (or a replaced chain)
    /// creates counters anew at zero: a count below the last one read is all new.
    pub(super) fn read_counters(&mut self) {
        let counts = match tokio::task::block_in_place(|| self.syncer.counters()) {
            Ok(c) => c,
            Err(e) => {
                tracing::debug!(error = %e, "named counters not read");
                return;
            }
        };
        let metrics = &self.config.telemetry.metrics;
        for (name, packets) in counts {
            let new = counter_delta(&mut self.copy_counts, name.clone(), packets);
            if name == crate::compile::ACL_OVER {
                if new > 0 {
                    tracing::info!(connections = new, "ACL logging: connections over the log rate limit not logged");
                    metrics.acl_log_dropped.inc_by(new);
                }
                continue;
            }
            if let Some(reason) = name.strip_prefix("eip-tunnel-") {
                if new > 0 {
                    tracing::warn!(reason, packets = new, "EgressIP tunnel: encapsulated packets refused");
                    let labels = crate::telemetry::metrics::TunnelDropLabels { reason: reason.replace('-', "_") };
                    metrics.tunnel_dropped.get_or_create(&labels).inc_by(new);
                }
                continue;
            }
            if let Some(verdict) = name.strip_prefix("fw-") {
                let labels = crate::telemetry::metrics::AclLabels { verdict: verdict.to_string() };
                metrics.firewall_packets.get_or_create(&labels).inc_by(new);
                continue;
            }
            let Some(class) = name.strip_prefix("snoop-over-") else { continue };
            if new > 0 {
                tracing::warn!(class, copies = new, "DNS snooping: copies over the rate limit were not taken");
                let labels = crate::telemetry::metrics::SnoopDropLabels { reason: format!("copies_over_rate_{class}") };
                metrics.dns_snoop_dropped.get_or_create(&labels).inc_by(new);
            }
        }
        self.read_namespace_counters();
    }

    /// `egressd_firewall_namespace_packets`: the rule counters of the chains of
    /// namespaces with ACL logging (one `nft -j list chain` each), summed by the verdict
    /// of the rule as the policy has it (a Deny in audit mode is `audit`).
    fn read_namespace_counters(&mut self) {
        let view = self.source.view();
        let logged: Vec<(String, Vec<&'static str>)> = view
            .firewalls
            .iter()
            .filter(|(ns, _)| view.namespaces.get(*ns).is_some_and(|n| matches!(n.acl_logging, Some(Ok(_)))))
            .filter_map(|(ns, e)| {
                let p = e.policy.as_ref()?;
                let verdicts = p
                    .rules
                    .iter()
                    .map(|r| match r.action {
                        crate::view::policy::Action::Allow => "allow",
                        crate::view::policy::Action::Deny if p.audit => "audit",
                        crate::view::policy::Action::Deny => "deny",
                    })
                    .collect();
                Some((ns.clone(), verdicts))
            })
            .collect();
        for (ns, verdicts) in logged {
            let chain = crate::nft::chain_name("fw", &ns);
            if !self.desired.table.chains.contains_key(chain.as_str()) {
                continue;
            }
            let counters = match tokio::task::block_in_place(|| self.syncer.rule_counters(&chain)) {
                Ok(c) => c,
                Err(e) => {
                    tracing::debug!(namespace = %ns, error = %e, "rule counters not read");
                    continue;
                }
            };
            let mut sums: std::collections::BTreeMap<&str, u64> = Default::default();
            for c in &counters {
                if let Some(v) = verdicts.get(c.index) {
                    *sums.entry(v).or_default() += c.packets;
                }
            }
            for (verdict, packets) in sums {
                let new = counter_delta(&mut self.copy_counts, format!("{chain}/{verdict}"), packets);
                let labels = crate::telemetry::metrics::NamespaceVerdictLabels {
                    namespace: ns.clone(),
                    verdict: verdict.to_string(),
                };
                self.config.telemetry.metrics.firewall_namespace_packets.get_or_create(&labels).inc_by(new);
            }
        }
    }

    /// Whether the counters are worth reading: some rule or copy can move them.
    pub(super) fn reads_counters(&self) -> bool {
        let view = self.source.view();
        self.snoop.is_some() || self.acl.is_some() || !view.firewalls.is_empty() || !view.egress_ips.is_empty()
    }
}

/// What a kernel counter read last as `packets` adds: all of it when it went down (the
/// counter was created anew).
fn counter_delta(last: &mut std::collections::HashMap<String, u64>, key: String, packets: u64) -> u64 {
    let before = last.insert(key, packets).unwrap_or(0);
    if packets >= before { packets - before } else { packets }
}
