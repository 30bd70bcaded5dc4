//! One probe of one proxy: a TCP connect, or a `GET` of the check URL through the proxy
//! with reqwest, whatever kind of proxy the member is.
//!
//! reqwest speaks every scheme a member may have: `http` (absolute-form requests, CONNECT
//! for `https` targets), `https` (the same over TLS to the proxy), `socks4` and `socks5`
//! (target names resolved here) and `socks5h` (resolved by the proxy), with the member's
//! credentials. TLS (rustls) is verified, certificate chain and host name, against the
//! Mozilla roots compiled in plus the check's `ca_pem`, parsed once per round ([`Prober`]).
//!
//! Everything this module dials goes through [`guarded_addresses`] or [`GuardedResolver`]:
//! unless the pool's rules allow private addresses, a proxy (or, for `socks4`/`socks5`, a
//! target name resolved here) that is or resolves to a non-public address is refused
//! before any connection is opened.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::domain::{
    CHECK_BODY_WINDOW_BYTES, CheckConfig, CheckKind, Host, MemberId, OutcomeResult,
};

/// Where a member's proxy listens, parsed from its id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyAddr {
    scheme: Option<String>,
    host: String,
    port: u16,
    /// The password from the id, percent-decoded: it is cut out of every detail a probe
    /// reports, whatever an error message might echo.
    password: Option<String>,
    /// `scheme://[userinfo@]host:port` as written in the id, for the HTTP client.
    url: String,
}

impl ProxyAddr {
    /// Reads `[scheme://][user:pass@]host:port[/...]` (IPv6 hosts in brackets). `None`
    /// for ids that name no port, which cannot be probed.
    pub fn parse(member: &MemberId) -> Option<Self> {
        let text = member.as_str();
        let (scheme, rest) = match text.split_once("://") {
            Some((scheme, rest)) => (Some(scheme.to_ascii_lowercase()), rest),
            None => (None, text),
        };
        let authority = rest.split('/').next().unwrap_or(rest);
        let (password, host_port) = match authority.rsplit_once('@') {
            Some((userinfo, host_port)) => (
                userinfo
                    .split_once(':')
                    .map(|(_, pass)| percent_decode(pass)),
                host_port,
            ),
            None => (None, authority),
        };
        let (host, port) = host_port.rsplit_once(':')?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let port = port.parse::<u16>().ok().filter(|p| *p != 0)?;
        let url = format!("{}://{authority}", scheme.as_deref().unwrap_or("http"));
        (!host.is_empty()).then(|| Self {
            scheme,
            host: host.to_owned(),
            port,
            password,
            url,
        })
    }

    /// `detail` with the member's password (if any) replaced by `***`.
    fn redact(&self, detail: String) -> String {
        match self.password.as_deref() {
            Some(password) if !password.is_empty() => detail.replace(password, "***"),
            _ => detail,
        }
    }
}

/// What one round needs to probe its members: the check, the pool's private-address rule,
/// and for `http` checks the extra trusted certificates and request headers, parsed once.
pub struct Prober {
    check: CheckConfig,
    allow_private: bool,
    roots: Vec<reqwest::Certificate>,
    headers: HeaderMap,
}

impl Prober {
    /// Prepares a round of `check` in a pool whose rules do (or do not) allow private
    /// addresses.
    ///
    /// # Errors
    /// A block of `check.ca_pem` is not a certificate.
    pub fn new(check: CheckConfig, allow_private: bool) -> Result<Self, reqwest::Error> {
        let mut headers = HeaderMap::new();
        let mut roots = Vec::new();
        if check.kind == CheckKind::Http {
            if let Some(pem) = check.ca_pem.as_deref() {
                roots = reqwest::Certificate::from_pem_bundle(pem.as_bytes())?;
                // Certificates are parsed when a client trusts them: one client now, so that
                // a block that is no certificate stops the round before any probe.
                let mut builder = reqwest::Client::builder();
                for root in &roots {
                    builder = builder.add_root_certificate(root.clone());
                }
                builder.build()?;
            }
            for (name, value) in &check.headers {
                // Both were checked when the configuration was accepted.
                if let (Ok(name), Ok(value)) = (
                    HeaderName::from_bytes(name.as_bytes()),
                    HeaderValue::from_str(value),
                ) {
                    headers.insert(name, value);
                }
            }
        }
        Ok(Self {
            check,
            allow_private,
            roots,
            headers,
        })
    }

