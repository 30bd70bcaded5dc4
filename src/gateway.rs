//! The forward-proxy gateway (`GATEWAY_LISTEN`): an HTTP proxy port that picks a pool's
//! member for every request, dials it, reports the outcome and holds the lease exactly as
//! long as the request or tunnel, so that clients which take one proxy address (Scrapy,
//! browsers, curl, vendor tools) use a pool with no code of ours.
//!
//! - **Who and which pool.** `Proxy-Authorization: Basic` with the pool and its options as
//!   user name (the grammar is in [`user`]) and the worker token as password, or the token
//!   of a client that lists the pool (403 `pool_not_allowed` for another pool); 407 with
//!   `Proxy-Authenticate` otherwise. Without a worker token the gateway only starts on a
//!   loopback address (see `startup.rs`), where any password is taken.
//! - **What is dialled.** `CONNECT host:port` opens a tunnel through the member; an
//!   absolute-form `http://` request is forwarded through it (as an absolute-form request
//!   to an `http`/`https` proxy, in origin form through a SOCKS tunnel). The host is the
//!   assign's `target`, so per-site bans and pacing apply. The gateway only ever connects
//!   to the member's own proxy address ([`upstream`]); the client's `Proxy-Authorization`
//!   never reaches it, the member's own credentials do.
//! - **Outcomes and retries.** A refused connection, a timeout or a proxy's refusal before
//!   the tunnel is up (or before an `http://` response head arrives) is reported `failed`
//!   through the same store operation as `POST /pools/{pool}/outcomes`, and the next
//!   member not tried yet is tried, up to the pool's `gateway.attempts` (else
//!   `GATEWAY_ATTEMPTS`) members. On plain HTTP the request's body is kept (up to
//!   `GATEWAY_RETRY_BODY_MAX`) so that it can be sent again, and the pool's retry rules
//!   (listed statuses, block patterns; see `forward.rs`) make a block go to another member
//!   too. A 403 or 429 (or a block) is `blocked` with the target (a ban for that site
//!   only); anything else is `ok`.
//! - **Answers of its own**, in the API's error shape: 407 `proxy_auth_required`, 400
//!   `invalid_request` (a malformed user name or request), 404 `pool_not_found`, 503
//!   `no_eligible_proxy` with `Retry-After` and `x-proxy-allocator: no-eligible-proxy`
//!   (the API's 204), 502 `upstream_failed` when every attempt failed, 502
//!   `member_not_a_proxy` / `private_address` when the pool holds members the gateway must
//!   not dial (logged once per pool), 503 `store_unavailable`.

mod forward;
mod relay;
pub mod socks;
pub mod status;
pub mod upstream;
pub mod user;

use std::collections::{HashMap, HashSet};
use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use base64::Engine;
use bytes::Bytes;
use http_body_util::BodyExt;
use http_body_util::combinators::UnsyncBoxBody;
use hyper::body::Incoming;
use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use subtle::ConstantTimeEq;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{Notify, watch};
use tokio::time::Instant;

use crate::domain::{Exclude, GatewayRules, MemberId, OutcomeResult, PoolId, Scheme, Target};
use crate::monitoring::{OTHER_POOL, PoolSnapshot};
use crate::store::{
    AssignRequest, Assignment, Lease, Report, ReportSource, SessionRequest, Store, StoreError,
};
use crate::tickets::{Ticketed, Tickets};

use self::forward::{Forward, Outgoing};
use self::status::Tried;
use self::upstream::{Connection, DialError, DialFailure, Dialer, FailureKind, Upstream};
use self::user::Selection;

/// How the gateway dials and retries (from `GATEWAY_*` options).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    /// Most members one request tries.
    pub attempts: u32,
    /// Longest a member may take to connect and complete its handshake (a target's answer
    /// through it then has the pool's `gateway.response_timeout_ms` to start).
    pub connect_timeout: Duration,
    /// Longest a tunnel may pass no byte before it is closed.
    pub idle_timeout: Duration,
    /// Largest request body kept to be sent again on a retry; a larger one is streamed and
    /// never retried.
    pub retry_body_max: usize,
}

/// The body of every gateway answer.
pub type GatewayBody = UnsyncBoxBody<Bytes, Box<dyn std::error::Error + Send + Sync>>;

/// The header that tells a gateway answer of its own from an upstream's.
pub const MARKER: HeaderName = HeaderName::from_static("x-proxy-allocator");

/// How long a pool's private-address rule is taken from memory before it is read again.
const RULES_FRESH: Duration = Duration::from_secs(1);

