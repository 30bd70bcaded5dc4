//! The README's and the book's sessions, replayed: every ```` ```console ```` block of
//! `README.md` and then of every page of the book (`docs/src/`, in the order of its
//! `SUMMARY.md`), top to bottom, in one shell, against the service started as the pages say,
//! and each command's output compared with what the page shows. The README and the pages
//! are one walk: a page goes on from the state the ones before it left (the walkthrough's
//! pools, its variables and files), so a page that uses something before it is introduced
//! fails here as well as one whose outputs went stale. A failure names the file and line.
//!
//! The book's "Development" page is the manual of this test; in short:
//!
//! - `$ ` starts a command, `> ` continues it (a here-document, a long pipeline); the lines
//!   up to the next `$ ` are its output, standard output and error together. Every command
//!   must exit with 0: a block that shows a failure ends its command with `; echo "exit $?"`.
//! - In an output, `[..]` stands for any text within a line, `...` on a line of its own for
//!   any lines, `[TIMESTAMP]` for an RFC 3339 time of the API (`2026-11-30T10:17:19.384Z`) and
//!   `[ID]` for 32 hexadecimal digits (lease and request ids).
//! - `<!-- replay: start NAME=value ... -->` on the line before a block (re)starts the
//!   service with those settings, on the same address, before the block runs. The first block
//!   needs one. `<!-- replay: by <path> -->` leaves a block to the test in that file, which
//!   replays it against a service of its own (a restart on a data directory).
//! - The service listens on a free port, which the test writes wherever a command says
//!   `127.0.0.1:8080` or `localhost:8080` (and reads back as 8080 in outputs);
//!   `PROXY_ALLOCATOR_URL` points the operator commands at it. The shell runs in a directory
//!   of its own, with `set -o pipefail`, the binary under test first on `PATH`, and standard
//!   input closed.

#[expect(
    dead_code,
    reason = "the harness is shared with the API suite; this test uses its service process"
)]
#[path = "api/helpers.rs"]
mod helpers;
#[expect(
    dead_code,
    reason = "shared with the API suite, which reads the log and sends signals"
)]
#[path = "api/process.rs"]
mod process;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use process::ServiceProcess;

/// The address the pages' commands are written for.
const README_ADDRESSES: [&str; 2] = ["127.0.0.1:8080", "localhost:8080"];

/// Longest a single command may take.
const STEP_TIMEOUT: Duration = Duration::from_secs(60);

/// One command of a block and the output the page shows for it.
#[derive(Debug)]
struct Step {
    /// 1-based line of the page where the command starts.
    line: usize,
    command: String,
    expected: String,
    /// 0-based lines of the page that hold the output, and their indentation.
    output_lines: std::ops::Range<usize>,
    indent: usize,
}

/// One ```` ```console ```` block.
#[derive(Debug)]
struct Block {
    /// 1-based line of the page of the opening fence.
    line: usize,
    /// What the `<!-- replay: ... -->` line right before the block says, if there is one.
    directive: Option<Directive>,
    steps: Vec<Step>,
}

/// A `<!-- replay: ... -->` line.
#[derive(Debug, PartialEq, Eq)]
enum Directive {
    /// `start NAME=value ...`: (re)start the service with these settings first.
    Start(Vec<(String, String)>),
    /// `by <path>`: another test, in the file named, replays this block (one that needs a
    /// service of its own, such as a restart on a data directory).
    By(String),
}

/// The directive of `line` (line `number` of `file`), when it is a `<!-- replay: ... -->`
/// line.
fn directive(line: &str, file: &str, number: usize) -> Option<Directive> {
    let inner = line
        .trim()
        .strip_prefix("<!--")?
        .strip_suffix("-->")?
        .trim()
        .strip_prefix("replay:")?
        .trim();
    if let Some(path) = inner.strip_prefix("by ") {
        return Some(Directive::By(path.trim().to_owned()));
    }
    let rest = inner
        .strip_prefix("start")
        .unwrap_or_else(|| panic!("{file}:{number}: unknown replay directive {inner:?}"));
    Some(Directive::Start(
        rest.split_whitespace()
            .map(|setting| {
                let (name, value) = setting
                    .split_once('=')
                    .unwrap_or_else(|| panic!("{file}:{number}: {setting:?} is not NAME=value"));
                (name.to_owned(), value.to_owned())
            })
            .collect(),
    ))
}

