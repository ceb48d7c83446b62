//! Test hosts in network namespaces: create, wire, run egressd in, probe across, and
//! remove them — also when a test fails (everything is torn down on drop).
//!
//! Namespace work runs on a dedicated thread that `setns`es into the namespace (setns
//! only affects the calling thread); sockets created there stay in that namespace, so
//! servers and clients live in this process and need no external programs. Processes
//! (egressd) are started with `ip netns exec`, which execs in place, so the child's PID
//! is the program's own and it is stopped by that PID.
//!
//! Addresses: 198.18.0.0/15 for nodes and pods, 192.0.2.0/24, 198.51.100.0/24,
//! 203.0.113.0/24 and 2001:db8::/32 for external hosts.

#![allow(dead_code)]

pub mod cluster;
pub mod failover;
pub mod kube;
pub mod routed;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::path::Path;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

static COUNTER: AtomicUsize = AtomicUsize::new(0);

/// Fail the test unless it runs as root with `ip` and `nft` available.
pub fn require_root() {
    assert!(nix::unistd::geteuid().is_root(), "netns tests need root (run the README's test command as root)");
    for tool in ["ip", "nft"] {
        let ok = Command::new(tool).arg("-V").output().map(|o| o.status.success()).unwrap_or(false)
            || Command::new(tool).arg("--version").output().map(|o| o.status.success()).unwrap_or(false);
        assert!(ok, "`{tool}` not found: install iproute2 and nftables");
    }
}