    /// The check this prober runs.
    pub fn check(&self) -> &CheckConfig {
        &self.check
    }

    /// Probes `addr` within the check's timeout: the result, what was seen, and how long it
    /// took when there was an answer.
    pub async fn probe(&self, addr: &ProxyAddr) -> Probed {
        let timeout = Duration::from_millis(self.check.timeout_ms);
        let started = Instant::now();
        let (result, detail, latency_ms, exit_ip) =
            match tokio::time::timeout(timeout, self.attempt(addr)).await {
                Ok(Ok(seen)) => {
                    let took = started.elapsed();
                    let (result, detail) = judge(&seen, took, &self.check);
                    let exit_ip = match seen {
                        Seen::Answer { exit_ip, .. } => exit_ip,
                        Seen::Connected => ExitIp::NotRead,
                    };
                    (result, detail, Some(millis(took)), exit_ip)
                }
                Ok(Err(detail)) => (OutcomeResult::Failed, detail, None, ExitIp::NotRead),
                Err(_) => (
                    OutcomeResult::Failed,
                    "timeout".to_owned(),
                    None,
                    ExitIp::NotRead,
                ),
            };
        Probed {
            result,
            detail: addr.redact(detail),
            latency_ms,
            exit_ip,
        }
    }

    async fn attempt(&self, addr: &ProxyAddr) -> Result<Seen, String> {
        match (self.check.kind, self.check.url.as_deref()) {
            (CheckKind::Http, Some(url)) => self.fetch(addr, url).await,
            _ => {
                let addresses = guarded_addresses(&addr.host, addr.port, self.allow_private)
                    .await
                    .map_err(|error| describe_io(&error))?;
                TcpStream::connect(addresses.as_slice())
                    .await
                    .map_err(|error| describe_io(&error))?;
                Ok(Seen::Connected)
            }
        }
    }

    /// `GET url` through the proxy; the body is read only as far as `expect_body` needs.
    async fn fetch(&self, addr: &ProxyAddr, url: &str) -> Result<Seen, String> {
        if !matches!(
            addr.scheme.as_deref(),
            None | Some("http" | "https" | "socks4" | "socks5" | "socks5h")
        ) {
            return Err("unsupported proxy scheme".to_owned());
        }
        // IP literals never reach a resolver, so the private-address rule is applied to
        // them here; names are checked by the resolver when they are looked up.
        if let Ok(ip) = addr.host.parse::<IpAddr>()
            && !self.allow_private
            && Host::Ip(ip).is_non_public()
        {
            return Err("private address".to_owned());
        }
        let proxy = reqwest::Proxy::all(&addr.url).map_err(|_| "unusable proxy address")?;
        let mut builder = reqwest::Client::builder();
        for root in &self.roots {
            builder = builder.add_root_certificate(root.clone());
        }
        let client = builder
            .proxy(proxy)
            .dns_resolver(Arc::new(GuardedResolver {
                allow_private: self.allow_private,
            }))
            // A check judges the answer of the URL it names, not of wherever it points.
            .redirect(reqwest::redirect::Policy::none())
            .pool_max_idle_per_host(0)
            .user_agent("proxy-allocator-check")
            .default_headers(self.headers.clone())
            .build()
            .map_err(|error| describe(&error))?;
        let mut response = client
            .get(url)
            .send()
            .await
            .map_err(|error| describe(&error))?;
        let status = response.status().as_u16();
        // The exit address is read only from an answer the check accepts: an error page
        // holds no address, and is not worth counting as an unreadable one.
        let read_exit = self.check.exit_ip && self.check.expect_status.contains(&status);
        let expected = self.check.expect_body.as_deref();
        if expected.is_none() && !read_exit {
            return Ok(Seen::Answer {
                status,
                body_matches: true,
                exit_ip: ExitIp::NotRead,
            });
        }
        let mut body = Vec::new();
        while body.len() < CHECK_BODY_WINDOW_BYTES {
            match response.chunk().await {
                Ok(Some(chunk)) => body.extend_from_slice(&chunk),
                Ok(None) => break,
                Err(error) => return Err(describe(&error)),
            }
        }
        body.truncate(CHECK_BODY_WINDOW_BYTES);
        Ok(Seen::Answer {
            status,
            body_matches: expected.is_none_or(|expected| contains(&body, expected.as_bytes())),
            exit_ip: if read_exit {
                parse_exit_ip(&body).map_or(ExitIp::Unreadable, ExitIp::Seen)
            } else {
                ExitIp::NotRead
            },
        })
    }
}

