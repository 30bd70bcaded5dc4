//! The key layout of a pool: every key a pool script touches, in the order of its `KEYS`.
//!
//! # Key layout
//! Every key of a pool carries the pool id as its hash tag, so every script touches one
//! hash slot and the layout works unchanged on Redis Cluster:
//!
//! | key | type | holds |
//! |---|---|---|
//! | `<prefix>:{<pool>}:meta` | hash | configuration, creation time, total assignments; its existence is the pool's |
//! | `<prefix>:{<pool>}:eligible` | sorted set | eligible member -> assignments |
//! | `<prefix>:{<pool>}:ineligible` | sorted set | ineligible member -> kept assignments |
//! | `<prefix>:{<pool>}:taken_out` | hash | ineligible member -> `"<since_ms> <reason>"` |
//! | `<prefix>:{<pool>}:by_in_flight` | sorted set | least-in-flight: the choosing order (see `scripts/leases.lua`) |
//! | `<prefix>:{<pool>}:in_flight` | hash | member -> live leases (absent when none) |
//! | `<prefix>:{<pool>}:leases` | hash | lease id -> member |
//! | `<prefix>:{<pool>}:lease_expiry` | sorted set | lease id -> expiry (ms, Redis clock) |
//! | `<prefix>:{<pool>}:health` | hash | member -> `"<streak> <trips> <cooldown_ms>"` (absent when all 0) |
//! | `<prefix>:{<pool>}:returns` | sorted set | cooling-down member -> when it comes back (ms, Redis clock) |
//! | `<prefix>:{<pool>}:checks` | hash | member -> `"<at_ms> <result>[/<latency_ms>] <detail>"`, its last active check |
//! | `<prefix>:{<pool>}:check_round` | string with ttl | held by the replica running the pool's check round |
//! | `<prefix>:{<pool>}:gone:<token>:<part>` | as its part | a deleted pool's key, renamed out of the way by `delete_pool.lua` and unlinked right after (see `operations.rs`) |
//! | `<prefix>:pools` | set | pool ids, for listing; updated outside the pool scripts because it lives in another slot |

use redis::{RedisWrite, ToRedisArgs};

use super::RedisStore;
use crate::domain::PoolId;

/// Every key of a pool, in the order of `KEYS` in every pool script (see `leases.lua` and
/// `health.lua`).
pub(super) const POOL_KEY_PARTS: [&str; 12] = [
    "meta",
    "eligible",
    "ineligible",
    "taken_out",
    "by_in_flight",
    "in_flight",
    "leases",
    "lease_expiry",
    "health",
    "returns",
    "checks",
    "check_round",
];

/// Every key of one pool, in the order of [`POOL_KEY_PARTS`], written straight into a
/// command as its arguments; with a graveyard token, followed by the names the pool's keys
/// are renamed to when it is deleted (the same parts, in the same hash slot).
pub(super) struct PoolKeys<'a> {
    pub(super) prefix: &'a str,
    pub(super) pool: &'a PoolId,
    pub(super) graveyard: Option<&'a str>,
}

impl PoolKeys<'_> {
    /// The bytes of a key, less its part.
    fn head(&self) -> usize {
        self.prefix.len() + self.pool.as_str().len() + ":{}:".len()
    }

    /// The bytes a graveyard name adds to a key.
    fn graveyard_infix(&self) -> usize {
        self.graveyard
            .map_or(0, |token| "gone::".len() + token.len())
    }

    /// The bytes of every key together.
    pub(super) fn bytes(&self) -> usize {
        let keys: usize = POOL_KEY_PARTS
            .iter()
            .map(|part| self.head() + part.len())
            .sum();
        match self.graveyard {
            Some(_) => 2 * keys + POOL_KEY_PARTS.len() * self.graveyard_infix(),
            None => keys,
        }
    }
}

impl ToRedisArgs for PoolKeys<'_> {
    fn write_redis_args<W>(&self, out: &mut W)
    where
        W: ?Sized + RedisWrite,
    {
        // One buffer for every key: `write_arg` copies a whole key at a time, where
        // redis-rs's argument writer would take each piece through `io::Write`.
        let longest = POOL_KEY_PARTS.iter().map(|part| part.len()).max();
        let mut key =
            Vec::with_capacity(self.head() + self.graveyard_infix() + longest.unwrap_or(0));
        let graves = self.graveyard.map(|token| (b"gone:", token));
        for infix in [None].into_iter().chain(graves.map(Some)) {
            for part in POOL_KEY_PARTS {
                key.clear();
                key.extend_from_slice(self.prefix.as_bytes());
                key.extend_from_slice(b":{");
                key.extend_from_slice(self.pool.as_str().as_bytes());
                key.extend_from_slice(b"}:");
                if let Some((gone, token)) = infix {
                    key.extend_from_slice(gone);
                    key.extend_from_slice(token.as_bytes());
                    key.push(b':');
                }
                key.extend_from_slice(part.as_bytes());
                out.write_arg(&key);
            }
        }
    }

    fn num_of_args(&self) -> usize {
        match self.graveyard {
            Some(_) => 2 * POOL_KEY_PARTS.len(),
            None => POOL_KEY_PARTS.len(),
        }
    }
}

impl RedisStore {
    /// The registry of pool ids.
    pub(super) fn registry_key(&self) -> String {
        format!("{}:pools", self.prefix)
    }
}
