//! The exit-code policy: the status a failed command ends the process with. Schedulers and
//! scripts act on it (requeue a run stopped by a signal, fix a configuration rather than
//! retry), so it is decided here, once, and listed in `rtrain --help`.

use crate::cluster::signals::{self, PREEMPTED_EXIT_CODE};
use crate::config::ConfigError;

/// `rtrain --help`'s list of exit codes; `exit_code` chooses among them.
pub const EXIT_CODES_HELP: &str = "\
Exit codes:
  0   success
  1   any other failure
  2   a usage or configuration error
  75  a run stopped by a signal (SIGTERM, SIGINT, SIGUSR1) after saving its checkpoint; continue
      it with --resume auto (a stopped `predict --out`: run the same command again)";

/// The exit status for a failed command: 2 for usage and configuration errors, 75 for a run
/// stopped by a signal with its checkpoint (or finished prediction parts) saved, 1 otherwise.
pub fn exit_code(error: &anyhow::Error) -> u8 {
    if error.downcast_ref::<ConfigError>().is_some() {
        2
    } else if signals::is_clean_stop(error) {
        PREEMPTED_EXIT_CODE
    } else {
        1
    }
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
    }
}
