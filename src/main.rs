//! The `proxy-allocator` binary: `serve` (the default) parses the configuration, starts
//! logging and serves until a shutdown signal; `demo` does the same with a pool of local
//! proxies (see [`proxy_allocator::demo`]); `pools` and `members` are operator commands
//! for a running service (see [`proxy_allocator::cli`]).

use std::process::ExitCode;

use proxy_allocator::cli::{self, Cli, Command, DemoArgs};
use proxy_allocator::config::Config;
use proxy_allocator::startup::{Application, shutdown_signal};
use proxy_allocator::{demo, telemetry};

// jemalloc rather than the system allocator: an assign allocates a few dozen small blocks,
// and on the benchmark (bench/assign.sh) jemalloc gave about 15% more assigns per second
// at a peak RSS of about 24 MB, where mimalloc gave as much at 63 MB.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[tokio::main]
async fn main() -> ExitCode {
    match Cli::parse_args().into_command() {
        Command::Serve(config) => serve(*config).await,
        Command::Demo(args) => demo(args).await,
        Command::Pools(args) => cli::pools(args).await,
        Command::Members(args) => cli::members(args).await,
        Command::Sessions(args) => cli::sessions(args).await,
        Command::Clients(args) => cli::clients(args).await,
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

async fn demo(args: DemoArgs) -> ExitCode {
    let _log = telemetry::init(args.log_format);
    match demo::run(args, shutdown_signal()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!(%error, "demo failed");
            ExitCode::FAILURE
        }
    }
}
