//! Every option of the service: a flag, an environment variable and a default, in one place.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, ValueEnum};

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// JSON when standard output is not a terminal, text when it is.
    Auto,
    /// One JSON object per line.
    Json,
    /// Human-readable text.
    Text,
}

/// The service's configuration: the options of `proxy-allocator serve`, which are also
/// those of `proxy-allocator` without a subcommand (see [`crate::cli::Cli`]).
#[derive(Debug, Clone, Parser)]
pub struct Config {
    /// Address to listen on; port 0 picks a free port.
    #[arg(long = "listen", env = "LISTEN_ADDR", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,

    /// Redis URL (`redis://` or `rediss://`). Without it the service runs on its embedded
    /// store: state is neither shared between replicas nor kept across restarts.
    #[arg(long, env = "REDIS_URL")]
    pub redis_url: Option<String>,

    /// Prefix of every Redis key, so several deployments can share one Redis.
    #[arg(long, env = "KEY_PREFIX", default_value = "pa", value_parser = parse_key_prefix)]
    pub key_prefix: String,

    /// Longest time one store operation may take, in milliseconds; past it the request
    /// answers 503 `store_unavailable`.
    #[arg(long, env = "STORE_TIMEOUT_MS", default_value_t = 1000)]
    pub store_timeout_ms: u64,

    /// Redis connections kept open; each one is shared by many concurrent requests.
    #[arg(long, env = "REDIS_CONNECTIONS", default_value_t = 4)]
    pub redis_connections: usize,

    /// Largest request body accepted, in bytes.
    #[arg(long, env = "BODY_LIMIT_BYTES", default_value_t = 1024 * 1024)]
    pub body_limit_bytes: usize,

    /// Token required on admin routes. When neither this nor `ADMIN_TOKEN_FILE` is set, a
    /// random token is generated at startup and logged once.
    #[arg(long, env = "ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,

    /// File holding the admin token (surrounding white space ignored).
    #[arg(long, env = "ADMIN_TOKEN_FILE", conflicts_with = "admin_token")]
    pub admin_token_file: Option<PathBuf>,

    /// Token required on worker routes (assign, lease release and renewal). When unset, worker routes are open. The
    /// admin token is accepted there too.
    #[arg(long, env = "WORKER_TOKEN", hide_env_values = true)]
    pub worker_token: Option<String>,

    /// Longest time, in milliseconds, that shutdown waits for requests in flight.
    #[arg(long, env = "SHUTDOWN_TIMEOUT_MS", default_value_t = 10_000)]
    pub shutdown_timeout_ms: u64,

    /// Longest time, in milliseconds, a client may take to send a request's headers; a
    /// slower connection is closed so that it cannot hold resources.
    #[arg(long, env = "HEADER_READ_TIMEOUT_MS", default_value_t = 5_000)]
    pub header_read_timeout_ms: u64,

    /// How often, in milliseconds, the background reaper reclaims expired leases in every
    /// pool (assigns also reclaim a few in their own pool). A crashed worker's lease is back
    /// within its ttl plus this interval, even in a pool nobody assigns from.
    #[arg(long, env = "REAP_INTERVAL_MS", default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..))]
    pub reap_interval_ms: u64,

    /// Log format. The level is set with `RUST_LOG` (default `info`).
    #[arg(long, env = "LOG_FORMAT", value_enum, default_value_t = LogFormat::Auto)]
    pub log_format: LogFormat,
}

impl Config {
    /// The store timeout as a duration.
    pub fn store_timeout(&self) -> Duration {
        Duration::from_millis(self.store_timeout_ms)
    }

    /// The shutdown drain timeout as a duration.
    pub fn shutdown_timeout(&self) -> Duration {
        Duration::from_millis(self.shutdown_timeout_ms)
    }

    /// The header read timeout as a duration.
    pub fn header_read_timeout(&self) -> Duration {
        Duration::from_millis(self.header_read_timeout_ms)
    }

    /// The reaper interval as a duration.
    pub fn reap_interval(&self) -> Duration {
        Duration::from_millis(self.reap_interval_ms)
    }

    /// A configuration with every default, for tests and embedding.
    pub fn defaults() -> Self {
        // Parsing no arguments cannot fail: every option has a default or is optional.
        // Environment variables are read, exactly as for the binary.
        Self::parse_from(["proxy-allocator"])
    }
}

/// Key prefixes may not hold `{` or `}` (they would move keys out of their pool's hash slot)
/// nor white space.
fn parse_key_prefix(text: &str) -> Result<String, String> {
    let ok = !text.is_empty()
        && text.len() <= 64
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b':'));
    if ok {
        Ok(text.to_owned())
    } else {
        Err("1 to 64 characters of A-Z, a-z, 0-9, '.', '_', '-' and ':'".to_owned())
    }
}
