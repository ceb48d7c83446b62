//! CloudPrivateIPConfig (`--egress-ip-mode cloud` and `cloud-local`).
//!
//! Leader (both modes): one CloudPrivateIPConfig per placed egress IP — named by the IP
//! ([`cloud_private_ip_name`]), annotated with its EgressIP ([`CLOUD_OWNER_ANNOTATION`]),
//! `spec.node` = the node the plan chose; a move changes `spec.node`, an IP no longer
//! placed has its config deleted. An item is published in the EgressIP only once its
//! config reports `status.node == spec.node` and `Assigned=True`, so a node hosts the IP
//! only after the cloud (or the local controller) assigned it.
//!
//! Node (`cloud-local`: egressd is the controller, the reference provider for bare
//! metal): the compile step hosts the IP of a config naming this node while no other
//! node holds it; this task then adds the finalizer, reports `Assigned` True
//! (`CloudResponseSuccess`) or False (`CloudResponseError`, with the reason), clears
//! `status.node` once a config that moved away is released here (`CloudResponsePending`,
//! "Moving IP address"), and removes the finalizer of a deleted config once the IP is
//! gone from this node. The leader stands in for nodes that cannot: it clears
//! `status.node` (or the finalizer) of a config held by a node that is gone, NotReady
//! or unreachable, and reports a `spec.node` that names no node
//! (`Target node "X" does not exist`).
//!
//! A provider for a real cloud (AWS, Azure, GCP) would replace the node part only: see
//! docs/design/kubernetes.md for the plan.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use kube::Client;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use super::Reach;
use crate::api::Kind;
use crate::view::policy::{CLOUD_FINALIZER, CLOUD_OWNER_ANNOTATION, CloudPrivateIp, cloud_private_ip_name};

/// The reasons of the reference's controller.
pub(crate) const PENDING: &str = "CloudResponsePending";
pub(crate) const SUCCESS: &str = "CloudResponseSuccess";
pub(crate) const ERROR: &str = "CloudResponseError";

/// The planner's input items in the cloud modes: an IP whose config asks for a node
/// counts as placed there (first, before `status.items`: it is the latest decision),
/// so the plan does not change its mind while the cloud works.
pub(crate) fn pending_items(
    name: &str,
    ips: &[IpAddr],
    items: &[(IpAddr, String)],
    configs: &BTreeMap<IpAddr, CloudPrivateIp>,
) -> Vec<(IpAddr, String)> {
    let mut out: Vec<(IpAddr, String)> = configs
        .values()
        .filter(|c| c.owner.as_deref() == Some(name) && ips.contains(&c.ip) && !c.deleting && !c.failed())
        .filter_map(|c| c.node.clone().map(|n| (c.ip, n)))
        .collect();
    out.extend(items.iter().cloned());
    out
}

/// The items to publish: the planned ones whose config is assigned to that node.
pub(crate) fn published(
    planned: &[(IpAddr, String)],
    configs: &BTreeMap<IpAddr, CloudPrivateIp>,
) -> Vec<(IpAddr, String)> {
    planned.iter().filter(|(ip, n)| configs.get(ip).is_some_and(|c| c.assigned_to(n))).cloned().collect()
}

/// One change the leader makes to the configs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ConfigChange {
    /// Create the config of an IP for (EgressIP, node).
    Create { ip: IpAddr, owner: String, node: String },
    /// Move it: `spec.node`.
    Move { ip: IpAddr, node: String },
    /// Delete it (the IP is no longer placed).
    Delete { ip: IpAddr },
}

