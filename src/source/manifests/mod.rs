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
//! [`watch`] turns directory events into debounced [`DirChange`]s naming the files they
//! touched; [`ManifestSource::load_changed`] reads only those (a change it cannot
//! attribute — `..data` swapped, a directory, a lost event — reads the whole directory).

use crate::api::ObjectKey;
use crate::view::{ClusterView, Update};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

mod docs;
mod watch;
use docs::{DefIndex, Doc, DocSummary, FileEntry, ParsedDoc, duplicate, parse_file, text_hash};
pub use watch::{DirChange, ManifestsWatch, SETTLE, watch};

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
#[derive(Debug, Clone, Default, PartialEq, Eq)]
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
    /// Files that could not be read, with the error (reported until read again).
    unreadable: BTreeMap<PathBuf, String>,
    /// Where each object is defined (from the parse cache): a watch event re-collects
    /// only the objects its files defined before or define now.
    index: DefIndex,
    /// Each file's part of the report, kept for [`ManifestSource::summarise`].
    summary: Summary,
}

/// The directory's report by file, made from the cache summaries: while no object is
/// defined twice, a file's part depends on that file alone, so a change remakes the
/// parts of the files it changed, not of every file (a walk over 11k documents, with an
/// index lookup each, was ~0.6 ms of every change at 100k rules).
#[derive(Debug, Default)]
struct Summary {
    parts: BTreeMap<PathBuf, FilePart>,
    /// The parts' objects, summed.
    objects: usize,
    /// Files whose part has errors or ignored documents.
    noisy: std::collections::BTreeSet<PathBuf>,
    /// Files whose cache entry changed since their part was made.
    dirty: std::collections::BTreeSet<PathBuf>,
    /// Whether the parts were made while no object was defined twice (else every part
    /// is made anew).
    valid: bool,
}

/// One file's part of the report.
#[derive(Debug, Default)]
struct FilePart {
    errors: Vec<DocumentError>,
    ignored: Vec<String>,
    objects: usize,
}

fn is_manifest(path: &Path) -> bool {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
    !name.starts_with('.') && (name.ends_with(".yaml") || name.ends_with(".yml"))
}