/// Run a command, panicking with its stderr on failure.
pub fn sh(args: &[&str]) -> String {
    let out = Command::new(args[0]).args(&args[1..]).output().unwrap_or_else(|e| panic!("{args:?}: {e}"));
    assert!(out.status.success(), "{args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A network namespace, deleted on drop.
pub struct Netns {
    pub name: String,
}

impl Netns {
    /// Create `egd<pid>-<n>-<role>` (unique per process and call).
    pub fn new(role: &str) -> Self {
        let n = COUNTER.fetch_add(1, Ordering::SeqCst);
        let name = format!("egd{}-{n}-{role}", std::process::id());
        sh(&["ip", "netns", "add", &name]);
        let ns = Self { name };
        ns.ip(&["link", "set", "lo", "up"]);
        ns
    }

    /// `ip -n NAME ARGS...`
    pub fn ip(&self, args: &[&str]) -> String {
        let mut full = vec!["ip", "-n", self.name.as_str()];
        full.extend_from_slice(args);
        sh(&full)
    }

    /// `ip netns exec NAME ARGS...`
    pub fn exec(&self, args: &[&str]) -> String {
        let mut full = vec!["ip", "netns", "exec", self.name.as_str()];
        full.extend_from_slice(args);
        sh(&full)
    }

    /// `ip netns exec NAME ARGS...`, returning success and combined output.
    pub fn try_exec(&self, args: &[&str]) -> (bool, String) {
        let out = Command::new("ip").args(["netns", "exec", &self.name]).args(args).output().unwrap();
        let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.push_str(&String::from_utf8_lossy(&out.stderr));
        (out.status.success(), text)
    }

    /// Set a sysctl inside the namespace.
    pub fn sysctl(&self, key: &str, value: &str) {
        self.exec(&["sysctl", "-qw", &format!("{key}={value}")]);
    }

    /// Run `f` on a thread that has entered this namespace.
    pub fn run<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        let path = format!("/run/netns/{}", self.name);
        std::thread::spawn(move || {
            let file = std::fs::File::open(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
            nix::sched::setns(file, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
            f()
        })
        .join()
        .expect("netns thread panicked")
    }

    /// The nft ruleset of the namespace.
    pub fn nft_list(&self) -> String {
        self.exec(&["nft", "list", "ruleset"])
    }

    /// `nft -j list table inet NAME` without what differs between equal tables: object
    /// handles, the time elements have left, the order of set elements.
    pub fn table_json(&self, table: &str) -> serde_json::Value {
        fn normalize(v: &mut serde_json::Value) {
            match v {
                serde_json::Value::Object(map) => {
                    map.remove("handle");
                    map.remove("expires");
                    map.values_mut().for_each(normalize);
                    if let Some(serde_json::Value::Array(elements)) = map.get_mut("elem") {
                        elements.sort_by_key(|e| e.to_string());
                    }
                }
                serde_json::Value::Array(items) => items.iter_mut().for_each(normalize),
                _ => {}
            }
        }
        let mut v: serde_json::Value =
            serde_json::from_str(&self.exec(&["nft", "-j", "list", "table", "inet", table])).expect("nft -j");
        normalize(&mut v);
        v
    }

    /// Whether table `inet NAME` exists.
    pub fn has_table(&self, table: &str) -> bool {
        self.try_exec(&["nft", "list", "table", "inet", table]).0
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.name]).status();
    }
}

/// Connect `a` (in `ns_a`, interface `if_a`) and `b` with a veth pair.
pub fn veth(ns_a: &Netns, if_a: &str, ns_b: &Netns, if_b: &str) {
    let n = COUNTER.fetch_add(1, Ordering::SeqCst);
    let tmp_a = format!("egdv{}a{n}", std::process::id() % 100000);
    let tmp_b = format!("egdv{}b{n}", std::process::id() % 100000);
    sh(&["ip", "link", "add", &tmp_a, "type", "veth", "peer", "name", &tmp_b]);
    sh(&["ip", "link", "set", &tmp_a, "netns", &ns_a.name, "name", if_a]);
    sh(&["ip", "link", "set", &tmp_b, "netns", &ns_b.name, "name", if_b]);
    // No duplicate address detection on test links: a tentative link-local address
    // delays neighbour discovery by a second or more.
    ns_a.sysctl(&format!("net.ipv6.conf.{if_a}.accept_dad"), "0");
    ns_b.sysctl(&format!("net.ipv6.conf.{if_b}.accept_dad"), "0");
    ns_a.ip(&["link", "set", if_a, "up"]);
    ns_b.ip(&["link", "set", if_b, "up"]);
}

/// Add an address without duplicate address detection.
pub fn addr(ns: &Netns, dev: &str, cidr: &str) {
    if cidr.contains(':') {
        ns.ip(&["addr", "add", cidr, "dev", dev, "nodad"]);
    } else {
        ns.ip(&["addr", "add", cidr, "dev", dev]);
    }
}

/// Servers started in a namespace: TCP on each port (answers with the peer address
/// and closes) and UDP on each port (echoes the peer address). Dual-stack sockets.
pub fn serve(ns: &Netns, tcp_ports: &[u16], udp_ports: &[u16]) {
    let tcp: Vec<TcpListener> = {
        let ports = tcp_ports.to_vec();
        ns.run(move || ports.iter().map(|p| TcpListener::bind(("::", *p)).expect("bind tcp")).collect())
    };
    let udp: Vec<UdpSocket> = {
        let ports = udp_ports.to_vec();
        ns.run(move || ports.iter().map(|p| UdpSocket::bind(("::", *p)).expect("bind udp")).collect())
    };
    for l in tcp {
        std::thread::spawn(move || {
            for mut s in l.incoming().flatten() {
                let peer = s.peer_addr().map(|a| a.ip().to_canonical().to_string()).unwrap_or_default();
                let _ = s.write_all(peer.as_bytes());
            }
        });
    }
    for u in udp {
        std::thread::spawn(move || {
            let mut buf = [0u8; 1500];
            while let Ok((_, from)) = u.recv_from(&mut buf) {
                let _ = u.send_to(from.ip().to_canonical().to_string().as_bytes(), from);
            }
        });
    }
}

/// TCP connect from `ns` to `addr`; `Some(source address seen by the server)` on success.
pub fn tcp(ns: &Netns, addr: &str, port: u16) -> Option<String> {
    let target: SocketAddr = SocketAddr::new(addr.parse().unwrap(), port);
    ns.run(move || {
        let mut s = TcpStream::connect_timeout(&target, Duration::from_millis(700)).ok()?;
        s.set_read_timeout(Some(Duration::from_millis(700))).ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).ok()?;
        Some(out)
    })
}

/// UDP round trip from `ns`; `Some(source address seen by the server)` on a reply.
pub fn udp(ns: &Netns, addr: &str, port: u16) -> Option<String> {
    let target: SocketAddr = SocketAddr::new(addr.parse().unwrap(), port);
    ns.run(move || {
        let bind: SocketAddr = if target.is_ipv4() { "0.0.0.0:0".parse().unwrap() } else { "[::]:0".parse().unwrap() };
        let s = UdpSocket::bind(bind).ok()?;
        s.set_read_timeout(Some(Duration::from_millis(500))).ok()?;
        s.send_to(b"ping", target).ok()?;
        let mut buf = [0u8; 256];
        let (n, _) = s.recv_from(&mut buf).ok()?;
        Some(String::from_utf8_lossy(&buf[..n]).into_owned())
    })
}

