//! The DNS proxy (`--dns-mode proxy`): pods' DNS answers are held until the kernel
//! allows what they teach, so a pod's first connection after its own lookup is never
//! dropped (snooping alone copies the answer while the pod already has it).
//!
//! The kernel side is compiled with the snooping rules
//! ([`crate::compile`], chain `dns-proxy`): a snooped pod's query to a trusted server
//! whose guard element lives is taken by `tproxy` and marked, and the rule
//! `fwmark <intercept> lookup <table>` with `local default dev lo` in that table
//! delivers it here. Nothing is translated: the pod's flow is its own
//! (pod → server:53) in conntrack, and the answer leaves from the server's address.
//!
//! * UDP: a transparent listener on [`DnsProxySettings::port`] receives the queries with
//!   their original destination (`IP_ORIGDSTADDR`); the answers leave from one socket
//!   per server bound to the server's address and port 53. Each query goes to the
//!   server unchanged from a socket of its own (its id and the pod's port are kept; the
//!   server sees this node's address).
//! * TCP: a transparent listener on [`DnsProxySettings::port`]; each accepted
//!   connection (its local address is the server's) is relayed over a connection of
//!   its own to the server, message by message.
//! * Every query and answer goes through the same [`Snooper`] as copied ones (the same
//!   trust rules, bounds and CNAME chains); what an answer teaches is added through
//!   [`SnoopHandle::commit`], and the answer is sent to the pod after the kernel
//!   acknowledged it.
//! * Never a single point of failure: the guard elements live
//!   [`PROXY_GUARD_TIMEOUT`] unless this thread refreshes them (every
//!   [`PROXY_GUARD_REFRESH`]). egressd killed: its sockets are gone and `tproxy` finds
//!   none, so queries go to the server at once; egressd hung: the guard expires within
//!   a second. Either way the snoop rules copy the direct queries as before.
//! * A server at an address of this host (a node-local cache) is never taken, and one
//!   whose address becomes this host's is let go ([`release_local`]): its queries stay
//!   direct and snooped.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hickory_proto::op::Message;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};

use crate::dataplane::elements::{Element, ElementWriter};
use crate::dataplane::nflog::SnoopHandle;
use crate::dns::snoop::{Packet, Snooper};
use crate::dns::targets::{DnsProxySettings, PROXY_GUARD_REFRESH, PROXY_GUARD_TIMEOUT};
use crate::telemetry::metrics::{Metrics, ProxyLabels};

mod routing;
mod sockets;

use routing::routing;
pub use routing::{RoutingError, cleanup};
use sockets::*;

/// How long the proxy waits for the server's answer (the pod retries sooner).
const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(5);
/// Most queries of all pods waiting for an answer at once; beyond it a query is not
/// taken (counted `busy`), and the pod retries.
pub(crate) const MAX_IN_FLIGHT: usize = 16_384;
/// Most TCP connections relayed at once.
pub(crate) const MAX_TCP_CONNECTIONS: usize = 1024;
/// A query that waited longer than this in the kernel before the proxy read it means
/// the proxy is overloaded: it lets its guard expire (new queries go direct) until it
/// has worked off what it has.
pub(crate) const OVERLOAD_LAG: Duration = Duration::from_millis(100);
/// An idle TCP connection is closed after this.
const TCP_IDLE: Duration = Duration::from_secs(30);

/// What the proxy's tasks share.
struct Shared {
    handle: SnoopHandle,
    snooper: Mutex<Snooper>,
    writer: Mutex<ElementWriter>,
    telemetry: Arc<crate::telemetry::Telemetry>,
    settings: DnsProxySettings,
    /// The servers whose queries are taken, each with the socket its answers leave from
    /// (bound to the server's address and port 53). A server whose address becomes one
    /// of this host's is let go ([`release_local`]).
    taken: std::sync::RwLock<std::collections::HashMap<IpAddr, Arc<UdpSocket>>>,
    in_flight: std::sync::atomic::AtomicUsize,
    tcp_connections: std::sync::atomic::AtomicUsize,
    /// How long the last UDP query read had waited in the kernel, and when it was read.
    lag: Mutex<Option<(Duration, Instant)>>,
}