impl ManifestSource {
    /// A source reading `dir`. Nothing is read until [`ManifestSource::load`].
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            view: ClusterView::default(),
            origins: BTreeMap::new(),
            parsed: BTreeMap::new(),
            unreadable: BTreeMap::new(),
            index: DefIndex::default(),
            summary: Summary::default(),
        }
    }

    /// Set (or with `None` drop) the cache entry of `file`, keeping the index in step.
    fn set_entry(&mut self, file: &Path, entry: Option<FileEntry>) {
        self.summary.dirty.insert(file.to_path_buf());
        if let Some(old) = self.parsed.remove(file) {
            self.index.remove(file, &old);
        }
        if let Some(new) = entry {
            self.index.add(file, &new);
            self.parsed.insert(file.to_path_buf(), new);
        }
    }

    /// Whether every file could be read and every document is YAML: then the index
    /// tells each object's definitions, and a change can be collected incrementally.
    fn clean(&self) -> bool {
        self.unreadable.is_empty() && self.index.unreadable_docs == 0
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
        let entries = std::fs::read_dir(&self.dir).map_err(|source| self.dir_error(source))?;
        // Symlinks are followed (a ConfigMap volume's files are links).
        let mut files: Vec<PathBuf> =
            entries.filter_map(Result::ok).map(|e| e.path()).filter(|p| is_manifest(p) && p.is_file()).collect();
        files.sort();
        Ok(files)
    }

    fn dir_error(&self, source: std::io::Error) -> SourceError {
        SourceError::Directory { path: self.dir.clone(), source }
    }

    /// Read the whole directory and bring the view up to date: refresh the parse cache
    /// (every file read, only changed ones parsed), collect the objects and rejections
    /// of all files, then update the view with what differs.
    pub fn load(&mut self) -> Result<LoadReport, SourceError> {
        let files = self.files()?;
        let present: BTreeSet<&PathBuf> = files.iter().collect();
        let gone: Vec<PathBuf> = self.parsed.keys().filter(|p| !present.contains(p)).cloned().collect();
        for file in gone {
            self.set_entry(&file, None);
        }
        self.unreadable.retain(|path, _| present.contains(path));
        let mut read = Read::default();
        for file in &files {
            self.read_file(file, &mut read);
        }
        Ok(self.finish(read))
    }

    /// [`ManifestSource::load`] when only `changed` files can differ from the last load
    /// (what a directory watch reports): only they are read again, and the directory is
    /// not listed. A path outside the directory calls for a whole load.
    pub fn load_changed(&mut self, changed: &BTreeSet<PathBuf>) -> Result<LoadReport, SourceError> {
        // A ConfigMap volume swaps `..data` (a link to a new `..<timestamp>` directory):
        // its files, links through it, change without an event naming them.
        let indirect = |p: &Path| {
            p.parent() != Some(self.dir.as_path())
                || p.file_name().and_then(|n| n.to_str()).is_none_or(|n| n.starts_with(".."))
                || p.is_dir()
        };
        if changed.iter().any(|p| indirect(p)) {
            return self.load();
        }
        std::fs::read_dir(&self.dir).map_err(|source| self.dir_error(source))?;
        let was_clean = self.clean();
        // The objects the files defined before: with what they define now, the only
        // ones whose first definition can have changed.
        let mut touched: BTreeSet<ObjectKey> = BTreeSet::new();
        let mut read = Read::default();
        for file in changed {
            if let Some(entry) = self.parsed.get(file) {
                touched.extend(DefIndex::keys(entry).map(|(k, _)| k.clone()));
            }
            if is_manifest(file) && file.is_file() {
                self.read_file(file, &mut read);
            } else {
                self.set_entry(file, None);
                self.unreadable.remove(file);
            }
            if let Some(entry) = self.parsed.get(file) {
                touched.extend(DefIndex::keys(entry).map(|(k, _)| k.clone()));
            }
        }
        if !(was_clean && self.clean()) {
            return Ok(self.finish(read));
        }
        Ok(self.finish_touched(read, &touched))
    }

    /// [`ManifestSource::finish`] when every file is readable YAML (before and after
    /// this load) and only the objects `touched` can have changed: they are brought up
    /// to date from the index; the report is made from the cache summaries, looking up
    /// definitions only for objects defined more than once.
    fn finish_touched(&mut self, mut read: Read, touched: &BTreeSet<ObjectKey>) -> LoadReport {
        let mut report = self.summarise();
        // In the order of the whole collect: removals, then objects, then rejections.
        let mut gone = Vec::new();
        let mut todo = Vec::new();
        let mut rejected = Vec::new();
        for key in touched {
            let Some((file, i)) = self.index.first(key) else {
                if self.origins.contains_key(key) {
                    gone.push(key);
                }
                continue;
            };
            match self.parsed.get(file).and_then(|e| e.docs.get(i)) {
                Some(DocSummary::Object { .. }) => {
                    let same_origin = self.origins.get(key).is_some_and(|f| f == file);
                    if !same_origin || read.changed.contains_key(file) {
                        todo.push((key, file.clone(), i));
                    }
                }
                Some(doc @ DocSummary::Rejected { .. }) => {
                    rejected.push((key, doc.located(file), file.clone()));
                }
                _ => {}
            }
        }
        let mut changed = false;
        for key in gone {
            self.view.remove(key);
            self.origins.remove(key);
            changed = true;
        }
        for (key, file, at) in todo {
            // A file changed again since it was read is read again at its event.
            let Some(update) = object_of(&mut read, &file, key, at) else { continue };
            changed |= self.view.apply(update);
            self.origins.insert(key.clone(), file);
        }
        for (key, message, file) in rejected {
            changed |= self.view.reject(key, message);
            self.origins.insert(key.clone(), file);
        }
        report.changed = changed;
        report
    }

    /// The report of the whole directory from the cache summaries and the index (every
    /// file readable YAML): errors in file and document order, duplicates named. Made
    /// from the kept parts of the files ([`Summary`]), remaking those of changed files,
    /// or of every file while an object is defined twice.
    fn summarise(&mut self) -> LoadReport {
        let mut summary = std::mem::take(&mut self.summary);
        let dirty = std::mem::take(&mut summary.dirty);
        let files: Vec<PathBuf> = if summary.valid && self.index.multi.is_empty() {
            dirty.into_iter().collect()
        } else {
            summary = Summary::default();
            self.parsed.keys().cloned().collect()
        };
        for file in files {
            if let Some(old) = summary.parts.remove(&file) {
                summary.objects -= old.objects;
                summary.noisy.remove(&file);
            }
            let Some(entry) = self.parsed.get(&file) else { continue };
            let part = self.file_part(&file, entry);
            summary.objects += part.objects;
            if !part.errors.is_empty() || !part.ignored.is_empty() {
                summary.noisy.insert(file.clone());
            }
            summary.parts.insert(file, part);
        }
        summary.valid = self.index.multi.is_empty();
        let mut report = LoadReport { objects: summary.objects, ..LoadReport::default() };
        for file in &summary.noisy {
            if let Some(part) = summary.parts.get(file) {
                report.errors.extend(part.errors.iter().cloned());
                report.ignored.extend(part.ignored.iter().cloned());
            }
        }
        self.summary = summary;
        report
    }

    /// One file's part of the report.
    fn file_part(&self, file: &PathBuf, entry: &FileEntry) -> FilePart {
        let mut part = FilePart::default();
        for (i, doc) in entry.docs.iter().enumerate() {
            part.errors.extend(doc.error(file));
            part.ignored.extend(doc.ignored(file));
            let DocSummary::Object { number, line, key } = doc else { continue };
            match self.index.multi.contains(key).then(|| self.index.first(key)).flatten() {
                Some((f, n)) if (f, n) != (file, i) => {
                    let first = self.parsed.get(f).and_then(|e| e.docs.get(n)).map_or(0, DocSummary::number);
                    part.errors.push(duplicate(file, *number, *line, key, (f, first)));
                }
                _ => part.objects += 1,
            }
        }
        part
    }

    /// Read one file: parse it when its text changed (into `read`), note it when it
    /// cannot be read.
    fn read_file(&mut self, file: &Path, read: &mut Read) {
        match std::fs::read_to_string(file) {
            Ok(text) => {
                self.unreadable.remove(file);
                let (len, hash) = (text.len(), text_hash(&text));
                if self.parsed.get(file).is_none_or(|e| e.len != len || e.hash != hash) {
                    let docs = parse_file(&text);
                    let summaries = docs.iter().map(DocSummary::of).collect();
                    self.set_entry(file, Some(FileEntry { len, hash, docs: summaries }));
                    read.changed.insert(file.to_path_buf(), docs);
                }
            }
            Err(e) => {
                self.set_entry(file, None);
                self.unreadable.insert(file.to_path_buf(), format!("cannot read file: {e}"));
            }
        }
    }

    /// Collect the objects and rejections of all files (from the cache) and update the
    /// view with what differs.
    fn finish(&mut self, mut read: Read) -> LoadReport {
        let mut report = LoadReport::default();
        for (file, message) in &self.unreadable {
            let message = message.clone();
            report.errors.push(DocumentError { file: file.clone(), document: 0, line: 0, key: None, message });
        }
        let mut collected = collect(&self.parsed, &mut report);
        collected.unreadable.extend(self.unreadable.keys());
        report.objects = collected.objects.len();
        report.changed = update_view(&mut self.view, &mut self.origins, collected, &mut read);
        report
    }
}

