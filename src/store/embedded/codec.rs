//! The embedded store's records: each effect of an operation, and each entry of a snapshot,
//! as bytes, and back.
//!
//! A record is the *after-image* of one thing an operation changed — a pool's settings and
//! numbers, one member with everything the pool keeps about it, one lease — or its removal.
//! Recovery sets each thing to its last image and needs no clock, no randomness and no
//! rule of the store: the lease ids, jitter draws and times an operation used are in its
//! images. A snapshot is made of the same records, so loading a snapshot and replaying a
//! log are one loop. One record is not a whole image: [`Record::Assigned`], the assign's
//! count update, kept small because it is written on every assign.
//!
//! A new kind of per-pool state is a new record kind (or a new field of an image) here,
//! written where an operation changes it and emitted by the snapshot.
//!
//! Encoding: a kind byte, then fields in order; integers as LEB128 varints, text as a
//! varint length and its bytes, options as a `0`/`1` byte and the value. A pool's
//! configuration is its JSON, as the API shows it.

use std::borrow::Cow;

use crate::domain::{
    ClientConfig, ClientId, Labels, LeaseId, MemberId, OutcomeResult, PoolConfig, PoolId,
    Timestamp, TokenHash,
};
use crate::store::{ClientRecord, Health, LastCheck, Quality};

const POOL: u8 = 1;
const POOL_DELETED: u8 = 2;
const MEMBER: u8 = 3;
const MEMBER_REMOVED: u8 = 4;
const LEASE: u8 = 5;
const LEASE_ENDED: u8 = 6;
const ASSIGNED: u8 = 7;
const SNAPSHOT_END: u8 = 8;
/// A member record followed by the member's labels: members without labels keep the
/// shorter [`MEMBER`] record, so files written before labels existed read unchanged.
const LABELLED_MEMBER: u8 = 9;
/// A member record with its labels (possibly none) and its [`Provenance`]: members with
/// the default provenance keep the shorter kinds, so files written before provenance was
/// kept read unchanged.
const TRACED_MEMBER: u8 = 10;
/// A [`TRACED_MEMBER`] record followed by the member's exit address (as text) and when a
/// check saw it: members without one keep the shorter kinds, so files written before exit
/// addresses were kept read unchanged.
const EXITED_MEMBER: u8 = 12;
/// A pool record followed by its prune count and its [`SourceBook`]: pools with neither
/// keep the shorter [`POOL`] record.
const SOURCED_POOL: u8 = 11;
/// A member record of any shorter kind's fields (labels, provenance), an optional exit
/// address (`0`, or `1`, the address as text and when a check saw it), then its
/// [`Quality`] (outcomes, success in millionths, latencies, latency in microseconds):
/// members without outcomes counted keep the shorter kinds, so files written before
/// success rates were kept read unchanged.
const RATED_MEMBER: u8 = 15;
/// A client with its configuration (JSON, as the API shows it) and its token's SHA-256.
const CLIENT: u8 = 13;
/// A client deleted.
const CLIENT_DELETED: u8 = 14;

/// Where a member came from and what pruning keeps about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) struct Provenance {
    /// `None`: added by hand; `Some(0)`: imported; `Some(id)`: added by the source `id`.
    pub origin: Option<u64>,
    /// For members of a source: the number of its last fetch that listed them. `None`
    /// once they are due for removal as absent.
    pub seen: Option<u64>,
    /// Active checks failed in a row.
    pub check_fails: u64,
    /// Since when it is due for removal (see `prune.lua`, which the embedded store follows).
    pub prune_due: Option<Timestamp>,
}

/// What a pool keeps about its sources beyond a restart: the ids it gave (with the URLs of
/// the last 256, for the origins of members) and the successful fetches of the current
/// ones, by id.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(super) struct SourceBook {
    /// The last id given (ids start at 1).
    pub last_id: u64,
    /// The last 256 ids given, with their URLs.
    pub urls: std::collections::BTreeMap<u64, String>,
    /// The current sources' successful fetches, by id.
    pub successes: std::collections::BTreeMap<u64, u64>,
}

