//! Guarded listeners: every TCP port the process serves (the API, the probes, and any later
//! one) accepts through here, so each gets the same protections with its own [`Limits`].
//!
//! - **A connection cap.** Beyond `max_connections` open connections, a new one is accepted
//!   and closed at once (answered 503 with `Retry-After` first when its request had already
//!   arrived), never left in the backlog to time out; open connections keep being served.
//! - **A fair share per client.** With [`ClientShares`], one client (an IPv4 address, an
//!   IPv6 /64) holds at most its share of open connections; beyond it its new ones are
//!   closed at once as at the cap (with their own 503 message), counted by listener and
//!   logged at most once a minute per client, while other clients keep connecting. Trusted
//!   networks (a load balancer in front) are exempt. Listeners that share one
//!   [`ClientShares`] (the gateway's ports) count a client's connections together.
//! - **A deadline for every request head.** A new connection must complete its first
//!   request head within `header_read_timeout` of being accepted, whether it sends nothing
//!   or part of a head. After a response, an idle keep-alive connection is closed after
//!   `keep_alive_timeout`; once the first byte of its next request arrives, that head must
//!   be complete within `header_read_timeout` of it. hyper's own header timeout starts
//!   only once its HTTP/1 parser runs, which the HTTP/2 detection of the auto builder
//!   delays until the client sends something: an idle new connection was never closed.
//! - **A deadline for the unauthenticated.** A connection that has not authenticated is
//!   closed `unauthenticated_timeout` after accept (unless a request is in flight), when
//!   that comes before its other deadlines. A complete request head authenticates a
//!   connection of the API and probe ports; on the gateway its service says so, through
//!   the request's [`Unauthenticated`] extension, once a request's credentials are right.
//! - **Accept errors logged once.** Running out of file descriptors makes `accept` fail
//!   until some are freed; the failure is logged when it starts and when it ends (with a
//!   count), never per attempt, and counted in `/metrics`, as are refused connections and
//!   timeouts by kind.
//!
//! Request bodies have their own deadline, in the HTTP layer (`BODY_READ_TIMEOUT_MS`).

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::domain::Network;
use crate::monitoring::ListenerMetrics;

/// What one listener allows its clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Most connections open at once; beyond it new ones are refused at once.
    pub max_connections: usize,
    /// How long a request head may take: from accept for the first request, from its first
    /// byte for the next ones on a keep-alive connection.
    pub header_read_timeout: Duration,
    /// How long a keep-alive connection may stay idle between a response and the first
    /// byte of the next request.
    pub keep_alive_timeout: Duration,
    /// How long after accept a connection that has not authenticated is closed (while no
    /// request of it is in flight), when that is before its other deadlines.
    pub unauthenticated_timeout: Duration,
    /// What authenticates a connection.
    pub authentication: Authentication,
}

/// What authenticates a connection, ending its [`Limits::unauthenticated_timeout`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Authentication {
    /// Its first complete request head (the API port, whose routes check their own tokens
    /// per request, and the probe port).
    Head,
    /// Its service, through the [`Unauthenticated`] extension of its requests (the
    /// gateway, once a request's proxy credentials are right).
    Service,
}

/// Largest request head (request line and headers) accepted, in bytes; beyond it the
/// connection answers 431.
pub const MAX_HEADER_BYTES: usize = 64 * 1024;

/// Open files kept back from every listener's connections for the process's own needs:
/// standard streams, the runtime's event queue and timers, log output, Redis connections.
pub const RESERVED_FILES: u64 = 128;

/// A run of failures no shorter than this, without a failure, ends it: a flood that lets
/// one connection through now and then is still one episode, logged once.
const QUIET: Duration = Duration::from_secs(1);

/// How long `accept` waits before trying again after an error that is not about one
/// connection (out of file descriptors, out of memory): retrying at once would spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(20);

/// Connections the kernel keeps waiting for `accept` (capped by `net.core.somaxconn`).
/// More than the usual 1,024: during a burst, a connection beyond the backlog has its SYN
/// dropped and its client waits a second or more to retry, where one in the backlog is
/// accepted, and refused at the cap if need be, within milliseconds.
const BACKLOG: u32 = 4096;

