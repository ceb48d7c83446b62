//! The Kubernetes status writer.
//!
//! Leader ([`crate::leader::Leadership`], checked right before each write), field manager
//! `egressd-leader`, one server-side apply per object whose status differs:
//! * EgressFirewall: `status.messages` holds `<node>: EgressFirewall Rules applied` (or
//!   `... not correctly applied: <reason>`) for every Ready node, and `status.status` the
//!   aggregate (`... not correctly applied` as soon as one entry is);
//! * EgressQoS: condition `Ready-In-Zone-<node>` for every Ready node (list-type map keyed
//!   by `type`, `lastTransitionTime` kept while the condition's status stays the same),
//!   and the aggregate;
//! * in clusters of more than [`super::ZONES_PER_NODE_UP_TO`] Ready nodes (or always, or
//!   never: [`StatusZones`]) one entry names the whole cluster instead, zone
//!   [`GLOBAL_ZONE`], as the reference's centralized mode writes it: the entries grow
//!   with nothing but the nodes whose own kernel refused the rules;
//! * entries of nodes that no longer exist are removed (applying an empty list as that
//!   node's field manager);
//! * an Event (type Warning) for every rejected object, once per distinct error.
//!
//! The leader reports each node's entry from its own compile: whether an object applies
//! depends on the object and the cluster, which every node compiles alike. A policy change
//! is therefore one write per changed status, not one per node (at N = 50 the per-node
//! writes made every write cost O(N): bench/FINDINGS.md "2026-11-27 (fifth)").
//!
//! Per node (every agent), field manager `egressd-<node>`: only what the node alone
//! knows — its kernel refused the rules ([`ObjectStatus::local_problem`]). It then writes
//! its own entry (the leader leaves that node's entry to it, and which manager holds
//! what is read from `metadata.managedFields`), and releases it once the problem is gone.
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

mod events;

use super::board::StatusBoard;
use super::{GLOBAL_ZONE, StatusSink, StatusZones, ZoneForm};
use crate::api::{Kind, ObjectKey};
use crate::compile::{
    Desired, FIREWALL_APPLIED as EF_APPLIED, FIREWALL_NOT_APPLIED as EF_NOT_APPLIED, ObjectStatus, Outcome,
    QOS_APPLIED, QOS_CONDITION_PREFIX, QOS_NOT_APPLIED, parse_message,
};
use crate::leader::Leadership;
use crate::view::ClusterView;
use crate::view::observed::{Held, Observed, entry_digest, said};
pub(crate) use events::record_event;
use events::{EventKind, EventLog, emit_once, node_problems, rejections};

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
    /// The cluster's nodes (who is Ready, whose field managers exist).
    nodes: Arc<BTreeMap<String, crate::view::NodeInfo>>,
    /// The rejected objects ([`rejections`]).
    rejections: Vec<(ObjectKey, String)>,
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
            let then =
                if kind == Kind::EgressFirewall { "only status.status is written" } else { "no status is written" };
            tracing::info!(kind = %kind, "this cluster's {kind} CRD has no per-node status field (OpenShift 4.13 shape): {then}");
        }
    }
}

/// Sends each applied state to the writer task.
pub struct KubeStatusWriter {
    tx: watch::Sender<Option<Arc<Snapshot>>>,
    nodes: crate::status::SharedNodes,
}

impl KubeStatusWriter {
    /// Start the writer task for node `node`; `board` is what the API stores (the
    /// Kubernetes source keeps it up to date); `zones`: how the leader names the entries;
    /// `nodes`: the copy of the nodes shared with the other sink.
    pub fn start(
        client: Client,
        node: String,
        leadership: Leadership,
        board: StatusBoard,
        zones: StatusZones,
        nodes: crate::status::SharedNodes,
    ) -> Self {
        let (tx, rx) = watch::channel(None);
        let span = tracing::info_span!("status_writer", node = %node);
        let task = writer_task(client, node, leadership, rx, board, zones);
        tokio::spawn(tracing::Instrument::instrument(task, span));
        Self { tx, nodes }
    }
}

/// What the API stores, by object.
pub(crate) type ObservedObjects = BTreeMap<ObjectKey, Observed>;

/// The writes done, so that the same write is not repeated while nothing changed. An
/// entry counts only for the same object (`uid`: a deleted and re-created object is
/// written again) whose stored status is still what it was when written (anyone
/// changing it — the echo of the write included — makes the writer look again, and it
/// writes only what differs).
#[derive(Debug, Default)]
pub(crate) struct WriteLog {
    /// (object, manager) → (what was stored, the digest of what was written): a status
    /// holds one entry per node, so the written JSON is not kept.
    done: BTreeMap<(ObjectKey, String), (Observed, u64)>,
}

/// The digest of a status written.
fn written(status: &Value) -> u64 {
    entry_digest(&status.to_string())
}

impl WriteLog {
    /// Whether `w` must be sent, given what is stored now.
    pub(crate) fn needed(&self, w: &StatusWrite, observed: &ObservedObjects) -> bool {
        let now = observed.get(&w.key).cloned().unwrap_or_default();
        self.done.get(&(w.key.clone(), w.manager.clone())) != Some(&(now, written(&w.status)))
    }

    /// `w` was written while `observed` was stored.
    pub(crate) fn record(&mut self, w: StatusWrite, observed: &ObservedObjects) {
        let now = observed.get(&w.key).cloned().unwrap_or_default();
        let digest = written(&w.status);
        self.done.insert((w.key, w.manager), (now, digest));
    }

