//! The operator commands' human-readable output: tables and reports rendered from the
//! service's JSON answers.
//!
//! Rendering works on `serde_json::Value`s rather than the service's own types so that a
//! field the service adds later (a newer service, an older client) is shown, not lost.

use serde_json::Value;

use crate::domain::PoolId;

/// What a command prints, and the part of the request that was not applied, if any.
#[derive(Debug, PartialEq, Eq)]
pub struct Report {
    /// The text for standard output.
    pub text: String,
    /// A summary of the members that were unknown or rejected.
    pub partial: Option<String>,
}

impl Report {
    /// A report of a request applied in full.
    pub fn done(text: String) -> Self {
        Self {
            text,
            partial: None,
        }
    }
}

/// A value as a table cell: `-` for null or missing, strings as they are.
fn cell(value: &Value) -> String {
    match value {
        Value::Null => "-".to_owned(),
        Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}

/// A table with a header line; columns whose cells are all numbers (or `-`) are aligned
/// right, the others left. Every line ends without trailing spaces.
fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let width = |column: usize| {
        rows.iter()
            .map(|row| row[column].chars().count())
            .chain([headers[column].len()])
            .max()
            .unwrap_or(0)
    };
    let numeric = |column: usize| {
        !rows.is_empty()
            && rows
                .iter()
                .all(|row| row[column] == "-" || row[column].bytes().all(|b| b.is_ascii_digit()))
    };
    let columns: Vec<(usize, bool)> = (0..headers.len())
        .map(|column| (width(column), numeric(column)))
        .collect();
    let line = |cells: Vec<&str>| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&columns)
            .map(|(text, &(width, right))| {
                if right {
                    format!("{text:>width$}")
                } else {
                    format!("{text:<width$}")
                }
            })
            .collect();
        format!("{}\n", padded.join("  ").trim_end())
    };
    let mut out = line(headers.to_vec());
    for row in rows {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
    }
    out
}

/// `name  value` lines, names padded to one width.
fn key_values(pairs: &[(String, String)]) -> String {
    let width = pairs.iter().map(|(key, _)| key.len()).max().unwrap_or(0);
    pairs
        .iter()
        .map(|(key, value)| format!("{key:<width$}  {value}\n"))
        .collect()
}

/// The fields of `object`: those named in `order` first, in that order, then any others
/// in the order the answer has them.
fn ordered(object: &Value, order: &[&str]) -> Vec<(String, String)> {
    let Some(map) = object.as_object() else {
        return Vec::new();
    };
    let mut pairs: Vec<(String, String)> = order
        .iter()
        .filter_map(|key| map.get(*key).map(|value| ((*key).to_owned(), cell(value))))
        .collect();
    for (key, value) in map {
        if !order.contains(&key.as_str()) {
            flatten(key, value, &mut pairs);
        }
    }
    pairs
}

/// A nested object becomes one line per field (`health.cooldown_ms  60000`), so that a
/// table never holds a blob of JSON.
fn flatten(key: &str, value: &Value, pairs: &mut Vec<(String, String)>) {
    match value.as_object() {
        Some(fields) if !fields.is_empty() => {
            for (field, inner) in fields {
                flatten(&format!("{key}.{field}"), inner, pairs);
            }
        }
        _ => pairs.push((key.to_owned(), cell(value))),
    }
}

const CONFIG_ORDER: [&str; 5] = [
    "policy",
    "restore",
    "start_assignments",
    "lease_ttl_ms",
    "max_in_flight",
];

const STATS_ORDER: [&str; 7] = [
    "eligible",
    "ineligible",
    "in_flight",
    "min_assignments",
    "max_assignments",
    "total_assignments",
    "abandoned",
];

