//! Optimizers (SGD with momentum/Nesterov/weight decay, Adam, AdamW) and learning-rate schedules,
//! written over named tensors so that their state can be checkpointed and resumed exactly.
//!
//! tch's own optimizers cannot save their momentum buffers. These follow `torch.optim`'s
//! single-tensor algorithms operation for operation (tests/reference/optim_reference.py checks
//! them against PyTorch on the same libtorch), and keep their state under PyTorch's names:
//! `momentum_buffer`, `exp_avg`, `exp_avg_sq`.

use std::collections::BTreeMap;

use tch::{TchError, Tensor};

use crate::config::{OptimConfig, OptimKind, PlateauMode, ScheduleConfig, ScheduleKind, ThresholdMode};
use crate::run_dir::checkpoint::PlateauState;

#[derive(Debug, thiserror::Error)]
pub enum OptimError {
    #[error("optimizer state: {0}")]
    Torch(#[from] TchError),
    #[error("optimizer state for {name}: {problem}")]
    State { name: String, problem: String },
}

/// One parameter and its per-parameter state.
struct Slot {
    name: String,
    param: Tensor,
    /// SGD: [momentum_buffer]; Adam and AdamW: [exp_avg, exp_avg_sq]. Empty until the first step,
    /// as in PyTorch (SGD's first momentum buffer is a copy of the gradient, not zeros).
    state: Vec<Tensor>,
}

pub struct Optimizer {
    settings: OptimConfig,
    slots: Vec<Slot>,
    /// Steps taken; Adam's bias correction depends on it.
    steps: u64,
}

impl Optimizer {
    pub fn new(config: &OptimConfig, params: Vec<(String, Tensor)>) -> Optimizer {
        let slots = params.into_iter().map(|(name, param)| Slot { name, param, state: Vec::new() }).collect();
        Optimizer { settings: config.clone(), slots, steps: 0 }
    }

    pub fn steps(&self) -> u64 {
        self.steps
    }

    pub fn zero_grad(&mut self) {
        for slot in &mut self.slots {
            slot.param.zero_grad();
        }
    }

    /// Applies one update with learning rate `lr` to every parameter that has a gradient.
    pub fn step(&mut self, lr: f64) -> Result<(), OptimError> {
        self.steps += 1;
        let steps = self.steps;
        let config = self.settings.clone();
        // SGD's multipliers as 0-dim tensors, made once per step rather than once per parameter.
        let kind = self.slots.first().map_or(tch::Kind::Float, |slot| slot.param.kind());
        let scalar = |value: f64| Tensor::from(value).to_kind(kind);
        let sgd = SgdScalars {
            weight_decay: scalar(config.weight_decay),
            momentum: scalar(config.momentum),
            neg_lr: scalar(-lr),
        };
        tch::no_grad(|| {
            for slot in &mut self.slots {
                let grad = slot.param.grad();
                if !grad.defined() {
                    continue;
                }
                match config.name {
                    OptimKind::Sgd => sgd_update(&config, &sgd, slot, &grad)?,
                    OptimKind::Adam => adam_update(&config, lr, steps, slot, &grad, WeightDecay::L2)?,
                    OptimKind::Adamw => adam_update(&config, lr, steps, slot, &grad, WeightDecay::Decoupled)?,
                }
            }
            Ok(())
        })
    }

    fn state_names(&self) -> &'static [&'static str] {
        match self.settings.name {
            OptimKind::Sgd if self.settings.momentum == 0.0 => &[],
            OptimKind::Sgd => &["momentum_buffer"],
            OptimKind::Adam | OptimKind::Adamw => &["exp_avg", "exp_avg_sq"],
        }
    }

    /// The state as named tensors: `<state name>.<parameter name>`.
    pub fn state_tensors(&self) -> Vec<(String, Tensor)> {
        let names = self.state_names();
        let mut out = Vec::new();
        for slot in &self.slots {
            for (state_name, tensor) in names.iter().zip(&slot.state) {
                out.push((format!("{state_name}.{}", slot.name), tensor.shallow_clone()));
            }
        }
        out
    }

    /// Restores what [`Self::state_tensors`] saved after `steps` steps.
    pub fn load_state(&mut self, tensors: &BTreeMap<String, Tensor>, steps: u64) -> Result<(), OptimError> {
        let names = self.state_names();
        for slot in &mut self.slots {
            let mut state = Vec::new();
            for state_name in names {
                match tensors.get(&format!("{state_name}.{}", slot.name)) {
                    Some(t) if t.size() == slot.param.size() => {
                        state.push(t.to_kind(slot.param.kind()).to_device(slot.param.device()))
                    }
                    Some(t) => {
                        return Err(OptimError::State {
                            name: slot.name.clone(),
                            problem: format!(
                                "{state_name} has shape {:?}, expected {:?}",
                                t.size(),
                                slot.param.size()
                            ),
                        })
                    }
                    None => break,
                }
            }
            if !state.is_empty() && state.len() != names.len() {
                return Err(OptimError::State {
                    name: slot.name.clone(),
                    problem: "incomplete state".into(),
                });
            }
            if state.is_empty() && steps > 0 && !names.is_empty() && slot.param.requires_grad() {
                return Err(OptimError::State {
                    name: slot.name.clone(),
                    problem: format!("missing {} after {steps} steps", names.join("/")),
                });
            }
            slot.state = state;
        }
        self.steps = steps;
        Ok(())
    }
}

