//! Prometheus metrics: the process-wide recorder, the per-pool gauges, and `GET /metrics`.
//!
//! Counters and histograms go through the `metrics` facade into one recorder installed
//! once per process (installing it per application would fail for the second one, which
//! is exactly what tests do). Per-pool gauges are not kept in the recorder: they are
//! rendered at scrape time from a snapshot of at most `METRICS_MAX_POOLS` pools (see
//! [`PoolSnapshot`]) refreshed every `METRICS_REFRESH_MS`, so a deleted pool's series
//! disappear with it and only pools that exist ever become label values. Requests naming a
//! pool without series of its own (one that does not exist, or one beyond the bound) are
//! counted under `pool="_other"`, so neither a flood of random pool ids nor a hundred
//! thousand real pools can grow the series.
//!
//! The same pools, and only they, keep their activity of the last minutes
//! ([`activity`]): assigns, 204s and reports per second, for the dashboard's chart.

mod activity;

use std::collections::HashMap;
use std::fmt::Write as _;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, OnceLock, PoisonError, RwLock};
use std::time::Duration;

use axum::http::Method;
use metrics::{Counter, Histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tokio::time::MissedTickBehavior;

use self::activity::Activity;
pub use self::activity::{ActivityView, Event, SECONDS as ACTIVITY_SECONDS};
use crate::domain::{OutcomeResult, PoolId, Timestamp};
use crate::store::{PoolInfo, Store};

/// The label value for a pool that is not known to exist.
pub const OTHER_POOL: &str = "_other";

/// Buckets for latencies in seconds: 100 µs to 5 s.
const LATENCY_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
];

/// The process-wide Prometheus handle, installed on first use.
pub fn prometheus() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        let builder = PrometheusBuilder::new()
            .set_buckets_for_metric(Matcher::Suffix("_seconds".to_owned()), LATENCY_BUCKETS)
            .unwrap_or_else(|_| PrometheusBuilder::new());
        let recorder = builder.build_recorder();
        let handle = recorder.handle();
        // Fails only when another recorder is already installed (an embedding program
        // brought its own); this handle then renders nothing, which is harmless.
        let _ = metrics::set_global_recorder(recorder);
        describe();
        handle
    })
}

fn describe() {
    use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    describe_counter!(
        "pa_assigns_total",
        "Assign requests by pool and outcome (assigned, empty, not_found, error)."
    );
    describe_counter!(
        "pa_exit_ip_unreadable_total",
        "Answers of exit_ip checks that held no address (garbage, a block page): nothing was recorded for them."
    );
    describe_counter!(
        "pa_large_work_steps_total",
        "Steps of large operations (seed, import, disable, enable, remove, the sweep, listing pieces)."
    );
    describe_counter!(
        "pa_large_work_rests_total",
        "Steps of large operations followed by a rest, by what made the step contended: local (this replica's calls waited through it) or remote (on Redis, others sent it at least 16 KiB a second since the reading before)."
    );
    describe_histogram!(
        "pa_assign_duration_seconds",
        Unit::Seconds,
        "Time to answer an assign, by outcome."
    );
    describe_counter!(
        "pa_http_requests_total",
        "HTTP requests by method, route template and status."
    );
    describe_histogram!(
        "pa_http_request_duration_seconds",
        Unit::Seconds,
        "Time to answer a request, by route template."
    );
    describe_counter!(
        "pa_store_errors_total",
        "Store operations that failed, by kind (timeout, unavailable)."
    );
    describe_histogram!(
        "pa_store_round_trip_seconds",
        Unit::Seconds,
        "Redis round-trip time of one store operation."
    );
    describe_counter!(
        "pa_leases_reclaimed_total",
        "Expired leases reclaimed by this replica's background sweep."
    );
    describe_counter!(
        "pa_accept_errors_total",
        "Failed accepts by listener (out of file descriptors and the like)."
    );
    describe_counter!(
        "pa_connections_refused_total",
        "Connections closed at once because the listener was at its cap."
    );
    describe_counter!(
        "pa_connections_refused_per_client_total",
        "Connections closed at once because their client (an IPv4 address, an IPv6 /64) held \
         its whole share of the listener's connections."
    );
    describe_counter!(
        "pa_connection_timeouts_total",
        "Connections closed for a timeout, by listener and kind (header, keep_alive, unauthenticated, body)."
    );
    describe_gauge!("pa_connections_open", "Connections open, by listener.");
    describe_gauge!("pa_connections_max", "The connection cap of each listener.");
    describe_gauge!(
        "pa_connections_max_per_client",
        "The most connections one client may hold, by listener (absent: no per-client share)."
    );
    describe_counter!(
        "pa_gateway_requests_total",
        "Gateway requests by pool and outcome (tunnel, forwarded, or the code of the gateway's \
         own answer: no_eligible_proxy, upstream_failed, proxy_auth_required, ...)."
    );
    describe_gauge!("pa_gateway_tunnels_open", "Gateway tunnels open.");
    describe_counter!(
        "pa_gateway_bytes_total",
        Unit::Bytes,
        "Bytes the gateway relayed, by direction (sent: client to upstream; received: upstream \
         to client)."
    );
}

