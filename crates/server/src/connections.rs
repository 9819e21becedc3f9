//! The server's connections, from accept to close. HTTP itself is hyper's (HTTP/1.1 through
//! hyper-util's Tokio glue); this module watches the bytes go by, counts connections, and
//! closes what overstays:
//!
//! - **Caps.** At most `max` connections at once, and `per_peer` from one peer (an IPv4
//!   address or an IPv6 /64; a trusted proxy is not capped per peer). At the global cap the
//!   connection that has waited longest without a whole request head is shed — never one
//!   with a request in progress or a stream; with none to shed, the new connection is
//!   answered 503 with `Retry-After`, its request unread. Past a peer's cap, 429.
//! - **Timeouts.** A request head must arrive whole within `header_timeout` of its first
//!   byte. A body must keep coming: nothing for `header_timeout`, or less than
//!   `body_rate_min` bytes a second on average once `header_timeout` has passed, closes the
//!   connection. Between requests a connection is closed after `idle_timeout`. A client that
//!   reads nothing of a response for `write_timeout` is dropped. A response the server is
//!   producing (an event stream, an MCP stream, a replay) is never timed out while the
//!   client reads it.
//!
//! One sweeper looks at every connection five times a second; a connection closed by it is
//! dropped, which closes its socket.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::http::Request;
use baton_engine::cancel::CancelToken;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tower_service::Service;

use crate::metrics::Metrics;
use crate::peers::{Client, PeerKey};
use crate::settings::ConnectionLimits as Limits;

/// The longest request head hyper buffers; a longer one is refused with 431.
const HEAD_BYTES_MAX: usize = 64 * 1024;
/// Refusals (503, 429) being written at once; past it a refused connection is just closed.
const REFUSING_MAX: usize = 256;
/// How long a refused connection is given to take its answer.
const REFUSAL_LINGER: Duration = Duration::from_secs(1);
/// How long the server waits for requests in progress when it stops.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// No request in progress and no byte of the next one yet.
const IDLE: u8 = 0;
/// Bytes of a request head have come, not all of it.
const HEAD: u8 = 1;
/// A request is in progress: its body, its handler or its response.
const REQUEST: u8 = 2;

/// What the sweeper and the accept loop know of one connection. Times are milliseconds
/// since the registry's epoch, plus one (zero: never).
#[derive(Debug)]
struct Watch {
    peer: PeerKey,
    capped: bool,
    phase: AtomicU8,
    waiting_since: AtomicU64,
    head_since: AtomicU64,
    last_read: AtomicU64,
    body_open: AtomicBool,
    body_since: AtomicU64,
    body_bytes: AtomicU64,
    write_stalled_since: AtomicU64,
    close: CancellationToken,
}

/// The open connections.
#[derive(Debug)]
struct Registry {
    epoch: Instant,
    limits: Limits,
    open: Mutex<Open>,
    refusing: AtomicUsize,
    metrics: Arc<Metrics>,
}

#[derive(Debug, Default)]
struct Open {
    next: u64,
    conns: HashMap<u64, Arc<Watch>>,
    per_peer: HashMap<PeerKey, usize>,
}

/// Why a connection was not taken.
#[derive(Clone, Copy, Debug)]
enum Refused {
    Full,
    PeerFull(PeerKey),
}

