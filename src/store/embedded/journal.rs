//! The log's writing side: the buffer operations append their records to under the store's
//! lock, and the writer thread that frames, writes and fsyncs it.
//!
//! The writer takes the whole buffer at once, under the same lock, so what it takes ends
//! between two operations: each frame holds whole operations, in the order they happened,
//! and a crash can only ever cut the log after some operation. That is what makes a
//! recovered state one the store actually passed through.
//!
//! Operations whose answers must wait for the disk raise `wanted` to the log offset they
//! need and wait for `durable` to reach it; the writer fsyncs everything it has taken so
//! far, so operations that wait at the same time share one fsync (group commit). Without
//! waiters it writes and fsyncs once per interval, and earlier when the buffer grows past
//! [`PRESSURE_BYTES`].

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::thread::{JoinHandle, Thread};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::{DataDirOptions, Inner, OpenError, Pool, Refused, codec, files, snapshot};
use crate::domain::{MemberId, PoolId};
use crate::store::StoreError;

/// A buffer this large is written without waiting for the interval, so that memory stays
/// bounded under a burst of changes.
const PRESSURE_BYTES: usize = 4 << 20;

/// Records of whole operations that the writer has not taken yet. Lives under the store's
/// lock.
#[derive(Debug)]
pub(super) struct Buffer {
    bytes: Vec<u8>,
    /// Log offset of `bytes[0]`, counted from this process's start.
    start: u64,
    /// Where the next log generation begins, when a compaction has asked for one and the
    /// writer has not switched yet.
    pub(super) rotation: Option<u64>,
    /// Whether the writer was already nudged about the buffer's size.
    nudged: bool,
    shared: Arc<Shared>,
}

impl Buffer {
    /// The log offset after the last record appended.
    pub(super) fn end(&self) -> u64 {
        self.start + self.bytes.len() as u64
    }

    /// Appends the after-image (or removal) of everything `pool` marked as changed, and
    /// clears the marks.
    pub(super) fn record(&mut self, id: &PoolId, pool: &mut Pool) {
        let changes = &mut pool.changes;
        if !changes.pool && changes.members.is_empty() && changes.leases.is_empty() {
            return self.check_size();
        }
        let mut members = std::mem::take(&mut changes.members);
        let mut leases = std::mem::take(&mut changes.leases);
        let pool_changed = std::mem::take(&mut changes.pool);
        members.sort_unstable();
        members.dedup();
        leases.sort_unstable();
        leases.dedup();
        if pool_changed {
            codec::pool(&mut self.bytes, id, &pool.image());
        }
        for member in &members {
            match pool.member_image(member) {
                Some(image) => codec::member(&mut self.bytes, id, member, &image),
                None => codec::member_removed(&mut self.bytes, id, member),
            }
        }
        for lease in &leases {
            match pool.leases.get(lease) {
                Some((member, expires_at)) => {
                    codec::lease(&mut self.bytes, id, lease, member, *expires_at);
                }
                None => codec::lease_ended(&mut self.bytes, id, lease),
            }
        }
        // The vectors go back, emptied, so that their space serves the next operation.
        members.clear();
        leases.clear();
        pool.changes.members = members;
        pool.changes.leases = leases;
        self.check_size();
    }

    /// Appends an assign's count update.
    pub(super) fn assigned(&mut self, pool: &PoolId, member: &MemberId, count: u64, total: u64) {
        codec::assigned(&mut self.bytes, pool, member, count, total);
    }

    /// Appends a pool's deletion.
    pub(super) fn pool_deleted(&mut self, pool: &PoolId) {
        codec::pool_deleted(&mut self.bytes, pool);
        self.check_size();
    }

    /// Appends a client's after-image; the log offset after it.
    pub(super) fn client(&mut self, client: &crate::store::ClientRecord) -> u64 {
        codec::client(&mut self.bytes, client);
        self.check_size();
        self.end()
    }

    /// Appends a client's deletion; the log offset after it.
    pub(super) fn client_deleted(&mut self, id: &crate::domain::ClientId) -> u64 {
        codec::client_deleted(&mut self.bytes, id);
        self.check_size();
        self.end()
    }

