//! Plain-HTTP forwarding: the client's request kept so that it can be sent again (its body
//! up to `GATEWAY_RETRY_BODY_MAX`), one exchange through a dialled member, and the pool's
//! retry rules applied to the target's answer (a listed status, or a block pattern in the
//! first 64 KiB of the body, is a block: reported with the target and, while attempts last,
//! not passed on).

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::header::{self, HeaderMap, HeaderValue};
use hyper::{Method, Request, Response, StatusCode, Uri, Version};
use hyper_util::rt::TokioIo;

use super::upstream::{Connection, DialFailure, FailureKind, Upstream};
use super::{GatewayBody, HOP_BY_HOP, Held, Kind, MARKER, empty, full, status};
use crate::domain::{GatewayRules, OutcomeResult, Scheme};

/// How much of a target's answer the block patterns are matched against.
pub(super) const BLOCK_WINDOW: usize = 64 * 1024;

/// A pool's gateway rules as the gateway applies them: its patterns compiled once.
#[derive(Debug)]
pub(super) struct Rules {
    /// Most members one request tries (the service's `GATEWAY_ATTEMPTS` when `None`).
    pub(super) attempts: Option<u32>,
    statuses: Vec<u16>,
    patterns: Option<regex::bytes::RegexSet>,
    response_timeout: Duration,
}

impl Rules {
    /// The rules of a pool's configuration; a pool without any has none of them.
    pub(super) fn of(rules: Option<&GatewayRules>) -> Self {
        let defaults = GatewayRules::default();
        let rules = rules.unwrap_or(&defaults);
        Self {
            attempts: rules.attempts,
            statuses: rules.retry_statuses.clone(),
            // Every saved pattern compiled when the pool was saved, under the same bound.
            patterns: rules.compiled_patterns().ok().flatten(),
            response_timeout: Duration::from_millis(rules.response_timeout_ms),
        }
    }
}

/// The client's request as it is sent to each member in turn.
pub(super) struct Outgoing {
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: OutgoingBody,
}

enum OutgoingBody {
    /// Read whole (at most the retry limit): sent again on each attempt.
    Kept(Bytes),
    /// Larger than the retry limit: streamed once, never retried. `None` once sent.
    Once(Option<GatewayBody>),
}

impl Outgoing {
    /// Reads the request's body up to `max` bytes; a larger body (by its length, or once
    /// `max` bytes have come) is streamed instead, the bytes read so far first.
    pub(super) async fn read(request: Request<Incoming>, max: usize) -> Self {
        let (parts, mut body) = request.into_parts();
        let declared = body.size_hint().exact();
        let body = if declared.is_some_and(|n| n > max as u64) {
            OutgoingBody::Once(Some(body.map_err(Into::into).boxed_unsync()))
        } else {
            let mut kept = BytesMut::new();
            let mut too_large = false;
            let mut failed = false;
            while !body.is_end_stream() {
                match body.frame().await {
                    Some(Ok(frame)) => {
                        if let Some(data) = frame.data_ref() {
                            kept.extend_from_slice(data);
                        }
                        if kept.len() > max {
                            too_large = true;
                            break;
                        }
                    }
                    Some(Err(_)) => {
                        failed = true;
                        break;
                    }
                    None => break,
                }
            }
            if too_large {
                let first = http_body_util::Full::new(kept.freeze())
                    .map_err(|never| match never {})
                    .boxed_unsync();
                OutgoingBody::Once(Some(
                    Chained {
                        first: Some(first),
                        rest: body,
                    }
                    .boxed_unsync(),
                ))
            } else if failed {
                // The client's body broke off: what came is all there is to send.
                OutgoingBody::Once(Some(full(kept.freeze())))
            } else {
                OutgoingBody::Kept(kept.freeze())
            }
        };
        Self {
            method: parts.method,
            uri: parts.uri,
            headers: parts.headers,
            body,
        }
    }

    /// Whether the request may be sent again after it has been sent once.
    pub(super) fn replayable(&self) -> bool {
        matches!(self.body, OutgoingBody::Kept(_))
    }

    /// The request for one more attempt; `None` when its body was streamed already.
    fn attempt(&mut self) -> Option<Request<GatewayBody>> {
        let body = match &mut self.body {
            OutgoingBody::Kept(bytes) if bytes.is_empty() => empty(),
            OutgoingBody::Kept(bytes) => full(bytes.clone()),
            OutgoingBody::Once(body) => body.take()?,
        };
        let mut request = Request::new(body);
        *request.method_mut() = self.method.clone();
        *request.uri_mut() = self.uri.clone();
        *request.version_mut() = Version::HTTP_11;
        *request.headers_mut() = self.headers.clone();
        for name in &HOP_BY_HOP {
            request.headers_mut().remove(name);
        }
        Some(request)
    }
}

