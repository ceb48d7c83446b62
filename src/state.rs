//! The agent's state directory (`--state-dir`): the status file `egressd status` reads
//! and the last good versions of invalid objects ([`crate::view::last_good`]).
//!
//! Every file is written privately and atomically: a new temporary file (mode 0600,
//! created exclusively, never through a symlink), then renamed over the old one, which
//! replaces a symlink planted there instead of following it. The last good versions are
//! synced to disk before the rename (a restart after a crash relies on them); the status
//! file is not (it is written after every sync, and the next sync writes it again: a
//! disk flush per change on every node was I/O wait on the agent's loop). Files are read
//! without following symlinks.

use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::Path;

use crate::view::last_good::{FORMAT, LastGood};

/// The status file.
pub const STATUS_FILE: &str = "status";
/// The last good versions of invalid objects.
pub(crate) const LAST_GOOD_FILE: &str = "last-good.json";

/// Make `dir` (and its missing parents) a private directory: mode 0700. One that exists
/// with a wider mode — the DaemonSet's `hostPath` is created 0755 by the kubelet — is
/// narrowed, so the explain socket and the files in it are reachable by root only
/// whoever created the directory.
pub(crate) fn private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
    let mode = std::fs::metadata(dir)?.permissions().mode();
    if mode & 0o077 != 0 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
        tracing::info!(dir = %dir.display(), was = format!("{:o}", mode & 0o777), "state directory narrowed to 0700");
    }
    Ok(())
}

/// Write `dir/name` privately and atomically (see the module docs).
pub(crate) fn write_private(dir: &Path, name: &str, bytes: &[u8]) -> std::io::Result<()> {
    write_private_as(dir, name, bytes, true)
}

/// [`write_private`], synced to disk before the rename only when `durable`.
pub(crate) fn write_private_as(dir: &Path, name: &str, bytes: &[u8], durable: bool) -> std::io::Result<()> {
    private_dir(dir)?;
    let tmp = dir.join(format!(".{name}.tmp"));
    // A left-over temporary file (or anything planted there) goes first; unlink never
    // follows a symlink.
    match std::fs::remove_file(&tmp) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&tmp)?;
    file.write_all(bytes)?;
    if durable {
        file.sync_all()?;
    }
    std::fs::rename(&tmp, dir.join(name))
}

/// Read `dir/name` without following a symlink; `Ok(None)` when it does not exist.
pub(crate) fn read_private(dir: &Path, name: &str) -> std::io::Result<Option<Vec<u8>>> {
    let file = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW).open(dir.join(name));
    let mut file = match file {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut out = Vec::new();
    file.read_to_end(&mut out)?;
    Ok(Some(out))
}

/// A saved file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub(crate) enum StateError {
    /// It cannot be read (a symlink, say).
    #[error("{path}: {source}")]
    Read {
        /// The file.
        path: std::path::PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// It is not what egressd writes.
    #[error("{path}: {source}")]
    Parse {
        /// The file.
        path: std::path::PathBuf,
        /// The JSON error.
        #[source]
        source: serde_json::Error,
    },
    /// It was written by a version of egressd with another format.
    #[error("{path}: format {found} is not {FORMAT}")]
    Format {
        /// The file.
        path: std::path::PathBuf,
        /// Its format.
        found: u32,
    },
}

/// The saved last good versions (none when there is no file). A file that cannot be
/// read or parsed, or is of another format, is an error the caller logs; nothing is
/// adopted from it.
pub(crate) fn load_last_good(dir: &Path) -> Result<LastGood, StateError> {
    let path = dir.join(LAST_GOOD_FILE);
    let Some(bytes) =
        read_private(dir, LAST_GOOD_FILE).map_err(|source| StateError::Read { path: path.clone(), source })?
    else {
        return Ok(LastGood::default());
    };
    let saved: LastGood =
        serde_json::from_slice(&bytes).map_err(|source| StateError::Parse { path: path.clone(), source })?;
    if saved.format != FORMAT {
        return Err(StateError::Format { path, found: saved.format });
    }
    Ok(saved)
}

/// Save the last good versions.
pub(crate) fn save_last_good(dir: &Path, saved: &LastGood) -> std::io::Result<()> {
    let bytes = serde_json::to_vec_pretty(saved).map_err(std::io::Error::other)?;
    write_private(dir, LAST_GOOD_FILE, &bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn writes_are_private_atomic_and_never_follow_symlinks() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        write_private(&state, "status", b"one").unwrap();
        let meta = std::fs::metadata(state.join("status")).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        assert_eq!(std::fs::metadata(&state).unwrap().permissions().mode() & 0o777, 0o700);

        // A symlink planted at the file or at the temporary name is replaced, and its
        // target is never written.
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "untouched").unwrap();
        std::fs::remove_file(state.join("status")).unwrap();
        std::os::unix::fs::symlink(&victim, state.join("status")).unwrap();
        std::os::unix::fs::symlink(&victim, state.join(".status.tmp")).unwrap();
        write_private(&state, "status", b"two").unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "untouched");
        assert!(!std::fs::symlink_metadata(state.join("status")).unwrap().file_type().is_symlink());
        assert_eq!(std::fs::read_to_string(state.join("status")).unwrap(), "two");

        // Reading refuses a symlink.
        std::fs::remove_file(state.join("status")).unwrap();
        std::os::unix::fs::symlink(&victim, state.join("status")).unwrap();
        assert!(read_private(&state, "status").is_err());
        assert_eq!(read_private(&state, "absent").unwrap(), None);
    }

    #[test]
    fn a_state_directory_created_wider_is_narrowed_to_0700() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        std::fs::create_dir(&state).unwrap();
        std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o755)).unwrap();
        write_private(&state, "status", b"one").unwrap();
        assert_eq!(std::fs::metadata(&state).unwrap().permissions().mode() & 0o777, 0o700);
        std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o750)).unwrap();
        private_dir(&state).unwrap();
        assert_eq!(std::fs::metadata(&state).unwrap().permissions().mode() & 0o777, 0o700);
    }

    #[test]
    fn last_good_round_trips_and_bad_files_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(load_last_good(dir.path()).unwrap(), LastGood::default());
        save_last_good(dir.path(), &LastGood::default()).unwrap();
        assert_eq!(load_last_good(dir.path()).unwrap(), LastGood::default());
        std::fs::write(dir.path().join(LAST_GOOD_FILE), "{not json").unwrap();
        assert!(load_last_good(dir.path()).is_err());
        std::fs::write(dir.path().join(LAST_GOOD_FILE), r#"{"format": 99, "objects": []}"#).unwrap();
        assert!(load_last_good(dir.path()).unwrap_err().to_string().contains("format 99 is not 1"));
    }
}
