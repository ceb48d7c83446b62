//! Wiring: source → view → compile → dataplane, in a loop, until shutdown.
//!
//! Guarantees of [`run_manifests`]:
//! * Nothing is applied before the source has delivered a complete view (for the
//!   manifests source: one full read of the directory). No transient "no policy" state.
//! * Every change (debounced directory events, and a periodic resync that also catches
//!   missed events) is recompiled and synced as a delta.
//! * On shutdown the dataplane is left exactly as it is: policy keeps holding while the
//!   agent restarts. `egressd cleanup` is the explicit way to remove it.

use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use tokio::sync::mpsc;

use crate::compile::{Desired, NodeConfig, ObjectStatus, Outcome, compile};
use crate::dataplane::nft::{NftBackend, NftError, NftSyncer, SyncKind};
use crate::source::manifests::{LoadReport, ManifestSource, SourceError, watch};

/// Errors that stop the agent.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The source failed as a whole.
    #[error(transparent)]
    Source(#[from] SourceError),
}

/// Settings of the manifests-mode agent.
#[derive(Debug, Clone)]
pub struct RunConfig {
    /// The manifests directory.
    pub manifests: PathBuf,
    /// This node.
    pub node: NodeConfig,
    /// Quiet time after a directory event before reloading.
    pub debounce: Duration,
    /// Periodic full reload and recompile.
    pub resync: Duration,
    /// Where the status file is written after every sync (`egressd status` reads it).
    pub state_dir: Option<PathBuf>,
}

/// The file in the state directory holding the last statuses.
pub const STATUS_FILE: &str = "status";

/// The status report `egressd status` prints: a header line (node, time, sync
/// outcome), one line per object, then problems.
pub fn status_report(
    node: &NodeConfig,
    desired: &Desired,
    sync: &Result<SyncKind, NftError>,
    problems: &[String],
) -> String {
    let outcome = match sync {
        Ok(_) => "dataplane in sync".to_string(),
        Err(e) => format!("dataplane NOT in sync: {e}"),
    };
    let mut out = format!(
        "# egressd on node {} at {}: {outcome}\n",
        node.node_name,
        jiff::Timestamp::now()
            .round(jiff::Unit::Second)
            .unwrap_or_else(|_| jiff::Timestamp::now())
    );
    out.push_str(&crate::compile::render_statuses(&desired.statuses));
    if !problems.is_empty() || !desired.warnings.is_empty() {
        out.push_str("# problems\n");
        for p in problems.iter().chain(&desired.warnings) {
            out.push_str(p);
            out.push('\n');
        }
    }
    out
}

/// Write `text` to `dir/status` atomically (temporary file + rename).
pub fn write_status(dir: &std::path::Path, text: &str) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(".status.tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, dir.join(STATUS_FILE))
}

fn publish(
    config: &RunConfig,
    desired: &Desired,
    sync: &Result<SyncKind, NftError>,
    report: &LoadReport,
) {
    let Some(dir) = &config.state_dir else { return };
    let problems: Vec<String> = report.errors.iter().map(ToString::to_string).collect();
    if let Err(e) = write_status(dir, &status_report(&config.node, desired, sync, &problems)) {
        tracing::warn!(dir = %dir.display(), error = %e, "cannot write the status file");
    }
}

/// What `egressd render` prints for a manifests directory: the nft table that would be
/// applied, each object's status, then any problems (rejected documents, pod IP clashes).
pub fn render_manifests(dir: &std::path::Path, node: &NodeConfig) -> Result<String, SourceError> {
    let mut source = ManifestSource::new(dir);
    let report = source.load()?;
    let desired = compile(source.view(), node);
    let mut out = desired.table.render();
    out.push_str("# status\n");
    out.push_str(&crate::compile::render_statuses(&desired.statuses));
    if !report.errors.is_empty() || !desired.warnings.is_empty() {
        out.push_str("# problems\n");
        for e in &report.errors {
            out.push_str(&format!("{e}\n"));
        }
        for w in &desired.warnings {
            out.push_str(&format!("{w}\n"));
        }
    }
    Ok(out)
}

