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
}
