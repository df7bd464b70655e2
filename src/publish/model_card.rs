//! `MODEL_CARD.md`: the model card of Mitchell et al., "Model Cards for Model Reporting"
//! (FAT* 2019), in its nine sections. Every fact rtrain knows is filled in from the runs'
//! manifests, evaluations and seed statistics; what only the author can say (intended uses,
//! the factors that matter in the field, ethical considerations) is marked **[AUTHOR]**, with
//! the questions that section should answer.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use super::{name_and_link, Bundle, BundledRun, CITATION, REPORT_DIR};
use crate::metrics::Interval;
use crate::report::seeds::SeedSummary;
use crate::run_dir::manifest::DataSplit;

/// How a placeholder for the author starts, so that none is missed (`grep -n AUTHOR`).
pub const AUTHOR: &str = "**[AUTHOR]**";

/// The model card of `bundle`.
pub fn write(bundle: &Bundle) -> String {
    let mut md = String::new();
    let _ = writeln!(md, "# Model card: {}\n", bundle.title());
    let _ = writeln!(
        md,
        "The sections follow Mitchell et al., \"Model Cards for Model Reporting\" (FAT* 2019). Every fact was \
         filled in by `rtrain publish` from the {} run(s) in `runs/`; text marked {AUTHOR} is for the author \
         to write (then run `rtrain publish --seal` on this directory so that its checksums hold).\n",
        bundle.runs.len()
    );
    model_details(&mut md, bundle);
    intended_use(&mut md, bundle);
    factors(&mut md, bundle);
    metrics(&mut md);
    data(&mut md, bundle);
    quantitative_analyses(&mut md, bundle);
    ethical_considerations(&mut md);
    caveats(&mut md, bundle);
    md
}

/// A configuration value as the configuration file spells it (`adamw`, `plateau`).
/// ", at most N epochs with early stopping on METRIC (patience P)" when early stopping is on.
fn early_stopping(config: &crate::config::Config) -> String {
    let stop = &config.train.early_stopping;
    match stop.metric {
        crate::config::StopMetric::None => String::new(),
        metric => format!(" at most, early stopping on {} (patience {})", spelled(&metric), stop.patience),
    }
}

/// The class-imbalance choices: the loss's class weights and the sampler, when not the default.
fn imbalance(config: &crate::config::Config, class_weights: Option<&[f64]>) -> String {
    let mut parts = String::new();
    if let Some(weights) = class_weights {
        let rounded: Vec<String> = weights.iter().map(|w| format!("{w:.4}")).collect();
        let _ = write!(
            parts,
            ", class weights [{}] ({})",
            rounded.join(", "),
            spelled(&config.train.class_weights)
        );
    }
    if config.data.sampler == crate::config::SamplerKind::Balanced {
        parts.push_str(", class-balanced sampling with replacement");
    }
    parts
}

fn spelled<T: Serialize>(value: &T) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(text)) => text,
        Ok(other) => other.to_string(),
        Err(_) => "?".into(),
    }
}

