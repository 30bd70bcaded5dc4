//! Building the application from its configuration and running it until it is stopped.

use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use hyper_util::server::graceful::GracefulShutdown;
use tower::ServiceExt;

use crate::config::{Config, RedisSettingsError};
use crate::connections::{
    self, Authentication, ClientShares, GuardedListener, Limits as ConnectionLimits,
};
use crate::gateway::upstream::Dialer;
use crate::gateway::{Gateway, Tunnels};
use crate::geoip::GeoIp;
use crate::http::{self, AppState, Limits, Tokens};
use crate::monitoring::PoolSnapshot;
use crate::store::{
    DataDirOptions, EmbeddedStore, OpenError, RedisStore, RedisStoreOptions, Store, StoreError,
};
use crate::tickets::Tickets;
use crate::{checker, sources, sweep};

/// Why the service could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    /// The listen address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The cause.
        source: std::io::Error,
    },
    /// A token file could not be read or is empty.
    #[error("cannot read the {what} from {path}: {reason}")]
    TokenFile {
        /// Which token: `admin token` or `worker token`.
        what: &'static str,
        /// The file.
        path: String,
        /// The cause.
        reason: String,
    },
    /// A token setting holds nothing but white space, which would be a token anyone
    /// guesses.
    #[error("{0} is set but empty")]
    EmptyToken(&'static str),
    /// Worker routes would be open on an address that is not loopback.
    #[error(
        "refusing to start: {0} is not a loopback address and no worker token is set, so \
         anyone who reaches the port would be handed the proxies' credentials by assign; set \
         WORKER_TOKEN or WORKER_TOKEN_FILE, or ALLOW_ANONYMOUS_WORKERS=true if open worker \
         routes are meant"
    )]
    AnonymousWorkers(SocketAddr),
    /// The gateway would be an open proxy on an address that is not loopback.
    #[error(
        "refusing to start: {0} {1} is not a loopback address and no worker token \
         is set, so anyone who reaches the port could use the pools' proxies; set WORKER_TOKEN \
         or WORKER_TOKEN_FILE (the gateway's proxy password)"
    )]
    OpenGateway(&'static str, SocketAddr),
    /// `GATEWAY_CA_FILE` cannot be read or holds no certificate.
    #[error("cannot read GATEWAY_CA_FILE {path}: {reason}")]
    GatewayCa {
        /// The file.
        path: String,
        /// The cause.
        reason: String,
    },
    /// The Redis settings do not name exactly one way to reach Redis.
    #[error("invalid Redis settings: {0}")]
    RedisSettings(#[from] RedisSettingsError),
    /// The store could not be set up.
    #[error("cannot set up the store: {0}")]
    Store(#[from] StoreError),
    /// `DATA_DIR` is set together with a Redis setting.
    #[error(
        "DATA_DIR is where the embedded store keeps its state, but a Redis setting is given \
         and the state lives in Redis: set one or the other"
    )]
    DataDirWithRedis,
    /// The data directory could not be opened.
    #[error("cannot open the data directory: {0}")]
    DataDir(#[from] OpenError),
}

/// The gateway and its bound ports (at least one of them).
struct GatewayPorts {
    /// `GATEWAY_LISTEN`.
    http: Option<GuardedListener>,
    /// `GATEWAY_SOCKS_LISTEN`.
    socks: Option<GuardedListener>,
    gateway: Gateway,
}

/// A bound, ready-to-run service.
pub struct Application {
    api: GuardedListener,
    probes: Option<GuardedListener>,
    gateway: Option<GatewayPorts>,
    router: Router,
    probe_router: Router,
    store: Arc<dyn Store>,
    snapshot: PoolSnapshot,
    geoip: GeoIp,
    config: Config,
}

impl Application {
    /// Checks the tokens, raises the open-file limit, connects the store and binds the
    /// listeners.
    ///
    /// # Errors
    /// A [`StartupError`] when an address cannot be bound, a token file cannot be read,
    /// worker routes would be open on an address that is not loopback, or the Redis
    /// settings are contradictory or invalid. An unreachable Redis is not an error: the
    /// service starts and reports not ready until Redis answers.
    pub async fn build(config: Config) -> Result<Self, StartupError> {
        // Before anything else, so that a refused configuration says so at once.
        let worker_token = worker_token(&config)?;
        let admin_token = admin_token(&config)?;
        let store = store(&config).await?;
        Self::assemble(config, store, admin_token, worker_token).await
    }

    /// Binds the listener and serves `store`, which `config`'s store settings are taken to
    /// describe.
    ///
    /// # Errors
    /// As [`Application::build`], but for the store.
    pub async fn with_store(config: Config, store: Arc<dyn Store>) -> Result<Self, StartupError> {
        let worker_token = worker_token(&config)?;
        let admin_token = admin_token(&config)?;
        Self::assemble(config, store, admin_token, worker_token).await
    }

    async fn assemble(
        config: Config,
        store: Arc<dyn Store>,
        admin_token: String,
        worker_token: Option<String>,
    ) -> Result<Self, StartupError> {
        // Before anything is bound: an open gateway on a reachable address is refused.
        let gateway_ports = [
            ("GATEWAY_LISTEN", config.gateway_listen),
            ("GATEWAY_SOCKS_LISTEN", config.gateway_socks_listen),
        ];
        for (option, addr) in gateway_ports {
            if let Some(addr) = addr {
                gateway_token_check(option, addr, worker_token.as_ref())?;
            }
        }
        // One token for both roles makes every worker an administrator: allowed (a test
        // bench may want it), but said.
        if worker_token.as_deref() == Some(admin_token.as_str()) {
            tracing::warn!(
                "ADMIN_TOKEN equals WORKER_TOKEN: every worker can also manage pools and \
                 members; give the workers a token of their own"
            );
        }
        let tokens = Tokens::new(admin_token, worker_token.clone());
        let open_files = open_file_limit();
        crate::monitoring::prometheus();
        let snapshot = PoolSnapshot::new(
            usize::try_from(config.metrics_max_pools).unwrap_or(usize::MAX),
            config.metrics_pools.clone(),
        );
        let tickets = Tickets::new(Duration::from_millis(config.gateway_ticket_ttl_ms));
        let geoip = config
            .geoip_db
            .as_deref()
            .map_or_else(GeoIp::none, GeoIp::open);
        let state = AppState {
            store: Arc::clone(&store),
            tokens: Arc::new(tokens),
            snapshot: snapshot.clone(),
            source_min_interval_ms: config.source_min_interval_ms,
            tickets: tickets.clone(),
            geoip: geoip.clone(),
        };
        let limits = Limits {
            body_bytes: config.body_limit_bytes,
            import_body_bytes: config.import_body_limit_bytes,
            body_read_timeout: config.body_read_timeout(),
            import_body_read_timeout: config.import_body_read_timeout(),
        };
        let router = http::app(state.clone(), limits);
        let probe_router = http::probe_app(state, limits);

        let probe_budget = config
            .probe_listen
            .map(|_| usize::try_from(config.probe_max_connections).unwrap_or(usize::MAX));
        let budget = connections::default_max_connections(open_files, probe_budget.unwrap_or(0));
        let max_connections = match config.max_connections {
            Some(configured) => {
                let configured = usize::try_from(configured).unwrap_or(usize::MAX);
                if configured > budget {
                    tracing::warn!(
                        max_connections = configured,
                        open_files,
                        within_budget = budget,
                        "MAX_CONNECTIONS is more than the open-file limit leaves for the API \
                         port: at the limit, accepts fail and outgoing connections cannot open"
                    );
                }
                configured
            }
            None => budget,
        };
        let limits = |max_connections, authentication| ConnectionLimits {
            max_connections,
            header_read_timeout: config.header_read_timeout(),
            keep_alive_timeout: config.keep_alive_timeout(),
            unauthenticated_timeout: config.unauthenticated_timeout(),
            authentication,
        };
        let bind = |name, addr, max_connections, authentication| async move {
            GuardedListener::bind(name, addr, limits(max_connections, authentication))
                .await
                .map_err(|source| StartupError::Bind { addr, source })
        };
        // Each port's clients get a share of its cap; the probe port has only its own
        // small cap, which an orchestrator's probes never come near.
        let shares = |configured: Option<u64>, cap: usize| {
            let max = configured.map_or_else(
                || connections::default_max_connections_per_client(cap),
                |max| usize::try_from(max).unwrap_or(usize::MAX),
            );
            ClientShares::new(max, config.trusted_client_networks.clone())
        };
        let api = bind("api", config.listen, max_connections, Authentication::Head)
            .await?
            .with_client_shares(shares(config.max_connections_per_client, max_connections));
        let probes = match (config.probe_listen, probe_budget) {
            (Some(addr), Some(budget)) => {
                Some(bind("probe", addr, budget, Authentication::Head).await?)
            }
            _ => None,
        };
        let gateway = if config.gateway_listen.is_some() || config.gateway_socks_listen.is_some() {
            let cap = config.gateway_max_connections.map_or_else(
                || connections::default_max_connections(open_files, 0) / 2,
                |cap| usize::try_from(cap).unwrap_or(usize::MAX),
            );
            let cap = cap.max(1);
            let first = |name, addr| async move {
                Ok::<_, StartupError>(
                    bind(name, addr, cap, Authentication::Service)
                        .await?
                        .with_client_shares(shares(config.gateway_max_connections_per_client, cap)),
                )
            };
            let http = match config.gateway_listen {
                Some(addr) => Some(first("gateway", addr).await?),
                None => None,
            };
            // The SOCKS5 port counts under the HTTP port's cap and in its clients' shares:
            // a client's share spans the gateway's ports.
            let socks = match (config.gateway_socks_listen, &http) {
                (Some(addr), Some(http)) => Some(
                    http.bind_beside("socks5", addr)
                        .await
                        .map_err(|source| StartupError::Bind { addr, source })?,
                ),
                (Some(addr), None) => Some(first("socks5", addr).await?),
                (None, _) => None,
            };
            let dialer = Dialer::new(gateway_roots(&config)?);
            let gateway = Gateway::new(
                Arc::clone(&store),
                worker_token,
                config.gateway_settings(),
                snapshot.clone(),
                dialer,
                tickets,
            );
            Some(GatewayPorts {
                http,
                socks,
                gateway,
            })
        } else {
            None
        };
        Ok(Self {
            api,
            probes,
            gateway,
            router,
            probe_router,
            store,
            snapshot,
            geoip,
            config,
        })
    }

    /// The address actually bound (useful with port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.api.local_addr().unwrap_or(self.config.listen)
    }

    /// The probe port's address, when `PROBE_LISTEN` is set.
    pub fn probe_addr(&self) -> Option<SocketAddr> {
        self.probes
            .as_ref()
            .and_then(|probes| probes.local_addr().ok())
    }

    /// The gateway's address, when `GATEWAY_LISTEN` is set.
    pub fn gateway_addr(&self) -> Option<SocketAddr> {
        self.gateway
            .as_ref()
            .and_then(|ports| ports.http.as_ref())
            .and_then(|listener| listener.local_addr().ok())
    }

    /// The gateway's SOCKS5 address, when `GATEWAY_SOCKS_LISTEN` is set.
    pub fn gateway_socks_addr(&self) -> Option<SocketAddr> {
        self.gateway
            .as_ref()
            .and_then(|ports| ports.socks.as_ref())
            .and_then(|listener| listener.local_addr().ok())
    }

    /// Serves until `shutdown` completes, then stops accepting connections and lets the
    /// requests in flight finish, for at most the configured shutdown timeout. The
    /// background sweep, the active checks and the metrics refresher run alongside and stop
    /// with the server.
    ///
    /// Both ports accept through [`GuardedListener`]s, which cap their connections and
    /// close those that keep a request head (or an idle keep-alive) waiting too long.
    ///
    /// # Errors
    /// None today: accept errors are logged and retried; the type leaves room for one.
    pub async fn run_until_stopped(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        let drain = self.config.shutdown_timeout();
        let graceful = GracefulShutdown::new();
        let api_limits = self.api.limits();
        let dashboard = dashboard_url(self.local_addr());
        tracing::info!(
            addr = %self.local_addr(),
            max_connections = api_limits.max_connections,
            %dashboard,
            max_connections_per_client = self.api.client_shares().map(ClientShares::max_per_client),
            "listening"
        );
        if crate::telemetry::is_text() {
            tracing::info!("the dashboard is at {dashboard} (it asks for the admin token)");
        }
        if let (Some(addr), Some(probes)) = (self.probe_addr(), &self.probes) {
            tracing::info!(
                %addr,
                max_connections = probes.limits().max_connections,
                "probes listening"
            );
        }
        if let Some(ports) = &self.gateway {
            for (listener, what) in [
                (&ports.http, "gateway listening"),
                (&ports.socks, "gateway SOCKS5 listening"),
            ] {
                let Some(listener) = listener else { continue };
                tracing::info!(
                    addr = %listener.local_addr().map_or_else(|_| "?".to_owned(), |addr| addr.to_string()),
                    max_connections = listener.limits().max_connections,
                    max_connections_per_client =
                        listener.client_shares().map(ClientShares::max_per_client),
                    "{what}"
                );
            }
        }
        // Background tasks stop when this flips to true, after the requests have drained.
        let (stop_tasks, stopping) = tokio::sync::watch::channel(false);
        let stopped = move || {
            let mut stopping = stopping.clone();
            async move {
                let _ = stopping.wait_for(|stop| *stop).await;
            }
        };
        let tasks = [
            tokio::spawn(sweep::run(
                Arc::clone(&self.store),
                self.config.sweep_interval(),
                stopped(),
            )),
            tokio::spawn(checker::run(
                Arc::clone(&self.store),
                self.geoip.clone(),
                self.config.check_tick(),
                stopped(),
            )),
            tokio::spawn(sources::run(
                Arc::clone(&self.store),
                self.geoip.clone(),
                self.config.source_settings(),
                stopped(),
            )),
            tokio::spawn(
                self.geoip
                    .clone()
                    .watch(self.config.geoip_reload(), stopped()),
            ),
            tokio::spawn(self.snapshot.clone().run(
                Arc::clone(&self.store),
                self.config.metrics_refresh(),
                stopped(),
            )),
            tokio::spawn(self.snapshot.clone().sample_activity(stopped())),
        ];
        // Both listeners stop accepting when the shutdown signal arrives.
        let (stop_accepting, accepting) = tokio::sync::watch::channel(false);
        let stop = || {
            let mut accepting = accepting.clone();
            async move {
                let _ = accepting.wait_for(|stop| *stop).await;
            }
        };
        let api = self.api.serve_http(service(self.router), &graceful, stop());
        let probes = async {
            if let Some(probes) = self.probes {
                probes
                    .serve_http(service(self.probe_router), &graceful, stop())
                    .await;
            }
        };
        let tunnels = self
            .gateway
            .as_ref()
            .map(|ports| ports.gateway.tunnels().clone());
        let (http_gateway, socks_gateway) = match self.gateway {
            Some(ports) => (
                ports.http.map(|listener| (listener, ports.gateway.clone())),
                ports.socks.map(|listener| (listener, ports.gateway)),
            ),
            None => (None, None),
        };
        let http_gateway = async {
            if let Some((listener, gateway)) = http_gateway {
                let service = tower::service_fn(move |request| gateway.clone().handle(request));
                listener.serve_http(service, &graceful, stop()).await;
            }
        };
        let socks_gateway = async {
            if let Some((listener, gateway)) = socks_gateway {
                let serve = move |accepted| gateway.clone().serve_socks(accepted);
                listener.serve_streams(serve, stop()).await;
            }
        };
        let signal = async {
            shutdown.await;
            let _ = stop_accepting.send(true);
        };
        tokio::join!(api, probes, http_gateway, socks_gateway, signal);
        tracing::info!(
            connections = graceful.count(),
            tunnels = tunnels.as_ref().map_or(0, Tunnels::open),
            "shutting down: draining requests in flight"
        );
        let tunnels_drained = async {
            if let Some(tunnels) = &tunnels {
                tunnels.drained().await;
            }
        };
        let drained = async { tokio::join!(graceful.shutdown(), tunnels_drained) };
        if tokio::time::timeout(drain, drained).await.is_err() {
            tracing::warn!(
                timeout_ms = drain.as_millis(),
                "drain timeout reached; closing the remaining connections"
            );
            if let Some(tunnels) = &tunnels {
                // Closed tunnels give their leases back on the way out; that takes a store
                // round trip each, not another drain.
                tunnels.close_all();
                let _ = tokio::time::timeout(Duration::from_secs(1), tunnels.drained()).await;
            }
        }
        let _ = stop_tasks.send(true);
        // The tasks only ever end by being told to; a panic inside one is not the server's
        // failure, so their join results are not the run's result.
        for task in tasks {
            let _ = task.await;
        }
        // Last: everything answered is made durable, and nothing after it is accepted.
        self.store.close().await;
        Ok(())
    }
}

