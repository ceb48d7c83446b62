//! Watching the manifests directory: directory events turned into debounced
//! [`DirChange`]s ([`watch`]), and [`ManifestsWatch`], the directory as a
//! [`super::super::ViewSource`].

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::sync::mpsc;

use super::{LoadReport, ManifestSource, SourceError, is_manifest};
use crate::view::ClusterView;

/// Whether a directory event can change what the directory holds. Opening, reading and
/// closing a file unwritten (every reload does that to every file) and access-time
/// updates cannot: reacting to them would make each reload trigger the next one.
fn changes_content(kind: &notify::EventKind) -> bool {
    use notify::event::{AccessKind, AccessMode, MetadataKind, ModifyKind};
    match kind {
        notify::EventKind::Access(AccessKind::Close(AccessMode::Write)) => true,
        notify::EventKind::Access(_) => false,
        notify::EventKind::Modify(ModifyKind::Metadata(MetadataKind::AccessTime)) => false,
        _ => true,
    }
}

/// What a burst of directory events touched: the files named by the events, or
/// `rescan` when some event named none (or the watch lost events) and only reading the
/// whole directory is safe.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DirChange {
    /// Paths the events named.
    pub files: BTreeSet<PathBuf>,
    /// Read the whole directory.
    pub rescan: bool,
}

/// Where an event leaves the files it names: being written (created, written to: more
/// may follow), complete (closed after writing, renamed, removed, their metadata
/// changed: nothing more of this write follows), or renamed into place: a file written
/// beside (a name that is not a manifest's) renamed onto a manifest's name within the
/// directory — the event pairing the two halves, which the watch reports after both, is
/// the last of that action. A manifest renamed away is only complete: an editor that
/// saves by moving the old file aside writes the new one next, and reading the
/// directory between the two would drop the file's objects for a moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Progress {
    Writing,
    Complete,
    Renamed,
}

fn progress(kind: &notify::EventKind, paths: &[PathBuf]) -> Progress {
    use notify::event::{AccessKind, AccessMode, ModifyKind, RenameMode};
    // A file that is not a manifest renamed onto a manifest's name.
    let into_place = matches!(paths, [from, to] if !is_manifest(from) && is_manifest(to));
    match kind {
        notify::EventKind::Modify(ModifyKind::Name(RenameMode::Both)) if into_place => Progress::Renamed,
        notify::EventKind::Access(AccessKind::Close(AccessMode::Write))
        | notify::EventKind::Modify(ModifyKind::Name(_) | ModifyKind::Metadata(_))
        | notify::EventKind::Remove(_) => Progress::Complete,
        _ => Progress::Writing,
    }
}

/// How long a burst whose files are all complete waits for more events before it is
/// sent: the rest of one action (a rename's pairing event, the next file of a copy).
/// A burst that ends with a file renamed into place ([`Progress::Renamed`]) is sent at
/// once.
pub const SETTLE: Duration = Duration::from_millis(5);

/// Watch `dir` and send what changed on `tx` after each burst of changes: once every
/// manifest file the burst touched is complete ([`Progress`]: an atomic rename, a
/// closed write) and [`SETTLE`] passed without further events, else once `quiet` has
/// passed without further events (a file still open for writing, a symlink swap, an
/// event that names no file); at most `max_delay` after the first. So a rename into
/// place (`kubectl cp`, ConfigMap-less deploys, editors' rename-on-save) is applied
/// within milliseconds, and a file written in several steps is never read half-written
/// while its writer keeps writing. The returned watcher must be kept alive.
pub fn watch(
    dir: &Path,
    quiet: Duration,
    max_delay: Duration,
    tx: mpsc::Sender<DirChange>,
) -> Result<notify::RecommendedWatcher, SourceError> {
    watch_settling(dir, quiet, quiet.min(SETTLE), max_delay, tx)
}