fn model_details(md: &mut String, bundle: &Bundle) {
    let first = &bundle.runs[0].manifest;
    let (config, software) = (&first.config, first);
    let affiliation = match &bundle.authorship.affiliation {
        Some(affiliation) => format!(" ({})", name_and_link(affiliation).0),
        None => format!(" ({AUTHOR} affiliation)"),
    };
    let authors = match bundle.authorship.authors.as_slice() {
        [] => format!("{AUTHOR} names{affiliation}"),
        names => {
            let names: Vec<&str> = names.iter().map(|author| name_and_link(author).0).collect();
            format!("{}{affiliation}", names.join(", "))
        }
    };
    let classes = bundle.classes().len();
    let head = match config.model.head_hidden.as_slice() {
        [] => format!("a linear layer to the {classes} classes"),
        hidden => format!(
            "fully connected layers of {} units with ReLU, then {classes} outputs (the tutorial's head)",
            hidden.iter().map(usize::to_string).collect::<Vec<_>>().join(", ")
        ),
    };
    let start = match &first.starting_weights {
        Some(weights) => format!(
            "{} (sha256 {})",
            weights.name.clone().unwrap_or_else(|| weights.path.display().to_string()),
            weights.sha256
        ),
        None => "a random initialisation (seeded by `run.seed`)".into(),
    };
    let _ = writeln!(md, "## Model details\n");
    let _ = writeln!(md, "- **Developed by:** {authors}.");
    let _ = writeln!(md, "- **Published:** {}. **Version:** {AUTHOR} (e.g. 1.0).", bundle.date);
    let _ = writeln!(
        md,
        "- **Model type:** {} (torchvision's ResNet, parameter names as torchvision's) with {head}; \
         classifies one RGB image, resized to {}x{} pixels{}, into one of {} classes: {}.",
        config.model.arch,
        config.data.image_size,
        config.data.image_size,
        if config.data.normalize { " and normalised with ImageNet's mean and deviation" } else { "" },
        bundle.classes().len(),
        bundle.classes().iter().map(|c| format!("`{c}`")).collect::<Vec<_>>().join(", ")
    );
    let _ = writeln!(md, "- **Starting weights:** {start}.");
    let _ = writeln!(
        md,
        "- **Training:** {} epochs{}, optimizer {} (learning rate {}, weight decay {}), schedule {}, batch {} per \
         rank on {} rank(s){}, label smoothing {}{}, augmentation {}, precision {}; rtrain {} (git {}), libtorch {}.",
        config.train.epochs,
        early_stopping(config),
        spelled(&config.optim.name),
        config.optim.lr,
        config.optim.weight_decay,
        spelled(&config.schedule.kind),
        config.data.batch_size,
        software.job.world_size,
        match config.train.accumulate {
            1 => String::new(),
            k => format!(" accumulating {k} micro-batches per step"),
        },
        config.train.label_smoothing,
        imbalance(config, software.class_weights.as_deref()),
        spelled(&config.data.augment_policy),
        spelled(&config.train.precision),
        software.rtrain_version,
        software.git_revision,
        software.software.libtorch
    );
    let _ = writeln!(
        md,
        "- **Licence:** {}. **Citation:** `{CITATION}`. **Contact:** {AUTHOR} an address for questions.\n",
        bundle
            .authorship
            .license
            .as_deref()
            .unwrap_or(&format!("{AUTHOR} an SPDX identifier, e.g. CC-BY-4.0"))
    );
    let _ = writeln!(
        md,
        "The weights: each run's `model.safetensors` (after the last epoch) and `checkpoints/best.safetensors` \
         (the epoch with the best validation top-1, which the evaluation below is of). `rtrain predict \
         --checkpoint runs/NAME/checkpoints/best.safetensors PHOTOS... --out DIR` classifies photos with it.\n"
    );
    let _ = writeln!(md, "| run | seed | epochs | best epoch | best val top-1 | best.safetensors sha256 |");
    let _ = writeln!(md, "|---|---:|---:|---:|---:|---|");
    for run in &bundle.runs {
        let m = &run.manifest;
        let best = m.epochs.iter().enumerate().max_by(|a, b| a.1.val_top1.total_cmp(&b.1.val_top1));
        let sha =
            run.file("checkpoints/best.safetensors").map_or("-".to_string(), |f| format!("`{}`", f.sha256));
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {sha} |",
            run.name,
            m.seeds.run,
            m.epochs.len(),
            best.map_or("-".into(), |(i, _)| (i + 1).to_string()),
            best.map_or("-".into(), |(_, e)| format!("{:.4}", e.val_top1)),
        );
    }
    md.push('\n');
}