/// Most pools whose rule is kept in memory, and whose misconfiguration is remembered as
/// logged; beyond it the memory is cleared (and a misconfiguration may be logged again).
const MAX_REMEMBERED_POOLS: usize = 10_000;

/// The gateway: the store, the worker token and the dialer, shared by every connection.
/// Cloning is shallow.
#[derive(Clone)]
pub struct Gateway {
    inner: Arc<Inner>,
}

struct Inner {
    store: Arc<dyn Store>,
    token: Option<String>,
    settings: Settings,
    dialer: Dialer,
    snapshot: PoolSnapshot,
    tunnels: Tunnels,
    tickets: Tickets,
    /// Each pool's routing (`rules.allow_private` and its gateway rules) and when it was
    /// read.
    routes: Mutex<HashMap<PoolId, (Instant, Route)>>,
    /// Pools whose misconfiguration has been logged.
    misconfigured: Mutex<HashSet<PoolId>>,
}

/// A refusal the gateway answers itself.
#[derive(Debug, thiserror::Error)]
enum Refusal {
    #[error("proxy authentication required: the pool as user name, the worker token as password")]
    Unauthenticated,
    #[error("{0}")]
    Invalid(String),
    #[error("pool not found")]
    PoolNotFound,
    #[error("this client's token is not for this pool")]
    PoolNotAllowed,
    #[error("the pool has no eligible member for this request")]
    NoEligible { next_return: Option<Duration> },
    #[error("{attempts} member(s) tried, none could be reached")]
    UpstreamFailed { attempts: u32, last: DialFailure },
    #[error("the pool's member is not a proxy address the gateway can dial")]
    NotAProxy,
    #[error(
        "the pool's member has a non-public address and the pool does not allow private addresses"
    )]
    PrivateAddress,
    #[error("the store is unavailable; retry shortly")]
    Store,
    #[error("the pool holds the most live sessions it keeps; retry once some have ended")]
    TooManySessions,
}

impl Refusal {
    fn status(&self) -> StatusCode {
        match self {
            Self::Unauthenticated => StatusCode::PROXY_AUTHENTICATION_REQUIRED,
            Self::Invalid(_) => StatusCode::BAD_REQUEST,
            Self::PoolNotFound => StatusCode::NOT_FOUND,
            Self::PoolNotAllowed => StatusCode::FORBIDDEN,
            Self::NoEligible { .. } | Self::Store | Self::TooManySessions => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            Self::UpstreamFailed { .. } | Self::NotAProxy | Self::PrivateAddress => {
                StatusCode::BAD_GATEWAY
            }
        }
    }

    fn code(&self) -> &'static str {
        match self {
            Self::Unauthenticated => "proxy_auth_required",
            Self::Invalid(_) => "invalid_request",
            Self::PoolNotFound => "pool_not_found",
            Self::PoolNotAllowed => "pool_not_allowed",
            Self::NoEligible { .. } => "no_eligible_proxy",
            Self::UpstreamFailed { .. } => "upstream_failed",
            Self::NotAProxy => "member_not_a_proxy",
            Self::PrivateAddress => "private_address",
            Self::Store => "store_unavailable",
            Self::TooManySessions => "too_many_sessions",
        }
    }

    /// The RFC 9209 error type and details of this refusal, for `Proxy-Status`.
    fn proxy_status(&self) -> (&'static str, String) {
        let error = match self {
            Self::Unauthenticated | Self::PoolNotAllowed | Self::TooManySessions => {
                "http_request_denied"
            }
            Self::Invalid(_) | Self::PoolNotFound => "http_request_error",
            Self::NoEligible { .. } => "destination_unavailable",
            Self::UpstreamFailed { last, .. } => {
                return (
                    last.kind.proxy_status_error(),
                    format!("{self}; the last: {}", last.message),
                );
            }
            Self::NotAProxy | Self::PrivateAddress => "proxy_configuration_error",
            Self::Store => "proxy_internal_error",
        };
        (error, self.to_string())
    }

    /// The answer, with what `tried` says of the members tried.
    fn response(&self, tried: &Tried) -> Response<GatewayBody> {
        let body = crate::http::error::error_body(self.code(), &self.to_string()).to_string();
        let mut response = Response::new(full(body));
        *response.status_mut() = self.status();
        let headers = response.headers_mut();
        let (error, details) = self.proxy_status();
        status::failed(headers, error, &details);
        tried.write(headers);
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        headers.insert(MARKER, HeaderValue::from_static(self.code_marker()));
        match self {
            Self::Unauthenticated => {
                headers.insert(
                    header::PROXY_AUTHENTICATE,
                    HeaderValue::from_static("Basic realm=\"proxy-allocator\""),
                );
            }
            Self::NoEligible { next_return } => {
                let seconds = next_return.map_or(1, |wait| {
                    u64::try_from(wait.as_millis())
                        .unwrap_or(u64::MAX)
                        .div_ceil(1000)
                        .max(1)
                });
                headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds));
            }
            Self::Store | Self::TooManySessions => {
                headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            }
            _ => {}
        }
        response
    }

    /// The marker header's value: the code with dashes, as headers are usually written.
    fn code_marker(&self) -> &'static str {
        match self {
            Self::Unauthenticated => "proxy-auth-required",
            Self::Invalid(_) => "invalid-request",
            Self::PoolNotFound => "pool-not-found",
            Self::PoolNotAllowed => "pool-not-allowed",
            Self::NoEligible { .. } => "no-eligible-proxy",
            Self::UpstreamFailed { .. } => "upstream-failed",
            Self::NotAProxy => "member-not-a-proxy",
            Self::PrivateAddress => "private-address",
            Self::Store => "store-unavailable",
            Self::TooManySessions => "too-many-sessions",
        }
    }
}

