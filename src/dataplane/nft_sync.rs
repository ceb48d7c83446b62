//! The nftables driver.
//!
//! Backends: the `nft` program fed a script on stdin (`nft -f -`), nft's own error text
//! captured and returned; and, for changes that are set and map elements only (the
//! steady state: pods, DNS answers, EgressIP members), in-process nf_tables netlink
//! ([`crate::dataplane::elements`]). Measured on the project's machines
//! (`bench/RESULTS.md` and `bench/`): a small delta through `nft` costs ~5–7 ms of
//! process start plus nft reading the whole table into its cache before each
//! transaction (tens of ms at 100k rules); the netlink path costs the kernel's commit
//! only. Text is what `egressd render` shows, so a full replace applies exactly the
//! script rendered; `--nft-elements nft` sends every change through `nft` (the
//! fallback, and what the tests compare the netlink path with).
//!
//! Guarantees of [`NftSyncer::sync`]:
//! * The first sync (and any sync after a failure) replaces the whole table in one
//!   transaction: no moment without policy.
//! * Later syncs send only the difference ([`crate::nft::diff`] or, for elements only,
//!   [`ElementDelta`]), in one transaction.
//! * The same desired table twice sends nothing.
//! * A failed delta is retried at once as a full replace.
//!
//! Assumptions: nothing but egressd changes its table; when something does, the drift
//! watch ([`crate::dataplane::drift`]) has the agent call [`NftSyncer::force_full`].
//! Every `nft` run is bounded by [`NFT_TIMEOUT`]. Caveat: a full replace resets
//! the rule counters.

use std::collections::VecDeque;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use super::elements::Element;
use crate::nft::delta::ElementDelta;
use crate::nft::{Comparison, Table, diff};

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

/// How a transaction reached the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// An `nft` process.
    Nft,
    /// This process, over netlink (counted in [`super::elements::own_commits`]).
    Netlink,
}

/// Something that applies an nft script atomically.
pub trait NftBackend: Send {
    /// Apply `script` as one transaction.
    fn apply(&mut self, script: &str) -> Result<(), NftError>;

    /// Apply element changes to table `table` as one transaction (by default as the
    /// script [`ElementDelta::script`] renders).
    fn apply_elements(&mut self, table: &str, delta: &ElementDelta) -> Result<(), NftError> {
        self.apply(&delta.script(table))
    }

    /// Replace the kernel's table of this name with `table` and add the elements
    /// `kept` (what DNS snooping learned), and say how it went. By default the script
    /// [`Table::replace_script`] renders, then the kept elements as a second
    /// transaction.
    fn replace(&mut self, table: &Table, kept: &[Element]) -> Result<Transport, NftError> {
        replace_by_script(self, table, kept)
    }

    /// Change the kernel's table from `c.old` (what it holds) into `c.new` as one
    /// transaction (by default with the script [`diff`] renders).
    fn apply_changes(&mut self, c: &Comparison<'_>) -> Result<(), NftError> {
        match diff(c.old, c.new) {
            Some(script) => self.apply(&script),
            None => Ok(()),
        }
    }

    /// The packet counts of the named counters of `table` (none by default).
    fn counters(&mut self, _table: &str) -> Result<Vec<(String, u64)>, NftError> {
        Ok(Vec::new())
    }

    /// The per-rule counters of `chain` of `table` (none by default).
    fn rule_counters(
        &mut self,
        _table: &str,
        _chain: &str,
    ) -> Result<Vec<super::rule_counters::RuleCounter>, NftError> {
        Ok(Vec::new())
    }
}

/// A full replace through `backend`'s scripts: [`Table::replace_script`], then the
/// `kept` elements as a second transaction (the default of [`NftBackend::replace`] and
/// the `nft` fallback of the netlink one).
fn replace_by_script<B: NftBackend + ?Sized>(
    backend: &mut B,
    table: &Table,
    kept: &[Element],
) -> Result<Transport, NftError> {
    backend.apply(&table.replace_script())?;
    if !kept.is_empty() {
        let delta = ElementDelta { delete: Vec::new(), add: super::elements::by_slot(kept) };
        backend.apply_elements(&table.name, &delta)?;
    }
    Ok(Transport::Nft)
}

/// Runs the `nft` program; sends element-only changes over netlink unless told not to.
pub struct NftCli {
    program: PathBuf,
    /// Element changes over netlink (`true`) or through `nft`.
    netlink_elements: bool,
    /// The netlink socket for element changes, opened on first use, for this table.
    writer: Option<(String, super::elements::ElementWriter)>,
}