fn intended_use(md: &mut String, bundle: &Bundle) {
    let _ = writeln!(md, "## Intended use\n");
    let _ = writeln!(
        md,
        "- **Trained to:** assign each photo one of the classes {}.",
        bundle.classes().iter().map(|c| format!("`{c}`")).collect::<Vec<_>>().join(", ")
    );
    let _ = writeln!(
        md,
        "- **Primary intended uses:** {AUTHOR} what the predictions are for (e.g. triage of reconnaissance \
         photos after an event, for review by engineers), and for which hazards, regions and building types."
    );
    let _ = writeln!(
        md,
        "- **Primary intended users:** {AUTHOR} who uses the predictions, and with what expertise."
    );
    let _ = writeln!(
        md,
        "- **Out of scope:** {AUTHOR} uses the model must not be put to. The model was evaluated only on photos \
         like its validation split (below): photos of other events, regions, cameras or viewpoints are outside \
         what these numbers say.\n"
    );
}

fn factors(md: &mut String, bundle: &Bundle) {
    let _ = writeln!(md, "## Factors\n");
    let _ = writeln!(
        md,
        "- **Relevant factors:** {AUTHOR} the groups, instruments and environments performance may differ by \
         (hazard and event, region and building type, camera or phone, distance and viewpoint, lighting)."
    );
    let supports: Vec<String> = bundle.runs[0]
        .evaluation
        .as_ref()
        .map(|e| {
            e.classes
                .iter()
                .zip(&e.metrics.per_class)
                .map(|(class, m)| format!("`{class}` {}", m.support))
                .collect()
        })
        .unwrap_or_default();
    let _ = writeln!(
        md,
        "- **Evaluation factors:** the class, the one factor every image is labelled with: the metrics below are \
         reported per class and averaged over classes (macro), so that a rare class counts as much as a common \
         one. Validation images per class: {}.\n",
        if supports.is_empty() { "unknown (no evaluation)".to_string() } else { supports.join(", ") }
    );
}

fn metrics(md: &mut String) {
    let _ = writeln!(md, "## Metrics\n");
    let _ = writeln!(
        md,
        "- **Top-1 accuracy**, and because damage classes are seldom even, **macro-F1** and **balanced accuracy** \
         (mean recall over classes); per class precision, recall, F1 and one-vs-rest ROC AUC.\n\
         - Because damage levels are ordered, **quadratic weighted kappa**, the mean distance in classes of the \
         predicted from the true level, and the share of errors more than one class away.\n\
         - Calibration: **log loss** and the **expected calibration error** (15 equal-width confidence bins).\n\
         - Uncertainty over images: 95% percentile-bootstrap intervals (1,000 resamples of the validation images, \
         seeded by the run's seed). Uncertainty over training: the runs differ only in their seed; their \
         mean, standard deviation and 95% Student-t interval (below). Both are computed by rtrain and were \
         checked against scikit-learn and SciPy.\n"
    );
}

fn data(md: &mut String, bundle: &Bundle) {
    for (heading, which) in [("Evaluation data", Split::Val), ("Training data", Split::Train)] {
        let _ = writeln!(md, "## {heading}\n");
        let mut seen = Vec::new();
        for run in &bundle.runs {
            let name = match which {
                Split::Val => &run.manifest.config.data.val_split,
                Split::Train => &run.manifest.config.data.train_split,
            };
            for split in run.manifest.data.iter().filter(|s| &s.split == name) {
                if seen.contains(&split.sha256) {
                    continue;
                }
                seen.push(split.sha256.clone());
                let _ = writeln!(
                    md,
                    "- `{}` split: {} images from `{}` (sha256 over its files `{}`; each file's sha256 is in \
                     `runs/{}/manifest.json` and `ro-crate-metadata.json`). {}",
                    split.split,
                    split.images,
                    split.root.display(),
                    split.sha256,
                    run.name,
                    class_counts(split).map_or(String::new(), |counts| format!("Per class: {counts}."))
                );
            }
        }
        let _ = writeln!(
            md,
            "- {AUTHOR} where the photos come from (event, dates, places, who took them and how they were \
             labelled), their licence and DOI, and how the splits were made (by photo, building or area).\n"
        );
    }
}

enum Split {
    Val,
    Train,
}

