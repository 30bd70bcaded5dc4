//! The scripts' replies, decoded in one place: one type per script, each with the one
//! decoder that knows its script's shape.
//!
//! A decoder reads the whole reply and refuses anything its script never returns (a value
//! missing, one too many, a number out of its range, a list whose length does not match
//! the members asked about), so a script that changes shape fails loudly, naming itself,
//! instead of being read a place off. Every pool script answers `{-1}` when the pool does
//! not exist, and puts `1` first otherwise (`assign.lua` has statuses of its own). The
//! replies read in one piece by an operator or a page (`members.lua`) name each of their
//! values, and the decoders check the names; the others are short and positional,
//! `assign.lua` because every assign carries it and `pool_info.lua` because a page of the
//! pool listing reads a thousand of its replies.
//! `tests.rs` runs every script on a real Redis and decodes each shape of its reply.

use std::borrow::Cow;
use std::time::Duration;

use redis::Value;

use crate::domain::{
    ClientConfig, ClientId, Labels, LeaseTtl, MemberId, OutcomeResult, PoolConfig, PoolId,
    RestorePolicy, Timestamp, TokenHash,
};
use crate::store::{
    CheckRound, ClaimedSource, ClientRecord, Cursor, Effect, FetchOutcome, Health, LastCheck,
    MemberState, MemberView, Origin, PoolInfo, PoolStats, Pruned, PutClient, Quality, SourceFetch,
    SourceState, StoreError, Swept,
};

/// A reply of a shape its script never returns: the script and this decoder disagree.
#[derive(Debug, thiserror::Error)]
#[error("unexpected reply to {answered_by}: {problem}")]
pub(super) struct UnexpectedReply {
    /// The script (or command) that answered.
    answered_by: &'static str,
    /// What did not fit.
    problem: Cow<'static, str>,
}

/// Why a reply could not be read.
#[derive(Debug)]
enum Problem {
    /// The pool script answered `{-1}`.
    NoPool,
    /// The reply does not have its script's shape.
    Shape(Cow<'static, str>),
}

impl From<&'static str> for Problem {
    fn from(problem: &'static str) -> Self {
        Self::Shape(Cow::Borrowed(problem))
    }
}

impl From<String> for Problem {
    fn from(problem: String) -> Self {
        Self::Shape(Cow::Owned(problem))
    }
}

type Read<T> = Result<T, Problem>;

/// Runs `read` on the reply of `answered_by`, turning what it finds wrong into the store's errors.
fn decode<T>(
    answered_by: &'static str,
    value: Value,
    read: impl FnOnce(Value) -> Read<T>,
) -> Result<T, StoreError> {
    read(value).map_err(|problem| match problem {
        Problem::NoPool => StoreError::PoolNotFound,
        Problem::Shape(problem) => StoreError::Unavailable(Box::new(UnexpectedReply {
            answered_by,
            problem,
        })),
    })
}

/// A reply array, read from the front.
struct Items(std::vec::IntoIter<Value>);

impl Items {
    fn new(value: Value) -> Read<Self> {
        array(value).map(|items| Self(items.into_iter()))
    }

    /// The items after a pool script's status, which must be `1` (`-1`: no such pool).
    fn of_pool(value: Value) -> Read<Self> {
        let mut items = Self::new(value)?;
        match items.int()? {
            1 => Ok(items),
            -1 => Err(Problem::NoPool),
            _ => Err("unknown status".into()),
        }
    }

    fn next(&mut self) -> Read<Value> {
        self.0.next().ok_or_else(|| "reply too short".into())
    }

    /// The next value, which the reply names `name`.
    fn field(&mut self, name: &'static str) -> Read<Value> {
        match string(self.next()?) {
            // What stands there instead is not repeated: it may be data.
            Ok(found) if found == name => self.next(),
            _ => Err(format!("expected the name `{name}`").into()),
        }
    }

    fn int(&mut self) -> Read<i64> {
        int(&self.next()?)
    }

    fn count(&mut self) -> Read<u64> {
        count(&self.next()?)
    }

    fn optional_count(&mut self) -> Read<Option<u64>> {
        optional_count(&self.next()?)
    }

    /// A time in ms on Redis's clock, `0` standing for none.
    fn due_time(&mut self) -> Read<Option<u64>> {
        self.count().map(|ms| (ms > 0).then_some(ms))
    }

    fn member(&mut self) -> Read<MemberId> {
        string(self.next()?).map(MemberId::from_stored)
    }

    /// The reply ends here.
    fn end(mut self) -> Read<()> {
        match self.0.next() {
            None => Ok(()),
            Some(_) => Err("reply too long".into()),
        }
    }
}

/// `assign.lua`: what the pool's policy chose, or why nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum AssignReply {
    /// The label filter would have checked more candidates than allowed; nothing changed.
    TooCostly,
    /// Nothing to assign; when nothing is eligible and some member is cooling down, the
    /// wait until the first returns (0 when one is already due).
    Empty {
        /// How long until the first cooling-down member returns.
        next_return: Option<Duration>,
    },
    /// A least-used pool's choices, in pick order: each member with its count including
    /// this assignment.
    Assigned(Vec<(MemberId, u64)>),
    /// A least-in-flight pool's choices, in pick order, the i-th leased under the i-th id
    /// the assign passed in.
    Leased {
        /// When the leases expire.
        expires_at: Timestamp,
        /// The ttl they were given.
        ttl_ms: LeaseTtl,
        /// The pool's new earliest due time when these leases moved it earlier (the hint
        /// for the due index, see `keys.rs`).
        due_hint: Option<u64>,
        /// Each member with its count including this assignment and its live leases
        /// including this one.
        members: Vec<(MemberId, u64, u64)>,
    },
}

impl AssignReply {
    /// Decodes `{-1}`, `{-2}`, `{0}`, `{0, ms}`, `{1, member, assignments, ...}` or
    /// `{2, expires_ms, ttl_ms, due hint, member, assignments, in_flight, ...}`.
    pub(super) fn decode(value: Value) -> Result<Self, StoreError> {
        decode("assign.lua", value, Self::read)
    }

