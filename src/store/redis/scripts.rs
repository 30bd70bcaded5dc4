//! The Lua scripts, one per operation, each loaded once and run by its hash.
//!
//! The table below is the one list of scripts: it declares the fields of [`Scripts`] and
//! [`Scripts::all`], from which the startup load and the reply tests (`tests.rs`, one per
//! script) take their list. Each name is its file's, in `src/store/scripts/`.

use redis::Script;

/// Declares [`Scripts`] from `name: source` lines, where the source is `plain` (the file
/// alone), `with_helpers` (the file with `labels.lua`, `leases.lua` and `health.lua` in front
/// of it, and before `health.lua` the rules' Lua twins, `src/rules/expiry.lua` and
/// `src/rules/health.lua`), `with_reports` (the same helpers, the quality rule `src/rules/quality.lua` with its
/// helper `quality.lua`, and `report.lua`, the outcome rules, in front of it), `fast_path_then_helpers` (the client rate limit, `rate.lua` with its rule
/// `src/rules/bucket.lua`, then `leases_fast.lua` and `<name>_fast.lua`, then the file with
/// its helpers: a script that answers its common case before the helpers' closures are
/// made) or `picking_after_done` (the assign that applies the worker's last outcome first:
/// the rate limit as for `assign`, then the quality rule and its helper, which every path counts outcomes with, then `leases_fast.lua` and `<name>_fast.lua`, which answers the outcome that changes nothing
/// and the release of a live lease before any helper exists, then the whole plain assign as the function `pick` for it, then for every
/// other outcome the helpers, `report.lua` and the file, which applies it, and the assign
/// again as a function on those helpers, so that their closures are made once) or
/// `chunked` (the helpers, then `chunk.lua`, the bound every chunk of a large member call
/// and every step of the sweep keeps, then the file).
macro_rules! scripts {
    ($($name:ident: $source:ident,)*) => {
        /// Every script of the store.
        pub(super) struct Scripts {
            $(
                #[doc = concat!("`", stringify!($name), ".lua`.")]
                pub(super) $name: Script,
            )*
        }

        impl Scripts {
            pub(super) fn new() -> Self {
                Self::made_by(Script::new)
            }

            /// Every script, each made from its source by `make`.
            fn made_by(make: impl Fn(&str) -> Script) -> Self {
                Self {
                    $($name: make(scripts!(@$source $name)),)*
                }
            }

            /// Every script with its name.
            pub(super) fn all(&self) -> impl Iterator<Item = (&'static str, &Script)> {
                [$((stringify!($name), &self.$name)),*].into_iter()
            }
        }
    };
    (@plain $name:ident) => {
        include_str!(concat!("../scripts/", stringify!($name), ".lua"))
    };
    (@fast_path_then_helpers $name:ident) => {
        concat!(
            scripts!(@rate_limited),
            include_str!("../scripts/leases_fast.lua"),
            include_str!(concat!("../scripts/", stringify!($name), "_fast.lua")),
            include_str!("../scripts/labels.lua"),
            include_str!("../scripts/leases.lua"),
            include_str!("../../rules/expiry.lua"),
            include_str!("../../rules/health.lua"),
            include_str!("../scripts/health.lua"),
            include_str!(concat!("../scripts/", stringify!($name), ".lua"))
        )
    };
    (@with_reports $name:ident) => {
        concat!(
            include_str!("../scripts/labels.lua"),
            include_str!("../scripts/leases.lua"),
            include_str!("../../rules/expiry.lua"),
            include_str!("../../rules/health.lua"),
            include_str!("../scripts/health.lua"),
            include_str!("../../rules/quality.lua"),
            include_str!("../scripts/quality.lua"),
            include_str!("../scripts/report.lua"),
            include_str!(concat!("../scripts/", stringify!($name), ".lua"))
        )
    };
    (@picking_after_done $name:ident) => {
        concat!(
            scripts!(@rate_limited),
            include_str!("../../rules/quality.lua"),
            include_str!("../scripts/quality.lua"),
            include_str!("../scripts/leases_fast.lua"),
            include_str!(concat!("../scripts/", stringify!($name), "_fast.lua")),
            "local function pick()\n",
            include_str!("../scripts/assign_fast.lua"),
            include_str!("../scripts/labels.lua"),
            include_str!("../scripts/leases.lua"),
            include_str!("../../rules/expiry.lua"),
            include_str!("../../rules/health.lua"),
            include_str!("../scripts/health.lua"),
            include_str!("../scripts/assign.lua"),
            "end\nif done then\n    return done_reply(done, pick())\nend\n",
            include_str!("../scripts/labels.lua"),
            include_str!("../scripts/leases.lua"),
            include_str!("../../rules/expiry.lua"),
            include_str!("../../rules/health.lua"),
            include_str!("../scripts/health.lua"),
            include_str!("../scripts/report.lua"),
            include_str!(concat!("../scripts/", stringify!($name), ".lua")),
            "local function pick_after_done()\n",
            include_str!("../scripts/assign_fast.lua"),
            include_str!("../scripts/assign.lua"),
            "end\nreturn with_done(done, pick_after_done())\n"
        )
    };
    // The head of both assign scripts: the client rate limit (`rate.lua`) with its rule,
    // in a block of their own so that its names stay there.
    (@rate_limited) => {
        concat!(
            "do\n",
            include_str!("../../rules/bucket.lua"),
            include_str!("../scripts/rate.lua"),
            "end\n"
        )
    };
    (@chunked $name:ident) => {
        concat!(
            include_str!("../scripts/labels.lua"),
            include_str!("../scripts/leases.lua"),
            include_str!("../../rules/expiry.lua"),
            include_str!("../../rules/health.lua"),
            include_str!("../scripts/health.lua"),
            include_str!("../scripts/chunk.lua"),
            include_str!(concat!("../scripts/", stringify!($name), ".lua"))
        )
    };
    (@with_helpers $name:ident) => {
        concat!(
            include_str!("../scripts/labels.lua"),
            include_str!("../scripts/leases.lua"),
            include_str!("../../rules/expiry.lua"),
            include_str!("../../rules/health.lua"),
            include_str!("../scripts/health.lua"),
            include_str!(concat!("../scripts/", stringify!($name), ".lua"))
        )
    };
}

