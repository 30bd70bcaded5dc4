//! Clients: who may use which pools, with a token of their own (`PUT /clients/{client}`).
//!
//! A client's token is 32 random bytes, URL-safe base64, shown once when the client is
//! created or its token rotated; the store keeps only its SHA-256 ([`TokenHash`]), so a
//! copy of the store (a Redis dump, the embedded store's files) gives nobody a token.

use std::fmt;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use sha2::{Digest, Sha256};

use super::{InvalidPoolId, PoolId};

/// The most pool patterns one client may list.
pub const MAX_CLIENT_POOLS: usize = 100;

/// The most clients a store keeps: every replica may hold them all in memory, and a
/// listing shows them all.
pub const MAX_CLIENTS: usize = 10_000;

/// A client's id: the grammar of a pool id (`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`), for the
/// same reason: it is part of store keys and of the gateway's user names.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClientId(PoolId);

/// Why a string is not a [`ClientId`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "a client id is 1 to 64 characters of A-Z, a-z, 0-9, '.', '_' and '-', starting with a letter or digit"
)]
pub struct InvalidClientId;

impl ClientId {
    /// Parses a client id.
    ///
    /// # Errors
    /// [`InvalidClientId`] when the text is not a valid id.
    pub fn parse(text: &str) -> Result<Self, InvalidClientId> {
        PoolId::parse(text).map(Self).map_err(|_| InvalidClientId)
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        self.0.as_str()
    }
}

impl fmt::Display for ClientId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl serde::Serialize for ClientId {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

/// A pool a client may use: one id, or every id that starts with a prefix (`eu-*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PoolPattern {
    /// Exactly this pool.
    Pool(PoolId),
    /// Every pool whose id starts with this text (`*` alone: every pool).
    Prefix(String),
}

/// Why a string is not a [`PoolPattern`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a pool pattern is a pool id, or the start of one followed by a single trailing '*'")]
pub struct InvalidPoolPattern;

impl PoolPattern {
    /// Parses a pattern: a pool id, or a prefix of one with `*` at the end (and nowhere
    /// else).
    ///
    /// # Errors
    /// [`InvalidPoolPattern`] for anything else.
    pub fn parse(text: &str) -> Result<Self, InvalidPoolPattern> {
        match text.strip_suffix('*') {
            Some("") => Ok(Self::Prefix(String::new())),
            // A prefix is valid when it could start a pool id: the id it is itself.
            Some(prefix) => PoolId::parse(prefix)
                .map(|_| Self::Prefix(prefix.to_owned()))
                .map_err(|_: InvalidPoolId| InvalidPoolPattern),
            None => PoolId::parse(text)
                .map(Self::Pool)
                .map_err(|_| InvalidPoolPattern),
        }
    }

    /// Whether `pool` is one this pattern allows.
    pub fn allows(&self, pool: &PoolId) -> bool {
        match self {
            Self::Pool(id) => id == pool,
            Self::Prefix(prefix) => pool.as_str().starts_with(prefix.as_str()),
        }
    }

    /// The pattern as written.
    pub fn to_text(&self) -> String {
        match self {
            Self::Pool(id) => id.as_str().to_owned(),
            Self::Prefix(prefix) => format!("{prefix}*"),
        }
    }
}

impl serde::Serialize for PoolPattern {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.to_text())
    }
}

/// The highest `rate_per_second` a client may be given.
pub const MAX_RATE_PER_SECOND: u64 = 100_000;

/// The highest `burst` a client may be given.
pub const MAX_BURST: u64 = 1_000_000;

/// A client's rate limit: a token bucket per pool it uses, refilled at `rate_per_second`
/// tokens a second up to `burst` tokens; each member an assign asks for takes one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct ClientRate {
    /// Tokens added each second, 1 to [`MAX_RATE_PER_SECOND`].
    pub rate_per_second: u64,
    /// The most tokens the bucket holds, 1 to [`MAX_BURST`].
    pub burst: u64,
}

/// What a client may do: the body of `PUT /clients/{client}`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ClientConfig {
    /// The pools it may use, in the order given, without repeats.
    pub pools: Vec<PoolPattern>,
    /// Its rate limit, when it has one.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub rate: Option<ClientRate>,
}

/// Why a body is not a [`ClientConfig`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidClientConfig {
    /// A pattern that is not one.
    #[error("pools[{index}]: {source}")]
    Pattern {
        /// Its place in the list.
        index: usize,
        /// Why.
        source: InvalidPoolPattern,
    },
    /// A list longer than [`MAX_CLIENT_POOLS`].
    #[error("pools: at most {MAX_CLIENT_POOLS} patterns, got {0}")]
    TooManyPools(usize),
    /// A number out of its range (or not a whole number).
    #[error("{field}: a whole number from 1 to {most}")]
    OutOfRange {
        /// The field.
        field: &'static str,
        /// Its highest value.
        most: u64,
    },
}

