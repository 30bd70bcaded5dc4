//! proxy-allocator hands out the least-used (or least-busy) eligible proxy of a pool, over
//! HTTP.
//!
//! Workers call `POST /pools/{pool}/assign` before each outgoing request. On a least-used
//! pool they receive the eligible member with the fewest recorded assignments; on a
//! least-in-flight pool, the one with the fewest live leases, together with a lease they
//! release when done (or that is reclaimed once it expires). The pick and the update
//! happen in one atomic step (one Lua script in Redis, one lock in the embedded store), so
//! two workers never both take the same minimum. Operators create pools, seed or import
//! members (proxy lists filtered by each pool's eligibility rules), and take members out
//! and bring them back under an explicit restore policy; workers' outcome reports (and
//! optional active checks) take failing members out for a cooldown that grows with each
//! repeated trip, after which they come back by themselves.
//!
//! # Layout
//! - [`cli`]: the command line: `serve` (the default), `demo`, and the operator commands
//!   (`pools`, `members`, `sessions`) that talk to a running service over HTTP.
//! - [`config`]: every option, as flag, environment variable and default.
//! - [`domain`]: ids and configuration values parsed at the edge (`PoolId`, `MemberId`,
//!   `LeaseId`, `LeaseTtl`, `PoolConfig`, `Policy`, `RestorePolicy`, `HealthConfig`,
//!   `CheckConfig`, `OutcomeResult`), the proxy candidate parser that gives every address
//!   one canonical id (`Candidate`), and a pool's eligibility `Rules`.
//! - [`rules`]: the pool rules both stores apply, each written once in Rust with its Lua
//!   twin beside it (`rules/<family>.rs` and `.lua`) and a test that runs both on random
//!   inputs and compares (`rules/twins.rs`); today the health rules (cooldowns, bans,
//!   restore counts), the expiry rules (how much one call clears) and the client rate
//!   limit's token bucket (`rules/bucket.rs`). Above `domain`,
//!   below `store`.
//! - [`store`]: the [`store::Store`] trait, the only code that touches pool state, with its
//!   Redis implementation and the embedded one. The Redis one (`src/store/redis/`) keeps
//!   the key layout, running a script with its retries, decoding each script's reply into
//!   one type, and the operations in modules of their own; the scripts are
//!   `src/store/scripts/*.lua`; one server, a Redis Cluster or Sentinel's primary is
//!   reached through `src/store/redis/connection.rs`. The embedded one (`src/store/embedded/`) keeps
//!   its pools in memory and, with a data directory, on disk: the records of what each
//!   operation changed (`codec.rs`), their checksummed files (`files.rs`), the writer that
//!   group-commits them (`journal.rs`), snapshots written while operations go on
//!   (`snapshot.rs`) and recovery (`recovery.rs`).
//! - [`http`]: the route table (each route with its method, who may call it and what body
//!   it reads; the router is built from it and the tests walk it), handlers per resource
//!   (assign, outcomes, leases, pools, members, activity, the import with its own body limit,
//!   probes), auth, extractors, the error type.
//! - [`geoip`]: the GeoIP file (`GEOIP_DB`), read from local disk and looked at again
//!   when it changes, which gives members the labels `geo_country`, `geo_asn` and
//!   `geo_org`; used by the import, the sources and the checks.
//! - [`sweep`]: the background sweep that reclaims expired leases and returns members
//!   whose cooldown has ended, in the pools that have such work due (each store keeps an
//!   index of them; see `src/store/redis/keys.rs`).
//! - [`checker`]: the background task that runs active checks of pools whose round is due
//!   (one replica per pool and interval) and feeds their results into the health rules; and
//!   the fetcher a pool's sources use (`checker/fetch.rs`: bounded, at most 3 redirects,
//!   every hop through the checker's private-address guard).
//! - [`sources`]: the background task that fetches the pools' sources when they are due
//!   (one replica per fetch) and imports them by the import route's own path.
//! - [`startup`]: [`startup::Application`], which binds, builds and serves (port 0 works,
//!   which is how the tests start it): the API port and, with `PROBE_LISTEN`, a probe port.
//! - [`demo`]: `proxy-allocator demo`, above `startup`: the service with a pool of
//!   forward proxies it runs itself on loopback (`demo/local.rs`: healthy, slow and failing
//!   ones, and a page to fetch through them), seeded through the API.
//! - [`connections`]: what every listening port goes through: a connection cap, each
//!   client's share of it (an IPv4 address, an IPv6 /64; trusted networks exempt),
//!   deadlines for request heads, idle keep-alive and unauthenticated connections, accept
//!   errors logged once per episode, and the open-file limit raised at start.
//! - [`gateway`]: the forward-proxy gateway (`GATEWAY_LISTEN`): a proxy port that picks,
//!   dials (`gateway/upstream.rs`: CONNECT, SOCKS, TLS to `https` proxies), reports and
//!   releases by itself, with the pool and options in the proxy user name
//!   (`gateway/user.rs`), relays tunnels (`gateway/relay.rs`: the two-way copy with
//!   buffers that grow with the traffic), and its SOCKS5 port (`GATEWAY_SOCKS_LISTEN`,
//!   `gateway/socks.rs`).
//! - [`tickets`]: the tickets of the gateway's tunnels, with which a client reports about
//!   the member that served a tunnel without learning its credentials (shared by the
//!   gateway, which issues them, and the outcomes route, which reads them).
//! - [`monitoring`]: Prometheus metrics, the per-pool gauges, and the per-second activity of
//!   the pools with series of their own (`monitoring/activity.rs`: a ring per pool).
//! - [`telemetry`]: logging setup.

pub mod checker;
pub mod cli;
pub mod config;
pub mod connections;
pub mod demo;
pub mod domain;
pub mod gateway;
pub mod geoip;
pub mod http;
pub mod monitoring;
pub mod rules;
pub mod sources;
pub mod startup;
pub mod store;
pub mod sweep;
pub mod telemetry;
pub mod tickets;

/// The test harness's `redis-server` processes, for the unit tests that need a real Redis
/// (the store's replies, the rule twins).
#[cfg(test)]
#[expect(
    dead_code,
    reason = "the test harness's Redis processes; these tests start plain servers"
)]
#[path = "../tests/api/redis_server.rs"]
mod test_redis;
