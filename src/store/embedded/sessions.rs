//! The embedded store's sticky sessions, by the rules of `scripts/assign.lua`: each session
//! pins one member until it ends, and every assign naming it moves its end. Memory follows
//! what is live: each assign in a session first clears a few sessions that have ended, as
//! the Redis index is cleared, the sweep clears the rest when the first end falls due (the
//! pool's due time counts it), and a session read after its end counts as absent. Kept in
//! memory only: after a restart every session starts anew, which costs its next assign a
//! fresh pick.

use std::collections::{BTreeSet, HashMap};

use crate::domain::{MemberId, SessionId, Timestamp};

use crate::rules::expiry::CLEANUP;

/// A pool's sessions: each one's member and end, and the sessions by their end.
#[derive(Debug, Default)]
pub(super) struct Sessions {
    pinned: HashMap<SessionId, (MemberId, Timestamp)>,
    by_end: BTreeSet<(Timestamp, SessionId)>,
}

impl Sessions {
    /// Forgets up to [`CLEANUP`] sessions that ended by `now`, earliest first.
    pub(super) fn clear_ended(&mut self, now: Timestamp) {
        self.clear_ended_up_to(now, CLEANUP as u64);
    }

    /// Forgets up to `limit` sessions that ended by `now`, earliest first; how many. The
    /// sweep calls it when [`Sessions::first_end`] falls due, so that the sessions of a pool
    /// nobody assigns from any more are gone too.
    pub(super) fn clear_ended_up_to(&mut self, now: Timestamp, limit: u64) -> u64 {
        let mut cleared = 0;
        while cleared < limit {
            match self.by_end.first() {
                Some((end, _)) if *end <= now => {
                    if let Some((_, ended)) = self.by_end.pop_first() {
                        self.pinned.remove(&ended);
                        cleared += 1;
                    }
                }
                _ => break,
            }
        }
        cleared
    }

    /// When the session that ends first ends, if any is held.
    pub(super) fn first_end(&self) -> Option<Timestamp> {
        self.by_end.first().map(|(end, _)| *end)
    }

    /// The member of `session` when it is live at `now`.
    pub(super) fn member(&self, session: &SessionId, now: Timestamp) -> Option<&MemberId> {
        self.pinned
            .get(session)
            .filter(|(_, end)| *end > now)
            .map(|(member, _)| member)
    }

    /// Sessions held, live or ended and not yet cleared.
    pub(super) fn len(&self) -> u64 {
        self.pinned.len() as u64
    }

    /// Pins `session` to `member` until `until` (the member it had, if any, is replaced).
    pub(super) fn pin(&mut self, session: &SessionId, member: MemberId, until: Timestamp) {
        if let Some((_, before)) = self.pinned.insert(session.clone(), (member, until)) {
            self.by_end.remove(&(before, session.clone()));
        }
        self.by_end.insert((until, session.clone()));
    }

    /// Moves the end of `session`, which is held, to `until`.
    pub(super) fn slide(&mut self, session: &SessionId, until: Timestamp) {
        if let Some((member, _)) = self.pinned.get(session) {
            let member = member.clone();
            self.pin(session, member, until);
        }
    }

    /// Ends `session`; whether it was live at `now`.
    pub(super) fn end(&mut self, session: &SessionId, now: Timestamp) -> bool {
        match self.pinned.remove(session) {
            Some((_, end)) => {
                self.by_end.remove(&(end, session.clone()));
                end > now
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(text: &str) -> SessionId {
        SessionId::parse("session", text).expect("a valid id")
    }

    #[test]
    fn ended_sessions_are_cleared_a_few_at_a_time_and_never_read_as_live() {
        let mut sessions = Sessions::default();
        for n in 0..40 {
            sessions.pin(
                &id(&format!("s{n}")),
                MemberId::from_stored("a".into()),
                Timestamp(10),
            );
        }
        sessions.pin(
            &id("live"),
            MemberId::from_stored("b".into()),
            Timestamp(100),
        );
        assert_eq!(sessions.member(&id("s0"), Timestamp(10)), None);
        assert_eq!(
            sessions
                .member(&id("live"), Timestamp(10))
                .map(MemberId::as_str),
            Some("b")
        );
        sessions.clear_ended(Timestamp(10));
        assert_eq!(sessions.len(), 41 - 16);
        sessions.clear_ended(Timestamp(10));
        sessions.clear_ended(Timestamp(10));
        assert_eq!(sessions.len(), 1);
        assert!(!sessions.end(&id("s0"), Timestamp(10)));
        assert!(sessions.end(&id("live"), Timestamp(10)));
        assert_eq!(sessions.len(), 0);
    }
}
