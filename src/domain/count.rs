//! Bounds on the counts a client may set (starting counts, caps): every one must stay an
//! exact whole number in a Redis sorted-set score and in Lua, both IEEE doubles.

use std::num::NonZeroU64;

use serde::{Deserialize, Deserializer, de::Error as _};

/// The largest count accepted: 2^53 − 1, the last whole number a double holds exactly.
pub const MAX_COUNT: u64 = (1 << 53) - 1;

fn bounded<E: serde::de::Error>(n: u64) -> Result<u64, E> {
    if n <= MAX_COUNT {
        Ok(n)
    } else {
        Err(E::custom(format_args!("a count is at most {MAX_COUNT}")))
    }
}

/// `deserialize_with` for an optional count.
///
/// # Errors
/// When the value is not a whole number from 0 to [`MAX_COUNT`] (or null).
pub fn optional<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<u64>, D::Error> {
    Option::<u64>::deserialize(deserializer)?
        .map(bounded)
        .transpose()
}

/// `deserialize_with` for an optional non-zero count.
///
/// # Errors
/// When the value is not a whole number from 1 to [`MAX_COUNT`] (or null).
pub fn optional_non_zero<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<NonZeroU64>, D::Error> {
    match Option::<NonZeroU64>::deserialize(deserializer)? {
        Some(n) if n.get() > MAX_COUNT => Err(D::Error::custom(format_args!(
            "a count is at most {MAX_COUNT}"
        ))),
        other => Ok(other),
    }
}

/// How many members one assign hands out (`count` in the API): 1 to 100, so that the one
/// script or lock turn an assign takes stays short.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "u64")]
pub struct AssignCount(u8);

/// Why a number is not an [`AssignCount`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("count is 1 to {max} members", max = AssignCount::MAX)]
pub struct InvalidAssignCount;

impl AssignCount {
    /// The most members one assign hands out.
    pub const MAX: u8 = 100;
    /// One member: what an assign without `count` hands out.
    pub const ONE: Self = Self(1);

    /// The count as a number.
    pub fn get(self) -> usize {
        usize::from(self.0)
    }
}

impl TryFrom<u64> for AssignCount {
    type Error = InvalidAssignCount;

    fn try_from(n: u64) -> Result<Self, InvalidAssignCount> {
        match u8::try_from(n) {
            Ok(n @ 1..=Self::MAX) => Ok(Self(n)),
            _ => Err(InvalidAssignCount),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Deserialize)]
    struct Counts {
        #[serde(default, deserialize_with = "optional")]
        n: Option<u64>,
        #[serde(default, deserialize_with = "optional_non_zero")]
        cap: Option<NonZeroU64>,
    }

    #[test]
    fn counts_up_to_two_to_the_53_minus_one_are_accepted_and_larger_ones_refused() {
        let ok: Counts =
            serde_json::from_str(r#"{"n": 9007199254740991, "cap": 9007199254740991}"#)
                .expect("the largest exact count");
        assert_eq!(
            (ok.n, ok.cap.map(NonZeroU64::get)),
            (Some(MAX_COUNT), Some(MAX_COUNT))
        );
        assert!(serde_json::from_str::<Counts>(r#"{"n": 9007199254740992}"#).is_err());
        assert!(serde_json::from_str::<Counts>(r#"{"cap": 9007199254740992}"#).is_err());
        assert!(serde_json::from_str::<Counts>(r#"{"cap": 0}"#).is_err());
        let none: Counts = serde_json::from_str(r#"{"n": null}"#).expect("null is none");
        assert_eq!(none.n, None);
    }

    #[test]
    fn an_assign_count_is_one_to_a_hundred() {
        let counts: Vec<Result<usize, InvalidAssignCount>> = [0, 1, 100, 101, 256, u64::MAX]
            .into_iter()
            .map(|n| AssignCount::try_from(n).map(AssignCount::get))
            .collect();
        assert_eq!(
            counts,
            [
                Err(InvalidAssignCount),
                Ok(1),
                Ok(100),
                Err(InvalidAssignCount),
                Err(InvalidAssignCount),
                Err(InvalidAssignCount)
            ]
        );
    }
}