/// What is kept of each file.
type ParseCache = BTreeMap<PathBuf, FileEntry>;

/// What one load parsed.
#[derive(Default)]
struct Read {
    /// Files parsed anew (new, or with changed text), with their documents (kept for
    /// this load only).
    changed: BTreeMap<PathBuf, Vec<ParsedDoc>>,
}

/// Every object of the directory, by the document summaries of the parse cache (keys
/// and files borrowed from it: this runs on every change, over every document).
struct Collected<'a> {
    /// Good objects, their file and document number (the first definition wins; later
    /// copies are errors).
    objects: BTreeMap<&'a ObjectKey, (&'a PathBuf, usize)>,
    /// Rejected objects: the located error, their file and document number.
    rejected: BTreeMap<&'a ObjectKey, (String, &'a PathBuf, usize)>,
    /// Files with a document that is not YAML, and files that cannot be read (their
    /// objects cannot be told).
    unreadable: BTreeSet<&'a PathBuf>,
}

impl<'a> Collected<'a> {
    /// Where `key` was first defined (file and document number).
    fn first(&self, key: &ObjectKey) -> Option<(&'a PathBuf, usize)> {
        self.objects.get(key).copied().or_else(|| self.rejected.get(key).map(|(_, f, n)| (*f, *n)))
    }
}

