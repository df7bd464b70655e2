//! Seed statistics for `rtrain report`: runs whose resolved configurations differ only in
//! `run.seed` (and where they were written: `run.name`, `run.dir`) form a group; for each group
//! and metric, n, mean, standard deviation, the 95% Student-t interval of the mean, min and max;
//! each pair of groups compared by the difference of their means with Welch's 95% interval and
//! test (as `scipy.stats.ttest_ind(equal_var=False)`).

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value;
use statrs::distribution::{ContinuousCDF, StudentsT};

/// Configuration keys that never make runs differ: the seed, and where the run was written.
pub const ALWAYS_IGNORED: [&str; 3] = ["run.seed", "run.name", "run.dir"];

/// A configuration flattened to `section.key` -> value (JSON text).
type FlatConfig = BTreeMap<String, String>;

/// What grouping needs of a run: its name and resolved configuration (None without a manifest).
pub struct SeedRun {
    pub name: String,
    pub config: Option<Value>,
}

/// One metric's value for each run given to [`statistics`], in their order (None where a run
/// lacks it: a kappa undefined, no `evaluation/`).
pub struct MetricValues {
    pub name: &'static str,
    pub values: Vec<Option<f64>>,
}

/// Runs that differ only in their seeds.
#[derive(Debug, Clone, PartialEq)]
pub struct Group {
    /// What sets it apart from the other groups (`optim.lr=0.1, data.jpeg_draft=true`), or
    /// `all runs` when there is one group; a run without a manifest is a group of its own,
    /// named after it.
    pub name: String,
    /// Indices into the runs given.
    pub runs: Vec<usize>,
}

/// Groups `runs` by their resolved configuration without `ignored` keys (dotted, as
/// `optim.lr`) and [`ALWAYS_IGNORED`], in the order of each group's first run.
pub fn groups(runs: &[SeedRun], ignored: &[String]) -> Vec<Group> {
    let ignored: Vec<&str> =
        ALWAYS_IGNORED.iter().copied().chain(ignored.iter().map(String::as_str)).collect();
    let keys: Vec<Option<FlatConfig>> =
        runs.iter().map(|run| run.config.as_ref().map(|config| flatten(config, &ignored))).collect();
    let mut groups: Vec<(Option<&FlatConfig>, Vec<usize>)> = Vec::new();
    for (index, key) in keys.iter().enumerate() {
        match groups.iter_mut().find(|(k, _)| key.is_some() && *k == key.as_ref()) {
            Some((_, members)) => members.push(index),
            None => groups.push((key.as_ref(), vec![index])),
        }
    }
    let configured: Vec<&FlatConfig> = groups.iter().filter_map(|(k, _)| *k).collect();
    groups
        .iter()
        .map(|(key, members)| {
            let name = match key {
                None => runs[members[0]].name.clone(),
                Some(_) if configured.len() < 2 => "all runs".to_string(),
                Some(key) => distinguishing(key, &configured),
            };
            Group { name, runs: members.clone() }
        })
        .collect()
}

/// `key=value` for each key whose value is not the same in every configuration.
fn distinguishing(config: &FlatConfig, all: &[&FlatConfig]) -> String {
    config
        .iter()
        .filter(|(key, value)| all.iter().any(|other| other.get(*key) != Some(value)))
        .map(|(key, value)| format!("{key}={value}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A JSON configuration as `section.key` -> value (JSON text), without `ignored` keys.
fn flatten(config: &Value, ignored: &[&str]) -> FlatConfig {
    fn walk(prefix: &str, value: &Value, out: &mut FlatConfig) {
        match value {
            Value::Object(map) => {
                for (key, value) in map {
                    let path = if prefix.is_empty() { key.clone() } else { format!("{prefix}.{key}") };
                    walk(&path, value, out);
                }
            }
            other => {
                out.insert(prefix.to_string(), other.to_string());
            }
        }
    }
    let mut out = FlatConfig::new();
    walk("", config, &mut out);
    out.retain(|key, _| !ignored.contains(&key.as_str()));
    out
}

/// One metric over one group's runs.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct SeedSummary {
    pub group: String,
    pub metric: String,
    pub n: usize,
    pub mean: f64,
    /// Sample standard deviation (n - 1 in the denominator); NaN for one run.
    pub sd: f64,
    /// The 95% Student-t interval of the mean: mean -/+ t(0.975, n - 1) sd / sqrt(n).
    pub ci_low: f64,
    pub ci_high: f64,
    pub min: f64,
    pub max: f64,
}

impl SeedSummary {
    /// The summary of `values` (at least one).
    pub fn of(group: &str, metric: &str, values: &[f64]) -> SeedSummary {
        let n = values.len();
        let (mean, variance) = mean_and_variance(values);
        let sd = variance.sqrt();
        let half = t_quantile(n as f64 - 1.0) * sd / (n as f64).sqrt();
        SeedSummary {
            group: group.to_string(),
            metric: metric.to_string(),
            n,
            mean,
            sd: if n > 1 { sd } else { f64::NAN },
            ci_low: mean - half,
            ci_high: mean + half,
            min: values.iter().copied().fold(f64::INFINITY, f64::min),
            max: values.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        }
    }
}

/// Two groups' means compared: `group_a` minus `group_b`, with Welch's 95% interval and test.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Comparison {
    pub metric: String,
    pub group_a: String,
    pub group_b: String,
    pub n_a: usize,
    pub n_b: usize,
    pub difference: f64,
    pub ci_low: f64,
    pub ci_high: f64,
    /// Welch's t statistic and its Welch-Satterthwaite degrees of freedom.
    pub t: f64,
    pub df: f64,
    /// Two-sided p-value.
    pub p: f64,
}

impl Comparison {
    /// Welch's comparison of `a` and `b` (each at least two values).
    pub fn welch(metric: &str, (group_a, a): (&str, &[f64]), (group_b, b): (&str, &[f64])) -> Comparison {
        let moments = |values: &[f64]| {
            let n = values.len() as f64;
            let (mean, variance) = mean_and_variance(values);
            (n, mean, variance / n)
        };
        let ((n_a, mean_a, se2_a), (n_b, mean_b, se2_b)) = (moments(a), moments(b));
        let se = (se2_a + se2_b).sqrt();
        let df = (se2_a + se2_b).powi(2) / (se2_a.powi(2) / (n_a - 1.0) + se2_b.powi(2) / (n_b - 1.0));
        // Two groups without spread give 0/0; SciPy's ttest_ind takes 1 degree of freedom
        // then (its `_unequal_var_ttest_denom`), and so does this, to report as it does.
        let df = if df.is_nan() { 1.0 } else { df };
        let difference = mean_a - mean_b;
        let t = difference / se;
        let half = t_quantile(df) * se;
        // Equal groups without spread give t = 0/0: no p-value, as SciPy reports (statrs'
        // survival function panics on NaN).
        let p = match t.is_nan() {
            true => f64::NAN,
            false => StudentsT::new(0.0, 1.0, df).map_or(f64::NAN, |dist| 2.0 * dist.sf(t.abs())),
        };
        Comparison {
            metric: metric.to_string(),
            group_a: group_a.to_string(),
            group_b: group_b.to_string(),
            n_a: a.len(),
            n_b: b.len(),
            difference,
            ci_low: difference - half,
            ci_high: difference + half,
            t,
            df,
            p,
        }
    }
}

/// The mean and the sample variance (n - 1 in the denominator; NaN for one value).
fn mean_and_variance(values: &[f64]) -> (f64, f64) {
    let n = values.len() as f64;
    let mean = values.iter().sum::<f64>() / n;
    (mean, values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0))
}

