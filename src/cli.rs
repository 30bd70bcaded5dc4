//! The command line: `serve` runs the service (and is what runs when no subcommand is
//! given); `demo` runs it with a pool of local proxies to try it on (see
//! [`crate::demo`]); `pools`, `members`, `sessions` and `clients` are operator commands
//! that talk to a running service over HTTP with the admin token.
//!
//! The operator commands print human-readable tables, or with `--json` the service's JSON
//! answer. They exit with [`EXIT_REFUSED`] when the service refused the request (its error
//! message on standard error), [`EXIT_USAGE`] for a usage error, [`EXIT_UNAVAILABLE`] when
//! the service or its store could not answer (retrying may help), and [`EXIT_PARTIAL`] when
//! some of the members a command named were unknown or rejected (the others were applied).

mod clients;
mod render;
mod service;

use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::builder::PossibleValuesParser;
use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use serde_json::{Value, json};

pub use self::clients::{ClientsArgs, ClientsCommand};
use self::render::Report;
use self::service::{Body, Service};
use crate::config::Config;
use crate::domain::{PoolId, SessionId};

/// Exit code when the service refused the request (a 4xx answer).
pub const EXIT_REFUSED: u8 = 1;
/// Exit code of a usage error: bad arguments, no admin token, an unreadable file.
pub const EXIT_USAGE: u8 = 2;
/// Exit code when the service could not be reached or could not answer (a 5xx answer).
pub const EXIT_UNAVAILABLE: u8 = 3;
/// Exit code when some named members were unknown or rejected and the others applied.
pub const EXIT_PARTIAL: u8 = 4;

/// The whole command line. Without a subcommand it is `serve` with the same options, so
/// existing deployments (flags and environment variables alone) run as before.
#[derive(Debug, Parser)]
#[command(
    name = "proxy-allocator",
    version,
    about,
    args_conflicts_with_subcommands = true,
    after_help = "Operator commands exit with 0 on success, 1 when the service refused the \
                  request, 2 on a usage error, 3 when the service or its store could not \
                  answer, 4 when some named members were unknown or rejected."
)]
pub struct Cli {
    /// What to do; `serve` when left out.
    #[command(subcommand)]
    pub command: Option<Command>,
    /// The service's options, for `proxy-allocator` without a subcommand.
    #[command(flatten)]
    pub serve: Config,
}

impl Cli {
    /// Parses the process's arguments; on a usage error prints clap's message and exits
    /// with 2.
    pub fn parse_args() -> Self {
        let matches = plain_usage_lines(Self::command()).get_matches();
        Self::from_arg_matches(&matches).unwrap_or_else(|error| error.exit())
    }

    /// The command to run: the one given, or `serve` with the top-level options.
    pub fn into_command(self) -> Command {
        self.command
            .unwrap_or_else(|| Command::Serve(Box::new(self.serve)))
    }
}

/// Gives every command without subcommands of its own the usage line clap writes when no
/// option is used, fixed in advance. clap's error messages otherwise show the options the
/// invocation used, and one set through its environment variable counts as used: with
/// `ADMIN_TOKEN` set, `members add` without arguments printed `Usage: proxy-allocator
/// members add --admin-token <ADMIN_TOKEN> <POOL> <MEMBERS>...`, as if the flag were
/// required.
fn plain_usage_lines(mut command: clap::Command) -> clap::Command {
    command.build();
    plain_usage_below(command)
}

fn plain_usage_below(mut command: clap::Command) -> clap::Command {
    let children: Vec<String> = command
        .get_subcommands()
        .map(|child| child.get_name().to_owned())
        .collect();
    if children.is_empty() {
        let rendered = command.render_usage().to_string();
        let line = rendered
            .strip_prefix("Usage: ")
            .unwrap_or(&rendered)
            .to_owned();
        return command.override_usage(line);
    }
    children.into_iter().fold(command, |command, child| {
        command.mut_subcommand(child, plain_usage_below)
    })
}

