//! `rtrain bench`: the benchmarks' arguments and how they become the library's benchmark
//! options (`crate::bench`); the timing itself is the library's, the lines printed print.rs's.

use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::{Args, Subcommand};
use tch::Device;

use super::{parse_arch, print, ConfigArgs};
use crate::bench::{self, AllreduceEvent, AllreduceSuite, LoaderBench, StepBench};
use crate::config::AllreduceAlgorithm;
use crate::config::GradCompression;
use crate::model::precision::{Compute, Precision};
use crate::model::Arch;
use crate::plan::RunPlan;

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Time the training step (forward, backward, SGD) on random input.
    Step(BenchStepArgs),
    /// One training step on the CPU and on DEVICE from the same weights and batch: how far the
    /// loss, logits and updated weights differ (fp32; a GPU's TF32 convolutions differ a little).
    Agree(BenchAgreeArgs),
    /// The attainable GFLOP/s through libtorch (square matrix products), on the CPU or a GPU.
    Peak(BenchPeakArgs),
    /// Time the input pipeline (decode + RandomResizedCrop + flip + normalise into batches).
    Loader(BenchLoaderArgs),
    /// Time the gradient all-reduce per bucket size (run under mpirun; rank 0 prints).
    Allreduce(BenchAllreduceArgs),
    /// Time reading footprints and giving each photo of a CSV its building (predict --footprints).
    Assign(BenchAssignArgs),
}

impl BenchCommand {
    pub(super) fn run(self) -> Result<()> {
        match self {
            BenchCommand::Step(args) => args.run(),
            BenchCommand::Agree(args) => args.run(),
            BenchCommand::Peak(args) => args.run(),
            BenchCommand::Loader(args) => args.run(),
            BenchCommand::Allreduce(args) => args.run(),
            BenchCommand::Assign(args) => args.run(),
        }
    }
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum BenchPrecision {
    Fp32,
    Bf16,
}

impl From<BenchPrecision> for Precision {
    fn from(precision: BenchPrecision) -> Precision {
        match precision {
            BenchPrecision::Fp32 => Precision::Fp32,
            BenchPrecision::Bf16 => Precision::Bf16,
        }
    }
}

fn parse_device(name: &str) -> Result<Device, String> {
    crate::cluster::device::parse(name)
}

#[derive(Debug, Args)]
pub struct BenchStepArgs {
    #[arg(long, default_value = "resnet18", value_parser = parse_arch)]
    arch: Arch,
    #[arg(long, default_value_t = 64)]
    image_size: i64,
    #[arg(long, default_value_t = 32)]
    batch_size: i64,
    /// libtorch threads (0: all cores).
    #[arg(long, default_value_t = 0)]
    threads: usize,
    #[arg(long, default_value_t = 3)]
    warmup: usize,
    #[arg(long, default_value_t = 10)]
    steps: usize,
    #[arg(long, value_enum, default_value_t = BenchPrecision::Fp32)]
    precision: BenchPrecision,
    /// Channels-last (NHWC) input and convolution weights.
    #[arg(long)]
    channels_last: bool,
    /// cpu, cuda or cuda:N.
    #[arg(long, default_value = "cpu", value_parser = parse_device)]
    device: Device,
    #[arg(long)]
    json: bool,
}

impl BenchStepArgs {
    fn options(&self) -> StepBench {
        StepBench {
            arch: self.arch,
            image_size: self.image_size,
            batch_size: self.batch_size,
            threads: self.threads,
            warmup: self.warmup,
            steps: self.steps,
            compute: Compute {
                precision: self.precision.into(),
                channels_last: self.channels_last,
                device: self.device,
            },
        }
    }

