//! Extractors whose rejections use the API's own error shape.
//!
//! axum's own `Json`, `Query` and `Path` reject with plain-text bodies; these wrap them so
//! that malformed JSON, a wrong content type, an oversized body or a bad pool id all answer
//! with `{"error": {...}}` and a stable code.

use std::time::Duration;

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, JsonRejection};
use axum::extract::{FromRequest, FromRequestParts, Path, Request};
use axum::http::StatusCode;
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

use super::error::ApiError;
use crate::domain::{LeaseId, PoolId, SessionId};

/// The pool id of the path, parsed.
#[derive(Debug, Clone)]
pub struct PoolPath(pub PoolId);

impl<S: Send + Sync> FromRequestParts<S> for PoolPath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let Path(raw) = Path::<String>::from_request_parts(parts, state)
            .await
            .map_err(|_| ApiError::InvalidPoolId(crate::domain::InvalidPoolId))?;
        Ok(Self(PoolId::parse(&raw)?))
    }
}

/// The pool id and lease id of a `/pools/{pool}/leases/{lease}/...` path, parsed. A lease
/// id this service could never have issued answers 404 `lease_not_found`, like any other
/// unknown lease.
#[derive(Debug, Clone)]
pub struct LeasePath(pub PoolId, pub LeaseId);

impl<S: Send + Sync> FromRequestParts<S> for LeasePath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let Path((pool, lease)) = Path::<(String, String)>::from_request_parts(parts, state)
            .await
            .map_err(|_| ApiError::LeaseNotFound)?;
        let pool = PoolId::parse(&pool)?;
        let lease = LeaseId::parse(&lease).map_err(|_| ApiError::LeaseNotFound)?;
        Ok(Self(pool, lease))
    }
}

/// The pool id and session id of a `/pools/{pool}/sessions/{session}` path, parsed. A
/// session id no assign could have named answers 404 `session_not_found`, like any other
/// unknown session.
#[derive(Debug, Clone)]
pub struct SessionPath(pub PoolId, pub SessionId);

impl<S: Send + Sync> FromRequestParts<S> for SessionPath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let Path((pool, session)) = Path::<(String, String)>::from_request_parts(parts, state)
            .await
            .map_err(|_| ApiError::SessionNotFound)?;
        let pool = PoolId::parse(&pool)?;
        let session =
            SessionId::parse("session", &session).map_err(|_| ApiError::SessionNotFound)?;
        Ok(Self(pool, session))
    }
}

/// A JSON body. With `T: Default`, see [`JsonOrDefault`] for bodies that may be empty.
#[derive(Debug, Clone)]
pub struct Json<T>(pub T);

/// A JSON body that may also be empty, meaning `T::default()`.
#[derive(Debug, Clone)]
pub struct JsonOrDefault<T>(pub T);

/// The body limits of the request's route: its size, for the 413 message, and how long the
/// whole body may take to arrive.
#[derive(Debug, Clone, Copy)]
pub struct BodyLimit {
    /// Largest body, in bytes.
    pub bytes: usize,
    /// Longest time the body may take to arrive, counted from when the handler reads it
    /// (right after the head).
    pub read_timeout: Duration,
}

fn body_rejection(rejection: BytesRejection, limit: usize) -> ApiError {
    if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
        ApiError::PayloadTooLarge(limit)
    } else {
        ApiError::InvalidJson(rejection.body_text())
    }
}

const JSON_ONLY: &str = "application/json";

fn json_rejection(rejection: JsonRejection, limit: usize) -> ApiError {
    match rejection.status() {
        StatusCode::PAYLOAD_TOO_LARGE => ApiError::PayloadTooLarge(limit),
        StatusCode::UNSUPPORTED_MEDIA_TYPE => ApiError::UnsupportedMediaType(JSON_ONLY),
        _ => ApiError::InvalidJson(rejection.body_text()),
    }
}

/// The body limits the route set (none: nothing may be read).
fn body_limit(req: &Request) -> BodyLimit {
    req.extensions()
        .get::<BodyLimit>()
        .copied()
        .unwrap_or(BodyLimit {
            bytes: 0,
            read_timeout: Duration::ZERO,
        })
}