/// The answer to a connection refused at the cap whose request had already arrived: the
/// API's error shape, so clients treat it as any other 503.
const REFUSAL: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\n\
content-type: application/json\r\n\
retry-after: 1\r\n\
connection: close\r\n\
content-length: 107\r\n\
\r\n\
{\"error\":{\"code\":\"too_many_connections\",\"message\":\"the service is at its connection limit; retry shortly\"}}";

/// The answer to a connection refused over its client's share whose request had already
/// arrived.
const REFUSAL_PER_CLIENT: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\n\
content-type: application/json\r\n\
retry-after: 1\r\n\
connection: close\r\n\
content-length: 130\r\n\
\r\n\
{\"error\":{\"code\":\"too_many_connections\",\"message\":\"this client address holds the most connections one client may; retry shortly\"}}";

/// A client refused over its share is logged at most once per this long.
const CLIENT_LOG_EVERY: Duration = Duration::from_secs(60);

/// Most clients whose last refusal line is remembered; when that many were logged within
/// [`CLIENT_LOG_EVERY`], further clients over their share are counted but not logged.
const MAX_LOGGED_CLIENTS: usize = 4096;

/// The process's open-file limit, as found and as raised at start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenFileLimit {
    /// The soft limit the process started with.
    pub was: u64,
    /// The soft limit now in force.
    pub soft: u64,
    /// The hard limit, which the soft one may not exceed.
    pub hard: u64,
}

/// Raises the soft open-file limit to the hard limit: every connection is a file, and
/// the default soft limit (often 1,024) would cap the service far below what it can serve.
///
/// # Errors
/// The system call's error when the limits cannot be read or set.
pub fn raise_open_file_limit() -> io::Result<OpenFileLimit> {
    let (was, hard) = rlimit::getrlimit(rlimit::Resource::NOFILE)?;
    let soft = rlimit::increase_nofile_limit(hard)?;
    Ok(OpenFileLimit { was, soft, hard })
}

/// The connection cap a listener gets when none is configured: half of the open files left
/// after [`RESERVED_FILES`] and the other listeners' caps (`reserved`), at least 1. The other
/// half stays free for what the process dials (active checks, list sources, and a
/// gateway's upstream connections), so a full API port never starves them.
pub fn default_max_connections(open_files: u64, reserved: usize) -> usize {
    let reserved = RESERVED_FILES.saturating_add(u64::try_from(reserved).unwrap_or(u64::MAX));
    let half = open_files.saturating_sub(reserved) / 2;
    usize::try_from(half).unwrap_or(usize::MAX).max(1)
}

/// The share of a port's connections one client gets when none is configured: a quarter of
/// the port's cap, at least 1. A single client can then never fill the port, three quarters
/// stay for the others, and a worker host with hundreds of connections open (a keep-alive
/// connection per worker, a gateway tunnel per request in flight) stays under it at any cap
/// of a few thousand.
pub fn default_max_connections_per_client(max_connections: usize) -> usize {
    (max_connections / 4).max(1)
}

/// Whom a connection's share is counted for: an IPv4 address, or the /64 of an IPv6 one
/// (one host, or one customer's network, usually gets a whole /64).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Client {
    /// An IPv4 address (an IPv4-mapped IPv6 one included).
    V4(std::net::Ipv4Addr),
    /// The first 64 bits of an IPv6 address.
    V6(u64),
}

impl Client {
    /// The client `address` counts for.
    pub fn of(address: IpAddr) -> Self {
        match address.to_canonical() {
            IpAddr::V4(v4) => Self::V4(v4),
            // The upper half of the 128 bits: the truncation is the point.
            IpAddr::V6(v6) => Self::V6((u128::from(v6) >> 64) as u64),
        }
    }
}

impl std::fmt::Display for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::V4(v4) => write!(f, "{v4}"),
            Self::V6(prefix) => write!(f, "{}/64", Ipv6Addr::from(u128::from(*prefix) << 64)),
        }
    }
}

/// The open connections of each client on the listeners that share this, and the most one
/// client may hold. Cloning is shallow: give one to every listener whose connections a
/// client's share spans (the gateway's ports).
///
/// The map holds only clients with a connection open (an entry goes when its count reaches
/// zero), so it never has more entries than the listeners' caps allow connections; taking
/// and giving back a place is one hash-map step under a lock held for nothing else.
#[derive(Clone)]
pub struct ClientShares {
    inner: Arc<SharesInner>,
}

struct SharesInner {
    max_per_client: usize,
    trusted: Vec<Network>,
    open: Mutex<HashMap<Client, usize>>,
}