/// `pools list`: one line per pool.
pub fn pools(pools: &[Value]) -> String {
    if pools.is_empty() {
        return "no pools\n".to_owned();
    }
    let rows: Vec<Vec<String>> = pools
        .iter()
        .map(|info| {
            let stats = &info["stats"];
            vec![
                cell(&info["pool"]),
                cell(&info["config"]["policy"]),
                cell(&stats["eligible"]),
                cell(&stats["ineligible"]),
                cell(&stats["in_flight"]),
                cell(&stats["min_assignments"]),
                cell(&stats["max_assignments"]),
                cell(&stats["total_assignments"]),
            ]
        })
        .collect();
    table(
        &[
            "POOL",
            "POLICY",
            "ELIGIBLE",
            "INELIGIBLE",
            "IN_FLIGHT",
            "MIN",
            "MAX",
            "TOTAL",
        ],
        &rows,
    )
}

/// `pools show`: the pool, its configuration, its creation time and its numbers.
pub fn pool(info: &Value) -> String {
    let mut pairs = vec![("pool".to_owned(), cell(&info["pool"]))];
    pairs.extend(ordered(&info["config"], &CONFIG_ORDER));
    pairs.push(("created_at".to_owned(), cell(&info["created_at"])));
    pairs.extend(ordered(&info["stats"], &STATS_ORDER));
    key_values(&pairs)
}

/// `pools create`: whether the pool was created or its configuration replaced, and the
/// configuration now in force.
pub fn created(pool: &PoolId, created: bool, answer: &Value) -> String {
    let verb = if created {
        "created pool"
    } else {
        "replaced the configuration of pool"
    };
    format!(
        "{verb} {pool}\n{}",
        key_values(&ordered(&answer["config"], &CONFIG_ORDER))
    )
}

/// `pools set`: the pool's whole configuration after the change.
pub fn changed(pool: &PoolId, answer: &Value) -> String {
    format!(
        "changed pool {pool}\n{}",
        key_values(&ordered(&answer["config"], &CONFIG_ORDER))
    )
}

/// `members list`: one line per member.
pub fn members(members: &[Value]) -> String {
    if members.is_empty() {
        return "no members\n".to_owned();
    }
    // The labels column only when some member has labels: pools without keep their table.
    let labelled = members.iter().any(|member| member.get("labels").is_some());
    // The origin column only when some member was not added by hand: pools fed by hand
    // keep their table.
    let traced = members.iter().any(|member| {
        member
            .get("origin")
            .is_some_and(|origin| origin != "manual")
    });
    // The bans column only for a listing that named a target.
    let targeted = members
        .iter()
        .any(|member| member.get("banned_until").is_some());
    let rows: Vec<Vec<String>> = members
        .iter()
        .map(|member| {
            let mut row = vec![
                cell(&member["member"]),
                cell(&member["state"]),
                cell(&member["assignments"]),
                cell(&member["in_flight"]),
                cell(&member["reason"]),
                cell(&member["since"]),
            ];
            if labelled {
                row.push(labels_cell(&member["labels"]));
            }
            if traced {
                row.push(cell(&member["origin"]));
            }
            if targeted {
                row.push(cell(&member["banned_until"]));
            }
            row
        })
        .collect();
    let mut headers = vec![
        "MEMBER",
        "STATE",
        "ASSIGNMENTS",
        "IN_FLIGHT",
        "REASON",
        "SINCE",
    ];
    if labelled {
        headers.push("LABELS");
    }
    if traced {
        headers.push("ORIGIN");
    }
    if targeted {
        headers.push("BANNED_UNTIL");
    }
    table(&headers, &rows)
}

/// `pools sources`: one line per source, with its last fetch.
pub fn sources(answer: &Value) -> String {
    let sources = answer["sources"].as_array().map_or(&[][..], Vec::as_slice);
    if sources.is_empty() {
        return "no sources\n".to_owned();
    }
    let rows: Vec<Vec<String>> = sources
        .iter()
        .map(|source| {
            let last = &source["last_fetch"];
            vec![
                cell(&source["url"]),
                cell(&source["interval_ms"]),
                cell(&source["successes"]),
                cell(&source["failures"]),
                cell(&last["at"]),
                cell(&last["outcome"]),
                cell(&last["counts"]["added"]),
                cell(&last["counts"]["existing"]),
                cell(&last["counts"]["rejected"]),
                cell(&last["error"]),
            ]
        })
        .collect();
    table(
        &[
            "URL",
            "INTERVAL_MS",
            "FETCHED",
            "FAILURES",
            "LAST_FETCH",
            "OUTCOME",
            "ADDED",
            "EXISTING",
            "REJECTED",
            "ERROR",
        ],
        &rows,
    )
}