/// Reads the whole body within the limits set for the route, answering 413 with the size
/// limit that applied, or 408 when the body is slower than its timeout: a client that
/// announces a body and trickles it (or never sends it) would otherwise hold the request,
/// and whatever it waits for, for ever. The request then ends before reaching the store.
async fn read_body(req: Request) -> Result<(Bytes, usize), ApiError> {
    let BodyLimit {
        bytes: limit,
        read_timeout,
    } = body_limit(&req);
    // A body that has ended before it began (`Content-Length: 0`, or none announced) is
    // empty under any limit and cannot be slow: no timer, no collecting. This is every
    // plain assign.
    if axum::body::HttpBody::is_end_stream(req.body()) {
        return Ok((Bytes::new(), limit));
    }
    let bytes = tokio::time::timeout(read_timeout, Bytes::from_request(req, &()))
        .await
        .map_err(|_| {
            crate::monitoring::record_body_timeout();
            ApiError::RequestTimeout(read_timeout)
        })?
        .map_err(|rejection| body_rejection(rejection, limit))?;
    Ok((bytes, limit))
}

/// A type a JSON request body is read into.
pub trait JsonBody: DeserializeOwned {
    /// Whether an array of objects is one of its forms (a batch, as outcome reports come);
    /// every other body is one object.
    const BATCH: bool = false;
}

fn parse_json<T: JsonBody>(bytes: &[u8], limit: usize) -> Result<T, ApiError> {
    // Most bodies are one object with whole numbers written as integers: read straight into
    // the type, skipping the tree that the rewrite below needs. Anything else, and any body
    // the direct read refuses (`3.0` for an integer field, a duplicate field, trailing
    // bytes, ...), takes the full path, so that every answer, error text included, is the
    // full path's. Batches keep the full path: an object is not their only form.
    if !T::BATCH
        && bytes.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{')
        && !has_non_integer_number(bytes)
        && let Ok(body) = serde_json::from_slice::<T>(bytes)
    {
        return Ok(body);
    }
    parse_json_in_full(bytes, limit)
}

/// Whether a number outside the body's strings may be read differently by the full path:
/// one with a fraction or an exponent (`3.0`, `1e3`, rewritten there into integers even
/// inside `serde_json::Value` fields the direct read would hand over as floats), or a
/// negative one (`-0` is read as a float). Conservative: a `.`, `-` or exponent anywhere
/// outside a string counts, valid JSON or not.
fn has_non_integer_number(bytes: &[u8]) -> bool {
    let mut in_string = false;
    let mut escaped = false;
    let mut previous = b' ';
    for &b in bytes {
        if in_string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
            }
        } else {
            match b {
                b'"' => in_string = true,
                b'.' | b'-' => return true,
                b'e' | b'E' if previous.is_ascii_digit() => return true,
                _ => {}
            }
        }
        previous = b;
    }
    false
}

/// The body read as a `serde_json::Value` first: its shape checked, its whole numbers
/// rewritten, then read into the type.
fn parse_json_in_full<T: JsonBody>(bytes: &[u8], limit: usize) -> Result<T, ApiError> {
    let value = json_document(bytes, limit, T::BATCH)?;
    from_document(value)
}

/// Reads a document built from a body (by [`parse_json_in_full`], or a merge patch applied
/// to a stored configuration) into the type, refused as a body of the wrong shape is.
pub fn from_document<T: JsonBody>(value: serde_json::Value) -> Result<T, ApiError> {
    T::deserialize(value).map_err(|error| ApiError::InvalidJson(error.to_string()))
}

/// The body as a JSON document: an object, or with `batch` an array of them too, whole
/// numbers rewritten as integers.
fn json_document(bytes: &[u8], limit: usize, batch: bool) -> Result<serde_json::Value, ApiError> {
    let axum::Json(mut value) = axum::Json::<serde_json::Value>::from_bytes(bytes)
        .map_err(|rejection| json_rejection(rejection, limit))?;
    // Every JSON body is an object, or where the type says so an array of them: serde
    // would otherwise fill a struct from an array by position (`[null, null]` read as an
    // assign with no fields).
    let shaped = match &value {
        serde_json::Value::Object(_) => true,
        serde_json::Value::Array(items) => batch && items.iter().all(serde_json::Value::is_object),
        _ => false,
    };
    if !shaped {
        let expected = if batch {
            "the body must be a JSON object or an array of them"
        } else {
            "the body must be a JSON object"
        };
        return Err(ApiError::InvalidJson(expected.to_owned()));
    }
    whole_numbers_as_integers(&mut value);
    Ok(value)
}

