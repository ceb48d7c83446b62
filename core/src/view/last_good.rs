//! The last good version of every object whose current version is invalid (policy
//! objects, and Namespaces, Pods and Nodes from manifests with a schema error).
//!
//! The view keeps such a version in memory (nothing applied is lost because of a bad
//! edit); [`LastGood`] is that set as a value the agent saves in its state directory, so
//! that after a restart the namespace is still filtered by it instead of failing open.

use serde::{Deserialize, Serialize};

use super::policy::{CloudPrivateIp, EgressIpPolicy, FirewallPolicy, QosPolicy};
use super::{ClusterView, Entry, NamespaceInfo, NodeInfo, PodInfo};
use crate::api::{Kind, ObjectKey};

/// A saved policy, by kind.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum SavedPolicy {
    /// An EgressFirewall.
    EgressFirewall(FirewallPolicy),
    /// An EgressQoS.
    EgressQoS(QosPolicy),
    /// An EgressIP.
    EgressIP(EgressIpPolicy),
    /// A CloudPrivateIPConfig.
    CloudPrivateIPConfig(CloudPrivateIp),
    /// A Namespace.
    Namespace(NamespaceInfo),
    /// A Pod.
    Pod(PodInfo),
    /// A Node.
    Node(NodeInfo),
}

/// The format version written; a file of another version is ignored (with a warning).
pub const FORMAT: u32 = 1;

/// Last good versions of the objects that are invalid now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LastGood {
    /// [`FORMAT`].
    pub format: u32,
    /// (object, its last good version), sorted by object.
    pub objects: Vec<(ObjectKey, SavedPolicy)>,
}

impl Default for LastGood {
    fn default() -> Self {
        Self { format: FORMAT, objects: Vec::new() }
    }
}

fn kept<T: Clone>(entries: &super::Tracked<Entry<T>>, wrap: fn(T) -> SavedPolicy) -> Vec<(ObjectKey, SavedPolicy)> {
    entries
        .values()
        .filter(|e| e.error.is_some())
        .filter_map(|e| e.policy.as_deref().map(|p| (e.key.clone(), wrap(p.clone()))))
        .collect()
}

fn adopt<T: Clone>(entries: &mut super::Tracked<Entry<T>>, key: &ObjectKey, policy: &T) -> bool {
    let found = entries.iter().find(|(_, e)| &e.key == key && e.error.is_some() && e.policy.is_none());
    let Some(id) = found.map(|(id, _)| id.clone()) else { return false };
    match entries.get_mut(&id) {
        Some(e) => {
            e.policy = Some(std::sync::Arc::new(policy.clone()));
            true
        }
        None => false,
    }
}

/// A rejected core object without a version in the view gets the saved one.
fn adopt_core<T: Clone>(map: &mut super::Tracked<T>, id: String, saved: &T) -> bool {
    if map.contains_key(&id) {
        return false;
    }
    map.insert(id, saved.clone());
    true
}

impl ClusterView {
    /// The last good versions the view holds for objects that are invalid now.
    pub fn kept_last_good(&self) -> LastGood {
        let mut objects = kept(&self.firewalls, SavedPolicy::EgressFirewall);
        objects.extend(kept(&self.qos, SavedPolicy::EgressQoS));
        objects.extend(kept(&self.egress_ips, SavedPolicy::EgressIP));
        objects.extend(kept(&self.cloud_ips, SavedPolicy::CloudPrivateIPConfig));
        for key in &self.rejected_core {
            let saved = match key.kind {
                Kind::Namespace => self.namespaces.get(key.name.as_str()).cloned().map(SavedPolicy::Namespace),
                Kind::Pod => self
                    .pods
                    .get(&(key.namespace.to_string(), key.name.to_string()))
                    .map(|p| SavedPolicy::Pod((**p).clone())),
                Kind::Node => self.nodes.get(key.name.as_str()).cloned().map(SavedPolicy::Node),
                _ => None,
            };
            objects.extend(saved.map(|s| (key.clone(), s)));
        }
        objects.sort_by(|a, b| a.0.cmp(&b.0));
        LastGood { format: FORMAT, objects }
    }