/// A subcommand.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the service (what runs when no subcommand is given).
    Serve(Box<Config>),
    /// Try the service without proxies of your own: it runs with the gateway and a pool
    /// `demo` of four forward proxies it serves itself on loopback (two healthy, one slow,
    /// one failing) and a local page to fetch through them, prints the dashboard's URL with
    /// the admin token and the curl lines to try, and runs until Ctrl-C. The store is in
    /// memory: nothing is kept.
    Demo(DemoArgs),
    /// List, show, create, change and delete the pools of a running service, and show a
    /// pool's sources.
    Pools(PoolsArgs),
    /// Add, import, list, disable and enable the members of a pool of a running service.
    Members(MembersArgs),
    /// End a sticky session of a pool of a running service.
    Sessions(SessionsArgs),
    /// Create, list, show, rotate the token of and delete the clients of a running
    /// service: tokens of their own for some pools.
    Clients(ClientsArgs),
    /// Exit 0 when the service answers its liveness probe with 200, else 1: for container
    /// health checks in images without curl or a shell.
    Healthcheck(HealthcheckArgs),
}

/// `proxy-allocator demo`.
#[derive(Debug, Clone, Args)]
pub struct DemoArgs {
    /// Address of the API and the dashboard; port 0 picks a free port. Loopback only: the
    /// demo has no worker token.
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub listen: std::net::SocketAddr,

    /// Address of the forward-proxy gateway; port 0 picks a free port. Loopback only.
    #[arg(long, default_value = "127.0.0.1:8081")]
    pub gateway_listen: std::net::SocketAddr,

    /// The admin token; a random one is generated (and printed) when unset.
    #[arg(long, env = "ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,

    /// Log format. The level is set with `RUST_LOG` (default `info`).
    #[arg(long, env = "LOG_FORMAT", value_enum, default_value_t = crate::config::LogFormat::Auto)]
    pub log_format: crate::config::LogFormat,
}

/// `proxy-allocator healthcheck`.
#[derive(Debug, Clone, Args)]
pub struct HealthcheckArgs {
    /// The probe to ask.
    #[arg(long, default_value = "http://127.0.0.1:8080/livez")]
    pub url: String,

    /// Longest time to wait for the answer, in milliseconds.
    #[arg(long, default_value_t = 2_000)]
    pub timeout_ms: u64,
}

/// Runs `proxy-allocator healthcheck`.
pub async fn healthcheck(args: HealthcheckArgs) -> ExitCode {
    let client = match reqwest::Client::builder()
        .timeout(std::time::Duration::from_millis(args.timeout_ms))
        .no_proxy()
        .build()
    {
        Ok(client) => client,
        Err(_) => return ExitCode::FAILURE,
    };
    match client.get(&args.url).send().await {
        Ok(response) if response.status() == reqwest::StatusCode::OK => ExitCode::SUCCESS,
        Ok(response) => {
            eprintln!("unhealthy: {} answered {}", args.url, response.status());
            ExitCode::FAILURE
        }
        Err(error) => {
            eprintln!("unhealthy: {error}");
            ExitCode::FAILURE
        }
    }
}

/// How the operator commands reach the service.
#[derive(Debug, Clone, Args)]
pub struct Remote {
    /// Base URL of the running service (plain HTTP).
    #[arg(
        long,
        env = "PROXY_ALLOCATOR_URL",
        default_value = "http://127.0.0.1:8080",
        global = true
    )]
    pub url: String,

    /// The service's admin token.
    #[arg(long, env = "ADMIN_TOKEN", hide_env_values = true, global = true)]
    pub admin_token: Option<String>,

    /// File holding the admin token (surrounding white space ignored).
    #[arg(
        long,
        env = "ADMIN_TOKEN_FILE",
        conflicts_with = "admin_token",
        global = true
    )]
    pub admin_token_file: Option<PathBuf>,

    /// Longest time one request to the service may take, in milliseconds.
    #[arg(
        long,
        env = "PROXY_ALLOCATOR_TIMEOUT_MS",
        default_value_t = 10_000,
        global = true
    )]
    pub timeout_ms: u64,

    /// Print the service's JSON answer instead of a table.
    #[arg(long, global = true)]
    pub json: bool,
}

