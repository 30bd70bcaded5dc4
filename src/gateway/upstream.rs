//! Dialling a member: its proxy address read from its id, and the handshake its scheme
//! needs (`CONNECT` through an `http` or `https` proxy, SOCKS4/4a, SOCKS5 with or without
//! a user name and password), with the member's own credentials.
//!
//! The only address this module connects to is the member's proxy, and only when it is
//! public or the pool's rules allow private addresses (checked on every address a name
//! resolves to, through the checker's [`guarded_addresses`]). A target is only ever named
//! to the upstream proxy, never connected to.

use std::net::SocketAddr;
use std::sync::Arc;

use base64::Engine;
use hyper::Uri;
use hyper::http::HeaderValue;
use hyper_util::client::legacy::connect::proxy::{SocksV4, SocksV5};
use hyper_util::rt::TokioIo;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tower::Service;

use crate::checker::{guarded_addresses, percent_decode};
use crate::domain::{Candidate, Host, MemberId, Scheme, looks_like_address};

/// A byte stream to an upstream: TCP, or TLS over TCP to an `https` proxy.
pub trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Stream for T {}

/// A connected upstream stream.
pub type Connection = Box<dyn Stream>;

/// A member's proxy, as its id names it.
#[derive(Clone)]
pub struct Upstream {
    scheme: Scheme,
    host: Host,
    port: u16,
    /// User name and password, percent-decoded.
    credentials: Option<(String, String)>,
}

impl std::fmt::Debug for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upstream")
            .field("scheme", &self.scheme)
            .field("host", &self.host)
            .field("port", &self.port)
            .finish_non_exhaustive()
    }
}

/// Why a dial failed.
#[derive(Debug, thiserror::Error)]
pub enum DialError {
    /// The proxy's address is not public and the pool's rules do not allow private ones:
    /// nothing was dialled. The pool's configuration, not the member, is at fault.
    #[error("the member's address is not public and the pool does not allow private addresses")]
    PrivateAddress,
    /// The connection, the TLS handshake or the proxy handshake failed; credential-free.
    #[error("{0}")]
    Failed(DialFailure),
}

/// A failed dial: what kind of failure, and a credential-free sentence saying what failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct DialFailure {
    /// Which kind of failure, as `Proxy-Status` names it.
    pub kind: FailureKind,
    /// What failed, with no credential and no address in it.
    pub message: String,
}

/// The kinds of failure a client is told apart (`Proxy-Status`'s `error`, RFC 9209).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureKind {
    /// The proxy refused the connection.
    Refused,
    /// The proxy did not connect, hand shake or answer in time.
    TimedOut,
    /// The proxy answered the tunnel's `CONNECT` with a refusal of its own (407, 5xx).
    ProxyAnswer,
    /// Any other failure to reach the destination through the proxy (TLS, SOCKS, a
    /// broken connection).
    Unreachable,
    /// The target's answer (through the proxy) did not start within the pool's
    /// `response_timeout_ms`.
    ResponseTimedOut,
}

impl FailureKind {
    /// The RFC 9209 error type.
    pub fn proxy_status_error(self) -> &'static str {
        match self {
            Self::Refused => "connection_refused",
            Self::TimedOut => "connection_timeout",
            Self::ProxyAnswer => "proxy_internal_response",
            Self::Unreachable => "destination_unavailable",
            Self::ResponseTimedOut => "http_response_timeout",
        }
    }
}

impl DialFailure {
    /// A failure of `kind` saying `message`.
    pub fn new(kind: FailureKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }
}

fn failed(what: &str, error: impl std::fmt::Display) -> DialError {
    failed_as(FailureKind::Unreachable, what, error)
}

fn failed_as(kind: FailureKind, what: &str, error: impl std::fmt::Display) -> DialError {
    DialError::Failed(DialFailure::new(kind, format!("{what}: {error}")))
}