impl ClientShares {
    /// At most `max_per_client` connections per client, except for addresses in `trusted`,
    /// which are not counted.
    pub fn new(max_per_client: usize, trusted: Vec<Network>) -> Self {
        Self {
            inner: Arc::new(SharesInner {
                max_per_client: max_per_client.max(1),
                trusted,
                open: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// The most connections one client may hold.
    pub fn max_per_client(&self) -> usize {
        self.inner.max_per_client
    }

    /// A place for a new connection from `address`: `Ok(None)` when it is trusted (nothing
    /// is counted), `Err` with its client when that client holds its whole share.
    fn take(&self, address: IpAddr) -> Result<Option<Share>, Client> {
        if self.inner.trusted.iter().any(|net| net.contains(address)) {
            return Ok(None);
        }
        let client = Client::of(address);
        let mut open = self.open();
        let count = open.entry(client).or_insert(0);
        if *count >= self.inner.max_per_client {
            return Err(client);
        }
        *count += 1;
        Ok(Some(Share {
            shares: self.clone(),
            client,
        }))
    }

    /// How many connections `client` holds.
    pub fn held(&self, client: Client) -> usize {
        self.open().get(&client).copied().unwrap_or(0)
    }

    fn open(&self) -> std::sync::MutexGuard<'_, HashMap<Client, usize>> {
        // The counts are whole after every step under the lock: a panic elsewhere cannot
        // leave one half-changed.
        self.inner
            .open
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// One connection's place in its client's share, given back when dropped.
struct Share {
    shares: ClientShares,
    client: Client,
}

impl Drop for Share {
    fn drop(&mut self) {
        let mut open = self.shares.open();
        if let Some(count) = open.get_mut(&self.client) {
            *count -= 1;
            if *count == 0 {
                open.remove(&self.client);
            }
        }
    }
}

/// A failure that may repeat many times a second, logged when it starts and when it ends.
#[derive(Debug, Default)]
struct Episode {
    /// When the episode started and when its last failure was, while it lasts.
    running: Option<(Instant, Instant)>,
    count: u64,
}

impl Episode {
    /// Counts one failure; true when it starts a new episode.
    fn failed(&mut self, now: Instant) -> bool {
        self.count += 1;
        match &mut self.running {
            Some((_, last)) => {
                *last = now;
                false
            }
            None => {
                self.running = Some((now, now));
                true
            }
        }
    }

    /// After a success: the episode's failure count and length when this ends it (the
    /// last failure is at least [`QUIET`] ago).
    fn succeeded(&mut self, now: Instant) -> Option<(u64, Duration)> {
        let (started, last) = self.running?;
        if now.duration_since(last) < QUIET {
            return None;
        }
        self.running = None;
        Some((
            std::mem::take(&mut self.count),
            last.duration_since(started),
        ))
    }
}

/// A TCP listener with a connection cap, per-connection timeouts and accept errors logged
/// once per episode. Each port of the process is one, with its own name and limits.
pub struct GuardedListener {
    name: &'static str,
    listener: TcpListener,
    limits: Limits,
    open: Arc<AtomicUsize>,
    metrics: ListenerMetrics,
    accept_errors: Episode,
    refusals: Episode,
    shares: Option<ClientShares>,
    /// When each client over its share was last logged.
    logged: HashMap<Client, Instant>,
    /// Whether its clients speak HTTP, so that a refused one whose request arrived is
    /// answered 503 (another protocol's client is closed without an answer).
    speaks_http: bool,
}

impl GuardedListener {
    /// Binds `addr` for the listener called `name` (a log field and metric label).
    ///
    /// # Errors
    /// The bind error.
    pub async fn bind(name: &'static str, addr: SocketAddr, limits: Limits) -> io::Result<Self> {
        let socket = if addr.is_ipv4() {
            TcpSocket::new_v4()?
        } else {
            TcpSocket::new_v6()?
        };
        // As the standard library's listeners do: a restarted service rebinds at once.
        socket.set_reuseaddr(true)?;
        socket.bind(addr)?;
        Ok(Self::new(name, socket.listen(BACKLOG)?, limits))
    }

    /// Binds `addr` for another port of the same service as this listener (the gateway's
    /// SOCKS5 port beside its HTTP one), called `name`: with the same limits, counting its
    /// connections under the same cap and, when this listener has them, in the same client
    /// shares, so that a client holds its share across both ports.
    ///
    /// # Errors
    /// The bind error.
    pub async fn bind_beside(&self, name: &'static str, addr: SocketAddr) -> io::Result<Self> {
        let mut beside = Self::bind(name, addr, self.limits).await?;
        beside.open = Arc::clone(&self.open);
        if let Some(shares) = &self.shares {
            beside = beside.with_client_shares(shares.clone());
        }
        Ok(beside)
    }

    /// Guards a bound listener.
    pub fn new(name: &'static str, listener: TcpListener, limits: Limits) -> Self {
        Self {
            name,
            listener,
            limits,
            open: Arc::new(AtomicUsize::new(0)),
            metrics: ListenerMetrics::new(name, limits.max_connections),
            accept_errors: Episode::default(),
            refusals: Episode::default(),
            shares: None,
            logged: HashMap::new(),
            speaks_http: true,
        }
    }

    /// Holds each client to its share of `shares` (see the module doc).
    #[must_use]
    pub fn with_client_shares(mut self, shares: ClientShares) -> Self {
        self.metrics.max_per_client(shares.max_per_client());
        self.shares = Some(shares);
        self
    }

    /// The client shares this listener counts in, if any.
    pub fn client_shares(&self) -> Option<&ClientShares> {
        self.shares.as_ref()
    }

    /// The bound address.
    ///
    /// # Errors
    /// The socket's error.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// The listener's limits.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// The next connection under the cap. Connections over it are refused on the way;
    /// errors are logged once per episode and retried, so this only ever returns a
    /// connection. Cancel-safe.
    pub async fn accept(&mut self) -> Accepted {
        loop {
            let (stream, peer) = match self.listener.accept().await {
                Ok(accepted) => accepted,
                Err(error) => {
                    self.accept_failed(&error);
                    if !is_about_one_connection(&error) {
                        tokio::time::sleep(ACCEPT_BACKOFF).await;
                    }
                    continue;
                }
            };
            let now = Instant::now();
            if let Some((errors, lasted)) = self.accept_errors.succeeded(now) {
                tracing::warn!(
                    listener = self.name,
                    errors,
                    lasted_ms = u64::try_from(lasted.as_millis()).unwrap_or(u64::MAX),
                    "accepting connections again"
                );
            }
            if self.open.load(Ordering::Acquire) >= self.limits.max_connections {
                self.metrics.refused.increment(1);
                if self.refusals.failed(now) {
                    tracing::warn!(
                        listener = self.name,
                        max_connections = self.limits.max_connections,
                        "connection cap reached: refusing new connections"
                    );
                }
                if self.speaks_http {
                    refuse_with(&stream, REFUSAL);
                }
                continue;
            }
            if let Some((refused, lasted)) = self.refusals.succeeded(now) {
                tracing::info!(
                    listener = self.name,
                    refused,
                    lasted_ms = u64::try_from(lasted.as_millis()).unwrap_or(u64::MAX),
                    "below the connection cap again"
                );
            }
            let share = match self.shares.as_ref().map(|shares| shares.take(peer.ip())) {
                None | Some(Ok(None)) => None,
                Some(Ok(Some(share))) => Some(share),
                Some(Err(client)) => {
                    self.over_share(client, now);
                    if self.speaks_http {
                        refuse_with(&stream, REFUSAL_PER_CLIENT);
                    }
                    continue;
                }
            };
            self.open.fetch_add(1, Ordering::AcqRel);
            self.metrics.open.increment(1.0);
            let _ = stream.set_nodelay(true);
            let activity = Arc::new(Activity::new(now, self.limits));
            let slot = Slot {
                open: Arc::clone(&self.open),
                metrics: self.metrics.clone(),
                _share: share,
            };
            return Accepted {
                stream: GuardedStream {
                    stream,
                    activity: Arc::clone(&activity),
                    _slot: slot,
                },
                peer,
                activity,
                metrics: self.metrics.clone(),
            };
        }
    }

    /// Counts a connection refused over its client's share, and logs it unless that client
    /// was logged within [`CLIENT_LOG_EVERY`].
    fn over_share(&mut self, client: Client, now: Instant) {
        self.metrics.refused_per_client.increment(1);
        let due = self
            .logged
            .get(&client)
            .is_none_or(|last| now.duration_since(*last) >= CLIENT_LOG_EVERY);
        if !due {
            return;
        }
        if self.logged.len() >= MAX_LOGGED_CLIENTS && !self.logged.contains_key(&client) {
            self.logged
                .retain(|_, last| now.duration_since(*last) < CLIENT_LOG_EVERY);
            if self.logged.len() >= MAX_LOGGED_CLIENTS {
                return;
            }
        }
        self.logged.insert(client, now);
        tracing::warn!(
            listener = self.name,
            client = %client,
            max_connections_per_client =
                self.shares.as_ref().map_or(0, ClientShares::max_per_client),
            "client at its share of connections: refusing its new connections (logged at \
             most once a minute per client)"
        );
    }

    fn accept_failed(&mut self, error: &io::Error) {
        self.metrics.accept_errors.increment(1);
        if self.accept_errors.failed(Instant::now()) {
            tracing::warn!(
                listener = self.name,
                %error,
                "accept failing: new connections wait in the backlog until it works again"
            );
        }
    }

    /// Serves HTTP/1 and HTTP/2 with `service` on every connection until `stop`
    /// completes. Each connection is watched by `graceful`, which drains them afterwards,
    /// and by its own deadlines (see the module doc).
    pub async fn serve_http<S, B>(
        mut self,
        service: S,
        graceful: &GracefulShutdown,
        stop: impl Future<Output = ()>,
    ) where
        S: tower::Service<Request<Incoming>, Response = Response<B>> + Clone + Send + 'static,
        S::Future: Send + 'static,
        S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
        B: Body + Send + 'static,
        B::Data: Send,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let mut builder = Builder::new(TokioExecutor::new());
        // hyper's header timeout is off: the connection's watchdog keeps every deadline,
        // and two clocks for one head would only disagree.
        builder
            .http1()
            .timer(TokioTimer::new())
            .header_read_timeout(None)
            .max_buf_size(MAX_HEADER_BYTES);
        let mut stop = std::pin::pin!(stop);
        loop {
            let Accepted {
                stream, activity, ..
            } = tokio::select! {
                accepted = self.accept() => accepted,
                () = &mut stop => return,
            };
            let service = Tracked {
                inner: TowerToHyperService::new(service.clone()),
                activity: Arc::clone(&activity),
            };
            let connection = graceful.watch(
                builder
                    .serve_connection_with_upgrades(TokioIo::new(stream), service)
                    .into_owned(),
            );
            let metrics = self.metrics.clone();
            // Boxed: a connection's future is large, and tokio moves an unboxed one by value
            // several times as it spawns it and again when it completes (about 6,000
            // instructions a connection, measured with callgrind); a box is moved once.
            tokio::spawn(Box::pin(async move {
                if let Some(Err(error)) = activity.watch(connection, &metrics).await {
                    tracing::debug!(%error, "connection ended with an error");
                }
            }));
        }
    }
}

impl GuardedListener {
    /// Serves a protocol of its own on every connection until `stop` completes: `handle`
    /// runs in a task of its own per connection, which it owns (its place under the cap and
    /// in its client's share is given back when the stream is dropped). The handler keeps
    /// the connection's deadline itself, through [`Accepted::handshake`].
    pub async fn serve_streams<F, Fut>(mut self, handle: F, stop: impl Future<Output = ()>)
    where
        F: Fn(Accepted) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.speaks_http = false;
        let mut stop = std::pin::pin!(stop);
        loop {
            let accepted = tokio::select! {
                accepted = self.accept() => accepted,
                () = &mut stop => return,
            };
            // Boxed, as an HTTP connection's future is (see `serve_http`).
            tokio::spawn(Box::pin(handle(accepted)));
        }
    }
}

/// Errors `accept` returns for one connection that went away before it was accepted; the
/// listener itself is fine, so the next `accept` may follow at once.
fn is_about_one_connection(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionRefused
    )
}

/// Closes a connection over the cap or its client's share at once. When its request has
/// already arrived it is read (so that closing sends FIN rather than a reset that could
/// destroy the answer) and answered `answer` (a 503); nothing waits for a request that has
/// not.
fn refuse_with(stream: &TcpStream, answer: &[u8]) {
    let mut head = [0u8; 4096];
    if matches!(stream.try_read(&mut head), Ok(n) if n > 0) {
        let _ = stream.try_write(answer);
    }
}

/// One accepted connection, counted against its listener's cap until its stream is dropped.
pub struct Accepted {
    /// The connection; its reads feed the watchdog.
    pub stream: GuardedStream,
    /// The client's address.
    pub peer: SocketAddr,
    activity: Arc<Activity>,
    metrics: ListenerMetrics,
}

impl Accepted {
    /// The deadline of the part of a connection of a protocol other than HTTP that comes
    /// before its client has authenticated and said what it wants (a SOCKS greeting, its
    /// credentials and its request): the deadline an HTTP request head has on the same
    /// listener, the shorter of the header and the unauthenticated timeouts from accept.
    pub fn handshake_deadline(&self) -> HandshakeDeadline {
        let limits = self.activity.limits;
        // At a tie the header timeout is named, as for an HTTP connection.
        let (timeout, kind) = if limits.unauthenticated_timeout < limits.header_read_timeout {
            (limits.unauthenticated_timeout, Timeout::Unauthenticated)
        } else {
            (limits.header_read_timeout, Timeout::Header)
        };
        HandshakeDeadline {
            at: self.activity.accepted + timeout,
            kind,
            metrics: self.metrics.clone(),
        }
    }
}

/// When a connection's handshake must be over (see [`Accepted::handshake_deadline`]).
pub struct HandshakeDeadline {
    at: Instant,
    kind: Timeout,
    metrics: ListenerMetrics,
}

impl HandshakeDeadline {
    /// Runs `handshake` until the deadline: `None` when it missed it, counted as that
    /// timeout; the caller then drops the connection, which closes it.
    pub async fn within<T>(self, handshake: impl Future<Output = T>) -> Option<T> {
        if let Ok(done) = tokio::time::timeout_at(self.at, handshake).await {
            Some(done)
        } else {
            self.metrics.timed_out(self.kind);
            None
        }
    }
}

/// Gives a connection's place under the cap (and in its client's share) back when the
/// connection is dropped.
struct Slot {
    open: Arc<AtomicUsize>,
    metrics: ListenerMetrics,
    _share: Option<Share>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.open.fetch_sub(1, Ordering::AcqRel);
        self.metrics.open.decrement(1.0);
    }
}

/// An accepted TCP stream that tells its connection's watchdog when bytes arrive and holds
/// the connection's place under the cap for as long as it lives (an upgraded connection
/// included).
pub struct GuardedStream {
    stream: TcpStream,
    activity: Arc<Activity>,
    _slot: Slot,
}

impl AsyncRead for GuardedStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let read = Pin::new(&mut this.stream).poll_read(cx, buf);
        if buf.filled().len() > before {
            this.activity.bytes_arrived();
        }
        read
    }
}