/// `proxy-allocator pools ...`.
#[derive(Debug, Args)]
pub struct PoolsArgs {
    /// How to reach the service.
    #[command(flatten)]
    pub remote: Remote,
    /// What to do with pools.
    #[command(subcommand)]
    pub command: PoolsCommand,
}

/// Pool commands.
#[derive(Debug, Subcommand)]
pub enum PoolsCommand {
    /// Every pool with its numbers.
    List,
    /// One pool: its configuration and numbers.
    Show {
        /// The pool.
        #[arg(value_parser = PoolId::parse)]
        pool: PoolId,
    },
    /// Create a pool, or replace the whole configuration of an existing one (options left
    /// out take their defaults).
    Create {
        /// The pool.
        #[arg(value_parser = PoolId::parse)]
        pool: PoolId,
        /// How assign chooses a member [service default: least-used].
        #[arg(long, value_parser = PossibleValuesParser::new(["least-used", "least-in-flight"]))]
        policy: Option<String>,
        /// How returning members are given their count [service default: minimum].
        #[arg(long, value_parser = PossibleValuesParser::new(["minimum", "history", "zero"]))]
        restore: Option<String>,
        /// Starting count of new members [service default: the current minimum].
        #[arg(long)]
        start_assignments: Option<u64>,
        /// Lease ttl of least-in-flight pools, in milliseconds [service default: 30000].
        #[arg(long)]
        lease_ttl_ms: Option<u64>,
        /// Most live leases per member (least-in-flight pools) [service default: no cap].
        #[arg(long)]
        max_in_flight: Option<u64>,
        /// A list to fetch on a schedule and import (repeatable): its `http(s)` URL.
        #[arg(long = "source", value_name = "URL")]
        sources: Vec<String>,
        /// Time between fetches of every --source, in milliseconds.
        #[arg(long, default_value_t = 3_600_000, requires = "sources")]
        source_interval_ms: u64,
        /// How every --source is written [service default: lines].
        #[arg(long, requires = "sources", value_parser = PossibleValuesParser::new(["lines", "json"]))]
        source_format: Option<String>,
        /// Let the sources be on private addresses (`rules.allow_private_sources`).
        #[arg(long, requires = "sources")]
        allow_private_sources: bool,
        /// Accept members on private and loopback addresses, such as a local proxy on
        /// 127.0.0.1 (`rules.allow_private`).
        #[arg(long)]
        allow_private: bool,
        /// Remove members whose last N active checks all failed (`prune.after_failed_checks`).
        #[arg(long, value_name = "N")]
        prune_after_failed_checks: Option<u64>,
        /// Remove a source's members its last K fetches did not list
        /// (`prune.absent_from_source_fetches`).
        #[arg(long, value_name = "K")]
        prune_absent_from_source_fetches: Option<u64>,
        /// Prune members added by hand after failed checks too (`prune.manual`).
        #[arg(long)]
        prune_manual: bool,
    },
    /// Change some settings of an existing pool, keeping every other one (a merge patch;
    /// `create` replaces the whole configuration).
    Set {
        /// The pool.
        #[arg(value_parser = PoolId::parse)]
        pool: PoolId,
        /// How assign chooses a member (only while the pool has no members).
        #[arg(long, value_parser = PossibleValuesParser::new(["least-used", "least-in-flight"]))]
        policy: Option<String>,
        /// How returning members are given their count.
        #[arg(long, value_parser = PossibleValuesParser::new(["minimum", "history", "zero"]))]
        restore: Option<String>,
        /// Starting count of new members.
        #[arg(long)]
        start_assignments: Option<u64>,
        /// Lease ttl of least-in-flight pools, in milliseconds.
        #[arg(long)]
        lease_ttl_ms: Option<u64>,
        /// Most live leases per member (least-in-flight pools).
        #[arg(long)]
        max_in_flight: Option<u64>,
        /// Accept members on private and loopback addresses (`rules.allow_private`);
        /// `--allow-private=false` refuses them again.
        #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true")]
        allow_private: Option<bool>,
        /// Put a setting back to its default (repeatable): a field of the configuration,
        /// dotted for a nested one (`start_assignments`, `rules.max_members`, `pacing`).
        #[arg(long = "default", value_name = "FIELD")]
        defaults: Vec<String>,
    },
    /// A pool's sources: each one's schedule and last fetch.
    Sources {
        /// The pool.
        #[arg(value_parser = PoolId::parse)]
        pool: PoolId,
    },
    /// Delete a pool and all its state.
    Delete {
        /// The pool.
        #[arg(value_parser = PoolId::parse)]
        pool: PoolId,
    },
}