fn count(metrics: &Metrics, transport: &'static str, result: &'static str) {
    metrics.dns_proxied.get_or_create(&ProxyLabels { transport, result }).inc();
}

/// Start the proxy on a thread of its own (its own runtime: an agent busy syncing never
/// delays an answer, and a hung proxy stops refreshing its guard). Returns the servers
/// it took; the others stay snooped only.
pub(crate) fn start(
    handle: SnoopHandle,
    servers: &[IpAddr],
    settings: DnsProxySettings,
    table: &str,
    telemetry: Arc<crate::telemetry::Telemetry>,
) -> std::io::Result<Vec<IpAddr>> {
    let mut udp = Vec::new();
    for server in servers {
        if is_local(*server) {
            tracing::info!(server = %server, "DNS proxy: a server on this node is not taken (its queries stay snooped)");
            continue;
        }
        match transparent_udp(*server, settings.answer_mark()) {
            Ok(s) => udp.push((*server, s)),
            Err(e) => tracing::warn!(
                server = %server,
                error = %e,
                "DNS proxy: cannot take this server's queries (a DNS server of this host?); they stay snooped"
            ),
        }
    }
    let taken: Vec<IpAddr> = udp.iter().map(|(s, _)| *s).collect();
    let families: Vec<bool> = [false, true].into_iter().filter(|v6| taken.iter().any(|s| s.is_ipv6() == *v6)).collect();
    let tcp = families
        .iter()
        .map(|v6| transparent_listener(*v6, settings.port, settings.answer_mark()))
        .collect::<std::io::Result<Vec<_>>>()?;
    let udp_in =
        families.iter().map(|v6| transparent_udp_listener(*v6, settings.port)).collect::<std::io::Result<Vec<_>>>()?;
    let shared = Arc::new(Shared {
        handle,
        snooper: Mutex::new(Snooper::new()),
        writer: Mutex::new(ElementWriter::open(table)?),
        telemetry,
        settings,
        taken: Default::default(),
        in_flight: Default::default(),
        tcp_connections: Default::default(),
        lag: Mutex::new(None),
    });
    let guard_writer = ElementWriter::open(table)?;
    let guard: Vec<Element> =
        taken.iter().map(|ip| (DnsProxySettings::guard_slot(ip.is_ipv6()), *ip, PROXY_GUARD_TIMEOUT)).collect();
    std::thread::Builder::new().name("egressd-dns-proxy".into()).spawn(move || {
        let _span = tracing::info_span!("dns_proxy").entered();
        let _alive = crate::telemetry::DeadOnExit { telemetry: shared.telemetry.clone(), component: "dns_proxy" };
        let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(error = %e, "DNS proxy: no runtime");
                return;
            }
        };
        runtime.block_on(run(shared, Sockets { udp_in, udp_out: udp, tcp }, guard, guard_writer));
    })?;
    Ok(taken)
}

/// The proxy's sockets.
struct Sockets {
    /// The transparent UDP listeners `tproxy` hands queries to (one per family).
    udp_in: Vec<std::net::UdpSocket>,
    /// Per server: the socket answers leave from (bound to the server's address, 53).
    udp_out: Vec<(IpAddr, std::net::UdpSocket)>,
    /// The transparent TCP listeners (one per family).
    tcp: Vec<std::net::TcpListener>,
}

