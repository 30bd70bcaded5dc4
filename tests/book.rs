//! The README's and the book's links, checked: every relative link of `README.md` and of
//! every page of `docs/src/` must name a file or folder that exists, and every `#anchor` a
//! heading of the page it points into (the page itself when the link is only an anchor).
//! `mdbook build docs` turns the pages into HTML but does not look at their links; this
//! test does, so that a renamed heading or a moved page fails here, naming the file and line.
//!
//! Anchors follow GitHub's and mdBook's rule: the heading's text without its markup, lower
//! case, each space a `-`, every character that is not a letter, a digit, `-` or `_` left
//! out; a heading whose anchor an earlier one of the page already has gets `-1`, `-2`, ...
//! Links in code (fenced blocks, `inline spans`) are not links and are not checked; links
//! with a scheme (`https:`, `mailto:`) are not followed.

use std::collections::BTreeSet;
use std::path::{Component, Path, PathBuf};

/// The crate's root, where the README is.
const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The anchor GitHub and mdBook give a heading of `text` (its Markdown as written).
fn anchor(text: &str) -> String {
    plain(text)
        .chars()
        .filter_map(|c| {
            if c.is_alphanumeric() || c == '-' || c == '_' {
                Some(c.to_lowercase().collect::<String>())
            } else if c == ' ' {
                Some("-".to_owned())
            } else {
                None
            }
        })
        .collect()
}

/// `text` without its inline markup: code spans' backticks, emphasis, and links reduced
/// to their text.
fn plain(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find('[') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        match after.find("](").and_then(|close| {
            after[close + 2..]
                .find(')')
                .map(|end| (close, close + 2 + end + 1))
        }) {
            Some((close, end)) => {
                out.push_str(&after[..close]);
                rest = &after[end..];
            }
            None => {
                out.push('[');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out.replace(['`', '*'], "")
}

/// The lines of `text` that are prose, with their 1-based numbers: fenced blocks left out,
/// inline code spans blanked.
fn prose(text: &str) -> Vec<(usize, String)> {
    let mut lines = Vec::new();
    let mut fence: Option<String> = None;
    for (index, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        if let Some(open) = &fence {
            if trimmed.starts_with(open.as_str())
                && trimmed.trim_matches(|c| c == '`' || c == '~').is_empty()
            {
                fence = None;
            }
            continue;
        }
        if trimmed.starts_with("```") || trimmed.starts_with("~~~") {
            let marker: String = trimmed
                .chars()
                .take_while(|&c| c == '`' || c == '~')
                .collect();
            fence = Some(marker);
            continue;
        }
        lines.push((index + 1, without_code_spans(line)));
    }
    lines
}

/// `line` with every code span (a run of backticks, up to the same run) blanked out.
fn without_code_spans(line: &str) -> String {
    let mut out = String::new();
    let mut rest = line;
    while let Some(at) = rest.find('`') {
        out.push_str(&rest[..at]);
        let ticks = rest[at..].chars().take_while(|&c| c == '`').count();
        let after = &rest[at + ticks..];
        match after.find(&"`".repeat(ticks)) {
            Some(end) => {
                out.push_str(&" ".repeat(ticks * 2 + end));
                rest = &after[end + ticks..];
            }
            None => {
                out.push_str(&rest[at..at + ticks]);
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// The anchors of the headings of `text`, duplicates numbered as GitHub and mdBook do.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut fence = false;
    for line in text.lines() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("```") || trimmed.starts_with("~~~") {
            fence = !fence;
            continue;
        }
        if fence {
            continue;
        }
        let hashes = line.chars().take_while(|&c| c == '#').count();
        let Some(heading) = line[hashes..].strip_prefix(' ') else {
            continue;
        };
        if !(1..=6).contains(&hashes) {
            continue;
        }
        let base = anchor(heading.trim().trim_end_matches('#').trim());
        let mut candidate = base.clone();
        let mut n = 0;
        while found.contains(&candidate) {
            n += 1;
            candidate = format!("{base}-{n}");
        }
        found.insert(candidate);
    }
    found
}

/// The link targets of a prose line: inline links and images `[text](target "title")`,
/// and reference definitions `[label]: target`.
fn targets(line: &str) -> Vec<String> {
    let mut found = Vec::new();
    let trimmed = line.trim_start();
    if trimmed.starts_with('[')
        && let Some((_, definition)) = trimmed.split_once("]: ")
        && let Some(target) = definition.split_whitespace().next()
    {
        found.push(target.trim_matches(['<', '>']).to_owned());
    }
    let mut rest = line;
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        let end = after.find(')').unwrap_or(after.len());
        if let Some(target) = after[..end].split_whitespace().next() {
            found.push(target.trim_matches(['<', '>']).to_owned());
        }
        rest = &after[end..];
    }
    found
}

/// `path` with its `.` and `..` steps applied; `None` when it climbs out of the crate.
fn normalised(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    return None;
                }
            }
            other => out.push(other),
        }
    }
    Some(out)
}

