//! `rtrain report RUN_DIR...`: a report people read, from one run or several side by side.
//! Writes `report.md` (what ran, a summary table, per-epoch tables, the final confusion matrix),
//! plots as SVG and PNG (loss and accuracy per epoch, learning rate and throughput per logged
//! step, confusion matrices) and the metrics as CSV (`epochs.csv`, `steps.csv`).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::evaluation::{self, Evaluated};
use super::seeds;
use crate::plot::{self, PlotError, Series};
use crate::run_dir::manifest::Manifest;
use crate::run_dir::records::{self, EpochRecord, EvalReport, MetricsRecord, RecordError, StepRecord};
use crate::run_dir::RunPaths;
use crate::util::files::{self, FileError};

#[derive(Debug, thiserror::Error)]
pub enum RunReportError {
    #[error(transparent)]
    Read(#[from] RecordError),
    #[error("{path}: {source}")]
    CreateDir { path: PathBuf, source: std::io::Error },
    #[error("{path}: no epoch finished yet, nothing to report")]
    NoEpochs { path: PathBuf },
    #[error(transparent)]
    Plot(#[from] PlotError),
    #[error(transparent)]
    Write(#[from] FileError),
    #[error("{path}: {source}")]
    Csv { path: PathBuf, source: csv::Error },
    #[error("{path}: {source}")]
    Copy { path: PathBuf, source: std::io::Error },
}

/// What the report knows about one run.
pub struct RunData {
    pub dir: PathBuf,
    /// How report.md names the directory: `dir`, unless the report is written for a bundle
    /// that holds the run elsewhere ([`RunData::shown_as`]).
    shown_dir: PathBuf,
    pub name: String,
    manifest: Option<Manifest>,
    classes: Vec<String>,
    steps: Vec<StepRecord>,
    epochs: Vec<EpochRecord>,
    /// The best checkpoint's evaluation that training wrote into `RUN/evaluation/`.
    evaluation: Option<Evaluated>,
}

impl RunData {
    pub fn read(dir: &Path) -> Result<RunData, RunReportError> {
        let path = RunPaths::new(dir).metrics();
        let (mut steps, mut epochs) = (Vec::new(), Vec::new());
        for record in records::read_metrics(&path)? {
            match record {
                MetricsRecord::Epoch(epoch) => epochs.push(epoch),
                MetricsRecord::Step(step) => steps.push(step),
            }
        }
        if epochs.is_empty() {
            return Err(RunReportError::NoEpochs { path });
        }
        let paths = RunPaths::new(dir);
        // A run without a manifest (an old one, or metrics copied alone) is reported as far as its
        // metrics go; one whose manifest or summary is there but unreadable is said to be so.
        let manifest = match Manifest::read(dir) {
            Ok(manifest) => Some(manifest),
            Err(error) if paths.manifest().exists() => {
                tracing::warn!("{error}: reported without it (architecture, ranks and hashes unknown)");
                None
            }
            Err(_) => None,
        };
        if paths.summary().exists() {
            if let Err(error) = records::Summary::read(&paths.summary()) {
                tracing::warn!("{error}: the run's summary is unreadable");
            }
        }
        let classes =
            manifest.as_ref().and_then(|m| m.data.first()).map(|d| d.classes.clone()).unwrap_or_default();
        let name =
            dir.file_name().map_or_else(|| dir.display().to_string(), |n| n.to_string_lossy().into_owned());
        // Runs from before training wrote it, or stopped before the end, have none.
        let evaluation = match Evaluated::read(&paths.evaluation()) {
            Ok(evaluation) => Some(evaluation),
            Err(error) if paths.evaluation().exists() => {
                tracing::warn!("{error:#}: reported without the best checkpoint's evaluation");
                None
            }
            Err(_) => None,
        };
        Ok(RunData {
            dir: dir.to_path_buf(),
            shown_dir: dir.to_path_buf(),
            name,
            manifest,
            classes,
            steps,
            epochs,
            evaluation,
        })
    }

    /// The run as report.md names it: `shown` instead of the directory it was read from (a
    /// publication bundle names its runs by their place in the bundle).
    pub fn shown_as(self, shown: &Path) -> RunData {
        RunData { shown_dir: shown.to_path_buf(), ..self }
    }

    pub fn manifest(&self) -> Option<&Manifest> {
        self.manifest.as_ref()
    }

    pub fn epochs(&self) -> &[EpochRecord] {
        &self.epochs
    }

    /// The best checkpoint's evaluation from `RUN/evaluation/` (None for runs without one).
    pub fn evaluation(&self) -> Option<&Evaluated> {
        self.evaluation.as_ref()
    }

    fn last_eval(&self) -> Option<&EvalReport> {
        self.epochs.last().map(|e| &e.val)
    }

    /// The run's seed, from its manifest.
    fn seed(&self) -> Option<u64> {
        self.manifest.as_ref().map(|m| m.seeds.run)
    }

    /// `NAME (seed S)`, as the seed statistics list a group's runs.
    fn name_and_seed(&self) -> String {
        format!("{} (seed {})", self.name, self.seed().map_or("?".into(), |s| s.to_string()))
    }

    /// The resolved configuration from the manifest, as JSON (None without a manifest).
    fn config_json(&self) -> Option<serde_json::Value> {
        self.manifest.as_ref().and_then(|m| serde_json::to_value(&m.config).ok())
    }
}

/// Writes the report for `runs` into `out` and returns the path of `report.md`. Runs whose
/// configurations differ only in the seed (and in `ignored` keys) are grouped for the seed
/// statistics.
pub fn write(runs: &[RunData], out: &Path, ignored: &[String]) -> Result<PathBuf, RunReportError> {
    std::fs::create_dir_all(out)
        .map_err(|source| RunReportError::CreateDir { path: out.to_path_buf(), source })?;
    let epoch_series = |value: fn(&EpochRecord) -> f64, what: &str| -> Vec<Series> {
        runs.iter()
            .map(|run| Series {
                label: format!("{} {what}", run.name),
                points: run.epochs.iter().map(|e| (f64::from(e.epoch + 1), value(e))).collect(),
            })
            .collect()
    };
    let step_series = |value: fn(&StepRecord) -> f64| -> Vec<Series> {
        runs.iter()
            .map(|run| Series {
                label: run.name.clone(),
                points: run.steps.iter().map(|s| (s.global_step as f64, value(s))).collect(),
            })
            .collect()
    };
    let val_loss = |e: &EpochRecord| e.val.loss;
    let val_top1 = |e: &EpochRecord| e.val.top1;
    let mut loss = epoch_series(|e| e.train_loss, "train");
    loss.extend(epoch_series(val_loss, "val"));
    let labels = |title, x, y, log_y| plot::Labels { title, x, y, log_y };
    plot::lines(&out.join("loss"), &labels("Loss per epoch", "epoch", "cross-entropy", true), &loss)?;
    let mut accuracy = epoch_series(|e| e.train_accuracy, "train");
    accuracy.extend(epoch_series(val_top1, "val top-1"));
    plot::lines(&out.join("accuracy"), &labels("Accuracy per epoch", "epoch", "accuracy", false), &accuracy)?;
    plot::lines(
        &out.join("lr"),
        &labels("Learning rate", "global step", "lr", false),
        &step_series(|s| s.lr),
    )?;
    let throughput = labels("Training throughput", "global step", "images / s", false);
    plot::lines(&out.join("throughput"), &throughput, &step_series(|s| s.images_per_second))?;
    for run in runs {
        if let Some(eval) = run.last_eval() {
            let title = format!("{}: validation confusion, epoch {}", run.name, run.epochs.len());
            let stem = out.join(format!("confusion-{}", run.name));
            plot::confusion(&stem, &title, &run.classes, &eval.confusion, plot::Cells::Counts)?;
            let title =
                format!("{}: validation confusion by true class, epoch {}", run.name, run.epochs.len());
            let stem = out.join(format!("confusion-{}-by-row", run.name));
            plot::confusion(&stem, &title, &run.classes, &eval.confusion, plot::Cells::RowShares)?;
        }
    }
    for run in runs.iter().filter(|run| run.evaluation.is_some()) {
        let from = RunPaths::new(&run.dir).evaluation();
        for figure in evaluation::REPORTED_FIGURES {
            let path = from.join(figure);
            // A figure is a few hundred KiB; the bound keeps a strange file from filling memory.
            let bytes = files::read_regular(&path, 256 << 20)
                .map_err(|source| RunReportError::Copy { path: path.clone(), source })?;
            files::write_atomic(&out.join(best_figure(run, figure)), &bytes)?;
        }
    }
    write_csv(&out.join("epochs.csv"), epochs_csv(runs))?;
    write_csv(&out.join("steps.csv"), steps_csv(runs))?;
    let SeedStatistics { groups, summaries, comparisons } = seed_statistics(runs, ignored);
    let mut md = markdown(runs);
    if !summaries.is_empty() {
        write_csv(&out.join("seeds.csv"), files::csv_of(&summaries))?;
        write_csv(&out.join("comparisons.csv"), files::csv_of(&comparisons))?;
        for (number, group) in groups.iter().enumerate().filter(|(_, g)| g.runs.len() > 1) {
            seed_curves(runs, group, &out.join(format!("seeds-{}", number + 1)))?;
        }
        md.push_str(&seed_markdown(runs, &groups, &summaries, &comparisons));
    }
    let report = out.join("report.md");
    files::write_atomic(&report, md.as_bytes())?;
    Ok(report)
}

/// The seed statistics of a report: its groups of runs, each group's summaries per metric and
/// the comparisons between groups.
pub struct SeedStatistics {
    pub groups: Vec<seeds::Group>,
    pub summaries: Vec<seeds::SeedSummary>,
    pub comparisons: Vec<seeds::Comparison>,
}

/// The seed statistics over `runs` as [`write`] reports them ([`SEED_METRICS`], grouped
/// without the `ignored` keys).
pub fn seed_statistics(runs: &[RunData], ignored: &[String]) -> SeedStatistics {
    let seed_runs: Vec<seeds::SeedRun> =
        runs.iter().map(|run| seeds::SeedRun { name: run.name.clone(), config: run.config_json() }).collect();
    let groups = seeds::groups(&seed_runs, ignored);
    let metrics: Vec<seeds::MetricValues> = SEED_METRICS
        .iter()
        .map(|&(name, read)| seeds::MetricValues { name, values: runs.iter().map(read).collect() })
        .collect();
    let (summaries, comparisons) = seeds::statistics(&metrics, &groups);
    SeedStatistics { groups, summaries, comparisons }
}

/// Writes a CSV made by [`files::csv_of`] to `path`, atomically.
fn write_csv(path: &Path, csv: Result<Vec<u8>, csv::Error>) -> Result<(), RunReportError> {
    let csv = csv.map_err(|source| RunReportError::Csv { path: path.to_path_buf(), source })?;
    files::write_atomic(path, &csv)?;
    Ok(())
}

/// How a metric of the seed statistics is read off a run (None where the run lacks it).
type ReadMetric = fn(&RunData) -> Option<f64>;

/// The per-run numbers the seed statistics are taken over, by name.
const SEED_METRICS: [(&str, ReadMetric); 8] = [
    ("final_val_top1", |run| run.epochs.last().map(|e| e.val.top1)),
    ("best_val_top1", |run| run.epochs.iter().map(|e| e.val.top1).reduce(f64::max)),
    ("final_val_loss", |run| run.epochs.last().map(|e| e.val.loss)),
    ("final_val_macro_f1", |run| run.epochs.last().map(|e| e.val.ordinal.macro_f1)),
    ("final_val_balanced_accuracy", |run| run.epochs.last().map(|e| e.val.ordinal.balanced_accuracy)),
    ("final_val_quadratic_kappa", |run| run.epochs.last().and_then(|e| e.val.ordinal.quadratic_kappa)),
    ("best_checkpoint_macro_f1", |run| run.evaluation.as_ref().map(|e| e.metrics.ordinal.macro_f1)),
    ("best_checkpoint_ece", |run| run.evaluation.as_ref().map(|e| e.metrics.ece)),
];

/// Each seed's validation top-1 per epoch, with the group's mean and the mean -/+ one standard
/// deviation over the seeds that reached that epoch.
fn seed_curves(runs: &[RunData], group: &seeds::Group, stem: &Path) -> Result<(), RunReportError> {
    let mut series: Vec<Series> = group
        .runs
        .iter()
        .map(|&i| Series {
            label: runs[i].name_and_seed(),
            points: runs[i].epochs.iter().map(|e| (f64::from(e.epoch + 1), e.val.top1)).collect(),
        })
        .collect();
    let longest = group.runs.iter().map(|&i| runs[i].epochs.len()).max().unwrap_or(0);
    let (mut mean, mut low, mut high) = (Vec::new(), Vec::new(), Vec::new());
    for epoch in 0..longest {
        let values: Vec<f64> =
            group.runs.iter().filter_map(|&i| runs[i].epochs.get(epoch)).map(|e| e.val.top1).collect();
        let summary = seeds::SeedSummary::of("", "", &values);
        let x = (epoch + 1) as f64;
        mean.push((x, summary.mean));
        if values.len() > 1 {
            low.push((x, summary.mean - summary.sd));
            high.push((x, summary.mean + summary.sd));
        }
    }
    series.push(Series { label: "mean".into(), points: mean });
    series.push(Series { label: "mean - sd".into(), points: low });
    series.push(Series { label: "mean + sd".into(), points: high });
    let title = format!("Validation top-1 per seed: {}", group.name);
    let labels = plot::Labels { title: &title, x: "epoch", y: "val top-1", log_y: false };
    plot::lines(stem, &labels, &series)?;
    Ok(())
}

fn seed_markdown(
    runs: &[RunData],
    groups: &[seeds::Group],
    summaries: &[seeds::SeedSummary],
    comparisons: &[seeds::Comparison],
) -> String {
    let mut md = String::from(
        "## Seed statistics\n\nRuns whose resolved configurations differ only in `run.seed` (and `run.name`, \
         `run.dir`, and any `--ignore-key`) form a group. Mean, sample standard deviation and the 95% Student-t \
         interval of the mean over the group's runs (`seeds.csv`); groups compared by the difference of means \
         with Welch's 95% interval and two-sided test (`comparisons.csv`).\n\n",
    );
    for (number, group) in groups.iter().enumerate() {
        let members: Vec<String> = group.runs.iter().map(|&i| runs[i].name_and_seed()).collect();
        let _ = writeln!(md, "- group {}: **{}**: {}", number + 1, group.name, members.join(", "));
    }
    md.push_str("\n| group | metric | n | mean | sd | 95% interval | min | max |\n|---|---|---:|---:|---:|---|---:|---:|\n");
    for s in summaries {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {:.4} | {:.4} | [{:.4}, {:.4}] | {:.4} | {:.4} |",
            s.group, s.metric, s.n, s.mean, s.sd, s.ci_low, s.ci_high, s.min, s.max
        );
    }
    if !comparisons.is_empty() {
        md.push_str("\n| metric | A | B | mean A - mean B | Welch 95% interval | t | df | p |\n|---|---|---|---:|---|---:|---:|---:|\n");
        for c in comparisons {
            let _ = writeln!(
                md,
                "| {} | {} | {} | {:.4} | [{:.4}, {:.4}] | {:.3} | {:.1} | {:.4} |",
                c.metric, c.group_a, c.group_b, c.difference, c.ci_low, c.ci_high, c.t, c.df, c.p
            );
        }
    }
    md.push('\n');
    for (number, group) in groups.iter().enumerate().filter(|(_, g)| g.runs.len() > 1) {
        let _ = writeln!(md, "![validation top-1 per seed, {}](seeds-{}.svg)\n", group.name, number + 1);
    }
    md
}

/// The name in the report of one of a run's evaluation figures.
fn best_figure(run: &RunData, figure: &str) -> String {
    format!("{}-best-{figure}", run.name)
}

/// One row of `epochs.csv`: a run's finished epoch (1-based), its training sums and evaluation.
#[derive(Serialize)]
struct EpochRow<'a> {
    run: &'a str,
    epoch: u32,
    global_step: u64,
    train_loss: f64,
    train_accuracy: f64,
    val_loss: f64,
    val_top1: f64,
    val_macro_f1: f64,
    val_balanced_accuracy: f64,
    val_quadratic_kappa: Option<f64>,
    val_mean_rank_error: f64,
    train_images_per_second: f64,
    seconds: f64,
    lr: f64,
}

/// One row of `steps.csv`: a run's logged step (epoch 1-based).
#[derive(Serialize)]
struct StepRow<'a> {
    run: &'a str,
    epoch: u32,
    step: u64,
    global_step: u64,
    loss: f64,
    accuracy: f64,
    lr: f64,
    images_per_second: f64,
}

