//! A structural-schema validator for the subset of OpenAPI v3 that the upstream CRDs use.
//!
//! egressd validates manifests against the *same* `openAPIV3Schema` it installs (the
//! upstream CRDs, embedded verbatim in [`crate::api::crds`]), so that the schema layer
//! accepts and rejects exactly what a kube-apiserver with those CRDs does — including the
//! upstream regex quirks (`^TCP|UDP|SCTP$` accepts `TCPX`). Messages follow the
//! apiserver's wording (`<path>: Invalid value: <v>: <path> in body should match '<re>'`).
//!
//! Supported keywords: `type`, `properties`, `required`, `additionalProperties`, `items`,
//! `pattern`, `minimum`, `maximum`, `minProperties`, `maxProperties`, `minItems`,
//! `maxItems`, `enum`, `format` (`cidr`, `ipv4`, `ipv6`, `date-time`, `int32`, `int64`),
//! `anyOf`, `nullable`, `x-kubernetes-list-type` (`set`, `map` with
//! `x-kubernetes-list-map-keys`) and `x-kubernetes-preserve-unknown-fields`. Unknown fields
//! are errors (the apiserver's `fieldValidation=Strict`, which kubectl sends by default).
//! `metadata` is checked only where the CRD constrains it (ObjectMeta itself is checked by
//! [`crate::api::meta`]).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

use regex::Regex;
use serde_json::Value;

/// One schema violation, with the JSON path of the offending field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SchemaViolation {
    /// Path in apiserver notation: `spec.egress[0].ports[1].port`.
    pub path: String,
    /// The full message, path included.
    pub message: String,
}

impl std::fmt::Display for SchemaViolation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// Validate `value` against `schema` (an `openAPIV3Schema` node). Returns every violation
/// found, in document order.
pub(crate) fn validate(schema: &Value, value: &Value) -> Vec<SchemaViolation> {
    let mut out = Vec::new();
    check(schema, value, "", &mut out);
    out
}

fn child(path: &str, key: &str) -> String {
    if path.is_empty() { key.to_string() } else { format!("{path}.{key}") }
}

fn show(value: &Value) -> String {
    match value {
        Value::String(s) => format!("{s:?}"),
        other => other.to_string(),
    }
}

fn invalid(out: &mut Vec<SchemaViolation>, path: &str, value: &Value, detail: String) {
    out.push(SchemaViolation {
        path: path.to_string(),
        message: format!("{path}: Invalid value: {}: {path} in body {detail}", show(value)),
    });
}

fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn type_matches(expected: &str, value: &Value) -> bool {
    match (expected, value) {
        ("object", Value::Object(_))
        | ("array", Value::Array(_))
        | ("string", Value::String(_))
        | ("boolean", Value::Bool(_)) => true,
        ("integer", Value::Number(n)) => n.is_i64() || n.is_u64(),
        ("number", Value::Number(_)) => true,
        _ => false,
    }
}

/// Formats as the apiserver's `strfmt` registry checks them.
fn format_ok(format: &str, s: &str) -> bool {
    match format {
        "ipv4" => Ipv4Addr::from_str(s).is_ok(),
        "ipv6" => Ipv6Addr::from_str(s).is_ok(),
        "cidr" => parse_go_cidr(s).is_some(),
        "date-time" => is_rfc3339(s),
        // Unknown formats are not enforced by the apiserver either.
        _ => true,
    }
}

/// Parse a CIDR the way Go's `net.ParseCIDR` does: an address, a slash and a decimal
/// prefix length within the family's range. Host bits may be set.
pub(crate) fn parse_go_cidr(s: &str) -> Option<(IpAddr, u8)> {
    let (addr, len) = s.split_once('/')?;
    if len.is_empty() || len.len() > 3 || !len.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let len: u8 = len.parse().ok()?;
    let ip = IpAddr::from_str(addr).ok()?;
    let max = if ip.is_ipv4() { 32 } else { 128 };
    (len <= max).then_some((ip, len))
}

