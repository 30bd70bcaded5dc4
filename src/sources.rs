//! Sources: a background task that fetches the lists pools name in `sources` on their
//! schedule and imports each through the pool's rules, by the same path as
//! `POST /pools/{pool}/import` ([`crate::http::import_list`]).
//!
//! Every replica runs one. Each tick it takes the pools whose next fetch may be due from
//! the store's index ([`Store::due_source_pools`]: only those, never every pool) and asks
//! the store to claim their due sources ([`Store::claim_sources`]); a claimed source is
//! held for the fetch's timeout plus [`SOURCE_CLAIM_HOLD`], so across replicas each fetch
//! happens once, on one replica. The end of a fetch ([`Store::record_source_fetch`])
//! schedules the next one: an interval later after a success, sooner after a failure
//! ([`retry_in`], doubling from [`SOURCE_RETRY_BASE`] up to the interval).
//!
//! Each failed fetch is logged once, here, with the source's URL masked ([`masked_url`]),
//! and every fetch is counted in `pa_source_fetches_total` by a fixed outcome code.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use tokio::task::JoinSet;
use tokio::time::MissedTickBehavior;

use crate::checker::{Fetcher, masked_url};
use crate::domain::{Labels, PoolId, PruneConfig, Source, SourceFormat};
use crate::geoip::GeoIp;
use crate::http::{ImportRequest, ListKind, WholeList, import_list};
use crate::store::{ClaimedSource, FetchOutcome, SOURCE_CLAIM_HOLD, SeedOrigin, Store, StoreError};

/// The first retry after a failed fetch comes this long after it; each further failure
/// doubles the wait, up to the source's interval.
pub const SOURCE_RETRY_BASE: Duration = Duration::from_secs(5);

/// Most pools one tick takes from the index; the rest wait for the next tick.
const DUE_POOLS_PER_TICK: usize = 256;

/// How the fetcher task fetches.
#[derive(Debug, Clone)]
pub struct SourceSettings {
    /// How often the index is looked at.
    pub tick: Duration,
    /// Longest one fetch may take, redirects and body included.
    pub timeout: Duration,
    /// Largest list, in bytes (the import's body limit).
    pub max_bytes: usize,
}

/// When the next fetch of a source comes after one that ended with `outcome`, when the
/// source had failed `failures` times in a row before it.
pub fn retry_in(outcome: &FetchOutcome, failures: u64, interval: Duration) -> Duration {
    match outcome {
        FetchOutcome::Ok { .. } => interval,
        FetchOutcome::Failed { .. } => {
            let doubling = 2_u32.saturating_pow(u32::try_from(failures).unwrap_or(u32::MAX));
            SOURCE_RETRY_BASE.saturating_mul(doubling).min(interval)
        }
    }
}

/// Looks for due sources every `settings.tick` until `stop` completes; fetches still
/// running then are cancelled (a cancelled import keeps the batches it wrote, as a failed
/// one does, and its claim runs out by itself).
/// The members a fetch adds get labels from `geoip` for their own addresses, as imported
/// ones do.
pub async fn run(
    store: Arc<dyn Store>,
    geoip: GeoIp,
    settings: SourceSettings,
    stop: impl Future<Output = ()>,
) {
    let fetching = Fetching {
        fetcher: Fetcher::new(settings.timeout, settings.max_bytes),
        geoip,
    };
    let hold = settings.timeout + SOURCE_CLAIM_HOLD;
    let mut ticks = tokio::time::interval(settings.tick);
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    tokio::pin!(stop);
    let mut fetches = JoinSet::new();
    let mut failing = false;
    loop {
        tokio::select! {
            () = &mut stop => break,
            _ = ticks.tick() => {}
        }
        while fetches.try_join_next().is_some() {}
        match start_due_fetches(&store, &fetching, hold, &mut fetches).await {
            Ok(()) if failing => {
                tracing::info!("source fetches reach the store again");
                failing = false;
            }
            Ok(()) => {}
            Err(error) => {
                if !failing {
                    tracing::warn!(%error, "source fetches cannot reach the store; retrying every tick");
                    failing = true;
                }
            }
        }
    }
    fetches.abort_all();
}

/// What every fetch uses: the fetcher, and the GeoIP file for the labels of the members
/// it adds.
#[derive(Clone)]
struct Fetching {
    fetcher: Fetcher,
    geoip: GeoIp,
}

async fn start_due_fetches(
    store: &Arc<dyn Store>,
    fetching: &Fetching,
    hold: Duration,
    fetches: &mut JoinSet<()>,
) -> Result<(), StoreError> {
    for pool in store.due_source_pools(DUE_POOLS_PER_TICK).await? {
        let info = match store.pool(&pool).await {
            Ok(info) => info,
            Err(StoreError::PoolNotFound) => continue,
            Err(error) => return Err(error),
        };
        let sources = info.config.sources;
        let urls: Vec<String> = sources.iter().map(|source| source.url.clone()).collect();
        let claimed = match store.claim_sources(&pool, &urls, hold).await {
            Ok(claimed) => claimed,
            Err(StoreError::PoolNotFound) => continue,
            Err(error) => return Err(error),
        };
        let allow_private = info.config.rules.allow_private_sources;
        let prune = info.config.prune;
        for claim in claimed {
            let Some(source) = sources.iter().find(|s| s.url == claim.url).cloned() else {
                continue;
            };
            fetches.spawn(fetch_one(
                Arc::clone(store),
                fetching.clone(),
                pool.clone(),
                source,
                claim,
                allow_private,
                prune,
            ));
        }
    }
    Ok(())
}

