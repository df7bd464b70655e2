//! The cross-entropy's class weights, `train.class_weights`: none, one given weight per class,
//! or scikit-learn's "balanced" rule counted over the training split. The loss uses them as
//! PyTorch's `CrossEntropyLoss(weight=...)` does: each image's loss is multiplied by its true
//! class's weight and the batch's mean divides by the sum of those weights (with label
//! smoothing, the smoothing term weighs each class by its own weight, as PyTorch's does).

use std::path::PathBuf;

use crate::config::{ClassWeightRule, ClassWeights};

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ClassWeightsError {
    #[error(
        "train.class_weights = \"balanced\": class {class:?} has no image in {}, so its weight would be infinite; give the weights as a list instead",
        dir.display()
    )]
    EmptyClass { class: String, dir: PathBuf },
    #[error("train.class_weights gives {given} weights, but {} has {classes} classes ({names:?})", dir.display())]
    Count { given: usize, classes: usize, names: Vec<String>, dir: PathBuf },
}

/// The weights `setting` gives the classes `classes` of the training split at `dir`, whose
/// class `c` has `counts[c]` images; None for the plain cross-entropy.
pub fn resolve(
    setting: &ClassWeights,
    classes: &[String],
    counts: &[u64],
    dir: PathBuf,
) -> Result<Option<Vec<f64>>, ClassWeightsError> {
    match setting {
        ClassWeights::Rule(ClassWeightRule::None) => Ok(None),
        ClassWeights::Rule(ClassWeightRule::Balanced) => {
            if let Some(empty) = counts.iter().position(|&count| count == 0) {
                return Err(ClassWeightsError::EmptyClass { class: classes[empty].clone(), dir });
            }
            Ok(Some(balanced(counts)))
        }
        ClassWeights::PerClass(weights) if weights.len() == classes.len() => Ok(Some(weights.clone())),
        ClassWeights::PerClass(weights) => Err(ClassWeightsError::Count {
            given: weights.len(),
            classes: classes.len(),
            names: classes.to_vec(),
            dir,
        }),
    }
}

/// scikit-learn's `compute_class_weight("balanced")`: `n_samples / (n_classes * count_c)`, so
/// that every class weighs `n_samples / n_classes` in all.
pub fn balanced(counts: &[u64]) -> Vec<f64> {
    let total: u64 = counts.iter().sum();
    let classes = counts.len() as f64;
    counts.iter().map(|&count| total as f64 / (classes * count as f64)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("C{i}")).collect()
    }

    #[test]
    fn balanced_weights_are_scikit_learns() {
        // compute_class_weight("balanced", classes=[0, 1, 2], y=[0]*70 + [1]*20 + [2]*10)
        // = [100/210, 100/60, 100/30].
        let weights = balanced(&[70, 20, 10]);
        for (got, want) in weights.iter().zip([100.0 / 210.0, 100.0 / 60.0, 100.0 / 30.0]) {
            assert!((got - want).abs() < 1e-15, "{weights:?}");
        }
        let per_class_total: Vec<f64> = weights.iter().zip([70.0, 20.0, 10.0]).map(|(w, n)| w * n).collect();
        assert!(per_class_total.iter().all(|t| (t - 100.0 / 3.0).abs() < 1e-12), "{per_class_total:?}");
    }

    #[test]
    fn settings_resolve_or_name_the_problem() {
        let dir = PathBuf::from("data/train");
        let balanced = ClassWeights::Rule(ClassWeightRule::Balanced);
        assert_eq!(
            resolve(&ClassWeights::Rule(ClassWeightRule::None), &names(2), &[3, 1], dir.clone()),
            Ok(None)
        );
        assert_eq!(resolve(&balanced, &names(2), &[3, 1], dir.clone()), Ok(Some(vec![4.0 / 6.0, 2.0])));
        let err = resolve(&balanced, &names(3), &[3, 0, 1], dir.clone()).unwrap_err().to_string();
        assert!(err.contains("\"C1\"") && err.contains("data/train"), "{err}");
        let given = ClassWeights::PerClass(vec![1.0, 2.0]);
        assert_eq!(resolve(&given, &names(2), &[3, 1], dir.clone()), Ok(Some(vec![1.0, 2.0])));
        let err = resolve(&given, &names(3), &[3, 1, 1], dir).unwrap_err().to_string();
        assert!(err.contains("gives 2 weights") && err.contains("3 classes"), "{err}");
    }
}
