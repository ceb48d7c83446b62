//! Prerequisite checks: the sysctls and kernel features egressd's features need, checked
//! at start and periodically, reported in `/readyz` and the log. With
//! `--manage-sysctls` egressd sets the required sysctls itself; otherwise it only reports.
//!
//! | check | required when | why |
//! |---|---|---|
//! | `net.ipv4.ip_forward = 1` | an IPv4 cluster range is configured | pods' traffic is forwarded by the node |
//! | `net.ipv6.conf.all.forwarding = 1` | an IPv6 cluster range is configured | same for IPv6 |
//! | conntrack (`/proc/sys/net/netfilter/nf_conntrack_max`) | always | rules judge the original direction (`ct direction`) |
//! | nft ≥ 0.9.3 | always | verdict maps, `th dport` concatenations, element timeouts |
//! | `net.ipv4.fib_multipath_hash_policy = 1` (and `net.ipv6.…`) | informational (set with `--manage-sysctls`) | EgressIP steering across several hosting nodes spreads flows by their ports; with 0 every flow between two addresses takes one path |
//! | `net.ipv4.conf.all.rp_filter` ≠ 1 | informational | strict reverse-path filtering drops packets steered to a hosting node on a network where the pod's range does not route back over the link they arrived on (use 2, loose) |
//! | `net.bridge.bridge-nf-call-iptables = 1` | informational | EgressQoS/EgressFirewall see same-node bridged pod traffic only with it |
//! | Linux ≥ 6.1 (`IFA_PROTO` address tags) | informational | without it egress IPs are not hosted on the node (egressd could not find its addresses again); steering to other nodes works |

use std::path::{Path, PathBuf};

/// The result of one check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    /// What was checked (`net.ipv4.ip_forward`, `nft`, …).
    pub name: String,
    /// Whether it holds.
    pub ok: bool,
    /// Whether readiness depends on it.
    pub required: bool,
    /// What was found and what is needed.
    pub detail: String,
}

/// Where sysctls are read and written (`/proc/sys`, or a directory in tests).
#[derive(Debug, Clone)]
pub struct Sysctls {
    root: PathBuf,
}

impl Default for Sysctls {
    fn default() -> Self {
        Self { root: PathBuf::from("/proc/sys") }
    }
}

