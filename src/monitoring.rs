//! Prometheus metrics: the process-wide recorder, the per-pool gauges, and `GET /metrics`.
//!
//! Counters and histograms go through the `metrics` facade into one recorder installed
//! once per process (installing it per application would fail for the second one, which
//! is exactly what tests do). Per-pool gauges are not kept in the recorder: they are
//! rendered at scrape time from a snapshot of `Store::pools` refreshed every
//! `METRICS_REFRESH_MS`, so a deleted pool's series disappear with it and only pools that
//! exist ever become label values. Requests naming a pool that does not exist are counted
//! under `pool="_other"`, so a flood of random pool ids cannot grow the series.

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::future::Future;
use std::sync::{Arc, LazyLock, OnceLock, PoisonError, RwLock};
use std::time::Duration;

use axum::http::Method;
use metrics::{Counter, Histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tokio::time::MissedTickBehavior;

use crate::domain::PoolId;
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
        "pa_connection_timeouts_total",
        "Connections closed for a timeout, by listener and kind (header, keep_alive, body)."
    );
    describe_gauge!("pa_connections_open", "Connections open, by listener.");
    describe_gauge!("pa_connections_max", "The connection cap of each listener.");
}

/// The metrics of one listener (see [`crate::connections`]), registered once: every
/// connection touches them.
#[derive(Clone)]
pub struct ListenerMetrics {
    /// `pa_accept_errors_total`.
    pub accept_errors: Counter,
    /// `pa_connections_refused_total`.
    pub refused: Counter,
    /// `pa_connection_timeouts_total` with `kind="header"`.
    pub header_timeouts: Counter,
    /// `pa_connection_timeouts_total` with `kind="keep_alive"`.
    pub keep_alive_timeouts: Counter,
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
            header_timeouts: timeouts("header"),
            keep_alive_timeouts: timeouts("keep_alive"),
            open: metrics::gauge!("pa_connections_open", "listener" => listener),
        }
    }

    /// Counts a connection closed for `kind`.
    pub fn timed_out(&self, kind: crate::connections::Timeout) {
        match kind {
            crate::connections::Timeout::Header => self.header_timeouts.increment(1),
            crate::connections::Timeout::KeepAlive => self.keep_alive_timeouts.increment(1),
        }
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

/// What the scrape renders for every pool, refreshed in the background.
#[derive(Clone, Default)]
pub struct PoolSnapshot {
    inner: Arc<RwLock<Snapshot>>,
}

#[derive(Default)]
struct Snapshot {
    pools: Vec<PoolInfo>,
    known: HashSet<PoolId>,
}

impl PoolSnapshot {
    /// The label to use for `pool`: itself when it is known to exist, else [`OTHER_POOL`].
    pub fn label(&self, pool: &PoolId) -> String {
        let known = self
            .inner
            .read()
            .is_ok_and(|snapshot| snapshot.known.contains(pool));
        if known {
            pool.as_str().to_owned()
        } else {
            OTHER_POOL.to_owned()
        }
    }

    fn replace(&self, pools: Vec<PoolInfo>) {
        let known = pools.iter().map(|p| p.pool.clone()).collect();
        if let Ok(mut snapshot) = self.inner.write() {
            *snapshot = Snapshot { pools, known };
        }
    }

    /// Reads every pool once.
    ///
    /// # Errors
    /// The store's error; the previous snapshot stays.
    pub async fn refresh(&self, store: &dyn Store) -> Result<(), crate::store::StoreError> {
        let pools = store.pools().await?;
        self.replace(pools);
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

    /// The per-pool gauges in Prometheus text format.
    pub fn render(&self) -> String {
        let Ok(snapshot) = self.inner.read() else {
            return String::new();
        };
        let mut out = String::new();
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
