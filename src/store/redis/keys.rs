//! The key layout of a pool: every key a pool script touches, in the order of its `KEYS`.
//!
//! # Key layout
//! Every key of a pool carries the pool id as its hash tag, so every script touches one
//! hash slot and the layout works unchanged on Redis Cluster:
//!
//! | key | type | holds |
//! |---|---|---|
//! | `<prefix>:{<pool>}:meta` | hash | configuration, creation time, total assignments, `shared_exit_ips` and `country_mismatches` (kept by `scripts/labels.lua`); its existence is the pool's |
//! | `<prefix>:{<pool>}:eligible` | sorted set | eligible member -> assignments |
//! | `<prefix>:{<pool>}:ineligible` | sorted set | ineligible member -> kept assignments |
//! | `<prefix>:{<pool>}:taken_out` | hash | ineligible member -> `"<since_ms> <reason>"` |
//! | `<prefix>:{<pool>}:by_in_flight` | sorted set | least-in-flight: the choosing order (see `scripts/leases.lua`) |
//! | `<prefix>:{<pool>}:in_flight` | hash | member -> live leases (absent when none) |
//! | `<prefix>:{<pool>}:leases` | hash | lease id -> member |
//! | `<prefix>:{<pool>}:lease_expiry` | sorted set | lease id -> expiry (ms, Redis clock) |
//! | `<prefix>:{<pool>}:health` | hash | member -> `"<streak> <trips> <cooldown_ms>"` (absent when all 0) |
//! | `<prefix>:{<pool>}:returns` | sorted set | cooling-down member -> when it comes back (ms, Redis clock) |
//! | `<prefix>:{<pool>}:checks` | hash | member -> `"<at_ms> <result>[/<latency_ms>] <detail>"`, its last active check; `exit <member>` -> `"<ip> <at_ms>"`, its exit address (`exit_ip` checks); `shared <ip>` -> how many members exit there (see `scripts/labels.lua`) |
//! | `<prefix>:{<pool>}:check_round` | string with ttl | held by the replica running the pool's check round |
//! | `<prefix>:{<pool>}:labels` | hash | member -> its labels, `key=value` lines (absent when none) |
//! | `<prefix>:{<pool>}:by_label` | sorted set | eligible members' labels in the choosing order (see `scripts/labels.lua`) |
//! | `<prefix>:{<pool>}:label_members` | sorted set | every member's labels, `key=value` NUL member, for listings |
//! | `<prefix>:{<pool>}:origins` | hash | member -> `i` (imported) or `s<id>` (added by the source with that id); absent: added by hand |
//! | `<prefix>:{<pool>}:seen` | sorted set | member added by a source -> `id * 2^32 + n`, n the source's last fetch that listed it (see `prune.lua`) |
//! | `<prefix>:{<pool>}:check_fails` | hash | member -> active checks failed in a row (absent when 0) |
//! | `<prefix>:{<pool>}:prune` | sorted set | member due for removal -> when it was last looked at (ms, Redis clock) |
//! | `<prefix>:{<pool>}:sources` | hash | per source URL: `n:<url>` -> `"<next_ms> <failures> <successes> <id>"`, `l:<url>` -> `"<at_ms> <outcome JSON>"`, its last fetch; for the last 256 ids given, `u:<id>` -> its URL (for the origins of its members) |
//! | `<prefix>:{<pool>}:bans` | sorted set with ttl | the ban index: targets the pool has bans for -> when they are all forgotten (ms, Redis clock); expires with the last |
//! | `<prefix>:{<pool>}:paced` | sorted set with ttl | pools paced pool-wide: member -> until when it rests (ms, Redis clock); expires with its last entry |
//! | `<prefix>:{<pool>}:paced:<target>` | sorted set with ttl | pools paced per target: member -> until when it rests for that target; expires with its last entry; passed, after the pool's keys and the target's ban hash, only to assigns that name the target. Valid only while the pacing index lists the target, so a deleted pool's sets (left to expire) are never read: the new pool's first rest for the target unlinks it |
//! | `<prefix>:{<pool>}:paced_targets` | sorted set with ttl | the pacing index: targets the pool rests members for -> when the last of those rests ends (ms, Redis clock); expires with the last. Not one of the pool's fixed keys: passed, after the target's pacing set, only to assigns that name a target, and renamed with the pool on delete |
//! | `<prefix>:{<pool>}:bans:<target>` | hash with ttl | one target's bans, member -> `"<until_ms> <ban_ms> <bans in a row>"`; expires when they are all forgotten. Not one of the pool's fixed keys: passed, after them, only to the calls that name the target. Valid only while the index lists the target, so a deleted pool's hashes (left to expire, see `delete_pool.lua`) are never read |
//! | `<prefix>:{<pool>}:buckets` | hash with ttl | client rate limits: client id -> its token bucket in this pool, `"<milli-tokens> <ms>"` (see `scripts/rate.lua`; a client absent has a full bucket); expires once the last of them would be full again. Not one of the pool's fixed keys: passed, last, only to assigns with a client token that has a rate, and renamed with the pool on delete, so a pool made anew starts with full buckets |
//! | `<prefix>:{<pool>}:sessions` | sorted set with ttl | the session index: live sticky sessions -> when they end (ms, Redis clock); expires with the last; ended ones leave it as assigns pass (see `assign.lua`). Not one of the pool's fixed keys: passed, after them, only to assigns and ends of sessions, and renamed with them on delete |
//! | `<prefix>:{<pool>}:sessions:<session>` | string with ttl | one session's member, expiring with the session. Valid only while the index lists the session as live, so a deleted pool's (left to expire) are never read |
//! | `<prefix>:{<pool>}:gone:<token>:<part>` | as its part | a deleted pool's key, renamed out of the way by `delete_pool.lua` and unlinked right after (see `operations.rs`) |
//! | `<prefix>:pool_ids` | sorted set | the registry: pool ids, all at score 0 so that they sort by id (listing pages, prefix search, the safety net's walk); updated outside the pool scripts because it lives in another slot |
//! | `<prefix>:pools` | set | the registry of earlier versions: copied into `pool_ids` and removed when a replica starts |
//! | `{<prefix>:pool_ids}:walk` | hash | the safety net's walk, shared by every replica: `last` pool handed out, `next` turn (ms, Redis clock); in the registry's hash slot (its tag is the registry key) |
//! | `<prefix>:due` | sorted set | the sweep's due index: pool id -> when its next lease expires or member returns (ms, Redis clock), never later |
//! | `<prefix>:checks_due` | sorted set | the check index: pool id -> when its next check round is due (ms, Redis clock) |
//! | `<prefix>:sources_due` | sorted set | the source index: pool id -> when its next source fetch may be due (ms, Redis clock), never later |
//!
//! # The due index
//! Background work finds pools through the two indexes instead of reading every pool, so an
//! idle replica sends the same few commands whatever the number of pools. The indexes live
//! in hash slots of their own, which no pool script may touch; they are kept by the service,
//! next to the scripts, under these invariants:
//! - A pool's meta field `due` is never later than its earliest lease expiry or return
//!   (`due_by` in `leases.lua`; `sweep.lua` sets it to the exact time, or removes it).
//! - The pool's entry in `<prefix>:due` is never later than its `due`: a script that moves
//!   `due` earlier answers the new time (the hint, rare in steady state: later work leaves
//!   `due` where it is) and the service lowers the entry with `ZADD LT`. The sweep takes due
//!   pools out of the index (`claim_due.lua`), sweeps each and puts it back with `ZADD LT`
//!   at the time `sweep.lua` answered; every write to the index only lowers an entry or adds
//!   one, so a hint sent while a pool is being swept is never overwritten by a later time.
//! - Entries may be early (a released lease leaves `due` and the entry where they were):
//!   the sweep then finds nothing to do and moves them to the right time.
//! - A replica that dies between a script and its hint, or between taking a pool from the
//!   index and putting it back, leaves a pool whose entry is missing or late. Each sweep
//!   therefore also asks for a turn of the safety net: `walk.lua` hands out the next few
//!   registered pools in id order ([`super::operations`]'s safety net sweeps each, which
//!   puts it back into the index at its exact time, and puts pools with checks into the
//!   check index unless they are there).
//! - The replicas share one walk: its position and its turn live in
//!   `{<prefix>:pool_ids}:walk`, in the registry's slot so that one script reads the
//!   registry and moves the position. A turn lasts `walk_turn` (nine tenths of the sweep
//!   interval): a replica asking meanwhile is given nothing, so the walk costs the same
//!   whatever the number of replicas, one replica alone still walks at every sweep, and a
//!   replica that stops hands the next turn to whichever asks after its turn ends (the pools
//!   of a turn it took and never swept wait for the walk to come round again).
//! - `<prefix>:checks_due` is set to "due now" by `PUT /pools/{pool}` with checks and
//!   cleared by one without (and by a delete). The checker takes due pools with a hold
//!   (`claim_due.lua`), and once a round is claimed (or found held by another replica) sets
//!   the entry to when the next one may start (`ZADD XX`, so a pool whose checks were
//!   switched off meanwhile is not put back).
//! - `<prefix>:sources_due` follows the same rules for sources: "due now" on a `PUT` with
//!   sources, cleared by one without (and by a delete); the fetcher takes due pools with a
//!   hold, `claim_sources.lua` answers the pool's earliest next fetch (`ZADD XX`), and the
//!   end of a fetch lowers the entry to that source's next fetch (`ZADD LT`). An entry may
//!   be early (the next visit claims nothing and moves it); one written late by a claim
//!   racing another replica's end of fetch is late by at most the claim's hold.

