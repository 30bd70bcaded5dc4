//! The embedded store's client rate limits: one token bucket per client in each pool, by
//! the rule of `rules/bucket.rs` (the Redis store keeps the same bucket in the pool's hash
//! slot, see `scripts/rate.lua`). In memory only: after a restart every bucket is full,
//! which lets a client take at most one more burst.
//!
//! A pool keeps at most [`MAX_BUCKETS`] buckets: a bucket that has refilled is as good as
//! none, so those go first when a new one needs room, then the one idle longest. A deleted
//! pool's buckets go with it, as the Redis store renames its hash with the pool's keys.

use std::collections::HashMap;
use std::time::Duration;

use crate::domain::{ClientId, ClientRate, Timestamp};
use crate::rules::bucket::{self, Bucket};
use crate::store::{ClientLimit, MAX_BUCKETS, StoreError};

/// The buckets of one pool's clients.
#[derive(Debug, Default)]
pub(super) struct Buckets {
    held: HashMap<ClientId, (Bucket, ClientRate)>,
}

impl Buckets {
    /// Takes `needed` tokens from `limit`'s client's bucket at `now`.
    ///
    /// # Errors
    /// [`StoreError::ClientRateLimited`], changing nothing, when it holds fewer.
    pub(super) fn take(
        &mut self,
        limit: &ClientLimit,
        now: Timestamp,
        needed: u64,
    ) -> Result<(), StoreError> {
        let rate = limit.rate;
        let held = self.held.get(&limit.client).map(|(bucket, _)| *bucket);
        let after = bucket::take(held, rate.rate_per_second, rate.burst, now.0, needed)
            .map_err(|ms| StoreError::ClientRateLimited(Duration::from_millis(ms)))?;
        if held.is_none() && self.held.len() >= MAX_BUCKETS {
            self.make_room(now);
        }
        self.held.insert(limit.client.clone(), (after, rate));
        Ok(())
    }

    /// Drops the buckets that are full again, or when none is, the one idle longest.
    fn make_room(&mut self, now: Timestamp) {
        self.held.retain(|_, (held, rate)| {
            bucket::refilled(Some(*held), rate.rate_per_second, rate.burst, now.0)
                < rate.burst * bucket::MILLI
        });
        if self.held.len() >= MAX_BUCKETS {
            let idlest = self
                .held
                .iter()
                .min_by_key(|(_, (held, _))| held.at_ms)
                .map(|(client, _)| client.clone());
            if let Some(client) = idlest {
                self.held.remove(&client);
            }
        }
    }

    /// How many buckets the pool keeps.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.held.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limit(client: &str, rate_per_second: u64, burst: u64) -> ClientLimit {
        ClientLimit {
            client: ClientId::parse(client).expect("a client id"),
            rate: ClientRate {
                rate_per_second,
                burst,
            },
        }
    }

    #[test]
    fn a_pool_keeps_at_most_its_bound_of_buckets_dropping_full_ones_first() {
        let mut buckets = Buckets::default();
        // One slow client, emptied: its bucket is far from full a second later.
        let slow = limit("slow", 1, 1);
        buckets.take(&slow, Timestamp(0), 1).expect("a token");
        for i in 1..MAX_BUCKETS {
            buckets
                .take(&limit(&format!("c{i}"), 1_000, 2), Timestamp(0), 1)
                .expect("a token");
        }
        assert_eq!(buckets.len(), MAX_BUCKETS);
        // A second later the fast ones are full again and make room; the slow one stays.
        buckets
            .take(&limit("new", 1, 1), Timestamp(500), 1)
            .expect("a token");
        assert_eq!(buckets.len(), 2);
        assert!(matches!(
            buckets.take(&slow, Timestamp(500), 1),
            Err(StoreError::ClientRateLimited(wait)) if wait == Duration::from_millis(500)
        ));
    }
}
