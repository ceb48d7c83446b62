//! The EgressIP health check: every agent answers on `--egress-ip-health-port` (TCP,
//! default 9107 like the reference's `egressip-node-healthcheck-port`), the leader
//! probes.
//!
//! Protocol: the agent accepts a connection, writes `ok\n` when it is live (the same
//! check as `/healthz`) or `fail\n` when not, and closes. Nothing else is said, nothing
//! is read: the port reveals that egressd runs and is well, no more. A probe succeeds
//! when `ok\n` arrives within the timeout; a refused connection, a timeout (the node's
//! link is down, the node is off) or `fail` is a miss.

use std::net::{Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::telemetry::Telemetry;

/// The reply of a live agent.
const OK: &[u8] = b"ok\n";

/// Bind the health port on every address of the node (IPv6 socket accepting IPv4 too,
/// or IPv4 only where IPv6 is disabled).
pub fn bind(port: u16) -> std::io::Result<TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let v6 = || -> std::io::Result<Socket> {
        let s = Socket::new(Domain::IPV6, Type::STREAM, Some(Protocol::TCP))?;
        s.set_only_v6(false)?;
        s.set_reuse_address(true)?;
        s.bind(&SocketAddr::from((Ipv6Addr::UNSPECIFIED, port)).into())?;
        Ok(s)
    };
    let socket = match v6() {
        Ok(s) => s,
        Err(_) => {
            let s = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP))?;
            s.set_reuse_address(true)?;
            s.bind(&SocketAddr::from(([0, 0, 0, 0], port)).into())?;
            s
        }
    };
    socket.listen(128)?;
    socket.set_nonblocking(true)?;
    TcpListener::from_std(socket.into())
}

/// Answer probes until the task is dropped.
pub async fn serve(listener: TcpListener, telemetry: Arc<Telemetry>) {
    loop {
        let Ok((mut stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let live = telemetry.health.liveness().is_ok();
        tokio::spawn(async move {
            let reply: &[u8] = if live { OK } else { b"fail\n" };
            let _ = tokio::time::timeout(Duration::from_secs(1), stream.write_all(reply)).await;
        });
    }
}

/// One probe of `addr`: `true` when the agent there answered `ok` within `timeout`.
pub async fn probe(addr: SocketAddr, timeout: Duration) -> bool {
    let attempt = async {
        let mut stream = TcpStream::connect(addr).await.ok()?;
        let mut buf = [0u8; 3];
        stream.read_exact(&mut buf).await.ok()?;
        Some(buf == OK)
    };
    matches!(tokio::time::timeout(timeout, attempt).await, Ok(Some(true)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_live_agent_answers_and_a_closed_port_or_dead_agent_does_not() {
        let telemetry = Arc::new(Telemetry::default());
        let listener = bind(0).unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = tokio::spawn(serve(listener, telemetry.clone()));
        let t = Duration::from_millis(500);
        assert!(probe(SocketAddr::from(([127, 0, 0, 1], port)), t).await, "IPv4 on the dual-stack socket");
        assert!(probe(SocketAddr::from((Ipv6Addr::LOCALHOST, port)), t).await);
        telemetry.health.set_dead("test", "stopped");
        assert!(!probe(SocketAddr::from(([127, 0, 0, 1], port)), t).await, "a dead agent says fail");
        server.abort();
        let _ = server.await;
        assert!(!probe(SocketAddr::from(([127, 0, 0, 1], port)), t).await, "nobody listens");
    }
}
