//! The fault suite: Redis killed, flushed, slowed and cut off; the service stopped under
//! load; several service processes on one Redis; hostile requests and connections (idle,
//! beyond the cap, slow bodies, a flood past the open-file limit). Everything runs on
//! loopback, is bounded in time, and stops what it starts.

#[expect(
    dead_code,
    reason = "the harness is shared with tests/api; this binary uses part of it"
)]
#[path = "../api/helpers.rs"]
mod helpers;

mod chaos;
mod connections;
#[expect(
    dead_code,
    reason = "shared with the data directory suite, which reads the counts of the answers"
)]
mod load;
#[expect(
    dead_code,
    reason = "shared with the data directory suite, which also kills and watches starts \
              fail, and with the book's replay, which starts it in a directory"
)]
#[path = "../api/process.rs"]
mod process;

mod hostile;
mod redis_outages;
mod replicas;
mod shutdown;
