//! egressd's CRDs and parser against the conformance corpus (`tests/conformance/`):
//! every object is accepted or rejected by the layer the corpus says, and rejections name
//! the field.

use std::path::{Path, PathBuf};

use egressd::api::parse::{Parsed, yaml_to_value};
use egressd::api::{Object, parse_document};
use egressd::view::policy::{self, PolicyError};

fn corpus(dir: &str) -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/conformance").join(dir);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&root)
        .unwrap_or_else(|e| panic!("{}: {e}", root.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no files in {}", root.display());
    files
}

fn name(path: &Path) -> String {
    path.file_stem().unwrap().to_string_lossy().into_owned()
}

/// The schema/admission layer: what the API server (with the upstream CRDs and policy)
/// would do with a create.
fn parse(path: &Path) -> Result<Object, String> {
    let text = std::fs::read_to_string(path).unwrap();
    let value = yaml_to_value(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    match parse_document(&value, "default", true) {
        Ok(Parsed::Object(o)) => Ok(o),
        Ok(Parsed::Ignored { kind, .. }) => panic!("{}: kind {kind} ignored", path.display()),
        Err(e) => Err(e.violations.join("; ")),
    }
}

/// The controller layer: what egressd's policy conversion says about a stored object.
fn policy(object: &Object) -> Result<(), String> {
    let result = match object {
        Object::EgressFirewall(o) => policy::firewall_policy(o).map(drop),
        Object::EgressQoS(o) => policy::qos_policy(o).map(drop),
        Object::EgressIP(o) => policy::egress_ip_policy(o).map(drop),
        Object::CloudPrivateIPConfig(o) => policy::cloud_private_ip(o).map(drop),
        other => panic!("unexpected object {:?}", other.key()),
    };
    result.map_err(|e| match e {
        PolicyError::Invalid(m) | PolicyError::Ignored(m) => m,
    })
}

fn firewall(object: &Object) -> policy::FirewallPolicy {
    match object {
        Object::EgressFirewall(o) => policy::firewall_policy(o).expect("valid EgressFirewall"),
        other => panic!("not an EgressFirewall: {:?}", other.key()),
    }
}

fn layer(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix("# layer: "))
        .unwrap_or_else(|| panic!("{}: no layer header", path.display()))
        .to_string()
}

#[test]
fn every_valid_object_is_accepted_by_both_layers() {
    for path in corpus("valid") {
        let object = parse(&path).unwrap_or_else(|e| panic!("{}: rejected: {e}", name(&path)));
        policy(&object).unwrap_or_else(|e| panic!("{}: policy rejected: {e}", name(&path)));
    }
}

/// What each invalid file must be rejected with: a substring naming the field.
fn expected_rejection(file: &str) -> &'static str {
    match file {
        "cloudprivateipconfig-missing-spec" => "spec: Required value",
        "cloudprivateipconfig-name-ipv6-colons" => "metadata.name: Invalid value: \"fc00:f853:ccd:e793::54\"",
        "cloudprivateipconfig-name-ipv6-not-expanded" => "metadata.name",
        "cloudprivateipconfig-name-not-an-ip" => "metadata.name: Invalid value",
        "cloudprivateipconfig-readme-status-under-spec" => "unknown field \"spec.status\"",
        "egressfirewall-cidrselector-malformed" => "spec.egress[0].to.cidrSelector: invalid CIDR address: 1.2.3./32",
        "egressfirewall-dnsname-double-wildcard" => ".to.dnsName in body should match",
        "egressfirewall-name-not-default" => "metadata.name in body should match '^default$'",
        "egressfirewall-ocp-docs-port-without-protocol" => "spec.egress[0].ports[1].protocol: Required value",
        "egressfirewall-port-0" => ".port in body should be greater than or equal to 1",
        "egressfirewall-port-65536" => ".port in body should be less than or equal to 65535",
        "egressfirewall-protocol-icmp" => ".protocol in body should match '^TCP|UDP|SCTP$'",
        "egressfirewall-protocol-lowercase-tcp" => ".protocol in body should match '^TCP|UDP|SCTP$'",
        "egressfirewall-to-cidr-and-dnsname" => "spec.egress[0].to: Too many: 2: must have at most 1 items",
        "egressfirewall-to-cidr-and-nodeselector" => "spec.egress[0].to: Too many: 2: must have at most 1 items",
        "egressfirewall-to-empty" => "spec.egress[0].to in body should have at least 1 properties",
        "egressfirewall-type-lowercase-allow" => ".type in body should match '^Allow|Deny$'",
        "egressip-create-with-mark-annotation" => {
            "EgressIP resources cannot be created with the \"k8s.ovn.org/egressip-mark\" annotation"
        }
        "egressip-invalid-ip" => "unable to parse provided EgressIP: 0:0:0:0:0:feff:c0a8:8e32:5, invalid",
        "egressip-missing-namespaceselector" => "spec.namespaceSelector: Required value",
        "egressip-status-without-items" => "status.items: Required value",
        "egressqos-dscp-64" => "spec.egress[0].dscp in body should be less than or equal to 63",
        "egressqos-dstcidr-garbage-chars" => "Invalid value: \"abc&!ABC/24\"",
        "egressqos-dstcidr-ipv4-prefix-42" => "Invalid value: \"1.2.3.4/42\"",
        "egressqos-dstcidr-ipv6-bad" => "Invalid value: \"2001:::::::7334/158\"",
        "egressqos-dstcidr-octet-256" => "Invalid value: \"1.2.3.256/32\"",
        "egressqos-name-not-default" => "metadata.name in body should match '^default$'",
        other => panic!("no expectation for invalid/{other}.yaml: add one"),
    }
}

