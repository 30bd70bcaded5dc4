//! Running at scale: a Redis Cluster of three primaries with a replica each, a Sentinel
//! group, and the settings that choose between them. Every Redis process runs on loopback,
//! is started by its test and stopped when the test ends, and every test is bounded in time.
//!
//! Several service processes sharing one Redis are tested by the fault suite
//! (`tests/faults/replicas.rs`).

#[expect(
    dead_code,
    reason = "the harness is shared with tests/api; this binary uses part of it"
)]
#[path = "../api/helpers.rs"]
mod helpers;

mod cluster;
mod sentinel;
mod settings;
mod tls;
mod topology;
