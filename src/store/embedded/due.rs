//! The embedded store's due indexes: which pools have work due when, so that the sweep and
//! the checker visit only those instead of every pool.
//!
//! Unlike Redis's index (which may run early, see `redis/keys.rs`) these are exact: every
//! operation runs under the store's one lock, which sets the pool's entry to its next due
//! time before it lets go. They are not written to disk: opening a data directory rebuilds
//! them from the recovered pools.

use std::collections::{BTreeSet, HashMap};

use crate::domain::{PoolId, Timestamp};

/// Pools by the time their next work falls due; each pool at most once.
#[derive(Debug, Default)]
pub(super) struct DueIndex {
    by_time: BTreeSet<(Timestamp, PoolId)>,
    at: HashMap<PoolId, Timestamp>,
}

impl DueIndex {
    /// When `pool` is due, if it is indexed.
    pub(super) fn get(&self, pool: &PoolId) -> Option<Timestamp> {
        self.at.get(pool).copied()
    }

    /// Puts `pool` at `at`, or takes it out with `None`.
    pub(super) fn set(&mut self, pool: &PoolId, at: Option<Timestamp>) {
        let current = self.get(pool);
        if current == at {
            return;
        }
        if let Some(current) = current {
            self.by_time.remove(&(current, pool.clone()));
        }
        match at {
            Some(at) => {
                self.by_time.insert((at, pool.clone()));
                self.at.insert(pool.clone(), at);
            }
            None => {
                self.at.remove(pool);
            }
        }
    }

    /// Hands out up to `limit` pools due by `now`, earliest first, each left in the index
    /// at `now + hold` so that it is not handed out again meanwhile.
    pub(super) fn take_due_holding(
        &mut self,
        now: Timestamp,
        limit: usize,
        hold: std::time::Duration,
    ) -> Vec<PoolId> {
        let hold = u64::try_from(hold.as_millis()).unwrap_or(u64::MAX);
        let due = self.take_due(now, limit);
        for pool in &due {
            self.set(pool, Some(Timestamp(now.0.saturating_add(hold))));
        }
        due
    }

    /// Takes up to `limit` pools due by `now` out of the index, earliest first.
    pub(super) fn take_due(&mut self, now: Timestamp, limit: usize) -> Vec<PoolId> {
        let mut due = Vec::new();
        while due.len() < limit {
            match self.by_time.first() {
                Some((at, _)) if *at <= now => {}
                _ => break,
            }
            if let Some((_, pool)) = self.by_time.pop_first() {
                self.at.remove(&pool);
                due.push(pool);
            }
        }
        due
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(id: &str) -> PoolId {
        PoolId::parse(id).expect("a valid pool id")
    }

    #[test]
    fn due_pools_come_out_earliest_first_and_moved_ones_only_at_their_new_time() {
        let mut index = DueIndex::default();
        index.set(&pool("late"), Some(Timestamp(30)));
        index.set(&pool("early"), Some(Timestamp(10)));
        index.set(&pool("moved"), Some(Timestamp(5)));
        index.set(&pool("moved"), Some(Timestamp(50)));
        index.set(&pool("gone"), Some(Timestamp(1)));
        index.set(&pool("gone"), None);
        assert_eq!(
            index.take_due(Timestamp(40), 10),
            [pool("early"), pool("late")]
        );
        assert_eq!(index.take_due(Timestamp(40), 10), Vec::<PoolId>::new());
        assert_eq!(index.get(&pool("moved")), Some(Timestamp(50)));
        assert_eq!(index.take_due(Timestamp(50), 1), [pool("moved")]);
        assert_eq!(index.get(&pool("moved")), None);
    }
}