/// The router as a service of hyper's requests.
fn service(
    router: Router,
) -> impl tower::Service<
    hyper::Request<hyper::body::Incoming>,
    Response = axum::response::Response,
    Error = std::convert::Infallible,
    Future = impl Send + 'static,
> + Clone
+ Send
+ 'static {
    router.map_request(|req: hyper::Request<hyper::body::Incoming>| req.map(Body::new))
}

/// Raises the soft open-file limit to the hard one and logs both; returns the limit in
/// force.
fn open_file_limit() -> u64 {
    match connections::raise_open_file_limit() {
        Ok(limit) => {
            tracing::info!(
                soft = limit.soft,
                hard = limit.hard,
                soft_at_start = limit.was,
                "open-file limit"
            );
            limit.soft
        }
        Err(error) => {
            let soft = rlimit::getrlimit(rlimit::Resource::NOFILE).map_or(1024, |(soft, _)| soft);
            tracing::warn!(%error, soft, "cannot raise the open-file limit");
            soft
        }
    }
}

/// Reads a token from a file, surrounding white space left out.
fn read_token_file(what: &'static str, path: &Path) -> Result<String, StartupError> {
    let failure = |reason: String| StartupError::TokenFile {
        what,
        path: path.display().to_string(),
        reason,
    };
    let text = std::fs::read_to_string(path).map_err(|e| failure(e.to_string()))?;
    let token = text.trim();
    if token.is_empty() {
        return Err(failure("the file is empty".to_owned()));
    }
    Ok(token.to_owned())
}

