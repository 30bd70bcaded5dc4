//! `POST /pools/{pool}/import` (admin): a list of candidate proxies, filtered by the pool's
//! rules, seeded like `POST /pools/{pool}/members`, and answered with a report of what
//! became of every line.
//!
//! The list is read as it arrives (see [`import`]) and written in batches of
//! [`MAX_MEMBERS_PER_CALL`], one store call per batch, which the store splits further into
//! chunks sized by their measured cost (see [`crate::store::CHUNK_BUDGET`]). Each chunk is
//! atomic; the import as a whole is not: when the store fails part-way, the earlier chunks
//! stay, and running the same import again completes it (what was added reports as
//! existing). Every batch after the first starts its new members at the count the first
//! one used, so one import gives one starting count even while assignments go on.
//!
//! Only counts are logged, never a line: lines may hold credentials.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::hash::{BuildHasher, RandomState};

use std::future::Future;

use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};

use super::AppState;
use super::auth::Admin;
use super::error::ApiError;
use super::extract::{ListBody, ListKind, PoolPath, QueryWithLabels};
use super::log::set_outcome;
use super::members::MAX_MEMBERS_PER_CALL;
use crate::domain::{Labels, MemberId, PoolId, Rejection, Rules, Scheme, mask_credentials};
use crate::geoip::GeoIp;
use crate::store::{ImportCounts, Seed, SeedOrigin, Store};

/// Most examples of rejected lines a report shows.
pub const MAX_EXAMPLES: usize = 20;

/// Query of `POST /pools/{pool}/import`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImportQuery {
    /// Scheme of the lines that name none.
    #[serde(default)]
    default_scheme: Scheme,
    /// Report without writing.
    #[serde(default)]
    dry_run: bool,
}

/// What an import did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ImportReport {
    /// Distinct candidates that passed the rules: `added` + `existing`.
    pub accepted: u64,
    /// Accepted candidates that were not in the pool and now are (or would be, in a dry run).
    pub added: u64,
    /// Accepted candidates already in the pool, left untouched.
    pub existing: u64,
    /// Lines that repeated a candidate seen earlier in the same list (after
    /// canonicalisation).
    pub duplicates: u64,
    /// Rejected lines per reason code.
    pub rejected: BTreeMap<&'static str, u64>,
    /// The first rejected lines, at most [`MAX_EXAMPLES`], in line order.
    pub examples: Vec<Example>,
}

impl ImportReport {
    /// The report's counts, rejections summed over their reasons.
    pub fn counts(&self) -> ImportCounts {
        ImportCounts {
            accepted: self.accepted,
            added: self.added,
            existing: self.existing,
            duplicates: self.duplicates,
            rejected: self.rejected.values().sum(),
        }
    }
}

/// One rejected line, with its credentials masked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Example {
    /// 1-based line number (element number for a JSON array).
    pub line: usize,
    /// The line, trimmed, credentials masked, cut when long.
    pub input: String,
    /// The reason code.
    pub reason: &'static str,
    /// What to change in the pool's rules to accept the line, when a rule refused it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hint: Option<&'static str>,
}

impl Example {
    /// Line `line`, written `input`, refused for `reason`; the input's credentials masked.
    pub fn new(line: usize, input: &str, reason: Rejection) -> Self {
        Self {
            line,
            input: mask_credentials(input),
            reason: reason.code(),
            hint: reason.hint(),
        }
    }
}

/// Accepted members in list order, each with the line it first appeared on and that line.
type Batch = Vec<(MemberId, usize, String)>;

/// A list read against a pool's rules as it arrives: the accepted members not yet written,
/// and what became of the other lines.
///
/// Repeats are found by a 64-bit keyed hash of each accepted member (drawn afresh for
/// every import), not by the members themselves: 8 bytes a member instead of the member,
/// which keeps an import's memory within twice its list. Two distinct members of one list
/// share a hash with a chance of about n² / 2⁶⁵ (one in ten million for three million
/// members); the second would be counted as a duplicate.
#[derive(Debug)]
struct Plan {
    rules: Rules,
    default_scheme: Scheme,
    /// Accepted members not yet handed to the store.
    members: Batch,
    seen: HashSet<u64>,
    keys: RandomState,
    /// Lines read so far.
    lines: usize,
    duplicates: u64,
    rejected: BTreeMap<&'static str, u64>,
    examples: Vec<Example>,
}

