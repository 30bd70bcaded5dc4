//! The `proxy-allocator` binary: `serve` (the default) parses the configuration, starts
//! logging and serves until a shutdown signal; `pools` and `members` are operator commands
//! for a running service (see [`proxy_allocator::cli`]).

use std::process::ExitCode;

use clap::Parser;
use proxy_allocator::cli::{self, Cli, Command};
use proxy_allocator::config::Config;
use proxy_allocator::startup::{Application, shutdown_signal};
use proxy_allocator::telemetry;

#[tokio::main]
async fn main() -> ExitCode {
    match Cli::parse().into_command() {
        Command::Serve(config) => serve(*config).await,
        Command::Pools(args) => cli::pools(args).await,
        Command::Members(args) => cli::members(args).await,
        Command::Healthcheck(args) => cli::healthcheck(args).await,
    }
}

async fn serve(config: Config) -> ExitCode {
    let _log = telemetry::init(config.log_format);
    let app = match Application::build(config).await {
        Ok(app) => app,
        Err(error) => {
            tracing::error!(%error, "cannot start");
            return ExitCode::FAILURE;
        }
    };
    match app.run_until_stopped(shutdown_signal()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!(%error, "server failed");
            ExitCode::FAILURE
        }
    }
}