/// A member's labels as `key=value,key=value` (`-` when it has none).
fn labels_cell(labels: &Value) -> String {
    match labels.as_object() {
        Some(map) if !map.is_empty() => map
            .iter()
            .map(|(key, value)| format!("{key}={}", value.as_str().unwrap_or("")))
            .collect::<Vec<_>>()
            .join(","),
        _ => "-".to_owned(),
    }
}

/// The strings of an array field (member ids).
fn ids(answer: &Value, field: &str) -> Vec<String> {
    answer[field]
        .as_array()
        .map(|items| items.iter().map(cell).collect())
        .unwrap_or_default()
}

/// One `MEMBER  RESULT` line per member a call named, a closing summary, and the partial
/// failure when members were unknown or rejected. `counts` start with the members the call
/// changed (added, disabled, enabled), then those already as asked.
fn member_report(
    answer: &Value,
    mut lines: Vec<(String, String)>,
    counts: &[(usize, &str)],
) -> Report {
    let applied = lines.len();
    let unknown = ids(answer, "unknown");
    lines.extend(unknown.iter().map(|id| (id.clone(), "unknown".to_owned())));
    let rejected: Vec<(String, String)> = answer["rejected"]
        .as_array()
        .map(|items| {
            items
                .iter()
                .map(|r| {
                    (
                        cell(&r["member"]),
                        format!("rejected: {}", cell(&r["reason"])),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    let rejected_count = rejected.len();
    lines.extend(rejected);
    let rows: Vec<Vec<String>> = lines.into_iter().map(|(id, what)| vec![id, what]).collect();
    let mut summary: Vec<String> = counts
        .iter()
        .map(|(n, what)| format!("{n} {what}"))
        .collect();
    if answer.get("unknown").is_some() {
        summary.push(format!("{} unknown", unknown.len()));
    }
    summary.push(format!("{rejected_count} rejected"));
    let text = format!(
        "{}{}\n{}",
        table(&["MEMBER", "RESULT"], &rows),
        summary.join(", "),
        hints(&answer["rejected"])
    );
    let mut missed = Vec::new();
    if !unknown.is_empty() {
        missed.push(format!("{} unknown", unknown.len()));
    }
    if rejected_count > 0 {
        missed.push(format!("{rejected_count} rejected"));
    }
    let partial = (!missed.is_empty()).then(|| {
        // "Applied" only when some member changed: members already as asked need none.
        let rest = if applied == 0 {
            "nothing was applied"
        } else if counts.first().is_some_and(|(changed, _)| *changed == 0) {
            "the others needed no change"
        } else {
            "the others were applied"
        };
        format!("{} of the members named; {rest}", missed.join(" and "))
    });
    Report { text, partial }
}

fn tagged(ids: &[String], what: &str) -> Vec<(String, String)> {
    ids.iter().map(|id| (id.clone(), what.to_owned())).collect()
}

/// `members add`.
pub fn added(answer: &Value) -> Report {
    let added = ids(answer, "added");
    let existing = ids(answer, "existing");
    let mut lines = tagged(&added, "added");
    lines.extend(tagged(&existing, "existing"));
    let mut report = member_report(
        answer,
        lines,
        &[(added.len(), "added"), (existing.len(), "existing")],
    );
    // Where new members start is news only when some member is new.
    if !added.is_empty() {
        report.text = format!(
            "{}new members start at {} assignments\n",
            report.text,
            cell(&answer["start_assignments"])
        );
    }
    report
}

/// `members disable`.
pub fn disabled(answer: &Value) -> Report {
    let disabled = ids(answer, "disabled");
    let already = ids(answer, "already_ineligible");
    let mut lines = tagged(&disabled, "disabled");
    lines.extend(tagged(&already, "already ineligible"));
    member_report(
        answer,
        lines,
        &[
            (disabled.len(), "disabled"),
            (already.len(), "already ineligible"),
        ],
    )
}

/// `members enable`.
pub fn enabled(answer: &Value) -> Report {
    let enabled: Vec<(String, String)> = answer["enabled"]
        .as_array()
        .map(|items| {
            items
                .iter()
                .map(|e| {
                    (
                        cell(&e["member"]),
                        format!(
                            "enabled at {} (kept {})",
                            cell(&e["assignments"]),
                            cell(&e["kept_assignments"])
                        ),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    let already = ids(answer, "already_eligible");
    let count = enabled.len();
    let mut lines = enabled;
    lines.extend(tagged(&already, "already eligible"));
    let mut report = member_report(
        answer,
        lines,
        &[(count, "enabled"), (already.len(), "already eligible")],
    );
    // The restore policy set the counts of the members enabled: none, nothing to say.
    if count > 0 {
        report.text = format!(
            "{}restore policy: {}\n",
            report.text,
            cell(&answer["restore"])
        );
    }
    report
}

/// One line per reason among rejected `entries` that carries a hint (what to change in the
/// pool's rules to accept it), in the order the reasons first appear: said once, not on
/// every line it applies to.
fn hints(entries: &Value) -> String {
    let mut said = Vec::new();
    let mut text = String::new();
    for entry in entries.as_array().into_iter().flatten() {
        if let (Some(reason), Some(hint)) = (entry["reason"].as_str(), entry["hint"].as_str())
            && !said.contains(&reason)
        {
            said.push(reason);
            text.push_str(&format!("hint ({reason}): {hint}\n"));
        }
    }
    text
}

/// `members import`: the counts, rejections per reason, the first rejected lines, and what
/// to change to accept them.
pub fn imported(answer: &Value, dry_run: bool) -> Report {
    let mut text = String::new();
    if dry_run {
        text.push_str("dry run: nothing was written\n");
    }
    let reasons: Vec<String> = answer["rejected"]
        .as_object()
        .map(|map| {
            map.iter()
                .map(|(reason, n)| format!("{reason} {}", cell(n)))
                .collect()
        })
        .unwrap_or_default();
    let rejected: u64 = answer["rejected"]
        .as_object()
        .map(|map| map.values().filter_map(Value::as_u64).sum())
        .unwrap_or(0);
    let mut pairs = vec![
        (
            "accepted".to_owned(),
            format!(
                "{} ({} added, {} existing)",
                cell(&answer["accepted"]),
                cell(&answer["added"]),
                cell(&answer["existing"])
            ),
        ),
        ("duplicates".to_owned(), cell(&answer["duplicates"])),
        ("rejected".to_owned(), rejected.to_string()),
    ];
    if !reasons.is_empty() {
        pairs[2].1 = format!("{rejected} ({})", reasons.join(", "));
    }
    text.push_str(&key_values(&pairs));
    if let Some(examples) = answer["examples"].as_array().filter(|e| !e.is_empty()) {
        let rows: Vec<Vec<String>> = examples
            .iter()
            .map(|e| vec![cell(&e["line"]), cell(&e["reason"]), cell(&e["input"])])
            .collect();
        text.push_str(&table(&["LINE", "REASON", "INPUT"], &rows));
        text.push_str(&hints(&answer["examples"]));
    }
    // Lists are expected to hold lines the pool's rules refuse: that is the import's job,
    // not a failure of the command.
    Report::done(text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_origin_column_shows_only_when_some_member_was_not_added_by_hand() {
        let by_hand = serde_json::json!({"member": "a", "origin": "manual", "state": "eligible",
            "assignments": 0, "in_flight": 0});
        let listed = serde_json::json!({"member": "b", "origin": "https://l.example/p",
            "state": "eligible", "assignments": 1, "in_flight": 0});
        assert_eq!(
            members(std::slice::from_ref(&by_hand)),
            "MEMBER  STATE     ASSIGNMENTS  IN_FLIGHT  REASON  SINCE\n\
             a       eligible            0          0       -      -\n"
        );
        assert_eq!(
            members(&[by_hand, listed]),
            "MEMBER  STATE     ASSIGNMENTS  IN_FLIGHT  REASON  SINCE  ORIGIN\n\
             a       eligible            0          0       -      -  manual\n\
             b       eligible            1          0       -      -  https://l.example/p\n"
        );
    }

    #[test]
    fn a_table_aligns_numbers_right_text_left_and_leaves_no_trailing_spaces() {
        let rows = vec![
            vec!["web".to_owned(), "12".to_owned(), "-".to_owned()],
            vec!["browsers".to_owned(), "3".to_owned(), "x".to_owned()],
        ];
        assert_eq!(
            table(&["POOL", "TOTAL", "NOTE"], &rows),
            "POOL      TOTAL  NOTE\n\
             web          12  -\n\
             browsers      3  x\n"
        );
    }

    #[test]
    fn pool_fields_come_in_a_fixed_order_and_unknown_fields_are_still_shown() {
        let info = json!({
            "pool": "web",
            "config": {"max_in_flight": null, "policy": "least-used", "rules": {"a": 1}},
            "created_at": "2026-11-30T10:04:36.788Z",
            "stats": {"abandoned": 0, "eligible": 3},
        });
        assert_eq!(
            pool(&info),
            "pool           web\n\
             policy         least-used\n\
             max_in_flight  -\n\
             rules.a        1\n\
             created_at     2026-11-30T10:04:36.788Z\n\
             eligible       3\n\
             abandoned      0\n"
        );
    }

    #[test]
    fn a_disable_with_unknown_and_rejected_members_reports_them_as_a_partial_failure() {
        let answer = json!({
            "pool": "web",
            "disabled": ["http://p1:1"],
            "already_ineligible": [],
            "unknown": ["http://p9:1"],
            "rejected": [{"member": "", "reason": "empty"}],
        });
        assert_eq!(
            disabled(&answer),
            Report {
                text: "MEMBER       RESULT\n\
                       http://p1:1  disabled\n\
                       http://p9:1  unknown\n\
                       \x20            rejected: empty\n\
                       1 disabled, 0 already ineligible, 1 unknown, 1 rejected\n"
                    .to_owned(),
                partial: Some(
                    "1 unknown and 1 rejected of the members named; the others were applied"
                        .to_owned()
                ),
            }
        );
    }

    #[test]
    fn a_call_whose_every_member_was_unknown_or_rejected_says_nothing_was_applied() {
        let answer = json!({
            "pool": "web",
            "disabled": [],
            "already_ineligible": [],
            "unknown": ["http://p9:1"],
            "rejected": [{"member": "", "reason": "empty"}],
        });
        assert_eq!(
            disabled(&answer).partial.as_deref(),
            Some("1 unknown and 1 rejected of the members named; nothing was applied")
        );
    }

    #[test]
    fn an_import_report_lists_counts_reasons_and_example_lines() {
        let answer = json!({
            "accepted": 2, "added": 1, "existing": 1, "duplicates": 1,
            "rejected": {"private_address": 2, "unparsable": 1},
            "examples": [
                {"line": 6, "input": "10.0.0.5:80", "reason": "private_address"},
                {"line": 12, "input": "nonsense", "reason": "unparsable"},
            ],
        });
        assert_eq!(
            imported(&answer, true),
            Report::done(
                "dry run: nothing was written\n\
                 accepted    2 (1 added, 1 existing)\n\
                 duplicates  1\n\
                 rejected    3 (private_address 2, unparsable 1)\n\
                 LINE  REASON           INPUT\n\
                 \x20  6  private_address  10.0.0.5:80\n\
                 \x20 12  unparsable       nonsense\n"
                    .to_owned()
            )
        );
    }
}