impl Plan {
    fn new(rules: Rules, default_scheme: Scheme) -> Self {
        Self {
            rules,
            default_scheme,
            members: Vec::new(),
            seen: HashSet::new(),
            keys: RandomState::new(),
            lines: 0,
            duplicates: 0,
            rejected: BTreeMap::new(),
            examples: Vec::new(),
        }
    }

    /// Reads the next line of a `text/plain` list (without its `\n`).
    fn text_line(&mut self, raw: &[u8]) {
        self.lines += 1;
        let raw = raw.strip_suffix(b"\r").unwrap_or(raw);
        match std::str::from_utf8(raw) {
            Ok(text) => self.line(text),
            Err(_) => self.reject(
                self.lines,
                String::from_utf8_lossy(raw).trim_ascii(),
                Rejection::Unparsable,
            ),
        }
    }

    /// Reads a piece of a `text/plain` list; `partial` holds the start of a line a
    /// previous piece ended in, and keeps the end of this one.
    fn text_piece(&mut self, partial: &mut Vec<u8>, piece: &[u8]) {
        let mut rest = piece;
        while let Some(end) = rest.iter().position(|b| *b == b'\n') {
            if partial.is_empty() {
                self.text_line(&rest[..end]);
            } else {
                partial.extend_from_slice(&rest[..end]);
                let line = std::mem::take(partial);
                self.text_line(&line);
                *partial = line;
                partial.clear();
            }
            rest = &rest[end + 1..];
        }
        partial.extend_from_slice(rest);
    }

    /// Reads the next element of a JSON list.
    fn json_element(&mut self, text: &str) {
        self.lines += 1;
        self.line(text);
    }

    fn line(&mut self, text: &str) {
        let text = text.trim_ascii();
        if text.is_empty() || text.starts_with('#') {
            return;
        }
        match self.rules.admit_line(text, self.default_scheme) {
            Ok(member) => {
                if self.seen.insert(self.keys.hash_one(&member)) {
                    self.members.push((member, self.lines, text.to_owned()));
                } else {
                    self.duplicates += 1;
                }
            }
            Err(reason) => self.reject(self.lines, text, reason),
        }
    }

    fn reject(&mut self, line: usize, input: &str, reason: Rejection) {
        *self.rejected.entry(reason.code()).or_default() += 1;
        if self.examples.len() < MAX_EXAMPLES {
            self.examples.push(Example::new(line, input, reason));
        }
    }

    /// The next batch to write, once a whole one is ready (or whatever is left, `last`).
    fn batch(&mut self, last: bool) -> Option<Batch> {
        if self.members.len() >= MAX_MEMBERS_PER_CALL {
            let rest = self.members.split_off(MAX_MEMBERS_PER_CALL);
            Some(std::mem::replace(&mut self.members, rest))
        } else if last && !self.members.is_empty() {
            Some(std::mem::take(&mut self.members))
        } else {
            None
        }
    }
}

/// Writes an import's batches, one store call each, and keeps what they did.
struct Writer<'a> {
    store: &'a dyn Store,
    pool: &'a PoolId,
    dry_run: bool,
    origin: SeedOrigin,
    /// The count the first batch started its new members at, for the later ones.
    start: Option<u64>,
    pending_adds: u64,
    /// Labels for every imported member, replacing their own (none given: left alone).
    labels: Labels,
    /// The GeoIP file.
    geoip: GeoIp,
    added: u64,
    existing: u64,
    /// New members refused because the pool is full, counted apart from the parser's
    /// rejections and with examples of their own: merged at the end, the two sets give
    /// the first 20 rejected lines overall.
    full: u64,
    full_examples: Vec<Example>,
}