fn is_rfc3339(s: &str) -> bool {
    static RE: std::sync::OnceLock<Regex> = std::sync::OnceLock::new();
    // Infallible: a constant pattern, exercised by the tests.
    #[allow(clippy::expect_used)]
    let re = RE.get_or_init(|| {
        Regex::new(r"^\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$").expect("constant regex")
    });
    re.is_match(s)
}

fn check(schema: &Value, value: &Value, path: &str, out: &mut Vec<SchemaViolation>) {
    let Some(schema) = schema.as_object() else {
        return;
    };
    // A null is fine only where the schema says nullable; otherwise it is a type error.
    if value.is_null() && schema.get("nullable").and_then(Value::as_bool) == Some(true) {
        return;
    }
    if let Some(expected) = schema.get("type").and_then(Value::as_str)
        && !type_matches(expected, value)
    {
        out.push(SchemaViolation {
            path: path.to_string(),
            message: format!(
                "{path}: Invalid value: \"{}\": {path} in body must be of type {expected}: {}",
                type_name(value),
                show(value)
            ),
        });
        return;
    }
    if let Some(options) = schema.get("enum").and_then(Value::as_array)
        && !options.contains(value)
    {
        let list: Vec<String> = options.iter().map(show).collect();
        out.push(SchemaViolation {
            path: path.to_string(),
            message: format!("{path}: Unsupported value: {}: supported values: {}", show(value), list.join(", ")),
        });
    }
    if let Some(any_of) = schema.get("anyOf").and_then(Value::as_array) {
        let mut branch_errors = Vec::new();
        let ok = any_of.iter().any(|branch| {
            let mut errs = Vec::new();
            check(branch, value, path, &mut errs);
            let ok = errs.is_empty();
            branch_errors.extend(errs);
            ok
        });
        if !ok {
            out.extend(branch_errors);
        }
    }
    match value {
        Value::String(s) => check_string(schema, s, value, path, out),
        Value::Number(n) => check_number(schema, n, value, path, out),
        Value::Array(items) => check_array(schema, items, value, path, out),
        Value::Object(map) => check_object(schema, map, value, path, out),
        _ => {}
    }
}

fn check_string(
    schema: &serde_json::Map<String, Value>,
    s: &str,
    value: &Value,
    path: &str,
    out: &mut Vec<SchemaViolation>,
) {
    if let Some(pattern) = schema.get("pattern").and_then(Value::as_str) {
        match pattern_matches(pattern, s) {
            Ok(true) => {}
            Ok(false) => invalid(out, path, value, format!("should match '{pattern}'")),
            Err(e) => invalid(out, path, value, format!("has an unusable pattern: {e}")),
        }
    }
    if let Some(format) = schema.get("format").and_then(Value::as_str)
        && !format_ok(format, s)
    {
        invalid(out, path, value, format!("must be of type {format}: {}", show(value)));
    }
}

/// Match `s` against `pattern`, compiling each distinct pattern once per thread.
fn pattern_matches(pattern: &str, s: &str) -> Result<bool, regex::Error> {
    thread_local! {
        static CACHE: std::cell::RefCell<std::collections::HashMap<String, Regex>> =
            std::cell::RefCell::new(std::collections::HashMap::new());
    }
    CACHE.with(|cache| {
        let mut cache = cache.borrow_mut();
        if let Some(re) = cache.get(pattern) {
            return Ok(re.is_match(s));
        }
        let re = Regex::new(pattern)?;
        let matched = re.is_match(s);
        cache.insert(pattern.to_string(), re);
        Ok(matched)
    })
}

