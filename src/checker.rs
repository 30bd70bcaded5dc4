//! Active checks: a background task that probes the members of pools with a `check` and
//! feeds the results into the same health rules as worker reports.
//!
//! Every replica runs one. Each tick it takes the pools whose round is due from the store's
//! index ([`Store::due_check_pools`]: only those, never every pool) and asks the store to
//! claim each one's round ([`Store::claim_check_round`]), which schedules the next; the
//! claim lasts the pool's `interval_ms`, so across replicas a pool's round runs at most once
//! per interval, on one replica. A round is bounded three ways: at most `concurrency` probes at once, each at
//! most `timeout_ms`, and the whole round at most `interval_ms` (probes not started by
//! then wait for the next round). Results are reported one by one as they come in, so a
//! failing member trips without waiting for the rest of the round.

mod fetch;
mod probe;

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use tokio::task::JoinHandle;
use tokio::time::{Instant, MissedTickBehavior};

pub use self::fetch::{FetchError, Fetcher, MAX_REDIRECTS, masked_url};
pub(crate) use self::probe::percent_decode;
pub use self::probe::{ExitIp, Probed, Prober, ProxyAddr, guarded_addresses, parse_exit_ip};
use crate::domain::{MemberId, PoolId};
use crate::geoip::GeoIp;
use crate::store::{Effect, ExitSeen, Report, ReportSource, Store};

/// Looks for due check rounds every `tick` until `stop` completes; rounds still running
/// then are cancelled (they hold nothing a cancelled probe would leak). The exit addresses
/// `exit_ip` checks see get their labels from `geoip`.
pub async fn run(
    store: Arc<dyn Store>,
    geoip: GeoIp,
    tick: Duration,
    stop: impl Future<Output = ()>,
) {
    let mut ticks = tokio::time::interval(tick);
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    tokio::pin!(stop);
    let mut rounds: HashMap<PoolId, JoinHandle<()>> = HashMap::new();
    let mut failing = false;
    loop {
        tokio::select! {
            () = &mut stop => break,
            _ = ticks.tick() => {}
        }
        rounds.retain(|_, round| !round.is_finished());
        match start_due_rounds(&store, &geoip, &mut rounds).await {
            Ok(()) if failing => {
                tracing::info!("active checks reach the store again");
                failing = false;
            }
            Ok(()) => {}
            Err(error) => {
                if !failing {
                    tracing::warn!(%error, "active checks cannot reach the store; retrying every tick");
                    failing = true;
                }
            }
        }
    }
    for round in rounds.into_values() {
        round.abort();
    }
}

/// Most pools whose round is due that one tick takes; the rest wait for the next tick.
const DUE_ROUNDS_PER_TICK: usize = 256;

async fn start_due_rounds(
    store: &Arc<dyn Store>,
    geoip: &GeoIp,
    rounds: &mut HashMap<PoolId, JoinHandle<()>>,
) -> Result<(), crate::store::StoreError> {
    for pool in store.due_check_pools(DUE_ROUNDS_PER_TICK).await? {
        // Due again means a whole interval has passed: the round before has run out of its
        // time (it stops at its deadline) and gives way to the next.
        if let Some(round) = rounds.remove(&pool) {
            round.abort();
        }
        let info = match store.pool(&pool).await {
            Ok(info) => info,
            Err(crate::store::StoreError::PoolNotFound) => continue,
            Err(error) => return Err(error),
        };
        let Some(check) = info.config.health.check else {
            continue;
        };
        let interval = Duration::from_millis(check.interval_ms);
        let claimed = match store.claim_check_round(&pool, interval).await {
            Ok(claimed) => claimed,
            Err(crate::store::StoreError::PoolNotFound) => continue,
            Err(error) => return Err(error),
        };
        if let Some(members) = claimed {
            let targets = members
                .eligible
                .into_iter()
                .chain(members.cooling)
                .collect();
            let prober = match Prober::new(check, info.config.rules.allow_private) {
                Ok(prober) => prober,
                Err(error) => {
                    tracing::warn!(pool = pool.as_str(), %error,
                        "check round skipped: its TLS settings could not be built");
                    continue;
                }
            };
            let prune = info
                .config
                .prune
                .is_some_and(|prune| prune.after_failed_checks.is_some());
            let task = tokio::spawn(run_round(
                Arc::clone(store),
                geoip.clone(),
                pool.clone(),
                prober,
                targets,
                prune,
            ));
            rounds.insert(pool, task);
        }
    }
    Ok(())
}