impl Writer<'_> {
    async fn write(&mut self, batch: Batch) -> Result<(), ApiError> {
        let seed = Seed {
            assignments: self.start,
            dry_run: self.dry_run,
            pending_adds: self.pending_adds,
            origin: self.origin,
            labels: if self.labels.is_empty() {
                HashMap::new()
            } else {
                batch
                    .iter()
                    .map(|(member, ..)| (member.clone(), self.labels.clone()))
                    .collect()
            },
            geo: batch
                .iter()
                .filter_map(|(member, ..)| {
                    Some((member.clone(), self.geoip.lookup_member(member)?))
                })
                .collect(),
            ..Seed::new(batch.iter().map(|(member, ..)| member.clone()).collect())
        };
        let outcome = self.store.add_members(self.pool, &seed).await?;
        self.start = Some(outcome.start_assignments);
        self.added += outcome.added.len() as u64;
        self.existing += outcome.existing.len() as u64;
        if self.dry_run {
            self.pending_adds += outcome.added.len() as u64;
        }
        // `full` is in request order, a subsequence of the batch: one pass finds the lines.
        let mut full = outcome.full.iter().peekable();
        for (member, line, input) in &batch {
            if full.next_if(|refused| *refused == member).is_some() {
                self.full += 1;
                if self.full_examples.len() < MAX_EXAMPLES {
                    self.full_examples
                        .push(Example::new(*line, input, Rejection::PoolFull));
                }
            }
        }
        Ok(())
    }
}

/// Reads a JSON list element by element, handing each to `element`, without holding the
/// elements: a visitor of the array's sequence.
fn read_json_list(
    bytes: &[u8],
    element: impl FnMut(&str) -> bool,
) -> Result<(), serde_json::Error> {
    struct Elements<F>(F);

    impl<'de, F: FnMut(&str) -> bool> serde::de::Visitor<'de> for Elements<F> {
        type Value = ();

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("an array of strings")
        }

        fn visit_seq<A: serde::de::SeqAccess<'de>>(mut self, mut seq: A) -> Result<(), A::Error> {
            while let Some(text) = seq.next_element::<std::borrow::Cow<'de, str>>()? {
                if !(self.0)(&text) {
                    break;
                }
            }
            Ok(())
        }
    }

    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    serde::Deserializer::deserialize_seq(&mut deserializer, Elements(element))?;
    deserializer.end()
}

/// What an import is asked to do besides reading its list.
#[derive(Debug, Clone)]
pub struct ImportRequest {
    /// Scheme of the lines that name none.
    pub default_scheme: Scheme,
    /// Report without writing.
    pub dry_run: bool,
    /// Labels for every imported member, replacing their own (none given: left alone).
    pub labels: Labels,
    /// The GeoIP file, which gives members labels for their own addresses.
    pub geoip: GeoIp,
    /// Where the new members come from (the route: [`SeedOrigin::Import`]).
    pub origin: SeedOrigin,
}

/// A list as an import reads it: pieces, as they arrive.
pub trait ListPieces: Send {
    /// The next piece, `None` at the end of the list.
    ///
    /// # Errors
    /// When the list cannot be read (too large, too slow, cut off).
    fn next_piece(&mut self) -> impl Future<Output = Result<Option<Bytes>, ApiError>> + Send;
}

impl ListPieces for ListBody {
    fn next_piece(&mut self) -> impl Future<Output = Result<Option<Bytes>, ApiError>> + Send {
        ListBody::next_piece(self)
    }
}

/// A list already read whole (a source's fetched body): one piece.
#[derive(Debug)]
pub struct WholeList(pub Option<Bytes>);

impl ListPieces for WholeList {
    fn next_piece(&mut self) -> impl Future<Output = Result<Option<Bytes>, ApiError>> + Send {
        std::future::ready(Ok(self.0.take()))
    }
}

/// Most bytes of a `text/plain` list read in one go (about 3,000 lines): a source's list
/// arrives as one piece of up to the largest accepted size, and its batches are written
/// as they fill rather than after the whole list is read.
const PARSE_PIECE: usize = 64 * 1024;

/// Reads `piece` of a `text/plain` list into `plan` on a blocking thread, not on the
/// runtime's: every line is parsed, canonicalised and checked against the pool's rules, and
/// on a runtime thread every request that thread would have answered meanwhile (the
/// assigns of every other pool) waited for the piece in hand.
async fn read_text_apart(mut plan: Plan, mut partial: Vec<u8>, piece: Bytes) -> (Plan, Vec<u8>) {
    tokio::task::spawn_blocking(move || {
        plan.text_piece(&mut partial, &piece);
        (plan, partial)
    })
    .await
    // A panic while reading is a bug; it unwinds here as it would have inline.
    .unwrap_or_else(|error| std::panic::resume_unwind(error.into_panic()))
}