    /// Forget objects that are gone.
    pub(crate) fn retain_present(&mut self, observed: &ObservedObjects) {
        self.done.retain(|(k, _), _| observed.contains_key(k));
    }
}

impl StatusSink for KubeStatusWriter {
    fn applied(&mut self, view: &ClusterView, desired: &Desired, _: Option<&crate::net::HostLinks>) {
        // What the writer reads of the view, not a copy of it: every agent sends this at
        // every sync, and the view holds every policy of the cluster.
        let snapshot = Snapshot { nodes: self.nodes.of(view), rejections: rejections(view), desired: desired.clone() };
        let _ = self.tx.send(Some(Arc::new(snapshot)));
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

/// The leader's field manager: it writes every Ready node's entry of each status and the
/// aggregate, in one write per object.
const LEADER: &str = crate::status::LEADER_MANAGER;

/// What `manager` holds of `key`'s status.
fn held<'a>(observed: &'a ObservedObjects, key: &ObjectKey, manager: &str) -> Option<&'a Held> {
    observed.get(key).and_then(|o| o.held.get(manager)).filter(|h| !h.is_empty())
}

/// The condition `c` as written, its `lastTransitionTime` kept from what is stored while
/// its status stays the same.
fn condition_value(c: &crate::compile::StatusCondition, stored: Option<&Observed>, now: &str) -> Value {
    let since = stored
        .and_then(|o| o.conditions.get(&c.type_))
        .filter(|s| s.status == c.status)
        .map_or(now, |s| s.since.as_str());
    json!({
        "type": c.type_, "status": c.status, "reason": c.reason,
        "message": c.message, "lastTransitionTime": since,
    })
}

/// Whether `stored` has condition `c` (its time aside).
fn has_condition(stored: Option<&Observed>, c: &crate::compile::StatusCondition) -> bool {
    stored
        .and_then(|o| o.conditions.get(&c.type_))
        .is_some_and(|s| s.status == c.status && s.said == said(&c.reason, &c.message))
}

/// The empty form of `kind`'s per-node field: applied by a manager, it releases the
/// entries that manager holds.
fn release(kind: Kind, legacy: bool) -> Value {
    match (kind, legacy) {
        (_, true) => json!({}),
        (Kind::EgressFirewall, false) => json!({ "messages": [] }),
        _ => json!({ "conditions": [] }),
    }
}

/// What this node writes: nothing while it has no problem of its own with an object
/// (the leader reports what every node computes alike, [`leader_writes`]); its own
/// EgressFirewall message or EgressQoS condition while it has one (a kernel error); and
/// the release of that entry once the problem is gone.
pub(crate) fn node_writes(
    node: &str,
    observed: &ObservedObjects,
    desired: &Desired,
    now: &str,
    shapes: &Shapes,
) -> Vec<StatusWrite> {
    let mine = manager(node);
    let mut out = Vec::new();
    for s in &desired.statuses {
        if !matches!(s.key.kind, Kind::EgressFirewall | Kind::EgressQoS) || matches!(s.outcome, Outcome::Ignored(_)) {
            continue;
        }
        let stored = observed.get(&s.key);
        let holds = held(observed, &s.key, &mine);
        let legacy = shapes.legacy.contains(&s.key.kind);
        let write = |status: Value| StatusWrite { key: s.key.clone(), manager: mine.clone(), status, force: true };
        if !s.local_problem() {
            if holds.is_some() {
                out.push(write(release(s.key.kind, legacy)));
            }
            continue;
        }
        let only = |entry: &str| holds.is_some_and(|h| h.count == 1 && h.entries.contains(entry));
        match (s.key.kind, legacy) {
            (Kind::EgressFirewall, true) => {
                let stored_text = stored.and_then(|o| o.text.as_deref());
                if stored_text != Some(EF_NOT_APPLIED) || !holds.is_some_and(|h| h.status) {
                    out.push(write(json!({ "status": EF_NOT_APPLIED })));
                }
            }
            (Kind::EgressFirewall, false) => {
                // Held by this node's manager: stored (server-side apply tracks it).
                let message = s.message();
                if !only(&message) {
                    out.push(write(json!({ "messages": [message] })));
                }
            }
            (_, true) => {}
            (_, false) => {
                let Some(c) = s.condition() else { continue };
                if !only(&c.type_) || !has_condition(stored, &c) {
                    out.push(write(json!({ "conditions": [condition_value(&c, stored, now)] })));
                }
            }
        }
    }
    out
}

