//! The core stays pure: nothing in its dependency closure does I/O, and its own code
//! (tests aside) reaches no filesystem, socket, process or thread. ARCHITECTURE.md states
//! it; this keeps it true.

use std::path::Path;
use std::process::Command;

/// Crates that do I/O or run tasks: none may be in the core's dependency closure.
const IO_CRATES: &[&str] = &[
    "tokio",
    "kube",
    "kube-client",
    "kube-runtime",
    "hyper",
    "reqwest",
    "rtnetlink",
    "netlink-proto",
    "netlink-sys",
    "nix",
    "mio",
    "socket2",
    "hickory-resolver",
    "nftables",
];

#[test]
fn no_crate_that_does_io_is_a_dependency_of_the_core() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(["tree", "--offline", "-p", "egressd-core", "-e", "normal", "--prefix", "none", "--format", "{p}"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo tree runs");
    assert!(out.status.success(), "cargo tree failed: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    let names: Vec<&str> = text.lines().filter_map(|l| l.split_whitespace().next()).collect();
    assert!(names.contains(&"egressd-core"), "{text}");
    assert!(names.contains(&"kube-core"), "the tree lists the dependencies: {text}");
    let found: Vec<&&str> = IO_CRATES.iter().filter(|c| names.contains(c)).collect();
    assert!(found.is_empty(), "the core depends on crates that do I/O: {found:?}");
}

/// What the core's non-test code must not name.
const IO_PATHS: &[&str] = &[
    "std::fs",
    "std::process",
    "std::thread",
    "std::os::",
    "std::net::TcpStream",
    "std::net::TcpListener",
    "std::net::UdpSocket",
    "std::io::stdin",
    "std::env::var",
];

#[test]
fn the_core_code_names_no_filesystem_socket_process_or_thread() {
    let mut offenders = Vec::new();
    let mut files = 0;
    visit(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"), &mut |path, text| {
        files += 1;
        // Unit tests sit at the end of a file, after `#[cfg(test)]`.
        let code = text.split("\n#[cfg(test)]").next().unwrap_or_default();
        for (i, line) in code.lines().enumerate() {
            let line = line.split("//").next().unwrap_or_default();
            for p in IO_PATHS {
                if line.contains(p) {
                    offenders.push(format!("{}:{}: {p}", path.display(), i + 1));
                }
            }
        }
    });
    assert!(files > 40, "read {files} files");
    assert!(offenders.is_empty(), "I/O in the pure core:\n{}", offenders.join("\n"));
}

fn visit(dir: &Path, f: &mut dyn FnMut(&Path, &str)) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            visit(&path, f);
        } else if path.extension().is_some_and(|e| e == "rs") && !path.ends_with("tests.rs") {
            f(&path, &std::fs::read_to_string(&path).unwrap());
        }
    }
}
