//! The Kubernetes status writer.
//!
//! Per node (every agent):
//! * EgressFirewall: `status.messages` gets `<node>: EgressFirewall Rules applied` (or
//!   `... not correctly applied: <reason>`), by server-side apply with field manager
//!   `egressd-<node>`; `messages` is a list-type set, so each node owns its own entry.
//! * EgressQoS: condition `Ready-In-Zone-<node>` (list-type map keyed by `type`),
//!   `lastTransitionTime` kept while the condition's status stays the same.
//!
//! Leader only ([`crate::leader::Leadership`], checked right before each write):
//! * aggregate `status.status`: `... Rules applied` once every Ready node reports success
//!   (egressd runs on every node, as a DaemonSet with tolerations for all), `... Rules
//!   not correctly applied` as soon as one reports a failure;
//! * entries of nodes that no longer exist are removed (applying an empty list as that
//!   node's field manager);
//! * an Event (type Warning) for every rejected object, once per distinct error.
//!
//! Writes happen only when the object's stored status differs from what would be written
//! (a restart does not rewrite every object), are coalesced (the latest state wins) and
//! paced. On a CRD without a status subresource, the main resource is patched instead.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use kube::Client;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tokio::sync::watch;

use super::StatusSink;
use crate::api::{Kind, ObjectKey};
use crate::compile::{
    Desired, FIREWALL_APPLIED as EF_APPLIED, FIREWALL_NOT_APPLIED as EF_NOT_APPLIED, Outcome, QOS_APPLIED,
    QOS_NOT_APPLIED, condition_node, parse_message,
};
use crate::leader::Leadership;
use crate::view::ClusterView;
use crate::view::observed::{Observed, StatusBoard};

/// One server-side apply of a status.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct StatusWrite {
    /// The object.
    pub key: ObjectKey,
    /// The field manager.
    pub manager: String,
    /// The `status` to apply.
    pub status: Value,
    /// Take the fields from other managers (every write but a node's "applied" on a
    /// CRD without per-node messages, see [`Shapes`]).
    pub force: bool,
}

struct Snapshot {
    view: ClusterView,
    desired: Desired,
}

/// Which status fields this cluster's CRDs keep. OpenShift 4.13's CRDs (the seeds' API
/// reference) have only `status.status` for EgressFirewall and no status fields for
/// EgressQoS; newer ones add the per-node `messages` and `conditions`. A field the CRD
/// does not know is pruned silently by the API server, so the writer finds out from the
/// object a write returns, and then:
/// * EgressFirewall without `messages`: every node applies the aggregate
///   `status.status` itself (its own field manager): "applied" without force — nodes
///   agreeing share the field —, "not correctly applied" with force, so one failing node
///   wins, and the field returns to "applied" only once every failing node has
///   recovered (a recovering node cannot take the field back from another failing one);
/// * EgressQoS without `conditions`: nothing is written (nothing would be kept).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Shapes {
    /// Kinds whose CRD pruned the per-node field.
    pub legacy: BTreeSet<Kind>,
}

impl Shapes {
    /// `kind`'s CRD has no per-node status field (logged once).
    fn learn(&mut self, kind: Kind) {
        if self.legacy.insert(kind) {
            let then = if kind == Kind::EgressFirewall {
                "each node writes status.status itself"
            } else {
                "no status is written"
            };
            tracing::info!(kind = %kind, "this cluster's {kind} CRD has no per-node status field (OpenShift 4.13 shape): {then}");
        }
    }
}

/// Sends each applied state to the writer task.
pub struct KubeStatusWriter {
    tx: watch::Sender<Option<Arc<Snapshot>>>,
}

impl KubeStatusWriter {
    /// Start the writer task for node `node`; `board` is what the API stores (the
    /// Kubernetes source keeps it up to date).
    pub fn start(client: Client, node: String, leadership: Leadership, board: StatusBoard) -> Self {
        let (tx, rx) = watch::channel(None);
        let span = tracing::info_span!("status_writer", node = %node);
        tokio::spawn(tracing::Instrument::instrument(writer_task(client, node, leadership, rx, board), span));
        Self { tx }
    }
}