    /// Give every object that is invalid and has no good version in the view (after a
    /// restart) its saved last good version. Objects that are valid, gone, or already
    /// have one are left alone. Returns whether the view changed.
    pub fn adopt_last_good(&mut self, saved: &LastGood) -> bool {
        let mut changed = false;
        for (key, policy) in &saved.objects {
            changed |= match policy {
                SavedPolicy::EgressFirewall(p) => adopt(&mut self.firewalls, key, p),
                SavedPolicy::EgressQoS(p) => adopt(&mut self.qos, key, p),
                SavedPolicy::EgressIP(p) => adopt(&mut self.egress_ips, key, p),
                SavedPolicy::CloudPrivateIPConfig(p) => adopt(&mut self.cloud_ips, key, p),
                SavedPolicy::Namespace(n) => {
                    self.rejected_core.contains(key) && adopt_core(&mut self.namespaces, key.name.to_string(), n)
                }
                SavedPolicy::Pod(p) => {
                    self.rejected_core.contains(key)
                        && self.pods.set_if_absent((key.namespace.to_string(), key.name.to_string()), p)
                }
                SavedPolicy::Node(n) => {
                    self.rejected_core.contains(key) && adopt_core(&mut self.nodes, key.name.to_string(), n)
                }
            };
        }
        changed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::Kind;
    use crate::view::policy::{Action, FirewallRule, Target};

    fn policy(cidr: &str) -> FirewallPolicy {
        FirewallPolicy {
            namespace: "a".into(),
            rules: vec![FirewallRule {
                action: Action::Deny,
                target: Target::Cidr(cidr.parse().unwrap()),
                ports: Default::default(),
            }],
            warnings: vec![],
            audit: false,
        }
    }

    #[test]
    fn only_invalid_objects_with_a_good_version_are_kept_and_adopted_after_a_restart() {
        let key = ObjectKey::new(Kind::EgressFirewall, "a", "default");
        let mut before = ClusterView::default();
        before
            .firewalls
            .insert("a".into(), Entry { key: key.clone(), policy: Some(policy("192.0.2.0/24").into()), error: None });
        assert!(before.kept_last_good().objects.is_empty(), "a valid object needs nothing saved");
        before.firewalls.get_mut("a").unwrap().error = Some("spec.egress[0]: bad".into());
        let saved = before.kept_last_good();
        assert_eq!(saved.objects, vec![(key.clone(), SavedPolicy::EgressFirewall(policy("192.0.2.0/24")))]);
        let json = serde_json::to_string(&saved).unwrap();
        let back: LastGood = serde_json::from_str(&json).unwrap();
        assert_eq!(back, saved);

        // After a restart the view has only the invalid version.
        let mut after = ClusterView::default();
        after.firewalls.insert("a".into(), Entry { key: key.clone(), policy: None, error: Some("bad".into()) });
        assert!(after.adopt_last_good(&back));
        assert_eq!(after.firewalls["a"].policy.as_deref(), Some(&policy("192.0.2.0/24")));
        assert!(!after.adopt_last_good(&back), "adopted once");
        assert_eq!(after.kept_last_good(), saved, "and kept while still invalid");

        // A valid version, or another object of the same namespace, is never overridden.
        let mut fixed = ClusterView::default();
        fixed.firewalls.insert(
            "a".into(),
            Entry { key: key.clone(), policy: Some(policy("198.51.100.0/24").into()), error: None },
        );
        assert!(!fixed.adopt_last_good(&back));
        let mut other = ClusterView::default();
        let other_key = ObjectKey::new(Kind::EgressFirewall, "b", "default");
        other.firewalls.insert("b".into(), Entry { key: other_key, policy: None, error: Some("bad".into()) });
        assert!(!other.adopt_last_good(&back));
    }
}
