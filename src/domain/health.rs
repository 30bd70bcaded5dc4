//! A pool's health rules (`health` in its configuration): when reported failures take a
//! member out, for how long, and how the service checks members on its own.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// What a worker (or an active check) saw when it used a member.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutcomeResult {
    /// The request through the proxy worked. Resets the failure streak.
    Ok,
    /// The proxy failed (refused, timed out, broke the connection, answered garbage).
    Failed,
    /// The target refused the proxy (403, 429, a captcha page): the proxy works but is
    /// blocked. Counts like a failure; a trip it causes is recorded with reason `blocked`.
    Blocked,
}

impl OutcomeResult {
    /// The name used in the API and in the Redis scripts.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Failed => "failed",
            Self::Blocked => "blocked",
        }
    }

    /// Parses the name written by [`OutcomeResult::as_str`].
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "ok" => Some(Self::Ok),
            "failed" => Some(Self::Failed),
            "blocked" => Some(Self::Blocked),
            _ => None,
        }
    }
}

/// A pool's health rules. Every field has a default; `{}` (or leaving `health` out) gives
/// the documented defaults, with active checks off.
///
/// A member that collects `max_consecutive_failures` failures in a row is taken out with
/// reason `unhealthy` (`blocked` when the last report was `blocked`) and comes back by
/// itself after its cooldown, under the pool's restore policy. Each trip without a success
/// in between multiplies the cooldown by `backoff`, up to `max_cooldown_ms`; a success
/// resets both the streak and the backoff.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "super::object::Object<RawHealthConfig>")]
pub struct HealthConfig {
    /// Failures in a row that take a member out (1 to 1,000; default 3).
    pub max_consecutive_failures: u32,
    /// The first cooldown, in milliseconds (100 ms to 24 h; default 60,000).
    pub cooldown_ms: u64,
    /// The longest cooldown, in milliseconds (at least `cooldown_ms`, at most 7 days;
    /// default 3,600,000).
    pub max_cooldown_ms: u64,
    /// The factor each repeated trip multiplies the cooldown by (1 to 10; default 2). A
    /// whole number, so that every store computes the same cooldown to the millisecond.
    pub backoff: u32,
    /// Spread of each cooldown, in percent (0 to 50; default 10): a cooldown is drawn
    /// uniformly within ±`jitter_percent` of its nominal length (then capped at
    /// `max_cooldown_ms`), so that members tripped together do not all return together.
    pub jitter_percent: u32,
    /// How long a `blocked` report naming a target bans the member for that target only,
    /// in milliseconds (100 ms to 7 days; default 600,000). Each repeat ban while the last
    /// one is remembered doubles it, up to `max_cooldown_ms` (see
    /// `rules::health::ban_ms`).
    pub target_ban_ms: u64,
    /// Active checks; `null` (the default) means none.
    pub check: Option<CheckConfig>,
}

impl HealthConfig {
    /// Default failures in a row before a trip.
    pub const DEFAULT_MAX_CONSECUTIVE_FAILURES: u32 = 3;
    /// Default first cooldown, in milliseconds.
    pub const DEFAULT_COOLDOWN_MS: u64 = 60_000;
    /// Default longest cooldown, in milliseconds.
    pub const DEFAULT_MAX_COOLDOWN_MS: u64 = 3_600_000;
    /// Default backoff factor.
    pub const DEFAULT_BACKOFF: u32 = 2;
    /// Default jitter, in percent.
    pub const DEFAULT_JITTER_PERCENT: u32 = 10;
    /// Default length of a first ban for one target, in milliseconds.
    pub const DEFAULT_TARGET_BAN_MS: u64 = 600_000;

    /// The parameters the Redis scripts need, as one argument:
    /// `"<max_consecutive_failures> <cooldown_ms> <max_cooldown_ms> <backoff> <jitter_percent>"`.
    pub fn script_arg(&self) -> String {
        format!(
            "{} {} {} {} {}",
            self.max_consecutive_failures,
            self.cooldown_ms,
            self.max_cooldown_ms,
            self.backoff,
            self.jitter_percent
        )
    }
}

