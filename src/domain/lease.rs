//! `LeaseId` and `LeaseTtl`: a lease on a member of a least-in-flight pool, as workers see it.

use std::fmt;

use serde::{Deserialize, Serialize};

/// An opaque lease id: 128 random bits, written as 32 lowercase hex digits.
///
/// The id is the only proof a worker holds a lease, so it must not be guessable: it is
/// drawn from the operating system's random source, never from a counter or a clock.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LeaseId(String);

/// Why a string is not a [`LeaseId`]. The API answers it as an unknown lease: an id this
/// service could never have issued names no lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a lease id is 32 lowercase hex digits")]
pub struct InvalidLeaseId;

impl LeaseId {
    /// Length of a lease id, in characters.
    pub const LEN: usize = 32;

    /// A fresh, unpredictable id.
    pub fn random() -> Self {
        Self(hex(&random_bytes()))
    }

    /// Parses an id as it appears in a path.
    ///
    /// # Errors
    /// [`InvalidLeaseId`] unless the text is exactly 32 lowercase hex digits.
    pub fn parse(text: &str) -> Result<Self, InvalidLeaseId> {
        let well_formed = text.len() == Self::LEN
            && text
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        if well_formed {
            Ok(Self(text.to_owned()))
        } else {
            Err(InvalidLeaseId)
        }
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

// Maps keyed by ids can be searched with the text of one (the embedded store's recovery
// looks ids up as it reads them): an id hashes and compares exactly as its text.
impl std::borrow::Borrow<str> for LeaseId {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for LeaseId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Serialize for LeaseId {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

/// Sixteen random bytes, drawn as one `u128`: `rand::random::<[u8; 16]>()` draws every
/// byte from a `u32` of its own, sixteen draws where two do, and every request and every
/// assign draws an id.
pub fn random_bytes() -> [u8; 16] {
    rand::random::<u128>().to_le_bytes()
}

/// Bytes as lowercase hex, two digits each. (Every request draws an id, every assign
/// another: a table lookup into a buffer of the final size, not a formatter per byte nor a
/// `char` push per digit, which encodes it as UTF-8 and checks the capacity each time.)
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut text = vec![0; bytes.len() * 2];
    for (digits, b) in text.chunks_exact_mut(2).zip(bytes) {
        digits[0] = DIGITS[usize::from(b >> 4)];
        digits[1] = DIGITS[usize::from(b & 0x0f)];
    }
    // Only ASCII digits were written.
    String::from_utf8(text).unwrap_or_default()
}

/// How long a lease lives unless it is renewed: 100 ms to 24 h, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "u64", into = "u64")]
pub struct LeaseTtl(u64);

/// Why a number is not a [`LeaseTtl`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a lease ttl is 100 to 86400000 milliseconds (100 ms to 24 h)")]
pub struct InvalidLeaseTtl;

impl LeaseTtl {
    /// The shortest ttl accepted, in milliseconds.
    pub const MIN_MS: u64 = 100;
    /// The longest ttl accepted, in milliseconds (24 h).
    pub const MAX_MS: u64 = 24 * 60 * 60 * 1000;
    /// The ttl of a pool that does not set one, in milliseconds.
    pub const DEFAULT_MS: u64 = 30_000;

    /// Checks that `ms` is within range.
    ///
    /// # Errors
    /// [`InvalidLeaseTtl`] below 100 ms or above 24 h.
    pub fn from_millis(ms: u64) -> Result<Self, InvalidLeaseTtl> {
        if (Self::MIN_MS..=Self::MAX_MS).contains(&ms) {
            Ok(Self(ms))
        } else {
            Err(InvalidLeaseTtl)
        }
    }

    /// The ttl in milliseconds.
    pub fn as_millis(self) -> u64 {
        self.0
    }
}

impl Default for LeaseTtl {
    fn default() -> Self {
        Self(Self::DEFAULT_MS)
    }
}

impl TryFrom<u64> for LeaseTtl {
    type Error = InvalidLeaseTtl;

    fn try_from(ms: u64) -> Result<Self, InvalidLeaseTtl> {
        Self::from_millis(ms)
    }
}

impl From<LeaseTtl> for u64 {
    fn from(ttl: LeaseTtl) -> u64 {
        ttl.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_writes_two_lowercase_digits_per_byte_high_nibble_first() {
        assert_eq!(hex(&[0x00, 0x0f, 0xa5, 0xff, 0x10]), "000fa5ff10");
        assert_eq!(hex(&[]), "");
    }

    #[test]
    fn random_ids_are_32_hex_digits_that_parse_back_and_never_repeat() {
        let ids: std::collections::HashSet<LeaseId> =
            (0..1000).map(|_| LeaseId::random()).collect();
        assert_eq!(ids.len(), 1000);
        for id in &ids {
            assert_eq!(LeaseId::parse(id.as_str()).as_ref(), Ok(id));
        }
    }

    #[test]
    fn ids_that_this_service_never_issues_are_refused() {
        for bad in [
            "",
            "0",
            &"A".repeat(32),
            &"g".repeat(32),
            &"0".repeat(33),
            "../x",
        ] {
            assert_eq!(LeaseId::parse(bad), Err(InvalidLeaseId), "{bad:?}");
        }
    }

    #[test]
    fn a_ttl_is_accepted_from_100_ms_to_24_hours() {
        assert_eq!(LeaseTtl::from_millis(99), Err(InvalidLeaseTtl));
        assert_eq!(LeaseTtl::from_millis(100).map(LeaseTtl::as_millis), Ok(100));
        assert_eq!(
            LeaseTtl::from_millis(86_400_000).map(LeaseTtl::as_millis),
            Ok(86_400_000)
        );
        assert_eq!(LeaseTtl::from_millis(86_400_001), Err(InvalidLeaseTtl));
        assert!(serde_json::from_str::<LeaseTtl>("50").is_err());
        assert_eq!(LeaseTtl::default().as_millis(), 30_000);
    }
}
