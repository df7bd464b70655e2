//! Early stopping, `train.early_stopping`: after each epoch's evaluation, whether the watched
//! validation metric improved on its best by more than `min_delta`, and whether `patience`
//! evaluations have passed without that (Lightning's `EarlyStopping`). The evaluations are
//! already summed over the ranks, so every rank decides the same.

use crate::config::{EarlyStoppingConfig, StopMetric, StopMode};
use crate::run_dir::checkpoint::EarlyStoppingState;
use crate::run_dir::records::{EarlyStop, EvalReport};

pub struct EarlyStopping {
    rule: EarlyStoppingConfig,
    state: EarlyStoppingState,
}

impl EarlyStopping {
    pub fn new(config: &EarlyStoppingConfig) -> EarlyStopping {
        EarlyStopping { rule: config.clone(), state: EarlyStoppingState::default() }
    }

    /// Continues from a checkpoint's state.
    pub fn restore(&mut self, state: EarlyStoppingState) {
        self.state = state;
    }

    /// For checkpoints.
    pub fn state(&self) -> EarlyStoppingState {
        self.state.clone()
    }

    /// Takes the evaluation after epoch `epoch` (0-based) into account; returns the stop when
    /// training should end after this epoch.
    pub fn after_evaluation(&mut self, epoch: u32, val: &EvalReport) -> Option<EarlyStop> {
        let value = watched_value(self.rule.metric, val)?;
        let improved = value.is_finite()
            && self.state.best.is_none_or(|best| match self.lower_is_better() {
                true => value < best - self.rule.min_delta,
                false => value > best + self.rule.min_delta,
            });
        self.state.last = Some(value);
        if improved {
            (self.state.best, self.state.best_epoch, self.state.bad_epochs) =
                (Some(value), Some(epoch + 1), 0);
        } else {
            self.state.bad_epochs += 1;
        }
        self.stop_after(epoch + 1)
    }

    /// The stop recorded by the state, if it says training is over after epoch `epoch`
    /// (1-based): a checkpoint written after the stop, from which a resumed run must not train on.
    pub fn stop_after(&self, epoch: u32) -> Option<EarlyStop> {
        let state = &self.state;
        if self.rule.metric == StopMetric::None || state.bad_epochs < self.rule.patience.max(1) {
            return None;
        }
        Some(EarlyStop {
            epoch,
            metric: metric_name(self.rule.metric).to_string(),
            value: state.last.filter(|v| v.is_finite()),
            best: state.best,
            best_epoch: state.best_epoch,
            patience: self.rule.patience,
            min_delta: self.rule.min_delta,
        })
    }

    fn lower_is_better(&self) -> bool {
        match self.rule.mode {
            StopMode::Min => true,
            StopMode::Max => false,
            StopMode::Auto => self.rule.metric == StopMetric::ValLoss,
        }
    }
}

/// The metric's value in an evaluation (None when early stopping is off; NaN for a kappa an
/// evaluation could not compute, which is never an improvement).
fn watched_value(metric: StopMetric, val: &EvalReport) -> Option<f64> {
    Some(match metric {
        StopMetric::None => return None,
        StopMetric::ValLoss => val.loss,
        StopMetric::ValTop1 => val.top1,
        StopMetric::ValMacroF1 => val.ordinal.macro_f1,
        StopMetric::ValBalancedAccuracy => val.ordinal.balanced_accuracy,
        StopMetric::ValQuadraticKappa => val.ordinal.quadratic_kappa.unwrap_or(f64::NAN),
    })
}