impl Default for HealthConfig {
    fn default() -> Self {
        Self {
            max_consecutive_failures: Self::DEFAULT_MAX_CONSECUTIVE_FAILURES,
            cooldown_ms: Self::DEFAULT_COOLDOWN_MS,
            max_cooldown_ms: Self::DEFAULT_MAX_COOLDOWN_MS,
            backoff: Self::DEFAULT_BACKOFF,
            jitter_percent: Self::DEFAULT_JITTER_PERCENT,
            target_ban_ms: Self::DEFAULT_TARGET_BAN_MS,
            check: None,
        }
    }
}

/// `health` as written by the client, before its ranges are checked.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHealthConfig {
    #[serde(default = "default_failures")]
    max_consecutive_failures: u32,
    #[serde(default = "default_cooldown")]
    cooldown_ms: u64,
    #[serde(default = "default_max_cooldown")]
    max_cooldown_ms: u64,
    #[serde(default = "default_backoff")]
    backoff: u32,
    #[serde(default = "default_jitter")]
    jitter_percent: u32,
    #[serde(default = "default_target_ban")]
    target_ban_ms: u64,
    #[serde(default)]
    check: Option<CheckConfig>,
}

fn default_failures() -> u32 {
    HealthConfig::DEFAULT_MAX_CONSECUTIVE_FAILURES
}
fn default_cooldown() -> u64 {
    HealthConfig::DEFAULT_COOLDOWN_MS
}
fn default_max_cooldown() -> u64 {
    HealthConfig::DEFAULT_MAX_COOLDOWN_MS
}
fn default_backoff() -> u32 {
    HealthConfig::DEFAULT_BACKOFF
}
fn default_jitter() -> u32 {
    HealthConfig::DEFAULT_JITTER_PERCENT
}
fn default_target_ban() -> u64 {
    HealthConfig::DEFAULT_TARGET_BAN_MS
}

/// Why a `health` configuration was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("health: {0}")]
pub struct InvalidHealthConfig(&'static str);

const DAY_MS: u64 = 24 * 60 * 60 * 1000;

impl TryFrom<super::object::Object<RawHealthConfig>> for HealthConfig {
    type Error = InvalidHealthConfig;

    fn try_from(
        super::object::Object(raw): super::object::Object<RawHealthConfig>,
    ) -> Result<Self, InvalidHealthConfig> {
        let fail = |why| Err(InvalidHealthConfig(why));
        if !(1..=1000).contains(&raw.max_consecutive_failures) {
            return fail("max_consecutive_failures is 1 to 1000");
        }
        if !(100..=DAY_MS).contains(&raw.cooldown_ms) {
            return fail("cooldown_ms is 100 to 86400000");
        }
        // A maximum below `cooldown_ms` caps the first cooldown too: every cooldown is
        // min(nominal, max), so the two need no rule between them.
        if !(100..=7 * DAY_MS).contains(&raw.max_cooldown_ms) {
            return fail("max_cooldown_ms is 100 to 604800000");
        }
        if !(1..=10).contains(&raw.backoff) {
            return fail("backoff is a whole number from 1 to 10");
        }
        if raw.jitter_percent > 50 {
            return fail("jitter_percent is 0 to 50");
        }
        if !(100..=7 * DAY_MS).contains(&raw.target_ban_ms) {
            return fail("target_ban_ms is 100 to 604800000");
        }
        Ok(Self {
            max_consecutive_failures: raw.max_consecutive_failures,
            cooldown_ms: raw.cooldown_ms,
            max_cooldown_ms: raw.max_cooldown_ms,
            backoff: raw.backoff,
            jitter_percent: raw.jitter_percent,
            target_ban_ms: raw.target_ban_ms,
            check: raw.check,
        })
    }
}

/// How an active check probes a member.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CheckKind {
    /// A TCP connection to the proxy's host and port is opened and closed.
    Tcp,
    /// `url` is fetched through the proxy, whatever kind of proxy it is (`http`, `https`,
    /// `socks4`, `socks5`, `socks5h`), and the answer is judged by the pass rules.
    Http,
}

