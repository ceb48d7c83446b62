//! The `egressd` command line: exit codes, help, `crds`, `render`, `explain`.

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
    // The roles are Kubernetes mode's: with manifests there is no Lease to split.
    for role in ["node", "controller"] {
        let args = ["run", "--manifests", d, "--node-name", "n1", "--cluster-cidr", "198.18.0.0/16", "--role", role];
        let (code, _, err) = egressd(&args);
        assert_eq!(code, Some(64), "{err}");
        assert!(err.contains("--role node and --role controller are for Kubernetes mode"), "{err}");
    }
    // The admission webhook is the controller's; a pod's subnets need the pod's name.
    let kube = ["run", "--kubeconfig", "/nonexistent", "--node-name", "n1", "--cluster-cidr", "198.18.0.0/16"];
    let (code, _, err) = egressd(&[&kube[..], &["--role", "node", "--webhook-listen", "127.0.0.1:9443"]].concat());
    assert_eq!(code, Some(64), "{err}");
    assert!(err.contains("--webhook-listen is served by --role controller only"), "{err}");
    let (code, _, err) = egressd(&[&kube[..], &["--role", "node", "--subnets-on", "pod"]].concat());
    assert_eq!(code, Some(64), "{err}");
    assert!(err.contains("--pod-name"), "{err}");
}

