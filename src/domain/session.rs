//! `SessionId` and `SessionTtl`: a sticky session, which keeps one worker's requests on one
//! member while that member stays eligible for them.

use std::fmt;

use serde::{Deserialize, Serialize};

/// The longest session id accepted, in bytes.
pub const MAX_SESSION_ID_LEN: usize = 128;

/// Most live sessions one pool keeps. An assign that would start a further session is
/// refused (409 `too_many_sessions`) until some end or expire; sessions already live are
/// served as usual. With expired sessions cleared as assigns pass (see the stores), this
/// bounds a pool's session memory by what is live.
pub const MAX_SESSIONS: u64 = 1_000_000;

/// The caller's name for a session: 1 to [`MAX_SESSION_ID_LEN`] visible ASCII bytes
/// (`!` to `~`). It is data, never interpreted: two requests share a session exactly when
/// their ids are the same bytes.
///
/// Its text never holds a space or a control byte. The Redis store puts it into a key name
/// after the pool's hash tag, which is the key's first `{...}`, so a brace in the id leaves
/// the key in the pool's hash slot.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SessionId(String);

/// Why a text is not a [`SessionId`]: answered as 400 `invalid_request` naming the field,
/// or, in a path, as the unknown session it names.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: a session id is 1 to 128 visible ASCII characters ('!' to '~')")]
pub struct InvalidSessionId {
    /// The field, as the caller wrote it.
    pub field: String,
}

impl SessionId {
    /// Parses `text` exactly as given.
    ///
    /// # Errors
    /// [`InvalidSessionId`] naming `field` when the text is empty, longer than
    /// [`MAX_SESSION_ID_LEN`] bytes, or holds anything but visible ASCII.
    pub fn parse(field: &str, text: &str) -> Result<Self, InvalidSessionId> {
        let visible = text.bytes().all(|b| b.is_ascii_graphic());
        if visible && (1..=MAX_SESSION_ID_LEN).contains(&text.len()) {
            Ok(Self(text.to_owned()))
        } else {
            Err(InvalidSessionId {
                field: field.to_owned(),
            })
        }
    }

    /// Parses a JSON value, which must be a string (see [`SessionId::parse`]).
    ///
    /// # Errors
    /// [`InvalidSessionId`] naming `field` for anything else.
    pub fn from_json(field: &str, value: &serde_json::Value) -> Result<Self, InvalidSessionId> {
        match value {
            serde_json::Value::String(text) => Self::parse(field, text),
            _ => Err(InvalidSessionId {
                field: field.to_owned(),
            }),
        }
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::borrow::Borrow<str> for SessionId {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Serialize for SessionId {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

/// How long a session lives after its last assign: 1,000 ms to 24 h, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "u64", into = "u64")]
pub struct SessionTtl(u64);

/// Why a number is not a [`SessionTtl`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: a session ttl is 1000 to 86400000 milliseconds (1 s to 24 h)")]
pub struct InvalidSessionTtl {
    /// The field, as the caller wrote it.
    pub field: String,
}

impl SessionTtl {
    /// The shortest ttl accepted, in milliseconds.
    pub const MIN_MS: u64 = 1_000;
    /// The longest ttl accepted, in milliseconds (24 h).
    pub const MAX_MS: u64 = 24 * 60 * 60 * 1000;
    /// The ttl of a pool that does not set one, in milliseconds (10 minutes).
    pub const DEFAULT_MS: u64 = 600_000;

    /// Checks that `ms` is within range.
    ///
    /// # Errors
    /// [`InvalidSessionTtl`] below 1,000 ms or above 24 h.
    pub fn from_millis(ms: u64) -> Result<Self, InvalidSessionTtl> {
        if (Self::MIN_MS..=Self::MAX_MS).contains(&ms) {
            Ok(Self(ms))
        } else {
            Err(InvalidSessionTtl {
                field: "session_ttl_ms".to_owned(),
            })
        }
    }

    /// Parses a JSON value, which must be a whole number in range.
    ///
    /// # Errors
    /// [`InvalidSessionTtl`] naming `field` for anything else.
    pub fn from_json(field: &str, value: &serde_json::Value) -> Result<Self, InvalidSessionTtl> {
        value
            .as_u64()
            .and_then(|ms| Self::from_millis(ms).ok())
            .ok_or_else(|| InvalidSessionTtl {
                field: field.to_owned(),
            })
    }

    /// The ttl in milliseconds.
    pub fn as_millis(self) -> u64 {
        self.0
    }
}

impl Default for SessionTtl {
    fn default() -> Self {
        Self(Self::DEFAULT_MS)
    }
}

impl TryFrom<u64> for SessionTtl {
    type Error = InvalidSessionTtl;

    fn try_from(ms: u64) -> Result<Self, InvalidSessionTtl> {
        Self::from_millis(ms)
    }
}

impl From<SessionTtl> for u64 {
    fn from(ttl: SessionTtl) -> u64 {
        ttl.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_id_is_1_to_128_visible_ascii_bytes_kept_as_written() {
        let longest = "x".repeat(128);
        for good in ["a", "Login-42", "{odd}:id/with~marks", longest.as_str()] {
            assert_eq!(
                SessionId::parse("session", good).map(|s| s.0),
                Ok(good.to_owned())
            );
        }
        let too_long = "x".repeat(129);
        for bad in [
            "",
            "with space",
            "tab\there",
            "é",
            "nul\0",
            too_long.as_str(),
        ] {
            assert_eq!(
                SessionId::parse("session", bad),
                Err(InvalidSessionId {
                    field: "session".to_owned()
                }),
                "{bad:?}"
            );
        }
        assert!(SessionId::from_json("session", &serde_json::json!(7)).is_err());
    }

    #[test]
    fn a_session_ttl_is_accepted_from_1_second_to_24_hours() {
        assert!(SessionTtl::from_millis(999).is_err());
        assert_eq!(
            SessionTtl::from_millis(1_000).map(SessionTtl::as_millis),
            Ok(1_000)
        );
        assert_eq!(
            SessionTtl::from_millis(86_400_000).map(SessionTtl::as_millis),
            Ok(86_400_000)
        );
        assert!(SessionTtl::from_millis(86_400_001).is_err());
        assert!(SessionTtl::from_json("session_ttl_ms", &serde_json::json!(1.5e3)).is_err());
        assert!(serde_json::from_str::<SessionTtl>("50").is_err());
        assert_eq!(SessionTtl::default().as_millis(), 600_000);
    }
}