impl SourceBook {
    /// The id of the source with this URL among the current ones.
    pub fn current_id(&self, url: &str) -> Option<u64> {
        self.successes
            .keys()
            .copied()
            .find(|id| self.urls.get(id).is_some_and(|known| known == url))
    }
}

/// A pool's own state: everything but its members and leases.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct PoolImage<'a> {
    pub config: Cow<'a, PoolConfig>,
    pub created_at: Timestamp,
    pub total_assignments: u64,
    pub abandoned: u64,
    pub tripped: u64,
    pub recovered: u64,
    pub check_round_until: Option<Timestamp>,
    /// Members removed by the pool's prune rules.
    pub pruned: u64,
    pub sources: Cow<'a, SourceBook>,
}

/// Everything a pool keeps about one member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct MemberImage<'a> {
    pub eligible: bool,
    pub assignments: u64,
    /// Why and since when it was taken out (ineligible members).
    pub taken_out: Option<(Cow<'a, str>, Timestamp)>,
    pub health: Health,
    /// Its decaying success rate and latency.
    pub quality: Quality,
    /// When it comes back by itself (members cooling down).
    pub returns_at: Option<Timestamp>,
    pub last_check: Option<Cow<'a, LastCheck>>,
    /// Its labels.
    pub labels: Cow<'a, Labels>,
    pub provenance: Provenance,
    /// Its exit address and when a check saw it.
    pub exit: Option<(std::net::IpAddr, Timestamp)>,
}