    fn run(self) -> Result<()> {
        let options = self.options();
        print::step(&options, &bench::bench_step(&options)?, self.json)
    }
}

#[derive(Debug, Args)]
pub struct BenchAgreeArgs {
    #[arg(long, default_value = "resnet18", value_parser = parse_arch)]
    arch: Arch,
    #[arg(long, default_value_t = 64)]
    image_size: i64,
    #[arg(long, default_value_t = 8)]
    batch_size: i64,
    /// cpu, cuda or cuda:N.
    #[arg(long, default_value = "cuda", value_parser = parse_device)]
    device: Device,
    /// Largest relative difference of the loss accepted.
    #[arg(long, default_value_t = 1e-3)]
    loss_tolerance: f64,
    /// Largest relative difference of the weight update accepted (with TF32 off, PyTorch's own
    /// GPU step is within 4e-3 of its CPU step at batch sizes 8 and 64 on an H200).
    #[arg(long, default_value_t = 1e-2)]
    update_tolerance: f64,
    /// Let cuDNN's convolutions use TF32, as training does by default (PyTorch's default):
    /// the step then lands about 11% away, in PyTorch as in rtrain (bench/agree_reference.py).
    #[arg(long)]
    tf32: bool,
    #[arg(long)]
    json: bool,
}

impl BenchAgreeArgs {
    fn run(self) -> Result<()> {
        let (device, loss_tolerance, update_tolerance) =
            (self.device, self.loss_tolerance, self.update_tolerance);
        let reference = Compute { precision: Precision::Fp32, channels_last: false, device: Device::Cpu };
        let other = Compute { device, ..reference };
        let result =
            bench::bench_agree(self.arch, self.image_size, self.batch_size, reference, other, self.tf32)?;
        let agree = result.loss_relative_difference <= loss_tolerance
            && result.update_relative_difference <= update_tolerance;
        print::agree(&result, device, loss_tolerance, update_tolerance, agree, self.json)?;
        if !agree {
            bail!(
                "{device:?} and the CPU differ after one step: loss {:.1e} (tolerance {loss_tolerance:.0e}), weight update {:.1e} (tolerance {update_tolerance:.0e})",
                result.loss_relative_difference,
                result.update_relative_difference
            );
        }
        Ok(())
    }
}

#[derive(Debug, Args)]
pub struct BenchPeakArgs {
    #[arg(long, default_value_t = 0)]
    threads: usize,
    /// cpu, cuda or cuda:N.
    #[arg(long, default_value = "cpu", value_parser = parse_device)]
    device: Device,
    #[arg(long, default_value_t = 2048)]
    size: i64,
    #[arg(long, value_enum, default_value_t = BenchPrecision::Fp32)]
    precision: BenchPrecision,
    #[arg(long, default_value_t = 5)]
    repeats: usize,
    #[arg(long)]
    json: bool,
}

impl BenchPeakArgs {
    fn run(self) -> Result<()> {
        let result =
            bench::bench_peak(self.threads, self.device, self.size, self.precision.into(), self.repeats)?;
        print::peak(&result, self.size, self.repeats, self.json)
    }
}

#[derive(Debug, Args)]
pub struct BenchLoaderArgs {
    /// A shard directory (rtrain data prepare) or an image tree.
    #[arg(long)]
    data: PathBuf,
    #[arg(long, default_value = "train")]
    split: String,
    /// Output side; default data.image_size (set with --config/--set).
    #[arg(long)]
    image_size: Option<u32>,
    /// The configuration whose training transform is timed (policy, geometry, data.jpeg_draft,
    /// data.exif_orientation): training's defaults unless --config/--set change them.
    #[command(flatten)]
    config: ConfigArgs,
    #[arg(long, default_value_t = 32)]
    batch_size: usize,
    /// Decoding threads (0: on the iterating thread).
    #[arg(long, default_value_t = 1)]
    workers: usize,
    #[arg(long, default_value_t = 2)]
    prefetch: usize,
    /// Batches timed (after one warm-up batch).
    #[arg(long, default_value_t = 20)]
    batches: usize,
    #[arg(long)]
    json: bool,
}

impl BenchLoaderArgs {
    /// Training's own transform, as the plan derives it, so that the timing is training's.
    fn options(&self) -> Result<LoaderBench> {
        let mut transform = RunPlan::for_inference(&self.config.load()?.config).train_transform();
        transform.size = self.image_size.unwrap_or(transform.size);
        Ok(LoaderBench {
            root: self.data.clone(),
            split: self.split.clone(),
            transform,
            batch_size: self.batch_size,
            workers: self.workers,
            prefetch: self.prefetch,
            batches: self.batches,
        })
    }