impl Upstream {
    /// The proxy a member id names; `None` for ids that are not proxy addresses (opaque
    /// names such as `dc-fra-07`), which the gateway cannot dial.
    pub fn parse(member: &MemberId) -> Option<Self> {
        let text = member.as_str();
        if !looks_like_address(text) {
            return None;
        }
        let candidate = Candidate::parse(text, Scheme::Http).ok()?;
        let credentials = candidate.has_credentials().then(|| {
            let after_scheme = text.find("://").map_or(0, |i| i + 3);
            let authority = &text[after_scheme..];
            let userinfo = authority.rfind('@').map_or("", |at| &authority[..at]);
            let (user, pass) = userinfo.split_once(':').unwrap_or((userinfo, ""));
            (percent_decode(user), percent_decode(pass))
        });
        Some(Self {
            scheme: candidate.scheme(),
            host: candidate.host().clone(),
            port: candidate.port(),
            credentials,
        })
    }

    /// The proxy's scheme.
    pub fn scheme(&self) -> Scheme {
        self.scheme
    }

    /// `Proxy-Authorization` for an `http`/`https` proxy with credentials.
    pub fn authorization(&self) -> Option<HeaderValue> {
        let (user, pass) = self.credentials.as_ref()?;
        let encoded = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pass}"));
        HeaderValue::from_str(&format!("Basic {encoded}")).ok()
    }

    fn host_text(&self) -> String {
        match &self.host {
            Host::Ip(ip) => ip.to_string(),
            Host::Name(name) => name.clone(),
        }
    }

    /// The proxy as a URI, for the handshake code (which only reads it).
    fn uri(&self) -> Uri {
        let host = match &self.host {
            Host::Ip(std::net::IpAddr::V6(v6)) => format!("[{v6}]"),
            _ => self.host_text(),
        };
        // Host and port were parsed from a member id; a URI of them always parses.
        format!("{}://{host}:{}", self.scheme, self.port)
            .parse()
            .unwrap_or_default()
    }
}

/// Dials members; one per gateway, shared by all its requests. Cloning is shallow.
#[derive(Clone)]
pub struct Dialer {
    tls: tokio_rustls::TlsConnector,
}

impl Default for Dialer {
    fn default() -> Self {
        Self::new(Vec::new())
    }
}

impl Dialer {
    /// A dialer that trusts the Mozilla roots and `extra_roots` for `https` proxies.
    pub fn new(extra_roots: Vec<tokio_rustls::rustls::pki_types::CertificateDer<'static>>) -> Self {
        let mut roots = tokio_rustls::rustls::RootCertStore::empty();
        roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        for root in extra_roots {
            let _ = roots.add(root);
        }
        let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
        let config = tokio_rustls::rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map(|builder| builder.with_root_certificates(roots).with_no_client_auth());
        // The ring provider supports its own default protocol versions.
        let config = config.unwrap_or_else(|_| {
            tokio_rustls::rustls::ClientConfig::builder()
                .with_root_certificates(tokio_rustls::rustls::RootCertStore::empty())
                .with_no_client_auth()
        });
        Self {
            tls: tokio_rustls::TlsConnector::from(Arc::new(config)),
        }
    }