/// What the API stores, by object.
pub(crate) type ObservedObjects = BTreeMap<ObjectKey, Observed>;

fn stored<'a>(observed: &'a ObservedObjects, key: &ObjectKey) -> Option<&'a Value> {
    observed.get(key).and_then(|o| o.status.as_ref())
}

/// The writes done, so that the same write is not repeated while nothing changed. An
/// entry counts only for the same object (`uid`: a deleted and re-created object is
/// written again) whose stored status is still what it was when written (anyone
/// changing it — the echo of the write included — makes the writer look again, and it
/// writes only what differs).
#[derive(Debug, Default)]
pub(crate) struct WriteLog {
    done: BTreeMap<(ObjectKey, String), (Observed, Value)>,
}

impl WriteLog {
    /// Whether `w` must be sent, given what is stored now.
    pub(crate) fn needed(&self, w: &StatusWrite, observed: &ObservedObjects) -> bool {
        let now = observed.get(&w.key).cloned().unwrap_or_default();
        self.done.get(&(w.key.clone(), w.manager.clone())) != Some(&(now, w.status.clone()))
    }

    /// `w` was written while `observed` was stored.
    pub(crate) fn record(&mut self, w: StatusWrite, observed: &ObservedObjects) {
        let now = observed.get(&w.key).cloned().unwrap_or_default();
        self.done.insert((w.key, w.manager), (now, w.status));
    }

    /// Forget objects that are gone.
    pub(crate) fn retain_present(&mut self, observed: &ObservedObjects) {
        self.done.retain(|(k, _), _| observed.contains_key(k));
    }
}

impl StatusSink for KubeStatusWriter {
    fn applied(&mut self, view: &ClusterView, desired: &Desired, _: Option<&crate::net::HostLinks>) {
        let _ = self.tx.send(Some(Arc::new(Snapshot { view: view.clone(), desired: desired.clone() })));
    }
}

/// The API server's limit on a field manager's name and on an Event's
/// `reportingInstance`.
const NAME_LIMIT: usize = 128;

/// `name` if it fits in `limit` bytes, else as much of it as fits before `-` and 16 hex
/// digits of its SHA-256 (distinct names stay distinct, the same name maps the same way
/// on every node).
fn bounded(name: &str, limit: usize) -> String {
    use sha2::{Digest, Sha256};
    if name.len() <= limit {
        return name.to_string();
    }
    let hash: String = Sha256::digest(name.as_bytes()).iter().take(8).map(|b| format!("{b:02x}")).collect();
    let mut keep = limit - hash.len() - 1;
    while !name.is_char_boundary(keep) {
        keep -= 1;
    }
    format!("{}-{hash}", &name[..keep])
}

/// The field manager of `node`'s status entries (every node computes the same name, so
/// the leader can remove a deleted node's entries by it).
fn manager(node: &str) -> String {
    bounded(&format!("egressd-{node}"), NAME_LIMIT)
}

fn messages(api_status: Option<&Value>) -> Vec<String> {
    api_status
        .and_then(|s| s.get("messages"))
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).map(String::from).collect())
        .unwrap_or_default()
}

fn conditions(api_status: Option<&Value>) -> Vec<Value> {
    api_status.and_then(|s| s.get("conditions")).and_then(Value::as_array).cloned().unwrap_or_default()
}