/// SGD's per-step multipliers, as the 0-dim tensors `addcmul_` takes.
struct SgdScalars {
    weight_decay: Tensor,
    momentum: Tensor,
    neg_lr: Tensor,
}

/// torch.optim.SGD, single-tensor path (dampening 0).
///
/// Same arithmetic as PyTorch, in four passes and no allocation after the first step: `x + a*y`
/// is `x.addcmul_(y, a)` with `a` a 0-dim tensor (tch has no `alpha` argument), and the gradient
/// is updated in place since nothing reads it after the step.
fn sgd_update(config: &OptimConfig, s: &SgdScalars, slot: &mut Slot, grad: &Tensor) -> Result<(), TchError> {
    let mut d_p = grad.shallow_clone();
    if config.weight_decay != 0.0 {
        let _ = d_p.f_addcmul_(&slot.param, &s.weight_decay)?;
    }
    if config.momentum != 0.0 {
        match slot.state.first_mut() {
            None => slot.state.push(d_p.detach().copy()),
            Some(buf) => {
                let _ = buf.f_mul_scalar_(config.momentum)?;
                let _ = buf.f_add_(&d_p)?;
            }
        }
        let buf = &slot.state[0];
        if config.nesterov {
            let _ = d_p.f_addcmul_(buf, &s.momentum)?;
        } else {
            d_p = buf.shallow_clone();
        }
    }
    let _ = slot.param.f_addcmul_(&d_p, &s.neg_lr)?;
    Ok(())
}

/// How Adam applies `optim.weight_decay`.
#[derive(Clone, Copy, PartialEq, Eq)]
enum WeightDecay {
    /// torch.optim.Adam: `weight_decay * param` added to the gradient (L2 regularisation).
    L2,
    /// torch.optim.AdamW: the parameter shrunk by `lr * weight_decay` before the update.
    Decoupled,
}

/// torch.optim.Adam and AdamW, single-tensor path (amsgrad off).
fn adam_update(
    config: &OptimConfig,
    lr: f64,
    step: u64,
    slot: &mut Slot,
    grad: &Tensor,
    decay: WeightDecay,
) -> Result<(), TchError> {
    let [beta1, beta2] = config.betas;
    if slot.state.is_empty() {
        slot.state.push(slot.param.f_zeros_like()?);
        slot.state.push(slot.param.f_zeros_like()?);
    }
    let weight_decay = config.weight_decay;
    let l2_grad;
    let grad = match decay {
        _ if weight_decay == 0.0 => grad,
        WeightDecay::L2 => {
            // grad.add(param, alpha=weight_decay), a new tensor as in PyTorch.
            l2_grad = grad.f_add(&slot.param.f_mul_scalar(weight_decay)?)?;
            &l2_grad
        }
        WeightDecay::Decoupled => {
            let _ = slot.param.f_mul_scalar_(1.0 - lr * weight_decay)?;
            grad
        }
    };
    let (exp_avg, exp_avg_sq) = slot.state.split_at_mut(1);
    let (exp_avg, exp_avg_sq) = (&mut exp_avg[0], &mut exp_avg_sq[0]);
    let _ = exp_avg.f_lerp_(grad, 1.0 - beta1)?;
    let _ = exp_avg_sq.f_mul_scalar_(beta2)?;
    let _ = exp_avg_sq.f_addcmul_(&grad.f_mul_scalar(1.0 - beta2)?, grad)?;
    let step = step as f64;
    let bias_correction1 = 1.0 - beta1.powf(step);
    let bias_correction2 = 1.0 - beta2.powf(step);
    let step_size = lr / bias_correction1;
    let denom = exp_avg_sq.f_sqrt()?.f_div_scalar(bias_correction2.sqrt())?.f_add_scalar(config.eps)?;
    // addcdiv_(exp_avg, denom, value=-step_size) computes param + value * (exp_avg / denom).
    let _ = slot.param.f_add_(&exp_avg.f_div(&denom)?.f_mul_scalar(-step_size)?)?;
    Ok(())
}