impl From<StoreError> for Refusal {
    fn from(error: StoreError) -> Self {
        match error {
            StoreError::PoolNotFound => Self::PoolNotFound,
            StoreError::TooManySessions => Self::TooManySessions,
            StoreError::FilterTooCostly => Self::Invalid(format!(
                "the label filter would check more than {} members; filter on one key",
                crate::store::MAX_LABEL_CHECKS
            )),
            other => {
                tracing::warn!(error = %other, "gateway: store operation failed");
                Self::Store
            }
        }
    }
}

fn full(text: impl Into<Bytes>) -> GatewayBody {
    http_body_util::Full::new(text.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}

fn empty() -> GatewayBody {
    full(Bytes::new())
}

/// Where a request goes: a tunnel, or one `http://` request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Tunnel,
    Forward,
}

/// Headers that belong to one hop and are never passed on.
const HOP_BY_HOP: [HeaderName; 6] = [
    header::CONNECTION,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::UPGRADE,
    HeaderName::from_static("proxy-connection"),
];

impl Gateway {
    /// A gateway over `store` dialling with `dialer`; `token` is the worker token (none: any
    /// password is taken, which startup only allows on loopback).
    pub fn new(
        store: Arc<dyn Store>,
        token: Option<String>,
        settings: Settings,
        snapshot: PoolSnapshot,
        dialer: Dialer,
        tickets: Tickets,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                store,
                token,
                settings,
                dialer,
                snapshot,
                tunnels: Tunnels::default(),
                tickets,
                routes: Mutex::new(HashMap::new()),
                misconfigured: Mutex::new(HashSet::new()),
            }),
        }
    }

    /// The open tunnels, which shutdown drains.
    pub fn tunnels(&self) -> &Tunnels {
        &self.inner.tunnels
    }

    /// Answers one proxy request.
    ///
    /// # Errors
    /// Never: every failure is an answer.
    pub async fn handle(
        self,
        request: Request<Incoming>,
    ) -> Result<Response<GatewayBody>, Infallible> {
        let mut label = OTHER_POOL.to_owned();
        let mut tried = Tried::default();
        let (outcome, response) = match self.serve(request, &mut label, &mut tried).await {
            Ok((outcome, mut response)) => {
                tried.write(response.headers_mut());
                (outcome, response)
            }
            Err(refusal) => (refusal.code(), refusal.response(&tried)),
        };
        metrics::counter!("pa_gateway_requests_total", "listener" => "http", "pool" => label, "outcome" => outcome)
            .increment(1);
        Ok(response)
    }

    async fn serve(
        &self,
        mut request: Request<Incoming>,
        label: &mut String,
        tried: &mut Tried,
    ) -> Result<(&'static str, Response<GatewayBody>), Refusal> {
        let (user, password) = self.credentials(request.headers())?;
        let selection = Selection::parse(&user);
        // A password that is not the worker token may be a client's, which needs the pool:
        // with a user name that names none, it is refused as wrong credentials.
        match &selection {
            Ok(selection) => self.admit(&password, &selection.pool).await?,
            Err(_) if self.password_is_right(&password) => {}
            Err(_) => return Err(Refusal::Unauthenticated),
        }
        // The right credentials end the connection's short unauthenticated deadline.
        if let Some(connection) = request
            .extensions()
            .get::<crate::connections::Unauthenticated>()
        {
            connection.authenticated();
        }
        let selection = selection.map_err(|e| Refusal::Invalid(e.to_string()))?;
        let (kind, host, port) = destination(&request)?;
        let mut attempts = self.attempts(selection, kind, &host, port, label).await?;
        let mut upgrade = (kind == Kind::Tunnel).then(|| hyper::upgrade::on(&mut request));
        let mut outgoing = match kind {
            Kind::Forward => {
                Some(Outgoing::read(request, self.inner.settings.retry_body_max).await)
            }
            Kind::Tunnel => None,
        };
        // A block's answer, kept while another member is tried: passed on if none can be.
        let mut blocked: Option<Response<GatewayBody>> = None;
        for attempt in 1..=attempts.most {
            let (held, upstream, connection) = match attempts.next(tried).await? {
                Attempt::Dialled(dialled) => *dialled,
                Attempt::DialFailed => continue,
                Attempt::Exhausted(next_return) => {
                    return match blocked {
                        Some(answer) => Ok(("forwarded", answer)),
                        None => Err(attempts.give_up(tried, next_return)),
                    };
                }
            };
            if let Some(upgrade) = upgrade.take() {
                return Ok(("tunnel", held.tunnel(upgrade, connection)));
            }
            let Some(outgoing) = outgoing.as_mut() else {
                // Each kind keeps what it needs: a tunnel its upgrade, a forward its request.
                return Err(Refusal::Store);
            };
            let member = held.member.clone();
            let may_retry = attempt < attempts.most && outgoing.replayable();
            let rules = Arc::clone(&attempts.route.rules);
            let forwarded = held
                .forward(
                    outgoing, upstream, connection, &host, port, &rules, may_retry,
                )
                .await;
            match forwarded {
                Forward::Answered(answer) => return Ok(("forwarded", answer)),
                Forward::Blocked(answer) => blocked = Some(answer),
                Forward::Failed(failure) => attempts.last_failure = Some(failure),
            }
            // The request went to this member: sent again only when its body was kept.
            if !outgoing.replayable() {
                break;
            }
            attempts.assign.exclude.insert(member);
        }
        match blocked {
            Some(answer) => Ok(("forwarded", answer)),
            None => Err(attempts.give_up(tried, None)),
        }
    }

    /// The tries of one request to `host:port` in the pool `selection` names (whose metric
    /// label goes into `label`).
    async fn attempts<'a>(
        &self,
        selection: Selection,
        kind: Kind,
        host: &'a str,
        port: u16,
        label: &mut String,
    ) -> Result<Attempts<'a>, Refusal> {
        let target = Target::parse("target", host).map_err(|e| Refusal::Invalid(e.to_string()))?;
        let pool = selection.pool.clone();
        let route = self.route(&pool).await?;
        *label = self.inner.snapshot.label(&pool, true).to_owned();
        Ok(Attempts {
            gateway: self.clone(),
            most: route.rules.attempts.unwrap_or(self.inner.settings.attempts),
            assign: AssignRequest {
                ttl: selection.ttl,
                labels: selection.labels,
                target: Some(target.clone()),
                exclude: Exclude::default(),
                // The gateways do not apply a client's rate limit yet (see workers.md).
                rate: None,
            },
            session: selection.session,
            pool,
            target,
            route,
            kind,
            host,
            port,
            last_failure: None,
        })
    }

    /// The user name and the password of a request's `Proxy-Authorization`.
    fn credentials(&self, headers: &HeaderMap) -> Result<(String, Vec<u8>), Refusal> {
        let value = headers
            .get(header::PROXY_AUTHORIZATION)
            .ok_or(Refusal::Unauthenticated)?
            .as_bytes();
        let encoded = value
            .get(..6)
            .filter(|scheme| scheme.eq_ignore_ascii_case(b"basic "))
            .and_then(|_| value.get(6..))
            .ok_or(Refusal::Unauthenticated)?;
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(encoded.trim_ascii())
            .map_err(|_| Refusal::Unauthenticated)?;
        let colon = decoded
            .iter()
            .position(|b| *b == b':')
            .ok_or(Refusal::Unauthenticated)?;
        let (user, password) = (&decoded[..colon], &decoded[colon + 1..]);
        let Ok(user) = String::from_utf8(user.to_vec()) else {
            return Err(if self.password_is_right(password) {
                Refusal::Invalid("proxy user name: not UTF-8".to_owned())
            } else {
                Refusal::Unauthenticated
            });
        };
        Ok((user, password.to_vec()))
    }

    /// Whether `password` opens `pool`: the worker token opens every pool (any password
    /// does without one), a client's token the pools its client lists (`PoolNotAllowed`
    /// for another), anything else none (`Unauthenticated`). A client token costs one
    /// store call, its lookup by hash.
    async fn admit(&self, password: &[u8], pool: &PoolId) -> Result<(), Refusal> {
        if self.password_is_right(password) {
            return Ok(());
        }
        match self
            .inner
            .store
            .client_by_token(crate::domain::TokenHash::of(password))
            .await?
        {
            Some(client) if client.config.allows(pool) => Ok(()),
            Some(_) => Err(Refusal::PoolNotAllowed),
            None => Err(Refusal::Unauthenticated),
        }
    }

    /// Whether `password` is the worker token (any password is, without one: startup only
    /// allows that on loopback).
    fn password_is_right(&self, password: &[u8]) -> bool {
        self.inner.token.as_ref().is_none_or(|token| {
            // The length of a token is not secret; its bytes are compared in constant time.
            password.len() == token.len() && bool::from(password.ct_eq(token.as_bytes()))
        })
    }

    /// The pool's routing, read from the store at most once a second; its patterns are
    /// compiled again only when its gateway rules changed.
    async fn route(&self, pool: &PoolId) -> Result<Route, Refusal> {
        let now = Instant::now();
        let known = {
            let routes = self
                .inner
                .routes
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            match routes.get(pool) {
                Some((read, route)) if now.duration_since(*read) < RULES_FRESH => {
                    return Ok(route.clone());
                }
                Some((_, route)) => Some(route.clone()),
                None => None,
            }
        };
        let info = self.inner.store.pool(pool).await?;
        let gateway = info.config.gateway;
        let route = match known {
            Some(route) if route.source == gateway => Route {
                allow_private: info.config.rules.allow_private,
                ..route
            },
            _ => Route {
                allow_private: info.config.rules.allow_private,
                rules: Arc::new(forward::Rules::of(gateway.as_ref())),
                source: gateway,
            },
        };
        let mut routes = self
            .inner
            .routes
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if routes.len() >= MAX_REMEMBERED_POOLS {
            routes.clear();
        }
        routes.insert(pool.clone(), (now, route.clone()));
        Ok(route)
    }

    /// Logs, once per pool, that it holds a member the gateway must not dial.
    fn misconfigured(&self, pool: &PoolId, member: &MemberId, what: &str) {
        let mut logged = self
            .inner
            .misconfigured
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if logged.len() >= MAX_REMEMBERED_POOLS {
            logged.clear();
        }
        if logged.insert(pool.clone()) {
            tracing::warn!(
                pool = pool.as_str(),
                proxy = %member.masked(),
                "gateway: the pool's member {what}, so the gateway cannot dial it; give the \
                 gateway a pool of proxy addresses (or allow private addresses in its rules)"
            );
        }
    }

    /// Reports a failed attempt of a `kind` of request and gives its lease back.
    async fn failed(
        &self,
        pool: &PoolId,
        member: &MemberId,
        kind: Kind,
        why: &str,
        hold: Option<LeaseHold>,
    ) {
        // One message per kind: a forward fails before its response head, which may come
        // after the connection is up, a tunnel before it is up.
        match kind {
            Kind::Tunnel => tracing::info!(
                pool = pool.as_str(),
                proxy = %member.masked(),
                kind = "tunnel",
                error = why,
                "gateway: tunnel failed before it was up; reported failed"
            ),
            Kind::Forward => tracing::info!(
                pool = pool.as_str(),
                proxy = %member.masked(),
                kind = "forward",
                error = why,
                "gateway: forward failed before the response head; reported failed"
            ),
        }
        self.report(pool, member, OutcomeResult::Failed, None, None)
            .await;
        if let Some(hold) = hold {
            hold.release().await;
        }
    }

    async fn report(
        &self,
        pool: &PoolId,
        member: &MemberId,
        result: OutcomeResult,
        target: Option<Target>,
        latency_ms: Option<u64>,
    ) {
        let report = Report {
            member: member.clone(),
            result,
            detail: String::new(),
            latency_ms,
            target,
        };
        if let Err(error) = self
            .inner
            .store
            .report(pool, ReportSource::Worker, &[report])
            .await
        {
            tracing::warn!(pool = pool.as_str(), %error, "gateway: the outcome report failed");
        }
    }

    /// Reports `ok`, with the latency the gateway measured, without holding up the answer.
    fn report_ok(&self, pool: &PoolId, member: &MemberId, latency_ms: u64) {
        let (gateway, pool, member) = (self.clone(), pool.clone(), member.clone());
        tokio::spawn(async move {
            gateway
                .report(&pool, &member, OutcomeResult::Ok, None, Some(latency_ms))
                .await;
        });
    }
}