/// What the leader writes, one write per object whose status differs: every Ready node's
/// EgressFirewall message (EgressQoS condition) as every node computes it, except where a
/// node holds an entry of its own (its own problem) — or, in the [`ZoneForm::Global`]
/// form, one entry for all of them, zone [`GLOBAL_ZONE`] —, and the aggregate `status.status`
/// ("not correctly applied" when any entry is); and the release of the entries of nodes
/// that no longer exist, by their own field manager. A policy change therefore costs one
/// write per changed status, whatever the number of nodes.
///
/// The leader reports a node's entry from its own compile: the outcome depends only on
/// the object and the cluster (every node compiles the same view), not on the node; what
/// only a node can know — its kernel refused the rules — that node reports itself.
/// Whether its own entries are stored is compared by digest ([`Held::digest`]): the
/// messages are built only for a write.
///
/// The writes are built one object at a time, as the caller takes them: a status holds
/// an entry per Ready node, and building every object's at once made the leader's peak
/// RSS ~150 MiB at 1,500 nodes and 1,000 EgressFirewalls (bench/FINDINGS.md
/// "2026-11-27 (seventh)").
pub(crate) fn leader_writes<'a>(
    me: &'a str,
    nodes: &'a BTreeMap<String, crate::view::NodeInfo>,
    desired: &'a Desired,
    observed: &'a ObservedObjects,
    now: &'a str,
    shapes: &'a Shapes,
    form: ZoneForm,
) -> impl Iterator<Item = StatusWrite> + Send + 'a {
    let round = LeaderRound {
        me,
        ready: nodes.iter().filter(|(_, n)| n.ready).map(|(n, _)| n.as_str()).collect(),
        form,
        managers: nodes.keys().map(|n| (manager(n), n.as_str())).collect(),
        mine: desired.statuses.iter().map(|s| (&s.key, s)).collect(),
        now,
        shapes,
    };
    observed
        .iter()
        .filter(|(k, _)| matches!(k.kind, Kind::EgressFirewall | Kind::EgressQoS))
        .flat_map(move |(key, obs)| round.object(key, obs))
}

/// What one round of [`leader_writes`] knows of every object.
struct LeaderRound<'a> {
    me: &'a str,
    /// The Ready nodes.
    ready: Vec<&'a str>,
    /// An entry per node, or one for the cluster.
    form: ZoneForm,
    /// Field manager → node, for the nodes that exist.
    managers: BTreeMap<String, &'a str>,
    /// This node's compiled status of each object.
    mine: BTreeMap<&'a ObjectKey, &'a ObjectStatus>,
    now: &'a str,
    shapes: &'a Shapes,
}

impl LeaderRound<'_> {
    /// The leader's writes for one object (see [`leader_writes`]).
    fn object(&self, key: &ObjectKey, obs: &Observed) -> Vec<StatusWrite> {
        let legacy = self.shapes.legacy.contains(&key.kind);
        let mut out = self.releases(key, obs, legacy);
        let Some(status) = self.mine.get(key).copied() else { return out };
        if matches!(status.outcome, Outcome::Ignored(_))
            || self.ready.is_empty()
            || (legacy && key.kind == Kind::EgressQoS)
        {
            return out;
        }
        // What the nodes that exist hold themselves (rare: their own kernel errors).
        let nodes_held: BTreeMap<&str, &Held> = obs
            .held
            .iter()
            .filter(|(_, h)| !h.is_empty())
            .filter_map(|(m, h)| Some((*self.managers.get(m.as_str())?, h)))
            .collect();
        // A node that holds its own entry (or is about to write one: this node, with a
        // problem of its own) reports itself.
        let own = |n: &str| nodes_held.contains_key(n) || (n == self.me && status.local_problem());
        // The zones the leader reports: every Ready node that does not report itself, or
        // one for all of them.
        let mut reported: Vec<&str> = self.ready.iter().copied().filter(|n| !own(n)).collect();
        if self.form == ZoneForm::Global && !reported.is_empty() {
            reported = vec![GLOBAL_ZONE];
        }
        let nothing = Held::default();
        let one = LeaderObject {
            key,
            obs,
            status,
            common: status.as_on(self.me),
            holds: obs.held.get(LEADER).unwrap_or(&nothing),
            nodes_held,
            reported,
            me: self.me,
            now: self.now,
        };
        out.extend(match key.kind {
            Kind::EgressFirewall if legacy => one.legacy_firewall(),
            Kind::EgressFirewall => one.firewall(),
            _ => one.qos(),
        });
        out
    }

    /// The releases of `key`'s entries held by nodes that are gone.
    fn releases(&self, key: &ObjectKey, obs: &Observed, legacy: bool) -> Vec<StatusWrite> {
        obs.held
            .iter()
            .filter(|(m, h)| m.as_str() != LEADER && !h.is_empty() && !self.managers.contains_key(m.as_str()))
            .map(|(m, _)| StatusWrite {
                key: key.clone(),
                manager: m.clone(),
                status: release(key.kind, legacy),
                force: true,
            })
            .collect()
    }
}

/// What the leader knows of one object it reports in a round.
struct LeaderObject<'a> {
    key: &'a ObjectKey,
    obs: &'a Observed,
    /// This node's compiled status of the object.
    status: &'a ObjectStatus,
    /// That status as every node computes it (this node's kernel aside).
    common: ObjectStatus,
    /// What the leader's field manager holds.
    holds: &'a Held,
    /// What the nodes that exist hold themselves, by node.
    nodes_held: BTreeMap<&'a str, &'a Held>,
    /// The zones the leader reports.
    reported: Vec<&'a str>,
    me: &'a str,
    now: &'a str,
}

