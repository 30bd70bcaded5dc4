//! `POST /pools/{pool}/import` (admin): a list of candidate proxies, filtered by the pool's
//! rules, seeded like `POST /pools/{pool}/members`, and answered with a report of what
//! became of every line.
//!
//! The list is read and checked in full before anything is written (on a blocking thread:
//! a 32 MiB list is a lot of parsing), then written in chunks of
//! [`MAX_MEMBERS_PER_CALL`], one store call per chunk. Each chunk is atomic; the import as
//! a whole is not: when the store fails part-way, the earlier chunks stay, and running the
//! same import again completes it (what was added reports as existing). Every chunk after
//! the first starts its new members at the count the first one used, so one import gives
//! one starting count even while assignments go on.
//!
//! Only counts are logged, never a line: lines may hold credentials.

use std::collections::{BTreeMap, HashMap, HashSet};

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};

use super::AppState;
use super::auth::Admin;
use super::error::ApiError;
use super::extract::{ListBody, PoolPath, QueryWithLabels};
use super::log::Outcome;
use super::members::MAX_MEMBERS_PER_CALL;
use crate::domain::{Labels, MemberId, Rejection, Rules, Scheme, mask_credentials};
use crate::store::Seed;

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

/// One rejected line, with its credentials masked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Example {
    /// 1-based line number (element number for a JSON array).
    pub line: usize,
    /// The line, trimmed, credentials masked, cut when long.
    pub input: String,
    /// The reason code.
    pub reason: &'static str,
}

/// A list read against a pool's rules, before anything is written.
#[derive(Debug, Default)]
struct Plan {
    /// Distinct accepted members in list order, each with the line it first appeared on.
    members: Vec<(MemberId, usize, String)>,
    duplicates: u64,
    rejected: BTreeMap<&'static str, u64>,
    examples: Vec<Example>,
}

impl Plan {
    fn read(body: &ListBody, rules: &Rules, default_scheme: Scheme) -> Self {
        let mut plan = Self::default();
        let mut seen = HashSet::new();
        match body {
            ListBody::Text(bytes) => {
                for (index, raw) in bytes.split(|b| *b == b'\n').enumerate() {
                    let raw = raw.strip_suffix(b"\r").unwrap_or(raw);
                    match std::str::from_utf8(raw) {
                        Ok(text) => plan.line(rules, default_scheme, &mut seen, index + 1, text),
                        Err(_) => plan.reject(
                            index + 1,
                            String::from_utf8_lossy(raw).trim_ascii(),
                            Rejection::Unparsable,
                        ),
                    }
                }
            }
            ListBody::Json(items) => {
                for (index, text) in items.iter().enumerate() {
                    plan.line(rules, default_scheme, &mut seen, index + 1, text);
                }
            }
        }
        plan
    }

    fn line(
        &mut self,
        rules: &Rules,
        default_scheme: Scheme,
        seen: &mut HashSet<MemberId>,
        line: usize,
        text: &str,
    ) {
        let text = text.trim_ascii();
        if text.is_empty() || text.starts_with('#') {
            return;
        }
        match rules.admit_line(text, default_scheme) {
            Ok(member) if seen.insert(member.clone()) => {
                self.members.push((member, line, text.to_owned()));
            }
            Ok(_) => self.duplicates += 1,
            Err(reason) => self.reject(line, text, reason),
        }
    }

    fn reject(&mut self, line: usize, input: &str, reason: Rejection) {
        *self.rejected.entry(reason.code()).or_default() += 1;
        if self.examples.len() < MAX_EXAMPLES {
            self.examples.push(Example {
                line,
                input: mask_credentials(input),
                reason: reason.code(),
            });
        }
    }
}

/// Imports a list of candidates into the pool (or, with `dry_run`, reports what an import
/// would do).
pub async fn import(
    _: Admin,
    State(state): State<AppState>,
    PoolPath(pool): PoolPath,
    QueryWithLabels(query, labels): QueryWithLabels<ImportQuery>,
    body: ListBody,
) -> Result<Response, ApiError> {
    let labels = Labels::from_pairs("label", labels.iter().map(String::as_str))
        .map_err(|e| ApiError::InvalidRequest(e.to_string()))?;
    let rules = state.store.pool(&pool).await?.config.rules;
    let default_scheme = query.default_scheme;
    let planning =
        tokio::task::spawn_blocking(move || Plan::read(&body, &rules, default_scheme)).await;
    // A panic while planning is a bug; it unwinds here as it would have inline.
    let mut plan = planning.unwrap_or_else(|error| std::panic::resume_unwind(error.into_panic()));
    // The members leave the plan so that pool_full lines can still be recorded in it, and
    // its examples are set aside so that those lines get their own first 20: merged below,
    // the two sets give the first 20 rejected lines overall.
    let members = std::mem::take(&mut plan.members);
    let parse_examples = std::mem::take(&mut plan.examples);

    let mut report = ImportReport {
        duplicates: plan.duplicates,
        ..ImportReport::default()
    };
    let mut start = None;
    let mut pending_adds = 0;
    for chunk in members.chunks(MAX_MEMBERS_PER_CALL) {
        let seed = Seed {
            assignments: start,
            dry_run: query.dry_run,
            pending_adds,
            // Every imported member gets the call's labels (replacing its own), when given.
            labels: if labels.is_empty() {
                HashMap::new()
            } else {
                chunk
                    .iter()
                    .map(|(member, ..)| (member.clone(), labels.clone()))
                    .collect()
            },
            ..Seed::new(chunk.iter().map(|(member, ..)| member.clone()).collect())
        };
        let outcome = state.store.add_members(&pool, &seed).await?;
        start = Some(outcome.start_assignments);
        report.added += outcome.added.len() as u64;
        report.existing += outcome.existing.len() as u64;
        if query.dry_run {
            pending_adds += outcome.added.len() as u64;
        }
        // `full` is in request order, a subsequence of the chunk: one pass finds the lines.
        let mut full = outcome.full.iter().peekable();
        for (member, line, input) in chunk {
            if full.next_if(|refused| *refused == member).is_some() {
                plan.reject(*line, input, Rejection::PoolFull);
            }
        }
    }
    plan.examples.extend(parse_examples);
    plan.examples.sort_by_key(|example| example.line);
    plan.examples.truncate(MAX_EXAMPLES);
    report.accepted = report.added + report.existing;
    report.rejected = plan.rejected;
    report.examples = plan.examples;

    let rejected: u64 = report.rejected.values().sum();
    tracing::info!(
        pool = pool.as_str(),
        dry_run = query.dry_run,
        accepted = report.accepted,
        added = report.added,
        existing = report.existing,
        duplicates = report.duplicates,
        rejected,
        "import"
    );
    if !query.dry_run {
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
    let outcome = if query.dry_run { "dry_run" } else { "imported" };
    let mut response = axum::Json(report).into_response();
    response.extensions_mut().insert(Outcome(outcome));
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan_text(text: &[u8], rules: &Rules) -> Plan {
        Plan::read(
            &ListBody::Text(axum::body::Bytes::copy_from_slice(text)),
            rules,
            Scheme::Http,
        )
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
                    reason: "private_address"
                },
                Example {
                    line: 7,
                    input: "u:***@127.0.0.1:6379".to_owned(),
                    reason: "private_address"
                },
                Example {
                    line: 8,
                    input: "\u{fffd}\u{fffd}1.2.3.4:80".to_owned(),
                    reason: "unparsable"
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
