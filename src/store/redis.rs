//! `RedisStore`: every pool in Redis, each operation one Lua script on one hash slot.
//!
//! # Layout
//! - `keys.rs`: the key layout, one hash tag per pool.
//! - `scripts.rs`: the scripts (`src/store/scripts/*.lua`), one per operation.
//! - `run.rs`: checkout, the store timeout, and which failed calls are sent again.
//! - `reply.rs`: every script's reply, decoded into one type per script.
//! - `operations.rs`: the `Store` trait, one script per operation.
//! - `connection.rs`: reaching a standalone server, a Redis Cluster or Sentinel's primary.
//! - `tests.rs`: every script run on a real Redis, each of its replies decoded.
//!
//! # Connections
//! `connection.rs` reaches a standalone server, a Redis Cluster or Sentinel's primary; the
//! operations are written once against its `Connection`. deadpool-redis's own
//! manager PINGs (and UNWATCHes) every connection it hands out: one extra round trip per
//! request (on a cluster, one per primary). This store keeps deadpool as the connection
//! layer but with a recycle step that only checks a "broken" flag, and uses each pooled
//! connection as a shared handle: a request clones the connection and returns the pool
//! object at once, so concurrent requests share a few connections and reach Redis
//! pipelined. A connection is marked broken when a command on it fails at the connection
//! level or times out; the next checkout then drops it and dials a new one.
//! When any connection notices that its socket closed (redis-rs reports a `Disconnection`
//! push), every pooled connection is verified with one PING at its next checkout, so that
//! after Redis restarts or a proxy cuts connections the next request goes out on a live
//! connection instead of failing on a dead one. In steady state no checkout sends anything.
//!
//! Measured under `wrk -c64` on two cores (bench/assign.sh): an assign is exactly one
//! EVALSHA (`tests/api/round_trips.rs`). redis-rs writes each command as soon as its driver
//! task runs, which on a busy service is about one socket write per command; a coalescing
//! sender that held commands back until the worker had nothing else ready and then wrote
//! them as one pipeline cut the service's writes from 1.85 to 1.19 per assign, but the
//! assign rate did not rise (requests waited for their batch and the cores idled more), so
//! it was not kept. Running tokio without its LIFO slot batches the same way for free (the
//! connection task then runs after the requests already woken, not right after the first):
//! 0.31 Redis writes per assign instead of 0.83, and again the same rate.

mod clients;
mod connection;
mod keys;
mod operations;
mod reply;
mod run;
mod scripts;
#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::time::Duration;

use deadpool::managed;

pub use self::connection::RedisTopology;
use self::connection::SharedConnectionManager;
use self::scripts::Scripts;
use super::StoreError;

/// How to reach Redis and how long to wait for it.
#[derive(Debug, Clone)]
pub struct RedisStoreOptions {
    /// Where Redis is: one server, a cluster, or Sentinel's primary.
    pub topology: RedisTopology,
    /// Prefix of every key, so several deployments (or tests) can share one Redis.
    pub key_prefix: String,
    /// Longest time one store operation may take, connection included.
    pub timeout: Duration,
    /// Most connections kept open; each is shared by many concurrent requests.
    pub connections: usize,
    /// How long one replica's turn of the due index's safety net lasts: the replicas share
    /// one walk of the registry, and while a turn lasts no other replica walks (see
    /// `keys.rs`, "The due index"). The service uses nine tenths of its sweep interval, so
    /// that one replica alone walks at every sweep; zero lets every sweep walk.
    pub walk_turn: Duration,
}

/// The Redis-backed store. Cloning is shallow: clones share the connection pool.
#[derive(Clone)]
pub struct RedisStore {
    pool: managed::Pool<SharedConnectionManager>,
    prefix: Arc<str>,
    timeout: Duration,
    scripts: Arc<Scripts>,
    /// The start of each pool's assign command, written once (see `run.rs`).
    heads: Arc<run::Heads>,
    /// The chunk sizes of the member operations, learned from their round trips, and the
    /// count of calls in flight that tells whether a chunk's rest protects anyone.
    chunks: Arc<super::chunks::MemberChunks>,
    /// Whether this handle's calls count in that count: all but the handle a large
    /// operation's chunks go through ([`RedisStore::for_chunks`]), which would otherwise
    /// find themselves in flight and rest for nobody.
    foreground: bool,
    /// How long a turn of the shared registry walk (the due index's safety net) lasts.
    walk_turn: Duration,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("prefix", &self.prefix)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl RedisStore {
    /// Builds the store and tries to load every script. Redis need not be up yet: the
    /// service starts, reports not ready, and connects when Redis appears.
    ///
    /// # Errors
    /// [`StoreError::Unavailable`] when a URL cannot be parsed or the pool cannot be built.
    pub async fn connect(options: RedisStoreOptions) -> Result<Self, StoreError> {
        Self::connect_with(options, Scripts::new()).await
    }

    /// [`RedisStore::connect`] with every script reading its time from the key `clock`
    /// (Unix milliseconds) instead of Redis's `TIME`, so that a test sets this store's
    /// clock (see `Scripts::on_test_clock`).
    #[cfg(test)]
    pub(crate) async fn connect_on_test_clock(
        options: RedisStoreOptions,
        clock: &str,
    ) -> Result<Self, StoreError> {
        Self::connect_with(options, Scripts::on_test_clock(clock)).await
    }

    /// Holds the safety net's walk of the registry off for good (its next turn set to a
    /// time no clock reaches), so that a sweep follows the due index alone: in a test of a
    /// few pools the walk would otherwise reach every pool at every sweep.
    #[cfg(test)]
    pub(crate) async fn hold_off_safety_net(&self) -> Result<(), StoreError> {
        let mut hset = redis::cmd("HSET");
        hset.arg(self.walk_key()).arg("next").arg(u64::MAX / 4);
        self.command(hset).await.map(drop)
    }

    async fn connect_with(
        options: RedisStoreOptions,
        scripts: Scripts,
    ) -> Result<Self, StoreError> {
        let pool = connection::pool(&options.topology, options.timeout, options.connections)?;
        // Every connection is dialled now, all at once (a pool only grows when checkouts
        // overlap): no request pays for dialling later, and steady-state traffic carries
        // nothing but the operations. Failures are left to the first requests.
        let dialled =
            futures_util::future::join_all((0..pool.status().max_size).map(|_| pool.get())).await;
        drop(dialled);
        let store = Self {
            pool,
            prefix: options.key_prefix.into(),
            timeout: options.timeout,
            scripts: Arc::new(scripts),
            heads: Arc::default(),
            chunks: Arc::default(),
            foreground: true,
            walk_turn: options.walk_turn,
        };
        if let Err(error) = store.load_scripts().await {
            tracing::warn!(%error, "could not load the scripts at startup; they load on first use");
        }
        if let Err(error) = store.adopt_legacy_registry().await {
            tracing::warn!(%error, "could not copy the pool registry of an earlier version; trying again at the next start");
        }
        Ok(store)
    }

    /// Loads every script into Redis's script cache, so the first requests need no retry.
    async fn load_scripts(&self) -> Result<(), StoreError> {
        let conn = self.checkout().await?;
        for (_, script) in self.scripts.all() {
            let mut connection = conn.connection.clone();
            script.load_async(&mut connection).await.map_err(|e| {
                conn.retire_if_failed(&e);
                StoreError::Unavailable(Box::new(e))
            })?;
        }
        Ok(())
    }
}
