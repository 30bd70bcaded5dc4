//! The HTTP API: every route in one table, the shared state, and the layers around them.
//!
//! Handlers live in one file per resource and only ever call the [`Store`] trait.

mod activity;
mod assign;
mod auth;
mod clients;
mod done;
pub mod error;
mod extract;
mod import;
mod leases;
mod log;
mod members;
mod outcomes;
mod pools;
mod probes;
mod sessions;
mod sources;
mod ui;

use std::sync::Arc;
use std::time::Duration;

use axum::extract::DefaultBodyLimit;
use axum::handler::Handler;
use axum::http::Method;
use axum::routing::{MethodFilter, MethodRouter, on};
use axum::{Extension, Router};

pub use self::auth::Tokens;
use self::error::ApiError;
use self::extract::BodyLimit;
pub use self::extract::ListKind;
pub use self::import::{ImportReport, ImportRequest, ListPieces, WholeList, import_list};
pub use self::members::MAX_MEMBERS_PER_CALL;
use crate::monitoring::PoolSnapshot;
use crate::store::Store;
use crate::tickets::Tickets;

/// What every handler can reach. Cloning is shallow.
#[derive(Clone)]
pub struct AppState {
    /// The pools' state.
    pub store: Arc<dyn Store>,
    /// The accepted tokens.
    pub tokens: Arc<Tokens>,
    /// The pools as last read for the metrics.
    pub snapshot: PoolSnapshot,
    /// The shortest `interval_ms` a pool's source may have (`SOURCE_MIN_INTERVAL_MS`).
    pub source_min_interval_ms: u64,
    /// The gateway's tunnel tickets, which outcome reports may name.
    pub tickets: Tickets,
    /// The GeoIP file, for the labels of seeded and imported members.
    pub geoip: crate::geoip::GeoIp,
}

/// Limits applied to requests.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Largest request body accepted, in bytes, on every route but the import.
    pub body_bytes: usize,
    /// Largest list the import route accepts, in bytes.
    pub import_body_bytes: usize,
    /// Longest time a request body may take to arrive, on every route but the import.
    pub body_read_timeout: Duration,
    /// Longest time the import route's list may take to arrive.
    pub import_body_read_timeout: Duration,
}

/// Who may call a route. Declared in the route table, enforced by the handler's first
/// extractor ([`auth`]'s `Admin` or `Worker`), and checked against each other for every
/// route by `tests/api/auth.rs`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// No token needed: probes, metrics, the contract, the index and the dashboard page.
    Open,
    /// The worker token when one is configured (the admin token is accepted too); open
    /// when none is, which the service allows on a loopback address only (or with
    /// `ALLOW_ANONYMOUS_WORKERS`).
    Worker,
    /// The admin token.
    Admin,
}

/// What a route reads from its request body. Declared in the route table, read by the
/// handler's extractors, and checked against each other for every route by
/// `tests/faults/hostile.rs`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouteBody {
    /// Nothing: a body, if any, is ignored.
    Ignored,
    /// A JSON document (`application/json`).
    Json,
    /// A JSON document, or no body at all for the defaults.
    OptionalJson,
    /// A whole proxy list, `text/plain` or a JSON array, under the import body limit.
    List,
}

/// One route of the API. The table builds the router (the method a route is declared with
/// is the method it is routed under: both come from one value), and the tests read it to
/// cover every route: the OpenAPI contract, tokens, hostile bodies.
pub struct Route {
    /// Path pattern in axum's (and OpenAPI's) `{param}` syntax.
    pub path: &'static str,
    /// HTTP method.
    pub method: Method,
    /// Who may call it.
    pub access: Access,
    /// What it reads from the body.
    pub body: RouteBody,
    /// Whether the probe port (`PROBE_LISTEN`) serves the route too.
    pub probe: bool,
    handler: MethodRouter<AppState>,
}

fn route<H, T>(
    path: &'static str,
    method: Method,
    access: Access,
    body: RouteBody,
    handler: H,
) -> Route
where
    H: Handler<T, AppState>,
    T: 'static,
{
    // Every method in the table below is a standard one, which always has a filter; the
    // router is built from the table by every test that starts the service.
    let filter = MethodFilter::try_from(method.clone()).expect("a standard HTTP method");
    Route {
        path,
        method,
        access,
        body,
        probe: false,
        handler: on(filter, handler),
    }
}