/// What an `exit_ip` check read from its answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitIp {
    /// The check does not ask for it, or got no answer with an expected status.
    NotRead,
    /// The address the target saw the probe come from.
    Seen(IpAddr),
    /// The answer held no address (garbage, a block page, a name): nothing is recorded.
    Unreadable,
}

/// The caller's address in an echo service's answer: the whole body as text (ipify,
/// `curl ifconfig.me`), or a JSON object's `ip` (ipify's JSON) or `origin` (httpbin). A
/// list `"a, b"` (httpbin behind forwarding proxies) gives its last entry: the address
/// that connected to the target, which is the proxy's exit. Anything else is `None`.
pub fn parse_exit_ip(body: &[u8]) -> Option<IpAddr> {
    let text = std::str::from_utf8(body).ok()?.trim();
    let text = if text.starts_with('{') {
        let value: serde_json::Value = serde_json::from_str(text).ok()?;
        let field = value.get("ip").or_else(|| value.get("origin"))?;
        field.as_str()?.rsplit(',').next()?.trim().to_owned()
    } else {
        text.to_owned()
    };
    text.parse().ok()
}

/// What one probe concluded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probed {
    /// The result fed into the health rules.
    pub result: OutcomeResult,
    /// What was seen, credential-free.
    pub detail: String,
    /// Milliseconds from the start of the probe to its answer (none without an answer).
    pub latency_ms: Option<u64>,
    /// For `exit_ip` checks: the address the target saw.
    pub exit_ip: ExitIp,
}

fn millis(took: Duration) -> u64 {
    u64::try_from(took.as_millis()).unwrap_or(u64::MAX)
}

/// What a probe saw before it was judged.
enum Seen {
    /// A TCP check connected.
    Connected,
    /// An HTTP check got an answer.
    Answer {
        status: u16,
        body_matches: bool,
        exit_ip: ExitIp,
    },
}

