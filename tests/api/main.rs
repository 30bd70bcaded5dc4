//! The API test suite: one binary, the real application on port 0, a real Redis started by
//! the harness. Tests that state a rule of the store run against both stores (see
//! `for_each_store!`), so the Redis and embedded stores cannot drift apart.

#[expect(
    dead_code,
    reason = "the harness is shared with tests/faults; this binary uses part of it"
)]
mod helpers;

mod activity;
mod assign;
mod auth;
mod batches;
mod check_targets;
mod checks;
mod cli;
mod clients;
mod concurrency;
mod contract;
mod demo;
mod deploy;
mod done;
mod due;
mod exclude;
mod gateway;
mod gateway_answers;
mod gateway_clients;
mod gateway_retries;
mod geo;
mod health;
mod import;
mod labels;
mod large;
mod leases;
mod logs;
mod members;
mod metrics;
mod mmdb;
mod pacing;
mod pools;
#[expect(dead_code, reason = "shared with tests/faults, which sends it signals")]
mod process;
mod proxies;
mod prune;
mod quality;
mod rate_limits;
mod redis_faults;
mod requests;
mod round_trips;
mod sessions;
mod socks;
mod sources;
mod spy;
mod targets;
mod ui;