impl Registry {
    fn now(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX - 1) + 1
    }

    /// Takes a connection from `addr` in, shedding the longest-waiting one without a whole
    /// request head when the server is full.
    fn admit(&self, addr: SocketAddr) -> Result<(u64, Arc<Watch>), Refused> {
        let peer = PeerKey::of(addr.ip());
        let capped = !crate::peers::trusted(addr.ip(), &self.limits.trusted_proxies);
        let now = self.now();
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        if capped && open.per_peer.get(&peer).copied().unwrap_or(0) >= self.limits.per_peer {
            return Err(Refused::PeerFull(peer));
        }
        if open.conns.len() >= self.limits.max {
            let oldest = open
                .conns
                .iter()
                .filter(|(_, w)| w.phase.load(Ordering::Relaxed) != REQUEST)
                .min_by_key(|(_, w)| w.waiting_since.load(Ordering::Relaxed))
                .map(|(id, _)| *id);
            let Some(oldest) = oldest else { return Err(Refused::Full) };
            if let Some(shed) = Self::forget(&mut open, oldest) {
                shed.close.cancel();
                self.metrics.connection_closed("shed");
            }
        }
        let watch = Arc::new(Watch {
            peer,
            capped,
            phase: AtomicU8::new(IDLE),
            waiting_since: AtomicU64::new(now),
            head_since: AtomicU64::new(0),
            last_read: AtomicU64::new(now),
            body_open: AtomicBool::new(false),
            body_since: AtomicU64::new(0),
            body_bytes: AtomicU64::new(0),
            write_stalled_since: AtomicU64::new(0),
            close: CancellationToken::new(),
        });
        open.next += 1;
        let id = open.next;
        open.conns.insert(id, Arc::clone(&watch));
        if capped {
            *open.per_peer.entry(peer).or_insert(0) += 1;
        }
        self.metrics.connections_open(open.conns.len());
        Ok((id, watch))
    }

    /// Drops a connection from the counts; `None` when it was gone already (shed).
    fn forget(open: &mut Open, id: u64) -> Option<Arc<Watch>> {
        let watch = open.conns.remove(&id)?;
        if watch.capped
            && let Some(n) = open.per_peer.get_mut(&watch.peer)
        {
            *n -= 1;
            if *n == 0 {
                open.per_peer.remove(&watch.peer);
            }
        }
        Some(watch)
    }

    fn closed(&self, id: u64) {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        Self::forget(&mut open, id);
        self.metrics.connections_open(open.conns.len());
    }

    fn len(&self) -> usize {
        self.open.lock().unwrap_or_else(PoisonError::into_inner).conns.len()
    }

    /// Closes every connection past one of its timeouts.
    fn sweep(&self) {
        let now = self.now();
        let l = &self.limits;
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        let (head, idle, write) = (ms(l.header_timeout), ms(l.idle_timeout), ms(l.write_timeout));
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let mut late = Vec::new();
        for (id, w) in &open.conns {
            let since = |a: &AtomicU64| now.saturating_sub(a.load(Ordering::Relaxed));
            let stalled = w.write_stalled_since.load(Ordering::Relaxed);
            let why = match w.phase.load(Ordering::Relaxed) {
                _ if stalled != 0 && now.saturating_sub(stalled) > write => Some("write_timeout"),
                IDLE if since(&w.waiting_since) > idle => Some("idle_timeout"),
                HEAD if since(&w.head_since) > head => Some("header_timeout"),
                REQUEST if w.body_open.load(Ordering::Relaxed) => {
                    let elapsed = since(&w.body_since);
                    let bytes = w.body_bytes.load(Ordering::Relaxed);
                    let owed = l.body_rate_min.saturating_mul(elapsed.saturating_sub(head)) / 1000;
                    (since(&w.last_read) > head || bytes < owed).then_some("body_timeout")
                }
                _ => None,
            };
            if let Some(why) = why {
                late.push((*id, why));
            }
        }
        for (id, why) in late {
            if let Some(w) = Self::forget(&mut open, id) {
                w.close.cancel();
                self.metrics.connection_closed(why);
            }
        }
        self.metrics.connections_open(open.conns.len());
    }
}

