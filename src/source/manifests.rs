//! The manifests source: every `*.yaml` / `*.yml` file of one directory, multi-document,
//! holding the four custom resources plus Namespaces, Pods and Nodes.
//!
//! Guarantees:
//! * A bad document gets an error naming the file, the document number (and its first
//!   line) and the field; every other document still applies.
//! * The previous good version of a rejected object stays in use (its error becomes the
//!   object's status). A document that cannot even be read as YAML cannot be attributed
//!   to an object, so every object its file held before is kept until the file is fixed.
//! * Only the directory's own entries are read, following symlinks, so ConfigMap mounts
//!   (`foo.yaml -> ..data/foo.yaml`, swapped atomically) and editors' rename-on-save work.
//!   Hidden entries (`..data`, `.foo.yaml.swp`) are skipped.
//!
//! [`watch`] turns directory events into debounced reload signals.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::sync::mpsc;

use crate::api::parse::{Parsed, split_documents, yaml_to_value};
use crate::api::{ObjectKey, parse_document};
use crate::view::{ClusterView, Update};

/// Errors that stop the source as a whole (not a single bad document).
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// The directory cannot be listed.
    #[error("cannot read manifests directory {path}: {source}")]
    Directory {
        /// The directory.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The directory cannot be watched.
    #[error("cannot watch manifests directory {path}: {source}")]
    Watch {
        /// The directory.
        path: PathBuf,
        /// The watcher error.
        #[source]
        source: notify::Error,
    },
}

/// One rejected document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DocumentError {
    /// The file.
    pub file: PathBuf,
    /// 1-based number of the document in the file (0 when the whole file failed).
    pub document: usize,
    /// 1-based line where the document starts.
    pub line: usize,
    /// The object, when known.
    pub key: Option<ObjectKey>,
    /// What is wrong, naming the field.
    pub message: String,
}

impl std::fmt::Display for DocumentError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.file.display())?;
        if self.document > 0 {
            write!(f, ": document {} (line {})", self.document, self.line)?;
        }
        if let Some(k) = &self.key {
            write!(f, ": {k}")?;
        }
        write!(f, ": {}", self.message)
    }
}

/// What one load found.
#[derive(Debug, Clone, Default)]
pub struct LoadReport {
    /// Rejected documents.
    pub errors: Vec<DocumentError>,
    /// Documents of kinds egressd does not read (`file: apiVersion/kind`).
    pub ignored: Vec<String>,
    /// Number of objects read.
    pub objects: usize,
    /// Whether the view changed.
    pub changed: bool,
}

/// One document of a file, as parsed.
#[derive(Debug, Clone)]
#[allow(clippy::large_enum_variant)] // short-lived: only while a changed file is applied
enum ParsedDoc {
    /// Not YAML.
    Unreadable { number: usize, line: usize, error: String },
    /// Parsed (or rejected with a known or unknown key).
    Parsed { number: usize, line: usize, result: Result<Doc, crate::api::ParseError> },
}

/// A parsed document: an object already in the view's form (taken out when the view
/// gets it), or a kind egressd does not read. Not the parsed object itself: a load of
/// every file holds one of these per document at once.
#[derive(Debug, Clone)]
#[allow(clippy::large_enum_variant)] // nearly every document is an object
enum Doc {
    Object { key: ObjectKey, update: Option<Update> },
    Ignored { api_version: String, kind: String },
}

/// What the parse cache keeps of a document: where it is and what it names or why it
/// was refused — never the object itself (the view holds what egressd uses of it).
#[derive(Debug, Clone)]
enum DocSummary {
    /// Not YAML.
    Unreadable { number: usize, line: usize, error: String },
    /// A kind egressd does not read.
    Ignored { number: usize, what: String },
    /// An object.
    Object { number: usize, line: usize, key: ObjectKey },
    /// A refused document, with its object when known.
    Rejected { number: usize, line: usize, key: Option<ObjectKey>, message: String },
}

impl DocSummary {
    fn of(doc: &ParsedDoc) -> Self {
        match doc {
            ParsedDoc::Unreadable { number, line, error } => {
                Self::Unreadable { number: *number, line: *line, error: error.clone() }
            }
            ParsedDoc::Parsed { number, line, result } => {
                let (number, line) = (*number, *line);
                match result {
                    Ok(Doc::Ignored { api_version, kind }) => {
                        Self::Ignored { number, what: format!("{api_version}/{kind}") }
                    }
                    Ok(Doc::Object { key, .. }) => Self::Object { number, line, key: key.clone() },
                    Err(e) => Self::Rejected { number, line, key: e.key.clone(), message: e.violations.join("; ") },
                }
            }
        }
    }
}

