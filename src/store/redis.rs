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
//! | `<prefix>:{<pool>}:by_in_flight` | sorted set | least-in-flight: the choosing order (see `scripts/leases.lua`) |
//! | `<prefix>:{<pool>}:in_flight` | hash | member -> live leases (absent when none) |
//! | `<prefix>:{<pool>}:leases` | hash | lease id -> member |
//! | `<prefix>:{<pool>}:lease_expiry` | sorted set | lease id -> expiry (ms, Redis clock) |
//! | `<prefix>:{<pool>}:health` | hash | member -> `"<streak> <trips> <cooldown_ms>"` (absent when all 0) |
//! | `<prefix>:{<pool>}:returns` | sorted set | cooling-down member -> when it comes back (ms, Redis clock) |
//! | `<prefix>:{<pool>}:checks` | hash | member -> `"<at_ms> <result> <detail>"`, its last active check |
//! | `<prefix>:{<pool>}:check_round` | string with ttl | held by the replica running the pool's check round |
//! | `<prefix>:pools` | set | pool ids, for listing; updated outside the pool scripts because it lives in another slot |
//!
//! # Connections
//! `connection.rs` reaches a standalone server, a Redis Cluster or Sentinel's primary; the
//! operations below are written once against its `Connection`. deadpool-redis's own
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
//!
//! A script call is never retried after it was sent: the script may have run with only its
//! reply lost, and running it again would count an assignment twice. The caller gets a 503
//! instead. The same holds for a release: a retried one finds the lease gone and answers
//! 404, never a second decrement. The exceptions are answers that prove Redis ran nothing:
//! NOSCRIPT, after which `eval` loads the script (on a cluster, on every node) and sends
//! it again; and, within the store timeout, the answers of a failover in progress (MOVED,
//! TRYAGAIN, CLUSTERDOWN, MASTERDOWN, READONLY) or of a script cache flushed once more,
//! after which the call is sent again once the cluster's slot map or Sentinel's primary has
//! moved on.

mod connection;

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use deadpool::managed;
use redis::{ErrorKind, RedisError, RedisWrite, Script, ServerErrorKind, ToRedisArgs, Value};

pub use self::connection::RedisTopology;
use self::connection::{Connection, SharedConnection, SharedConnectionManager};

use super::{
    Assignment, CheckRound, Cursor, DisableReport, Effect, EnableReport, Health, LastCheck, Lease,
    MAX_PROBES_PER_ROUND, MemberPage, MemberState, MemberView, PoolInfo, PoolStats, PutPool,
    REAP_BATCH, REAP_ON_ASSIGN, RETURN_ON_ASSIGN, RemoveReport, Renewed, Report, ReportSource,
    ReportSummary, Restored, Seed, SeedReport, StateFilter, Store, StoreError, StoreStatus, Swept,
};
use crate::domain::{
    LeaseId, LeaseTtl, MemberId, OutcomeResult, PoolConfig, PoolId, RestorePolicy, Timestamp,
};

/// The batch sizes every assign passes to its script, written out once rather than on
/// every call of the hot path.
static ASSIGN_BATCHES: std::sync::LazyLock<[String; 2]> =
    std::sync::LazyLock::new(|| [REAP_ON_ASSIGN.to_string(), RETURN_ON_ASSIGN.to_string()]);

/// Most reaper steps one sweep runs on one pool, so that a sweep always ends.
const MAX_REAP_STEPS: u64 = 64;

/// Every key of a pool, in the order of `KEYS` in every pool script (see `leases.lua` and
/// `health.lua`).
const POOL_KEY_PARTS: [&str; 12] = [
    "meta",
    "eligible",
    "ineligible",
    "taken_out",
    "by_in_flight",
    "in_flight",
    "leases",
    "lease_expiry",
    "health",
    "returns",
    "checks",
    "check_round",
];

/// Every key of one pool, in the order of [`POOL_KEY_PARTS`], written straight into a
/// command as its arguments.
struct PoolKeys<'a> {
    prefix: &'a str,
    pool: &'a PoolId,
}

impl PoolKeys<'_> {
    /// The bytes of a key, less its part.
    fn head(&self) -> usize {
        self.prefix.len() + self.pool.as_str().len() + ":{}:".len()
    }

    /// The bytes of every key together.
    fn bytes(&self) -> usize {
        POOL_KEY_PARTS
            .iter()
            .map(|part| self.head() + part.len())
            .sum()
    }
}