    fn read(value: Value) -> Read<Self> {
        {
            let mut items = Items::new(value)?;
            let reply = match items.int()? {
                -1 => return Err(Problem::NoPool),
                -2 => Self::TooCostly,
                0 => Self::Empty {
                    // Negative when more members are due than one assign returns.
                    next_return: items
                        .0
                        .next()
                        .map(|ms| int(&ms))
                        .transpose()?
                        .map(|ms| Duration::from_millis(u64::try_from(ms).unwrap_or(0))),
                },
                1 => {
                    let mut members = Vec::new();
                    while !items.0.as_slice().is_empty() {
                        members.push((items.member()?, items.count()?));
                    }
                    if members.is_empty() {
                        return Err("reply too short".into());
                    }
                    Self::Assigned(members)
                }
                2 => {
                    let expires_at = Timestamp(items.count()?);
                    let ttl_ms = lease_ttl(items.count()?)?;
                    let due_hint = items.due_time()?;
                    let mut members = Vec::new();
                    while !items.0.as_slice().is_empty() {
                        members.push((items.member()?, items.count()?, items.count()?));
                    }
                    if members.is_empty() {
                        return Err("reply too short".into());
                    }
                    Self::Leased {
                        expires_at,
                        ttl_ms,
                        due_hint,
                        members,
                    }
                }
                _ => return Err("unknown status".into()),
            };
            items.end()?;
            Ok(reply)
        }
    }
}

/// The head of `assign.lua` and `assign_done.lua` (`rate.lua`): `{-4, ms}` when the
/// request's client has too few tokens left, nothing else having run; any other reply is
/// the script's own, passed on for its decoder.
pub(super) fn rate_limited(value: Value) -> Result<Value, StoreError> {
    match &value {
        Value::Array(items) if matches!(items.first(), Some(Value::Int(-4))) => {
            decode("rate.lua", value, |value| {
                let mut items = Items::new(value)?;
                items.int()?;
                let wait = items.count()?;
                items.end()?;
                Ok(StoreError::ClientRateLimited(Duration::from_millis(wait)))
            })
            .and_then(Err)
        }
        _ => Ok(value),
    }
}

/// `assign.lua` with a session: the session's state, then the answer as without one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum SessionAssignReply {
    /// The session is new and the pool holds the most sessions it keeps; nothing changed.
    TooManySessions,
    /// The assign ran.
    Answered {
        /// When the session ends, `None` when no session is live (a new one that found
        /// nothing to pin).
        ends_at: Option<Timestamp>,
        /// Whether a live session moved to another member.
        repinned: bool,
        /// The answer as without a session.
        reply: AssignReply,
    },
}

impl SessionAssignReply {
    /// Decodes `{-1}`, `{-3}`, `{-2}` or `{3, ends_ms or 0, 0|1, {the answer}}`.
    pub(super) fn decode(value: Value) -> Result<Self, StoreError> {
        decode("assign.lua", value, |value| {
            let mut items = Items::new(value)?;
            let reply = match items.int()? {
                -1 => return Err(Problem::NoPool),
                -2 => Self::Answered {
                    ends_at: None,
                    repinned: false,
                    reply: AssignReply::TooCostly,
                },
                -3 => Self::TooManySessions,
                3 => Self::Answered {
                    ends_at: items.due_time()?.map(Timestamp),
                    repinned: match items.int()? {
                        0 => false,
                        1 => true,
                        _ => return Err("re-pinned is 0 or 1".into()),
                    },
                    reply: AssignReply::read(items.next()?)?,
                },
                _ => return Err("unknown status".into()),
            };
            items.end()?;
            Ok(reply)
        })
    }
}

/// `end_session.lua`: whether a live session was ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct EndSessionReply {
    /// `false` when the pool had no such live session.
    pub(super) ended: bool,
}

impl EndSessionReply {
    /// Decodes `{-1}`, `{1, 1}` or `{1, 0}`.
    pub(super) fn decode(value: Value) -> Result<Self, StoreError> {
        decode("end_session.lua", value, |value| {
            let mut items = Items::of_pool(value)?;
            let ended = match items.int()? {
                0 => false,
                1 => true,
                _ => return Err("ended is 0 or 1".into()),
            };
            items.end()?;
            Ok(Self { ended })
        })
    }
}

/// `put_pool.lua`: whether the pool was created, updated, or its policy change refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum PutPoolReply {
    /// The pool did not exist.
    Created,
    /// The pool existed; its configuration was replaced.
    Updated,
    /// The pool has members and the configuration changes its policy: nothing changed.
    PolicyChangeRefused,
}

impl PutPoolReply {
    /// Decodes `1`, `0` or `-2`.
    pub(super) fn decode(value: Value) -> Result<Self, StoreError> {
        decode("put_pool.lua", value, |value| match int(&value)? {
            1 => Ok(Self::Created),
            0 => Ok(Self::Updated),
            -2 => Ok(Self::PolicyChangeRefused),
            _ => Err("unknown status".into()),
        })
    }
}

/// `pool_info.lua`: a pool's configuration and numbers, from one snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct PoolInfoReply {
    /// The configuration as the service stored it.
    pub(super) config: PoolConfig,
    /// When the pool was created.
    pub(super) created_at: Timestamp,
    /// Its numbers.
    pub(super) stats: PoolStats,
}

impl PoolInfoReply {
    /// The pool's info as the store answers it.
    pub(super) fn of(self, pool: PoolId) -> PoolInfo {
        PoolInfo {
            pool,
            config: self.config,
            created_at: self.created_at,
            stats: self.stats,
        }
    }

    /// Decodes `{-1}` or `{1, config, created_ms, total_assignments, eligible, ineligible,
    /// min_assignments, max_assignments, in_flight, abandoned, tripped, recovered, pruned,
    /// shared_exit_ips, country_mismatches}`.
    pub(super) fn decode(value: Value) -> Result<Self, StoreError> {
        decode("pool_info.lua", value, |value| {
            let mut items = Items::of_pool(value)?;
            let config = serde_json::from_str(&string(items.next()?)?)
                .map_err(|_| "pool configuration is not valid JSON")?;
            let created_ms = items.optional_count()?.unwrap_or(0);
            let total_assignments = items.optional_count()?.unwrap_or(0);
            let stats = PoolStats {
                total_assignments,
                eligible: items.count()?,
                ineligible: items.count()?,
                min_assignments: items.optional_count()?,
                max_assignments: items.optional_count()?,
                in_flight: items.count()?,
                abandoned: items.optional_count()?.unwrap_or(0),
                tripped: items.optional_count()?.unwrap_or(0),
                recovered: items.optional_count()?.unwrap_or(0),
                pruned: items.optional_count()?.unwrap_or(0),
                shared_exit_ips: items.optional_count()?.unwrap_or(0),
                country_mismatches: items.optional_count()?.unwrap_or(0),
            };
            items.end()?;
            Ok(Self {
                config,
                created_at: Timestamp(created_ms),
                stats,
            })
        })
    }
}