/// What the leader changes so the configs match the plan (`want`: IP → (EgressIP, node)).
/// Only configs egressd created (they carry the owner annotation) are deleted.
pub(crate) fn config_changes(
    want: &BTreeMap<IpAddr, (String, String)>,
    configs: &BTreeMap<IpAddr, CloudPrivateIp>,
) -> Vec<ConfigChange> {
    let mut out = Vec::new();
    for (ip, (owner, node)) in want {
        match configs.get(ip) {
            None => out.push(ConfigChange::Create { ip: *ip, owner: owner.clone(), node: node.clone() }),
            Some(c) if c.deleting => {}
            Some(c) if c.node.as_deref() != Some(node.as_str()) => {
                out.push(ConfigChange::Move { ip: *ip, node: node.clone() });
            }
            Some(_) => {}
        }
    }
    for c in configs.values() {
        if c.owner.is_some() && !c.deleting && !want.contains_key(&c.ip) {
            out.push(ConfigChange::Delete { ip: c.ip });
        }
    }
    out
}

/// A status write of one config (what it should say now).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ConfigStatus {
    /// `status.node` (`None`: removed).
    pub node: Option<String>,
    /// `Assigned` condition status.
    pub status: &'static str,
    /// Reason.
    pub reason: &'static str,
    /// Message.
    pub message: String,
}

impl ConfigStatus {
    /// Whether the config says this already.
    pub(crate) fn matches(&self, c: &CloudPrivateIp) -> bool {
        c.status_node == self.node
            && c.assigned.as_ref().is_some_and(|(s, r, m)| s == self.status && r == self.reason && *m == self.message)
    }
}

/// What a controller decides for one config: its new status, and the finalizer
/// (`Some(true)` add, `Some(false)` remove).
pub(crate) type Action = (Option<ConfigStatus>, Option<bool>);

/// A CloudPrivateIPConfig controller ("provider"): its decision for one config on a node
/// (every agent) and on the leader. [`LocalProvider`] (`cloud-local`) hosts IPs on the
/// nodes' own links; a cloud provider (AWS, Azure, GCP: plan in docs/design/kubernetes.md) would
/// do nothing on nodes and call its cloud's API from the leader.
pub(crate) trait Provider {
    /// On node `me`: `hosted`, the IP is on this node now; `problem`, why this node
    /// cannot host it.
    fn on_node(&self, me: &str, c: &CloudPrivateIp, hosted: bool, problem: Option<&str>) -> Action;
    /// On the leader: `node_ok(n)` is `None` for an unknown node, `Some(false)` for one
    /// that is NotReady or unreachable.
    fn on_leader(&self, c: &CloudPrivateIp, node_ok: &dyn Fn(&str) -> Option<bool>) -> Action;
}

/// egressd as the controller, for bare metal (`cloud-local`).
pub(crate) struct LocalProvider;

impl Provider for LocalProvider {
    fn on_node(&self, me: &str, c: &CloudPrivateIp, hosted: bool, problem: Option<&str>) -> Action {
        node_action(me, c, hosted, problem)
    }

    fn on_leader(&self, c: &CloudPrivateIp, node_ok: &dyn Fn(&str) -> Option<bool>) -> Action {
        leader_action(c, node_ok)
    }
}

/// What this node (the controller, `cloud-local`) does with one config: its status, and
/// the finalizer (`Some(true)` add, `Some(false)` remove). `hosted`: the IP is on this
/// node now (the last sync succeeded with it); `problem`: why the compile step could not
/// host it here.
fn node_action(me: &str, c: &CloudPrivateIp, hosted: bool, problem: Option<&str>) -> Action {
    let mine_now = c.status_node.as_deref() == Some(me);
    if c.deleting {
        let holder = mine_now || (c.status_node.is_none() && c.node.as_deref() == Some(me));
        return (None, (holder && c.finalizer && !hosted).then_some(false));
    }
    if c.node.as_deref() == Some(me) && c.status_node.as_deref().is_none_or(|n| n == me) {
        let finalizer = (!c.finalizer).then_some(true);
        let status = if let Some(p) = problem {
            Some(ConfigStatus { node: None, status: "False", reason: ERROR, message: p.to_string() })
        } else if hosted {
            Some(ConfigStatus {
                node: Some(me.to_string()),
                status: "True",
                reason: SUCCESS,
                message: "IP address successfully added".into(),
            })
        } else {
            None
        };
        return (status.filter(|s| !s.matches(c)), finalizer);
    }
    if mine_now && !hosted {
        // Moved away (or unassigned): released here.
        let s = ConfigStatus { node: None, status: "Unknown", reason: PENDING, message: "Moving IP address".into() };
        return ((!s.matches(c)).then_some(s), None);
    }
    (None, None)
}