    /// Starts the next log generation after the records appended so far; returns it.
    pub(super) fn rotate(&mut self) -> u64 {
        self.rotation = Some(self.end());
        self.shared.nudge_writer();
        self.shared.progress.borrow().generation + 1
    }

    fn check_size(&mut self) {
        if self.bytes.len() >= PRESSURE_BYTES && !self.nudged {
            self.nudged = true;
            self.shared.nudge_writer();
        }
    }
}

/// How far the writer got.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Progress {
    /// Every record before this log offset is fsynced.
    pub(super) durable: u64,
    /// The generation of the log being appended to.
    pub(super) generation: u64,
    /// The disk failed; nothing more will be written.
    pub(super) failed: bool,
}

/// What the writer, the compactor and the waiting operations share.
#[derive(Debug)]
pub(super) struct Shared {
    /// The highest log offset an operation waits to see fsynced.
    wanted: AtomicU64,
    /// Set by the buffer when the writer should come before its interval.
    nudged: AtomicBool,
    pub(super) stop: AtomicBool,
    pub(super) progress: watch::Sender<Progress>,
    /// Bytes in the log being appended to.
    pub(super) log_bytes: AtomicU64,
    writer: OnceLock<Thread>,
    compactor: OnceLock<Thread>,
}

impl Shared {
    fn nudge_writer(&self) {
        self.nudged.store(true, Ordering::SeqCst);
        if let Some(writer) = self.writer.get() {
            writer.unpark();
        }
    }

    pub(super) fn stopping(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }
}

/// The log file being appended to.
#[derive(Debug)]
pub(super) struct LogFile {
    pub(super) file: File,
    pub(super) generation: u64,
    pub(super) len: u64,
    pub(super) dir: PathBuf,
}

impl LogFile {
    /// Creates the log of `generation`, with its header, durably.
    pub(super) fn create(dir: PathBuf, generation: u64) -> io::Result<Self> {
        let path = files::path(&dir, &files::log_name(generation));
        let mut file = OpenOptions::new()
            .create_new(true)
            .append(true)
            .open(&path)?;
        file.write_all(&files::file_header(files::LOG_MAGIC, generation))?;
        file.sync_all()?;
        files::sync_dir(&dir)?;
        Ok(Self {
            file,
            generation,
            len: files::FILE_HEADER,
            dir,
        })
    }

    fn append(&mut self, records: &[u8], framed: &mut Vec<u8>) -> io::Result<()> {
        if records.is_empty() {
            return Ok(());
        }
        framed.clear();
        files::frame(framed, records);
        // One write per frame: a crash leaves a prefix of it, which recovery drops whole.
        self.file.write_all(framed)?;
        self.len += framed.len() as u64;
        Ok(())
    }
}

/// What recovery hands over to the writer and the compactor.
#[derive(Debug)]
pub(super) struct Recovered {
    /// The lock file, held for as long as the store is open.
    pub(super) lock: File,
    pub(super) log: LogFile,
    /// Bytes of the snapshot the log follows (0 without one).
    pub(super) snapshot_bytes: u64,
}

/// The threads of a store with a data directory, and how its answers wait for them.
#[derive(Debug)]
pub(super) struct Disk {
    shared: Arc<Shared>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    fsync_every_answer: bool,
    timeout: Duration,
    #[cfg_attr(
        not(test),
        expect(dead_code, reason = "tests start compactions themselves")
    )]
    options: DataDirOptions,
    /// Held until the store is closed; released after the threads have stopped.
    lock: Mutex<Option<File>>,
}