/// `proxy-allocator sessions ...`.
#[derive(Debug, Args)]
pub struct SessionsArgs {
    /// How to reach the service.
    #[command(flatten)]
    pub remote: Remote,
    /// What to do with sessions.
    #[command(subcommand)]
    pub command: SessionsCommand,
}

/// Session commands.
#[derive(Debug, Subcommand)]
pub enum SessionsCommand {
    /// End a live session: the next assign naming it picks a member afresh.
    End {
        /// The pool.
        #[arg(value_parser = PoolId::parse)]
        pool: PoolId,
        /// The session id, as the workers name it.
        #[arg(value_parser = |text: &str| SessionId::parse("session", text))]
        session: SessionId,
    },
}

/// `proxy-allocator members ...`.
#[derive(Debug, Args)]
pub struct MembersArgs {
    /// How to reach the service.
    #[command(flatten)]
    pub remote: Remote,
    /// What to do with members.
    #[command(subcommand)]
    pub command: MembersCommand,
}

/// Member commands.
#[derive(Debug, Subcommand)]
pub enum MembersCommand {
    /// Add members. New ones start at --assignments, else at the pool's start_assignments,
    /// else at the current minimum; members already in the pool are left as they are.
    Add {
        /// The pool.
        #[arg(value_parser = PoolId::parse)]
        pool: PoolId,
        /// Member ids (proxy URLs or opaque names).
        #[arg(required = true)]
        members: Vec<String>,
        /// Starting count of the new members.
        #[arg(long)]
        assignments: Option<u64>,
        /// Set members already in the pool to the starting count too.
        #[arg(long)]
        reset: bool,
        /// A label for every member named (repeatable), replacing the labels it had.
        #[arg(long = "label", value_name = "KEY=VALUE")]
        labels: Vec<String>,
    },
    /// Import a list of candidate proxies, one per line, filtered by the pool's rules.
    Import {
        /// The pool.
        #[arg(value_parser = PoolId::parse)]
        pool: PoolId,
        /// The list: a file, or `-` for standard input.
        file: PathBuf,
        /// Report what the import would do, and write nothing.
        #[arg(long)]
        dry_run: bool,
        /// Scheme of the lines that name none [service default: http].
        #[arg(long)]
        default_scheme: Option<String>,
        /// A label for every imported member (repeatable), replacing the labels it had.
        #[arg(long = "label", value_name = "KEY=VALUE")]
        labels: Vec<String>,
    },
    /// List members by assignments, then id.
    List {
        /// The pool.
        #[arg(value_parser = PoolId::parse)]
        pool: PoolId,
        /// Which members to list.
        #[arg(long, default_value = "all", value_parser = PossibleValuesParser::new(["all", "eligible", "ineligible"]))]
        state: String,
        /// Only members carrying this label (repeatable; a key given twice accepts either
        /// value).
        #[arg(long = "label", value_name = "KEY=VALUE")]
        labels: Vec<String>,
        /// Show each member's ban for this host (`BANNED_UNTIL`, `-` when none).
        #[arg(long, value_name = "HOST")]
        target: Option<String>,
    },
    /// Take members out of the eligible set; they keep their counts.
    Disable {
        /// The pool.
        #[arg(value_parser = PoolId::parse)]
        pool: PoolId,
        /// Member ids.
        #[arg(required = true)]
        members: Vec<String>,
        /// Why, recorded with each member (1 to 256 bytes) [service default: disabled].
        #[arg(long)]
        reason: Option<String>,
    },
    /// Return members to the eligible set under the pool's restore policy, or --restore.
    Enable {
        /// The pool.
        #[arg(value_parser = PoolId::parse)]
        pool: PoolId,
        /// Member ids.
        #[arg(required = true)]
        members: Vec<String>,
        /// Restore policy for this call instead of the pool's.
        #[arg(long, value_parser = PossibleValuesParser::new(["minimum", "history", "zero"]))]
        restore: Option<String>,
    },
}