/// What this node writes: its own EgressFirewall message and EgressQoS condition, where
/// the stored status differs.
pub(crate) fn node_writes(
    node: &str,
    observed: &ObservedObjects,
    desired: &Desired,
    now: &str,
    shapes: &Shapes,
) -> Vec<StatusWrite> {
    let mut out = Vec::new();
    for s in &desired.statuses {
        let stored = stored(observed, &s.key);
        let legacy = shapes.legacy.contains(&s.key.kind);
        match s.key.kind {
            Kind::EgressFirewall if legacy => {
                if matches!(s.outcome, Outcome::Ignored(_)) {
                    continue;
                }
                let failed = matches!(s.outcome, Outcome::Failed(_));
                let text = if failed { EF_NOT_APPLIED } else { EF_APPLIED };
                if stored.and_then(|v| v.get("status")).and_then(Value::as_str) != Some(text) {
                    out.push(StatusWrite {
                        key: s.key.clone(),
                        manager: manager(node),
                        status: json!({ "status": text }),
                        force: failed,
                    });
                }
            }
            Kind::EgressQoS if legacy => {}
            Kind::EgressFirewall
                if !matches!(s.outcome, Outcome::Ignored(_)) && !messages(stored).contains(&s.message()) =>
            {
                out.push(StatusWrite {
                    key: s.key.clone(),
                    manager: manager(node),
                    status: json!({ "messages": [s.message()] }),
                    force: true,
                });
            }
            Kind::EgressQoS => {
                let Some(c) = s.condition() else { continue };
                let existing = conditions(stored).into_iter().find(|v| v["type"] == c.type_.as_str());
                let same = existing.as_ref().is_some_and(|v| {
                    v["status"] == c.status.as_str()
                        && v["reason"] == c.reason.as_str()
                        && v["message"] == c.message.as_str()
                });
                if same {
                    continue;
                }
                let since = existing
                    .as_ref()
                    .filter(|v| v["status"] == c.status.as_str())
                    .and_then(|v| v["lastTransitionTime"].as_str().map(String::from))
                    .unwrap_or_else(|| now.to_string());
                out.push(StatusWrite {
                    key: s.key.clone(),
                    manager: manager(node),
                    status: json!({ "conditions": [{
                        "type": c.type_, "status": c.status, "reason": c.reason,
                        "message": c.message, "lastTransitionTime": since,
                    }] }),
                    force: true,
                });
            }
            _ => {}
        }
    }
    out
}

/// What the leader writes: aggregates and removal of deleted nodes' entries.
pub(crate) fn leader_writes(view: &ClusterView, observed: &ObservedObjects, shapes: &Shapes) -> Vec<StatusWrite> {
    let mut out = Vec::new();
    let ready: BTreeSet<&str> = view.nodes.iter().filter(|(_, n)| n.ready).map(|(n, _)| n.as_str()).collect();
    let exists = |n: &str| view.nodes.contains_key(n);
    let firewalls = view.firewalls.values().filter(|_| !shapes.legacy.contains(&Kind::EgressFirewall));
    for entry in firewalls {
        let stored = stored(observed, &entry.key);
        let msgs = messages(stored);
        // Each node's entry, read back in the one place that also renders it.
        let entries: Vec<(&str, bool)> = msgs.iter().filter_map(|m| parse_message(m)).collect();
        let gone: BTreeSet<&str> = entries.iter().map(|(n, _)| *n).filter(|n| !exists(n)).collect();
        for n in gone {
            out.push(StatusWrite {
                key: entry.key.clone(),
                manager: manager(n),
                status: json!({ "messages": [] }),
                force: true,
            });
        }
        let live: Vec<&(&str, bool)> = entries.iter().filter(|(n, _)| exists(n)).collect();
        let reported: BTreeSet<&str> = live.iter().map(|(n, _)| *n).collect();
        let failed = live.iter().any(|(_, applied)| !applied);
        let complete = !ready.is_empty() && ready.iter().all(|n| reported.contains(n));
        out.extend(aggregate_write(&entry.key, stored, failed, complete, (EF_APPLIED, EF_NOT_APPLIED)));
    }
    for entry in view.qos.values().filter(|_| !shapes.legacy.contains(&Kind::EgressQoS)) {
        let stored = stored(observed, &entry.key);
        let conds = conditions(stored);
        let zone = |c: &Value| c["type"].as_str().and_then(condition_node).map(String::from);
        let mut reported = BTreeSet::new();
        let mut failed = false;
        for c in &conds {
            let Some(n) = zone(c) else { continue };
            if !exists(&n) {
                out.push(StatusWrite {
                    key: entry.key.clone(),
                    manager: manager(&n),
                    status: json!({ "conditions": [] }),
                    force: true,
                });
                continue;
            }
            failed |= c["status"] == "False";
            reported.insert(n);
        }
        let complete = !ready.is_empty() && ready.iter().all(|n| reported.contains(*n));
        out.extend(aggregate_write(&entry.key, stored, failed, complete, (QOS_APPLIED, QOS_NOT_APPLIED)));
    }
    out
}

