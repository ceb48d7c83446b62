//! The documents of the manifest files: each as parsed ([`ParsedDoc`], [`Doc`]), what
//! the parse cache keeps of it ([`DocSummary`] in a [`FileEntry`]), and where each
//! object is defined ([`DefIndex`]).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use super::DocumentError;
use crate::api::parse::{Parsed, split_documents, yaml_to_value};
use crate::api::{ObjectKey, parse_document};
use crate::view::Update;

/// One document of a file, as parsed.
#[derive(Debug, Clone)]
#[allow(clippy::large_enum_variant)] // short-lived: only while a changed file is applied
pub(super) enum ParsedDoc {
    /// Not YAML.
    Unreadable { number: usize, line: usize, error: crate::api::parse::YamlError },
    /// Parsed (or rejected with a known or unknown key).
    Parsed { number: usize, line: usize, result: Result<Doc, crate::api::ParseError> },
}

/// A parsed document: an object already in the view's form (taken out when the view
/// gets it), or a kind egressd does not read. Not the parsed object itself: a load of
/// every file holds one of these per document at once.
#[derive(Debug, Clone)]
#[allow(clippy::large_enum_variant)] // nearly every document is an object
pub(super) enum Doc {
    Object { key: ObjectKey, update: Option<Update> },
    Ignored { api_version: String, kind: String },
}

/// What the parse cache keeps of a document: where it is and what it names or why it
/// was refused — never the object itself (the view holds what egressd uses of it).
#[derive(Debug, Clone)]
pub(super) enum DocSummary {
    /// Not YAML.
    Unreadable { number: usize, line: usize, error: crate::api::parse::YamlError },
    /// A kind egressd does not read.
    Ignored { number: usize, what: String },
    /// An object.
    Object { number: usize, line: usize, key: ObjectKey },
    /// A refused document, with its object when known.
    Rejected { number: usize, line: usize, key: Option<ObjectKey>, message: String },
}

/// The error of a document that defines an object again (`first` is where it was).
pub(super) fn duplicate(
    file: &Path,
    number: usize,
    line: usize,
    key: &ObjectKey,
    first: (&Path, usize),
) -> DocumentError {
    DocumentError {
        file: file.to_path_buf(),
        document: number,
        line,
        key: Some(key.clone()),
        message: format!(
            "duplicate object: already defined in {} document {}; this copy is ignored",
            first.0.display(),
            first.1
        ),
    }
}

impl DocSummary {
    /// The error this document reports by itself (not YAML, or refused), in `file`.
    pub(super) fn error(&self, file: &Path) -> Option<DocumentError> {
        let (document, line, key, message) = match self {
            Self::Unreadable { number, line, error } => (*number, *line, None, error.to_string()),
            Self::Rejected { number, line, key, message } => (*number, *line, key.clone(), message.clone()),
            _ => return None,
        };
        Some(DocumentError { file: file.to_path_buf(), document, line, key, message })
    }

    /// A refused document's error as its object's status gives it: where the bad version
    /// is, then the fields (no key: the status is the object's own).
    pub(super) fn located(&self, file: &Path) -> String {
        let mut e = self.error(file).unwrap_or_else(|| DocumentError {
            file: file.to_path_buf(),
            document: self.number(),
            line: 0,
            key: None,
            message: String::new(),
        });
        e.key = None;
        e.to_string()
    }

    /// What an ignored document is (`file document n: apiVersion/kind`).
    pub(super) fn ignored(&self, file: &Path) -> Option<String> {
        match self {
            Self::Ignored { number, what } => Some(format!("{} document {number}: {what}", file.display())),
            _ => None,
        }
    }

    /// The document's 1-based number in its file.
    pub(super) fn number(&self) -> usize {
        match self {
            Self::Unreadable { number, .. }
            | Self::Ignored { number, .. }
            | Self::Object { number, .. }
            | Self::Rejected { number, .. } => *number,
        }
    }

    pub(super) fn of(doc: &ParsedDoc) -> Self {
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
pub(super) struct FileEntry {
    pub(super) len: usize,
    pub(super) hash: u64,
    pub(super) docs: Vec<DocSummary>,
}

pub(super) fn text_hash(text: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    text.hash(&mut h);
    h.finish()
}

/// Every definition of each object (a document naming it, good or refused), in file
/// and document order: the first one counts, later ones are duplicates.
#[derive(Debug, Default)]
pub(super) struct DefIndex {
    pub(super) defs: BTreeMap<ObjectKey, Vec<(PathBuf, usize)>>,
    /// Objects defined more than once (usually none).
    pub(super) multi: BTreeSet<ObjectKey>,
    /// Documents that are not YAML, in all files: while there are any, objects cannot be
    /// told apart from them and every load collects everything.
    pub(super) unreadable_docs: usize,
}

impl DefIndex {
    /// The keys of `entry`'s documents with their positions.
    pub(super) fn keys(entry: &FileEntry) -> impl Iterator<Item = (&ObjectKey, usize)> {
        entry.docs.iter().enumerate().filter_map(|(i, d)| match d {
            DocSummary::Object { key, .. } | DocSummary::Rejected { key: Some(key), .. } => Some((key, i)),
            _ => None,
        })
    }

    pub(super) fn unreadable(entry: &FileEntry) -> usize {
        entry.docs.iter().filter(|d| matches!(d, DocSummary::Unreadable { .. })).count()
    }

    /// Forget what `file` defined (its cache entry `old`).
    pub(super) fn remove(&mut self, file: &Path, old: &FileEntry) {
        self.unreadable_docs -= Self::unreadable(old);
        for (key, _) in Self::keys(old) {
            if let Some(defs) = self.defs.get_mut(key) {
                defs.retain(|(f, _)| f != file);
                match defs.len() {
                    0 => {
                        self.defs.remove(key);
                        self.multi.remove(key);
                    }
                    1 => {
                        self.multi.remove(key);
                    }
                    _ => {}
                }
            }
        }
    }

    /// Note what `file` defines (its cache entry `new`).
    pub(super) fn add(&mut self, file: &Path, new: &FileEntry) {
        self.unreadable_docs += Self::unreadable(new);
        for (key, i) in Self::keys(new) {
            let defs = self.defs.entry(key.clone()).or_default();
            let at = defs.partition_point(|(f, n)| (f.as_path(), *n) < (file, i));
            defs.insert(at, (file.to_path_buf(), i));
            if defs.len() > 1 {
                self.multi.insert(key.clone());
            }
        }
    }

    /// The first definition of `key`: its file and document position.
    pub(super) fn first(&self, key: &ObjectKey) -> Option<(&PathBuf, usize)> {
        self.defs.get(key)?.first().map(|(f, i)| (f, *i))
    }
}

pub(super) fn parse_file(text: &str) -> Vec<ParsedDoc> {
    split_documents(text)
        .into_iter()
        .map(|(number, line, body)| match yaml_to_value(&body) {
            Ok(value) => {
                let result = parse_document(&value, "default", true).map(|parsed| match parsed {
                    Parsed::Object(o) => {
                        let update = Update::of(&o);
                        Doc::Object { key: update.key().clone(), update: Some(update) }
                    }
                    Parsed::Ignored { api_version, kind } => Doc::Ignored { api_version, kind },
                });
                ParsedDoc::Parsed { number, line, result }
            }
            Err(error) => ParsedDoc::Unreadable { number, line, error },
        })
        .collect()
}