/// `delete_pool.lua`: whether the pool existed, and where its keys went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct DeletePoolReply {
    /// When the pool existed: the graveyard names its keys now have, still to be freed.
    pub(super) graveyard: Option<Vec<String>>,
}

impl DeletePoolReply {
    /// Decodes `{0}` or `{1, {graveyard key, ...}}`.
    pub(super) fn decode(value: Value) -> Result<Self, StoreError> {
        decode("delete_pool.lua", value, |value| {
            let mut items = Items::new(value)?;
            let graveyard = match items.int()? {
                1 => Some(
                    array(items.next()?)?
                        .into_iter()
                        .map(string)
                        .collect::<Read<_>>()?,
                ),
                0 => None,
                _ => return Err("unknown status".into()),
            };
            items.end()?;
            Ok(Self { graveyard })
        })
    }
}

/// What seeding did to one member.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SeedOutcome {
    /// It joined the pool.
    Added,
    /// It was already in the pool.
    Existing,
    /// It was refused: the pool is at `max_members`.
    Full,
}

/// `seed.lua`: the starting count and what happened to each member, in request order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct SeedReply {
    /// The count new members join at.
    pub(super) start_assignments: u64,
    /// One outcome per member asked about, in order: of the first ones only when the chunk
    /// stopped at its bound.
    pub(super) outcomes: Vec<SeedOutcome>,
}

impl SeedReply {
    /// Decodes `{-1}` or `{1, start, {1 = added | 0 = existing | 2 = full, ...}}` with one
    /// outcome for each of the first of `asked` members (see [`per_member`]).
    pub(super) fn decode(value: Value, asked: usize) -> Result<Self, StoreError> {
        decode("seed.lua", value, |value| {
            let mut items = Items::of_pool(value)?;
            let start_assignments = items.count()?;
            let outcomes = per_member(items.next()?, asked, |flag| match int(flag)? {
                1 => Ok(SeedOutcome::Added),
                0 => Ok(SeedOutcome::Existing),
                2 => Ok(SeedOutcome::Full),
                _ => Err("unknown seed outcome".into()),
            })?;
            items.end()?;
            Ok(Self {
                start_assignments,
                outcomes,
            })
        })
    }
}

/// `exit_ip.lua`: how many of the members named the pool still has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct ExitsReply {
    /// Members whose exit address was recorded.
    pub(super) recorded: u64,
}

impl ExitsReply {
    /// Decodes `{-1}` or `{1, recorded}`.
    pub(super) fn decode(value: Value) -> Result<Self, StoreError> {
        decode("exit_ip.lua", value, |value| {
            let mut items = Items::of_pool(value)?;
            let recorded = items.count()?;
            items.end()?;
            Ok(Self { recorded })
        })
    }
}

/// `members.lua`: one page of each set, in set order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct MembersReply {
    /// The page of eligible members.
    pub(super) eligible: Vec<MemberView>,
    /// The page of ineligible members.
    pub(super) ineligible: Vec<MemberView>,
    /// With a label filter: where the next page's walk starts, when it has not ended.
    pub(super) next: Option<u64>,
    /// Listing the members that share an exit address: where the next page's walk starts
    /// in each set, when it has not ended.
    pub(super) next_shared: Option<Cursor>,
}

impl MembersReply {
    /// Decodes `{-1}`, `{1, 'eligible', {...}, 'ineligible', {...}}` or, with a label
    /// filter, `{2, ..., 'next', offset | -1}`, or for the members sharing an exit address
    /// `{3, ..., 'next', {eligible offset, ineligible offset} | -1}`, where each set's page
    /// names its lists (see `members.lua`).
    /// With `banned` (a listing for a target), each page also has its `banned_until`.
    pub(super) fn decode(value: Value, banned: bool) -> Result<Self, StoreError> {
        decode("members.lua", value, |value| {
            let mut items = Items::new(value)?;
            let status = items.int()?;
            if status == -1 {
                return Err(Problem::NoPool);
            }
            if !(1..=3).contains(&status) {
                return Err("unknown status".into());
            }
            let eligible = member_views(items.field("eligible")?, MemberState::Eligible, banned)?;
            let ineligible =
                member_views(items.field("ineligible")?, MemberState::Ineligible, banned)?;
            let (mut next, mut next_shared) = (None, None);
            if status == 2 {
                next = u64::try_from(int(&items.field("next")?)?).ok();
            } else if status == 3 {
                next_shared = match items.field("next")? {
                    Value::Array(offsets) => {
                        let [eligible, ineligible] = offsets.as_slice() else {
                            return Err("next is not two offsets".into());
                        };
                        Some(Cursor {
                            eligible: count(eligible)?,
                            ineligible: count(ineligible)?,
                        })
                    }
                    _ => None,
                };
            }
            items.end()?;
            Ok(Self {
                eligible,
                ineligible,
                next,
                next_shared,
            })
        })
    }
}

/// One set's page: `members` as `(member, count)` pairs, then one list per member
/// property, each entry belonging to the member of the same place; with `banned`, the
/// last is `banned_until` (ms, 0 when not banned).
fn member_views(page: Value, state: MemberState, banned: bool) -> Read<Vec<MemberView>> {
    let mut page = Items::new(page)?;
    let pairs = array(page.field("members")?)?;
    if pairs.len() % 2 != 0 {
        return Err("members are not (member, count) pairs".into());
    }
    let size = pairs.len() / 2;
    let ineligible = state == MemberState::Ineligible;
    let mut taken_out = ineligible
        .then(|| column(page.field("taken_out")?, size))
        .transpose()?;
    let mut in_flight = column(page.field("in_flight")?, size)?;
    let mut health = column(page.field("health")?, size)?;
    let mut returns = ineligible
        .then(|| column(page.field("returns")?, size))
        .transpose()?;
    let mut checks = column(page.field("checks")?, size)?;
    let mut labels = column(page.field("labels")?, size)?;
    let mut origins = column(page.field("origins")?, size)?;
    let mut exits = column(page.field("exits")?, size)?;
    let mut qualities = column(page.field("quality")?, size)?;
    let mut bans = banned
        .then(|| column(page.field("banned_until")?, size))
        .transpose()?;
    page.end()?;
    let mut views = Vec::with_capacity(size);
    let mut pairs = pairs.into_iter();
    // Every column has `size` entries, checked above.
    let next = |column: &mut std::vec::IntoIter<Value>| column.next().unwrap_or(Value::Nil);
    while let (Some(member), Some(assignments)) = (pairs.next(), pairs.next()) {
        let (reason, since) = match taken_out.as_mut() {
            Some(taken_out) => parse_taken_out(next(taken_out))?,
            None => (None, None),
        };
        let health = parse_health(next(&mut health))?;
        let returns_at = match returns.as_mut() {
            Some(returns) => optional_count(&next(returns))?.map(Timestamp),
            None => None,
        };
        let (exit_ip, exit_ip_at) = parse_exit(next(&mut exits))?;
        let labels = match next(&mut labels) {
            Value::Nil => Labels::default(),
            text => Labels::from_script_text(&string(text)?),
        };
        let mut view = MemberView {
            member: MemberId::from_stored(string(member)?),
            origin: match next(&mut origins) {
                Value::Nil => Origin::Manual,
                text => match string(text)? {
                    text if text == "import" => Origin::Import,
                    url => Origin::Source(url),
                },
            },
            state,
            assignments: count(&assignments)?,
            in_flight: optional_count(&next(&mut in_flight))?.unwrap_or(0),
            reason,
            since,
            consecutive_failures: health.streak,
            last_cooldown_ms: (health.trips > 0).then_some(health.cooldown_ms),
            returns_at,
            last_check: parse_last_check(next(&mut checks))?,
            exit_ip,
            exit_ip_at,
            labels: Labels::default(),
            geo_labels: Labels::default(),
            country_mismatch: false,
            banned_until: match bans.as_mut() {
                Some(bans) => Some(
                    Some(count(&next(bans))?)
                        .filter(|&ms| ms > 0)
                        .map(Timestamp),
                ),
                None => None,
            },
            quality: parse_quality(next(&mut qualities))?,
        };
        view.set_labels(labels);
        views.push(view);
    }
    Ok(views)
}