/// The kind, host and port a proxy request names.
fn destination(request: &Request<Incoming>) -> Result<(Kind, String, u16), Refusal> {
    let uri = request.uri();
    if request.method() == Method::CONNECT {
        let authority = uri
            .authority()
            .filter(|a| a.port_u16().is_some())
            .ok_or_else(|| Refusal::Invalid("CONNECT names host:port".to_owned()))?;
        let port = authority.port_u16().unwrap_or(443);
        return Ok((Kind::Tunnel, authority.host().to_owned(), port));
    }
    match (uri.scheme_str(), uri.authority()) {
        (Some("http"), Some(authority)) => Ok((
            Kind::Forward,
            authority.host().to_owned(),
            authority.port_u16().unwrap_or(80),
        )),
        (Some("https"), _) => Err(Refusal::Invalid(
            "https:// URLs go through a CONNECT tunnel; point the client's HTTPS proxy at the \
             gateway too"
                .to_owned(),
        )),
        _ => Err(Refusal::Invalid(
            "this port is a proxy: send absolute-form http:// requests or CONNECT host:port"
                .to_owned(),
        )),
    }
}

/// One request's tries of its pool's members: each attempt picks a member not tried yet
/// (the members tried before are excluded, so a retry never goes back to a member that just
/// failed, whose count may well still be the lowest) and dials it.
struct Attempts<'a> {
    gateway: Gateway,
    /// Most attempts: the pool's `gateway.attempts`, else `GATEWAY_ATTEMPTS`.
    most: u32,
    assign: AssignRequest,
    session: Option<SessionRequest>,
    pool: PoolId,
    target: Target,
    route: Route,
    kind: Kind,
    host: &'a str,
    port: u16,
    /// Why the last attempt that failed did.
    last_failure: Option<DialFailure>,
}

