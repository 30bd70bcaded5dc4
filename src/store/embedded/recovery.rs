//! Opening a data directory: the lock, the newest complete snapshot, the logs after it.
//!
//! A last log whose final frame was cut short by a crash is truncated to its last whole
//! frame, with a warning naming the file, the offset and the bytes dropped: that frame's
//! operations were never fsynced, so none of them was a change the store had promised to
//! keep. Anything else that does not read back — a checksum that fails before the end, a
//! missing generation, a snapshot without its end — stops the opening with the file and
//! offset: the store never starts on part of its state.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::path::Path;
use std::time::Instant;

use super::clients::Clients;
use super::codec::{MemberImage, PoolImage, Provenance, Reader, Record};
use super::journal::{LogFile, Recovered as ForDisk};
use super::{DataDirOptions, OpenError, Pool, files};
use crate::domain::{MemberId, Policy, PoolId};
use crate::store::{Health, Quality};

/// The state found, and the open files to go on with.
pub(super) struct Recovered {
    pub(super) pools: BTreeMap<PoolId, Pool>,
    pub(super) clients: Clients,
    pub(super) disk: ForDisk,
}

fn io(path: &Path) -> impl Fn(std::io::Error) -> OpenError + '_ {
    move |source| OpenError::Io {
        path: path.to_owned(),
        source,
    }
}

/// Takes the directory's lock, or says who holds it.
fn lock(dir: &Path) -> Result<File, OpenError> {
    let path = files::path(dir, files::LOCK);
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(io(&path))?;
    match file.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            let mut holder = String::new();
            let _ = file.read_to_string(&mut holder);
            let holder = holder.trim();
            return Err(OpenError::Locked {
                dir: dir.to_owned(),
                holder: (!holder.is_empty()).then(|| holder.to_owned()),
            });
        }
        Err(std::fs::TryLockError::Error(source)) => return Err(OpenError::Io { path, source }),
    }
    // The pid is only there for the message another process shows; the lock is the flock.
    file.set_len(0).map_err(io(&path))?;
    file.rewind().map_err(io(&path))?;
    write!(file, "{}", std::process::id()).map_err(io(&path))?;
    Ok(file)
}

/// Opens `options.dir` (creating it when missing) and loads what it holds.
pub(super) fn recover(options: &DataDirOptions) -> Result<Recovered, OpenError> {
    let started = Instant::now();
    let dir = options.dir.as_path();
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let lock = lock(dir)?;
    let mut logs = Vec::new();
    let mut snapshots = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io(dir))? {
        let entry = entry.map_err(io(dir))?;
        let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
            continue;
        };
        match files::kind_of(&name) {
            Some(files::Kind::Log(generation)) => logs.push(generation),
            Some(files::Kind::Snapshot(generation)) => snapshots.push(generation),
            Some(files::Kind::SnapshotInProgress(_)) => {
                // A compaction the last process did not finish: the logs still hold all.
                let path = files::path(dir, &name);
                std::fs::remove_file(&path).map_err(io(&path))?;
                tracing::info!(file = %path.display(), "removed an unfinished snapshot");
            }
            None => {}
        }
    }
    logs.sort_unstable();
    snapshots.sort_unstable();
    let snapshot = snapshots.last().copied();
    // Files older than the newest snapshot were about to be deleted when the last process
    // stopped.
    let first_log = snapshot.unwrap_or(1);
    for generation in logs.iter().filter(|g| **g < first_log) {
        let path = files::path(dir, &files::log_name(*generation));
        std::fs::remove_file(&path).map_err(io(&path))?;
    }
    for generation in snapshots.iter().filter(|g| Some(**g) != snapshot) {
        let path = files::path(dir, &files::snapshot_name(*generation));
        std::fs::remove_file(&path).map_err(io(&path))?;
    }
    logs.retain(|g| *g >= first_log);
    for (expected, found) in (first_log..).zip(&logs) {
        if expected != *found {
            return Err(missing(dir, &files::log_name(expected)));
        }
    }

    let mut pools = BTreeMap::new();
    let mut clients = Clients::default();
    let mut snapshot_bytes = 0;
    if let Some(generation) = snapshot {
        let path = files::path(dir, &files::snapshot_name(generation));
        snapshot_bytes = load_snapshot(&path, generation, &mut pools, &mut clients)?;
        if logs.first() != Some(&generation) {
            return Err(missing(dir, &files::log_name(generation)));
        }
    }
    let mut replayed = 0u64;
    let last = logs.last().copied();
    for generation in &logs {
        let path = files::path(dir, &files::log_name(*generation));
        let end = files::read_frames(
            &path,
            files::LOG_MAGIC,
            *generation,
            Some(*generation) == last,
            |payload, offset| {
                replayed += apply_frame(&mut pools, &mut clients, payload, &path, offset)?;
                Ok(())
            },
        )?;
        if let files::End::Torn { offset, dropped } = end {
            tracing::warn!(
                file = %path.display(),
                offset,
                dropped_bytes = dropped,
                "the last log ends in a record cut short by a crash; dropped it (its \
                 operations were never fsynced, so none had been promised to be kept)"
            );
            let file = OpenOptions::new()
                .write(true)
                .open(&path)
                .map_err(io(&path))?;
            file.set_len(offset).map_err(io(&path))?;
            file.sync_all().map_err(io(&path))?;
        }
    }
    let log = match last {
        Some(generation) => {
            let path = files::path(dir, &files::log_name(generation));
            let file = OpenOptions::new()
                .append(true)
                .open(&path)
                .map_err(io(&path))?;
            let len = file.metadata().map_err(io(&path))?.len();
            LogFile {
                file,
                generation,
                len,
                dir: dir.to_owned(),
            }
        }
        None => LogFile::create(dir.to_owned(), 1).map_err(io(dir))?,
    };
    let members: u64 = pools
        .values()
        .map(|p: &Pool| p.eligible.len() + p.ineligible.len())
        .sum();
    let leases: usize = pools.values().map(|p| p.leases.len()).sum();
    tracing::info!(
        data_dir = %dir.display(),
        pools = pools.len(),
        members,
        leases,
        snapshot = snapshot.map(files::snapshot_name),
        logs = logs.len(),
        records_replayed = replayed,
        took_ms = started.elapsed().as_millis() as u64,
        "embedded store: recovered the data directory"
    );
    Ok(Recovered {
        pools,
        clients,
        disk: ForDisk {
            lock,
            log,
            snapshot_bytes,
        },
    })
}

