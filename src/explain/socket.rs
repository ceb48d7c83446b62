//! The running agent answers `egressd explain` on a Unix socket in its state directory
//! (`explain.sock`, mode 0600 in the 0700 directory: root only), with its own view,
//! resolved answers and kernel sets — exactly what it applies, nothing written to disk
//! per change. One JSON [`Query`] line in, one JSON line out (`Ok(Explanation)` or
//! `Err(message)`).

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};

use super::{Explanation, Query};

/// The socket's name in the state directory.
pub const SOCKET: &str = "explain.sock";

/// A query and where its answer goes.
pub type Request = (Query, oneshot::Sender<Result<Explanation, String>>);

/// Longest query line accepted.
const MAX_LINE: u64 = 64 * 1024;

/// Listen on `dir/explain.sock` (replacing a stale one); queries arrive on the returned
/// channel, for the agent loop to answer.
pub fn listen(dir: &Path) -> std::io::Result<mpsc::Receiver<Request>> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
    let path = dir.join(SOCKET);
    match std::fs::remove_file(&path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let listener = tokio::net::UnixListener::bind(&path)?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
    let (tx, rx) = mpsc::channel(16);
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { continue };
            let tx = tx.clone();
            tokio::spawn(async move {
                if let Err(e) = serve_one(stream, tx).await {
                    tracing::debug!(error = %e, "explain query not answered");
                }
            });
        }
    });
    Ok(rx)
}

async fn serve_one(stream: tokio::net::UnixStream, tx: mpsc::Sender<Request>) -> std::io::Result<()> {
    let (read, mut write) = stream.into_split();
    let mut line = String::new();
    tokio::io::AsyncReadExt::take(tokio::io::BufReader::new(read), MAX_LINE).read_line(&mut line).await?;
    let answer: Result<Explanation, String> = match serde_json::from_str::<Query>(&line) {
        Err(e) => Err(format!("bad query: {e}")),
        Ok(q) => {
            let (reply, rx) = oneshot::channel();
            if tx.send((q, reply)).await.is_err() {
                Err("the agent is shutting down".into())
            } else {
                rx.await.unwrap_or_else(|_| Err("the agent did not answer".to_string()))
            }
        }
    };
    let mut out = serde_json::to_vec(&answer).map_err(std::io::Error::other)?;
    out.push(b'\n');
    write.write_all(&out).await
}

/// Ask the agent whose state directory is `dir` (blocking, at most `timeout`).
pub fn ask(dir: &Path, query: &Query, timeout: Duration) -> Result<Explanation, String> {
    let path: PathBuf = dir.join(SOCKET);
    let mut stream = std::os::unix::net::UnixStream::connect(&path).map_err(|e| {
        format!(
            "cannot reach the running agent at {}: {e} (is `egressd run` running with --state-dir {}?)",
            path.display(),
            dir.display()
        )
    })?;
    stream.set_read_timeout(Some(timeout)).map_err(|e| e.to_string())?;
    stream.set_write_timeout(Some(timeout)).map_err(|e| e.to_string())?;
    let mut line = serde_json::to_vec(query).map_err(|e| e.to_string())?;
    line.push(b'\n');
    stream.write_all(&line).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut answer = String::new();
    std::io::BufReader::new(stream).read_line(&mut answer).map_err(|e| format!("{}: {e}", path.display()))?;
    serde_json::from_str::<Result<Explanation, String>>(&answer)
        .map_err(|e| format!("{}: unexpected answer: {e}", path.display()))?
}
