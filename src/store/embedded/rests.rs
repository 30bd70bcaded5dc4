//! The embedded store's pacing, by the rules of `scripts/assign.lua`: a member handed out
//! rests until `now + min_interval_ms`, pool-wide or per target, and assigns skip resting
//! members. Memory follows what rests: each set clears a few entries that are over on
//! every rest it records, and a target's set is dropped once its last rest is over (found
//! through an index by that time, a few at a time), as the Redis sets expire.

use std::collections::{BTreeSet, HashMap};

use crate::domain::{MemberId, Target, Timestamp};

use crate::rules::expiry::CLEANUP;

/// Members resting in one scope (the pool, or one target).
#[derive(Debug)]
struct RestSet {
    until: HashMap<MemberId, Timestamp>,
    by_end: BTreeSet<(Timestamp, MemberId)>,
    /// The latest end in the set.
    last: Timestamp,
}

impl Default for RestSet {
    fn default() -> Self {
        Self {
            until: HashMap::new(),
            by_end: BTreeSet::new(),
            last: Timestamp(0),
        }
    }
}

impl RestSet {
    fn resting_until(&self, member: &MemberId, now: Timestamp) -> Option<Timestamp> {
        self.until.get(member).copied().filter(|end| *end > now)
    }

    fn rest(&mut self, member: &MemberId, until: Timestamp, now: Timestamp) {
        for _ in 0..CLEANUP {
            match self.by_end.first() {
                Some((end, _)) if *end <= now => {
                    if let Some((_, over)) = self.by_end.pop_first() {
                        self.until.remove(&over);
                    }
                }
                _ => break,
            }
        }
        if let Some(before) = self.until.insert(member.clone(), until) {
            self.by_end.remove(&(before, member.clone()));
        }
        self.by_end.insert((until, member.clone()));
        self.last = self.last.max(until);
    }
}

/// A pool's resting members: pool-wide, and per target.
#[derive(Debug, Default)]
pub(super) struct Rests {
    pool: RestSet,
    targets: HashMap<Target, RestSet>,
    /// Targets by the end of their last rest, for the lazy clean-up.
    targets_by_last: BTreeSet<(Timestamp, Target)>,
}

impl Rests {
    /// Until when `member` rests in the scope (`None`: pool-wide), if it does at `now`.
    pub(super) fn resting_until(
        &self,
        target: Option<&Target>,
        member: &MemberId,
        now: Timestamp,
    ) -> Option<Timestamp> {
        match target {
            None => self.pool.resting_until(member, now),
            Some(target) => self.targets.get(target)?.resting_until(member, now),
        }
    }

    /// Rests `member` until `until` in the scope.
    pub(super) fn rest(
        &mut self,
        target: Option<&Target>,
        member: &MemberId,
        until: Timestamp,
        now: Timestamp,
    ) {
        let Some(target) = target else {
            self.pool.rest(member, until, now);
            return;
        };
        for _ in 0..CLEANUP {
            match self.targets_by_last.first() {
                Some((last, _)) if *last <= now => {
                    if let Some((_, over)) = self.targets_by_last.pop_first() {
                        self.targets.remove(&over);
                    }
                }
                _ => break,
            }
        }
        let set = self.targets.entry(target.clone()).or_default();
        let before = set.last;
        set.rest(member, until, now);
        if set.last != before {
            self.targets_by_last.remove(&(before, target.clone()));
            self.targets_by_last.insert((set.last, target.clone()));
        }
    }

    /// How many entries are kept, over or not (for tests of the clean-up).
    #[cfg(test)]
    fn entries(&self) -> usize {
        self.pool.until.len() + self.targets.values().map(|s| s.until.len()).sum::<usize>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(n: u64) -> MemberId {
        MemberId::parse(&format!("m{n}")).expect("a member")
    }

    #[test]
    fn a_member_rests_until_its_end_and_sets_clear_what_is_over() {
        let mut rests = Rests::default();
        let site = Target::parse("target", "example.com").expect("a target");
        rests.rest(None, &member(1), Timestamp(100), Timestamp(0));
        assert_eq!(
            rests.resting_until(None, &member(1), Timestamp(99)),
            Some(Timestamp(100))
        );
        assert_eq!(rests.resting_until(None, &member(1), Timestamp(100)), None);
        assert_eq!(
            rests.resting_until(Some(&site), &member(1), Timestamp(0)),
            None
        );
        for n in 0..40 {
            rests.rest(Some(&site), &member(n), Timestamp(10), Timestamp(0));
        }
        assert_eq!(rests.entries(), 41);
        // A later rest for another target drops the whole set that is over.
        let other = Target::parse("target", "example.org").expect("a target");
        rests.rest(Some(&other), &member(1), Timestamp(60), Timestamp(50));
        assert_eq!(rests.entries(), 2);
        // A later pool-wide rest clears the pool-wide entry that is over.
        rests.rest(None, &member(2), Timestamp(300), Timestamp(200));
        assert_eq!(rests.entries(), 2);
    }
}