/// How one attempt ended.
enum Attempt {
    /// A member was picked and dialled (boxed: the other outcomes are a word or two).
    Dialled(Box<(Held, Upstream, Connection)>),
    /// The member picked could not be dialled (reported, and excluded from the next).
    DialFailed,
    /// No member is left to try; when one comes back by itself, in how long.
    Exhausted(Option<Duration>),
}

impl Attempts<'_> {
    /// Picks the next member and dials it.
    async fn next(&mut self, tried: &mut Tried) -> Result<Attempt, Refusal> {
        let gateway = &self.gateway;
        let store = &gateway.inner.store;
        let assignment = match &self.session {
            Some(session) => {
                store
                    .assign_in_session(&self.pool, &self.assign, session)
                    .await?
                    .assignment
            }
            None => store.assign(&self.pool, &self.assign).await?,
        };
        let (member, lease) = match assignment {
            Assignment::Assigned { member, .. } => (member, None),
            Assignment::Leased { member, lease, .. } => (member, Some(lease)),
            Assignment::Empty { next_return } => return Ok(Attempt::Exhausted(next_return)),
        };
        tried.attempt(&member);
        let hold = lease.map(|lease| LeaseHold::start(store, &self.pool, lease));
        let Some(upstream) = Upstream::parse(&member) else {
            gateway.misconfigured(&self.pool, &member, "is not a proxy address");
            return Err(Refusal::NotAProxy);
        };
        let allow_private = self.route.allow_private;
        let dialer = &gateway.inner.dialer;
        let dial = async {
            match (self.kind, upstream.scheme()) {
                (Kind::Forward, Scheme::Http | Scheme::Https) => {
                    dialer.connect_proxy(&upstream, allow_private).await
                }
                _ => {
                    dialer
                        .tunnel(&upstream, self.host, self.port, allow_private)
                        .await
                }
            }
        };
        let timeout = gateway.inner.settings.connect_timeout;
        // The member's latency is counted from here: the connection to it, then the
        // tunnel's setup or the time to the answer's first byte (see `Held::latency_ms`).
        let dialling = Instant::now();
        let failure = match tokio::time::timeout(timeout, dial).await {
            Ok(Ok(connection)) => {
                let held = Held {
                    gateway: gateway.clone(),
                    pool: self.pool.clone(),
                    member,
                    target: self.target.clone(),
                    hold,
                    started: dialling,
                };
                return Ok(Attempt::Dialled(Box::new((held, upstream, connection))));
            }
            Ok(Err(DialError::PrivateAddress)) => {
                gateway.misconfigured(&self.pool, &member, "has a non-public address");
                return Err(Refusal::PrivateAddress);
            }
            Ok(Err(DialError::Failed(failure))) => failure,
            Err(_) => DialFailure::new(
                FailureKind::TimedOut,
                "the proxy did not complete its handshake in time",
            ),
        };
        gateway
            .failed(&self.pool, &member, self.kind, &failure.message, hold)
            .await;
        self.last_failure = Some(failure);
        self.assign.exclude.insert(member);
        Ok(Attempt::DialFailed)
    }

    /// Why the request could not be served: every attempt failed, or nothing was eligible.
    fn give_up(self, tried: &Tried, next_return: Option<Duration>) -> Refusal {
        match self.last_failure {
            Some(last) => Refusal::UpstreamFailed {
                attempts: tried.attempts,
                last,
            },
            None => Refusal::NoEligible { next_return },
        }
    }
}