impl Sysctls {
    /// Sysctls under `root` instead of `/proc/sys`.
    pub fn at(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    fn path(&self, key: &str) -> PathBuf {
        self.root.join(key.replace('.', "/"))
    }

    /// The value of `key`, trimmed; `None` when it does not exist.
    pub fn get(&self, key: &str) -> Option<String> {
        std::fs::read_to_string(self.path(key)).ok().map(|s| s.trim().to_string())
    }

    /// Set `key`.
    pub fn set(&self, key: &str, value: &str) -> std::io::Result<()> {
        std::fs::write(self.path(key), value)
    }

    fn exists(&self, key: &str) -> bool {
        Path::new(&self.path(key)).exists()
    }
}

fn nft_version_ok(version: &str) -> bool {
    // "nftables v1.0.6 (Lester Gooch #5)"
    let Some(v) = version.split_whitespace().find_map(|w| w.strip_prefix('v')) else { return false };
    let parts: Vec<u32> = v.split('.').filter_map(|p| p.parse().ok()).collect();
    parts >= vec![0, 9, 3]
}

/// Run the checks. With `manage`, wrong required sysctls are set first (and the result
/// of setting them is what is reported).
pub fn check(sysctls: &Sysctls, v4: bool, v6: bool, nft_version: Option<&str>, manage: bool) -> Vec<Check> {
    let mut out = Vec::new();
    let wanted: Vec<(&str, &str, bool, bool)> = vec![
        ("net.ipv4.ip_forward", "1", v4, true),
        ("net.ipv6.conf.all.forwarding", "1", v6, true),
        ("net.ipv4.fib_multipath_hash_policy", "1", v4, false),
        ("net.ipv6.fib_multipath_hash_policy", "1", v6, false),
    ];
    for (key, want, needed, required) in wanted {
        if !needed {
            continue;
        }
        out.push(sysctl_check(sysctls, key, want, required, manage));
    }
    if v4 {
        out.push(rp_filter_check(sysctls));
    }
    let conntrack = sysctls.exists("net.netfilter.nf_conntrack_max");
    out.push(Check {
        name: "conntrack".into(),
        ok: conntrack,
        required: true,
        detail: if conntrack { "available".into() } else { "nf_conntrack not loaded".into() },
    });
    out.push(nft_check(nft_version));
    if let Some(release) = kernel_release() {
        let ok = crate::net::kernel_tags_addresses(&release);
        out.push(Check {
            name: "kernel address tags (IFA_PROTO)".into(),
            ok,
            required: false,
            detail: if ok {
                format!("Linux {release}")
            } else {
                format!("Linux {release}: egress IPs cannot be hosted on this node (needs 6.1 or later)")
            },
        });
    }
    out.push(bridge_check(sysctls));
    out
}

/// Sysctl `key` is `want` (set first with `manage`).
fn sysctl_check(sysctls: &Sysctls, key: &str, want: &str, required: bool, manage: bool) -> Check {
    let mut have = sysctls.get(key);
    if manage && have.as_deref() != Some(want) {
        match sysctls.set(key, want) {
            Ok(()) => {
                tracing::info!(sysctl = key, value = want, "sysctl set (--manage-sysctls)");
                have = sysctls.get(key);
            }
            Err(e) => tracing::warn!(sysctl = key, error = %e, "cannot set sysctl"),
        }
    }
    let ok = have.as_deref() == Some(want);
    let detail = match &have {
        Some(v) if ok => format!("is {v}"),
        Some(v) if required => format!("is {v}, needs {want} (set it, or run with --manage-sysctls)"),
        Some(v) => format!(
            "is {v}; EgressIP flows spread over several hosting nodes by L3 only (set {want}, or run with --manage-sysctls)"
        ),
        None => "not available on this kernel".to_string(),
    };
    Check { name: key.to_string(), ok, required, detail }
}

/// Strict reverse-path filtering drops steered EgressIP traffic.
fn rp_filter_check(sysctls: &Sysctls) -> Check {
    let rp = sysctls.get("net.ipv4.conf.all.rp_filter");
    Check {
        name: "net.ipv4.conf.all.rp_filter".into(),
        ok: rp.as_deref() != Some("1"),
        required: false,
        detail: match rp.as_deref() {
            Some("1") => "is 1 (strict): a hosting node drops EgressIP traffic steered to it unless the pod's range \
                          routes back over the link it arrived on; 2 (loose) is safe"
                .into(),
            Some(v) => format!("is {v}"),
            None => "not available".into(),
        },
    }
}

/// The `nft` program, 0.9.3 or later.
fn nft_check(nft_version: Option<&str>) -> Check {
    match nft_version {
        Some(v) if nft_version_ok(v) => Check { name: "nft".into(), ok: true, required: true, detail: v.to_string() },
        Some(v) => {
            Check { name: "nft".into(), ok: false, required: true, detail: format!("{v}: needs 0.9.3 or later") }
        }
        None => Check { name: "nft".into(), ok: false, required: true, detail: "not found".into() },
    }
}

/// Same-node bridged pod traffic passes netfilter only with br_netfilter's sysctl.
fn bridge_check(sysctls: &Sysctls) -> Check {
    let bridge = sysctls.get("net.bridge.bridge-nf-call-iptables");
    Check {
        name: "net.bridge.bridge-nf-call-iptables".into(),
        ok: bridge.as_deref() == Some("1"),
        required: false,
        detail: match bridge {
            Some(v) => format!("is {v}; same-node bridged pod traffic is filtered and marked only when 1"),
            None => "br_netfilter not loaded; same-node bridged pod traffic is not filtered or marked".into(),
        },
    }
}

/// This machine's kernel release, if readable.
pub fn kernel_release() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/osrelease").ok().map(|s| s.trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake(values: &[(&str, &str)]) -> (tempfile::TempDir, Sysctls) {
        let dir = tempfile::tempdir().unwrap();
        for (k, v) in values {
            let p = dir.path().join(k.replace('.', "/"));
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, format!("{v}\n")).unwrap();
        }
        let s = Sysctls::at(dir.path());
        (dir, s)
    }

    #[test]
    fn reports_wrong_sysctls_by_name() {
        let (_d, s) = fake(&[("net.ipv4.ip_forward", "0"), ("net.netfilter.nf_conntrack_max", "1024")]);
        let checks = check(&s, true, false, Some("nftables v1.0.6 (Lester Gooch #5)"), false);
        let fwd = checks.iter().find(|c| c.name == "net.ipv4.ip_forward").unwrap();
        assert!(!fwd.ok && fwd.required);
        assert_eq!(fwd.detail, "is 0, needs 1 (set it, or run with --manage-sysctls)");
        assert!(checks.iter().find(|c| c.name == "nft").unwrap().ok);
        assert!(!checks.iter().any(|c| c.name.starts_with("net.ipv6")), "no IPv6 range, no IPv6 check");
        let hash = checks.iter().find(|c| c.name == "net.ipv4.fib_multipath_hash_policy").unwrap();
        assert!(!hash.required, "informational");
    }

    #[test]
    fn egress_ip_sysctls_are_reported_and_managed() {
        let (_d, s) = fake(&[("net.ipv4.fib_multipath_hash_policy", "0"), ("net.ipv4.conf.all.rp_filter", "1")]);
        let checks = check(&s, true, false, Some("nftables v1.0.6"), false);
        let hash = checks.iter().find(|c| c.name == "net.ipv4.fib_multipath_hash_policy").unwrap();
        assert!(!hash.ok && hash.detail.contains("L3 only"), "{hash:?}");
        let rp = checks.iter().find(|c| c.name == "net.ipv4.conf.all.rp_filter").unwrap();
        assert!(!rp.ok && rp.detail.contains("strict"), "{rp:?}");
        check(&s, true, false, Some("nftables v1.0.6"), true);
        assert_eq!(s.get("net.ipv4.fib_multipath_hash_policy").as_deref(), Some("1"));
        assert_eq!(s.get("net.ipv4.conf.all.rp_filter").as_deref(), Some("1"), "rp_filter is never changed");
    }

    #[test]
    fn manage_sets_them() {
        let (_d, s) = fake(&[("net.ipv4.ip_forward", "0"), ("net.ipv6.conf.all.forwarding", "0")]);
        let checks = check(&s, true, true, Some("nftables v1.0.6"), true);
        assert!(checks.iter().filter(|c| c.name.contains("forward")).all(|c| c.ok));
        assert_eq!(s.get("net.ipv4.ip_forward").as_deref(), Some("1"));
    }

    #[test]
    fn nft_versions() {
        assert!(nft_version_ok("nftables v1.0.6 (Lester Gooch #5)"));
        assert!(nft_version_ok("nftables v0.9.3 (Topsy)"));
        assert!(!nft_version_ok("nftables v0.9.1 (Headless Horseman)"));
        assert!(!nft_version_ok("garbage"));
    }
}