/// Why an operator command did not fully succeed.
#[derive(Debug, thiserror::Error)]
pub enum Failure {
    /// Bad input on this side; nothing was sent.
    #[error("{0}")]
    Usage(String),
    /// The service answered with an error.
    #[error("{message} ({code}, HTTP {status})")]
    Answer {
        /// The HTTP status.
        status: u16,
        /// The service's error code.
        code: String,
        /// The service's error message.
        message: String,
    },
    /// No answer: refused connection, timeout, broken answer.
    #[error("{0}")]
    Unreachable(String),
    /// The request was applied, except for the members named here.
    #[error("{0}")]
    Partial(String),
}

impl Failure {
    /// The process exit code for this failure.
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Usage(_) => EXIT_USAGE,
            Self::Answer { status, .. } if *status >= 500 => EXIT_UNAVAILABLE,
            Self::Answer { .. } => EXIT_REFUSED,
            Self::Unreachable(_) => EXIT_UNAVAILABLE,
            Self::Partial(_) => EXIT_PARTIAL,
        }
    }
}

/// Runs a `pools` command, printing its result; the process exit code.
pub async fn pools(args: PoolsArgs) -> ExitCode {
    finish(run_pools(&args.remote, args.command).await)
}

/// Runs a `members` command, printing its result; the process exit code.
pub async fn members(args: MembersArgs) -> ExitCode {
    finish(run_members(&args.remote, args.command).await)
}

/// Runs a `clients` command, printing its result; the process exit code.
pub async fn clients(args: ClientsArgs) -> ExitCode {
    finish(clients::run(&args.remote, args.command).await)
}

/// Runs a `sessions` command, printing its result; the process exit code.
pub async fn sessions(args: SessionsArgs) -> ExitCode {
    finish(run_sessions(&args.remote, args.command).await)
}

async fn run_sessions(remote: &Remote, command: SessionsCommand) -> Result<(), Failure> {
    let service = Service::new(remote)?;
    match command {
        SessionsCommand::End { pool, session } => {
            service
                .send(
                    reqwest::Method::DELETE,
                    &format!("/pools/{pool}/sessions/{}", path_segment(session.as_str())),
                    Body::None,
                )
                .await?;
            let answer = json!({ "pool": pool.as_str(), "session": session, "ended": true });
            print(
                remote,
                &answer,
                Report::done(format!("ended session {session} of pool {pool}\n")),
            )
        }
    }
}

/// `text` as one path segment: every byte but the unreserved ones (RFC 3986) escaped, so
/// that a session id holding `/`, `?` or `%` names that session and no other route.
fn path_segment(text: &str) -> String {
    let mut segment = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            segment.push(char::from(byte));
        } else {
            segment.push_str(&format!("%{byte:02X}"));
        }
    }
    segment
}

fn finish(result: Result<(), Failure>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            eprintln!("error: {failure}");
            ExitCode::from(failure.exit_code())
        }
    }
}

/// Prints the JSON answer or the rendered text; a report's partial failure comes last.
fn print(remote: &Remote, answer: &Value, report: Report) -> Result<(), Failure> {
    if remote.json {
        // Rendering a `Value` cannot fail: its keys are strings.
        println!(
            "{}",
            serde_json::to_string_pretty(answer).unwrap_or_default()
        );
    } else {
        print!("{}", report.text);
    }
    match report.partial {
        Some(message) => Err(Failure::Partial(message)),
        None => Ok(()),
    }
}