/// Every console block of `text` (the page `file`), with its commands and outputs.
fn console_blocks(text: &str, file: &str) -> Vec<Block> {
    let lines: Vec<&str> = text.lines().collect();
    let mut blocks = Vec::new();
    let mut at = 0;
    while at < lines.len() {
        let fence = lines[at];
        let indent = fence.len() - fence.trim_start().len();
        if fence.trim_start() != "```console" {
            at += 1;
            continue;
        }
        let directive = at
            .checked_sub(1)
            .and_then(|before| directive(lines[before], file, before + 1));
        let mut block = Block {
            line: at + 1,
            directive,
            steps: Vec::new(),
        };
        at += 1;
        let mut body = Vec::new();
        while at < lines.len() && lines[at].trim_start() != "```" {
            // Blocks inside list items are indented like their fence.
            body.push((at, lines[at].get(indent..).unwrap_or("")));
            at += 1;
        }
        assert!(at < lines.len(), "{file}:{}: unclosed block", block.line);
        at += 1;
        let mut body = body.into_iter().peekable();
        while let Some((index, line)) = body.next() {
            let number = index + 1;
            let Some(first) = line.strip_prefix("$ ") else {
                panic!("{file}:{number}: output before any command: {line:?}");
            };
            let mut command = first.to_owned();
            let mut last = index;
            while let Some((more_at, more)) =
                body.next_if(|(_, l)| l.starts_with("> ") || *l == ">")
            {
                command.push('\n');
                command.push_str(more.strip_prefix("> ").unwrap_or(""));
                last = more_at;
            }
            let mut expected = Vec::new();
            while let Some((output_at, output)) = body.next_if(|(_, l)| !l.starts_with("$ ")) {
                expected.push(output);
                last = output_at;
            }
            block.steps.push(Step {
                line: number,
                command,
                output_lines: last + 1 - expected.len()..last + 1,
                expected: expected.join("\n"),
                indent,
            });
        }
        blocks.push(block);
    }
    blocks
}

/// A `bash` that runs the steps one after another, keeping its variables and directory.
struct Shell {
    child: Child,
    input: ChildStdin,
    output: Receiver<String>,
    marker: String,
}

impl Shell {
    fn start(dir: &Path, bin_dir: &Path, service_url: &str) -> Self {
        let path = format!(
            "{}:{}",
            bin_dir.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let mut child = Command::new("bash")
            .args(["--noprofile", "--norc"])
            .current_dir(dir)
            .env_clear()
            .env("PATH", path)
            .env("HOME", dir)
            .env("LANG", "C.UTF-8")
            .env("TERM", "dumb")
            .env("PROXY_ALLOCATOR_URL", service_url)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("bash starts");
        let input = child.stdin.take().expect("stdin");
        let stdout = child.stdout.take().expect("stdout");
        let (lines, output) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if lines.send(line).is_err() {
                    return;
                }
            }
        });
        let mut shell = Self {
            child,
            input,
            output,
            marker: format!("__replay_step_done_{:016x}__", rand::random::<u64>()),
        };
        shell.send("exec 2>&1; set -o pipefail\n");
        shell
    }

    fn send(&mut self, text: &str) {
        self.input
            .write_all(text.as_bytes())
            .and_then(|()| self.input.flush())
            .expect("bash reads its input");
    }

    /// Runs `command`; its output (standard error included) and exit status.
    fn run(&mut self, command: &str) -> Result<(String, i32), String> {
        let marker = self.marker.clone();
        // Standard input is closed for the command: a command that reads it would
        // otherwise read the steps that follow.
        self.send(&format!(
            "{{ {command}\n}} </dev/null; printf '\\n%s %d\\n' {marker} $?\n"
        ));
        let deadline = Instant::now() + STEP_TIMEOUT;
        let mut lines: Vec<String> = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.output.recv_timeout(left) {
                Ok(line) => match line.strip_prefix(&format!("{marker} ")) {
                    Some(status) => {
                        // The marker's own leading newline ends the output.
                        if lines.last().is_some_and(String::is_empty) {
                            lines.pop();
                        }
                        let status = status.parse().expect("an exit status");
                        return Ok((lines.join("\n"), status));
                    }
                    None => lines.push(line),
                },
                Err(RecvTimeoutError::Timeout) => {
                    return Err(format!(
                        "no end within {STEP_TIMEOUT:?}; output so far:\n{}",
                        lines.join("\n")
                    ));
                }
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(format!("the shell exited; output:\n{}", lines.join("\n")));
                }
            }
        }
    }
}

