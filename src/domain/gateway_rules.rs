//! A pool's gateway rules (`gateway` in its configuration): how many members a gateway
//! request may try, and which answers of a target on plain HTTP are a block to retry
//! through another member.

use serde::{Deserialize, Serialize};

/// Most statuses `retry_statuses` lists.
pub const MAX_RETRY_STATUSES: usize = 32;

/// Most patterns `block_patterns` lists.
pub const MAX_BLOCK_PATTERNS: usize = 16;

/// Longest pattern, in bytes.
pub const MAX_PATTERN_LEN: usize = 1_000;

/// Most bytes one compiled pattern may take. The regex crate matches in linear time
/// whatever the pattern, but a pattern's compiled size can grow exponentially with its
/// repetitions (`(a{100}){100}`): this bound refuses such a pattern when the pool is saved.
pub const PATTERN_SIZE_LIMIT: usize = 1 << 18;

/// How long a target's answer may take to start by default, in milliseconds.
pub const DEFAULT_RESPONSE_TIMEOUT_MS: u64 = 30_000;

/// The longest `response_timeout_ms`, in milliseconds (ten minutes).
pub const MAX_RESPONSE_TIMEOUT_MS: u64 = 600_000;

/// Most members one gateway request may try.
pub const MAX_ATTEMPTS: u32 = 10;

/// `{"attempts", "retry_statuses", "block_patterns", "response_timeout_ms"}`: on plain
/// HTTP, a response whose status is listed, or whose first 64 KiB of body matches a
/// pattern, is a block: reported with the target and sent again through another member
/// while attempts last.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "super::object::Object<RawGatewayRules>")]
pub struct GatewayRules {
    /// Most members one request tries (`GATEWAY_ATTEMPTS` when `None`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attempts: Option<u32>,
    /// Statuses of a target's answer that are a block.
    pub retry_statuses: Vec<u16>,
    /// Patterns (Rust `regex` syntax) that make an answer whose body's first 64 KiB
    /// matches one a block.
    pub block_patterns: Vec<String>,
    /// How long a target's answer may take to start before the attempt is `failed`.
    pub response_timeout_ms: u64,
}

impl Default for GatewayRules {
    fn default() -> Self {
        Self {
            attempts: None,
            retry_statuses: Vec::new(),
            block_patterns: Vec::new(),
            response_timeout_ms: DEFAULT_RESPONSE_TIMEOUT_MS,
        }
    }
}

impl GatewayRules {
    /// The block patterns, compiled for matching a body's bytes; `None` without patterns.
    ///
    /// # Errors
    /// The first pattern that does not compile under the size bound (never one a saved
    /// configuration holds: each was compiled when the pool was saved).
    pub fn compiled_patterns(&self) -> Result<Option<regex::bytes::RegexSet>, InvalidGatewayRules> {
        if self.block_patterns.is_empty() {
            return Ok(None);
        }
        regex::bytes::RegexSetBuilder::new(&self.block_patterns)
            .size_limit(PATTERN_SIZE_LIMIT * self.block_patterns.len())
            .build()
            .map(Some)
            .map_err(|_| InvalidGatewayRules::Pattern(self.block_patterns.join(" | ")))
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawGatewayRules {
    #[serde(default)]
    attempts: Option<u32>,
    #[serde(default)]
    retry_statuses: Vec<u16>,
    #[serde(default)]
    block_patterns: Vec<String>,
    #[serde(default)]
    response_timeout_ms: Option<u64>,
}

/// Why a `gateway` configuration was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidGatewayRules {
    /// `attempts` out of range.
    #[error("gateway.attempts is 1 to {MAX_ATTEMPTS}")]
    Attempts,
    /// A status out of range, or too many.
    #[error(
        "gateway.retry_statuses lists at most {MAX_RETRY_STATUSES} HTTP statuses from 100 to 599"
    )]
    Statuses,
    /// Too many patterns.
    #[error("gateway.block_patterns lists at most {MAX_BLOCK_PATTERNS} patterns")]
    TooManyPatterns,
    /// A pattern that does not compile, is longer than [`MAX_PATTERN_LEN`] or compiles
    /// larger than [`PATTERN_SIZE_LIMIT`].
    #[error(
        "gateway.block_patterns: {0:?} is not a pattern of at most {MAX_PATTERN_LEN} bytes that compiles within the size limit"
    )]
    Pattern(String),
    /// `response_timeout_ms` out of range.
    #[error("gateway.response_timeout_ms is 1 to {MAX_RESPONSE_TIMEOUT_MS}")]
    Timeout,
}