    /// A connection to the proxy itself: TCP to the first of its addresses that answers
    /// (each one checked against the private-address rule first), then TLS for `https`.
    ///
    /// # Errors
    /// [`DialError::PrivateAddress`] before any connection when the rule refuses every
    /// address; [`DialError::Failed`] when none connects or TLS fails.
    pub async fn connect_proxy(
        &self,
        upstream: &Upstream,
        allow_private: bool,
    ) -> Result<Connection, DialError> {
        let host = upstream.host_text();
        let addresses: Vec<SocketAddr> = guarded_addresses(&host, upstream.port, allow_private)
            .await
            .map_err(|error| {
                if error.to_string() == "private address" {
                    DialError::PrivateAddress
                } else {
                    failed("resolving the proxy", error)
                }
            })?;
        let mut last = None;
        let mut tcp = None;
        for address in addresses {
            match TcpStream::connect(address).await {
                Ok(stream) => {
                    tcp = Some(stream);
                    break;
                }
                Err(error) => last = Some(error),
            }
        }
        let tcp = match (tcp, last) {
            (Some(tcp), _) => tcp,
            (None, Some(error)) => {
                let kind = match error.kind() {
                    std::io::ErrorKind::ConnectionRefused => FailureKind::Refused,
                    std::io::ErrorKind::TimedOut => FailureKind::TimedOut,
                    _ => FailureKind::Unreachable,
                };
                return Err(failed_as(kind, "connecting to the proxy", error.kind()));
            }
            (None, None) => return Err(failed("resolving the proxy", "no address")),
        };
        let _ = tcp.set_nodelay(true);
        if upstream.scheme != Scheme::Https {
            return Ok(Box::new(tcp));
        }
        let name = tokio_rustls::rustls::pki_types::ServerName::try_from(host)
            .map_err(|error| failed("the proxy's TLS name", error))?;
        let tls = self
            .tls
            .connect(name, tcp)
            .await
            .map_err(|error| failed("TLS to the proxy", error))?;
        Ok(Box::new(tls))
    }

    /// A stream to `host:port` through the member: a `CONNECT` tunnel through an HTTP(S)
    /// proxy, or a SOCKS connection.
    ///
    /// # Errors
    /// As [`Dialer::connect_proxy`], and [`DialError::Failed`] when the proxy refuses or
    /// breaks the handshake.
    pub async fn tunnel(
        &self,
        upstream: &Upstream,
        host: &str,
        port: u16,
        allow_private: bool,
    ) -> Result<Connection, DialError> {
        let connection = self.connect_proxy(upstream, allow_private).await?;
        if matches!(upstream.scheme, Scheme::Http | Scheme::Https) {
            // Our own CONNECT rather than hyper-util's tunnel, which drops whatever arrives
            // with the proxy's answer: see `connect_through`.
            return connect_through(connection, host, port, upstream.authorization()).await;
        }
        let target: Uri = format!("http://{host}:{port}")
            .parse()
            .map_err(|error| failed("the target", error))?;
        let proxy = upstream.uri();
        let mut ready = Some(TokioIo::new(connection));
        let connector = tower::service_fn(move |_: Uri| {
            let connection = ready.take();
            async move { connection.ok_or_else(|| std::io::Error::other("used once")) }
        });
        let connected = match upstream.scheme {
            // Dialled by connect_through above.
            Scheme::Http | Scheme::Https => return Err(failed("the proxy's scheme", "http")),
            Scheme::Socks5 | Scheme::Socks5h => {
                let mut socks =
                    SocksV5::new(proxy, connector).local_dns(upstream.scheme == Scheme::Socks5);
                if let Some((user, pass)) = upstream.credentials.clone() {
                    socks = socks.with_auth(user, pass);
                }
                socks
                    .call(target)
                    .await
                    .map_err(|error| failed("SOCKS5 handshake", error))?
            }
            Scheme::Socks4 => SocksV4::new(proxy, connector)
                .local_dns(false)
                .call(target)
                .await
                .map_err(|error| failed("SOCKS4 handshake", error))?,
        };
        Ok(connected.into_inner())
    }
}

/// The most an HTTP proxy's answer head to a CONNECT may take.
const CONNECT_HEAD_LIMIT: usize = 8192;