fn missing(dir: &Path, name: &str) -> OpenError {
    OpenError::Corrupt {
        path: files::path(dir, name),
        offset: 0,
        reason: "this file is missing: the files of the data directory do not follow each \
                 other"
            .to_owned(),
    }
}

fn load_snapshot(
    path: &Path,
    generation: u64,
    pools: &mut BTreeMap<PoolId, Pool>,
    clients: &mut Clients,
) -> Result<u64, OpenError> {
    let mut records = 0u64;
    let mut ended = false;
    let mut last_offset = 0;
    files::read_frames(
        path,
        files::SNAPSHOT_MAGIC,
        generation,
        false,
        |payload, offset| {
            let mut reader = Reader::new(payload);
            last_offset = offset;
            loop {
                let at = offset + files::FRAME_HEADER as u64;
                let record = reader.next_record().map_err(|error| OpenError::Corrupt {
                    path: path.to_owned(),
                    offset: at + error.at as u64,
                    reason: error.to_string(),
                })?;
                match record {
                    None => return Ok(()),
                    Some(_) if ended => {
                        return Err(corrupt(path, offset, "records after the snapshot's end"));
                    }
                    Some(Record::SnapshotEnd {
                        generation: g,
                        records: r,
                    }) => {
                        if g != generation || r != records {
                            return Err(corrupt(
                                path,
                                offset,
                                "the snapshot's end does not match it",
                            ));
                        }
                        ended = true;
                    }
                    Some(Record::Member(id, member, image)) => {
                        records += 1;
                        if let Some(pool) = pools.get_mut(id) {
                            pool.load_member(member, image);
                        }
                    }
                    Some(record) => {
                        records += 1;
                        apply(pools, clients, record);
                    }
                }
            }
        },
    )?;
    if !ended {
        return Err(corrupt(path, last_offset, "the snapshot has no end"));
    }
    Ok(std::fs::metadata(path).map_err(io(path))?.len())
}

fn corrupt(path: &Path, offset: u64, reason: &str) -> OpenError {
    OpenError::Corrupt {
        path: path.to_owned(),
        offset,
        reason: reason.to_owned(),
    }
}