use redis::{RedisWrite, ToRedisArgs};

use super::RedisStore;
use crate::domain::{PoolId, SessionId, Target};

/// Every key of a pool, in the order of `KEYS` in every pool script (see `labels.lua`,
/// `leases.lua` and `health.lua`).
pub(super) const POOL_KEY_PARTS: [&str; 22] = [
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
    "labels",
    "by_label",
    "label_members",
    "sources",
    "origins",
    "seen",
    "check_fails",
    "prune",
    "bans",
    "paced",
];

/// The keys `delete_pool.lua` renames: every part of [`POOL_KEY_PARTS`], then the session
/// index and the pacing index, which no other pool script but the assigns (and ends of
/// sessions) is given. Renaming the indexes is what makes the session keys and per-target
/// pacing sets a deleted pool leaves behind unreadable.
pub(super) const DELETE_KEY_PARTS: [&str; 25] = {
    let mut parts = [""; 25];
    let mut i = 0;
    while i < POOL_KEY_PARTS.len() {
        parts[i] = POOL_KEY_PARTS[i];
        i += 1;
    }
    parts[22] = "sessions";
    parts[23] = PACING_INDEX;
    parts[24] = BUCKETS;
    parts
};

/// The part of the pacing index's key (see the key layout above).
const PACING_INDEX: &str = "paced_targets";

