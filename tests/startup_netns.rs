//! SIGTERM at any point of start-up ends the agent cleanly (exit 0), never by the
//! signal's default action: the handlers are in place before the first log line.

mod netns;

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

use netns::{Agent, Netns, require_root};

/// Poll the agent's log until it contains `needle` (or the agent exited).
fn wait_log(agent: &Agent, needle: &str) -> bool {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(20) {
        if agent.log_text().contains(needle) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    false
}

#[test]
fn sigterm_during_start_up_exits_0_every_time() {
    require_root();
    let ns = Netns::new("start");
    let dir = tempfile::tempdir().unwrap();
    let manifests = dir.path().join("m");
    std::fs::create_dir(&manifests).unwrap();
    std::fs::write(
        manifests.join("fw.yaml"),
        "apiVersion: k8s.ovn.org/v1\nkind: EgressFirewall\nmetadata: {name: default, namespace: a}\nspec:\n  egress:\n  - {type: Deny, to: {cidrSelector: 192.0.2.0/24}}\n---\napiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: a}\nspec: {nodeName: n1}\nstatus: {podIP: 198.18.0.5}\n",
    )
    .unwrap();
    // An nft that takes a while to apply a script (and says when it started), so a
    // signal can land in the middle of the first sync.
    let marker = dir.path().join("nft-started");
    let slow_nft = dir.path().join("slow-nft");
    let mut f = std::fs::File::create(&slow_nft).unwrap();
    writeln!(
        f,
        "#!/bin/sh\ncase \"$1\" in --version|-V) exec nft \"$@\";; esac\ntouch {}\nsleep 0.3\nexec nft \"$@\"",
        marker.display()
    )
    .unwrap();
    drop(f);
    std::fs::set_permissions(&slow_nft, std::fs::Permissions::from_mode(0o755)).unwrap();

    // (what to wait for before SIGTERM, description)
    let points: [(&str, &str); 4] = [
        ("", "at the first log line"),
        ("manifests loaded", "before the first sync"),
        ("@marker", "during the first sync"),
        ("dataplane in sync", "right after the first sync"),
    ];
    let mut outcomes = Vec::new();
    for run in 0..20 {
        let (point, what) = points[run % points.len()];
        let _ = std::fs::remove_file(&marker);
        let log = dir.path().join(format!("agent-{run}.log"));
        let state = dir.path().join("state");
        let mut agent = Agent::start(
            &ns,
            &[
                "run",
                "--manifests",
                manifests.to_str().unwrap(),
                "--node-name",
                "n1",
                "--cluster-cidr",
                "198.18.0.0/16",
                "--state-dir",
                state.to_str().unwrap(),
                "--nft",
                slow_nft.to_str().unwrap(),
                // The first sync through the slow nft (over netlink it takes no time).
                "--nft-transport",
                "nft",
                "--no-dns-snoop",
            ],
            log,
        );
        let reached = match point {
            "" => wait_log(&agent, "egressd"),
            "@marker" => {
                let start = Instant::now();
                while !marker.exists() && start.elapsed() < Duration::from_secs(20) {
                    std::thread::sleep(Duration::from_millis(1));
                }
                marker.exists()
            }
            needle => wait_log(&agent, needle),
        };
        assert!(reached, "run {run}: start-up never reached the point {what}:\n{}", agent.log_text());
        let code = agent.stop();
        outcomes.push((run, what, code));
        assert_eq!(code, Some(0), "run {run}: SIGTERM {what} did not exit 0:\n{}", agent.log_text());
    }
    assert_eq!(outcomes.len(), 20);
}