/// The metrics of one listener (see [`crate::connections`]), registered once: every
/// connection touches them.
#[derive(Clone)]
pub struct ListenerMetrics {
    /// `pa_accept_errors_total`.
    pub accept_errors: Counter,
    /// `pa_connections_refused_total`.
    pub refused: Counter,
    /// `pa_connections_refused_per_client_total`: refused over the client's share.
    pub refused_per_client: Counter,
    /// `pa_connection_timeouts_total` with `kind="header"`.
    pub header_timeouts: Counter,
    /// `pa_connection_timeouts_total` with `kind="keep_alive"`.
    pub keep_alive_timeouts: Counter,
    /// `pa_connection_timeouts_total` with `kind="unauthenticated"`.
    pub unauthenticated_timeouts: Counter,
    listener: &'static str,
    /// `pa_connections_open`.
    pub open: metrics::Gauge,
}

impl ListenerMetrics {
    /// The handles of the listener called `listener`, whose cap is `max_connections`.
    pub fn new(listener: &'static str, max_connections: usize) -> Self {
        prometheus();
        #[expect(
            clippy::cast_precision_loss,
            reason = "a gauge is a float; caps are far below 2^53"
        )]
        metrics::gauge!("pa_connections_max", "listener" => listener).set(max_connections as f64);
        let timeouts = |kind: &'static str| metrics::counter!("pa_connection_timeouts_total", "listener" => listener, "kind" => kind);
        Self {
            accept_errors: metrics::counter!("pa_accept_errors_total", "listener" => listener),
            refused: metrics::counter!("pa_connections_refused_total", "listener" => listener),
            refused_per_client: metrics::counter!("pa_connections_refused_per_client_total", "listener" => listener),
            header_timeouts: timeouts("header"),
            keep_alive_timeouts: timeouts("keep_alive"),
            unauthenticated_timeouts: timeouts("unauthenticated"),
            listener,
            open: metrics::gauge!("pa_connections_open", "listener" => listener),
        }
    }

    /// Counts a connection closed for `kind`.
    pub fn timed_out(&self, kind: crate::connections::Timeout) {
        match kind {
            crate::connections::Timeout::Header => self.header_timeouts.increment(1),
            crate::connections::Timeout::KeepAlive => self.keep_alive_timeouts.increment(1),
            crate::connections::Timeout::Unauthenticated => {
                self.unauthenticated_timeouts.increment(1);
            }
        }
    }

    /// Sets `pa_connections_max_per_client`, the most connections one client may hold.
    pub fn max_per_client(&self, max: usize) {
        #[expect(
            clippy::cast_precision_loss,
            reason = "a gauge is a float; shares are far below 2^53"
        )]
        metrics::gauge!("pa_connections_max_per_client", "listener" => self.listener)
            .set(max as f64);
    }
}

/// Counts a request body that did not arrive within its timeout (on the API's listener,
/// the only one whose routes read bodies).
pub fn record_body_timeout() {
    static BODY: LazyLock<Counter> = LazyLock::new(|| {
        prometheus();
        metrics::counter!("pa_connection_timeouts_total", "listener" => "api", "kind" => "body")
    });
    BODY.increment(1);
}

/// Handles of the metrics every request records, registered once per label set: the
/// `metrics` macros allocate the label values and look the series up in the recorder on
/// every call, which on the assign path cost a tenth of the service's own work.
struct Handles {
    /// `pa_http_requests_total` and `pa_http_request_duration_seconds`, by route template,
    /// then method and status.
    requests: Registered<(Method, u16), (Counter, Histogram)>,
    /// `pa_assigns_total` and `pa_assign_duration_seconds`, by pool label, then outcome.
    assigns: Registered<&'static str, (Counter, Histogram)>,
    store_round_trip: Histogram,
}

/// Handles by one label value that varies freely (a route, a pool) and a few that do not;
/// each handle is registered the first time its labels are seen.
struct Registered<K, H>(RwLock<HashMap<String, Vec<(K, H)>>>);