impl Disk {
    /// Starts the writer and the compactor on what recovery found, and gives the store
    /// its buffer.
    pub(super) fn start(
        inner: &Arc<Mutex<Inner>>,
        options: DataDirOptions,
        recovered: Recovered,
    ) -> Result<Self, OpenError> {
        let Recovered {
            lock,
            log,
            snapshot_bytes,
        } = recovered;
        let (progress, _) = watch::channel(Progress {
            durable: 0,
            generation: log.generation,
            failed: false,
        });
        let shared = Arc::new(Shared {
            wanted: AtomicU64::new(0),
            nudged: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            progress,
            log_bytes: AtomicU64::new(log.len),
            writer: OnceLock::new(),
            compactor: OnceLock::new(),
        });
        lock_inner(inner).journal = Some(Buffer {
            bytes: Vec::new(),
            start: 0,
            rotation: None,
            nudged: false,
            shared: Arc::clone(&shared),
        });
        let spawn_error = |source| OpenError::Io {
            path: options.dir.clone(),
            source,
        };
        let writer = {
            let (inner, shared, interval) = (
                Arc::clone(inner),
                Arc::clone(&shared),
                options.fsync_interval,
            );
            std::thread::Builder::new()
                .name("pa-log-writer".to_owned())
                .spawn(move || write_loop(&inner, &shared, log, interval))
                .map_err(spawn_error)?
        };
        let _ = shared.writer.set(writer.thread().clone());
        let compactor = {
            let (inner, shared, options) =
                (Arc::clone(inner), Arc::clone(&shared), options.clone());
            std::thread::Builder::new()
                .name("pa-compactor".to_owned())
                .spawn(move || snapshot::compact_loop(&inner, &shared, &options, snapshot_bytes))
                .map_err(spawn_error)?
        };
        let _ = shared.compactor.set(compactor.thread().clone());
        Ok(Self {
            shared,
            threads: Mutex::new(vec![writer, compactor]),
            fsync_every_answer: options.fsync_interval.is_zero(),
            timeout: options.timeout,
            options,
            lock: Mutex::new(Some(lock)),
        })
    }

    /// Whether every answer waits for its fsync (`FSYNC_INTERVAL_MS=0`).
    pub(super) fn fsyncs_every_answer(&self) -> bool {
        self.fsync_every_answer
    }

    /// Waits until every record before `offset` is fsynced.
    ///
    /// # Errors
    /// [`StoreError::Timeout`] after the store timeout, [`StoreError::Unavailable`] when
    /// the disk failed.
    pub(super) async fn wait(&self, offset: u64) -> Result<(), StoreError> {
        let mut progress = self.shared.progress.subscribe();
        if progress.borrow().durable >= offset {
            return Ok(());
        }
        self.shared.wanted.fetch_max(offset, Ordering::SeqCst);
        if let Some(writer) = self.shared.writer.get() {
            writer.unpark();
        }
        let reached = progress.wait_for(|p| p.durable >= offset || p.failed);
        match tokio::time::timeout(self.timeout, reached).await {
            Ok(Ok(p)) if p.durable >= offset => Ok(()),
            Ok(_) => Err(StoreError::Unavailable(
                "the data directory failed; the change may not be on disk".into(),
            )),
            Err(_) => Err(StoreError::Timeout(self.timeout)),
        }
    }

    /// Compacts now, whatever the log's size.
    #[cfg(test)]
    pub(super) fn compact_now(&self, inner: &Mutex<Inner>) -> Option<snapshot::Compacted> {
        snapshot::compact(inner, &self.shared, &self.options).expect("compacted")
    }

    /// Starts a compaction that the caller steps through.
    #[cfg(test)]
    pub(super) fn begin_compaction(&self, inner: &Mutex<Inner>) -> snapshot::Compaction {
        snapshot::Compaction::begin(inner, &self.options)
            .expect("begun")
            .expect("no other compaction")
    }

    /// Ends a compaction begun with [`Disk::begin_compaction`].
    #[cfg(test)]
    pub(super) fn finish_compaction(
        &self,
        compaction: snapshot::Compaction,
    ) -> snapshot::Compacted {
        compaction
            .finish(&self.shared)
            .expect("finished")
            .expect("not stopped")
    }

