//! The embedded store's labels: each member's labels and the two indexes built on them,
//! kept in step by `Pool::unplace` and `Pool::place` exactly as `scripts/labels.lua` keeps
//! the Redis ones.
//!
//! - `eligible`: per key, per value, the eligible members carrying it in the choosing order
//!   (`(live leases on least-in-flight pools else 0, assignments, id)`): its first entry is
//!   the choice of an assign filtering on that one label. Two levels of maps rather than
//!   one keyed `key=value`, so that an assign finds a set from the filter's strings, and
//!   moves a member's entries from its labels, without building a key.
//! - `members`: per `key=value`, every member carrying it, by id, for listings.

use std::collections::{BTreeSet, HashMap};

use super::{Holds, Pool};
use crate::domain::{LabelFilter, Labels, MemberId, Policy, Timestamp};
use crate::store::{
    Cursor, MAX_LABEL_CHECKS, MAX_LISTING_SCAN, MemberPage, StateFilter, StoreError,
};

/// A place in the choosing order: `(live leases or 0, assignments, member)`.
pub(super) type OrderEntry = (u64, u64, MemberId);

/// Each member's labels and the indexes over them.
#[derive(Debug, Default)]
pub(super) struct LabelIndex {
    /// Members with labels; members without any are absent.
    pub(super) of: HashMap<MemberId, Labels>,
    eligible: HashMap<String, HashMap<String, BTreeSet<OrderEntry>>>,
    members: HashMap<String, BTreeSet<MemberId>>,
}

impl Pool {
    /// Where an eligible member stands in the choosing order; `None` when not eligible.
    fn label_key(&self, member: &MemberId) -> Option<(u64, u64, MemberId)> {
        let assignments = self.eligible.get(member)?;
        let live = if self.config.policy == Policy::LeastInFlight {
            self.in_flight_of(member)
        } else {
            0
        };
        Some((live, assignments, member.clone()))
    }

    /// Takes an eligible member out of the label index, before its numbers change.
    pub(super) fn unlabel(&mut self, member: &MemberId) {
        if self.labels.of.is_empty() {
            return;
        }
        let Some(key) = self.label_key(member) else {
            return;
        };
        let LabelIndex { of, eligible, .. } = &mut self.labels;
        for (name, value) in of.get(member).into_iter().flat_map(Labels::iter) {
            if let Some(values) = eligible.get_mut(name)
                && let Some(set) = values.get_mut(value)
            {
                set.remove(&key);
                if set.is_empty() {
                    values.remove(value);
                    if values.is_empty() {
                        eligible.remove(name);
                    }
                }
            }
        }
    }

    /// Puts an eligible member back into the label index with its current numbers.
    pub(super) fn label(&mut self, member: &MemberId) {
        if self.labels.of.is_empty() {
            return;
        }
        let Some(key) = self.label_key(member) else {
            return;
        };
        let LabelIndex { of, eligible, .. } = &mut self.labels;
        for (name, value) in of.get(member).into_iter().flat_map(Labels::iter) {
            eligible_set(eligible, name, value).insert(key.clone());
        }
    }

    /// Moves an eligible member of a least-used pool from `before` assignments to `after` in
    /// the label index, as `unlabel` then `label` would, but without a copy of its id per
    /// label: each entry is taken out and put back with the new count. Answers the id.
    pub(super) fn recount_labels(&mut self, member: MemberId, before: u64, after: u64) -> MemberId {
        let LabelIndex { of, eligible, .. } = &mut self.labels;
        let Some(labels) = of.get(&member) else {
            return member;
        };
        let probe: OrderEntry = (0, before, member);
        for (name, value) in labels.iter() {
            let set = eligible_set(eligible, name, value);
            match set.take(&probe) {
                Some(mut entry) => {
                    entry.1 = after;
                    set.insert(entry);
                }
                // It was not eligible before: `label` would put it in now.
                None => {
                    set.insert((0, after, probe.2.clone()));
                }
            }
        }
        probe.2
    }

    /// The choice of an assign filtering on one key with nothing held back: the first entry
    /// of the values' sets, the least of them with several values (a member has one value
    /// per key, so the sets share none). `None` when the filter has several keys, which
    /// `pick_labelled` walks; `Some(None)` when no eligible member carries the label.
    pub(super) fn first_labelled(&self, filter: &LabelFilter) -> Option<Option<&OrderEntry>> {
        let mut groups = filter.groups();
        let (name, values) = groups.next()?;
        if groups.next().is_some() {
            return None;
        }
        let sets = self.labels.eligible.get(name);
        Some(
            values
                .iter()
                .filter_map(|value| sets.and_then(|sets| sets.get(value.as_str())))
                .filter_map(BTreeSet::first)
                .min(),
        )
    }

