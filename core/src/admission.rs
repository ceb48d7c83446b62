//! What a node agent may write (issue #41, the split layout's per-node enforcement): the
//! pure decision of the controller's validating admission webhook.
//!
//! Kubernetes RBAC cannot say "its own node", so the node identity's shared writes are
//! checked here, per request, against the node the writing pod runs on (the API server
//! names the pod of a pod-bound service-account token in the user's extra fields;
//! [`caller`]). A node agent may change:
//! * its own pod's [`EGRESS_SUBNETS_ANNOTATION`] (the controller copies it onto the
//!   Node: node agents write no Node), and nothing else of any pod;
//! * its own entries of EgressFirewall and EgressQoS statuses (`<node>: …` messages,
//!   `Ready-In-Zone-<node>` conditions), never another node's nor the aggregate;
//! * the status and egressd's finalizer of a CloudPrivateIPConfig that asks for its node
//!   (`spec.node`) or that its node holds (`status.node`), never the spec, and
//!   `status.node` only to itself or empty.
//!
//! Everything else a request of the node identity asks (another kind, a create, a
//! delete) is refused. Anyone else's request is allowed: the webhook only guards the node
//! identity ([`Caller::Other`]).

use serde_json::{Map, Value, json};

use crate::compile::{QOS_CONDITION_PREFIX, parse_message};
use crate::view::EGRESS_SUBNETS_ANNOTATION;
use crate::view::policy::CLOUD_FINALIZER;

/// The user extra fields of a pod-bound service-account token.
pub const POD_NAME_EXTRA: &str = "authentication.kubernetes.io/pod-name";
/// See [`POD_NAME_EXTRA`].
pub const POD_UID_EXTRA: &str = "authentication.kubernetes.io/pod-uid";

/// Who sent a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    /// The node identity with a pod-bound token: the pod (namespace, name, uid) whose
    /// node the request may speak for.
    NodeAgent {
        /// The service account's namespace (the pod's).
        namespace: String,
        /// The pod's name.
        pod: String,
        /// The pod's uid, as the token was issued for it.
        uid: String,
    },
    /// The node identity without a pod binding (a long-lived secret token): it speaks
    /// for no node.
    Unbound,
    /// Anyone else.
    Other,
}

/// Who sent `request` (an AdmissionReview's `request`), `node_user` being the node
/// identity's user name (`system:serviceaccount:<namespace>:<name>`).
pub fn caller(request: &Value, node_user: &str) -> Caller {
    let user = &request["userInfo"];
    if user["username"].as_str() != Some(node_user) {
        return Caller::Other;
    }
    let extra = |key: &str| user["extra"][key][0].as_str().filter(|s| !s.is_empty()).map(str::to_string);
    let namespace = node_user.strip_prefix("system:serviceaccount:").and_then(|r| r.split_once(':')).map(|(ns, _)| ns);
    match (namespace, extra(POD_NAME_EXTRA), extra(POD_UID_EXTRA)) {
        (Some(namespace), Some(pod), Some(uid)) => Caller::NodeAgent { namespace: namespace.to_string(), pod, uid },
        _ => Caller::Unbound,
    }
}

/// The node agent a request comes from: its pod and the pod's node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeAgent<'a> {
    /// The node it runs on (the pod's `spec.nodeName`).
    pub node: &'a str,
    /// Its pod's namespace.
    pub namespace: &'a str,
    /// Its pod's name.
    pub pod: &'a str,
}

