//! One fetch of a proxy list from a URL, as a pool's sources need it: bounded in time and
//! size, following at most [`MAX_REDIRECTS`] redirects, and never dialling a non-public
//! address unless the pool allows private sources.
//!
//! Every hop (the source URL and each redirect target) goes through the same guard as the
//! checker's dials, [`guarded_addresses`]: a name is resolved here, the addresses the guard
//! refuses are dropped, and the request is pinned to what is left, so a name cannot resolve
//! to a public address for the guard and a private one for the connection. Redirects are
//! followed by this code rather than by the client for the same reason: each target is
//! guarded before anything is sent to it.
//!
//! Errors and URLs in logs never hold the URL's credentials ([`masked_url`]).

use std::net::SocketAddr;
use std::time::Duration;

use reqwest::Url;

use super::guarded_addresses;

/// Most redirects one fetch follows.
pub const MAX_REDIRECTS: usize = 3;

/// Why a fetch gave no list. The `Display` text is short, fixed per kind and holds no
/// credentials, so it may be logged and shown in the sources listing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FetchError {
    /// The URL (or a redirect's `Location`) is not an `http(s)` URL with a host.
    #[error("not an http(s) url")]
    BadUrl,
    /// The host is, or resolves only to, non-public addresses and the pool does not allow
    /// private sources. Nothing was dialled.
    #[error("private address refused")]
    Private,
    /// The host name did not resolve.
    #[error("host did not resolve")]
    Unresolved,
    /// More than [`MAX_REDIRECTS`] redirects.
    #[error("more than {MAX_REDIRECTS} redirects")]
    TooManyRedirects,
    /// The server answered with a status other than 2xx (or a redirect).
    #[error("status {0}")]
    Status(u16),
    /// The body is larger than the limit.
    #[error("larger than {0} bytes")]
    TooLarge(usize),
    /// The whole fetch, redirects and body included, took longer than the timeout.
    #[error("timed out")]
    Timeout,
    /// The connection or the request failed.
    #[error("request failed: {0}")]
    Request(String),
}

impl FetchError {
    /// A fixed code per kind, for the `outcome` label of `pa_source_fetches_total`.
    pub fn code(&self) -> &'static str {
        match self {
            Self::BadUrl => "bad_url",
            Self::Private => "private_address",
            Self::Unresolved => "unresolved",
            Self::TooManyRedirects => "too_many_redirects",
            Self::Status(_) => "status",
            Self::TooLarge(_) => "too_large",
            Self::Timeout => "timeout",
            Self::Request(_) => "request_failed",
        }
    }
}

/// Fetches lists with one set of bounds. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Fetcher {
    timeout: Duration,
    max_bytes: usize,
    /// Addresses the tests' loopback servers listen on, treated as public so that a test
    /// can serve a redirect to a private address with the guard on.
    #[cfg(test)]
    trusted: Vec<SocketAddr>,
}

impl Fetcher {
    /// A fetcher whose fetches take at most `timeout` in all and whose bodies hold at most
    /// `max_bytes`.
    pub fn new(timeout: Duration, max_bytes: usize) -> Self {
        Self {
            timeout,
            max_bytes,
            #[cfg(test)]
            trusted: Vec::new(),
        }
    }

    /// The body of `url`, after at most [`MAX_REDIRECTS`] redirects.
    ///
    /// # Errors
    /// See [`FetchError`]: every bound and every guard gives its own kind.
    pub async fn fetch(&self, url: &str, allow_private: bool) -> Result<Vec<u8>, FetchError> {
        let url = Url::parse(url).map_err(|_| FetchError::BadUrl)?;
        tokio::time::timeout(self.timeout, self.follow(url, allow_private))
            .await
            .map_err(|_| FetchError::Timeout)?
    }

