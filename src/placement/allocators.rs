//! The neighbouring allocators whose addresses an egress IP must never take: whereabouts
//! `IPPool` allocations (`whereabouts.cni.cncf.io/v1alpha1`: `spec.range` and
//! `spec.allocations`, keyed by the address's offset in the range) and `IPAMClaim`
//! (`k8s.cni.cncf.io/v1alpha1`: the addresses in `status.ips`). The leader reads them
//! (a list every [`REFRESH`]) only while their CRDs are served: a missing CRD is no
//! error, just no holders.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Duration;

use ipnet::IpNet;
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams};
use serde_json::Value;

/// How often the leader lists the allocators' objects.
pub const REFRESH: Duration = Duration::from_secs(5);

/// The address at `offset` in `range` (offset 0: the range's first address).
fn at_offset(range: IpNet, offset: u128) -> Option<IpAddr> {
    match range.network() {
        IpAddr::V4(v4) => {
            let n = u128::from(u32::from(v4)).checked_add(offset)?;
            u32::try_from(n).ok().map(|n| IpAddr::V4(n.into()))
        }
        IpAddr::V6(v6) => u128::from(v6).checked_add(offset).map(|n| IpAddr::V6(n.into())),
    }
    .filter(|ip| range.contains(ip))
}

/// The addresses an `IPPool` has allocated → who holds each (`IPPool ns/name (pod …)`).
pub fn pool_holders(pool: &Value) -> Vec<(IpAddr, String)> {
    let meta = &pool["metadata"];
    let name = format!("{}/{}", meta["namespace"].as_str().unwrap_or(""), meta["name"].as_str().unwrap_or(""));
    let Some(range) = pool["spec"]["range"].as_str().and_then(|r| r.parse::<IpNet>().ok()) else {
        return Vec::new();
    };
    let Some(allocations) = pool["spec"]["allocations"].as_object() else { return Vec::new() };
    allocations
        .iter()
        .filter_map(|(offset, a)| {
            let ip = at_offset(range, offset.parse().ok()?)?;
            let pod = a["podref"].as_str().unwrap_or("?");
            Some((ip, format!("IPPool {name} (pod {pod})")))
        })
        .collect()
}

/// The addresses an `IPAMClaim` holds (`status.ips`, with or without a prefix length).
pub fn claim_holders(claim: &Value) -> Vec<(IpAddr, String)> {
    let meta = &claim["metadata"];
    let ns = meta["namespace"].as_str().unwrap_or("");
    let name = format!("{ns}/{}", meta["name"].as_str().unwrap_or(""));
    let owner = claim["status"]["ownerPod"]["name"].as_str().map(|p| format!(" (pod {ns}/{p})")).unwrap_or_default();
    let Some(ips) = claim["status"]["ips"].as_array() else { return Vec::new() };
    ips.iter()
        .filter_map(|v| {
            let s = v.as_str()?;
            let ip = s.parse::<IpNet>().map(|n| n.addr()).or_else(|_| s.parse::<IpAddr>()).ok()?;
            Some((ip, format!("IPAMClaim {name}{owner}")))
        })
        .collect()
}

fn resource(group: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, "v1alpha1", kind), plural)
}

/// List one kind's objects; `None` when its CRD is not served (or listing fails: logged).
async fn list(client: &Client, ar: &ApiResource) -> Option<Vec<Value>> {
    let api: Api<DynamicObject> = Api::all_with(client.clone(), ar);
    match api.list(&ListParams::default()).await {
        Ok(list) => Some(list.items.into_iter().filter_map(|o| serde_json::to_value(o).ok()).collect()),
        Err(kube::Error::Api(e)) if e.code == 404 => None,
        Err(e) => {
            tracing::warn!(kind = %ar.kind, error = %e, "cannot list the allocator's objects; its addresses are not checked");
            None
        }
    }
}

/// Every address the allocators hold → the holder, for the leader's plan.
pub async fn holders(client: &Client) -> BTreeMap<IpAddr, String> {
    let mut out = BTreeMap::new();
    if let Some(pools) = list(client, &resource("whereabouts.cni.cncf.io", "IPPool", "ippools")).await {
        for pool in &pools {
            for (ip, who) in pool_holders(pool) {
                out.entry(ip).or_insert(who);
            }
        }
    }
    if let Some(claims) = list(client, &resource("k8s.cni.cncf.io", "IPAMClaim", "ipamclaims")).await {
        for claim in &claims {
            for (ip, who) in claim_holders(claim) {
                out.entry(ip).or_insert(who);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_allocations_are_offsets_in_the_range() {
        let pool = serde_json::json!({
            "metadata": {"name": "pool-a", "namespace": "kube-system"},
            "spec": {"range": "198.19.1.96/28", "allocations": {
                "4": {"id": "c1", "podref": "team/web-0"},
                "15": {"id": "c2", "podref": "team/web-1"},
                "16": {"id": "out", "podref": "team/outside"},
                "x": {"id": "bad", "podref": "team/bad"}
            }}
        });
        let mut got = pool_holders(&pool);
        got.sort();
        assert_eq!(
            got,
            vec![
                ("198.19.1.100".parse().unwrap(), "IPPool kube-system/pool-a (pod team/web-0)".to_string()),
                ("198.19.1.111".parse().unwrap(), "IPPool kube-system/pool-a (pod team/web-1)".to_string()),
            ]
        );
        let v6 = serde_json::json!({
            "metadata": {"name": "p6", "namespace": "ns"},
            "spec": {"range": "2001:db8::/64", "allocations": {"256": {"id": "c", "podref": "ns/p"}}}
        });
        assert_eq!(pool_holders(&v6)[0].0, "2001:db8::100".parse::<IpAddr>().unwrap());
        assert!(pool_holders(&serde_json::json!({"spec": {"range": "nonsense"}})).is_empty());
    }

    #[test]
    fn claims_hold_their_status_ips() {
        let claim = serde_json::json!({
            "metadata": {"name": "vm-a.net1", "namespace": "vms"},
            "status": {"ips": ["198.19.1.101/24", "2001:db8::5", "junk"], "ownerPod": {"name": "virt-launcher-a"}}
        });
        let got = claim_holders(&claim);
        assert_eq!(got.len(), 2);
        assert_eq!(
            got[0],
            ("198.19.1.101".parse().unwrap(), "IPAMClaim vms/vm-a.net1 (pod vms/virt-launcher-a)".into())
        );
        assert_eq!(got[1].0, "2001:db8::5".parse::<IpAddr>().unwrap());
        assert!(claim_holders(&serde_json::json!({"metadata": {"name": "pending"}, "spec": {}})).is_empty());
    }
}
