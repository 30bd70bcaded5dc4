//! The embedded store's data directory, with the service as a real process: restarted
//! after SIGTERM and after SIGKILL under load, started on logs cut short or damaged, started
//! twice on one directory, and the book's restart replayed. A binary of its own, so that
//! its processes and load never share the machine with the fault suite's timed tests (test
//! binaries run one after the other).

#[expect(
    dead_code,
    reason = "the harness is shared with tests/api; this binary uses part of it"
)]
#[path = "../api/helpers.rs"]
mod helpers;
#[expect(
    dead_code,
    reason = "shared with the fault suite, which reads more of it"
)]
#[path = "../faults/load.rs"]
mod load;
#[expect(
    dead_code,
    reason = "shared with the book's replay, which starts it in a directory of its own"
)]
#[path = "../api/process.rs"]
mod process;

mod data_dir;
