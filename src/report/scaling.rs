//! `rtrain report --scaling RUN_DIR...`: the answer to "how does our training scale?" from
//! finished runs at different world sizes: time per epoch, images per second, speed-up and
//! efficiency against the smallest run, as a table and an SVG plot.
//!
//! Each run's numbers are medians over its epochs, leaving out the first when there are more
//! (it pays for warm-up: allocator, caches, bucket rebuilding).

use std::path::PathBuf;

use serde::Serialize;

use crate::bench::median;
use crate::plot::{self, PlotError, ScalingPoint};
use crate::run_dir::records::{self, EpochRecord, MetricsRecord, RecordError, Summary};
use crate::run_dir::RunPaths;

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
        });
    }
    rows.sort_by_key(|row| (row.world_size, row.nodes));
    let base = rows.first().cloned().ok_or(ReportError::NoRuns)?;
    for row in &mut rows {
        row.speedup = row.images_per_second / base.images_per_second;
        row.efficiency = row.speedup / (row.world_size as f64 / base.world_size as f64);
    }
    Ok(rows)
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