impl LeaderObject<'_> {
    fn write(&self, status: Value) -> StatusWrite {
        StatusWrite { key: self.key.clone(), manager: LEADER.into(), status, force: true }
    }

    /// Whether the stored aggregate and the leader's entries differ from `text` and
    /// entries with this digest.
    fn differs(&self, text: &str, digest: u64) -> bool {
        let h = self.holds;
        self.obs.text.as_deref() != Some(text) || !h.status || h.count != self.reported.len() || h.digest != digest
    }

    /// A CRD with only `status.status`: one field; a node's failure, forced, stays until
    /// that node releases it.
    fn legacy_firewall(&self) -> Option<StatusWrite> {
        if self.nodes_held.values().any(|h| h.status) {
            return None;
        }
        let text = if matches!(self.common.outcome, Outcome::Failed(_)) { EF_NOT_APPLIED } else { EF_APPLIED };
        (self.obs.text.as_deref() != Some(text) || !self.holds.status).then(|| self.write(json!({ "status": text })))
    }

    /// Every reported node's message is `<node>: <the same words>`.
    fn firewall(&self) -> Option<StatusWrite> {
        let mine_text = self.common.message();
        let words = mine_text.strip_prefix(&format!("{}: ", self.me)).unwrap_or(&mine_text);
        let mut buf = String::new();
        let digest =
            self.reported.iter().fold(0u64, |d, n| d.wrapping_add(entry_digest(node_message(&mut buf, n, words))));
        // This node's own report, written in the same round (not stored yet).
        let own_report: Option<String> = self.status.local_problem().then(|| self.status.message());
        let failed = matches!(self.common.outcome, Outcome::Failed(_)) && !self.reported.is_empty()
            || self
                .nodes_held
                .values()
                .flat_map(|h| h.entries.iter())
                .chain(own_report.iter())
                .filter_map(|m| parse_message(m))
                .any(|(_, applied)| !applied);
        let text = if failed { EF_NOT_APPLIED } else { EF_APPLIED };
        if !self.differs(text, digest) {
            return None;
        }
        let entries: Vec<String> = self.reported.iter().map(|n| node_message(&mut buf, n, words).to_string()).collect();
        Some(self.write(json!({ "status": text, "messages": entries })))
    }

    /// A condition `Ready-In-Zone-<node>` per reported node.
    fn qos(&self) -> Option<StatusWrite> {
        let c = self.common.condition()?;
        let rest =
            |n: &str| crate::compile::StatusCondition { type_: format!("{QOS_CONDITION_PREFIX}{n}"), ..c.clone() };
        let mut digest = 0u64;
        let mut stored_all = true;
        for n in &self.reported {
            let cn = rest(n);
            digest = digest.wrapping_add(entry_digest(&cn.type_));
            stored_all &= has_condition(Some(self.obs), &cn);
        }
        let own_types: BTreeSet<&String> = self.nodes_held.values().flat_map(|h| h.entries.iter()).collect();
        let failed = (c.status == "False" && !self.reported.is_empty())
            || own_types.iter().any(|t| self.obs.conditions.get(*t).is_some_and(|s| s.status == "False"))
            || (self.status.local_problem() && matches!(self.status.outcome, Outcome::Failed(_)));
        let text = if failed { QOS_NOT_APPLIED } else { QOS_APPLIED };
        if !self.differs(text, digest) && stored_all {
            return None;
        }
        let wanted: Vec<Value> =
            self.reported.iter().map(|n| condition_value(&rest(n), Some(self.obs), self.now)).collect();
        Some(self.write(json!({ "status": text, "conditions": wanted })))
    }
}

/// `<node>: <words>` in `buf` (reused: a status holds one message per node).
fn node_message<'b>(buf: &'b mut String, node: &str, words: &str) -> &'b str {
    buf.clear();
    buf.push_str(node);
    buf.push_str(": ");
    buf.push_str(words);
    buf
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