impl std::fmt::Debug for NftCli {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NftCli")
            .field("program", &self.program)
            .field("netlink_elements", &self.netlink_elements)
            .finish_non_exhaustive()
    }
}

/// The name egressd's `nft` runs have in the kernel (their `comm`, which nf_tables
/// reports with each transaction): they are started through a symlink of this name.
pub(crate) const NFT_ALIAS: &str = "egressd-nft";

impl NftCli {
    /// Use `program` (usually `nft`).
    pub fn new(program: impl Into<PathBuf>) -> Self {
        Self { program: program.into(), netlink_elements: true, writer: None }
    }

    /// Send element-only changes, and read the named counters, over netlink (`true`, the
    /// default) or through `nft`.
    pub fn with_netlink_elements(mut self, on: bool) -> Self {
        self.netlink_elements = on;
        self
    }

    /// The netlink socket for `table`, opened on first use (again after an error).
    fn writer(&mut self, table: &str) -> std::io::Result<&mut super::elements::ElementWriter> {
        if self.writer.as_ref().is_none_or(|(t, _)| t != table) {
            self.writer = None;
            self.writer = Some((table.to_string(), super::elements::ElementWriter::open(table)?));
        }
        match self.writer.as_mut() {
            Some((_, writer)) => Ok(writer),
            None => Err(std::io::Error::other("no netlink socket")),
        }
    }

    /// Try `send` (a `what` of table `table`) over netlink, when netlink is on: whether it
    /// applied. What the netlink path does not write is logged at debug level, a
    /// refusal as a warning (and the socket is opened afresh next time); either way the
    /// caller then goes through `nft`.
    fn over_netlink(
        &mut self,
        table: &str,
        what: &str,
        send: impl FnOnce(&mut super::elements::ElementWriter) -> std::io::Result<()>,
    ) -> bool {
        if !self.netlink_elements {
            return false;
        }
        match self.writer(table).and_then(send) {
            Ok(()) => true,
            Err(e) if e.kind() == std::io::ErrorKind::Unsupported => {
                // Every rule egressd compiles is in the netlink path's vocabulary
                // (`nft/wire.rs`): a rule outside it is a defect worth seeing.
                tracing::warn!(reason = %e, "{what} through nft: the netlink path does not write this table");
                false
            }
            Err(e) => {
                self.writer = None;
                tracing::warn!(error = %e, "the kernel refused the {what} over netlink; sending it through nft");
                false
            }
        }
    }

    /// Run `program` through a symlink named [`NFT_ALIAS`] in `dir`, so the kernel names
    /// egressd's transactions after it even where PIDs cannot be compared (a container
    /// without the host's PID namespace). Without a usable directory, `program` is run
    /// as it is (own transactions are then told apart by PID only).
    pub fn with_alias_in(self, dir: &std::path::Path) -> Self {
        let Some(target) = find_program(&self.program) else { return self };
        let alias = dir.join(NFT_ALIAS);
        let made =
            std::fs::DirBuilder::new().recursive(true).create(dir).and_then(|()| match std::fs::remove_file(&alias) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
                _ => std::os::unix::fs::symlink(&target, &alias),
            });
        match made {
            Ok(()) => Self { program: alias, ..self },
            Err(e) => {
                tracing::warn!(alias = %alias.display(), error = %e, "nft runs under its own name; drift is told apart by PID only");
                self
            }
        }
    }

    /// `nft --version`, to check nft is usable.
    pub fn version(&self) -> Result<String, NftError> {
        let out = Command::new(&self.program)
            .arg("--version")
            .output()
            .map_err(|e| NftError::Spawn { program: self.program.display().to_string(), message: e.to_string() })?;
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }
}

/// How long one `nft` run may take before it is killed (and the sync reported failed).
pub(crate) const NFT_TIMEOUT: Duration = Duration::from_secs(30);

/// The PIDs of the `nft` processes this agent started (the most recent ones): their
/// commits are egressd's own, not drift (see [`crate::dataplane::drift`]).
static OWN_NFT: Mutex<VecDeque<u32>> = Mutex::new(VecDeque::new());

fn record_own(pid: u32) {
    if let Ok(mut own) = OWN_NFT.lock() {
        if own.len() >= 64 {
            own.pop_front();
        }
        own.push_back(pid);
    }
}

