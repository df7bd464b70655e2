//! What each command prints: human-readable lines, or JSON with `--json`.

use std::path::Path;

use anyhow::Result;
use tch::Device;

use crate::bench::{
    AgreeResult, AllreduceBenchResult, AssignBenchResult, LoaderBench, LoaderBenchResult, PeakBenchResult,
    StepBench, StepBenchResult, WireCheck,
};
use crate::cluster::Topology;
use crate::data::shards::ShardManifest;
use crate::explain::Explained;
use crate::predict::Prediction;
use crate::report::evaluation::Evaluated;
use crate::run_dir::manifest::Finding;

pub fn eval_report(evaluated: &Evaluated, json: bool) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(evaluated)?);
    } else {
        print!("{}", evaluated.describe());
    }
    Ok(())
}

pub fn predictions(predictions: &[Prediction], json: bool) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(predictions)?);
        return Ok(());
    }
    for prediction in predictions {
        let shown: Vec<String> =
            prediction.top.iter().map(|p| format!("{} {:.3}", p.class, p.probability)).collect();
        println!("{}: {}", prediction.image.display(), shown.join(", "));
    }
    Ok(())
}

/// What `rtrain calibrate` fitted, and where it wrote the model.
pub fn calibrated(calibrated: &crate::calibrate::Calibrated, json: bool) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(calibrated)?);
        return Ok(());
    }
    let c = &calibrated.calibration;
    println!(
        "{}: temperature {:.4} fitted on {} images of {} ({}); NLL {:.4} -> {:.4}, ECE {:.4} -> {:.4}",
        calibrated.model.display(),
        c.temperature,
        c.fitted_on.images,
        c.fitted_on.data,
        c.fitted_on.split,
        c.nll_before,
        c.nll_after,
        calibrated.ece_before,
        calibrated.ece_after
    );
    if let Some(conformal) = &c.conformal {
        println!(
            "conformal prediction sets ({:?}, alpha {}): threshold {:.6}",
            conformal.method, conformal.alpha, conformal.threshold
        );
    }
    println!("uncertain above entropy {:.4} nats", c.entropy_threshold);
    println!("{}", calibrated.out.display());
    Ok(())
}

/// Each explained image's line, then where the files are.
pub fn explained(explained: &[Explained], out: &Path) -> Result<()> {
    for row in explained {
        let truth = row.true_class.as_ref().map(|t| format!(" (true {t})")).unwrap_or_default();
        println!(
            "{}{truth}: predicted {} {:.3}; {} map of {} {:.3} in {}",
            row.image,
            row.predicted,
            row.predicted_probability,
            row.layer,
            row.explained,
            row.explained_probability,
            row.overlay
        );
    }
    println!("{} images explained: {}", explained.len(), out.join("index.csv").display());
    Ok(())
}

/// Prints `rtrain verify`'s findings; returns how many are bad.
pub fn verify_findings(findings: &[Finding]) -> usize {
    let mut bad = 0;
    for finding in findings {
        match finding {
            Finding::Ok(what) => println!("ok        {what}"),
            Finding::Mismatch(what) => {
                bad += 1;
                println!("MISMATCH  {what}");
            }
            Finding::Missing(what) => {
                bad += 1;
                println!("MISSING   {what}");
            }
        }
    }
    bad
}

pub fn prepared_shards(out: &Path, manifest: &ShardManifest) {
    for (split, info) in &manifest.splits {
        let bytes: u64 = info.shards.iter().map(|s| s.bytes).sum();
        println!(
            "{}: {split}: {} samples in {} shard(s), {:.1} MiB",
            out.display(),
            info.samples,
            info.shards.len(),
            bytes as f64 / f64::from(1u32 << 20)
        );
    }
}

pub fn allreduce_header(topology: &Topology, blocking: bool) {
    println!(
        "all-reduce of gradients: {} ranks on {} nodes ({}), {} calls",
        topology.world_size,
        topology.nodes,
        topology.launcher,
        if blocking { "blocking" } else { "polled non-blocking (as training's communication thread)" }
    );
}