/// How one exchange through a member ended.
pub(super) enum Forward {
    /// The answer to pass on.
    Answered(Response<GatewayBody>),
    /// A block (reported), with attempts left: the answer is passed on only if no other
    /// member can be tried.
    Blocked(Response<GatewayBody>),
    /// The member failed (reported) before an answer came.
    Failed(DialFailure),
}

impl Held {
    /// Sends `outgoing` once through the dialled member and judges the answer by `rules`;
    /// `may_retry` says whether a block would be tried again through another member (else
    /// it is passed on as it came, reported all the same).
    #[expect(clippy::too_many_arguments, reason = "one exchange's whole context")]
    pub(super) async fn forward(
        self,
        outgoing: &mut Outgoing,
        upstream: Upstream,
        connection: Connection,
        host: &str,
        port: u16,
        rules: &Arc<Rules>,
        may_retry: bool,
    ) -> Forward {
        let Some(mut request) = outgoing.attempt() else {
            // Never: a streamed body is only sent by the first exchange, and the loop asks
            // for no other after it.
            return Forward::Failed(DialFailure::new(
                FailureKind::Unreachable,
                "the request's body was sent already",
            ));
        };
        to_member(&mut request, &upstream, host, port);
        let gateway = self.gateway.clone();
        let exchange = async {
            // Header names go out capitalised (`Proxy-Authorization`), as browsers and curl
            // write them: some upstream proxies read their credentials in that spelling only.
            let (mut sender, connection) = hyper::client::conn::http1::Builder::new()
                .title_case_headers(true)
                .handshake(TokioIo::new(connection))
                .await?;
            tokio::spawn(connection);
            let response = sender.send_request(request).await?;
            Ok::<_, hyper::Error>((sender, response))
        };
        let (sender, response) = match tokio::time::timeout(rules.response_timeout, exchange).await
        {
            Ok(Ok(exchanged)) => exchanged,
            failure => {
                let failure = match failure {
                    Ok(Err(error)) => DialFailure::new(
                        FailureKind::Unreachable,
                        format!("the exchange through the proxy: {error}"),
                    ),
                    _ => DialFailure::new(
                        FailureKind::ResponseTimedOut,
                        "the target's answer did not start in time",
                    ),
                };
                return self.failed(failure).await;
            }
        };
        let status = response.status();
        if status == StatusCode::PROXY_AUTHENTICATION_REQUIRED
            && matches!(upstream.scheme(), Scheme::Http | Scheme::Https)
        {
            // The member's proxy refused its own credentials: a proxy failure, not an
            // answer of the target.
            let failure = DialFailure::new(
                FailureKind::ProxyAnswer,
                "the proxy refused the member's credentials (407)",
            );
            return self.failed(failure).await;
        }
        let (mut parts, mut body) = response.into_parts();
        let listed = rules.statuses.contains(&status.as_u16());
        let mut prefix = Bytes::new();
        let mut matched = false;
        if !listed && let Some(patterns) = &rules.patterns {
            let mut window = BytesMut::new();
            let read = read_window(&mut body, &mut window);
            // A body that stalls is judged by what came within the timeout.
            let _ = tokio::time::timeout(rules.response_timeout, read).await;
            prefix = window.freeze();
            matched = patterns.is_match(&prefix[..prefix.len().min(BLOCK_WINDOW)]);
        }
        let blocked = listed
            || matched
            || matches!(
                status,
                StatusCode::FORBIDDEN | StatusCode::TOO_MANY_REQUESTS
            );
        let latency_ms = self.latency_ms();
        if blocked {
            gateway
                .report(
                    &self.pool,
                    &self.member,
                    OutcomeResult::Blocked,
                    Some(self.target.clone()),
                    Some(latency_ms),
                )
                .await;
        } else {
            gateway.report_ok(&self.pool, &self.member, latency_ms);
        }
        for name in &HOP_BY_HOP {
            parts.headers.remove(name);
        }
        // The gateway's own headers say who answered: an upstream's are not passed on.
        parts.headers.remove(MARKER);
        status::served(&mut parts.headers, Some(status.as_u16()));
        let retry = (listed || matched) && may_retry;
        let body = Forwarded {
            first: (!prefix.is_empty()).then_some(prefix),
            inner: body,
            received: 0,
            status: status.as_u16(),
            held: Some(self),
            _sender: sender,
        };
        let response = Response::from_parts(parts, body.boxed_unsync());
        if retry {
            Forward::Blocked(response)
        } else {
            Forward::Answered(response)
        }
    }
}

