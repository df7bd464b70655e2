//! `rtrain report --scaling RUN_DIR...`: the answer to "how does our training scale?" from
//! finished runs at different world sizes: time per epoch, images per second, speed-up and
//! efficiency against the smallest run, as a table and an SVG plot.
//!
//! Each run's numbers are medians over its epochs, leaving out the first when there are more
//! (it pays for warm-up: allocator, caches, bucket rebuilding).
//!
//! And why: each run's step split into its phases ([`crate::train::phases`]), the efficiency
//! lost against the smallest run split into exposed communication, waiting for the slowest
//! rank, data stall and the rest, the straggler named, and a projection to 2x, 4x and 8x the
//! largest world size from a ring all-reduce cost model ([`projection`]), checked against the
//! largest measured run by projecting it from the smaller ones.

use std::path::PathBuf;

use serde::Serialize;

use crate::plot::{self, PlotError, ScalingPoint};
use crate::run_dir::records::{
    self, EpochRecord, MetricsRecord, PhaseReport, RecordError, Straggler, Summary,
};
use crate::run_dir::RunPaths;
use crate::util::stats::median;

#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error(transparent)]
    Read(#[from] RecordError),
    #[error("{path}: no epoch records (did the run finish an epoch?)")]
    NoEpochs { path: PathBuf },
    #[error("report --scaling needs at least one run directory")]
    NoRuns,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ScalingRow {
    pub run: PathBuf,
    pub world_size: usize,
    pub nodes: usize,
    pub global_batch_size: usize,
    pub epochs_used: usize,
    pub epoch_seconds: f64,
    pub images_per_second: f64,
    /// images_per_second over the baseline's (the run with the fewest ranks).
    pub speedup: f64,
    /// speedup over the increase in ranks: 1.0 is linear scaling.
    pub efficiency: f64,
    /// Bytes of gradient each rank all-reduces per step (0 in runs from before it was recorded).
    pub gradient_bytes: u64,
    /// Where a step's time goes (None for runs from before phases were recorded).
    pub breakdown: Option<Breakdown>,
    /// The efficiency lost against the smallest run, by cause (None without breakdowns).
    pub lost: Option<LostEfficiency>,
}

/// A run's step, in seconds: the median rank's phases, medians over the epochs used.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Breakdown {
    /// The seven phases in step order (`data`, `copy`, `forward`, `backward`, `comm_wait`,
    /// `optimizer`, `other`), each the median over ranks.
    pub phases: Vec<(String, f64)>,
    /// The median rank's step.
    pub step: f64,
    /// The median rank's step without waiting for the all-reduce: its own work.
    pub busy: f64,
    /// The slowest rank's all-reduce wait (nobody keeps it waiting): communication that
    /// backward did not hide.
    pub exposed_comm: f64,
    /// The slowest rank's own work beyond the other ranks' median: what they wait for it.
    pub waiting_for_slowest: f64,
    /// The data wait every rank has (the least any rank waits): a slow input pipeline; one
    /// rank's extra wait shows in `waiting_for_slowest` instead.
    pub data_stall: f64,
    /// The communication thread's all-reduce time per step (median rank), mostly beside
    /// backward.
    pub allreduce: f64,
    /// The straggler named in the last epoch used, if any.
    pub straggler: Option<Straggler>,
}

/// Efficiency points (fractions) lost against the smallest run, which add up to
/// `1 - step_base / step`: each cause's extra seconds per step over this run's step.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LostEfficiency {
    pub exposed_comm: f64,
    pub waiting_for_slowest: f64,
    pub data_stall: f64,
    /// Everything else (compute, copies, the optimizer, between steps) that grew.
    pub compute_and_other: f64,
}

