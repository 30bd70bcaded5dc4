//! Building the application from its configuration and running it until it is stopped.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tower::ServiceExt;

use crate::config::{Config, RedisSettingsError};
use crate::http::{self, AppState, Limits, Tokens};
use crate::monitoring::PoolSnapshot;
use crate::store::{
    DataDirOptions, EmbeddedStore, OpenError, RedisStore, RedisStoreOptions, Store, StoreError,
};
use crate::{checker, sweep};

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
    /// The admin token file could not be read or is empty.
    #[error("cannot read the admin token from {path}: {reason}")]
    AdminTokenFile {
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

/// A bound, ready-to-run service.
pub struct Application {
    listener: TcpListener,
    router: Router,
    store: Arc<dyn Store>,
    snapshot: PoolSnapshot,
    config: Config,
}

impl Application {
    /// Binds the listener and connects the store.
    ///
    /// # Errors
    /// A [`StartupError`] when the address cannot be bound, the token file cannot be read,
    /// or the Redis settings are contradictory or invalid. An unreachable Redis is not an error: the service starts
    /// and reports not ready until Redis answers.
    pub async fn build(config: Config) -> Result<Self, StartupError> {
        let store = store(&config).await?;
        Self::with_store(config, store).await
    }

    /// Binds the listener and serves `store`, which `config`'s store settings are taken to
    /// describe.
    ///
    /// # Errors
    /// As [`Application::build`], but for the store.
    pub async fn with_store(config: Config, store: Arc<dyn Store>) -> Result<Self, StartupError> {
        let tokens = Tokens::new(admin_token(&config)?, config.worker_token.clone());
        crate::monitoring::prometheus();
        let snapshot = PoolSnapshot::default();
        let state = AppState {
            store: Arc::clone(&store),
            tokens: Arc::new(tokens),
            snapshot: snapshot.clone(),
        };
        let router = http::app(
            state,
            Limits {
                body_bytes: config.body_limit_bytes,
                import_body_bytes: config.import_body_limit_bytes,
            },
        );
        let listener =
            TcpListener::bind(config.listen)
                .await
                .map_err(|source| StartupError::Bind {
                    addr: config.listen,
                    source,
                })?;
        Ok(Self {
            listener,
            router,
            store,
            snapshot,
            config,
        })
    }

    /// The address actually bound (useful with port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.listener.local_addr().unwrap_or(self.config.listen)
    }

    /// Serves until `shutdown` completes, then stops accepting connections and lets the
    /// requests in flight finish, for at most the configured shutdown timeout. The
    /// background sweep, the active checks and the metrics refresher run alongside and stop
    /// with the server.
    ///
    /// The accept loop is this crate's own rather than `axum::serve` so that HTTP/1 header
    /// reads have a deadline: a client that trickles its headers byte by byte is cut off
    /// after `HEADER_READ_TIMEOUT_MS` instead of holding a connection forever.
    ///
    /// # Errors
    /// An I/O error of the listener.
    pub async fn run_until_stopped(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        let drain = self.config.shutdown_timeout();
        let mut builder = Builder::new(TokioExecutor::new());
        builder
            .http1()
            .timer(TokioTimer::new())
            .header_read_timeout(self.config.header_read_timeout())
            .max_buf_size(MAX_HEADER_BYTES);
        let graceful = GracefulShutdown::new();
        tracing::info!(addr = %self.local_addr(), "listening");
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
                self.config.check_tick(),
                stopped(),
            )),
            tokio::spawn(self.snapshot.clone().run(
                Arc::clone(&self.store),
                self.config.metrics_refresh(),
                stopped(),
            )),
        ];
        let mut shutdown = std::pin::pin!(shutdown);
        loop {
            let (stream, _peer) = tokio::select! {
                accepted = self.listener.accept() => match accepted {
                    Ok(accepted) => accepted,
                    Err(error) => {
                        // Out of file descriptors and the like: back off instead of spinning.
                        tracing::warn!(%error, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
                () = &mut shutdown => break,
            };
            let _ = stream.set_nodelay(true);
            let service = TowerToHyperService::new(
                self.router
                    .clone()
                    .map_request(|req: hyper::Request<hyper::body::Incoming>| req.map(Body::new)),
            );
            let connection = builder
                .serve_connection_with_upgrades(TokioIo::new(stream), service)
                .into_owned();
            let connection = graceful.watch(connection);
            tokio::spawn(async move {
                if let Err(error) = connection.await {
                    tracing::debug!(error = %error, "connection ended with an error");
                }
            });
        }
        drop(self.listener);
        tracing::info!(
            connections = graceful.count(),
            "shutting down: draining requests in flight"
        );
        if tokio::time::timeout(drain, graceful.shutdown())
            .await
            .is_err()
        {
            tracing::warn!(
                timeout_ms = drain.as_millis(),
                "drain timeout reached; closing the remaining connections"
            );
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

/// Largest request head (request line and headers) accepted, in bytes; beyond it the
/// connection answers 431.
const MAX_HEADER_BYTES: usize = 64 * 1024;

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
        let failure = |reason: String| StartupError::AdminTokenFile {
            path: path.display().to_string(),
            reason,
        };
        let text = std::fs::read_to_string(path).map_err(|e| failure(e.to_string()))?;
        let token = text.trim();
        if token.is_empty() {
            return Err(failure("the file is empty".to_owned()));
        }
        return Ok(token.to_owned());
    }
    let token = random_token();
    // Logged once, on purpose: without it nobody could use the admin routes, and leaving
    // them open by accident would be worse.
    tracing::warn!(
        admin_token = token.as_str(),
        "no ADMIN_TOKEN or ADMIN_TOKEN_FILE: generated an admin token for this process"
    );
    Ok(token)
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
