//! The two stores against each other: random sequences of the [`Store`] trait's
//! operations (`twins/ops.rs`: pools created, reconfigured, deleted and created again;
//! seeds and imports; assigns of every kind; worker and check reports; releases, renewals,
//! sessions ended; disables, enables, removals; listings; the sweep; and steps of the
//! clock), each run on an [`EmbeddedStore`] and on a [`RedisStore`] over a real
//! `redis-server`. After every step the two answers must be the same text, and so must a
//! dump of both pools (their numbers and configuration, every member with its count,
//! state, reason, in-flight leases, health and labels, and its ban for each target).
//! proptest draws the sequences from a fixed seed and shrinks a failing one to the
//! shortest it can find, which is in the failure's message.
//!
//! # One clock
//! Both stores run on a clock the test sets (the embedded store's [`Clock`](super::embedded),
//! the Redis scripts' `TIME` read from a key instead: `Scripts::on_test_clock`): it starts
//! at [`EPOCH`] and moves only when a sequence says `Advance(ms)`. So every time in an
//! answer is the same on both sides, and cooldowns, bans, lease expiries, pacing rests,
//! sessions and returns all come due inside a sequence, at the same step on both sides.
//! [`EPOCH`] is years ahead of the real time, because Redis still expires keys by its own
//! clock (`PEXPIREAT` the scripts set from the test clock lands in the future; sessions
//! last longer than a sequence runs).
//!
//! `TWINS_CASES=n` runs n sequences instead of 600; `TWINS_TRACE=1` (with `--nocapture`)
//! prints every step and its answer.
//!
//! What the answers hold of chance is masked: lease ids (random on each side) become
//! `L0`, `L1`, ... in the order they were first handed out, and a sequence names a lease
//! by that order. Cooldowns have no jitter (every pool has `jitter_percent: 0`).
//!
//! The Redis store's safety net (the walk of the pool registry that repairs a due index
//! left behind by a replica that died) is held off: it would sweep every pool of a
//! two-pool test at every sweep, where in a service with many pools it reaches one rarely,
//! and hide a due index that is wrong.

mod ops;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use proptest::prelude::*;
use redis::aio::MultiplexedConnection;

use self::ops::{Op, POOLS, TARGETS};
use super::{
    Cursor, EmbeddedStore, RedisStore, RedisStoreOptions, RedisTopology, StateFilter, Store,
};
use crate::domain::{LabelFilter, LeaseId};
use crate::test_redis::RedisServer;

/// Where the test clock starts (Unix milliseconds): 2033-05-18, years ahead of the real
/// time, so that what Redis expires by its own clock lives through every sequence.
const EPOCH: u64 = 2_000_000_000_000;

/// The key the Redis scripts read the test clock from.
const CLOCK_KEY: &str = "twins:clock";

/// One Redis for the whole test, a store on it, a side connection for the clock, and the
/// runtime they live on.
struct Twins {
    runtime: tokio::runtime::Runtime,
    redis: RedisStore,
    side: MultiplexedConnection,
    _server: RedisServer,
}

fn twins() -> &'static Mutex<Twins> {
    static TWINS: OnceLock<Mutex<Twins>> = OnceLock::new();
    TWINS.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        let server = RedisServer::start();
        let (redis, side) = runtime.block_on(async {
            let store = RedisStore::connect_on_test_clock(
                RedisStoreOptions {
                    topology: RedisTopology::Standalone { url: server.url() },
                    key_prefix: "twins".to_owned(),
                    timeout: Duration::from_secs(10),
                    connections: 1,
                    walk_turn: Duration::ZERO,
                },
                CLOCK_KEY,
            )
            .await
            .expect("a store on the test Redis");
            let side = redis::Client::open(server.url())
                .expect("a valid URL")
                .get_multiplexed_async_connection()
                .await
                .expect("a side connection");
            (store, side)
        });
        Mutex::new(Twins {
            runtime,
            redis,
            side,
            _server: server,
        })
    })
}

/// One side of the comparison: a store and the leases it handed out so far, in order,
/// each with its pool.
struct Side<'a> {
    store: &'a dyn Store,
    leases: Vec<(LeaseId, usize)>,
}

