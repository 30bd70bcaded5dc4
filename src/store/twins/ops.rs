//! The operations the store twins test sends to both stores, how proptest draws them, and
//! how each is run on one store (its answer as text).
//!
//! Everything an operation names is a small index: a pool of [`POOLS`], a member of
//! [`MEMBERS`], a lease by the order it was handed out in. So a sequence shrunk by dropping
//! operations still means something, and the shrunk case reads in a few lines.

use std::collections::HashMap;

use proptest::prelude::*;
use proptest::sample::select;
use serde_json::json;

use crate::domain::{
    AssignCount, Exclude, LabelFilter, Labels, LeaseId, LeaseTtl, MemberId, OutcomeResult,
    PoolConfig, PoolId, RestorePolicy, SessionId, SessionTtl, Target,
};
use crate::store::{
    AssignRequest, Cursor, Done, DoneReport, Report, ReportSource, Seed, SeedOrigin,
    SessionRequest, StateFilter, Store,
};

/// The pools a sequence uses.
pub(super) const POOLS: [&str; 2] = ["twin-a", "twin-b"];

/// The members a sequence uses, in byte order.
/// Few enough that reports, bans and assigns meet the same member often.
pub(super) const MEMBERS: [&str; 4] = [
    "http://10.0.0.1:8000",
    "http://10.0.0.2:8000",
    "http://10.0.0.3:8000",
    "http://10.0.0.4:8000",
];

/// The targets of bans and per-target pacing.
pub(super) const TARGETS: [&str; 2] = ["a.example", "b.example"];

const SESSIONS: [&str; 3] = ["s1", "s2", "s3"];

/// Labels a seeding may give a member (the first takes its labels away).
const LABELS: [&[&str]; 5] = [
    &[],
    &["country=de"],
    &["country=us"],
    &["country=de", "tier=1"],
    &["country=us", "tier=2"],
];

/// Label filters of assigns and listings: one key, one key with two values, two keys.
const FILTERS: [&[&str]; 4] = [
    &["country=de"],
    &["country=de", "country=us"],
    &["country=us", "tier=2"],
    &["tier=1"],
];

/// A pool's configuration, in the few fields the rules read (jitter is always 0, so that
/// both stores draw the same cooldown).
#[derive(Debug, Clone)]
pub(super) struct Config {
    least_in_flight: bool,
    restore: RestorePolicy,
    start: Option<u64>,
    lease_ttl_ms: u64,
    max_in_flight: Option<u64>,
    max_members: Option<u64>,
    failures: u32,
    cooldown_ms: u64,
    max_cooldown_ms: u64,
    backoff: u32,
    target_ban_ms: u64,
    /// `min_interval_ms` and `per_target`.
    pacing: Option<(u64, bool)>,
    session_ttl_ms: u64,
}

impl Config {
    fn pool_config(&self) -> PoolConfig {
        let policy = if self.least_in_flight {
            "least-in-flight"
        } else {
            "least-used"
        };
        let value = json!({
            "policy": policy,
            "restore": self.restore.as_str(),
            "start_assignments": self.start,
            "lease_ttl_ms": self.lease_ttl_ms,
            "max_in_flight": self.max_in_flight,
            "rules": {"max_members": self.max_members},
            "health": {
                "max_consecutive_failures": self.failures,
                "cooldown_ms": self.cooldown_ms,
                "max_cooldown_ms": self.max_cooldown_ms,
                "backoff": self.backoff,
                "jitter_percent": 0,
                "target_ban_ms": self.target_ban_ms,
            },
            "pacing": self.pacing.map(|(ms, per_target)| json!({
                "min_interval_ms": ms,
                "per_target": per_target,
            })),
            "session_ttl_ms": self.session_ttl_ms,
        });
        serde_json::from_value(value).expect("a valid pool configuration")
    }
}

/// What an assign asks for beyond its pool's rule.
#[derive(Debug, Clone)]
pub(super) struct Ask {
    ttl_ms: Option<u64>,
    filter: Option<usize>,
    target: Option<usize>,
    exclude: Vec<usize>,
    /// A client's rate limit (of [`RATES`]), as a client token carries it.
    rate: Option<usize>,
}

