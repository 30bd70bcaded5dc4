//! Every option of the service: a flag, an environment variable and a default, in one place.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, ValueEnum};

pub use crate::store::RedisTopology;

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
    /// Address to listen on; port 0 picks a free port. On an address that is not loopback
    /// the service needs a worker token (or `ALLOW_ANONYMOUS_WORKERS=true`): assign hands
    /// out members' proxy credentials to whoever reaches the port.
    #[arg(long = "listen", env = "LISTEN_ADDR", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,

    /// A second address that serves only `/livez`, `/readyz` and `/metrics`, with its own
    /// small connection budget, so that a flood of the API port never makes an
    /// orchestrator restart a healthy replica. Unset: no probe port (the API port serves
    /// the probes as well, always).
    #[arg(long, env = "PROBE_LISTEN")]
    pub probe_listen: Option<SocketAddr>,

    /// Most connections the probe port keeps open at once.
    #[arg(long, env = "PROBE_MAX_CONNECTIONS", default_value_t = 32, value_parser = clap::value_parser!(u64).range(1..))]
    pub probe_max_connections: u64,

    /// Most connections the API port keeps open at once; beyond it new connections are
    /// closed at once (answered 503 with `Retry-After` when their request has already
    /// arrived), and those already open keep being served. Unset: half of the open-file
    /// limit left after 128 files and the probe port's budget, so that Redis, active checks
    /// and other outgoing connections always have files to spare.
    #[arg(long, env = "MAX_CONNECTIONS", value_parser = clap::value_parser!(u64).range(1..))]
    pub max_connections: Option<u64>,

    /// Most connections one client (an IPv4 address, an IPv6 /64) keeps open at once on the
    /// API port; beyond it that client's new connections are closed at once (503 with
    /// `Retry-After` when their request has already arrived) while other clients keep
    /// connecting. Unset: a quarter of the API port's cap. Behind a load balancer every
    /// client is the balancer's address, unless it is in `TRUSTED_CLIENT_NETWORKS`.
    #[arg(long, env = "MAX_CONNECTIONS_PER_CLIENT", value_parser = clap::value_parser!(u64).range(1..))]
    pub max_connections_per_client: Option<u64>,

    /// Addresses and networks, comma-separated (`10.0.0.0/8,2001:db8::/32,192.0.2.7`), that
    /// `MAX_CONNECTIONS_PER_CLIENT` and `GATEWAY_MAX_CONNECTIONS_PER_CLIENT` do not apply
    /// to: a load balancer or proxy in front of the service, through which many clients
    /// come from one address. The port's own cap still does.
    #[arg(long, env = "TRUSTED_CLIENT_NETWORKS", value_delimiter = ',', value_parser = parse_network)]
    pub trusted_client_networks: Vec<crate::domain::Network>,

    /// Longest time, in milliseconds, a connection may stay unauthenticated after accept
    /// when that is shorter than its other timeouts: on the API port until its first
    /// complete request head, on the gateway until a request carries the right proxy
    /// credentials. So idle and trickling sockets are reclaimed quickly.
    #[arg(long, env = "UNAUTHENTICATED_TIMEOUT_MS", default_value_t = 5_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub unauthenticated_timeout_ms: u64,

    /// Redis URL (`redis://` or `rediss://`). Without it (and without a Cluster or Sentinel
    /// setting) the service runs on its embedded store, for one replica: in memory, or in
    /// `DATA_DIR` when that is set.
    #[arg(long, env = "REDIS_URL")]
    pub redis_url: Option<String>,

    /// Directory where the embedded store keeps its state (created when missing): it is
    /// recovered at start, and only one process may open it. Without it the embedded store
    /// keeps nothing across a restart. Not used with Redis.
    #[arg(long, env = "DATA_DIR")]
    pub data_dir: Option<PathBuf>,

    /// With `DATA_DIR`: at most how long, in milliseconds, an assignment count or an
    /// outcome (health) change stays in memory only; 0 fsyncs before every answer. Changes
    /// of configuration and membership, and leases issued, are always fsynced before their
    /// answer.
    #[arg(long, env = "FSYNC_INTERVAL_MS", default_value_t = 1000)]
    pub fsync_interval_ms: u64,

    /// Seed nodes of a Redis Cluster, comma-separated URLs; the rest of the cluster is
    /// discovered from them. An alternative to `REDIS_URL`.
    #[arg(long, env = "REDIS_CLUSTER_URLS")]
    pub redis_cluster_urls: Option<String>,

    /// Sentinels, comma-separated URLs; the service connects to the primary they name for
    /// `REDIS_SENTINEL_MASTER` and follows it through failovers. An alternative to
    /// `REDIS_URL`.
    #[arg(long, env = "REDIS_SENTINEL_URLS")]
    pub redis_sentinel_urls: Option<String>,

    /// The name under which the sentinels monitor the primary (`sentinel monitor <name> ...`).
    #[arg(long, env = "REDIS_SENTINEL_MASTER")]
    pub redis_sentinel_master: Option<String>,

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

    /// Largest request body accepted, in bytes (every route but the import).
    #[arg(long, env = "BODY_LIMIT_BYTES", default_value_t = 1024 * 1024)]
    pub body_limit_bytes: usize,

    /// Largest list `POST /pools/{pool}/import` accepts, in bytes.
    #[arg(long, env = "IMPORT_BODY_LIMIT_BYTES", default_value_t = 32 * 1024 * 1024)]
    pub import_body_limit_bytes: usize,

    /// Token required on admin routes. When neither this nor `ADMIN_TOKEN_FILE` is set, a
    /// random token is generated at startup and logged once.
    #[arg(long, env = "ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,

    /// File holding the admin token (surrounding white space ignored).
    #[arg(long, env = "ADMIN_TOKEN_FILE", conflicts_with = "admin_token")]
    pub admin_token_file: Option<PathBuf>,

    /// Token required on worker routes (assign, outcome reports, lease release and
    /// renewal). When unset, worker routes are open, which only a loopback listen address
    /// allows unless `ALLOW_ANONYMOUS_WORKERS=true`. The admin token is accepted there too.
    #[arg(long, env = "WORKER_TOKEN", hide_env_values = true)]
    pub worker_token: Option<String>,

    /// File holding the worker token (surrounding white space ignored).
    #[arg(long, env = "WORKER_TOKEN_FILE", conflicts_with = "worker_token")]
    pub worker_token_file: Option<PathBuf>,

    /// Start with open worker routes on an address that is not loopback. Without it (or a
    /// worker token) the service refuses to start there, since assign would hand the
    /// proxies' credentials to anyone who reaches the port.
    #[arg(long, env = "ALLOW_ANONYMOUS_WORKERS")]
    pub allow_anonymous_workers: bool,

    /// Longest time, in milliseconds, that shutdown waits for requests in flight.
    #[arg(long, env = "SHUTDOWN_TIMEOUT_MS", default_value_t = 10_000)]
    pub shutdown_timeout_ms: u64,

    /// Longest time, in milliseconds, a client may take to send a complete request head:
    /// counted from accept for a new connection (whether it sends nothing or part of a
    /// head), and from the first byte of the next request on a keep-alive one. A slower
    /// connection is closed so that it cannot hold resources.
    #[arg(long, env = "HEADER_READ_TIMEOUT_MS", default_value_t = 5_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub header_read_timeout_ms: u64,

    /// Longest time, in milliseconds, a keep-alive connection may stay idle between a
    /// response and the first byte of its next request before it is closed.
    #[arg(long, env = "KEEP_ALIVE_TIMEOUT_MS", default_value_t = 5_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub keep_alive_timeout_ms: u64,

    /// Longest time, in milliseconds, a request body may take to arrive once its head has
    /// (every route but the import); then 408 `request_timeout` and the request is dropped
    /// before it reaches the store.
    #[arg(long, env = "BODY_READ_TIMEOUT_MS", default_value_t = 10_000)]
    pub body_read_timeout_ms: u64,

    /// Longest time, in milliseconds, the list of `POST /pools/{pool}/import` may take to
    /// arrive (up to `IMPORT_BODY_LIMIT_BYTES`, so longer than other bodies).
    #[arg(long, env = "IMPORT_BODY_READ_TIMEOUT_MS", default_value_t = 60_000)]
    pub import_body_read_timeout_ms: u64,

    /// How often, in milliseconds, the background sweep reclaims expired leases and returns
    /// members whose cooldown has ended, in the pools that have them due (assigns also do a
    /// few in their own pool). A crashed worker's lease is back within its ttl plus this interval, and a
    /// cooled-down member within its cooldown plus this interval, even in a pool nobody
    /// assigns from.
    #[arg(long, env = "SWEEP_INTERVAL_MS", default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..))]
    pub sweep_interval_ms: u64,

    /// The sweep interval's former name, refused with a pointer to the new one: a
    /// deployment that still sets it must not run on the default interval unawares.
    #[arg(long = "reap-interval-ms", env = "REAP_INTERVAL_MS", hide = true, value_parser = renamed_to_sweep_interval)]
    renamed_reap_interval: Option<String>,

    /// How often, in milliseconds, the per-pool gauges of `/metrics` are refreshed.
    #[arg(long, env = "METRICS_REFRESH_MS", default_value_t = 5_000, value_parser = clap::value_parser!(u64).range(100..))]
    pub metrics_refresh_ms: u64,

    /// Most pools with series of their own in `/metrics` (per-pool gauges and the `pool`
    /// label of `pa_assigns_total`); every other pool counts under `pool="_other"`, so a
    /// scrape stays small whatever the number of pools.
    #[arg(long, env = "METRICS_MAX_POOLS", default_value_t = 100, value_parser = clap::value_parser!(u64).range(0..=10_000))]
    pub metrics_max_pools: u64,

    /// The pools with series of their own, comma-separated (at most `METRICS_MAX_POOLS`).
    /// Unset: the first `METRICS_MAX_POOLS` pools this replica assigns from.
    #[arg(long, env = "METRICS_POOLS", value_delimiter = ',', value_parser = parse_pool_id)]
    pub metrics_pools: Vec<crate::domain::PoolId>,
    /// How often, in milliseconds, each replica looks for pools whose active check round
    /// is due. A pool's round itself runs once per its `check.interval_ms`, on one replica.
    #[arg(long, env = "CHECK_TICK_MS", default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..))]
    pub check_tick_ms: u64,

    /// A MaxMind-format GeoIP file (GeoLite2 or GeoIP2 Country, City or ASN `.mmdb`) on
    /// local disk. With it, members get the labels `geo_country`, `geo_asn` and `geo_org`
    /// for their exit address (or, before a check sees one, their own address when it is
    /// an IP). The service never looks an address up over the network. A file that cannot
    /// be read is logged, and labels nothing until a valid one replaces it.
    #[arg(long, env = "GEOIP_DB")]
    pub geoip_db: Option<PathBuf>,

    /// How often, in milliseconds, the GeoIP file's modification time and size are looked
    /// at; when either changed the file is read again (the last valid one stays in use
    /// meanwhile).
    #[arg(long, env = "GEOIP_RELOAD_MS", default_value_t = 5_000, value_parser = clap::value_parser!(u64).range(100..))]
    pub geoip_reload_ms: u64,

    /// The shortest `interval_ms` a pool's source may have, in milliseconds (at least
    /// 1,000). Public lists change slowly and their hosts should not be hammered; tests and
    /// private list servers may go lower.
    #[arg(long, env = "SOURCE_MIN_INTERVAL_MS", default_value_t = crate::domain::DEFAULT_SOURCE_MIN_INTERVAL_MS, value_parser = clap::value_parser!(u64).range(1000..))]
    pub source_min_interval_ms: u64,

    /// Longest one fetch of a pool's source may take, in milliseconds, redirects and body
    /// included. Its size is bounded by `IMPORT_BODY_LIMIT_BYTES`.
    #[arg(long, env = "SOURCE_FETCH_TIMEOUT_MS", default_value_t = 30_000, value_parser = clap::value_parser!(u64).range(100..=600_000))]
    pub source_fetch_timeout_ms: u64,

    /// An address for the forward-proxy gateway: an HTTP proxy port (absolute-form `http://`
    /// requests and `CONNECT` tunnels) that picks a pool's member for each request, dials
    /// it, reports the outcome and releases the lease by itself. Clients authenticate with
    /// the pool (and options) as proxy user name and the worker token as password. Without
    /// a worker token it starts only on a loopback address. Unset: no gateway.
    #[arg(long, env = "GATEWAY_LISTEN")]
    pub gateway_listen: Option<SocketAddr>,

    /// An address for the gateway's SOCKS5 port (RFC 1928, user name and password per RFC
    /// 1929): the same user names, password, attempts, outcomes and leases as the HTTP
    /// gateway, for `CONNECT` to IPv4, IPv6 and domain-name addresses. Its connections count
    /// under `GATEWAY_MAX_CONNECTIONS` and each client's share together with the HTTP
    /// port's. Without a worker token it starts only on a loopback address. Unset: none.
    #[arg(long, env = "GATEWAY_SOCKS_LISTEN")]
    pub gateway_socks_listen: Option<SocketAddr>,

    /// Most members one gateway request tries: when dialling one fails before anything was
    /// sent to the client, the next pick is tried, each attempt an assignment and each
    /// failure an outcome report.
    #[arg(long, env = "GATEWAY_ATTEMPTS", default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=10))]
    pub gateway_attempts: u32,

    /// Largest request body, in bytes, the gateway keeps to send again through another
    /// member on a retry of a plain-HTTP request; a larger body is streamed and never
    /// retried.
    #[arg(long, env = "GATEWAY_RETRY_BODY_MAX", default_value_t = 1 << 20, value_parser = clap::value_parser!(u64).range(0..=(64 << 20)))]
    pub gateway_retry_body_max: u64,

    /// How long, in milliseconds, a tunnel's ticket (`x-proxy-allocator-ticket`) stays
    /// valid for an outcome report after the tunnel closes.
    #[arg(long, env = "GATEWAY_TICKET_TTL_MS", default_value_t = 600_000, value_parser = clap::value_parser!(u64).range(1_000..=86_400_000))]
    pub gateway_ticket_ttl_ms: u64,

    /// Most client connections the gateway keeps open at once (each open tunnel also holds
    /// one connection to its upstream). Unset: a quarter of the open-file limit left after
    /// 128 files.
    #[arg(long, env = "GATEWAY_MAX_CONNECTIONS", value_parser = clap::value_parser!(u64).range(1..))]
    pub gateway_max_connections: Option<u64>,

    /// Most connections one client (an IPv4 address, an IPv6 /64) keeps open at once on the
    /// gateway's ports, its open tunnels included; beyond it that client's new connections
    /// are closed at once. Unset: a quarter of `GATEWAY_MAX_CONNECTIONS`. Addresses in
    /// `TRUSTED_CLIENT_NETWORKS` are exempt.
    #[arg(long, env = "GATEWAY_MAX_CONNECTIONS_PER_CLIENT", value_parser = clap::value_parser!(u64).range(1..))]
    pub gateway_max_connections_per_client: Option<u64>,

    /// Longest time, in milliseconds, the gateway gives an upstream member to connect and
    /// complete its proxy handshake (TLS, CONNECT or SOCKS), and an `http://` request's
    /// response head to arrive; past it the attempt is a `failed` outcome.
    #[arg(long, env = "GATEWAY_CONNECT_TIMEOUT_MS", default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub gateway_connect_timeout_ms: u64,

    /// A PEM file of CA certificates the gateway trusts, besides the Mozilla roots, for its
    /// TLS to `https` members (a private proxy fleet's own CA).
    #[arg(long, env = "GATEWAY_CA_FILE")]
    pub gateway_ca_file: Option<PathBuf>,

    /// Longest time, in milliseconds, a gateway tunnel may pass no byte either way before it
    /// is closed (and its lease released).
    #[arg(long, env = "GATEWAY_IDLE_TIMEOUT_MS", default_value_t = 60_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub gateway_idle_timeout_ms: u64,

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

    /// The unauthenticated connections' timeout as a duration.
    pub fn unauthenticated_timeout(&self) -> Duration {
        Duration::from_millis(self.unauthenticated_timeout_ms)
    }

    /// The keep-alive idle timeout as a duration.
    pub fn keep_alive_timeout(&self) -> Duration {
        Duration::from_millis(self.keep_alive_timeout_ms)
    }

    /// The body read timeout as a duration.
    pub fn body_read_timeout(&self) -> Duration {
        Duration::from_millis(self.body_read_timeout_ms)
    }

    /// The import's body read timeout as a duration.
    pub fn import_body_read_timeout(&self) -> Duration {
        Duration::from_millis(self.import_body_read_timeout_ms)
    }

    /// The background sweep's interval as a duration.
    pub fn sweep_interval(&self) -> Duration {
        Duration::from_millis(self.sweep_interval_ms)
    }

    /// The metrics refresh interval as a duration.
    pub fn metrics_refresh(&self) -> Duration {
        Duration::from_millis(self.metrics_refresh_ms)
    }

    /// The fsync interval of the embedded store's data directory as a duration.
    pub fn fsync_interval(&self) -> Duration {
        Duration::from_millis(self.fsync_interval_ms)
    }

    /// How the gateway dials and retries.
    pub fn gateway_settings(&self) -> crate::gateway::Settings {
        crate::gateway::Settings {
            attempts: self.gateway_attempts,
            connect_timeout: Duration::from_millis(self.gateway_connect_timeout_ms),
            idle_timeout: Duration::from_millis(self.gateway_idle_timeout_ms),
            retry_body_max: usize::try_from(self.gateway_retry_body_max).unwrap_or(usize::MAX),
        }
    }

    /// The check tick as a duration.
    pub fn check_tick(&self) -> Duration {
        Duration::from_millis(self.check_tick_ms)
    }

    /// `GEOIP_RELOAD_MS` as a duration.
    pub fn geoip_reload(&self) -> Duration {
        Duration::from_millis(self.geoip_reload_ms)
    }

    /// How the sources' fetcher runs: on the check tick, within the fetch timeout and the
    /// import's body limit.
    pub fn source_settings(&self) -> crate::sources::SourceSettings {
        crate::sources::SourceSettings {
            tick: self.check_tick(),
            timeout: Duration::from_millis(self.source_fetch_timeout_ms),
            max_bytes: self.import_body_limit_bytes,
        }
    }

    /// Where Redis is, from the one Redis setting given; `None` for the embedded store.
    ///
    /// # Errors
    /// [`RedisSettingsError`] when more than one of `REDIS_URL`, `REDIS_CLUSTER_URLS` and
    /// `REDIS_SENTINEL_URLS` is set, when a list is empty, or when only one of
    /// `REDIS_SENTINEL_URLS` and `REDIS_SENTINEL_MASTER` is.
    pub fn redis_topology(&self) -> Result<Option<RedisTopology>, RedisSettingsError> {
        let given: Vec<&'static str> = [
            ("REDIS_URL", self.redis_url.is_some()),
            ("REDIS_CLUSTER_URLS", self.redis_cluster_urls.is_some()),
            ("REDIS_SENTINEL_URLS", self.redis_sentinel_urls.is_some()),
        ]
        .into_iter()
        .filter_map(|(name, set)| set.then_some(name))
        .collect();
        if given.len() > 1 {
            return Err(RedisSettingsError::SeveralTopologies(given.join(" and ")));
        }
        if self.redis_sentinel_master.is_some() && self.redis_sentinel_urls.is_none() {
            return Err(RedisSettingsError::SentinelMasterAlone);
        }
        if let Some(url) = &self.redis_url {
            return Ok(Some(RedisTopology::Standalone { url: url.clone() }));
        }
        if let Some(list) = &self.redis_cluster_urls {
            return Ok(Some(RedisTopology::Cluster {
                seeds: url_list("REDIS_CLUSTER_URLS", list)?,
            }));
        }
        if let Some(list) = &self.redis_sentinel_urls {
            let master = self
                .redis_sentinel_master
                .clone()
                .filter(|name| !name.trim().is_empty())
                .ok_or(RedisSettingsError::SentinelWithoutMaster)?;
            return Ok(Some(RedisTopology::Sentinel {
                sentinels: url_list("REDIS_SENTINEL_URLS", list)?,
                master,
            }));
        }
        Ok(None)
    }

    /// A configuration with every default, for tests and embedding.
    pub fn defaults() -> Self {
        // Parsing no arguments cannot fail: every option has a default or is optional.
        // Environment variables are read, exactly as for the binary.
        Self::parse_from(["proxy-allocator"])
    }
}

