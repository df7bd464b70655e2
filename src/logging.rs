//! Log output: human-readable on a terminal, one JSON object per line with `--log-format json`,
//! filtered by `--log-level` or else `RUST_LOG` (default `info`). Always to stderr, so stdout
//! stays for results (`config show`, `predict`, `bench --json`).

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Human,
    Json,
}

pub fn init(format: LogFormat, level: Option<&str>) {
    let filter = match level {
        Some(level) => EnvFilter::new(level),
        None => EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
    };
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    let result = match format {
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
        LogFormat::Human => builder.with_ansi(std::io::stderr().is_terminal()).with_target(false).try_init(),
    };
    // A second init (tests calling into the library twice) keeps the first subscriber.
    let _ = result;
}