/// The worker token, from `WORKER_TOKEN` or `WORKER_TOKEN_FILE`; without one, the listen
/// address must be loopback unless open worker routes are explicitly allowed.
fn worker_token(config: &Config) -> Result<Option<String>, StartupError> {
    let token = match (&config.worker_token, &config.worker_token_file) {
        (Some(token), _) if token.trim().is_empty() => {
            return Err(StartupError::EmptyToken("WORKER_TOKEN"));
        }
        (Some(token), _) => Some(token.clone()),
        (None, Some(path)) => Some(read_token_file("worker token", path)?),
        (None, None) => None,
    };
    if token.is_none() && !config.listen.ip().to_canonical().is_loopback() {
        if !config.allow_anonymous_workers {
            return Err(StartupError::AnonymousWorkers(config.listen));
        }
        tracing::warn!(
            addr = %config.listen,
            "ALLOW_ANONYMOUS_WORKERS: worker routes are open on an address that is not \
             loopback; anyone who reaches it is handed the proxies' credentials"
        );
    }
    Ok(token)
}

/// The extra CA certificates of `GATEWAY_CA_FILE`, none when it is unset.
fn gateway_roots(
    config: &Config,
) -> Result<Vec<tokio_rustls::rustls::pki_types::CertificateDer<'static>>, StartupError> {
    use tokio_rustls::rustls::pki_types::CertificateDer;
    use tokio_rustls::rustls::pki_types::pem::PemObject;
    let Some(path) = &config.gateway_ca_file else {
        return Ok(Vec::new());
    };
    let failure = |reason: String| StartupError::GatewayCa {
        path: path.display().to_string(),
        reason,
    };
    let pem = std::fs::read(path).map_err(|e| failure(e.to_string()))?;
    let roots = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| failure(e.to_string()))?;
    if roots.is_empty() {
        return Err(failure("no certificate in the file".to_owned()));
    }
    Ok(roots)
}