/// The leader's aggregate `status.status` of one object: "not correctly applied" as soon
/// as one node failed, "applied" once every Ready node reported; written only when the
/// stored value differs. `texts` are (applied, not applied).
fn aggregate_write(
    key: &ObjectKey,
    stored: Option<&Value>,
    failed: bool,
    complete: bool,
    texts: (&str, &str),
) -> Option<StatusWrite> {
    let aggregate = if failed {
        texts.1
    } else if complete {
        texts.0
    } else {
        return None;
    };
    (stored.and_then(|s| s.get("status")).and_then(Value::as_str) != Some(aggregate)).then(|| StatusWrite {
        key: key.clone(),
        manager: "egressd-leader".into(),
        status: json!({ "status": aggregate }),
        force: true,
    })
}

/// Rejected objects (leader only): (object, error).
fn rejections(view: &ClusterView) -> Vec<(ObjectKey, String)> {
    let mut out: Vec<(ObjectKey, String)> = Vec::new();
    out.extend(view.firewalls.values().filter_map(|e| e.error.clone().map(|m| (e.key.clone(), m))));
    out.extend(view.qos.values().filter_map(|e| e.error.clone().map(|m| (e.key.clone(), m))));
    out.extend(
        view.egress_ips
            .values()
            .filter_map(|e| e.error.as_deref().map(|m| (e.key.clone(), egress_ip_event(&e.key.name, m)))),
    );
    out.extend(view.cloud_ips.values().filter_map(|e| e.error.clone().map(|m| (e.key.clone(), m))));
    out
}

/// The `InvalidEgressIP` Event's message: the reference's wording for an address that
/// does not parse, the error itself otherwise.
fn egress_ip_event(name: &str, error: &str) -> String {
    match error
        .strip_prefix("spec.egressIPs: unable to parse provided EgressIP: ")
        .and_then(|rest| rest.strip_suffix(", invalid"))
    {
        Some(ip) => format!("egress IP: {ip} for object EgressIP: {name} is not a valid IP address"),
        None => error.to_string(),
    }
}

/// EgressIP objects this node failed to apply for reasons of its own (not invalidity,
/// which the leader reports).
fn node_problems(desired: &Desired) -> Vec<(ObjectKey, String)> {
    desired
        .statuses
        .iter()
        .filter(|s| s.key.kind == Kind::EgressIP && matches!(s.outcome, Outcome::Failed(_)) && !s.cluster_only)
        .map(|s| (s.key.clone(), s.message()))
        .collect()
}

/// Apply `w`; returns the object's `status` as the API server stored it.
async fn apply_status(client: &Client, w: &StatusWrite) -> Result<Option<Value>, kube::Error> {
    let ar = w.key.kind.api_resource();
    let api: Api<DynamicObject> = if w.key.kind.namespaced() {
        Api::namespaced_with(client.clone(), &w.key.namespace, &ar)
    } else {
        Api::all_with(client.clone(), &ar)
    };
    let mut metadata = json!({ "name": w.key.name });
    if w.key.kind.namespaced() {
        metadata["namespace"] = json!(w.key.namespace);
    }
    let body = json!({
        "apiVersion": w.key.kind.api_version(), "kind": w.key.kind.as_str(),
        "metadata": metadata, "status": w.status,
    });
    let pp = if w.force { PatchParams::apply(&w.manager).force() } else { PatchParams::apply(&w.manager) };
    let stored = |o: DynamicObject| o.data.get("status").cloned();
    match api.patch_status(&w.key.name, &pp, &Patch::Apply(&body)).await {
        Ok(o) => Ok(stored(o)),
        // No status subresource on this cluster's CRD: status is part of the object.
        Err(kube::Error::Api(e)) if e.code == 404 => {
            api.patch(&w.key.name, &pp, &Patch::Apply(&body)).await.map(stored)
        }
        Err(e) => Err(e),
    }
}