/// Opens a CONNECT tunnel to `host:port` (a host the gateway took as the assign's
/// [`Target`](crate::domain::Target), an IPv6 literal in brackets) through the HTTP(S) proxy
/// at the other end of `connection`. Whatever the proxy sent after its answer's head, in the same reads, is the
/// tunnel's first bytes (a target that speaks first, or a proxy that writes both at once):
/// it is handed on before anything read later, never dropped.
async fn connect_through(
    mut connection: Connection,
    host: &str,
    port: u16,
    authorization: Option<HeaderValue>,
) -> Result<Connection, DialError> {
    let what = "CONNECT through the proxy";
    let mut port_text = itoa::Buffer::new();
    let port = port_text.format(port);
    let mut request = Vec::with_capacity(128);
    for part in [
        "CONNECT ",
        host,
        ":",
        port,
        " HTTP/1.1\r\nHost: ",
        host,
        ":",
        port,
        "\r\n",
    ] {
        request.extend_from_slice(part.as_bytes());
    }
    if let Some(authorization) = authorization {
        request.extend_from_slice(b"Proxy-Authorization: ");
        request.extend_from_slice(authorization.as_bytes());
        request.extend_from_slice(b"\r\n");
    }
    request.extend_from_slice(b"\r\n");
    connection
        .write_all(&request)
        .await
        .map_err(|error| failed(what, error))?;
    // Read straight into the head's spare room, never zeroed: an answer is one read.
    let mut head = Vec::with_capacity(1024);
    loop {
        if head.len() == head.capacity() {
            head.reserve(1024);
        }
        let searched = head.len().saturating_sub(3);
        let n = connection
            .read_buf(&mut head)
            .await
            .map_err(|error| failed(what, error))?;
        if n == 0 {
            return Err(failed(what, "the proxy closed the connection"));
        }
        if let Some(end) = head[searched..]
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .map(|at| searched + at)
        {
            let rest = head.split_off(end + 4);
            return match status_code(&head) {
                Some(200..=299) if rest.is_empty() => Ok(connection),
                Some(200..=299) => Ok(Box::new(Prefixed {
                    first: rest,
                    at: 0,
                    inner: connection,
                })),
                Some(407) => Err(failed_as(
                    FailureKind::ProxyAnswer,
                    what,
                    "the proxy refused the member's credentials (407)",
                )),
                Some(code) => Err(failed_as(
                    FailureKind::ProxyAnswer,
                    what,
                    format!("the proxy answered {code}"),
                )),
                None => Err(failed(what, "the proxy's answer is not HTTP")),
            };
        }
        if head.len() > CONNECT_HEAD_LIMIT {
            return Err(failed(what, "the proxy's answer head is too long"));
        }
    }
}

/// The status code of an HTTP/1 answer head (`HTTP/1.x NNN ...`).
fn status_code(head: &[u8]) -> Option<u16> {
    let line = head.split(|b| *b == b'\r').next()?;
    let mut parts = line.split(|b| *b == b' ');
    let version = parts.next()?;
    if !version.starts_with(b"HTTP/1.") {
        return None;
    }
    std::str::from_utf8(parts.next()?).ok()?.parse().ok()
}

/// A tunnel whose first bytes were read with the proxy's answer: they come first.
struct Prefixed {
    first: Vec<u8>,
    at: usize,
    inner: Connection,
}