/// `"<outcomes> <success_ppm> <latencies> <latency_us>"`, a member's quality (see
/// `quality.lua`); none before its first outcome counted.
fn parse_quality(value: Value) -> Read<Quality> {
    if matches!(value, Value::Nil) {
        return Ok(Quality::default());
    }
    let text = string(value)?;
    let numbers: Vec<u64> = text
        .split(' ')
        .map(str::parse)
        .collect::<Result<_, _>>()
        .map_err(|_| "malformed quality entry")?;
    let [outcomes, success_ppm, latencies, latency_us] = numbers[..] else {
        return Err("malformed quality entry".into());
    };
    Ok(Quality {
        outcomes,
        success_ppm,
        latencies,
        latency_us,
    })
}

/// `"<ip> <at_ms>"`, a member's exit address and when a check saw it (see `labels.lua`).
fn parse_exit(value: Value) -> Read<(Option<std::net::IpAddr>, Option<Timestamp>)> {
    if matches!(value, Value::Nil) {
        return Ok((None, None));
    }
    let text = string(value)?;
    let (ip, at) = text.split_once(' ').ok_or("malformed exit entry")?;
    let ip = ip.parse().map_err(|_| "malformed exit address")?;
    let at = at.parse::<u64>().map_err(|_| "malformed exit time")?;
    Ok((Some(ip), Some(Timestamp(at))))
}

/// A list with one entry per member of a page of `size` members.
fn column(value: Value, size: usize) -> Read<std::vec::IntoIter<Value>> {
    let column = array(value)?;
    if column.len() != size {
        return Err(format!("a list of {} entries for {size} members", column.len()).into());
    }
    Ok(column.into_iter())
}

/// `"<since_ms> <reason>"`: when and why an operator or health took a member out.
fn parse_taken_out(info: Value) -> Read<(Option<String>, Option<Timestamp>)> {
    if matches!(info, Value::Nil) {
        return Ok((None, None));
    }
    let text = string(info)?;
    let (since, reason) = text.split_once(' ').unwrap_or((text.as_str(), ""));
    let since = since.parse::<u64>().ok().map(Timestamp);
    Ok((Some(reason.to_owned()), since))
}

/// `"<streak> <trips> <cooldown_ms>"`, absent when all three are 0.
fn parse_health(value: Value) -> Read<Health> {
    if matches!(value, Value::Nil) {
        return Ok(Health::default());
    }
    let text = string(value)?;
    let mut numbers = text.split(' ').map(str::parse::<u64>);
    let mut next = || {
        numbers
            .next()
            .and_then(Result::ok)
            .ok_or(Problem::from("malformed health entry"))
    };
    Ok(Health {
        streak: next()?,
        trips: next()?,
        cooldown_ms: next()?,
    })
}

/// `"<at_ms> <result>[/<latency_ms>] <detail>"`, the member's last active check (entries
/// written before latencies were kept have none).
fn parse_last_check(value: Value) -> Read<Option<LastCheck>> {
    if matches!(value, Value::Nil) {
        return Ok(None);
    }
    let text = string(value)?;
    let mut parts = text.splitn(3, ' ');
    let at = parts.next().and_then(|t| t.parse::<u64>().ok());
    let (result, latency) = match parts.next().map(|r| r.split_once('/').unwrap_or((r, ""))) {
        Some((result, "")) => (OutcomeResult::from_name(result), Some(None)),
        Some((result, ms)) => (OutcomeResult::from_name(result), ms.parse().ok().map(Some)),
        None => (None, None),
    };
    match (at, result, latency) {
        (Some(at), Some(result), Some(latency_ms)) => Ok(Some(LastCheck {
            at: Timestamp(at),
            result,
            detail: parts.next().unwrap_or("").to_owned(),
            latency_ms,
        })),
        _ => Err("malformed check entry".into()),
    }
}

/// What a disable did to one member.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum DisableOutcome {
    /// It was eligible or cooling down; an operator holds it out now.
    Disabled,
    /// An operator had already taken it out.
    AlreadyIneligible,
    /// The pool does not have it.
    Unknown,
}

/// `disable.lua`: one outcome per member, in request order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct DisableReply(pub(super) Vec<DisableOutcome>);

impl DisableReply {
    /// Decodes `{-1}` or `{1, {1 = disabled | 2 = already ineligible | 0 = unknown, ...}}`
    /// with one outcome for each of the first of `asked` members (see [`per_member`]).
    pub(super) fn decode(value: Value, asked: usize) -> Result<Self, StoreError> {
        decode("disable.lua", value, |value| {
            let mut items = Items::of_pool(value)?;
            let outcomes = per_member(items.next()?, asked, |outcome| match int(outcome)? {
                1 => Ok(DisableOutcome::Disabled),
                2 => Ok(DisableOutcome::AlreadyIneligible),
                0 => Ok(DisableOutcome::Unknown),
                _ => Err("unknown disable outcome".into()),
            })?;
            items.end()?;
            Ok(Self(outcomes))
        })
    }
}