/// How the gateway routes a pool's requests, as last read.
#[derive(Debug, Clone)]
struct Route {
    /// `rules.allow_private`.
    allow_private: bool,
    /// The pool's gateway rules, compiled.
    rules: Arc<forward::Rules>,
    /// The gateway rules as configured, to tell whether they changed.
    source: Option<GatewayRules>,
}

/// A member picked and dialled for one request: what its end needs.
struct Held {
    gateway: Gateway,
    pool: PoolId,
    member: MemberId,
    target: Target,
    hold: Option<LeaseHold>,
    /// When the gateway started dialling the member.
    started: Instant,
}

impl Held {
    /// The member's latency for this request, so far: from the start of the dial to now
    /// (a tunnel's setup, or a forward's first byte of the answer), in whole
    /// milliseconds, at most the longest a report may carry.
    fn latency_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis())
            .unwrap_or(u64::MAX)
            .min(crate::rules::quality::MAX_LATENCY_MS)
    }

    /// Answers 200 and relays the tunnel once the client's connection is handed over.
    fn tunnel(
        self,
        upgrade: hyper::upgrade::OnUpgrade,
        connection: Connection,
    ) -> Response<GatewayBody> {
        let ticket = self.gateway.inner.tickets.issue(Ticketed {
            pool: self.pool.clone(),
            member: self.member.clone(),
            target: self.target.clone(),
        });
        let closing_ticket = ticket.clone();
        let client = async move { upgrade.await.ok().map(TokioIo::new) };
        self.relay(client, connection, Some(closing_ticket), "http");
        let mut response = Response::new(empty());
        status::served(response.headers_mut(), None);
        // Hex digits only: always a header value.
        if let Ok(value) = HeaderValue::from_str(&ticket) {
            response.headers_mut().insert(status::TICKET, value);
        }
        response
    }

    /// Reports the tunnel `ok` and relays it, in a task, between the client (once `client`
    /// hands it over) and the member; when it ends, logs it, gives the lease back and starts
    /// its ticket's ttl. `listener` names the gateway port it came through.
    fn relay<C>(
        self,
        client: impl Future<Output = Option<C>> + Send + 'static,
        connection: Connection,
        ticket: Option<String>,
        listener: &'static str,
    ) where
        C: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        self.gateway
            .report_ok(&self.pool, &self.member, self.latency_ms());
        let entered = self.gateway.inner.tunnels.enter();
        let idle = self.gateway.inner.settings.idle_timeout;
        // Boxed, as a connection's future is (see `connections.rs`).
        tokio::spawn(Box::pin(async move {
            let relayed = match client.await {
                Some(client) => relay::relay(client, connection, idle, entered.closing()).await,
                None => relay::Relayed::default(),
            };
            let bytes = entered.set.bytes(listener);
            bytes.sent.increment(relayed.sent);
            bytes.received.increment(relayed.received);
            tracing::info!(
                listener,
                pool = self.pool.as_str(),
                proxy = %self.member.masked(),
                target = self.target.as_str(),
                sent = relayed.sent,
                received = relayed.received,
                duration_ms = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX),
                ended = relayed.ended,
                "gateway tunnel closed"
            );
            if let Some(hold) = self.hold {
                hold.release().await;
            }
            if let Some(ticket) = ticket {
                self.gateway.inner.tickets.close(&ticket);
            }
            drop(entered);
        }));
    }
}

