//! A store put between a test app and its real store. It counts the background work the
//! app asks for (sweeps, check-round claims) and what that work did, and it can step in
//! right after a seeding. Tests wait on these counts for work to have happened, where
//! sleeping would leave them passing without testing anything on a stalled machine.

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use proxy_allocator::config::Config;
use proxy_allocator::domain::{
    AssignCount, ClientConfig, ClientId, LabelFilter, LeaseId, LeaseTtl, MemberId, PoolConfig,
    PoolId, RestorePolicy, SessionId, Target, TokenHash,
};
use proxy_allocator::store::{
    AssignRequest, Assignment, Batch, CheckRound, ClaimedSource, ClientRecord, Cursor,
    DisableReport, Done, DoneSummary, EnableReport, ExitSeen, FetchOutcome, MemberPage, PoolInfo,
    PoolPage, Pruned, PutClient, PutPool, RemoveReport, Renewed, Report, ReportSource,
    ReportSummary, Seed, SeedReport, SessionAssignment, SessionRequest, SourceState, StateFilter,
    Store, StoreError, StoreStatus, Swept,
};

use crate::helpers::TestApp;

/// Calls of one kind that one app makes one after another (its sweeps, its check ticks).
#[derive(Debug, Default)]
pub struct Calls {
    started: AtomicU64,
    finished: AtomicU64,
}

impl Calls {
    fn start(&self) {
        self.started.fetch_add(1, Ordering::SeqCst);
    }

    fn finish(&self) {
        self.finished.fetch_add(1, Ordering::SeqCst);
    }

    /// How many calls have started so far: a mark to wait from.
    pub fn mark(&self) -> u64 {
        self.started.load(Ordering::SeqCst)
    }

