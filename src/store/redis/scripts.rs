//! The Lua scripts, one per operation, each loaded once and run by its hash.

use redis::Script;

/// A script with the shared helpers of `scripts/leases.lua` and `scripts/health.lua` in
/// front of it.
macro_rules! with_helpers {
    ($file:literal) => {
        Script::new(concat!(
            include_str!("../scripts/leases.lua"),
            include_str!("../scripts/health.lua"),
            include_str!(concat!("../", $file))
        ))
    };
}

pub(super) struct Scripts {
    pub(super) assign: Script,
    pub(super) put_pool: Script,
    pub(super) pool_info: Script,
    pub(super) delete_pool: Script,
    pub(super) seed: Script,
    pub(super) members: Script,
    pub(super) disable: Script,
    pub(super) enable: Script,
    pub(super) remove: Script,
    pub(super) release: Script,
    pub(super) renew: Script,
    pub(super) reap: Script,
    pub(super) outcomes: Script,
    pub(super) claim_check: Script,
}

impl Scripts {
    pub(super) fn new() -> Self {
        Self {
            assign: with_helpers!("scripts/assign.lua"),
            put_pool: Script::new(include_str!("../scripts/put_pool.lua")),
            pool_info: Script::new(include_str!("../scripts/pool_info.lua")),
            delete_pool: Script::new(include_str!("../scripts/delete_pool.lua")),
            seed: with_helpers!("scripts/seed.lua"),
            members: Script::new(include_str!("../scripts/members.lua")),
            disable: with_helpers!("scripts/disable.lua"),
            enable: with_helpers!("scripts/enable.lua"),
            remove: with_helpers!("scripts/remove.lua"),
            release: with_helpers!("scripts/release.lua"),
            renew: with_helpers!("scripts/renew.lua"),
            reap: with_helpers!("scripts/reap.lua"),
            outcomes: with_helpers!("scripts/outcomes.lua"),
            claim_check: Script::new(include_str!("../scripts/claim_check.lua")),
        }
    }

    pub(super) fn all(&self) -> [&Script; 14] {
        [
            &self.assign,
            &self.put_pool,
            &self.pool_info,
            &self.delete_pool,
            &self.seed,
            &self.members,
            &self.disable,
            &self.enable,
            &self.remove,
            &self.release,
            &self.renew,
            &self.reap,
            &self.outcomes,
            &self.claim_check,
        ]
    }
}
