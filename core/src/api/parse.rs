//! One document (already decoded from YAML or JSON) → one typed object.
//!
//! Layers, in the order the apiserver applies them: type lookup (`apiVersion`/`kind`),
//! generic metadata checks, the CRD's structural schema (strict: unknown fields are
//! errors), then decoding into the wire types. What the apiserver would store but the
//! reference controller refuses (a malformed `cidrSelector`, say) is *not* rejected here:
//! it is stored and reported by the policy layer ([`crate::view::policy`]).

use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::types::{CloudPrivateIPConfig, EgressFirewall, EgressIP, EgressQoS};
use super::{Kind, ObjectKey, crds, meta, schema};

/// A decoded object of one of the kinds egressd reads.
#[derive(Debug, Clone)]
#[allow(clippy::large_enum_variant)]
pub enum Object {
    /// An EgressFirewall.
    EgressFirewall(EgressFirewall),
    /// An EgressQoS.
    EgressQoS(EgressQoS),
    /// An EgressIP.
    EgressIP(EgressIP),
    /// A CloudPrivateIPConfig.
    CloudPrivateIPConfig(CloudPrivateIPConfig),
    /// A Namespace.
    Namespace(Namespace),
    /// A Pod.
    Pod(Pod),
    /// A Node.
    Node(Node),
}