/// Per-step learning rate: linear warm-up (torch's LinearLR) then cosine (CosineAnnealingLR),
/// step decay (StepLR) or constant, all in closed form of the global step so a resumed run
/// needs no scheduler state; or ReduceLROnPlateau, stepped after each epoch's evaluation, whose
/// state checkpoints carry.
#[derive(Debug, Clone)]
pub struct Schedule {
    kind: ScheduleKind,
    base_lr: f64,
    min_lr: f64,
    warmup_steps: u64,
    warmup_start_factor: f64,
    total_steps: u64,
    step_every: u64,
    gamma: f64,
    /// Present for `ScheduleKind::Plateau`.
    plateau: Option<Plateau>,
}

impl Schedule {
    pub fn new(config: &ScheduleConfig, base_lr: f64, steps_per_epoch: u64, epochs: u32) -> Schedule {
        let steps_per_epoch = steps_per_epoch.max(1);
        Schedule {
            kind: config.kind,
            base_lr,
            min_lr: config.min_lr,
            warmup_steps: (config.warmup_epochs * steps_per_epoch as f64).round() as u64,
            warmup_start_factor: config.warmup_start_factor,
            total_steps: steps_per_epoch * u64::from(epochs),
            step_every: steps_per_epoch * u64::from(config.step_epochs),
            gamma: config.gamma,
            plateau: (config.kind == ScheduleKind::Plateau).then(|| Plateau::new(config, base_lr)),
        }
    }

    pub fn lr(&self, step: u64) -> f64 {
        // Plateau reduces the rate the warm-up ramps to.
        let base_lr = self.plateau.as_ref().map_or(self.base_lr, |plateau| plateau.state.lr);
        if step < self.warmup_steps {
            let progress = step as f64 / self.warmup_steps as f64;
            return base_lr * (self.warmup_start_factor + (1.0 - self.warmup_start_factor) * progress);
        }
        let since = step - self.warmup_steps;
        match self.kind {
            ScheduleKind::Constant | ScheduleKind::Plateau => base_lr,
            ScheduleKind::Step => self.base_lr * self.gamma.powi((since / self.step_every.max(1)) as i32),
            ScheduleKind::Cosine => {
                let span = self.total_steps.saturating_sub(self.warmup_steps).max(1);
                let t = (since.min(span)) as f64 / span as f64;
                self.min_lr + (self.base_lr - self.min_lr) * (1.0 + (std::f64::consts::PI * t).cos()) / 2.0
            }
        }
    }

    /// Tells the schedule an epoch's global validation loss and top-1; ReduceLROnPlateau steps
    /// on the one its mode watches. Returns the new learning rate when it reduced it.
    pub fn after_evaluation(&mut self, val_loss: f64, val_top1: f64) -> Option<f64> {
        let plateau = self.plateau.as_mut()?;
        let metric = match plateau.mode {
            PlateauMode::Min => val_loss,
            PlateauMode::Max => val_top1,
        };
        plateau.step(metric)
    }

    /// ReduceLROnPlateau's state, for checkpoints.
    pub fn plateau_state(&self) -> Option<PlateauState> {
        self.plateau.as_ref().map(|plateau| plateau.state.clone())
    }

    /// Continues from a checkpoint's ReduceLROnPlateau state (none: as it starts).
    pub fn restore_plateau(&mut self, state: Option<PlateauState>) {
        if let (Some(plateau), Some(state)) = (self.plateau.as_mut(), state) {
            plateau.state = state;
        }
    }
}

/// torch.optim.lr_scheduler.ReduceLROnPlateau, operation for operation.
#[derive(Debug, Clone)]
struct Plateau {
    mode: PlateauMode,
    factor: f64,
    patience: u32,
    threshold: f64,
    threshold_mode: ThresholdMode,
    cooldown: u32,
    min_lr: f64,
    state: PlateauState,
}

impl Plateau {
    /// torch's `eps`: a reduction smaller than this is not applied.
    const EPS: f64 = 1e-8;

    fn new(config: &ScheduleConfig, base_lr: f64) -> Plateau {
        Plateau {
            mode: config.mode,
            factor: config.factor,
            patience: config.patience,
            threshold: config.threshold,
            threshold_mode: config.threshold_mode,
            cooldown: config.cooldown,
            min_lr: config.min_lr,
            state: PlateauState { lr: base_lr, best: None, num_bad_epochs: 0, cooldown_counter: 0 },
        }
    }

    fn is_better(&self, current: f64) -> bool {
        let Some(best) = self.state.best else { return !current.is_nan() };
        match (self.mode, self.threshold_mode) {
            (PlateauMode::Min, ThresholdMode::Rel) => current < best * (1.0 - self.threshold),
            (PlateauMode::Min, ThresholdMode::Abs) => current < best - self.threshold,
            (PlateauMode::Max, ThresholdMode::Rel) => current > best * (self.threshold + 1.0),
            (PlateauMode::Max, ThresholdMode::Abs) => current > best + self.threshold,
        }
    }