    async fn follow(&self, mut url: Url, allow_private: bool) -> Result<Vec<u8>, FetchError> {
        for _ in 0..=MAX_REDIRECTS {
            let client = self.client_for(&url, allow_private).await?;
            let mut response = client
                .get(url.clone())
                .send()
                .await
                .map_err(|error| FetchError::Request(describe(&error)))?;
            let status = response.status();
            if status.is_redirection() {
                let location = response
                    .headers()
                    .get(reqwest::header::LOCATION)
                    .and_then(|value| value.to_str().ok())
                    .ok_or(FetchError::Status(status.as_u16()))?;
                url = url.join(location).map_err(|_| FetchError::BadUrl)?;
                continue;
            }
            if !status.is_success() {
                return Err(FetchError::Status(status.as_u16()));
            }
            if response
                .content_length()
                .is_some_and(|length| length > self.max_bytes as u64)
            {
                return Err(FetchError::TooLarge(self.max_bytes));
            }
            let mut body = Vec::new();
            while let Some(chunk) = response
                .chunk()
                .await
                .map_err(|error| FetchError::Request(describe(&error)))?
            {
                if body.len() + chunk.len() > self.max_bytes {
                    return Err(FetchError::TooLarge(self.max_bytes));
                }
                body.extend_from_slice(&chunk);
            }
            return Ok(body);
        }
        Err(FetchError::TooManyRedirects)
    }

    /// A client that can only reach `url`'s host at the addresses the guard let through.
    async fn client_for(
        &self,
        url: &Url,
        allow_private: bool,
    ) -> Result<reqwest::Client, FetchError> {
        if !matches!(url.scheme(), "http" | "https") {
            return Err(FetchError::BadUrl);
        }
        let host = url.host_str().ok_or(FetchError::BadUrl)?;
        let port = url.port_or_known_default().ok_or(FetchError::BadUrl)?;
        // Url keeps an IPv6 literal in brackets; the guard wants the bare address.
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        let addresses = self.guard(bare, port, allow_private).await?;
        reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .resolve_to_addrs(host, &addresses)
            .pool_max_idle_per_host(0)
            .user_agent("proxy-allocator-source")
            .build()
            .map_err(|error| FetchError::Request(describe(&error)))
    }

    async fn guard(
        &self,
        host: &str,
        port: u16,
        allow_private: bool,
    ) -> Result<Vec<SocketAddr>, FetchError> {
        #[cfg(test)]
        if let Ok(ip) = host.parse::<std::net::IpAddr>()
            && self.trusted.contains(&SocketAddr::new(ip, port))
        {
            return Ok(vec![SocketAddr::new(ip, port)]);
        }
        guarded_addresses(host, port, allow_private)
            .await
            .map_err(|error| match error.to_string().as_str() {
                "private address" => FetchError::Private,
                _ => FetchError::Unresolved,
            })
    }
}

/// `url` with its user name and password replaced by `***`, for logs and listings.
pub fn masked_url(url: &str) -> String {
    match Url::parse(url) {
        Ok(mut parsed) if !parsed.username().is_empty() || parsed.password().is_some() => {
            // Setting them fails only for URLs without a host, which have no userinfo.
            let _ = parsed.set_password(None);
            let _ = parsed.set_username("***");
            parsed.to_string()
        }
        Ok(parsed) => parsed.to_string(),
        Err(_) => "(unparsable url)".to_owned(),
    }
}

