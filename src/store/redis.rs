//! `RedisStore`: every pool in Redis, each operation one Lua script on one hash slot.
//!
//! # Key layout
//! Every key of a pool carries the pool id as its hash tag, so every script touches one
//! hash slot and the layout works unchanged on Redis Cluster:
//!
//! | key | type | holds |
//! |---|---|---|
//! | `<prefix>:{<pool>}:meta` | hash | configuration, creation time, total assignments; its existence is the pool's |
//! | `<prefix>:{<pool>}:eligible` | sorted set | eligible member -> assignments |
//! | `<prefix>:{<pool>}:ineligible` | sorted set | ineligible member -> kept assignments |
//! | `<prefix>:{<pool>}:taken_out` | hash | ineligible member -> `"<since_ms> <reason>"` |
//! | `<prefix>:pools` | set | pool ids, for listing; updated outside the pool scripts because it lives in another slot |
//!
//! # Connections
//! deadpool-redis's own manager PINGs (and UNWATCHes) every connection it hands out: one
//! extra round trip per request. This store keeps deadpool as the connection layer but
//! wraps its manager with a recycle step that only checks a "broken" flag, and uses each
//! pooled multiplexed connection as a shared handle: a request clones the connection and
//! returns the pool object at once, so concurrent requests share a few connections and
//! reach Redis pipelined. A connection is marked broken when a command on it fails at the
//! connection level or times out; the next checkout then drops it and dials a new one.
//!
//! A script call is never retried after it was sent: the script may have run with only its
//! reply lost, and running it again would count an assignment twice. The caller gets a 503
//! instead. (A NOSCRIPT answer is the exception: Redis ran nothing, so `Script` loads the
//! script and sends it again.)

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use deadpool::managed::{self, Metrics, RecycleError, RecycleResult};
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, RedisError, Script, Value};

use super::{
    Assignment, Cursor, DisableReport, EnableReport, MemberPage, MemberState, MemberView, PoolInfo,
    PoolStats, PutPool, RemoveReport, Restored, Seed, SeedReport, StateFilter, Store, StoreError,
    StoreStatus,
};
use crate::domain::{MemberId, PoolConfig, PoolId, RestorePolicy, Timestamp};

/// How to reach Redis and how long to wait for it.
#[derive(Debug, Clone)]
pub struct RedisStoreOptions {
    /// `redis://` or `rediss://` URL.
    pub url: String,
    /// Prefix of every key, so several deployments (or tests) can share one Redis.
    pub key_prefix: String,
    /// Longest time one store operation may take, connection included.
    pub timeout: Duration,
    /// Most connections kept open; each is shared by many concurrent requests.
    pub connections: usize,
}

/// The Redis-backed store. Cloning is shallow: clones share the connection pool.
#[derive(Clone)]
pub struct RedisStore {
    pool: managed::Pool<SharedConnectionManager>,
    prefix: Arc<str>,
    timeout: Duration,
    scripts: Arc<Scripts>,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("prefix", &self.prefix)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

struct Scripts {
    assign: Script,
    put_pool: Script,
    pool_info: Script,
    delete_pool: Script,
    seed: Script,
    members: Script,
    disable: Script,
    enable: Script,
    remove: Script,
}

impl Scripts {
    fn new() -> Self {
        Self {
            assign: Script::new(include_str!("scripts/assign.lua")),
            put_pool: Script::new(include_str!("scripts/put_pool.lua")),
            pool_info: Script::new(include_str!("scripts/pool_info.lua")),
            delete_pool: Script::new(include_str!("scripts/delete_pool.lua")),
            seed: Script::new(include_str!("scripts/seed.lua")),
            members: Script::new(include_str!("scripts/members.lua")),
            disable: Script::new(include_str!("scripts/disable.lua")),
            enable: Script::new(include_str!("scripts/enable.lua")),
            remove: Script::new(include_str!("scripts/remove.lua")),
        }
    }

