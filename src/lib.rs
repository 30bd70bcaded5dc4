//! proxy-allocator hands out the least-used eligible proxy of a pool, over HTTP.
//!
//! Workers call `POST /pools/{pool}/assign` before each outgoing request and receive the
//! eligible member with the fewest recorded assignments; the pick and the increment happen
//! in one atomic step (one Lua script in Redis, one lock in the embedded store), so two
//! workers never both take the same minimum. Operators create pools, seed or import
//! members (proxy lists filtered by each pool's eligibility rules), and take members out
//! and bring them back under an explicit restore policy.
//!
//! # Layout
//! - [`config`]: every option, as flag, environment variable and default.
//! - [`domain`]: ids and configuration values parsed at the edge (`PoolId`, `MemberId`,
//!   `PoolConfig`, `RestorePolicy`), the proxy candidate parser that gives every address
//!   one canonical id (`Candidate`), and a pool's eligibility `Rules`.
//! - [`store`]: the [`store::Store`] trait, the only code that touches pool state, with its
//!   Redis implementation (scripts in `src/store/scripts/*.lua`) and the embedded one.
//! - [`http`]: the route table, handlers per resource (the import in `http/import.rs`, with
//!   its own body limit), auth, extractors, the error type.
//! - [`startup`]: [`startup::Application`], which binds, builds and serves (port 0 works,
//!   which is how the tests start it).
//! - [`telemetry`]: logging setup.

pub mod config;
pub mod domain;
pub mod http;
pub mod startup;
pub mod store;
pub mod telemetry;
