//! `PoolId`: the name of a pool, as it appears in paths and Redis keys.

use std::fmt;

/// A validated pool id: `^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`.
///
/// The alphabet leaves out `{`, `}` and `:` on purpose: a pool id is embedded in Redis keys
/// inside a hash tag (`pa:{<pool>}:eligible`), and an id holding braces could move a key to
/// another hash slot or collide with another pool's keys.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PoolId(String);

/// Why a string is not a [`PoolId`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "a pool id is 1 to 64 characters of A-Z, a-z, 0-9, '.', '_' and '-', starting with a letter or digit"
)]
pub struct InvalidPoolId;

impl PoolId {
    /// The longest pool id accepted, in bytes.
    pub const MAX_LEN: usize = 64;

    /// Parses a pool id.
    ///
    /// # Errors
    /// [`InvalidPoolId`] when the text does not match `^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`.
    pub fn parse(text: &str) -> Result<Self, InvalidPoolId> {
        let bytes = text.as_bytes();
        let first_ok = bytes.first().is_some_and(u8::is_ascii_alphanumeric);
        let rest_ok = bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
        if first_ok && rest_ok && bytes.len() <= Self::MAX_LEN {
            Ok(Self(text.to_owned()))
        } else {
            Err(InvalidPoolId)
        }
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

// Maps keyed by ids can be searched with the text of one (the embedded store's recovery
// looks ids up as it reads them): an id hashes and compares exactly as its text.
impl std::borrow::Borrow<str> for PoolId {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for PoolId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl serde::Serialize for PoolId {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_names_made_of_the_allowed_alphabet() {
        for ok in ["a", "A9", "pool-1", "eu.west_2", &"x".repeat(64)] {
            assert_eq!(
                PoolId::parse(ok).map(|p| p.as_str().to_owned()),
                Ok(ok.to_owned())
            );
        }
    }

    #[test]
    fn rejects_everything_else() {
        let too_long = "x".repeat(65);
        for bad in [
            "", "-a", ".a", "_a", "a b", "a{b}", "a:b", "a*", "..", "a/b", "é", "a\0", &too_long,
        ] {
            assert_eq!(PoolId::parse(bad), Err(InvalidPoolId), "{bad:?}");
        }
    }
}