fn check_number(
    schema: &serde_json::Map<String, Value>,
    n: &serde_json::Number,
    value: &Value,
    path: &str,
    out: &mut Vec<SchemaViolation>,
) {
    let Some(v) = n.as_f64() else { return };
    if let Some(max) = schema.get("maximum").and_then(Value::as_f64)
        && v > max
    {
        invalid(out, path, value, format!("should be less than or equal to {max}"));
    }
    if let Some(min) = schema.get("minimum").and_then(Value::as_f64)
        && v < min
    {
        invalid(out, path, value, format!("should be greater than or equal to {min}"));
    }
    let range = match schema.get("format").and_then(Value::as_str) {
        Some("int32") => Some((f64::from(i32::MIN), f64::from(i32::MAX))),
        _ => None,
    };
    if let Some((lo, hi)) = range
        && !(lo..=hi).contains(&v)
    {
        invalid(out, path, value, "must be of type int32".to_string());
    }
}

fn check_array(
    schema: &serde_json::Map<String, Value>,
    items: &[Value],
    value: &Value,
    path: &str,
    out: &mut Vec<SchemaViolation>,
) {
    if let Some(max) = schema.get("maxItems").and_then(Value::as_u64)
        && items.len() as u64 > max
    {
        out.push(SchemaViolation {
            path: path.to_string(),
            message: format!("{path}: Too many: {}: must have at most {max} items", items.len()),
        });
    }
    if let Some(min) = schema.get("minItems").and_then(Value::as_u64)
        && (items.len() as u64) < min
    {
        invalid(out, path, value, format!("should have at least {min} items"));
    }
    if let Some(item_schema) = schema.get("items") {
        for (i, item) in items.iter().enumerate() {
            check(item_schema, item, &format!("{path}[{i}]"), out);
        }
    }
    match schema.get("x-kubernetes-list-type").and_then(Value::as_str) {
        Some("set") => {
            for (i, item) in items.iter().enumerate() {
                if items[..i].contains(item) {
                    out.push(SchemaViolation {
                        path: format!("{path}[{i}]"),
                        message: format!("{path}[{i}]: Duplicate value: {}", show(item)),
                    });
                }
            }
        }
        Some("map") => {
            let keys: Vec<&str> = schema
                .get("x-kubernetes-list-map-keys")
                .and_then(Value::as_array)
                .map(|k| k.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            let key_of = |item: &Value| -> Vec<Value> {
                keys.iter().map(|k| item.get(k).cloned().unwrap_or(Value::Null)).collect()
            };
            for (i, item) in items.iter().enumerate() {
                let key = key_of(item);
                if items[..i].iter().any(|prev| key_of(prev) == key) {
                    let shown: Vec<String> = key.iter().map(show).collect();
                    out.push(SchemaViolation {
                        path: format!("{path}[{i}]"),
                        message: format!(
                            "{path}[{i}]: Duplicate value: map[{}]",
                            keys.iter().zip(shown).map(|(k, v)| format!("{k}:{v}")).collect::<Vec<_>>().join(" ")
                        ),
                    });
                }
            }
        }
        _ => {}
    }
}

fn check_object(
    schema: &serde_json::Map<String, Value>,
    map: &serde_json::Map<String, Value>,
    value: &Value,
    path: &str,
    out: &mut Vec<SchemaViolation>,
) {
    if let Some(required) = schema.get("required").and_then(Value::as_array) {
        for key in required.iter().filter_map(Value::as_str) {
            if !map.contains_key(key) {
                let p = child(path, key);
                out.push(SchemaViolation { message: format!("{p}: Required value"), path: p });
            }
        }
    }
    if let Some(max) = schema.get("maxProperties").and_then(Value::as_u64)
        && map.len() as u64 > max
    {
        out.push(SchemaViolation {
            path: path.to_string(),
            message: format!("{path}: Too many: {}: must have at most {max} items", map.len()),
        });
    }
    if let Some(min) = schema.get("minProperties").and_then(Value::as_u64)
        && (map.len() as u64) < min
    {
        invalid(out, path, value, format!("should have at least {min} properties"));
    }
    let preserve = schema.get("x-kubernetes-preserve-unknown-fields").and_then(Value::as_bool) == Some(true);
    let properties = schema.get("properties").and_then(Value::as_object);
    let additional = schema.get("additionalProperties");
    let is_metadata_root = path == "metadata";
    for (key, field) in map {
        let p = child(path, key);
        if let Some(prop) = properties.and_then(|props| props.get(key)) {
            check(prop, field, &p, out);
        } else if let Some(extra) = additional.filter(|a| a.is_object()) {
            check(extra, field, &p, out);
        } else if !preserve && !is_metadata_root && (properties.is_some() || additional == Some(&Value::Bool(false))) {
            out.push(SchemaViolation { message: format!("unknown field \"{p}\""), path: p });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> Value {
        json!({
            "type": "object",
            "required": ["spec"],
            "properties": {
                "spec": {
                    "type": "object",
                    "properties": {
                        "port": {"type": "integer", "minimum": 1, "maximum": 65535},
                        "proto": {"type": "string", "pattern": "^TCP|UDP|SCTP$"},
                        "cidr": {"type": "string", "format": "cidr"},
                        "to": {"type": "object", "minProperties": 1, "maxProperties": 1,
                               "properties": {"a": {"type": "string"}, "b": {"type": "string"}}},
                        "msgs": {"type": "array", "items": {"type": "string"}, "x-kubernetes-list-type": "set"},
                        "labels": {"type": "object", "additionalProperties": {"type": "string"}}
                    }
                }
            }
        })
    }

    fn messages(v: Value) -> Vec<String> {
        validate(&schema(), &v).into_iter().map(|e| e.message).collect()
    }

    #[test]
    fn accepts_a_valid_object() {
        assert!(
            messages(json!({"spec": {"port": 80, "proto": "TCP", "cidr": "1.2.3.4/24",
            "to": {"a": "x"}, "msgs": ["a", "b"], "labels": {"k": "v"}}}))
            .is_empty()
        );
    }

    #[test]
    fn reports_each_violation_with_its_path() {
        let got = messages(json!({"spec": {"port": 65536, "proto": "tcp", "cidr": "1.2.3.4/42",
            "to": {"a": "x", "b": "y"}, "msgs": ["a", "a"], "extra": 1}}));
        assert_eq!(
            got,
            vec![
                "spec.cidr: Invalid value: \"1.2.3.4/42\": spec.cidr in body must be of type cidr: \"1.2.3.4/42\"",
                "unknown field \"spec.extra\"",
                "spec.msgs[1]: Duplicate value: \"a\"",
                "spec.port: Invalid value: 65536: spec.port in body should be less than or equal to 65535",
                "spec.proto: Invalid value: \"tcp\": spec.proto in body should match '^TCP|UDP|SCTP$'",
                "spec.to: Too many: 2: must have at most 1 items",
            ]
        );
    }

    #[test]
    fn keeps_the_upstream_regex_quirk() {
        // `^TCP|UDP|SCTP$` is an alternation: the apiserver accepts "TCPX".
        assert!(messages(json!({"spec": {"proto": "TCPX"}})).is_empty());
        assert!(messages(json!({"spec": {"proto": "xUDPx"}})).is_empty());
    }

    #[test]
    fn required_and_min_properties() {
        assert_eq!(messages(json!({})), vec!["spec: Required value"]);
        assert_eq!(
            messages(json!({"spec": {"to": {}}})),
            vec!["spec.to: Invalid value: {}: spec.to in body should have at least 1 properties"]
        );
    }

    #[test]
    fn go_cidr_parsing() {
        assert!(parse_go_cidr("1.2.3.4/24").is_some());
        assert!(parse_go_cidr("2001:db8::/32").is_some());
        for bad in
            ["1.2.3.256/32", "1.2.3.4/42", "abc&!ABC/24", "2001:::::::7334/158", "1.2.3.4", "1.2.3./32", "1.2.3.4/+8"]
        {
            assert!(parse_go_cidr(bad).is_none(), "{bad}");
        }
    }
}
