//! The test tiers. `cargo test` as an ordinary user runs the tier that needs no root
//! and nothing installed (unit, golden, conformance, property, hostile and CLI tests);
//! the system tier — the network-namespace tests (`tests/*_netns.rs`: root, network
//! namespaces, nftables tables, real agents) and the tests against services
//! tests/run.sh installs (`tests/aws_client.rs`: moto) — is built only with
//! `--features system`. tests/run.sh, the README's test command, runs both. Without the
//! feature the test below is the one line that says so.

/// The system tier can run here: built (`--features system`), as root, with `ip` and
/// `nft` (tests/run.sh installs them and the services).
#[test]
#[cfg_attr(
    not(feature = "system"),
    ignore = "the system tests (tests/*_netns.rs: root; tests/aws_client.rs: moto) are not built: `--features system`, as root; tests/run.sh runs them"
)]
fn the_system_tier_can_run_here() {
    assert!(nix::unistd::geteuid().is_root(), "the netns tests need root: run tests/run.sh as root");
    for tool in ["ip", "nft"] {
        let found = ["-V", "--version"].iter().any(|flag| {
            std::process::Command::new(tool).arg(flag).output().map(|o| o.status.success()).unwrap_or(false)
        });
        assert!(found, "`{tool}` not found: install iproute2 and nftables (tests/run.sh does)");
    }
}
