//! Label selectors with the apiserver's validation: `matchLabels` plus `matchExpressions`
//! with `In`, `NotIn` (need values), `Exists`, `DoesNotExist` (must not have values).

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use crate::api::meta;

/// One requirement of a selector.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) enum Requirement {
    /// The label's value is one of the set.
    In(String, BTreeSet<String>),
    /// The label is absent or its value is none of the set.
    NotIn(String, BTreeSet<String>),
    /// The label is present.
    Exists(String),
    /// The label is absent.
    DoesNotExist(String),
}

/// A validated label selector; the requirements are ANDed; empty matches everything.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct Selector {
    requirements: Vec<Requirement>,
}

impl Selector {
    /// The selector that matches every object.
    pub fn everything() -> Self {
        Self::default()
    }

    /// Validate and convert a wire selector. `path` names the field in errors.
    pub fn parse(selector: &LabelSelector, path: &str) -> Result<Self, String> {
        let mut requirements = Vec::new();
        for (k, v) in selector.match_labels.iter().flatten() {
            if let Some(e) = meta::label_key_error(k) {
                return Err(format!("{path}.matchLabels: Invalid value: {k:?}: {e}"));
            }
            if let Some(e) = meta::label_value_error(v) {
                return Err(format!("{path}.matchLabels: Invalid value: {e}"));
            }
            requirements.push(Requirement::In(k.clone(), BTreeSet::from([v.clone()])));
        }
        for (i, expr) in selector.match_expressions.iter().flatten().enumerate() {
            let p = format!("{path}.matchExpressions[{i}]");
            if let Some(e) = meta::label_key_error(&expr.key) {
                return Err(format!("{p}.key: Invalid value: {:?}: {e}", expr.key));
            }
            let values: BTreeSet<String> = expr.values.iter().flatten().cloned().collect();
            let key = expr.key.clone();
            let req = match expr.operator.as_str() {
                "In" | "NotIn" if values.is_empty() => {
                    return Err(format!(
                        "{p}.values: Required value: must be specified when `operator` is 'In' or 'NotIn'"
                    ));
                }
                "Exists" | "DoesNotExist" if !values.is_empty() => {
                    return Err(format!(
                        "{p}.values: Forbidden: may not be specified when `operator` is 'Exists' or 'DoesNotExist'"
                    ));
                }
                "In" => Requirement::In(key, values),
                "NotIn" => Requirement::NotIn(key, values),
                "Exists" => Requirement::Exists(key),
                "DoesNotExist" => Requirement::DoesNotExist(key),
                other => {
                    return Err(format!(
                        "{p}.operator: Unsupported value: {other:?}: supported values: \"In\", \"NotIn\", \"Exists\", \"DoesNotExist\""
                    ));
                }
            };
            for v in values_of(&req) {
                if let Some(e) = meta::label_value_error(v) {
                    return Err(format!("{p}.values: Invalid value: {e}"));
                }
            }
            requirements.push(req);
        }
        Ok(Self { requirements })
    }

    /// Whether `labels` satisfy every requirement.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.requirements.iter().all(|r| match r {
            Requirement::In(k, vs) => labels.get(k).is_some_and(|v| vs.contains(v)),
            Requirement::NotIn(k, vs) => labels.get(k).is_none_or(|v| !vs.contains(v)),
            Requirement::Exists(k) => labels.contains_key(k),
            Requirement::DoesNotExist(k) => !labels.contains_key(k),
        })
    }
}

/// kubectl's notation: `app=web, env in (prod,stage), team, !legacy`; `{}` (everything)
/// when empty.
impl std::fmt::Display for Selector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.requirements.is_empty() {
            return f.write_str("{} (everything)");
        }
        let join = |vs: &BTreeSet<String>| vs.iter().cloned().collect::<Vec<_>>().join(",");
        let parts: Vec<String> = self
            .requirements
            .iter()
            .map(|r| match r {
                Requirement::In(k, vs) if vs.len() == 1 => format!("{k}={}", join(vs)),
                Requirement::In(k, vs) => format!("{k} in ({})", join(vs)),
                Requirement::NotIn(k, vs) => format!("{k} notin ({})", join(vs)),
                Requirement::Exists(k) => k.clone(),
                Requirement::DoesNotExist(k) => format!("!{k}"),
            })
            .collect();
        f.write_str(&parts.join(", "))
    }
}

fn values_of(r: &Requirement) -> impl Iterator<Item = &String> {
    let set = match r {
        Requirement::In(_, v) | Requirement::NotIn(_, v) => Some(v),
        _ => None,
    };
    set.into_iter().flatten()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    fn expr(key: &str, op: &str, values: Option<Vec<&str>>) -> LabelSelectorRequirement {
        LabelSelectorRequirement {
            key: key.into(),
            operator: op.into(),
            values: values.map(|v| v.into_iter().map(String::from).collect()),
        }
    }

    #[test]
    fn the_four_operators() {
        let sel = LabelSelector {
            match_labels: Some(BTreeMap::from([("app".into(), "web".into())])),
            match_expressions: Some(vec![
                expr("env", "In", Some(vec!["prod", "stage"])),
                expr("tier", "NotIn", Some(vec!["db"])),
                expr("team", "Exists", None),
                expr("legacy", "DoesNotExist", None),
            ]),
        };
        let s = Selector::parse(&sel, "spec.podSelector").unwrap();
        assert!(s.matches(&labels(&[("app", "web"), ("env", "prod"), ("team", "a")])));
        assert!(!s.matches(&labels(&[("app", "web"), ("env", "dev"), ("team", "a")])));
        assert!(!s.matches(&labels(&[("app", "web"), ("env", "prod"), ("team", "a"), ("tier", "db")])));
        assert!(!s.matches(&labels(&[("app", "web"), ("env", "prod")])));
        assert!(!s.matches(&labels(&[("app", "web"), ("env", "prod"), ("team", "a"), ("legacy", "")])));
        assert!(Selector::everything().matches(&labels(&[])));
    }

    #[test]
    fn reference_validation() {
        let bad = |e| LabelSelector { match_expressions: Some(vec![e]), ..Default::default() };
        let err = Selector::parse(&bad(expr("a", "In", None)), "spec.x").unwrap_err();
        assert!(err.starts_with("spec.x.matchExpressions[0].values: Required value"), "{err}");
        let err = Selector::parse(&bad(expr("a", "Exists", Some(vec!["v"]))), "spec.x").unwrap_err();
        assert!(err.starts_with("spec.x.matchExpressions[0].values: Forbidden"), "{err}");
        let err = Selector::parse(&bad(expr("a", "Equals", Some(vec!["v"]))), "spec.x").unwrap_err();
        assert!(err.contains("operator: Unsupported value: \"Equals\""), "{err}");
    }
}