async fn run(shared: Arc<Shared>, sockets: Sockets, guard: Vec<Element>, guard_writer: ElementWriter) {
    if let Err(e) = routing(&shared.settings).await {
        tracing::error!(error = %e, "DNS proxy: the routing of taken queries could not be set up; queries stay snooped");
        return;
    }
    let mut tasks = tokio::task::JoinSet::new();
    for (server, socket) in sockets.udp_out {
        match (UdpSocket::from_std(socket), shared.taken.write()) {
            (Ok(s), Ok(mut taken)) => {
                taken.insert(server, Arc::new(s));
            }
            (Err(e), _) => tracing::error!(error = %e, "DNS proxy: socket"),
            (_, Err(_)) => {}
        }
    }
    for socket in sockets.udp_in {
        match UdpSocket::from_std(socket) {
            Ok(s) => {
                tasks.spawn(serve_udp(shared.clone(), s));
            }
            Err(e) => tracing::error!(error = %e, "DNS proxy: socket"),
        }
    }
    for listener in sockets.tcp {
        match TcpListener::from_std(listener) {
            Ok(l) => {
                tasks.spawn(serve_tcp(shared.clone(), l));
            }
            Err(e) => tracing::error!(error = %e, "DNS proxy: listener"),
        }
    }
    tracing::info!(
        servers = guard.len(),
        port = shared.settings.port,
        "DNS proxy on: answers are held until the kernel allows what they teach"
    );
    tasks.spawn(refresh_guard(shared.clone(), guard, guard_writer));
    // Every task runs for ever; one that ends is an error, and the proxy stops (its
    // guard expires, queries go direct and are snooped).
    if let Some(ended) = tasks.join_next().await {
        tracing::error!(?ended, "DNS proxy stopped");
    }
}

/// Keep the guard elements alive while this thread runs.
///
/// Not while the proxy is overloaded (the last query it read had waited more than
/// [`OVERLOAD_LAG`] in the kernel, and it read one in the last tick): the guard is left
/// to expire, new queries go to the servers directly (snooped) and the proxy works off
/// what it has; once nothing waits, it takes queries again.
async fn refresh_guard(shared: Arc<Shared>, mut guard: Vec<Element>, mut writer: ElementWriter) -> std::io::Result<()> {
    let mut tick = tokio::time::interval(PROXY_GUARD_REFRESH);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failing = false;
    let mut overloaded = false;
    // Until when the elements last written live (a margin before it: they may be gone).
    let mut alive_until: Option<Instant> = None;
    loop {
        tick.tick().await;
        release_local(&shared, &mut guard, &mut writer);
        let lag = shared.lag.lock().map(|l| *l).unwrap_or_default();
        if lag.is_some_and(|(waited, read_at)| waited > OVERLOAD_LAG && read_at.elapsed() < PROXY_GUARD_REFRESH) {
            if !overloaded {
                tracing::warn!(
                    waited_ms = lag.map(|l| l.0.as_millis()),
                    "DNS proxy overloaded: queries go to the servers directly (snooped) until it catches up"
                );
                count(&shared.telemetry.metrics, "udp", "overloaded");
            }
            overloaded = true;
            continue;
        } else if overloaded {
            tracing::info!("DNS proxy caught up: taking queries again");
            overloaded = false;
        }
        let now = Instant::now();
        let alive = alive_until.is_some_and(|t| t > now + Duration::from_millis(50));
        match shared.handle.refresh_guard(&guard, alive, &mut writer) {
            Ok(()) => {
                alive_until = Some(now + PROXY_GUARD_TIMEOUT);
                if failing {
                    tracing::info!("DNS proxy: guard elements refreshed again");
                    failing = false;
                }
            }
            // No set yet (no dnsName rule, or the first sync is not done): nothing to take.
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => alive_until = None,
            Err(e) => {
                alive_until = None;
                if !failing {
                    tracing::warn!(error = %e, "DNS proxy: refreshing the guard failed (queries go direct meanwhile)");
                }
                failing = true;
            }
        }
    }
}