    /// Replaces a member's operator labels (`operator`) or its labels from the GeoIP file
    /// (`geo`), each `None` to keep that part, as `relabel` in `scripts/labels.lua` does.
    pub(super) fn relabel(
        &mut self,
        member: &MemberId,
        operator: Option<&Labels>,
        geo: Option<&Labels>,
    ) {
        let old = self.labels.of.get(member).cloned().unwrap_or_default();
        let (old_operator, old_geo) = old.clone().split_geo();
        let new = operator
            .unwrap_or(&old_operator)
            .merged(geo.unwrap_or(&old_geo));
        if new != old {
            self.set_labels(member, new);
        }
    }

    /// Replaces a member's labels; its count and state stay.
    pub(super) fn set_labels(&mut self, member: &MemberId, labels: Labels) {
        self.drop_labels(member);
        if labels.is_empty() {
            return;
        }
        if labels.country_mismatch() {
            self.country_mismatches += 1;
        }
        for pair in labels.pairs() {
            self.labels
                .members
                .entry(pair)
                .or_default()
                .insert(member.clone());
        }
        self.labels.of.insert(member.clone(), labels);
        self.label(member);
    }

    /// Forgets a member's labels, before it leaves the pool.
    pub(super) fn drop_labels(&mut self, member: &MemberId) {
        self.unlabel(member);
        let Some(old) = self.labels.of.remove(member) else {
            return;
        };
        if old.country_mismatch() {
            self.country_mismatches = self.country_mismatches.saturating_sub(1);
        }
        for pair in old.pairs() {
            if let Some(set) = self.labels.members.get_mut(&pair) {
                set.remove(member);
                if set.is_empty() {
                    self.labels.members.remove(&pair);
                }
            }
        }
    }

    /// The first `wanted` eligible members in the choosing order that pass `filter`, in
    /// that order, by the rule of `pick_labelled` in `scripts/labels.lua`: with one key
    /// and nothing held, the first entries of each value's set; otherwise a walk over the
    /// key with the fewest entries that checks at most [`MAX_LABEL_CHECKS`] candidates.
    /// With `holds`, members banned for the request's target, resting or excluded are
    /// skipped, each counting as a check; the earliest time one of those that pass the
    /// filter becomes eligible by itself (see `Pool::wait_counts`; an excluded member never
    /// does) comes second.
    pub(super) fn pick_labelled(
        &self,
        filter: &LabelFilter,
        holds: Option<&Holds<'_>>,
        wanted: usize,
    ) -> Result<(Vec<OrderEntry>, Option<Timestamp>), StoreError> {
        let banned_until =
            |member: &MemberId| holds.and_then(|holds| self.held_until(holds, member));
        let mut earliest: Option<Timestamp> = None;
        let groups: Vec<(&str, &[String])> = filter.groups().collect();
        let set = |key: &str, value: &str| {
            self.labels
                .eligible
                .get(key)
                .and_then(|values| values.get(value))
        };
        let size = |(key, values): &(&str, &[String])| -> usize {
            values
                .iter()
                .map(|v| set(key, v).map_or(0, BTreeSet::len))
                .sum()
        };
        let Some(walk) = (0..groups.len()).min_by_key(|&i| size(&groups[i])) else {
            return Ok((Vec::new(), None));
        };
        let (key, values) = groups[walk];
        let mut found: Vec<&(u64, u64, MemberId)> = Vec::new();
        let mut checked = 0u64;
        for value in values {
            let Some(entries) = set(key, value) else {
                continue;
            };
            let mut taken = 0;
            for entry in entries {
                if taken == wanted {
                    break;
                }
                if groups.len() > 1 || holds.is_some() {
                    checked += 1;
                    if checked > MAX_LABEL_CHECKS {
                        return Err(StoreError::FilterTooCostly);
                    }
                    if !self
                        .labels
                        .of
                        .get(&entry.2)
                        .is_some_and(|labels| labels.matches(filter))
                    {
                        continue;
                    }
                    if let Some(held_back) = banned_until(&entry.2) {
                        // Only a member that is eligible once its hold ends makes a 204
                        // wait (see `Pool::wait_counts`).
                        if self.wait_counts(entry.0) {
                            earliest = held_back.earliest(earliest);
                        }
                        continue;
                    }
                }
                found.push(entry);
                taken += 1;
            }
        }
        // Each set is in order already; with several values, merge them. A member has one
        // value per key, so the sets never share a member.
        found.sort();
        found.truncate(wanted);
        Ok((found.into_iter().cloned().collect(), earliest))
    }