/// One file as last read: its length and a hash of its text (an unchanged file is not
/// parsed again) and its documents' summaries.
#[derive(Debug, Clone)]
struct FileEntry {
    len: usize,
    hash: u64,
    /// Size and modification time when it was read (a file named by no event is read
    /// again when they differ).
    stamp: Option<Stamp>,
    docs: Vec<DocSummary>,
}

fn text_hash(text: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    text.hash(&mut h);
    h.finish()
}

/// The manifests directory and the view built from it.
#[derive(Debug)]
pub struct ManifestSource {
    dir: PathBuf,
    view: ClusterView,
    /// Which file each object in the view came from.
    origins: BTreeMap<ObjectKey, PathBuf>,
    /// Each file's length, text hash and document summaries: a file whose text is
    /// unchanged is not parsed again (a resync of an unchanged directory reads the files
    /// but parses nothing), and neither its text nor its documents are kept.
    parsed: ParseCache,
}

fn parse_file(text: &str) -> Vec<ParsedDoc> {
    split_documents(text)
        .into_iter()
        .map(|(number, line, body)| match yaml_to_value(&body) {
            Ok(value) => {
                let result = parse_document(&value, "default", true).map(|parsed| match parsed {
                    Parsed::Object(o) => Doc::Object { key: o.key(), update: Some(Update::of(&o)) },
                    Parsed::Ignored { api_version, kind } => Doc::Ignored { api_version, kind },
                });
                ParsedDoc::Parsed { number, line, result }
            }
            Err(error) => ParsedDoc::Unreadable { number, line, error },
        })
        .collect()
}

fn is_manifest(path: &Path) -> bool {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
    !name.starts_with('.') && (name.ends_with(".yaml") || name.ends_with(".yml"))
}

impl ManifestSource {
    /// A source reading `dir`. Nothing is read until [`ManifestSource::load`].
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into(), view: ClusterView::default(), origins: BTreeMap::new(), parsed: BTreeMap::new() }
    }

    /// The current view.
    pub fn view(&self) -> &ClusterView {
        &self.view
    }

    /// The current view, mutably (last good versions adopted after a restart).
    pub fn view_mut(&mut self) -> &mut ClusterView {
        &mut self.view
    }

    /// The manifest files, sorted by name.
    pub fn files(&self) -> Result<Vec<PathBuf>, SourceError> {
        Ok(self.listing()?.into_iter().map(|(path, _)| path).collect())
    }

    /// The manifest files, sorted by name, with their size and modification time.
    fn listing(&self) -> Result<Vec<(PathBuf, Option<Stamp>)>, SourceError> {
        let entries =
            std::fs::read_dir(&self.dir).map_err(|source| SourceError::Directory { path: self.dir.clone(), source })?;
        let mut files: Vec<(PathBuf, Option<Stamp>)> = entries
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| is_manifest(p))
            .filter_map(|p| {
                // Symlinks are followed (a ConfigMap volume's files are links).
                let meta = std::fs::metadata(&p).ok()?;
                meta.is_file().then(|| (p, meta.modified().ok().map(|t| (meta.len(), t))))
            })
            .collect();
        files.sort();
        Ok(files)
    }

    /// Read the whole directory and bring the view up to date: refresh the parse cache
    /// (every file read, only changed ones parsed), collect the objects and rejections
    /// of all files, then update the view with what differs.
    pub fn load(&mut self) -> Result<LoadReport, SourceError> {
        self.load_files(None)
    }

    /// [`ManifestSource::load`] when only `changed` files (and new ones) can differ from
    /// the last load: the others are not read again. What a directory watch reports (a
    /// change it could not attribute to files calls for a whole [`ManifestSource::load`]).
    pub fn load_changed(&mut self, changed: &BTreeSet<PathBuf>) -> Result<LoadReport, SourceError> {
        self.load_files(Some(changed))
    }

    fn load_files(&mut self, only: Option<&BTreeSet<PathBuf>>) -> Result<LoadReport, SourceError> {
        let listing = self.listing()?;
        let mut report = LoadReport::default();
        let mut read = refresh(&mut self.parsed, &listing, only, &mut report);
        let files: Vec<PathBuf> = listing.into_iter().map(|(path, _)| path).collect();
        let mut collected = collect(&files, &self.parsed, &mut report);
        collected.unreadable.extend(std::mem::take(&mut read.unreadable));
        report.objects = collected.objects.len();
        report.changed = update_view(&mut self.view, &mut self.origins, collected, &mut read);
        Ok(report)
    }
}

