//! `ApiError`: every error the API returns, each with one status and one stable code.
//!
//! Every error response has the same body, `{"error": {"code": "<snake_case>", "message":
//! "<human text>"}}`. The message never carries internal details (Redis error text, file
//! paths): those travel to the request log line through the response's extensions, so a
//! failure is logged once, where the request ends.

use std::time::Duration;

use crate::store::StoreError;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

/// An error answer of the API.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// 400 `invalid_pool_id`: the pool id in the path is not a valid id.
    #[error("{0}")]
    InvalidPoolId(#[from] crate::domain::InvalidPoolId),
    /// 400 `invalid_client_id`: the client id in the path is not a valid id.
    #[error("{0}")]
    InvalidClientId(#[from] crate::domain::InvalidClientId),
    /// 400 `invalid_json`: the body is not JSON of the expected shape.
    #[error("{0}")]
    InvalidJson(String),
    /// 400 `invalid_query`: a query parameter is malformed.
    #[error("{0}")]
    InvalidQuery(String),
    /// 400 `invalid_request`: a field has a value outside its documented range.
    #[error("{0}")]
    InvalidRequest(String),
    /// 400 `too_many_members`: more members in one call than allowed.
    #[error("at most {0} members per call")]
    TooManyMembers(usize),
    /// 401 `unauthorized`: no valid token.
    #[error("a valid bearer token is required")]
    Unauthorized,
    /// 403 `forbidden`: a valid token without the right to this route.
    #[error("this route needs the admin token")]
    Forbidden,
    /// 403 `pool_not_allowed`: a client token used on a pool its client does not list.
    #[error("this client's token is not for this pool")]
    PoolNotAllowed,
    /// 404 `pool_not_found`.
    #[error("pool not found")]
    PoolNotFound,
    /// 404 `client_not_found`.
    #[error("client not found")]
    ClientNotFound,
    /// 404 `lease_not_found`: no such live lease in the pool (never issued, already
    /// released, expired, or ended with its member).
    #[error("no such live lease in this pool")]
    LeaseNotFound,
    /// 404 `session_not_found`: no such live session in the pool (never started, ended, or
    /// expired).
    #[error("no such live session in this pool")]
    SessionNotFound,
    /// 404 `not_found`: no such route.
    #[error("no such route")]
    RouteNotFound,
    /// 405 `method_not_allowed`.
    #[error("method not allowed on this route")]
    MethodNotAllowed,
    /// 409 `policy_change_requires_empty_pool`: the pool's policy can only change while it
    /// has no members.
    #[error("the policy of a pool can only change while it has no members; remove them first")]
    PolicyChangeRequiresEmptyPool,
    /// 409 `too_many_sessions`: the assign would start a session in a pool that holds the
    /// most live sessions it keeps; nothing was handed out.
    #[error(
        "this pool holds {} live sessions, the most it keeps; end some, or assign without a new session",
        crate::domain::MAX_SESSIONS
    )]
    TooManySessions,
    /// 409 `too_many_clients`: the store keeps the most clients it may; nothing changed.
    #[error(
        "the store keeps {} clients, the most it may; delete some first",
        crate::domain::MAX_CLIENTS
    )]
    TooManyClients,
    /// 429 `client_rate_limited`, with `Retry-After` (whole seconds, rounded up, at least
    /// 1): the client token's bucket for this pool holds fewer tokens than the assign asks
    /// for; nothing was handed out and nothing changed.
    #[error("this client is over its rate limit for this pool; retry after {} ms", .0.as_millis())]
    ClientRateLimited(Duration),
    /// 408 `request_timeout`: the request's body did not arrive within its timeout; the
    /// connection is closed after this answer.
    #[error("the request body did not arrive within {} ms", .0.as_millis())]
    RequestTimeout(Duration),
    /// 413 `payload_too_large`.
    #[error("request body is larger than {0} bytes")]
    PayloadTooLarge(usize),
    /// 415 `unsupported_media_type`; names the content types the route takes.
    #[error("expected a body with content type {0}")]
    UnsupportedMediaType(&'static str),
    /// 503 `store_unavailable`, with `Retry-After`.
    #[error("the pool store is unavailable; retry shortly")]
    StoreUnavailable(#[source] StoreError),
}

/// The internal detail of a failure, kept in the response's extensions for the request log.
#[derive(Debug, Clone)]
pub struct ErrorDetail(pub String);

/// The stable code of an error answer, kept in the response's extensions for the request log.
#[derive(Debug, Clone, Copy)]
pub struct ErrorCode(pub &'static str);

impl ApiError {
    /// The HTTP status of this error.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::InvalidPoolId(_)
            | Self::InvalidClientId(_)
            | Self::InvalidJson(_)
            | Self::InvalidQuery(_)
            | Self::InvalidRequest(_)
            | Self::TooManyMembers(_) => StatusCode::BAD_REQUEST,
            Self::Unauthorized => StatusCode::UNAUTHORIZED,
            Self::Forbidden | Self::PoolNotAllowed => StatusCode::FORBIDDEN,
            Self::PoolNotFound
            | Self::ClientNotFound
            | Self::LeaseNotFound
            | Self::SessionNotFound
            | Self::RouteNotFound => StatusCode::NOT_FOUND,
            Self::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            Self::PolicyChangeRequiresEmptyPool | Self::TooManySessions | Self::TooManyClients => {
                StatusCode::CONFLICT
            }
            Self::RequestTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            Self::ClientRateLimited(_) => StatusCode::TOO_MANY_REQUESTS,
            Self::PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            Self::UnsupportedMediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Self::StoreUnavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// The stable snake_case code of this error.
    pub fn code(&self) -> &'static str {
        match self {
            Self::InvalidPoolId(_) => "invalid_pool_id",
            Self::InvalidClientId(_) => "invalid_client_id",
            Self::PoolNotAllowed => "pool_not_allowed",
            Self::ClientNotFound => "client_not_found",
            Self::TooManyClients => "too_many_clients",
            Self::InvalidJson(_) => "invalid_json",
            Self::InvalidQuery(_) => "invalid_query",
            Self::InvalidRequest(_) => "invalid_request",
            Self::TooManyMembers(_) => "too_many_members",
            Self::Unauthorized => "unauthorized",
            Self::Forbidden => "forbidden",
            Self::PoolNotFound => "pool_not_found",
            Self::LeaseNotFound => "lease_not_found",
            Self::SessionNotFound => "session_not_found",
            Self::TooManySessions => "too_many_sessions",
            Self::RouteNotFound => "not_found",
            Self::MethodNotAllowed => "method_not_allowed",
            Self::PolicyChangeRequiresEmptyPool => "policy_change_requires_empty_pool",
            Self::RequestTimeout(_) => "request_timeout",
            Self::ClientRateLimited(_) => "client_rate_limited",
            Self::PayloadTooLarge(_) => "payload_too_large",
            Self::UnsupportedMediaType(_) => "unsupported_media_type",
            Self::StoreUnavailable(_) => "store_unavailable",
        }
    }

    /// How long a client should wait before retrying a 503.
    pub const RETRY_AFTER: Duration = Duration::from_secs(1);
}

impl From<StoreError> for ApiError {
    fn from(error: StoreError) -> Self {
        match error {
            StoreError::PoolNotFound => Self::PoolNotFound,
            StoreError::LeaseNotFound => Self::LeaseNotFound,
            StoreError::SessionNotFound => Self::SessionNotFound,
            StoreError::TooManySessions => Self::TooManySessions,
            StoreError::PolicyChangeRequiresEmptyPool => Self::PolicyChangeRequiresEmptyPool,
            StoreError::ClientNotFound => Self::ClientNotFound,
            StoreError::TooManyClients => Self::TooManyClients,
            StoreError::ClientRateLimited(wait) => Self::ClientRateLimited(wait),
            other => Self::StoreUnavailable(other),
        }
    }
}

/// Renders the one error shape; also used by the readiness probe, which adds fields.
pub fn error_body(code: &str, message: &str) -> serde_json::Value {
    serde_json::json!({ "error": { "code": code, "message": message } })
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        self.respond(error_body(self.code(), &self.to_string()))
    }
}