#[test]
fn help_describes_every_command() {
    let (code, out, _) = egressd(&["--help"]);
    assert_eq!(code, Some(0));
    for cmd in ["run", "render", "crds", "cleanup", "status", "explain"] {
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
    assert!(text.contains("ip6 daddr 2001:db8:1::/48 goto fw-mark"), "{text}");
    assert!(text.contains("EgressFirewall a/default\tapplied\tnode-x: EgressFirewall Rules applied"), "{text}");
    assert!(text.contains("ct state established ct mark and 0x0f000000 @fw-epoch accept"), "{text}");
    // The verified connections' default mask steps aside for EgressIP's bits.
    let d = dir.path().to_str().unwrap();
    let (code, text, err) = egressd(&[
        "render",
        "--manifests",
        d,
        "--node-name",
        "n",
        "--cluster-cidr",
        "198.18.0.0/16",
        "--egress-ip-mark-mask",
        "0x0f000000",
    ]);
    assert_eq!(code, Some(0), "{err}");
    assert!(text.contains("ct state established ct mark and 0xf0000000 @fw-epoch accept"), "{text}");
}

/// Options at and beyond their limits: beyond → exit 64 naming the option (never a
/// panic or a wrapped value); at the limit → accepted.
#[test]
fn options_at_their_extremes() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let render = ["render", "--manifests", d, "--node-name", "n1", "--cluster-cidr", "198.18.0.0/16"];
    let run =
        ["run", "--manifests", d, "--node-name", "n1", "--cluster-cidr", "198.18.0.0/16", "--nft", "/nonexistent"];
    let rejected: &[(&[&str], &str)] = &[
        (&["--dns-grace-secs", "18446744073709551615"], "--dns-grace-secs"),
        (&["--dns-grace-secs", "604801"], "--dns-grace-secs"),
        (&["--egress-ip-table-base", "0"], "--egress-ip-table-base"),
        (&["--egress-ip-table-base", "254"], "--egress-ip-table-base"),
        (&["--egress-ip-table-base", "4294967040"], "--egress-ip-table-base"),
        (&["--egress-ip-table-base", "4294967295"], "--egress-ip-table-base"),
        (&["--egress-ip-mark-mask", "0x4000"], "kube-proxy"),
        (&["--egress-ip-mark-mask", "0x0000ff00"], "kube-proxy"),
        (&["--egress-ip-mark-mask", "0x00010100"], "contiguous"),
        (&["--egress-ip-mark-mask", "0"], "--egress-ip-mark-mask"),
        (&["--egress-ip-mark-mask", "0x1ffffffff"], "--egress-ip-mark-mask"),
        (&["--egress-ip-rule-priority", "0"], "--egress-ip-rule-priority"),
        (&["--egress-ip-rule-priority", "32766"], "--egress-ip-rule-priority"),
        (&["--egress-ip-protocol", "2"], "--egress-ip-protocol"),
        (&["--egress-ip-protocol", "256"], "--egress-ip-protocol"),
        (&["--firewall-verified-mark-mask", "0x00030000"], "overlaps the EgressIP mark bits"),
        (&["--firewall-verified-mark-mask", "0x01000000"], "at least two bits"),
        (&["--firewall-verified-mark-mask", "0x05000000"], "contiguous"),
        (&["--firewall-verified-mark-mask", "0x1ffffffff"], "--firewall-verified-mark-mask"),
    ];
    for (extra, needle) in rejected {
        for base in [&render[..], &run[..]] {
            let args: Vec<&str> = base.iter().chain(extra.iter()).copied().collect();
            let (code, _, err) = egressd(&args);
            assert_eq!(code, Some(64), "{args:?}: {err}");
            assert!(err.contains(needle), "{args:?}: {err}");
            assert!(!err.contains("panicked"), "{args:?}: {err}");
        }
    }
    let run_only: &[(&[&str], &str)] = &[
        (&["--debounce-ms", "0"], "--debounce-ms"),
        (&["--debounce-ms", "18446744073709551615"], "--debounce-ms"),
        (&["--resync-secs", "18446744073709551615"], "--resync-secs"),
        (&["--net-check-secs", "0"], "--net-check-secs"),
        (&["--net-check-secs", "18446744073709551615"], "--net-check-secs"),
        (&["--dns-timeout-ms", "0"], "--dns-timeout-ms"),
        (&["--lease-duration-secs", "5", "--lease-renew-secs", "5"], "--lease-renew-secs"),
    ];
    for (extra, needle) in run_only {
        let args: Vec<&str> = run.iter().chain(extra.iter()).copied().collect();
        let (code, _, err) = egressd(&args);
        assert_eq!(code, Some(64), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
    // The limits themselves are accepted.
    for extra in [
        &["--dns-grace-secs", "604800"][..],
        &["--egress-ip-table-base", "255"],
        &["--egress-ip-table-base", "4294967039"],
        &["--egress-ip-mark-mask", "0xffff0000"],
        &["--egress-ip-mark-mask", "0x1"],
        &["--egress-ip-rule-priority", "32765"],
        &["--egress-ip-protocol", "255"],
        &["--firewall-verified-mark-mask", "0"],
        &["--firewall-verified-mark-mask", "0xc0000000"],
        &["--egress-ip-mark-mask", "0x0f000000"],
    ] {
        let args: Vec<&str> = render.iter().chain(extra.iter()).copied().collect();
        let (code, _, err) = egressd(&args);
        assert_eq!(code, Some(0), "{args:?}: {err}");
    }
}

#[test]
fn explain_from_manifests_in_text_and_json_and_its_errors() {
    let golden = "tests/golden-explain/cluster/manifests";
    let base = ["explain", "--manifests", golden, "--cluster-cidr", "198.18.0.0/16", "--node-name", "n1"];
    let run = |extra: &[&str]| egressd(&[&base[..], extra].concat());
    let (code, out, err) = run(&["--pod", "team-a/web", "--to", "192.0.2.10:80"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("firewall    ALLOWED: allowed by EgressFirewall team-a/default rule 1:"), "{out}");
    assert!(out.contains("leaves the cluster with 198.19.0.50"), "{out}");
    let (code, out, err) = run(&["--src", "198.18.1.2", "--to", "192.0.2.10:8080", "-o", "json"]);
    assert_eq!(code, Some(0), "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["firewall"]["verdict"], "dropped", "{v:#}");
    assert_eq!(v["firewall"]["rule"]["index"], 4, "{v:#}");
    assert_eq!(v["pod"], "team-a/web", "{v:#}");
    // Unknown pod: an error, not an answer.
    let (code, _, err) = run(&["--pod", "team-a/nope", "--to", "192.0.2.10"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("pod team-a/nope is not known"), "{err}");
    // Bad destination, bad pod name: usage errors naming the flag.
    let (code, _, err) = run(&["--pod", "team-a/web", "--to", "192.0.2.10:99999"]);
    assert_eq!(code, Some(64), "{err}");
    assert!(err.contains("--to \"192.0.2.10:99999\""), "{err}");
    let (code, _, err) = run(&["--pod", "web", "--to", "192.0.2.10"]);
    assert_eq!(code, Some(64), "{err}");
    assert!(err.contains("NAMESPACE/NAME"), "{err}");
    // --manifests needs the node's ranges; without --manifests the running agent is asked.
    let (code, _, err) = egressd(&["explain", "--manifests", golden, "--pod", "team-a/web", "--to", "192.0.2.10"]);
    assert_eq!(code, Some(64), "{err}");
    assert!(err.contains("--cluster-cidr"), "{err}");
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().to_str().unwrap();
    let (code, _, err) = egressd(&["explain", "--state-dir", state, "--pod", "team-a/web", "--to", "192.0.2.10"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("cannot reach the running agent") && err.contains("explain.sock"), "{err}");
}

/// `egressd` with an empty environment: the help shows each option's `[env: NAME=value]`
/// with the value it finds, and the reference must not depend on who generated it.
fn help_of(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_egressd")).args(args).env_clear().output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

/// The subcommands `egressd --help` lists (`help` aside), in its order.
fn subcommands(top: &str) -> Vec<String> {
    top.lines()
        .skip_while(|l| *l != "Commands:")
        .skip(1)
        .take_while(|l| !l.is_empty())
        .filter_map(|l| l.strip_prefix("  ")?.split_whitespace().next().filter(|_| !l.starts_with("   ")))
        .filter(|c| *c != "help")
        .map(str::to_owned)
        .collect()
}

/// docs/cli.md: the help clap prints for `egressd` and each subcommand, nothing written by
/// hand, so the reference cannot drift from the binary. After an intended change of an
/// option: `EGRESSD_UPDATE_GOLDEN=1 cargo test --test cli`, and review the diff.
fn cli_reference() -> String {
    let top = help_of(&["--help"]);
    let mut doc = String::from(
        "# egressd command-line reference\n\n\
         Generated from the binary's own help (`egressd --help`, `egressd <command> --help`) by\n\
         `tests/cli.rs`, which fails when this file and the binary differ. Regenerate after\n\
         changing an option: `EGRESSD_UPDATE_GOLDEN=1 cargo test --test cli`.\n\n\
         Every option with an `[env: …]` can also be set by that environment variable (the\n\
         systemd unit's environment file and the DaemonSet use them).\n\n",
    );
    doc.push_str("## egressd\n\n```text\n");
    doc.push_str(top.trim_end());
    doc.push_str("\n```\n");
    for cmd in subcommands(&top) {
        doc.push_str(&format!("\n## egressd {cmd}\n\n```text\n"));
        doc.push_str(help_of(&[&cmd, "--help"]).trim_end());
        doc.push_str("\n```\n");
    }
    // No trailing spaces (clap indents its empty lines inside an option's help).
    doc.lines().map(str::trim_end).collect::<Vec<_>>().join("\n") + "\n"
}

#[test]
fn the_cli_reference_is_the_help_the_binary_prints() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/cli.md");
    let top = help_of(&["--help"]);
    assert_eq!(subcommands(&top), ["run", "render", "crds", "cleanup", "status", "explain"], "{top}");
    assert!(top.contains("Exit codes:") && top.contains("64  configuration error"), "{top}");
    let want = cli_reference();
    if std::env::var_os("EGRESSD_UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, &want).unwrap();
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    if have != want {
        let first = have.lines().zip(want.lines()).position(|(a, b)| a != b).unwrap_or(0);
        panic!(
            "docs/cli.md differs from the binary's help from line {} (have {:?}, want {:?}): \
             regenerate with EGRESSD_UPDATE_GOLDEN=1 cargo test --test cli and review",
            first + 1,
            have.lines().nth(first),
            want.lines().nth(first)
        );
    }
}