/// Whether `agent` may do what `request` asks: `Err` says why not, in words that name
/// the object and what was refused.
pub fn decide(request: &Value, agent: &NodeAgent) -> Result<(), String> {
    let node = agent.node;
    let resource = &request["resource"];
    let what = (
        resource["group"].as_str().unwrap_or(""),
        resource["resource"].as_str().unwrap_or(""),
        request["subResource"].as_str().unwrap_or(""),
    );
    let operation = request["operation"].as_str().unwrap_or("");
    let name = request["name"].as_str().unwrap_or("");
    let refuse = |why: String| Err(format!("egressd node agent of node {node:?}: {why}"));
    let full = if what.2.is_empty() { what.1.to_string() } else { format!("{}/{}", what.1, what.2) };
    if operation != "UPDATE" {
        return refuse(format!("may not {} {full} {name:?}", operation.to_lowercase()));
    }
    let (old, new) = (&request["oldObject"], &request["object"]);
    match what {
        ("", "pods", "") => {
            let namespace = request["namespace"].as_str().unwrap_or("");
            if (namespace, name) != (agent.namespace, agent.pod) {
                return refuse(format!("may not change pod {namespace}/{name}, only its own"));
            }
            same_but(old, new, |o| drop(annotations(o).map(|a| a.remove(EGRESS_SUBNETS_ANNOTATION)))).map_err(|field| {
                format!("egressd node agent of node {node:?}: may change only the {EGRESS_SUBNETS_ANNOTATION} annotation of its pod, not {field}")
            })
        }
        ("k8s.ovn.org", "egressfirewalls", "status") => same_but(old, new, |o| {
            keep(o, "messages", |m| m.as_str().and_then(parse_message).is_none_or(|(n, _)| n != node))
        })
        .map_err(|field| {
            format!("egressd node agent of node {node:?}: may change only its own entry of EgressFirewall {name:?}'s status, not {field}")
        }),
        ("k8s.ovn.org", "egressqoses", "status") => {
            let own = format!("{QOS_CONDITION_PREFIX}{node}");
            same_but(old, new, |o| keep(o, "conditions", |c| c["type"].as_str() != Some(own.as_str()))).map_err(|field| {
                format!("egressd node agent of node {node:?}: may change only its own condition of EgressQoS {name:?}'s status, not {field}")
            })
        }
        ("cloud.network.openshift.io", "cloudprivateipconfigs", sub @ ("" | "status")) => cloud_config(old, new, node, name, sub),
        _ => refuse(format!("may not change {full} {name:?}")),
    }
}

/// A CloudPrivateIPConfig's status or egressd's finalizer, by the node it names.
fn cloud_config(old: &Value, new: &Value, node: &str, name: &str, sub: &str) -> Result<(), String> {
    let refuse = |why: String| Err(format!("egressd node agent of node {node:?}: {why}"));
    let named = |o: &Value, path: [&str; 2]| o[path[0]][path[1]].as_str() == Some(node);
    if !named(old, ["spec", "node"]) && !named(old, ["status", "node"]) {
        return refuse(format!(
            "may not change CloudPrivateIPConfig {name:?}, which neither asks for nor is held by its node"
        ));
    }
    if sub == "status" {
        let to = new["status"]["node"].as_str().unwrap_or("");
        if !to.is_empty() && to != node {
            return refuse(format!("may not give CloudPrivateIPConfig {name:?} to node {to:?} (status.node)"));
        }
        return same_but(old, new, |o| drop(o.as_object_mut().map(|m| m.remove("status")))).map_err(|field| {
            format!("egressd node agent of node {node:?}: may change only the status of CloudPrivateIPConfig {name:?}, not {field}")
        });
    }
    same_but(old, new, |o| {
        if let Some(list) = o.pointer_mut("/metadata/finalizers").and_then(Value::as_array_mut) {
            list.retain(|f| f.as_str() != Some(CLOUD_FINALIZER));
            if list.is_empty() {
                drop(o.pointer_mut("/metadata").and_then(Value::as_object_mut).map(|m| m.remove("finalizers")));
            }
        }
    })
    .map_err(|field| {
        format!("egressd node agent of node {node:?}: may change only the finalizer {CLOUD_FINALIZER} of CloudPrivateIPConfig {name:?}, not {field}")
    })
}

/// `Ok` when `old` and `new` are equal once `allowed` took out of both what the caller
/// may change (and the bookkeeping the API server itself changes); else the first field
/// that differs.
fn same_but(old: &Value, new: &Value, allowed: impl Fn(&mut Value)) -> Result<(), String> {
    let rest = |v: &Value| {
        let mut v = v.clone();
        allowed(&mut v);
        if let Some(meta) = v.get_mut("metadata").and_then(Value::as_object_mut) {
            for field in ["resourceVersion", "managedFields", "generation"] {
                meta.remove(field);
            }
            if meta.get("annotations").and_then(Value::as_object).is_some_and(Map::is_empty) {
                meta.remove("annotations");
            }
        }
        v
    };
    first_difference(&rest(old), &rest(new), "").map_or(Ok(()), Err)
}

