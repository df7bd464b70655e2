//! `rtrain report --scaling RUN_DIR...`: the answer to "how does our training scale?" from
//! finished runs at different world sizes: time per epoch, images per second, speed-up and
//! efficiency against the smallest run, as a table and an SVG plot.
//!
//! Each run's numbers are medians over its epochs, leaving out the first when there are more
//! (it pays for warm-up: allocator, caches, bucket rebuilding).

use std::path::PathBuf;

use serde::Serialize;

use crate::bench::median;
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

/// Images per second against ranks, with the ideal (linear from the baseline) dashed.
pub fn svg(rows: &[ScalingRow]) -> String {
    let (width, height, margin) = (640.0, 400.0, 60.0);
    let max_ranks = rows.iter().map(|r| r.world_size).max().unwrap_or(1).max(2) as f64;
    let base = rows.first();
    let ideal_top = base.map_or(1.0, |b| b.images_per_second * max_ranks / b.world_size as f64);
    let max_rate = rows.iter().map(|r| r.images_per_second).fold(ideal_top, f64::max) * 1.1;
    let x = |ranks: f64| margin + (ranks / max_ranks) * (width - 2.0 * margin);
    let y = |rate: f64| height - margin - (rate / max_rate) * (height - 2.0 * margin);
    let points = |values: Vec<(f64, f64)>| {
        values.iter().map(|&(r, v)| format!("{:.1},{:.1}", x(r), y(v))).collect::<Vec<_>>().join(" ")
    };
    let measured = points(rows.iter().map(|r| (r.world_size as f64, r.images_per_second)).collect());
    let ideal = base.map_or(String::new(), |b| {
        points(vec![
            (b.world_size as f64, b.images_per_second),
            (max_ranks, b.images_per_second * max_ranks / b.world_size as f64),
        ])
    });
    let mut out = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"{}\" y=\"24\" text-anchor=\"middle\" font-size=\"15\">Training throughput against ranks</text>\n\
         <line x1=\"{margin}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/>\n\
         <line x1=\"{margin}\" y1=\"{margin}\" x2=\"{margin}\" y2=\"{}\" stroke=\"black\"/>\n\
         <text x=\"{}\" y=\"{}\" text-anchor=\"middle\">ranks</text>\n\
         <text x=\"16\" y=\"{}\" transform=\"rotate(-90 16 {})\" text-anchor=\"middle\">images / s</text>\n\
         <polyline points=\"{ideal}\" fill=\"none\" stroke=\"gray\" stroke-dasharray=\"6 4\"/>\n\
         <polyline points=\"{measured}\" fill=\"none\" stroke=\"steelblue\" stroke-width=\"2\"/>\n",
        width / 2.0,
        height - margin,
        width - margin,
        height - margin,
        height - margin,
        width / 2.0,
        height - 20.0,
        height / 2.0,
        height / 2.0,
    );
    for r in rows {
        let (cx, cy) = (x(r.world_size as f64), y(r.images_per_second));
        out.push_str(&format!(
            "<circle cx=\"{cx:.1}\" cy=\"{cy:.1}\" r=\"4\" fill=\"steelblue\"/>\n\
             <text x=\"{cx:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{:.0} img/s, {:.0}%</text>\n\
             <text x=\"{cx:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>\n",
            cy - 10.0,
            r.images_per_second,
            100.0 * r.efficiency,
            height - margin + 16.0,
            r.world_size
        ));
    }
    out.push_str(&format!(
        "<text x=\"{:.1}\" y=\"{:.1}\" fill=\"gray\">ideal (linear)</text>\n</svg>\n",
        width - margin - 90.0,
        margin - 8.0
    ));
    out
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
        let svg = svg(&rows);
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