/// The innermost cause of a failed request, without the URL reqwest puts in its own text.
fn describe(error: &reqwest::Error) -> String {
    let mut cause: &dyn std::error::Error = error;
    while let Some(next) = cause.source() {
        cause = next;
    }
    cause.to_string()
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;

    /// A loopback server answering every connection with `reply(path)`, after `delay`.
    async fn serve(
        delay: Duration,
        reply: impl Fn(&str) -> Vec<u8> + Send + Sync + 'static,
    ) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("address");
        let reply = std::sync::Arc::new(reply);
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let reply = std::sync::Arc::clone(&reply);
                tokio::spawn(async move {
                    let mut head = vec![0; 4096];
                    let n = stream.read(&mut head).await.unwrap_or(0);
                    let text = String::from_utf8_lossy(&head[..n]).into_owned();
                    let path = text.split(' ').nth(1).unwrap_or("/").to_owned();
                    tokio::time::sleep(delay).await;
                    let _ = stream.write_all(&reply(&path)).await;
                });
            }
        });
        address
    }

    fn ok(body: &str) -> Vec<u8> {
        format!(
            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        )
        .into_bytes()
    }

    fn redirect(to: &str) -> Vec<u8> {
        format!(
            "HTTP/1.1 302 Found\r\nlocation: {to}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
        )
        .into_bytes()
    }

    fn fetcher() -> Fetcher {
        Fetcher::new(Duration::from_secs(5), 64)
    }

    #[tokio::test]
    async fn a_list_is_fetched_through_up_to_three_redirects_and_not_four() {
        let server = serve(Duration::ZERO, |path| match path {
            "/1" => redirect("/2"),
            "/2" => redirect("/3"),
            "/3" => redirect("/list"),
            "/0" => redirect("/1"),
            _ => ok("1.2.3.4:8080\n"),
        })
        .await;
        let fetched = fetcher().fetch(&format!("http://{server}/1"), true).await;
        assert_eq!(fetched, Ok(b"1.2.3.4:8080\n".to_vec()));
        let refused = fetcher().fetch(&format!("http://{server}/0"), true).await;
        assert_eq!(refused, Err(FetchError::TooManyRedirects));
    }

    #[tokio::test]
    async fn a_private_source_or_a_redirect_to_a_private_address_is_refused_before_dialling() {
        // 10.0.0.1 is never answered here: a dial would end in the 5 s timeout, not in
        // `Private` at once.
        let server = serve(Duration::ZERO, |path| match path {
            "/ten" => redirect("http://10.0.0.1:9/list"),
            _ => redirect("http://localhost:9/list"),
        })
        .await;
        let mut fetcher = fetcher();
        let direct = fetcher.fetch(&format!("http://{server}/ten"), false).await;
        assert_eq!(direct, Err(FetchError::Private));
        fetcher.trusted.push(server);
        let started = tokio::time::Instant::now();
        let to_ten = fetcher.fetch(&format!("http://{server}/ten"), false).await;
        assert_eq!(to_ten, Err(FetchError::Private));
        assert!(started.elapsed() < Duration::from_secs(1));
        let to_localhost = fetcher.fetch(&format!("http://{server}/name"), false).await;
        assert_eq!(to_localhost, Err(FetchError::Private));
    }

    #[tokio::test]
    async fn an_oversized_or_slow_or_failing_source_fails_with_its_own_error() {
        let big = serve(Duration::ZERO, |_| ok(&"x".repeat(65))).await;
        let chunked = serve(Duration::ZERO, |_| {
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n40\r\nxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\r\n1\r\nx\r\n0\r\n\r\n".to_vec()
        })
        .await;
        let slow = serve(Duration::from_secs(10), |_| ok("late")).await;
        let missing = serve(Duration::ZERO, |_| {
            b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n".to_vec()
        })
        .await;
        let fetcher = Fetcher::new(Duration::from_millis(300), 64);
        let exact = serve(Duration::ZERO, |_| ok(&"x".repeat(64))).await;
        assert_eq!(
            fetcher.fetch(&format!("http://{exact}/"), true).await,
            Ok(vec![b'x'; 64])
        );
        assert_eq!(
            fetcher.fetch(&format!("http://{big}/"), true).await,
            Err(FetchError::TooLarge(64))
        );
        assert_eq!(
            fetcher.fetch(&format!("http://{chunked}/"), true).await,
            Err(FetchError::TooLarge(64))
        );
        assert_eq!(
            fetcher.fetch(&format!("http://{slow}/"), true).await,
            Err(FetchError::Timeout)
        );
        assert_eq!(
            fetcher.fetch(&format!("http://{missing}/"), true).await,
            Err(FetchError::Status(404))
        );
        assert_eq!(
            fetcher.fetch("ftp://example.com/list", true).await,
            Err(FetchError::BadUrl)
        );
    }

    #[test]
    fn a_urls_credentials_are_masked() {
        assert_eq!(
            masked_url("https://user:secret@lists.example/p?x=1"),
            "https://***@lists.example/p?x=1"
        );
        assert_eq!(
            masked_url("http://lists.example/p"),
            "http://lists.example/p"
        );
    }
}
