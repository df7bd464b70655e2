//! Log output: human-readable on a terminal, one JSON object per line with `--log-format json`,
//! filtered by `--log-level` or else `RUST_LOG` (default `info`). Always to stderr, so stdout
//! stays for results (`config show`, `predict`, `bench --json`).
//!
//! In a multi-rank job every line carries the rank (a `rank` span that the command enters), and
//! only rank 0 logs at the chosen level: the others report warnings and errors unless
//! `--log-all-ranks`, so that N ranks do not print N copies of the same progress.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Human,
    Json,
}

pub fn init(format: LogFormat, level: Option<&str>, rank: Option<usize>, all_ranks: bool) {
    let quiet_rank = rank.is_some_and(|rank| rank > 0) && !all_ranks;
    let filter = match level {
        _ if quiet_rank => EnvFilter::new("warn"),
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

/// An error and its causes on one line, `outer: cause: cause`, each said once: a cause whose
/// text its wrapper already quotes (as `"{path}: {source}"` messages do) is not repeated.
pub fn describe_error(error: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in error.chain() {
        let message = cause.to_string();
        if text.contains(&message) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&message);
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_cause_is_said_once() {
        #[derive(Debug, thiserror::Error)]
        #[error("model.safetensors: {source}")]
        struct Quoting {
            source: std::io::Error,
        }
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "No such file");
        let error = anyhow::Error::new(Quoting { source: io }).context("loading the model");
        assert_eq!(describe_error(&error), "loading the model: model.safetensors: No such file");
    }
}