/// The per-node field `w` wrote is missing from what the API server stored: the CRD
/// does not have it (pruned).
fn pruned(w: &StatusWrite, stored: Option<&Value>) -> Option<Kind> {
    let field = match w.key.kind {
        Kind::EgressFirewall => "messages",
        Kind::EgressQoS => "conditions",
        _ => return None,
    };
    let wrote = w.status.get(field)?.as_array()?;
    if wrote.is_empty() {
        return None;
    }
    let kept = stored.and_then(|s| s.get(field)).and_then(Value::as_array);
    (!kept.is_some_and(|k| wrote.iter().all(|v| k.contains(v)))).then_some(w.key.kind)
}

/// Why an Event is recorded: the object was rejected (leader), or this node could not
/// apply it (every node, for its own problems).
#[derive(Debug, Clone, Copy)]
enum EventKind {
    Invalid,
    NotApplied,
}

async fn emit_event(
    client: &Client,
    node: &str,
    key: &ObjectKey,
    message: &str,
    kind: EventKind,
) -> Result<(), kube::Error> {
    let (reason, action) = match kind {
        EventKind::Invalid => (format!("Invalid{}", key.kind), "Validate"),
        EventKind::NotApplied => (format!("{}NotApplied", key.kind), "Apply"),
    };
    record_event(client, node, key, &reason, action, message).await
}

/// Record a Warning Event about `key` (reported by `node`), with the reference's
/// `reason`.
pub(crate) async fn record_event(
    client: &Client,
    node: &str,
    key: &ObjectKey,
    reason: &str,
    action: &str,
    message: &str,
) -> Result<(), kube::Error> {
    let reason = reason.to_string();
    let ns = if key.namespace.is_empty() { "default" } else { key.namespace.as_str() };
    let now = jiff::Timestamp::now();
    let event = Event {
        metadata: ObjectMeta {
            generate_name: Some(format!("{}.", key.name)),
            namespace: Some(ns.into()),
            ..Default::default()
        },
        involved_object: ObjectReference {
            api_version: Some(key.kind.api_version().into()),
            kind: Some(key.kind.as_str().into()),
            name: Some(key.name.to_string()),
            namespace: (!key.namespace.is_empty()).then(|| key.namespace.to_string()),
            ..Default::default()
        },
        reason: Some(reason),
        message: Some(message.chars().take(1024).collect()),
        type_: Some("Warning".into()),
        source: Some(EventSource { component: Some("egressd".into()), host: Some(node.into()) }),
        first_timestamp: Some(Time(now)),
        last_timestamp: Some(Time(now)),
        // New-style fields only for namespaced objects: the API server's validation of
        // new-style Events wants the Event's namespace to be the object's, which a
        // cluster-scoped object (EgressIP) does not have.
        event_time: (!key.namespace.is_empty()).then_some(MicroTime(now)),
        reporting_component: Some("egressd".into()),
        reporting_instance: Some(bounded(node, NAME_LIMIT)),
        action: (!key.namespace.is_empty()).then(|| action.into()),
        count: Some(1),
        ..Default::default()
    };
    Api::<Event>::namespaced(client.clone(), ns).create(&PostParams::default(), &event).await.map(drop)
}

/// Events already recorded: (object, uid) → message; a re-created object gets its own.
type EventLog = BTreeMap<(ObjectKey, Option<String>), String>;

