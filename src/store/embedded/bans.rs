//! The embedded store's per-target bans, by the rules of `scripts/outcomes.lua`: a
//! `blocked` report naming a target bans the member for that target only. Memory follows
//! what is live: a target's bans are forgotten once its last ban ended as long ago as it
//! lasted, found through an index by that time and cleared a few at a time on each ban,
//! as the Redis store's keys expire. Bans live in memory only: a restart forgets them
//! (they last minutes; the data directory keeps counts, membership and leases).

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use crate::domain::{HealthConfig, MemberId, Target, Timestamp};
use crate::store::{BAN_CLEANUP, MAX_BAN_TARGETS};

/// One member's ban for one target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Ban {
    until: Timestamp,
    ms: u64,
    /// Bans in a row, this one included.
    bans: u64,
}

impl Ban {
    /// Whether the next ban counts as a repeat of this one.
    fn remembered(&self, now: Timestamp) -> bool {
        self.until.0.saturating_add(self.ms) > now.0
    }
}

/// One target's bans.
#[derive(Debug)]
struct TargetBans {
    members: HashMap<MemberId, Ban>,
    /// When every ban here is forgotten.
    forgotten: Timestamp,
}

/// A pool's bans, per target.
#[derive(Debug, Default)]
pub(super) struct Bans {
    targets: HashMap<Target, TargetBans>,
    /// Targets by when their bans are all forgotten, for the lazy clean-up.
    by_forgotten: BTreeSet<(Timestamp, Target)>,
}

/// What a ban report did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Banned {
    /// The member is banned until then.
    Now(Timestamp),
    /// The member was banned already, until then; nothing changed.
    Already(Timestamp),
    /// The pool keeps bans for [`MAX_BAN_TARGETS`] targets already.
    Full,
}

impl Bans {
    /// A target's bans while they are live.
    fn live(&self, target: &Target, now: Timestamp) -> Option<&TargetBans> {
        self.targets.get(target).filter(|t| t.forgotten > now)
    }

    /// Until when `member` is banned for `target`, if it is at `now`.
    pub(super) fn banned_until(
        &self,
        target: &Target,
        member: &MemberId,
        now: Timestamp,
    ) -> Option<Timestamp> {
        let ban = self.live(target, now)?.members.get(member)?;
        (ban.until > now).then_some(ban.until)
    }

    /// Whether any member may be banned for `target`: an assign without any skips the
    /// walk.
    pub(super) fn has_live(&self, target: &Target, now: Timestamp) -> bool {
        self.live(target, now).is_some()
    }

    /// Bans `member` for `target` (see `ban` in `scripts/outcomes.lua`).
    pub(super) fn ban(
        &mut self,
        target: &Target,
        member: &MemberId,
        now: Timestamp,
        health: &HealthConfig,
    ) -> Banned {
        let live = self.live(target, now).is_some();
        if !live {
            self.forget_expired(now);
            if self.targets.len() as u64 >= MAX_BAN_TARGETS && !self.targets.contains_key(target) {
                return Banned::Full;
            }
            if let Some(old) = self.targets.remove(target) {
                self.by_forgotten.remove(&(old.forgotten, target.clone()));
            }
        }
        let entry = self
            .targets
            .entry(target.clone())
            .or_insert_with(|| TargetBans {
                members: HashMap::new(),
                forgotten: Timestamp(0),
            });
        let current = entry.members.get(member).copied();
        if let Some(ban) = current
            && ban.until > now
        {
            return Banned::Already(ban.until);
        }
        let bans = current
            .filter(|ban| ban.remembered(now))
            .map_or(1, |ban| ban.bans + 1);
        let ms = crate::rules::health::ban_ms(health, bans);
        let until = Timestamp(now.0.saturating_add(ms));
        entry
            .members
            .insert(member.clone(), Ban { until, ms, bans });
        let forgotten = Timestamp(until.0.saturating_add(ms));
        if forgotten > entry.forgotten {
            let before = std::mem::replace(&mut entry.forgotten, forgotten);
            self.by_forgotten.remove(&(before, target.clone()));
            self.by_forgotten.insert((forgotten, target.clone()));
        }
        Banned::Now(until)
    }

    /// Forgets up to [`BAN_CLEANUP`] targets whose bans are all forgotten by `now`.
    fn forget_expired(&mut self, now: Timestamp) {
        for _ in 0..BAN_CLEANUP {
            match self.by_forgotten.first() {
                Some((at, _)) if *at <= now => {
                    if let Some((_, target)) = self.by_forgotten.pop_first() {
                        self.targets.remove(&target);
                    }
                }
                _ => break,
            }
        }
    }

    /// How many targets the pool keeps bans for (live or not yet cleared).
    #[cfg(test)]
    fn targets(&self) -> usize {
        self.targets.len()
    }
}

/// The wait until the earliest of `ends`, from `now`.
pub(super) fn wait_until(ends: Option<Timestamp>, now: Timestamp) -> Option<Duration> {
    ends.map(|at| Duration::from_millis(at.0.saturating_sub(now.0)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(text: &str) -> Target {
        Target::parse("target", text).expect("a target")
    }

    fn member(text: &str) -> MemberId {
        MemberId::parse(text).expect("a member")
    }

    fn health() -> HealthConfig {
        HealthConfig {
            target_ban_ms: 1_000,
            max_cooldown_ms: 3_000,
            ..HealthConfig::default()
        }
    }

    #[test]
    fn a_repeat_ban_doubles_while_the_last_is_remembered_and_starts_over_after() {
        let mut bans = Bans::default();
        let (site, a) = (target("example.com"), member("a"));
        assert_eq!(
            bans.ban(&site, &a, Timestamp(0), &health()),
            Banned::Now(Timestamp(1_000))
        );
        assert_eq!(
            bans.ban(&site, &a, Timestamp(500), &health()),
            Banned::Already(Timestamp(1_000))
        );
        assert_eq!(
            bans.ban(&site, &a, Timestamp(1_500), &health()),
            Banned::Now(Timestamp(3_500))
        );
        assert_eq!(
            bans.ban(&site, &a, Timestamp(4_000), &health()),
            Banned::Now(Timestamp(7_000))
        );
        assert_eq!(
            bans.banned_until(&site, &a, Timestamp(6_999)),
            Some(Timestamp(7_000))
        );
        assert_eq!(bans.banned_until(&site, &a, Timestamp(7_000)), None);
        assert_eq!(
            bans.ban(&site, &a, Timestamp(10_000), &health()),
            Banned::Now(Timestamp(11_000))
        );
    }

    #[test]
    fn forgotten_targets_are_cleared_a_few_at_a_time_by_later_bans() {
        let mut bans = Bans::default();
        for n in 0..40 {
            bans.ban(
                &target(&format!("site{n}.example")),
                &member("a"),
                Timestamp(0),
                &health(),
            );
        }
        assert_eq!(bans.targets(), 40);
        bans.ban(
            &target("late.example"),
            &member("a"),
            Timestamp(2_000),
            &health(),
        );
        assert_eq!(bans.targets(), 40 - BAN_CLEANUP as usize + 1);
        assert!(!bans.has_live(&target("site39.example"), Timestamp(2_000)));
    }
}