impl Breakdown {
    fn of(reports: &[&PhaseReport]) -> Option<Breakdown> {
        let last = reports.last()?;
        let med = |f: &dyn Fn(&PhaseReport) -> f64| median(&reports.iter().map(|r| f(r)).collect::<Vec<_>>());
        let phases = (0..7)
            .map(|i| {
                let name = crate::train::phases::medians(last)[i].0.to_string();
                (name, med(&|r| crate::train::phases::medians(r)[i].1))
            })
            .collect();
        Some(Breakdown {
            phases,
            step: med(&|r| r.step.median),
            busy: med(&|r| r.busy.median),
            exposed_comm: med(&|r| r.exposed_comm),
            waiting_for_slowest: med(&|r| r.waiting_for_slowest),
            data_stall: med(&|r| r.data.min),
            allreduce: med(&|r| r.allreduce.median),
            straggler: last.straggler.clone(),
        })
    }

    /// A phase's seconds by name (0 when absent).
    pub fn phase(&self, name: &str) -> f64 {
        self.phases.iter().find(|(n, _)| n == name).map_or(0.0, |(_, v)| *v)
    }
}

/// One row per run, in order of world size, with speed-up and efficiency against the first.
pub fn scaling(runs: &[PathBuf]) -> Result<Vec<ScalingRow>, ReportError> {
    let mut rows = Vec::with_capacity(runs.len());
    for run in runs {
        let paths = RunPaths::new(run);
        let summary = Summary::read(&paths.summary())?;
        let metrics_path = paths.metrics();
        let epochs: Vec<EpochRecord> = records::read_metrics(&metrics_path)?
            .into_iter()
            .filter_map(|record| match record {
                MetricsRecord::Epoch(epoch) => Some(epoch),
                MetricsRecord::Step(_) => None,
            })
            .collect();
        if epochs.is_empty() {
            return Err(ReportError::NoEpochs { path: metrics_path });
        }
        let used = if epochs.len() > 1 { &epochs[1..] } else { &epochs[..] };
        let reports: Vec<&PhaseReport> = used.iter().filter_map(|e| e.phases.as_ref()).collect();
        rows.push(ScalingRow {
            run: run.clone(),
            world_size: summary.world_size,
            nodes: summary.nodes,
            global_batch_size: summary.global_batch_size,
            epochs_used: used.len(),
            epoch_seconds: median(&used.iter().map(|e| e.seconds).collect::<Vec<_>>()),
            images_per_second: median(&used.iter().map(|e| e.train_images_per_second).collect::<Vec<_>>()),
            speedup: 1.0,
            efficiency: 1.0,
            gradient_bytes: summary.gradient_bytes,
            breakdown: Breakdown::of(&reports),
            lost: None,
        });
    }
    rows.sort_by_key(|row| (row.world_size, row.nodes));
    let base = rows.first().cloned().ok_or(ReportError::NoRuns)?;
    for row in &mut rows {
        row.speedup = row.images_per_second / base.images_per_second;
        row.efficiency = row.speedup / (row.world_size as f64 / base.world_size as f64);
        row.lost = match (&base.breakdown, &row.breakdown) {
            (Some(base), Some(this)) => Some(lost_efficiency(base, this)),
            _ => None,
        };
    }
    Ok(rows)
}

/// The efficiency `this` lost against `base`, by cause: each cause's extra seconds per step
/// over `this` step.
fn lost_efficiency(base: &Breakdown, this: &Breakdown) -> LostEfficiency {
    let step = this.step.max(1e-12);
    let exposed_comm = (this.exposed_comm - base.exposed_comm) / step;
    let waiting_for_slowest = (this.waiting_for_slowest - base.waiting_for_slowest) / step;
    let data_stall = (this.data_stall - base.data_stall) / step;
    let total = (this.step - base.step) / step;
    LostEfficiency {
        exposed_comm,
        waiting_for_slowest,
        data_stall,
        compute_and_other: total - exposed_comm - waiting_for_slowest - data_stall,
    }
}

