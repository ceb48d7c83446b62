//! Kubernetes Events: the objects rejected (the leader records them) and what this node
//! could not apply (every node, for its own problems), each recorded once.

use super::*;

/// Rejected objects: (object, error). Every agent's snapshot carries them (a scan of the
/// view without copies); only the leader emits their Events.
pub(super) fn rejections(view: &ClusterView) -> Vec<(ObjectKey, String)> {
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
pub(super) fn node_problems(desired: &Desired) -> Vec<(ObjectKey, String)> {
    desired
        .statuses
        .iter()
        .filter(|s| s.key.kind == Kind::EgressIP && matches!(s.outcome, Outcome::Failed(_)) && !s.cluster_only)
        .map(|s| (s.key.clone(), s.message()))
        .collect()
}

/// Why an Event is recorded: the object was rejected (leader), or this node could not
/// apply it (every node, for its own problems).
#[derive(Debug, Clone, Copy)]
pub(super) enum EventKind {
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
pub(super) type EventLog = BTreeMap<(ObjectKey, Option<String>), String>;

/// Record an Event for each (object, message) not recorded yet.
pub(super) async fn emit_once(
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unparsable_egress_ip_is_reported_in_the_references_words() {
        assert_eq!(
            egress_ip_event("e1", "spec.egressIPs: unable to parse provided EgressIP: 1.2.3, invalid"),
            "egress IP: 1.2.3 for object EgressIP: e1 is not a valid IP address"
        );
        assert_eq!(egress_ip_event("e1", "spec.namespaceSelector: bad"), "spec.namespaceSelector: bad");
    }
}