/// Most bytes of `check.ca_pem`.
pub const MAX_CA_PEM_BYTES: usize = 64 * 1024;
/// Most characters of `check.expect_body`.
pub const MAX_EXPECT_BODY_CHARS: usize = 1024;
/// Most request headers a check sends.
pub const MAX_CHECK_HEADERS: usize = 16;
/// How much of a target's body `expect_body` is looked for in.
pub const CHECK_BODY_WINDOW_BYTES: usize = 64 * 1024;

/// Active checks of a pool: each round probes the eligible and cooling-down members and
/// feeds the results into the same rules as worker reports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "super::object::Object<RawCheckConfig>")]
pub struct CheckConfig {
    /// How a member is probed.
    pub kind: CheckKind,
    /// For `http`: the `http://` or `https://` URL fetched through the proxy, ideally the
    /// real target. An `https` target is reached through a tunnel (CONNECT, or the SOCKS
    /// equivalent) with its certificate and host name verified.
    pub url: Option<String>,
    /// For `http`: the statuses that count as healthy (default `[200]`). 403 and 429
    /// outside this list count as `blocked`, anything else as `failed`.
    pub expect_status: Vec<u16>,
    /// For `http`: text (1 to 1,024 characters) the first 64 KiB of the body must contain
    /// to pass (sites answer a block page with 200); a body without it counts as `blocked`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expect_body: Option<String>,
    /// For `http`: a probe slower than this (from the connection to the last byte judged)
    /// counts as `failed` (1 to `timeout_ms`; default none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_latency_ms: Option<u64>,
    /// For `http`: request headers sent to the target (at most 16), e.g. a `User-Agent`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    /// For `http`: PEM certificates (one or more, at most 64 KiB) trusted besides the
    /// Mozilla roots built in, for private targets and `https` proxies with a private CA.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_pem: Option<String>,
    /// Time between rounds, in milliseconds (100 ms to 24 h; default 30,000). It is also
    /// the longest a round may run: probes not started by then wait for the next round.
    pub interval_ms: u64,
    /// Longest one probe may take, in milliseconds (10 ms to 60 s, below `interval_ms`;
    /// default 5,000).
    pub timeout_ms: u64,
    /// Probes run at once in one round (1 to 256; default 8).
    pub concurrency: u32,
    /// For `http`: the target answers the caller's address (plain text, or JSON with an
    /// `ip` or `origin` field, as ipify and httpbin do), which is recorded as the member's
    /// `exit_ip` when the probe passes its status rule (default `false`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub exit_ip: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCheckConfig {
    kind: CheckKind,
    #[serde(default)]
    url: Option<String>,
    #[serde(default)]
    expect_status: Option<Vec<u16>>,
    #[serde(default)]
    expect_body: Option<String>,
    #[serde(default)]
    max_latency_ms: Option<u64>,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    #[serde(default)]
    ca_pem: Option<String>,
    #[serde(default = "default_interval")]
    interval_ms: u64,
    #[serde(default = "default_timeout")]
    timeout_ms: u64,
    #[serde(default = "default_concurrency")]
    concurrency: u32,
    #[serde(default)]
    exit_ip: bool,
}

fn default_interval() -> u64 {
    30_000
}
fn default_timeout() -> u64 {
    5_000
}
fn default_concurrency() -> u32 {
    8
}

impl TryFrom<super::object::Object<RawCheckConfig>> for CheckConfig {
    type Error = InvalidHealthConfig;