impl<K: PartialEq, H: Clone> Registered<K, H> {
    fn new() -> Self {
        Self(RwLock::default())
    }

    fn get(&self, name: &str, key: K, register: impl FnOnce() -> H) -> H {
        let find = |handles: &[(K, H)], key: &K| {
            handles
                .iter()
                .find(|(k, _)| k == key)
                .map(|(_, h)| h.clone())
        };
        // A poisoned lock only means a panic while a handle was added: the map is whole.
        let found = self
            .0
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(name)
            .and_then(|handles| find(handles, &key));
        found.unwrap_or_else(|| {
            let mut all = self.0.write().unwrap_or_else(PoisonError::into_inner);
            let handles = all.entry(name.to_owned()).or_default();
            find(handles, &key).unwrap_or_else(|| {
                let handle = register();
                handles.push((key, handle.clone()));
                handle
            })
        })
    }
}

/// The handles, registered with the process's recorder (installed first).
static HANDLES: LazyLock<Handles> = LazyLock::new(|| {
    prometheus();
    Handles {
        requests: Registered::new(),
        assigns: Registered::new(),
        store_round_trip: metrics::histogram!("pa_store_round_trip_seconds"),
    }
});

/// Counts one answered request under its method, route template and status, and records
/// how long it took.
pub fn record_request(method: &Method, route: &str, status: u16, seconds: f64) {
    let (requests, duration) = HANDLES.requests.get(route, (method.clone(), status), || {
        (
            metrics::counter!("pa_http_requests_total",
                "method" => method.to_string(), "route" => route.to_owned(), "status" => status.to_string()),
            metrics::histogram!("pa_http_request_duration_seconds", "route" => route.to_owned()),
        )
    });
    requests.increment(1);
    duration.record(seconds);
}

/// Counts one assign under its pool label (see [`PoolSnapshot::label`]) and outcome, and
/// records how long it took.
pub fn record_assign(pool_label: &str, outcome: &'static str, seconds: f64) {
    let (assigns, duration) = HANDLES.assigns.get(pool_label, outcome, || {
        (
            metrics::counter!("pa_assigns_total", "pool" => pool_label.to_owned(), "outcome" => outcome),
            metrics::histogram!("pa_assign_duration_seconds", "outcome" => outcome),
        )
    });
    assigns.increment(1);
    duration.record(seconds);
}

/// Records how long one store operation took, reply included.
pub fn record_store_round_trip(seconds: f64) {
    HANDLES.store_round_trip.record(seconds);
}

/// A per-pool gauge: name, help text, and how to read it from a pool's numbers.
type Gauge = (&'static str, &'static str, fn(&PoolInfo) -> Option<u64>);

/// The pools with series of their own and what the scrape renders for them, refreshed in
/// the background. Cloning is shallow.
///
/// At most `max` pools have series: the named ones (`METRICS_POOLS`), or else the first
/// pools this replica assigns from (a pool takes a place when the store has just said it
/// exists, and gives it back once a refresh finds it deleted). Every other pool counts
/// under [`OTHER_POOL`], so the number of series never grows with the number of pools, and
/// a refresh reads only these pools and the number of all pools. The same pools keep their
/// activity of the last minutes (see [`PoolSnapshot::sample_activity`]).
#[derive(Clone)]
pub struct PoolSnapshot {
    inner: Arc<RwLock<Snapshot>>,
    /// The end of the last second the sampler moved into the rings, in Unix seconds.
    sampled_until: Arc<AtomicU64>,
}

struct Snapshot {
    /// The pools with series, each with its activity, and whether they were named (then
    /// none joins).
    tracked: HashMap<PoolId, Arc<Activity>>,
    named: bool,
    max: usize,
    /// Their numbers at the last refresh.
    pools: Vec<PoolInfo>,
    /// How many pools exist, at the last refresh.
    total: Option<u64>,
}

impl Default for PoolSnapshot {
    /// Up to 100 pools, none named.
    fn default() -> Self {
        Self::new(100, Vec::new())
    }
}

impl PoolSnapshot {
    /// Series for `named` pools (at most `max` of them), or, when none is named, for the
    /// first `max` pools assigned from.
    pub fn new(max: usize, named: Vec<PoolId>) -> Self {
        let is_named = !named.is_empty();
        let tracked = named
            .into_iter()
            .take(max)
            .map(|pool| (pool, Arc::default()))
            .collect();
        Self {
            inner: Arc::new(RwLock::new(Snapshot {
                tracked,
                named: is_named,
                max,
                pools: Vec::new(),
                total: None,
            })),
            sampled_until: Arc::new(AtomicU64::new(Timestamp::now().0 / 1000)),
        }
    }