impl ApiError {
    /// This error's answer with `body` (the one error shape, or the readiness probe's
    /// extension of it): its status, its headers (`Retry-After` on a 503), and for the
    /// request log its code and internal detail.
    pub fn respond(&self, body: serde_json::Value) -> Response {
        let mut response = (self.status(), axum::Json(body)).into_response();
        let headers = response.headers_mut();
        match self {
            Self::StoreUnavailable(_) => {
                headers.insert(
                    header::RETRY_AFTER,
                    HeaderValue::from(Self::RETRY_AFTER.as_secs()),
                );
            }
            Self::ClientRateLimited(wait) => {
                // Whole seconds, rounded up: a client that waits as told finds the tokens.
                let seconds = wait.as_millis().div_ceil(1_000).max(1);
                headers.insert(
                    header::RETRY_AFTER,
                    HeaderValue::from(u64::try_from(seconds).unwrap_or(u64::MAX)),
                );
            }
            Self::Unauthorized => {
                headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            }
            // The rest of the body may still come; the connection cannot be reused.
            Self::RequestTimeout(_) => {
                headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
            }
            _ => {}
        }
        if let Self::StoreUnavailable(source) = self {
            response
                .extensions_mut()
                .insert(ErrorDetail(source.to_string()));
        }
        response.extensions_mut().insert(ErrorCode(self.code()));
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn retry_after(wait_ms: u64) -> String {
        let response = ApiError::ClientRateLimited(Duration::from_millis(wait_ms)).into_response();
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        response.headers()[header::RETRY_AFTER]
            .to_str()
            .expect("text")
            .to_owned()
    }

    #[test]
    fn a_rate_limited_client_is_told_whole_seconds_rounded_up_and_at_least_one() {
        assert_eq!(retry_after(0), "1");
        assert_eq!(retry_after(1), "1");
        assert_eq!(retry_after(1_000), "1");
        assert_eq!(retry_after(1_001), "2");
        assert_eq!(retry_after(86_400_000), "86400");
    }
}