fn epochs_csv(runs: &[RunData]) -> Result<Vec<u8>, csv::Error> {
    let rows = runs.iter().flat_map(|run| {
        run.epochs.iter().map(|e| EpochRow {
            run: &run.name,
            epoch: e.epoch + 1,
            global_step: e.global_step,
            train_loss: e.train_loss,
            train_accuracy: e.train_accuracy,
            val_loss: e.val.loss,
            val_top1: e.val.top1,
            val_macro_f1: e.val.ordinal.macro_f1,
            val_balanced_accuracy: e.val.ordinal.balanced_accuracy,
            val_quadratic_kappa: e.val.ordinal.quadratic_kappa,
            val_mean_rank_error: e.val.ordinal.mean_rank_error,
            train_images_per_second: e.train_images_per_second,
            seconds: e.seconds,
            lr: e.lr,
        })
    });
    files::csv_of(rows)
}

fn steps_csv(runs: &[RunData]) -> Result<Vec<u8>, csv::Error> {
    let rows = runs.iter().flat_map(|run| {
        run.steps.iter().map(|s| StepRow {
            run: &run.name,
            epoch: s.epoch + 1,
            step: s.step,
            global_step: s.global_step,
            loss: s.loss,
            accuracy: s.accuracy,
            lr: s.lr,
            images_per_second: s.images_per_second,
        })
    });
    files::csv_of(rows)
}

