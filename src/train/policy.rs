//! The checkpoint policy: when training saves a checkpoint, when it keeps one as the best,
//! and which old ones it deletes. Pure decisions from numbers, apart from the file operations
//! (the run directory's), so they are testable alone (as burn's checkpoint strategies are).

use std::path::PathBuf;

use crate::config::CheckpointConfig;

/// What to save after an epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EpochActions {
    /// Take a checkpoint at the epoch boundary.
    pub save: bool,
    /// Copy that checkpoint to `best.safetensors`.
    pub keep_as_best: bool,
}

/// Whether to checkpoint after step `step_in_epoch` (1-based) of an epoch of `steps_per_epoch`:
/// every `checkpoint.every_steps`, except at the epoch's end, which the epoch's own checkpoint
/// covers.
pub fn save_after_step(policy: &CheckpointConfig, step_in_epoch: u64, steps_per_epoch: u64) -> bool {
    let every = policy.every_steps;
    every > 0 && step_in_epoch % every == 0 && step_in_epoch < steps_per_epoch
}

/// What to save after epoch `epoch` (0-based) of `epochs`, whose evaluation was the best so far
/// when `is_best`: the last epoch always, every `checkpoint.every_epochs`, and a new best when
/// `checkpoint.keep_best`.
pub fn after_epoch(policy: &CheckpointConfig, epoch: u32, epochs: u32, is_best: bool) -> EpochActions {
    let last = epoch + 1 == epochs;
    let every = policy.every_epochs;
    let keep_as_best = is_best && policy.keep_best;
    EpochActions { save: last || (every > 0 && (epoch + 1) % every == 0) || keep_as_best, keep_as_best }
}

/// Whether `top1` beats the best validation top-1 so far (the first evaluation always does).
pub fn is_best(best_so_far: Option<f64>, top1: f64) -> bool {
    best_so_far.is_none_or(|best| top1 > best)
}

/// Which step checkpoints (oldest first, as listed by the run directory) to delete so that
/// only the newest `keep_last` remain.
pub fn retention(existing: &[(u64, PathBuf)], keep_last: usize) -> Vec<PathBuf> {
    let excess = existing.len().saturating_sub(keep_last);
    existing.iter().take(excess).map(|(_, path)| path.clone()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(every_steps: u64, every_epochs: u32, keep_best: bool) -> CheckpointConfig {
        CheckpointConfig { every_steps, every_epochs, keep_best, ..CheckpointConfig::default() }
    }

    #[test]
    fn step_checkpoints_skip_the_epoch_boundary() {
        let p = policy(2, 1, false);
        let saved: Vec<u64> = (1..=6).filter(|&s| save_after_step(&p, s, 6)).collect();
        assert_eq!(saved, vec![2, 4], "step 6 ends the epoch: the epoch checkpoint covers it");
        assert!(
            !(1..=6).any(|s| save_after_step(&policy(0, 1, false), s, 6)),
            "0 turns step checkpoints off"
        );
    }

    #[test]
    fn epoch_checkpoints_every_n_the_last_and_the_best() {
        let p = policy(0, 2, false);
        let saved: Vec<u32> = (0..5).filter(|&e| after_epoch(&p, e, 5, false).save).collect();
        assert_eq!(saved, vec![1, 3, 4], "epochs 2 and 4 (1-based), and the last");
        let best = after_epoch(&policy(0, 0, true), 0, 5, true);
        assert_eq!(best, EpochActions { save: true, keep_as_best: true });
        let not_kept = after_epoch(&policy(0, 0, false), 0, 5, true);
        assert_eq!(not_kept, EpochActions { save: false, keep_as_best: false });
    }

    #[test]
    fn best_means_strictly_better() {
        assert!(is_best(None, 0.0));
        assert!(is_best(Some(0.5), 0.6));
        assert!(!is_best(Some(0.5), 0.5), "a tie keeps the earlier best");
    }

    #[test]
    fn retention_keeps_newest() {
        let existing: Vec<(u64, PathBuf)> =
            [1, 2, 3, 4].iter().map(|&s| (s, PathBuf::from(format!("{s}")))).collect();
        assert_eq!(retention(&existing, 2), vec![PathBuf::from("1"), PathBuf::from("2")]);
        assert!(retention(&existing, 5).is_empty());
    }
}