    fn all(&self) -> [&Script; 9] {
        [
            &self.assign,
            &self.put_pool,
            &self.pool_info,
            &self.delete_pool,
            &self.seed,
            &self.members,
            &self.disable,
            &self.enable,
            &self.remove,
        ]
    }
}

/// A multiplexed connection plus the flag that retires it.
#[derive(Clone)]
struct SharedConnection {
    connection: MultiplexedConnection,
    broken: Arc<AtomicBool>,
}

impl SharedConnection {
    fn retire_if_failed(&self, error: &RedisError) {
        if error.is_io_error()
            || error.is_connection_dropped()
            || error.is_connection_refusal()
            || error.is_timeout()
            || error.is_unrecoverable_error()
        {
            self.broken.store(true, Ordering::Relaxed);
        }
    }
}

/// deadpool-redis's manager for dialling, with a recycle step that costs no round trip.
struct SharedConnectionManager {
    dial: deadpool_redis::Manager,
}

impl managed::Manager for SharedConnectionManager {
    type Type = SharedConnection;
    type Error = RedisError;

    async fn create(&self) -> Result<SharedConnection, RedisError> {
        let connection = managed::Manager::create(&self.dial).await?;
        Ok(SharedConnection {
            connection,
            broken: Arc::new(AtomicBool::new(false)),
        })
    }

