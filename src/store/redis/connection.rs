//! How `RedisStore` reaches Redis (one server, a Redis Cluster, or the primary that Sentinel
//! names) through a pool of shared connections that are retired when they fail.
//!
//! Every topology gives the store the same thing: a [`Connection`] that speaks
//! `redis::aio::ConnectionLike` and is cheap to clone, so the store's operations are written
//! once. What differs is how a connection is dialled and when it is given up:
//!
//! - **Standalone**: one multiplexed connection per pooled object, dialled by deadpool-redis's
//!   manager.
//! - **Cluster**: one redis-rs cluster connection per pooled object. It holds a multiplexed
//!   connection to every node, routes each command by its key's slot, reconnects to nodes
//!   whose sockets closed, and re-reads the slot map when a node answers MOVED. Its own
//!   retries are off (`retries(0)`): they would send a script again after a lost reply
//!   (see `run.rs`); the store retries only answers that prove nothing ran.
//!   deadpool-redis's cluster manager is not used because its recycle step PINGs, and a
//!   PING on a cluster connection goes to every primary.
//! - **Sentinel**: like standalone, but each new connection first asks the sentinels which
//!   server is the primary now. After a failover the old connections fail (closed socket, or
//!   READONLY from a demoted primary), are retired, and their replacements reach the new
//!   primary.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use deadpool::managed::{self, Metrics, RecycleError, RecycleResult};
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::sentinel::{Sentinel, SentinelNodeConnectionInfo};
use redis::{
    AsyncConnectionConfig, Cmd, ErrorKind, IntoConnectionInfo, Pipeline, ProtocolVersion,
    RedisConnectionInfo, RedisError, RedisFuture, ServerErrorKind, Value,
};

use crate::store::{StoreError, StoreStatus};

/// Where Redis is and how to find it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedisTopology {
    /// One Redis server (or a proxy in front of several).
    Standalone {
        /// `redis://` or `rediss://` URL.
        url: String,
    },
    /// A Redis Cluster; the rest of it is discovered from these nodes.
    Cluster {
        /// URLs of some of its nodes.
        seeds: Vec<String>,
    },
    /// The primary that Sentinel monitors under a name.
    Sentinel {
        /// URLs of the sentinels.
        sentinels: Vec<String>,
        /// The name of the monitored primary (`sentinel monitor <name> ...`).
        master: String,
    },
}

/// One pooled connection, of whichever topology. Cloning is shallow: clones share sockets.
#[derive(Clone)]
pub(super) enum Connection {
    /// To one server.
    Standalone(MultiplexedConnection),
    /// To every node of a cluster.
    Cluster(ClusterConnection),
    /// To the primary Sentinel named when this connection was dialled.
    Sentinel {
        connection: MultiplexedConnection,
        /// `host:port` of that primary.
        master: Arc<str>,
    },
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Standalone(connection) | Self::Sentinel { connection, .. } => {
                connection.req_packed_command(cmd)
            }
            Self::Cluster(connection) => connection.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Self::Standalone(connection) | Self::Sentinel { connection, .. } => {
                connection.req_packed_commands(pipeline, offset, count)
            }
            Self::Cluster(connection) => connection.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Standalone(connection) | Self::Sentinel { connection, .. } => connection.get_db(),
            Self::Cluster(connection) => connection.get_db(),
        }
    }
}

impl Connection {
    /// Asks Redis what it is, at the cost of one command: PING on a standalone server,
    /// `CLUSTER NODES` on one node of a cluster (not a PING, which would go to every
    /// primary), `ROLE` on Sentinel's primary, to notice a demoted one.
    pub(super) async fn status(&mut self) -> Result<StoreStatus, RedisError> {
        match self {
            Self::Standalone(connection) => {
                let _: Value = redis::cmd("PING").query_async(connection).await?;
                Ok(StoreStatus::redis("standalone"))
            }
            Self::Cluster(connection) => {
                let mut nodes = redis::cmd("CLUSTER");
                nodes.arg("NODES");
                let listing = connection
                    .route_command(
                        nodes,
                        RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
                    )
                    .await?;
                let primaries = serving_primaries(&text(listing)?);
                Ok(StoreStatus {
                    primaries: Some(primaries),
                    ..StoreStatus::redis("cluster")
                })
            }
            Self::Sentinel { connection, master } => {
                let role: Vec<Value> = redis::cmd("ROLE").query_async(connection).await?;
                match role.into_iter().next().map(text).transpose()?.as_deref() {
                    Some("master") => Ok(StoreStatus {
                        master: Some(master.to_string()),
                        ..StoreStatus::redis("sentinel")
                    }),
                    _ => Err(RedisError::from((
                        ErrorKind::Server(ServerErrorKind::ReadOnly),
                        "the server Sentinel named as primary is no longer one",
                    ))),
                }
            }
        }
    }
}

