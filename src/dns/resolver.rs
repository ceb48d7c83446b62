//! Resolution with hickory-resolver, with its cache off: egressd tracks every answer's
//! TTL itself ([`super::DnsTracker`]).
//!
//! Names are queried as absolute names (trailing dot), so resolv.conf search domains
//! never expand them; the hosts file is not used (policy follows DNS, as the reference).

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::time::Duration;

use hickory_resolver::TokioResolver;
use hickory_resolver::config::{NameServerConfig, ResolveHosts, ResolverConfig, ResolverOpts};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::net::{DnsError, NetError, NoRecords};
use hickory_resolver::proto::rr::{RData, RecordType};

use super::{Families, Resolved};

/// Resolver set-up failures.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ResolverError {
    /// resolv.conf could not be read and no `--dns-server` was given.
    #[error("cannot read the system resolver configuration (give --dns-server): {0}")]
    SystemConfig(String),
    /// The resolver could not be built.
    #[error("cannot build the DNS resolver: {0}")]
    Build(String),
}

/// A name that got no answer (an authoritative "no such name" is an answer, not this).
#[derive(Debug, thiserror::Error)]
#[error("{record_type} {name}: {source}")]
pub(crate) struct ResolveError {
    /// The record type asked for.
    pub record_type: RecordType,
    /// The name.
    pub name: String,
    /// What went wrong (timeout, SERVFAIL, unreachable server, ...).
    #[source]
    pub source: NetError,
}

/// A DNS resolver for rule names.
#[derive(Clone)]
pub(crate) struct DnsResolver {
    inner: TokioResolver,
}

impl std::fmt::Debug for DnsResolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DnsResolver")
    }
}

impl DnsResolver {
    /// Use `servers` (UDP, falling back to TCP), or the name servers of
    /// `/etc/resolv.conf` when empty. `timeout` bounds each query.
    pub(crate) fn new(servers: &[IpAddr], timeout: Duration) -> Result<Self, ResolverError> {
        let name_servers: Vec<NameServerConfig> = if servers.is_empty() {
            let (config, _) = hickory_resolver::system_conf::read_system_conf()
                .map_err(|e| ResolverError::SystemConfig(e.to_string()))?;
            config.name_servers().to_vec()
        } else {
            servers.iter().map(|ip| NameServerConfig::udp_and_tcp(*ip)).collect()
        };
        let config = ResolverConfig::from_parts(None, vec![], name_servers);
        let mut opts = ResolverOpts::default();
        opts.cache_size = 0;
        opts.timeout = timeout;
        opts.attempts = 1;
        opts.ndots = 0;
        opts.use_hosts_file = ResolveHosts::Never;
        let inner = TokioResolver::builder_with_config(config, TokioRuntimeProvider::default())
            .with_options(opts)
            .build()
            .map_err(|e| ResolverError::Build(e.to_string()))?;
        Ok(Self { inner })
    }

    /// Resolve `name` (absolute, e.g. `www.example.com.`) for the given families. An
    /// authoritative "no such name" or "no records" is `Ok` with no addresses and the
    /// negative TTL; anything else that is not an answer is `Err`.
    pub(crate) async fn resolve(&self, name: &str, families: Families) -> Result<Resolved, ResolveError> {
        let mut addresses = BTreeSet::new();
        let mut ttl: Option<u32> = None;
        let kinds = [(families.v4, RecordType::A), (families.v6, RecordType::AAAA)];
        for (wanted, kind) in kinds {
            if !wanted {
                continue;
            }
            match self.inner.lookup(name, kind).await {
                Ok(lookup) => {
                    for record in lookup.answers() {
                        let ip = match &record.data {
                            RData::A(a) if kind == RecordType::A => IpAddr::V4(a.0),
                            RData::AAAA(a) if kind == RecordType::AAAA => IpAddr::V6(a.0),
                            // CNAMEs on the way are followed by the resolver.
                            _ => continue,
                        };
                        addresses.insert(ip);
                        ttl = Some(ttl.map_or(record.ttl, |t| t.min(record.ttl)));
                    }
                }
                Err(NetError::Dns(DnsError::NoRecordsFound(NoRecords { negative_ttl, .. }))) => {
                    let neg = negative_ttl.unwrap_or(0);
                    ttl = Some(ttl.map_or(neg, |t| t.min(neg)));
                }
                Err(source) => return Err(ResolveError { record_type: kind, name: name.to_string(), source }),
            }
        }
        Ok(Resolved { addresses, ttl: Duration::from_secs(u64::from(ttl.unwrap_or(0))) })
    }
}
