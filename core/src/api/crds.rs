//! The CustomResourceDefinitions egressd serves, embedded verbatim from upstream.
//!
//! The files under `src/api/crds/` are byte-for-byte copies of the CRDs that
//! OVN-Kubernetes (helm chart) and openshift/api publish (Apache-2.0, see the licence file
//! beside them). Embedding rather than generating them keeps every validation pattern —
//! quirks included — identical to what clusters already run, and lets
//! [`crate::api::schema`] validate manifests with the very same schema.
//! `egressd crds` prints [`all_yaml`]; `daemonset/crds/` holds that output.

use std::sync::OnceLock;

use serde_json::Value;

use super::Kind;

/// One embedded CRD.
#[derive(Debug)]
pub struct Crd {
    /// The kind it defines.
    pub kind: Kind,
    /// The file name used under `daemonset/crds/`.
    pub file_name: &'static str,
    /// The CRD document, verbatim.
    pub yaml: &'static str,
}

/// Every CRD egressd uses, in a stable order.
pub const CRDS: [Crd; 4] = [
    Crd {
        kind: Kind::EgressFirewall,
        file_name: "k8s.ovn.org_egressfirewalls.yaml",
        yaml: include_str!("crds/k8s.ovn.org_egressfirewalls.yaml"),
    },
    Crd {
        kind: Kind::EgressIP,
        file_name: "k8s.ovn.org_egressips.yaml",
        yaml: include_str!("crds/k8s.ovn.org_egressips.yaml"),
    },
    Crd {
        kind: Kind::EgressQoS,
        file_name: "k8s.ovn.org_egressqoses.yaml",
        yaml: include_str!("crds/k8s.ovn.org_egressqoses.yaml"),
    },
    Crd {
        kind: Kind::CloudPrivateIPConfig,
        file_name: "cloud.network.openshift.io_cloudprivateipconfigs.yaml",
        yaml: include_str!("crds/cloud.network.openshift.io_cloudprivateipconfigs.yaml"),
    },
];

/// All CRDs as one multi-document YAML stream (what `egressd crds` prints).
pub fn all_yaml() -> String {
    let mut out = String::new();
    for crd in &CRDS {
        let body = crd.yaml.strip_prefix("---\n").unwrap_or(crd.yaml);
        out.push_str("---\n");
        out.push_str(body);
        if !body.ends_with('\n') {
            out.push('\n');
        }
    }
    out
}

/// The parsed CRD document for `kind`.
pub fn document(kind: Kind) -> &'static Value {
    static PARSED: OnceLock<Vec<(Kind, Value)>> = OnceLock::new();
    let parsed = PARSED.get_or_init(|| {
        CRDS.iter()
            .map(|crd| {
                // The embedded files are fixed at build time and covered by the tests
                // below; a parse failure is a build defect, reported as an empty schema.
                let value = serde_saphyr::from_str::<Value>(crd.yaml).unwrap_or(Value::Null);
                (crd.kind, value)
            })
            .collect()
    });
    parsed.iter().find(|(k, _)| *k == kind).map(|(_, v)| v).unwrap_or(&Value::Null)
}

/// The `openAPIV3Schema` of the served version (`v1`) of `kind`.
pub fn schema(kind: Kind) -> &'static Value {
    document(kind).pointer("/spec/versions/0/schema/openAPIV3Schema").unwrap_or(&Value::Null)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_crd_parses_and_names_its_kind() {
        for crd in &CRDS {
            let doc = document(crd.kind);
            assert_eq!(doc["kind"], "CustomResourceDefinition", "{}", crd.file_name);
            assert_eq!(doc["spec"]["names"]["kind"], crd.kind.as_str());
            assert_eq!(doc["spec"]["group"], crd.kind.group());
            assert_eq!(doc["spec"]["names"]["plural"], crd.kind.plural());
            let scope = if crd.kind.namespaced() { "Namespaced" } else { "Cluster" };
            assert_eq!(doc["spec"]["scope"], scope);
            assert!(schema(crd.kind).is_object());
        }
    }

    #[test]
    fn status_subresources_match_the_reference() {
        let has_status = |k: Kind| document(k).pointer("/spec/versions/0/subresources/status").is_some();
        assert!(has_status(Kind::EgressFirewall));
        assert!(has_status(Kind::EgressQoS));
        assert!(has_status(Kind::CloudPrivateIPConfig));
        assert!(!has_status(Kind::EgressIP));
    }

    #[test]
    fn reference_patterns_are_byte_identical() {
        let ef = schema(Kind::EgressFirewall);
        let rule = &ef["properties"]["spec"]["properties"]["egress"]["items"];
        assert_eq!(rule["properties"]["type"]["pattern"], "^Allow|Deny$");
        assert_eq!(rule["properties"]["ports"]["items"]["properties"]["protocol"]["pattern"], "^TCP|UDP|SCTP$");
        assert_eq!(
            rule["properties"]["to"]["properties"]["dnsName"]["pattern"],
            r"^(\*\.)?([A-Za-z0-9-]+\.)*[A-Za-z0-9-]+\.?$"
        );
        assert_eq!(ef["properties"]["metadata"]["properties"]["name"]["pattern"], "^default$");
        let cpic = schema(Kind::CloudPrivateIPConfig);
        assert_eq!(
            cpic["properties"]["metadata"]["properties"]["name"]["anyOf"][1]["pattern"],
            r"^[0-9a-f]{4}(\.[0-9a-f]{4}){7}$"
        );
        // No CEL: the test apiserver is 1.20.
        for crd in &CRDS {
            assert!(!crd.yaml.contains("x-kubernetes-validations"), "{}", crd.file_name);
        }
    }
}