/// Applies every record of one log frame; how many there were.
fn apply_frame(
    pools: &mut BTreeMap<PoolId, Pool>,
    clients: &mut Clients,
    payload: &[u8],
    path: &Path,
    offset: u64,
) -> Result<u64, OpenError> {
    let mut reader = Reader::new(payload);
    let mut count = 0;
    loop {
        let record = reader.next_record().map_err(|error| OpenError::Corrupt {
            path: path.to_owned(),
            offset: offset + files::FRAME_HEADER as u64 + error.at as u64,
            reason: error.to_string(),
        })?;
        match record {
            None => return Ok(count),
            Some(Record::SnapshotEnd { .. }) => {
                return Err(corrupt(path, offset, "a snapshot's end inside a log"));
            }
            Some(record) => apply(pools, clients, record),
        }
        count += 1;
    }
}

/// Sets what `record` names to the value it holds. Records of pools that do not exist are
/// skipped: under a fuzzy snapshot they describe a pool deleted later (see `snapshot.rs`).
pub(super) fn apply(pools: &mut BTreeMap<PoolId, Pool>, clients: &mut Clients, record: Record<'_>) {
    match record {
        Record::Client(client) => clients.set(*client),
        Record::ClientDeleted(id) => {
            clients.remove(id);
        }
        Record::Pool(id, image) => set_pool(pools, id, *image),
        Record::PoolDeleted(id) => {
            pools.remove(id);
        }
        Record::Member(id, member, image) => {
            if let Some(pool) = pools.get_mut(id) {
                pool.replace_member(member, image);
            }
        }
        Record::MemberRemoved(id, member) => {
            if let Some(pool) = pools.get_mut(id) {
                pool.forget_member(member);
            }
        }
        Record::Lease {
            pool,
            id,
            member,
            expires_at,
        } => {
            if let Some(pool) = pools.get_mut(pool) {
                pool.end_lease(&id);
                pool.unplace(&member);
                *pool.in_flight.entry(member.clone()).or_insert(0) += 1;
                pool.leases.insert(id.clone(), (member.clone(), expires_at));
                pool.expiry.insert((expires_at, id));
                pool.place(&member);
                pool.changes.clear();
            }
        }
        Record::LeaseEnded(pool, id) => {
            if let Some(pool) = pools.get_mut(pool)
                && let Some(id) = pool.leases.get_key_value(id).map(|(id, _)| id.clone())
            {
                pool.end_lease(&id);
                pool.changes.clear();
            }
        }
        Record::Assigned {
            pool,
            member,
            assignments,
            total_assignments,
        } => {
            if let Some(pool) = pools.get_mut(pool) {
                pool.total_assignments = total_assignments;
                pool.set_count(member, assignments);
            }
        }
        Record::SnapshotEnd { .. } => {}
    }
}

fn set_pool(pools: &mut BTreeMap<PoolId, Pool>, id: PoolId, image: PoolImage<'static>) {
    let pool = pools
        .entry(id)
        .or_insert_with(|| Pool::new(image.config.clone().into_owned(), image.created_at));
    let reorder = pool.config.policy != image.config.policy;
    pool.config = image.config.into_owned();
    pool.created_at = image.created_at;
    pool.total_assignments = image.total_assignments;
    pool.abandoned = image.abandoned;
    pool.tripped = image.tripped;
    pool.recovered = image.recovered;
    pool.check_round_until = image.check_round_until;
    pool.pruned = image.pruned;
    pool.book = image.sources.into_owned();
    if reorder {
        // The choosing order exists on least-in-flight pools only.
        pool.order.clear();
        if pool.config.policy == Policy::LeastInFlight {
            let members: Vec<_> = pool.eligible.counts.keys().cloned().collect();
            for member in &members {
                pool.place(member);
            }
        }
    }
}

impl Pool {
    /// Removes everything the pool keeps about `member` except its leases.
    fn forget_member(&mut self, member: &str) {
        // Only members of one of the two sets have anything else recorded about them.
        let Some(member) = self
            .eligible
            .counts
            .get_key_value(member)
            .or_else(|| self.ineligible.counts.get_key_value(member))
            .map(|(id, _)| id.clone())
        else {
            return;
        };
        self.drop_labels(&member);
        self.unplace(&member);
        self.eligible.remove(&member);
        self.ineligible.remove(&member);
        self.taken_out.remove(&member);
        self.health.remove(&member);
        self.quality.remove(&member);
        if let Some(at) = self.return_at.remove(&member) {
            self.returns.remove(&(at, member.clone()));
        }
        self.checks.remove(&member);
        self.drop_exit(&member);
        self.set_provenance(&member, Provenance::default());
    }