/// Without a worker token the gateway would be an open proxy: only a loopback address is
/// allowed, and the log says so.
fn gateway_token_check(
    option: &'static str,
    addr: SocketAddr,
    token: Option<&String>,
) -> Result<(), StartupError> {
    if token.is_some() {
        return Ok(());
    }
    if !addr.ip().to_canonical().is_loopback() {
        return Err(StartupError::OpenGateway(option, addr));
    }
    tracing::warn!(
        %addr,
        "no worker token: the gateway takes any proxy password, which only a loopback \
         address allows; set WORKER_TOKEN to require it"
    );
    Ok(())
}

/// The store `config` names: Redis, or the embedded store in `DATA_DIR` or in memory.
///
/// # Errors
/// [`StartupError`] when the settings contradict each other or the data directory cannot
/// be opened (in use, damaged, unreadable).
pub async fn store(config: &Config) -> Result<Arc<dyn Store>, StartupError> {
    let topology = config.redis_topology()?;
    if topology.is_some() && config.data_dir.is_some() {
        return Err(StartupError::DataDirWithRedis);
    }
    if let Some(topology) = topology {
        return Ok(Arc::new(
            RedisStore::connect(RedisStoreOptions {
                topology,
                key_prefix: config.key_prefix.clone(),
                timeout: config.store_timeout(),
                connections: config.redis_connections,
                walk_turn: config.sweep_interval() * 9 / 10,
            })
            .await?,
        ));
    }
    let Some(dir) = &config.data_dir else {
        tracing::warn!(
            "no REDIS_URL, REDIS_CLUSTER_URLS or REDIS_SENTINEL_URLS: using the embedded store \
             in memory; pools are neither shared with other replicas nor kept across restarts \
             (set DATA_DIR to keep them)"
        );
        return Ok(Arc::new(EmbeddedStore::new()));
    };
    let options = DataDirOptions {
        fsync_interval: config.fsync_interval(),
        timeout: config.store_timeout(),
        ..DataDirOptions::new(dir.clone())
    };
    // Reading a large directory takes a moment of blocking file I/O.
    let store = tokio::task::spawn_blocking(move || EmbeddedStore::open(options))
        .await
        .map_err(|error| StartupError::Store(StoreError::Unavailable(Box::new(error))))??;
    tracing::info!(
        data_dir = %dir.display(),
        fsync_interval_ms = config.fsync_interval_ms,
        "using the embedded store in DATA_DIR: pools are kept across restarts, not shared \
         with other replicas; changes of configuration and membership are on disk before \
         they are answered, counts within FSYNC_INTERVAL_MS"
    );
    Ok(Arc::new(store))
}

