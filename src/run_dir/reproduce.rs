//! `rtrain reproduce RUN_DIR`: the verdict on a re-run. Where bit-equality is expected (a
//! deterministic CPU run at the same world size and thread count), the final weights' sha256
//! must match, and every re-run epoch's metrics must equal the original's exactly. Elsewhere
//! (GPU, another world size or thread count, non-deterministic mode) the metrics must agree
//! within stated tolerances: validation top-1 within [`TOP1_TOLERANCE`] and training loss within
//! [`LOSS_RELATIVE_TOLERANCE`] of the original.

use crate::run_dir::manifest::Manifest;

/// Absolute difference allowed in validation top-1 when bit-equality is not expected.
pub const TOP1_TOLERANCE: f64 = 0.05;
/// Relative difference allowed in training loss when bit-equality is not expected.
pub const LOSS_RELATIVE_TOLERANCE: f64 = 0.10;

#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    pub reproduced: bool,
    /// Whether the comparison demanded bit-equality.
    pub exact: bool,
    pub lines: Vec<String>,
}

/// Compares a re-run (`again`, launched with `world_size` ranks and stopped after `epochs`)
/// with the `original` run's manifest.
pub fn compare(original: &Manifest, again: &Manifest, epochs: u32, world_size: usize) -> Verdict {
    let exact = original.deterministic
        && original.job.device == "Cpu"
        && again.job.device == "Cpu"
        && original.job.world_size == world_size
        && original.job.threads_per_rank == again.job.threads_per_rank;
    let mut lines = vec![format!(
        "comparison: {} (original: {} rank(s) on {}, {} thread(s) per rank, deterministic {}; re-run: {} rank(s) on {}, {} thread(s))",
        if exact { "bit-identical expected" } else { "within tolerances" },
        original.job.world_size,
        original.job.device,
        original.job.threads_per_rank,
        original.deterministic,
        world_size,
        again.job.device,
        again.job.threads_per_rank,
    )];
    let mut reproduced = true;
    if original.rtrain_version != again.rtrain_version {
        lines.push(format!(
            "rtrain: re-run with {}, the original ran {} (another version may compute differently)",
            again.rtrain_version, original.rtrain_version
        ));
    }

    for (before, after) in original.data.iter().zip(&again.data) {
        if before.sha256 != after.sha256 {
            reproduced = false;
            lines.push(format!(
                "data {}: differs ({} files, sha256 {} vs {} originally)",
                after.split, after.images, after.sha256, before.sha256
            ));
        }
    }

    for after in &again.epochs {
        let Some(before) = original.epochs.iter().find(|e| e.epoch == after.epoch) else {
            reproduced = false;
            lines.push(format!("epoch {}: not in the original manifest", after.epoch + 1));
            continue;
        };
        let same = if exact {
            before.train_loss == after.train_loss
                && before.val_loss == after.val_loss
                && before.val_top1 == after.val_top1
        } else {
            (before.val_top1 - after.val_top1).abs() <= TOP1_TOLERANCE
                && (before.train_loss - after.train_loss).abs()
                    <= LOSS_RELATIVE_TOLERANCE * before.train_loss.abs()
        };
        reproduced &= same;
        lines.push(format!(
            "epoch {}: {} train loss {:.6} (originally {:.6}), val top-1 {:.4} (originally {:.4})",
            after.epoch + 1,
            if same { "ok  " } else { "DIFF" },
            after.train_loss,
            before.train_loss,
            after.val_top1,
            before.val_top1
        ));
    }
    // Early stopping within the epochs re-run must end the re-run after the same epoch where
    // bit-equality is expected; within tolerances a metric may cross `min_delta` elsewhere, and
    // the re-run ends where the original did anyway (`rtrain reproduce` stops it there).
    let stopped = |manifest: &Manifest| manifest.stopped_early.as_ref().map(|stop| stop.epoch);
    let original_stop = stopped(original).filter(|&epoch| epoch <= epochs);
    if original_stop != stopped(again) {
        // A difference fails the comparison only where bit-equality is expected.
        reproduced &= !exact;
        let describe = |stop: Option<u32>| {
            stop.map_or("did not stop early".to_string(), |e| format!("stopped early after epoch {e}"))
        };
        lines.push(format!(
            "early stopping: {} the re-run {}, the original {}",
            if exact { "DIFF" } else { "(not required within tolerances)" },
            describe(stopped(again)),
            describe(original_stop)
        ));
    } else if let Some(epoch) = original_stop {
        lines.push(format!("early stopping: ok   after epoch {epoch}, as the original"));
    }
    let expected_epochs = original_stop.unwrap_or(epochs);
    if (again.epochs.len() as u32) < expected_epochs {
        reproduced = false;
        lines.push(format!("the re-run recorded {} of {expected_epochs} epochs", again.epochs.len()));
    }

    let full_run = epochs == original.config.train.epochs || original_stop.is_some();
    if let (true, true, Some(before), Some(after)) = (full_run, exact, &original.weights, &again.weights) {
        let same = before.sha256 == after.sha256;
        reproduced &= same;
        lines.push(match same {
            true => format!("final weights: identical (sha256 {})", after.sha256),
            false => {
                format!("final weights: DIFFER (sha256 {} vs {} originally)", after.sha256, before.sha256)
            }
        });
    }
    lines.push(if reproduced { "reproduced".to_string() } else { "NOT reproduced".to_string() });
    Verdict { reproduced, exact, lines }
}