    /// Puts `member` in the pool exactly as `image` says.
    fn replace_member(&mut self, member: MemberId, image: MemberImage<'static>) {
        self.forget_member(member.as_str());
        let MemberImage {
            eligible,
            assignments,
            taken_out,
            health,
            quality,
            returns_at,
            last_check,
            labels,
            provenance,
            exit,
        } = image;
        self.set_provenance(&member, provenance);
        if let Some((ip, at)) = exit {
            self.set_exit(&member, ip, at);
        }
        if let Some((reason, since)) = taken_out {
            self.taken_out
                .insert(member.clone(), (reason.into_owned(), since));
        }
        if health != Health::default() {
            self.health.insert(member.clone(), health);
        }
        if quality != Quality::default() {
            self.quality.insert(member.clone(), quality);
        }
        if let Some(at) = returns_at {
            self.return_at.insert(member.clone(), at);
            self.returns.insert((at, member.clone()));
        }
        if let Some(check) = last_check {
            self.checks.insert(member.clone(), check.into_owned());
        }
        let ranked = if eligible {
            &mut self.eligible
        } else {
            &mut self.ineligible
        };
        if self.config.policy == Policy::LeastInFlight {
            ranked.insert_absent(member.clone(), assignments);
            self.place(&member);
        } else {
            ranked.insert_absent(member.clone(), assignments);
        }
        if !labels.is_empty() {
            self.set_labels(&member, labels.into_owned());
        }
    }

    /// Puts a member read from a snapshot in the pool: as [`Pool::replace_member`], with
    /// fewer lookups. A snapshot copies a pool's eligible members before its ineligible
    /// ones, and holds a member twice only when it moved while being copied (the later copy
    /// wins), so an eligible member can only have been seen before in the eligible set.
    /// (A member that changed sets while being copied also has its whole image in the log
    /// that follows; dropping its earlier copy here keeps the snapshot alone consistent.)
    fn load_member(&mut self, member: MemberId, image: MemberImage<'static>) {
        if self.config.policy == Policy::LeastInFlight {
            return self.replace_member(member, image);
        }
        // A member seen before was indexed under its earlier copy's numbers.
        if self.labels.of.contains_key(&member) {
            self.drop_labels(&member);
        }
        let (target, other) = if image.eligible {
            (&mut self.eligible, &mut self.ineligible)
        } else {
            (&mut self.ineligible, &mut self.eligible)
        };
        let seen = match target.counts.insert(member.clone(), image.assignments) {
            Some(old) => {
                target.order.remove(&(old, member.clone()));
                true
            }
            None => !image.eligible && other.remove(&member).is_some(),
        };

        target.order.insert((image.assignments, member.clone()));
        if seen {
            self.taken_out.remove(&member);
            self.health.remove(&member);
            self.quality.remove(&member);
            if let Some(at) = self.return_at.remove(&member) {
                self.returns.remove(&(at, member.clone()));
            }
            self.checks.remove(&member);
            self.drop_exit(&member);
        }
        let MemberImage {
            taken_out,
            health,
            quality,
            returns_at,
            last_check,
            labels,
            provenance,
            exit,
            ..
        } = image;
        self.set_provenance(&member, provenance);
        if let Some((ip, at)) = exit {
            self.set_exit(&member, ip, at);
        }
        if let Some((reason, since)) = taken_out {
            self.taken_out
                .insert(member.clone(), (reason.into_owned(), since));
        }
        if health != Health::default() {
            self.health.insert(member.clone(), health);
        }
        if quality != Quality::default() {
            self.quality.insert(member.clone(), quality);
        }
        if let Some(at) = returns_at {
            self.return_at.insert(member.clone(), at);
            self.returns.insert((at, member.clone()));
        }
        if let Some(check) = last_check {
            self.checks.insert(member.clone(), check.into_owned());
        }
        if !labels.is_empty() {
            self.set_labels(&member, labels.into_owned());
        }
    }

    /// Sets the count of `member`, in whichever set it is; a member the pool does not
    /// have is left alone.
    fn set_count(&mut self, member: &str, assignments: u64) {
        let (member, eligible) = if let Some((id, _)) = self.eligible.counts.get_key_value(member) {
            (id.clone(), true)
        } else if let Some((id, _)) = self.ineligible.counts.get_key_value(member) {
            (id.clone(), false)
        } else {
            return;
        };
        self.unplace(&member);
        let ranked = if eligible {
            &mut self.eligible
        } else {
            &mut self.ineligible
        };
        if self.config.policy == Policy::LeastInFlight {
            ranked.set(member.clone(), assignments);
            self.place(&member);
        } else {
            ranked.set(member, assignments);
        }
    }
}