/// An open `GET` route without a body that the probe port serves too.
fn probe_route<H, T>(path: &'static str, handler: H) -> Route
where
    H: Handler<T, AppState>,
    T: 'static,
{
    Route {
        probe: true,
        ..route(path, Method::GET, Access::Open, RouteBody::Ignored, handler)
    }
}

/// Every route of the API.
pub fn routes() -> Vec<Route> {
    use Access::{Admin, Open, Worker};
    use RouteBody::{Ignored, Json, List, OptionalJson};
    vec![
        probe_route("/livez", probes::livez),
        probe_route("/readyz", probes::readyz),
        probe_route("/metrics", probes::metrics),
        route("/openapi.yaml", Method::GET, Open, Ignored, probes::openapi),
        route("/", Method::GET, Open, Ignored, ui::index),
        route("/ui", Method::GET, Open, Ignored, ui::page),
        route("/pools", Method::GET, Admin, Ignored, pools::list_pools),
        route("/pools/{pool}", Method::PUT, Admin, Json, pools::put_pool),
        route(
            "/pools/{pool}",
            Method::PATCH,
            Admin,
            Json,
            pools::patch_pool,
        ),
        route(
            "/pools/{pool}",
            Method::GET,
            Admin,
            Ignored,
            pools::get_pool,
        ),
        route(
            "/pools/{pool}",
            Method::DELETE,
            Admin,
            Ignored,
            pools::delete_pool,
        ),
        route(
            "/pools/{pool}/assign",
            Method::POST,
            Worker,
            OptionalJson,
            assign::assign,
        ),
        route(
            "/pools/{pool}/outcomes",
            Method::POST,
            Worker,
            Json,
            outcomes::report_outcomes,
        ),
        route(
            "/pools/{pool}/leases/{lease}/release",
            Method::POST,
            Worker,
            Ignored,
            leases::release,
        ),
        route(
            "/pools/{pool}/leases/{lease}/renew",
            Method::POST,
            Worker,
            OptionalJson,
            leases::renew,
        ),
        route(
            "/pools/{pool}/sessions/{session}",
            Method::DELETE,
            Worker,
            Ignored,
            sessions::end_session,
        ),
        route(
            "/pools/{pool}/members",
            Method::POST,
            Admin,
            Json,
            members::add_members,
        ),
        route(
            "/pools/{pool}/members",
            Method::GET,
            Admin,
            Ignored,
            members::list_members,
        ),
        route(
            "/pools/{pool}/members/disable",
            Method::POST,
            Admin,
            Json,
            members::disable_members,
        ),
        route(
            "/pools/{pool}/members/enable",
            Method::POST,
            Admin,
            Json,
            members::enable_members,
        ),
        route(
            "/pools/{pool}/members/remove",
            Method::POST,
            Admin,
            Json,
            members::remove_members,
        ),
        route(
            "/pools/{pool}/import",
            Method::POST,
            Admin,
            List,
            import::import,
        ),
        route(
            "/pools/{pool}/sources",
            Method::GET,
            Admin,
            Ignored,
            sources::list_sources,
        ),
        route(
            "/pools/{pool}/activity",
            Method::GET,
            Admin,
            Ignored,
            activity::activity,
        ),
        route(
            "/clients",
            Method::GET,
            Admin,
            Ignored,
            clients::list_clients,
        ),
        route(
            "/clients/{client}",
            Method::PUT,
            Admin,
            Json,
            clients::put_client,
        ),
        route(
            "/clients/{client}",
            Method::GET,
            Admin,
            Ignored,
            clients::get_client,
        ),
        route(
            "/clients/{client}",
            Method::DELETE,
            Admin,
            Ignored,
            clients::delete_client,
        ),
        route(
            "/clients/{client}/token",
            Method::POST,
            Admin,
            Ignored,
            clients::rotate_token,
        ),
    ]
}

/// The whole application as a `Router`, ready to serve or to drive with `oneshot` in tests.
pub fn app(state: AppState, limits: Limits) -> Router {
    router(routes(), state, limits)
}

/// The probe port's application: the routes marked [`Route::probe`] only, so a flood of
/// the API port, which is refused at its cap, never reaches the orchestrator's probes.
pub fn probe_app(state: AppState, limits: Limits) -> Router {
    router(
        routes().into_iter().filter(|route| route.probe).collect(),
        state,
        limits,
    )
}

fn router(routes: Vec<Route>, state: AppState, limits: Limits) -> Router {
    let mut router = Router::new();
    for Route {
        path,
        handler,
        body,
        ..
    } in routes
    {
        // Layers on the route run after the router-wide ones below, so this limit (and the
        // limit the 413 message names) replaces the small one for this route only.
        let handler = if body == RouteBody::List {
            handler
                .layer::<_, std::convert::Infallible>(DefaultBodyLimit::max(
                    limits.import_body_bytes,
                ))
                .layer::<_, std::convert::Infallible>(Extension(BodyLimit {
                    bytes: limits.import_body_bytes,
                    read_timeout: limits.import_body_read_timeout,
                }))
        } else {
            handler
        };
        router = router.route(path, handler);
    }
    router
        .fallback(|| async { ApiError::RouteNotFound })
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        .layer(DefaultBodyLimit::max(limits.body_bytes))
        .layer(Extension(BodyLimit {
            bytes: limits.body_bytes,
            read_timeout: limits.body_read_timeout,
        }))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            log::log_request,
        ))
        .with_state(state)
}