/// The path of the first field where `a` and `b` differ.
fn first_difference(a: &Value, b: &Value, at: &str) -> Option<String> {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let mut keys: Vec<&String> = x.keys().chain(y.keys()).collect();
            keys.sort();
            keys.dedup();
            keys.into_iter().find_map(|k| {
                let path = if at.is_empty() { k.clone() } else { format!("{at}.{k}") };
                first_difference(x.get(k).unwrap_or(&Value::Null), y.get(k).unwrap_or(&Value::Null), &path)
            })
        }
        _ if a == b => None,
        _ => Some(if at.is_empty() { "the object".to_string() } else { at.to_string() }),
    }
}

fn annotations(o: &mut Value) -> Option<&mut Map<String, Value>> {
    o.pointer_mut("/metadata/annotations").and_then(Value::as_object_mut)
}

/// Keep of `status.<list>` the entries `keep` accepts, sorted (the order of the others'
/// entries is the API server's merge, not the caller's).
fn keep(o: &mut Value, list: &str, keep: impl Fn(&Value) -> bool) {
    if let Some(entries) = o.pointer_mut(&format!("/status/{list}")).and_then(Value::as_array_mut) {
        entries.retain(|e| keep(e));
        entries.sort_by_key(|e| e.to_string());
    }
}

