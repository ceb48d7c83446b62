//! What the API server stores of each custom object besides its spec, in compact form:
//! its `uid`, `status.status`, its conditions, and what each egressd field manager holds
//! of the status. Only the status writer reads it; it is *not* part of the
//! [`super::ClusterView`], so a status written by any node (an echo of a write) never
//! makes a node recompile.
//!
//! Compact because a status holds one entry per node (the reference's per-zone entries):
//! every agent watches every EgressFirewall, and keeping each object's `status` as JSON
//! cost every agent ~800 MiB at 1,500 nodes and 1,000 EgressFirewalls (bench/FINDINGS.md
//! "2026-11-27 (sixth)"). The leader's own entries are kept as a digest; a node's own
//! entries (rare: its kernel errors) in full.

use std::collections::{BTreeMap, BTreeSet};
use std::hash::Hasher;

use serde_json::Value;

/// One object as stored.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Observed {
    /// `metadata.uid`: a deleted and re-created object has a new one.
    pub uid: Option<String>,
    /// `status.status`.
    pub text: Option<String>,
    /// `status.conditions` by `type`.
    pub conditions: BTreeMap<String, StoredCondition>,
    /// What each egressd field manager holds of the status (from `metadata.managedFields`).
    /// Only managers named `egressd-…` are kept.
    pub held: BTreeMap<String, Held>,
}

/// One stored condition, compact.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StoredCondition {
    /// `status` (`True`/`False`).
    pub status: String,
    /// `lastTransitionTime`.
    pub since: String,
    /// [`said`] of its `reason` and `message`.
    pub said: u64,
}

/// The digest of a condition's `reason` and `message`.
pub fn said(reason: &str, message: &str) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    h.write(reason.as_bytes());
    h.write_u8(0xff);
    h.write(message.as_bytes());
    h.finish()
}

/// The digest of one entry (a message, a condition type).
pub fn entry_digest(entry: &str) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    h.write(entry.as_bytes());
    h.finish()
}

/// The status fields one field manager holds, as server-side apply tracks them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Held {
    /// `status.status`.
    pub status: bool,
    /// The values of the `status.messages` set, or the `type`s of the `status.conditions`
    /// map, it holds (left empty for a manager read as a digest only).
    pub entries: BTreeSet<String>,
    /// How many entries it holds.
    pub count: usize,
    /// The order-independent digest of those entries (the sum of their
    /// [`entry_digest`]s).
    pub digest: u64,
}

impl Held {
    /// Holds nothing.
    pub fn is_empty(&self) -> bool {
        !self.status && self.count == 0
    }

    fn add(&mut self, entry: String, keep: bool) {
        self.count += 1;
        self.digest = self.digest.wrapping_add(entry_digest(&entry));
        if keep {
            self.entries.insert(entry);
        }
    }
}

/// Read an object's compact [`Observed`] form from its `status` and the `(manager,
/// fieldsV1)` pairs of `metadata.managedFields`
/// (`{"f:status":{"f:status":{},"f:messages":{"v:\"…\"":{}},
/// "f:conditions":{"k:{\"type\":\"…\"}":{…}}}}`). Managers holding nothing of the status
/// are left out; `digest_only` (the leader's manager) is kept as a digest.
pub fn observe<'a>(
    uid: Option<String>,
    status: Option<&Value>,
    managed: impl IntoIterator<Item = (&'a str, &'a Value)>,
    digest_only: &str,
) -> Observed {
    let text = status.and_then(|s| s.get("status")).and_then(Value::as_str).map(String::from);
    let mut conditions = BTreeMap::new();
    for c in status.and_then(|s| s.get("conditions")).and_then(Value::as_array).into_iter().flatten() {
        let field = |f: &str| c.get(f).and_then(Value::as_str).unwrap_or_default();
        if field("type").is_empty() {
            continue;
        }
        conditions.insert(
            field("type").to_string(),
            StoredCondition {
                status: field("status").to_string(),
                since: field("lastTransitionTime").to_string(),
                said: said(field("reason"), field("message")),
            },
        );
    }
    Observed { uid, text, conditions, held: held_by_managers(managed, digest_only) }
}