async fn run_pools(remote: &Remote, command: PoolsCommand) -> Result<(), Failure> {
    let service = Service::new(remote)?;
    match command {
        PoolsCommand::List => {
            // Every page, however many pools there are.
            let pools = service.all_pools().await?;
            let answer = serde_json::json!({ "pools": pools });
            print(remote, &answer, Report::done(render::pools(&pools)))
        }
        PoolsCommand::Show { pool } => {
            let answer = service.get(&format!("/pools/{pool}")).await?;
            print(remote, &answer, Report::done(render::pool(&answer)))
        }
        PoolsCommand::Create {
            pool,
            policy,
            restore,
            start_assignments,
            lease_ttl_ms,
            max_in_flight,
            sources,
            source_interval_ms,
            source_format,
            allow_private_sources,
            allow_private,
            prune_after_failed_checks,
            prune_absent_from_source_fetches,
            prune_manual,
        } => {
            let mut config = serde_json::Map::new();
            if !sources.is_empty() {
                let sources: Vec<Value> = sources
                    .iter()
                    .map(|url| {
                        let mut source = json!({"url": url, "interval_ms": source_interval_ms});
                        if let Some(format) = &source_format {
                            source["format"] = json!(format);
                        }
                        source
                    })
                    .collect();
                config.insert("sources".to_owned(), Value::from(sources));
            }
            if allow_private_sources || allow_private {
                let mut rules = serde_json::Map::new();
                for (name, set) in [
                    ("allow_private_sources", allow_private_sources),
                    ("allow_private", allow_private),
                ] {
                    if set {
                        rules.insert(name.to_owned(), json!(true));
                    }
                }
                config.insert("rules".to_owned(), Value::Object(rules));
            }
            if prune_after_failed_checks.is_some()
                || prune_absent_from_source_fetches.is_some()
                || prune_manual
            {
                let mut prune = json!({"manual": prune_manual});
                if let Some(n) = prune_after_failed_checks {
                    prune["after_failed_checks"] = json!(n);
                }
                if let Some(k) = prune_absent_from_source_fetches {
                    prune["absent_from_source_fetches"] = json!(k);
                }
                config.insert("prune".to_owned(), prune);
            }
            let fields = [
                ("policy", policy.map(Value::from)),
                ("restore", restore.map(Value::from)),
                ("start_assignments", start_assignments.map(Value::from)),
                ("lease_ttl_ms", lease_ttl_ms.map(Value::from)),
                ("max_in_flight", max_in_flight.map(Value::from)),
            ];
            for (name, value) in fields {
                if let Some(value) = value {
                    config.insert(name.to_owned(), value);
                }
            }
            let (status, answer) = service
                .send(
                    reqwest::Method::PUT,
                    &format!("/pools/{pool}"),
                    Body::Json(Value::Object(config)),
                )
                .await?;
            let created = status == reqwest::StatusCode::CREATED;
            let mut answer = answer.unwrap_or(Value::Null);
            let text = render::created(&pool, created, &answer);
            answer["created"] = json!(created);
            print(remote, &answer, Report::done(text))
        }
        PoolsCommand::Set {
            pool,
            policy,
            restore,
            start_assignments,
            lease_ttl_ms,
            max_in_flight,
            allow_private,
            defaults,
        } => {
            let mut patch = json!({});
            for field in &defaults {
                put_at(&mut patch, field, Value::Null)?;
            }
            let fields = [
                ("policy", policy.map(Value::from)),
                ("restore", restore.map(Value::from)),
                ("start_assignments", start_assignments.map(Value::from)),
                ("lease_ttl_ms", lease_ttl_ms.map(Value::from)),
                ("max_in_flight", max_in_flight.map(Value::from)),
                ("rules.allow_private", allow_private.map(Value::from)),
            ];
            for (field, value) in fields {
                if let Some(value) = value {
                    put_at(&mut patch, field, value)?;
                }
            }
            if patch.as_object().is_some_and(serde_json::Map::is_empty) {
                return Err(Failure::Usage(
                    "name at least one setting to change (see pools set --help)".to_owned(),
                ));
            }
            let (_, answer) = service
                .send(
                    reqwest::Method::PATCH,
                    &format!("/pools/{pool}"),
                    Body::MergePatch(patch),
                )
                .await?;
            let answer = answer.unwrap_or(Value::Null);
            print(
                remote,
                &answer,
                Report::done(render::changed(&pool, &answer)),
            )
        }
        PoolsCommand::Sources { pool } => {
            let answer = service.get(&format!("/pools/{pool}/sources")).await?;
            print(remote, &answer, Report::done(render::sources(&answer)))
        }
        PoolsCommand::Delete { pool } => {
            service
                .send(
                    reqwest::Method::DELETE,
                    &format!("/pools/{pool}"),
                    Body::None,
                )
                .await?;
            let answer = json!({ "pool": pool.as_str(), "deleted": true });
            print(
                remote,
                &answer,
                Report::done(format!("deleted pool {pool}\n")),
            )
        }
    }
}