/// [`watch`] with the settle window as a parameter (tests make it long enough to tell
/// a burst sent at once from one sent after it).
pub(super) fn watch_settling(
    dir: &Path,
    quiet: Duration,
    settle: Duration,
    max_delay: Duration,
    tx: mpsc::Sender<DirChange>,
) -> Result<notify::RecommendedWatcher, SourceError> {
    use notify::Watcher;
    // `None`: an event that names no file.
    let (raw_tx, mut raw_rx) = mpsc::unbounded_channel::<Option<(Progress, Vec<PathBuf>)>>();
    let mut watcher = notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
        let paths = match res {
            Ok(e) if !changes_content(&e.kind) => return,
            Ok(e) if e.need_rescan() || e.paths.is_empty() => None,
            Ok(e) => Some((progress(&e.kind, &e.paths), e.paths)),
            Err(_) => None,
        };
        let _ = raw_tx.send(paths);
    })
    .map_err(|source| SourceError::Watch { path: dir.to_path_buf(), source })?;
    watcher
        .watch(dir, notify::RecursiveMode::NonRecursive)
        .map_err(|source| SourceError::Watch { path: dir.to_path_buf(), source })?;
    tokio::spawn(async move {
        while let Some(first) = raw_rx.recv().await {
            let mut change = DirChange::default();
            // Manifest files of the burst still being written.
            let mut writing: BTreeSet<PathBuf> = BTreeSet::new();
            // Whether every manifest file of the burst is complete, and whether the
            // event was a rename's last.
            let mut add = |event: Option<(Progress, Vec<PathBuf>)>, change: &mut DirChange| match event {
                Some((p, paths)) => {
                    for path in paths {
                        if p == Progress::Writing && is_manifest(&path) {
                            writing.insert(path.clone());
                        } else {
                            writing.remove(&path);
                        }
                        change.files.insert(path);
                    }
                    (writing.is_empty(), p == Progress::Renamed)
                }
                None => {
                    change.rescan = true;
                    (false, false)
                }
            };
            let (mut complete, mut renamed) = add(first, &mut change);
            let deadline = tokio::time::Instant::now() + max_delay;
            loop {
                if complete && renamed && !change.rescan {
                    break;
                }
                let wait = if complete && !change.rescan { settle } else { quiet };
                match tokio::time::timeout_at(deadline.min(tokio::time::Instant::now() + wait), raw_rx.recv()).await {
                    Ok(Some(event)) => (complete, renamed) = add(event, &mut change),
                    Ok(None) => return,
                    Err(_) => break,
                }
            }
            if tx.send(change).await.is_err() {
                return;
            }
        }
    });
    Ok(watcher)
}

/// Log a load report: each bad document at warn level, ignored kinds at debug.
fn log_report(report: &LoadReport) {
    for e in &report.errors {
        tracing::warn!(error = %e, "manifest rejected");
    }
    for i in &report.ignored {
        tracing::debug!(document = %i, "kind not used by egressd; ignored");
    }
}

/// The manifests directory as a [`super::super::ViewSource`]: directory events (debounced) and a
/// periodic re-read.
pub struct ManifestsWatch {
    source: ManifestSource,
    report: LoadReport,
    events: mpsc::Receiver<DirChange>,
    resync: tokio::time::Interval,
    _watcher: notify::RecommendedWatcher,
    /// When the last reported change was seen (its debounced event arrived).
    seen: Option<std::time::Instant>,
}

impl ManifestsWatch {
    /// Read `dir` once (fails when it is unreadable) and start watching it.
    pub async fn open(dir: &std::path::Path, debounce: Duration, resync: Duration) -> Result<Self, SourceError> {
        let mut source = ManifestSource::new(dir);
        let report = source.load()?;
        log_report(&report);
        tracing::info!(dir = %dir.display(), objects = report.objects, errors = report.errors.len(), "manifests loaded");
        let (tx, events) = mpsc::channel(1);
        let watcher = watch(dir, debounce, debounce * 5, tx)?;
        let mut resync = tokio::time::interval(resync);
        resync.tick().await;
        Ok(Self { source, report, events, resync, _watcher: watcher, seen: None })
    }
}

impl super::super::ViewSource for ManifestsWatch {
    fn view(&self) -> &ClusterView {
        self.source.view()
    }

    fn view_mut(&mut self) -> &mut ClusterView {
        self.source.view_mut()
    }

    fn problems(&self) -> Vec<String> {
        self.report.errors.iter().map(ToString::to_string).collect()
    }

    fn seen_at(&self) -> Option<std::time::Instant> {
        self.seen
    }

    async fn next_change(&mut self) -> bool {
        // The periodic re-read catches missed events; what changed is what the view says.
        // Files a watch event named are read again; a rescan or the resync reads all.
        let changed = tokio::select! {
            Some(change) = self.events.recv() => (!change.rescan).then_some(change.files),
            _ = self.resync.tick() => None,
        };
        let started = std::time::Instant::now();
        self.seen = Some(started);
        let loaded = match &changed {
            Some(files) => self.source.load_changed(files),
            None => self.source.load(),
        };
        match loaded {
            Ok(report) => {
                if report.changed || !report.errors.is_empty() {
                    log_report(&report);
                }
                let elapsed_ms = started.elapsed().as_secs_f64() * 1e3;
                let files = changed.as_ref().map_or(0, BTreeSet::len);
                tracing::debug!(elapsed_ms, files, changed = report.changed, "manifests read");
                let changed = report.changed;
                self.report = report;
                changed
            }
            Err(e) => {
                tracing::error!(error = %e, "manifests unreadable; keeping the current dataplane");
                false
            }
        }
    }
}