/// What each egressd manager holds, from `(manager, fieldsV1)` pairs (see [`observe`]).
pub fn held_by_managers<'a>(
    entries: impl IntoIterator<Item = (&'a str, &'a Value)>,
    digest_only: &str,
) -> BTreeMap<String, Held> {
    let mut out: BTreeMap<String, Held> = BTreeMap::new();
    for (manager, fields) in entries {
        if !manager.starts_with("egressd-") {
            continue;
        }
        let Some(status) = fields.get("f:status").and_then(Value::as_object) else { continue };
        let keep = manager != digest_only;
        let mut held = Held { status: status.contains_key("f:status"), ..Held::default() };
        let keys = |field: &str| status.get(field).and_then(Value::as_object).into_iter().flat_map(|m| m.keys());
        for k in keys("f:messages") {
            if let Some(Value::String(m)) = k.strip_prefix("v:").and_then(|v| serde_json::from_str(v).ok()) {
                held.add(m, keep);
            }
        }
        for k in keys("f:conditions") {
            let key: Option<Value> = k.strip_prefix("k:").and_then(|v| serde_json::from_str(v).ok());
            if let Some(t) = key.as_ref().and_then(|v| v.get("type")).and_then(Value::as_str) {
                held.add(t.to_string(), keep);
            }
        }
        if !held.is_empty() {
            // A manager has one entry per operation and subresource; merge them.
            let into = out.entry(manager.to_string()).or_default();
            into.status |= held.status;
            into.count += held.count;
            into.digest = into.digest.wrapping_add(held.digest);
            into.entries.extend(held.entries);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn what_each_egressd_manager_holds_is_read_from_managed_fields() {
        // As the API server stores them (kubectl get --show-managed-fields -o json).
        let leader = json!({"f:status": {".": {}, "f:status": {}, "f:messages": {
            "v:\"node-a: EgressFirewall Rules applied\"": {},
            "v:\"node-b: EgressFirewall Rules applied\"": {}}}});
        let node = json!({"f:status": {"f:conditions": {
            "k:{\"type\":\"Ready-In-Zone-node-b\"}": {".": {}, "f:type": {}, "f:status": {}}}}});
        let released = json!({"f:status": {"f:messages": {}}});
        let spec = json!({"f:spec": {"f:egress": {}}});
        let managed = [
            ("egressd-leader", &leader),
            ("egressd-node-b", &node),
            ("egressd-node-c", &released),
            ("kubectl-client-side-apply", &leader),
            ("egressd-node-d", &spec),
        ];
        let held = held_by_managers(managed, "egressd-leader");
        assert_eq!(held.keys().collect::<Vec<_>>(), ["egressd-leader", "egressd-node-b"], "{held:?}");
        let l = &held["egressd-leader"];
        assert!(l.status && l.entries.is_empty(), "the leader's entries as a digest");
        assert_eq!(l.count, 2);
        let (a, b) = ("node-a: EgressFirewall Rules applied", "node-b: EgressFirewall Rules applied");
        assert_eq!(l.digest, entry_digest(b).wrapping_add(entry_digest(a)), "order-independent");
        let n = &held["egressd-node-b"];
        assert!(!n.status);
        assert_eq!(n.entries.iter().collect::<Vec<_>>(), ["Ready-In-Zone-node-b"]);
        let full = held_by_managers(managed, "none");
        assert_eq!(full["egressd-leader"].entries.iter().collect::<Vec<_>>(), [a, b]);

        let status = json!({"status": "EgressQoS Rules applied", "conditions": [
            {"type": "Ready-In-Zone-node-b", "status": "True", "reason": "SetupSucceeded",
             "message": "EgressQoS Rules applied", "lastTransitionTime": "2026-01-01T00:00:00Z"}]});
        let o = observe(Some("u".into()), Some(&status), managed, "egressd-leader");
        assert_eq!(o.text.as_deref(), Some("EgressQoS Rules applied"));
        let c = &o.conditions["Ready-In-Zone-node-b"];
        assert_eq!((c.status.as_str(), c.since.as_str()), ("True", "2026-01-01T00:00:00Z"));
        assert_eq!(c.said, said("SetupSucceeded", "EgressQoS Rules applied"));
        assert_ne!(c.said, said("SetupFailed", "EgressQoS Rules applied"));
    }
}