    fn run(self) -> Result<()> {
        let options = self.options()?;
        print::loader(&options, &bench::bench_loader(&options)?, self.json)
    }
}

#[derive(Debug, Args)]
pub struct BenchAllreduceArgs {
    /// Models whose gradients to reduce.
    #[arg(long, value_delimiter = ',', default_value = "resnet18,resnet50", value_parser = parse_arch)]
    arch: Vec<Arch>,
    /// Bucket sizes in MiB.
    #[arg(long, value_delimiter = ',', default_value = "1,5,25,100")]
    bucket_mb: Vec<f64>,
    #[arg(long, default_value_t = 2)]
    warmup: usize,
    #[arg(long, default_value_t = 5)]
    iterations: usize,
    /// The link's rate in Gbit/s, to print bus bandwidth as a share of it.
    #[arg(long)]
    link_gbit: Option<f64>,
    /// The all-reduce algorithm to ask MPI for (as `dist.allreduce`).
    #[arg(long, value_enum, default_value_t = AllreduceAlgorithm::Auto)]
    algorithm: AllreduceAlgorithm,
    /// Time blocking calls instead of the communication thread's polled non-blocking ones.
    #[arg(long)]
    blocking: bool,
    /// Gradients on the wire as `dist.compress` sends them (cast, summed in that format,
    /// widened back).
    #[arg(long, value_enum, default_value_t = GradCompression::None)]
    compress: GradCompression,
    /// After timing, average ResNet-18's gradients as training does (with --compress) and
    /// compare them with the exact mean of every rank's gradients rounded to the wire
    /// format.
    #[arg(long)]
    check: bool,
    #[arg(long)]
    json: bool,
}

impl BenchAllreduceArgs {
    fn suite(&self) -> AllreduceSuite {
        AllreduceSuite {
            archs: self.arch.clone(),
            bucket_mbs: self.bucket_mb.clone(),
            algorithm: self.algorithm,
            blocking: self.blocking,
            compress: self.compress,
            check: self.check,
            warmup: self.warmup,
            iterations: self.iterations,
        }
    }

    /// Prints each result as it comes; the first error in printing is returned after the suite.
    fn run(self) -> Result<()> {
        let mut printed = Ok(());
        bench::allreduce_suite(&self.suite(), |event| match event {
            AllreduceEvent::Started(topology) if !self.json => {
                print::allreduce_header(topology, self.blocking)
            }
            AllreduceEvent::Started(_) => {}
            AllreduceEvent::Measured(result) => {
                if printed.is_ok() {
                    printed = print::allreduce(&result, self.link_gbit, self.json);
                }
            }
            AllreduceEvent::Checked(checked) => {
                if printed.is_ok() {
                    printed = print::wire_check(&checked, self.json);
                }
            }
        })?;
        printed
    }
}

#[derive(Debug, Args)]
pub struct BenchAssignArgs {
    /// Building footprints: a GeoJSON FeatureCollection of (Multi)Polygons in WGS 84.
    #[arg(long)]
    footprints: PathBuf,
    /// The property holding each footprint's id.
    #[arg(long, default_value = "id")]
    footprint_id: String,
    /// Photos: a CSV with columns latitude, longitude and heading (empty: none).
    #[arg(long)]
    photos: PathBuf,
    /// Metres within which a photo's line of sight or nearest footprint counts.
    #[arg(long, default_value_t = 30.0)]
    max_distance: f64,
    #[arg(long)]
    json: bool,
}

impl BenchAssignArgs {
    fn run(self) -> Result<()> {
        if !(self.max_distance.is_finite() && self.max_distance >= 0.0) {
            bail!("--max-distance {}: must be a non-negative number of metres", self.max_distance);
        }
        let result =
            bench::bench_assign(&self.footprints, &self.footprint_id, &self.photos, self.max_distance)?;
        print::assign(&result, self.json)
    }
}