/// Clients with rate limits, `(id, rate_per_second, burst)`. Slow on purpose: Redis also
/// expires a bucket once it would be full again on its own clock (a memory bound, not the
/// rule), which the test clock does not hold back, so a bucket must outlive a sequence's
/// real run (seconds here, far longer than a sequence takes).
const RATES: [(&str, u64, u64); 2] = [("wide", 1, 3), ("narrow", 1, 1)];

/// How many members an assign wants, or the session it names (with its ttl).
#[derive(Debug, Clone)]
pub(super) enum Wanted {
    One,
    Several(u8),
    Session(usize, Option<u64>),
}

/// The outcome an assign carries in `done`: a lease to release (by the order it was
/// handed out in), a report (about a member, or with none about the lease's), or both.
#[derive(Debug, Clone)]
pub(super) struct DoneOp {
    lease: Option<usize>,
    report: Option<(Option<usize>, OutcomeResult, Option<usize>)>,
}

/// One operation of the `Store` trait (or one step of the shared clock).
#[derive(Debug, Clone)]
pub(super) enum Op {
    /// Creates the pool or replaces its configuration.
    Put(usize, Config),
    Delete(usize),
    /// Seeds (or, `import`, imports) members, each with the labels it is given.
    Seed {
        pool: usize,
        members: Vec<(usize, Option<usize>)>,
        assignments: Option<u64>,
        reset: bool,
        dry_run: bool,
        import: bool,
    },
    Assign {
        pool: usize,
        ask: Ask,
        wanted: Wanted,
        done: Option<DoneOp>,
    },
    /// Outcome reports, from a worker or (`check`) from active checks: member, result,
    /// target.
    Report {
        pool: usize,
        check: bool,
        reports: Vec<(usize, OutcomeResult, Option<usize>)>,
    },
    /// Releases a lease: by the order it was handed out in, newest first, in its own pool
    /// (or, `elsewhere`, in the other).
    Release {
        lease: usize,
        elsewhere: bool,
    },
    /// Renews a lease (named as by `Release`), with a ttl or the pool's.
    Renew {
        lease: usize,
        elsewhere: bool,
        ttl: Option<u64>,
    },
    EndSession(usize, usize),
    Disable(usize, Vec<usize>),
    Enable(usize, Vec<usize>, Option<RestorePolicy>),
    Remove(usize, Vec<usize>),
    /// A page of the member listing.
    List {
        pool: usize,
        state: u8,
        filter: Option<usize>,
        target: Option<usize>,
        limit: usize,
        cursor: (u64, u64),
    },
    Sweep,
    /// Moves the shared clock on by this many milliseconds.
    Advance(u64),
}

fn restore() -> impl Strategy<Value = RestorePolicy> {
    select(vec![
        RestorePolicy::Minimum,
        RestorePolicy::History,
        RestorePolicy::Zero,
    ])
}

/// Durations the stores compare to the clock. Sessions last at least 30 s: Redis also
/// expires a session's key after its ttl on its own clock (a memory bound, not the rule),
/// which the test clock does not hold back, and a sequence runs for far less.
fn config() -> impl Strategy<Value = Config> {
    (
        (
            any::<bool>(),
            restore(),
            prop::option::of(0..4u64),
            select(vec![500u64, 5_000, 60_000]),
            prop::option::of(1..3u64),
            prop::option::weighted(0.2, 2..5u64),
        ),
        (
            1..4u32,
            select(vec![1_000u64, 10_000]),
            select(vec![10_000u64, 60_000]),
            1..4u32,
            select(vec![500u64, 5_000]),
            prop::option::weighted(0.3, (select(vec![500u64, 5_000]), any::<bool>())),
            select(vec![30_000u64, 120_000]),
        ),
    )
        .prop_map(
            |(
                (least_in_flight, restore, start, lease_ttl_ms, max_in_flight, max_members),
                (failures, cooldown_ms, max_cooldown_ms, backoff, target_ban_ms, pacing, session),
            )| Config {
                least_in_flight,
                restore,
                start,
                lease_ttl_ms,
                max_in_flight,
                max_members,
                failures,
                cooldown_ms,
                max_cooldown_ms,
                backoff,
                target_ban_ms,
                pacing,
                session_ttl_ms: session,
            },
        )
}

