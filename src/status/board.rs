//! The objects as the API server stores them ([`Observed`]), shared by the Kubernetes
//! source, which records them, and the status writer, which reads them and is woken on
//! every change.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use crate::api::ObjectKey;
use crate::view::observed::Observed;

/// The observed objects, shared by the Kubernetes source (writer) and the status writer
/// (reader), with a notification on every change.
#[derive(Debug, Clone, Default)]
pub struct StatusBoard {
    /// Copied on write: a snapshot costs a reference while the reader holds it, and a
    /// change copies the map only when a snapshot is still held.
    objects: Arc<Mutex<Arc<BTreeMap<ObjectKey, Observed>>>>,
    changed: Arc<Notify>,
}

impl StatusBoard {
    /// Record what is stored for `key`; returns whether it differs from before.
    pub fn set(&self, key: &ObjectKey, observed: Observed) -> bool {
        let Ok(mut map) = self.objects.lock() else { return false };
        if map.get(key) == Some(&observed) {
            return false;
        }
        Arc::make_mut(&mut map).insert(key.clone(), observed);
        drop(map);
        self.changed.notify_one();
        true
    }

    /// Forget a deleted object.
    pub fn remove(&self, key: &ObjectKey) {
        let removed = self
            .objects
            .lock()
            .map(|mut m| m.contains_key(key) && Arc::make_mut(&mut m).remove(key).is_some())
            .unwrap_or(false);
        if removed {
            self.changed.notify_one();
        }
    }

    /// Everything observed now (held as it is: drop it soon, or the next change copies
    /// the map).
    pub(crate) fn snapshot(&self) -> Arc<BTreeMap<ObjectKey, Observed>> {
        self.objects.lock().map(|m| Arc::clone(&m)).unwrap_or_default()
    }

    /// Wait until something changes (a change since the last wait counts).
    pub async fn changed(&self) {
        self.changed.notified().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_keeps_what_it_saw_and_costs_no_copy_once_dropped() {
        use crate::api::Kind;
        let board = StatusBoard::default();
        let key = |n: &str| ObjectKey::new(Kind::EgressFirewall, n, "default");
        let seen = |uid: &str| Observed { uid: Some(uid.into()), ..Observed::default() };
        assert!(board.set(&key("a"), seen("1")));
        assert!(!board.set(&key("a"), seen("1")), "the same again is no change");
        let held = board.snapshot();
        assert!(board.set(&key("b"), seen("2")));
        board.remove(&key("a"));
        assert_eq!(held.keys().collect::<Vec<_>>(), [&key("a")], "a held snapshot does not change");
        assert_eq!(board.snapshot().keys().collect::<Vec<_>>(), [&key("b")]);
        // Not held: a change is made in place.
        let at = Arc::as_ptr(&board.snapshot());
        drop(held);
        assert!(board.set(&key("c"), seen("3")));
        let now = board.snapshot();
        assert_eq!(Arc::as_ptr(&now), at, "changed in place");
        assert_eq!(now.len(), 2);
    }
}
