//! Readers for the shapes the scripts return.

use redis::Value;

use crate::domain::{LeaseTtl, MemberId, OutcomeResult, Timestamp};
use crate::store::{Health, LastCheck, MemberState, MemberView, StoreError};

/// The error for a reply whose shape the scripts never produce.
#[derive(Debug, thiserror::Error)]
#[error("unexpected reply from Redis: {0}")]
struct UnexpectedReply(&'static str);

pub(super) fn unexpected(what: &'static str) -> StoreError {
    StoreError::Unavailable(Box::new(UnexpectedReply(what)))
}

pub(super) fn array(value: Value) -> Result<Vec<Value>, StoreError> {
    match value {
        // RESP3 answers SMEMBERS with a set.
        Value::Array(items) | Value::Set(items) => Ok(items),
        _ => Err(unexpected("expected an array")),
    }
}

pub(super) fn int(value: &Value) -> Result<i64, StoreError> {
    match value {
        Value::Int(n) => Ok(*n),
        Value::BulkString(bytes) => std::str::from_utf8(bytes)
            .ok()
            .and_then(|s| s.parse::<f64>().ok())
            // Counts are whole numbers kept in Redis scores (doubles).
            .map(|f| f as i64)
            .ok_or_else(|| unexpected("expected a number")),
        _ => Err(unexpected("expected a number")),
    }
}

pub(super) fn count(value: &Value) -> Result<u64, StoreError> {
    u64::try_from(int(value)?).map_err(|_| unexpected("expected a non-negative count"))
}

pub(super) fn optional_count(value: &Value) -> Result<Option<u64>, StoreError> {
    match value {
        Value::Nil => Ok(None),
        other => count(other).map(Some),
    }
}

pub(super) fn string(value: Value) -> Result<String, StoreError> {
    match value {
        Value::BulkString(bytes) => {
            String::from_utf8(bytes).map_err(|_| unexpected("expected UTF-8 text"))
        }
        Value::SimpleString(text) => Ok(text),
        _ => Err(unexpected("expected text")),
    }
}

/// The status every pool script puts first: `-1` means the pool does not exist.
pub(super) fn pool_status(value: Value) -> Result<std::vec::IntoIter<Value>, StoreError> {
    let mut items = array(value)?.into_iter();
    match items.next().as_ref().map(int).transpose()? {
        Some(-1) => Err(StoreError::PoolNotFound),
        Some(_) => Ok(items),
        None => Err(unexpected("empty reply")),
    }
}

pub(super) fn next(items: &mut impl Iterator<Item = Value>) -> Result<Value, StoreError> {
    items.next().ok_or_else(|| unexpected("reply too short"))
}

fn parse_taken_out(info: Value) -> Result<(Option<String>, Option<Timestamp>), StoreError> {
    if matches!(info, Value::Nil) {
        return Ok((None, None));
    }
    let text = string(info)?;
    let (since, reason) = text.split_once(' ').unwrap_or((text.as_str(), ""));
    let since = since.parse::<u64>().ok().map(Timestamp);
    Ok((Some(reason.to_owned()), since))
}

/// One set's page as the members script returns it: `(member, count)` pairs and, per
/// member, its live leases, health, scheduled return and last check.
pub(super) struct SetPage {
    pub(super) pairs: Value,
    pub(super) live: Value,
    pub(super) health: Value,
    pub(super) returns: Option<Value>,
    pub(super) checks: Value,
}

fn parse_health(value: &Value) -> Result<Health, StoreError> {
    if matches!(value, Value::Nil) {
        return Ok(Health::default());
    }
    let text = string(value.clone())?;
    let mut numbers = text.split(' ').map(str::parse::<u64>);
    let mut next = || {
        numbers
            .next()
            .and_then(Result::ok)
            .ok_or_else(|| unexpected("malformed health entry"))
    };
    Ok(Health {
        streak: next()?,
        trips: next()?,
        cooldown_ms: next()?,
    })
}

fn parse_last_check(value: Value) -> Result<Option<LastCheck>, StoreError> {
    if matches!(value, Value::Nil) {
        return Ok(None);
    }
    let text = string(value)?;
    let mut parts = text.splitn(3, ' ');
    let at = parts.next().and_then(|t| t.parse::<u64>().ok());
    let result = parts.next().and_then(OutcomeResult::from_name);
    match (at, result) {
        (Some(at), Some(result)) => Ok(Some(LastCheck {
            at: Timestamp(at),
            result,
            detail: parts.next().unwrap_or("").to_owned(),
        })),
        _ => Err(unexpected("malformed check entry")),
    }
}

pub(super) fn member_views(
    page: SetPage,
    infos: Option<Vec<Value>>,
) -> Result<Vec<MemberView>, StoreError> {
    let pairs = array(page.pairs)?;
    let mut live = array(page.live)?.into_iter();
    let mut health = array(page.health)?.into_iter();
    let mut checks = array(page.checks)?.into_iter();
    let mut returns = page.returns.map(array).transpose()?.map(Vec::into_iter);
    let mut infos = infos.map(Vec::into_iter);
    let mut views = Vec::with_capacity(pairs.len() / 2);
    let mut items = pairs.into_iter();
    while let Some(member) = items.next() {
        let member = MemberId::from_stored(string(member)?);
        let assignments = count(&next(&mut items)?)?;
        let in_flight = optional_count(&live.next().unwrap_or(Value::Nil))?.unwrap_or(0);
        let (state, (reason, since)) = match infos.as_mut() {
            None => (MemberState::Eligible, (None, None)),
            Some(infos) => (
                MemberState::Ineligible,
                parse_taken_out(infos.next().unwrap_or(Value::Nil))?,
            ),
        };
        let health = parse_health(&health.next().unwrap_or(Value::Nil))?;
        let returns_at = match returns.as_mut().and_then(Iterator::next) {
            Some(value) => optional_count(&value)?.map(Timestamp),
            None => None,
        };
        views.push(MemberView {
            member,
            state,
            assignments,
            in_flight,
            reason,
            since,
            consecutive_failures: health.streak,
            cooldown_ms: (health.trips > 0).then_some(health.cooldown_ms),
            returns_at,
            last_check: parse_last_check(checks.next().unwrap_or(Value::Nil))?,
        });
    }
    Ok(views)
}

/// The `expires_ms, ttl_ms` pair that ends the lease replies.
pub(super) fn lease_times(
    items: &mut impl Iterator<Item = Value>,
) -> Result<(Timestamp, LeaseTtl), StoreError> {
    let expires_at = Timestamp(count(&next(items)?)?);
    let ttl = LeaseTtl::from_millis(count(&next(items)?)?)
        .map_err(|_| unexpected("lease ttl out of range"))?;
    Ok((expires_at, ttl))
}

/// The status lease scripts put after the pool's: `0` means no live lease.
pub(super) fn lease_found(items: &mut impl Iterator<Item = Value>) -> Result<(), StoreError> {
    match int(&next(items)?)? {
        0 => Err(StoreError::LeaseNotFound),
        _ => Ok(()),
    }
}