/// Fetches and imports one source, records how it went and schedules its next fetch.
async fn fetch_one(
    store: Arc<dyn Store>,
    Fetching { fetcher, geoip }: Fetching,
    pool: PoolId,
    source: Source,
    claim: ClaimedSource,
    allow_private: bool,
    prune: Option<PruneConfig>,
) {
    let url = masked_url(&source.url);
    // The number this fetch has when it succeeds: the members it lists are marked with it.
    let fetch = claim.successes + 1;
    let (outcome, code) = match fetcher.fetch(&source.url, allow_private).await {
        Ok(body) => {
            let request = ImportRequest {
                default_scheme: source.default_scheme,
                dry_run: false,
                labels: Labels::default(),
                geoip,
                origin: SeedOrigin::Source {
                    id: claim.id,
                    fetch,
                },
            };
            let kind = match source.format {
                SourceFormat::Lines => ListKind::Text,
                SourceFormat::Json => ListKind::Json,
            };
            let list = WholeList(Some(Bytes::from(body)));
            match import_list(&*store, &pool, request, kind, list).await {
                Ok(report) => (
                    FetchOutcome::Ok {
                        counts: report.counts(),
                    },
                    "ok",
                ),
                Err(error) => (
                    FetchOutcome::Failed {
                        error: format!("import failed: {error}"),
                    },
                    "import_failed",
                ),
            }
        }
        Err(error) => (
            FetchOutcome::Failed {
                error: error.to_string(),
            },
            error.code(),
        ),
    };
    metrics::counter!("pa_source_fetches_total", "outcome" => code).increment(1);
    let interval = Duration::from_millis(source.interval_ms);
    let next_in = retry_in(&outcome, claim.failures, interval);
    match &outcome {
        FetchOutcome::Ok { counts } => tracing::info!(
            pool = pool.as_str(),
            source = %url,
            added = counts.added,
            existing = counts.existing,
            rejected = counts.rejected,
            "source fetched"
        ),
        FetchOutcome::Failed { error } => tracing::warn!(
            pool = pool.as_str(),
            source = %url,
            %error,
            failures = claim.failures + 1,
            retry_in_ms = u64::try_from(next_in.as_millis()).unwrap_or(u64::MAX),
            "source fetch failed"
        ),
    }
    // After a successful fetch, the source's members listed by none of its last k
    // fetches (last seen at fetch - k or before) go, before the fetch is recorded: once
    // the listing shows a fetch, everything it does is done.
    if let (FetchOutcome::Ok { .. }, Some(k)) = (
        &outcome,
        prune.and_then(|prune| prune.absent_from_source_fetches),
    ) && fetch > k
    {
        prune_members(&*store, &pool, Some((claim.id, fetch - k))).await;
    }
    if let Err(error) = store
        .record_source_fetch(&pool, &source.url, &outcome, next_in)
        .await
    {
        tracing::warn!(pool = pool.as_str(), source = %url, %error,
            "could not record a source fetch; it is fetched again when its claim ends");
    }
}

/// Most batches one pruning runs; what is left waits for the pool's next fetch or round.
const MAX_PRUNE_BATCHES: usize = 64;

/// Applies the pool's prune rules ([`Store::prune`]) batch by batch, logging each member
/// removed (masked) and any failure once.
pub async fn prune_members(store: &dyn Store, pool: &PoolId, absent: Option<(u64, u64)>) {
    // Each batch moves the next stale members (if any are left) and removes due ones.
    for _ in 0..MAX_PRUNE_BATCHES {
        match store.prune(pool, absent).await {
            Ok(pruned) => {
                for member in &pruned.removed {
                    tracing::info!(pool = pool.as_str(), proxy = %member.masked(),
                        "member pruned");
                }
                if !pruned.more {
                    return;
                }
            }
            Err(StoreError::PoolNotFound) => return,
            Err(error) => {
                tracing::warn!(pool = pool.as_str(), %error,
                    "could not prune members; they are pruned after the next fetch or check round");
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::ImportCounts;

    #[test]
    fn failed_fetches_are_retried_sooner_doubling_up_to_the_interval() {
        let failed = FetchOutcome::Failed {
            error: "timed out".to_owned(),
        };
        let ok = FetchOutcome::Ok {
            counts: ImportCounts::default(),
        };
        let hour = Duration::from_secs(3_600);
        let waits: Vec<u64> = (0..5)
            .map(|failures| retry_in(&failed, failures, hour).as_secs())
            .collect();
        assert_eq!(waits, [5, 10, 20, 40, 80]);
        assert_eq!(retry_in(&failed, 40, hour), hour);
        assert_eq!(
            retry_in(&failed, 0, Duration::from_secs(2)),
            Duration::from_secs(2)
        );
        assert_eq!(retry_in(&ok, 3, hour), hour);
    }
}