impl AsyncWrite for GuardedStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

/// Why a connection's watchdog closed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Timeout {
    /// No complete request head in time.
    Header,
    /// Idle between requests for too long.
    KeepAlive,
    /// Not authenticated in time.
    Unauthenticated,
}

/// No time recorded.
const NONE: u64 = u64::MAX;

/// What the watchdog of one connection reads, written by the connection's reads and
/// requests. Times are nanoseconds since the connection was accepted. Everything here
/// happens in the connection's own task (HTTP/2 streams aside), so the atomics are for
/// soundness, not contention.
struct Activity {
    accepted: Instant,
    limits: Limits,
    /// Requests begun whose response has not been sent in full.
    in_flight: AtomicUsize,
    /// Whether any request has begun.
    started: AtomicBool,
    /// Whether the connection has authenticated (see [`Authentication`]).
    authenticated: AtomicBool,
    /// When the last response ended.
    idle_since: AtomicU64,
    /// When the first byte after `idle_since` arrived, or [`NONE`].
    first_byte: AtomicU64,
    /// Whether the next byte read is the first of a new request head.
    awaiting_byte: AtomicBool,
    /// The deadline the watchdog's timer is set for.
    armed: AtomicU64,
    /// Wakes the watchdog when a deadline moves earlier than `armed`.
    notify: Notify,
}

fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(NONE - 1)
}

impl Activity {
    fn new(accepted: Instant, limits: Limits) -> Self {
        Self {
            accepted,
            limits,
            in_flight: AtomicUsize::new(0),
            started: AtomicBool::new(false),
            authenticated: AtomicBool::new(false),
            idle_since: AtomicU64::new(0),
            first_byte: AtomicU64::new(NONE),
            awaiting_byte: AtomicBool::new(false),
            armed: AtomicU64::new(nanos(
                limits
                    .header_read_timeout
                    .min(limits.unauthenticated_timeout),
            )),
            notify: Notify::new(),
        }
    }

    fn now(&self) -> u64 {
        nanos(self.accepted.elapsed())
    }

    /// Wakes the watchdog if `deadline` is earlier than the one its timer is set for; a
    /// later one it finds by itself when the timer fires, so most requests wake nothing.
    fn moved(&self, deadline: u64) {
        if deadline < self.armed.load(Ordering::Acquire) {
            self.notify.notify_one();
        }
    }

    /// A request head is complete and its request begins.
    fn begin(&self) {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        self.started.store(true, Ordering::Release);
        if self.limits.authentication == Authentication::Head {
            self.authenticated.store(true, Ordering::Release);
        }
        self.awaiting_byte.store(false, Ordering::Release);
    }

