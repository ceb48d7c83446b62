//! Faults around the agent itself (root required): killed in the middle of a large
//! transaction (an `nft` process's or its own netlink one), then restarted.

mod netns;

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use netns::{Netns, Topology, wait_for};

const ECHO_PORT: u16 = 7100;

/// A line echo server on the external host (one thread per connection).
fn echo_server(ns: &Netns) {
    let listener = ns.run(|| TcpListener::bind(("203.0.113.2", ECHO_PORT)).expect("bind echo"));
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let mut out = conn.try_clone().unwrap();
                for line in BufReader::new(conn).lines() {
                    let Ok(line) = line else { return };
                    if out.write_all(format!("{line}\n").as_bytes()).is_err() {
                        return;
                    }
                }
            });
        }
    });
}

/// A connection from a pod that stays open.
struct Flow {
    writer: TcpStream,
    reader: BufReader<TcpStream>,
}

impl Flow {
    fn open(pod: &Netns) -> Self {
        let s = pod.run(|| {
            TcpStream::connect_timeout(
                &(std::net::Ipv4Addr::new(203, 0, 113, 2), ECHO_PORT).into(),
                Duration::from_secs(2),
            )
            .expect("connect")
        });
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        Self { writer: s.try_clone().unwrap(), reader: BufReader::new(s) }
    }

    /// Whether a line goes there and back.
    fn alive(&mut self, n: usize) -> bool {
        if self.writer.write_all(format!("ping {n}\n").as_bytes()).is_err() {
            return false;
        }
        let mut line = String::new();
        self.reader.read_line(&mut line).is_ok() && line == format!("ping {n}\n")
    }
}

/// The table as the kernel lists it, without the counters' values.
fn table(ns: &Netns) -> String {
    let listed = ns.exec(&["nft", "list", "table", "inet", "egressd"]);
    // Counts differ between runs: rules' own counters and the named counters' bodies.
    let re = regex::Regex::new(r"packets \d+ bytes \d+").unwrap();
    re.replace_all(&listed, "packets - bytes -").into_owned()
}

fn big_firewall(extra_rules: usize) -> String {
    let mut rules = String::from(
        "  - type: Allow\n    to: {cidrSelector: 203.0.113.2/32}\n    ports: [{protocol: TCP, port: 7100}]\n",
    );
    // Alternating actions: nothing merges, so the transaction stays large (~8,000
    // elements of the flattened segment's sets, `compile/boxes.rs`: as rules they would
    // cost the kernel more memory).
    for i in 0..extra_rules {
        rules.push_str(&format!(
            "  - type: {}\n    to: {{cidrSelector: 198.51.{}.{}/32}}\n",
            if i % 2 == 0 { "Deny" } else { "Allow" },
            100 + (i / 256) % 2,
            i % 256
        ));
    }
    rules.push_str("  - type: Deny\n    to: {cidrSelector: 0.0.0.0/0}\n");
    rules
}

#[test]
fn sigkill_in_the_middle_of_a_large_transaction_then_restart() {
    let t = Topology::new(&["team-a"]);
    echo_server(&t.ext);
    t.set_firewall("team-a", &big_firewall(0));
    // An nft that says when it starts (the agent is killed then, while nft works on a
    // transaction of ~8,000 destinations; nft itself lives on as an orphan and finishes or not).
    let marker = t.dir.path().join("nft-started");
    let nft = t.dir.path().join("marking-nft");
    std::fs::write(&nft, format!("#!/bin/sh\ncase \"$1\" in -f) touch {};; esac\nexec nft \"$@\"\n", marker.display()))
        .unwrap();
    std::fs::set_permissions(&nft, std::fs::Permissions::from_mode(0o755)).unwrap();
    let nft_arg = nft.to_str().unwrap().to_string();

    for round in 0..3 {
        // Rounds 0 and 1 through nft (killed while its process works), round 2 over
        // netlink (killed around its in-process transaction, ~100 ms after the change:
        // the debounce, then the compile and the send).
        let netlink = round == 2;
        let mut args = vec!["--nft", nft_arg.as_str()];
        if !netlink {
            args.extend(["--nft-transport", "nft"]);
        }
        let mut agent = t.start_agent_with(&format!("agent{round}"), &args);
        let mut flow = Flow::open(&t.pods[0]);
        assert!(flow.alive(0), "round {round}: the allowed connection does not work:\n{}", agent.log_text());

        // A large change; the agent is killed as soon as its nft starts on it.
        let _ = std::fs::remove_file(&marker);
        t.set_firewall("team-a", &big_firewall(7_990 - round * 10));
        if netlink {
            std::thread::sleep(Duration::from_millis(100 + 20 * round as u64));
        } else {
            let started = wait_for(Duration::from_secs(10), || marker.exists());
            assert!(started.is_some(), "round {round}: nft never started:\n{}", agent.log_text());
        }
        agent.kill();
        assert!(flow.alive(1), "round {round}: the established connection broke when the agent was killed");

        // Restarted: the table becomes complete; the connection never breaks.
        let agent = t.start_agent_with(&format!("agent{round}-restarted"), &args);
        std::thread::sleep(Duration::from_secs(2)); // an orphaned nft would be done by now
        assert!(flow.alive(2), "round {round}: the established connection broke over the restart");
        let after_restart = table(&t.node);
        drop(agent);

        // What a fresh start on an empty kernel gives, for comparison.
        t.node.exec(&["nft", "delete", "table", "inet", "egressd"]);
        let fresh = t.start_agent(&format!("agent{round}-fresh"));
        let expected = table(&t.node);
        drop(fresh);
        assert!(
            after_restart == expected,
            "round {round}: the table after kill + restart differs from a fresh start's ({} vs {} lines)",
            after_restart.lines().count(),
            expected.lines().count()
        );
        // The large policy's last destination (an Allow: an odd index) is in the table.
        let n = 7_990 - round * 10;
        let last = format!("198.51.{}.{}", 100 + ((n - 1) / 256) % 2, (n - 1) % 256);
        assert!(
            expected.contains(&format!("{last},")) || expected.contains(&format!("{last} ")),
            "round {round}: not the large policy ({last} missing)"
        );
        assert!(flow.alive(3), "round {round}: the connection after a fresh start");
        t.set_firewall("team-a", &big_firewall(0));
    }
}