/// The first 80 characters of a pattern, for an error message that names it.
fn named(pattern: &str) -> String {
    pattern.chars().take(80).collect()
}

impl TryFrom<super::object::Object<RawGatewayRules>> for GatewayRules {
    type Error = InvalidGatewayRules;

    fn try_from(
        super::object::Object(raw): super::object::Object<RawGatewayRules>,
    ) -> Result<Self, InvalidGatewayRules> {
        if raw
            .attempts
            .is_some_and(|n| !(1..=MAX_ATTEMPTS).contains(&n))
        {
            return Err(InvalidGatewayRules::Attempts);
        }
        if raw.retry_statuses.len() > MAX_RETRY_STATUSES
            || raw.retry_statuses.iter().any(|s| !(100..=599).contains(s))
        {
            return Err(InvalidGatewayRules::Statuses);
        }
        if raw.block_patterns.len() > MAX_BLOCK_PATTERNS {
            return Err(InvalidGatewayRules::TooManyPatterns);
        }
        for pattern in &raw.block_patterns {
            let compiles = pattern.len() <= MAX_PATTERN_LEN
                && regex::bytes::RegexBuilder::new(pattern)
                    .size_limit(PATTERN_SIZE_LIMIT)
                    .build()
                    .is_ok();
            if !compiles {
                return Err(InvalidGatewayRules::Pattern(named(pattern)));
            }
        }
        let response_timeout_ms = raw
            .response_timeout_ms
            .unwrap_or(DEFAULT_RESPONSE_TIMEOUT_MS);
        if !(1..=MAX_RESPONSE_TIMEOUT_MS).contains(&response_timeout_ms) {
            return Err(InvalidGatewayRules::Timeout);
        }
        let mut retry_statuses = raw.retry_statuses;
        retry_statuses.sort_unstable();
        retry_statuses.dedup();
        Ok(Self {
            attempts: raw.attempts,
            retry_statuses,
            block_patterns: raw.block_patterns,
            response_timeout_ms,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(json: &str) -> Result<GatewayRules, String> {
        serde_json::from_str(json).map_err(|e| e.to_string())
    }

    #[test]
    fn the_rules_of_the_issue_parse_and_defaults_fill_the_rest() {
        let rules = parsed(
            r#"{"attempts": 3, "retry_statuses": [429, 403], "block_patterns": ["(?i)access denied", "captcha"], "response_timeout_ms": 30000}"#,
        )
        .expect("valid");
        assert_eq!(
            rules,
            GatewayRules {
                attempts: Some(3),
                retry_statuses: vec![403, 429],
                block_patterns: vec!["(?i)access denied".to_owned(), "captcha".to_owned()],
                response_timeout_ms: 30_000,
            }
        );
        assert_eq!(parsed("{}").expect("valid"), GatewayRules::default());
        let set = rules
            .compiled_patterns()
            .expect("compiles")
            .expect("patterns");
        assert!(set.is_match(b"<h1>Access Denied</h1>"));
        assert!(!set.is_match(b"<h1>welcome</h1>"));
    }

    #[test]
    fn a_bad_or_oversized_pattern_is_refused_naming_it() {
        let error = parsed(r#"{"block_patterns": ["ok", "(unclosed"]}"#).expect_err("refused");
        assert!(error.contains("\"(unclosed\" is not a pattern"), "{error}");
        // Linear-time matching, but a compiled size that grows with each repetition.
        let error = parsed(r#"{"block_patterns": ["((a{100}){100}){100}"]}"#).expect_err("refused");
        assert!(error.contains("((a{100}){100}){100}"), "{error}");
        let long = format!(r#"{{"block_patterns": ["{}"]}}"#, "a".repeat(1_001));
        assert!(parsed(&long).is_err());
    }

    #[test]
    fn numbers_out_of_range_are_refused() {
        for (json, says) in [
            (r#"{"attempts": 0}"#, "gateway.attempts is 1 to 10"),
            (r#"{"attempts": 11}"#, "gateway.attempts is 1 to 10"),
            (r#"{"retry_statuses": [99]}"#, "gateway.retry_statuses"),
            (
                r#"{"response_timeout_ms": 0}"#,
                "gateway.response_timeout_ms",
            ),
            (r#"{"nope": 1}"#, "unknown field"),
        ] {
            let error = parsed(json).expect_err("refused");
            assert!(error.contains(says), "{json}: {error}");
        }
    }
}