    /// Refuses further operations, writes and fsyncs everything recorded so far, stops
    /// the threads and lets go of the directory. Idempotent.
    pub(super) fn close(&self, inner: &Mutex<Inner>) {
        {
            let mut inner = lock_inner(inner);
            if inner.refused.is_none() {
                inner.refused = Some(Refused::Closed);
            }
        }
        self.shared.stop.store(true, Ordering::SeqCst);
        for thread in [self.shared.writer.get(), self.shared.compactor.get()]
            .into_iter()
            .flatten()
        {
            thread.unpark();
        }
        // Joined under the lock: a second `close` (shutdown and a drop, or two callers)
        // returns only once the final write is done and the directory let go.
        let mut threads = self.threads.lock().unwrap_or_else(PoisonError::into_inner);
        for thread in threads.drain(..) {
            let _ = thread.join();
        }
        // Nothing more will be written: another process may have the directory now.
        drop(
            self.lock
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take(),
        );
        drop(threads);
    }
}

pub(super) fn lock_inner(inner: &Mutex<Inner>) -> std::sync::MutexGuard<'_, Inner> {
    inner.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Takes the buffer's records into `records` (which must be empty); returns the log offset
/// they start at and the pending rotation.
fn take(inner: &Mutex<Inner>, records: &mut Vec<u8>) -> (u64, Option<u64>) {
    let mut inner = lock_inner(inner);
    let Some(journal) = inner.journal.as_mut() else {
        return (0, None);
    };
    // A swap, not a copy: the lock is held for a few instructions, and the emptied vector
    // the writer hands back keeps its space for the next operations.
    std::mem::swap(&mut journal.bytes, records);
    let start = journal.start;
    journal.start += records.len() as u64;
    journal.nudged = false;
    (start, journal.rotation.take())
}

/// Marks the store failed: from now on every operation answers 503, and waiting ones are
/// told at once.
pub(super) fn fail(inner: &Mutex<Inner>, shared: &Shared, error: &io::Error) {
    tracing::error!(
        %error,
        "cannot write the data directory: the embedded store refuses every operation until \
         the service is restarted"
    );
    lock_inner(inner).refused = Some(Refused::DiskFailed(error.to_string()));
    shared.progress.send_modify(|p| p.failed = true);
}

fn write_loop(inner: &Mutex<Inner>, shared: &Shared, mut log: LogFile, interval: Duration) {
    let mut records = Vec::new();
    let mut framed = Vec::new();
    let mut written = 0u64;
    let mut synced = 0u64;
    let mut next_sync = Instant::now() + interval;
    loop {
        let stopping = shared.stopping();
        let wanted = shared.wanted.load(Ordering::SeqCst);
        let nudged = shared.nudged.swap(false, Ordering::SeqCst);
        let now = Instant::now();
        let timer = !interval.is_zero() && now >= next_sync;
        if !(stopping || wanted > synced || timer || nudged) {
            let wait = if interval.is_zero() {
                Duration::from_secs(3600)
            } else {
                next_sync - now
            };
            std::thread::park_timeout(wait);
            continue;
        }
        if timer {
            next_sync = now + interval;
        }
        let (start, rotation) = take(inner, &mut records);
        let must_sync = stopping || wanted > synced || timer || interval.is_zero();
        let mut step = || -> io::Result<()> {
            let mut rest = &records[..];
            if let Some(at) = rotation {
                let split = usize::try_from(at - start)
                    .unwrap_or(usize::MAX)
                    .min(records.len());
                log.append(&records[..split], &mut framed)?;
                // The old generation is complete and durable before the next one exists.
                log.file.sync_data()?;
                synced = at;
                log = LogFile::create(log.dir.clone(), log.generation + 1)?;
                rest = &records[split..];
            }
            log.append(rest, &mut framed)?;
            written = start + records.len() as u64;
            if must_sync && written > synced {
                log.file.sync_data()?;
                synced = written;
            }
            Ok(())
        };
        if let Err(error) = step() {
            fail(inner, shared, &error);
            return;
        }
        shared.log_bytes.store(log.len, Ordering::SeqCst);
        shared.progress.send_modify(|p| {
            p.durable = synced;
            p.generation = log.generation;
        });
        records.clear();
        if rotation.is_some()
            && let Some(compactor) = shared.compactor.get()
        {
            compactor.unpark();
        }
        if stopping {
            return;
        }
    }
}