fn text(value: Value) -> Result<String, RedisError> {
    match value {
        Value::BulkString(bytes) => Ok(String::from_utf8_lossy(&bytes).into_owned()),
        Value::SimpleString(text) | Value::VerbatimString { text, .. } => Ok(text),
        _ => Err(RedisError::from((
            ErrorKind::UnexpectedReturnType,
            "expected text",
        ))),
    }
}

/// Primaries that hold slots and are not marked failed, from a `CLUSTER NODES` listing
/// (`<id> <addr> <flags> <primary> <ping> <pong> <epoch> <link> <slot>...`).
fn serving_primaries(listing: &str) -> usize {
    listing
        .lines()
        .filter(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let flags: Vec<&str> = fields.get(2).map_or(Vec::new(), |f| f.split(',').collect());
            flags.contains(&"master") && !flags.contains(&"fail") && fields.len() > 8
        })
        .count()
}

/// A connection plus the flag that retires it.
#[derive(Clone)]
pub(super) struct SharedConnection {
    pub(super) connection: Connection,
    broken: Arc<AtomicBool>,
    /// The disconnect generation this connection was last known to be alive at.
    verified_at: u64,
}

impl SharedConnection {
    /// Marks the connection so that its next checkout drops it and dials a new one.
    pub(super) fn retire(&self) {
        self.broken.store(true, Ordering::Relaxed);
    }

    /// Retires the connection when `error` says it is unusable.
    pub(super) fn retire_if_failed(&self, error: &RedisError) {
        // A cluster connection repairs its node connections itself and re-reads the slot
        // map on MOVED; replacing it would only redo that work. It is retired on a timeout
        // (by the caller), like every connection.
        if matches!(self.connection, Connection::Cluster(_)) {
            return;
        }
        if error.is_io_error()
            || error.is_connection_dropped()
            || error.is_connection_refusal()
            || error.is_timeout()
            || error.is_unrecoverable_error()
            // A primary demoted to replica: the next connection asks Sentinel again.
            || error.kind() == ErrorKind::Server(ServerErrorKind::ReadOnly)
        {
            self.retire();
        }
    }
}

/// How new connections are made, per topology.
enum Dialer {
    Standalone(deadpool_redis::Manager),
    Cluster(ClusterClient),
    Sentinel {
        /// Behind a lock because asking it needs `&mut`; asked only when dialling.
        sentinel: tokio::sync::Mutex<Sentinel>,
        master: String,
        node: SentinelNodeConnectionInfo,
        config: AsyncConnectionConfig,
    },
}

/// Dials connections for the pool, with a recycle step that costs no round trip unless some
/// connection was seen to disconnect since this one was last verified.
pub(super) struct SharedConnectionManager {
    dial: Dialer,
    /// Bumped by every standalone or Sentinel connection whose socket closed.
    disconnects: Arc<AtomicU64>,
}

impl SharedConnectionManager {
    /// Opens a connection to the topology's primary (or the cluster).
    async fn dial(&self) -> Result<SharedConnection, RedisError> {
        let verified_at = self.disconnects.load(Ordering::Acquire);
        let connection = match &self.dial {
            Dialer::Standalone(manager) => {
                Connection::Standalone(managed::Manager::create(manager).await?)
            }
            Dialer::Cluster(client) => Connection::Cluster(client.get_async_connection().await?),
            Dialer::Sentinel {
                sentinel,
                master,
                node,
                config,
            } => {
                // Asked for every new connection, so that replacements follow a failover.
                let client = sentinel
                    .lock()
                    .await
                    .async_master_for(master, Some(node))
                    .await?;
                let master = client.get_connection_info().addr().to_string().into();
                let connection = client
                    .get_multiplexed_async_connection_with_config(config)
                    .await?;
                Connection::Sentinel { connection, master }
            }
        };
        Ok(SharedConnection {
            connection,
            broken: Arc::new(AtomicBool::new(false)),
            verified_at,
        })
    }
}

impl managed::Manager for SharedConnectionManager {
    type Type = SharedConnection;
    type Error = RedisError;