/// Log a load report: each bad document at warn level, ignored kinds at debug.
pub fn log_report(report: &LoadReport) {
    for e in &report.errors {
        tracing::warn!(error = %e, "manifest rejected");
    }
    for i in &report.ignored {
        tracing::debug!(document = %i, "kind not used by egressd; ignored");
    }
}

/// Compile and sync once; returns the statuses with kernel failures folded in.
pub fn apply_once<B: NftBackend>(
    source: &ManifestSource,
    node: &NodeConfig,
    syncer: &mut NftSyncer<B>,
) -> (Desired, Result<SyncKind, NftError>) {
    let started = std::time::Instant::now();
    let mut desired = compile(source.view(), node);
    let result = syncer.sync(&desired.table);
    match &result {
        Ok(kind) => tracing::info!(
            sync = ?kind,
            rules = desired.table.rule_count(),
            elements = desired.table.element_count(),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "dataplane in sync"
        ),
        Err(e) => {
            tracing::error!(error = %e, "nft sync failed; will retry in full");
            for s in &mut desired.statuses {
                if s.outcome == Outcome::Applied {
                    let reason = format!("kernel error: {e}");
                    s.message = s.message.replace(
                        "EgressFirewall Rules applied",
                        &format!("EgressFirewall Rules not correctly applied: {reason}"),
                    );
                    s.outcome = Outcome::Failed(reason);
                }
            }
        }
    }
    for w in &desired.warnings {
        tracing::warn!(warning = %w, "cluster view");
    }
    (desired, result)
}

fn log_status_changes(old: &[ObjectStatus], new: &[ObjectStatus]) {
    for s in new {
        if old.iter().any(|o| o == s) {
            continue;
        }
        match &s.outcome {
            Outcome::Failed(_) => tracing::warn!(object = %s.key, status = %s.message, "status"),
            _ => tracing::info!(object = %s.key, status = %s.message, "status"),
        }
    }
}

/// Run against a manifests directory until `shutdown` completes.
pub async fn run_manifests<B: NftBackend>(
    config: RunConfig,
    mut syncer: NftSyncer<B>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), AgentError> {
    let mut source = ManifestSource::new(&config.manifests);
    let report = source.load()?;
    log_report(&report);
    tracing::info!(dir = %config.manifests.display(), objects = report.objects, errors = report.errors.len(), "manifests loaded");

    let (tx, mut rx) = mpsc::channel(1);
    let _watcher = watch(&config.manifests, config.debounce, config.debounce * 5, tx)?;

    let (desired, mut last_result) =
        tokio::task::block_in_place(|| apply_once(&source, &config.node, &mut syncer));
    log_status_changes(&[], &desired.statuses);
    publish(&config, &desired, &last_result, &report);
    let mut statuses = desired.statuses;

    let mut resync = tokio::time::interval(config.resync);
    resync.tick().await;
    tokio::pin!(shutdown);
    loop {
        let forced = tokio::select! {
            _ = &mut shutdown => break,
            Some(()) = rx.recv() => false,
            _ = resync.tick() => true,
        };
        let report = match source.load() {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(error = %e, "manifests unreadable; keeping the current dataplane");
                continue;
            }
        };
        if report.changed || !report.errors.is_empty() {
            log_report(&report);
        }
        if !report.changed && !forced && last_result.is_ok() {
            continue;
        }
        let (desired, result) =
            tokio::task::block_in_place(|| apply_once(&source, &config.node, &mut syncer));
        log_status_changes(&statuses, &desired.statuses);
        publish(&config, &desired, &result, &report);
        statuses = desired.statuses;
        last_result = result;
    }
    tracing::info!("shutting down; the dataplane stays in place");
    Ok(())
}
