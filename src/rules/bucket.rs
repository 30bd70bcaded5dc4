//! The client rate limit's token bucket: how many tokens a client's bucket in a pool holds
//! after some time, whether an assign may take what it needs, and how long it waits when it
//! may not. The Lua twin of every function here is in `bucket.lua` beside this file, under
//! the same name; `twins.rs` proves they agree.
//!
//! Tokens are counted in thousandths (milli-tokens) and time in milliseconds, so that a
//! rate of `r` per second adds exactly `r` milli-tokens per millisecond: every value is a
//! whole number below 2^53, the same in Rust's integers and in Lua's doubles, and no float
//! rounding makes the two stores drift apart.

/// Milli-tokens in one token.
pub const MILLI: u64 = 1_000;

/// A bucket as the store keeps it: its milli-tokens at `at_ms` (the store's clock). A
/// bucket the store does not hold is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bucket {
    /// Milli-tokens left at `at_ms`.
    pub milli: u64,
    /// When it was last taken from.
    pub at_ms: u64,
}

/// The milli-tokens of `bucket` (full when `None`) at `now_ms`: what it held plus
/// `elapsed × rate`, capped at `burst` tokens. A clock that went back adds nothing.
pub fn refilled(bucket: Option<Bucket>, rate: u64, burst: u64, now_ms: u64) -> u64 {
    let full = burst * MILLI;
    match bucket {
        None => full,
        Some(Bucket { milli, at_ms }) => {
            // Capping the elapsed time first keeps the product small: past `full / rate`
            // ms the bucket is full whatever it held.
            let elapsed = now_ms.saturating_sub(at_ms).min(full / rate + 1);
            (milli + elapsed * rate).min(full)
        }
    }
}

/// Takes `needed` tokens at `now_ms`: the bucket after it (`Ok`), or how many ms until it
/// holds enough (`Err`, at least 1). An assign of more than `burst` needs a full bucket and
/// empties it: it could never have more.
///
/// # Errors
/// The wait in ms when the bucket holds fewer tokens than needed.
pub fn take(
    bucket: Option<Bucket>,
    rate: u64,
    burst: u64,
    now_ms: u64,
    needed: u64,
) -> Result<Bucket, u64> {
    let have = refilled(bucket, rate, burst, now_ms);
    let want = needed.min(burst) * MILLI;
    if have >= want {
        Ok(Bucket {
            milli: have - want,
            at_ms: now_ms,
        })
    } else {
        Err((want - have).div_ceil(rate))
    }
}

/// How many ms until `bucket` is full again from `now_ms` (at least 1): how long the
/// store keeps it, since a bucket it no longer holds is full.
pub fn full_in_ms(bucket: Bucket, rate: u64, burst: u64) -> u64 {
    (burst * MILLI)
        .saturating_sub(bucket.milli)
        .div_ceil(rate)
        .max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_bucket_gives_its_burst_then_waits_for_one_token() {
        let mut bucket = None;
        for _ in 0..5 {
            bucket = Some(take(bucket, 5, 5, 1_000, 1).expect("a token"));
        }
        assert_eq!(
            bucket,
            Some(Bucket {
                milli: 0,
                at_ms: 1_000
            })
        );
        assert_eq!(take(bucket, 5, 5, 1_000, 1), Err(200));
        assert_eq!(take(bucket, 5, 5, 1_150, 1), Err(50));
        assert_eq!(
            take(bucket, 5, 5, 1_200, 1),
            Ok(Bucket {
                milli: 0,
                at_ms: 1_200
            })
        );
    }

    #[test]
    fn refill_is_capped_at_the_burst_and_a_clock_going_back_adds_nothing() {
        let half = Some(Bucket {
            milli: 2_500,
            at_ms: 10_000,
        });
        assert_eq!(refilled(half, 5, 5, 10_100), 3_000);
        assert_eq!(refilled(half, 5, 5, u64::MAX), 5_000);
        assert_eq!(refilled(half, 5, 5, 9_000), 2_500);
        assert_eq!(refilled(None, 5, 7, 0), 7_000);
    }

    #[test]
    fn several_tokens_are_taken_at_once_and_more_than_the_burst_needs_a_full_bucket() {
        assert_eq!(
            take(None, 10, 10, 0, 4),
            Ok(Bucket {
                milli: 6_000,
                at_ms: 0
            })
        );
        assert_eq!(take(None, 10, 3, 0, 50), Ok(Bucket { milli: 0, at_ms: 0 }));
        let low = Some(Bucket {
            milli: 2_999,
            at_ms: 0,
        });
        assert_eq!(take(low, 10, 3, 0, 50), Err(1));
        assert_eq!(full_in_ms(Bucket { milli: 0, at_ms: 0 }, 10, 3), 300);
        assert_eq!(
            full_in_ms(
                Bucket {
                    milli: 3_000,
                    at_ms: 0
                },
                10,
                3
            ),
            1
        );
    }
}