fn members() -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(0..MEMBERS.len(), 1..4)
}

fn result() -> impl Strategy<Value = OutcomeResult> {
    prop_oneof![
        2 => Just(OutcomeResult::Ok),
        3 => Just(OutcomeResult::Failed),
        3 => Just(OutcomeResult::Blocked),
    ]
}

/// The member a report is about: the first most often, so that one member meets the
/// rules that need several reports in a row (trips, repeated bans).
fn reported() -> impl Strategy<Value = usize> {
    prop_oneof![2 => Just(0), 1 => 0..MEMBERS.len()]
}

/// A report's target: the first most often, for the same reason.
fn reported_target() -> impl Strategy<Value = Option<usize>> {
    prop_oneof![3 => Just(Some(0)), 1 => Just(None), 1 => Just(Some(1))]
}

fn target() -> impl Strategy<Value = Option<usize>> {
    prop::option::of(0..TARGETS.len())
}

fn ask() -> impl Strategy<Value = Ask> {
    (
        prop::option::weighted(0.2, select(vec![100u64, 1_000, 60_000])),
        prop::option::weighted(0.25, 0..FILTERS.len()),
        prop::option::weighted(0.4, 0..TARGETS.len()),
        prop::collection::vec(0..MEMBERS.len(), 0..3),
        prop::option::weighted(0.3, 0..RATES.len()),
    )
        .prop_map(|(ttl_ms, filter, target, exclude, rate)| Ask {
            ttl_ms,
            filter,
            target,
            exclude,
            rate,
        })
}

fn wanted() -> impl Strategy<Value = Wanted> {
    prop_oneof![
        6 => Just(Wanted::One),
        1 => (2..4u8).prop_map(Wanted::Several),
        3 => (
            0..SESSIONS.len(),
            prop::option::weighted(0.2, select(vec![30_000u64, 60_000]))
        )
            .prop_map(|(id, ttl)| Wanted::Session(id, ttl)),
    ]
}

fn done() -> impl Strategy<Value = DoneOp> {
    prop_oneof![
        (0..8usize).prop_map(|lease| DoneOp {
            lease: Some(lease),
            report: None,
        }),
        (0..8usize, result(), target()).prop_map(|(lease, result, target)| DoneOp {
            lease: Some(lease),
            report: Some((None, result, target)),
        }),
        (0..MEMBERS.len(), result(), target()).prop_map(|(member, result, target)| DoneOp {
            lease: None,
            report: Some((Some(member), result, target)),
        }),
    ]
}

