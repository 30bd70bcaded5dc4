//! Compaction: a snapshot of every pool, written while operations go on, after which the
//! logs before it are deleted.
//!
//! A compaction first starts a new log generation `g` (under the lock, so the switch falls
//! between two operations), then copies the pools into `snapshot.g.partial` a chunk at a
//! time, taking the lock once per chunk of [`DataDirOptions::snapshot_chunk`] entries: no
//! operation waits longer than one chunk, and memory holds one chunk. Pools are visited by
//! id, and within a pool eligible members, ineligible members and leases in the order
//! the pool keeps them.
//!
//! Such a snapshot is *fuzzy*: chunks are copied at different moments. Snapshot `g` plus
//! log `g` is still exact, because every record is an absolute value (an after-image, or
//! a count update that sets a count) and log `g` holds every change since the snapshot
//! began: replaying it sets each thing the snapshot copied too early to its later value,
//! and things nothing changed were copied as they are. The one condition is that every
//! member nothing changed is copied, which holds because an unchanged member keeps its
//! place in the order; a member that moves is changed, and its after-image is in the log.
//! A count update ([`Record::Assigned`](super::codec::Record::Assigned)) is the only record
//! that is not a whole image, and it applies only to a member the snapshot holds; an assign
//! raises a count, which moves the member forward in the order, so it is copied after the
//! move if not before; any operation that moves a member back logs its whole image.
//!
//! The snapshot ends with a record naming its generation and how many records came before:
//! only then is it renamed to `snapshot.g`, fsynced with its directory, and the older
//! files deleted.

use std::fs::{File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::ops::Bound;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::clients::Clients;
use super::codec::{self, Reader};
use super::journal::{Shared, fail, lock_inner};
use super::{DataDirOptions, Inner, Pool, files};
use crate::domain::{LeaseId, MemberId, PoolId, Timestamp};

/// How often the compactor looks at the log's size.
const LOOK_EVERY: Duration = Duration::from_secs(1);

/// Where the copying of a snapshot has got to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Cursor {
    /// Every client, in the first turn: at most `MAX_CLIENTS` records of a few hundred
    /// bytes.
    Clients,
    /// The next pool after this one (all pools from the first when `None`).
    Pools(Option<PoolId>),
    /// Eligible members of the pool after this one.
    Eligible(PoolId, Option<(u64, MemberId)>),
    /// Ineligible members of the pool after this one.
    Ineligible(PoolId, Option<(u64, MemberId)>),
    /// Leases of the pool after this one.
    Leases(PoolId, Option<(Timestamp, LeaseId)>),
    /// Everything is copied.
    Done,
}

fn after<T: Ord + Clone>(key: &Option<T>) -> (Bound<T>, Bound<T>) {
    (
        key.clone().map_or(Bound::Unbounded, Bound::Excluded),
        Bound::Unbounded,
    )
}

