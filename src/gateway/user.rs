//! The gateway's proxy user name: which pool a client uses and what it asks of the pick,
//! as commercial gateways carry it, `<pool>-<key>-<value>-<key>-<value>...`.
//!
//! The grammar, exactly:
//! - The name is split at every single `-`; `--` stands for one `-` inside a part, read
//!   left to right (so `a---b` is the parts `a-` and `b`). This is how a pool id or a label
//!   value that holds `-` is written: pool `eu-web` is `eu--web`. A part cannot start with
//!   `-`.
//! - The first part is the pool id; the others come in pairs, a key and its value.
//! - The keys `session` (a sticky session's name, 1 to 64 characters of A-Z, a-z, 0-9,
//!   `_`, `.`), `sessionttl` (its lifetime in milliseconds) and `ttl` (the lease ttl in
//!   milliseconds, on least-in-flight pools) are options; every other key is a label key,
//!   and the pick is among members with that label value. A label key given twice accepts
//!   either value (`country-de-country-fr`). An option given twice is refused.

use crate::domain::{LabelFilter, LeaseTtl, PoolId};

/// Longest user name read, in bytes.
pub const MAX_USER_LEN: usize = 1024;

/// What a gateway client asks for, read from its user name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selection {
    /// The pool.
    pub pool: PoolId,
    /// Only members whose labels pass this filter are picked.
    pub labels: LabelFilter,
    /// A sticky session's name.
    pub session: Option<String>,
    /// The session's lifetime in milliseconds.
    pub session_ttl_ms: Option<u64>,
    /// A lease ttl other than the pool's.
    pub ttl: Option<LeaseTtl>,
}

/// Why a user name was refused; the text is what the client is told.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("proxy user name: {0}")]
pub struct InvalidUser(String);

fn invalid(what: impl Into<String>) -> InvalidUser {
    InvalidUser(what.into())
}

/// Splits at single `-`, with `--` as a literal `-` (see the module doc).
fn parts(name: &str) -> Vec<String> {
    let mut parts = Vec::new();
    let mut current = String::new();
    let mut chars = name.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '-' if chars.peek() == Some(&'-') => {
                chars.next();
                current.push('-');
            }
            '-' => parts.push(std::mem::take(&mut current)),
            other => current.push(other),
        }
    }
    parts.push(current);
    parts
}

fn valid_session(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.'))
}