fn admin_token(config: &Config) -> Result<String, StartupError> {
    if let Some(token) = &config.admin_token {
        return Ok(token.clone());
    }
    if let Some(path) = &config.admin_token_file {
        return read_token_file("admin token", path);
    }
    let token = random_token();
    // Logged once, on purpose: without it nobody could use the admin routes, and leaving
    // them open by accident would be worse. In text the token is in the sentence, where a
    // person at the terminal finds it; in JSON it stays the field it always was.
    if crate::telemetry::is_text() {
        tracing::warn!(
            "no ADMIN_TOKEN or ADMIN_TOKEN_FILE: generated the admin token {token} for this \
             process; paste it into the dashboard or pass it to the operator commands as \
             ADMIN_TOKEN (it changes at every start unless you set one)"
        );
    } else {
        tracing::warn!(
            admin_token = token.as_str(),
            "no ADMIN_TOKEN or ADMIN_TOKEN_FILE: generated an admin token for this process"
        );
    }
    Ok(token)
}

/// Where a browser on this machine finds the dashboard of the API port bound at `addr`: an
/// unspecified address (`0.0.0.0`, `::`) is reached on loopback.
pub fn dashboard_url(addr: SocketAddr) -> String {
    let ip = match addr.ip() {
        ip if !ip.is_unspecified() => ip,
        std::net::IpAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
        std::net::IpAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
    };
    format!("http://{}/ui", SocketAddr::new(ip, addr.port()))
}

/// 32 random bytes as hex.
pub fn random_token() -> String {
    let bytes: [u8; 32] = rand::random();
    crate::domain::hex(&bytes)
}

/// Completes on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    let interrupt = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = interrupt => {},
        () = terminate => {},
    }
}
