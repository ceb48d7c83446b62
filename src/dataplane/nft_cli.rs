//! [`NftCli`]: the [`NftBackend`] of a running agent. Full replaces, rule changes and
//! element changes go over nf_tables netlink ([`super::elements`]) unless told not to;
//! what the kernel refuses there, and everything with `--nft-transport nft`, goes
//! through the `nft` program ([`super::nft_run`]).

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use super::elements::Element;
use super::nft_run::{NFT_ALIAS, NFT_TIMEOUT, NftError, find_program, record_own, stderr_of, wait_within_timeout};
use super::nft_sync::{NftBackend, Transport, replace_by_script};
use crate::nft::delta::ElementDelta;
use crate::nft::{Comparison, Table, diff};

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
                // The netlink path encodes every rule egressd compiles but an
                // anonymous set of addresses (`nft/wire/encode.rs`: a logged
                // namespace's nodeSelector rule with several addresses of a family).
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