async fn read_whole(list: &mut impl ListPieces) -> Result<Vec<u8>, ApiError> {
    let mut whole = Vec::new();
    while let Some(piece) = list.next_piece().await? {
        whole.extend_from_slice(&piece);
    }
    Ok(whole)
}

/// Imports a list of candidates into the pool (or, with `dry_run`, reports what an import
/// would do).
///
/// A `text/plain` list is read as it arrives, a piece of at most 64 KiB at a time on a
/// blocking thread, and written in batches of [`MAX_MEMBERS_PER_CALL`] as soon as each is
/// whole; a JSON array is read whole, then
/// element by element on a blocking thread that hands over each batch as it is whole. An
/// import's memory is its batch in flight, 8 bytes per distinct accepted member, and (for
/// JSON) the list itself. A list that fails part-way (too large, too slow, a JSON syntax
/// error) keeps the batches written before the failure, as a store failure does.
pub async fn import(
    _: Admin,
    State(state): State<AppState>,
    PoolPath(pool): PoolPath,
    QueryWithLabels(query, labels): QueryWithLabels<ImportQuery>,
    body: ListBody,
) -> Result<Response, ApiError> {
    let labels = Labels::from_pairs("label", labels.iter().map(String::as_str))
        .map_err(|e| ApiError::InvalidRequest(e.to_string()))?;
    let request = ImportRequest {
        default_scheme: query.default_scheme,
        dry_run: query.dry_run,
        labels,
        geoip: state.geoip.clone(),
        origin: SeedOrigin::Import,
    };
    let kind = body.kind;
    let report = import_list(&*state.store, &pool, request, kind, body).await?;
    let outcome = if query.dry_run { "dry_run" } else { "imported" };
    let response = axum::Json(report).into_response();
    set_outcome(outcome);
    Ok(response)
}