impl AsyncRead for Prefixed {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if this.at < this.first.len() {
            let n = (this.first.len() - this.at).min(buf.remaining());
            buf.put_slice(&this.first[this.at..this.at + n]);
            this.at += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for Prefixed {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn bytes_that_arrive_with_the_proxy_s_answer_are_the_tunnel_s_first() {
        let (client, mut proxy) = tokio::io::duplex(1 << 16);
        let answering = tokio::spawn(async move {
            let mut request = vec![0_u8; 1024];
            let n = proxy.read(&mut request).await.expect("the request");
            // The answer and the target's first bytes in one write, as a proxy relaying a
            // target that speaks first may send them.
            proxy
                .write_all(b"HTTP/1.1 200 Connection established\r\n\r\nhello from the target")
                .await
                .expect("answered");
            proxy.write_all(b", and more").await.expect("more");
            drop(proxy);
            String::from_utf8(request[..n].to_vec()).expect("text")
        });
        let mut tunnel = connect_through(
            Box::new(client),
            "shop.example",
            443,
            Some(HeaderValue::from_static("Basic dXNlcjpwYXNz")),
        )
        .await
        .expect("a tunnel");
        let mut received = String::new();
        tunnel
            .read_to_string(&mut received)
            .await
            .expect("the tunnel's bytes");
        assert_eq!(received, "hello from the target, and more");
        assert_eq!(
            answering.await.expect("the proxy"),
            "CONNECT shop.example:443 HTTP/1.1\r\nHost: shop.example:443\r\n\
             Proxy-Authorization: Basic dXNlcjpwYXNz\r\n\r\n"
        );
    }

    #[tokio::test]
    async fn an_answer_that_arrives_a_byte_at_a_time_opens_the_tunnel() {
        // A pipe of one byte: every read of the answer gets one byte.
        let (client, mut proxy) = tokio::io::duplex(1);
        tokio::spawn(async move {
            let mut request = Vec::new();
            while !request.ends_with(b"\r\n\r\n") {
                request.push(proxy.read_u8().await.expect("the request"));
            }
            proxy
                .write_all(b"HTTP/1.1 200 Connection established\r\nVia: 1.1 p\r\n\r\nhi")
                .await
                .expect("answered");
        });
        let mut tunnel = connect_through(Box::new(client), "[2001:db8::1]", 8443, None)
            .await
            .expect("a tunnel");
        let mut first = [0; 2];
        tunnel
            .read_exact(&mut first)
            .await
            .expect("the tunnel's bytes");
        assert_eq!(&first, b"hi");
    }

    #[tokio::test]
    async fn a_connect_answered_407_or_500_is_a_failed_dial() {
        for (answer, says) in [
            (
                &b"HTTP/1.1 407 Proxy Authentication Required\r\n\r\n"[..],
                "407",
            ),
            (&b"HTTP/1.0 500 Oops\r\n\r\n"[..], "answered 500"),
        ] {
            let (client, mut proxy) = tokio::io::duplex(1 << 16);
            tokio::spawn(async move {
                let mut request = vec![0_u8; 1024];
                let _ = proxy.read(&mut request).await;
                let _ = proxy.write_all(answer).await;
            });
            match connect_through(Box::new(client), "shop.example", 443, None).await {
                Err(DialError::Failed(failure)) => {
                    assert_eq!(failure.kind, FailureKind::ProxyAnswer);
                    assert!(failure.message.contains(says), "{failure}");
                }
                Err(other) => panic!("{other}"),
                Ok(_) => panic!("a tunnel through a refusing proxy"),
            }
        }
    }

    fn upstream(text: &str) -> Option<Upstream> {
        Upstream::parse(&MemberId::parse(text).expect("an id"))
    }

    #[test]
    fn a_proxy_url_gives_its_scheme_address_and_decoded_credentials() {
        let parsed = upstream("socks5://us%40er:p%3Ass@10.0.0.1:1080").expect("a proxy");
        assert_eq!(parsed.scheme(), Scheme::Socks5);
        assert_eq!(parsed.host_text(), "10.0.0.1");
        assert_eq!(parsed.port, 1080);
        assert_eq!(
            parsed.credentials,
            Some(("us@er".to_owned(), "p:ss".to_owned()))
        );
        let http = upstream("http://user:pass@proxy.example:3128").expect("a proxy");
        assert_eq!(
            http.authorization(),
            Some(HeaderValue::from_static("Basic dXNlcjpwYXNz"))
        );
        assert_eq!(
            upstream("http://[::1]:8080").map(|u| u.uri()),
            Some(Uri::from_static("http://[::1]:8080"))
        );
    }

    #[test]
    fn opaque_ids_are_not_proxies() {
        assert!(upstream("dc-fra-07").is_none());
        assert!(upstream("no-port.example").is_none());
    }
}
