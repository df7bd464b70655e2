//! `rtrain bench`: timings that can be compared with PyTorch's, run for run.
//!
//! `bench peak` measures the attainable rate (large matrix products); `bench step` also
//! reports the step's floating-point rate, so their ratio says how much is left to win.
//!
//! `bench step` times the training step alone (forward, loss, backward, SGD update) on random
//! input, exactly what bench/step_reference.py times in PyTorch eager (also in bf16 autocast
//! and channels-last), so the ratio of the two isolates the framework from data loading.
//!
//! `bench loader` times the input pipeline alone: decoding, RandomResizedCrop + flip to the
//! training size and normalisation into batch tensors, from shards or an image tree, with the
//! same worker threads training uses — what bench/loader_reference.py times for torchvision's
//! `ImageFolder` + `DataLoader`.
//!
//! `bench allreduce` (under mpirun) times the gradient all-reduce alone: a model's gradients in
//! the buckets training would use, summed over all ranks, per bucket size. It reports
//! algorithm bandwidth (bytes / time) and bus bandwidth (x 2(p-1)/p, the NCCL-tests convention:
//! the traffic each link carries, comparable with the link's rate).
//!
//! `bench assign` times giving photos their buildings (`predict --footprints`): reading and
//! checking the footprints file, projecting and indexing them, then assigning every photo of a
//! CSV (latitude, longitude, optional heading), with the process's peak memory — what
//! bench/compare_assign.py times for geopandas' `sjoin` + `sjoin_nearest`.

use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;
use tch::{Device, Kind, Tensor};

use crate::cluster::grad_sync::{bucket_layout, GradSync, Reducer, SyncOptions, FIRST_BUCKET_BYTES};
use crate::cluster::wire::Wire;
use crate::cluster::{self, Communicator};
use crate::config::{DistConfig, OptimConfig, OptimKind};
use crate::model::precision::{self, Compute};
use crate::model::{Arch, Model, ModelError};
use crate::plan::{self, set_threads};
use crate::train::optim::{OptimError, Optimizer};
use crate::train::phases::PhaseClock;
use crate::train::step::{train_step, GradientSync, MicroBatch, StepContext, StepError};
use crate::util::shim::ShimError;
use crate::util::stats::median;