impl Object {
    /// The object's identity.
    pub fn key(&self) -> ObjectKey {
        fn k(kind: Kind, m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> ObjectKey {
            let ns = if kind.namespaced() { m.namespace.clone().unwrap_or_default() } else { String::new() };
            ObjectKey::new(kind, ns, m.name.clone().unwrap_or_default())
        }
        match self {
            Object::EgressFirewall(o) => k(Kind::EgressFirewall, &o.metadata),
            Object::EgressQoS(o) => k(Kind::EgressQoS, &o.metadata),
            Object::EgressIP(o) => k(Kind::EgressIP, &o.metadata),
            Object::CloudPrivateIPConfig(o) => k(Kind::CloudPrivateIPConfig, &o.metadata),
            Object::Namespace(o) => k(Kind::Namespace, &o.metadata),
            Object::Pod(o) => k(Kind::Pod, &o.metadata),
            Object::Node(o) => k(Kind::Node, &o.metadata),
        }
    }
}

/// What a document turned out to be.
#[derive(Debug, Clone)]
#[allow(clippy::large_enum_variant)]
pub enum Parsed {
    /// An object egressd reads.
    Object(Object),
    /// A well-formed document of a kind egressd does not read (a Deployment, say).
    Ignored {
        /// Its `apiVersion`.
        api_version: String,
        /// Its `kind`.
        kind: String,
    },
}

/// Why a document was rejected: every violation found, each naming its field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}{}", key.as_ref().map(|k| format!("{k}: ")).unwrap_or_default(), violations.join("; "))]
pub struct ParseError {
    /// The object's identity, when the document got far enough to tell.
    pub key: Option<ObjectKey>,
    /// The violations, apiserver-style (`spec.egress[0].type: ...`).
    pub violations: Vec<String>,
}

/// The annotation only ovnkube-cluster-manager may set (ValidatingAdmissionPolicy
/// `egressip-mark-annotation-validation`, installed by the helm chart and by OpenShift).
pub(crate) const EGRESSIP_MARK_ANNOTATION: &str = "k8s.ovn.org/egressip-mark";

/// Decode one document. `default_namespace` fills a missing namespace of namespaced
/// kinds (as `kubectl apply` does). With `as_created_by_user`, the admission policies
/// that guard user-created objects apply too (manifests are created by users; objects
/// read back from an API server are not).
pub fn parse_document(doc: &Value, default_namespace: &str, as_created_by_user: bool) -> Result<Parsed, ParseError> {
    let fail = |key: Option<ObjectKey>, violations: Vec<String>| ParseError { key, violations };
    let Some(map) = doc.as_object() else {
        return Err(fail(None, vec!["document is not a mapping (expected a Kubernetes object)".into()]));
    };
    let api_version = map.get("apiVersion").and_then(Value::as_str);
    let kind_name = map.get("kind").and_then(Value::as_str);
    let (Some(api_version), Some(kind_name)) = (api_version, kind_name) else {
        let mut v = Vec::new();
        if api_version.is_none() {
            v.push("apiVersion: Required value".to_string());
        }
        if kind_name.is_none() {
            v.push("kind: Required value".to_string());
        }
        return Err(fail(None, v));
    };
    let Some(kind) = Kind::from_type(api_version, kind_name) else {
        // One of egressd's kinds under a version that does not exist is a mistake, not
        // another program's object.
        if let Some(known) =
            Kind::ALL.iter().find(|k| k.as_str() == kind_name && same_group(k.api_version(), api_version))
        {
            return Err(fail(
                None,
                vec![format!(
                    "apiVersion: Unsupported value: {api_version:?}: kind {kind_name} is served as {:?}",
                    known.api_version()
                )],
            ));
        }
        return Ok(Parsed::Ignored { api_version: api_version.into(), kind: kind_name.into() });
    };

    let mut doc = doc.clone();
    if kind.namespaced()
        && let Some(meta) = doc.get_mut("metadata").and_then(Value::as_object_mut)
        && !meta.contains_key("namespace")
    {
        meta.insert("namespace".into(), Value::String(default_namespace.to_string()));
    }
    let name = doc.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default();
    let namespace = if kind.namespaced() {
        doc.pointer("/metadata/namespace").and_then(Value::as_str).unwrap_or_default()
    } else {
        ""
    };
    let key = (!name.is_empty()).then(|| ObjectKey::new(kind, namespace, name));

    let violations = violations(kind, &doc, name, as_created_by_user);
    if !violations.is_empty() {
        return Err(fail(key, violations));
    }

    fn decode<T: DeserializeOwned>(doc: Value, key: &Option<ObjectKey>) -> Result<T, ParseError> {
        serde_path_to_error::deserialize(doc)
            .map_err(|e| ParseError { key: key.clone(), violations: vec![format!("{}: {}", e.path(), e.inner())] })
    }
    let object = match kind {
        Kind::EgressFirewall => Object::EgressFirewall(decode(doc, &key)?),
        Kind::EgressQoS => Object::EgressQoS(decode(doc, &key)?),
        Kind::EgressIP => Object::EgressIP(decode(doc, &key)?),
        Kind::CloudPrivateIPConfig => Object::CloudPrivateIPConfig(decode(doc, &key)?),
        Kind::Namespace => Object::Namespace(decode(doc, &key)?),
        Kind::Pod => Object::Pod(decode(doc, &key)?),
        Kind::Node => Object::Node(decode(doc, &key)?),
    };
    Ok(Parsed::Object(object))
}

/// What the API server's validation (and, with `as_created_by_user`, the admission
/// policies guarding user-created objects) would refuse in `doc`, a `kind` named `name`.
fn violations(kind: Kind, doc: &Value, name: &str, as_created_by_user: bool) -> Vec<String> {
    let mut violations = meta::check(doc.get("metadata"), kind.is_custom() || kind == Kind::Node);
    if kind == Kind::Namespace && !name.is_empty() && !meta::is_dns1123_label(name) {
        violations.push(format!("metadata.name: Invalid value: {name:?}: a namespace name must be a DNS-1123 label"));
    }
    if kind.is_custom() {
        violations.extend(schema::validate(crds::schema(kind), doc).into_iter().map(|v| v.message));
    }
    if kind == Kind::Pod {
        pod_ip_violations(doc, &mut violations);
    }
    if as_created_by_user
        && kind == Kind::EgressIP
        && doc
            .pointer("/metadata/annotations")
            .and_then(Value::as_object)
            .is_some_and(|a| a.contains_key(EGRESSIP_MARK_ANNOTATION))
    {
        violations.push(format!(
            "metadata.annotations: EgressIP resources cannot be created with the \
             \"{EGRESSIP_MARK_ANNOTATION}\" annotation. This annotation is managed by the system."
        ));
    }
    violations
}

/// As the API server validates a pod's status: every pod IP is an IP address.
fn pod_ip_violations(doc: &Value, violations: &mut Vec<String>) {
    let ips = doc.pointer("/status/podIPs").and_then(Value::as_array).into_iter().flatten();
    for (i, ip) in ips.enumerate() {
        if let Some(s) = ip.get("ip").and_then(Value::as_str)
            && s.parse::<std::net::IpAddr>().is_err()
        {
            violations.push(format!("status.podIPs[{i}].ip: Invalid value: {s:?}: must be a valid IP address"));
        }
    }
    if let Some(s) = doc.pointer("/status/podIP").and_then(Value::as_str)
        && !s.is_empty()
        && s.parse::<std::net::IpAddr>().is_err()
    {
        violations.push(format!("status.podIP: Invalid value: {s:?}: must be a valid IP address"));
    }
}

/// Whether two apiVersions are of the same group (`v1` is the core group).
fn same_group(a: &str, b: &str) -> bool {
    let group = |v: &str| v.rsplit_once('/').map_or("", |(g, _)| g).to_string();
    group(a) == group(b)
}

/// Split a YAML stream into documents the way kubectl's reader does: at lines that are
/// `---` (optionally followed by whitespace or a comment). Returns each document's text
/// with its 1-based number among the non-empty documents and its first line number.
pub fn split_documents(text: &str) -> Vec<(usize, usize, String)> {
    let mut docs = Vec::new();
    let mut current = String::new();
    let mut start_line = 1;
    let mut has_content = false;
    let mut flush = |current: &mut String, has_content: &mut bool, start: usize| {
        if *has_content {
            let n = docs.len() + 1;
            docs.push((n, start, std::mem::take(current)));
        } else {
            current.clear();
        }
        *has_content = false;
    };
    for (i, line) in text.lines().enumerate() {
        let is_separator =
            line == "---" || line.strip_prefix("---").is_some_and(|rest| rest.starts_with([' ', '\t', '#']));
        if is_separator {
            flush(&mut current, &mut has_content, start_line);
            start_line = i + 2;
            continue;
        }
        let trimmed = line.trim();
        if !trimmed.is_empty() && !trimmed.starts_with('#') && trimmed != "..." {
            if !has_content {
                start_line = i + 1;
            }
            has_content = true;
        }
        current.push_str(line);
        current.push('\n');
    }
    flush(&mut current, &mut has_content, start_line);
    docs
}

/// A YAML document that does not parse: the first line of the parser's message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid YAML: {0}")]
pub struct YamlError(pub String);

/// Decode a YAML document's text to a JSON value.
pub fn yaml_to_value(text: &str) -> Result<Value, YamlError> {
    let options = serde_saphyr::options! { with_snippet: false };
    serde_saphyr::from_str_with_options::<Value>(text, options)
        .map_err(|e| YamlError(e.to_string().lines().next().unwrap_or_default().to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_like_kubectl() {
        let docs = split_documents("# header\n---\na: 1\n--- # two\nb: 2\n---\n\n---\nc: 3\n");
        let bodies: Vec<_> = docs.iter().map(|(n, l, t)| (*n, *l, t.trim().to_string())).collect();
        assert_eq!(bodies, vec![(1, 3, "a: 1".into()), (2, 5, "b: 2".into()), (3, 9, "c: 3".into())]);
    }

    #[test]
    fn unknown_kinds_are_ignored_not_errors() {
        let v = serde_json::json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "x"}});
        assert!(matches!(parse_document(&v, "default", true), Ok(Parsed::Ignored { .. })));
    }

    #[test]
    fn missing_namespace_defaults() {
        let v = serde_json::json!({"apiVersion": "k8s.ovn.org/v1", "kind": "EgressFirewall",
            "metadata": {"name": "default"}, "spec": {"egress": []}});
        let Ok(Parsed::Object(o)) = parse_document(&v, "team-a", true) else { panic!() };
        assert_eq!(o.key(), ObjectKey::new(Kind::EgressFirewall, "team-a", "default"));
    }
}
