//! What the API server stores of each custom object besides its spec: its `uid` and its
//! `status` as last seen. Only the status writer reads it; it is *not* part of the
//! [`super::ClusterView`], so a status written by any node (an echo of a write) never
//! makes a node recompile.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use serde_json::Value;
use tokio::sync::Notify;

use crate::api::ObjectKey;

/// One object as stored.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Observed {
    /// `metadata.uid`: a deleted and re-created object has a new one.
    pub uid: Option<String>,
    /// `status`, as stored.
    pub status: Option<Value>,
    /// What each egressd field manager holds of the status (from `metadata.managedFields`):
    /// manager → the entries it applied. Only managers named `egressd-…` are kept.
    pub held: BTreeMap<String, Held>,
}

/// The status fields one field manager holds, as server-side apply tracks them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Held {
    /// `status.status`.
    pub status: bool,
    /// Values of the `status.messages` set.
    pub messages: BTreeSet<String>,
    /// `type`s of the `status.conditions` map.
    pub conditions: BTreeSet<String>,
}

impl Held {
    /// Holds nothing.
    pub fn is_empty(&self) -> bool {
        !self.status && self.messages.is_empty() && self.conditions.is_empty()
    }
}

/// Read what each egressd manager holds from `(manager, fieldsV1)` pairs of
/// `metadata.managedFields` (`{"f:status":{"f:status":{},"f:messages":{"v:\"…\"":{}},
/// "f:conditions":{"k:{\"type\":\"…\"}":{…}}}}`). Managers holding nothing of the
/// status are left out.
pub fn held_by_managers<'a>(entries: impl IntoIterator<Item = (&'a str, &'a Value)>) -> BTreeMap<String, Held> {
    let mut out: BTreeMap<String, Held> = BTreeMap::new();
    for (manager, fields) in entries {
        if !manager.starts_with("egressd-") {
            continue;
        }
        let Some(status) = fields.get("f:status").and_then(Value::as_object) else { continue };
        let mut held = Held { status: status.contains_key("f:status"), ..Held::default() };
        let keys = |field: &str| status.get(field).and_then(Value::as_object).into_iter().flat_map(|m| m.keys());
        for k in keys("f:messages") {
            if let Some(Value::String(m)) = k.strip_prefix("v:").and_then(|v| serde_json::from_str(v).ok()) {
                held.messages.insert(m);
            }
        }
        for k in keys("f:conditions") {
            let key: Option<Value> = k.strip_prefix("k:").and_then(|v| serde_json::from_str(v).ok());
            if let Some(t) = key.as_ref().and_then(|v| v.get("type")).and_then(Value::as_str) {
                held.conditions.insert(t.to_string());
            }
        }
        if !held.is_empty() {
            // A manager has one entry per operation and subresource; merge them.
            let into = out.entry(manager.to_string()).or_default();
            into.status |= held.status;
            into.messages.extend(held.messages);
            into.conditions.extend(held.conditions);
        }
    }
    out
}

/// The observed objects, shared by the Kubernetes source (writer) and the status writer
/// (reader), with a notification on every change.
#[derive(Debug, Clone, Default)]
pub struct StatusBoard {
    objects: Arc<Mutex<BTreeMap<ObjectKey, Observed>>>,
    changed: Arc<Notify>,
}

impl StatusBoard {
    /// Record what is stored for `key`; returns whether it differs from before.
    pub fn set(&self, key: &ObjectKey, observed: Observed) -> bool {
        let Ok(mut map) = self.objects.lock() else { return false };
        if map.get(key) == Some(&observed) {
            return false;
        }
        map.insert(key.clone(), observed);
        drop(map);
        self.changed.notify_one();
        true
    }

    /// Forget a deleted object.
    pub fn remove(&self, key: &ObjectKey) {
        let removed = self.objects.lock().map(|mut m| m.remove(key).is_some()).unwrap_or(false);
        if removed {
            self.changed.notify_one();
        }
    }

    /// A copy of everything observed.
    pub(crate) fn snapshot(&self) -> BTreeMap<ObjectKey, Observed> {
        self.objects.lock().map(|m| m.clone()).unwrap_or_default()
    }

    /// Wait until something changes (a change since the last wait counts).
    pub async fn changed(&self) {
        self.changed.notified().await;
    }
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
        let held = held_by_managers([
            ("egressd-leader", &leader),
            ("egressd-node-b", &node),
            ("egressd-node-c", &released),
            ("kubectl-client-side-apply", &leader),
            ("egressd-node-d", &spec),
        ]);
        assert_eq!(held.keys().collect::<Vec<_>>(), ["egressd-leader", "egressd-node-b"], "{held:?}");
        let l = &held["egressd-leader"];
        assert!(l.status);
        assert_eq!(
            l.messages.iter().collect::<Vec<_>>(),
            ["node-a: EgressFirewall Rules applied", "node-b: EgressFirewall Rules applied"]
        );
        let n = &held["egressd-node-b"];
        assert!(!n.status && n.messages.is_empty());
        assert_eq!(n.conditions.iter().collect::<Vec<_>>(), ["Ready-In-Zone-node-b"]);
    }
}