/// Probes `members` of `pool` and reports each result as it comes in, with the exit
/// address an `exit_ip` check read (and its labels from `geoip`); with `prune`, then
/// removes the members whose checks failed `prune.after_failed_checks` times in a row
/// (and those left from earlier rounds that had live leases then).
async fn run_round(
    store: Arc<dyn Store>,
    geoip: GeoIp,
    pool: PoolId,
    prober: Prober,
    members: Vec<MemberId>,
    prune: bool,
) {
    let check = prober.check();
    let deadline = Instant::now() + Duration::from_millis(check.interval_ms);
    let (probeable, unprobeable): (Vec<_>, Vec<_>) = members
        .into_iter()
        .map(|member| (ProxyAddr::parse(&member), member))
        .partition(|(addr, _)| addr.is_some());
    if let Some((_, example)) = unprobeable.first() {
        tracing::warn!(
            pool = pool.as_str(),
            unprobeable = unprobeable.len(),
            example = %example.masked(),
            "members without host:port cannot be probed; they are skipped"
        );
    }
    let prober = &prober;
    let probes = futures_util::stream::iter(probeable.into_iter().filter_map(|(addr, member)| {
        addr.map(|addr| async move {
            let probed = prober.probe(&addr).await;
            let report = Report {
                member,
                result: probed.result,
                detail: probed.detail,
                latency_ms: probed.latency_ms,
                target: None,
            };
            (report, probed.exit_ip)
        })
    }))
    .buffer_unordered(usize::try_from(check.concurrency).unwrap_or(1));
    let unreadable = std::sync::atomic::AtomicU64::new(0);
    let reporting = probes.for_each(|(report, exit_ip)| {
        let store = &store;
        let pool = &pool;
        let geoip = &geoip;
        let unreadable = &unreadable;
        async move {
            match exit_ip {
                ExitIp::Seen(ip) => {
                    let exit = ExitSeen {
                        member: report.member.clone(),
                        ip,
                        geo: geoip.lookup(ip),
                    };
                    if let Err(error) = store.record_exits(pool, std::slice::from_ref(&exit)).await {
                        tracing::warn!(pool = pool.as_str(), proxy = %report.member.masked(), %error,
                            "could not record an exit address");
                    }
                }
                ExitIp::Unreadable => {
                    metrics::counter!("pa_exit_ip_unreadable_total").increment(1);
                    unreadable.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                ExitIp::NotRead => {}
            }
            let proxy = report.member.masked();
            match store
                .report(pool, ReportSource::Check, std::slice::from_ref(&report))
                .await
            {
                Ok(summary) => {
                    for applied in &summary.applied {
                        let result = applied.result;
                        match applied.effect {
                            Effect::Tripped => tracing::info!(pool = pool.as_str(), %proxy,
                                result = result.as_str(), detail = report.detail.as_str(),
                                "member cooling down after a failed check"),
                            Effect::Returned => tracing::info!(pool = pool.as_str(), %proxy,
                                "member back after a passing check"),
                            Effect::Counted | Effect::Ignored | Effect::Banned => {}
                        }
                    }
                }
                Err(error) => tracing::warn!(pool = pool.as_str(), %proxy, %error,
                    "could not record a check result"),
            }
        }
    });
    if tokio::time::timeout_at(deadline, reporting).await.is_err() {
        tracing::warn!(
            pool = pool.as_str(),
            interval_ms = check.interval_ms,
            "check round ran out of time; the remaining members wait for the next round"
        );
    }
    // Once per round, not per member: a target that answers garbage would otherwise log
    // a line for every member every round.
    let unreadable = unreadable.into_inner();
    if unreadable > 0 {
        tracing::warn!(
            pool = pool.as_str(),
            unreadable,
            url = check.url.as_deref().map(masked_url).unwrap_or_default(),
            "exit_ip check answers held no address; those members' exit addresses stay as they were"
        );
    }
    if prune {
        crate::sources::prune_members(&*store, &pool, None).await;
    }
}