/// The pool's client rate limits, a hash (see [`RedisStore::buckets_key`]).
const BUCKETS: &str = "buckets";

/// The keys `pool_info.lua` is given: the first eight of [`POOL_KEY_PARTS`], which hold the
/// four it reads (the meta hash, both member sets, the lease expiries) in their usual
/// places. A page of the pool listing runs it for a thousand pools, and what a script call
/// costs Redis grows with the keys it is given: with eight instead of fifteen a call took
/// about two thirds of the time (`redis-benchmark` of the same script, pipelined).
pub(super) const POOL_INFO_KEY_PARTS: &[&str] = POOL_KEY_PARTS.split_at(8).0;

/// Keys of one pool, `parts` in their order (every script but `pool_info.lua` is given all
/// of [`POOL_KEY_PARTS`]), written straight into a command as its arguments; with a
/// graveyard token, followed by the names the pool's keys are renamed to when it is
/// deleted (the same parts, in the same hash slot).
pub(super) struct PoolKeys<'a> {
    pub(super) prefix: &'a str,
    pub(super) pool: &'a PoolId,
    pub(super) parts: &'a [&'a str],
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
        let keys: usize = self.parts.iter().map(|part| self.head() + part.len()).sum();
        match self.graveyard {
            Some(_) => 2 * keys + self.parts.len() * self.graveyard_infix(),
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
        let longest = self.parts.iter().map(|part| part.len()).max();
        let mut key =
            Vec::with_capacity(self.head() + self.graveyard_infix() + longest.unwrap_or(0));
        let graves = self.graveyard.map(|token| (b"gone:", token));
        for infix in [None].into_iter().chain(graves.map(Some)) {
            for part in self.parts {
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
            Some(_) => 2 * self.parts.len(),
            None => self.parts.len(),
        }
    }
}