impl Side<'_> {
    /// `answer` with its lease ids masked as `L<n>`, n the order each was first seen in
    /// (a lease seen first is `pool`'s); times as milliseconds after [`EPOCH`]; members by
    /// their host.
    fn masked(&mut self, answer: &str, pool: Option<usize>) -> String {
        static LEASE: OnceLock<regex::Regex> = OnceLock::new();
        static TIME: OnceLock<regex::Regex> = OnceLock::new();
        static MEMBER: OnceLock<regex::Regex> = OnceLock::new();
        let lease = LEASE.get_or_init(|| regex::Regex::new("[0-9a-f]{32}").expect("a regex"));
        let time = TIME.get_or_init(|| regex::Regex::new(r"Timestamp\((\d+)\)").expect("a regex"));
        let member = MEMBER.get_or_init(|| {
            regex::Regex::new(r#"MemberId\("http://([0-9.]+):8000"\)"#).expect("a regex")
        });
        let answer = lease.replace_all(answer, |found: &regex::Captures<'_>| {
            let id = LeaseId::parse(&found[0]).expect("a lease id");
            let n = match self.leases.iter().position(|(known, _)| *known == id) {
                Some(n) => n,
                None => {
                    self.leases.push((id, pool.unwrap_or(0)));
                    self.leases.len() - 1
                }
            };
            format!("L{n}")
        });
        let answer = time.replace_all(&answer, |found: &regex::Captures<'_>| {
            let ms: u64 = found[1].parse().expect("a number");
            format!("t+{}", ms.wrapping_sub(EPOCH))
        });
        member.replace_all(&answer, "$1").into_owned()
    }

    /// Both pools as this store shows them: each pool's configuration and numbers, every
    /// member as listed, and for each target the members' bans.
    async fn dump(&mut self) -> String {
        let mut dump = Vec::new();
        for pool in 0..POOLS.len() {
            let id = ops::pool_id(pool);
            dump.push(ops::text(self.store.pool(&id).await));
            let none = LabelFilter::default();
            let listing = self
                .store
                .members(&id, StateFilter::All, &none, None, 100, Cursor::default())
                .await;
            let Ok(page) = listing else {
                continue;
            };
            dump.extend(page.members.iter().map(|view| format!("{view:?}")));
            for target in 0..TARGETS.len() {
                let target = ops::target_of(target);
                let page = self
                    .store
                    .members(
                        &id,
                        StateFilter::All,
                        &none,
                        Some(&target),
                        100,
                        Cursor::default(),
                    )
                    .await
                    .expect("the pool just listed");
                dump.push(format!(
                    "{target:?}: {:?}",
                    page.members
                        .iter()
                        .map(|view| (&view.member, view.banned_until))
                        .collect::<Vec<_>>()
                ));
            }
        }
        dump.push(ops::text(self.store.pool_count().await));
        self.masked(&dump.join("\n"), None)
    }
}

/// Runs `sequence` on a fresh embedded store and a flushed Redis, both at [`EPOCH`], and
/// fails at the first step whose answers or dumps differ.
fn agree(sequence: &[Op]) -> Result<(), TestCaseError> {
    let mut twins = twins().lock().unwrap_or_else(PoisonError::into_inner);
    let Twins {
        runtime,
        redis,
        side,
        ..
    } = &mut *twins;
    runtime.block_on(async {
        let clock = Arc::new(AtomicU64::new(EPOCH));
        let () = redis::cmd("FLUSHALL")
            .query_async(side)
            .await
            .expect("FLUSHALL");
        let () = redis::cmd("SET")
            .arg(CLOCK_KEY)
            .arg(EPOCH)
            .query_async(side)
            .await
            .expect("the clock set");
        redis
            .hold_off_safety_net()
            .await
            .expect("the safety net held off");
        let embedded = EmbeddedStore::on_test_clock(Arc::clone(&clock));
        let mut sides = [
            Side {
                store: &embedded,
                leases: Vec::new(),
            },
            Side {
                store: &*redis,
                leases: Vec::new(),
            },
        ];
        for (step, op) in sequence.iter().enumerate() {
            if let Op::Advance(ms) = op {
                let now = clock.fetch_add(*ms, Ordering::SeqCst) + ms;
                let () = redis::cmd("SET")
                    .arg(CLOCK_KEY)
                    .arg(now)
                    .query_async(side)
                    .await
                    .expect("the clock set");
                continue;
            }
            let mut answers = Vec::new();
            for side in &mut sides {
                let answer = ops::apply(side.store, op, &side.leases).await;
                answers.push(side.masked(&answer, op.pool()));
            }
            if std::env::var_os("TWINS_TRACE").is_some() {
                eprintln!("{step} {op:?}\n   => {}", answers[0]);
            }
            prop_assert_eq!(
                &answers[0],
                &answers[1],
                "step {}, {:?}: embedded (left) and Redis (right) answer differently",
                step,
                op
            );
            let mut dumps = Vec::new();
            for side in &mut sides {
                dumps.push(side.dump().await);
            }
            prop_assert_eq!(
                &dumps[0],
                &dumps[1],
                "after step {}, {:?}: the pools differ between embedded (left) and Redis (right)",
                step,
                op
            );
        }
        Ok(())
    })
}

proptest! {
    // A fixed seed: every run tries the same sequences, so a failure here fails again
    // there. Nothing is written to disk; the shortest failing sequence is in the message.
    #![proptest_config(ProptestConfig {
        cases: std::env::var("TWINS_CASES").ok().and_then(|n| n.parse().ok()).unwrap_or(600),
        rng_seed: proptest::test_runner::RngSeed::Fixed(0x7477_696e),
        failure_persistence: None,
        max_shrink_iters: 4_096,
        ..ProptestConfig::default()
    })]

    #[test]
    fn both_stores_answer_every_sequence_of_operations_alike(
        sequence in ops::sequence(60)
    ) {
        agree(&sequence.0)?;
    }
}