/// Appends the records of up to `budget` entries from `cursor` on, and moves the cursor;
/// returns how many records it appended.
pub(super) fn copy_chunk(
    pools: &std::collections::BTreeMap<PoolId, Pool>,
    clients: &Clients,
    cursor: &mut Cursor,
    out: &mut Vec<u8>,
    budget: usize,
) -> u64 {
    let mut copied = 0usize;
    while copied < budget {
        let next = match &*cursor {
            Cursor::Done => break,
            Cursor::Clients => {
                for client in clients.all() {
                    codec::client(out, client);
                    copied += 1;
                }
                Cursor::Pools(None)
            }
            Cursor::Pools(last) => match pools.range(after(last)).next() {
                Some((id, pool)) => {
                    codec::pool(out, id, &pool.image());
                    copied += 1;
                    Cursor::Eligible(id.clone(), None)
                }
                None => Cursor::Done,
            },
            Cursor::Eligible(id, last) | Cursor::Ineligible(id, last) => {
                let eligible = matches!(cursor, Cursor::Eligible(..));
                let Some(pool) = pools.get(id) else {
                    // Deleted since the last chunk: its deletion is in the log.
                    *cursor = Cursor::Pools(Some(id.clone()));
                    continue;
                };
                let ranked = if eligible {
                    &pool.eligible
                } else {
                    &pool.ineligible
                };
                let mut last_copied = None;
                for (count, member) in ranked.order.range(after(last)).take(budget - copied) {
                    let image = pool.member_image_with(member, *count, eligible);
                    codec::member(out, id, member, &image);
                    copied += 1;
                    last_copied = Some((*count, member));
                }
                match (last_copied, eligible) {
                    (Some((count, member)), true) if copied == budget => {
                        Cursor::Eligible(id.clone(), Some((count, member.clone())))
                    }
                    (Some((count, member)), false) if copied == budget => {
                        Cursor::Ineligible(id.clone(), Some((count, member.clone())))
                    }
                    (_, true) => Cursor::Ineligible(id.clone(), None),
                    (_, false) => Cursor::Leases(id.clone(), None),
                }
            }
            Cursor::Leases(id, last) => {
                let Some(pool) = pools.get(id) else {
                    *cursor = Cursor::Pools(Some(id.clone()));
                    continue;
                };
                let mut last_copied = None;
                for (expires_at, lease) in pool.expiry.range(after(last)).take(budget - copied) {
                    if let Some((member, _)) = pool.leases.get(lease) {
                        codec::lease(out, id, lease, member, *expires_at);
                    }
                    copied += 1;
                    last_copied = Some((*expires_at, lease));
                }
                match last_copied {
                    Some((at, lease)) if copied == budget => {
                        Cursor::Leases(id.clone(), Some((at, lease.clone())))
                    }
                    _ => Cursor::Pools(Some(id.clone())),
                }
            }
        };
        *cursor = next;
    }
    copied as u64
}

/// Every record of the whole state, decoded and written out one per line.
pub(super) fn describe(
    pools: &std::collections::BTreeMap<PoolId, Pool>,
    clients: &Clients,
) -> Vec<String> {
    let mut bytes = Vec::new();
    copy_chunk(pools, clients, &mut Cursor::Clients, &mut bytes, usize::MAX);
    let mut reader = Reader::new(&bytes);
    let mut lines = Vec::new();
    while let Ok(Some(record)) = reader.next_record() {
        lines.push(format!("{record:?}"));
    }
    lines
}

/// Compacts whenever the log has grown past the larger of the options' minimum and half
/// the last snapshot, until the store stops.
pub(super) fn compact_loop(
    inner: &Arc<Mutex<Inner>>,
    shared: &Shared,
    options: &DataDirOptions,
    mut snapshot_bytes: u64,
) {
    while !shared.stopping() {
        std::thread::park_timeout(LOOK_EVERY);
        let log_bytes = shared.log_bytes.load(Ordering::SeqCst);
        let threshold = options.compact_min_log_bytes.max(snapshot_bytes / 2);
        if shared.stopping() || log_bytes <= threshold {
            continue;
        }
        match compact(inner, shared, options) {
            Ok(Some(done)) => {
                tracing::info!(
                    generation = done.generation,
                    log_bytes,
                    snapshot_bytes = done.bytes,
                    records = done.records,
                    took_ms = done.took.as_millis() as u64,
                    "embedded store: compacted the log into a snapshot"
                );
                snapshot_bytes = done.bytes;
            }
            Ok(None) => return,
            Err(error) => {
                fail(inner, shared, &error);
                return;
            }
        }
    }
}

/// What a compaction wrote.
#[derive(Debug, Clone, Copy)]
pub(super) struct Compacted {
    pub(super) generation: u64,
    pub(super) bytes: u64,
    pub(super) records: u64,
    pub(super) took: Duration,
}

/// Writes a snapshot of the next generation and deletes what it replaces. `None` when the
/// store stopped first (the partial snapshot is deleted; the logs still hold everything).
pub(super) fn compact(
    inner: &Mutex<Inner>,
    shared: &Shared,
    options: &DataDirOptions,
) -> io::Result<Option<Compacted>> {
    let Some(mut compaction) = Compaction::begin(inner, options)? else {
        return Ok(None);
    };
    loop {
        if shared.stopping() {
            compaction.abandon();
            return Ok(None);
        }
        match compaction.step(inner, options.snapshot_chunk) {
            Ok(false) => {}
            Ok(true) => return compaction.finish(shared),
            Err(error) => {
                compaction.abandon();
                return Err(error);
            }
        }
    }
}

