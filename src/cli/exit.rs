//! The exit-code policy: the status a failed command ends the process with. Schedulers and
//! scripts act on it (requeue a run stopped by a signal, fix a configuration rather than
//! retry), so it is decided here, once, and listed in `rtrain --help`.

use crate::cluster::signals::{self, PREEMPTED_EXIT_CODE};
use crate::config::ConfigError;
use crate::explain::ExplainError;
use crate::train::TrainError;

/// `rtrain --help`'s list of exit codes; `exit_code` chooses among them.
pub const EXIT_CODES_HELP: &str = "\
Exit codes:
  0   success
  1   any other failure
  2   a usage or configuration error
  75  a run stopped by a signal (SIGTERM, SIGINT, SIGUSR1) after saving its checkpoint; continue
      it with --resume auto (a stopped `predict --out`: run the same command again)";

/// A flag that does not fit what it applies to, found by the command's own code after parsing
/// (`reproduce --ranks 2` in a job of one): a usage error, with its message.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

/// The exit status for a failed command: 2 for usage and configuration errors, 75 for a run
/// stopped by a signal with its checkpoint (or finished prediction parts) saved, 1 otherwise.
pub fn exit_code(error: &anyhow::Error) -> u8 {
    if is_usage_error(error) {
        2
    } else if signals::is_clean_stop(error) {
        PREEMPTED_EXIT_CODE
    } else {
        1
    }
}

/// Whether `error` is the user's to fix on the command line or in the configuration rather than
/// to retry: a setting refused, a flag or setting that does not fit the checkpoint, the data or
/// the job. Library errors are recognised by their variants, here in one place.
fn is_usage_error(error: &anyhow::Error) -> bool {
    error.downcast_ref::<ConfigError>().is_some()
        || error.downcast_ref::<UsageError>().is_some()
        || matches!(
            error.downcast_ref::<ExplainError>(),
            Some(ExplainError::UnknownLayer(_) | ExplainError::UnknownClass { .. })
        )
        // `train.class_weights` that the training split's classes do not fit.
        || matches!(error.downcast_ref::<TrainError>(), Some(TrainError::ClassWeights(_)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn help_lists_every_code_the_policy_returns() {
        let config = anyhow::Error::new(ConfigError::MissingFile { path: "x.toml".into() });
        let other = anyhow::anyhow!("disk full");
        for code in [0, exit_code(&config), exit_code(&other), PREEMPTED_EXIT_CODE] {
            assert!(EXIT_CODES_HELP.contains(&format!("\n  {code:<3} ")), "{code} missing");
        }
        assert_eq!((exit_code(&config), exit_code(&other)), (2, 1));
        let usage = anyhow::Error::new(UsageError("--ranks 2, but this job has 1 rank(s)".into()));
        let layer = anyhow::Error::new(ExplainError::UnknownLayer("layer9".into()));
        let unreadable = anyhow::Error::new(ExplainError::CreateDir {
            path: "out".into(),
            source: std::io::Error::other("read-only file system"),
        });
        assert_eq!((exit_code(&usage), exit_code(&layer), exit_code(&unreadable)), (2, 2, 1));
    }
}