/// The body as JSON: unknown fields are refused, so that a limit this version does not
/// enforce is never taken for one it does.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientConfigBody {
    /// The pool patterns, as written.
    pub pools: Vec<String>,
    /// Tokens a second of its rate limit; any JSON number, checked by
    /// [`ClientConfig::parse`] so that a refusal names the field.
    #[serde(default)]
    pub rate_per_second: Option<serde_json::Number>,
    /// The bucket's size (`rate_per_second` rounded up to at least 1 when absent).
    #[serde(default)]
    pub burst: Option<serde_json::Number>,
}

/// `number` when it is a whole number from 1 to `most`.
fn in_range(
    field: &'static str,
    number: &serde_json::Number,
    most: u64,
) -> Result<u64, InvalidClientConfig> {
    number
        .as_u64()
        .filter(|n| (1..=most).contains(n))
        .ok_or(InvalidClientConfig::OutOfRange { field, most })
}

impl ClientConfig {
    /// Checks a body: every pattern valid, at most [`MAX_CLIENT_POOLS`] of them; a
    /// pattern given twice is kept once.
    ///
    /// # Errors
    /// The first reason it is refused.
    pub fn parse(body: &ClientConfigBody) -> Result<Self, InvalidClientConfig> {
        if body.pools.len() > MAX_CLIENT_POOLS {
            return Err(InvalidClientConfig::TooManyPools(body.pools.len()));
        }
        let mut pools: Vec<PoolPattern> = Vec::with_capacity(body.pools.len());
        for (index, text) in body.pools.iter().enumerate() {
            let pattern = PoolPattern::parse(text)
                .map_err(|source| InvalidClientConfig::Pattern { index, source })?;
            if !pools.contains(&pattern) {
                pools.push(pattern);
            }
        }
        let rate = match (&body.rate_per_second, &body.burst) {
            (None, None) => None,
            // A burst without a rate limits nothing (the contract allows the pair): it is
            // checked like any burst, then dropped with the rate it would go with.
            (None, Some(burst)) => {
                in_range("burst", burst, MAX_BURST)?;
                None
            }
            (Some(rate), burst) => {
                let rate_per_second = in_range("rate_per_second", rate, MAX_RATE_PER_SECOND)?;
                let burst = match burst {
                    Some(burst) => in_range("burst", burst, MAX_BURST)?,
                    None => rate_per_second,
                };
                Some(ClientRate {
                    rate_per_second,
                    burst,
                })
            }
        };
        Ok(Self { pools, rate })
    }

    /// Whether the client may use `pool`.
    pub fn allows(&self, pool: &PoolId) -> bool {
        self.pools.iter().any(|pattern| pattern.allows(pool))
    }

    /// The configuration as the store keeps it (its JSON).
    pub fn to_json(&self) -> String {
        // Plain data with string keys: serialising cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// A configuration as the store kept it.
    ///
    /// # Errors
    /// When the text is not one this version wrote.
    pub fn from_json(text: &str) -> Result<Self, String> {
        let body: ClientConfigBody = serde_json::from_str(text).map_err(|e| e.to_string())?;
        Self::parse(&body).map_err(|e| e.to_string())
    }
}

/// A client token as given to the client once: 32 random bytes, URL-safe base64 without
/// padding (43 characters). Never logged and never stored: its `Debug` hides it.
pub struct ClientToken(String);

impl ClientToken {
    /// A new random token.
    pub fn generate() -> Self {
        let bytes: [u8; 32] = rand::random();
        Self(URL_SAFE_NO_PAD.encode(bytes))
    }

    /// The token's text, to show the client once.
    pub fn reveal(&self) -> &str {
        &self.0
    }

    /// What the store keeps of it.
    pub fn hash(&self) -> TokenHash {
        TokenHash::of(self.0.as_bytes())
    }
}

impl fmt::Debug for ClientToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ClientToken(..)")
    }
}

/// The SHA-256 of a token: how the store knows a client's token without keeping it. A
/// token is 256 random bits, so a fast hash is enough: nobody can guess one from its hash,
/// and looking one up costs a hash, not a password hash's deliberate seconds.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct TokenHash([u8; 32]);

impl TokenHash {
    /// The hash of a token as presented (`Authorization: Bearer`, a gateway password).
    pub fn of(token: &[u8]) -> Self {
        Self(Sha256::digest(token).into())
    }

    /// The hash as 64 lowercase hex digits, as the Redis store keeps it.
    pub fn to_hex(self) -> String {
        super::hex(&self.0)
    }

    /// A hash written by [`TokenHash::to_hex`].
    pub fn from_hex(text: &str) -> Option<Self> {
        if text.len() != 64 {
            return None;
        }
        let mut bytes = [0; 32];
        for (byte, pair) in bytes.iter_mut().zip(text.as_bytes().chunks_exact(2)) {
            let digits = std::str::from_utf8(pair).ok()?;
            *byte = u8::from_str_radix(digits, 16).ok()?;
        }
        Some(Self(bytes))
    }

    /// The hash's bytes.
    pub fn bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// A hash from its bytes (the embedded store's files).
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }
}