/// The one path of every import, the route's and the sources': reads `list` against the
/// pool's rules, writes its batches (see [`import`] for how), logs the counts and counts
/// the lines in `/metrics`.
///
/// # Errors
/// The list's own errors (too large, too slow, invalid JSON) and the store's; the batches
/// written before either stay.
pub async fn import_list(
    store: &dyn Store,
    pool: &PoolId,
    request: ImportRequest,
    kind: ListKind,
    mut list: impl ListPieces,
) -> Result<ImportReport, ApiError> {
    let rules = store.pool(pool).await?.config.rules;
    let mut plan = Plan::new(rules, request.default_scheme);
    let mut writer = Writer {
        store,
        pool,
        dry_run: request.dry_run,
        origin: request.origin,
        start: None,
        pending_adds: 0,
        labels: request.labels,
        geoip: request.geoip,
        added: 0,
        existing: 0,
        full: 0,
        full_examples: Vec::new(),
    };
    match kind {
        ListKind::Text => {
            let mut partial = Vec::new();
            while let Some(mut piece) = list.next_piece().await? {
                while !piece.is_empty() {
                    let part = piece.split_to(piece.len().min(PARSE_PIECE));
                    (plan, partial) = read_text_apart(plan, partial, part).await;
                    while let Some(batch) = plan.batch(false) {
                        writer.write(batch).await?;
                    }
                }
            }
            // What follows the last line end is a line too (empty after a final newline).
            plan.text_line(&partial);
        }
        ListKind::Json => {
            let bytes = read_whole(&mut list).await?;
            let (batches, mut ready) = tokio::sync::mpsc::channel::<Batch>(1);
            let planning = tokio::task::spawn_blocking(move || {
                let parsed = read_json_list(&bytes, |text| {
                    plan.json_element(text);
                    // Stops reading once the writer has given up.
                    plan.batch(false)
                        .is_none_or(|batch| batches.blocking_send(batch).is_ok())
                });
                (plan, parsed)
            });
            let mut written = Ok(());
            while let Some(batch) = ready.recv().await {
                written = writer.write(batch).await;
                if written.is_err() {
                    break;
                }
            }
            drop(ready);
            // A panic while planning is a bug; it unwinds here as it would have inline.
            let (done, parsed) = planning
                .await
                .unwrap_or_else(|error| std::panic::resume_unwind(error.into_panic()));
            written?;
            parsed.map_err(|error| ApiError::InvalidJson(error.to_string()))?;
            plan = done;
        }
    }
    if let Some(batch) = plan.batch(true) {
        writer.write(batch).await?;
    }

    let mut examples = std::mem::take(&mut plan.examples);
    examples.extend(std::mem::take(&mut writer.full_examples));
    examples.sort_by_key(|example| example.line);
    examples.truncate(MAX_EXAMPLES);
    let mut rejected = std::mem::take(&mut plan.rejected);
    if writer.full > 0 {
        *rejected.entry(Rejection::PoolFull.code()).or_default() += writer.full;
    }
    let report = ImportReport {
        accepted: writer.added + writer.existing,
        added: writer.added,
        existing: writer.existing,
        duplicates: plan.duplicates,
        rejected,
        examples,
    };

    let rejected: u64 = report.rejected.values().sum();
    tracing::info!(
        pool = pool.as_str(),
        dry_run = request.dry_run,
        accepted = report.accepted,
        added = report.added,
        existing = report.existing,
        duplicates = report.duplicates,
        rejected,
        "import"
    );
    if !request.dry_run {
        let lines = [
            ("added", report.added),
            ("existing", report.existing),
            ("duplicate", report.duplicates),
        ];
        for (outcome, n) in lines {
            metrics::counter!("pa_import_lines_total", "outcome" => outcome).increment(n);
        }
        for (reason, n) in &report.rejected {
            // Reasons are the parser's fixed set of codes, so the series stay bounded.
            metrics::counter!("pa_import_lines_total", "outcome" => reason.to_string())
                .increment(*n);
        }
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads `text` in pieces of 7 bytes, so that lines span pieces.
    fn plan_text(text: &[u8], rules: &Rules) -> Plan {
        let mut plan = Plan::new(rules.clone(), Scheme::Http);
        let mut partial = Vec::new();
        for piece in text.chunks(7) {
            plan.text_piece(&mut partial, piece);
        }
        plan.text_line(&partial);
        plan
    }

    #[test]
    fn a_list_is_read_line_by_line_skipping_blanks_and_comments() {
        let text = b"# free proxies\r\n1.2.3.4:8080\r\n\r\n   \n  HTTP://1.2.3.4:8080/  \n\
            10.0.0.5:80\nu:secret@127.0.0.1:6379\n\xff\xfe1.2.3.4:80\n8.8.8.8:3128:me:pw\n";
        let plan = plan_text(text, &Rules::default());
        let members: Vec<(&str, usize)> = plan
            .members
            .iter()
            .map(|(member, line, _)| (member.as_str(), *line))
            .collect();
        assert_eq!(
            members,
            [("http://1.2.3.4:8080", 2), ("http://me:pw@8.8.8.8:3128", 9)]
        );
        assert_eq!(plan.duplicates, 1);
        assert_eq!(
            plan.rejected,
            BTreeMap::from([("private_address", 2), ("unparsable", 1)])
        );
        assert_eq!(
            plan.examples,
            [
                Example {
                    line: 6,
                    input: "10.0.0.5:80".to_owned(),
                    reason: "private_address",
                    hint: Some("set rules.allow_private to accept private and loopback addresses"),
                },
                Example {
                    line: 7,
                    input: "u:***@127.0.0.1:6379".to_owned(),
                    reason: "private_address",
                    hint: Some("set rules.allow_private to accept private and loopback addresses"),
                },
                Example {
                    line: 8,
                    input: "\u{fffd}\u{fffd}1.2.3.4:80".to_owned(),
                    reason: "unparsable",
                    hint: None,
                },
            ]
        );
    }

    #[test]
    fn a_report_keeps_only_the_first_twenty_examples() {
        let text: String = (0..100).map(|i| format!("bad line {i}\n")).collect();
        let plan = plan_text(text.as_bytes(), &Rules::default());
        assert_eq!(plan.rejected, BTreeMap::from([("unparsable", 100)]));
        assert_eq!(plan.examples.len(), MAX_EXAMPLES);
        assert_eq!(plan.examples[19].line, 20);
    }
}
