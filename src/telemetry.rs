//! Logging setup: `tracing` with JSON lines when not on a terminal.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;

/// Installs the global subscriber. Calling it again (as tests do) is harmless.
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let json = match format {
        LogFormat::Json => true,
        LogFormat::Text => false,
        LogFormat::Auto => !std::io::stdout().is_terminal(),
    };
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    // Ignore the error of a second installation: the first subscriber stays.
    let _ = if json {
        builder.json().flatten_event(true).try_init()
    } else {
        builder.try_init()
    };
}