/// Images per class of a class-per-directory split (`CLASS/...`), or None for another layout
/// (shards) where the files do not say.
fn class_counts(split: &DataSplit) -> Option<String> {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for path in split.files.keys() {
        let class = path.split_once('/').map(|(class, _)| class)?;
        *counts.entry(class).or_default() += 1;
    }
    let known = split.classes.iter().all(|class| counts.contains_key(class.as_str()));
    let total: usize = counts.values().sum();
    (known && counts.len() == split.classes.len() && total == split.images).then(|| {
        let shares: Vec<String> = split
            .classes
            .iter()
            .map(|class| {
                let n = counts[class.as_str()];
                format!("`{class}` {n} ({:.1}%)", 100.0 * n as f64 / total as f64)
            })
            .collect();
        shares.join(", ")
    })
}

fn quantitative_analyses(md: &mut String, bundle: &Bundle) {
    let _ = writeln!(md, "## Quantitative analyses\n");
    let _ = writeln!(
        md,
        "Each run's best checkpoint on the validation split, with 95% bootstrap intervals over images \
         (`runs/NAME/evaluation/`):\n"
    );
    let _ = writeln!(md, "| run | top-1 | macro-F1 | balanced accuracy | quadratic kappa | ECE | log loss |");
    let _ = writeln!(md, "|---|---|---|---|---|---:|---:|");
    for run in &bundle.runs {
        let Some(e) = &run.evaluation else {
            let _ = writeln!(md, "| {} | no evaluation | | | | | |", run.name);
            continue;
        };
        let (m, i) = (&e.metrics, e.intervals.as_ref());
        let cell = |value: Option<f64>, interval: Option<Interval>| match (value, interval) {
            (Some(v), Some(i)) => format!("{v:.4} [{:.4}, {:.4}]", i.low, i.high),
            (Some(v), None) => format!("{v:.4}"),
            (None, _) => "-".into(),
        };
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {:.4} | {:.4} |",
            run.name,
            cell(Some(m.top1), i.map(|i| i.top1)),
            cell(Some(m.ordinal.macro_f1), i.map(|i| i.macro_f1)),
            cell(Some(m.ordinal.balanced_accuracy), i.map(|i| i.balanced_accuracy)),
            cell(m.ordinal.quadratic_kappa, i.map(|i| i.quadratic_kappa)),
            m.ece,
            m.log_loss
        );
    }
    per_class(md, bundle);
    let summaries: Vec<&SeedSummary> = bundle.seeds.summaries.iter().collect();
    if summaries.is_empty() {
        let _ = writeln!(md, "\nOne run per configuration: no spread over seeds could be measured.\n");
    } else {
        let _ = writeln!(
            md,
            "\nOver seeds: runs whose configurations differ only in their seed form a group; per metric the mean, \
             the sample standard deviation and the 95% Student-t interval of the mean (`{REPORT_DIR}/seeds.csv`):\n"
        );
        let _ = writeln!(md, "| group | metric | n | mean | sd | 95% interval | min | max |");
        let _ = writeln!(md, "|---|---|---:|---:|---:|---|---:|---:|");
        for s in summaries {
            let _ = writeln!(
                md,
                "| {} | {} | {} | {:.4} | {:.4} | [{:.4}, {:.4}] | {:.4} | {:.4} |",
                s.group, s.metric, s.n, s.mean, s.sd, s.ci_low, s.ci_high, s.min, s.max
            );
        }
    }
    for c in &bundle.seeds.comparisons {
        let _ = writeln!(
            md,
            "- {}: {} minus {}: {:.4}, Welch 95% interval [{:.4}, {:.4}], p {:.4}",
            c.metric, c.group_a, c.group_b, c.difference, c.ci_low, c.ci_high, c.p
        );
    }
    let _ = writeln!(
        md,
        "\nFigures (in `{REPORT_DIR}/`, with `report.md`): per run the confusion matrix by true class \
         (`NAME-best-confusion-by-row.svg`), the reliability diagram (`NAME-best-reliability.svg`), ROC curves \
         (`NAME-best-roc.svg`), the most confident mistakes with their Grad-CAM maps \
         (`NAME-best-mistakes.png`, `NAME-best-mistakes-gradcam.png`); loss and accuracy per epoch; each seed's \
         validation curve with the group's mean (`seeds-N.svg`).\n"
    );
}