/// What is kept of each file.
type ParseCache = BTreeMap<PathBuf, FileEntry>;

/// A file's size and modification time.
type Stamp = (u64, std::time::SystemTime);

/// What reading the files found.
struct Read {
    /// Files parsed anew (new, or with changed text), with their documents (kept for
    /// this load only).
    changed: BTreeMap<PathBuf, Vec<ParsedDoc>>,
    /// Files that could not be read.
    unreadable: BTreeSet<PathBuf>,
}

/// Bring the parse cache up to date with `files`: drop files that are gone, read every
/// file (with `only`: those, and files that are new or whose size or modification time
/// changed), parse only the ones whose text changed.
fn refresh(
    parsed: &mut ParseCache,
    files: &[(PathBuf, Option<Stamp>)],
    only: Option<&BTreeSet<PathBuf>>,
    report: &mut LoadReport,
) -> Read {
    let present: BTreeSet<&PathBuf> = files.iter().map(|(path, _)| path).collect();
    parsed.retain(|path, _| present.contains(path));
    let mut read = Read { changed: BTreeMap::new(), unreadable: BTreeSet::new() };
    for (file, stamp) in files {
        let unchanged = parsed.get(file).is_some_and(|e| stamp.is_some() && e.stamp == *stamp);
        if unchanged && only.is_some_and(|only| !only.contains(file)) {
            continue;
        }
        match std::fs::read_to_string(file) {
            Ok(text) => {
                let (len, hash) = (text.len(), text_hash(&text));
                if let Some(e) = parsed.get_mut(file).filter(|e| e.len == len && e.hash == hash) {
                    e.stamp = *stamp;
                } else {
                    let docs = parse_file(&text);
                    let summaries = docs.iter().map(DocSummary::of).collect();
                    parsed.insert(file.clone(), FileEntry { len, hash, stamp: *stamp, docs: summaries });
                    read.changed.insert(file.clone(), docs);
                }
            }
            Err(e) => {
                parsed.remove(file);
                report.errors.push(DocumentError {
                    file: file.clone(),
                    document: 0,
                    line: 0,
                    key: None,
                    message: format!("cannot read file: {e}"),
                });
                read.unreadable.insert(file.clone());
            }
        }
    }
    read
}

/// Every object of the directory, by the document summaries of the parse cache (keys
/// and files borrowed from it: this runs on every change, over every document).
struct Collected<'a> {
    /// Good objects and their file (the first definition wins; later copies are errors).
    objects: BTreeMap<&'a ObjectKey, &'a PathBuf>,
    /// Rejected objects: the located error and their file.
    rejected: BTreeMap<&'a ObjectKey, (String, &'a PathBuf)>,
    /// Files with a document that is not YAML (their objects cannot be told).
    unreadable: BTreeSet<PathBuf>,
}

/// Walk the cached summaries of `files` in order, reporting errors.
fn collect<'a>(files: &'a [PathBuf], parsed: &'a ParseCache, report: &mut LoadReport) -> Collected<'a> {
    let mut c = Collected { objects: BTreeMap::new(), rejected: BTreeMap::new(), unreadable: BTreeSet::new() };
    // Where each key was first defined: file and document number.
    let mut seen_at: BTreeMap<&ObjectKey, (&Path, usize)> = BTreeMap::new();
    let at = |(file, number): (&Path, usize)| format!("{} document {number}", file.display());
    for file in files {
        let Some(entry) = parsed.get(file) else { continue };
        for doc in &entry.docs {
            let err = |document: usize, line: usize, key: Option<ObjectKey>, message: String| DocumentError {
                file: file.clone(),
                document,
                line,
                key,
                message,
            };
            match doc {
                DocSummary::Unreadable { number, line, error } => {
                    report.errors.push(err(*number, *line, None, error.clone()));
                    c.unreadable.insert(file.clone());
                }
                DocSummary::Ignored { number, what, .. } => {
                    report.ignored.push(format!("{} document {number}: {what}", file.display()));
                }
                DocSummary::Object { number, line, key } => {
                    if let Some(first) = seen_at.get(key) {
                        report.errors.push(err(
                            *number,
                            *line,
                            Some(key.clone()),
                            format!("duplicate object: already defined in {}; this copy is ignored", at(*first)),
                        ));
                        continue;
                    }
                    seen_at.insert(key, (file, *number));
                    c.objects.insert(key, file);
                }
                DocSummary::Rejected { number, line, key, message } => {
                    if let Some(key) = key
                        && !seen_at.contains_key(key)
                    {
                        seen_at.insert(key, (file, *number));
                        // The status names where the bad version is, then the fields.
                        let located = err(*number, *line, None, message.clone()).to_string();
                        c.rejected.insert(key, (located, file));
                    }
                    report.errors.push(err(*number, *line, key.clone(), message.clone()));
                }
            }
        }
    }
    c
}