/// What is wrong with the links of `file` (a path from the crate's root), one line each.
fn broken_links(file: &str) -> Vec<String> {
    let root = Path::new(ROOT);
    let text = std::fs::read_to_string(root.join(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
    let own = anchors(&text);
    let dir = Path::new(file).parent().unwrap_or(Path::new(""));
    let mut broken = Vec::new();
    for (number, line) in prose(&text) {
        for target in targets(&line) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (path, fragment) = match target.split_once('#') {
                Some((path, fragment)) => (path, Some(fragment)),
                None => (target.as_str(), None),
            };
            let (shown, headings) = if path.is_empty() {
                (file.to_owned(), Some(own.clone()))
            } else {
                let Some(resolved) = normalised(&dir.join(path)) else {
                    broken.push(format!("{file}:{number}: {target}: outside the repository"));
                    continue;
                };
                let shown = resolved.display().to_string();
                let on_disk = root.join(&resolved);
                if !on_disk.exists() {
                    broken.push(format!("{file}:{number}: {target}: {shown} does not exist"));
                    continue;
                }
                let headings = (on_disk.extension().is_some_and(|e| e == "md"))
                    .then(|| std::fs::read_to_string(&on_disk).map(|t| anchors(&t)))
                    .transpose()
                    .unwrap_or_else(|e| panic!("{shown}: {e}"));
                (shown, headings)
            };
            if let Some(fragment) = fragment {
                match headings {
                    Some(headings) if headings.contains(fragment) => {}
                    Some(_) => broken.push(format!(
                        "{file}:{number}: {target}: {shown} has no heading #{fragment}"
                    )),
                    None => broken.push(format!(
                        "{file}:{number}: {target}: an anchor into {shown}, which has no headings"
                    )),
                }
            }
        }
    }
    broken
}

/// The README and every Markdown file of the book's sources, as paths from the crate's root.
fn pages() -> Vec<String> {
    let mut pages = vec!["README.md".to_owned()];
    let mut book: Vec<String> = std::fs::read_dir(Path::new(ROOT).join("docs/src"))
        .expect("docs/src")
        .map(|entry| {
            entry
                .expect("an entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .filter(|name| name.ends_with(".md"))
        .map(|name| format!("docs/src/{name}"))
        .collect();
    book.sort();
    pages.extend(book);
    pages
}

#[test]
fn every_relative_link_of_the_readme_and_the_book_names_a_file_and_a_heading_that_exist() {
    let pages = pages();
    assert!(pages.len() > 2, "the book's pages: {pages:?}");
    let broken: Vec<String> = pages.iter().flat_map(|page| broken_links(page)).collect();
    assert!(
        broken.is_empty(),
        "{} broken links:\n{}",
        broken.len(),
        broken.join("\n")
    );
}

#[test]
fn anchors_are_made_as_github_and_mdbook_make_them() {
    assert_eq!(anchor("Which policy do I want?"), "which-policy-do-i-want");
    assert_eq!(
        anchor("Sticky sessions (`session`)"),
        "sticky-sessions-session"
    );
    assert_eq!(
        anchor("The embedded store on disk (`DATA_DIR`)"),
        "the-embedded-store-on-disk-data_dir"
    );
    assert_eq!(
        anchor("Targets: what an assign naming one costs"),
        "targets-what-an-assign-naming-one-costs"
    );
    assert_eq!(
        anchor("Every kind of assign, and sessions' memory"),
        "every-kind-of-assign-and-sessions-memory"
    );
    assert_eq!(anchor("[Asyncio](x.md) *client*"), "asyncio-client");
    let text = "# A\n## Choosing\n```sh\n# Choosing\n```\n### Choosing\n";
    assert_eq!(
        anchors(text),
        ["a", "choosing", "choosing-1"].map(str::to_owned).into()
    );
}

#[test]
fn links_in_code_are_not_links_and_titles_are_not_targets() {
    let text = "see [a](a.md#x \"A\") and `[b](b.md)`\n```md\n[c](c.md)\n```\n[d]: d.md\n";
    let found: Vec<(usize, Vec<String>)> = prose(text)
        .into_iter()
        .map(|(number, line)| (number, targets(&line)))
        .filter(|(_, targets)| !targets.is_empty())
        .collect();
    assert_eq!(
        found,
        [(1, vec!["a.md#x".to_owned()]), (5, vec!["d.md".to_owned()])]
    );
}