    fn try_from(
        super::object::Object(raw): super::object::Object<RawCheckConfig>,
    ) -> Result<Self, InvalidHealthConfig> {
        let fail = |why| Err(InvalidHealthConfig(why));
        match (raw.kind, raw.url.as_deref()) {
            (CheckKind::Http, None) => return fail("check.url is required for kind http"),
            (CheckKind::Http, Some(url)) if !is_target_url(url) => {
                return fail(
                    "check.url is an http:// or https:// URL with a host, of at most 2048 bytes",
                );
            }
            (CheckKind::Tcp, _)
                if raw.url.is_some()
                    || raw.expect_body.is_some()
                    || raw.max_latency_ms.is_some()
                    || !raw.headers.is_empty()
                    || raw.ca_pem.is_some()
                    || raw.exit_ip =>
            {
                return fail(
                    "check.url, expect_body, max_latency_ms, headers, ca_pem and exit_ip apply to kind http only",
                );
            }
            _ => {}
        }
        let expect_status = raw.expect_status.unwrap_or_else(|| vec![200]);
        if expect_status.is_empty()
            || expect_status.len() > 32
            || !expect_status.iter().all(|s| (100..=599).contains(s))
        {
            return fail("check.expect_status is 1 to 32 statuses from 100 to 599");
        }
        if !(100..=DAY_MS).contains(&raw.interval_ms) {
            return fail("check.interval_ms is 100 to 86400000");
        }
        // A probe never outlives its round (`interval_ms`), whatever its own timeout says.
        if !(10..=60_000).contains(&raw.timeout_ms) {
            return fail("check.timeout_ms is 10 to 60000");
        }
        if !(1..=256).contains(&raw.concurrency) {
            return fail("check.concurrency is 1 to 256");
        }
        if raw
            .expect_body
            .as_ref()
            .is_some_and(|text| text.is_empty() || text.chars().count() > MAX_EXPECT_BODY_CHARS)
        {
            return fail("check.expect_body is 1 to 1024 characters");
        }
        // No rule ties it to `timeout_ms`: a bound above the timeout is simply never hit.
        if raw
            .max_latency_ms
            .is_some_and(|ms| !(1..=60_000).contains(&ms))
        {
            return fail("check.max_latency_ms is 1 to 60000");
        }
        if raw.headers.len() > MAX_CHECK_HEADERS
            || !raw
                .headers
                .iter()
                .all(|(name, value)| is_header(name, value))
        {
            return fail(
                "check.headers is at most 16 headers with valid names and visible ASCII values of at most 1024 bytes",
            );
        }
        if let Some(pem) = &raw.ca_pem {
            // The framing is checked here, as the API contract states it; whether each
            // block decodes to a certificate is known when a round builds its TLS settings
            // (a round whose certificates do not decode is skipped and logged).
            if pem.len() > MAX_CA_PEM_BYTES || !is_pem_framed(pem) {
                return fail("check.ca_pem is one or more PEM certificates, at most 65536 bytes");
            }
        }
        Ok(Self {
            kind: raw.kind,
            url: raw.url,
            expect_status,
            expect_body: raw.expect_body,
            max_latency_ms: raw.max_latency_ms,
            headers: raw.headers,
            ca_pem: raw.ca_pem,
            interval_ms: raw.interval_ms,
            timeout_ms: raw.timeout_ms,
            concurrency: raw.concurrency,
            exit_ip: raw.exit_ip,
        })
    }
}

/// `-----BEGIN CERTIFICATE-----` / base64 lines / `-----END CERTIFICATE-----` blocks, one
/// or more, separated by line breaks (what `openapi.yaml`'s pattern says).
fn is_pem_framed(pem: &str) -> bool {
    const BEGIN: &str = "-----BEGIN CERTIFICATE-----";
    const END: &str = "-----END CERTIFICATE-----";
    let mut blocks = 0;
    let mut inside = false;
    for line in pem
        .lines()
        .map(|line| line.strip_suffix('\r').unwrap_or(line))
    {
        match (inside, line) {
            (false, BEGIN) => inside = true,
            (false, "") => {}
            (true, END) => {
                inside = false;
                blocks += 1;
            }
            (true, body)
                if !body.is_empty()
                    && body.len() <= 76
                    && body
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'=')) => {}
            _ => return false,
        }
    }
    blocks > 0 && !inside
}

/// An `http://` or `https://` URL with a host, visible ASCII only.
pub(super) fn is_target_url(url: &str) -> bool {
    url.len() <= 2048
        && url.bytes().all(|b| b.is_ascii_graphic())
        // The URL parser would read `https:///path` as the host `path`.
        && url
            .split_once("://")
            .is_some_and(|(_, rest)| !rest.is_empty() && !rest.starts_with('/'))
        && reqwest::Url::parse(url).is_ok_and(|parsed| {
            matches!(parsed.scheme(), "http" | "https")
                && parsed.host_str().is_some_and(is_url_host)
        })
}