    async fn recycle(&self, conn: &mut SharedConnection, _: &Metrics) -> RecycleResult<RedisError> {
        if conn.broken.load(Ordering::Relaxed) {
            Err(RecycleError::message("connection failed earlier"))
        } else {
            Ok(())
        }
    }
}

/// The error for a reply whose shape the scripts never produce.
#[derive(Debug, thiserror::Error)]
#[error("unexpected reply from Redis: {0}")]
struct UnexpectedReply(&'static str);

fn unexpected(what: &'static str) -> StoreError {
    StoreError::Unavailable(Box::new(UnexpectedReply(what)))
}

/// Readers for the shapes the scripts return.
mod reply {
    use super::{StoreError, Value, unexpected};

    pub fn array(value: Value) -> Result<Vec<Value>, StoreError> {
        match value {
            Value::Array(items) => Ok(items),
            _ => Err(unexpected("expected an array")),
        }
    }

    pub fn int(value: &Value) -> Result<i64, StoreError> {
        match value {
            Value::Int(n) => Ok(*n),
            Value::BulkString(bytes) => std::str::from_utf8(bytes)
                .ok()
                .and_then(|s| s.parse::<f64>().ok())
                // Counts are whole numbers kept in Redis scores (doubles).
                .map(|f| f as i64)
                .ok_or_else(|| unexpected("expected a number")),
            _ => Err(unexpected("expected a number")),
        }
    }

    pub fn count(value: &Value) -> Result<u64, StoreError> {
        u64::try_from(int(value)?).map_err(|_| unexpected("expected a non-negative count"))
    }

    pub fn optional_count(value: &Value) -> Result<Option<u64>, StoreError> {
        match value {
            Value::Nil => Ok(None),
            other => count(other).map(Some),
        }
    }

    pub fn string(value: Value) -> Result<String, StoreError> {
        match value {
            Value::BulkString(bytes) => {
                String::from_utf8(bytes).map_err(|_| unexpected("expected UTF-8 text"))
            }
            Value::SimpleString(text) => Ok(text),
            _ => Err(unexpected("expected text")),
        }
    }

    /// The status every pool script puts first: `-1` means the pool does not exist.
    pub fn pool_status(value: Value) -> Result<std::vec::IntoIter<Value>, StoreError> {
        let mut items = array(value)?.into_iter();
        match items.next().as_ref().map(int).transpose()? {
            Some(-1) => Err(StoreError::PoolNotFound),
            Some(_) => Ok(items),
            None => Err(unexpected("empty reply")),
        }
    }

    pub fn next(items: &mut impl Iterator<Item = Value>) -> Result<Value, StoreError> {
        items.next().ok_or_else(|| unexpected("reply too short"))
    }
}

impl RedisStore {
    /// Builds the store and tries to load every script. Redis need not be up yet: the
    /// service starts, reports not ready, and connects when Redis appears.
    ///
    /// # Errors
    /// [`StoreError::Unavailable`] when the URL cannot be parsed or the pool cannot be built.
    pub async fn connect(options: RedisStoreOptions) -> Result<Self, StoreError> {
        let connection_config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(options.timeout))
            .set_response_timeout(Some(options.timeout));
        let dial =
            deadpool_redis::Manager::new_with_config(options.url.as_str(), connection_config)
                .map_err(|e| StoreError::Unavailable(Box::new(e)))?;
        let pool = managed::Pool::builder(SharedConnectionManager { dial })
            .max_size(options.connections.max(1))
            .runtime(deadpool::Runtime::Tokio1)
            .wait_timeout(Some(options.timeout))
            .create_timeout(Some(options.timeout))
            .recycle_timeout(Some(options.timeout))
            .build()
            .map_err(|e| StoreError::Unavailable(Box::new(e)))?;
        let store = Self {
            pool,
            prefix: options.key_prefix.into(),
            timeout: options.timeout,
            scripts: Arc::new(Scripts::new()),
        };
        if let Err(error) = store.load_scripts().await {
            tracing::warn!(%error, "could not load the scripts at startup; they load on first use");
        }
        Ok(store)
    }

    /// Loads every script into Redis's script cache, so the first requests need no retry.
    async fn load_scripts(&self) -> Result<(), StoreError> {
        let conn = self.checkout().await?;
        for script in self.scripts.all() {
            let mut connection = conn.connection.clone();
            script.load_async(&mut connection).await.map_err(|e| {
                conn.retire_if_failed(&e);
                StoreError::Unavailable(Box::new(e))
            })?;
        }
        Ok(())
    }

    async fn checkout(&self) -> Result<SharedConnection, StoreError> {
        match self.pool.get().await {
            // Clone the handle and give the pool object back at once: the connection is
            // multiplexed, so other requests may use it while this one waits for its reply.
            Ok(object) => Ok(SharedConnection::clone(&object)),
            Err(managed::PoolError::Timeout(_)) => Err(StoreError::Timeout(self.timeout)),
            Err(managed::PoolError::Backend(e)) => Err(StoreError::Unavailable(Box::new(e))),
            Err(e) => Err(StoreError::Unavailable(Box::new(e))),
        }
    }

    /// Runs one command or script within the store timeout.
    async fn run(
        &self,
        request: impl AsyncFnOnce(&mut MultiplexedConnection) -> Result<Value, RedisError>,
    ) -> Result<Value, StoreError> {
        let started = Instant::now();
        let conn = tokio::time::timeout(self.timeout, self.checkout())
            .await
            .map_err(|_| StoreError::Timeout(self.timeout))??;
        let remaining = self.timeout.saturating_sub(started.elapsed());
        let mut connection = conn.connection.clone();
        match tokio::time::timeout(remaining, request(&mut connection)).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(error)) => {
                conn.retire_if_failed(&error);
                Err(StoreError::Unavailable(Box::new(error)))
            }
            Err(_) => {
                // A stalled connection would stall every request multiplexed onto it.
                conn.broken.store(true, Ordering::Relaxed);
                Err(StoreError::Timeout(self.timeout))
            }
        }
    }

    async fn eval(
        &self,
        script: &Script,
        keys: &[String],
        args: &[&[u8]],
    ) -> Result<Value, StoreError> {
        let mut invocation = script.prepare_invoke();
        for key in keys {
            invocation.key(key.as_str());
        }
        for arg in args {
            invocation.arg(*arg);
        }
        self.run(async |connection| invocation.invoke_async(connection).await)
            .await
    }

    async fn command(&self, cmd: redis::Cmd) -> Result<Value, StoreError> {
        self.run(async |connection| cmd.query_async(connection).await)
            .await
    }

    fn key(&self, pool: &PoolId, part: &str) -> String {
        format!("{}:{{{}}}:{}", self.prefix, pool.as_str(), part)
    }

    fn registry_key(&self) -> String {
        format!("{}:pools", self.prefix)
    }

    /// Keys in the order every member script expects them.
    fn pool_keys(&self, pool: &PoolId) -> Vec<String> {
        ["meta", "eligible", "ineligible", "taken_out"]
            .iter()
            .map(|part| self.key(pool, part))
            .collect()
    }

    async fn member_script(
        &self,
        script: &Script,
        pool: &PoolId,
        first: &[u8],
        members: &[MemberId],
    ) -> Result<std::vec::IntoIter<Value>, StoreError> {
        let mut args: Vec<&[u8]> = Vec::with_capacity(members.len() + 1);
        args.push(first);
        args.extend(members.iter().map(|m| m.as_str().as_bytes()));
        let value = self.eval(script, &self.pool_keys(pool), &args).await?;
        reply::pool_status(value)
    }
}