/// What the leader does for nodes that cannot act (`cloud-local`): a config held by a
/// node that is gone, NotReady or unreachable is released on its behalf; a `spec.node`
/// naming no node is an error.
fn leader_action(c: &CloudPrivateIp, node_ok: &dyn Fn(&str) -> Option<bool>) -> Action {
    if let Some(holder) = &c.status_node
        && node_ok(holder) != Some(true)
    {
        if c.deleting {
            return (None, c.finalizer.then_some(false));
        }
        if c.node.as_deref() != Some(holder.as_str()) {
            let s =
                ConfigStatus { node: None, status: "Unknown", reason: PENDING, message: "Moving IP address".into() };
            return ((!s.matches(c)).then_some(s), None);
        }
    }
    if let Some(n) = &c.node
        && node_ok(n).is_none()
        && !c.deleting
    {
        let s = ConfigStatus {
            node: None,
            status: "False",
            reason: ERROR,
            message: format!("Target node {n:?} does not exist"),
        };
        return ((!s.matches(c)).then_some(s), None);
    }
    if c.deleting
        && c.status_node.is_none()
        && c.finalizer
        && c.node.as_deref().is_none_or(|n| node_ok(n) != Some(true))
    {
        return (None, Some(false));
    }
    (None, None)
}

/// Whether a node can act for its configs: `None` unknown node, `Some(false)` NotReady
/// or unreachable.
pub(crate) fn node_ok(
    nodes: &BTreeMap<String, crate::view::NodeInfo>,
    reach: &BTreeMap<String, Reach>,
    n: &str,
) -> Option<bool> {
    nodes.get(n).map(|info| info.ready && reach.get(n).copied() != Some(Reach::Down))
}

fn api(client: &Client) -> Api<DynamicObject> {
    Api::all_with(client.clone(), &Kind::CloudPrivateIPConfig.api_resource())
}

/// Apply one leader change.
pub(crate) async fn apply_change(client: &Client, change: &ConfigChange) -> Result<(), kube::Error> {
    let api = api(client);
    match change {
        ConfigChange::Create { ip, owner, node } => {
            let name = cloud_private_ip_name(*ip);
            let obj: DynamicObject = serde_json::from_value(json!({
                "apiVersion": Kind::CloudPrivateIPConfig.api_version(),
                "kind": "CloudPrivateIPConfig",
                "metadata": { "name": name, "annotations": { CLOUD_OWNER_ANNOTATION: owner } },
                "spec": { "node": node },
            }))
            .map_err(kube::Error::SerdeError)?;
            api.create(&PostParams::default(), &obj).await.map(drop)
        }
        ConfigChange::Move { ip, node } => {
            let patch = json!({ "spec": { "node": node } });
            api.patch(&cloud_private_ip_name(*ip), &PatchParams::default(), &Patch::Merge(&patch)).await.map(drop)
        }
        ConfigChange::Delete { ip } => {
            api.delete(&cloud_private_ip_name(*ip), &DeleteParams::default()).await.map(drop)
        }
    }
}

/// Write a config's status (status subresource, merge patch).
pub(crate) async fn write_status(client: &Client, ip: IpAddr, s: &ConfigStatus) -> Result<(), kube::Error> {
    let now = jiff::Timestamp::now().round(jiff::Unit::Second).unwrap_or_else(|_| jiff::Timestamp::now()).to_string();
    let patch = json!({ "status": {
        "node": s.node,
        "conditions": [{
            "type": "Assigned", "status": s.status, "reason": s.reason, "message": s.message,
            "lastTransitionTime": now,
        }],
    } });
    api(client).patch_status(&cloud_private_ip_name(ip), &PatchParams::default(), &Patch::Merge(&patch)).await.map(drop)
}