/// Walk the cached summaries of every file, in order, reporting errors.
fn collect<'a>(parsed: &'a ParseCache, report: &mut LoadReport) -> Collected<'a> {
    let mut c = Collected { objects: BTreeMap::new(), rejected: BTreeMap::new(), unreadable: BTreeSet::new() };
    for (file, entry) in parsed {
        for doc in &entry.docs {
            report.errors.extend(doc.error(file));
            report.ignored.extend(doc.ignored(file));
            match doc {
                DocSummary::Unreadable { .. } => {
                    c.unreadable.insert(file);
                }
                DocSummary::Ignored { .. } => {}
                DocSummary::Object { number, line, key } => {
                    if let Some((f, n)) = c.first(key) {
                        report.errors.push(duplicate(file, *number, *line, key, (f, n)));
                        continue;
                    }
                    c.objects.insert(key, (file, *number));
                }
                DocSummary::Rejected { number, key, .. } => {
                    if let Some(key) = key
                        && c.first(key).is_none()
                    {
                        c.rejected.insert(key, (doc.located(file), file, *number));
                    }
                }
            }
        }
    }
    c
}

/// The object `key` as parsed from `file`: from this load's parse of a changed file, or
/// (when the object's first definition moved to a file that did not change) by parsing
/// that file again. `at` is the position of its first definition in the file as the
/// parse cache knows it: that document is taken when it holds `key`; otherwise (the
/// file changed again since) the first document that does. Without the position, a file
/// of n objects cost n²/2 key comparisons at a full load (10,000 pods in one file: 50M).
fn object_of(read: &mut Read, file: &Path, key: &ObjectKey, at: usize) -> Option<Update> {
    if !read.changed.contains_key(file) {
        let text = std::fs::read_to_string(file).ok()?;
        read.changed.insert(file.to_path_buf(), parse_file(&text));
    }
    let docs = read.changed.get_mut(file)?;
    let holds =
        |d: &ParsedDoc| matches!(d, ParsedDoc::Parsed { result: Ok(Doc::Object { key: k, .. }), .. } if k == key);
    let i = if docs.get(at).is_some_and(holds) { at } else { docs.iter().position(holds)? };
    match docs.get_mut(i) {
        Some(ParsedDoc::Parsed { result: Ok(Doc::Object { update, .. }), .. }) => update.take(),
        _ => None,
    }
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
    // One walk over the objects and their previous origins (both sorted by key): what is
    // gone, and what is new, moved or from a changed file.
    let mut gone: Vec<ObjectKey> = Vec::new();
    // With the position of the first definition in its file (document numbers count
    // from 1).
    let mut todo: Vec<(&ObjectKey, &PathBuf, usize)> = Vec::new();
    let mut before = origins.iter().peekable();
    let keep = |k: &ObjectKey, file: &PathBuf| c.rejected.contains_key(k) || c.unreadable.contains(file);
    for (key, (file, number)) in &c.objects {
        while let Some((k, f)) = before.next_if(|(k, _)| *k < *key) {
            if !keep(k, f) {
                gone.push(k.clone());
            }
        }
        let same_origin = before.next_if(|(k, _)| *k == *key).is_some_and(|(_, f)| f.as_os_str() == file.as_os_str());
        // The same version from the same unchanged file is in the view already.
        if !same_origin || read.changed.contains_key(*file) {
            todo.push((key, file, number.saturating_sub(1)));
        }
    }
    for (k, f) in before {
        if !keep(k, f) {
            gone.push(k.clone());
        }
    }
    let mut changed = false;
    for key in gone {
        view.remove(&key);
        origins.remove(&key);
        changed = true;
    }
    for (key, file, at) in todo {
        // A file changed again since it was read is read again at its event.
        let Some(update) = object_of(read, file, key, at) else { continue };
        changed |= view.apply(update);
        origins.insert(key.clone(), file.clone());
    }
    for (key, (message, file, _)) in c.rejected {
        changed |= view.reject(key, message);
        origins.insert(key.clone(), file.clone());
    }
    changed
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::sync::mpsc;

    use super::watch::watch_settling;
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
    fn an_object_is_taken_from_its_position_or_else_its_first_definition() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("pods.yaml");
        let other = POD.replace("name: p,", "name: q,");
        let text = format!("{POD}---\n{other}---\n{POD}");
        std::fs::write(&file, &text).unwrap();
        let key = |name: &str| ObjectKey { kind: Kind::Pod, namespace: "a".into(), name: name.into() };
        // Which documents still hold their object (an object is taken out once).
        let held = |read: &Read| -> Vec<bool> {
            read.changed[&file]
                .iter()
                .map(|d| matches!(d, ParsedDoc::Parsed { result: Ok(Doc::Object { update: Some(_), .. }), .. }))
                .collect()
        };

        // This load's parse of the file.
        let parsed = || Read { changed: BTreeMap::from([(file.clone(), parse_file(&text))]) };

        // The position names the document: the one there is taken.
        let mut read = parsed();
        assert!(object_of(&mut read, &file, &key("q"), 1).is_some());
        assert_eq!(held(&read), [true, false, true]);
        assert!(object_of(&mut read, &file, &key("p"), 0).is_some());
        assert_eq!(held(&read), [false, false, true]);

        // A position that does not hold the key (the file changed since): the first
        // definition, found by key; a key no document holds: nothing.
        let mut read = parsed();
        assert!(object_of(&mut read, &file, &key("p"), 1).is_some());
        assert_eq!(held(&read), [false, true, true]);
        assert!(object_of(&mut read, &file, &key("q"), 7).is_some());
        assert_eq!(held(&read), [false, false, true]);
        assert!(object_of(&mut read, &file, &key("r"), 0).is_none());

        // A file this load did not parse is read from disk.
        let mut read = Read::default();
        assert!(object_of(&mut read, &file, &key("q"), 1).is_some());
        assert_eq!(held(&read), [true, false, true]);
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
        // The same swap seen as a watch sees it: events name only `..data_tmp`, `..data`
        // and the new directory, not `fw.yaml`.
        std::fs::create_dir(d.join("..v3")).unwrap();
        std::fs::write(d.join("..v3/fw.yaml"), GOOD.replace("192.0.2.0/24", "203.0.113.0/24")).unwrap();
        std::os::unix::fs::symlink("..v3", d.join("..data_tmp")).unwrap();
        std::fs::rename(d.join("..data_tmp"), d.join("..data")).unwrap();
        let named = BTreeSet::from([d.join("..v3"), d.join("..data_tmp"), d.join("..data")]);
        assert!(src.load_changed(&named).unwrap().changed);
        assert!(rule_cidr(&src).unwrap().contains("203.0.113.0/24"));
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
    async fn a_rename_into_place_is_sent_at_once_and_an_open_file_waits_for_quiet() {
        use std::io::Write;
        let dir = tempfile::tempdir().unwrap();
        let (tx, mut rx) = mpsc::channel(1);
        let quiet = Duration::from_millis(400);
        let _w = watch(dir.path(), quiet, quiet * 5, tx).unwrap();
        // Written beside, renamed into place: complete, sent well before `quiet`.
        std::fs::write(dir.path().join(".a.yaml.tmp"), GOOD).unwrap();
        let start = std::time::Instant::now();
        std::fs::rename(dir.path().join(".a.yaml.tmp"), dir.path().join("a.yaml")).unwrap();
        // (The hidden file's own write may come as a burst of its own first.)
        loop {
            let change = tokio::time::timeout(Duration::from_secs(5), rx.recv()).await.unwrap().unwrap();
            if change.files.contains(&dir.path().join("a.yaml")) {
                break;
            }
        }
        assert!(start.elapsed() < quiet / 2, "a rename waited {:?}", start.elapsed());
        // A file still open after a write: not sent before `quiet` has passed.
        let mut f = std::fs::File::create(dir.path().join("b.yaml")).unwrap();
        f.write_all(b"apiVersion: v1\n").unwrap();
        f.flush().unwrap();
        let start = std::time::Instant::now();
        let change = tokio::time::timeout(Duration::from_secs(5), rx.recv()).await.unwrap().unwrap();
        assert!(change.files.contains(&dir.path().join("b.yaml")), "{change:?}");
        assert!(start.elapsed() >= quiet - Duration::from_millis(50), "sent while open after {:?}", start.elapsed());
        drop(f);
    }

    #[tokio::test]
    async fn a_rename_within_the_directory_is_sent_without_the_settle_window_and_a_closed_write_after_it() {
        let dir = tempfile::tempdir().unwrap();
        let (tx, mut rx) = mpsc::channel(1);
        let (quiet, settle) = (Duration::from_secs(2), Duration::from_millis(400));
        let _w = watch_settling(dir.path(), quiet, settle, quiet * 5, tx).unwrap();
        std::fs::write(dir.path().join(".a.yaml.tmp"), GOOD).unwrap();
        // The hidden file's write: complete (closed), sent after the settle window.
        let start = std::time::Instant::now();
        let change = tokio::time::timeout(Duration::from_secs(5), rx.recv()).await.unwrap().unwrap();
        assert!(change.files.contains(&dir.path().join(".a.yaml.tmp")), "{change:?}");
        assert!(
            start.elapsed() >= settle - Duration::from_millis(50),
            "a closed write sent after {:?}",
            start.elapsed()
        );
        // Renamed into place: the pairing event ends the action, sent at once.
        let start = std::time::Instant::now();
        std::fs::rename(dir.path().join(".a.yaml.tmp"), dir.path().join("a.yaml")).unwrap();
        let change = tokio::time::timeout(Duration::from_secs(5), rx.recv()).await.unwrap().unwrap();
        assert!(change.files.contains(&dir.path().join("a.yaml")), "{change:?}");
        assert!(change.files.contains(&dir.path().join(".a.yaml.tmp")), "one burst holds both halves: {change:?}");
        assert!(start.elapsed() < settle / 2, "a rename waited {:?}", start.elapsed());
        // Nothing of the rename is left to come as a burst of its own.
        let late = tokio::time::timeout(settle * 2, rx.recv()).await;
        assert!(late.is_err(), "a second burst for one rename: {late:?}");
        // An editor's save that moves the manifest aside and then writes the new one:
        // never sent between the two (the file's objects would be gone for a moment).
        let start = std::time::Instant::now();
        std::fs::rename(dir.path().join("a.yaml"), dir.path().join("a.yaml~")).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        std::fs::write(dir.path().join("a.yaml"), GOOD).unwrap();
        let change = tokio::time::timeout(Duration::from_secs(5), rx.recv()).await.unwrap().unwrap();
        assert!(start.elapsed() >= settle, "sent after {:?}, before the settle window", start.elapsed());
        assert!(change.files.contains(&dir.path().join("a.yaml~")), "{change:?}");
        assert!(change.files.contains(&dir.path().join("a.yaml")), "one burst with the new file: {change:?}");
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