fn parse_taken_out(info: Value) -> Result<(Option<String>, Option<Timestamp>), StoreError> {
    if matches!(info, Value::Nil) {
        return Ok((None, None));
    }
    let text = reply::string(info)?;
    let (since, reason) = text.split_once(' ').unwrap_or((text.as_str(), ""));
    let since = since.parse::<u64>().ok().map(Timestamp);
    Ok((Some(reason.to_owned()), since))
}

fn member_views(pairs: Value, infos: Option<Vec<Value>>) -> Result<Vec<MemberView>, StoreError> {
    let pairs = reply::array(pairs)?;
    let mut infos = infos.map(Vec::into_iter);
    let mut views = Vec::with_capacity(pairs.len() / 2);
    let mut items = pairs.into_iter();
    while let Some(member) = items.next() {
        let member = MemberId::from_stored(reply::string(member)?);
        let assignments = reply::count(&reply::next(&mut items)?)?;
        let (state, (reason, since)) = match infos.as_mut() {
            None => (MemberState::Eligible, (None, None)),
            Some(infos) => (
                MemberState::Ineligible,
                parse_taken_out(infos.next().unwrap_or(Value::Nil))?,
            ),
        };
        views.push(MemberView {
            member,
            state,
            assignments,
            reason,
            since,
        });
    }
    Ok(views)
}