/// A lease held for as long as a request or tunnel is open: renewed at a third of its ttl,
/// released when it ends (or, if dropped without [`LeaseHold::release`], in a task).
struct LeaseHold {
    store: Arc<dyn Store>,
    pool: PoolId,
    lease: Option<Lease>,
    renewing: tokio::task::JoinHandle<()>,
}

impl LeaseHold {
    fn start(store: &Arc<dyn Store>, pool: &PoolId, lease: Lease) -> Self {
        let every =
            Duration::from_millis(lease.ttl_ms.as_millis() / 3).max(Duration::from_millis(50));
        let renewing = {
            let (store, pool, id, ttl) = (
                Arc::clone(store),
                pool.clone(),
                lease.id.clone(),
                lease.ttl_ms,
            );
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(every).await;
                    match store.renew(&pool, &id, Some(ttl)).await {
                        Ok(_) => {}
                        Err(StoreError::LeaseNotFound) => return,
                        Err(error) => {
                            tracing::warn!(pool = pool.as_str(), %error, "gateway: renewing a lease failed");
                        }
                    }
                }
            })
        };
        Self {
            store: Arc::clone(store),
            pool: pool.clone(),
            lease: Some(lease),
            renewing,
        }
    }

    /// Stops renewing and releases the lease.
    async fn release(mut self) {
        self.renewing.abort();
        if let Some(lease) = self.lease.take() {
            release(&*self.store, &self.pool, &lease).await;
        }
    }
}

