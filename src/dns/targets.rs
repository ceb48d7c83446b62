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
}

/// The prefixes of the copies.
pub(crate) const PREFIX_QUERY: &str = "dns-q";
/// Answers from a trusted server.
pub(crate) const PREFIX_ANSWER: &str = "dns-a";
/// Answers from any other server.
pub(crate) const PREFIX_UNTRUSTED: &str = "dns-u";
/// Answer-shaped packets outside any flow a pod opened.
pub(crate) const PREFIX_UNTRACKED: &str = "dns-x";

/// One `dnsName` of a namespace, as the snooping listener matches it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnoopName {
    /// Normalised base name.
    pub base: String,
    /// `*.base`.
    pub wildcard: bool,
    /// Its sets: IPv4, IPv6 (`None` for a family not in use).
    pub sets: [Option<String>; 2],
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
}