    /// Waits (at most 10 s, then fails naming `what`) until a call that started after
    /// `mark` has finished. The calls run one after another, so once `mark + 1` of them
    /// have finished, the one after the mark has.
    pub async fn await_one_after(&self, mark: u64, what: &str) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.finished.load(Ordering::SeqCst) <= mark {
            assert!(
                Instant::now() < deadline,
                "no {what} started after the mark finished within 10 s"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// What to do right after the next seeding: its report in, a seeding of the real store
/// (of the same pool) out.
type AfterSeed = Box<dyn FnOnce(&SeedReport) -> Seed + Send>;

/// The store between an app and its real store.
pub struct Spy {
    inner: Arc<dyn Store>,
    /// Background sweeps.
    pub sweeps: Calls,
    /// Looks into the index of due check rounds (one per check tick).
    pub check_ticks: Calls,
    /// Check-round claims.
    pub claims: Calls,
    /// Leases the sweeps reclaimed.
    pub reclaimed: AtomicU64,
    /// Members the sweeps returned.
    pub returned: AtomicU64,
    /// Check rounds the claims won.
    pub rounds: AtomicU64,
    /// Looks into the index of due sources (one per source tick).
    pub source_ticks: Calls,
    /// Sources this app claimed for a fetch.
    pub sources_claimed: AtomicU64,
    /// Seedings (one per batch of an import).
    pub seeds: Calls,
    after_seed: Mutex<Option<AfterSeed>>,
    seed_delay: Mutex<Duration>,
}

impl Spy {
    fn new(inner: Arc<dyn Store>) -> Self {
        Self {
            inner,
            sweeps: Calls::default(),
            check_ticks: Calls::default(),
            claims: Calls::default(),
            reclaimed: AtomicU64::new(0),
            returned: AtomicU64::new(0),
            rounds: AtomicU64::new(0),
            source_ticks: Calls::default(),
            sources_claimed: AtomicU64::new(0),
            seeds: Calls::default(),
            after_seed: Mutex::new(None),
            seed_delay: Mutex::new(Duration::ZERO),
        }
    }

    /// Right after the next seeding that writes (a dry run does not), and before its
    /// answer goes back, seeds the real store with what `then` makes of its report: as if
    /// another client had come in between two store calls of one request.
    pub fn after_next_seed(&self, then: impl FnOnce(&SeedReport) -> Seed + Send + 'static) {
        *self.after_seed.lock().expect("not poisoned") = Some(Box::new(then));
    }

    /// Makes every seeding from now on take `delay` longer, as on a store that paces its
    /// chunks or is busy.
    pub fn slow_seeds_by(&self, delay: Duration) {
        *self.seed_delay.lock().expect("not poisoned") = delay;
    }
}

/// Starts an app on `config` with a spy around `store` (shared with other apps, as
/// replicas share one Redis) instead of the store `config` describes.
pub async fn spawn_spied_on(config: Config, store: Arc<dyn Store>) -> (TestApp, Arc<Spy>) {
    let spy = Arc::new(Spy::new(store));
    let served: Arc<dyn Store> = spy.clone();
    let app = TestApp::spawn_with_store(config, move |_| served).await;
    (app, spy)
}

/// Starts an app on `config` with a spy around its store.
pub async fn spawn_spied(config: Config) -> (TestApp, Arc<Spy>) {
    let slot: Arc<Mutex<Option<Arc<Spy>>>> = Arc::default();
    let kept = Arc::clone(&slot);
    let app = TestApp::spawn_with_store(config, move |inner| {
        let spy = Arc::new(Spy::new(inner));
        *kept.lock().expect("not poisoned") = Some(Arc::clone(&spy));
        spy
    })
    .await;
    let spy = slot
        .lock()
        .expect("not poisoned")
        .take()
        .expect("the app was built around the spy");
    (app, spy)
}

#[async_trait]
impl Store for Spy {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    async fn status(&self) -> Result<StoreStatus, StoreError> {
        self.inner.status().await
    }

    async fn assign(
        &self,
        pool: &PoolId,
        request: &AssignRequest,
    ) -> Result<Assignment, StoreError> {
        self.inner.assign(pool, request).await
    }

    async fn assign_several(
        &self,
        pool: &PoolId,
        request: &AssignRequest,
        count: AssignCount,
    ) -> Result<Batch, StoreError> {
        self.inner.assign_several(pool, request, count).await
    }

    async fn assign_after_done(
        &self,
        pool: &PoolId,
        done: &Done,
        request: &AssignRequest,
        count: AssignCount,
    ) -> Result<(Batch, DoneSummary), StoreError> {
        self.inner
            .assign_after_done(pool, done, request, count)
            .await
    }

    async fn assign_in_session(
        &self,
        pool: &PoolId,
        request: &AssignRequest,
        session: &SessionRequest,
    ) -> Result<SessionAssignment, StoreError> {
        self.inner.assign_in_session(pool, request, session).await
    }

    async fn assign_in_session_after_done(
        &self,
        pool: &PoolId,
        done: &Done,
        request: &AssignRequest,
        session: &SessionRequest,
    ) -> Result<(SessionAssignment, DoneSummary), StoreError> {
        self.inner
            .assign_in_session_after_done(pool, done, request, session)
            .await
    }

    async fn end_session(&self, pool: &PoolId, session: &SessionId) -> Result<(), StoreError> {
        self.inner.end_session(pool, session).await
    }

    async fn release(&self, pool: &PoolId, lease: &LeaseId) -> Result<(), StoreError> {
        self.inner.release(pool, lease).await
    }

    async fn renew(
        &self,
        pool: &PoolId,
        lease: &LeaseId,
        ttl: Option<LeaseTtl>,
    ) -> Result<Renewed, StoreError> {
        self.inner.renew(pool, lease, ttl).await
    }

    async fn sweep(&self) -> Result<Swept, StoreError> {
        self.sweeps.start();
        let swept = self.inner.sweep().await;
        if let Ok(swept) = &swept {
            self.reclaimed.fetch_add(swept.reclaimed, Ordering::SeqCst);
            self.returned.fetch_add(swept.returned, Ordering::SeqCst);
        }
        self.sweeps.finish();
        swept
    }

    async fn report(
        &self,
        pool: &PoolId,
        source: ReportSource,
        reports: &[Report],
    ) -> Result<ReportSummary, StoreError> {
        self.inner.report(pool, source, reports).await
    }

    async fn due_check_pools(&self, limit: usize) -> Result<Vec<PoolId>, StoreError> {
        self.check_ticks.start();
        let due = self.inner.due_check_pools(limit).await;
        self.check_ticks.finish();
        due
    }

    async fn claim_check_round(
        &self,
        pool: &PoolId,
        interval: Duration,
    ) -> Result<Option<CheckRound>, StoreError> {
        self.claims.start();
        let claimed = self.inner.claim_check_round(pool, interval).await;
        if let Ok(Some(_)) = &claimed {
            self.rounds.fetch_add(1, Ordering::SeqCst);
        }
        self.claims.finish();
        claimed
    }

    async fn due_source_pools(&self, limit: usize) -> Result<Vec<PoolId>, StoreError> {
        self.source_ticks.start();
        let due = self.inner.due_source_pools(limit).await;
        self.source_ticks.finish();
        due
    }

    async fn claim_sources(
        &self,
        pool: &PoolId,
        urls: &[String],
        hold: Duration,
    ) -> Result<Vec<ClaimedSource>, StoreError> {
        let claimed = self.inner.claim_sources(pool, urls, hold).await;
        if let Ok(claimed) = &claimed {
            self.sources_claimed
                .fetch_add(claimed.len() as u64, Ordering::SeqCst);
        }
        claimed
    }

    async fn record_source_fetch(
        &self,
        pool: &PoolId,
        url: &str,
        outcome: &FetchOutcome,
        next_in: Duration,
    ) -> Result<(), StoreError> {
        self.inner
            .record_source_fetch(pool, url, outcome, next_in)
            .await
    }

    async fn source_states(
        &self,
        pool: &PoolId,
    ) -> Result<std::collections::HashMap<String, SourceState>, StoreError> {
        self.inner.source_states(pool).await
    }

    async fn prune(&self, pool: &PoolId, absent: Option<(u64, u64)>) -> Result<Pruned, StoreError> {
        self.inner.prune(pool, absent).await
    }

    async fn put_pool(&self, pool: &PoolId, config: &PoolConfig) -> Result<PutPool, StoreError> {
        self.inner.put_pool(pool, config).await
    }

    async fn pool(&self, pool: &PoolId) -> Result<PoolInfo, StoreError> {
        self.inner.pool(pool).await
    }

    async fn pool_page(
        &self,
        prefix: &str,
        after: Option<&PoolId>,
        limit: usize,
    ) -> Result<PoolPage, StoreError> {
        self.inner.pool_page(prefix, after, limit).await
    }

    async fn pool_count(&self) -> Result<u64, StoreError> {
        self.inner.pool_count().await
    }

    async fn delete_pool(&self, pool: &PoolId) -> Result<(), StoreError> {
        self.inner.delete_pool(pool).await
    }

    async fn add_members(&self, pool: &PoolId, seed: &Seed) -> Result<SeedReport, StoreError> {
        self.seeds.start();
        let delay = *self.seed_delay.lock().expect("not poisoned");
        tokio::time::sleep(delay).await;
        let report = self.inner.add_members(pool, seed).await;
        self.seeds.finish();
        let report = report?;
        let then = if seed.dry_run {
            None
        } else {
            self.after_seed.lock().expect("not poisoned").take()
        };
        if let Some(then) = then {
            self.inner.add_members(pool, &then(&report)).await?;
        }
        Ok(report)
    }

    async fn members(
        &self,
        pool: &PoolId,
        filter: StateFilter,
        labels: &LabelFilter,
        target: Option<&Target>,
        limit: usize,
        cursor: Cursor,
    ) -> Result<MemberPage, StoreError> {
        self.inner
            .members(pool, filter, labels, target, limit, cursor)
            .await
    }

    async fn shared_exit_members(
        &self,
        pool: &PoolId,
        filter: StateFilter,
        target: Option<&Target>,
        limit: usize,
        cursor: Cursor,
    ) -> Result<MemberPage, StoreError> {
        self.inner
            .shared_exit_members(pool, filter, target, limit, cursor)
            .await
    }

    async fn record_exits(&self, pool: &PoolId, exits: &[ExitSeen]) -> Result<u64, StoreError> {
        self.inner.record_exits(pool, exits).await
    }

    async fn disable_members(
        &self,
        pool: &PoolId,
        members: &[MemberId],
        reason: &str,
    ) -> Result<DisableReport, StoreError> {
        self.inner.disable_members(pool, members, reason).await
    }

    async fn enable_members(
        &self,
        pool: &PoolId,
        members: &[MemberId],
        restore: Option<RestorePolicy>,
    ) -> Result<EnableReport, StoreError> {
        self.inner.enable_members(pool, members, restore).await
    }

    async fn remove_members(
        &self,
        pool: &PoolId,
        members: &[MemberId],
    ) -> Result<RemoveReport, StoreError> {
        self.inner.remove_members(pool, members).await
    }

    async fn put_client(
        &self,
        id: &ClientId,
        config: &ClientConfig,
        token: TokenHash,
    ) -> Result<PutClient, StoreError> {
        self.inner.put_client(id, config, token).await
    }

    async fn rotate_client_token(&self, id: &ClientId, token: TokenHash) -> Result<(), StoreError> {
        self.inner.rotate_client_token(id, token).await
    }

    async fn client(&self, id: &ClientId) -> Result<ClientRecord, StoreError> {
        self.inner.client(id).await
    }

    async fn clients(&self) -> Result<Vec<ClientRecord>, StoreError> {
        self.inner.clients().await
    }

    async fn delete_client(&self, id: &ClientId) -> Result<(), StoreError> {
        self.inner.delete_client(id).await
    }

    async fn client_by_token(&self, token: TokenHash) -> Result<Option<ClientRecord>, StoreError> {
        self.inner.client_by_token(token).await
    }
}
