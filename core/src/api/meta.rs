//! The apiserver's generic ObjectMeta checks that apply before any CRD schema: object
//! names (DNS-1123 subdomain for custom resources), namespaces, labels.

use std::sync::OnceLock;

use regex::Regex;
use serde_json::Value;

const DNS1123_SUBDOMAIN: &str = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$";
const DNS1123_LABEL: &str = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$";
const QUALIFIED_NAME: &str = r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$";
const LABEL_VALUE: &str = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$";

fn re(cell: &'static OnceLock<Regex>, pattern: &str) -> &'static Regex {
    // Infallible: every `pattern` is a constant of this module, compiled by its tests.
    #[allow(clippy::expect_used)]
    cell.get_or_init(|| Regex::new(pattern).expect("constant regex"))
}

/// Whether `s` is a DNS-1123 subdomain (object names of custom resources, nodes).
pub(crate) fn is_dns1123_subdomain(s: &str) -> bool {
    static R: OnceLock<Regex> = OnceLock::new();
    s.len() <= 253 && re(&R, DNS1123_SUBDOMAIN).is_match(s)
}

/// Whether `s` is a DNS-1123 label (namespace names).
pub(crate) fn is_dns1123_label(s: &str) -> bool {
    static R: OnceLock<Regex> = OnceLock::new();
    s.len() <= 63 && re(&R, DNS1123_LABEL).is_match(s)
}

/// Validate a label key (`[prefix/]name`). Returns the reason when invalid.
pub(crate) fn label_key_error(key: &str) -> Option<String> {
    static R: OnceLock<Regex> = OnceLock::new();
    let (prefix, name) = match key.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(p) = prefix
        && (p.is_empty() || !is_dns1123_subdomain(p))
    {
        return Some(format!("prefix part of {key:?} must be a DNS-1123 subdomain"));
    }
    if name.is_empty() || name.len() > 63 || !re(&R, QUALIFIED_NAME).is_match(name) {
        return Some(format!(
            "name part of {key:?} must consist of alphanumeric characters, '-', '_' or '.', \
             and must start and end with an alphanumeric character (at most 63 characters)"
        ));
    }
    None
}

/// Validate a label value. Returns the reason when invalid.
pub(crate) fn label_value_error(value: &str) -> Option<String> {
    static R: OnceLock<Regex> = OnceLock::new();
    if value.len() > 63 || !re(&R, LABEL_VALUE).is_match(value) {
        return Some(format!(
            "{value:?}: a valid label must be an empty string or consist of alphanumeric \
             characters, '-', '_' or '.', and must start and end with an alphanumeric \
             character (at most 63 characters)"
        ));
    }
    None
}

/// The API server's limit on the total size of an object's annotations
/// (`TotalAnnotationSizeLimitB`, 256 KiB).
pub const TOTAL_ANNOTATION_SIZE: usize = 256 * 1024;

/// Check `metadata` of a document: name present and valid, namespace valid when present,
/// labels valid, annotations within the API server's size limit. `name_must_be_subdomain`
/// is true for custom resources and nodes.
pub fn check(metadata: Option<&Value>, name_must_be_subdomain: bool) -> Vec<String> {
    let mut out = Vec::new();
    let Some(meta) = metadata.and_then(Value::as_object) else {
        out.push("metadata.name: Required value: name or generateName is required".to_string());
        return out;
    };
    if let Some(v) = meta.get("name").filter(|v| !v.is_string() && !v.is_null()) {
        out.push(format!(
            "metadata.name: Invalid value: {v}: must be a string (quote it: YAML reads \
             y/n/yes/no/on/off and numbers as other types)"
        ));
        return out;
    }
    match meta.get("name").and_then(Value::as_str) {
        None | Some("") => out.push("metadata.name: Required value: name or generateName is required".to_string()),
        Some(name) if name_must_be_subdomain && !is_dns1123_subdomain(name) => out.push(format!(
            "metadata.name: Invalid value: {name:?}: a lowercase RFC 1123 subdomain must consist \
             of lower case alphanumeric characters, '-' or '.', and must start and end with an \
             alphanumeric character"
        )),
        Some(_) => {}
    }
    // The API server's limit on all annotations of an object together (keys and values).
    if let Some(annotations) = meta.get("annotations").and_then(Value::as_object) {
        let size: usize =
            annotations.iter().map(|(k, v)| k.len() + v.as_str().map_or_else(|| v.to_string().len(), str::len)).sum();
        if size > TOTAL_ANNOTATION_SIZE {
            out.push(format!(
                "metadata.annotations: Too long: must have at most {TOTAL_ANNOTATION_SIZE} bytes (has {size})"
            ));
        }
    }
    if let Some(ns) = meta.get("namespace").and_then(Value::as_str)
        && !is_dns1123_label(ns)
    {
        out.push(format!(
            "metadata.namespace: Invalid value: {ns:?}: a lowercase RFC 1123 label must consist \
             of lower case alphanumeric characters or '-', and must start and end with an \
             alphanumeric character"
        ));
    }
    if let Some(labels) = meta.get("labels").and_then(Value::as_object) {
        for (k, v) in labels {
            if let Some(e) = label_key_error(k) {
                out.push(format!("metadata.labels: Invalid value: {k:?}: {e}"));
            }
            match v.as_str() {
                Some(v) => {
                    if let Some(e) = label_value_error(v) {
                        out.push(format!("metadata.labels: Invalid value: {e}"));
                    }
                }
                None => out.push(format!("metadata.labels.{k}: must be a string")),
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn names() {
        assert!(is_dns1123_subdomain("192.168.172.12"));
        assert!(is_dns1123_subdomain("fc00.f853.0ccd.e793.0000.0000.0000.0054"));
        assert!(!is_dns1123_subdomain("fc00:f853::54"));
        assert!(!is_dns1123_subdomain("Not_An_IP"));
        assert!(is_dns1123_label("egress-firewall-policy-8412"));
        assert!(!is_dns1123_label("a.b"));
    }

    #[test]
    fn labels() {
        assert!(label_key_error("topology.kubernetes.io/zone").is_none());
        assert!(label_key_error("k8s.ovn.org/egress-assignable").is_none());
        assert!(label_key_error("-bad").is_some());
        assert!(label_value_error("").is_none());
        assert!(label_value_error("bad value").is_some());
    }

    #[test]
    fn metadata_errors_name_the_field() {
        assert_eq!(
            check(Some(&json!({})), true),
            vec!["metadata.name: Required value: name or generateName is required"]
        );
        let errs = check(Some(&json!({"name": "x", "labels": {"a": "b c"}})), true);
        assert_eq!(errs.len(), 1);
        assert!(errs[0].starts_with("metadata.labels: Invalid value"));
    }
}
