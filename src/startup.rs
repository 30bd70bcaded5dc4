//! Building the application from its configuration and running it until it is stopped.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use tokio::net::TcpListener;

use crate::config::Config;
use crate::http::{self, AppState, Limits, Tokens};
use crate::store::{EmbeddedStore, RedisStore, RedisStoreOptions, Store, StoreError};

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
    /// The store could not be set up.
    #[error("cannot set up the store: {0}")]
    Store(#[from] StoreError),
}

/// A bound, ready-to-run service.
pub struct Application {
    listener: TcpListener,
    router: Router,
    config: Config,
}

impl Application {
    /// Binds the listener and connects the store.
    ///
    /// # Errors
    /// A [`StartupError`] when the address cannot be bound, the token file cannot be read,
    /// or the Redis URL is invalid. An unreachable Redis is not an error: the service starts
    /// and reports not ready until Redis answers.
    pub async fn build(config: Config) -> Result<Self, StartupError> {
        let store: Arc<dyn Store> = match &config.redis_url {
            Some(url) => Arc::new(
                RedisStore::connect(RedisStoreOptions {
                    url: url.clone(),
                    key_prefix: config.key_prefix.clone(),
                    timeout: config.store_timeout(),
                    connections: config.redis_connections,
                })
                .await?,
            ),
            None => {
                tracing::warn!(
                    "no REDIS_URL: using the embedded store; pools are neither shared with \
                     other replicas nor kept across restarts"
                );
                Arc::new(EmbeddedStore::new())
            }
        };
        let tokens = Tokens::new(admin_token(&config)?, config.worker_token.clone());
        let state = AppState {
            store,
            tokens: Arc::new(tokens),
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
            config,
        })
    }

    /// The address actually bound (useful with port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.listener.local_addr().unwrap_or(self.config.listen)
    }

    /// Serves until `shutdown` completes, then stops accepting connections and lets the
    /// requests in flight finish, for at most the configured shutdown timeout.
    ///
    /// # Errors
    /// An I/O error of the listener.
    pub async fn run_until_stopped(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        let drain = self.config.shutdown_timeout();
        let (stopping_tx, stopping_rx) = tokio::sync::oneshot::channel::<()>();
        let signal = async move {
            shutdown.await;
            tracing::info!("shutting down: draining requests in flight");
            let _ = stopping_tx.send(());
        };
        tracing::info!(addr = %self.local_addr(), "listening");
        let server = axum::serve(self.listener, self.router).with_graceful_shutdown(signal);
        let deadline = async move {
            if stopping_rx.await.is_ok() {
                tokio::time::sleep(drain).await;
            } else {
                std::future::pending::<()>().await;
            }
        };
        tokio::select! {
            result = server.into_future() => result,
            () = deadline => {
                tracing::warn!(timeout_ms = drain.as_millis(), "drain timeout reached; closing the remaining connections");
                Ok(())
            }
        }
    }
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
    use std::fmt::Write;
    let bytes: [u8; 32] = rand::random();
    bytes.iter().fold(String::with_capacity(64), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
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