/// Add (`true`) or remove the finalizer, keeping the others (read, then a merge patch
/// carrying the `resourceVersion` read: a concurrent change makes it fail and retry).
pub(crate) async fn set_finalizer(client: &Client, ip: IpAddr, add: bool) -> Result<(), kube::Error> {
    let api = api(client);
    let name = cloud_private_ip_name(ip);
    let Some(obj) = api.get_opt(&name).await? else { return Ok(()) };
    let mut list: Vec<String> = obj.metadata.finalizers.clone().unwrap_or_default();
    let has = list.iter().any(|f| f == CLOUD_FINALIZER);
    if has == add {
        return Ok(());
    }
    if add {
        list.push(CLOUD_FINALIZER.to_string());
    } else {
        list.retain(|f| f != CLOUD_FINALIZER);
    }
    let patch = json!({ "metadata": { "finalizers": list, "resourceVersion": obj.metadata.resource_version } });
    api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await.map(drop)
}

/// Writes done and not yet seen, so they are not repeated while the echo is on its way:
/// key → until.
#[derive(Debug, Default)]
pub(crate) struct Pending(BTreeMap<String, Instant>);

impl Pending {
    /// Whether `key` may be sent now; if so it is held for `hold`.
    pub(crate) fn take(&mut self, key: String, hold: Duration) -> bool {
        let now = Instant::now();
        self.0.retain(|_, until| now < *until);
        if self.0.contains_key(&key) {
            return false;
        }
        self.0.insert(key, now + hold);
        true
    }

    /// Forget everything (leadership lost).
    pub(crate) fn clear(&mut self) {
        self.0.clear();
    }
}

/// A stable key of a value for [`Pending`].
pub(crate) fn key(ip: IpAddr, what: &str, value: &Value) -> String {
    format!("{ip} {what} {value}")
}

