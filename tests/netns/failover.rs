//! What the EgressIP failover tests and benches share (`placement_netns.rs` on one
//! segment, `tunnel_kube_netns.rs` across subnets): new connections probed quickly, a
//! node killed, the time until every watched pod leaves as the egress IP again, the
//! table the benches print.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use super::{Agent, Netns, wait_for};

/// One new connection from `pod` to a source-echoing server at `target` (a line is sent
/// first, for servers that answer lines): the source it saw. 150 ms bounds each step:
/// the failover loops retry at once, so a lost SYN costs a retry, not a second.
pub fn quick_source(pod: &Netns, target: SocketAddr) -> Option<String> {
    source_within(pod, target, Duration::from_millis(150))
}

/// [`quick_source`] with `bound` for each step: a single check (not a retrying loop)
/// gives a loaded machine its time.
pub fn source_within(pod: &Netns, target: SocketAddr, bound: Duration) -> Option<String> {
    pod.run(move || {
        let s = TcpStream::connect_timeout(&target, bound).ok()?;
        s.set_read_timeout(Some(bound)).ok()?;
        let mut w = s.try_clone().ok()?;
        w.write_all(b"x\n").ok()?;
        let mut line = String::new();
        BufReader::new(s).read_line(&mut line).ok()?;
        Some(line.trim().to_string())
    })
}

/// Kill a node: its uplink `eth0` down and its agent SIGKILLed (API objects unchanged).
pub fn kill_node(ns: &Netns, agent: &mut Option<Agent>) {
    ns.ip(&["link", "set", "eth0", "down"]);
    if let Some(mut a) = agent.take() {
        a.kill();
    }
}

/// From `t0` until a new connection of every pod in `pods` leaves as `eip` (10 s at most).
pub fn until_all_leave_as(pods: &[&Netns], target: SocketAddr, eip: &str, t0: Instant) -> Option<Duration> {
    let mut done = vec![false; pods.len()];
    while t0.elapsed() < Duration::from_secs(10) {
        for (pod, d) in pods.iter().zip(done.iter_mut()) {
            if !*d {
                *d = quick_source(pod, target).as_deref() == Some(eip);
            }
        }
        if done.iter().all(|d| *d) {
            return Some(t0.elapsed());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    None
}

/// How often the leader `agent` logged a node reachable again.
pub fn reachable_count(leader: Option<&Agent>) -> usize {
    leader.map(Agent::log_text).unwrap_or_default().matches("egress node reachable").count()
}

/// Wait until the leader logged a node reachable more than `seen` times.
pub fn leader_sees_it_again(leader: Option<&Agent>, seen: usize) {
    let again = wait_for(Duration::from_secs(10), || reachable_count(leader) > seen);
    assert!(again.is_some(), "the leader never saw the revived node answer");
}

/// The bench table's header.
pub fn print_header() {
    println!("| run | node killed | new host | failover (ms) |");
    println!("|---|---|---|---|");
}

/// The bench's summary line (the last line, which bench/run.sh quotes).
pub fn print_summary(mut times: Vec<Duration>) {
    times.sort();
    let median = times[times.len() / 2];
    let max = times[times.len() - 1];
    println!("failover over {} runs: median {} ms, max {} ms", times.len(), median.as_millis(), max.as_millis());
}