#[test]
fn every_invalid_object_is_rejected_by_its_layer_naming_the_field() {
    for path in corpus("invalid") {
        let file = name(&path);
        let layer = layer(&path);
        let expected = expected_rejection(&file);
        let message = if layer.starts_with("controller") {
            // The API server stores it: the schema layer must accept, the policy refuse.
            let object = parse(&path).unwrap_or_else(|e| panic!("{file}: schema layer rejected: {e}"));
            policy(&object).expect_err(&file)
        } else {
            assert!(
                layer.starts_with("apiserver-schema")
                    || layer.starts_with("apiserver-field-validation")
                    || layer.starts_with("admission-policy"),
                "{file}: unknown layer {layer}"
            );
            match parse(&path) {
                Ok(_) => panic!("{file}: accepted, but the {layer} layer rejects it"),
                Err(e) => e,
            }
        };
        assert!(message.contains(expected), "{file}: expected {expected:?} in {message:?}");
    }
}

#[test]
fn edge_objects_are_stored_and_egressd_is_strict_where_the_crd_is_loose() {
    for path in corpus("edge") {
        let file = name(&path);
        // The API server accepts every edge object.
        let object = parse(&path).unwrap_or_else(|e| panic!("{file}: schema layer rejected: {e}"));
        let verdict = policy(&object);
        match file.as_str() {
            // Read as the reference reads them, never more permissively: unknown
            // protocols skipped (a Deny rule left without ports denies every port),
            // a type other than exactly "Allow" denies; each says so in a warning.
            "egressfirewall-protocol-tcpx-regex-quirk" => {
                verdict.expect(&file);
                let p = firewall(&object);
                assert_eq!(p.rules.len(), 1);
                assert!(p.rules[0].ports.is_empty(), "{p:?}");
                assert!(p.warnings.iter().any(|w| w.contains("ports[0].protocol: \"TCPX\"")), "{p:?}");
                assert!(p.warnings.iter().any(|w| w.contains("Deny rule applies to every port")), "{p:?}");
            }
            "egressfirewall-type-allowed-regex-quirk" => {
                verdict.expect(&file);
                let p = firewall(&object);
                assert_eq!(p.rules[0].action, egressd::view::policy::Action::Deny);
                assert!(p.warnings.iter().any(|w| w.contains("type: \"Allowed\" is neither")), "{p:?}");
            }
            "egressip-garbage-ip-accepted" => {
                let e = verdict.expect_err(&file);
                assert!(e.contains("unable to parse provided EgressIP"), "{e}");
            }
            // Rejected by the reference only with DNSNameResolver; egressd resolves it.
            "egressfirewall-dnsname-tld-only" => verdict.unwrap(),
            other => panic!("no expectation for edge/{other}.yaml: add one"),
        }
    }
}

#[test]
fn embedded_crds_are_the_upstream_crds() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/conformance/crds");
    let pairs = [
        ("ovn-kubernetes/k8s.ovn.org_egressfirewalls.yaml", egressd::api::Kind::EgressFirewall),
        ("ovn-kubernetes/k8s.ovn.org_egressips.yaml", egressd::api::Kind::EgressIP),
        ("ovn-kubernetes/k8s.ovn.org_egressqoses.yaml", egressd::api::Kind::EgressQoS),
        ("openshift-api/001_cloudprivateipconfigs.crd.yaml", egressd::api::Kind::CloudPrivateIPConfig),
    ];
    for (file, kind) in pairs {
        let upstream = std::fs::read_to_string(root.join(file)).unwrap();
        let embedded = egressd::api::crds::CRDS.iter().find(|c| c.kind == kind).unwrap();
        assert_eq!(embedded.yaml, upstream, "{file} differs from the embedded CRD");
    }
}

#[test]
fn daemonset_crds_are_exactly_what_egressd_crds_prints() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("daemonset/crds/crds.yaml");
    let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        on_disk == egressd::api::crds::all_yaml(),
        "daemonset/crds/crds.yaml drifted from `egressd crds`; regenerate with: \
         cargo run -q -p egressd-agent -- crds > daemonset/crds/crds.yaml"
    );
}
