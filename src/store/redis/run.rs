//! Running a command or a script on Redis: checkout, the store timeout, and the few retries
//! that cannot count anything twice.
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

use std::collections::HashMap;
use std::sync::{PoisonError, RwLock};
use std::time::{Duration, Instant};

use deadpool::managed;
use redis::{ErrorKind, RedisError, Script, ServerErrorKind, ToRedisArgs, Value};

use super::RedisStore;
use super::connection::{Connection, SharedConnection};
use super::keys::{POOL_KEY_PARTS, PoolKeys};
use crate::domain::PoolId;
use crate::store::StoreError;

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

impl RedisStore {
    pub(super) async fn checkout(&self) -> Result<SharedConnection, StoreError> {
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
    pub(super) async fn run<T, F>(&self, request: impl Fn(Connection) -> F) -> Result<T, StoreError>
    where
        F: Future<Output = Result<T, RedisError>>,
    {
        // Counted from before the checkout, so that a call queued for a connection behind a
        // chunk counts as waiting on Redis: one atomic add now and one subtraction when it
        // drops.
        let _in_flight = self.foreground.then(|| self.chunks.traffic.enter());
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
    pub(super) async fn eval(
        &self,
        script: &Script,
        pool: &PoolId,
        args: &[&[u8]],
    ) -> Result<Value, StoreError> {
        self.eval_with(script, pool, None, args).await
    }

    /// [`RedisStore::eval`], with the graveyard names of the pool's keys after them when
    /// `graveyard` holds a token (see `keys.rs`).
    pub(super) async fn eval_with(
        &self,
        script: &Script,
        pool: &PoolId,
        graveyard: Option<&str>,
        args: &[&[u8]],
    ) -> Result<Value, StoreError> {
        self.eval_keyed(script, pool, graveyard, &[], args).await
    }

    /// Runs an assign script (`assign.lua`, `assign_done.lua`) with the pool's keys, `extra`
    /// keys after them, and `args`. Without extra keys (no target, no session: the plain
    /// assign) the command starts from the pool's [`Heads`] instead of being written anew.
    pub(super) async fn eval_assign(
        &self,
        script: &Script,
        pool: &PoolId,
        extra: &[String],
        args: &[&[u8]],
    ) -> Result<Value, StoreError> {
        if !extra.is_empty() {
            return self.eval_keyed(script, pool, None, extra, args).await;
        }
        let mut evalsha = self.heads.head(script, pool, || {
            let keys = PoolKeys {
                prefix: &self.prefix,
                pool,
                parts: &POOL_KEY_PARTS,
                graveyard: None,
            };
            pool_evalsha(script, &keys, &[], &[])
        });
        evalsha.arg(args);
        self.evalsha(script, &evalsha).await
    }

    /// [`RedisStore::eval_with`], with `extra` keys of the pool's hash slot after the
    /// pool's own (a target's ban hash and pacing set, see `keys.rs`).
    pub(super) async fn eval_keyed(
        &self,
        script: &Script,
        pool: &PoolId,
        graveyard: Option<&str>,
        extra: &[String],
        args: &[&[u8]],
    ) -> Result<Value, StoreError> {
        let keys = PoolKeys {
            prefix: &self.prefix,
            pool,
            parts: &POOL_KEY_PARTS,
            graveyard,
        };
        self.evalsha_of(pool, script, &pool_evalsha(script, &keys, extra, args))
            .await
    }

    /// [`RedisStore::eval`] with only the pool's keys `parts` (see `keys.rs`).
    pub(super) async fn eval_parts(
        &self,
        script: &Script,
        pool: &PoolId,
        parts: &[&str],
        args: &[&[u8]],
    ) -> Result<Value, StoreError> {
        let keys = PoolKeys {
            prefix: &self.prefix,
            pool,
            parts,
            graveyard: None,
        };
        self.evalsha_of(pool, script, &pool_evalsha(script, &keys, &[], args))
            .await
    }

    /// [`RedisStore::eval_parts`], with the graveyard names of those keys after them when
    /// `graveyard` holds a token (see `keys.rs`).
    pub(super) async fn eval_parts_with(
        &self,
        script: &Script,
        pool: &PoolId,
        parts: &[&str],
        graveyard: Option<&str>,
        args: &[&[u8]],
    ) -> Result<Value, StoreError> {
        let keys = PoolKeys {
            prefix: &self.prefix,
            pool,
            parts,
            graveyard,
        };
        self.evalsha_of(pool, script, &pool_evalsha(script, &keys, &[], args))
            .await
    }

    /// Runs `script`, which only reads, once for each of `pools` (with each pool's keys
    /// `parts`, no arguments), and answers the replies in the pools' order.
    ///
    /// On one server (or Sentinel's primary) the calls travel as one pipeline: one write and
    /// one read of every reply. Sent one by one (a checkout, a timer and a trip through the
    /// connection's task each), a page of a thousand cost the service about 1.8 times the
    /// CPU of the whole page sent so. A pipeline on a cluster must stay in one hash slot, and
    /// every pool has its own, so there each call goes by itself, all of them at once on
    /// the shared connection. Either way the page is one call of [`RedisStore::run`]: sent
    /// again after an answer that ran nothing, it repeats reads only.
    pub(super) async fn eval_each(
        &self,
        script: &Script,
        parts: &[&str],
        pools: &[PoolId],
    ) -> Result<Vec<Value>, StoreError> {
        // Nothing to send: the client fails an empty pipeline instead of answering an empty list.
        if pools.is_empty() {
            return Ok(Vec::new());
        }
        let calls: Vec<redis::Cmd> = pools
            .iter()
            .map(|pool| {
                let keys = PoolKeys {
                    prefix: &self.prefix,
                    pool,
                    parts,
                    graveyard: None,
                };
                pool_evalsha(script, &keys, &[], &[])
            })
            .collect();
        let calls = &calls;
        self.run(|connection| async move {
            match connection {
                Connection::Cluster(_) => {
                    let each = calls.iter().map(|evalsha| {
                        let mut connection = connection.clone();
                        async move { query_or_load(script, evalsha, &mut connection).await }
                    });
                    futures_util::future::try_join_all(each).await
                }
                Connection::Standalone(_) | Connection::Sentinel { .. } => {
                    let mut pipeline = redis::Pipeline::with_capacity(calls.len());
                    for evalsha in calls {
                        pipeline.add_command(evalsha.clone());
                    }
                    // Errors come back in place, so that a NOSCRIPT can be told apart.
                    pipeline.ignore_errors();
                    let mut connection = connection;
                    let mut replies: Vec<Value> = pipeline.query_async(&mut connection).await?;
                    if replies.iter().any(is_noscript) {
                        script.prepare_invoke().load_async(&mut connection).await?;
                        replies = pipeline.query_async(&mut connection).await?;
                    }
                    replies
                        .into_iter()
                        .map(|reply| match reply {
                            Value::ServerError(error) => Err(RedisError::from(error)),
                            reply => Ok(reply),
                        })
                        .collect()
                }
            }
        })
        .await
    }

    /// Runs a script that is not a pool script on keys of their own hash slot (a due index;
    /// the registry and its walk).
    pub(super) async fn eval_on(
        &self,
        script: &Script,
        keys: &[&str],
        args: &[&[u8]],
    ) -> Result<Value, StoreError> {
        let mut evalsha = redis::cmd("EVALSHA");
        evalsha
            .arg(script.get_hash())
            .arg(keys.len())
            .arg(keys)
            .arg(args);
        self.evalsha(script, &evalsha).await
    }

    /// Sends `evalsha`, a call on `pool`'s keys; a large operation's (the store is not
    /// `foreground`) counts its bytes first, so that what Redis received from others can be
    /// told from it (see `RemoteLoad` in chunks.rs).
    async fn evalsha_of(
        &self,
        pool: &PoolId,
        script: &Script,
        evalsha: &redis::Cmd,
    ) -> Result<Value, StoreError> {
        if !self.foreground {
            self.chunks.load.sent(pool, packed_len(evalsha));
        }
        self.evalsha(script, evalsha).await
    }

    /// Sends `evalsha`, loading `script` and sending it again after NOSCRIPT.
    async fn evalsha(&self, script: &Script, evalsha: &redis::Cmd) -> Result<Value, StoreError> {
        self.run(
            |mut connection| async move { query_or_load(script, evalsha, &mut connection).await },
        )
        .await
    }

    pub(super) async fn command(&self, cmd: redis::Cmd) -> Result<Value, StoreError> {
        let cmd = &cmd;
        self.run(|mut connection| async move { cmd.query_async(&mut connection).await })
            .await
    }
}

/// `EVALSHA` of `script` on one pool's `keys` with `args`, written in one buffer.
fn pool_evalsha(
    script: &Script,
    keys: &PoolKeys<'_>,
    extra: &[String],
    args: &[&[u8]],
) -> redis::Cmd {
    let mut evalsha = redis::Cmd::with_capacity(
        3 + 2 * keys.parts.len() + extra.len() + args.len(),
        script.get_hash().len()
            + keys.bytes()
            + extra.iter().map(String::len).sum::<usize>()
            + args.iter().map(|a| a.len()).sum::<usize>(),
    );
    evalsha
        .arg("EVALSHA")
        .arg(script.get_hash())
        .arg(keys.num_of_args() + extra.len())
        .arg(keys)
        .arg(extra)
        .arg(args);
    evalsha
}

/// Sends `evalsha` on `connection`; after NOSCRIPT (nothing ran) loads `script` and sends
/// it once more.
async fn query_or_load(
    script: &Script,
    evalsha: &redis::Cmd,
    connection: &mut Connection,
) -> Result<Value, RedisError> {
    match evalsha.query_async(connection).await {
        Err(error) if error.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
            script.prepare_invoke().load_async(connection).await?;
            evalsha.query_async(connection).await
        }
        result => result,
    }
}

/// Whether a reply in a pipeline is Redis's NOSCRIPT.
fn is_noscript(reply: &Value) -> bool {
    matches!(reply, Value::ServerError(error) if error.kind() == Some(ServerErrorKind::NoScript))
}

/// Most pools whose assign heads [`Heads`] keeps: about 1 KB a script each.
const HEAD_POOLS: usize = 512;

/// The start of the assign scripts' `EVALSHA` for each pool: the script's hash, the key
/// count and the pool's keys, everything but the arguments. An assign clones its pool's
/// head and appends its arguments; writing the keys anew was about a twelfth of the
/// service's instructions per assign. The keys depend on nothing but the prefix and the
/// pool id, so a head never goes stale, even across a deleted and recreated pool. Bounded
/// at [`HEAD_POOLS`] pools: the cache then starts over, so that the pools assigned from
/// now take the places again.
#[derive(Default)]
pub(super) struct Heads(RwLock<HashMap<PoolId, Vec<redis::Cmd>>>);

impl Heads {
    /// A copy of `pool`'s head for `script`, written with `write` the first time.
    fn head(
        &self,
        script: &Script,
        pool: &PoolId,
        write: impl FnOnce() -> redis::Cmd,
    ) -> redis::Cmd {
        // A head's second argument is its script's hash.
        let of_script = |head: &&redis::Cmd| {
            head.args_iter().nth(1) == Some(redis::Arg::Simple(script.get_hash().as_bytes()))
        };
        // A poisoned lock only means a panic while a head was added: the map is whole.
        if let Some(head) = self
            .0
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(pool)
            .and_then(|heads| heads.iter().find(of_script))
        {
            return head.clone();
        }
        let head = write();
        let mut all = self.0.write().unwrap_or_else(PoisonError::into_inner);
        if all.len() >= HEAD_POOLS && !all.contains_key(pool) {
            all.clear();
        }
        let heads = all.entry(pool.clone()).or_default();
        if !heads.iter().any(|h| of_script(&h)) {
            heads.push(head.clone());
        }
        head
    }
}

/// How many bytes `cmd` takes on the wire, as the client writes it (RESP2 and RESP3 alike:
/// an array of bulk strings), without writing it.
fn packed_len(cmd: &redis::Cmd) -> usize {
    let digits = |n: usize| n.checked_ilog10().unwrap_or(0) as usize + 1;
    let mut args = 0;
    let mut bytes = 0;
    for arg in cmd.args_iter() {
        let len = match arg {
            redis::Arg::Simple(data) => data.len(),
            // Only SCAN's cursor is written otherwise, and no script call has one.
            _ => 1,
        };
        args += 1;
        // `$<len>\r\n<data>\r\n`
        bytes += 1 + digits(len) + 2 + len + 2;
    }
    // `*<args>\r\n`
    1 + digits(args) + 2 + bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(id: &str) -> PoolId {
        PoolId::parse(id).expect("a valid pool id")
    }

    /// The plain assign's command as written without a head: the pool's keys, then `args`.
    fn written(script: &Script, pool: &PoolId, args: &[&[u8]]) -> Vec<u8> {
        let keys = PoolKeys {
            prefix: "pa",
            pool,
            parts: &POOL_KEY_PARTS,
            graveyard: None,
        };
        pool_evalsha(script, &keys, &[], args).get_packed_command()
    }

    fn head_of(heads: &Heads, script: &Script, pool: &PoolId) -> redis::Cmd {
        heads.head(script, pool, || {
            let keys = PoolKeys {
                prefix: "pa",
                pool,
                parts: &POOL_KEY_PARTS,
                graveyard: None,
            };
            pool_evalsha(script, &keys, &[], &[])
        })
    }

    #[test]
    fn a_command_from_a_kept_head_is_byte_for_byte_the_command_written_anew() {
        let heads = Heads::default();
        let assign = Script::new("return 'assign'");
        let done = Script::new("return 'done'");
        let args: [&[u8]; 3] = [b"lease", b"", b"1"];
        for _ in 0..2 {
            for script in [&assign, &done] {
                for id in ["p", "q"] {
                    let mut evalsha = head_of(&heads, script, &pool(id));
                    evalsha.arg(&args[..]);
                    assert_eq!(
                        evalsha.get_packed_command(),
                        written(script, &pool(id), &args)
                    );
                }
            }
        }
    }

    #[test]
    fn the_heads_start_over_when_more_pools_than_their_bound_assign() {
        let heads = Heads::default();
        let script = Script::new("return 1");
        for i in 0..HEAD_POOLS {
            head_of(&heads, &script, &pool(&format!("p{i}")));
        }
        assert_eq!(heads.0.read().expect("heads").len(), HEAD_POOLS);
        head_of(&heads, &script, &pool("one-more"));
        let kept = heads.0.read().expect("heads");
        assert_eq!(kept.len(), 1);
        assert_eq!(kept.get(&pool("one-more")).map(Vec::len), Some(1));
    }

    #[test]
    fn a_commands_length_on_the_wire_is_what_the_client_writes() {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg("0123456789abcdef0123456789abcdef01234567")
            .arg(2)
            .arg("{web}:meta")
            .arg("{web}:eligible")
            .arg(&[b"x".repeat(1_000), Vec::new(), b"1".to_vec()]);
        assert_eq!(packed_len(&cmd), cmd.get_packed_command().len());
        assert_eq!(packed_len(&cmd), 1_131);
    }
}
