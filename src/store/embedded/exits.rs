//! The embedded store's exit addresses: each member's, as `exit_ip` checks saw it, and how
//! many members exit at each address, kept as `set_exit` and `drop_exit` in
//! `scripts/labels.lua` keep the Redis ones.

use std::net::IpAddr;

use super::Pool;
use crate::domain::{MemberId, Timestamp};

impl Pool {
    /// The member's exit address, when a check saw one.
    pub(super) fn exit_of(&self, member: &MemberId) -> Option<IpAddr> {
        self.exits.get(member).map(|(ip, _)| *ip)
    }

    /// Whether another member exits at the member's address.
    pub(super) fn shares_exit(&self, member: &MemberId) -> bool {
        self.exit_of(member)
            .is_some_and(|ip| self.exit_counts.get(&ip).is_some_and(|n| *n >= 2))
    }

    /// Records that `member` exits at `ip`, seen at `at`.
    pub(super) fn set_exit(&mut self, member: &MemberId, ip: IpAddr, at: Timestamp) {
        match self.exits.insert(member.clone(), (ip, at)) {
            Some((old, _)) if old == ip => {}
            Some((old, _)) => {
                self.count_exit(old, false);
                self.count_exit(ip, true);
            }
            None => self.count_exit(ip, true),
        }
    }

    /// Forgets the member's exit address (it leaves the pool).
    pub(super) fn drop_exit(&mut self, member: &MemberId) {
        if let Some((old, _)) = self.exits.remove(member) {
            self.count_exit(old, false);
        }
    }

    /// One member more (`up`) or fewer at `ip`, keeping the count of shared addresses.
    fn count_exit(&mut self, ip: IpAddr, up: bool) {
        let n = self.exit_counts.entry(ip).or_insert(0);
        *n = if up { *n + 1 } else { n.saturating_sub(1) };
        match (up, *n) {
            (true, 2) => self.shared_exit_ips += 1,
            (false, 1) => self.shared_exit_ips = self.shared_exit_ips.saturating_sub(1),
            _ => {}
        }
        if *n == 0 {
            self.exit_counts.remove(&ip);
        }
    }
}
