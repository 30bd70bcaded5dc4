//! Bearer-token checks for admin and worker routes.
//!
//! Admin routes need the admin token. Worker routes (assign, lease release and renewal, and
//! outcome reports) need the worker token when one is configured; the admin token is accepted there
//! too. Tokens are compared in constant time and are only accepted in the `Authorization`
//! header, never in a query string, where they would end up in access logs.

use axum::extract::FromRequestParts;
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;
use subtle::ConstantTimeEq;

use super::AppState;
use super::error::ApiError;

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

/// Proof that the request may use worker routes.
#[derive(Debug, Clone, Copy)]
pub struct Worker;

impl FromRequestParts<AppState> for Worker {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let tokens = &state.tokens;
        let Some(worker) = tokens.worker.as_deref() else {
            return Ok(Self);
        };
        match bearer(parts) {
            Some(given) if same(given, worker) || same(given, &tokens.admin) => Ok(Self),
            _ => Err(ApiError::Unauthorized),
        }
    }
}