/// A snapshot being written.
pub(super) struct Compaction {
    generation: u64,
    dir: PathBuf,
    partial: PathBuf,
    out: BufWriter<File>,
    bytes: u64,
    records: u64,
    cursor: Cursor,
    chunk: Vec<u8>,
    framed: Vec<u8>,
    started: Instant,
}

impl Compaction {
    /// Starts the next log generation and the snapshot file; `None` when the store has no
    /// log or a compaction is already under way.
    pub(super) fn begin(
        inner: &Mutex<Inner>,
        options: &DataDirOptions,
    ) -> io::Result<Option<Self>> {
        let started = Instant::now();
        let generation = {
            let mut inner = lock_inner(inner);
            let Some(journal) = inner.journal.as_mut() else {
                return Ok(None);
            };
            if journal.rotation.is_some() {
                return Ok(None);
            }
            journal.rotate()
        };
        let dir = options.dir.clone();
        let partial = files::path(&dir, &files::snapshot_in_progress_name(generation));
        let file = OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .open(&partial)?;
        let mut out = BufWriter::with_capacity(1 << 20, file);
        out.write_all(&files::file_header(files::SNAPSHOT_MAGIC, generation))?;
        Ok(Some(Self {
            generation,
            dir,
            partial,
            out,
            bytes: files::FILE_HEADER,
            records: 0,
            cursor: Cursor::Clients,
            chunk: Vec::new(),
            framed: Vec::new(),
            started,
        }))
    }

    /// Copies the next `entries` under one turn of the lock and writes them as a frame;
    /// true once the snapshot's end is written.
    pub(super) fn step(&mut self, inner: &Mutex<Inner>, entries: usize) -> io::Result<bool> {
        self.chunk.clear();
        let inner = lock_inner(inner);
        self.records += copy_chunk(
            &inner.pools,
            &inner.clients,
            &mut self.cursor,
            &mut self.chunk,
            entries.max(1),
        );
        // Written outside the lock.
        drop(inner);
        let done = self.cursor == Cursor::Done;
        if done {
            codec::snapshot_end(&mut self.chunk, self.generation, self.records);
        }
        self.framed.clear();
        files::frame(&mut self.framed, &self.chunk);
        self.out.write_all(&self.framed)?;
        self.bytes += self.framed.len() as u64;
        Ok(done)
    }

    /// Makes the snapshot durable, waits for its log to exist, puts it in place and
    /// deletes the files it replaces.
    pub(super) fn finish(self, shared: &Shared) -> io::Result<Option<Compacted>> {
        let Self {
            generation,
            dir,
            partial,
            out,
            bytes,
            records,
            started,
            ..
        } = self;
        let file: File = out.into_inner().map_err(io::IntoInnerError::into_error)?;
        file.sync_all()?;
        // The snapshot needs its log: wait until the writer has switched to it.
        let mut progress = shared.progress.subscribe();
        while progress.borrow_and_update().generation < generation {
            if shared.stopping() || progress.borrow().failed {
                let _ = std::fs::remove_file(&partial);
                return Ok(None);
            }
            std::thread::park_timeout(Duration::from_millis(10));
        }
        std::fs::rename(
            &partial,
            files::path(&dir, &files::snapshot_name(generation)),
        )?;
        files::sync_dir(&dir)?;
        for entry in std::fs::read_dir(&dir)? {
            let name = entry?.file_name();
            let older = match name.to_str().and_then(files::kind_of) {
                Some(files::Kind::Log(g) | files::Kind::Snapshot(g)) => g < generation,
                _ => false,
            };
            if older {
                std::fs::remove_file(dir.join(&name))?;
            }
        }
        files::sync_dir(&dir)?;
        Ok(Some(Compacted {
            generation,
            bytes,
            records,
            took: started.elapsed(),
        }))
    }

    /// Deletes the partial snapshot: the logs still hold everything.
    pub(super) fn abandon(self) {
        let _ = std::fs::remove_file(&self.partial);
    }
}
