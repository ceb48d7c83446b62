//! The `nft` program as egressd runs it: the error type every nft path reports
//! ([`NftError`], netlink's included), each run bounded by [`NFT_TIMEOUT`], started
//! through a symlink named [`NFT_ALIAS`], and the PIDs of the runs remembered so the
//! drift watch tells egressd's own transactions apart ([`is_own`]).

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

/// An nft failure, with nft's own message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NftError {
    /// nft could not be started.
    #[error("cannot run {program}: {message}")]
    Spawn {
        /// The program.
        program: String,
        /// The OS error.
        message: String,
    },
    /// nft rejected the script.
    #[error("nft rejected the transaction: {message}")]
    Rejected {
        /// nft's stderr.
        message: String,
    },
    /// nft did not finish in time and was killed.
    #[error("nft did not finish within {seconds} s; killed")]
    Timeout {
        /// The limit.
        seconds: u64,
    },
    /// The kernel refused an element transaction sent over netlink (or the socket
    /// failed).
    #[error("nf_tables netlink transaction failed: {message}")]
    Netlink {
        /// The OS error.
        message: String,
    },
}

/// How long one `nft` run may take before it is killed (and the sync reported failed).
pub(crate) const NFT_TIMEOUT: Duration = Duration::from_secs(30);

/// The PIDs of the `nft` processes this agent started (the most recent ones): their
/// commits are egressd's own, not drift (see [`crate::dataplane::drift`]).
static OWN_NFT: Mutex<VecDeque<u32>> = Mutex::new(VecDeque::new());

pub(super) fn record_own(pid: u32) {
    if let Ok(mut own) = OWN_NFT.lock() {
        if own.len() >= 64 {
            own.pop_front();
        }
        own.push_back(pid);
    }
}

/// `program` as an absolute path (searched in `PATH` when it has no `/`).
pub(super) fn find_program(program: &std::path::Path) -> Option<PathBuf> {
    if program.is_absolute() {
        return Some(program.to_path_buf());
    }
    if program.components().count() > 1 {
        return std::fs::canonicalize(program).ok();
    }
    std::env::var_os("PATH")?.to_str()?.split(':').map(|d| std::path::Path::new(d).join(program)).find(|p| p.is_file())
}

/// Whether the kernel's name for a committer (`comm`, at most 15 bytes) is one of
/// egressd's: its `nft` runs ([`NFT_ALIAS`]), the agent and its threads (`egressd…`).
pub(crate) fn is_own_name(name: &str) -> bool {
    name.starts_with("egressd")
}

/// Whether `pid` — as the kernel names the committer of an nf_tables transaction: the
/// task, so a thread's id — is this agent (any of its threads: the DNS snooping listener
/// writes elements from its own) or an `nft` process it started.
pub(crate) fn is_own(pid: u32) -> bool {
    pid == std::process::id()
        || std::path::Path::new(&format!("/proc/self/task/{pid}")).exists()
        || OWN_NFT.lock().is_ok_and(|own| own.contains(&pid))
}

/// The name egressd's `nft` runs have in the kernel (their `comm`, which nf_tables
/// reports with each transaction): they are started through a symlink of this name.
pub(crate) const NFT_ALIAS: &str = "egressd-nft";

/// Wait for `child` at most [`NFT_TIMEOUT`]; past it, kill it and return `None`.
pub(super) fn wait_within_timeout(
    child: &mut std::process::Child,
) -> std::io::Result<Option<std::process::ExitStatus>> {
    let deadline = std::time::Instant::now() + NFT_TIMEOUT;
    loop {
        match child.try_wait()? {
            Some(status) => return Ok(Some(status)),
            None if std::time::Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return Ok(None);
            }
            None => std::thread::sleep(Duration::from_millis(2)),
        }
    }
}

/// What a finished `child` wrote to its piped stderr, trimmed.
pub(super) fn stderr_of(child: &mut std::process::Child) -> String {
    let mut stderr = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut e, &mut stderr);
    }
    stderr.trim().to_string()
}