/// `program` as an absolute path (searched in `PATH` when it has no `/`).
fn find_program(program: &std::path::Path) -> Option<PathBuf> {
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

impl NftBackend for NftCli {
    /// Over netlink (the counter objects only), unless element changes go through
    /// `nft`: then `nft -j list counters table inet <table>`, a read, no transaction
    /// (its output, nine counters, fits the pipe, so it is read after the exit), but
    /// `nft` reads the whole table first (0.3 s of CPU at 100k rules, every 5 s).
    fn counters(&mut self, table: &str) -> Result<Vec<(String, u64)>, NftError> {
        if self.netlink_elements {
            let netlink_err = |e: std::io::Error| NftError::Netlink { message: e.to_string() };
            let writer = self.writer(table).map_err(netlink_err)?;
            let read = writer.counters().map_err(netlink_err);
            if read.is_err() {
                self.writer = None;
            }
            return read;
        }
        let spawn_err =
            |e: std::io::Error| NftError::Spawn { program: self.program.display().to_string(), message: e.to_string() };
        let mut child = Command::new(&self.program)
            .args(["-j", "list", "counters", "table", crate::nft::FAMILY, table])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(spawn_err)?;
        let status = wait_within_timeout(&mut child).map_err(spawn_err)?;
        let mut stdout = Vec::new();
        if let Some(mut o) = child.stdout.take() {
            std::io::Read::read_to_end(&mut o, &mut stdout).map_err(spawn_err)?;
        }
        match status {
            Some(s) if s.success() => Ok(parse_counters(&stdout)),
            Some(_) => Err(NftError::Rejected { message: stderr_of(&mut child) }),
            None => Err(NftError::Timeout { seconds: NFT_TIMEOUT.as_secs() }),
        }
    }

    fn rule_counters(&mut self, table: &str, chain: &str) -> Result<Vec<super::rule_counters::RuleCounter>, NftError> {
        super::rule_counters::read(&self.program, table, Some(chain))
    }

    /// Over netlink (one batch, the send buffer raised to hold it), unless element
    /// changes go through `nft`.
    fn apply_elements(&mut self, table: &str, delta: &ElementDelta) -> Result<(), NftError> {
        if !self.netlink_elements {
            return self.apply(&delta.script(table));
        }
        let netlink_err = |e: std::io::Error| NftError::Netlink { message: e.to_string() };
        let applied = self.writer(table).map_err(netlink_err)?.apply(delta).map_err(netlink_err);
        if applied.is_err() {
            // A fresh socket next time: replies of a timed-out batch may still come.
            self.writer = None;
        }
        applied
    }

    /// Over netlink, as one batch built from the table's typed model
    /// ([`crate::nft::wire`]), unless element changes go through `nft` too; through
    /// `nft` when the table has a rule or set the netlink path does not write, or when
    /// the kernel refused the batch (then `nft` gets the same table and reports its own
    /// error if it fails too).
    fn replace(&mut self, table: &Table, kept: &[Element]) -> Result<Transport, NftError> {
        if self.over_netlink(&table.name, "full replace", |w| w.replace(table, kept)) {
            return Ok(Transport::Netlink);
        }
        replace_by_script(self, table, kept)
    }

    /// Over netlink as [`Self::replace`], with the same fallback to `nft`.
    fn apply_changes(&mut self, c: &Comparison<'_>) -> Result<(), NftError> {
        if self.over_netlink(&c.new.name, "change", |w| w.apply_changes(c)) {
            return Ok(());
        }
        match diff(c.old, c.new) {
            Some(script) => self.apply(&script),
            None => Ok(()),
        }
    }

    fn apply(&mut self, script: &str) -> Result<(), NftError> {
        let spawn_err =
            |e: std::io::Error| NftError::Spawn { program: self.program.display().to_string(), message: e.to_string() };
        let mut child = Command::new(&self.program)
            .args(["-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(spawn_err)?;
        record_own(child.id());
        if let Some(mut stdin) = child.stdin.take() {
            stdin.write_all(script.as_bytes()).map_err(spawn_err)?;
        }
        match wait_within_timeout(&mut child).map_err(spawn_err)? {
            Some(status) if status.success() => Ok(()),
            Some(_) => Err(NftError::Rejected { message: stderr_of(&mut child) }),
            None => Err(NftError::Timeout { seconds: NFT_TIMEOUT.as_secs() }),
        }
    }
}

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

/// (name, packets) of the counters in `nft -j list counters` output.
fn parse_counters(json: &[u8]) -> Vec<(String, u64)> {
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(json) else { return Vec::new() };
    let Some(items) = value.get("nftables").and_then(|v| v.as_array()) else { return Vec::new() };
    items
        .iter()
        .filter_map(|item| {
            let c = item.get("counter")?;
            Some((c.get("name")?.as_str()?.to_string(), c.get("packets")?.as_u64()?))
        })
        .collect()
}

/// Records scripts instead of applying them (unit tests). Fails the next
/// `fail_next` calls with the given message.
#[cfg(test)]
#[derive(Debug, Default)]
pub(crate) struct RecordingBackend {
    /// Every script received, applied or not.
    pub(crate) scripts: Vec<String>,
    /// How many of the next calls fail.
    pub(crate) fail_next: usize,
}

#[cfg(test)]
impl NftBackend for RecordingBackend {
    // Element changes are recorded as the script they render (the default).
    fn apply(&mut self, script: &str) -> Result<(), NftError> {
        self.scripts.push(script.to_string());
        if self.fail_next > 0 {
            self.fail_next -= 1;
            return Err(NftError::Rejected { message: "Error: injected failure".into() });
        }
        Ok(())
    }
}

/// Hooks around a full replace: the drift watch stops listening to nf_tables
/// notifications for its duration (the kernel builds one per rule and set element for
/// every listener) and checks the ruleset's generation afterwards instead
/// ([`crate::dataplane::drift`]).
pub trait QuietReplace: Send {
    /// Before the replace; what [`QuietReplace::after`] needs (`None`: stay listening).
    fn before(&mut self) -> Option<(u32, u64)>;
    /// After it; `committed` when a transaction the netlink commit count does not
    /// include (an `nft` process's) applied.
    fn after(&mut self, before: Option<(u32, u64)>, committed: bool);
}

/// What a sync did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncKind {
    /// Nothing to send.
    Unchanged,
    /// A delta transaction.
    Partial,
    /// A full replace.
    Full,
}

/// Keeps the applied table in memory and sends differences.
pub struct NftSyncer<B> {
    backend: B,
    /// Shared with the agent's copy of what it applied: keeping it costs no copy.
    applied: Option<std::sync::Arc<Table>>,
    /// How long the last [`NftSyncer::sync`] spent in the backend (the `nft` program and
    /// the kernel), as opposed to egressd's own diff and rendering.
    backend_time: std::time::Duration,
    /// Around full replaces, when the drift watch runs.
    quiet: Option<Box<dyn QuietReplace>>,
    /// The verified connections' policy generation every change moves (none: the
    /// tables' `fw-epoch` stays empty, nothing is verified).
    generations: Option<super::verified::Generations>,
}

impl<B: std::fmt::Debug> std::fmt::Debug for NftSyncer<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NftSyncer")
            .field("backend", &self.backend)
            .field("applied", &self.applied.as_ref().map(|t| t.name.as_str()))
            .field("quiet", &self.quiet.is_some())
            .field("generations", &self.generations)
            .finish_non_exhaustive()
    }
}