/// Precision, recall and F1 per class: the mean over the runs' best checkpoints, with the
/// standard deviation where there are several.
fn per_class(md: &mut String, bundle: &Bundle) {
    let evaluated: Vec<&BundledRun> = bundle.runs.iter().filter(|run| run.evaluation.is_some()).collect();
    let Some(first) = evaluated.first().and_then(|run| run.evaluation.as_ref()) else { return };
    let n = evaluated.len();
    let _ = writeln!(
        md,
        "\nPer class, over the {n} run(s){}:\n\n| class | support | precision | recall | F1 |\n|---|---:|---:|---:|---:|",
        if n > 1 { " (mean ± sd)" } else { "" }
    );
    for (k, class) in first.classes.iter().enumerate() {
        let values = |pick: fn(&crate::metrics::ClassMetrics) -> f64| -> String {
            let v: Vec<f64> = evaluated
                .iter()
                .filter_map(|run| run.evaluation.as_ref()?.metrics.per_class.get(k).map(pick))
                .collect();
            let s = SeedSummary::of("", "", &v);
            match v.len() {
                0 => "-".into(),
                1 => format!("{:.4}", s.mean),
                _ => format!("{:.4} ± {:.4}", s.mean, s.sd),
            }
        };
        let support = first.metrics.per_class.get(k).map_or(0, |c| c.support);
        let _ = writeln!(
            md,
            "| `{class}` | {support} | {} | {} | {} |",
            values(|c| c.precision),
            values(|c| c.recall),
            values(|c| c.f1)
        );
    }
}

fn ethical_considerations(md: &mut String) {
    let _ = writeln!(md, "## Ethical considerations\n");
    let _ = writeln!(
        md,
        "{AUTHOR} Who is affected when a prediction is wrong (a damaged home classed as undamaged may delay aid \
         or inspection; the reverse spends scarce inspections), who reviews predictions before they inform \
         decisions, and how the photos were collected and shared (people, faces, addresses and licence plates in \
         them; consent and licence).\n"
    );
}

fn caveats(md: &mut String, bundle: &Bundle) {
    let _ = writeln!(md, "## Caveats and recommendations\n");
    let runs = bundle.runs.len();
    if runs < 3 {
        let _ = writeln!(
            md,
            "- {runs} run(s): with fewer than three seeds the spread of training is barely measured; the seed \
             can move accuracy as much as a change of model size."
        );
    }
    let evaluations: Vec<_> = bundle.runs.iter().filter_map(|run| run.evaluation.as_ref()).collect();
    if !evaluations.is_empty() {
        let mean = |pick: fn(&crate::metrics::Metrics) -> f64| {
            evaluations.iter().map(|e| pick(&e.metrics)).sum::<f64>() / evaluations.len() as f64
        };
        let _ = writeln!(
            md,
            "- Calibration: mean ECE {:.3} over the runs' best checkpoints; a probability the model gives is {} \
             (see the reliability diagrams).",
            mean(|m| m.ece),
            if mean(|m| m.ece) > 0.05 { "not a frequency to rely on without recalibration" } else { "close to the frequency it is right with" }
        );
        let _ = writeln!(
            md,
            "- Errors more than one class away: {:.1}% of the mistakes on average (ordered classes: these are the \
             costly ones).",
            100.0 * mean(|m| m.ordinal.far_error_share)
        );
    }
    let _ = writeln!(
        md,
        "- The validation split chose the best epoch and is also what is reported here: the numbers are \
         optimistic by that choice. {AUTHOR} results on a held-out test split, if there is one \
         (`rtrain eval --checkpoint ... --split test`).\n\
         - {AUTHOR} further caveats and recommendations.\n"
    );
}