/// The phases of each run's step as stacked bars (`<stem>.svg`, `<stem>.png`), followed by
/// `more` (the projected world sizes); None when no run recorded phases.
pub fn phase_bars(
    stem: &std::path::Path,
    rows: &[ScalingRow],
    more: Vec<plot::StackedBar>,
) -> Result<Option<(PathBuf, PathBuf)>, PlotError> {
    let mut bars: Vec<plot::StackedBar> = rows
        .iter()
        .filter_map(|row| {
            let b = row.breakdown.as_ref()?;
            Some(plot::StackedBar { label: format!("{} ranks", row.world_size), segments: b.phases.clone() })
        })
        .collect();
    if bars.is_empty() {
        return Ok(None);
    }
    bars.extend(more);
    let title = "Where a training step's time goes (median rank)";
    Ok(Some(plot::stacked_bars(stem, title, "seconds per step", &bars)?))
}

/// The phase table: per run, seconds per step of each phase (median rank), the lost
/// efficiency by cause, and the straggler.
pub fn breakdown_table(rows: &[ScalingRow]) -> String {
    let mut out = String::from(
        "| ranks | data | copy | forward | backward | comm wait | optimizer | other | step (s) | lost: exposed comm | waiting for slowest | data stall | compute & other | straggler |\n\
         |------:|-----:|-----:|--------:|---------:|----------:|----------:|------:|---------:|---------:|---------:|---------:|----------------:|-----------|\n",
    );
    for row in rows {
        let Some(b) = &row.breakdown else {
            out.push_str(&format!("| {} | (no phases recorded) |||||||||||||\n", row.world_size));
            continue;
        };
        let cells: Vec<String> = b.phases.iter().map(|(_, v)| format!("{v:.4}")).collect();
        // Rounding must not print a cause that is none as "-0.0".
        let points = |v: f64| format!("{:.1}", if (100.0 * v).abs() < 0.05 { 0.0 } else { 100.0 * v });
        let lost = row.lost.as_ref().map_or(["", "", "", ""].map(String::from), |l| {
            [
                points(l.exposed_comm),
                points(l.waiting_for_slowest),
                points(l.data_stall),
                points(l.compute_and_other),
            ]
        });
        let straggler = b.straggler.as_ref().map_or("none".to_string(), |s| {
            format!(
                "rank {} on {} ({} {:.3} s vs {:.3} s)",
                s.rank, s.node, s.phase, s.phase_seconds, s.phase_median
            )
        });
        out.push_str(&format!(
            "| {} | {} | {:.4} | {} | {} |\n",
            row.world_size,
            cells.join(" | "),
            b.step,
            lost.join(" | "),
            straggler
        ));
    }
    out.push_str("\nSeconds per step, median rank; lost efficiency in points against the first row.\n");
    out
}

/// The table, in Markdown (readable as text, pastes into a paper's notes or an issue).
pub fn table(rows: &[ScalingRow]) -> String {
    let mut out = String::from(
        "| ranks | nodes | global batch | s/epoch | img/s | speed-up | efficiency | run |\n\
         |------:|------:|-------------:|--------:|------:|---------:|-----------:|-----|\n",
    );
    for r in rows {
        out.push_str(&format!(
            "| {} | {} | {} | {:.2} | {:.1} | {:.2}x | {:.0}% | {} |\n",
            r.world_size,
            r.nodes,
            r.global_batch_size,
            r.epoch_seconds,
            r.images_per_second,
            r.speedup,
            100.0 * r.efficiency,
            r.run.display()
        ));
    }
    out
}

