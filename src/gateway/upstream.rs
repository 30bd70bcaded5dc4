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
use hyper_util::client::legacy::connect::proxy::{SocksV4, SocksV5, Tunnel};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
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
    Failed(String),
}

fn failed(what: &str, error: impl std::fmt::Display) -> DialError {
    DialError::Failed(format!("{what}: {error}"))
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
            (None, Some(error)) => return Err(failed("connecting to the proxy", error.kind())),
            (None, None) => return Err(DialError::Failed("no address".to_owned())),
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
            Scheme::Http | Scheme::Https => {
                let mut tunnel = Tunnel::new(proxy, connector);
                if let Some(authorization) = upstream.authorization() {
                    tunnel = tunnel.with_auth(authorization);
                }
                tunnel
                    .call(target)
                    .await
                    .map_err(|error| failed("CONNECT through the proxy", error))?
            }
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

#[cfg(test)]
mod tests {
    use super::*;

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