fn parse_network(text: &str) -> Result<crate::domain::Network, String> {
    crate::domain::Network::parse(text).map_err(|e| e.to_string())
}

fn parse_pool_id(text: &str) -> Result<crate::domain::PoolId, String> {
    crate::domain::PoolId::parse(text).map_err(|e| e.to_string())
}

/// A comma-separated list of URLs, each passed on as written (a `rediss://` scheme, a user
/// and a password included).
fn url_list(setting: &'static str, list: &str) -> Result<Vec<String>, RedisSettingsError> {
    let urls: Vec<String> = list
        .split(',')
        .map(str::trim)
        .filter(|url| !url.is_empty())
        .map(str::to_owned)
        .collect();
    if urls.is_empty() {
        return Err(RedisSettingsError::EmptyList(setting));
    }
    Ok(urls)
}

/// Why the Redis settings do not name one way to reach Redis.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RedisSettingsError {
    /// More than one of the alternatives is set.
    #[error(
        "{0} are set, but only one of REDIS_URL, REDIS_CLUSTER_URLS and REDIS_SENTINEL_URLS \
         may be: they are alternative ways to reach Redis"
    )]
    SeveralTopologies(String),
    /// A list setting holds no URL.
    #[error("{0} is set but holds no URL")]
    EmptyList(&'static str),
    /// Sentinels without the name of the primary they monitor.
    #[error(
        "REDIS_SENTINEL_URLS is set without REDIS_SENTINEL_MASTER, the monitored primary's name"
    )]
    SentinelWithoutMaster,
    /// A primary name without sentinels to ask.
    #[error("REDIS_SENTINEL_MASTER is set without REDIS_SENTINEL_URLS")]
    SentinelMasterAlone,
}