#[async_trait]
impl Store for RedisStore {
    fn name(&self) -> &'static str {
        "redis"
    }

    async fn status(&self) -> Result<StoreStatus, StoreError> {
        self.command(redis::cmd("PING")).await?;
        Ok(StoreStatus {
            store: "redis",
            topology: "standalone".to_owned(),
        })
    }

    async fn assign(&self, pool: &PoolId) -> Result<Assignment, StoreError> {
        let keys = [self.key(pool, "meta"), self.key(pool, "eligible")];
        let value = self.eval(&self.scripts.assign, &keys, &[]).await?;
        let mut items = reply::pool_status(value)?;
        let Some(member) = items.next() else {
            return Ok(Assignment::Empty);
        };
        Ok(Assignment::Assigned {
            member: MemberId::from_stored(reply::string(member)?),
            assignments: reply::count(&reply::next(&mut items)?)?,
        })
    }

    async fn put_pool(&self, pool: &PoolId, config: &PoolConfig) -> Result<PutPool, StoreError> {
        let json = serde_json::to_vec(config).map_err(|e| StoreError::Unavailable(Box::new(e)))?;
        let start = config
            .start_assignments
            .map(|n| n.to_string())
            .unwrap_or_default();
        let max = config
            .rules
            .max_members
            .map(|n| n.to_string())
            .unwrap_or_default();
        let args: [&[u8]; 4] = [
            &json,
            config.restore.as_str().as_bytes(),
            start.as_bytes(),
            max.as_bytes(),
        ];
        let value = self
            .eval(&self.scripts.put_pool, &[self.key(pool, "meta")], &args)
            .await?;
        let created = reply::int(&value)? == 1;
        // The registry lives in another hash slot, so it is updated after the pool script.
        // A crash in between leaves a pool that `pools()` does not list until its next PUT.
        let mut sadd = redis::cmd("SADD");
        sadd.arg(self.registry_key()).arg(pool.as_str());
        self.command(sadd).await?;
        Ok(if created {
            PutPool::Created
        } else {
            PutPool::Updated
        })
    }

    async fn pool(&self, pool: &PoolId) -> Result<PoolInfo, StoreError> {
        let keys = [
            self.key(pool, "meta"),
            self.key(pool, "eligible"),
            self.key(pool, "ineligible"),
        ];
        let value = self.eval(&self.scripts.pool_info, &keys, &[]).await?;
        let mut items = reply::pool_status(value)?;
        let config_json = reply::string(reply::next(&mut items)?)?;
        let config: PoolConfig = serde_json::from_str(&config_json)
            .map_err(|_| unexpected("pool configuration is not valid JSON"))?;
        let created_ms = reply::optional_count(&reply::next(&mut items)?)?.unwrap_or(0);
        let total_assignments = reply::optional_count(&reply::next(&mut items)?)?.unwrap_or(0);
        let eligible = reply::count(&reply::next(&mut items)?)?;
        let ineligible = reply::count(&reply::next(&mut items)?)?;
        let min_assignments = reply::optional_count(&reply::next(&mut items)?)?;
        let max_assignments = reply::optional_count(&reply::next(&mut items)?)?;
        Ok(PoolInfo {
            pool: pool.clone(),
            config,
            created_at: Timestamp(created_ms),
            stats: PoolStats {
                eligible,
                ineligible,
                min_assignments,
                max_assignments,
                total_assignments,
            },
        })
    }

    async fn pools(&self) -> Result<Vec<PoolInfo>, StoreError> {
        let mut smembers = redis::cmd("SMEMBERS");
        smembers.arg(self.registry_key());
        let ids = reply::array(self.command(smembers).await?)?;
        let mut ids: Vec<PoolId> = ids
            .into_iter()
            .filter_map(|v| reply::string(v).ok())
            .filter_map(|s| PoolId::parse(&s).ok())
            .collect();
        ids.sort();
        // Issued together so that they travel pipelined on the shared connection.
        let infos = futures_util::future::join_all(ids.iter().map(|id| self.pool(id))).await;
        let mut pools = Vec::with_capacity(infos.len());
        for info in infos {
            match info {
                Ok(info) => pools.push(info),
                // Deleted between the listing and the read.
                Err(StoreError::PoolNotFound) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(pools)
    }

    async fn delete_pool(&self, pool: &PoolId) -> Result<(), StoreError> {
        let value = self
            .eval(&self.scripts.delete_pool, &self.pool_keys(pool), &[])
            .await?;
        let mut srem = redis::cmd("SREM");
        srem.arg(self.registry_key()).arg(pool.as_str());
        self.command(srem).await?;
        if reply::int(&value)? == 1 {
            Ok(())
        } else {
            Err(StoreError::PoolNotFound)
        }
    }

    async fn add_members(&self, pool: &PoolId, seed: &Seed) -> Result<SeedReport, StoreError> {
        let start = seed.assignments.map(|n| n.to_string()).unwrap_or_default();
        let flag = |on: bool| -> &'static [u8] { if on { b"1" } else { b"0" } };
        let pending = seed.pending_adds.to_string();
        let mut args: Vec<&[u8]> = Vec::with_capacity(seed.members.len() + 4);
        args.push(start.as_bytes());
        args.push(flag(seed.reset));
        args.push(flag(seed.dry_run));
        args.push(pending.as_bytes());
        args.extend(seed.members.iter().map(|m| m.as_str().as_bytes()));
        let keys = [
            self.key(pool, "meta"),
            self.key(pool, "eligible"),
            self.key(pool, "ineligible"),
        ];
        let value = self.eval(&self.scripts.seed, &keys, &args).await?;
        let mut items = reply::pool_status(value)?;
        let start_assignments = reply::count(&reply::next(&mut items)?)?;
        let flags = reply::array(reply::next(&mut items)?)?;
        let mut report = SeedReport {
            added: Vec::new(),
            existing: Vec::new(),
            full: Vec::new(),
            start_assignments,
        };
        for (member, flag) in seed.members.iter().zip(flags) {
            match reply::int(&flag)? {
                1 => report.added.push(member.clone()),
                2 => report.full.push(member.clone()),
                _ => report.existing.push(member.clone()),
            }
        }
        Ok(report)
    }

    async fn members(
        &self,
        pool: &PoolId,
        filter: StateFilter,
        limit: usize,
        cursor: Cursor,
    ) -> Result<MemberPage, StoreError> {
        // One more than a page from each set tells the merge whether more pages follow.
        let page = (limit + 1).to_string();
        let (eligible_count, ineligible_count) = match filter {
            StateFilter::Eligible => (page.as_str(), "0"),
            StateFilter::Ineligible => ("0", page.as_str()),
            StateFilter::All => (page.as_str(), page.as_str()),
        };
        let offsets = [cursor.eligible.to_string(), cursor.ineligible.to_string()];
        let args: [&[u8]; 4] = [
            offsets[0].as_bytes(),
            offsets[1].as_bytes(),
            eligible_count.as_bytes(),
            ineligible_count.as_bytes(),
        ];
        let value = self
            .eval(&self.scripts.members, &self.pool_keys(pool), &args)
            .await?;
        let mut items = reply::pool_status(value)?;
        let eligible = member_views(reply::next(&mut items)?, None)?;
        let ineligible_pairs = reply::next(&mut items)?;
        let infos = reply::array(reply::next(&mut items)?)?;
        let ineligible = member_views(ineligible_pairs, Some(infos))?;
        Ok(super::merge_page(eligible, ineligible, limit, cursor))
    }

    async fn disable_members(
        &self,
        pool: &PoolId,
        members: &[MemberId],
        reason: &str,
    ) -> Result<DisableReport, StoreError> {
        let mut items = self
            .member_script(&self.scripts.disable, pool, reason.as_bytes(), members)
            .await?;
        let outcomes = reply::array(reply::next(&mut items)?)?;
        let mut report = DisableReport::default();
        for (member, outcome) in members.iter().zip(outcomes) {
            match reply::int(&outcome)? {
                1 => report.disabled.push(member.clone()),
                2 => report.already_ineligible.push(member.clone()),
                _ => report.unknown.push(member.clone()),
            }
        }
        Ok(report)
    }

    async fn enable_members(
        &self,
        pool: &PoolId,
        members: &[MemberId],
        restore: Option<RestorePolicy>,
    ) -> Result<EnableReport, StoreError> {
        let policy = restore.map(RestorePolicy::as_str).unwrap_or("");
        let mut items = self
            .member_script(&self.scripts.enable, pool, policy.as_bytes(), members)
            .await?;
        let applied = reply::string(reply::next(&mut items)?)?;
        let restore = RestorePolicy::from_name(&applied)
            .ok_or_else(|| unexpected("unknown restore policy"))?;
        let outcomes = reply::array(reply::next(&mut items)?)?;
        let mut report = EnableReport {
            restore,
            enabled: Vec::new(),
            already_eligible: Vec::new(),
            unknown: Vec::new(),
        };
        for (member, outcome) in members.iter().zip(outcomes.chunks(3)) {
            let [status, kept, restored] = outcome else {
                return Err(unexpected("enable outcome too short"));
            };
            match reply::int(status)? {
                1 => report.enabled.push(Restored {
                    member: member.clone(),
                    kept_assignments: reply::count(kept)?,
                    assignments: reply::count(restored)?,
                }),
                2 => report.already_eligible.push(member.clone()),
                _ => report.unknown.push(member.clone()),
            }
        }
        Ok(report)
    }

    async fn remove_members(
        &self,
        pool: &PoolId,
        members: &[MemberId],
    ) -> Result<RemoveReport, StoreError> {
        let mut args: Vec<&[u8]> = Vec::with_capacity(members.len());
        args.extend(members.iter().map(|m| m.as_str().as_bytes()));
        let value = self
            .eval(&self.scripts.remove, &self.pool_keys(pool), &args)
            .await?;
        let mut items = reply::pool_status(value)?;
        let outcomes = reply::array(reply::next(&mut items)?)?;
        let mut report = RemoveReport::default();
        for (member, outcome) in members.iter().zip(outcomes) {
            if reply::int(&outcome)? == 1 {
                report.removed.push(member.clone());
            } else {
                report.unknown.push(member.clone());
            }
        }
        Ok(report)
    }
}