/// One operation, assigns, reports and the clock most often.
pub(super) fn op() -> impl Strategy<Value = Op> {
    let pool = || 0..POOLS.len();
    prop_oneof![
        3 => (pool(), config()).prop_map(|(pool, config)| Op::Put(pool, config)),
        1 => pool().prop_map(Op::Delete),
        4 => (
            pool(),
            prop::collection::vec(
                (0..MEMBERS.len(), prop::option::weighted(0.3, 0..LABELS.len())),
                1..5
            ),
            prop::option::weighted(0.2, 0..6u64),
            prop::bool::weighted(0.1),
            prop::bool::weighted(0.1),
            any::<bool>(),
        )
            .prop_map(|(pool, members, assignments, reset, dry_run, import)| Op::Seed {
                pool,
                members,
                assignments,
                reset,
                dry_run,
                import,
            }),
        12 => (pool(), ask(), wanted(), prop::option::weighted(0.25, done())).prop_map(
            |(pool, ask, wanted, done)| Op::Assign {
                pool,
                ask,
                wanted,
                done,
            }
        ),
        8 => (
            pool(),
            prop::bool::weighted(0.2),
            prop::collection::vec((reported(), result(), reported_target()), 1..4)
        )
            .prop_map(|(pool, check, reports)| Op::Report {
                pool,
                check,
                reports,
            }),
        2 => (0..6usize, prop::bool::weighted(0.1))
            .prop_map(|(lease, elsewhere)| Op::Release { lease, elsewhere }),
        2 => (
            0..6usize,
            prop::bool::weighted(0.1),
            prop::option::of(select(vec![100u64, 5_000, 120_000]))
        )
            .prop_map(|(lease, elsewhere, ttl)| Op::Renew {
                lease,
                elsewhere,
                ttl
            }),
        1 => (pool(), 0..SESSIONS.len()).prop_map(|(pool, id)| Op::EndSession(pool, id)),
        2 => (pool(), members()).prop_map(|(pool, members)| Op::Disable(pool, members)),
        2 => (pool(), members(), prop::option::of(restore()))
            .prop_map(|(pool, members, restore)| Op::Enable(pool, members, restore)),
        1 => (pool(), members()).prop_map(|(pool, members)| Op::Remove(pool, members)),
        1 => (
            pool(),
            0..3u8,
            prop::option::weighted(0.4, 0..FILTERS.len()),
            target(),
            1..4usize,
            (0..3u64, 0..3u64),
        )
            .prop_map(|(pool, state, filter, target, limit, cursor)| Op::List {
                pool,
                state,
                filter,
                target,
                limit,
                cursor,
            }),
        2 => Just(Op::Sweep),
        6 => prop_oneof![
            4 => select(vec![1u64, 100, 499, 500, 501, 999, 1_000, 5_000, 10_000, 30_000]),
            1 => 1..700_000u64,
        ]
        .prop_map(Op::Advance),
    ]
}

/// A sequence of operations, shown one a line (a shrunk failing case is read by people).
#[derive(Clone)]
pub(super) struct Sequence(pub(super) Vec<Op>);

impl std::fmt::Debug for Sequence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (step, op) in self.0.iter().enumerate() {
            write!(f, "\n{step:>4} {op:?}")?;
        }
        Ok(())
    }
}

/// A sequence: both pools created and seeded with every member, then `1..len` operations.
pub(super) fn sequence(len: usize) -> impl Strategy<Value = Sequence> {
    let seed = |pool| {
        prop::collection::vec(prop::option::weighted(0.5, 0..LABELS.len()), MEMBERS.len()).prop_map(
            move |labels| Op::Seed {
                pool,
                members: labels.into_iter().enumerate().collect(),
                assignments: None,
                reset: false,
                dry_run: false,
                import: false,
            },
        )
    };
    (
        (config(), seed(0), config(), seed(1)),
        prop::collection::vec(op(), 1..len),
    )
        .prop_map(|((first, seed_first, second, seed_second), ops)| {
            let mut sequence = vec![
                Op::Put(0, first),
                seed_first,
                Op::Put(1, second),
                seed_second,
            ];
            sequence.extend(ops);
            Sequence(sequence)
        })
}

pub(super) fn pool_id(pool: usize) -> PoolId {
    PoolId::parse(POOLS[pool]).expect("a valid pool id")
}

pub(super) fn member(index: usize) -> MemberId {
    MemberId::parse(MEMBERS[index]).expect("a valid member id")
}

fn member_list(indexes: &[usize]) -> Vec<MemberId> {
    let mut list: Vec<MemberId> = Vec::new();
    for &index in indexes {
        let member = member(index);
        if !list.contains(&member) {
            list.push(member);
        }
    }
    list
}

pub(super) fn target_of(index: usize) -> Target {
    Target::parse("target", TARGETS[index]).expect("a valid target")
}

pub(super) fn filter(index: Option<usize>) -> LabelFilter {
    index.map_or_else(LabelFilter::default, |index| {
        LabelFilter::from_pairs("labels", FILTERS[index].iter().copied()).expect("a valid filter")
    })
}

/// The lease handed out `index`-th from the newest (counting round the leases so far and
/// one more, which names a lease never issued) and its pool.
fn lease(leases: &[(LeaseId, usize)], index: usize) -> (LeaseId, usize) {
    let from_newest = index % (leases.len() + 1);
    leases
        .len()
        .checked_sub(from_newest + 1)
        .and_then(|at| leases.get(at))
        .cloned()
        .unwrap_or_else(|| {
            let never = LeaseId::parse("0123456789abcdef0123456789abcdef");
            (never.expect("a valid lease id"), 0)
        })
}

