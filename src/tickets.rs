//! Tickets of the gateway's tunnels: an opaque token each CONNECT's answer carries, with
//! which a client that saw a block inside TLS reports about the member that served it
//! (`POST /pools/{pool}/outcomes` with `ticket`) without ever learning its credentials.
//!
//! A ticket lives while its tunnel is open and for the ticket ttl after it closes. Tickets
//! are kept in this process: a report must reach the replica whose gateway issued the
//! ticket (any other answers it as unknown, never as an error). Memory is bounded: open
//! tickets by the gateway's connection cap, closed ones by [`MAX_CLOSED_TICKETS`], the
//! oldest forgotten first.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use crate::domain::{MemberId, PoolId, Target, hex, random_bytes};

/// Most tickets of closed tunnels kept at once; beyond it the oldest is forgotten before
/// its ttl ends.
pub const MAX_CLOSED_TICKETS: usize = 100_000;

/// What a ticket names: the tunnel's pool, member and target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ticketed {
    /// The pool the tunnel's member was assigned from.
    pub pool: PoolId,
    /// The member that served the tunnel.
    pub member: MemberId,
    /// The host the tunnel went to.
    pub target: Target,
}

/// The tickets of one process. Cloning is shallow.
#[derive(Clone)]
pub struct Tickets {
    inner: Arc<Mutex<Kept>>,
    ttl: Duration,
}

#[derive(Default)]
struct Kept {
    /// Every live ticket: what it names, and when its tunnel closed (`None` while open).
    tickets: HashMap<String, (Ticketed, Option<Instant>)>,
    /// Closed tickets in the order they closed, which with one ttl is the order they end.
    closed: VecDeque<(Instant, String)>,
}

impl Kept {
    /// Forgets the closed tickets whose ttl has ended, and the oldest beyond the bound.
    fn forget_ended(&mut self, now: Instant, ttl: Duration) {
        while let Some((closed_at, ticket)) = self.closed.front() {
            if now.duration_since(*closed_at) < ttl && self.closed.len() <= MAX_CLOSED_TICKETS {
                break;
            }
            self.tickets.remove(ticket);
            self.closed.pop_front();
        }
    }
}

impl Tickets {
    /// Tickets valid for `ttl` after their tunnel closes.
    pub fn new(ttl: Duration) -> Self {
        Self {
            inner: Arc::new(Mutex::new(Kept::default())),
            ttl,
        }
    }

    fn kept(&self) -> std::sync::MutexGuard<'_, Kept> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A new ticket for an open tunnel: 128 random bits as hex, which nobody can guess.
    pub fn issue(&self, ticketed: Ticketed) -> String {
        let ticket = hex(&random_bytes());
        let mut kept = self.kept();
        kept.forget_ended(Instant::now(), self.ttl);
        kept.tickets.insert(ticket.clone(), (ticketed, None));
        ticket
    }

    /// The tunnel of `ticket` closed: the ticket lives for the ttl from now.
    pub fn close(&self, ticket: &str) {
        let now = Instant::now();
        let mut kept = self.kept();
        if let Some((_, closed_at)) = kept.tickets.get_mut(ticket) {
            *closed_at = Some(now);
            kept.closed.push_back((now, ticket.to_owned()));
        }
        kept.forget_ended(now, self.ttl);
    }

    /// What a live ticket of `pool` names; `None` for a ticket that is unknown, expired or
    /// another pool's.
    pub fn resolve(&self, pool: &PoolId, ticket: &str) -> Option<Ticketed> {
        let mut kept = self.kept();
        kept.forget_ended(Instant::now(), self.ttl);
        kept.tickets
            .get(ticket)
            .filter(|(ticketed, _)| &ticketed.pool == pool)
            .map(|(ticketed, _)| ticketed.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ticketed(pool: &str) -> Ticketed {
        Ticketed {
            pool: PoolId::parse(pool).expect("a pool id"),
            member: MemberId::parse("http://user:pass@p1.example.net:3128").expect("an id"),
            target: Target::parse("target", "shop.example.com").expect("a target"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_ticket_lives_while_open_and_for_the_ttl_after_it_closes() {
        let tickets = Tickets::new(Duration::from_secs(600));
        let ticket = tickets.issue(ticketed("web"));
        assert_eq!(ticket.len(), 32);
        let web = PoolId::parse("web").expect("a pool id");
        tokio::time::advance(Duration::from_secs(3600)).await;
        assert_eq!(tickets.resolve(&web, &ticket), Some(ticketed("web")));
        tickets.close(&ticket);
        tokio::time::advance(Duration::from_secs(599)).await;
        assert_eq!(tickets.resolve(&web, &ticket), Some(ticketed("web")));
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(tickets.resolve(&web, &ticket), None);
    }

    #[tokio::test]
    async fn a_ticket_is_only_its_pools_and_an_unknown_one_names_nothing() {
        let tickets = Tickets::new(Duration::from_secs(600));
        let ticket = tickets.issue(ticketed("web"));
        let other = PoolId::parse("other").expect("a pool id");
        assert_eq!(tickets.resolve(&other, &ticket), None);
        let web = PoolId::parse("web").expect("a pool id");
        assert_eq!(
            tickets.resolve(&web, "0123456789abcdef0123456789abcdef"),
            None
        );
        assert_ne!(tickets.issue(ticketed("web")), ticket);
    }

    #[tokio::test]
    async fn closed_tickets_beyond_the_bound_forget_the_oldest() {
        let tickets = Tickets::new(Duration::from_secs(600));
        let web = PoolId::parse("web").expect("a pool id");
        let first = tickets.issue(ticketed("web"));
        tickets.close(&first);
        for _ in 0..MAX_CLOSED_TICKETS {
            let ticket = tickets.issue(ticketed("web"));
            tickets.close(&ticket);
        }
        assert_eq!(tickets.resolve(&web, &first), None);
        assert_eq!(tickets.kept().closed.len(), MAX_CLOSED_TICKETS);
        assert_eq!(tickets.kept().tickets.len(), MAX_CLOSED_TICKETS);
    }
}