/// Record an Event for each (object, message) not recorded yet.
async fn emit_once(
    client: &Client,
    node: &str,
    done: &mut EventLog,
    items: Vec<(ObjectKey, String)>,
    kind: EventKind,
    observed: &ObservedObjects,
) {
    for (key, message) in items {
        let id = (key.clone(), observed.get(&key).and_then(|o| o.uid.clone()));
        if done.get(&id) == Some(&message) {
            continue;
        }
        match emit_event(client, node, &key, &message, kind).await {
            Ok(()) => {
                done.insert(id, message);
            }
            Err(e) => tracing::warn!(object = %key, error = %e, "event not recorded"),
        }
    }
}

async fn writer_task(
    client: Client,
    node: String,
    leadership: Leadership,
    mut rx: watch::Receiver<Option<Arc<Snapshot>>>,
    board: StatusBoard,
) {
    let mut log = WriteLog::default();
    let mut shapes = Shapes::default();
    let mut evented = EventLog::new();
    let mut node_evented = EventLog::new();
    let mut recheck = tokio::time::interval(Duration::from_secs(5));
    loop {
        tokio::select! {
            r = rx.changed() => if r.is_err() { return },
            _ = board.changed() => {}
            _ = recheck.tick() => {}
        }
        let Some(snap) = rx.borrow_and_update().clone() else { continue };
        let observed = board.snapshot();
        log.retain_present(&observed);
        let now =
            jiff::Timestamp::now().round(jiff::Unit::Second).unwrap_or_else(|_| jiff::Timestamp::now()).to_string();
        let mut writes = node_writes(&node, &observed, &snap.desired, &now, &shapes);
        if leadership.is_leader() {
            writes.extend(leader_writes(&snap.view, &observed, &shapes));
        }
        for w in writes {
            if !log.needed(&w, &observed) {
                continue;
            }
            if w.manager != manager(&node) && !leadership.is_leader() {
                continue;
            }
            match apply_status(&client, &w).await {
                Ok(stored) => {
                    tracing::debug!(object = %w.key, manager = %w.manager, "status written");
                    if let Some(kind) = pruned(&w, stored.as_ref()) {
                        shapes.learn(kind);
                    }
                    log.record(w, &observed);
                }
                // Older API servers refuse a field the schema lacks instead of pruning it.
                Err(kube::Error::Api(e))
                    if e.message.contains("field not declared in schema") && pruned(&w, None).is_some() =>
                {
                    shapes.learn(w.key.kind);
                }
                Err(kube::Error::Api(e)) if e.code == 409 && !w.force => {
                    tracing::debug!(object = %w.key, "status.status held by a node that failed; not taken");
                }
                Err(e) => tracing::warn!(object = %w.key, error = %e, "status write failed; will retry"),
            }
        }
        if leadership.is_leader() {
            let invalid = rejections(&snap.view);
            emit_once(&client, &node, &mut evented, invalid, EventKind::Invalid, &observed).await;
        }
        // This node's own EgressIP problems (conflicts, addresses it cannot host): the
        // object has no per-node status field, so an Event is where they show.
        let problems = node_problems(&snap.desired);
        emit_once(&client, &node, &mut node_evented, problems, EventKind::NotApplied, &observed).await;
        // Pace writes: at most one batch per 200 ms; later states replace earlier ones.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compile::ObjectStatus;
    use crate::nft::Table;
    use crate::view::{Entry, NodeInfo};

    fn key() -> ObjectKey {
        ObjectKey::new(Kind::EgressFirewall, "a", "default")
    }

    fn view(nodes: &[(&str, bool)]) -> ClusterView {
        let mut v = ClusterView::default();
        for (n, ready) in nodes {
            v.nodes.insert(n.to_string(), NodeInfo { ready: *ready, ..Default::default() });
        }
        v.firewalls.insert("a".into(), Entry { key: key(), policy: None, error: None });
        v
    }

    fn obs(uid: &str, stored: Option<Value>) -> ObservedObjects {
        BTreeMap::from([(key(), Observed { uid: Some(uid.into()), status: stored })])
    }

    /// n1 applied the EgressFirewall.
    fn desired() -> Desired {
        Desired {
            table: Table::new("egressd").into(),
            net: Default::default(),
            snoop: Default::default(),
            statuses: vec![ObjectStatus::new(key(), "n1", Outcome::Applied)],
            warnings: vec![],
        }
    }

    #[test]
    fn field_managers_of_long_node_names_fit_the_api_limit() {
        assert_eq!(manager("n1"), "egressd-n1");
        let long_a = format!("{}a", "x".repeat(252));
        let long_b = format!("{}b", "x".repeat(252));
        for name in [&long_a, &long_b] {
            let m = manager(name);
            assert_eq!(m.len(), NAME_LIMIT, "{m}");
            assert!(m.starts_with("egressd-xxx"), "{m}");
            assert_eq!(manager(name), m, "deterministic");
        }
        assert_ne!(manager(&long_a), manager(&long_b), "distinct names stay distinct");
        let exactly = "y".repeat(NAME_LIMIT - "egressd-".len());
        assert_eq!(manager(&exactly), format!("egressd-{exactly}"), "a name that fits is kept");
        assert_eq!(bounded(&"é".repeat(100), 20).len(), 19, "cut at a character boundary");
    }

    #[test]
    fn a_write_is_repeated_for_a_re_created_object_or_a_cleared_status_only() {
        let msg = "n1: EgressFirewall Rules applied";
        let mut log = WriteLog::default();
        let before = obs("u1", None);
        let w = node_writes("n1", &before, &desired(), "t", &Shapes::default()).remove(0);
        assert!(log.needed(&w, &before));
        log.record(w.clone(), &before);
        assert!(!log.needed(&w, &before), "the same write while nothing changed is not repeated");
        // The echo arrives: nothing to write any more.
        let echoed = obs("u1", Some(json!({"messages": [msg]})));
        assert!(node_writes("n1", &echoed, &desired(), "t", &Shapes::default()).is_empty());
        // The object is deleted and re-created with the same name: new uid, empty status.
        let recreated = obs("u2", None);
        let again = node_writes("n1", &recreated, &desired(), "t", &Shapes::default());
        assert_eq!(again, vec![w.clone()]);
        assert!(log.needed(&again[0], &recreated), "a re-created object gets this node's status again");
        // Someone clears the status of the same object after the echo: written again.
        log.record(w.clone(), &echoed);
        let cleared = obs("u1", Some(json!({"messages": []})));
        let w3 = node_writes("n1", &cleared, &desired(), "t", &Shapes::default());
        assert!(log.needed(&w3[0], &cleared));
        log.retain_present(&BTreeMap::new());
        assert!(log.done.is_empty(), "deleted objects are forgotten");
    }

    #[test]
    fn a_node_writes_only_what_the_api_does_not_have() {
        let msg = "n1: EgressFirewall Rules applied";
        let w = node_writes("n1", &obs("u1", None), &desired(), "t", &Shapes::default());
        assert_eq!(
            w,
            vec![StatusWrite {
                key: key(),
                manager: "egressd-n1".into(),
                status: json!({"messages": [msg]}),
                force: true
            }]
        );
        let stored = json!({"messages": [msg]});
        assert!(
            node_writes("n1", &obs("u1", Some(stored)), &desired(), "t", &Shapes::default()).is_empty(),
            "restart rewrites nothing"
        );
    }

    #[test]
    fn aggregate_waits_for_every_ready_node_and_fails_on_any_failure() {
        let ok = |n: &str| format!("{n}: EgressFirewall Rules applied");
        let one = json!({"messages": [ok("n1")]});
        assert!(
            leader_writes(&view(&[("n1", true), ("n2", true)]), &obs("u1", Some(one.clone())), &Shapes::default())
                .is_empty(),
            "n2 has not reported"
        );
        // n2 is not Ready: n1's report is enough.
        let w = leader_writes(&view(&[("n1", true), ("n2", false)]), &obs("u1", Some(one)), &Shapes::default());
        assert_eq!(w[0].status, json!({"status": EF_APPLIED}));
        let bad = json!({"messages": [ok("n1"), "n2: EgressFirewall Rules not correctly applied: x"]});
        let w = leader_writes(&view(&[("n1", true), ("n2", true)]), &obs("u1", Some(bad)), &Shapes::default());
        assert_eq!(w[0].status, json!({"status": EF_NOT_APPLIED}));
    }

    #[test]
    fn a_deleted_nodes_entry_is_removed_by_its_own_field_manager() {
        let stored = json!({"messages": ["gone: EgressFirewall Rules applied", "n1: EgressFirewall Rules applied"], "status": EF_APPLIED});
        let w = leader_writes(&view(&[("n1", true)]), &obs("u1", Some(stored)), &Shapes::default());
        assert_eq!(
            w,
            vec![StatusWrite {
                key: key(),
                manager: "egressd-gone".into(),
                status: json!({"messages": []}),
                force: true
            }]
        );
    }

    #[test]
    fn qos_condition_keeps_its_transition_time_while_unchanged() {
        let qkey = ObjectKey::new(Kind::EgressQoS, "a", "default");
        let v = BTreeMap::from([(
            qkey.clone(),
            Observed {
                uid: None,
                status: Some(
                    json!({"conditions": [{"type": "Ready-In-Zone-n1", "status": "True", "reason": "SetupSucceeded", "message": "old", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}),
                ),
            },
        )]);
        let d = Desired {
            table: Table::new("egressd").into(),
            net: Default::default(),
            snoop: Default::default(),
            statuses: vec![ObjectStatus::new(qkey, "n1", Outcome::Applied)],
            warnings: vec![],
        };
        let w = node_writes("n1", &v, &d, "2026-11-22T00:00:00Z", &Shapes::default());
        assert_eq!(w[0].status["conditions"][0]["lastTransitionTime"], "2026-01-01T00:00:00Z");
        assert_eq!(w[0].status["conditions"][0]["message"], "EgressQoS Rules applied");
    }

    #[test]
    fn on_a_crd_without_messages_each_node_writes_the_aggregate_and_a_failure_wins() {
        let legacy = Shapes { legacy: BTreeSet::from([Kind::EgressFirewall, Kind::EgressQoS]) };
        // The write of a per-node message came back without it: pruned.
        let w = node_writes("n1", &obs("u1", None), &desired(), "t", &Shapes::default()).remove(0);
        assert_eq!(pruned(&w, Some(&json!({}))), Some(Kind::EgressFirewall));
        assert_eq!(pruned(&w, Some(&json!({"messages": ["n1: EgressFirewall Rules applied"]}))), None);
        // Then the node applies status.status, without force when applied...
        let w = node_writes("n1", &obs("u1", None), &desired(), "t", &legacy);
        assert_eq!(w.len(), 1);
        assert_eq!((w[0].status.clone(), w[0].force), (json!({"status": EF_APPLIED}), false));
        assert!(
            node_writes("n1", &obs("u1", Some(json!({"status": EF_APPLIED}))), &desired(), "t", &legacy).is_empty()
        );
        // ... with force when it failed.
        let mut failed = desired();
        failed.statuses[0].fail("kernel error: x");
        let w = node_writes("n1", &obs("u1", Some(json!({"status": EF_APPLIED}))), &failed, "t", &legacy);
        assert_eq!((w[0].status.clone(), w[0].force), (json!({"status": EF_NOT_APPLIED}), true));
        // The leader aggregates nothing there.
        assert!(leader_writes(&view(&[("n1", true)]), &obs("u1", None), &legacy).is_empty());
    }

    #[test]
    fn an_unparsable_egress_ip_is_reported_in_the_references_words() {
        assert_eq!(
            egress_ip_event("e1", "spec.egressIPs: unable to parse provided EgressIP: 1.2.3, invalid"),
            "egress IP: 1.2.3 for object EgressIP: e1 is not a valid IP address"
        );
        assert_eq!(egress_ip_event("e1", "spec.namespaceSelector: bad"), "spec.namespaceSelector: bad");
    }
}