impl Op {
    /// The pool the operation is about, if one.
    pub(super) fn pool(&self) -> Option<usize> {
        match self {
            Self::Put(pool, _)
            | Self::Delete(pool)
            | Self::Seed { pool, .. }
            | Self::Assign { pool, .. }
            | Self::Report { pool, .. }
            | Self::EndSession(pool, _)
            | Self::Disable(pool, _)
            | Self::Enable(pool, _, _)
            | Self::Remove(pool, _)
            | Self::List { pool, .. } => Some(*pool),
            Self::Release { .. } | Self::Renew { .. } | Self::Sweep | Self::Advance(_) => None,
        }
    }
}

/// The pool of a lease named by `Release` or `Renew`.
fn lease_pool(pool: usize, elsewhere: bool) -> PoolId {
    pool_id(if elsewhere { 1 - pool } else { pool })
}

/// Runs `op` on `store` and answers what it answered, as text (`Op::Advance` is the
/// caller's). `leases` are the leases this store handed out so far, in order.
pub(super) async fn apply(store: &dyn Store, op: &Op, leases: &[(LeaseId, usize)]) -> String {
    match op {
        Op::Put(pool, config) => text(store.put_pool(&pool_id(*pool), &config.pool_config()).await),
        Op::Delete(pool) => text(store.delete_pool(&pool_id(*pool)).await),
        Op::Seed {
            pool,
            members,
            assignments,
            reset,
            dry_run,
            import,
        } => {
            let indexes: Vec<usize> = members.iter().map(|(m, _)| *m).collect();
            let mut seed = Seed::new(member_list(&indexes));
            seed.assignments = *assignments;
            seed.reset = *reset;
            seed.dry_run = *dry_run;
            seed.labels = members
                .iter()
                .filter_map(|(m, labels)| Some((member(*m), (*labels)?)))
                .map(|(m, labels)| {
                    let labels = Labels::from_pairs("labels", LABELS[labels].iter().copied())
                        .expect("valid labels");
                    (m, labels)
                })
                .collect::<HashMap<_, _>>();
            if *import {
                seed.origin = SeedOrigin::Import;
            }
            text(store.add_members(&pool_id(*pool), &seed).await)
        }
        Op::Assign {
            pool,
            ask,
            wanted,
            done,
        } => assign(store, &pool_id(*pool), ask, wanted, done.as_ref(), leases).await,
        Op::Report {
            pool,
            check,
            reports,
        } => {
            let reports: Vec<Report> = reports
                .iter()
                .map(|(m, result, target)| Report {
                    member: member(*m),
                    result: *result,
                    detail: if *check {
                        result.as_str().to_owned()
                    } else {
                        String::new()
                    },
                    // A worker's latency counts in the member's quality: one per member, so
                    // that the averages move.
                    latency_ms: Some(if *check { 12 } else { 40 + 13 * *m as u64 }),
                    target: target.map(target_of),
                })
                .collect();
            let source = if *check {
                ReportSource::Check
            } else {
                ReportSource::Worker
            };
            text(store.report(&pool_id(*pool), source, &reports).await)
        }
        Op::Release {
            lease: index,
            elsewhere,
        } => {
            let (lease, pool) = lease(leases, *index);
            text(store.release(&lease_pool(pool, *elsewhere), &lease).await)
        }
        Op::Renew {
            lease: index,
            elsewhere,
            ttl,
        } => {
            let (lease, pool) = lease(leases, *index);
            let ttl = ttl.map(|ms| LeaseTtl::from_millis(ms).expect("a valid ttl"));
            text(
                store
                    .renew(&lease_pool(pool, *elsewhere), &lease, ttl)
                    .await,
            )
        }
        Op::EndSession(pool, id) => {
            let id = SessionId::parse("session", SESSIONS[*id]).expect("a valid session id");
            text(store.end_session(&pool_id(*pool), &id).await)
        }
        Op::Disable(pool, members) => text(
            store
                .disable_members(&pool_id(*pool), &member_list(members), "maintenance")
                .await,
        ),
        Op::Enable(pool, members, restore) => text(
            store
                .enable_members(&pool_id(*pool), &member_list(members), *restore)
                .await,
        ),
        Op::Remove(pool, members) => text(
            store
                .remove_members(&pool_id(*pool), &member_list(members))
                .await,
        ),
        Op::List {
            pool,
            state,
            filter: labels,
            target,
            limit,
            cursor,
        } => {
            let state = [
                StateFilter::All,
                StateFilter::Eligible,
                StateFilter::Ineligible,
            ][usize::from(*state)];
            let cursor = Cursor {
                eligible: cursor.0,
                ineligible: cursor.1,
            };
            let target = target.map(target_of);
            text(
                store
                    .members(
                        &pool_id(*pool),
                        state,
                        &filter(*labels),
                        target.as_ref(),
                        *limit,
                        cursor,
                    )
                    .await,
            )
        }
        Op::Sweep => text(store.sweep().await),
        Op::Advance(_) => String::new(),
    }
}