    /// A response has been sent (or its request abandoned).
    fn end(&self) {
        let now = self.now();
        self.first_byte.store(NONE, Ordering::Release);
        self.idle_since.store(now, Ordering::Release);
        self.awaiting_byte.store(true, Ordering::Release);
        if self.in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.moved(now.saturating_add(nanos(self.limits.keep_alive_timeout)));
        }
    }

    /// Bytes were read from the connection.
    fn bytes_arrived(&self) {
        if self.awaiting_byte.load(Ordering::Acquire)
            && self.awaiting_byte.swap(false, Ordering::AcqRel)
        {
            let now = self.now();
            self.first_byte.store(now, Ordering::Release);
            self.moved(now.saturating_add(nanos(self.limits.header_read_timeout)));
        }
    }

    /// When the connection is to be closed if nothing changes, and why; `None` while a
    /// request is in flight (its body and handler have their own deadlines).
    fn deadline(&self) -> Option<(u64, Timeout)> {
        if self.in_flight.load(Ordering::Acquire) > 0 {
            return None;
        }
        let header = nanos(self.limits.header_read_timeout);
        let deadline = if !self.started.load(Ordering::Acquire) {
            (header, Timeout::Header)
        } else {
            match self.first_byte.load(Ordering::Acquire) {
                NONE => (
                    self.idle_since
                        .load(Ordering::Acquire)
                        .saturating_add(nanos(self.limits.keep_alive_timeout)),
                    Timeout::KeepAlive,
                ),
                first => (first.saturating_add(header), Timeout::Header),
            }
        };
        let unauthenticated = nanos(self.limits.unauthenticated_timeout);
        // At a tie the other kind is named: with equal timeouts nothing changes.
        if !self.authenticated.load(Ordering::Acquire) && unauthenticated < deadline.0 {
            return Some((unauthenticated, Timeout::Unauthenticated));
        }
        Some(deadline)
    }

    /// Runs `connection` until it ends (`Some` with its result) or misses a deadline
    /// (`None`: it is dropped, which closes it).
    async fn watch<F: Future>(
        &self,
        connection: F,
        metrics: &ListenerMetrics,
    ) -> Option<F::Output> {
        let mut connection = std::pin::pin!(connection);
        let mut armed = self.armed.load(Ordering::Acquire);
        let timer = tokio::time::sleep_until(self.accepted + Duration::from_nanos(armed));
        let mut timer = std::pin::pin!(timer);
        // While a request is in flight the timer looks again after the shorter timeout: a
        // request ending before then gives a deadline no earlier than that, so it need not
        // wake the watchdog.
        let recheck = nanos(
            self.limits
                .header_read_timeout
                .min(self.limits.keep_alive_timeout),
        );
        loop {
            tokio::select! {
                biased;
                output = &mut connection => return Some(output),
                () = self.notify.notified() => {}
                () = &mut timer => {}
            }
            let now = self.now();
            let next = match self.deadline() {
                Some((deadline, kind)) if deadline <= now => {
                    metrics.timed_out(kind);
                    return None;
                }
                Some((deadline, _)) => deadline,
                None => now.saturating_add(recheck),
            };
            if next != armed {
                armed = next;
                self.armed.store(armed, Ordering::Release);
                timer
                    .as_mut()
                    .reset(self.accepted + Duration::from_nanos(armed));
            }
        }
    }
}