/// One decoded record. Ids that only name something to look up stay text borrowed from
/// the frame, so that replaying a count update allocates nothing for them.
#[derive(Debug, Clone, PartialEq, Eq)]
#[expect(
    clippy::large_enum_variant,
    reason = "member records are the most common kind after count updates: boxing them would \
              allocate once more per member replayed, where a record lives only while it is applied"
)]
pub(super) enum Record<'a> {
    /// A pool with these settings and numbers exists (created or changed). Boxed: a
    /// configuration is far larger than every other record, and pool records are rare.
    Pool(PoolId, Box<PoolImage<'static>>),
    /// The pool and everything it held are gone.
    PoolDeleted(&'a str),
    /// The member is in the pool, exactly like this.
    Member(&'a str, MemberId, MemberImage<'static>),
    /// The member is not in the pool (its leases are records of their own).
    MemberRemoved(&'a str, &'a str),
    /// The lease is live on `member` until `expires_at`.
    Lease {
        pool: &'a str,
        id: LeaseId,
        member: MemberId,
        expires_at: Timestamp,
    },
    /// The lease has ended.
    LeaseEnded(&'a str, &'a str),
    /// An assign: the member's count and the pool's total after it.
    Assigned {
        pool: &'a str,
        member: &'a str,
        assignments: u64,
        total_assignments: u64,
    },
    /// The last record of a complete snapshot, with how many records came before it.
    SnapshotEnd { generation: u64, records: u64 },
    /// A client exists, exactly like this (created, reconfigured or given a new token).
    /// Boxed, as pools are: client records are rare and as large as a member's.
    Client(Box<ClientRecord>),
    /// The client is gone.
    ClientDeleted(&'a str),
}

/// Why bytes that passed their checksum are not records: a bug or a file written by
/// another version, never a torn write.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("undecodable record at byte {at} of its frame: {what}")]
pub(super) struct DecodeError {
    pub at: usize,
    pub what: &'static str,
}

fn varint(buf: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        // Seven bits a byte, low bits first; truncation to the low byte is the point.
        buf.push((value as u8 & 0x7f) | 0x80);
        value >>= 7;
    }
    buf.push(value as u8);
}

fn text(buf: &mut Vec<u8>, text: &str) {
    varint(buf, text.len() as u64);
    buf.extend_from_slice(text.as_bytes());
}

fn optional_time(buf: &mut Vec<u8>, at: Option<Timestamp>) {
    match at {
        Some(at) => {
            buf.push(1);
            varint(buf, at.0);
        }
        None => buf.push(0),
    }
}

/// Appends a pool's own state.
pub(super) fn pool(buf: &mut Vec<u8>, id: &PoolId, image: &PoolImage<'_>) {
    let sourced = image.pruned > 0 || *image.sources != SourceBook::default();
    buf.push(if sourced { SOURCED_POOL } else { POOL });
    text(buf, id.as_str());
    // Serialising a configuration cannot fail: it is plain data with string keys.
    let config = serde_json::to_vec(&*image.config).unwrap_or_default();
    varint(buf, config.len() as u64);
    buf.extend_from_slice(&config);
    varint(buf, image.created_at.0);
    varint(buf, image.total_assignments);
    varint(buf, image.abandoned);
    varint(buf, image.tripped);
    varint(buf, image.recovered);
    optional_time(buf, image.check_round_until);
    if sourced {
        varint(buf, image.pruned);
        varint(buf, image.sources.last_id);
        varint(buf, image.sources.urls.len() as u64);
        for (id, url) in &image.sources.urls {
            varint(buf, *id);
            text(buf, url);
        }
        varint(buf, image.sources.successes.len() as u64);
        for (id, successes) in &image.sources.successes {
            varint(buf, *id);
            varint(buf, *successes);
        }
    }
}

/// Appends a pool's deletion.
pub(super) fn pool_deleted(buf: &mut Vec<u8>, id: &PoolId) {
    buf.push(POOL_DELETED);
    text(buf, id.as_str());
}

/// Appends a client's whole state.
pub(super) fn client(buf: &mut Vec<u8>, client: &ClientRecord) {
    buf.push(CLIENT);
    text(buf, client.id.as_str());
    text(buf, &client.config.to_json());
    buf.extend_from_slice(client.token.bytes());
}

pub(super) fn client_deleted(buf: &mut Vec<u8>, id: &ClientId) {
    buf.push(CLIENT_DELETED);
    text(buf, id.as_str());
}

/// Appends a member's whole state.
pub(super) fn member(buf: &mut Vec<u8>, pool: &PoolId, member: &MemberId, image: &MemberImage<'_>) {
    let rated = image.quality != Quality::default();
    let exited = image.exit.is_some();
    let traced = rated || exited || image.provenance != Provenance::default();
    buf.push(if rated {
        RATED_MEMBER
    } else if exited {
        EXITED_MEMBER
    } else if traced {
        TRACED_MEMBER
    } else if image.labels.is_empty() {
        MEMBER
    } else {
        LABELLED_MEMBER
    });
    text(buf, pool.as_str());
    text(buf, member.as_str());
    buf.push(u8::from(image.eligible));
    varint(buf, image.assignments);
    match &image.taken_out {
        Some((reason, since)) => {
            buf.push(1);
            text(buf, reason);
            varint(buf, since.0);
        }
        None => buf.push(0),
    }
    varint(buf, image.health.streak);
    varint(buf, image.health.trips);
    varint(buf, image.health.cooldown_ms);
    optional_time(buf, image.returns_at);
    // 1: a last check without a latency (what files written before latencies were kept
    // hold), 2: one with, the latency last.
    match &image.last_check {
        Some(check) => {
            buf.push(if check.latency_ms.is_some() { 2 } else { 1 });
            varint(buf, check.at.0);
            text(buf, check.result.as_str());
            text(buf, &check.detail);
            if let Some(ms) = check.latency_ms {
                varint(buf, ms);
            }
        }
        None => buf.push(0),
    }
    if traced || !image.labels.is_empty() {
        let pairs: Vec<(&str, &str)> = image.labels.iter().collect();
        varint(buf, pairs.len() as u64);
        for (key, value) in pairs {
            text(buf, key);
            text(buf, value);
        }
    }
    if traced {
        let p = &image.provenance;
        // The origin as one number: 0 by hand, 1 imported, id + 1 from source `id`.
        varint(buf, p.origin.map_or(0, |id| id + 1));
        varint(buf, p.seen.map_or(0, |n| n + 1));
        varint(buf, p.check_fails);
        optional_time(buf, p.prune_due);
    }
    if rated {
        buf.push(u8::from(image.exit.is_some()));
    }
    if let Some((ip, at)) = image.exit {
        text(buf, &ip.to_string());
        varint(buf, at.0);
    }
    if rated {
        let q = &image.quality;
        varint(buf, q.outcomes);
        varint(buf, q.success_ppm);
        varint(buf, q.latencies);
        varint(buf, q.latency_us);
    }
}

/// Appends a member's removal.
pub(super) fn member_removed(buf: &mut Vec<u8>, pool: &PoolId, member: &MemberId) {
    buf.push(MEMBER_REMOVED);
    text(buf, pool.as_str());
    text(buf, member.as_str());
}

/// Appends a live lease.
pub(super) fn lease(
    buf: &mut Vec<u8>,
    pool: &PoolId,
    id: &LeaseId,
    member: &MemberId,
    expires_at: Timestamp,
) {
    buf.push(LEASE);
    text(buf, pool.as_str());
    text(buf, id.as_str());
    text(buf, member.as_str());
    varint(buf, expires_at.0);
}

/// Appends a lease's end.
pub(super) fn lease_ended(buf: &mut Vec<u8>, pool: &PoolId, id: &LeaseId) {
    buf.push(LEASE_ENDED);
    text(buf, pool.as_str());
    text(buf, id.as_str());
}

/// Appends an assign's count update: the one record on the hot path, so it carries only
/// what an assign changes.
pub(super) fn assigned(
    buf: &mut Vec<u8>,
    pool: &PoolId,
    member: &MemberId,
    assignments: u64,
    total_assignments: u64,
) {
    buf.push(ASSIGNED);
    text(buf, pool.as_str());
    text(buf, member.as_str());
    varint(buf, assignments);
    varint(buf, total_assignments);
}

/// Appends the end of a snapshot.
pub(super) fn snapshot_end(buf: &mut Vec<u8>, generation: u64, records: u64) {
    buf.push(SNAPSHOT_END);
    varint(buf, generation);
    varint(buf, records);
}

/// Reads the records of one frame in order.
pub(super) struct Reader<'a> {
    data: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    pub(super) fn new(data: &'a [u8]) -> Self {
        Self { data, at: 0 }
    }

    fn fail<T>(&self, what: &'static str) -> Result<T, DecodeError> {
        Err(DecodeError { at: self.at, what })
    }

    fn byte(&mut self) -> Result<u8, DecodeError> {
        let Some(&byte) = self.data.get(self.at) else {
            return self.fail("record cut short");
        };
        self.at += 1;
        Ok(byte)
    }

    fn varint(&mut self) -> Result<u64, DecodeError> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = self.byte()?;
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        self.fail("integer longer than 64 bits")
    }

    fn bytes(&mut self) -> Result<&'a [u8], DecodeError> {
        let len = usize::try_from(self.varint()?).unwrap_or(usize::MAX);
        let Some(bytes) = self
            .at
            .checked_add(len)
            .and_then(|end| self.data.get(self.at..end))
        else {
            return self.fail("text longer than its record");
        };
        self.at += len;
        Ok(bytes)
    }

    fn text(&mut self) -> Result<&'a str, DecodeError> {
        let bytes = self.bytes()?;
        std::str::from_utf8(bytes).or_else(|_| self.fail("text is not UTF-8"))
    }

    fn flag(&mut self) -> Result<bool, DecodeError> {
        match self.byte()? {
            0 => Ok(false),
            1 => Ok(true),
            _ => self.fail("flag is neither 0 nor 1"),
        }
    }

    fn time(&mut self) -> Result<Timestamp, DecodeError> {
        self.varint().map(Timestamp)
    }

    fn optional_time(&mut self) -> Result<Option<Timestamp>, DecodeError> {
        if self.flag()? {
            Ok(Some(self.time()?))
        } else {
            Ok(None)
        }
    }

    fn pool_id(&mut self) -> Result<PoolId, DecodeError> {
        let text = self.text()?;
        PoolId::parse(text).or_else(|_| self.fail("invalid pool id"))
    }

    fn member_id(&mut self) -> Result<MemberId, DecodeError> {
        let text = self.text()?;
        MemberId::parse(text).or_else(|_| self.fail("invalid member id"))
    }

    fn lease_id(&mut self) -> Result<LeaseId, DecodeError> {
        let text = self.text()?;
        LeaseId::parse(text).or_else(|_| self.fail("invalid lease id"))
    }

    /// The next record, or `None` at the end of the frame.
    pub(super) fn next_record(&mut self) -> Result<Option<Record<'a>>, DecodeError> {
        if self.at == self.data.len() {
            return Ok(None);
        }
        let record = match self.byte()? {
            kind @ (POOL | SOURCED_POOL) => {
                let id = self.pool_id()?;
                let json = self.bytes()?;
                let config: PoolConfig = serde_json::from_slice(json)
                    .or_else(|_| self.fail("invalid pool configuration"))?;
                let mut record = Record::Pool(
                    id,
                    Box::new(PoolImage {
                        config: Cow::Owned(config),
                        created_at: self.time()?,
                        total_assignments: self.varint()?,
                        abandoned: self.varint()?,
                        tripped: self.varint()?,
                        recovered: self.varint()?,
                        check_round_until: self.optional_time()?,
                        pruned: 0,
                        sources: Cow::Owned(SourceBook::default()),
                    }),
                );
                if kind == SOURCED_POOL
                    && let Record::Pool(_, image) = &mut record
                {
                    image.pruned = self.varint()?;
                    let mut book = SourceBook {
                        last_id: self.varint()?,
                        ..SourceBook::default()
                    };
                    for _ in 0..self.varint()? {
                        let id = self.varint()?;
                        book.urls.insert(id, self.text()?.to_owned());
                    }
                    for _ in 0..self.varint()? {
                        let id = self.varint()?;
                        book.successes.insert(id, self.varint()?);
                    }
                    image.sources = Cow::Owned(book);
                }
                record
            }
            POOL_DELETED => Record::PoolDeleted(self.text()?),
            kind @ (MEMBER | LABELLED_MEMBER | TRACED_MEMBER | EXITED_MEMBER | RATED_MEMBER) => {
                let pool = self.text()?;
                let member = self.member_id()?;
                let eligible = self.flag()?;
                let assignments = self.varint()?;
                let taken_out = if self.flag()? {
                    let reason = self.text()?.to_owned();
                    Some((Cow::Owned(reason), self.time()?))
                } else {
                    None
                };
                let health = Health {
                    streak: self.varint()?,
                    trips: self.varint()?,
                    cooldown_ms: self.varint()?,
                };
                let returns_at = self.optional_time()?;
                let last_check = match self.byte()? {
                    0 => None,
                    kind @ (1 | 2) => {
                        let at = self.time()?;
                        let result = OutcomeResult::from_name(self.text()?)
                            .map_or_else(|| self.fail("unknown check result"), Ok)?;
                        let detail = self.text()?.to_owned();
                        let latency_ms = if kind == 2 {
                            Some(self.varint()?)
                        } else {
                            None
                        };
                        Some(Cow::Owned(LastCheck {
                            at,
                            result,
                            detail,
                            latency_ms,
                        }))
                    }
                    _ => return self.fail("unknown last check kind"),
                };
                let labels = if kind != MEMBER {
                    let count = self.varint()?;
                    if count > crate::domain::MAX_STORED_LABELS as u64 {
                        return self.fail("more labels than a member carries");
                    }
                    let mut pairs = Vec::new();
                    for _ in 0..count {
                        pairs.push(format!("{}={}", self.text()?, self.text()?));
                    }
                    Labels::from_script_text(&pairs.join("\n"))
                } else {
                    Labels::default()
                };
                let provenance = if matches!(kind, TRACED_MEMBER | EXITED_MEMBER | RATED_MEMBER) {
                    let origin = self.varint()?.checked_sub(1);
                    let seen = self.varint()?.checked_sub(1);
                    Provenance {
                        origin,
                        seen,
                        check_fails: self.varint()?,
                        prune_due: self.optional_time()?,
                    }
                } else {
                    Provenance::default()
                };
                let exited = kind == EXITED_MEMBER || (kind == RATED_MEMBER && self.flag()?);
                let exit = if exited {
                    let ip = self.text()?;
                    let ip = ip.parse().or_else(|_| self.fail("invalid exit address"))?;
                    Some((ip, self.time()?))
                } else {
                    None
                };
                let quality = if kind == RATED_MEMBER {
                    let q = Quality {
                        outcomes: self.varint()?,
                        success_ppm: self.varint()?,
                        latencies: self.varint()?,
                        latency_us: self.varint()?,
                    };
                    if q.success_ppm > crate::rules::quality::SUCCESS_ONE {
                        return self.fail("a success rate above 1");
                    }
                    q
                } else {
                    Quality::default()
                };
                Record::Member(
                    pool,
                    member,
                    MemberImage {
                        eligible,
                        assignments,
                        taken_out,
                        health,
                        quality,
                        returns_at,
                        last_check,
                        labels: Cow::Owned(labels),
                        provenance,
                        exit,
                    },
                )
            }
            MEMBER_REMOVED => Record::MemberRemoved(self.text()?, self.text()?),
            LEASE => Record::Lease {
                pool: self.text()?,
                id: self.lease_id()?,
                member: self.member_id()?,
                expires_at: self.time()?,
            },
            LEASE_ENDED => Record::LeaseEnded(self.text()?, self.text()?),
            ASSIGNED => Record::Assigned {
                pool: self.text()?,
                member: self.text()?,
                assignments: self.varint()?,
                total_assignments: self.varint()?,
            },
            SNAPSHOT_END => Record::SnapshotEnd {
                generation: self.varint()?,
                records: self.varint()?,
            },
            CLIENT => {
                let id =
                    ClientId::parse(self.text()?).or_else(|_| self.fail("invalid client id"))?;
                let config = ClientConfig::from_json(self.text()?)
                    .or_else(|_| self.fail("invalid client configuration"))?;
                let Some(token) = self.data.get(self.at..self.at + 32) else {
                    return self.fail("record cut short");
                };
                let mut hash = [0; 32];
                hash.copy_from_slice(token);
                self.at += 32;
                Record::Client(Box::new(ClientRecord {
                    id,
                    config,
                    token: TokenHash::from_bytes(hash),
                }))
            }
            CLIENT_DELETED => Record::ClientDeleted(self.text()?),
            _ => {
                self.at -= 1;
                return self.fail("unknown record kind");
            }
        };
        Ok(Some(record))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::HealthConfig;

    fn pool_id() -> PoolId {
        PoolId::parse("web").expect("a pool id")
    }

    fn member_id(text: &str) -> MemberId {
        MemberId::parse(text).expect("a member id")
    }

    fn decode_all(buf: &[u8]) -> Vec<Record<'_>> {
        let mut reader = Reader::new(buf);
        std::iter::from_fn(|| reader.next_record().expect("decodes")).collect()
    }

    #[test]
    fn every_record_kind_reads_back_as_written() {
        let config = PoolConfig {
            start_assignments: Some(7),
            health: HealthConfig {
                max_consecutive_failures: 5,
                ..HealthConfig::default()
            },
            ..PoolConfig::default()
        };
        let lease = LeaseId::parse("0123456789abcdef0123456789abcdef").expect("a lease id");
        let image = PoolImage {
            config: Cow::Owned(config),
            created_at: Timestamp(1_700_000_000_123),
            total_assignments: u64::MAX,
            abandoned: 2,
            tripped: 3,
            recovered: 4,
            check_round_until: Some(Timestamp(5)),
            pruned: 6,
            sources: Cow::Owned(SourceBook {
                last_id: 2,
                urls: [
                    (1, "http://a.example/p".to_owned()),
                    (2, "http://b.example/p".to_owned()),
                ]
                .into(),
                successes: [(2, 9)].into(),
            }),
        };
        let cooling = MemberImage {
            eligible: false,
            assignments: 300,
            taken_out: Some((Cow::Borrowed("unhealthy"), Timestamp(9))),
            health: Health {
                streak: 3,
                trips: 2,
                cooldown_ms: 120_000,
            },
            quality: Quality::default(),
            returns_at: Some(Timestamp(129)),
            last_check: Some(Cow::Owned(LastCheck {
                at: Timestamp(8),
                result: OutcomeResult::Blocked,
                detail: "status 403".to_owned(),
                latency_ms: Some(31),
            })),
            labels: Cow::Owned(Labels::from_script_text("country=de\ntier=a")),
            provenance: Provenance {
                origin: Some(2),
                seen: Some(0),
                check_fails: 4,
                prune_due: Some(Timestamp(10)),
            },
            exit: Some(("2001:db8::7".parse().expect("an address"), Timestamp(11))),
        };
        let rated = |exit| MemberImage {
            eligible: true,
            assignments: 5,
            taken_out: None,
            health: Health::default(),
            quality: Quality {
                outcomes: 1 << 40,
                success_ppm: 999_999,
                latencies: 3,
                latency_us: 600_000_000,
            },
            returns_at: None,
            last_check: None,
            labels: Cow::Owned(Labels::default()),
            provenance: Provenance::default(),
            exit,
        };
        let mut buf = Vec::new();
        self::pool(&mut buf, &pool_id(), &image);
        member(&mut buf, &pool_id(), &member_id("http://u:p@h:1"), &cooling);
        member(&mut buf, &pool_id(), &member_id("rated"), &rated(None));
        member(
            &mut buf,
            &pool_id(),
            &member_id("rated"),
            &rated(cooling.exit),
        );
        member_removed(&mut buf, &pool_id(), &member_id("gone"));
        self::lease(&mut buf, &pool_id(), &lease, &member_id("a"), Timestamp(77));
        lease_ended(&mut buf, &pool_id(), &lease);
        assigned(&mut buf, &pool_id(), &member_id("a"), 128, 1 << 40);
        pool_deleted(&mut buf, &pool_id());
        snapshot_end(&mut buf, 3, 6);
        let client_record = ClientRecord {
            id: ClientId::parse("team-a").expect("a client id"),
            config: ClientConfig::from_json(r#"{"pools":["web","eu-*"]}"#).expect("valid"),
            token: TokenHash::of(b"a token"),
        };
        client(&mut buf, &client_record);
        client_deleted(&mut buf, &client_record.id);

        assert_eq!(
            decode_all(&buf),
            [
                Record::Pool(pool_id(), Box::new(image)),
                Record::Member(
                    "web",
                    member_id("http://u:p@h:1"),
                    MemberImage {
                        taken_out: Some((Cow::Owned("unhealthy".to_owned()), Timestamp(9))),
                        ..cooling
                    }
                ),
                Record::Member("web", member_id("rated"), rated(None)),
                Record::Member("web", member_id("rated"), rated(cooling.exit)),
                Record::MemberRemoved("web", "gone"),
                Record::Lease {
                    pool: "web",
                    id: lease.clone(),
                    member: member_id("a"),
                    expires_at: Timestamp(77)
                },
                Record::LeaseEnded("web", lease.as_str()),
                Record::Assigned {
                    pool: "web",
                    member: "a",
                    assignments: 128,
                    total_assignments: 1 << 40
                },
                Record::PoolDeleted("web"),
                Record::SnapshotEnd {
                    generation: 3,
                    records: 6
                },
                Record::Client(Box::new(client_record.clone())),
                Record::ClientDeleted("team-a"),
            ]
        );
    }

    #[test]
    fn an_assign_record_is_small() {
        let mut buf = Vec::new();
        assigned(
            &mut buf,
            &pool_id(),
            &member_id("http://p1.example.net:3128"),
            1000,
            100_000,
        );
        // Kind, two lengths, the ids, two varints: what the disk pays per assign.
        assert_eq!(buf.len(), 1 + 1 + 3 + 1 + 26 + 2 + 3);
    }

    #[test]
    fn cut_or_unknown_records_are_errors_not_panics() {
        let mut buf = Vec::new();
        assigned(&mut buf, &pool_id(), &member_id("a"), 1, 1);
        for end in 1..buf.len() {
            assert!(
                Reader::new(&buf[..end]).next_record().is_err(),
                "cut at {end}"
            );
        }
        assert_eq!(
            Reader::new(&[99]).next_record(),
            Err(DecodeError {
                at: 0,
                what: "unknown record kind"
            })
        );
    }
}