/// Let go of every taken server whose address has become one of this host's (a
/// node-local DNS cache adds its address when it starts, maybe after egressd): its
/// answer socket is closed at once, so the server can bind its port 53, and its guard
/// element is deleted, so its queries are delivered to it (and snooped).
fn release_local(shared: &Shared, guard: &mut Vec<Element>, writer: &mut ElementWriter) {
    let local: Vec<IpAddr> = match shared.taken.read() {
        Ok(taken) => taken.keys().copied().filter(|ip| is_local(*ip)).collect(),
        Err(_) => return,
    };
    for server in local {
        if let Ok(mut taken) = shared.taken.write() {
            taken.remove(&server);
        }
        let (gone, kept): (Vec<Element>, Vec<Element>) = guard.iter().partition(|(_, ip, _)| *ip == server);
        *guard = kept;
        let delta =
            crate::nft::delta::ElementDelta { delete: crate::dataplane::elements::by_set(&gone), add: Vec::new() };
        if let Err(e) = writer.apply(&delta)
            && e.raw_os_error() != Some(libc::ENOENT)
        {
            tracing::warn!(server = %server, error = %e, "DNS proxy: the released server's guard element was not deleted (it expires within a second)");
        }
        count(&shared.telemetry.metrics, "udp", "released");
        tracing::warn!(server = %server, "DNS proxy: this server's address is now one of this node's; its queries are left to it (snooped)");
    }
}

/// A guard against more than the bound in flight.
struct InFlight<'a>(&'a std::sync::atomic::AtomicUsize);