/// The 97.5th percentile of Student's t with `df` degrees of freedom (NaN for none).
fn t_quantile(df: f64) -> f64 {
    StudentsT::new(0.0, 1.0, df).map_or(f64::NAN, |dist| dist.inverse_cdf(0.975))
}

/// Every metric of every group with two or more runs, and every pair of such groups compared;
/// a metric is taken over the runs that have it.
pub fn statistics(metrics: &[MetricValues], groups: &[Group]) -> (Vec<SeedSummary>, Vec<Comparison>) {
    let seeded: Vec<&Group> = groups.iter().filter(|g| g.runs.len() > 1).collect();
    let mut summaries = Vec::new();
    let mut comparisons = Vec::new();
    for metric in metrics {
        let values =
            |group: &Group| -> Vec<f64> { group.runs.iter().filter_map(|&i| metric.values[i]).collect() };
        for group in &seeded {
            let values = values(group);
            if !values.is_empty() {
                summaries.push(SeedSummary::of(&group.name, metric.name, &values));
            }
        }
        for (i, a) in seeded.iter().enumerate() {
            for b in &seeded[i + 1..] {
                let (va, vb) = (values(a), values(b));
                if va.len() > 1 && vb.len() > 1 {
                    comparisons.push(Comparison::welch(metric.name, (&a.name, &va), (&b.name, &vb)));
                }
            }
        }
    }
    (summaries, comparisons)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_summary_of_three_seeds() {
        let s = SeedSummary::of("g", "m", &[0.5, 0.6, 0.7]);
        assert!((s.mean - 0.6).abs() < 1e-15 && (s.sd - 0.1).abs() < 1e-15, "{s:?}");
        // t(0.975, 2) = 4.302652729696142 (SciPy), so the half-width is 4.3027 * 0.1 / sqrt(3).
        let half = 4.302652729696142 * 0.1 / 3f64.sqrt();
        assert!((s.ci_high - (0.6 + half)).abs() < 1e-9, "{s:?}");
        assert_eq!((s.min, s.max, s.n), (0.5, 0.7, 3));
        assert!(SeedSummary::of("g", "m", &[0.5]).sd.is_nan());
    }

    /// Seeds that agree exactly (a small validation split): the interval is the mean, and two
    /// such groups compare as SciPy's `ttest_ind(equal_var=False)` reports them (t inf, df 1,
    /// p 0, interval [0.25, 0.25] for these values, from SciPy 1.16.3).
    #[test]
    fn groups_without_spread() {
        let summary = SeedSummary::of("a", "top1", &[0.5, 0.5, 0.5]);
        assert_eq!((summary.sd, summary.ci_low, summary.ci_high), (0.0, 0.5, 0.5));
        let c = Comparison::welch("top1", ("a", &[0.5, 0.5, 0.5]), ("b", &[0.25, 0.25, 0.25]));
        assert_eq!((c.t, c.df, c.p, c.ci_low, c.ci_high), (f64::INFINITY, 1.0, 0.0, 0.25, 0.25));
        // Two equal such groups: t and p NaN, df 1 (SciPy 1.16.3); `rtrain report` panicked.
        let same = Comparison::welch("top1", ("a", &[0.5, 0.5, 0.5]), ("b", &[0.5, 0.5, 0.5]));
        assert!(same.t.is_nan() && same.p.is_nan() && same.df == 1.0, "{same:?}");
    }

    #[test]
    fn configurations_are_flattened_without_ignored_keys() {
        let config =
            serde_json::json!({"run": {"seed": 3, "name": "a"}, "optim": {"lr": 0.1, "betas": [0.9, 0.99]}});
        let flat = flatten(&config, &["run.seed", "run.name"]);
        assert_eq!(flat.keys().collect::<Vec<_>>(), ["optim.betas", "optim.lr"]);
        assert_eq!(flat["optim.lr"], "0.1");
    }
}