scripts! {
    assign: fast_path_then_helpers,
    assign_done: picking_after_done,
    put_pool: plain,
    pool_info: plain,
    delete_pool: plain,
    end_session: plain,
    seed: chunked,
    members: with_helpers,
    exit_ip: with_helpers,
    disable: chunked,
    enable: chunked,
    remove: chunked,
    release: with_helpers,
    renew: with_helpers,
    sweep: chunked,
    outcomes: with_reports,
    claim_check: plain,
    claim_sources: plain,
    record_source: plain,
    source_states: plain,
    prune: with_helpers,
    claim_due: plain,
    walk: plain,
    received: plain,
    put_client: plain,
    rotate_client: plain,
    delete_client: plain,
    client_by_token: plain,
}

/// How every script reads Redis's clock; the test clock replaces this text.
#[cfg(test)]
const CLOCK_CALL: &str = "redis.call('TIME')";

#[cfg(test)]
impl Scripts {
    /// Every script with its clock read from the key `clock` (Unix milliseconds, set by
    /// the test) instead of Redis's `TIME`: how the tests that give both stores one clock
    /// (`store/twins.rs`) set this store's time. It rewrites the scripts' text, so the
    /// production scripts ([`Scripts::new`]) carry nothing of it.
    pub(super) fn on_test_clock(clock: &str) -> Self {
        let head = format!(
            "local function test_clock()\n    \
                 local ms = tonumber(redis.call('GET', '{clock}'))\n    \
                 return {{string.format('%.0f', math.floor(ms / 1000)), \
                 string.format('%.0f', (ms % 1000) * 1000)}}\n\
             end\n"
        );
        Self::made_by(|source| {
            Script::new(&format!(
                "{head}{}",
                source.replace(CLOCK_CALL, "test_clock()")
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every script that reads the time reads it as [`CLOCK_CALL`], so the test clock
    /// reaches each of them: one written otherwise would keep Redis's own clock in the
    /// tests that compare the stores.
    #[test]
    fn every_script_reads_the_clock_one_way() {
        let scripts = Scripts::made_by(|source| {
            let rest = source.replace(CLOCK_CALL, "");
            for other in ["'TIME'", "\"TIME\""] {
                assert!(!rest.contains(other), "a script reads the clock as {other}");
            }
            Script::new(source)
        });
        assert!(scripts.all().count() > 20);
    }
}