impl<'a> InFlight<'a> {
    fn take(counter: &'a std::sync::atomic::AtomicUsize, max: usize) -> Option<Self> {
        let before = counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if before >= max {
            counter.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
            return None;
        }
        Some(Self(counter))
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

async fn serve_udp(shared: Arc<Shared>, socket: UdpSocket) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let mut buf = vec![0u8; 65_536];
    loop {
        let Received { len: n, from: pod, orig, waited } =
            socket.async_io(tokio::io::Interest::READABLE, || recv_orig(socket.as_raw_fd(), &mut buf)).await?;
        if let (Some(waited), Ok(mut lag)) = (waited, shared.lag.lock()) {
            *lag = Some((waited, Instant::now()));
        }
        // Only queries to a taken server are handed here (the guard holds no other).
        let Some(server) = orig.map(|o| o.ip()).filter(|ip| shared.is_taken(ip)) else {
            count(&shared.telemetry.metrics, "udp", "not_taken");
            continue;
        };
        let query = buf[..n].to_vec();
        tokio::spawn(udp_query(shared.clone(), server, pod, query));
    }
}

/// One UDP query: to the server unchanged, its answer held until the kernel took
/// what it teaches, then to the pod from the server's address.
async fn udp_query(shared: Arc<Shared>, server: IpAddr, pod: SocketAddr, query: Vec<u8>) {
    let metrics = &shared.telemetry.metrics;
    let Some(_slot) = InFlight::take(&shared.in_flight, MAX_IN_FLIGHT) else {
        count(metrics, "udp", "busy");
        return;
    };
    if !shared.query(pod, server, false, &query) {
        count(metrics, "udp", "busy");
        return;
    }
    let answer = tokio::time::timeout(UPSTREAM_TIMEOUT, ask_udp(server, &query)).await;
    let answer = match answer {
        Ok(Ok(a)) => a,
        Ok(Err(e)) => {
            tracing::debug!(error = %e, server = %server, "DNS proxy: upstream");
            count(metrics, "udp", "upstream_error");
            return;
        }
        Err(_) => {
            count(metrics, "udp", "upstream_timeout");
            return;
        }
    };
    shared.answer(pod, server, false, &answer);
    // The answer socket is looked up now, not held: a released server's port is free
    // at once (this answer is then dropped; the pod asks again).
    let Some(socket) = shared.taken.read().ok().and_then(|t| t.get(&server).cloned()) else {
        count(metrics, "udp", "released");
        return;
    };
    match socket.send_to(&answer, pod).await {
        Ok(_) => count(metrics, "udp", "answered"),
        Err(_) => count(metrics, "udp", "pod_gone"),
    }
}

/// Ask `server` over UDP from a socket of this query's own; the first datagram with the
/// query's id is the answer. No buffer is held while the query waits: a datagram's
/// size is peeked when it arrives and a buffer of that size taken for it (a waiting
/// query costs its task and socket, not 64 KiB each).
async fn ask_udp(server: IpAddr, query: &[u8]) -> std::io::Result<Vec<u8>> {
    let any: IpAddr = if server.is_ipv6() { Ipv6Addr::UNSPECIFIED.into() } else { Ipv4Addr::UNSPECIFIED.into() };
    let up = UdpSocket::bind(SocketAddr::new(any, 0)).await?;
    up.connect(SocketAddr::new(server, 53)).await?;
    up.send(query).await?;
    loop {
        let size = up
            .async_io(tokio::io::Interest::READABLE, || {
                let mut probe = [std::mem::MaybeUninit::<u8>::uninit(); 1];
                socket2::SockRef::from(&up).recv_with_flags(&mut probe, libc::MSG_PEEK | libc::MSG_TRUNC)
            })
            .await?;
        let mut buf = vec![0u8; size.max(1)];
        let n = up.recv(&mut buf).await?;
        if n >= 2 && query.len() >= 2 && buf[..2] == query[..2] {
            buf.truncate(n);
            return Ok(buf);
        }
    }
}

async fn serve_tcp(shared: Arc<Shared>, listener: TcpListener) -> std::io::Result<()> {
    loop {
        let (pod_stream, pod) = listener.accept().await?;
        let shared = shared.clone();
        tokio::spawn(async move {
            let Some(_slot) = InFlight::take(&shared.tcp_connections, MAX_TCP_CONNECTIONS) else {
                count(&shared.telemetry.metrics, "tcp", "busy");
                return;
            };
            // Only what `tproxy` handed over: a connection to a taken server's port 53
            // (anything reaching the listener's own port is closed).
            let server = pod_stream.local_addr().ok().filter(|a| a.port() == 53 && shared.is_taken(&a.ip()));
            let Some(server) = server.map(|a| a.ip()) else {
                count(&shared.telemetry.metrics, "tcp", "not_taken");
                return;
            };
            if let Err(e) = relay_tcp(&shared, pod_stream, pod, server).await {
                tracing::debug!(error = %e, pod = %pod, "DNS proxy: TCP connection ended");
            }
        });
    }
}

/// Read one length-prefixed DNS message (`None` at the end of the stream).
async fn read_message(r: &mut (impl AsyncReadExt + Unpin)) -> std::io::Result<Option<Vec<u8>>> {
    let mut len = [0u8; 2];
    match r.read_exact(&mut len).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let mut body = vec![0u8; usize::from(u16::from_be_bytes(len))];
    r.read_exact(&mut body).await?;
    Ok(Some(body))
}

async fn write_message(w: &mut (impl AsyncWriteExt + Unpin), body: &[u8]) -> std::io::Result<()> {
    let mut framed = Vec::with_capacity(body.len() + 2);
    framed.extend((body.len() as u16).to_be_bytes());
    framed.extend(body);
    w.write_all(&framed).await
}

/// Relay one pod's TCP connection over one of the proxy's own, message by message.
async fn relay_tcp(shared: &Shared, pod_stream: TcpStream, pod: SocketAddr, server: IpAddr) -> std::io::Result<()> {
    socket2::SockRef::from(&pod_stream).set_mark(shared.settings.answer_mark())?;
    let up = tokio::time::timeout(UPSTREAM_TIMEOUT, TcpStream::connect(SocketAddr::new(server, 53)))
        .await
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??;
    let (mut pod_r, mut pod_w) = pod_stream.into_split();
    let (mut up_r, mut up_w) = up.into_split();
    let queries = async {
        while let Some(q) = tokio::time::timeout(TCP_IDLE, read_message(&mut pod_r))
            .await
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??
        {
            if !shared.query(pod, server, true, &q) {
                count(&shared.telemetry.metrics, "tcp", "busy");
                continue;
            }
            write_message(&mut up_w, &q).await?;
        }
        up_w.shutdown().await
    };
    let answers = async {
        while let Some(a) = tokio::time::timeout(TCP_IDLE, read_message(&mut up_r))
            .await
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??
        {
            shared.answer(pod, server, true, &a);
            match write_message(&mut pod_w, &a).await {
                Ok(()) => count(&shared.telemetry.metrics, "tcp", "answered"),
                Err(e) => {
                    count(&shared.telemetry.metrics, "tcp", "pod_gone");
                    return Err(e);
                }
            }
        }
        pod_w.shutdown().await
    };
    let (q, a) = tokio::join!(queries, answers);
    q.and(a)
}

impl Shared {
    /// Whether `server`'s queries are taken.
    fn is_taken(&self, server: &IpAddr) -> bool {
        self.taken.read().is_ok_and(|t| t.contains_key(server))
    }

