//! The `egressd` command line: exit codes, help, `crds`, `render`.

use std::process::Command;

fn egressd(args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_egressd")).args(args).output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn missing_or_invalid_cluster_cidr_exits_64_with_a_clear_message() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let (code, _, err) = egressd(&["render", "--manifests", d, "--node-name", "n1"]);
    assert_eq!(code, Some(64), "{err}");
    assert!(err.contains("--cluster-cidr"), "{err}");
    let (code, _, err) = egressd(&["render", "--manifests", d, "--node-name", "n1", "--cluster-cidr", "198.18.0.0/33"]);
    assert_eq!(code, Some(64), "{err}");
    assert!(err.contains("198.18.0.0/33"), "{err}");
    let (code, _, err) =
        egressd(&["run", "--manifests", "/nonexistent", "--node-name", "n1", "--cluster-cidr", "198.18.0.0/16"]);
    assert_eq!(code, Some(64), "{err}");
    assert!(err.contains("not a directory"), "{err}");
}

#[test]
fn help_describes_every_command() {
    let (code, out, _) = egressd(&["--help"]);
    assert_eq!(code, Some(0));
    for cmd in ["run", "render", "crds", "cleanup"] {
        assert!(out.contains(cmd), "{cmd} missing from --help:\n{out}");
    }
    let (code, out, _) = egressd(&["run", "--help"]);
    assert_eq!(code, Some(0));
    assert!(out.contains("NODE_NAME") && out.contains("EGRESSD_CLUSTER_CIDRS"), "{out}");
}

#[test]
fn crds_prints_the_four_crds() {
    let (code, out, _) = egressd(&["crds"]);
    assert_eq!(code, Some(0));
    assert_eq!(out, egressd::api::crds::all_yaml());
    for name in [
        "egressfirewalls.k8s.ovn.org",
        "egressips.k8s.ovn.org",
        "egressqoses.k8s.ovn.org",
        "cloudprivateipconfigs.cloud.network.openshift.io",
    ] {
        assert!(out.contains(&format!("name: {name}")), "{name}");
    }
}

#[test]
fn render_touches_nothing_and_env_fallbacks_work() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("fw.yaml"),
        "apiVersion: k8s.ovn.org/v1\nkind: EgressFirewall\nmetadata: {name: default, namespace: a}\nspec:\n  egress:\n  - {type: Deny, to: {cidrSelector: 192.0.2.0/24}}\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_egressd"))
        .args(["render", "--manifests", dir.path().to_str().unwrap()])
        .env("NODE_NAME", "node-x")
        .env("EGRESSD_CLUSTER_CIDRS", "198.18.0.0/16,2001:db8:1::/48")
        .env("EGRESSD_NFT", "/nonexistent/nft")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("elements = { 2001:db8:1::/48 }"), "{text}");
    assert!(text.contains("EgressFirewall a/default\tapplied\tnode-x: EgressFirewall Rules applied"), "{text}");
}