impl<B: NftBackend> NftSyncer<B> {
    /// A syncer that has applied nothing yet (its first sync is a full replace).
    pub fn new(backend: B) -> Self {
        Self { backend, applied: None, backend_time: std::time::Duration::ZERO, quiet: None, generations: None }
    }

    /// Move the verified connections' generation with every change
    /// ([`crate::nft::verified`]).
    pub fn set_generations(&mut self, generations: super::verified::Generations) {
        self.generations = Some(generations);
    }

    /// Run full replaces between these hooks (the drift watch's).
    pub(crate) fn set_quiet(&mut self, quiet: Box<dyn QuietReplace>) {
        self.quiet = Some(quiet);
    }

    /// The backend (tests inspect the recording backend).
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// The backend, mutably.
    pub fn backend_mut(&mut self) -> &mut B {
        &mut self.backend
    }

    /// The table last applied successfully.
    #[cfg(test)]
    pub(crate) fn applied(&self) -> Option<&Table> {
        self.applied.as_deref()
    }

    /// How long the last [`NftSyncer::sync`] spent in the backend.
    pub fn backend_time(&self) -> std::time::Duration {
        self.backend_time
    }

    /// Make the kernel's table equal `desired` (kept as what is applied: an `Arc`
    /// shared with the caller is kept without a copy).
    pub fn sync(&mut self, desired: impl Into<std::sync::Arc<Table>>) -> Result<SyncKind, NftError> {
        self.sync_keeping(&mut desired.into(), Vec::new)
    }

