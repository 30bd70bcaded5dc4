//! The operator commands' side of the HTTP API: one request at a time, with the admin token,
//! error answers turned into [`Failure`]s that carry the service's code and message.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::Value;

use super::{Failure, Remote};
use crate::domain::PoolId;

/// Members asked for per page when listing: the service's largest page.
const PAGE: usize = 1_000;

/// The shortest time an import waits for its answer, whatever `--timeout-ms` says: the
/// service writes a large list in chunks it paces so that other pools stay fast, and a
/// list of a million lines takes it tens of seconds.
pub const IMPORT_TIMEOUT: Duration = Duration::from_secs(600);

/// A request body.
pub enum Body {
    /// No body.
    None,
    /// A JSON document.
    Json(Value),
    /// A JSON merge patch (RFC 7396), sent as `application/merge-patch+json`.
    MergePatch(Value),
    /// A text list (`text/plain`).
    Text(Vec<u8>),
}

/// A running service, reached with the admin token.
pub struct Service {
    http: reqwest::Client,
    base: String,
    token: String,
    /// The timeout of an import: `--timeout-ms`, at least [`IMPORT_TIMEOUT`].
    import_timeout: Duration,
}

impl Service {
    /// A client for `remote`.
    ///
    /// # Errors
    /// [`Failure::Usage`] when the URL is not plain HTTP or no admin token is given: both
    /// are found before anything is sent.
    pub fn new(remote: &Remote) -> Result<Self, Failure> {
        let base = remote.url.trim_end_matches('/').to_owned();
        // The client is built without TLS (it would double the build); the service itself
        // speaks plain HTTP.
        if !base.starts_with("http://") {
            return Err(Failure::Usage(format!(
                "--url must be a plain http:// URL, not {base:?}"
            )));
        }
        let token = match (&remote.admin_token, &remote.admin_token_file) {
            (Some(token), _) => token.trim().to_owned(),
            (None, Some(path)) => std::fs::read_to_string(path)
                .map_err(|error| {
                    Failure::Usage(format!("cannot read {}: {error}", path.display()))
                })?
                .trim()
                .to_owned(),
            (None, None) => String::new(),
        };
        if token.is_empty() {
            return Err(Failure::Usage(
                "no admin token: set ADMIN_TOKEN or ADMIN_TOKEN_FILE (or pass --admin-token)"
                    .to_owned(),
            ));
        }
        let http = reqwest::Client::builder()
            .timeout(Duration::from_millis(remote.timeout_ms))
            // An operator's HTTP_PROXY is for the outside world, not for the allocator.
            .no_proxy()
            .build()
            .map_err(|error| Failure::Unreachable(chain(&error)))?;
        Ok(Self {
            http,
            base,
            token,
            import_timeout: IMPORT_TIMEOUT.max(Duration::from_millis(remote.timeout_ms)),
        })
    }

    /// A GET whose answer must have a body.
    pub async fn get(&self, path: &str) -> Result<Value, Failure> {
        let (_, answer) = self.send(Method::GET, path, Body::None).await?;
        answer.ok_or_else(|| self.empty(path))
    }

    /// A POST of JSON whose answer must have a body.
    pub async fn post(&self, path: &str, body: Value) -> Result<Value, Failure> {
        let (_, answer) = self.send(Method::POST, path, Body::Json(body)).await?;
        answer.ok_or_else(|| self.empty(path))
    }

    /// One request; the status and JSON body (`None` when empty) of a successful answer.
    ///
    /// # Errors
    /// [`Failure::Answer`] for an error answer, [`Failure::Unreachable`] when there was none.
    pub async fn send(
        &self,
        method: Method,
        path: &str,
        body: Body,
    ) -> Result<(StatusCode, Option<Value>), Failure> {
        self.send_with_query(method, path, &[], body).await
    }