/// In the extensions of a request whose connection has not authenticated yet, on a
/// listener whose service decides that ([`Authentication::Service`]).
#[derive(Clone)]
pub struct Unauthenticated(Arc<Activity>);

impl Unauthenticated {
    /// The request's credentials are right: its connection is no longer held to
    /// [`Limits::unauthenticated_timeout`].
    pub fn authenticated(&self) {
        self.0.authenticated.store(true, Ordering::Release);
    }
}

/// A request on its way: ends the request when dropped.
struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.end();
    }
}

/// The connection's service, telling its watchdog when a request begins and ends.
struct Tracked<S> {
    inner: S,
    activity: Arc<Activity>,
}

impl<S, B> hyper::service::Service<Request<Incoming>> for Tracked<S>
where
    S: hyper::service::Service<Request<Incoming>, Response = Response<B>>,
{
    type Response = Response<TrackedBody<B>>;
    type Error = S::Error;
    type Future = TrackedFuture<S::Future>;

    fn call(&self, mut request: Request<Incoming>) -> Self::Future {
        self.activity.begin();
        // Only the requests of a connection still to authenticate carry the extension
        // (inserting one allocates): on the others this is one load.
        if self.activity.limits.authentication == Authentication::Service
            && !self.activity.authenticated.load(Ordering::Acquire)
        {
            request
                .extensions_mut()
                .insert(Unauthenticated(Arc::clone(&self.activity)));
        }
        TrackedFuture {
            inner: self.inner.call(request),
            request: Some(InFlight(Arc::clone(&self.activity))),
        }
    }
}

pin_project_lite::pin_project! {
    /// The response of a tracked request, which hands the request on to its body.
    struct TrackedFuture<F> {
        #[pin]
        inner: F,
        request: Option<InFlight>,
    }
}

impl<F, B, E> Future for TrackedFuture<F>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<TrackedBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let response = ready!(this.inner.poll(cx))?;
        let request = this.request.take();
        Poll::Ready(Ok(response.map(|inner| TrackedBody { inner, request })))
    }
}

pin_project_lite::pin_project! {
    /// A response body whose end (or drop) ends its request.
    struct TrackedBody<B> {
        #[pin]
        inner: B,
        request: Option<InFlight>,
    }
}