    /// [`NftSyncer::sync`], where a full replace also adds the elements `kept` gives
    /// (what DNS snooping learned, which the table does not hold) in the same
    /// transaction (over netlink; through `nft`, right after it). A change that only a
    /// full replace makes (see [`Comparison::needs_replace`]) is one, reported `Full`.
    ///
    /// With [`NftSyncer::set_generations`], `desired` is stamped with the verified
    /// connections' generation it applies: the next one, in the change's own
    /// transaction, when the change touches what decides the fast path's verdicts; the
    /// applied one when it changes only parts verified connections walk anyway
    /// ([`crate::nft::verified::outside`]). A table equal to the applied one but for
    /// that stamp is unchanged, and `desired` becomes the applied table.
    pub fn sync_keeping(
        &mut self,
        desired: &mut std::sync::Arc<Table>,
        kept: impl FnOnce() -> Vec<Element>,
    ) -> Result<SyncKind, NftError> {
        self.backend_time = std::time::Duration::ZERO;
        use crate::nft::verified;
        let mut generation = self.generations.as_ref().and_then(super::verified::Generations::upcoming);
        stamp(desired, generation);
        // One comparison of the two tables decides and builds the sync.
        let mut c = self.applied.as_deref().map(|applied| Comparison::of(applied, desired));
        if c.as_ref()
            .is_some_and(|c| c.is_empty() || (verified::stamped(c.old).is_some() && c.only_sets(verified::EPOCH_SET)))
        {
            drop(c);
            if let Some(applied) = &self.applied {
                *desired = applied.clone();
            }
            return Ok(SyncKind::Unchanged);
        }
        // A change of what verified connections walk anyway (EgressIP, EgressQoS) keeps
        // the applied generation: their verdicts stand, and no clearing is spent on it.
        let keeps = c.as_ref().and_then(|c| {
            let current = verified::stamped(c.old)?;
            let walked_anyway = |name: &str| name == verified::EPOCH_SET || verified::outside(name);
            (generation.is_some() && c.only_names(walked_anyway)).then_some(current)
        });
        if let Some(current) = keeps {
            drop(c);
            generation = Some(current);
            stamp(desired, generation);
            c = self.applied.as_deref().map(|applied| Comparison::of(applied, desired));
        } else if let Some(g) = generation
            && self.generations.as_mut().is_some_and(|gens| !gens.ready(g))
        {
            // The generation could not be cleared: the fast path is off from now on.
            drop(c);
            return self.sync_keeping(desired, kept);
        }
        let kind = 'sent: {
            if let Some(c) = c {
                let elements = ElementDelta::of_elements(&c);
                let t = std::time::Instant::now();
                let applied = match elements {
                    Some(delta) => Some(self.backend.apply_elements(&desired.name, &delta)),
                    None if c.needs_replace() => None,
                    None => Some(self.backend.apply_changes(&c)),
                };
                self.backend_time += t.elapsed();
                match applied {
                    None => {}
                    Some(Ok(())) => break 'sent SyncKind::Partial,
                    Some(Err(e)) => {
                        tracing::warn!(error = %e, "partial nft update failed; replacing the whole table");
                        self.applied = None;
                    }
                }
            }
            let t = std::time::Instant::now();
            let quiet = self.quiet.as_mut().and_then(|q| q.before());
            let applied = self.backend.replace(desired, &kept());
            if let Some(q) = self.quiet.as_mut() {
                q.after(quiet, matches!(applied, Ok(Transport::Nft)));
            }
            self.backend_time += t.elapsed();
            applied?;
            SyncKind::Full
        };
        self.applied = Some(desired.clone());
        if keeps.is_none() && self.generations.as_mut().is_some_and(|gens| gens.applied(generation)) {
            // The first table verified nothing; every value is cleared now: the first
            // generation goes in at once (an element change).
            let time = self.backend_time;
            let mut stamped = desired.clone();
            self.sync_keeping(&mut stamped, Vec::new)?;
            self.backend_time += time;
            *desired = stamped;
        }
        Ok(kind)
    }

    /// The packet counts of the applied table's named counters.
    pub fn counters(&mut self) -> Result<Vec<(String, u64)>, NftError> {
        let Some(name) = self.applied.as_ref().map(|t| t.name.clone()) else { return Ok(Vec::new()) };
        self.backend.counters(&name)
    }

    /// The per-rule counters of `chain` of the applied table.
    pub fn rule_counters(&mut self, chain: &str) -> Result<Vec<super::rule_counters::RuleCounter>, NftError> {
        let Some(name) = self.applied.as_ref().map(|t| t.name.clone()) else { return Ok(Vec::new()) };
        self.backend.rule_counters(&name, chain)
    }

    /// Re-add every element of `slots` as applied, which restarts their kernel
    /// timeouts (re-adding an existing element updates its timeout). Slots without
    /// applied elements are skipped. On failure the next
    /// sync is a full replace.
    pub fn refresh_timeouts(&mut self, slots: &[crate::nft::Slot]) -> Result<bool, NftError> {
        let Some(applied) = &self.applied else { return Ok(false) };
        let Some(delta) = ElementDelta::refresh(applied, slots) else {
            // Elements the compiler did not write in canonical form: a full replace
            // (next sync) sets every timeout afresh.
            self.applied = None;
            return Ok(false);
        };
        if delta.is_empty() {
            return Ok(false);
        }
        let name = applied.name.clone();
        if let Err(e) = self.backend.apply_elements(&name, &delta) {
            self.applied = None;
            return Err(e);
        }
        Ok(true)
    }

    /// Forget what was applied: the next sync is a full replace (someone else changed
    /// the table).
    pub(crate) fn force_full(&mut self) {
        self.applied = None;
    }

    /// Remove the table (and everything in it). Safe when it does not exist.
    pub fn delete(&mut self, table_name: &str) -> Result<(), NftError> {
        self.backend.apply(&Table::delete_script(table_name))?;
        self.applied = None;
        Ok(())
    }
}