impl fmt::Debug for TokenHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TokenHash(..)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(id: &str) -> PoolId {
        PoolId::parse(id).expect("a pool id")
    }

    fn config(pools: &[&str]) -> Result<ClientConfig, InvalidClientConfig> {
        ClientConfig::parse(&ClientConfigBody {
            pools: pools.iter().map(|p| (*p).to_owned()).collect(),
            rate_per_second: None,
            burst: None,
        })
    }

    #[test]
    fn a_pattern_is_a_pool_id_or_a_prefix_with_one_trailing_star() {
        let allowed = config(&["web", "eu-*"]).expect("valid");
        assert!(allowed.allows(&pool("web")));
        assert!(allowed.allows(&pool("eu-west")));
        assert!(allowed.allows(&pool("eu-")));
        assert!(!allowed.allows(&pool("webs")));
        assert!(!allowed.allows(&pool("us-east")));
        assert!(config(&["*"]).expect("every pool").allows(&pool("any")));
        assert!(config(&[]).expect("no pool").pools.is_empty());
        for bad in [
            "*eu",
            "e*u",
            "eu-**",
            "",
            "a:b*",
            "{web}",
            "-web*",
            &"x".repeat(65),
        ] {
            assert!(
                matches!(
                    config(&[bad]),
                    Err(InvalidClientConfig::Pattern { index: 0, .. })
                ),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn a_list_is_bounded_and_repeats_are_kept_once() {
        let many: Vec<String> = (0..=MAX_CLIENT_POOLS).map(|i| format!("p{i}")).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        assert_eq!(
            config(&many),
            Err(InvalidClientConfig::TooManyPools(MAX_CLIENT_POOLS + 1))
        );
        let twice = config(&["web", "web", "eu-*", "eu-*"]).expect("valid");
        assert_eq!(twice.to_json(), r#"{"pools":["web","eu-*"]}"#);
        assert_eq!(ClientConfig::from_json(&twice.to_json()), Ok(twice));
    }

    fn limited(json: &str) -> Result<Option<ClientRate>, String> {
        let body: ClientConfigBody = serde_json::from_str(json).map_err(|e| e.to_string())?;
        ClientConfig::parse(&body)
            .map(|config| config.rate)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn a_rate_is_a_whole_number_in_range_and_the_burst_defaults_to_it() {
        let rate = |rate_per_second, burst| {
            Ok(Some(ClientRate {
                rate_per_second,
                burst,
            }))
        };
        assert_eq!(limited(r#"{"pools": []}"#), Ok(None));
        assert_eq!(
            limited(r#"{"pools": [], "rate_per_second": 5}"#),
            rate(5, 5)
        );
        assert_eq!(
            limited(r#"{"pools": [], "rate_per_second": 100000, "burst": 1000000}"#),
            rate(100_000, 1_000_000)
        );
        let rate_error = "rate_per_second: a whole number from 1 to 100000";
        for bad in ["0", "-1", "100001", "1.5", "1e30", "18446744073709551616"] {
            let json = format!(r#"{{"pools": [], "rate_per_second": {bad}}}"#);
            assert_eq!(limited(&json), Err(rate_error.to_owned()), "{bad}");
        }
        let burst_error = "burst: a whole number from 1 to 1000000";
        for bad in ["0", "-5", "1000001", "2.5"] {
            let json = format!(r#"{{"pools": [], "rate_per_second": 1, "burst": {bad}}}"#);
            assert_eq!(limited(&json), Err(burst_error.to_owned()), "{bad}");
        }
        // Without a rate a burst limits nothing, but is still checked.
        assert_eq!(limited(r#"{"pools": [], "burst": 5}"#), Ok(None));
        assert_eq!(
            limited(r#"{"pools": [], "burst": 0}"#),
            Err(burst_error.to_owned())
        );
        assert_eq!(
            limited(r#"{"pools": [], "rate_per_second": null, "burst": null}"#),
            Ok(None)
        );
        let config = ClientConfig::parse(
            &serde_json::from_str(r#"{"pools": ["web"], "rate_per_second": 5, "burst": 9}"#)
                .expect("a body"),
        )
        .expect("valid");
        assert_eq!(
            config.to_json(),
            r#"{"pools":["web"],"rate_per_second":5,"burst":9}"#
        );
        assert_eq!(ClientConfig::from_json(&config.to_json()), Ok(config));
    }

    #[test]
    fn a_token_is_43_url_safe_characters_and_only_its_hash_is_kept() {
        let token = ClientToken::generate();
        assert_eq!(token.reveal().len(), 43);
        assert!(
            token
                .reveal()
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        );
        assert_ne!(token.reveal(), ClientToken::generate().reveal());
        assert_eq!(token.hash(), TokenHash::of(token.reveal().as_bytes()));
        assert_eq!(format!("{token:?}"), "ClientToken(..)");
        // SHA-256 of "abc", as every implementation gives it.
        let abc = TokenHash::of(b"abc");
        assert_eq!(
            abc.to_hex(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(TokenHash::from_hex(&abc.to_hex()), Some(abc));
        assert_eq!(TokenHash::from_hex("zz"), None);
    }
}