impl Drop for Shell {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What stands for what varies from one run to the next.
fn redactions() -> snapbox::Redactions {
    let mut redactions = snapbox::Redactions::new();
    redactions
        .insert(
            "[TIMESTAMP]",
            regex::Regex::new(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z").expect("a regex"),
        )
        .expect("a placeholder");
    redactions
        .insert("[ID]", regex::Regex::new(r"[0-9a-f]{32}").expect("a regex"))
        .expect("a placeholder");
    redactions
}

/// A directory of the test's own, removed when dropped.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn require(tool: &str, install: &str) {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|status| status.success());
    assert!(
        found,
        "the pages' sessions use {tool}, which is not on PATH: {install}"
    );
}

/// The crate's root, where the README is and the paths of the walk start.
const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The book's table of contents, whose order the walk follows.
const SUMMARY: &str = "docs/src/SUMMARY.md";

/// The files of the walk, as paths from the crate's root: the README, then every page that
/// `SUMMARY.md` links, in its order.
fn walk() -> Vec<String> {
    let summary = std::fs::read_to_string(Path::new(ROOT).join(SUMMARY))
        .unwrap_or_else(|error| panic!("{SUMMARY}: {error}"));
    let mut files = vec!["README.md".to_owned()];
    for (number, line) in summary.lines().enumerate() {
        let Some((_, rest)) = line.split_once("](") else {
            continue;
        };
        let page = rest
            .split_once(')')
            .unwrap_or_else(|| panic!("{SUMMARY}:{}: an unclosed link", number + 1))
            .0;
        files.push(format!("docs/src/{page}"));
    }
    files
}

#[test]
fn every_page_of_the_book_is_in_its_summary() {
    let listed = walk();
    let mut unlisted = Vec::new();
    for entry in std::fs::read_dir(Path::new(ROOT).join("docs/src")).expect("docs/src") {
        let name = entry.expect("an entry").file_name();
        let name = name.to_string_lossy();
        if name.ends_with(".md") && name != "SUMMARY.md" {
            let path = format!("docs/src/{name}");
            if !listed.contains(&path) {
                unlisted.push(path);
            }
        }
    }
    assert!(
        unlisted.is_empty(),
        "pages not in {SUMMARY}, so neither built nor replayed: {unlisted:?}"
    );
}

#[test]
fn every_console_session_of_the_readme_and_the_book_replays_as_printed() {
    require("curl", "apt-get install curl");
    require("jq", "apt-get install jq");
    let files = walk();
    let pages: Vec<(String, String, Vec<Block>)> = files
        .into_iter()
        .map(|file| {
            let text = std::fs::read_to_string(Path::new(ROOT).join(&file))
                .unwrap_or_else(|error| panic!("{file}: {error}"));
            let blocks = console_blocks(&text, &file);
            (file, text, blocks)
        })
        .collect();
    assert!(
        pages.iter().any(|(_, _, blocks)| !blocks.is_empty()),
        "no console block in the README or the book"
    );

    let scratch =
        Scratch(std::env::temp_dir().join(format!("pa-readme-{:016x}", rand::random::<u64>())));
    std::fs::create_dir_all(&scratch.0).expect("a scratch directory");
    let binary = PathBuf::from(env!("CARGO_BIN_EXE_proxy-allocator"));
    let bin_dir = binary.parent().expect("the binary's directory");

    // The first start picks a free port; later ones take the same address, so that what
    // the session wrote down (`U=...`) stays true.
    let mut address = "127.0.0.1:0".to_owned();
    let mut service: Option<ServiceProcess> = None;
    let mut shell: Option<Shell> = None;
    let assert = snapbox::Assert::new()
        .redact_with(redactions())
        .normalize_paths(false);
    // With README_REPLAY=overwrite, outputs that differ are written into their page instead
    // (what varies already replaced by its placeholder), for the author to read in the diff.
    let overwrite = std::env::var("README_REPLAY").is_ok_and(|mode| mode == "overwrite");
    let mut rewritten = Vec::new();
    for (file, text, blocks) in &pages {
        let mut rewrites: Vec<(std::ops::Range<usize>, usize, String)> = Vec::new();
        for block in blocks {
            if let Some(Directive::By(path)) = &block.directive {
                // Replayed there: that file must exist and read this page.
                let test =
                    std::fs::read_to_string(Path::new(ROOT).join(path)).unwrap_or_else(|error| {
                        panic!("{file}:{}: the test named, {path}: {error}", block.line)
                    });
                assert!(
                    test.contains(file.as_str()),
                    "{file}:{}: {path} does not read {file}",
                    block.line
                );
                continue;
            }
            if let Some(Directive::Start(settings)) = &block.directive {
                if let Some(mut running) = service.take() {
                    running.terminate();
                    running.wait_exit(Duration::from_secs(10));
                }
                let mut env: Vec<(&str, String)> = vec![("LISTEN_ADDR", address.clone())];
                env.extend(settings.iter().map(|(k, v)| (k.as_str(), v.clone())));
                let started = ServiceProcess::start_in(&scratch.0, &env);
                address = started.base.trim_start_matches("http://").to_owned();
                service = Some(started);
            }
            assert!(
                service.is_some(),
                "{file}:{}: the first console block needs a `<!-- replay: start ... -->` line \
                 before it",
                block.line
            );
            let shell = shell.get_or_insert_with(|| {
                Shell::start(&scratch.0, bin_dir, &format!("http://{address}"))
            });
            for step in &block.steps {
                let mut command = step.command.clone();
                for written in README_ADDRESSES {
                    command = command.replace(written, &address);
                }
                let (output, status) = shell.run(&command).unwrap_or_else(|problem| {
                    panic!("{file}:{}: `{}`: {problem}", step.line, step.command)
                });
                let output = output.replace(&address, "127.0.0.1:8080");
                assert!(
                    status == 0,
                    "{file}:{}: `{}` exited with {status}; output:\n{output}",
                    step.line,
                    step.command
                );
                let name = format!("the output of {file}:{} `{}`", step.line, step.command);
                if let Err(mismatch) = assert.try_eq(
                    Some(&name),
                    snapbox::Data::text(output.clone()),
                    snapbox::Data::text(step.expected.clone()),
                ) {
                    if !overwrite {
                        panic!(
                            "{mismatch}\n(README_REPLAY=overwrite cargo test --test readme \
                             writes the outputs into the pages)"
                        );
                    }
                    let redacted = redactions().redact(&output);
                    rewrites.push((step.output_lines.clone(), step.indent, redacted));
                }
            }
        }
        if !rewrites.is_empty() {
            let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
            for (range, indent, output) in rewrites.into_iter().rev() {
                let written = output
                    .lines()
                    .map(|line| format!("{}{line}", " ".repeat(indent)));
                lines.splice(range, written);
            }
            std::fs::write(Path::new(ROOT).join(file), lines.join("\n") + "\n")
                .unwrap_or_else(|error| panic!("{file} written: {error}"));
            rewritten.push(file.clone());
        }
    }
    assert!(
        rewritten.is_empty(),
        "outputs were rewritten in {rewritten:?}: read the diff before keeping it"
    );
}

#[test]
fn blocks_commands_continuations_outputs_and_directives_are_read_as_documented() {
    let text = "intro\n\
                <!-- replay: start ADMIN_TOKEN=s3cret RUST_LOG=warn -->\n\
                ```console\n\
                $ echo one\n\
                one\n\
                $ cat <<'EOF'\n\
                > a\n\
                >\n\
                > b\n\
                > EOF\n\
                a\n\
                \n\
                b\n\
                $ true\n\
                ```\n\
                - item\n\
                \x20 ```console\n\
                \x20 $ echo two\n\
                \x20 two\n\
                \x20 ```\n\
                ```text\n\
                $ not replayed\n\
                ```\n\
                <!-- replay: by tests/durable/data_dir.rs -->\n\
                ```console\n\
                $ kill -TERM %1\n\
                ```\n";
    let blocks = console_blocks(text, "README.md");
    assert_eq!(blocks.len(), 3);
    assert_eq!(
        blocks[2].directive,
        Some(Directive::By("tests/durable/data_dir.rs".to_owned()))
    );
    assert_eq!(
        blocks[0].directive,
        Some(Directive::Start(vec![
            ("ADMIN_TOKEN".to_owned(), "s3cret".to_owned()),
            ("RUST_LOG".to_owned(), "warn".to_owned())
        ]))
    );
    let steps: Vec<(usize, &str, &str, std::ops::Range<usize>)> = blocks[0]
        .steps
        .iter()
        .map(|s| {
            (
                s.line,
                s.command.as_str(),
                s.expected.as_str(),
                s.output_lines.clone(),
            )
        })
        .collect();
    assert_eq!(
        steps,
        [
            (4, "echo one", "one", 4..5),
            (6, "cat <<'EOF'\na\n\nb\nEOF", "a\n\nb", 10..13),
            (14, "true", "", 14..14)
        ]
    );
    assert_eq!((blocks[1].line, &blocks[1].directive), (17, &None));
    assert_eq!(blocks[1].steps[0].command, "echo two");
    assert_eq!(blocks[1].steps[0].expected, "two");
    assert_eq!(
        (
            blocks[1].steps[0].output_lines.clone(),
            blocks[1].steps[0].indent
        ),
        (18..19, 2)
    );
}