/// What an enable did to one member.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum EnableOutcome {
    /// It is eligible again, with the count the restore policy gave it.
    Enabled {
        /// The count it had while out.
        kept_assignments: u64,
        /// The count it came back with.
        assignments: u64,
    },
    /// It was eligible already.
    AlreadyEligible,
    /// The pool does not have it.
    Unknown,
}

/// `enable.lua`: the restore policy applied and one outcome per member, in request order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct EnableReply {
    /// The policy the members came back under.
    pub(super) restore: RestorePolicy,
    /// One outcome per member asked about, in order: of the first ones only when the chunk
    /// stopped at its bound.
    pub(super) outcomes: Vec<EnableOutcome>,
}

impl EnableReply {
    /// Decodes `{-1}` or `{1, policy, {outcome, kept, restored, ...}}` with outcome
    /// 1 = enabled, 2 = already eligible, 0 = unknown, for each of the first of `asked`
    /// members (see [`per_member`]).
    pub(super) fn decode(value: Value, asked: usize) -> Result<Self, StoreError> {
        decode("enable.lua", value, |value| {
            let mut items = Items::of_pool(value)?;
            let restore = RestorePolicy::from_name(&string(items.next()?)?)
                .ok_or("unknown restore policy")?;
            let outcomes = array(items.next()?)?;
            items.end()?;
            if outcomes.len() % 3 != 0 {
                return Err(format!("{} values for {asked} members", outcomes.len()).into());
            }
            handled(outcomes.len() / 3, asked)?;
            let outcomes = outcomes
                .chunks(3)
                .map(|outcome| match outcome {
                    [status, kept, restored] => match int(status)? {
                        1 => Ok(EnableOutcome::Enabled {
                            kept_assignments: count(kept)?,
                            assignments: count(restored)?,
                        }),
                        2 => Ok(EnableOutcome::AlreadyEligible),
                        0 => Ok(EnableOutcome::Unknown),
                        _ => Err("unknown enable outcome".into()),
                    },
                    _ => Err("enable outcome too short".into()),
                })
                .collect::<Read<_>>()?;
            Ok(Self { restore, outcomes })
        })
    }
}

/// `remove.lua`: per member, in request order, whether it was in the pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct RemoveReply(pub(super) Vec<bool>);

impl RemoveReply {
    /// Decodes `{-1}` or `{1, {1 = removed | 0 = unknown, ...}}` with one outcome for each
    /// of the first of `asked` members (see [`per_member`]).
    pub(super) fn decode(value: Value, asked: usize) -> Result<Self, StoreError> {
        decode("remove.lua", value, |value| {
            let mut items = Items::of_pool(value)?;
            let removed = per_member(items.next()?, asked, |outcome| match int(outcome)? {
                1 => Ok(true),
                0 => Ok(false),
                _ => Err("unknown remove outcome".into()),
            })?;
            items.end()?;
            Ok(Self(removed))
        })
    }
}

/// `release.lua`: whether the lease was live (and is released now).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct ReleaseReply {
    /// The lease was live and has ended.
    pub(super) released: bool,
}

impl ReleaseReply {
    /// Decodes `{-1}`, `{1, 0}` or `{1, 1}`.
    pub(super) fn decode(value: Value) -> Result<Self, StoreError> {
        decode("release.lua", value, |value| {
            let mut items = Items::of_pool(value)?;
            let released = lease_live(&mut items)?;
            items.end()?;
            Ok(Self { released })
        })
    }
}

/// `renew.lua`: the lease's new expiry, or `None` when it was not live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct RenewReply(pub(super) Option<Renewal>);

/// A renewed lease, as `renew.lua` returns it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Renewal {
    /// The leased member.
    pub(super) member: MemberId,
    /// The new expiry.
    pub(super) expires_at: Timestamp,
    /// The ttl it was given.
    pub(super) ttl_ms: LeaseTtl,
    /// The pool's new earliest due time when the renewal moved it earlier (a shorter ttl),
    /// for the due index; see `due_by` in `leases.lua`.
    pub(super) due_hint: Option<u64>,
}

impl RenewReply {
    /// Decodes `{-1}`, `{1, 0}` or `{1, 1, member, expires_ms, ttl_ms, due hint or 0}`.
    pub(super) fn decode(value: Value) -> Result<Self, StoreError> {
        decode("renew.lua", value, |value| {
            let mut items = Items::of_pool(value)?;
            let renewal = if lease_live(&mut items)? {
                Some(Renewal {
                    member: items.member()?,
                    expires_at: Timestamp(items.count()?),
                    ttl_ms: lease_ttl(items.count()?)?,
                    due_hint: items.due_time()?,
                })
            } else {
                None
            };
            items.end()?;
            Ok(Self(renewal))
        })
    }
}

/// `sweep.lua`: what one sweep step did in one pool, and when its next work is due.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct SweepReply {
    /// What the step did.
    pub(super) swept: Swept,
    /// When the pool's next lease expires or member returns (ms, Redis clock), if any.
    pub(super) next_due: Option<u64>,
    /// Whether the step stopped at its bound (see `chunk.lua`) with work left that its
    /// size would have covered.
    pub(super) stopped: bool,
}

impl SweepReply {
    /// Decodes `{-1}` or `{1, reclaimed, returned, next due or 0, stopped 1 or 0}`.
    pub(super) fn decode(value: Value) -> Result<Self, StoreError> {
        decode("sweep.lua", value, |value| {
            let mut items = Items::of_pool(value)?;
            let swept = Swept {
                reclaimed: items.count()?,
                returned: items.count()?,
            };
            let next_due = items.due_time()?;
            let stopped = match items.int()? {
                0 => false,
                1 => true,
                _ => return Err("stopped is neither 0 nor 1".into()),
            };
            items.end()?;
            Ok(Self {
                swept,
                next_due,
                stopped,
            })
        })
    }
}

/// `outcomes.lua`: per report, in request order, what it did, the member's failure
/// streak after it and the end of its ban for the report's target; `None` for a member
/// the pool does not have. With the pool's new earliest
/// due time when a trip moved it earlier (the hint for the due index, see `keys.rs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct OutcomesReply {
    /// Per report, what it did.
    pub(super) outcomes: Vec<Option<(Effect, u64, Option<Timestamp>)>>,
    /// The due index's hint.
    pub(super) due_hint: Option<u64>,
}