/// Stamp `table` with the verified connections' generation `value`, unless it holds it
/// (or has no `fw-epoch` set): a table the caller alone holds is changed in place.
fn stamp(table: &mut std::sync::Arc<Table>, value: Option<u32>) {
    use crate::nft::verified;
    if table.sets.contains_key(verified::EPOCH_SET) && verified::stamped(table) != value {
        verified::stamp(std::sync::Arc::make_mut(table), value);
    }
}

#[cfg(test)]
mod alias_tests {
    use super::*;

    #[test]
    fn nft_runs_through_an_alias_named_after_egressd() {
        let dir = tempfile::tempdir().unwrap();
        let cli = NftCli::new("/bin/true").with_alias_in(&dir.path().join("state"));
        assert_eq!(cli.program, dir.path().join("state").join(NFT_ALIAS));
        assert_eq!(std::fs::read_link(&cli.program).unwrap(), std::path::Path::new("/bin/true"));
        // Again (a restart): the old link is replaced.
        let again = NftCli::new("/bin/true").with_alias_in(&dir.path().join("state"));
        assert_eq!(again.program, cli.program);
        // A program that cannot be found is run as given.
        let missing = NftCli::new("no-such-nft-program").with_alias_in(dir.path());
        assert_eq!(missing.program, std::path::Path::new("no-such-nft-program"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nft::{Chain, KeyType, Set};

    fn table(n: usize) -> Table {
        let mut t = Table::new("egressd");
        let mut s = Set::new(KeyType::Ipv4, false);
        for i in 0..n {
            s.elements.insert(format!("198.18.0.{i}").into(), Default::default());
        }
        t.sets.insert("s".into(), s);
        t.chains.insert("c".into(), Chain::regular(vec!["counter accept".into()]));
        t
    }

    /// How many clearings were swept, once at least `at_least` were and no other
    /// followed for a moment (they run on a thread of their own).
    fn settled(swept: &std::sync::Mutex<Vec<u32>>, at_least: usize) -> usize {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while swept.lock().unwrap().len() < at_least && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
        swept.lock().unwrap().len()
    }

    /// A syncer with three generations (two bits); the groups its clearings swept.
    fn with_generations() -> (NftSyncer<RecordingBackend>, std::sync::Arc<std::sync::Mutex<Vec<u32>>>) {
        let swept = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let log = swept.clone();
        let mut s = NftSyncer::new(RecordingBackend::default());
        s.set_generations(super::super::verified::Generations::new(
            0x0300_0000,
            move |g: crate::nft::verified::Group, _: u32| {
                log.lock().unwrap().push(g.value);
                Ok(0)
            },
        ));
        (s, swept)
    }

    #[test]
    fn every_change_moves_the_verified_generation_in_its_own_transaction() {
        use crate::nft::verified::{EPOCH_SET, stamped};
        let with_epoch = |n| {
            let mut t = table(n);
            t.sets.insert(EPOCH_SET.into(), Set::new(KeyType::Mark, false));
            t
        };
        let (mut s, swept) = with_generations();
        // The first table verifies nothing; once every value is cleared, the first
        // generation follows as an element change.
        let mut first = std::sync::Arc::new(with_epoch(1));
        assert_eq!(s.sync_keeping(&mut first, Vec::new).unwrap(), SyncKind::Full);
        let scripts = s.backend().scripts.clone();
        assert_eq!(scripts.len(), 2, "{scripts:#?}");
        assert!(scripts[0].contains("set fw-epoch {\n\t\ttype mark;\n\t}"), "{}", scripts[0]);
        assert_eq!(scripts[1], "add element inet egressd fw-epoch { 0x01000000 }\n");
        assert_eq!(stamped(&first), Some(0x0100_0000), "the caller holds what is applied");
        assert_eq!(swept.lock().unwrap()[..3], [0x0100_0000, 0x0200_0000, 0x0300_0000]);
        // Nothing else changed: nothing sent, the generation stays.
        assert_eq!(s.sync(with_epoch(1)).unwrap(), SyncKind::Unchanged);
        assert_eq!(s.backend().scripts.len(), 2);
        // A change carries the next generation in its transaction.
        assert_eq!(s.sync(with_epoch(2)).unwrap(), SyncKind::Partial);
        assert_eq!(
            s.backend().scripts[2],
            "delete element inet egressd fw-epoch { 0x01000000 }\nadd element inet egressd fw-epoch { 0x02000000 }\nadd element inet egressd s { 198.18.0.1 }\n"
        );
        assert_eq!(s.applied().and_then(stamped), Some(0x0200_0000));
        assert_eq!(s.sync(with_epoch(3)).unwrap(), SyncKind::Partial);
        assert_eq!(s.sync(with_epoch(4)).unwrap(), SyncKind::Partial);
        assert_eq!(s.applied().and_then(stamped), Some(0x0100_0000), "the values cycle");
        // Each value was cleared again after it was last current, before its reuse.
        assert_eq!(swept.lock().unwrap()[3..6], [0x0200_0000, 0x0300_0000, 0x0100_0000]);
    }

    #[test]
    fn a_change_of_what_verified_connections_walk_anyway_keeps_the_generation() {
        use crate::nft::verified::{EPOCH_SET, stamped};
        let with = |n: usize, eip: usize, chain: &str| {
            let mut t = table(n);
            t.sets.insert(EPOCH_SET.into(), Set::new(KeyType::Mark, false));
            let mut s = Set::new(KeyType::Ipv4, false);
            for i in 0..eip {
                s.elements.insert(format!("198.19.0.{i}").into(), Default::default());
            }
            t.sets.insert("eip-self-v4".into(), s);
            t.chains.insert("egress-snat".into(), Chain::regular(vec![chain.into()]));
            t
        };
        let (mut s, swept) = with_generations();
        s.sync_keeping(&mut std::sync::Arc::new(with(1, 0, "accept")), Vec::new).unwrap();
        assert_eq!(s.applied().and_then(stamped), Some(0x0100_0000));
        // The first group cleared up front, and the next one asked for.
        let sweeps = settled(&swept, 4);
        assert_eq!(sweeps, 4);
        // EgressIP's sets and chains alone: the generation stays, nothing is cleared.
        let mut t = std::sync::Arc::new(with(1, 1, "accept"));
        assert_eq!(s.sync_keeping(&mut t, Vec::new).unwrap(), SyncKind::Partial);
        assert_eq!(s.backend().scripts.last().unwrap(), "add element inet egressd eip-self-v4 { 198.19.0.0 }\n");
        assert_eq!(stamped(&t), Some(0x0100_0000), "the caller holds what is applied");
        assert_eq!(s.sync(with(1, 1, "counter accept")).unwrap(), SyncKind::Partial);
        assert!(!s.backend().scripts.last().unwrap().contains(EPOCH_SET), "{}", s.backend().scripts.last().unwrap());
        assert_eq!(s.applied().and_then(stamped), Some(0x0100_0000));
        assert_eq!(s.sync(with(1, 1, "counter accept")).unwrap(), SyncKind::Unchanged);
        // With a set the firewall reads, it moves (and the next clearing is asked for).
        assert_eq!(s.sync(with(2, 0, "accept")).unwrap(), SyncKind::Partial);
        assert!(s.backend().scripts.last().unwrap().contains("add element inet egressd fw-epoch { 0x02000000 }"));
        assert_eq!(s.applied().and_then(stamped), Some(0x0200_0000));
        // (A clearing asked for by the kept changes would have come before this one.)
        assert_eq!(settled(&swept, sweeps + 1), sweeps + 1);
        // Kept generations never turn the fast path off, and the cycle goes on.
        for n in 3..8 {
            assert_eq!(s.sync(with(n, n % 2, "accept")).unwrap(), SyncKind::Partial);
            assert_eq!(s.sync(with(n, (n + 1) % 2, "accept")).unwrap(), SyncKind::Partial);
        }
        // Five moves from the second value: 3, 1, 2, 3, 1.
        assert_eq!(s.applied().and_then(stamped), Some(0x0100_0000));
        assert!(!s.generations.as_ref().unwrap().is_off());
    }

    #[test]
    fn first_full_then_delta_then_nothing() {
        let mut s = NftSyncer::new(RecordingBackend::default());
        assert_eq!(s.sync(table(1)).unwrap(), SyncKind::Full);
        assert_eq!(s.sync(table(2)).unwrap(), SyncKind::Partial);
        assert_eq!(s.sync(table(2)).unwrap(), SyncKind::Unchanged);
        let scripts = &s.backend().scripts;
        assert_eq!(scripts.len(), 2);
        assert!(scripts[0].starts_with("add table inet egressd\ndelete table inet egressd\ntable inet egressd {"));
        assert_eq!(scripts[1], "add element inet egressd s { 198.18.0.1 }\n");
    }

    #[test]
    fn a_full_replace_keeps_the_learned_elements_and_a_delta_never_touches_them() {
        let slot = crate::nft::Slot { set: "dns-v4", tag: 7 };
        let learned: Element = (slot, "192.0.2.10".parse().unwrap(), Duration::from_secs(60));
        let with_dns = |n| {
            let mut t = table(n);
            t.sets.insert("dns-v4".into(), Set::with_timeout(KeyType::TaggedIpv4));
            t
        };
        let mut s = NftSyncer::new(RecordingBackend::default());
        assert_eq!(s.sync_keeping(&mut with_dns(1).into(), || vec![learned]).unwrap(), SyncKind::Full);
        // A delta: the learned elements are not asked for.
        let asked = std::cell::Cell::new(false);
        let keep = || {
            asked.set(true);
            vec![learned]
        };
        assert_eq!(s.sync_keeping(&mut with_dns(2).into(), keep).unwrap(), SyncKind::Partial);
        assert!(!asked.get(), "a delta asked for the learned elements");
        // A change only a replace makes (new base chains at one hook and priority) is
        // one, and keeps them.
        let mut base = with_dns(2);
        let hook = crate::nft::Hook { chain_type: "filter", hook: "forward", priority: "filter" };
        base.chains.insert("a".into(), Chain::base(hook.clone(), vec!["counter".into()]));
        base.chains.insert("b".into(), Chain::base(hook, vec!["counter".into()]));
        assert_eq!(s.sync_keeping(&mut base.into(), || vec![learned]).unwrap(), SyncKind::Full);
        let scripts = &s.backend().scripts;
        let key = crate::nft::Slot::tagged_key(7, "192.0.2.10".parse().unwrap());
        let element = format!("add element inet egressd dns-v4 {{ {key} timeout 60s }}\n");
        assert_eq!(scripts.len(), 5, "{scripts:#?}");
        assert!(
            scripts[0].starts_with("add table inet egressd\n") && scripts[3].starts_with("add table inet egressd\n")
        );
        assert_eq!((&scripts[1], &scripts[4]), (&element, &element));
        assert_eq!(scripts[2], "add element inet egressd s { 198.18.0.1 }\n");
    }

    #[test]
    fn failed_delta_is_retried_in_full() {
        let mut s = NftSyncer::new(RecordingBackend::default());
        s.sync(table(1)).unwrap();
        s.backend_mut().fail_next = 1;
        assert_eq!(s.sync(table(3)).unwrap(), SyncKind::Full);
        let scripts = &s.backend().scripts;
        assert_eq!(scripts.len(), 3);
        assert!(scripts[2].starts_with("add table inet egressd\ndelete table inet egressd\n"));
    }

    #[test]
    fn failed_full_sync_reports_nfts_message_and_retries_in_full_next_time() {
        let mut s = NftSyncer::new(RecordingBackend::default());
        s.backend_mut().fail_next = 1;
        let err = s.sync(table(1)).unwrap_err();
        assert_eq!(err.to_string(), "nft rejected the transaction: Error: injected failure");
        assert!(s.applied().is_none());
        assert_eq!(s.sync(table(1)).unwrap(), SyncKind::Full);
    }

    #[test]
    fn counters_are_read_from_nfts_json() {
        let json = br#"{"nftables": [{"metainfo": {"version": "1.0.6", "json_schema_version": 1}},
            {"counter": {"family": "inet", "name": "snoop-over-query", "table": "egressd", "handle": 3, "packets": 17, "bytes": 1200}},
            {"counter": {"family": "inet", "name": "snoop-over-answer", "table": "egressd", "handle": 4, "packets": 0, "bytes": 0}}]}"#;
        assert_eq!(
            parse_counters(json),
            vec![("snoop-over-query".to_string(), 17), ("snoop-over-answer".to_string(), 0)]
        );
        assert!(parse_counters(b"not json").is_empty());
    }
}