fn judge(seen: &Seen, took: Duration, check: &CheckConfig) -> (OutcomeResult, String) {
    let &Seen::Answer {
        status,
        body_matches,
        ..
    } = seen
    else {
        return (OutcomeResult::Ok, "connected".to_owned());
    };
    let took_ms = millis(took);
    if !check.expect_status.contains(&status) {
        let result = if matches!(status, 403 | 429) {
            OutcomeResult::Blocked
        } else {
            OutcomeResult::Failed
        };
        return (result, format!("status {status}"));
    }
    if !body_matches {
        // A 200 with a block page: the proxy works, the target refuses it.
        return (
            OutcomeResult::Blocked,
            format!("status {status} without the expected body"),
        );
    }
    match check.max_latency_ms {
        Some(max) if took_ms > max => (
            OutcomeResult::Failed,
            format!("status {status} after {took_ms} ms, over max_latency_ms {max}"),
        ),
        _ => (OutcomeResult::Ok, format!("status {status}")),
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    needle.is_empty()
        || haystack
            .windows(needle.len())
            .any(|window| window == needle)
}

/// The addresses `host:port` may be dialled at: an IP literal as it is, a name resolved,
/// and either way without non-public addresses unless `allow_private`.
///
/// # Errors
/// The name did not resolve, or only to addresses the rule refuses.
pub async fn guarded_addresses(
    host: &str,
    port: u16,
    allow_private: bool,
) -> std::io::Result<Vec<SocketAddr>> {
    let found: Vec<SocketAddr> = match host.parse::<IpAddr>() {
        Ok(ip) => vec![SocketAddr::new(ip, port)],
        Err(_) => tokio::net::lookup_host((host, port)).await?.collect(),
    };
    let allowed: Vec<SocketAddr> = found
        .iter()
        .copied()
        .filter(|address| allow_private || !Host::Ip(address.ip()).is_non_public())
        .collect();
    match (found.is_empty(), allowed.is_empty()) {
        (true, _) => Err(std::io::Error::other("no address")),
        (false, true) => Err(std::io::Error::other("private address")),
        (false, false) => Ok(allowed),
    }
}

/// The HTTP client's resolver: [`guarded_addresses`] for every name it looks up (the
/// proxy's, and a `socks4`/`socks5` target's).
struct GuardedResolver {
    allow_private: bool,
}

impl reqwest::dns::Resolve for GuardedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let allow_private = self.allow_private;
        Box::pin(async move {
            let addresses = guarded_addresses(name.as_str(), 0, allow_private).await?;
            Ok(Box::new(addresses.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

/// A short, credential-free description of a failed request: the I/O error kind when there
/// is one, the TLS verification failure, or the innermost cause.
fn describe(error: &reqwest::Error) -> String {
    if error.is_timeout() {
        return "timeout".to_owned();
    }
    let mut chain: Vec<&(dyn std::error::Error + 'static)> = vec![error];
    while let Some(next) = chain.last().and_then(|e| e.source()) {
        if let Some(io) = next.downcast_ref::<std::io::Error>()
            && io.get_ref().is_none()
        {
            return describe_io(io);
        }
        chain.push(next);
    }
    // rustls names what was wrong with the certificate ("invalid peer certificate: ...").
    if let Some(reason) = chain.iter().find_map(|e| {
        e.to_string()
            .strip_prefix("invalid peer certificate: ")
            .map(str::to_owned)
    }) {
        return printable(&format!("tls: {reason}"));
    }
    let innermost = chain.last().copied().unwrap_or(error);
    let text = innermost.to_string();
    // The SOCKS connector keeps the failed connection's error out of its `source()`; its
    // debug form still names the kind, which makes the detail the same as for HTTP proxies.
    if text.ends_with("failed to create underlying connection") {
        let debug = format!("{innermost:?}");
        for (kind, detail) in [
            ("ConnectionRefused", "connection refused"),
            ("ConnectionReset", "connection reset"),
        ] {
            if debug.contains(kind) {
                return detail.to_owned();
            }
        }
    }
    printable(&text)
}

/// A short description of an I/O failure.
fn describe_io(error: &std::io::Error) -> String {
    match error.kind() {
        std::io::ErrorKind::ConnectionRefused => "connection refused".to_owned(),
        std::io::ErrorKind::ConnectionReset => "connection reset".to_owned(),
        std::io::ErrorKind::UnexpectedEof => "connection closed".to_owned(),
        std::io::ErrorKind::Other => printable(&error.to_string()),
        kind => kind.to_string(),
    }
}

/// Visible ASCII and spaces only, at most 200 characters: it is stored and shown.
fn printable(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_ascii_graphic() { c } else { ' ' })
        .take(200)
        .collect()
}

pub(crate) fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(text: &str) -> Option<ProxyAddr> {
        ProxyAddr::parse(&MemberId::parse(text).expect("valid"))
    }

    #[test]
    fn proxy_urls_with_a_port_parse_and_opaque_ids_do_not() {
        assert_eq!(
            addr("socks5://us%40er:p%3Ass@10.0.0.1:1080/"),
            Some(ProxyAddr {
                scheme: Some("socks5".to_owned()),
                host: "10.0.0.1".to_owned(),
                port: 1080,
                password: Some("p:ss".to_owned()),
                url: "socks5://us%40er:p%3Ass@10.0.0.1:1080".to_owned(),
            })
        );
        assert_eq!(
            addr("[::1]:8080").map(|a| (a.host, a.port, a.url)),
            Some(("::1".to_owned(), 8080, "http://[::1]:8080".to_owned()))
        );
        for opaque in [
            "proxy-7",
            "http://host",
            "http://host:0",
            "http://:80",
            "host:http",
        ] {
            assert_eq!(addr(opaque), None, "{opaque}");
        }
    }

    #[test]
    fn a_password_is_cut_out_of_every_detail() {
        let proxy = addr("http://user:s%3Acret@1.2.3.4:80").expect("an address");
        assert_eq!(
            proxy.redact("proxy said s:cret twice: s:cret".to_owned()),
            "proxy said *** twice: ***"
        );
    }

    fn check(json: &str) -> CheckConfig {
        let health: crate::domain::HealthConfig =
            serde_json::from_str(&format!(r#"{{"check": {json}}}"#)).expect("valid");
        health.check.expect("a check")
    }

    fn answer(status: u16, body_matches: bool) -> Seen {
        Seen::Answer {
            status,
            body_matches,
            exit_ip: ExitIp::NotRead,
        }
    }

    #[test]
    fn an_exit_address_is_read_from_text_or_json_and_nothing_else() {
        let ip = |text: &str| parse_exit_ip(text.as_bytes()).map(|ip| ip.to_string());
        assert_eq!(ip("203.0.113.7\n"), Some("203.0.113.7".to_owned()));
        assert_eq!(ip("  2001:db8::1 "), Some("2001:db8::1".to_owned()));
        assert_eq!(
            ip(r#"{"ip": "198.51.100.2"}"#),
            Some("198.51.100.2".to_owned())
        );
        assert_eq!(
            ip(r#"{"origin": "10.0.0.1, 198.51.100.3"}"#),
            Some("198.51.100.3".to_owned())
        );
        for garbage in [
            "",
            "<html>blocked</html>",
            "example.com",
            "203.0.113.7 extra",
            "999.1.1.1",
            r#"{"ip": 7}"#,
            r#"{"address": "198.51.100.2"}"#,
            r#"{"ip": "198.51.100.2""#,
            "\u{0}\u{ff}",
        ] {
            assert_eq!(ip(garbage), None, "{garbage:?}");
        }
        assert_eq!(parse_exit_ip(b"\xff\xfe1.2.3.4"), None);
    }

    #[test]
    fn expected_statuses_pass_403_and_429_are_blocked_and_the_rest_failed() {
        let check = check(r#"{"kind": "http", "url": "http://t/", "expect_status": [200, 204]}"#);
        let fast = Duration::from_millis(1);
        assert_eq!(judge(&answer(204, true), fast, &check).0, OutcomeResult::Ok);
        assert_eq!(
            judge(&answer(403, true), fast, &check).0,
            OutcomeResult::Blocked
        );
        assert_eq!(
            judge(&answer(429, true), fast, &check).0,
            OutcomeResult::Blocked
        );
        assert_eq!(
            judge(&answer(502, true), fast, &check),
            (OutcomeResult::Failed, "status 502".to_owned())
        );
    }

    #[test]
    fn a_missing_body_is_blocked_and_a_slow_answer_failed() {
        let check = check(
            r#"{"kind": "http", "url": "http://t/", "expect_body": "ok", "max_latency_ms": 50}"#,
        );
        assert_eq!(
            judge(&answer(200, false), Duration::from_millis(1), &check),
            (
                OutcomeResult::Blocked,
                "status 200 without the expected body".to_owned()
            )
        );
        assert_eq!(
            judge(&answer(200, true), Duration::from_millis(51), &check),
            (
                OutcomeResult::Failed,
                "status 200 after 51 ms, over max_latency_ms 50".to_owned()
            )
        );
        assert_eq!(
            judge(&answer(200, true), Duration::from_millis(50), &check),
            (OutcomeResult::Ok, "status 200".to_owned())
        );
    }

    #[test]
    fn a_needle_is_found_anywhere_in_the_window() {
        assert!(contains(b"<h1>Example Domain</h1>", b"Example"));
        assert!(contains(b"abc", b"abc"));
        assert!(!contains(b"ab", b"abc"));
        assert!(!contains(b"Access denied", b"Example"));
    }

    #[test]
    fn a_round_is_not_prepared_when_a_framed_ca_pem_block_is_no_certificate() {
        let bogus = check(
            r#"{"kind": "http", "url": "https://t/", "ca_pem": "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"}"#,
        );
        assert!(Prober::new(bogus, false).is_err());
        let plain = check(r#"{"kind": "http", "url": "https://t/"}"#);
        assert!(Prober::new(plain, false).is_ok());
    }

    #[tokio::test]
    async fn private_addresses_are_refused_unless_allowed() {
        for host in ["127.0.0.1", "10.1.2.3", "localhost"] {
            let refused = guarded_addresses(host, 80, false).await.expect_err(host);
            assert_eq!(refused.to_string(), "private address", "{host}");
        }
        assert_eq!(
            guarded_addresses("127.0.0.1", 80, true)
                .await
                .expect("allowed"),
            vec![SocketAddr::from(([127, 0, 0, 1], 80))]
        );
        assert_eq!(
            guarded_addresses("8.8.8.8", 53, false)
                .await
                .expect("public"),
            vec![SocketAddr::from(([8, 8, 8, 8], 53))]
        );
    }
}