impl<B: Body> Body for TrackedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        let frame = ready!(this.inner.poll_frame(cx));
        if frame.is_none() {
            this.request.take();
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_cap_is_half_of_what_the_reserve_and_other_listeners_leave() {
        assert_eq!(default_max_connections(1_048_576, 32), 524_208);
        assert_eq!(default_max_connections(20_000, 32), 9_920);
        assert_eq!(default_max_connections(1_024, 32), 432);
        assert_eq!(default_max_connections(100, 32), 1, "never 0");
    }

    #[test]
    fn the_refusal_is_a_503_in_the_error_shape_with_its_exact_length() {
        let text = std::str::from_utf8(REFUSAL).expect("ASCII");
        let (head, body) = text.split_once("\r\n\r\n").expect("a head and a body");
        assert!(head.starts_with("HTTP/1.1 503 "));
        assert!(head.contains("\r\nretry-after: 1\r\n"));
        assert!(head.contains(&format!("\r\ncontent-length: {}", body.len())));
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(body).expect("JSON"),
            crate::http::error::error_body(
                "too_many_connections",
                "the service is at its connection limit; retry shortly"
            )
        );
    }

    #[test]
    fn the_refusal_over_a_clients_share_is_a_503_in_the_error_shape_with_its_exact_length() {
        let text = std::str::from_utf8(REFUSAL_PER_CLIENT).expect("ASCII");
        let (head, body) = text.split_once("\r\n\r\n").expect("a head and a body");
        assert!(head.starts_with("HTTP/1.1 503 "));
        assert!(head.contains("\r\nretry-after: 1\r\n"));
        assert!(head.contains(&format!("\r\ncontent-length: {}", body.len())));
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(body).expect("JSON"),
            crate::http::error::error_body(
                "too_many_connections",
                "this client address holds the most connections one client may; retry shortly"
            )
        );
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().expect("an address")
    }

    #[test]
    fn a_client_is_an_ipv4_address_or_the_64_bit_prefix_of_an_ipv6_one() {
        assert_eq!(Client::of(ip("192.0.2.7")).to_string(), "192.0.2.7");
        assert_eq!(
            Client::of(ip("::ffff:192.0.2.7")),
            Client::of(ip("192.0.2.7"))
        );
        assert_ne!(Client::of(ip("192.0.2.7")), Client::of(ip("192.0.2.8")));
        let one = Client::of(ip("2001:db8:1:2:aaaa::1"));
        assert_eq!(one, Client::of(ip("2001:db8:1:2:ffff:ffff:ffff:ffff")));
        assert_ne!(one, Client::of(ip("2001:db8:1:3::1")));
        assert_eq!(one.to_string(), "2001:db8:1:2::/64");
    }

    #[test]
    fn a_share_is_given_back_when_dropped_and_a_client_at_zero_leaves_the_map() {
        let trusted = vec![Network::parse("10.0.0.0/8").expect("parses")];
        let shares = ClientShares::new(2, trusted);
        let (a, b) = (ip("192.0.2.1"), ip("192.0.2.2"));
        let first = shares.take(a).expect("under the share").expect("counted");
        let second = shares.take(a).expect("under the share").expect("counted");
        assert_eq!(
            shares.take(a).err(),
            Some(Client::of(a)),
            "the third is over"
        );
        assert!(shares.take(b).expect("another client").is_some());
        assert_eq!(shares.held(Client::of(a)), 2);
        drop(first);
        assert_eq!(shares.held(Client::of(a)), 1);
        let third = shares.take(a).expect("a place came back");
        drop((second, third));
        assert_eq!(shares.held(Client::of(a)), 0);
        assert_eq!(
            shares.open().len(),
            0,
            "the other client's share was dropped too"
        );
        for _ in 0..10 {
            assert!(shares.take(ip("10.1.2.3")).expect("trusted").is_none());
        }
        assert_eq!(shares.open().len(), 0, "trusted clients are not counted");
    }

    #[test]
    fn the_default_share_is_a_quarter_of_the_cap_and_never_0() {
        assert_eq!(default_max_connections_per_client(9_920), 2_480);
        assert_eq!(default_max_connections_per_client(2_000), 500);
        assert_eq!(default_max_connections_per_client(3), 1);
    }

    #[test]
    fn an_episode_is_logged_once_however_often_a_success_slips_between_failures() {
        let start = Instant::now();
        let mut episode = Episode::default();
        assert!(episode.failed(start));
        for step in 1..100 {
            let at = start + Duration::from_millis(step * 10);
            assert!(!episode.failed(at));
            assert_eq!(episode.succeeded(at + Duration::from_millis(5)), None);
        }
        let last = start + Duration::from_millis(990);
        assert_eq!(
            episode.succeeded(last + QUIET),
            Some((100, Duration::from_millis(990)))
        );
        assert!(episode.failed(last + QUIET), "a new episode starts");
    }

    #[tokio::test]
    async fn a_connection_over_the_cap_whose_request_has_arrived_gets_the_503() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bound");
        let mut client = TcpStream::connect(listener.local_addr().expect("address"))
            .await
            .expect("connected");
        client
            .write_all(b"GET /livez HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .expect("sent");
        let (server, _) = listener.accept().await.expect("accepted");
        server.readable().await.expect("readable");
        refuse_with(&server, REFUSAL);
        drop(server);
        let mut answer = Vec::new();
        client.read_to_end(&mut answer).await.expect("read");
        assert_eq!(answer, REFUSAL);
    }
}