    /// A page of the members sharing their exit address (see `Store::shared_exit_members`):
    /// the eligible set from `cursor.eligible` on, then the ineligible one, walking at most
    /// [`MAX_LISTING_SCAN`] members, as `members.lua` does.
    pub(super) fn shared_exit_page(
        &self,
        state: StateFilter,
        limit: usize,
        cursor: Cursor,
    ) -> MemberPage {
        let mut members = Vec::new();
        let mut budget = MAX_LISTING_SCAN;
        let mut next = cursor;
        let mut stopped = false;
        for eligible in [true, false] {
            let wanted = if eligible {
                state != StateFilter::Ineligible
            } else {
                state != StateFilter::Eligible
            };
            if !wanted || stopped {
                continue;
            }
            let (set, position) = if eligible {
                (&self.eligible, &mut next.eligible)
            } else {
                (&self.ineligible, &mut next.ineligible)
            };
            let skip = usize::try_from(*position).unwrap_or(usize::MAX);
            for (count, member) in set.order.iter().skip(skip) {
                if members.len() == limit || budget == 0 {
                    stopped = true;
                    break;
                }
                budget -= 1;
                *position += 1;
                if self.shares_exit(member) {
                    members.push(if eligible {
                        self.view_eligible(member, *count)
                    } else {
                        self.view_ineligible(member, *count)
                    });
                }
            }
            // A set walked to its end leaves `stopped` false: the walk goes on to the next.
        }
        MemberPage {
            members,
            next: stopped.then_some(next),
        }
    }

    /// A page of a listing with a label filter (see `Store::members`).
    pub(super) fn labelled_page(
        &self,
        state: StateFilter,
        filter: &LabelFilter,
        limit: usize,
        cursor: Cursor,
    ) -> MemberPage {
        let mut eligible = Vec::new();
        let mut ineligible = Vec::new();
        let mut position = 0u64;
        let mut budget = MAX_LISTING_SCAN;
        let mut next = None;
        if let Some((key, values)) = filter.groups().next() {
            'walk: for value in values {
                let Some(set) = self.labels.members.get(&format!("{key}={value}")) else {
                    continue;
                };
                let total = set.len() as u64;
                if cursor.eligible >= position + total {
                    position += total;
                    continue;
                }
                let start = cursor.eligible.saturating_sub(position);
                position += start;
                for member in set
                    .iter()
                    .skip(usize::try_from(start).unwrap_or(usize::MAX))
                {
                    if eligible.len() + ineligible.len() == limit || budget == 0 {
                        next = Some(position);
                        break 'walk;
                    }
                    budget -= 1;
                    position += 1;
                    if !self
                        .labels
                        .of
                        .get(member)
                        .is_some_and(|labels| labels.matches(filter))
                    {
                        continue;
                    }
                    if let Some(count) = self.eligible.get(member) {
                        if state != StateFilter::Ineligible {
                            eligible.push(self.view_eligible(member, count));
                        }
                    } else if let Some(count) = self.ineligible.get(member)
                        && state != StateFilter::Eligible
                    {
                        ineligible.push(self.view_ineligible(member, count));
                    }
                }
            }
        }
        crate::store::labelled_page(eligible, ineligible, filter, next)
    }
}

/// The set of `name=value` in `eligible`, made when it is missing; the key strings are
/// copied only then. (The `expect`s cannot fail: each key was inserted just above when
/// missing; the entry API would copy the key on every call.)
fn eligible_set<'a>(
    eligible: &'a mut HashMap<String, HashMap<String, BTreeSet<OrderEntry>>>,
    name: &str,
    value: &str,
) -> &'a mut BTreeSet<OrderEntry> {
    if !eligible.contains_key(name) {
        eligible.insert(name.to_owned(), HashMap::new());
    }
    let values = eligible.get_mut(name).expect("inserted above");
    if !values.contains_key(value) {
        values.insert(value.to_owned(), BTreeSet::new());
    }
    values.get_mut(value).expect("inserted above")
}