/// JSON has one number type: `3.0` is as much an integer as `3` (JSON Schema says so too),
/// but serde refuses it for an integer field. Rewriting whole-valued floats first lets
/// every integer field accept both spellings without a custom deserializer each.
fn whole_numbers_as_integers(value: &mut serde_json::Value) {
    use serde_json::Value;
    match value {
        Value::Number(n) if !n.is_i64() && !n.is_u64() => {
            if let Some(f) = n.as_f64().filter(|f| f.fract() == 0.0) {
                // Only within the range where f64 holds whole numbers exactly.
                if (0.0..9.007_199_254_740_992e15).contains(&f) {
                    *value = Value::from(f as u64);
                } else if (-9.007_199_254_740_992e15..0.0).contains(&f) {
                    *value = Value::from(f as i64);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(whole_numbers_as_integers),
        Value::Object(fields) => fields.values_mut().for_each(whole_numbers_as_integers),
        _ => {}
    }
}

async fn read_json<T: JsonBody + Send>(req: Request, empty: Option<T>) -> Result<T, ApiError> {
    let is_json = is_json_content_type(req.headers());
    let (bytes, limit) = read_body(req).await?;
    if bytes.is_empty()
        && let Some(default) = empty
    {
        return Ok(default);
    }
    if !is_json {
        return Err(ApiError::UnsupportedMediaType(JSON_ONLY));
    }
    parse_json(&bytes, limit)
}

/// The media type of the body, lower-cased, parameters left out.
fn content_type(headers: &axum::http::HeaderMap) -> Option<String> {
    let value = headers
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())?;
    let essence = value.split(';').next().unwrap_or("");
    Some(essence.trim().to_ascii_lowercase())
}

/// `application/json` or `application/<anything>+json`, parameters ignored.
fn is_json_content_type(headers: &axum::http::HeaderMap) -> bool {
    content_type(headers).is_some_and(|essence| {
        essence == "application/json"
            || (essence.starts_with("application/") && essence.ends_with("+json"))
    })
}

/// How a list of candidates is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListKind {
    /// `text/plain`, one candidate per line (kept as bytes, so that a line that is not
    /// UTF-8 is rejected on its own rather than failing the whole body).
    Text,
    /// `application/json`, an array of strings.
    Json,
}

/// A list of candidates, read as it arrives rather than as a whole, within the route's
/// body limits: its size (a `Content-Length` over it is refused before anything is read;
/// a body growing past it fails when it does) and its read timeout, counted from here in
/// the time spent waiting for the body: an import writes each batch before it reads on,
/// and the store's pace (see `store::chunks`) is not the client's slowness.
#[derive(Debug)]
pub struct ListBody {
    /// How the list is written.
    pub kind: ListKind,
    body: axum::body::BodyDataStream,
    limit: usize,
    read: usize,
    read_timeout: Duration,
    /// What is left of `read_timeout` for waiting on the body.
    waiting_left: Duration,
}

impl ListBody {
    /// The next piece of the body as it arrived, `None` at its end.
    ///
    /// # Errors
    /// 413 once the body is larger than the limit, 408 once it is slower than its read
    /// timeout, 400 when it cannot be read.
    pub async fn next_piece(&mut self) -> Result<Option<Bytes>, ApiError> {
        use futures_util::StreamExt;
        let started = tokio::time::Instant::now();
        let piece = tokio::time::timeout(self.waiting_left, self.body.next())
            .await
            .map_err(|_| {
                crate::monitoring::record_body_timeout();
                ApiError::RequestTimeout(self.read_timeout)
            })?;
        self.waiting_left = self.waiting_left.saturating_sub(started.elapsed());
        match piece {
            None => Ok(None),
            Some(Err(error)) => Err(ApiError::InvalidJson(format!(
                "the body could not be read: {error}"
            ))),
            Some(Ok(bytes)) => {
                self.read += bytes.len();
                if self.read > self.limit {
                    return Err(ApiError::PayloadTooLarge(self.limit));
                }
                Ok(Some(bytes))
            }
        }
    }
}

impl<S: Send + Sync> FromRequest<S> for ListBody {
    type Rejection = ApiError;

    async fn from_request(req: Request, _state: &S) -> Result<Self, ApiError> {
        let kind = if content_type(req.headers()).is_some_and(|essence| essence == "text/plain") {
            ListKind::Text
        } else if is_json_content_type(req.headers()) {
            ListKind::Json
        } else {
            return Err(ApiError::UnsupportedMediaType(
                "text/plain or application/json",
            ));
        };
        let BodyLimit {
            bytes: limit,
            read_timeout,
        } = body_limit(&req);
        let announced = req
            .headers()
            .get(axum::http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if announced.is_some_and(|n| n > limit as u64) {
            return Err(ApiError::PayloadTooLarge(limit));
        }
        Ok(Self {
            kind,
            body: req.into_body().into_data_stream(),
            limit,
            read: 0,
            read_timeout,
            waiting_left: read_timeout,
        })
    }
}

impl<S: Send + Sync, T: JsonBody + Send> FromRequest<S> for Json<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, _state: &S) -> Result<Self, ApiError> {
        read_json(req, None).await.map(Self)
    }
}