impl OutcomesReply {
    /// Decodes `{-1}` or `{1, {effect, streak, banned_until, ...}, due hint or 0}` with
    /// effect 0 = unknown, 1 = counted, 2 = tripped, 3 = ignored, 4 = returned, 5 = banned
    /// and banned_until 0 for none, for each of `asked` reports.
    pub(super) fn decode(value: Value, asked: usize) -> Result<Self, StoreError> {
        decode("outcomes.lua", value, |value| {
            let mut items = Items::of_pool(value)?;
            let outcomes = array(items.next()?)?;
            let due_hint = items.due_time()?;
            items.end()?;
            if outcomes.len() != asked * 3 {
                return Err(format!("{} values for {asked} reports", outcomes.len()).into());
            }
            let outcomes = outcomes
                .chunks(3)
                .map(|outcome| {
                    let [effect, streak, banned_until] = outcome else {
                        return Err("outcome too short".into());
                    };
                    report_outcome(effect, streak, banned_until)
                })
                .collect::<Read<_>>()?;
            Ok(Self { outcomes, due_hint })
        })
    }
}

/// One report's `effect, streak, banned_until` (`apply_report` in report.lua): `None` for
/// effect 0, a member the pool does not have.
fn report_outcome(
    effect: &Value,
    streak: &Value,
    banned_until: &Value,
) -> Read<Option<(Effect, u64, Option<Timestamp>)>> {
    let effect = match int(effect)? {
        0 => return Ok(None),
        1 => Effect::Counted,
        2 => Effect::Tripped,
        3 => Effect::Ignored,
        4 => Effect::Returned,
        5 => Effect::Banned,
        _ => return Err("unknown effect".into()),
    };
    let banned_until = Some(count(banned_until)?)
        .filter(|&ms| ms > 0)
        .map(Timestamp);
    Ok(Some((effect, count(streak)?, banned_until)))
}

/// `assign_done.lua`: what the worker's `done` did, then the pick's reply: `assign.lua`'s
/// ([`AssignReply`]), or in a session its session answer ([`SessionAssignReply`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct AssignDoneReply<P = AssignReply> {
    /// What the report and the release did.
    pub(super) done: DoneReply,
    /// The pick, as `assign.lua` replies it.
    pub(super) pick: P,
}

/// What `done` did, as `assign_done.lua` replies it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct DoneReply {
    /// `None` when `done` had no report; else, as [`OutcomesReply::outcomes`] holds each
    /// report, `None` for a member the pool does not have.
    pub(super) report: Option<Option<(Effect, u64, Option<Timestamp>)>>,
    /// The lease was live and has ended.
    pub(super) released: bool,
    /// The due index's hint, after the report and the pick.
    pub(super) due_hint: Option<u64>,
    /// The member the report was about (the lease's when it named none), when known.
    pub(super) member: Option<MemberId>,
}

impl DoneReply {
    /// Reads `{-1}` or `{1, effect, streak, banned_until, released, due hint or 0, member
    /// or '', the pick's reply...}` (flat: a nested reply costs more to read) with effect
    /// -1 for no report, else as outcomes.lua's: what `done` did, and the pick's reply as
    /// one array for its own decoder.
    fn split(value: Value) -> Result<(Self, Value), StoreError> {
        decode("assign_done.lua", value, |value| {
            let mut done = Items::of_pool(value)?;
            let [effect, streak, banned_until] = [done.next()?, done.next()?, done.next()?];
            let report = match int(&effect)? {
                -1 => None,
                _ => Some(report_outcome(&effect, &streak, &banned_until)?),
            };
            let released = match done.int()? {
                0 => false,
                1 => true,
                _ => return Err("released is 0 or 1".into()),
            };
            let due_hint = done.due_time()?;
            let member = string(done.next()?)?;
            let pick = Value::Array(done.0.collect());
            Ok((
                Self {
                    report,
                    released,
                    due_hint,
                    member: (!member.is_empty()).then(|| MemberId::from_stored(member)),
                },
                pick,
            ))
        })
    }
}

impl AssignDoneReply {
    /// Decodes what `done` did (see [`DoneReply::split`]) followed by `assign.lua`'s
    /// reply.
    pub(super) fn decode(value: Value) -> Result<Self, StoreError> {
        let (done, pick) = DoneReply::split(value)?;
        Ok(Self {
            done,
            pick: AssignReply::decode(pick)?,
        })
    }
}

impl AssignDoneReply<SessionAssignReply> {
    /// Decodes what `done` did (see [`DoneReply::split`]) followed by the reply of an
    /// assign in a session.
    pub(super) fn decode_in_session(value: Value) -> Result<Self, StoreError> {
        let (done, pick) = DoneReply::split(value)?;
        Ok(Self {
            done,
            pick: SessionAssignReply::decode(pick)?,
        })
    }
}

/// `claim_check.lua`: the members to probe when the round is this replica's, else `None`,
/// and when the pool's next round may start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ClaimCheckReply {
    /// The round, when it is this replica's.
    pub(super) round: Option<CheckRound>,
    /// When the claim that holds the pool ends (ms, Redis clock).
    pub(super) next_round: u64,
}

impl ClaimCheckReply {
    /// Decodes `{-1}`, `{1, 0, next}` or `{1, 1, next, eligible members, cooling-down
    /// members}`.
    pub(super) fn decode(value: Value) -> Result<Self, StoreError> {
        decode("claim_check.lua", value, |value| {
            let mut items = Items::of_pool(value)?;
            let claimed = items.int()?;
            let next_round = items.count()?;
            let round = match claimed {
                0 => None,
                1 => Some(CheckRound {
                    eligible: members(items.next()?)?,
                    cooling: members(items.next()?)?,
                }),
                _ => return Err("unknown claim status".into()),
            };
            items.end()?;
            Ok(Self { round, next_round })
        })
    }
}

/// `claim_sources.lua`: the sources this replica claimed, and the pool's earliest next
/// fetch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ClaimSourcesReply {
    /// The sources claimed.
    pub(super) claimed: Vec<ClaimedSource>,
    /// The earliest next fetch among the pool's sources (ms, Redis clock; none without
    /// sources).
    pub(super) next: Option<u64>,
}

impl ClaimSourcesReply {
    /// Decodes `{-1}` or `{1, next, {url, failures, successes, id, ...}}`.
    pub(super) fn decode(value: Value) -> Result<Self, StoreError> {
        decode("claim_sources.lua", value, |value| {
            let mut items = Items::of_pool(value)?;
            let next = items.due_time()?;
            let flat = array(items.next()?)?;
            if flat.len() % 4 != 0 {
                return Err("claimed sources come in fours".into());
            }
            let mut claimed = Vec::with_capacity(flat.len() / 4);
            let mut flat = flat.into_iter();
            while let (Some(url), Some(failures), Some(successes), Some(id)) =
                (flat.next(), flat.next(), flat.next(), flat.next())
            {
                claimed.push(ClaimedSource {
                    url: string(url)?,
                    failures: count(&failures)?,
                    successes: count(&successes)?,
                    id: count(&id)?,
                });
            }
            items.end()?;
            Ok(Self { claimed, next })
        })
    }
}