    /// One epoch's metric; the new learning rate when it reduced it.
    fn step(&mut self, current: f64) -> Option<f64> {
        if self.is_better(current) {
            self.state.best = Some(current);
            self.state.num_bad_epochs = 0;
        } else {
            self.state.num_bad_epochs += 1;
        }
        if self.state.cooldown_counter > 0 {
            self.state.cooldown_counter -= 1;
            self.state.num_bad_epochs = 0;
        }
        if self.state.num_bad_epochs <= self.patience {
            return None;
        }
        self.state.cooldown_counter = self.cooldown;
        self.state.num_bad_epochs = 0;
        let reduced = (self.state.lr * self.factor).max(self.min_lr);
        if self.state.lr - reduced <= Self::EPS {
            return None;
        }
        self.state.lr = reduced;
        Some(reduced)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    #[test]
    fn warmup_then_cosine_reaches_min() {
        let mut config = Config::default().schedule;
        config.warmup_epochs = 1.0;
        config.warmup_start_factor = 0.1;
        config.min_lr = 0.001;
        let schedule = Schedule::new(&config, 0.1, 10, 5);
        assert!((schedule.lr(0) - 0.01).abs() < 1e-12);
        assert!((schedule.lr(5) - 0.055).abs() < 1e-12);
        assert!((schedule.lr(10) - 0.1).abs() < 1e-12);
        assert!((schedule.lr(30) - (0.001 + 0.099 * 0.5)).abs() < 1e-12, "halfway through the cosine");
        assert!((schedule.lr(50) - 0.001).abs() < 1e-12);
    }

    #[test]
    fn step_decay() {
        let mut config = Config::default().schedule;
        config.kind = ScheduleKind::Step;
        config.warmup_epochs = 0.0;
        config.step_epochs = 2;
        config.gamma = 0.5;
        let schedule = Schedule::new(&config, 0.8, 10, 10);
        assert_eq!(schedule.lr(19), 0.8);
        assert_eq!(schedule.lr(20), 0.4);
        assert_eq!(schedule.lr(45), 0.2);
    }

    #[test]
    fn plateau_resumed_from_its_state_continues_exactly() {
        let mut config = Config::default().schedule;
        config.kind = ScheduleKind::Plateau;
        config.warmup_epochs = 0.0;
        config.patience = 1;
        let metrics = [1.0, 0.9, 0.95, 0.96, 0.97, 0.5, 0.6, 0.7, 0.8, 0.9];
        let run = |schedule: &mut Schedule, metrics: &[f64]| -> Vec<f64> {
            metrics
                .iter()
                .map(|&m| schedule.after_evaluation(m, 0.0).map_or(schedule.lr(0), |lr| lr))
                .collect()
        };
        let mut whole = Schedule::new(&config, 0.1, 10, 10);
        let uninterrupted = run(&mut whole, &metrics);
        assert!(uninterrupted.iter().any(|&lr| lr < 0.1), "it must reduce: {uninterrupted:?}");
        let mut first = Schedule::new(&config, 0.1, 10, 10);
        let mut resumed_lrs = run(&mut first, &metrics[..4]);
        let saved: PlateauState =
            serde_json::from_str(&serde_json::to_string(&first.plateau_state()).unwrap()).unwrap();
        let mut resumed = Schedule::new(&config, 0.1, 10, 10);
        resumed.restore_plateau(Some(saved));
        resumed_lrs.extend(run(&mut resumed, &metrics[4..]));
        assert_eq!(resumed_lrs, uninterrupted);
    }

    #[test]
    fn state_round_trips() {
        let config = OptimConfig { name: OptimKind::Sgd, ..Config::default().optim };
        let param = Tensor::from_slice(&[1.0f32, -2.0]).set_requires_grad(true);
        let mut optimizer = Optimizer::new(&config, vec![("w".into(), param.shallow_clone())]);
        let loss = (&param * &param).sum(tch::Kind::Float);
        loss.backward();
        optimizer.step(0.1).unwrap();
        let saved: BTreeMap<String, Tensor> =
            optimizer.state_tensors().into_iter().map(|(n, t)| (n, t.copy())).collect();
        assert_eq!(saved.keys().collect::<Vec<_>>(), vec!["momentum_buffer.w"]);
        let mut restored = Optimizer::new(&config, vec![("w".into(), param.shallow_clone())]);
        restored.load_state(&saved, 1).unwrap();
        assert!(restored.state_tensors()[0].1.equal(&saved["momentum_buffer.w"]));
        let empty = BTreeMap::new();
        let err = restored.load_state(&empty, 1).err().unwrap().to_string();
        assert!(err.contains("momentum_buffer") && err.contains(" w"), "{err}");
    }
}