    /// The label to use for `pool`: itself when it has series, else [`OTHER_POOL`]. With
    /// `exists` (the store has just answered for it) a pool takes a free place.
    pub fn label<'a>(&self, pool: &'a PoolId, exists: bool) -> &'a str {
        self.count(pool, exists, &[])
    }

    /// [`PoolSnapshot::label`], counting `events` (each with how many) in the pool's
    /// activity when it has series. Under the read lock the label takes anyway: counting
    /// adds no lock and no allocation to a request.
    pub fn count<'a>(&self, pool: &'a PoolId, exists: bool, events: &[(Event, u32)]) -> &'a str {
        let record = |activity: &Activity| {
            for &(event, n) in events {
                activity.count(event, n);
            }
        };
        // A poisoned lock only means a panic while a pool was added: the map is whole.
        let joins = {
            let snapshot = self.inner.read().unwrap_or_else(PoisonError::into_inner);
            if let Some(activity) = snapshot.tracked.get(pool) {
                record(activity);
                return pool.as_str();
            }
            exists && !snapshot.named && snapshot.tracked.len() < snapshot.max
        };
        if joins {
            let mut snapshot = self.inner.write().unwrap_or_else(PoisonError::into_inner);
            if snapshot.tracked.len() < snapshot.max {
                record(snapshot.tracked.entry(pool.clone()).or_default());
                return pool.as_str();
            }
        }
        OTHER_POOL
    }

    /// Counts reports about members of `pool` (which the store has just said exists) by
    /// their results.
    pub fn count_reports(&self, pool: &PoolId, results: impl IntoIterator<Item = OutcomeResult>) {
        let mut by_result = [
            (Event::Reported(OutcomeResult::Ok), 0_u32),
            (Event::Reported(OutcomeResult::Failed), 0),
            (Event::Reported(OutcomeResult::Blocked), 0),
        ];
        for result in results {
            for (event, n) in &mut by_result {
                if *event == Event::Reported(result) {
                    *n = n.saturating_add(1);
                }
            }
        }
        if by_result.iter().any(|(_, n)| *n > 0) {
            self.count(pool, true, &by_result);
        }
    }

    /// The activity of `pool` (which the store has just said exists) over the last
    /// [`ACTIVITY_SECONDS`] seconds the sampler finished. Asking takes a free place, as an
    /// assign does, so that a pool an operator looks at starts counting.
    pub fn activity(&self, pool: &PoolId) -> ActivityView {
        self.count(pool, true, &[]);
        let until = self.sampled_until.load(Ordering::Acquire);
        let series = self
            .inner
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .tracked
            .get(pool)
            .map(|activity| activity.series(until));
        ActivityView::new(pool.clone(), until, series)
    }

    /// Once a second, at the turn of each second of the clock, moves what the pools with
    /// series counted into their rings, until `stop` completes. One pass touches at most
    /// `METRICS_MAX_POOLS` pools, and writes the ring only of those that counted something.
    pub async fn sample_activity(self, stop: impl Future<Output = ()>) {
        tokio::pin!(stop);
        loop {
            let into_second = Duration::from_millis(Timestamp::now().0 % 1000);
            let to_next = Duration::from_secs(1).saturating_sub(into_second);
            tokio::select! {
                () = &mut stop => return,
                () = tokio::time::sleep(to_next) => {}
            }
            self.sample(Timestamp::now().0 / 1000);
        }
    }

    /// Moves the counts so far into the rings as the second before `now` (Unix seconds).
    fn sample(&self, now: u64) {
        // Woken early by a coarse timer: this second is not over, the next pass takes it.
        if now <= self.sampled_until.load(Ordering::Acquire) {
            return;
        }
        {
            let snapshot = self.inner.read().unwrap_or_else(PoisonError::into_inner);
            for activity in snapshot.tracked.values() {
                activity.sample(now - 1);
            }
        }
        // Published after the rings are written: a reader that sees `now` sees its counts.
        self.sampled_until.store(now, Ordering::Release);
    }

    /// Reads the pools with series and the number of all pools, once.
    ///
    /// # Errors
    /// The store's error; the previous snapshot stays.
    pub async fn refresh(&self, store: &dyn Store) -> Result<(), crate::store::StoreError> {
        let ids: Vec<PoolId> = {
            let snapshot = self.inner.read().unwrap_or_else(PoisonError::into_inner);
            snapshot.tracked.keys().cloned().collect()
        };
        let total = store.pool_count().await?;
        let infos = futures_util::future::join_all(ids.iter().map(|id| store.pool(id))).await;
        let mut pools = Vec::with_capacity(ids.len());
        let mut gone = Vec::new();
        for (id, info) in ids.into_iter().zip(infos) {
            match info {
                Ok(info) => pools.push(info),
                Err(crate::store::StoreError::PoolNotFound) => gone.push(id),
                Err(e) => return Err(e),
            }
        }
        pools.sort_by(|a, b| a.pool.cmp(&b.pool));
        let mut snapshot = self.inner.write().unwrap_or_else(PoisonError::into_inner);
        if !snapshot.named {
            for id in &gone {
                snapshot.tracked.remove(id);
            }
        }
        snapshot.pools = pools;
        snapshot.total = Some(total);
        Ok(())
    }

    /// Refreshes every `interval` until `stop` completes.
    pub async fn run(
        self,
        store: Arc<dyn Store>,
        interval: Duration,
        stop: impl Future<Output = ()>,
    ) {
        let mut ticks = tokio::time::interval(interval);
        ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
        tokio::pin!(stop);
        loop {
            tokio::select! {
                () = &mut stop => return,
                _ = ticks.tick() => {}
            }
            // A failed refresh keeps the last snapshot; the store errors are counted where
            // they happen, so nothing is logged here.
            let _ = self.refresh(store.as_ref()).await;
            prometheus().run_upkeep();
        }
    }

    /// The per-pool gauges and the pool totals in Prometheus text format.
    pub fn render(&self) -> String {
        let snapshot = self.inner.read().unwrap_or_else(PoisonError::into_inner);
        let mut out = String::new();
        if let Some(total) = snapshot.total {
            let _ = writeln!(
                out,
                "# HELP pa_pools Pools in the store.\n# TYPE pa_pools gauge\npa_pools {total}"
            );
        }
        let _ = writeln!(
            out,
            "# HELP pa_pools_with_series Pools with series of their own here (at most METRICS_MAX_POOLS).\n\
             # TYPE pa_pools_with_series gauge\npa_pools_with_series {}",
            snapshot.pools.len()
        );
        let gauges: [Gauge; 9] = [
            (
                "pa_pool_eligible_members",
                "Members assign may choose.",
                |p| Some(p.stats.eligible),
            ),
            (
                "pa_pool_ineligible_members",
                "Members taken out, keeping their counts.",
                |p| Some(p.stats.ineligible),
            ),
            (
                "pa_pool_in_flight",
                "Live leases (least-in-flight pools).",
                |p| Some(p.stats.in_flight),
            ),
            (
                "pa_pool_min_assignments",
                "Lowest count among eligible members.",
                |p| p.stats.min_assignments,
            ),
            (
                "pa_pool_max_assignments",
                "Highest count among eligible members.",
                |p| p.stats.max_assignments,
            ),
            (
                "pa_pool_assignments",
                "Assignments handed out since the pool was created.",
                |p| Some(p.stats.total_assignments),
            ),
            (
                "pa_pool_abandoned_leases",
                "Leases reclaimed after they expired unreleased.",
                |p| Some(p.stats.abandoned),
            ),
            (
                "pa_pool_health_trips",
                "Members taken out by the health rules since the pool was created.",
                |p| Some(p.stats.tripped),
            ),
            (
                "pa_pool_health_returns",
                "Members that came back after a cooldown or a passing check.",
                |p| Some(p.stats.recovered),
            ),
        ];
        for (name, help, value) in gauges {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
            for pool in &snapshot.pools {
                if let Some(v) = value(pool) {
                    // Pool ids are [A-Za-z0-9._-]: nothing to escape in a label value.
                    let _ = writeln!(out, "{name}{{pool=\"{}\"}} {v}", pool.pool);
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(id: &str) -> PoolId {
        PoolId::parse(id).expect("a valid pool id")
    }

    #[test]
    fn named_pools_have_series_and_no_other_pool_takes_a_place() {
        let snapshot = PoolSnapshot::new(2, vec![pool("named")]);
        assert_eq!(snapshot.label(&pool("named"), false), "named");
        assert_eq!(snapshot.label(&pool("other"), true), OTHER_POOL);
    }

    #[test]
    fn without_names_the_first_pools_assigned_from_take_the_places() {
        let snapshot = PoolSnapshot::new(2, Vec::new());
        assert_eq!(snapshot.label(&pool("unknown"), false), OTHER_POOL);
        assert_eq!(snapshot.label(&pool("first"), true), "first");
        assert_eq!(snapshot.label(&pool("second"), true), "second");
        assert_eq!(snapshot.label(&pool("third"), true), OTHER_POOL);
        assert_eq!(snapshot.label(&pool("first"), false), "first");
    }
}