    /// Track a pod's query (as a copied one is tracked); `false`: the pod has
    /// [`crate::dns::snoop::MAX_PENDING_PER_POD`] queries waiting, this one is not taken.
    fn query(&self, pod: SocketAddr, server: IpAddr, tcp: bool, body: &[u8]) -> bool {
        let metrics = &self.telemetry.metrics;
        let packet = packet(pod, server, tcp, body, true);
        let result = match Message::from_vec(body) {
            Ok(msg) => self.snooper.lock().map_or(Ok(()), |mut s| s.query_message(&packet, &msg, Instant::now())),
            Err(_) => Err(crate::dns::snoop::Ignored::Malformed),
        };
        let label = match result {
            Ok(()) => "query",
            Err(why) => why.as_str(),
        };
        metrics.dns_snooped.get_or_create(&crate::telemetry::metrics::SnoopLabels { result: label.into() }).inc();
        !matches!(result, Err(crate::dns::snoop::Ignored::PodPendingFull))
    }

    /// What the server's answer teaches, in the kernel before this returns.
    fn answer(&self, pod: SocketAddr, server: IpAddr, tcp: bool, body: &[u8]) {
        let metrics = &self.telemetry.metrics;
        let start = Instant::now();
        let packet = packet(pod, server, tcp, body, false);
        let learned = match Message::from_vec(body) {
            Ok(msg) => self
                .snooper
                .lock()
                .map_err(|_| crate::dns::snoop::Ignored::Malformed)
                .and_then(|mut s| s.answer_message(&packet, &msg, start)),
            Err(_) => Err(crate::dns::snoop::Ignored::Malformed),
        };
        match learned {
            Ok(learned) => {
                let elements = self.handle.elements(&learned);
                if let Ok(mut writer) = self.writer.lock() {
                    self.handle.commit(elements, start, &mut writer, metrics);
                }
            }
            Err(why) => {
                metrics
                    .dns_snooped
                    .get_or_create(&crate::telemetry::metrics::SnoopLabels { result: why.as_str().into() })
                    .inc();
            }
        }
        metrics.dns_proxy_hold.observe(start.elapsed().as_secs_f64());
    }
}

/// The packet a copy of this message would have been: `query` from the pod to the
/// server, else the answer back.
fn packet(pod: SocketAddr, server: IpAddr, tcp: bool, body: &[u8], query: bool) -> Packet<'_> {
    let (src, dst, sport, dport) =
        if query { (pod.ip(), server, pod.port(), 53) } else { (server, pod.ip(), 53, pod.port()) };
    Packet { src, dst, sport, dport, tcp, seq: 0, syn: false, payload: body }
}