#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error(transparent)]
    Shards(#[from] crate::data::shards::ShardError),
    #[error(transparent)]
    Data(#[from] crate::data::dataset::DataError),
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Optim(#[from] OptimError),
    #[error("bench step: {0}")]
    Torch(#[from] tch::TchError),
    #[error(transparent)]
    Shim(#[from] ShimError),
    #[error(transparent)]
    Step(#[from] StepError),
    #[error(transparent)]
    Dist(#[from] crate::cluster::DistError),
    #[error(transparent)]
    GradSync(#[from] crate::cluster::grad_sync::GradSyncError),
    #[error("--bucket-mb {0}: must be positive")]
    BucketSize(f64),
    #[error(transparent)]
    Footprints(#[from] crate::predict::footprints::FootprintError),
    #[error("{}: {problem}", path.display())]
    Photos { path: std::path::PathBuf, problem: String },
}

#[derive(Debug, Clone)]
pub struct LoaderBench {
    /// A shard directory or an image tree (as `data.root`).
    pub root: std::path::PathBuf,
    pub split: String,
    /// The training transform timed (its size, policy, geometry, draft decoding).
    pub transform: crate::data::transforms::Transform,
    pub batch_size: usize,
    pub workers: usize,
    pub prefetch: usize,
    /// Batches timed after the first (which includes starting the workers).
    pub batches: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct LoaderBenchResult {
    pub framework: &'static str,
    /// "shards" or "image tree".
    pub source: &'static str,
    pub workers: usize,
    pub image_size: u32,
    /// Whether JPEGs were decoded at reduced DCT scale (`data.jpeg_draft`).
    pub jpeg_draft: bool,
    pub images: usize,
    pub seconds: f64,
    pub images_per_second: f64,
    /// Per decoding thread (the iterating thread when `workers` is 0).
    pub images_per_second_per_core: f64,
    /// Peak resident memory of the whole process (libtorch included).
    pub peak_rss_mib: Option<f64>,
    /// Anonymous resident memory at the end: the loader's buffers, not the page cache of
    /// memory-mapped shards.
    pub rss_anon_mib: Option<f64>,
}

/// Times `options.batches` training batches (after one warm-up batch) over a seeded
/// permutation of the split, cycling through it if the split is shorter.
pub fn bench_loader(options: &LoaderBench) -> Result<LoaderBenchResult, BenchError> {
    use crate::data::loader;
    // The loader's threads do the work; libtorch only allocates the batch tensors.
    tch::set_num_threads(1);
    let data = crate::data::open_split(&options.root, &options.split, &[])?;
    let source = if crate::data::shards::is_shard_dir(&options.root) { "shards" } else { "image tree" };
    let wanted = (options.batches + 1) * options.batch_size;
    let permutation = crate::data::sampler::epoch_permutation(data.len(), 0, 0);
    let order: Vec<usize> = permutation.iter().copied().cycle().take(wanted).collect();
    let transform = options.transform.clone();
    let loader_options = loader::LoaderOptions {
        batch_size: options.batch_size,
        workers: options.workers,
        prefetch: options.prefetch,
        skip_bad_samples: false,
        // The loader alone, with nothing to yield to.
        low_priority: false,
        pin_for: None,
    };
    let every = loader::EpochBatches::every_sample(wanted, options.batch_size);
    let mut batches = loader::Loader::new(data, order, transform, every, loader_options);
    if let Some(first) = batches.next() {
        first?;
    }
    let started = Instant::now();
    let mut images = 0;
    for batch in batches {
        images += batch?.indices.len();
    }
    let seconds = started.elapsed().as_secs_f64();
    let images_per_second = images as f64 / seconds.max(1e-9);
    Ok(LoaderBenchResult {
        framework: "rtrain",
        source,
        workers: options.workers,
        image_size: options.transform.size(),
        jpeg_draft: options.transform.jpeg_draft,
        images,
        seconds,
        images_per_second,
        images_per_second_per_core: images_per_second / options.workers.max(1) as f64,
        peak_rss_mib: crate::util::memory::peak_rss_mib(),
        rss_anon_mib: crate::util::memory::anon_rss_mib(),
    })
}

#[derive(Debug, Clone)]
pub struct StepBench {
    pub arch: Arch,
    pub image_size: i64,
    pub batch_size: i64,
    pub threads: usize,
    pub warmup: usize,
    pub steps: usize,
    pub compute: Compute,
}

#[derive(Debug, Clone, Serialize)]
pub struct StepBenchResult {
    pub framework: &'static str,
    pub arch: String,
    pub image_size: i64,
    pub batch_size: i64,
    pub threads: i32,
    pub precision: String,
    pub channels_last: bool,
    pub device: String,
    pub step_seconds: Vec<f64>,
    pub median_step_seconds: f64,
    pub images_per_second: f64,
    /// Floating-point operations of one step (src/flops.rs) and the rate the median step
    /// reached, to set against `rtrain bench peak`.
    pub gflop_per_step: f64,
    pub gflops: f64,
}

/// The optimizer `bench step` and `bench agree` step with: bench/step_reference.py's SGD
/// (momentum 0.9, weight decay 5e-4), whatever the training default is.
fn reference_optimizer() -> OptimConfig {
    OptimConfig { name: OptimKind::Sgd, momentum: 0.9, weight_decay: 5e-4, ..OptimConfig::default() }
}

pub fn bench_step(options: &StepBench) -> Result<StepBenchResult, BenchError> {
    let threads = set_threads(options.threads, 1);
    tch::manual_seed(0);
    let num_classes = 10;
    let device = options.compute.device;
    crate::cluster::device::prepare(device, false);
    let model = Model::new(options.arch, num_classes, device)?;
    options.compute.prepare_model(&model)?;
    let mut optimizer = Optimizer::new(&reference_optimizer(), model.trainable());
    let size = [options.batch_size, 3, options.image_size, options.image_size];
    let images = options.compute.input(&Tensor::f_randn(size, (Kind::Float, Device::Cpu))?)?;
    let labels = Tensor::f_randint(num_classes as i64, [options.batch_size], (Kind::Int64, device))?;
    let context = StepContext {
        model: &model,
        compute: &options.compute,
        label_smoothing: 0.0,
        class_weights: None,
        before_update: None,
    };
    let batch = [MicroBatch { images: &images, labels: &labels }];
    let mut step_seconds = Vec::with_capacity(options.steps);
    for i in 0..options.warmup + options.steps {
        let started = Instant::now();
        train_step(&context, &mut optimizer, &mut GradientSync::Local, &batch, 0.01, &mut PhaseClock::new())?;
        synchronize(device);
        if i >= options.warmup {
            step_seconds.push(started.elapsed().as_secs_f64());
        }
    }
    let median_step_seconds = median(&step_seconds);
    let flop = crate::model::flops::training_step_flops(
        options.arch,
        options.image_size.unsigned_abs(),
        options.batch_size.unsigned_abs(),
        num_classes as u64,
    );
    Ok(StepBenchResult {
        framework: "rtrain",
        arch: options.arch.to_string(),
        image_size: options.image_size,
        batch_size: options.batch_size,
        threads,
        precision: options.compute.precision.to_string(),
        channels_last: options.compute.channels_last,
        device: format!("{device:?}"),
        images_per_second: options.batch_size as f64 / median_step_seconds,
        median_step_seconds,
        step_seconds,
        gflop_per_step: flop / 1e9,
        gflops: flop / 1e9 / median_step_seconds,
    })
}

/// Waits for a GPU's queued work, so that a timer measures it; nothing to wait for on the CPU.
fn synchronize(device: Device) {
    if let Device::Cuda(index) = device {
        tch::Cuda::synchronize(index as i64);
    }
}

/// How far one training step on another device (or in another precision or memory format)
/// lands from the reference computation, from the same weights and batch.
#[derive(Debug, Clone, Serialize)]
pub struct AgreeResult {
    pub arch: String,
    pub reference: String,
    pub other: String,
    /// Whether cuDNN's convolutions ran in TF32 on a GPU side (see [`precision::set_tf32`]).
    pub tf32: bool,
    pub loss_reference: f64,
    pub loss_other: f64,
    /// |loss_other - loss_reference| / |loss_reference|.
    pub loss_relative_difference: f64,
    pub logits_max_abs_difference: f64,
    /// How differently the step moved the weights: ||Δw_other - Δw_reference|| / ||Δw_reference||
    /// over all trainable weights together (Δw: updated minus initial).
    pub update_relative_difference: f64,
}

/// A step's loss, logits and updated weights, on the CPU.
type StepOutcome = (f64, Tensor, Vec<(String, Tensor)>);

/// One training step (forward in train mode, cross-entropy, backward, SGD) computed as
/// `reference` and as `other`, starting from the same weights and batch: the check that a GPU
/// (or bf16, or channels-last) computes what the CPU does. `tf32` sets cuDNN's TF32 for the
/// process (matrix products stay fp32): off, a GPU's fp32 step is the CPU's within rounding.
pub fn bench_agree(
    arch: Arch,
    image_size: i64,
    batch_size: i64,
    reference: Compute,
    other: Compute,
    tf32: bool,
) -> Result<AgreeResult, BenchError> {
    precision::set_tf32(tf32, false)?;
    let num_classes = 10;
    tch::manual_seed(0);
    let images = Tensor::f_randn([batch_size, 3, image_size, image_size], (Kind::Float, Device::Cpu))?;
    let labels = Tensor::f_randint(num_classes as i64, [batch_size], (Kind::Int64, Device::Cpu))?;
    let initial_model = Model::new(arch, num_classes, Device::Cpu)?;
    let initial = initial_model.state_dict();
    let trainable_initial: Vec<Tensor> =
        initial_model.trainable().into_iter().map(|(_, t)| t.detach().contiguous()).collect();
    let step = |compute: &Compute| -> Result<StepOutcome, BenchError> {
        let model = Model::new(arch, num_classes, compute.device)?;
        tch::no_grad(|| {
            for (name, tensor) in model.state_dict() {
                if let Some(source) = initial.get(&name) {
                    tensor.shallow_clone().copy_(source);
                }
            }
        });
        compute.prepare_model(&model)?;
        let mut optimizer = Optimizer::new(&reference_optimizer(), model.trainable());
        let context = StepContext {
            model: &model,
            compute,
            label_smoothing: 0.0,
            class_weights: None,
            before_update: None,
        };
        let batch = [MicroBatch { images: &images, labels: &labels }];
        let step = train_step(
            &context,
            &mut optimizer,
            &mut GradientSync::Local,
            &batch,
            0.01,
            &mut PhaseClock::new(),
        )?;
        let weights = model
            .trainable()
            .into_iter()
            .map(|(name, w)| (name, w.detach().to_device(Device::Cpu).contiguous()))
            .collect();
        Ok((step.loss, step.logits.detach().to_device(Device::Cpu).to_kind(Kind::Float), weights))
    };
    let (loss_reference, logits_reference, weights_reference) = step(&reference)?;
    let (loss_other, logits_other, weights_other) = step(&other)?;
    let (mut difference, mut update) = (0.0f64, 0.0f64);
    for ((start, (_, a)), (_, b)) in trainable_initial.iter().zip(&weights_reference).zip(&weights_other) {
        let squared = |t: Tensor| t.square().sum(Kind::Double).double_value(&[]);
        difference += squared(b - a);
        update += squared(a - start);
    }
    Ok(AgreeResult {
        arch: arch.to_string(),
        reference: reference.to_string(),
        other: other.to_string(),
        tf32,
        loss_reference,
        loss_other,
        loss_relative_difference: (loss_other - loss_reference).abs() / loss_reference.abs().max(1e-12),
        logits_max_abs_difference: (logits_other - logits_reference).abs().max().double_value(&[]),
        update_relative_difference: (difference / update.max(1e-30)).sqrt(),
    })
}

#[derive(Debug, Clone, Serialize)]
pub struct PeakBenchResult {
    pub device: String,
    pub threads: i32,
    pub precision: String,
    pub matrix_side: i64,
    pub gflops: Vec<f64>,
    pub median_gflops: f64,
    /// The fastest repetition: the attainable rate (slower ones were disturbed by other work).
    pub best_gflops: f64,
}

/// This CPU's attainable floating-point rate through libtorch: square matrix products (the
/// best case for any BLAS), timed `repeats` times after one warm-up.
pub fn bench_peak(
    threads: usize,
    device: Device,
    side: i64,
    precision: crate::model::precision::Precision,
    repeats: usize,
) -> Result<PeakBenchResult, BenchError> {
    let threads = set_threads(threads, 1);
    let kind = match precision {
        crate::model::precision::Precision::Bf16 => Kind::BFloat16,
        _ => Kind::Float,
    };
    let a = Tensor::f_randn([side, side], (kind, device))?;
    let b = Tensor::f_randn([side, side], (kind, device))?;
    let mut gflops = Vec::with_capacity(repeats);
    for i in 0..=repeats {
        let started = Instant::now();
        let c = a.f_matmul(&b)?;
        // Touch the result so the product is not left lazily unfinished (it is not, on CPU,
        // but this keeps the timing honest if that ever changes).
        let _ = c.f_sum(Kind::Float)?.f_double_value(&[])?;
        synchronize(device);
        let seconds = started.elapsed().as_secs_f64();
        if i > 0 {
            gflops.push(2.0 * (side as f64).powi(3) / seconds / 1e9);
        }
    }
    Ok(PeakBenchResult {
        device: format!("{device:?}"),
        threads,
        precision: precision.to_string(),
        matrix_side: side,
        median_gflops: median(&gflops),
        best_gflops: gflops.iter().copied().fold(f64::NAN, f64::max),
        gflops,
    })
}

#[derive(Debug, Clone, Serialize)]
pub struct AllreduceBenchResult {
    pub arch: String,
    pub world_size: usize,
    pub nodes: usize,
    /// Gradient bytes as training holds them (fp32).
    pub gradient_bytes: usize,
    /// What crosses the network: "fp32", "bf16" or "fp16", and its bytes.
    pub wire: String,
    pub wire_bytes: usize,
    pub bucket_mb: f64,
    pub buckets: usize,
    /// Timed as the communication thread calls it (non-blocking, polled), else blocking.
    pub background: bool,
    pub seconds: Vec<f64>,
    pub median_seconds: f64,
    /// Gradient bytes per second, in Gbit/s.
    pub algbw_gbit: f64,
    /// algbw x 2(p-1)/p, in Gbit/s: what each rank's link carried.
    pub busbw_gbit: f64,
    /// The same on the wire bytes (equal to the above without compression).
    pub wire_algbw_gbit: f64,
    pub wire_busbw_gbit: f64,
}

/// `rtrain bench allreduce`: every model's gradients in buckets of every size.
pub struct AllreduceSuite {
    pub archs: Vec<Arch>,
    pub bucket_mbs: Vec<f64>,
    pub algorithm: crate::config::AllreduceAlgorithm,
    /// Blocking calls instead of the communication thread's polled non-blocking ones.
    pub blocking: bool,
    /// Gradients on the wire as `dist.compress` would send them.
    pub compress: crate::config::GradCompression,
    /// After timing, check the compressed mean against the exact one.
    pub check: bool,
    pub warmup: usize,
    pub iterations: usize,
}

/// What rank 0 hears of a running suite.
pub enum AllreduceEvent<'a> {
    Started(&'a crate::cluster::Topology),
    Measured(AllreduceBenchResult),
    Checked(WireCheck),
}

/// Runs the suite as one rank of the job (every rank calls it, under mpirun); rank 0 hears of
/// each measurement as it is made.
pub fn allreduce_suite(
    suite: &AllreduceSuite,
    mut on_root: impl FnMut(AllreduceEvent<'_>),
) -> Result<(), BenchError> {
    if let Some(&bad) = suite.bucket_mbs.iter().find(|mb| mb.is_nan() || **mb <= 0.0) {
        return Err(BenchError::BucketSize(bad));
    }
    let comm = crate::cluster::init(suite.algorithm)?;
    let topology = comm.topology().clone();
    if topology.is_root() {
        on_root(AllreduceEvent::Started(&topology));
    }
    // The poll interval training uses by default (`dist.poll_us`).
    let poll = (!suite.blocking).then(|| plan::sync_options(&DistConfig::default()).poll);
    for &arch in &suite.archs {
        for &bucket_mb in &suite.bucket_mbs {
            let wire = Wire::of(suite.compress);
            let (warmup, iterations) = (suite.warmup, suite.iterations);
            let result = bench_allreduce(comm.as_ref(), arch, bucket_mb, poll, wire, warmup, iterations)?;
            if topology.is_root() {
                on_root(AllreduceEvent::Measured(result));
            }
        }
    }
    if let (true, Some(wire)) = (suite.check, Wire::of(suite.compress)) {
        if let Some(checked) = check_wire(&comm, wire)? {
            on_root(AllreduceEvent::Checked(checked));
        }
    }
    Ok(())
}

/// Times the all-reduce of `arch`'s trainable gradients in buckets of `bucket_mb`, every
/// bucket in turn, either as the communication thread runs it (`background`: non-blocking,
/// polled without spinning) or with blocking calls. A collective: all ranks call it with the
/// same arguments. Times are rank 0's, each from a barrier.
pub fn bench_allreduce(
    comm: &dyn Communicator,
    arch: Arch,
    bucket_mb: f64,
    poll: Option<std::time::Duration>,
    wire: Option<Wire>,
    warmup: usize,
    iterations: usize,
) -> Result<AllreduceBenchResult, BenchError> {
    let model = Model::new(arch, 1000, Device::Cpu)?;
    let numels: Vec<usize> = model.trainable().iter().map(|(_, t)| t.numel()).collect();
    let order: Vec<usize> = (0..numels.len()).rev().collect();
    let cap = (bucket_mb * 1024.0 * 1024.0) as usize;
    let layout = bucket_layout(&numels, &order, FIRST_BUCKET_BYTES.min(cap), cap);
    let mut buckets: Vec<Vec<f32>> =
        layout.iter().map(|members| vec![1.0f32; members.iter().map(|&i| numels[i]).sum()]).collect();
    let values: usize = numels.iter().sum();
    let gradient_bytes = values * std::mem::size_of::<f32>();
    let wire_bytes = values * wire.map_or(std::mem::size_of::<f32>(), |_| Wire::BYTES);
    let mut scratch = Vec::new();
    let mut seconds = Vec::with_capacity(iterations);
    for i in 0..warmup + iterations {
        comm.barrier();
        let started = Instant::now();
        for bucket in &mut buckets {
            match (wire, poll) {
                (None, Some(poll)) => comm.all_reduce_sum_f32_background(bucket, poll),
                (None, None) => comm.all_reduce_sum_f32(bucket),
                // As training does: cast, sum on the wire, widen.
                (Some(wire), poll) => {
                    cluster::all_reduce_mean_compressed(
                        comm,
                        bucket,
                        wire,
                        &mut scratch,
                        poll.unwrap_or_default(),
                    );
                }
            }
        }
        if i >= warmup {
            seconds.push(started.elapsed().as_secs_f64());
        }
    }
    let topology = comm.topology();
    let median_seconds = median(&seconds);
    let bus = |algbw: f64| algbw * 2.0 * (topology.world_size as f64 - 1.0) / topology.world_size as f64;
    let algbw_gbit = gradient_bytes as f64 * 8.0 / median_seconds / 1e9;
    let wire_algbw_gbit = wire_bytes as f64 * 8.0 / median_seconds / 1e9;
    Ok(AllreduceBenchResult {
        arch: arch.to_string(),
        world_size: topology.world_size,
        nodes: topology.nodes,
        gradient_bytes,
        wire: wire.map_or("fp32".to_string(), |w| format!("{w:?}").to_lowercase()),
        wire_bytes,
        bucket_mb,
        buckets: layout.len(),
        background: poll.is_some(),
        seconds,
        median_seconds,
        algbw_gbit,
        busbw_gbit: bus(algbw_gbit),
        wire_algbw_gbit,
        wire_busbw_gbit: bus(wire_algbw_gbit),
    })
}

/// How far the gradients that training's synchronisation averages with `wire` on the wire land
/// from the exact mean of the ranks' gradients rounded to the wire format. ResNet-18 starts
/// from the same weights on every rank and each rank takes the gradients of a batch of its
/// own; the average goes through [`GradSync`] as in training (buckets reduced on the
/// communication thread during backward, polled). Rank 0 computes every rank's gradients again
/// for the reference and is the only rank that returns the comparison.
#[derive(Debug, Clone, Serialize)]
pub struct WireCheck {
    pub wire: String,
    pub values: usize,
    /// Results equal to the reference.
    pub exact: usize,
    /// Results at most one ulp (of the wire format at the reference) from it.
    pub within_one_ulp: usize,
    /// Values whose ranks' gradients all have the same sign (no cancellation in the sum)...
    pub same_sign: usize,
    /// ... and of those, the results at most one ulp from the reference.
    pub same_sign_within_one_ulp: usize,
    /// Largest |result - reference| in units of the wire format's ulp at the reference.
    pub max_ulps: f64,
    /// Largest |result - reference| in units of the wire format's ulp at the largest rank's
    /// share (|value| / world size): the bound that holds when shares of opposite sign cancel.
    pub max_ulps_of_shares: f64,
}

pub fn check_wire(comm: &Arc<dyn Communicator>, wire: Wire) -> Result<Option<WireCheck>, BenchError> {
    let topology = comm.topology().clone();
    tch::manual_seed(0);
    let model = Model::new(Arch::Resnet18, 10, Device::Cpu)?;
    let trainable = model.trainable();
    let params: Vec<Tensor> = trainable.iter().map(|(_, t)| t.shallow_clone()).collect();
    let backward = |rank: usize| {
        tch::manual_seed(1000 + rank as i64);
        let images = Tensor::randn([8, 3, 64, 64], (Kind::Float, Device::Cpu));
        let labels = Tensor::randint(10, [8], (Kind::Int64, Device::Cpu));
        model.forward_t(&images, true).cross_entropy_for_logits(&labels).backward();
    };
    let gradients = || -> Result<Vec<f32>, BenchError> {
        let flat: Vec<Tensor> = params.iter().map(|p| p.grad().reshape([-1])).collect();
        Ok(Vec::<f32>::try_from(Tensor::cat(&flat, 0))?)
    };
    // The reference, before the synchronisation's hooks exist: every rank's own gradients.
    let mut all = Vec::new();
    if topology.is_root() {
        for rank in 0..topology.world_size {
            tch::no_grad(|| params.iter().for_each(|p| drop(p.grad().f_zero_())));
            backward(rank);
            all.push(gradients()?);
        }
    }
    // Training's defaults, with overlap on (as in training) and this wire format.
    let options =
        SyncOptions { overlap: true, wire: Some(wire), ..plan::sync_options(&DistConfig::default()) };
    let mut sync = GradSync::new(comm.clone(), trainable, options, Reducer::Mpi)?;
    sync.zero_grad();
    backward(topology.rank);
    sync.finish()?;
    if !topology.is_root() {
        return Ok(None);
    }
    let averaged = gradients()?;
    let world = topology.world_size as f64;
    let (mut exact, mut within_one_ulp, mut max_ulps, mut max_ulps_of_shares) = (0, 0, 0.0f64, 0.0f64);
    let (mut same_sign, mut same_sign_within_one_ulp) = (0, 0);
    for (i, &result) in averaged.iter().enumerate() {
        let mean = all.iter().map(|g| f64::from(g[i])).sum::<f64>() / world;
        let reference = wire.decode(wire.encode(mean as f32));
        let error = f64::from((result - reference).abs());
        exact += usize::from(error == 0.0);
        let ulps = error / f64::from(wire.ulp(reference));
        within_one_ulp += usize::from(ulps <= 1.0);
        max_ulps = max_ulps.max(ulps);
        if all.iter().all(|g| g[i] >= 0.0) || all.iter().all(|g| g[i] <= 0.0) {
            same_sign += 1;
            same_sign_within_one_ulp += usize::from(ulps <= 1.0);
        }
        let share = all.iter().map(|g| g[i].abs()).fold(0.0f32, f32::max) / topology.world_size as f32;
        max_ulps_of_shares = max_ulps_of_shares.max(error / f64::from(wire.ulp(share)));
    }
    Ok(Some(WireCheck {
        wire: format!("{wire:?}").to_lowercase(),
        values: averaged.len(),
        exact,
        within_one_ulp,
        same_sign,
        same_sign_within_one_ulp,
        max_ulps,
        max_ulps_of_shares,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::precision::Precision;

    #[test]
    fn agree_finds_no_difference_in_the_same_computation_and_a_real_one_in_bf16() {
        let fp32 = Compute { precision: Precision::Fp32, channels_last: false, device: Device::Cpu };
        let same = bench_agree(Arch::Resnet18, 64, 8, fp32, fp32, false).unwrap();
        assert!(same.loss_reference.is_finite() && same.loss_reference > 0.0);
        assert_eq!(same.loss_reference, same.loss_other);
        assert_eq!((same.logits_max_abs_difference, same.update_relative_difference), (0.0, 0.0));
        // bf16 keeps 8 bits of mantissa: the step lands measurably elsewhere (so the check that
        // a GPU agrees with the CPU can fail), but it is still the same step.
        let bf16 =
            bench_agree(Arch::Resnet18, 64, 8, fp32, Compute { precision: Precision::Bf16, ..fp32 }, false)
                .unwrap();
        assert!(bf16.logits_max_abs_difference > 1e-3, "{bf16:?}");
        assert!(bf16.loss_relative_difference > 1e-5 && bf16.loss_relative_difference < 0.05, "{bf16:?}");
        assert!(bf16.update_relative_difference > 1e-3 && bf16.update_relative_difference < 0.5, "{bf16:?}");
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct AssignBenchResult {
    pub footprints: usize,
    pub photos: usize,
    pub max_distance_m: f64,
    /// Reading and checking the GeoJSON file.
    pub read_seconds: f64,
    /// Projecting the footprints and building the R-tree.
    pub index_seconds: f64,
    /// Assigning every photo.
    pub assign_seconds: f64,
    /// Photos per kind of assignment (inside, line_of_sight, nearest, none).
    pub kinds: std::collections::BTreeMap<&'static str, usize>,
    /// Resident memory before reading the footprints (the binary and libtorch's libraries).
    pub rss_before_mib: Option<f64>,
    /// Peak resident memory of the whole process (VmHWM).
    pub peak_rss_mib: Option<f64>,
}

/// A photo of the benchmark's CSV: latitude, longitude and heading (an empty cell: none).
#[derive(serde::Deserialize)]
struct BenchPhoto {
    latitude: f64,
    longitude: f64,
    heading: Option<f64>,
}

/// Times reading `footprints`, indexing them and assigning each photo of the CSV `photos` to
/// its building within `max_distance_m`.
pub fn bench_assign(
    footprints: &std::path::Path,
    id_key: &str,
    photos: &std::path::Path,
    max_distance_m: f64,
) -> Result<AssignBenchResult, BenchError> {
    use crate::predict::assign::Assigner;
    use crate::predict::footprints::Footprints;
    let photos_error = |problem: String| BenchError::Photos { path: photos.to_path_buf(), problem };
    let mut reader = csv::Reader::from_path(photos).map_err(|e| photos_error(e.to_string()))?;
    let photos: Vec<BenchPhoto> =
        reader.deserialize().collect::<Result<_, _>>().map_err(|e| photos_error(e.to_string()))?;
    let rss_before_mib = crate::util::memory::peak_rss_mib();
    let started = Instant::now();
    let footprints = Footprints::read(footprints, id_key)?;
    let read_seconds = started.elapsed().as_secs_f64();
    let started = Instant::now();
    let assigner = Assigner::new(&footprints, max_distance_m);
    let index_seconds = started.elapsed().as_secs_f64();
    let started = Instant::now();
    let assignments: Vec<_> =
        photos.iter().map(|photo| assigner.assign(photo.latitude, photo.longitude, photo.heading)).collect();
    let assign_seconds = started.elapsed().as_secs_f64();
    let mut kinds = std::collections::BTreeMap::new();
    for assignment in &assignments {
        *kinds.entry(assignment.kind.as_str()).or_insert(0) += 1;
    }
    Ok(AssignBenchResult {
        footprints: footprints.items.len(),
        photos: photos.len(),
        max_distance_m,
        read_seconds,
        index_seconds,
        assign_seconds,
        kinds,
        rss_before_mib,
        peak_rss_mib: crate::util::memory::peak_rss_mib(),
    })
}