async fn release(store: &dyn Store, pool: &PoolId, lease: &Lease) {
    match store.release(pool, &lease.id).await {
        Ok(()) | Err(StoreError::LeaseNotFound) => {}
        Err(error) => {
            tracing::warn!(pool = pool.as_str(), %error, "gateway: releasing a lease failed; it expires by itself");
        }
    }
}

impl Drop for LeaseHold {
    fn drop(&mut self) {
        self.renewing.abort();
        if let (Some(lease), Ok(runtime)) =
            (self.lease.take(), tokio::runtime::Handle::try_current())
        {
            let (store, pool) = (Arc::clone(&self.store), self.pool.clone());
            runtime.spawn(async move { release(&*store, &pool, &lease).await });
        }
    }
}

/// The open tunnels: counted for the metrics and for shutdown, which waits for them and
/// then closes those still open. Cloning is shallow.
#[derive(Clone)]
pub struct Tunnels {
    inner: Arc<TunnelSet>,
}

struct TunnelSet {
    open: AtomicUsize,
    ended: Notify,
    closing: watch::Sender<bool>,
    /// The metrics every tunnel touches, registered once rather than looked up by name
    /// and labels per tunnel.
    open_gauge: metrics::Gauge,
    http_bytes: ByteCounters,
    socks5_bytes: ByteCounters,
}

impl TunnelSet {
    /// The byte counters of the port called `listener`.
    fn bytes(&self, listener: &'static str) -> &ByteCounters {
        if listener == "socks5" {
            &self.socks5_bytes
        } else {
            &self.http_bytes
        }
    }
}

/// `pa_gateway_bytes_total` of one gateway port, both directions.
struct ByteCounters {
    sent: metrics::Counter,
    received: metrics::Counter,
}

impl ByteCounters {
    fn of(listener: &'static str) -> Self {
        Self {
            sent: metrics::counter!("pa_gateway_bytes_total", "listener" => listener, "direction" => "sent"),
            received: metrics::counter!("pa_gateway_bytes_total", "listener" => listener, "direction" => "received"),
        }
    }
}

impl Default for Tunnels {
    fn default() -> Self {
        // The handles go to the recorder only once it is installed.
        crate::monitoring::prometheus();
        Self {
            inner: Arc::new(TunnelSet {
                open: AtomicUsize::new(0),
                ended: Notify::new(),
                closing: watch::channel(false).0,
                open_gauge: metrics::gauge!("pa_gateway_tunnels_open"),
                http_bytes: ByteCounters::of("http"),
                socks5_bytes: ByteCounters::of("socks5"),
            }),
        }
    }
}

impl Tunnels {
    fn enter(&self) -> Entered {
        self.inner.open.fetch_add(1, Ordering::AcqRel);
        self.inner.open_gauge.increment(1.0);
        Entered {
            set: Arc::clone(&self.inner),
        }
    }

    /// Tunnels open now.
    pub fn open(&self) -> usize {
        self.inner.open.load(Ordering::Acquire)
    }

    /// Completes once no tunnel is open.
    pub async fn drained(&self) {
        loop {
            let ended = self.inner.ended.notified();
            let mut ended = std::pin::pin!(ended);
            ended.as_mut().enable();
            if self.open() == 0 {
                return;
            }
            ended.await;
        }
    }

    /// Closes every open tunnel (their leases are released as they end).
    pub fn close_all(&self) {
        self.inner.closing.send_replace(true);
    }
}

/// One open tunnel's place in [`Tunnels`].
struct Entered {
    set: Arc<TunnelSet>,
}

impl Entered {
    fn closing(&self) -> watch::Receiver<bool> {
        self.set.closing.subscribe()
    }
}

impl Drop for Entered {
    fn drop(&mut self) {
        self.set.open.fetch_sub(1, Ordering::AcqRel);
        self.set.open_gauge.decrement(1.0);
        self.set.ended.notify_waiters();
    }
}