/// The scaling plot (SVG): images per second against ranks, each point labelled with its
/// efficiency, and the ideal linear line from the smallest run.
pub fn svg(rows: &[ScalingRow]) -> Result<String, PlotError> {
    let points: Vec<ScalingPoint> = rows
        .iter()
        .map(|r| ScalingPoint {
            ranks: r.world_size as f64,
            images_per_second: r.images_per_second,
            efficiency: r.efficiency,
        })
        .collect();
    plot::scaling_svg(&points)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn fake_run(dir: &Path, name: &str, world: usize, epoch_rates: &[(f64, f64)]) -> PathBuf {
        let run = dir.join(name);
        std::fs::create_dir_all(&run).unwrap();
        std::fs::write(
            run.join("summary.json"),
            format!("{{\"world_size\": {world}, \"nodes\": {world}, \"global_batch_size\": {}}}", 32 * world),
        )
        .unwrap();
        let mut metrics = String::from("{\"kind\":\"step\",\"loss\":1.0}\n");
        for (seconds, rate) in epoch_rates {
            metrics.push_str(&format!(
                "{{\"kind\":\"epoch\",\"seconds\":{seconds},\"train_images_per_second\":{rate}}}\n"
            ));
        }
        std::fs::write(run.join("metrics.jsonl"), metrics).unwrap();
        run
    }

    #[test]
    fn speedup_and_efficiency_against_the_smallest_run() {
        let dir = tempfile::tempdir().unwrap();
        // The first epoch of each run is warm-up and left out of the medians.
        let two = fake_run(dir.path(), "two", 2, &[(9.0, 50.0), (5.0, 180.0), (5.5, 170.0), (5.2, 175.0)]);
        let one = fake_run(dir.path(), "one", 1, &[(20.0, 40.0), (10.0, 100.0), (10.0, 100.0)]);
        let rows = scaling(&[two, one]).unwrap();
        assert_eq!(rows.iter().map(|r| r.world_size).collect::<Vec<_>>(), vec![1, 2]);
        assert_eq!(rows[0].epochs_used, 2);
        assert_eq!(rows[1].images_per_second, 175.0);
        assert_eq!(rows[1].epoch_seconds, 5.2);
        assert!((rows[1].speedup - 1.75).abs() < 1e-12);
        assert!((rows[1].efficiency - 0.875).abs() < 1e-12);
        let table = table(&rows);
        assert!(table.contains("| 2 | 2 | 64 | 5.20 | 175.0 | 1.75x | 88% |"), "{table}");
        let svg = svg(&rows).unwrap();
        assert!(svg.starts_with("<svg") && svg.contains("175 img/s, 88%"), "{svg}");
    }

    /// A run whose every epoch records `phases` (seconds per step, the same on every rank).
    fn phased_run(
        dir: &Path,
        name: &str,
        world: usize,
        phases: [f64; 7],
        exposed: f64,
        waiting: f64,
    ) -> PathBuf {
        let run = fake_run(dir, name, world, &[]);
        std::fs::write(
            run.join("summary.json"),
            format!(
                "{{\"world_size\": {world}, \"nodes\": {world}, \"global_batch_size\": {}, \"gradient_bytes\": 40000000}}",
                32 * world
            ),
        )
        .unwrap();
        let stat = |v: f64| serde_json::json!({"rank0": v, "min": v, "median": v, "max": v, "max_rank": 0});
        let names = ["data", "copy", "forward", "backward", "comm_wait", "optimizer", "other"];
        let mut report =
            serde_json::json!({"steps": 10, "exposed_comm": exposed, "waiting_for_slowest": waiting});
        for (name, value) in names.iter().zip(phases) {
            report[*name] = stat(value);
        }
        let step: f64 = phases.iter().sum();
        report["step"] = stat(step);
        report["busy"] = stat(step - phases[4]);
        report["allreduce"] = stat(if world > 1 { 0.4 } else { 0.0 });
        if waiting > 0.0 {
            report["straggler"] = serde_json::json!({"rank": 1, "node": "c2", "phase": "data", "phase_seconds": 0.3, "phase_median": 0.15});
        }
        let rate = 32.0 * world as f64 / step;
        let mut metrics = String::new();
        for _ in 0..3 {
            let record = serde_json::json!({"kind": "epoch", "seconds": step * 10.0, "train_images_per_second": rate, "phases": report});
            metrics.push_str(&format!("{record}\n"));
        }
        std::fs::write(run.join("metrics.jsonl"), metrics).unwrap();
        run
    }

    #[test]
    fn lost_efficiency_splits_by_cause_and_the_projection_checks_itself() {
        let dir = tempfile::tempdir().unwrap();
        let one = phased_run(dir.path(), "one", 1, [0.1, 0.0, 0.3, 0.5, 0.0, 0.1, 0.0], 0.0, 0.0);
        // 2 ranks: 0.1 s of exposed all-reduce, 0.15 s waiting for rank 1, 0.05 s more data wait.
        let two = phased_run(dir.path(), "two", 2, [0.15, 0.0, 0.3, 0.5, 0.25, 0.1, 0.0], 0.1, 0.15);
        let rows = scaling(&[one, two]).unwrap();
        let lost = rows[1].lost.clone().unwrap();
        let step = 1.3;
        assert!((lost.exposed_comm - 0.1 / step).abs() < 1e-12, "{lost:?}");
        assert!((lost.waiting_for_slowest - 0.15 / step).abs() < 1e-12, "{lost:?}");
        assert!((lost.data_stall - 0.05 / step).abs() < 1e-12, "{lost:?}");
        assert!(lost.compute_and_other.abs() < 1e-12, "{lost:?}");
        // The causes add up to the efficiency lost.
        assert!((1.0 - rows[1].efficiency - 0.3 / step).abs() < 1e-12);
        let table = breakdown_table(&rows);
        assert!(table.contains("| 2 | 0.1500 | 0.0000 | 0.3000 | 0.5000 | 0.2500 | 0.1000 | 0.0000 | 1.3000 | 7.7 | 11.5 | 3.8 | 0.0 | rank 1 on c2 (data 0.300 s vs 0.150 s) |"), "{table}");
        // The projection at 2 ranks from the 1-rank run and a 1 Gbit/s link: 0.32 s of
        // all-reduce, none hidden (nothing measured it), step 1.32 s.
        let projection = crate::report::projection::project(&rows, Some(1.0)).unwrap();
        let (check, measured) = projection.check.clone().unwrap();
        assert!((check.step - 1.32).abs() < 1e-9 && (measured - 1.0 / 1.3).abs() < 1e-9, "{check:?}");
        // From both runs, the 2-rank run's all-reduce (0.4 s) left 0.1 s exposed: 0.3 s of
        // backward's 0.5 s hid it.
        assert!((projection.inputs.hidden - 0.6).abs() < 1e-12, "{:?}", projection.inputs);
        assert_eq!(projection.projected.iter().map(|p| p.world_size).collect::<Vec<_>>(), vec![4, 8, 16]);
        let text = crate::report::projection::describe(&projection);
        assert!(
            text.contains("Check: the 2-rank run projected from the smaller runs: 76% against 77% measured"),
            "{text}"
        );
        let stem = dir.path().join("bars");
        let bars = crate::report::projection::bars(&projection);
        let (svg, png) = phase_bars(&stem, &rows, bars).unwrap().unwrap();
        assert!(std::fs::read_to_string(svg).unwrap().contains("comm_wait"));
        assert!(png.is_file());
        // Runs that record no gradient bytes (PyTorch DDP's, by bench/ddp_reference.py) are not
        // projected as if communication were free.
        let mut unknown = rows.clone();
        unknown.iter_mut().for_each(|row| row.gradient_bytes = 0);
        assert!(crate::report::projection::project(&unknown, Some(1.0)).is_none());
    }

    #[test]
    fn errors_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let err = scaling(&[dir.path().join("missing")]).unwrap_err().to_string();
        assert!(err.contains("missing/summary.json"), "{err}");
        let run = fake_run(dir.path(), "empty", 1, &[]);
        let err = scaling(&[run]).unwrap_err().to_string();
        assert!(err.contains("empty/metrics.jsonl") && err.contains("no epoch"), "{err}");
        assert!(matches!(scaling(&[]), Err(ReportError::NoRuns)));
    }
}