/// Refuses `REAP_INTERVAL_MS` / `--reap-interval-ms`, whatever its value.
fn renamed_to_sweep_interval(_: &str) -> Result<String, String> {
    Err("this setting is now SWEEP_INTERVAL_MS (--sweep-interval-ms)".to_owned())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_import_has_its_own_larger_body_limit_settable_by_flag() {
        if std::env::var_os("IMPORT_BODY_LIMIT_BYTES").is_none() {
            assert_eq!(Config::defaults().import_body_limit_bytes, 32 * 1024 * 1024);
        }
        let config = Config::parse_from(["proxy-allocator", "--import-body-limit-bytes", "4096"]);
        assert_eq!(config.import_body_limit_bytes, 4096);
    }

    #[test]
    fn the_sweep_interval_is_set_by_its_flag_and_its_former_name_is_refused_naming_the_new() {
        let config = Config::parse_from(["proxy-allocator", "--sweep-interval-ms", "250"]);
        assert_eq!(config.sweep_interval(), Duration::from_millis(250));
        let refused = Config::try_parse_from(["proxy-allocator", "--reap-interval-ms", "250"])
            .expect_err("the former flag is refused");
        assert_eq!(refused.kind(), clap::error::ErrorKind::ValueValidation);
        assert!(
            refused
                .to_string()
                .contains("this setting is now SWEEP_INTERVAL_MS (--sweep-interval-ms)"),
            "{refused}"
        );
    }

    #[test]
    fn trusted_client_networks_are_a_comma_separated_list_of_addresses_and_networks() {
        let config = Config::parse_from([
            "proxy-allocator",
            "--trusted-client-networks",
            "10.0.0.0/8, 192.0.2.7,2001:db8::/32",
        ]);
        let shown: Vec<String> = config
            .trusted_client_networks
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(shown, ["10.0.0.0/8", "192.0.2.7/32", "2001:db8::/32"]);
        let refused =
            Config::try_parse_from(["proxy-allocator", "--trusted-client-networks", "10.0.0/8"])
                .expect_err("refused");
        assert_eq!(refused.kind(), clap::error::ErrorKind::ValueValidation);
    }

    fn redis_settings(args: &[&str]) -> Result<Option<RedisTopology>, RedisSettingsError> {
        let mut config =
            Config::parse_from(std::iter::once("proxy-allocator").chain(args.iter().copied()));
        // Only the flags given here count, whatever the environment holds.
        for (flag, field) in [
            ("--redis-url", &mut config.redis_url),
            ("--redis-cluster-urls", &mut config.redis_cluster_urls),
            ("--redis-sentinel-urls", &mut config.redis_sentinel_urls),
            ("--redis-sentinel-master", &mut config.redis_sentinel_master),
        ] {
            if !args.contains(&flag) {
                *field = None;
            }
        }
        config.redis_topology()
    }

    #[test]
    fn a_redis_url_means_a_standalone_redis_passed_on_as_written() {
        assert_eq!(
            redis_settings(&["--redis-url", "rediss://user:secret@cache.internal:6380/2"]),
            Ok(Some(RedisTopology::Standalone {
                url: "rediss://user:secret@cache.internal:6380/2".to_owned()
            }))
        );
    }

    #[test]
    fn cluster_urls_are_split_on_commas_and_trimmed() {
        assert_eq!(
            redis_settings(&["--redis-cluster-urls", "redis://a:7000, rediss://b:7001,"]),
            Ok(Some(RedisTopology::Cluster {
                seeds: vec!["redis://a:7000".to_owned(), "rediss://b:7001".to_owned()]
            }))
        );
    }

    #[test]
    fn sentinel_urls_come_with_the_master_name() {
        assert_eq!(
            redis_settings(&[
                "--redis-sentinel-urls",
                "redis://s1:26379,redis://s2:26379",
                "--redis-sentinel-master",
                "main",
            ]),
            Ok(Some(RedisTopology::Sentinel {
                sentinels: vec!["redis://s1:26379".to_owned(), "redis://s2:26379".to_owned()],
                master: "main".to_owned(),
            }))
        );
    }

    #[test]
    fn no_redis_setting_means_the_embedded_store() {
        assert_eq!(redis_settings(&[]), Ok(None));
    }

    #[test]
    fn two_ways_to_reach_redis_at_once_are_refused_naming_both() {
        let refused = redis_settings(&[
            "--redis-url",
            "redis://a:6379",
            "--redis-cluster-urls",
            "redis://b:7000",
        ]);
        assert_eq!(
            refused,
            Err(RedisSettingsError::SeveralTopologies(
                "REDIS_URL and REDIS_CLUSTER_URLS".to_owned()
            ))
        );
        assert_eq!(
            refused.map_err(|e| e.to_string()),
            Err(
                "REDIS_URL and REDIS_CLUSTER_URLS are set, but only one of REDIS_URL, \
                 REDIS_CLUSTER_URLS and REDIS_SENTINEL_URLS may be: they are alternative ways \
                 to reach Redis"
                    .to_owned()
            )
        );
    }

    #[test]
    fn sentinels_without_a_master_name_and_a_name_without_sentinels_are_refused() {
        assert_eq!(
            redis_settings(&["--redis-sentinel-urls", "redis://s1:26379"]),
            Err(RedisSettingsError::SentinelWithoutMaster)
        );
        assert_eq!(
            redis_settings(&["--redis-sentinel-master", "main"]),
            Err(RedisSettingsError::SentinelMasterAlone)
        );
        assert_eq!(
            redis_settings(&["--redis-cluster-urls", " , "]),
            Err(RedisSettingsError::EmptyList("REDIS_CLUSTER_URLS"))
        );
    }
}
