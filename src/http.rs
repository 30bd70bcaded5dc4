//! The HTTP API: every route in one table, the shared state, and the layers around them.
//!
//! Handlers live in one file per resource and only ever call the [`Store`] trait.

mod assign;
mod auth;
pub mod error;
mod extract;
mod import;
mod leases;
mod log;
mod members;
mod outcomes;
mod pools;
mod probes;
mod ui;

use std::sync::Arc;
use std::time::Duration;

use axum::extract::DefaultBodyLimit;
use axum::http::Method;
use axum::routing::{MethodRouter, delete, get, post, put};
use axum::{Extension, Router};

pub use self::auth::Tokens;
use self::error::ApiError;
use self::extract::BodyLimit;
pub use self::members::MAX_MEMBERS_PER_CALL;
use crate::monitoring::PoolSnapshot;
use crate::store::Store;

/// What every handler can reach. Cloning is shallow.
#[derive(Clone)]
pub struct AppState {
    /// The pools' state.
    pub store: Arc<dyn Store>,
    /// The accepted tokens.
    pub tokens: Arc<Tokens>,
    /// The pools as last read for the metrics.
    pub snapshot: PoolSnapshot,
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

/// One route of the API: the table that builds the router is also what the OpenAPI
/// contract test compares with `openapi.yaml`.
pub struct Route {
    /// Path pattern in axum's (and OpenAPI's) `{param}` syntax.
    pub path: &'static str,
    /// HTTP method.
    pub method: Method,
    /// Whether the route takes whole proxy lists, under the import body limit.
    pub takes_lists: bool,
    /// Whether the probe port (`PROBE_LISTEN`) serves the route too.
    pub probe: bool,
    handler: MethodRouter<AppState>,
}

fn route(path: &'static str, method: Method, handler: MethodRouter<AppState>) -> Route {
    Route {
        path,
        method,
        takes_lists: false,
        probe: false,
        handler,
    }
}

fn probe_route(path: &'static str, handler: MethodRouter<AppState>) -> Route {
    Route {
        probe: true,
        ..route(path, Method::GET, handler)
    }
}

/// Every route of the API.
pub fn routes() -> Vec<Route> {
    vec![
        probe_route("/livez", get(probes::livez)),
        probe_route("/readyz", get(probes::readyz)),
        probe_route("/metrics", get(probes::metrics)),
        route("/openapi.yaml", Method::GET, get(probes::openapi)),
        route("/ui", Method::GET, get(ui::page)),
        route("/pools", Method::GET, get(pools::list_pools)),
        route("/pools/{pool}", Method::PUT, put(pools::put_pool)),
        route("/pools/{pool}", Method::GET, get(pools::get_pool)),
        route("/pools/{pool}", Method::DELETE, delete(pools::delete_pool)),
        route("/pools/{pool}/assign", Method::POST, post(assign::assign)),
        route(
            "/pools/{pool}/outcomes",
            Method::POST,
            post(outcomes::report_outcomes),
        ),
        route(
            "/pools/{pool}/leases/{lease}/release",
            Method::POST,
            post(leases::release),
        ),
        route(
            "/pools/{pool}/leases/{lease}/renew",
            Method::POST,
            post(leases::renew),
        ),
        route(
            "/pools/{pool}/members",
            Method::POST,
            post(members::add_members),
        ),
        route(
            "/pools/{pool}/members",
            Method::GET,
            get(members::list_members),
        ),
        route(
            "/pools/{pool}/members/disable",
            Method::POST,
            post(members::disable_members),
        ),
        route(
            "/pools/{pool}/members/enable",
            Method::POST,
            post(members::enable_members),
        ),
        route(
            "/pools/{pool}/members/remove",
            Method::POST,
            post(members::remove_members),
        ),
        Route {
            takes_lists: true,
            ..route("/pools/{pool}/import", Method::POST, post(import::import))
        },
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
        takes_lists,
        ..
    } in routes
    {
        // Layers on the route run after the router-wide ones below, so this limit (and the
        // limit the 413 message names) replaces the small one for this route only.
        let handler = if takes_lists {
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