impl<S: Send + Sync, T: JsonBody + Default + Send> FromRequest<S> for JsonOrDefault<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, _state: &S) -> Result<Self, ApiError> {
        read_json(req, Some(T::default())).await.map(Self)
    }
}

/// The content types a merge patch may come as: RFC 7396's own, and plain JSON for clients
/// that cannot set another (a merge patch is a JSON object either way).
const MERGE_PATCH: &str = "application/merge-patch+json or application/json";

/// A JSON merge patch (RFC 7396): an object, whole numbers rewritten as in every other
/// body. Other `+json` types are refused, unlike on the other body
/// routes: a JSON Patch (`application/json-patch+json`) is an array of operations, and
/// read as a merge patch it would mean something else entirely.
#[derive(Debug, Clone)]
pub struct MergePatch(pub serde_json::Map<String, serde_json::Value>);

impl<S: Send + Sync> FromRequest<S> for MergePatch {
    type Rejection = ApiError;

    async fn from_request(req: Request, _state: &S) -> Result<Self, ApiError> {
        let accepted = content_type(req.headers()).is_some_and(|essence| {
            essence == "application/merge-patch+json" || essence == "application/json"
        });
        if !accepted {
            return Err(ApiError::UnsupportedMediaType(MERGE_PATCH));
        }
        let (bytes, limit) = read_body(req).await?;
        // Only an object gets through: a patch that is not one would replace the whole
        // configuration (RFC 7396), which is what `PUT` is for.
        match json_document(&bytes, limit, false)? {
            serde_json::Value::Object(patch) => Ok(Self(patch)),
            _ => Err(ApiError::InvalidJson(
                "the body must be a JSON object".to_owned(),
            )),
        }
    }
}

/// Applies a JSON merge patch (RFC 7396) to `target`: objects merge key by key, at every
/// depth; `null` removes the key; any other value replaces what was there.
pub fn merge_patch(target: &mut serde_json::Value, patch: serde_json::Value) {
    use serde_json::Value;
    let Value::Object(patch) = patch else {
        *target = patch;
        return;
    };
    if !target.is_object() {
        *target = Value::Object(serde_json::Map::new());
    }
    if let Value::Object(fields) = target {
        for (key, value) in patch {
            if value.is_null() {
                fields.remove(&key);
            } else {
                merge_patch(fields.entry(key).or_insert(Value::Null), value);
            }
        }
    }
}

/// Query parameters, rejected with the API's error shape.
#[derive(Debug, Clone)]
pub struct Query<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for Query<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        axum::extract::Query::<T>::from_request_parts(parts, state)
            .await
            .map(|axum::extract::Query(value)| Self(value))
            .map_err(|rejection| ApiError::InvalidQuery(rejection.body_text()))
    }
}

