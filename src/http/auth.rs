//! Bearer-token checks for admin and worker routes.
//!
//! Admin routes need the admin token. Worker routes (assign, lease release and renewal, and
//! outcome reports) need the worker token when one is configured; the admin token is accepted there
//! too, and so is a client's token (`PUT /clients/{client}`) on the pools its client lists
//! (403 `pool_not_allowed` on another). Tokens are compared in constant time and are only
//! accepted in the `Authorization` header, never in a query string, where they would end
//! up in access logs. A client token is looked up by its SHA-256, which is all the store
//! keeps of it.

use axum::extract::{FromRequestParts, RawPathParams};
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;
use subtle::ConstantTimeEq;

use super::AppState;
use super::error::ApiError;
use crate::domain::{PoolId, TokenHash};
use crate::store::{ClientLimit, ClientRecord};

/// The configured tokens.
#[derive(Clone)]
pub struct Tokens {
    admin: String,
    worker: Option<String>,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokens").finish_non_exhaustive()
    }
}

impl Tokens {
    /// Tokens for admin routes and, when given, for worker routes.
    pub fn new(admin: String, worker: Option<String>) -> Self {
        Self { admin, worker }
    }
}

fn same(given: &[u8], expected: &str) -> bool {
    // The length of a token is not secret; its bytes are compared in constant time.
    given.len() == expected.len() && bool::from(given.ct_eq(expected.as_bytes()))
}

fn bearer(parts: &Parts) -> Option<&[u8]> {
    let value = parts.headers.get(AUTHORIZATION)?.as_bytes();
    let scheme = value.get(..7)?;
    scheme
        .eq_ignore_ascii_case(b"bearer ")
        .then(|| value[7..].trim_ascii())
}

/// Proof that the request carries the admin token.
#[derive(Debug, Clone, Copy)]
pub struct Admin;

impl FromRequestParts<AppState> for Admin {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let tokens = &state.tokens;
        match bearer(parts) {
            Some(given) if same(given, &tokens.admin) => Ok(Self),
            Some(given) if tokens.worker.as_deref().is_some_and(|w| same(given, w)) => {
                Err(ApiError::Forbidden)
            }
            _ => Err(ApiError::Unauthorized),
        }
    }
}

/// Proof that the request may use worker routes, on the pool it names: with the worker or
/// the admin token (or on an open service), or with the token of a client that lists the
/// pool, whose record it then holds.
#[derive(Debug, Clone)]
pub struct Worker {
    /// The client whose token the request carries; `None` for the worker and admin tokens.
    pub client: Option<ClientRecord>,
}

impl Worker {
    /// The client's rate limit, for the store to apply in the assign's own step; `None`
    /// without a client or when it has no rate.
    pub fn limit(&self) -> Option<ClientLimit> {
        let client = self.client.as_ref()?;
        Some(ClientLimit {
            client: client.id.clone(),
            rate: client.config.rate?,
        })
    }
}

impl FromRequestParts<AppState> for Worker {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let tokens = &state.tokens;
        let Some(worker) = tokens.worker.as_deref() else {
            return Ok(Self { client: None });
        };
        let Some(given) = bearer(parts) else {
            return Err(ApiError::Unauthorized);
        };
        if same(given, worker) || same(given, &tokens.admin) {
            return Ok(Self { client: None });
        }
        let Some(client) = state.store.client_by_token(TokenHash::of(given)).await? else {
            return Err(ApiError::Unauthorized);
        };
        // Every worker route names its pool; the router has matched it already.
        let params = RawPathParams::from_request_parts(parts, state)
            .await
            .map_err(|_| ApiError::Unauthorized)?;
        let pool = params
            .iter()
            .find_map(|(name, value)| (name == "pool").then_some(value));
        match pool.map(PoolId::parse) {
            Some(Ok(pool)) if client.config.allows(&pool) => Ok(Self {
                client: Some(client),
            }),
            Some(Ok(_)) => Err(ApiError::PoolNotAllowed),
            Some(Err(e)) => Err(ApiError::InvalidPoolId(e)),
            None => Err(ApiError::PoolNotAllowed),
        }
    }
}