/// As the configuration spells it.
pub fn metric_name(metric: StopMetric) -> &'static str {
    match metric {
        StopMetric::None => "none",
        StopMetric::ValLoss => "val_loss",
        StopMetric::ValTop1 => "val_top1",
        StopMetric::ValMacroF1 => "val_macro_f1",
        StopMetric::ValBalancedAccuracy => "val_balanced_accuracy",
        StopMetric::ValQuadraticKappa => "val_quadratic_kappa",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(loss: f64, top1: f64) -> EvalReport {
        EvalReport { loss, top1, ..EvalReport::default() }
    }

    fn stopping(metric: StopMetric, mode: StopMode, patience: u32, min_delta: f64) -> EarlyStopping {
        EarlyStopping::new(&EarlyStoppingConfig { metric, mode, patience, min_delta })
    }

    /// The epoch (1-based) after which each sequence of values stops, as Lightning's
    /// EarlyStopping(monitor, mode, patience, min_delta) decides: wait += 1 unless the value
    /// beats the best by more than min_delta; stop when wait >= patience.
    #[test]
    fn stops_after_patience_evaluations_without_improvement() {
        let stop_epoch = |mut s: EarlyStopping, losses: &[f64]| {
            losses.iter().enumerate().find_map(|(e, &l)| s.after_evaluation(e as u32, &report(l, 1.0 - l)))
        };
        let losses = [1.0, 0.8, 0.79, 0.85, 0.9, 0.5];
        let stop = stop_epoch(stopping(StopMetric::ValLoss, StopMode::Auto, 2, 0.0), &losses).unwrap();
        assert_eq!((stop.epoch, stop.best_epoch, stop.best), (5, Some(3), Some(0.79)));
        // min_delta 0.05: 0.79 is not better than 0.8 by more than 0.05.
        let stop = stop_epoch(stopping(StopMetric::ValLoss, StopMode::Auto, 2, 0.05), &losses).unwrap();
        assert_eq!((stop.epoch, stop.best_epoch), (4, Some(2)));
        // top-1 = 1 - loss, watched with max: the same decisions.
        let stop = stop_epoch(stopping(StopMetric::ValTop1, StopMode::Auto, 2, 0.0), &losses).unwrap();
        assert_eq!((stop.epoch, stop.metric.as_str()), (5, "val_top1"));
        // The loss watched with mode = max: every fall is a setback.
        let stop = stop_epoch(stopping(StopMetric::ValLoss, StopMode::Max, 1, 0.0), &losses).unwrap();
        assert_eq!(stop.epoch, 2);
        assert!(stop_epoch(stopping(StopMetric::None, StopMode::Auto, 1, 0.0), &losses).is_none());
        assert!(stop_epoch(stopping(StopMetric::ValLoss, StopMode::Auto, 3, 0.0), &losses).is_none());
    }

    #[test]
    fn a_restored_state_continues_where_it_stood() {
        let mut first = stopping(StopMetric::ValLoss, StopMode::Auto, 2, 0.0);
        assert!(first.after_evaluation(0, &report(1.0, 0.0)).is_none());
        assert!(first.after_evaluation(1, &report(1.2, 0.0)).is_none());
        let mut resumed = stopping(StopMetric::ValLoss, StopMode::Auto, 2, 0.0);
        resumed.restore(first.state());
        assert_eq!(resumed.after_evaluation(2, &report(1.1, 0.0)).map(|s| s.epoch), Some(3));
        assert_eq!(resumed.stop_after(3).and_then(|s| s.best_epoch), Some(1), "the state remembers the stop");
        let mut fresh = stopping(StopMetric::ValLoss, StopMode::Auto, 2, 0.0);
        assert!(fresh.after_evaluation(2, &report(1.1, 0.0)).is_none(), "without the state it would go on");
    }

    /// A kappa that is never a number (a one-class validation split) never improves: the run
    /// stops after `patience` epochs, and the record, without numbers, survives JSON.
    #[test]
    fn a_metric_that_is_never_a_number_stops_and_records_as_json() {
        let mut s = stopping(StopMetric::ValQuadraticKappa, StopMode::Auto, 2, 0.0);
        assert!(s.after_evaluation(0, &report(1.0, 0.5)).is_none());
        let stop = s.after_evaluation(1, &report(1.0, 0.5)).unwrap();
        assert_eq!((stop.epoch, stop.best, stop.value), (2, None, None));
        let text = serde_json::to_string(&stop).unwrap();
        assert_eq!(serde_json::from_str::<EarlyStop>(&text).unwrap(), stop, "{text}");
        assert!(stop.reason().contains("never a number"), "{}", stop.reason());
    }
}