async fn run_members(remote: &Remote, command: MembersCommand) -> Result<(), Failure> {
    // An unreadable list is a usage error found before any request.
    let list = match &command {
        MembersCommand::Import { file, .. } => Some(read_list(file)?),
        _ => None,
    };
    let service = Service::new(remote)?;
    match command {
        MembersCommand::Add {
            pool,
            members,
            assignments,
            reset,
            labels,
        } => {
            let mut body = json!({ "members": members, "reset": reset });
            if let Some(n) = assignments {
                body["assignments"] = json!(n);
            }
            if !labels.is_empty() {
                // The service checks each key and value and names the one it refuses.
                let labels: serde_json::Map<String, Value> = labels
                    .iter()
                    .map(|pair| {
                        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
                        (key.to_owned(), json!(value))
                    })
                    .collect();
                body["labels"] = Value::Object(labels);
            }
            let answer = service
                .post(&format!("/pools/{pool}/members"), body)
                .await?;
            print(remote, &answer, render::added(&answer))
        }
        MembersCommand::Import {
            pool,
            dry_run,
            default_scheme,
            labels,
            ..
        } => {
            let mut query = Vec::new();
            if dry_run {
                query.push(("dry_run", "true".to_owned()));
            }
            if let Some(scheme) = default_scheme {
                query.push(("default_scheme", scheme));
            }
            query.extend(labels.into_iter().map(|pair| ("label", pair)));
            let (_, answer) = service
                .send_with_query(
                    reqwest::Method::POST,
                    &format!("/pools/{pool}/import"),
                    &query,
                    Body::Text(list.unwrap_or_default()),
                )
                .await?;
            let answer = answer.unwrap_or(Value::Null);
            print(remote, &answer, render::imported(&answer, dry_run))
        }
        MembersCommand::List {
            pool,
            state,
            labels,
            target,
        } => {
            let members = service
                .all_members(&pool, &state, &labels, target.as_deref())
                .await?;
            let text = render::members(&members);
            let answer = json!({ "pool": pool.as_str(), "members": members });
            print(remote, &answer, Report::done(text))
        }
        MembersCommand::Disable {
            pool,
            members,
            reason,
        } => {
            let mut body = json!({ "members": members });
            if let Some(reason) = reason {
                body["reason"] = json!(reason);
            }
            let answer = service
                .post(&format!("/pools/{pool}/members/disable"), body)
                .await?;
            print(remote, &answer, render::disabled(&answer))
        }
        MembersCommand::Enable {
            pool,
            members,
            restore,
        } => {
            let mut body = json!({ "members": members });
            if let Some(restore) = restore {
                body["restore"] = json!(restore);
            }
            let answer = service
                .post(&format!("/pools/{pool}/members/enable"), body)
                .await?;
            print(remote, &answer, render::enabled(&answer))
        }
    }
}