/// Send the `writes` that are needed, learning the CRDs' shapes from what is stored;
/// the leader's only while this node leads.
async fn send(
    client: &Client,
    node: &str,
    leadership: &Leadership,
    writes: impl Iterator<Item = StatusWrite>,
    log: &mut WriteLog,
    shapes: &mut Shapes,
    observed: &ObservedObjects,
) {
    for w in writes {
        if !log.needed(&w, observed) {
            continue;
        }
        if w.manager != manager(node) && !leadership.is_leader() {
            continue;
        }
        match apply_status(client, &w).await {
            Ok(stored) => {
                tracing::debug!(object = %w.key, manager = %w.manager, "status written");
                if let Some(kind) = pruned(&w, stored.as_ref()) {
                    shapes.learn(kind);
                }
                log.record(w, observed);
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
}

async fn writer_task(
    client: Client,
    node: String,
    leadership: Leadership,
    mut rx: watch::Receiver<Option<Arc<Snapshot>>>,
    board: StatusBoard,
    zones: StatusZones,
) {
    let mut log = WriteLog::default();
    let mut form = None;
    let mut shapes = Shapes::default();
    let mut evented = EventLog::new();
    let mut node_evented = EventLog::new();
    let mut recheck = tokio::time::interval(Duration::from_secs(5));
    let mut echoes = 0u64;
    loop {
        tokio::select! {
            r = rx.changed() => if r.is_err() { return },
            _ = board.changed() => echoes += 1,
            _ = recheck.tick() => {
                // Statuses arrive in bursts (one echo per object written, each holding
                // an entry per node): give what their parsing freed back.
                if echoes > 0 {
                    crate::telemetry::memory::release_freed();
                    echoes = 0;
                }
            }
        }
        let Some(snap) = rx.borrow_and_update().clone() else { continue };
        let observed = board.snapshot();
        log.retain_present(&observed);
        let now =
            jiff::Timestamp::now().round(jiff::Unit::Second).unwrap_or_else(|_| jiff::Timestamp::now()).to_string();
        // The leader's writes are built as they are sent (`shapes` may learn meanwhile:
        // this round goes on with what it knew).
        let round = shapes.clone();
        let ready = snap.nodes.values().filter(|n| n.ready).count();
        let this_form = zones.form(form, ready);
        if form.is_some_and(|f| f != this_form) {
            tracing::info!(ready, form = ?this_form, "status entries: {}", match this_form {
                ZoneForm::PerNode => "one per Ready node",
                ZoneForm::Global => "one for the cluster (zone global)",
            });
        }
        form = Some(this_form);
        let writes = node_writes(&node, &observed, &snap.desired, &now, &shapes);
        let leader = leadership
            .is_leader()
            .then(|| leader_writes(&node, &snap.nodes, &snap.desired, &observed, &now, &round, this_form));
        let writes = writes.into_iter().chain(leader.into_iter().flatten());
        send(&client, &node, &leadership, writes, &mut log, &mut shapes, &observed).await;
        if leadership.is_leader() {
            let invalid = snap.rejections.clone();
            emit_once(&client, &node, &mut evented, invalid, EventKind::Invalid, &observed).await;
        }
        // This node's own EgressIP problems (conflicts, addresses it cannot host): the
        // object has no per-node status field, so an Event is where they show.
        let problems = node_problems(&snap.desired);
        emit_once(&client, &node, &mut node_evented, problems, EventKind::NotApplied, &observed).await;
        // Not held while waiting: a status echo meanwhile would copy the whole board.
        drop(observed);
        // Pace writes: at most one batch per 200 ms; later states replace earlier ones.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compile::ObjectStatus;
    use crate::nft::Table;
    use crate::view::observed::observe;
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

    /// The managedFields entry of `manager` holding what `status` has.
    fn fields(status: &Value) -> Value {
        let mut f = serde_json::Map::new();
        if status.get("status").is_some() {
            f.insert("f:status".into(), json!({}));
        }
        if let Some(m) = status.get("messages").and_then(Value::as_array) {
            let keys: serde_json::Map<String, Value> = m.iter().map(|v| (format!("v:{v}"), json!({}))).collect();
            f.insert("f:messages".into(), Value::Object(keys));
        }
        if let Some(c) = status.get("conditions").and_then(Value::as_array) {
            let keys: serde_json::Map<String, Value> =
                c.iter().map(|v| (format!("k:{}", json!({"type": v["type"]})), json!({}))).collect();
            f.insert("f:conditions".into(), Value::Object(keys));
        }
        json!({ "f:status": f })
    }

    /// `stored`, with each (manager, part of the status) holding that part.
    fn obs_held(uid: &str, stored: Option<Value>, held: &[(&str, Value)]) -> ObservedObjects {
        let fields: Vec<(&str, Value)> = held.iter().map(|(m, v)| (*m, fields(v))).collect();
        let o = observe(Some(uid.into()), stored.as_ref(), fields.iter().map(|(m, v)| (*m, v)), LEADER);
        BTreeMap::from([(key(), o)])
    }

    fn obs(uid: &str, stored: Option<Value>) -> ObservedObjects {
        obs_held(uid, stored, &[])
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

    fn applied(n: &str) -> String {
        format!("{n}: {EF_APPLIED}")
    }

    /// What the API stores after `w` (with its manager holding what it wrote), as the
    /// echo of the write brings it back.
    fn echo(w: &StatusWrite) -> ObservedObjects {
        let fields = fields(&w.status);
        let o = observe(Some("u1".into()), Some(&w.status), [(w.manager.as_str(), &fields)], LEADER);
        BTreeMap::from([(w.key.clone(), o)])
    }

    fn leader(me: &str, nodes: &[(&str, bool)], d: &Desired, o: &ObservedObjects, shapes: &Shapes) -> Vec<StatusWrite> {
        leader_writes(me, &view(nodes).nodes, d, o, "t", shapes, ZoneForm::PerNode).collect()
    }

    #[test]
    fn a_write_is_repeated_for_a_re_created_object_or_a_cleared_status_only() {
        let nodes = [("n1", true)];
        let mut log = WriteLog::default();
        let before = obs("u1", None);
        let w = leader("n1", &nodes, &desired(), &before, &Shapes::default()).remove(0);
        assert!(log.needed(&w, &before));
        log.record(w.clone(), &before);
        assert!(!log.needed(&w, &before), "the same write while nothing changed is not repeated");
        // The echo arrives: nothing to write any more.
        let echoed = echo(&w);
        assert!(leader("n1", &nodes, &desired(), &echoed, &Shapes::default()).is_empty());
        // The object is deleted and re-created with the same name: new uid, empty status.
        let recreated = obs("u2", None);
        let again = leader("n1", &nodes, &desired(), &recreated, &Shapes::default());
        assert_eq!(again, vec![w.clone()]);
        assert!(log.needed(&again[0], &recreated), "a re-created object gets its status again");
        // Someone clears the status of the same object after the echo: written again.
        log.record(w.clone(), &echoed);
        let cleared = obs("u1", Some(json!({"messages": []})));
        let w3 = leader("n1", &nodes, &desired(), &cleared, &Shapes::default());
        assert!(log.needed(&w3[0], &cleared));
        log.retain_present(&BTreeMap::new());
        assert!(log.done.is_empty(), "deleted objects are forgotten");
    }

    #[test]
    fn the_leader_reports_every_ready_node_in_one_write_and_a_change_costs_one_write() {
        let nodes = [("n1", true), ("n2", true), ("n3", false)];
        let w = leader("n1", &nodes, &desired(), &obs("u1", None), &Shapes::default());
        assert_eq!(
            w,
            vec![StatusWrite {
                key: key(),
                manager: "egressd-leader".into(),
                status: json!({"status": EF_APPLIED, "messages": [applied("n1"), applied("n2")]}),
                force: true
            }],
            "n3 is not Ready: no entry"
        );
        assert!(leader("n1", &nodes, &desired(), &echo(&w[0]), &Shapes::default()).is_empty(), "stored: no write");
        // The policy becomes invalid: every entry and the aggregate change, in one write.
        let mut invalid = desired();
        invalid.statuses[0].outcome = Outcome::Failed("spec.egress[0]: bad".into());
        let w2 = leader("n1", &nodes, &invalid, &echo(&w[0]), &Shapes::default());
        assert_eq!(w2.len(), 1);
        let bad = |n: &str| format!("{n}: {EF_NOT_APPLIED}: spec.egress[0]: bad");
        assert_eq!(w2[0].status, json!({"status": EF_NOT_APPLIED, "messages": [bad("n1"), bad("n2")]}));
        // No node writes anything for it: the problem is not theirs alone.
        for n in ["n1", "n2"] {
            let mut d = invalid.clone();
            d.statuses[0] = d.statuses[0].as_on(n);
            assert!(node_writes(n, &echo(&w2[0]), &d, "t", &Shapes::default()).is_empty());
        }
        // A node joins: one write.
        let more = [("n1", true), ("n2", true), ("n3", true)];
        let w3 = leader("n1", &more, &invalid, &echo(&w2[0]), &Shapes::default());
        assert_eq!(w3.len(), 1);
        assert_eq!(w3[0].status["messages"].as_array().map(Vec::len), Some(3));
    }

    #[test]
    fn a_node_reports_only_its_own_problem_and_releases_it_when_it_is_gone() {
        assert!(node_writes("n1", &obs("u1", None), &desired(), "t", &Shapes::default()).is_empty());
        let mut failed = desired();
        failed.statuses[0].fail("kernel error: x");
        let message = format!("n1: {EF_NOT_APPLIED}: kernel error: x");
        let w = node_writes("n1", &obs("u1", None), &failed, "t", &Shapes::default());
        assert_eq!(
            w,
            vec![StatusWrite {
                key: key(),
                manager: "egressd-n1".into(),
                status: json!({"messages": [message]}),
                force: true
            }]
        );
        assert!(node_writes("n1", &echo(&w[0]), &failed, "t", &Shapes::default()).is_empty(), "stored");
        // The leader leaves n1's entry to n1 and reports the failure in the aggregate.
        let both = obs_held(
            "u1",
            Some(json!({"messages": [message.clone()]})),
            &[("egressd-n1", json!({"messages": [message.clone()]}))],
        );
        let l = leader("n2", &[("n1", true), ("n2", true)], &desired(), &both, &Shapes::default());
        assert_eq!(l[0].status, json!({"status": EF_NOT_APPLIED, "messages": [applied("n2")]}));
        // The leader itself, with its own problem, leaves its entry to its node write.
        let l = leader("n1", &[("n1", true), ("n2", true)], &failed, &obs("u1", None), &Shapes::default());
        assert_eq!(l[0].status, json!({"status": EF_NOT_APPLIED, "messages": [applied("n2")]}));
        // Recovered: n1 releases its entry; then the leader reports it again.
        let release = node_writes("n1", &both, &desired(), "t", &Shapes::default());
        assert_eq!(release.len(), 1);
        assert_eq!(release[0].status, json!({"messages": []}));
        let l = leader("n2", &[("n1", true), ("n2", true)], &desired(), &obs("u1", None), &Shapes::default());
        assert_eq!(l[0].status, json!({"status": EF_APPLIED, "messages": [applied("n1"), applied("n2")]}));
    }

    #[test]
    fn a_deleted_nodes_entry_is_removed_by_its_own_field_manager() {
        let gone = applied("gone");
        let stored = json!({"messages": [gone.clone(), applied("n1")], "status": EF_APPLIED});
        let o = obs_held(
            "u1",
            Some(stored),
            &[
                ("egressd-gone", json!({"messages": [gone.clone()]})),
                ("egressd-leader", json!({"status": EF_APPLIED, "messages": [applied("n1")]})),
            ],
        );
        let w = leader("n1", &[("n1", true)], &desired(), &o, &Shapes::default());
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
    fn in_the_global_form_one_entry_reports_every_node_and_a_nodes_own_problem_stays_its_own() {
        let global = |me: &str, nodes: &[(&str, bool)], d: &Desired, o: &ObservedObjects| -> Vec<StatusWrite> {
            leader_writes(me, &view(nodes).nodes, d, o, "t", &Shapes::default(), ZoneForm::Global).collect()
        };
        let nodes = [("n1", true), ("n2", true), ("n3", false)];
        // Stored per node (a smaller cluster's); the global form replaces it in one write.
        let per_node = leader("n1", &nodes, &desired(), &obs("u1", None), &Shapes::default());
        let w = global("n1", &nodes, &desired(), &echo(&per_node[0]));
        assert_eq!(w.len(), 1);
        assert_eq!(w[0].status, json!({"status": EF_APPLIED, "messages": [applied("global")]}));
        assert!(global("n1", &nodes, &desired(), &echo(&w[0])).is_empty(), "stored: no write");
        // Invalid: one write, the one entry carries the reason.
        let mut invalid = desired();
        invalid.statuses[0].outcome = Outcome::Failed("spec.egress[0]: bad".into());
        let w2 = global("n1", &nodes, &invalid, &echo(&w[0]));
        assert_eq!(w2.len(), 1);
        let bad = format!("global: {EF_NOT_APPLIED}: spec.egress[0]: bad");
        assert_eq!(w2[0].status, json!({"status": EF_NOT_APPLIED, "messages": [bad]}));
        // Nodes coming and going change nothing stored.
        let more = [("n1", true), ("n2", true), ("n3", true), ("n4", true)];
        assert!(global("n1", &more, &invalid, &echo(&w2[0])).is_empty());
        // n1's kernel refused the rules: its own entry stays beside the global one, and
        // the aggregate says so.
        let message = format!("n1: {EF_NOT_APPLIED}: kernel error: x");
        let both = obs_held(
            "u1",
            Some(json!({"status": EF_APPLIED, "messages": [message.clone(), applied("global")]})),
            &[
                ("egressd-n1", json!({"messages": [message]})),
                (LEADER, json!({"status": EF_APPLIED, "messages": [applied("global")]})),
            ],
        );
        let l = global("n2", &[("n1", true), ("n2", true)], &desired(), &both);
        assert_eq!(l.len(), 1);
        assert_eq!(l[0].status, json!({"status": EF_NOT_APPLIED, "messages": [applied("global")]}));
        // EgressQoS: one condition, `Ready-In-Zone-global`.
        let qkey = ObjectKey::new(Kind::EgressQoS, "a", "default");
        let v = BTreeMap::from([(qkey.clone(), observe(None, None, [], LEADER))]);
        let d = Desired { statuses: vec![ObjectStatus::new(qkey, "n1", Outcome::Applied)], ..desired() };
        let q = global("n1", &nodes, &d, &v);
        assert_eq!(q.len(), 1);
        assert_eq!(q[0].status["conditions"].as_array().map(Vec::len), Some(1));
        assert_eq!(q[0].status["conditions"][0]["type"], "Ready-In-Zone-global");
        assert_eq!(q[0].status["status"], QOS_APPLIED);
    }

    #[test]
    fn auto_zones_switch_to_global_above_the_limit_and_back_only_well_below_it() {
        use super::super::{ZONES_PER_NODE_AGAIN_AT as AGAIN, ZONES_PER_NODE_UP_TO as UP_TO};
        let auto = StatusZones::Auto;
        assert_eq!(auto.form(None, 3), ZoneForm::PerNode);
        assert_eq!(auto.form(None, UP_TO), ZoneForm::PerNode);
        assert_eq!(auto.form(Some(ZoneForm::PerNode), UP_TO + 1), ZoneForm::Global);
        // Between the two limits the form stays what it was.
        assert_eq!(auto.form(Some(ZoneForm::Global), UP_TO), ZoneForm::Global);
        assert_eq!(auto.form(Some(ZoneForm::Global), AGAIN + 1), ZoneForm::Global);
        assert_eq!(auto.form(Some(ZoneForm::PerNode), AGAIN + 1), ZoneForm::PerNode);
        assert_eq!(auto.form(Some(ZoneForm::Global), AGAIN), ZoneForm::PerNode);
        assert_eq!(StatusZones::PerNode.form(Some(ZoneForm::Global), 5_000), ZoneForm::PerNode);
        assert_eq!(StatusZones::Global.form(None, 1), ZoneForm::Global);
    }

    #[test]
    fn qos_condition_keeps_its_transition_time_while_unchanged() {
        let qkey = ObjectKey::new(Kind::EgressQoS, "a", "default");
        let stored = json!({"conditions": [{"type": "Ready-In-Zone-n1", "status": "True", "reason": "SetupSucceeded", "message": "old", "lastTransitionTime": "2026-01-01T00:00:00Z"}]});
        let v = BTreeMap::from([(qkey.clone(), observe(None, Some(&stored), [], LEADER))]);
        let d = Desired {
            table: Table::new("egressd").into(),
            net: Default::default(),
            snoop: Default::default(),
            statuses: vec![ObjectStatus::new(qkey, "n1", Outcome::Applied)],
            warnings: vec![],
        };
        let mut view = view(&[("n1", true), ("n2", true)]);
        view.firewalls = Default::default();
        let w: Vec<_> =
            leader_writes("n1", &view.nodes, &d, &v, "2026-11-22T00:00:00Z", &Shapes::default(), ZoneForm::PerNode)
                .collect();
        assert_eq!(w.len(), 1);
        let c = &w[0].status["conditions"];
        assert_eq!(c[0]["lastTransitionTime"], "2026-01-01T00:00:00Z");
        assert_eq!(c[0]["message"], "EgressQoS Rules applied");
        assert_eq!(c[1]["type"], "Ready-In-Zone-n2");
        assert_eq!(c[1]["lastTransitionTime"], "2026-11-22T00:00:00Z");
        assert_eq!(w[0].status["status"], QOS_APPLIED);
        assert!(
            leader_writes("n1", &view.nodes, &d, &echo(&w[0]), "later", &Shapes::default(), ZoneForm::PerNode)
                .next()
                .is_none()
        );
        // A kernel error on n1: n1's own condition, its time from the stored one.
        let mut failed = d.clone();
        failed.statuses[0].fail("kernel error: x");
        let n = node_writes("n1", &echo(&w[0]), &failed, "2026-11-23T00:00:00Z", &Shapes::default());
        assert_eq!(n[0].manager, "egressd-n1");
        assert_eq!(n[0].status["conditions"][0]["status"], "False");
        assert_eq!(n[0].status["conditions"][0]["lastTransitionTime"], "2026-11-23T00:00:00Z");
    }

    #[test]
    fn on_a_crd_without_messages_the_leader_writes_the_aggregate_and_a_nodes_failure_wins() {
        let legacy = Shapes { legacy: BTreeSet::from([Kind::EgressFirewall, Kind::EgressQoS]) };
        let nodes = [("n1", true), ("n2", true)];
        // The leader's write came back without its messages: pruned.
        let w = leader("n1", &nodes, &desired(), &obs("u1", None), &Shapes::default()).remove(0);
        assert_eq!(pruned(&w, Some(&json!({"status": EF_APPLIED}))), Some(Kind::EgressFirewall));
        assert_eq!(pruned(&w, Some(&w.status)), None);
        // Then it applies status.status alone.
        let w = leader("n1", &nodes, &desired(), &obs("u1", None), &legacy);
        assert_eq!(w.len(), 1);
        assert_eq!(w[0].status, json!({"status": EF_APPLIED}));
        assert!(leader("n1", &nodes, &desired(), &echo(&w[0]), &legacy).is_empty());
        // A node with a problem of its own forces the failure ...
        let mut failed = desired();
        failed.statuses[0].fail("kernel error: x");
        let n = node_writes("n1", &echo(&w[0]), &failed, "t", &legacy);
        assert_eq!((n[0].status.clone(), n[0].force), (json!({"status": EF_NOT_APPLIED}), true));
        // ... which the leader leaves until that node releases it.
        let held = obs_held(
            "u1",
            Some(json!({"status": EF_NOT_APPLIED})),
            &[("egressd-n1", json!({"status": EF_NOT_APPLIED}))],
        );
        assert!(leader("n2", &nodes, &desired(), &held, &legacy).is_empty());
        assert_eq!(node_writes("n1", &held, &desired(), "t", &legacy)[0].status, json!({}));
    }

    proptest::proptest! {
        /// The leader compares what it holds by digest and count: that must decide exactly
        /// what comparing the stored messages in full decides, and a write, once stored,
        /// must leave nothing to write.
        #[test]
        fn the_leaders_digest_decides_what_a_full_comparison_decides(
            before in proptest::collection::vec(proptest::bool::ANY, 1..7),
            after in proptest::collection::vec(proptest::bool::ANY, 1..7),
            failed_before in proptest::bool::ANY,
            failed_after in proptest::bool::ANY,
            global_before in proptest::bool::ANY,
            global_after in proptest::bool::ANY,
        ) {
            let form = |global: bool| if global { ZoneForm::Global } else { ZoneForm::PerNode };
            let leader = |nodes: &[(&str, bool)], d: &Desired, o: &ObservedObjects, global: bool| -> Vec<StatusWrite> {
                leader_writes("n0", &view(nodes).nodes, d, o, "t", &Shapes::default(), form(global)).collect()
            };
            let names: Vec<String> = (0..7).map(|i| format!("n{i}")).collect();
            let nodes = |ready: &[bool]| -> Vec<(&str, bool)> {
                ready.iter().enumerate().map(|(i, r)| (names[i].as_str(), *r)).collect()
            };
            let outcome = |failed: bool| {
                let mut d = desired();
                if failed {
                    d.statuses[0].outcome = Outcome::Failed("spec.egress[0]: bad".into());
                }
                d
            };
            // What the API stores: the leader's write for the earlier state.
            let first = leader(&nodes(&before), &outcome(failed_before), &obs("u1", None), global_before);
            let stored = match first.first() {
                Some(w) => w.status.clone(),
                None => json!({}),
            };
            let observed = first.first().map_or_else(|| obs("u1", None), echo);
            let writes = leader(&nodes(&after), &outcome(failed_after), &observed, global_after);
            // In full: every Ready node's message (or the cluster's), and the aggregate.
            let d = outcome(failed_after);
            let mut want: BTreeSet<String> = nodes(&after)
                .iter()
                .filter(|(_, r)| *r)
                .map(|(n, _)| d.statuses[0].as_on(n).message())
                .collect();
            if global_after && !want.is_empty() {
                want = BTreeSet::from([d.statuses[0].as_on(GLOBAL_ZONE).message()]);
            }
            let have: BTreeSet<String> = stored["messages"]
                .as_array()
                .map(|a| a.iter().filter_map(|v| v.as_str().map(String::from)).collect())
                .unwrap_or_default();
            let text = if failed_after { EF_NOT_APPLIED } else { EF_APPLIED };
            let same = want.is_empty() || (want == have && stored["status"] == text);
            proptest::prop_assert_eq!(writes.is_empty(), same, "{:?} -> {:?}", stored, writes);
            if let Some(w) = writes.first() {
                let wrote: BTreeSet<String> = w.status["messages"]
                    .as_array()
                    .map(|a| a.iter().filter_map(|v| v.as_str().map(String::from)).collect())
                    .unwrap_or_default();
                proptest::prop_assert_eq!(&wrote, &want);
                proptest::prop_assert!(
                    leader(&nodes(&after), &d, &echo(w), global_after).is_empty(),
                    "a stored write leaves nothing to write"
                );
            }
        }
    }
}