/// `record_source.lua`: the source's next fetch, or `None` when it is no longer kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct RecordSourceReply(pub(super) Option<u64>);

impl RecordSourceReply {
    /// Decodes `{-1}`, `{0}` or `{1, next}`.
    pub(super) fn decode(value: Value) -> Result<Self, StoreError> {
        decode("record_source.lua", value, |value| {
            let mut items = Items::new(value)?;
            let next = match items.int()? {
                -1 => return Err(Problem::NoPool),
                0 => None,
                1 => Some(items.count()?),
                _ => return Err("unknown status".into()),
            };
            items.end()?;
            Ok(Self(next))
        })
    }
}

/// `source_states.lua`: what is kept about each source, by URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct SourceStatesReply(pub(super) std::collections::HashMap<String, SourceState>);

impl SourceStatesReply {
    /// Decodes `{-1}` or `{1, {field, value, ...}}`, the fields being `n:<url>` (schedule
    /// and counts) and `l:<url>` (last fetch), see `keys.rs`.
    pub(super) fn decode(value: Value) -> Result<Self, StoreError> {
        decode("source_states.lua", value, |value| {
            let mut items = Items::of_pool(value)?;
            let flat = array(items.next()?)?;
            items.end()?;
            let mut states = std::collections::HashMap::new();
            let mut lasts = Vec::new();
            let mut flat = flat.into_iter();
            while let (Some(field), Some(text)) = (flat.next(), flat.next()) {
                let (field, text) = (string(field)?, string(text)?);
                if let Some(url) = field.strip_prefix("n:") {
                    let numbers: Vec<u64> = text
                        .split(' ')
                        .map(|n| n.parse().map_err(|_| "a source's numbers"))
                        .collect::<Result<_, _>>()?;
                    let [next, failures, successes, _id] = numbers[..] else {
                        return Err("a source's numbers are four".into());
                    };
                    states.insert(
                        url.to_owned(),
                        SourceState {
                            next_fetch_at: Timestamp(next),
                            failures,
                            successes,
                            last_fetch: None,
                        },
                    );
                } else if let Some(url) = field.strip_prefix("l:") {
                    let (at, json) = text.split_once(' ').ok_or("a last fetch has a time")?;
                    let at = at.parse().map_err(|_| "a last fetch's time")?;
                    let outcome: FetchOutcome =
                        serde_json::from_str(json).map_err(|_| "a last fetch's outcome")?;
                    lasts.push((
                        url.to_owned(),
                        SourceFetch {
                            at: Timestamp(at),
                            outcome,
                        },
                    ));
                } else if !field.starts_with("u:") {
                    return Err("an unknown source field".into());
                }
            }
            for (url, last) in lasts {
                if let Some(state) = states.get_mut(&url) {
                    state.last_fetch = Some(last);
                }
            }
            Ok(Self(states))
        })
    }
}

/// `prune.lua`: the members removed, and whether a batch was full.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct PruneReply(pub(super) Pruned);

impl PruneReply {
    /// Decodes `{-1}` or `{1, {member, ...}, more}`.
    pub(super) fn decode(value: Value) -> Result<Self, StoreError> {
        decode("prune.lua", value, |value| {
            let mut items = Items::of_pool(value)?;
            let removed = members(items.next()?)?;
            let more = match items.int()? {
                0 => false,
                1 => true,
                _ => return Err("more is 0 or 1".into()),
            };
            items.end()?;
            Ok(Self(Pruned { removed, more }))
        })
    }
}

/// `claim_due.lua`: the pools taken from a due index, earliest first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ClaimDueReply(pub(super) Vec<PoolId>);

impl ClaimDueReply {
    /// Decodes a list of pool ids.
    pub(super) fn decode(value: Value) -> Result<Self, StoreError> {
        decode("claim_due.lua", value, |value| {
            pool_id_list(value).map(Self)
        })
    }
}

/// `walk.lua`: the pools of a turn of the registry walk, in id order (none: another
/// replica's turn).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct WalkReply(pub(super) Vec<PoolId>);

impl WalkReply {
    /// Decodes a list of pool ids.
    pub(super) fn decode(value: Value) -> Result<Self, StoreError> {
        decode("walk.lua", value, |value| pool_id_list(value).map(Self))
    }
}

/// One client as `put_client.lua` keeps it: `"<token sha-256 hex> <config json>"`.
fn client_record(id: &str, record: &str) -> Read<ClientRecord> {
    let id = ClientId::parse(id).map_err(|_| "expected a client id")?;
    let (token, config) = record
        .split_once(' ')
        .ok_or("expected a token hash and a configuration")?;
    Ok(ClientRecord {
        id,
        config: ClientConfig::from_json(config)
            .map_err(|e| format!("a client configuration: {e}"))?,
        token: TokenHash::from_hex(token).ok_or("expected a token hash")?,
    })
}

/// `HGET` of one client's record: the client, or `None` when there is none.
pub(super) fn client(id: &ClientId, value: Value) -> Result<Option<ClientRecord>, StoreError> {
    decode("HGET", value, |value| match value {
        Value::Nil => Ok(None),
        value => client_record(id.as_str(), &string(value)?).map(Some),
    })
}

/// `HGETALL` of every client's record, by id.
pub(super) fn clients(value: Value) -> Result<Vec<ClientRecord>, StoreError> {
    decode("HGETALL", value, |value| {
        let pairs: Vec<(String, String)> = match value {
            Value::Map(pairs) => pairs
                .into_iter()
                .map(|(id, record)| Ok((string(id)?, string(record)?)))
                .collect::<Read<_>>()?,
            Value::Array(items) => {
                let mut items = items.into_iter();
                let mut pairs = Vec::new();
                while let Some(id) = items.next() {
                    let record = items.next().ok_or("expected pairs")?;
                    pairs.push((string(id)?, string(record)?));
                }
                pairs
            }
            _ => return Err("expected a hash".into()),
        };
        let mut clients = pairs
            .iter()
            .map(|(id, record)| client_record(id, record))
            .collect::<Read<Vec<_>>>()?;
        clients.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(clients)
    })
}