/// The object `key` as parsed from `file`: from this load's parse of a changed file, or
/// (when the object's first definition moved to a file that did not change) by parsing
/// that file again.
fn object_of(read: &mut Read, file: &Path, key: &ObjectKey) -> Option<Update> {
    if !read.changed.contains_key(file) {
        let text = std::fs::read_to_string(file).ok()?;
        read.changed.insert(file.to_path_buf(), parse_file(&text));
    }
    read.changed.get_mut(file)?.iter_mut().find_map(|d| match d {
        ParsedDoc::Parsed { result: Ok(Doc::Object { key: k, update }), .. } if k == key => update.take(),
        _ => None,
    })
}

/// Make the view hold what was collected: remove objects that are gone (neither read
/// nor rejected, and not from a file with an unreadable document, which might hold
/// them), upsert objects of changed files or that moved, record rejections. Returns
/// whether the view changed.
fn update_view(
    view: &mut ClusterView,
    origins: &mut BTreeMap<ObjectKey, PathBuf>,
    c: Collected<'_>,
    read: &mut Read,
) -> bool {
    let mut changed = false;
    let gone: Vec<ObjectKey> = origins
        .iter()
        .filter(|(k, file)| {
            !c.objects.contains_key(*k) && !c.rejected.contains_key(*k) && !c.unreadable.contains(*file)
        })
        .map(|(k, _)| k.clone())
        .collect();
    for key in gone {
        view.remove(&key);
        origins.remove(&key);
        changed = true;
    }
    for (key, file) in c.objects {
        // The same version from the same unchanged file is in the view already.
        if !read.changed.contains_key(file) && origins.get(key) == Some(file) {
            continue;
        }
        // A file changed again since it was read is read again at its event.
        let Some(update) = object_of(read, file, key) else { continue };
        changed |= view.apply(update);
        origins.insert(key.clone(), file.clone());
    }
    for (key, (message, file)) in c.rejected {
        changed |= view.reject(key, message);
        origins.insert(key.clone(), file.clone());
    }
    changed
}

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

