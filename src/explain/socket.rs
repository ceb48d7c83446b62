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
    use std::os::unix::fs::PermissionsExt;
    // The socket is created with the process's umask; in the 0700 directory nobody but
    // root reaches it before its own mode is narrowed too.
    crate::state::private_dir(dir)?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn the_socket_is_root_only_and_answers_one_line_each_way() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        std::fs::create_dir(&state).unwrap();
        std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o755)).unwrap();
        let mut rx = listen(&state).unwrap();
        assert_eq!(mode(&state), 0o700, "a directory created wider is narrowed");
        assert_eq!(mode(&state.join(SOCKET)), 0o600);
        let asked = tokio::spawn(async move {
            let (query, reply) = rx.recv().await.unwrap();
            let _ = reply.send(Err("no such pod".into()));
            query
        });
        let query = Query::parse(Some("team-a/web"), None, "192.0.2.1:443/tcp").unwrap();
        let sent = query.clone();
        let state_dir = state.clone();
        let answer = tokio::task::spawn_blocking(move || ask(&state_dir, &sent, Duration::from_secs(5))).await.unwrap();
        assert_eq!(answer.unwrap_err(), "no such pod");
        assert_eq!(asked.await.unwrap(), query, "the agent got the query as sent");

        // A line that is not a query is answered with why, and reaches nothing.
        let mut stream = tokio::net::UnixStream::connect(state.join(SOCKET)).await.unwrap();
        stream.write_all(b"{\"from\": 1}\n").await.unwrap();
        let mut line = String::new();
        tokio::io::BufReader::new(stream).read_line(&mut line).await.unwrap();
        let answer: Result<Explanation, String> = serde_json::from_str(&line).unwrap();
        assert!(answer.unwrap_err().starts_with("bad query: "), "{line}");
    }
}