/// Accepts and serves connections on `listener` with `router` until `stop` is cancelled;
/// then lets the requests in progress finish (for at most [`STOP_GRACE`]) and returns.
pub(crate) async fn serve(
    listener: TcpListener,
    router: Router,
    limits: Limits,
    metrics: Arc<Metrics>,
    stop: CancelToken,
) {
    let registry = Arc::new(Registry {
        epoch: Instant::now(),
        limits,
        open: Mutex::default(),
        refusing: AtomicUsize::new(0),
        metrics,
    });
    let sweeper = {
        let registry = Arc::clone(&registry);
        tokio::spawn(async move {
            let mut every = tokio::time::interval(Duration::from_millis(200));
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                every.tick().await;
                registry.sweep();
            }
        })
    };
    let mut http = hyper::server::conn::http1::Builder::new();
    http.max_buf_size(HEAD_BYTES_MAX);
    let mut last_accept_error: Option<Instant> = None;
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = stop.cancelled() => break,
        };
        let (socket, addr) = match accepted {
            Ok(a) => a,
            Err(e) => {
                // Out of file descriptors, most often: wait for some to close.
                if last_accept_error.is_none_or(|at| at.elapsed() > Duration::from_secs(10)) {
                    crate::settings::warn(&format!("cannot accept a connection: {e}"));
                    last_accept_error = Some(Instant::now());
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = socket.set_nodelay(true);
        match registry.admit(addr) {
            Ok((id, watch)) => {
                let conn = Connection {
                    registry: Arc::clone(&registry),
                    id,
                    watch,
                    addr,
                    router: router.clone(),
                };
                tokio::spawn(conn.serve(socket, http.clone(), stop.clone()));
            }
            Err(why) => refuse(&registry, socket, why),
        }
    }
    let deadline = Instant::now() + STOP_GRACE;
    while registry.len() > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    sweeper.abort();
}

/// Answers a connection the server cannot take — 503 when full, 429 past its peer's cap —
/// without reading its request, and closes it.
fn refuse(registry: &Arc<Registry>, mut socket: TcpStream, why: Refused) {
    let (status, detail, reason) = match why {
        Refused::Full => (
            axum::http::StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "the server holds {} connections, the most it takes, and every one has a request in progress; try again shortly",
                registry.limits.max
            ),
            "full",
        ),
        Refused::PeerFull(peer) => (
            axum::http::StatusCode::TOO_MANY_REQUESTS,
            format!(
                "{peer} holds {} connections to this server, the most one peer may; close one first",
                registry.limits.per_peer
            ),
            "peer_full",
        ),
    };
    registry.metrics.connection_closed(reason);
    if registry.refusing.fetch_add(1, Ordering::Relaxed) >= REFUSING_MAX {
        registry.refusing.fetch_sub(1, Ordering::Relaxed);
        return;
    }
    let body =
        serde_json::to_string(&crate::problem::Problem::new(status, detail)).unwrap_or_default();
    let answer = format!(
        "HTTP/1.1 {} {}\r\ncontent-type: application/problem+json\r\nretry-after: 1\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        status.as_u16(),
        status.canonical_reason().unwrap_or_default(),
        body.len()
    );
    let registry = Arc::clone(registry);
    tokio::spawn(async move {
        let _ = tokio::time::timeout(REFUSAL_LINGER, async {
            socket.write_all(answer.as_bytes()).await?;
            socket.shutdown().await?;
            // Whatever the client sent is read and dropped, so closing does not reset the
            // connection before the answer is read.
            let mut sink = [0u8; 4096];
            let mut left = 64 * 1024usize;
            while left > 0 {
                let n = tokio::io::AsyncReadExt::read(&mut socket, &mut sink).await?;
                if n == 0 {
                    break;
                }
                left = left.saturating_sub(n);
            }
            Ok::<(), std::io::Error>(())
        })
        .await;
        registry.refusing.fetch_sub(1, Ordering::Relaxed);
    });
}

/// One accepted connection.
struct Connection {
    registry: Arc<Registry>,
    id: u64,
    watch: Arc<Watch>,
    addr: SocketAddr,
    router: Router,
}

impl Connection {
    async fn serve(
        self,
        socket: TcpStream,
        http: hyper::server::conn::http1::Builder,
        stop: CancelToken,
    ) {
        let Connection { registry, id, watch, addr, router } = self;
        let io = TokioIo::new(Watched {
            io: socket,
            watch: Arc::clone(&watch),
            registry: Arc::clone(&registry),
        });
        let service = {
            let (registry, watch) = (Arc::clone(&registry), Arc::clone(&watch));
            hyper::service::service_fn(move |request: Request<Incoming>| {
                let now = registry.now();
                let has_body = !hyper::body::Body::is_end_stream(request.body());
                watch.phase.store(REQUEST, Ordering::Relaxed);
                watch.body_open.store(has_body, Ordering::Relaxed);
                watch.body_since.store(now, Ordering::Relaxed);
                watch.body_bytes.store(0, Ordering::Relaxed);
                let client = crate::peers::client(
                    addr.ip(),
                    request.headers(),
                    &registry.limits.trusted_proxies,
                );
                let mut request = request
                    .map(|b| Body::new(Guarded { body: b, guard: Receiving(Arc::clone(&watch)) }));
                request.extensions_mut().insert(Client { key: PeerKey::of(client) });
                let answer = router.clone().call(request);
                let (registry, watch) = (Arc::clone(&registry), Arc::clone(&watch));
                async move {
                    let response = match answer.await {
                        Ok(r) => r,
                        Err(never) => match never {},
                    };
                    Ok::<_, Infallible>(response.map(|b| {
                        Body::new(Guarded { body: b, guard: Responding { watch, registry } })
                    }))
                }
            })
        };
        let conn = http.serve_connection(io, service);
        let mut conn = std::pin::pin!(conn);
        tokio::select! {
            _ = conn.as_mut() => {}
            () = watch.close.cancelled() => {}
            () = stop.cancelled() => {
                conn.as_mut().graceful_shutdown();
                tokio::select! {
                    _ = conn.as_mut() => {}
                    () = watch.close.cancelled() => {}
                    () = tokio::time::sleep(STOP_GRACE) => {}
                }
            }
        }
        registry.closed(id);
    }
}