fn markdown(runs: &[RunData]) -> String {
    let mut md = String::from("# Training report\n\n");
    let _ = writeln!(md, "| run | arch | ranks | epochs | final val top-1 | best val top-1 | img/s | config sha256 | weights sha256 |");
    md.push_str("|---|---|---:|---:|---:|---:|---:|---|---|\n");
    for run in runs {
        let last = run.epochs.last();
        let best = run.epochs.iter().map(|e| e.val.top1).fold(f64::NAN, f64::max);
        let m = run.manifest.as_ref();
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {:.4} | {:.4} | {:.1} | {} | {} |",
            run.name,
            m.map_or("?".to_string(), |m| m.config.model.arch.to_string()),
            m.map_or(1, |m| m.job.world_size),
            run.epochs.len(),
            run.last_eval().map_or(f64::NAN, |v| v.top1),
            best,
            last.map_or(f64::NAN, |e| e.train_images_per_second),
            m.map_or("?", |m| &m.config_hash[..12.min(m.config_hash.len())]),
            m.and_then(|m| m.weights.as_ref()).map_or("(unfinished)", |w| &w.sha256[..12]),
        );
    }
    md.push_str("\n![loss](loss.svg)\n\n![accuracy](accuracy.svg)\n\n![learning rate](lr.svg)\n\n![throughput](throughput.svg)\n\n");
    for run in runs {
        let _ = writeln!(md, "## {}\n", run.name);
        if let Some(m) = &run.manifest {
            let _ = writeln!(
                md,
                "rtrain {} (git {}), libtorch {}, {} rank(s) on {} node(s) ({}), {} thread(s) per rank on {}, seed {}, deterministic {}, \
                 started {}, finished {}. Directory: `{}`.\n",
                m.rtrain_version,
                m.git_revision,
                m.software.libtorch,
                m.job.world_size,
                m.job.nodes,
                m.job.hosts.join(", "),
                m.job.threads_per_rank,
                m.job.device,
                m.seeds.run,
                m.deterministic,
                m.started,
                m.finished.as_deref().unwrap_or("-"),
                run.shown_dir.display()
            );
        }
        md.push_str(
            "| epoch | train loss | train acc | val loss | val top-1 | val macro-F1 | val bal. acc | val QWK | img/s | s |\n\
             |---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        );
        for e in &run.epochs {
            let (val, ordinal) = (&e.val, &e.val.ordinal);
            let qwk = ordinal.quadratic_kappa.map_or("-".to_string(), |k| format!("{k:.4}"));
            let _ = writeln!(
                md,
                "| {} | {:.4} | {:.4} | {:.4} | {:.4} | {:.4} | {:.4} | {qwk} | {:.1} | {:.1} |",
                e.epoch + 1,
                e.train_loss,
                e.train_accuracy,
                val.loss,
                val.top1,
                ordinal.macro_f1,
                ordinal.balanced_accuracy,
                e.train_images_per_second,
                e.seconds
            );
        }
        if let Some(eval) = run.last_eval() {
            let _ = writeln!(md, "\nFinal validation confusion (rows: true class, columns: predicted):\n");
            let label = |i: usize| run.classes.get(i).cloned().unwrap_or_else(|| i.to_string());
            let n = eval.confusion.len();
            let _ = writeln!(
                md,
                "| true \\ predicted | {} | accuracy |",
                (0..n).map(label).collect::<Vec<_>>().join(" | ")
            );
            let _ = writeln!(md, "|---|{}---:|", "---:|".repeat(n));
            for (i, row) in eval.confusion.iter().enumerate() {
                let cells: Vec<String> = row.iter().map(u64::to_string).collect();
                let _ = writeln!(
                    md,
                    "| {} | {} | {:.3} |",
                    label(i),
                    cells.join(" | "),
                    eval.per_class.get(i).unwrap_or(&0.0)
                );
            }
            let _ = writeln!(md, "\n![confusion](confusion-{}.svg)\n", run.name);
            let _ = writeln!(md, "![confusion by true class](confusion-{}-by-row.svg)\n", run.name);
        }
        if let Some(evaluation) = &run.evaluation {
            let _ = writeln!(
                md,
                "### The best checkpoint on the validation split\n\n\
                 Evaluated again at the end of training, as `rtrain eval` does (`{}`): every image's \
                 result is in `predictions.csv` there.\n\n```text\n{}```\n",
                RunPaths::new(&run.shown_dir).evaluation().display(),
                evaluation.describe()
            );
            for (figure, what) in [
                ("confusion-by-row.svg", "confusion by true class"),
                ("reliability.svg", "reliability diagram"),
                ("roc.svg", "ROC curves"),
                ("mistakes.png", "most confident mistakes"),
                ("mistakes-gradcam.png", "Grad-CAM of the most confident mistakes"),
            ] {
                let _ = writeln!(md, "![{what}]({})\n", best_figure(run, figure));
            }
        }
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_metrics_and_writes_tables_and_csv() {
        let dir = tempfile::tempdir().unwrap();
        // A comma in the name: the CSV quotes the field instead of splitting it.
        let run = dir.path().join("run,a");
        std::fs::create_dir_all(&run).unwrap();
        let val = concat!(
            r#"{"samples":4,"loss":0.5,"top1":0.75,"per_class":[1.0,0.5],"confusion":[[2,0],[1,1]],"#,
            r#""macro_f1":0.7,"balanced_accuracy":0.75,"quadratic_kappa":0.5,"mean_rank_error":0.25}"#
        );
        std::fs::write(
            run.join("metrics.jsonl"),
            format!(
                "{{\"kind\":\"step\",\"epoch\":0,\"step\":1,\"global_step\":1,\"loss\":1.5,\"accuracy\":0.25,\"lr\":0.1,\"images_per_second\":99.0}}\n\
                 {{\"kind\":\"epoch\",\"epoch\":0,\"global_step\":1,\"train_loss\":1.5,\"train_accuracy\":0.25,\"train_images_per_second\":99.0,\"lr\":0.1,\"seconds\":2.0,\"val\":{val}}}\n"
            ),
        )
        .unwrap();
        let data = RunData::read(&run).unwrap();
        assert_eq!((data.steps.len(), data.epochs.len()), (1, 1));
        let csv = String::from_utf8(epochs_csv(&[RunData::read(&run).unwrap()]).unwrap()).unwrap();
        assert_eq!(
            csv,
            "run,epoch,global_step,train_loss,train_accuracy,val_loss,val_top1,val_macro_f1,val_balanced_accuracy,\
             val_quadratic_kappa,val_mean_rank_error,train_images_per_second,seconds,lr\n\
             \"run,a\",1,1,1.5,0.25,0.5,0.75,0.7,0.75,0.5,0.25,99.0,2.0,0.1\n"
        );
        let mut reader = csv::Reader::from_reader(csv.as_bytes());
        let row = reader.records().next().unwrap().unwrap();
        assert_eq!((&row[0], &row[1], &row[13]), ("run,a", "1", "0.1"));
        let md = markdown(&[data]);
        assert!(
            md.contains("| 1 | 1.5000 | 0.2500 | 0.5000 | 0.7500 | 0.7000 | 0.7500 | 0.5000 | 99.0 | 2.0 |"),
            "{md}"
        );
        assert!(md.contains("| 1 | 1 | 1 | 0.500 |"), "the confusion row of class 1: {md}");
        let err = RunData::read(dir.path()).err().unwrap().to_string();
        assert!(err.contains("metrics.jsonl"), "{err}");
    }
}