/// Watch `dir` and send what changed on `tx` after each burst of changes, once `quiet`
/// has passed without further events (at most `max_delay` after the first). The
/// returned watcher must be kept alive.
pub fn watch(
    dir: &Path,
    quiet: Duration,
    max_delay: Duration,
    tx: mpsc::Sender<DirChange>,
) -> Result<notify::RecommendedWatcher, SourceError> {
    use notify::Watcher;
    // `None`: an event that names no file.
    let (raw_tx, mut raw_rx) = mpsc::unbounded_channel::<Option<Vec<PathBuf>>>();
    let mut watcher = notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
        let paths = match res {
            Ok(e) if !changes_content(&e.kind) => return,
            Ok(e) if e.need_rescan() || e.paths.is_empty() => None,
            Ok(e) => Some(e.paths),
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
            let mut add = |paths: Option<Vec<PathBuf>>| match paths {
                Some(paths) => change.files.extend(paths),
                None => change.rescan = true,
            };
            add(first);
            let deadline = tokio::time::Instant::now() + max_delay;
            loop {
                match tokio::time::timeout_at(deadline.min(tokio::time::Instant::now() + quiet), raw_rx.recv()).await {
                    Ok(Some(paths)) => add(paths),
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
pub(crate) fn log_report(report: &LoadReport) {
    for e in &report.errors {
        tracing::warn!(error = %e, "manifest rejected");
    }
    for i in &report.ignored {
        tracing::debug!(document = %i, "kind not used by egressd; ignored");
    }
}

/// The manifests directory as a [`super::ViewSource`]: directory events (debounced) and a
/// periodic re-read.
pub struct ManifestsWatch {
    source: ManifestSource,
    report: LoadReport,
    events: mpsc::Receiver<DirChange>,
    resync: tokio::time::Interval,
    _watcher: notify::RecommendedWatcher,
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
        Ok(Self { source, report, events, resync, _watcher: watcher })
    }
}

impl super::ViewSource for ManifestsWatch {
    fn view(&self) -> &ClusterView {
        self.source.view()
    }

    fn view_mut(&mut self) -> &mut ClusterView {
        self.source.view_mut()
    }

    fn problems(&self) -> Vec<String> {
        self.report.errors.iter().map(ToString::to_string).collect()
    }

    async fn next_change(&mut self) -> bool {
        // The periodic re-read catches missed events; what changed is what the view says.
        // Files a watch event named are read again; a rescan or the resync reads all.
        let changed = tokio::select! {
            Some(change) = self.events.recv() => (!change.rescan).then_some(change.files),
            _ = self.resync.tick() => None,
        };
        let started = std::time::Instant::now();
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::Kind;

    const GOOD: &str = "apiVersion: k8s.ovn.org/v1\nkind: EgressFirewall\nmetadata: {name: default, namespace: a}\nspec:\n  egress:\n  - type: Deny\n    to: {cidrSelector: 192.0.2.0/24}\n";
    const SCHEMA_BAD: &str = "apiVersion: k8s.ovn.org/v1\nkind: EgressFirewall\nmetadata: {name: default, namespace: a}\nspec:\n  egress:\n  - type: deny\n    to: {cidrSelector: 192.0.2.0/24}\n";
    const CONTROLLER_BAD: &str = "apiVersion: k8s.ovn.org/v1\nkind: EgressFirewall\nmetadata: {name: default, namespace: a}\nspec:\n  egress:\n  - type: Deny\n    to: {cidrSelector: 192.0.2.0/33}\n";
    const POD: &str = "apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: a}\nspec: {nodeName: node-1}\nstatus: {podIP: 198.18.0.5}\n";

    fn rule_cidr(src: &ManifestSource) -> Option<String> {
        let entry = src.view().firewalls.get("a")?;
        let policy = entry.policy.as_ref()?;
        Some(format!("{:?}", policy.rules[0].target))
    }

    #[test]
    fn bad_versions_keep_the_last_good_one_and_name_the_field() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("fw.yaml");
        std::fs::write(&file, format!("{GOOD}---\n{POD}")).unwrap();
        let mut src = ManifestSource::new(dir.path());
        let r = src.load().unwrap();
        assert!(r.errors.is_empty() && r.changed && r.objects == 2);
        let good = rule_cidr(&src).unwrap();

        for bad in [SCHEMA_BAD, CONTROLLER_BAD] {
            std::fs::write(&file, format!("{bad}---\n{POD}")).unwrap();
            let r = src.load().unwrap();
            assert_eq!(rule_cidr(&src).unwrap(), good, "last good version kept");
            let entry = &src.view().firewalls["a"];
            let err = entry.error.as_deref().unwrap();
            assert!(err.contains("spec.egress[0]."), "{err}");
            assert!(src.view().pods.contains_key(&("a".into(), "p".into())), "other documents still apply");
            if bad == SCHEMA_BAD {
                assert_eq!(r.errors.len(), 1);
                assert_eq!(r.errors[0].document, 1);
                assert!(
                    r.errors[0]
                        .to_string()
                        .contains("fw.yaml: document 1 (line 1): EgressFirewall a/default: spec.egress[0].type")
                );
            }
        }

        std::fs::write(&file, format!("{GOOD}---\n{POD}")).unwrap();
        src.load().unwrap();
        assert!(src.view().firewalls["a"].error.is_none(), "fixed version clears the error");
    }

    #[test]
    fn removed_objects_leave_the_view_but_unreadable_files_keep_theirs() {
        let dir = tempfile::tempdir().unwrap();
        let fw = dir.path().join("fw.yaml");
        let pods = dir.path().join("pods.yml");
        std::fs::write(&fw, GOOD).unwrap();
        std::fs::write(&pods, POD).unwrap();
        let mut src = ManifestSource::new(dir.path());
        src.load().unwrap();
        assert_eq!(src.view().pods.len(), 1);

        // A document that is not YAML: its file's objects are kept.
        std::fs::write(&pods, "kind: [unclosed\n").unwrap();
        let r = src.load().unwrap();
        assert_eq!(r.errors.len(), 1);
        assert!(r.errors[0].message.starts_with("invalid YAML"), "{}", r.errors[0].message);
        assert_eq!(src.view().pods.len(), 1);

        std::fs::remove_file(&pods).unwrap();
        let r = src.load().unwrap();
        assert!(r.changed);
        assert!(src.view().pods.is_empty());
        assert!(src.view().firewalls.contains_key("a"));
        std::fs::remove_file(&fw).unwrap();
        src.load().unwrap();
        assert!(src.view().firewalls.is_empty());
    }

    #[test]
    fn configmap_style_symlink_swap_and_hidden_files() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::create_dir(d.join("..v1")).unwrap();
        std::fs::write(d.join("..v1/fw.yaml"), GOOD).unwrap();
        std::os::unix::fs::symlink("..v1", d.join("..data")).unwrap();
        std::os::unix::fs::symlink("..data/fw.yaml", d.join("fw.yaml")).unwrap();
        std::fs::write(d.join(".fw.yaml.swp"), "garbage").unwrap();
        std::fs::write(d.join("notes.txt"), "garbage").unwrap();
        let mut src = ManifestSource::new(d);
        let r = src.load().unwrap();
        assert!(r.errors.is_empty(), "{:?}", r.errors);
        let before = rule_cidr(&src).unwrap();
        // Swap ..data atomically to a new version, as the kubelet does.
        std::fs::create_dir(d.join("..v2")).unwrap();
        std::fs::write(d.join("..v2/fw.yaml"), GOOD.replace("192.0.2.0/24", "198.51.100.0/24")).unwrap();
        std::os::unix::fs::symlink("..v2", d.join("..data_tmp")).unwrap();
        std::fs::rename(d.join("..data_tmp"), d.join("..data")).unwrap();
        src.load().unwrap();
        let after = rule_cidr(&src).unwrap();
        assert_ne!(before, after);
        assert!(after.contains("198.51.100.0/24"));
    }

    #[test]
    fn missing_directory_is_an_error() {
        let mut src = ManifestSource::new("/nonexistent/egressd-test");
        assert!(matches!(src.load(), Err(SourceError::Directory { .. })));
    }

    #[test]
    fn kinds_are_all_read() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("all.yaml"),
            "apiVersion: v1\nkind: Namespace\nmetadata: {name: a, labels: {team: x}}\n---\napiVersion: v1\nkind: Node\nmetadata: {name: node-1}\n",
        )
        .unwrap();
        let mut src = ManifestSource::new(dir.path());
        src.load().unwrap();
        let keys = src.view().keys();
        assert!(keys.iter().any(|k| k.kind == Kind::Namespace && k.name == "a"));
        assert!(keys.iter().any(|k| k.kind == Kind::Node && k.name == "node-1"));
        assert_eq!(src.view().namespaces["a"].labels["team"], "x");
    }

    #[tokio::test]
    async fn reading_the_files_is_not_a_change() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.yaml"), GOOD).unwrap();
        let (tx, mut rx) = mpsc::channel(1);
        let _w = watch(dir.path(), Duration::from_millis(50), Duration::from_millis(250), tx).unwrap();
        // What a reload does: list, open, read, close every file.
        let mut src = ManifestSource::new(dir.path());
        for _ in 0..3 {
            src.load().unwrap();
        }
        let got = tokio::time::timeout(Duration::from_millis(600), rx.recv()).await;
        assert!(got.is_err(), "a reload must not signal a change: {got:?}");
        std::fs::write(dir.path().join("a.yaml"), GOOD.replace("192.0.2.0/24", "198.51.100.0/24")).unwrap();
        let got = tokio::time::timeout(Duration::from_secs(5), rx.recv()).await;
        let change = got.unwrap().unwrap();
        assert!(change.files.contains(&dir.path().join("a.yaml")), "a write does, naming the file: {change:?}");
    }

    #[tokio::test]
    async fn watch_signals_after_changes() {
        let dir = tempfile::tempdir().unwrap();
        let (tx, mut rx) = mpsc::channel(1);
        let _w = watch(dir.path(), Duration::from_millis(50), Duration::from_millis(250), tx).unwrap();
        std::fs::write(dir.path().join("a.yaml"), GOOD).unwrap();
        let got = tokio::time::timeout(Duration::from_secs(5), rx.recv()).await;
        let change = got.unwrap().unwrap();
        assert_eq!(change.files, BTreeSet::from([dir.path().join("a.yaml")]));
        assert!(!change.rescan);
    }
}