impl Selection {
    /// Reads a user name.
    ///
    /// # Errors
    /// [`InvalidUser`] saying which part breaks the grammar.
    pub fn parse(name: &str) -> Result<Self, InvalidUser> {
        if name.len() > MAX_USER_LEN {
            return Err(invalid(format!("at most {MAX_USER_LEN} bytes")));
        }
        let parts = parts(name);
        let (pool, options) = parts.split_first().ok_or_else(|| invalid("no pool"))?;
        let pool = PoolId::parse(pool).map_err(|e| {
            invalid(format!(
                "{e}; a '-' in a pool id is written '--' (pool eu-web is eu--web)"
            ))
        })?;
        if options.len() % 2 != 0 {
            return Err(invalid(
                "options after the pool come in pairs, <key>-<value>; a '-' inside a value \
                 is written '--'",
            ));
        }
        let mut labels = Vec::new();
        let mut session = None;
        let mut session_ttl_ms = None;
        let mut ttl = None;
        for pair in options.chunks_exact(2) {
            let (key, value) = (pair[0].as_str(), pair[1].as_str());
            let twice = || invalid(format!("{key} is given twice"));
            match key {
                "session" => {
                    if !valid_session(value) {
                        return Err(invalid(
                            "session: 1 to 64 characters of A-Z, a-z, 0-9, '_' and '.'",
                        ));
                    }
                    if session.replace(value.to_owned()).is_some() {
                        return Err(twice());
                    }
                }
                "sessionttl" => {
                    let ms = value
                        .parse::<u64>()
                        .ok()
                        .filter(|ms| *ms > 0)
                        .ok_or_else(|| {
                            invalid("sessionttl: a number of milliseconds, at least 1")
                        })?;
                    if session_ttl_ms.replace(ms).is_some() {
                        return Err(twice());
                    }
                }
                "ttl" => {
                    let lease = value
                        .parse::<u64>()
                        .ok()
                        .and_then(|ms| LeaseTtl::from_millis(ms).ok())
                        .ok_or_else(|| {
                            invalid(format!(
                                "ttl: a lease ttl in milliseconds, {} to {}",
                                LeaseTtl::MIN_MS,
                                LeaseTtl::MAX_MS
                            ))
                        })?;
                    if ttl.replace(lease).is_some() {
                        return Err(twice());
                    }
                }
                _ => labels.push(format!("{key}={value}")),
            }
        }
        if session_ttl_ms.is_some() && session.is_none() {
            return Err(invalid("sessionttl: only with a session"));
        }
        let labels = LabelFilter::from_pairs("label", labels.iter().map(String::as_str))
            .map_err(|e| invalid(e.to_string()))?;
        Ok(Self {
            pool,
            labels,
            session,
            session_ttl_ms,
            ttl,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[&str]) -> LabelFilter {
        LabelFilter::from_pairs("label", pairs.iter().copied()).expect("a filter")
    }

    #[test]
    fn a_pool_alone_asks_nothing_more() {
        assert_eq!(
            Selection::parse("web"),
            Ok(Selection {
                pool: PoolId::parse("web").expect("a pool"),
                labels: LabelFilter::default(),
                session: None,
                session_ttl_ms: None,
                ttl: None,
            })
        );
    }

    #[test]
    fn keys_after_the_pool_are_labels_and_options() {
        let selection = Selection::parse("web-country-de-session-abc123-sessionttl-60000-ttl-5000")
            .expect("valid");
        assert_eq!(selection.pool.as_str(), "web");
        assert_eq!(selection.labels, labels(&["country=de"]));
        assert_eq!(selection.session.as_deref(), Some("abc123"));
        assert_eq!(selection.session_ttl_ms, Some(60_000));
        assert_eq!(selection.ttl.map(LeaseTtl::as_millis), Some(5_000));
    }

    #[test]
    fn a_doubled_dash_is_a_dash_inside_a_pool_id_or_a_value() {
        let selection = Selection::parse("eu--web-city-frankfurt--am--main").expect("valid");
        assert_eq!(selection.pool.as_str(), "eu-web");
        assert_eq!(selection.labels, labels(&["city=frankfurt-am-main"]));
        let trailing = Selection::parse("web-----country-de").expect("valid");
        assert_eq!(trailing.pool.as_str(), "web--");
        assert_eq!(trailing.labels, labels(&["country=de"]));
        let odd = Selection::parse("web---country-de").expect("valid");
        assert_eq!(odd.pool.as_str(), "web-");
        assert_eq!(odd.labels, labels(&["country=de"]));
    }

    #[test]
    fn a_label_key_given_twice_accepts_either_value() {
        let selection = Selection::parse("web-country-de-country-fr").expect("valid");
        assert_eq!(selection.labels, labels(&["country=de", "country=fr"]));
    }

    #[test]
    fn malformed_names_are_refused_with_what_is_wrong() {
        let refused = |name: &str| Selection::parse(name).expect_err(name).to_string();
        assert!(refused("").contains("pool id"));
        assert!(refused("-web").contains("pool id"));
        assert!(refused("web-country").contains("come in pairs"));
        assert!(refused("web-session-a-session-b").contains("session is given twice"));
        assert!(refused("web-session-a b").contains("session: 1 to 64"));
        assert!(refused("web-sessionttl-10").contains("only with a session"));
        assert!(refused("web-ttl-5").contains("ttl: a lease ttl"));
        assert!(refused("web-Country-de").contains("label key"));
        assert!(refused(&"w".repeat(MAX_USER_LEN + 1)).contains("at most"));
    }
}