pub fn allreduce(result: &AllreduceBenchResult, link_gbit: Option<f64>, json: bool) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string(result)?);
        return Ok(());
    }
    // The link's share is what the wire carried; the fp32 figures are what training gained.
    let share =
        link_gbit.map(|link| format!(" ({:.0}% of {link} Gbit/s)", 100.0 * result.wire_busbw_gbit / link));
    let wire = match result.wire.as_str() {
        "fp32" => String::new(),
        wire => format!(
            ", as {wire}: {:.1} MB, algbw {:.2} Gbit/s, busbw {:.2} Gbit/s on the wire",
            result.wire_bytes as f64 / 1e6,
            result.wire_algbw_gbit,
            result.wire_busbw_gbit
        ),
    };
    println!(
        "{:<9} {:>6.1} MB in {:>3} buckets of {:>5} MiB: {:>8.1} ms, algbw {:>6.2} Gbit/s, busbw {:>6.2} Gbit/s{wire}{}",
        result.arch,
        result.gradient_bytes as f64 / 1e6,
        result.buckets,
        result.bucket_mb,
        result.median_seconds * 1e3,
        result.algbw_gbit,
        result.busbw_gbit,
        share.unwrap_or_default()
    );
    Ok(())
}

pub fn wire_check(check: &WireCheck, json: bool) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string(check)?);
    } else {
        println!(
            "{} check over ResNet-18's {} gradients: {:.2}% equal to the exact mean rounded to {}, \
             {:.2}% within one ulp of it ({:.2}% where the ranks' gradients have one sign); \
             largest error {:.2} ulp of the mean, {:.2} ulp of the largest share",
            check.wire,
            check.values,
            100.0 * check.exact as f64 / check.values.max(1) as f64,
            check.wire,
            100.0 * check.within_one_ulp as f64 / check.values.max(1) as f64,
            100.0 * check.same_sign_within_one_ulp as f64 / check.same_sign.max(1) as f64,
            check.max_ulps,
            check.max_ulps_of_shares
        );
    }
    Ok(())
}

pub fn peak(result: &PeakBenchResult, size: i64, repeats: usize, json: bool) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string(result)?);
    } else {
        println!(
            "{size}x{size} {} matrix product on {}, {} threads: best {:.1} GFLOP/s, median {:.1} of {repeats}",
            result.precision, result.device, result.threads, result.best_gflops, result.median_gflops
        );
    }
    Ok(())
}

pub fn assign(result: &AssignBenchResult, json: bool) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string(result)?);
    } else {
        let mib = |value: Option<f64>| value.map_or("?".to_string(), |mib| format!("{mib:.0}"));
        println!(
            "{} footprints: read {:.3} s, projected and indexed {:.3} s; {} photos assigned in {:.3} s \
             (within {} m: {:?}); peak RSS {} MiB ({} MiB before reading)",
            result.footprints,
            result.read_seconds,
            result.index_seconds,
            result.photos,
            result.assign_seconds,
            result.max_distance_m,
            result.kinds,
            mib(result.peak_rss_mib),
            mib(result.rss_before_mib)
        );
    }
    Ok(())
}

pub fn loader(options: &LoaderBench, result: &LoaderBenchResult, json: bool) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string(result)?);
    } else {
        println!(
            "{} from {}: {:.1} img/s at {}x{} with {} worker(s) ({:.1} per core), peak RSS {:.0} MiB",
            options.root.display(),
            result.source,
            result.images_per_second,
            result.image_size,
            result.image_size,
            options.workers,
            result.images_per_second_per_core,
            result.peak_rss_mib.unwrap_or(f64::NAN)
        );
    }
    Ok(())
}

pub fn step(options: &StepBench, result: &StepBenchResult, json: bool) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string(result)?);
    } else {
        println!(
            "{} {} {}x{} batch {} threads {}: {:.1} img/s (median step {:.1} ms over {} steps), {:.1} GFLOP/step at {:.1} GFLOP/s",
            result.arch,
            options.compute,
            options.image_size,
            options.image_size,
            options.batch_size,
            result.threads,
            result.images_per_second,
            result.median_step_seconds * 1e3,
            options.steps,
            result.gflop_per_step,
            result.gflops
        );
    }
    Ok(())
}

pub fn agree(
    result: &AgreeResult,
    device: Device,
    loss_tolerance: f64,
    update_tolerance: f64,
    agree: bool,
    json: bool,
) -> Result<()> {
    if json {
        let report = serde_json::json!({
            "result": result,
            "loss_tolerance": loss_tolerance,
            "update_tolerance": update_tolerance,
            "agree": agree,
        });
        println!("{}", serde_json::to_string(&report)?);
    } else {
        println!(
            "{} one step, cpu vs {device:?} (TF32 {}): loss {:.6} vs {:.6} (relative {:.1e}), logits max |diff| {:.1e}, weight update relative {:.1e}: {}",
            result.arch,
            if result.tf32 { "on" } else { "off" },
            result.loss_reference,
            result.loss_other,
            result.loss_relative_difference,
            result.logits_max_abs_difference,
            result.update_relative_difference,
            if agree { "agree" } else { "DIFFER" }
        );
    }
    Ok(())
}