/// The configs by IP.
pub(crate) fn by_ip(configs: &[CloudPrivateIp]) -> BTreeMap<IpAddr, CloudPrivateIp> {
    configs.iter().map(|c| (c.ip, c.clone())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(ip: &str, node: Option<&str>, status_node: Option<&str>, assigned: Option<(&str, &str)>) -> CloudPrivateIp {
        CloudPrivateIp {
            ip: ip.parse().unwrap(),
            node: node.map(String::from),
            status_node: status_node.map(String::from),
            assigned: assigned.map(|(s, r)| (s.into(), r.into(), String::new())),
            deleting: false,
            finalizer: true,
            owner: Some("e1".into()),
        }
    }

    #[test]
    fn the_ipv6_name_is_fully_expanded_with_dots_and_reads_back() {
        let ip: IpAddr = "2001:db8:ff::54".parse().unwrap();
        assert_eq!(cloud_private_ip_name(ip), "2001.0db8.00ff.0000.0000.0000.0000.0054");
        assert_eq!(crate::view::policy::cloud_private_ip_from_name(&cloud_private_ip_name(ip)), Some(ip));
        assert_eq!(cloud_private_ip_name("198.19.0.100".parse().unwrap()), "198.19.0.100");
    }

    #[test]
    fn items_are_published_only_once_assigned_and_pending_configs_hold_the_plan() {
        let ip: IpAddr = "198.19.0.100".parse().unwrap();
        let mut configs = BTreeMap::from([(ip, cfg("198.19.0.100", Some("b"), None, None))]);
        let planned = vec![(ip, "b".to_string())];
        assert!(published(&planned, &configs).is_empty(), "not assigned yet");
        assert_eq!(pending_items("e1", &[ip], &[], &configs), planned, "the request counts for the plan");
        configs.insert(ip, cfg("198.19.0.100", Some("b"), Some("b"), Some(("True", SUCCESS))));
        assert_eq!(published(&planned, &configs), planned);
        // An error does not hold the plan.
        configs.insert(ip, cfg("198.19.0.100", Some("b"), None, Some(("False", ERROR))));
        assert!(pending_items("e1", &[ip], &[], &configs).is_empty());
    }

    #[test]
    fn configs_follow_the_plan_and_only_owned_ones_are_deleted() {
        let a: IpAddr = "198.19.0.100".parse().unwrap();
        let b: IpAddr = "198.19.0.101".parse().unwrap();
        let c: IpAddr = "198.19.0.102".parse().unwrap();
        let mut foreign = cfg("198.19.0.102", Some("x"), None, None);
        foreign.owner = None;
        let configs = BTreeMap::from([(b, cfg("198.19.0.101", Some("n1"), None, None)), (c, foreign)]);
        let want = BTreeMap::from([(a, ("e1".to_string(), "n1".to_string()))]);
        assert_eq!(
            config_changes(&want, &configs),
            vec![ConfigChange::Create { ip: a, owner: "e1".into(), node: "n1".into() }, ConfigChange::Delete { ip: b }]
        );
        let want = BTreeMap::from([(b, ("e1".to_string(), "n2".to_string()))]);
        assert_eq!(config_changes(&want, &configs), vec![ConfigChange::Move { ip: b, node: "n2".into() }]);
    }

    #[test]
    fn the_node_adds_reports_releases_and_lets_go_of_deleted_configs() {
        // Asked to host, finalizer missing, not hosted yet: finalizer first, no status.
        let mut c = cfg("198.19.0.100", Some("b"), None, None);
        c.finalizer = false;
        assert_eq!(node_action("b", &c, false, None), (None, Some(true)));
        // Hosted: success.
        let (s, f) = node_action("b", &cfg("198.19.0.100", Some("b"), None, None), true, None);
        assert_eq!(f, None);
        let s = s.unwrap();
        assert_eq!((s.node.as_deref(), s.status, s.reason), (Some("b"), "True", SUCCESS));
        // Already reported: nothing.
        let mut done = cfg("198.19.0.100", Some("b"), Some("b"), None);
        done.assigned = Some(("True".into(), SUCCESS.into(), "IP address successfully added".into()));
        assert_eq!(node_action("b", &done, true, None), (None, None));
        // Cannot host: error with the reason.
        let (s, _) = node_action("b", &cfg("198.19.0.100", Some("b"), None, None), false, Some("no up link"));
        assert_eq!(s.unwrap().reason, ERROR);
        // Moved to c while b holds it: b releases, then clears status.node.
        let moving = cfg("198.19.0.100", Some("c"), Some("b"), Some(("True", SUCCESS)));
        assert_eq!(node_action("b", &moving, true, None), (None, None), "still hosted: wait");
        let (s, _) = node_action("b", &moving, false, None);
        assert_eq!(s.unwrap().node, None);
        // ... and c waits while b holds it.
        assert_eq!(node_action("c", &moving, false, None), (None, None));
        // Deleted: the holder removes the finalizer once the IP is gone.
        let mut del = cfg("198.19.0.100", Some("b"), Some("b"), Some(("True", SUCCESS)));
        del.deleting = true;
        assert_eq!(node_action("b", &del, true, None), (None, None));
        assert_eq!(node_action("b", &del, false, None), (None, Some(false)));
        assert_eq!(node_action("c", &del, false, None), (None, None));
    }

    #[test]
    fn the_leader_stands_in_for_dead_nodes_and_reports_unknown_ones() {
        let nodes_ok = |n: &str| match n {
            "b" => Some(true),
            "dead" => Some(false),
            _ => None,
        };
        let held_by_dead = cfg("198.19.0.100", Some("b"), Some("dead"), Some(("True", SUCCESS)));
        let (s, _) = leader_action(&held_by_dead, &nodes_ok);
        assert_eq!(s.unwrap().node, None, "released on the dead node's behalf");
        let (s, _) = leader_action(&cfg("198.19.0.100", Some("nowhere"), None, None), &nodes_ok);
        assert_eq!(s.unwrap().message, "Target node \"nowhere\" does not exist");
        let mut del = held_by_dead.clone();
        del.deleting = true;
        assert_eq!(leader_action(&del, &nodes_ok), (None, Some(false)));
        assert_eq!(leader_action(&cfg("198.19.0.100", Some("b"), Some("b"), None), &nodes_ok), (None, None));
    }
}
