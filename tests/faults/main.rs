//! The fault suite: Redis killed, flushed, slowed and cut off; the service stopped under
//! load; the embedded store's data directory after SIGTERM, SIGKILL and damage; several
//! service processes on one Redis; hostile requests. Everything runs on loopback, is
//! bounded in time, and stops what it starts.

#[expect(
    dead_code,
    reason = "the harness is shared with tests/api; this binary uses part of it"
)]
#[path = "../api/helpers.rs"]
mod helpers;

mod chaos;
mod durable;
mod load;
#[path = "../api/process.rs"]
mod process;

mod hostile;
mod redis_outages;
mod replicas;
mod shutdown;