async fn assign(
    store: &dyn Store,
    pool: &PoolId,
    ask: &Ask,
    wanted: &Wanted,
    done: Option<&DoneOp>,
    leases: &[(LeaseId, usize)],
) -> String {
    let request = AssignRequest {
        ttl: ask
            .ttl_ms
            .map(|ms| LeaseTtl::from_millis(ms).expect("a valid ttl")),
        labels: filter(ask.filter),
        target: ask.target.map(target_of),
        exclude: Exclude::of(member_list(&ask.exclude)),
        rate: ask.rate.map(|index| {
            let (client, rate_per_second, burst) = RATES[index];
            crate::store::ClientLimit {
                client: crate::domain::ClientId::parse(client).expect("a valid client id"),
                rate: crate::domain::ClientRate {
                    rate_per_second,
                    burst,
                },
            }
        }),
    };
    let session = |id: usize, ttl: Option<u64>| SessionRequest {
        id: SessionId::parse("session", SESSIONS[id]).expect("a valid session id"),
        ttl: ttl.map(|ms| SessionTtl::from_millis(ms).expect("a valid ttl")),
    };
    let count = |wanted: &Wanted| match wanted {
        Wanted::Several(n) => AssignCount::try_from(u64::from(*n)).expect("a valid count"),
        _ => AssignCount::ONE,
    };
    let Some(done) = done else {
        return match wanted {
            Wanted::One => text(store.assign(pool, &request).await),
            Wanted::Several(_) => text(store.assign_several(pool, &request, count(wanted)).await),
            Wanted::Session(id, ttl) => text(
                store
                    .assign_in_session(pool, &request, &session(*id, *ttl))
                    .await,
            ),
        };
    };
    let done = Done {
        lease: done.lease.map(|index| lease(leases, index).0),
        report: done.report.map(|(member, result, target)| DoneReport {
            // Whether there is a latency follows the result, so both stores count the same.
            latency_ms: (result != OutcomeResult::Failed).then_some(250),
            member: member.map(self::member),
            result,
            target: target.map(target_of),
        }),
    };
    match wanted {
        Wanted::Session(id, ttl) => text(
            store
                .assign_in_session_after_done(pool, &done, &request, &session(*id, *ttl))
                .await,
        ),
        _ => text(
            store
                .assign_after_done(pool, &done, &request, count(wanted))
                .await,
        ),
    }
}

/// An answer as text. A store that could not answer is not a difference between the
/// rules: the test stops there.
pub(super) fn text<T: std::fmt::Debug>(answer: Result<T, crate::store::StoreError>) -> String {
    use crate::store::StoreError;
    match answer {
        Ok(answer) => format!("{answer:?}"),
        Err(error @ (StoreError::Timeout(_) | StoreError::Unavailable(_))) => {
            panic!("a store failed to answer: {error}")
        }
        Err(error) => format!("Err({error:?})"),
    }
}