    async fn create(&self) -> Result<SharedConnection, RedisError> {
        // Dialling (standalone, cluster or Sentinel) is a future of several kilobytes, and
        // the pool's checkout future holds this one inline: every command's future would
        // carry that space, copied whole each time a store call is boxed. Boxed here, the
        // space is taken only when a connection is made.
        Box::pin(self.dial()).await
    }

    async fn recycle(&self, conn: &mut SharedConnection, _: &Metrics) -> RecycleResult<RedisError> {
        if conn.broken.load(Ordering::Relaxed) {
            return Err(RecycleError::message("connection failed earlier"));
        }
        let generation = self.disconnects.load(Ordering::Acquire);
        if generation != conn.verified_at {
            // Some connection closed; this one may share its fate (Redis restarted, a proxy
            // cut everything). One PING now is cheaper than failing a real request. Cluster
            // connections never bump the generation, so no PING reaches every primary.
            let _: Value = redis::cmd("PING")
                .query_async(&mut conn.connection)
                .await
                .inspect_err(|_| conn.retire())?;
            conn.verified_at = generation;
        }
        Ok(())
    }
}

/// Builds the connection pool for `topology`. Nothing is dialled yet.
///
/// # Errors
/// [`StoreError::Unavailable`] when a URL cannot be parsed or the pool cannot be built.
pub(super) fn pool(
    topology: &RedisTopology,
    timeout: Duration,
    connections: usize,
) -> Result<managed::Pool<SharedConnectionManager>, StoreError> {
    let invalid = |e: RedisError| StoreError::Unavailable(Box::new(e));
    let disconnects = Arc::new(AtomicU64::new(0));
    let on_push = Arc::clone(&disconnects);
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(timeout))
        // The store puts its own deadline on every call (and deadpool on every recycle), so
        // a second timer per command inside redis-rs would only cost time.
        .set_response_timeout(None)
        .set_push_sender(move |push: redis::PushInfo| {
            if push.kind == redis::PushKind::Disconnection {
                on_push.fetch_add(1, Ordering::AcqRel);
            }
            Ok::<(), redis::aio::SendError>(())
        });
    let dial = match topology {
        RedisTopology::Standalone { url } => {
            // RESP3, because redis-rs only reports disconnections to connections speaking it.
            let info = url.as_str().into_connection_info().map_err(invalid)?;
            let settings = info
                .redis_settings()
                .clone()
                .set_protocol(ProtocolVersion::RESP3);
            let info = info.set_redis_settings(settings);
            Dialer::Standalone(
                deadpool_redis::Manager::new_with_config(info, config).map_err(invalid)?,
            )
        }
        RedisTopology::Cluster { seeds } => Dialer::Cluster(
            ClusterClient::builder(seeds.iter().map(String::as_str))
                .retries(0)
                .connection_timeout(timeout)
                .response_timeout(timeout)
                .build()
                .map_err(invalid)?,
        ),
        RedisTopology::Sentinel { sentinels, master } => Dialer::Sentinel {
            sentinel: tokio::sync::Mutex::new(
                Sentinel::build(sentinels.iter().map(String::as_str).collect()).map_err(invalid)?,
            ),
            master: master.clone(),
            node: SentinelNodeConnectionInfo::default().set_redis_connection_info(
                RedisConnectionInfo::default().set_protocol(ProtocolVersion::RESP3),
            ),
            config,
        },
    };
    managed::Pool::builder(SharedConnectionManager { dial, disconnects })
        .max_size(connections.max(1))
        .runtime(deadpool::Runtime::Tokio1)
        .wait_timeout(Some(timeout))
        .create_timeout(Some(timeout))
        .recycle_timeout(Some(timeout))
        .build()
        .map_err(|e| StoreError::Unavailable(Box::new(e)))
}

#[cfg(test)]
mod tests {
    use super::serving_primaries;

    #[test]
    fn serving_primaries_are_primaries_with_slots_not_marked_failed() {
        let listing = "\
a1 127.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-5460
b2 127.0.0.1:7001@17001 master - 0 1 2 connected 5461-10922
c3 127.0.0.1:7002@17002 master,fail - 0 1 3 connected
d4 127.0.0.1:7003@17003 master - 0 1 7 connected 10923-16383
e5 127.0.0.1:7004@17004 slave a1 0 1 1 connected
f6 127.0.0.1:7005@17005 master,fail? - 0 1 8 connected 100
";
        assert_eq!(serving_primaries(listing), 4);
    }
}
