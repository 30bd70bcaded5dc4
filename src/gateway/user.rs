//! The gateway's proxy user name: which pool a client uses and what it asks of the pick,
//! as commercial gateways carry it, `<pool>-<key>-<value>-<key>-<value>...`.
//!
//! The grammar, exactly:
//! - The name is split at every single `-`; `--` stands for one `-` inside a part, read
//!   left to right (so `a---b` is the parts `a-` and `b`). This is how a pool id or a label
//!   value that holds `-` is written: pool `eu-web` is `eu--web`. A part cannot start with
//!   `-`.
//! - The first part is the pool id; the others come in pairs, a key and its value.
//! - The keys `session` (a sticky session's id, 1 to 128 visible ASCII characters but `:`,
//!   which a Basic user name cannot hold), `sessionttl` (its lifetime in milliseconds,
//!   1,000 to 86,400,000) and `ttl` (the lease ttl in milliseconds, on least-in-flight
//!   pools) are options; every other key is a label key,
//!   and the pick is among members with that label value. A label key given twice accepts
//!   either value (`country-de-country-fr`). An option given twice is refused.

use crate::domain::{LabelFilter, LeaseTtl, PoolId, SessionId, SessionTtl};
use crate::store::SessionRequest;

/// Longest user name read, in bytes.
pub const MAX_USER_LEN: usize = 1024;

/// What a gateway client asks for, read from its user name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selection {
    /// The pool.
    pub pool: PoolId,
    /// Only members whose labels pass this filter are picked.
    pub labels: LabelFilter,
    /// A sticky session, with its lifetime when one was given.
    pub session: Option<SessionRequest>,
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
        let mut session_ttl = None;
        let mut ttl = None;
        for pair in options.chunks_exact(2) {
            let (key, value) = (pair[0].as_str(), pair[1].as_str());
            let twice = || invalid(format!("{key} is given twice"));
            match key {
                "session" => {
                    let id =
                        SessionId::parse("session", value).map_err(|e| invalid(e.to_string()))?;
                    if session.replace(id).is_some() {
                        return Err(twice());
                    }
                }
                "sessionttl" => {
                    let ttl = value
                        .parse::<u64>()
                        .ok()
                        .and_then(|ms| SessionTtl::from_millis(ms).ok())
                        .ok_or_else(|| {
                            invalid(format!(
                                "sessionttl: a session's lifetime in milliseconds, {} to {}",
                                SessionTtl::MIN_MS,
                                SessionTtl::MAX_MS
                            ))
                        })?;
                    if session_ttl.replace(ttl).is_some() {
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
        if session_ttl.is_some() && session.is_none() {
            return Err(invalid("sessionttl: only with a session"));
        }
        let labels = LabelFilter::from_pairs("label", labels.iter().map(String::as_str))
            .map_err(|e| invalid(e.to_string()))?;
        Ok(Self {
            pool,
            labels,
            session: session.map(|id| SessionRequest {
                id,
                ttl: session_ttl,
            }),
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
        assert_eq!(
            selection.session,
            Some(SessionRequest {
                id: SessionId::parse("session", "abc123").expect("an id"),
                ttl: Some(SessionTtl::from_millis(60_000).expect("a ttl")),
            })
        );
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
        assert!(refused("web-session-a b").contains("session: a session id"));
        assert!(refused("web-session-a-sessionttl-10").contains("sessionttl: a session's"));
        assert!(refused("web-sessionttl-1000").contains("only with a session"));
        assert!(refused("web-ttl-5").contains("ttl: a lease ttl"));
        assert!(refused("web-Country-de").contains("label key"));
        assert!(refused(&"w".repeat(MAX_USER_LEN + 1)).contains("at most"));
    }
}