/// Query parameters with the repeatable `label=key=value` ones set apart (the typed part
/// cannot hold a repeated name), rejected with the API's error shape.
#[derive(Debug, Clone)]
pub struct QueryWithLabels<T>(pub T, pub Vec<String>);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for QueryWithLabels<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, ApiError> {
        let query = parts.uri.query().unwrap_or("");
        let mut labels = Vec::new();
        let mut rest = form_urlencoded::Serializer::new(String::new());
        for (name, value) in form_urlencoded::parse(query.as_bytes()) {
            if name == "label" {
                labels.push(value.into_owned());
            } else {
                rest.append_pair(&name, &value);
            }
        }
        let uri: axum::http::Uri = format!("/?{}", rest.finish())
            .parse()
            .map_err(|_| ApiError::InvalidQuery("the query is not valid".to_owned()))?;
        let axum::extract::Query(value) = axum::extract::Query::<T>::try_from_uri(&uri)
            .map_err(|rejection| ApiError::InvalidQuery(rejection.body_text()))?;
        Ok(Self(value, labels))
    }
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;
    use serde_json::json;

    use super::{JsonBody, has_non_integer_number, merge_patch, parse_json, parse_json_in_full};

    #[test]
    fn a_merge_patch_gives_the_results_of_the_rfc_7396_examples() {
        // RFC 7396, appendix A (the cases with an object at the top).
        for (target, patch, result) in [
            (json!({"a": "b"}), json!({"a": "c"}), json!({"a": "c"})),
            (
                json!({"a": "b"}),
                json!({"b": "c"}),
                json!({"a": "b", "b": "c"}),
            ),
            (json!({"a": "b"}), json!({"a": null}), json!({})),
            (
                json!({"a": "b", "b": "c"}),
                json!({"a": null}),
                json!({"b": "c"}),
            ),
            (json!({"a": ["b"]}), json!({"a": "c"}), json!({"a": "c"})),
            (json!({"a": "c"}), json!({"a": ["b"]}), json!({"a": ["b"]})),
            (
                json!({"a": {"b": "c"}}),
                json!({"a": {"b": "d", "c": null}}),
                json!({"a": {"b": "d"}}),
            ),
            (
                json!({"a": [{"b": "c"}]}),
                json!({"a": [1]}),
                json!({"a": [1]}),
            ),
            (
                json!({"e": null}),
                json!({"a": 1}),
                json!({"e": null, "a": 1}),
            ),
            (
                json!([1, 2]),
                json!({"a": "b", "c": null}),
                json!({"a": "b"}),
            ),
            (
                json!({}),
                json!({"a": {"bb": {"ccc": null}}}),
                json!({"a": {"bb": {}}}),
            ),
        ] {
            let mut merged = target.clone();
            merge_patch(&mut merged, patch.clone());
            assert_eq!(merged, result, "{target} patched with {patch}");
        }
    }

    /// A body with an integer field and a field handed over as JSON, as assign's are.
    #[derive(Debug, Default, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Probe {
        #[serde(default)]
        count: Option<u32>,
        #[serde(default)]
        labels: Option<serde_json::Value>,
    }

    impl JsonBody for Probe {}

    fn parsed(body: &str) -> Result<Probe, String> {
        parse_json::<Probe>(body.as_bytes(), 1024).map_err(|error| format!("{error:?}"))
    }

    fn parsed_in_full(body: &str) -> Result<Probe, String> {
        parse_json_in_full::<Probe>(body.as_bytes(), 1024).map_err(|error| format!("{error:?}"))
    }

    #[test]
    fn a_whole_float_for_an_integer_field_is_read_as_that_integer() {
        assert_eq!(
            parsed(r#"{"count": 3.0}"#).expect("accepted").count,
            Some(3)
        );
    }

    #[test]
    fn a_whole_float_inside_a_json_field_reaches_the_handler_as_an_integer() {
        let labels = parsed(r#"{"labels": {"n": 3.0, "m": [1E2]}}"#)
            .expect("accepted")
            .labels;
        assert_eq!(labels, Some(json!({"n": 3_u64, "m": [100_u64]})));
    }

    #[test]
    fn a_negative_zero_inside_a_json_field_reaches_the_handler_as_zero() {
        let labels = parsed(r#"{"labels": {"n": -0}}"#).expect("accepted").labels;
        assert_eq!(labels, Some(json!({"n": 0_u64})));
    }

    #[test]
    fn a_field_given_twice_counts_with_its_last_value() {
        assert_eq!(
            parsed(r#"{"count": 1, "count": 2}"#)
                .expect("accepted")
                .count,
            Some(2)
        );
    }

    #[test]
    fn every_body_is_answered_as_the_full_reading_answers_it() {
        let bodies = [
            r#"{"count": 3}"#,
            r#"  {"labels": {"country": "de"}}  "#,
            r#"{"labels": {"country": ["de", "fr"]}, "count": 2}"#,
            r#"{"labels": {"host": "a.b-c.example", "quote": "\"1.5\""}}"#,
            r#"{"count": 1} x"#,
            r#"{"count": 1}{}"#,
            r#"{"count": "3"}"#,
            r#"{"count": -1}"#,
            r#"{"counts": 3}"#,
            r#"{"count": 3"#,
            r#"[{"count": 3}]"#,
            r#"[null, null]"#,
            "null",
            "",
        ];
        for body in bodies {
            assert_eq!(
                format!("{:?}", parsed(body)),
                format!("{:?}", parsed_in_full(body)),
                "{body}"
            );
        }
        assert_eq!(
            parsed(r#"{"count": 1} x"#).expect_err("refused"),
            parsed_in_full(r#"{"count": 1} x"#).expect_err("refused")
        );
    }

    #[test]
    fn only_numbers_outside_strings_count_as_non_integer() {
        assert!(!has_non_integer_number(
            br#"{"a": "1.5", "b": "x\"-e", "c": [1, 20]}"#
        ));
        assert!(!has_non_integer_number(
            br#"{"a": true, "b": false, "c": null}"#
        ));
        assert!(has_non_integer_number(br#"{"a": 1.5}"#));
        assert!(has_non_integer_number(br#"{"a": 1e5}"#));
        assert!(has_non_integer_number(br#"{"a": 1E5}"#));
        assert!(has_non_integer_number(br#"{"a": -1}"#));
        assert!(has_non_integer_number(br#"{"a": "\\", "b": 2.0}"#));
    }
}