/// Sets the dotted `field` of a merge patch to `value`, making the objects on its way; a
/// field given twice (as a value and as `--default`) is a usage error rather than a guess.
fn put_at(patch: &mut Value, field: &str, value: Value) -> Result<(), Failure> {
    let refused = || Failure::Usage(format!("{field} is named twice, or inside another setting"));
    let mut names = field.split('.').peekable();
    let mut at = patch;
    while let Some(name) = names.next() {
        if name.is_empty() {
            return Err(Failure::Usage(format!("{field} is not a setting's name")));
        }
        let Value::Object(fields) = at else {
            return Err(refused());
        };
        if names.peek().is_none() {
            if fields.contains_key(name) {
                return Err(refused());
            }
            fields.insert(name.to_owned(), value);
            return Ok(());
        }
        at = fields.entry(name.to_owned()).or_insert_with(|| json!({}));
    }
    Ok(())
}

/// The bytes of a list: a file, or standard input for `-`.
fn read_list(file: &PathBuf) -> Result<Vec<u8>, Failure> {
    let mut bytes = Vec::new();
    let read = if file.as_os_str() == "-" {
        std::io::stdin().read_to_end(&mut bytes).map(|_| ())
    } else {
        std::fs::read(file).map(|content| bytes = content)
    };
    read.map_err(|error| Failure::Usage(format!("cannot read {}: {error}", file.display())))?;
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn command(args: &[&str]) -> Command {
        Cli::try_parse_from(args)
            .expect("valid arguments")
            .into_command()
    }

    #[test]
    fn no_subcommand_serves_with_the_top_level_options() {
        let Command::Serve(config) = command(&["proxy-allocator", "--listen", "127.0.0.1:9"])
        else {
            panic!("not serve");
        };
        assert_eq!(config.listen.to_string(), "127.0.0.1:9");
    }

    #[test]
    fn serve_takes_the_same_options_as_no_subcommand() {
        let Command::Serve(config) =
            command(&["proxy-allocator", "serve", "--key-prefix", "staging"])
        else {
            panic!("not serve");
        };
        assert_eq!(config.key_prefix, "staging");
    }

    #[test]
    fn demo_listens_on_8080_with_the_gateway_on_8081_unless_told_otherwise() {
        let Command::Demo(args) = command(&["proxy-allocator", "demo"]) else {
            panic!("not demo");
        };
        assert_eq!(
            (args.listen.to_string(), args.gateway_listen.to_string()),
            ("127.0.0.1:8080".to_owned(), "127.0.0.1:8081".to_owned())
        );
        let Command::Demo(args) = command(&[
            "proxy-allocator",
            "demo",
            "--listen",
            "127.0.0.1:0",
            "--gateway-listen",
            "127.0.0.1:0",
        ]) else {
            panic!("not demo");
        };
        assert_eq!((args.listen.port(), args.gateway_listen.port()), (0, 0));
    }

    #[test]
    fn service_options_do_not_mix_with_operator_commands() {
        let error =
            Cli::try_parse_from(["proxy-allocator", "--listen", "0.0.0.0:1", "pools", "list"])
                .expect_err("refused");
        assert_eq!(error.kind(), clap::error::ErrorKind::ArgumentConflict);
    }

    #[test]
    fn operator_options_are_accepted_before_or_after_the_command() {
        for args in [
            [
                "proxy-allocator",
                "pools",
                "--json",
                "--url",
                "http://h:1",
                "list",
            ],
            [
                "proxy-allocator",
                "pools",
                "list",
                "--json",
                "--url",
                "http://h:1",
            ],
        ] {
            let Command::Pools(pools) = command(&args) else {
                panic!("not pools");
            };
            assert_eq!(
                (pools.remote.url.as_str(), pools.remote.json),
                ("http://h:1", true)
            );
        }
    }

    #[test]
    fn failures_map_to_their_documented_exit_codes() {
        let answer = |status| Failure::Answer {
            status,
            code: "c".to_owned(),
            message: "m".to_owned(),
        };
        assert_eq!(answer(404).exit_code(), EXIT_REFUSED);
        assert_eq!(answer(503).exit_code(), EXIT_UNAVAILABLE);
        assert_eq!(Failure::Usage(String::new()).exit_code(), EXIT_USAGE);
        assert_eq!(
            Failure::Unreachable(String::new()).exit_code(),
            EXIT_UNAVAILABLE
        );
        assert_eq!(Failure::Partial(String::new()).exit_code(), EXIT_PARTIAL);
    }
}