/// A connection's socket, watched: when bytes arrive and when the client stops reading.
struct Watched {
    io: TcpStream,
    watch: Arc<Watch>,
    registry: Arc<Registry>,
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.io).poll_read(cx, buf);
        let n = buf.filled().len() - before;
        if n > 0 {
            let now = self.registry.now();
            let w = &self.watch;
            w.last_read.store(now, Ordering::Relaxed);
            match w.phase.load(Ordering::Relaxed) {
                IDLE => {
                    w.head_since.store(now, Ordering::Relaxed);
                    w.phase.store(HEAD, Ordering::Relaxed);
                }
                REQUEST => {
                    w.body_bytes.fetch_add(n as u64, Ordering::Relaxed);
                }
                _ => {}
            }
        }
        polled
    }
}

impl Watched {
    fn wrote<T>(&self, polled: Poll<std::io::Result<T>>) -> Poll<std::io::Result<T>> {
        let stalled = &self.watch.write_stalled_since;
        match &polled {
            Poll::Pending => {
                if stalled.load(Ordering::Relaxed) == 0 {
                    stalled.store(self.registry.now(), Ordering::Relaxed);
                }
            }
            Poll::Ready(_) => stalled.store(0, Ordering::Relaxed),
        }
        polled
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.io).poll_write(cx, buf);
        self.wrote(polled)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.wrote(polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let polled = Pin::new(&mut self.io).poll_flush(cx);
        self.wrote(polled)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// A body that holds `guard` while it is sent or read: the guard is told when the body
/// has ended, and dropped with it.
pub(crate) struct Guarded<B, G> {
    pub(crate) body: B,
    pub(crate) guard: G,
}

/// What a [`Guarded`] body holds.
pub(crate) trait Guard: Send + Sync + Unpin + 'static {
    /// The body has ended (its last frame, or an error).
    fn ended(&self) {}
}

impl<B, G> hyper::body::Body for Guarded<B, G>
where
    B: hyper::body::Body + Unpin,
    G: Guard,
{
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        let polled = Pin::new(&mut self.body).poll_frame(cx);
        if matches!(polled, Poll::Ready(None | Some(Err(_)))) {
            self.guard.ended();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

/// A request body being received: once it has ended (or was dropped unread) the
/// connection no longer owes bytes at the minimum rate.
struct Receiving(Arc<Watch>);

impl Guard for Receiving {
    fn ended(&self) {
        self.0.body_open.store(false, Ordering::Relaxed);
    }
}

impl Drop for Receiving {
    fn drop(&mut self) {
        self.ended();
    }
}

/// A response being sent: once it is (or is dropped) the connection waits for its next
/// request.
struct Responding {
    watch: Arc<Watch>,
    registry: Arc<Registry>,
}

impl Guard for Responding {}

impl Drop for Responding {
    fn drop(&mut self) {
        let w = &self.watch;
        w.body_open.store(false, Ordering::Relaxed);
        w.waiting_since.store(self.registry.now(), Ordering::Relaxed);
        w.phase.store(IDLE, Ordering::Relaxed);
    }
}

/// Raises this process's soft limit of open files to its hard limit, and says how many
/// connections fit under it: `wanted`, or fewer (with a warning) when the limit is lower.
pub(crate) fn fit_open_files(wanted: usize) -> usize {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    if limit.current < limit.maximum {
        let raised = rustix::process::Rlimit { current: limit.maximum, maximum: limit.maximum };
        let _ = setrlimit(Resource::Nofile, raised);
    }
    let Some(files) = getrlimit(Resource::Nofile).current else { return wanted };
    // The database, its journal, scenario files, programs' pipes and the listener.
    let room = usize::try_from(files.saturating_sub(256)).unwrap_or(usize::MAX).max(16);
    if wanted > room {
        crate::settings::warn(&format!(
            "--connections-max {wanted} is more than this process may open files ({files}, RLIMIT_NOFILE); taking {room} connections at most"
        ));
        return room;
    }
    wanted
}

#[cfg(test)]
mod tests {
    use super::*;

    fn registry(limits: Limits) -> Registry {
        Registry {
            epoch: Instant::now(),
            limits,
            open: Mutex::default(),
            refusing: AtomicUsize::new(0),
            metrics: Arc::new(Metrics::new()),
        }
    }

    fn addr(s: &str) -> SocketAddr {
        s.parse().expect("an address")
    }

    #[test]
    fn at_the_cap_the_longest_waiting_connection_without_a_head_is_shed() {
        let r = registry(Limits { max: 3, ..Limits::default() });
        let (_, busy) = r.admit(addr("10.0.0.1:1")).expect("admitted");
        busy.phase.store(REQUEST, Ordering::Relaxed);
        busy.waiting_since.store(0, Ordering::Relaxed);
        let (_, old) = r.admit(addr("10.0.0.2:1")).expect("admitted");
        old.waiting_since.store(1, Ordering::Relaxed);
        let (_, young) = r.admit(addr("10.0.0.3:1")).expect("admitted");
        young.phase.store(HEAD, Ordering::Relaxed);
        young.waiting_since.store(1000, Ordering::Relaxed);
        assert!(r.admit(addr("10.0.0.4:1")).is_ok());
        assert!(old.close.is_cancelled(), "the oldest waiting one goes");
        assert!(!busy.close.is_cancelled() && !young.close.is_cancelled());
        assert_eq!(r.len(), 3);
    }

    #[test]
    fn with_every_connection_busy_a_new_one_is_refused() {
        let r = registry(Limits { max: 1, ..Limits::default() });
        let (_, busy) = r.admit(addr("10.0.0.1:1")).expect("admitted");
        busy.phase.store(REQUEST, Ordering::Relaxed);
        assert!(matches!(r.admit(addr("10.0.0.2:1")), Err(Refused::Full)));
    }

    #[test]
    fn a_peer_past_its_cap_is_refused_and_a_trusted_proxy_is_not_capped() {
        let proxy: crate::peers::Cidr = "10.9.0.0/16".parse().expect("a block");
        let r = registry(Limits { per_peer: 2, trusted_proxies: vec![proxy], ..Limits::default() });
        let (first, _) = r.admit(addr("10.0.0.1:1")).expect("admitted");
        assert!(r.admit(addr("10.0.0.1:2")).is_ok());
        assert!(matches!(r.admit(addr("10.0.0.1:3")), Err(Refused::PeerFull(_))));
        r.closed(first);
        assert!(r.admit(addr("10.0.0.1:4")).is_ok(), "a closed one frees its place");
        for port in 0..5 {
            assert!(
                r.admit(SocketAddr::new("10.9.1.1".parse().expect("an address"), port)).is_ok()
            );
        }
    }

    #[test]
    fn the_sweeper_closes_what_overstays_and_spares_a_request_in_progress() {
        let r = registry(Limits {
            header_timeout: Duration::from_millis(100),
            idle_timeout: Duration::from_millis(300),
            ..Limits::default()
        });
        let (_, head) = r.admit(addr("10.0.0.1:1")).expect("admitted");
        head.phase.store(HEAD, Ordering::Relaxed);
        head.head_since.store(r.now(), Ordering::Relaxed);
        let (_, idle) = r.admit(addr("10.0.0.2:1")).expect("admitted");
        let (_, slow_body) = r.admit(addr("10.0.0.3:1")).expect("admitted");
        slow_body.phase.store(REQUEST, Ordering::Relaxed);
        slow_body.body_open.store(true, Ordering::Relaxed);
        slow_body.body_since.store(r.now(), Ordering::Relaxed);
        let (_, working) = r.admit(addr("10.0.0.4:1")).expect("admitted");
        working.phase.store(REQUEST, Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(150));
        r.sweep();
        assert!(head.close.is_cancelled(), "a head past its timeout");
        assert!(slow_body.close.is_cancelled(), "a body that paused past the timeout");
        assert!(!idle.close.is_cancelled(), "idle, not yet for long");
        std::thread::sleep(Duration::from_millis(200));
        r.sweep();
        assert!(idle.close.is_cancelled());
        assert!(!working.close.is_cancelled(), "a handler at work is never timed out");
        working.write_stalled_since.store(1, Ordering::Relaxed);
        r.sweep();
        assert!(!working.close.is_cancelled(), "a client may stall for the write timeout");
    }
}