impl ToRedisArgs for PoolKeys<'_> {
    fn write_redis_args<W>(&self, out: &mut W)
    where
        W: ?Sized + RedisWrite,
    {
        // One buffer for every key: `write_arg` copies a whole key at a time, where
        // redis-rs's argument writer would take each piece through `io::Write`.
        let longest = POOL_KEY_PARTS.iter().map(|part| part.len()).max();
        let mut key = Vec::with_capacity(self.head() + longest.unwrap_or(0));
        for part in POOL_KEY_PARTS {
            key.clear();
            key.extend_from_slice(self.prefix.as_bytes());
            key.extend_from_slice(b":{");
            key.extend_from_slice(self.pool.as_str().as_bytes());
            key.extend_from_slice(b"}:");
            key.extend_from_slice(part.as_bytes());
            out.write_arg(&key);
        }
    }

    fn num_of_args(&self) -> usize {
        POOL_KEY_PARTS.len()
    }
}

/// A script with the shared helpers of `scripts/leases.lua` and `scripts/health.lua` in
/// front of it.
macro_rules! with_helpers {
    ($file:literal) => {
        Script::new(concat!(
            include_str!("scripts/leases.lua"),
            include_str!("scripts/health.lua"),
            include_str!($file)
        ))
    };
}

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
    release: Script,
    renew: Script,
    reap: Script,
    outcomes: Script,
    claim_check: Script,
}

impl Scripts {
    fn new() -> Self {
        Self {
            assign: with_helpers!("scripts/assign.lua"),
            put_pool: Script::new(include_str!("scripts/put_pool.lua")),
            pool_info: Script::new(include_str!("scripts/pool_info.lua")),
            delete_pool: Script::new(include_str!("scripts/delete_pool.lua")),
            seed: with_helpers!("scripts/seed.lua"),
            members: Script::new(include_str!("scripts/members.lua")),
            disable: with_helpers!("scripts/disable.lua"),
            enable: with_helpers!("scripts/enable.lua"),
            remove: with_helpers!("scripts/remove.lua"),
            release: with_helpers!("scripts/release.lua"),
            renew: with_helpers!("scripts/renew.lua"),
            reap: with_helpers!("scripts/reap.lua"),
            outcomes: with_helpers!("scripts/outcomes.lua"),
            claim_check: Script::new(include_str!("scripts/claim_check.lua")),
        }
    }

    fn all(&self) -> [&Script; 14] {
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
            &self.release,
            &self.renew,
            &self.reap,
            &self.outcomes,
            &self.claim_check,
        ]
    }
}

/// The first wait before a call that ran nothing is sent again; it doubles up to
/// [`LAST_RETRY_PAUSE`] while the store timeout allows.
const FIRST_RETRY_PAUSE: Duration = Duration::from_millis(10);

/// The longest wait between two sends of a call that ran nothing.
const LAST_RETRY_PAUSE: Duration = Duration::from_millis(200);