/// A URL's host as the API documents it (`openapi.yaml`'s URL pattern): an IPv4 address, or
/// labels of letters, digits and hyphens (1 to 63 each) whose last starts with a letter.
/// The URL parser alone takes more (`*`, `_`), which no list or check host needs.
fn is_url_host(host: &str) -> bool {
    host.parse::<std::net::Ipv4Addr>().is_ok()
        || (host.split('.').all(|label| {
            (1..=63).contains(&label.len())
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        }) && host
            .rsplit('.')
            .next()
            .is_some_and(|last| last.starts_with(|c: char| c.is_ascii_alphabetic())))
}

/// A header the client can send as written: a token name, a visible-ASCII value.
fn is_header(name: &str, value: &str) -> bool {
    name.len() <= 64
        && value.len() <= 1024
        && reqwest::header::HeaderName::from_bytes(name.as_bytes()).is_ok()
        && value.bytes().all(|b| b == b' ' || b.is_ascii_graphic())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn health(json: &str) -> Result<HealthConfig, serde_json::Error> {
        serde_json::from_str(json)
    }

    #[test]
    fn an_empty_object_gives_the_documented_defaults_without_checks() {
        assert_eq!(health("{}").expect("valid"), HealthConfig::default());
        assert_eq!(HealthConfig::default().script_arg(), "3 60000 3600000 2 10");
    }

    #[test]
    fn nonsense_is_refused() {
        for bad in [
            r#"{"max_consecutive_failures": 0}"#,
            r#"{"cooldown_ms": 99}"#,
            r#"{"max_cooldown_ms": 99}"#,
            r#"{"backoff": 0}"#,
            r#"{"backoff": 1.5}"#,
            r#"{"jitter_percent": 51}"#,
            r#"{"check": {"kind": "http"}}"#,
            r#"{"check": {"kind": "http", "url": "ftp://example.com/"}}"#,
            r#"{"check": {"kind": "http", "url": "https:///path"}}"#,
            r#"{"check": {"kind": "http", "url": "http://a/", "expect_body": ""}}"#,
            r#"{"check": {"kind": "http", "url": "http://a/", "max_latency_ms": 0}}"#,
            r#"{"check": {"kind": "http", "url": "http://a/", "ca_pem": "-----BEGIN CERTIFICATE-----\nAA\n"}}"#,
            r#"{"check": {"kind": "http", "url": "http://a/", "headers": {"bad name": "x"}}}"#,
            r#"{"check": {"kind": "http", "url": "http://a/", "headers": {"x-a": "line\nbreak"}}}"#,
            r#"{"check": {"kind": "http", "url": "http://a/", "ca_pem": "not a certificate"}}"#,
            r#"{"check": {"kind": "tcp", "expect_body": "ok"}}"#,
            r#"{"check": {"kind": "tcp", "url": "http://example.com/"}}"#,
            r#"{"check": {"kind": "tcp", "exit_ip": true}}"#,
            r#"{"check": {"kind": "http", "url": "http://a/", "exit_ip": 1}}"#,
            r#"{"check": {"kind": "tcp", "timeout_ms": 60001}}"#,
            r#"{"check": {"kind": "tcp", "concurrency": 0}}"#,
            r#"{"check": {"kind": "http", "url": "http://a/", "expect_status": []}}"#,
            r#"{"check": {"kind": "udp"}}"#,
            r#"{"cooldown": 1}"#,
        ] {
            assert!(health(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_check_fills_in_its_defaults() {
        let config =
            health(r#"{"check": {"kind": "http", "url": "http://example.com/"}}"#).expect("valid");
        assert_eq!(
            config.check,
            Some(CheckConfig {
                kind: CheckKind::Http,
                url: Some("http://example.com/".to_owned()),
                expect_status: vec![200],
                expect_body: None,
                max_latency_ms: None,
                headers: BTreeMap::new(),
                ca_pem: None,
                interval_ms: 30_000,
                timeout_ms: 5_000,
                concurrency: 8,
                exit_ip: false,
            })
        );
    }
}