/// `put_client.lua`: created, replaced, or refused for the bound.
pub(super) fn put_client(value: Value) -> Result<PutClient, StoreError> {
    match decode("put_client.lua", value, |value| int(&value))? {
        1 => Ok(PutClient::Created),
        0 => Ok(PutClient::Replaced),
        -1 => Err(StoreError::TooManyClients),
        _ => decode("put_client.lua", Value::Nil, |_| {
            Err::<PutClient, _>("expected 1, 0 or -1".into())
        }),
    }
}

/// `rotate_client.lua` and `delete_client.lua`: done, or no such client.
pub(super) fn client_changed(answered_by: &'static str, value: Value) -> Result<(), StoreError> {
    match decode(answered_by, value, |value| int(&value))? {
        1 => Ok(()),
        0 => Err(StoreError::ClientNotFound),
        _ => decode(answered_by, Value::Nil, |_| {
            Err::<(), _>("expected 1 or 0".into())
        }),
    }
}

/// `client_by_token.lua`: the client the token opens, if any.
pub(super) fn client_by_token(value: Value) -> Result<Option<ClientRecord>, StoreError> {
    decode("client_by_token.lua", value, |value| match value {
        Value::Nil => Ok(None),
        value => {
            let mut items = array(value)?.into_iter();
            let (Some(id), Some(record), None) = (items.next(), items.next(), items.next()) else {
                return Err("expected an id and a record".into());
            };
            client_record(&string(id)?, &string(record)?).map(Some)
        }
    })
}

/// `received.lua`: how many bytes Redis has received from all its clients.
pub(super) fn received(value: Value) -> Result<u64, StoreError> {
    decode("received.lua", value, |value| count(&value))
}

/// `SSCAN` of an earlier version's pool registry: the cursor to go on from (`0` once the walk is through)
/// and a few pool ids.
pub(super) fn registry_page(value: Value) -> Result<(u64, Vec<PoolId>), StoreError> {
    decode("SSCAN", value, |value| {
        let mut items = Items::new(value)?;
        let cursor = string(items.next()?)?
            .parse::<u64>()
            .map_err(|_| "expected a cursor")?;
        let ids = pool_id_list(items.next()?)?;
        items.end()?;
        Ok((cursor, ids))
    })
}

/// `ZRANGE ... BYLEX` of the pool registry: pool ids, in id order.
pub(super) fn pool_ids(value: Value) -> Result<Vec<PoolId>, StoreError> {
    decode("ZRANGE", value, pool_id_list)
}

/// `ZCARD` of the pool registry: how many pools exist.
pub(super) fn pool_count(value: Value) -> Result<u64, StoreError> {
    decode("ZCARD", value, |value| count(&value))
}

/// A list of pool ids; an entry that is not a valid one is skipped (nothing the service
/// writes is one).
fn pool_id_list(value: Value) -> Read<Vec<PoolId>> {
    Ok(array(value)?
        .into_iter()
        .filter_map(|v| string(v).ok())
        .filter_map(|s| PoolId::parse(&s).ok())
        .collect())
}

/// The status lease scripts put after the pool's: `1` live, `0` not.
fn lease_live(items: &mut Items) -> Read<bool> {
    match items.int()? {
        1 => Ok(true),
        0 => Ok(false),
        _ => Err("unknown lease status".into()),
    }
}

fn lease_ttl(ms: u64) -> Read<LeaseTtl> {
    LeaseTtl::from_millis(ms).map_err(|_| "lease ttl out of range".into())
}

/// A list of exactly one entry per member asked about, each read by `read`.
/// The outcomes of a chunk script (see `chunk.lua`) asked about `asked` members: one for
/// each of the first members, all of them unless the chunk stopped at its bound, and at
/// least one unless none was asked about (else a call would never end).
fn per_member<T>(value: Value, asked: usize, read: impl Fn(&Value) -> Read<T>) -> Read<Vec<T>> {
    let list = array(value)?;
    handled(list.len(), asked)?;
    list.iter().map(read).collect()
}

/// Checks that a chunk script answered for `handled` of `asked` members (see
/// [`per_member`]).
fn handled(handled: usize, asked: usize) -> Read<()> {
    if handled > asked || (handled == 0 && asked > 0) {
        return Err(format!("{handled} outcomes for {asked} members").into());
    }
    Ok(())
}

fn members(value: Value) -> Read<Vec<MemberId>> {
    array(value)?
        .into_iter()
        .map(|m| string(m).map(MemberId::from_stored))
        .collect()
}

fn array(value: Value) -> Read<Vec<Value>> {
    match value {
        // RESP3 answers SMEMBERS with a set.
        Value::Array(items) | Value::Set(items) => Ok(items),
        _ => Err("expected an array".into()),
    }
}

fn int(value: &Value) -> Read<i64> {
    match value {
        Value::Int(n) => Ok(*n),
        Value::BulkString(bytes) => std::str::from_utf8(bytes)
            .ok()
            .and_then(|s| s.parse::<f64>().ok())
            // Counts are whole numbers kept in Redis scores (doubles).
            .map(|f| f as i64)
            .ok_or_else(|| "expected a number".into()),
        _ => Err("expected a number".into()),
    }
}

fn count(value: &Value) -> Read<u64> {
    u64::try_from(int(value)?).map_err(|_| "expected a non-negative count".into())
}

fn optional_count(value: &Value) -> Read<Option<u64>> {
    match value {
        Value::Nil => Ok(None),
        other => count(other).map(Some),
    }
}

fn string(value: Value) -> Read<String> {
    match value {
        Value::BulkString(bytes) => {
            String::from_utf8(bytes).map_err(|_| "expected UTF-8 text".into())
        }
        Value::SimpleString(text) => Ok(text),
        _ => Err("expected text".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_check_entry_reads_with_and_without_a_latency() {
        let read = |text: &str| parse_last_check(Value::BulkString(text.as_bytes().to_vec()));
        assert_eq!(
            read("1700000000000 ok/42 status 200").expect("valid"),
            Some(LastCheck {
                at: Timestamp(1_700_000_000_000),
                result: OutcomeResult::Ok,
                detail: "status 200".to_owned(),
                latency_ms: Some(42),
            })
        );
        // Written before latencies were kept.
        assert_eq!(
            read("1700000000000 failed connection refused").expect("valid"),
            Some(LastCheck {
                at: Timestamp(1_700_000_000_000),
                result: OutcomeResult::Failed,
                detail: "connection refused".to_owned(),
                latency_ms: None,
            })
        );
        assert!(read("1700000000000 ok/x status 200").is_err());
        assert_eq!(parse_last_check(Value::Nil).expect("nil"), None);
    }
}
