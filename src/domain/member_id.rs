//! `MemberId`: one proxy of a pool, as the workers will receive it.

use std::fmt;

/// The longest member id accepted, in bytes.
pub const MAX_MEMBER_ID_LEN: usize = 512;

/// A validated member id: 1 to 512 bytes of visible ASCII (`!` to `~`).
///
/// Member ids are data. They are stored and returned byte for byte, never interpreted: a
/// member that looks like Lua or like the Redis protocol is only ever passed to Redis as a
/// script argument, never spliced into a command or a key. Ids travel in JSON bodies, never
/// in paths, because real ones hold `:` and `/` (`http://user:pass@host:port`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MemberId(String);

/// Why a string is not a [`MemberId`]; the `code` is what the API reports per member.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum InvalidMemberId {
    /// The id is the empty string.
    #[error("a member id must not be empty")]
    Empty,
    /// The id is longer than [`MAX_MEMBER_ID_LEN`] bytes.
    #[error("a member id is at most 512 bytes")]
    TooLong,
    /// The id holds a byte outside visible ASCII (space, control characters, non-ASCII).
    #[error("a member id holds only visible ASCII characters ('!' to '~')")]
    InvalidCharacters,
}

impl InvalidMemberId {
    /// The stable snake_case reason reported by the API.
    pub fn code(self) -> &'static str {
        match self {
            Self::Empty => "empty",
            Self::TooLong => "too_long",
            Self::InvalidCharacters => "invalid_characters",
        }
    }
}

impl MemberId {
    /// Parses a member id.
    ///
    /// # Errors
    /// An [`InvalidMemberId`] saying which rule the text breaks; the text is never altered
    /// to make it fit.
    pub fn parse(text: &str) -> Result<Self, InvalidMemberId> {
        if text.is_empty() {
            Err(InvalidMemberId::Empty)
        } else if text.len() > MAX_MEMBER_ID_LEN {
            Err(InvalidMemberId::TooLong)
        } else if !text.bytes().all(|b| b.is_ascii_graphic()) {
            Err(InvalidMemberId::InvalidCharacters)
        } else {
            Ok(Self(text.to_owned()))
        }
    }

    /// Wraps text that a store read back from its own state, where only parsed ids were
    /// ever written.
    pub(crate) fn from_stored(text: String) -> Self {
        Self(text)
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The id for logs: credentials in a proxy URL (`scheme://user:pass@host`) are
    /// replaced by `***`, so that logs never hold them.
    pub fn masked(&self) -> std::borrow::Cow<'_, str> {
        let after_scheme = self.0.find("://").map_or(0, |i| i + 3);
        let authority_end = self.0[after_scheme..]
            .find('/')
            .map_or(self.0.len(), |i| after_scheme + i);
        match self.0[after_scheme..authority_end].rfind('@') {
            Some(at) => std::borrow::Cow::Owned(format!(
                "{}***{}",
                &self.0[..after_scheme],
                &self.0[after_scheme + at..]
            )),
            None => std::borrow::Cow::Borrowed(&self.0),
        }
    }
}

// Maps keyed by ids can be searched with the text of one (the embedded store's recovery
// looks ids up as it reads them): an id hashes and compares exactly as its text.
impl std::borrow::Borrow<str> for MemberId {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for MemberId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl serde::Serialize for MemberId {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_proxy_urls_and_script_looking_text_byte_for_byte() {
        for ok in [
            "http://user:pass@10.0.0.1:3128",
            "redis.call('FLUSHALL')",
            "*3$3DEL",
            "~",
            &"a".repeat(512),
        ] {
            assert_eq!(
                MemberId::parse(ok).map(|m| m.as_str().to_owned()),
                Ok(ok.to_owned())
            );
        }
    }

    #[test]
    fn masking_hides_credentials_and_keeps_the_rest() {
        let masked = |text: &str| MemberId::parse(text).expect("valid").masked().into_owned();
        assert_eq!(
            masked("http://user:pass@10.0.0.1:3128"),
            "http://***@10.0.0.1:3128"
        );
        assert_eq!(masked("user:p@ss@host:1/x@y"), "***@host:1/x@y");
        assert_eq!(masked("http://10.0.0.1:3128"), "http://10.0.0.1:3128");
        assert_eq!(masked("opaque-id"), "opaque-id");
    }

    #[test]
    fn rejects_empty_long_and_invisible_ids_with_a_reason() {
        assert_eq!(MemberId::parse(""), Err(InvalidMemberId::Empty));
        assert_eq!(
            MemberId::parse(&"a".repeat(513)),
            Err(InvalidMemberId::TooLong)
        );
        for bad in ["a b", "a\tb", "\r\n*3\r\n$3\r\nDEL", "é", "a\0"] {
            assert_eq!(
                MemberId::parse(bad),
                Err(InvalidMemberId::InvalidCharacters),
                "{bad:?}"
            );
        }
    }
}
