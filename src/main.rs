//! The `proxy-allocator` binary: parse the configuration, start logging, serve until a
//! shutdown signal.

use clap::Parser;
use proxy_allocator::config::Config;
use proxy_allocator::startup::{Application, shutdown_signal};
use proxy_allocator::telemetry;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let config = Config::parse();
    telemetry::init(config.log_format);
    let app = match Application::build(config).await {
        Ok(app) => app,
        Err(error) => {
            tracing::error!(%error, "cannot start");
            return std::process::ExitCode::FAILURE;
        }
    };
    match app.run_until_stopped(shutdown_signal()).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!(%error, "server failed");
            std::process::ExitCode::FAILURE
        }
    }
}
