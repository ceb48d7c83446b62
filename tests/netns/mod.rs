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

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

static COUNTER: AtomicUsize = AtomicUsize::new(0);

/// Fail the test unless it runs as root with `ip` and `nft` available.
pub fn require_root() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "netns tests need root (run the README's test command as root)"
    );
    for tool in ["ip", "nft"] {
        let ok = Command::new(tool)
            .arg("-V")
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false)
            || Command::new(tool)
                .arg("--version")
                .output()
                .map(|o| o.status.success())
                .unwrap_or(false);
        assert!(ok, "`{tool}` not found: install iproute2 and nftables");
    }
}

/// Run a command, panicking with its stderr on failure.
pub fn sh(args: &[&str]) -> String {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .unwrap_or_else(|e| panic!("{args:?}: {e}"));
    assert!(
        out.status.success(),
        "{args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
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
        let out = Command::new("ip")
            .args(["netns", "exec", &self.name])
            .args(args)
            .output()
            .unwrap();
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

    /// Whether table `inet NAME` exists.
    pub fn has_table(&self, table: &str) -> bool {
        self.try_exec(&["nft", "list", "table", "inet", table]).0
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

/// Connect `a` (in `ns_a`, interface `if_a`) and `b` with a veth pair.
pub fn veth(ns_a: &Netns, if_a: &str, ns_b: &Netns, if_b: &str) {
    let n = COUNTER.fetch_add(1, Ordering::SeqCst);
    let tmp_a = format!("egdv{}a{n}", std::process::id() % 100000);
    let tmp_b = format!("egdv{}b{n}", std::process::id() % 100000);
    sh(&[
        "ip", "link", "add", &tmp_a, "type", "veth", "peer", "name", &tmp_b,
    ]);
    sh(&[
        "ip", "link", "set", &tmp_a, "netns", &ns_a.name, "name", if_a,
    ]);
    sh(&[
        "ip", "link", "set", &tmp_b, "netns", &ns_b.name, "name", if_b,
    ]);
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
        ns.run(move || {
            ports
                .iter()
                .map(|p| TcpListener::bind(("::", *p)).expect("bind tcp"))
                .collect()
        })
    };
    let udp: Vec<UdpSocket> = {
        let ports = udp_ports.to_vec();
        ns.run(move || {
            ports
                .iter()
                .map(|p| UdpSocket::bind(("::", *p)).expect("bind udp"))
                .collect()
        })
    };
    for l in tcp {
        std::thread::spawn(move || {
            for mut s in l.incoming().flatten() {
                let peer = s
                    .peer_addr()
                    .map(|a| a.ip().to_canonical().to_string())
                    .unwrap_or_default();
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
        let bind: SocketAddr = if target.is_ipv4() {
            "0.0.0.0:0".parse().unwrap()
        } else {
            "[::]:0".parse().unwrap()
        };
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
        let file = std::fs::File::create(&log).unwrap();
        let child = Command::new("ip")
            .args(["netns", "exec", &ns.name])
            .arg(egressd_bin())
            .args(args)
            .env("RUST_LOG", "egressd=debug,info")
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .unwrap();
        Self {
            child: Some(child),
            log,
        }
    }

    /// The process id (egressd's own: `ip netns exec` execs in place).
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    /// SIGTERM and wait; returns the exit status code.
    pub fn stop(&mut self) -> Option<i32> {
        let mut child = self.child.take()?;
        let pid = nix::unistd::Pid::from_raw(child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let start = Instant::now();
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return status.code();
            }
            if start.elapsed() > Duration::from_secs(5) {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.stop();
    }
}