    /// [`Service::send`] with query parameters.
    ///
    /// # Errors
    /// As [`Service::send`].
    pub async fn send_with_query(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        body: Body,
    ) -> Result<(StatusCode, Option<Value>), Failure> {
        let mut request = self
            .http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(&self.token)
            .query(query);
        request = match body {
            Body::None => request,
            Body::Json(value) => request
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(value.to_string()),
            Body::MergePatch(value) => request
                .header(
                    reqwest::header::CONTENT_TYPE,
                    "application/merge-patch+json",
                )
                .body(value.to_string()),
            // A text list is an import (see IMPORT_TIMEOUT).
            Body::Text(bytes) => request
                .header(reqwest::header::CONTENT_TYPE, "text/plain; charset=utf-8")
                .timeout(self.import_timeout)
                .body(bytes),
        };
        let unreachable = |error: reqwest::Error| {
            Failure::Unreachable(format!("cannot reach {}: {}", self.base, chain(&error)))
        };
        let response = request.send().await.map_err(unreachable)?;
        let status = response.status();
        let bytes = response.bytes().await.map_err(unreachable)?;
        let answer = if bytes.is_empty() {
            None
        } else {
            Some(serde_json::from_slice::<Value>(&bytes).map_err(|_| {
                Failure::Unreachable(format!(
                    "{} answered {status} with a body that is not JSON; is it proxy-allocator?",
                    self.base
                ))
            })?)
        };
        if status.is_success() {
            return Ok((status, answer));
        }
        let error = answer.as_ref().map(|a| &a["error"]);
        let text = |field: &str| {
            error
                .and_then(|e| e[field].as_str())
                .map(str::to_owned)
                .unwrap_or_else(|| status.canonical_reason().unwrap_or("error").to_owned())
        };
        Err(Failure::Answer {
            status: status.as_u16(),
            code: text("code"),
            message: text("message"),
        })
    }

    /// Every member of a pool in `state`, following the listing's pages.
    pub async fn all_members(
        &self,
        pool: &PoolId,
        state: &str,
        labels: &[String],
        target: Option<&str>,
    ) -> Result<Vec<Value>, Failure> {
        let mut query = vec![("state", state.to_owned()), ("limit", PAGE.to_string())];
        query.extend(labels.iter().map(|pair| ("label", pair.clone())));
        query.extend(target.map(|host| ("target", host.to_owned())));
        self.all_pages(&format!("/pools/{pool}/members"), query, "members")
            .await
    }

    /// Every pool, following the listing's pages.
    pub async fn all_pools(&self) -> Result<Vec<Value>, Failure> {
        self.all_pages("/pools", vec![("limit", PAGE.to_string())], "pools")
            .await
    }

    /// Every entry under `key` of a paginated listing at `path`, page after page.
    async fn all_pages(
        &self,
        path: &str,
        query: Vec<(&str, String)>,
        key: &str,
    ) -> Result<Vec<Value>, Failure> {
        let mut entries = Vec::new();
        let mut cursor = String::new();
        loop {
            let mut query = query.clone();
            if !cursor.is_empty() {
                query.push(("cursor", cursor.clone()));
            }
            let (_, answer) = self
                .send_with_query(Method::GET, path, &query, Body::None)
                .await?;
            let answer = answer.ok_or_else(|| self.empty(path))?;
            if let Some(page) = answer[key].as_array() {
                entries.extend(page.iter().cloned());
            }
            match answer["next_cursor"].as_str() {
                Some(next) if !next.is_empty() => cursor = next.to_owned(),
                _ => return Ok(entries),
            }
        }
    }

    fn empty(&self, path: &str) -> Failure {
        Failure::Unreachable(format!(
            "{}{path} answered without a body; is it proxy-allocator?",
            self.base
        ))
    }
}

/// The causes of an error, which is where reqwest says what went wrong ("connection
/// refused"); its own message ("error sending request for url") only repeats the URL.
fn chain(error: &dyn std::error::Error) -> String {
    let Some(first) = error.source() else {
        return error.to_string();
    };
    let mut text = first.to_string();
    let mut source = first.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