impl RedisStore {
    /// The ban hash of each target: the keys a script that reads or writes those bans
    /// takes after the pool's own. A target never holds a brace (see [`Target`]), so the
    /// key stays in the pool's hash slot.
    pub(super) fn ban_keys(&self, pool: &PoolId, targets: &[&Target]) -> Vec<String> {
        targets
            .iter()
            .map(|t| format!("{}:{{{}}}:bans:{t}", self.prefix, pool.as_str()))
            .collect()
    }

    /// The keys an assign naming `target` takes after the pool's own: its ban hash, then
    /// its pacing set and the pool's pacing index (both used when the pool is paced per
    /// target).
    pub(super) fn target_keys(&self, pool: &PoolId, target: &Target) -> Vec<String> {
        let head = format!("{}:{{{}}}", self.prefix, pool.as_str());
        vec![
            format!("{head}:bans:{target}"),
            format!("{head}:paced:{target}"),
            format!("{head}:{PACING_INDEX}"),
        ]
    }

    /// The keys an assign or end naming `session` takes last: the pool's session index, then
    /// the session's key. The key is the index's name, `:`, then the id: a script reads the
    /// id back from there. Its hash tag is the pool's (the first `{...}` of the key), so a
    /// brace in the id leaves it in the pool's slot.
    pub(super) fn session_keys(&self, pool: &PoolId, session: &SessionId) -> [String; 2] {
        let index = format!("{}:{{{}}}:sessions", self.prefix, pool.as_str());
        let key = format!("{index}:{session}");
        [index, key]
    }

    /// The clients' rate limit buckets in `pool` (see `scripts/rate.lua`), one field per
    /// client: in the pool's hash slot so that the assign's own script takes from them, and
    /// one key, so that deleting the pool renames it with the rest.
    pub(super) fn buckets_key(&self, pool: &PoolId) -> String {
        format!("{}:{{{}}}:{BUCKETS}", self.prefix, pool.as_str())
    }

    /// The registry of pool ids.
    pub(super) fn registry_key(&self) -> String {
        format!("{}:pool_ids", self.prefix)
    }

    /// The safety net's walk of the registry, shared by every replica: a hash in the
    /// registry's hash slot (key prefixes hold no braces, so the tag is the registry key).
    pub(super) fn walk_key(&self) -> String {
        format!("{{{}}}:walk", self.registry_key())
    }

    /// The registry of earlier versions, a set.
    pub(super) fn legacy_registry_key(&self) -> String {
        format!("{}:pools", self.prefix)
    }

    /// The sweep's due index.
    /// The clients' two hashes, in one hash slot of their own (a pool id has no `:`, so no
    /// pool's tag is this one): each client by id, and each token hash's client.
    pub(super) fn client_keys(&self) -> [String; 2] {
        let tag = format!("{{{}:clients}}", self.prefix);
        [format!("{tag}:records"), format!("{tag}:tokens")]
    }

    pub(super) fn due_key(&self) -> String {
        format!("{}:due", self.prefix)
    }

    /// The check rounds' due index.
    pub(super) fn checks_due_key(&self) -> String {
        format!("{}:checks_due", self.prefix)
    }

    /// The sources' due index.
    pub(super) fn sources_due_key(&self) -> String {
        format!("{}:sources_due", self.prefix)
    }
}
