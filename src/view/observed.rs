//! What the API server stores of each custom object besides its spec: its `uid` and its
//! `status` as last seen. Only the status writer reads it; it is *not* part of the
//! [`super::ClusterView`], so a status written by any node (an echo of a write) never
//! makes a node recompile.

use std::collections::BTreeMap;
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