/// The AdmissionReview answer to `request`.
pub fn review(request: &Value, verdict: &Result<(), String>) -> Value {
    let mut response = json!({ "uid": request["uid"], "allowed": verdict.is_ok() });
    if let Err(message) = verdict {
        response["status"] = json!({ "code": 403, "reason": "Forbidden", "message": message });
    }
    json!({ "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response })
}

#[cfg(test)]
mod tests {
    use super::*;

    const NODE_USER: &str = "system:serviceaccount:egressd:egressd";

    fn request(resource: (&str, &str, &str), name: &str, old: Value, new: Value) -> Value {
        json!({
            "uid": "u1", "operation": "UPDATE", "name": name,
            "resource": {"group": resource.0, "version": "v1", "resource": resource.1},
            "subResource": resource.2,
            "userInfo": {"username": NODE_USER, "extra": {POD_NAME_EXTRA: ["egressd-x"], POD_UID_EXTRA: ["uid-x"]}},
            "oldObject": old, "object": new,
        })
    }

    fn pod(name: &str, annotations: Value, labels: Value) -> Value {
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": name, "namespace": "egressd", "resourceVersion": "7", "annotations": annotations, "labels": labels},
               "spec": {"nodeName": "b", "tolerations": []}})
    }

    const PODS: (&str, &str, &str) = ("", "pods", "");
    const B: NodeAgent = NodeAgent { node: "b", namespace: "egressd", pod: "egressd-x" };

    fn on_pod(mut r: Value, namespace: &str) -> Value {
        r["namespace"] = json!(namespace);
        r
    }

    #[test]
    fn the_node_identity_is_told_apart_by_its_pod_binding() {
        let r = request(PODS, "egressd-x", json!({}), json!({}));
        assert_eq!(
            caller(&r, NODE_USER),
            Caller::NodeAgent { namespace: "egressd".into(), pod: "egressd-x".into(), uid: "uid-x".into() }
        );
        let mut unbound = r.clone();
        unbound["userInfo"]["extra"] = json!({});
        assert_eq!(caller(&unbound, NODE_USER), Caller::Unbound);
        let mut other = r;
        other["userInfo"]["username"] = json!("system:node:b");
        assert_eq!(caller(&other, NODE_USER), Caller::Other);
    }

    #[test]
    fn a_node_agent_changes_only_its_own_pods_subnets_annotation() {
        let r = |name: &str, old: &Value, new: &Value| on_pod(request(PODS, name, old.clone(), new.clone()), "egressd");
        let before = pod("egressd-x", json!({"x": "1"}), json!({"l": "1"}));
        let mut subnets = before.clone();
        subnets["metadata"]["annotations"][EGRESS_SUBNETS_ANNOTATION] = json!("[\"198.18.0.0/24\"]");
        subnets["metadata"]["resourceVersion"] = json!("8");
        assert_eq!(decide(&r("egressd-x", &before, &subnets), &B), Ok(()));
        // The first annotation of a pod that had none.
        let bare = pod("egressd-x", Value::Null, json!({}));
        let mut first = bare.clone();
        first["metadata"]["annotations"] = json!({EGRESS_SUBNETS_ANNOTATION: "[]"});
        assert_eq!(decide(&r("egressd-x", &bare, &first), &B), Ok(()));
        // Another pod, of the same name in another namespace too.
        let other = decide(&r("egressd-y", &before, &subnets), &B).unwrap_err();
        assert!(other.contains("may not change pod egressd/egressd-y"), "{other}");
        let elsewhere = on_pod(request(PODS, "egressd-x", before.clone(), subnets), "default");
        assert!(decide(&elsewhere, &B).is_err());
        // A label, a toleration, another annotation of its own pod.
        let mut label = before.clone();
        label["metadata"]["labels"]["app"] = json!("x");
        let e = decide(&r("egressd-x", &before, &label), &B).unwrap_err();
        assert!(e.contains("not metadata.labels.app"), "{e}");
        let mut toleration = before.clone();
        toleration["spec"]["tolerations"] = json!([{"operator": "Exists"}]);
        assert!(decide(&r("egressd-x", &before, &toleration), &B).unwrap_err().contains("spec.tolerations"));
        let mut other_annotation = before.clone();
        other_annotation["metadata"]["annotations"]["x"] = json!("2");
        assert!(decide(&r("egressd-x", &before, &other_annotation), &B).is_err());
    }

    fn firewall(messages: &[&str], status: &str) -> Value {
        json!({"apiVersion": "k8s.ovn.org/v1", "kind": "EgressFirewall",
               "metadata": {"name": "default", "namespace": "a"},
               "spec": {"egress": []}, "status": {"messages": messages, "status": status}})
    }

    #[test]
    fn a_node_agent_writes_only_its_own_status_entries() {
        let ef = ("k8s.ovn.org", "egressfirewalls", "status");
        let applied = "EgressFirewall Rules applied";
        let (b_ok, c_ok) = (format!("b: {applied}"), format!("c: {applied}"));
        let b_bad = "b: EgressFirewall Rules not correctly applied: nft refused".to_string();
        let old = firewall(&[&c_ok, &b_ok], applied);
        // Its own entry, changed, removed, added.
        assert_eq!(decide(&request(ef, "default", old.clone(), firewall(&[&c_ok, &b_bad], applied)), &B), Ok(()));
        assert_eq!(decide(&request(ef, "default", old.clone(), firewall(&[&c_ok], applied)), &B), Ok(()));
        assert_eq!(decide(&request(ef, "default", firewall(&[&c_ok], applied), old.clone()), &B), Ok(()));
        // Another node's entry, or the aggregate.
        let e = decide(&request(ef, "default", old.clone(), firewall(&[&b_ok], applied)), &B).unwrap_err();
        assert!(e.contains("own entry of EgressFirewall \"default\"") && e.contains("status.messages"), "{e}");
        let c_bad = "c: EgressFirewall Rules not correctly applied: x";
        assert!(decide(&request(ef, "default", old.clone(), firewall(&[c_bad, &b_ok], applied)), &B).is_err());
        let aggregate = firewall(&[&c_ok, &b_ok], "EgressFirewall Rules not correctly applied");
        assert!(decide(&request(ef, "default", old, aggregate), &B).unwrap_err().contains("status.status"));

        let qos = ("k8s.ovn.org", "egressqoses", "status");
        let q = |conditions: Value| json!({"metadata": {"name": "default", "namespace": "a"}, "status": {"status": "ok", "conditions": conditions}});
        let cond = |n: &str, s: &str| json!({"type": format!("Ready-In-Zone-{n}"), "status": s});
        let old = q(json!([cond("c", "True"), cond("b", "True")]));
        assert_eq!(
            decide(&request(qos, "default", old.clone(), q(json!([cond("c", "True"), cond("b", "False")]))), &B),
            Ok(())
        );
        assert!(
            decide(&request(qos, "default", old.clone(), q(json!([cond("c", "False"), cond("b", "True")]))), &B)
                .is_err()
        );
        assert!(decide(&request(qos, "default", old, q(json!([cond("b", "True")]))), &B).is_err());
    }

    fn config(spec_node: &str, status_node: &str, finalizers: &[&str]) -> Value {
        json!({"apiVersion": "cloud.network.openshift.io/v1", "kind": "CloudPrivateIPConfig",
               "metadata": {"name": "198.18.9.1", "finalizers": finalizers},
               "spec": {"node": spec_node}, "status": {"node": status_node, "conditions": []}})
    }

    #[test]
    fn a_node_agent_writes_only_the_configs_of_its_node() {
        let main = ("cloud.network.openshift.io", "cloudprivateipconfigs", "");
        let status = ("cloud.network.openshift.io", "cloudprivateipconfigs", "status");
        let name = "198.18.9.1";
        // Asked to host: the finalizer, then the status.
        assert_eq!(decide(&request(main, name, config("b", "", &[]), config("b", "", &[CLOUD_FINALIZER])), &B), Ok(()));
        assert_eq!(decide(&request(status, name, config("b", "", &[]), config("b", "b", &[])), &B), Ok(()));
        // Moved away from it: it clears status.node; deleted: it removes the finalizer.
        assert_eq!(decide(&request(status, name, config("c", "b", &[]), config("c", "", &[])), &B), Ok(()));
        assert_eq!(
            decide(&request(main, name, config("c", "b", &[CLOUD_FINALIZER]), config("c", "b", &[])), &B),
            Ok(())
        );
        // Another node's config: its finalizer, its status.
        let e =
            decide(&request(main, name, config("c", "c", &[CLOUD_FINALIZER]), config("c", "c", &[])), &B).unwrap_err();
        assert!(e.contains("neither asks for nor is held by its node"), "{e}");
        assert!(decide(&request(status, name, config("c", "", &[]), config("c", "b", &[])), &B).is_err());
        // Its own config: the spec, another finalizer, giving it to another node.
        assert!(
            decide(&request(main, name, config("b", "", &[]), config("c", "", &[])), &B)
                .unwrap_err()
                .contains("spec.node")
        );
        assert!(decide(&request(main, name, config("b", "", &["x"]), config("b", "", &[])), &B).is_err());
        let e = decide(&request(status, name, config("b", "", &[]), config("b", "c", &[])), &B).unwrap_err();
        assert!(e.contains("to node \"c\""), "{e}");
    }

    #[test]
    fn a_node_agent_may_not_create_delete_or_write_other_kinds() {
        let mut create =
            request(("cloud.network.openshift.io", "cloudprivateipconfigs", ""), "x", Value::Null, json!({}));
        create["operation"] = json!("CREATE");
        assert!(decide(&create, &B).unwrap_err().contains("may not create"));
        let ip =
            request(("k8s.ovn.org", "egressips", ""), "e1", json!({"status": {}}), json!({"status": {"items": []}}));
        assert!(decide(&ip, &B).unwrap_err().contains("may not change egressips \"e1\""));
        let node = request(("", "nodes", ""), "b", json!({}), json!({}));
        assert!(decide(&node, &B).unwrap_err().contains("may not change nodes \"b\""));
    }

    #[test]
    fn the_answer_carries_the_requests_uid_and_the_reason() {
        let r = request(("", "nodes", ""), "c", json!({}), json!({}));
        let verdict = decide(&r, &B);
        let answer = review(&r, &verdict);
        assert_eq!(answer["response"]["uid"], "u1");
        assert_eq!(answer["response"]["allowed"], false);
        assert_eq!(answer["response"]["status"]["code"], 403);
        assert!(answer["response"]["status"]["message"].as_str().unwrap().contains("nodes \"c\""));
        assert_eq!(review(&r, &Ok(()))["response"]["allowed"], true);
    }
}