/// Answers with which Redis refuses a command before running any of it, and which clear up
/// by themselves: the slot is served elsewhere now (MOVED), the cluster is electing a
/// primary (TRYAGAIN, CLUSTERDOWN, MASTERDOWN), the server was demoted to replica
/// (READONLY: a script's first write fails before anything changed), or the script cache
/// was flushed again between `Script`'s own load and its second send (NOSCRIPT). Sending
/// the call again cannot count anything twice. A standalone primary answers only NOSCRIPT.
fn ran_nothing(error: &RedisError) -> bool {
    matches!(
        error.kind(),
        ErrorKind::Server(
            ServerErrorKind::NoScript
                | ServerErrorKind::Moved
                | ServerErrorKind::TryAgain
                | ServerErrorKind::ClusterDown
                | ServerErrorKind::MasterDown
                | ServerErrorKind::ReadOnly
        )
    )
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
            // RESP3 answers SMEMBERS with a set.
            Value::Array(items) | Value::Set(items) => Ok(items),
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
    /// [`StoreError::Unavailable`] when a URL cannot be parsed or the pool cannot be built.
    pub async fn connect(options: RedisStoreOptions) -> Result<Self, StoreError> {
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

    /// Runs one command or script within the store timeout. `request` is called again only
    /// after an answer that proves nothing ran (see the module doc), on a connection checked
    /// out afresh.
    async fn run<T, F>(&self, request: impl Fn(Connection) -> F) -> Result<T, StoreError>
    where
        F: Future<Output = Result<T, RedisError>>,
    {
        let started = Instant::now();
        let result = self.run_timed(started, request).await;
        crate::monitoring::record_store_round_trip(started.elapsed().as_secs_f64());
        if let Err(error) = &result {
            let kind = match error {
                StoreError::Timeout(_) => "timeout",
                _ => "unavailable",
            };
            metrics::counter!("pa_store_errors_total", "kind" => kind).increment(1);
        }
        result
    }

    async fn run_timed<T, F>(
        &self,
        started: Instant,
        request: impl Fn(Connection) -> F,
    ) -> Result<T, StoreError>
    where
        F: Future<Output = Result<T, RedisError>>,
    {
        let deadline = tokio::time::Instant::from_std(started) + self.timeout;
        let mut pause = FIRST_RETRY_PAUSE;
        loop {
            let conn = tokio::time::timeout_at(deadline, self.checkout())
                .await
                .map_err(|_| StoreError::Timeout(self.timeout))??;
            match tokio::time::timeout_at(deadline, request(conn.connection.clone())).await {
                Ok(Ok(value)) => return Ok(value),
                Ok(Err(error)) => {
                    conn.retire_if_failed(&error);
                    if ran_nothing(&error) && tokio::time::Instant::now() + pause < deadline {
                        tokio::time::sleep(pause).await;
                        pause = (pause * 2).min(LAST_RETRY_PAUSE);
                        continue;
                    }
                    return Err(StoreError::Unavailable(Box::new(error)));
                }
                Err(_) => {
                    // A stalled connection would stall every request multiplexed onto it.
                    conn.retire();
                    return Err(StoreError::Timeout(self.timeout));
                }
            }
        }
    }

    /// Runs a pool script with the pool's keys. The command is written once, keys straight
    /// into it: an assign allocates no key strings of its own. After NOSCRIPT (a restarted
    /// or flushed Redis) the script is loaded and the same command sent again, as
    /// `Script::invoke_async` would; NOSCRIPT proves nothing ran.
    async fn eval(
        &self,
        script: &Script,
        pool: &PoolId,
        args: &[&[u8]],
    ) -> Result<Value, StoreError> {
        let keys = PoolKeys {
            prefix: &self.prefix,
            pool,
        };
        let mut evalsha = redis::Cmd::with_capacity(
            3 + POOL_KEY_PARTS.len() + args.len(),
            script.get_hash().len() + keys.bytes() + args.iter().map(|a| a.len()).sum::<usize>(),
        );
        evalsha
            .arg("EVALSHA")
            .arg(script.get_hash())
            .arg(POOL_KEY_PARTS.len())
            .arg(&keys)
            .arg(args);
        let evalsha = &evalsha;
        self.run(|mut connection| async move {
            match evalsha.query_async(&mut connection).await {
                Err(error) if error.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                    script.prepare_invoke().load_async(&mut connection).await?;
                    evalsha.query_async(&mut connection).await
                }
                result => result,
            }
        })
        .await
    }

    async fn command(&self, cmd: redis::Cmd) -> Result<Value, StoreError> {
        let cmd = &cmd;
        self.run(|mut connection| async move { cmd.query_async(&mut connection).await })
            .await
    }

    fn registry_key(&self) -> String {
        format!("{}:pools", self.prefix)
    }

    /// Every registered pool id, in id order.
    async fn pool_ids(&self) -> Result<Vec<PoolId>, StoreError> {
        let mut smembers = redis::cmd("SMEMBERS");
        smembers.arg(self.registry_key());
        let ids = reply::array(self.command(smembers).await?)?;
        let mut ids: Vec<PoolId> = ids
            .into_iter()
            .filter_map(|v| reply::string(v).ok())
            .filter_map(|s| PoolId::parse(&s).ok())
            .collect();
        ids.sort();
        Ok(ids)
    }

    /// Sweep steps on one pool until it has no expired lease and no due return left (or
    /// the step budget is spent; the next sweep goes on).
    async fn sweep_pool(&self, pool: &PoolId) -> Result<Swept, StoreError> {
        let batch = REAP_BATCH.to_string();
        let mut swept = Swept::default();
        for _ in 0..MAX_REAP_STEPS {
            let value = self
                .eval(&self.scripts.reap, pool, &[batch.as_bytes()])
                .await?;
            let (reclaimed, returned) = match reply::pool_status(value) {
                Ok(mut items) => (
                    reply::count(&reply::next(&mut items)?)?,
                    reply::count(&reply::next(&mut items)?)?,
                ),
                // Deleted between the listing and the step.
                Err(StoreError::PoolNotFound) => (0, 0),
                Err(e) => return Err(e),
            };
            swept = swept
                + Swept {
                    reclaimed,
                    returned,
                };
            if reclaimed < REAP_BATCH && returned < REAP_BATCH {
                break;
            }
        }
        Ok(swept)
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
        let value = self.eval(script, pool, &args).await?;
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

/// One set's page as the members script returns it: `(member, count)` pairs and, per
/// member, its live leases, health, scheduled return and last check.
struct SetPage {
    pairs: Value,
    live: Value,
    health: Value,
    returns: Option<Value>,
    checks: Value,
}

fn parse_health(value: &Value) -> Result<Health, StoreError> {
    if matches!(value, Value::Nil) {
        return Ok(Health::default());
    }
    let text = reply::string(value.clone())?;
    let mut numbers = text.split(' ').map(str::parse::<u64>);
    let mut next = || {
        numbers
            .next()
            .and_then(Result::ok)
            .ok_or_else(|| unexpected("malformed health entry"))
    };
    Ok(Health {
        streak: next()?,
        trips: next()?,
        cooldown_ms: next()?,
    })
}

fn parse_last_check(value: Value) -> Result<Option<LastCheck>, StoreError> {
    if matches!(value, Value::Nil) {
        return Ok(None);
    }
    let text = reply::string(value)?;
    let mut parts = text.splitn(3, ' ');
    let at = parts.next().and_then(|t| t.parse::<u64>().ok());
    let result = parts.next().and_then(OutcomeResult::from_name);
    match (at, result) {
        (Some(at), Some(result)) => Ok(Some(LastCheck {
            at: Timestamp(at),
            result,
            detail: parts.next().unwrap_or("").to_owned(),
        })),
        _ => Err(unexpected("malformed check entry")),
    }
}

fn member_views(page: SetPage, infos: Option<Vec<Value>>) -> Result<Vec<MemberView>, StoreError> {
    let pairs = reply::array(page.pairs)?;
    let mut live = reply::array(page.live)?.into_iter();
    let mut health = reply::array(page.health)?.into_iter();
    let mut checks = reply::array(page.checks)?.into_iter();
    let mut returns = page
        .returns
        .map(reply::array)
        .transpose()?
        .map(Vec::into_iter);
    let mut infos = infos.map(Vec::into_iter);
    let mut views = Vec::with_capacity(pairs.len() / 2);
    let mut items = pairs.into_iter();
    while let Some(member) = items.next() {
        let member = MemberId::from_stored(reply::string(member)?);
        let assignments = reply::count(&reply::next(&mut items)?)?;
        let in_flight = reply::optional_count(&live.next().unwrap_or(Value::Nil))?.unwrap_or(0);
        let (state, (reason, since)) = match infos.as_mut() {
            None => (MemberState::Eligible, (None, None)),
            Some(infos) => (
                MemberState::Ineligible,
                parse_taken_out(infos.next().unwrap_or(Value::Nil))?,
            ),
        };
        let health = parse_health(&health.next().unwrap_or(Value::Nil))?;
        let returns_at = match returns.as_mut().and_then(Iterator::next) {
            Some(value) => reply::optional_count(&value)?.map(Timestamp),
            None => None,
        };
        views.push(MemberView {
            member,
            state,
            assignments,
            in_flight,
            reason,
            since,
            consecutive_failures: health.streak,
            last_cooldown_ms: (health.trips > 0).then_some(health.cooldown_ms),
            returns_at,
            last_check: parse_last_check(checks.next().unwrap_or(Value::Nil))?,
        });
    }
    Ok(views)
}

/// The `expires_ms, ttl_ms` pair that ends the lease replies.
fn lease_times(
    items: &mut impl Iterator<Item = Value>,
) -> Result<(Timestamp, LeaseTtl), StoreError> {
    let expires_at = Timestamp(reply::count(&reply::next(items)?)?);
    let ttl = LeaseTtl::from_millis(reply::count(&reply::next(items)?)?)
        .map_err(|_| unexpected("lease ttl out of range"))?;
    Ok((expires_at, ttl))
}

/// The status lease scripts put after the pool's: `0` means no live lease.
fn lease_found(items: &mut impl Iterator<Item = Value>) -> Result<(), StoreError> {
    match reply::int(&reply::next(items)?)? {
        0 => Err(StoreError::LeaseNotFound),
        _ => Ok(()),
    }
}

#[async_trait]
impl Store for RedisStore {
    fn name(&self) -> &'static str {
        "redis"
    }

    async fn status(&self) -> Result<StoreStatus, StoreError> {
        self.run(|mut connection| async move { connection.status().await })
            .await
    }

    async fn assign(&self, pool: &PoolId, ttl: Option<LeaseTtl>) -> Result<Assignment, StoreError> {
        // The id is drawn for every assign, used only on least-in-flight pools: deciding
        // here would need the pool's policy, which only the script reads.
        let id = LeaseId::random();
        let ttl_arg = ttl.map(|t| t.as_millis().to_string()).unwrap_or_default();
        let [reap, returns] = &*ASSIGN_BATCHES;
        let args: [&[u8]; 4] = [
            id.as_str().as_bytes(),
            ttl_arg.as_bytes(),
            reap.as_bytes(),
            returns.as_bytes(),
        ];
        let value = self.eval(&self.scripts.assign, pool, &args).await?;
        let mut items = reply::array(value)?.into_iter();
        let status = reply::int(&reply::next(&mut items)?)?;
        if status == -1 {
            return Err(StoreError::PoolNotFound);
        }
        if status == 0 {
            // The wait can be 0 or below when more members are due than one assign returns.
            let next_return = items
                .next()
                .map(|ms| reply::int(&ms))
                .transpose()?
                .map(|ms| Duration::from_millis(u64::try_from(ms).unwrap_or(0)));
            return Ok(Assignment::Empty { next_return });
        }
        let member = MemberId::from_stored(reply::string(reply::next(&mut items)?)?);
        let assignments = reply::count(&reply::next(&mut items)?)?;
        if status == 1 {
            return Ok(Assignment::Assigned {
                member,
                assignments,
            });
        }
        let in_flight = reply::count(&reply::next(&mut items)?)?;
        let (expires_at, ttl_ms) = lease_times(&mut items)?;
        Ok(Assignment::Leased {
            member,
            assignments,
            in_flight,
            lease: Lease {
                id,
                expires_at,
                ttl_ms,
            },
        })
    }

    async fn release(&self, pool: &PoolId, lease: &LeaseId) -> Result<(), StoreError> {
        let value = self
            .eval(&self.scripts.release, pool, &[lease.as_str().as_bytes()])
            .await?;
        let mut items = reply::pool_status(value)?;
        lease_found(&mut items)
    }

    async fn renew(
        &self,
        pool: &PoolId,
        lease: &LeaseId,
        ttl: Option<LeaseTtl>,
    ) -> Result<Renewed, StoreError> {
        let ttl_arg = ttl.map(|t| t.as_millis().to_string()).unwrap_or_default();
        let args: [&[u8]; 2] = [lease.as_str().as_bytes(), ttl_arg.as_bytes()];
        let value = self.eval(&self.scripts.renew, pool, &args).await?;
        let mut items = reply::pool_status(value)?;
        lease_found(&mut items)?;
        let member = MemberId::from_stored(reply::string(reply::next(&mut items)?)?);
        let (expires_at, ttl_ms) = lease_times(&mut items)?;
        Ok(Renewed {
            member,
            lease: Lease {
                id: lease.clone(),
                expires_at,
                ttl_ms,
            },
        })
    }

    async fn sweep(&self) -> Result<Swept, StoreError> {
        let pools = self.pool_ids().await?;
        // Issued together so that they travel pipelined on the shared connection.
        let swept =
            futures_util::future::join_all(pools.iter().map(|pool| self.sweep_pool(pool))).await;
        swept
            .into_iter()
            .try_fold(Swept::default(), |sum, pool| Ok(sum + pool?))
    }

    async fn report(
        &self,
        pool: &PoolId,
        source: ReportSource,
        reports: &[Report],
    ) -> Result<ReportSummary, StoreError> {
        let draw = super::jitter_draw().to_string();
        let mut args: Vec<&[u8]> = Vec::with_capacity(reports.len() * 3 + 2);
        args.push(source.as_str().as_bytes());
        args.push(draw.as_bytes());
        for report in reports {
            args.push(report.member.as_str().as_bytes());
            args.push(report.result.as_str().as_bytes());
            args.push(report.detail.as_bytes());
        }
        let value = self.eval(&self.scripts.outcomes, pool, &args).await?;
        let mut items = reply::pool_status(value)?;
        let outcomes = reply::array(reply::next(&mut items)?)?;
        let mut summary = ReportSummary::default();
        for (report, outcome) in reports.iter().zip(outcomes.chunks(2)) {
            let [effect, streak] = outcome else {
                return Err(unexpected("outcome too short"));
            };
            let effect = match reply::int(effect)? {
                0 => {
                    summary.unknown.push(report.member.clone());
                    continue;
                }
                1 => Effect::Counted,
                2 => Effect::Tripped,
                3 => Effect::Ignored,
                _ => Effect::Returned,
            };
            summary.applied.push((
                report.member.clone(),
                report.result,
                effect,
                reply::count(streak)?,
            ));
        }
        Ok(summary)
    }

    async fn claim_check_round(
        &self,
        pool: &PoolId,
        interval: Duration,
    ) -> Result<Option<CheckRound>, StoreError> {
        let ms = interval.as_millis().max(1).to_string();
        let limit = MAX_PROBES_PER_ROUND.to_string();
        let value = self
            .eval(
                &self.scripts.claim_check,
                pool,
                &[ms.as_bytes(), limit.as_bytes()],
            )
            .await?;
        let mut items = reply::pool_status(value)?;
        if reply::int(&reply::next(&mut items)?)? == 0 {
            return Ok(None);
        }
        let members = |value: Value| -> Result<Vec<MemberId>, StoreError> {
            reply::array(value)?
                .into_iter()
                .map(|m| reply::string(m).map(MemberId::from_stored))
                .collect()
        };
        Ok(Some(CheckRound {
            eligible: members(reply::next(&mut items)?)?,
            cooling: members(reply::next(&mut items)?)?,
        }))
    }

    async fn put_pool(&self, pool: &PoolId, config: &PoolConfig) -> Result<PutPool, StoreError> {
        let json = serde_json::to_vec(config).map_err(|e| StoreError::Unavailable(Box::new(e)))?;
        let start = config
            .start_assignments
            .map(|n| n.to_string())
            .unwrap_or_default();
        let ttl = config.lease_ttl_ms.as_millis().to_string();
        let cap = config
            .max_in_flight
            .map(|n| n.to_string())
            .unwrap_or_default();
        let max = config
            .rules
            .max_members
            .map(|n| n.to_string())
            .unwrap_or_default();
        let health = config.health.script_arg();
        let args: [&[u8]; 8] = [
            &json,
            config.restore.as_str().as_bytes(),
            start.as_bytes(),
            config.policy.as_str().as_bytes(),
            ttl.as_bytes(),
            cap.as_bytes(),
            max.as_bytes(),
            health.as_bytes(),
        ];
        let value = self.eval(&self.scripts.put_pool, pool, &args).await?;
        let created = match reply::int(&value)? {
            -2 => return Err(StoreError::PolicyChangeRequiresEmptyPool),
            status => status == 1,
        };
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
        let value = self.eval(&self.scripts.pool_info, pool, &[]).await?;
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
        let in_flight = reply::count(&reply::next(&mut items)?)?;
        let abandoned = reply::optional_count(&reply::next(&mut items)?)?.unwrap_or(0);
        let tripped = reply::optional_count(&reply::next(&mut items)?)?.unwrap_or(0);
        let recovered = reply::optional_count(&reply::next(&mut items)?)?.unwrap_or(0);
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
                in_flight,
                abandoned,
                tripped,
                recovered,
            },
        })
    }

    async fn pools(&self) -> Result<Vec<PoolInfo>, StoreError> {
        let ids = self.pool_ids().await?;
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
        let value = self.eval(&self.scripts.delete_pool, pool, &[]).await?;
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
        let value = self.eval(&self.scripts.seed, pool, &args).await?;
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
        let value = self.eval(&self.scripts.members, pool, &args).await?;
        let mut items = reply::pool_status(value)?;
        let mut next = || reply::next(&mut items);
        let (eligible_pairs, ineligible_pairs) = (next()?, next()?);
        let infos = reply::array(next()?)?;
        let (eligible_live, ineligible_live) = (next()?, next()?);
        let (eligible_health, ineligible_health) = (next()?, next()?);
        let returns = next()?;
        let (eligible_checks, ineligible_checks) = (next()?, next()?);
        let eligible = member_views(
            SetPage {
                pairs: eligible_pairs,
                live: eligible_live,
                health: eligible_health,
                returns: None,
                checks: eligible_checks,
            },
            None,
        )?;
        let ineligible = member_views(
            SetPage {
                pairs: ineligible_pairs,
                live: ineligible_live,
                health: ineligible_health,
                returns: Some(returns),
                checks: ineligible_checks,
            },
            Some(infos),
        )?;
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
        let value = self.eval(&self.scripts.remove, pool, &args).await?;
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