impl Held {
    /// Reports a forward that failed before its answer came, gives its lease back, and
    /// says why.
    async fn failed(self, failure: DialFailure) -> Forward {
        self.gateway
            .failed(
                &self.pool,
                &self.member,
                Kind::Forward,
                &failure.message,
                self.hold,
            )
            .await;
        Forward::Failed(failure)
    }
}

/// Reads `body` into `window` until it holds [`BLOCK_WINDOW`] bytes or the body ends.
/// Cancelling it loses nothing: every frame read is in `window` already.
async fn read_window(body: &mut Incoming, window: &mut BytesMut) {
    while window.len() < BLOCK_WINDOW && !body.is_end_stream() {
        match body.frame().await {
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    window.extend_from_slice(data);
                }
            }
            Some(Err(_)) | None => return,
        }
    }
}

/// The request as the member's proxy takes it: absolute form with the member's own
/// credentials for an HTTP(S) proxy, origin form with a `Host` through a SOCKS tunnel.
fn to_member(request: &mut Request<GatewayBody>, upstream: &Upstream, host: &str, port: u16) {
    match upstream.scheme() {
        Scheme::Http | Scheme::Https => {
            if let Some(authorization) = upstream.authorization() {
                request
                    .headers_mut()
                    .insert(header::PROXY_AUTHORIZATION, authorization);
            }
        }
        _ => {
            if !request.headers().contains_key(header::HOST) {
                let authority = if port == 80 {
                    host.to_owned()
                } else {
                    format!("{host}:{port}")
                };
                if let Ok(value) = HeaderValue::from_str(&authority) {
                    request.headers_mut().insert(header::HOST, value);
                }
            }
            let path = request
                .uri()
                .path_and_query()
                .map_or("/", hyper::http::uri::PathAndQuery::as_str);
            *request.uri_mut() = Uri::try_from(path).unwrap_or_else(|_| Uri::from_static("/"));
        }
    }
}

pin_project_lite::pin_project! {
    /// A body whose first bytes were read already, then the rest of it.
    struct Chained {
        first: Option<GatewayBody>,
        #[pin]
        rest: Incoming,
    }
}

impl Body for Chained {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.project();
        if let Some(first) = this.first {
            match Pin::new(first).poll_frame(cx) {
                Poll::Ready(None) => *this.first = None,
                other => return other,
            }
        }
        this.rest.poll_frame(cx).map_err(Into::into)
    }
}

pin_project_lite::pin_project! {
    /// An upstream's response body (its first bytes, when they were read for the block
    /// patterns, then the rest), which holds its member's lease (and its connection)
    /// until it has been sent or dropped, and then logs the request's line.
    struct Forwarded {
        first: Option<Bytes>,
        #[pin]
        inner: Incoming,
        received: u64,
        status: u16,
        held: Option<Held>,
        _sender: hyper::client::conn::http1::SendRequest<GatewayBody>,
    }

    impl PinnedDrop for Forwarded {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            if let Some(held) = this.held.take() {
                metrics::counter!("pa_gateway_bytes_total", "direction" => "received")
                    .increment(*this.received);
                tracing::info!(
                    pool = held.pool.as_str(),
                    proxy = %held.member.masked(),
                    target = held.target.as_str(),
                    status = *this.status,
                    received = *this.received,
                    duration_ms = u64::try_from(held.started.elapsed().as_millis()).unwrap_or(u64::MAX),
                    "gateway request forwarded"
                );
                // Dropping the hold releases the lease.
                drop(held.hold);
            }
        }
    }
}

impl Body for Forwarded {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.project();
        if let Some(first) = this.first.take() {
            *this.received += first.len() as u64;
            return Poll::Ready(Some(Ok(Frame::data(first))));
        }
        match this.inner.poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    *this.received += data.len() as u64;
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(error))) => Poll::Ready(Some(Err(Box::new(error)))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.first.is_none() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let mut hint = self.inner.size_hint();
        if let Some(first) = &self.first {
            // The upper bound first: a lower bound above the upper one panics.
            let n = first.len() as u64;
            let lower = hint.lower() + n;
            if let Some(upper) = hint.upper() {
                hint.set_upper(upper + n);
            }
            hint.set_lower(lower);
        }
        hint
    }
}
