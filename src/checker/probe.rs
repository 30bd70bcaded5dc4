//! One probe of one proxy: a TCP connect, or an HTTP `GET` of the check URL through the
//! proxy, written by hand on a `TcpStream` (absolute-form request line, status line read
//! back) so that checking needs no HTTP client dependency.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::domain::{CheckConfig, CheckKind, MemberId, OutcomeResult};

/// Where a member's proxy listens, parsed from its id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyAddr {
    scheme: Option<String>,
    host: String,
    port: u16,
    /// `user:pass` from the id, percent-decoded, for `Proxy-Authorization`.
    credentials: Option<String>,
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
        let (credentials, host_port) = match authority.rsplit_once('@') {
            Some((userinfo, host_port)) => (Some(percent_decode(userinfo)), host_port),
            None => (None, authority),
        };
        let (host, port) = host_port.rsplit_once(':')?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let port = port.parse::<u16>().ok().filter(|p| *p != 0)?;
        (!host.is_empty()).then(|| Self {
            scheme,
            host: host.to_owned(),
            port,
            credentials,
        })
    }
}

/// Probes `addr` under `check`, within its timeout: the result and what was seen.
pub async fn probe(addr: &ProxyAddr, check: &CheckConfig) -> (OutcomeResult, String) {
    let timeout = Duration::from_millis(check.timeout_ms);
    match tokio::time::timeout(timeout, attempt(addr, check)).await {
        Ok(Ok(status)) => judge(status, check),
        Ok(Err(error)) => (OutcomeResult::Failed, describe(&error)),
        Err(_) => (OutcomeResult::Failed, "timeout".to_owned()),
    }
}

/// `None` for a TCP check that connected, the proxy's status for an HTTP check.
async fn attempt(addr: &ProxyAddr, check: &CheckConfig) -> std::io::Result<Option<u16>> {
    let mut stream = TcpStream::connect((addr.host.as_str(), addr.port)).await?;
    let (CheckKind::Http, Some(url)) = (check.kind, check.url.as_deref()) else {
        return Ok(None);
    };
    if addr.scheme.as_deref().is_some_and(|s| s != "http") {
        return Err(std::io::Error::other("not an http proxy"));
    }
    stream.write_all(request(url, addr).as_bytes()).await?;
    Ok(Some(read_status(&mut stream).await?))
}

fn request(url: &str, addr: &ProxyAddr) -> String {
    let host = url
        .trim_start_matches("http://")
        .split('/')
        .next()
        .unwrap_or_default();
    let mut request = format!(
        "GET {url} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: proxy-allocator-check\r\n\
         Accept: */*\r\nConnection: close\r\n"
    );
    if let Some(credentials) = &addr.credentials {
        request.push_str("Proxy-Authorization: Basic ");
        request.push_str(&base64(credentials.as_bytes()));
        request.push_str("\r\n");
    }
    request.push_str("\r\n");
    request
}

/// Reads up to the end of the status line (at most 1 KiB) and returns its status.
async fn read_status(stream: &mut TcpStream) -> std::io::Result<u16> {
    let mut head = Vec::with_capacity(128);
    let mut buf = [0u8; 256];
    while !head.windows(2).any(|w| w == b"\r\n") {
        let n = stream.read(&mut buf).await?;
        if n == 0 || head.len() > 1024 {
            return Err(std::io::Error::other("no status line"));
        }
        head.extend_from_slice(&buf[..n]);
    }
    let line = String::from_utf8_lossy(&head);
    line.strip_prefix("HTTP/1.")
        .and_then(|rest| rest.get(2..5))
        .and_then(|code| code.parse::<u16>().ok())
        .ok_or_else(|| std::io::Error::other("malformed status line"))
}

fn judge(status: Option<u16>, check: &CheckConfig) -> (OutcomeResult, String) {
    let Some(status) = status else {
        return (OutcomeResult::Ok, "connected".to_owned());
    };
    let result = if check.expect_status.contains(&status) {
        OutcomeResult::Ok
    } else if matches!(status, 403 | 429) {
        OutcomeResult::Blocked
    } else {
        OutcomeResult::Failed
    };
    (result, format!("status {status}"))
}

/// A short, credential-free description of an I/O failure.
fn describe(error: &std::io::Error) -> String {
    match error.kind() {
        std::io::ErrorKind::ConnectionRefused => "connection refused".to_owned(),
        std::io::ErrorKind::ConnectionReset => "connection reset".to_owned(),
        std::io::ErrorKind::Other => error.to_string(),
        kind => kind.to_string(),
    }
    .chars()
    .map(|c| if c.is_ascii_graphic() { c } else { ' ' })
    .collect()
}

fn percent_decode(text: &str) -> String {
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

/// Standard base64 with padding, for a Basic credential.
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = u32::from(b[0]) << 16 | u32::from(b[1]) << 8 | u32::from(b[2]);
        for (i, shift) in [18, 12, 6, 0].into_iter().enumerate() {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[(n >> shift & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
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
            addr("http://us%40er:p%3Ass@10.0.0.1:3128/"),
            Some(ProxyAddr {
                scheme: Some("http".to_owned()),
                host: "10.0.0.1".to_owned(),
                port: 3128,
                credentials: Some("us@er:p:ss".to_owned()),
            })
        );
        assert_eq!(
            addr("[::1]:8080").map(|a| (a.host, a.port)),
            Some(("::1".to_owned(), 8080))
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
    fn base64_matches_the_standard_alphabet_and_padding() {
        assert_eq!(base64(b"user:pass"), "dXNlcjpwYXNz");
        assert_eq!(base64(b"a"), "YQ==");
        assert_eq!(base64(b"ab"), "YWI=");
        assert_eq!(base64(b""), "");
    }

    #[test]
    fn expected_statuses_pass_403_and_429_are_blocked_and_the_rest_failed() {
        let check: crate::domain::HealthConfig = serde_json::from_str(
            r#"{"check": {"kind": "http", "url": "http://t/", "expect_status": [200, 204]}}"#,
        )
        .expect("valid");
        let check = check.check.expect("a check");
        assert_eq!(judge(Some(204), &check).0, OutcomeResult::Ok);
        assert_eq!(judge(Some(403), &check).0, OutcomeResult::Blocked);
        assert_eq!(judge(Some(429), &check).0, OutcomeResult::Blocked);
        assert_eq!(
            judge(Some(502), &check),
            (OutcomeResult::Failed, "status 502".to_owned())
        );
    }
}