/// Poll `f` until it is true or `timeout` passes; returns the time it took.
pub fn wait_for(timeout: Duration, mut f: impl FnMut() -> bool) -> Option<Duration> {
    let start = Instant::now();
    while start.elapsed() < timeout {
        if f() {
            return Some(start.elapsed());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

/// The egressd binary cargo built from the current source for these tests.
pub fn egressd_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_egressd"))
}

/// An egressd process in a namespace, stopped (SIGTERM, by its own PID) on drop.
pub struct Agent {
    child: Option<Child>,
    pub log: PathBuf,
}

impl Agent {
    /// Start `egressd ARGS...` in `ns`, logging to `log`.
    pub fn start(ns: &Netns, args: &[&str], log: PathBuf) -> Self {
        Self::start_env(ns, args, &[], log)
    }

    /// [`Agent::start`] with extra environment variables.
    pub fn start_env(ns: &Netns, args: &[&str], env: &[(&str, &str)], log: PathBuf) -> Self {
        Self::start_wrapped(ns, &[], args, env, log)
    }

    /// [`Agent::start_env`] under `wrapper` (a program that execs the rest of its
    /// arguments in place, such as `setpriv …`: the PID stays egressd's).
    pub fn start_wrapped(ns: &Netns, wrapper: &[&str], args: &[&str], env: &[(&str, &str)], log: PathBuf) -> Self {
        let file = std::fs::File::create(&log).unwrap();
        let child = Command::new("ip")
            .args(["netns", "exec", &ns.name])
            .args(wrapper)
            .arg(egressd_bin())
            .args(args)
            .envs(env.iter().copied())
            .env("RUST_LOG", "egressd=debug,info")
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .unwrap();
        Self { child: Some(child), log }
    }

    /// The process id (egressd's own: `ip netns exec` execs in place).
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    /// SIGTERM and wait (up to 10 s, then SIGKILL and `None`); returns the exit code.
    pub fn stop(&mut self) -> Option<i32> {
        let mut child = self.child.take()?;
        let pid = nix::unistd::Pid::from_raw(child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let start = Instant::now();
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return status.code();
            }
            if start.elapsed() > Duration::from_secs(10) {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// SIGKILL (by its own PID) and reap it: no handler runs, nothing is cleaned up.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// The log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The log lines of syncs that went through the `nft` program although the
    /// transport is netlink (a rule the in-process encoder does not write, or a batch the
    /// kernel refused): none is expected, every table egressd writes goes in-process.
    pub fn nft_fallbacks(&self) -> Vec<String> {
        self.log_text().lines().filter(|l| l.contains("through nft")).map(str::to_string).collect()
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.stop();
    }
}

pub const TCP_PORTS: [u16; 2] = [8080, 9090];
pub const UDP_PORTS: [u16; 1] = [5353];

pub struct Topology {
    pub node: Netns,
    pub pods: Vec<Netns>,
    pub ext: Netns,
    pub dir: tempfile::TempDir,
}

pub fn pod_v4(i: usize) -> String {
    format!("198.18.1.{}", 4 * i + 2)
}

pub fn pod_v6(i: usize) -> String {
    format!("2001:db8:1:{}::2", i + 1)
}

/// The node settings every test agent runs with (and `egressd explain --manifests`
/// needs to explain as it did).
pub const NODE_ARGS: [&str; 8] = [
    "--node-name",
    "node-a",
    "--cluster-cidr",
    "198.18.0.0/16",
    "--cluster-cidr",
    "2001:db8:1::/48",
    "--service-cidr",
    "198.19.0.0/16",
];

/// One node namespace running egressd, pods behind it, an external host.
///
/// ```text
///  pod i: 198.18.1.(4i+2)/30, 2001:db8:1:(i+1)::2/64 ── node (egressd) eth-ext 203.0.113.1/24, 2001:db8:ff::1/64
///                                                       ── ext 203.0.113.2/24, 2001:db8:ff::2/64, 192.0.2.10,
///                                                          198.51.100.10, 2001:db8:ff:1::10
/// ```
impl Topology {
    /// Pods `i` in namespaces `pod_namespaces[i]`, unlabelled.
    pub fn new(pod_namespaces: &[&str]) -> Self {
        let pods: Vec<(&str, &str)> = pod_namespaces.iter().map(|ns| (*ns, "{}")).collect();
        Self::with_pods(&pods)
    }

    /// Pods `(namespace, labels as YAML flow map)`; an empty namespace wires the pod
    /// but does not declare it (see [`Topology::declare_pod`]).
    pub fn with_pods(pod_defs: &[(&str, &str)]) -> Self {
        require_root();
        let node = Netns::new("node");
        node.sysctl("net.ipv4.ip_forward", "1");
        node.sysctl("net.ipv6.conf.all.forwarding", "1");
        let ext = Netns::new("ext");
        veth(&node, "eth-ext", &ext, "eth0");
        addr(&node, "eth-ext", "203.0.113.1/24");
        addr(&node, "eth-ext", "2001:db8:ff::1/64");
        for a in ["203.0.113.2/24", "192.0.2.10/32", "198.51.100.10/32", "2001:db8:ff::2/64", "2001:db8:ff:1::10/128"] {
            addr(&ext, "eth0", a);
        }
        ext.ip(&["route", "add", "198.18.0.0/15", "via", "203.0.113.1"]);
        ext.ip(&["-6", "route", "add", "2001:db8:1::/48", "via", "2001:db8:ff::1"]);
        node.ip(&["route", "add", "192.0.2.0/24", "via", "203.0.113.2"]);
        node.ip(&["route", "add", "198.51.100.0/24", "via", "203.0.113.2"]);
        node.ip(&["-6", "route", "add", "2001:db8:ff:1::/64", "via", "2001:db8:ff::2"]);

        let mut pods = Vec::new();
        for i in 0..pod_defs.len() {
            let pod = Netns::new(&format!("pod{i}"));
            let dev = format!("vpod{i}");
            veth(&node, &dev, &pod, "eth0");
            addr(&node, &dev, &format!("198.18.1.{}/30", 4 * i + 1));
            addr(&node, &dev, &format!("2001:db8:1:{}::1/64", i + 1));
            addr(&pod, "eth0", &format!("{}/30", pod_v4(i)));
            addr(&pod, "eth0", &format!("{}/64", pod_v6(i)));
            pod.ip(&["route", "add", "default", "via", &format!("198.18.1.{}", 4 * i + 1)]);
            pod.ip(&["-6", "route", "add", "default", "via", &format!("2001:db8:1:{}::1", i + 1)]);
            pods.push(pod);
        }
        serve(&ext, &TCP_PORTS, &UDP_PORTS);
        serve(&node, &TCP_PORTS, &UDP_PORTS);
        for p in &pods {
            serve(p, &TCP_PORTS, &UDP_PORTS);
        }

        let dir = tempfile::tempdir().unwrap();
        let cluster = "apiVersion: v1\nkind: Node\nmetadata: {name: node-a}\nstatus:\n  addresses:\n  - {type: InternalIP, address: 203.0.113.1}\n";
        std::fs::write(dir.path().join("cluster.yaml"), cluster).unwrap();
        let t = Self { node, pods, ext, dir };
        for (i, (ns, labels)) in pod_defs.iter().enumerate() {
            if !ns.is_empty() {
                t.declare_pod(i, ns, labels);
            }
        }
        t
    }

    pub fn manifests(&self) -> &Path {
        self.dir.path()
    }

    /// Write (atomically) pod `i`'s manifest: namespace and labels.
    pub fn declare_pod(&self, i: usize, namespace: &str, labels: &str) {
        let body = format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: pod{i}, namespace: {namespace}, labels: {labels}}}\nspec: {{nodeName: node-a}}\n\
             status:\n  phase: Running\n  podIPs: [{{ip: {}}}, {{ip: \"{}\"}}]\n",
            pod_v4(i),
            pod_v6(i)
        );
        self.write_manifest(&format!("pod-{i}.yaml"), &body);
    }

    /// Write a manifest atomically (write + rename, as editors do).
    pub fn write_manifest(&self, name: &str, body: &str) {
        let tmp = self.dir.path().join(format!(".{name}.tmp"));
        std::fs::write(&tmp, body).unwrap();
        std::fs::rename(&tmp, self.dir.path().join(name)).unwrap();
    }

    /// Remove a manifest.
    pub fn remove_manifest(&self, name: &str) {
        std::fs::remove_file(self.dir.path().join(name)).unwrap();
    }

    /// Write the EgressFirewall of `namespace`.
    pub fn set_firewall(&self, namespace: &str, rules: &str) {
        let body = format!(
            "apiVersion: k8s.ovn.org/v1\nkind: EgressFirewall\nmetadata: {{name: default, namespace: {namespace}}}\nspec:\n  egress:\n{rules}"
        );
        self.write_manifest(&format!("firewall-{namespace}.yaml"), &body);
    }

    /// Remove the EgressFirewall of `namespace`.
    pub fn remove_firewall(&self, namespace: &str) {
        self.remove_manifest(&format!("firewall-{namespace}.yaml"));
    }

    pub fn start_agent(&self, name: &str) -> Agent {
        self.start_agent_with(name, &[])
    }

    /// Start egressd on the node with extra arguments; waits for its first sync.
    pub fn start_agent_with(&self, name: &str, extra: &[&str]) -> Agent {
        self.start_agent_env(name, extra, &[])
    }

    /// [`Topology::start_agent_with`] with extra environment variables.
    pub fn start_agent_env(&self, name: &str, extra: &[&str], env: &[(&str, &str)]) -> Agent {
        self.start_agent_wrapped(name, &[], extra, env)
    }

    /// [`Topology::start_agent_env`] under `wrapper` ([`Agent::start_wrapped`]).
    pub fn start_agent_wrapped(&self, name: &str, wrapper: &[&str], extra: &[&str], env: &[(&str, &str)]) -> Agent {
        let dir = self.manifests().to_str().unwrap().to_string();
        let state = self.dir.path().join("state").to_str().unwrap().to_string();
        let mut args: Vec<&str> = vec!["run", "--manifests", &dir];
        args.extend_from_slice(&NODE_ARGS);
        args.extend_from_slice(&["--state-dir", &state]);
        args.extend_from_slice(extra);
        let agent = Agent::start_wrapped(&self.node, wrapper, &args, env, self.dir.path().join(format!("{name}.log")));
        let in_sync = wait_for(Duration::from_secs(10), || agent.log_text().contains("dataplane in sync"));
        assert!(in_sync.is_some(), "egressd did not sync:\n{}", agent.log_text());
        agent
    }
}

/// Records the DSCP of UDP packets arriving in `ns` on each of `ports`: one nft counter
/// per (port, family, DSCP value) in the namespace's own table (nft 1.0.6 cannot key a
/// set by IPv6 DSCP, so counters it is).
pub struct DscpObserver<'a> {
    ns: &'a Netns,
}

impl<'a> DscpObserver<'a> {
    pub fn install(ns: &'a Netns, ports: std::ops::RangeInclusive<u16>) -> Self {
        let mut script =
            String::from("table inet dscpobs {\n chain in {\n  type filter hook input priority -300; policy accept;\n");
        for port in ports {
            for d in 0..64 {
                script.push_str(&format!(
                    "  udp dport {port} ip dscp {d} counter\n  udp dport {port} ip6 dscp {d} counter\n"
                ));
            }
        }
        script.push_str(" }\n}\n");
        let path = std::env::temp_dir().join(format!("dscpobs-{}.nft", ns.name));
        std::fs::write(&path, script).unwrap();
        ns.exec(&["nft", "-f", path.to_str().unwrap()]);
        let _ = std::fs::remove_file(path);
        Self { ns }
    }

    /// The DSCP values seen on `port` so far.
    pub fn seen(&self, port: u16) -> Vec<u8> {
        let text = self.ns.exec(&["nft", "list", "chain", "inet", "dscpobs", "in"]);
        let mut out = Vec::new();
        for line in text.lines().map(str::trim) {
            let words: Vec<&str> = line.split_whitespace().collect();
            // udp dport P ip[6] dscp V counter packets N bytes B
            if words.len() >= 9 && words[2] == port.to_string() && words[7] == "packets" && words[8] != "0" {
                let v = words[5];
                let value = match v.strip_prefix("0x") {
                    Some(hex) => u8::from_str_radix(hex, 16).unwrap(),
                    None => dscp_name(v),
                };
                out.push(value);
            }
        }
        out
    }
}

fn dscp_name(name: &str) -> u8 {
    match name {
        "cs0" => 0,
        "cs1" => 8,
        "cs2" => 16,
        "cs3" => 24,
        "cs4" => 32,
        "cs5" => 40,
        "cs6" => 48,
        "cs7" => 56,
        "af11" => 10,
        "af12" => 12,
        "af13" => 14,
        "af21" => 18,
        "af22" => 20,
        "af23" => 22,
        "af31" => 26,
        "af32" => 28,
        "af33" => 30,
        "af41" => 34,
        "af42" => 36,
        "af43" => 38,
        "ef" => 46,
        "va" => 44,
        "le" => 1,
        other => other.parse().unwrap_or_else(|_| panic!("unknown dscp {other}")),
    }
}

/// Send one UDP datagram from `ns` (no reply expected).
pub fn udp_send(ns: &Netns, addr: &str, port: u16) {
    let target: SocketAddr = SocketAddr::new(addr.parse().unwrap(), port);
    ns.run(move || {
        let bind = if target.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" };
        let s = UdpSocket::bind(bind).unwrap();
        s.send_to(b"mark me", target).unwrap();
    });
}

/// A dnsmasq serving `hosts` (an /etc/hosts-style file it re-reads on SIGHUP) on
/// `listen`:53 in `ns`, answers with TTL `ttl`. Stopped by its own PID on drop.
pub struct Dnsmasq {
    child: Option<Child>,
    pub hosts: PathBuf,
}

impl Dnsmasq {
    pub fn start(ns: &Netns, listen: &str, hosts: PathBuf, ttl: u32) -> Self {
        Self::start_with(ns, listen, hosts, ttl, &[])
    }

    /// [`Dnsmasq::start`] with extra dnsmasq options (`--cname=...`).
    pub fn start_with(ns: &Netns, listen: &str, hosts: PathBuf, ttl: u32, extra: &[&str]) -> Self {
        let child = Command::new("ip")
            .args(["netns", "exec", &ns.name, "dnsmasq", "--keep-in-foreground", "--no-resolv", "--no-hosts"])
            .arg(format!("--addn-hosts={}", hosts.display()))
            .arg(format!("--local-ttl={ttl}"))
            .arg(format!("--listen-address={listen}"))
            .args(["--bind-interfaces", "--port=53", "--user=root", "--conf-file=/dev/null", "--pid-file="])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("dnsmasq (install dnsmasq-base)");
        let d = Self { child: Some(child), hosts };
        let ready =
            wait_for(Duration::from_secs(5), || ns.try_exec(&["ss", "-lun"]).1.contains(&format!("{listen}:53")));
        assert!(ready.is_some(), "dnsmasq did not start");
        d
    }

    /// Replace the hosts file and make dnsmasq re-read it.
    pub fn set_hosts(&self, text: &str) {
        std::fs::write(&self.hosts, text).unwrap();
        if let Some(c) = &self.child {
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(c.id() as i32), nix::sys::signal::Signal::SIGHUP)
                .unwrap();
        }
    }

    /// Stop the server (its PID, not a wrapper's).
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ =
                nix::sys::signal::kill(nix::unistd::Pid::from_raw(c.id() as i32), nix::sys::signal::Signal::SIGTERM);
            let _ = c.wait();
        }
    }
}

impl Drop for Dnsmasq {
    fn drop(&mut self) {
        self.stop();
    }
}

/// `GET path` over HTTP/1.0 from `ns`; (status code, body).
pub fn http_get(ns: &Netns, addr: &str, path: &str) -> Option<(u16, String)> {
    let target: SocketAddr = addr.parse().unwrap();
    let path = path.to_string();
    ns.run(move || {
        let mut s = TcpStream::connect_timeout(&target, Duration::from_millis(700)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
        s.write_all(format!("GET {path} HTTP/1.0\r\nHost: egressd\r\n\r\n").as_bytes()).ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).ok()?;
        let code = out.split_whitespace().nth(1)?.parse().ok()?;
        let body = out.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
        Some((code, body))
    })
}

/// The A and AAAA addresses of a DNS message's answer section.
pub fn dns_addresses(m: &hickory_proto::op::Message) -> Vec<std::net::IpAddr> {
    use hickory_proto::rr::RData;
    m.answers
        .iter()
        .filter_map(|r| match &r.data {
            RData::A(a) => Some(std::net::IpAddr::V4(a.0)),
            RData::AAAA(a) => Some(std::net::IpAddr::V6(a.0)),
            _ => None,
        })
        .collect()
}
