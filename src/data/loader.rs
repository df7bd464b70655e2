//! The batch loader: decodes and transforms an epoch's samples on worker threads and hands
//! them out as tensors, in a fixed order, with bounded memory.
//!
//! This module owns batching (`order.chunks(batch_size)`), the worker threads and their
//! shutdown, and writing each batch straight into a `tch::Tensor`. Batch `k` (counted from
//! the first one yielded) is built by worker `k % workers` into that worker's own bounded channel and
//! the iterator receives from the channels round-robin, so batches arrive in order whatever
//! the thread timing. Augmentation randomness comes from [`sample_rng`] per sample, so the
//! batches are bit-identical for any number of workers, including none.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver};
use std::sync::Arc;
use std::thread::JoinHandle;

use tch::{Device, Kind, Tensor};

use rand_chacha::ChaCha8Rng;

use super::dataset::DataError;
use super::dataset::Dataset;
use super::decode::{decode_request, decode_whole, DecodeError, DecodeOptions, Request};
use super::transforms::{self, sample_rng, DrawnTransform, Transform};

/// One batch of transformed images.
#[derive(Debug)]
pub struct Batch {
    /// `[B, 3, S, S]` `f32`, normalised, on the CPU.
    pub images: Tensor,
    /// `[B]` `i64` class labels.
    pub labels: Tensor,
    /// The dataset indices the batch was built from, in batch order.
    pub indices: Vec<usize>,
    /// Samples left out because they could not be read or decoded (`skip_bad_samples`): which
    /// and why.
    pub skipped: Vec<SkippedSample>,
}

impl Batch {
    /// The same tensors (no copy) and indices; the skipped samples are not carried.
    pub fn shallow_clone(&self) -> Batch {
        Batch {
            images: self.images.shallow_clone(),
            labels: self.labels.shallow_clone(),
            indices: self.indices.clone(),
            skipped: Vec::new(),
        }
    }
}

/// A sample a batch left out, and why.
#[derive(Debug)]
pub struct SkippedSample {
    /// Its dataset index.
    pub index: usize,
    /// A [`DataError::Decode`], or the failure to read its file.
    pub error: DataError,
}

impl std::fmt::Display for SkippedSample {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.error {
            DataError::Decode { path, source } => write!(f, "{}: {source}", path.display()),
            other => write!(f, "{other}"),
        }
    }
}

/// How batches are formed and how much work runs ahead.
#[derive(Debug, Clone)]
pub struct LoaderOptions {
    /// Samples per batch (at least 1).
    pub batch_size: usize,
    /// Decoding threads; 0 decodes on the thread that iterates.
    pub workers: usize,
    /// Finished batches each worker may hold before it waits for the consumer; 0 means a
    /// worker hands over each batch as it is taken (still one batch ahead while it waits).
    pub prefetch: usize,
    /// Leave out samples that cannot be read or decoded (the batch is smaller, and says which)
    /// instead of failing with the sample named (`data.on_bad_sample`).
    pub skip_bad_samples: bool,
    /// Run the workers at a lower scheduling priority, for when the model computes on the
    /// same cores: see [`LOW_PRIORITY_NICE`].
    pub low_priority: bool,
    /// Put each batch's images in page-locked memory for asynchronous copies to this GPU.
    pub pin_for: Option<Device>,
}

/// The nice value of loader threads with `low_priority`. When libtorch's threads already take
/// every core, a loader thread that wakes up preempts one of them, and the others then wait
/// for it at the next parallel region's barrier: decoding costs several times its own CPU
/// time. At a lower priority, decoding mostly runs in the gaps (the step's serial parts, a
/// wait for the next batch). ResNet-18 epochs at 64x64 on 2 cores ran 4-9% faster this way
/// (BENCHMARKS.md).
pub const LOW_PRIORITY_NICE: i32 = 10;

/// Lowers the calling thread's priority to [`LOW_PRIORITY_NICE`]. On Linux a nice value
/// belongs to a thread (`setpriority` with its thread id); elsewhere this does nothing.
fn lower_this_threads_priority() {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: gettid and setpriority take and return plain integers and touch no memory.
        let result = unsafe {
            let tid = libc::gettid();
            libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, LOW_PRIORITY_NICE)
        };
        if result != 0 {
            // Only a scheduling hint: decoding still works at the normal priority.
            tracing::debug!(
                "could not lower a loader thread's priority: {}",
                std::io::Error::last_os_error()
            );
        }
    }
}

/// Everything a worker needs to build any batch of the epoch; shared read-only.
struct Batcher {
    dataset: Arc<dyn Dataset>,
    order: Vec<usize>,
    transform: Transform,
    seed: u64,
    epoch: u64,
    batch_size: usize,
    skip_bad_samples: bool,
    pin_for: Option<Device>,
}

impl Batcher {
    /// Builds batch `k`, or returns `Ok(None)` if `cancel` was raised part-way.
    fn build(&self, k: usize, cancel: &AtomicBool) -> Result<Option<Batch>, DataError> {
        let began = std::time::Instant::now();
        let batch = self.build_untraced(k, cancel);
        if let (true, Ok(Some(batch))) = (crate::trace::recording(), &batch) {
            let args = serde_json::json!({"batch": k, "images": batch.indices.len(), "skipped": batch.skipped.len()});
            let name = format!("decode batch {k}");
            crate::trace::span(name, crate::trace::CPU_OP, began, std::time::Instant::now(), Some(args));
        }
        batch
    }

    /// [`Self::build`] without its span in the step trace.
    fn build_untraced(&self, k: usize, cancel: &AtomicBool) -> Result<Option<Batch>, DataError> {
        let start = k * self.batch_size;
        let end = (start + self.batch_size).min(self.order.len());
        let indices = self.order[start..end].to_vec();
        let per_image = self.transform.output_len();
        let size = i64::from(self.transform.size());
        let len = per_image * indices.len();
        let tensor_err = |source| DataError::Tensor { root: self.dataset.root().to_path_buf(), source };
        // The images are written straight into the tensor's memory. `Tensor::from_slice` would
        // cost a zero-fill (an OpenMP region: each loader thread then keeps its own team of
        // spinning OpenMP threads) plus a copy — more CPU than the resampling itself at 224².
        let images = Tensor::f_empty([indices.len() as i64, 3, size, size], (Kind::Float, Device::Cpu))
            .map_err(tensor_err)?;
        let pixels: &mut [f32] = if len == 0 {
            &mut []
        } else {
            // SAFETY: `images` was just allocated by libtorch as a contiguous CPU `f32` tensor
            // of exactly `len` elements, so `data_ptr` is valid and aligned for `len` `f32`s.
            // No other handle to its storage exists until `images` is returned below, after
            // the last use of this slice, so nothing else reads or writes it meanwhile.
            unsafe { std::slice::from_raw_parts_mut(images.data_ptr().cast::<f32>(), len) }
        };
        let mut labels = Vec::with_capacity(indices.len());
        let mut kept = Vec::with_capacity(indices.len());
        let mut skipped = Vec::new();
        for &index in &indices {
            if cancel.load(Ordering::Relaxed) {
                return Ok(None);
            }
            let mut rng = sample_rng(self.seed, self.epoch, index);
            // Samples fill the tensor from the front; `render` writes every value of its slot.
            let slot = kept.len();
            let out = &mut pixels[slot * per_image..(slot + 1) * per_image];
            match decode_transformed(self.dataset.as_ref(), index, &self.transform, &mut rng, out) {
                Ok(()) => {}
                Err(error @ (DataError::Decode { .. } | DataError::Io { .. })) if self.skip_bad_samples => {
                    skipped.push(SkippedSample { index, error });
                    continue;
                }
                Err(err) => return Err(err),
            }
            // `encoded` has checked the index, so this lookup cannot fail.
            labels.push(self.dataset.label(index).unwrap_or(0) as i64);
            kept.push(index);
        }
        // Skipped samples leave unwritten slots at the end: cut them off.
        let images = if kept.len() < indices.len() { images.narrow(0, 0, kept.len() as i64) } else { images };
        // Pinned here, on the worker, so that the training thread's copy to the GPU is
        // asynchronous.
        let images = match self.pin_for {
            Some(_) => crate::util::shim::pinned(&images)
                .map_err(|e| tensor_err(tch::TchError::Torch(e.to_string())))?,
            None => images,
        };
        let labels = Tensor::f_from_slice(&labels).map_err(tensor_err)?;
        Ok(Some(Batch { images, labels, indices: kept, skipped }))
    }
}

/// Decodes sample `index` and writes its transformed pixels into `out`; see
/// [`transform_encoded`].
fn decode_transformed(
    dataset: &dyn Dataset,
    index: usize,
    transform: &Transform,
    rng: &mut ChaCha8Rng,
    out: &mut [f32],
) -> Result<(), DataError> {
    let bytes = dataset.encoded(index)?;
    transform_encoded(&bytes, transform, rng, out)
        .map_err(|source| DataError::Decode { path: dataset.describe(index).into(), source })
}

/// How every image is decoded for `transform`.
fn decode_options(transform: &Transform) -> DecodeOptions {
    DecodeOptions { exif_orientation: transform.exif_orientation, max_pixels: transform.max_image_pixels }
}

/// Decodes an encoded image and writes its transformed pixels into `out`. The transform's plan
/// is drawn from the image's size as soon as the header is read, so only the pixels it reads
/// are decoded (for a JPEG), and with `jpeg_draft` at the smallest DCT scale that still gives
/// the plan as many pixels as it writes.
pub fn transform_encoded(
    bytes: &[u8],
    transform: &Transform,
    rng: &mut ChaCha8Rng,
    out: &mut [f32],
) -> Result<(), DecodeError> {
    if transform.policy.is_some() {
        // The policy's operations read the whole image: decode it all, reduced as far as the
        // geometry after it allows whatever it draws.
        let image = decode_whole(bytes, decode_options(transform), |width, height| {
            if transform.jpeg_draft {
                transform.whole_image_reduction(width, height)
            } else {
                1
            }
        })?;
        transforms::apply_owned(image, transform, rng, out);
        return Ok(());
    }
    let mut plan = None;
    let region = decode_request(bytes, decode_options(transform), |width, height| {
        let drawn = DrawnTransform::new(width, height, transform, rng);
        let reduction = if transform.jpeg_draft { drawn.max_reduction() } else { 1 };
        let request = drawn.reduced(reduction).source().map(|rect| Request { reduction, rect });
        plan = Some(drawn);
        request
    })?;
    let plan = plan.expect("decode_request asks for the region once the header is read");
    plan.reduced(region.reduction).render(&region.pixels, region.rect, out);
    Ok(())
}

/// Which of an epoch's batches a loader yields: the first `count` of `order.chunks(batch_size)`
/// (the plan decides how many: [`crate::plan::RunPlan::steps_per_epoch`] for training), from
/// batch `start` on (resuming mid-epoch), with augmentation randomness keyed by `seed` and
/// `epoch`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EpochBatches {
    pub seed: u64,
    pub epoch: u64,
    pub count: usize,
    pub start: usize,
}

impl EpochBatches {
    /// Every one of `samples` in batches of `batch_size`, the last one partial, with no
    /// augmentation to key: evaluation and prediction.
    pub fn every_sample(samples: usize, batch_size: usize) -> EpochBatches {
        EpochBatches { seed: 0, epoch: 0, count: samples.div_ceil(batch_size.max(1)), start: 0 }
    }
}

/// Where batches come from.
enum Source {
    /// `workers == 0`: build on the iterating thread.
    Inline,
    /// One channel per worker, received from round-robin.
    Workers {
        receivers: Vec<Receiver<Result<Batch, DataError>>>,
        handles: Vec<JoinHandle<()>>,
        cancel: Arc<AtomicBool>,
    },
    /// Finished, failed or shut down: yields nothing more.
    Done,
}

/// Iterator over one epoch's batches; see the module documentation.
///
/// Dropping it early stops and joins the workers.
pub struct Loader {
    job: Arc<Batcher>,
    /// Absolute number of the next batch to yield.
    next: usize,
    /// First batch this loader yields (`EpochBatches::start`, capped).
    first: usize,
    /// Number of batches in the whole epoch.
    end: usize,
    /// Set when the options are unusable; reported by the first `next`.
    invalid: Option<DataError>,
    source: Source,
}

impl Loader {
    /// Starts loading `batches` of `order.chunks(batch_size)` (at most as many as `order`
    /// fills), skipping the first `batches.start` of them without decoding anything — for
    /// resuming mid-epoch. `order` is this epoch's sequence of dataset indices (the sampler's
    /// job).
    ///
    /// Workers start immediately. A `batch_size` of 0 makes the first item an error.
    pub fn new(
        dataset: Arc<dyn Dataset>,
        order: Vec<usize>,
        transform: Transform,
        batches: EpochBatches,
        options: LoaderOptions,
    ) -> Loader {
        let invalid = (options.batch_size == 0).then(|| DataError::InvalidOptions {
            root: dataset.root().to_path_buf(),
            reason: "batch_size must be at least 1".to_string(),
        });
        let batch_size = options.batch_size.max(1);
        let end = match invalid {
            // Nothing but the error will be yielded.
            Some(_) => 0,
            None => batches.count.min(order.len().div_ceil(batch_size)),
        };
        let first = batches.start.min(end);
        let (skip_bad_samples, pin_for) = (options.skip_bad_samples, options.pin_for);
        let EpochBatches { seed, epoch, .. } = batches;
        let job = Arc::new(Batcher {
            dataset,
            order,
            transform,
            seed,
            epoch,
            batch_size,
            skip_bad_samples,
            pin_for,
        });
        let source = if invalid.is_some() || first == end {
            Source::Done
        } else if options.workers == 0 {
            Source::Inline
        } else {
            spawn_workers(&job, first, end, &options)
        };
        Loader { job, next: first, first, end, invalid, source }
    }

    /// Number of batches this loader yields in all: the epoch's batches minus the skipped
    /// `start` (constant; it does not count down as batches are taken).
    pub fn len(&self) -> usize {
        self.end - self.first
    }

    /// Whether the loader yields no batches at all.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Number of batches in the whole epoch, including any skipped by `start`.
    pub fn epoch_batches(&self) -> usize {
        self.end
    }

    /// Stops the workers and waits for them. Dropping the receivers first makes any worker
    /// blocked on a full channel fail its send and exit, so the joins cannot deadlock; the
    /// cancel flag stops one mid-batch at the next sample.
    fn shutdown(&mut self) {
        if let Source::Workers { receivers, handles, cancel } =
            std::mem::replace(&mut self.source, Source::Done)
        {
            cancel.store(true, Ordering::Relaxed);
            drop(receivers);
            for handle in handles {
                // A panicked worker was already reported as `WorkerLost` (or its batch was
                // never wanted); there is nothing more to do with the payload.
                let _ = handle.join();
            }
        }
        self.next = self.end;
    }
}

impl Drop for Loader {
    fn drop(&mut self) {
        self.shutdown();
    }
}

impl Iterator for Loader {
    type Item = Result<Batch, DataError>;

    fn next(&mut self) -> Option<Self::Item> {
        if let Some(err) = self.invalid.take() {
            return Some(Err(err));
        }
        if self.next >= self.end {
            self.shutdown();
            return None;
        }
        let k = self.next;
        let result = match &self.source {
            Source::Done => return None,
            Source::Inline => {
                let never = AtomicBool::new(false);
                // Without a cancel flag being raised, `build` always yields a batch.
                match self.job.build(k, &never) {
                    Ok(Some(batch)) => Ok(batch),
                    Ok(None) => return None,
                    Err(err) => Err(err),
                }
            }
            Source::Workers { receivers, .. } => {
                let worker = (k - self.first) % receivers.len();
                receivers[worker].recv().unwrap_or_else(|_| {
                    Err(DataError::WorkerLost { worker, root: self.job.dataset.root().to_path_buf() })
                })
            }
        };
        self.next += 1;
        if result.is_err() {
            // The epoch cannot continue past a missing batch: end here and free the workers.
            self.shutdown();
        } else if self.next >= self.end {
            self.shutdown();
        }
        Some(result)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let remaining = self.end.saturating_sub(self.next) + usize::from(self.invalid.is_some());
        (remaining, Some(remaining))
    }
}

/// Starts `options.workers` threads; worker `w` builds batches `first + w`,
/// `first + w + workers`, … into its own channel. Falls back to inline decoding if the OS
/// refuses a thread.
fn spawn_workers(job: &Arc<Batcher>, first: usize, end: usize, options: &LoaderOptions) -> Source {
    let workers = options.workers.min(end - first).max(1);
    let low_priority = options.low_priority;
    let cancel = Arc::new(AtomicBool::new(false));
    let mut receivers = Vec::with_capacity(workers);
    let mut handles = Vec::with_capacity(workers);
    for w in 0..workers {
        let (tx, rx) = sync_channel(options.prefetch);
        let job = Arc::clone(job);
        let stop = Arc::clone(&cancel);
        let spawned = std::thread::Builder::new().name(format!("loader-{w}")).spawn(move || {
            if low_priority {
                lower_this_threads_priority();
            }
            let mut k = first + w;
            while k < end && !stop.load(Ordering::Relaxed) {
                let result = match job.build(k, &stop) {
                    Ok(Some(batch)) => Ok(batch),
                    Ok(None) => return,
                    Err(err) => Err(err),
                };
                let failed = result.is_err();
                // A failed send means the loader is gone: nobody wants more batches.
                if tx.send(result).is_err() || failed {
                    return;
                }
                k += workers;
            }
        });
        match spawned {
            Ok(handle) => {
                receivers.push(rx);
                handles.push(handle);
            }
            Err(err) => {
                tracing::warn!(error = %err, "could not start loader threads; decoding inline");
                cancel.store(true, Ordering::Relaxed);
                drop(receivers);
                for handle in handles {
                    let _ = handle.join();
                }
                return Source::Inline;
            }
        }
    }
    Source::Workers { receivers, handles, cancel }
}

#[cfg(test)]
mod tests {
    use super::super::folder::ImageFolder;
    use super::super::transforms::{Augment, IMAGENET_MEAN, IMAGENET_STD};
    use super::*;
    use std::path::Path;

    /// A tiny tree with two classes, mixed PNG/JPEG, different sizes and colours.
    fn make_tree(root: &Path) {
        for (class, count) in [("ants", 5), ("bees", 6)] {
            std::fs::create_dir_all(root.join(class)).unwrap();
            for i in 0..count {
                let (w, h) = (20 + 3 * i, 16 + 5 * i);
                let mut img = image::RgbImage::new(w, h);
                for (x, y, p) in img.enumerate_pixels_mut() {
                    *p = image::Rgb([(x * 9 + i) as u8, (y * 7) as u8, ((x ^ y) * 8) as u8]);
                }
                let ext = if i % 2 == 0 { "png" } else { "jpg" };
                img.save(root.join(class).join(format!("{i:02}.{ext}"))).unwrap();
            }
        }
    }

    fn options(batch_size: usize, workers: usize) -> LoaderOptions {
        LoaderOptions {
            batch_size,
            workers,
            prefetch: 2,
            skip_bad_samples: false,
            low_priority: false,
            pin_for: None,
        }
    }

    /// The batches from `start` on, as many as the order fills.
    fn from(seed: u64, epoch: u64, start: usize) -> EpochBatches {
        EpochBatches { seed, epoch, count: usize::MAX, start }
    }

    /// A batch read back: (image values, labels, indices, image tensor shape).
    type Collected = (Vec<f32>, Vec<i64>, Vec<usize>, Vec<i64>);

    fn collect(loader: Loader) -> Vec<Collected> {
        loader
            .map(|b| {
                let b = b.unwrap();
                let images = Vec::<f32>::try_from(b.images.flatten(0, -1)).unwrap();
                let labels = Vec::<i64>::try_from(&b.labels).unwrap();
                (images, labels, b.indices, b.images.size())
            })
            .collect()
    }

    #[test]
    fn batches_are_identical_for_any_worker_count() {
        let dir = tempfile::tempdir().unwrap();
        make_tree(dir.path());
        let data: Arc<dyn Dataset> = Arc::new(ImageFolder::open(dir.path()).unwrap());
        let order = vec![7, 2, 10, 0, 5, 3, 9, 1, 8, 4, 6];
        let t = Transform::train(12, Augment::default());
        let run = |workers| {
            let loader =
                Loader::new(Arc::clone(&data), order.clone(), t.clone(), from(42, 3, 0), options(4, workers));
            assert_eq!(loader.len(), 3);
            collect(loader)
        };
        let inline = run(0);
        assert_eq!(inline.len(), 3);
        assert_eq!(inline[2].3, vec![3, 3, 12, 12]);
        assert_eq!(inline[0].3, vec![4, 3, 12, 12]);
        let flat: Vec<usize> = inline.iter().flat_map(|b| b.2.clone()).collect();
        assert_eq!(flat, order);
        for workers in [1, 3] {
            let threaded = run(workers);
            assert_eq!(threaded.len(), inline.len());
            for (a, b) in inline.iter().zip(&threaded) {
                // Bit-identical, not merely close.
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&a.0), bits(&b.0), "workers={workers}");
                assert_eq!(a.1, b.1);
                assert_eq!(a.2, b.2);
            }
        }
        // A different epoch augments differently.
        let other =
            collect(Loader::new(Arc::clone(&data), order.clone(), t.clone(), from(42, 4, 0), options(4, 2)));
        assert_ne!(other[0].0, inline[0].0);
    }

    #[test]
    fn labels_match_folder_classes() {
        let dir = tempfile::tempdir().unwrap();
        make_tree(dir.path());
        let data: Arc<dyn Dataset> = Arc::new(ImageFolder::open(dir.path()).unwrap());
        assert_eq!(data.classes(), ["ants", "bees"]);
        let order: Vec<usize> = (0..data.len()).rev().collect();
        let t = Transform::eval(8, 10);
        let batches = collect(Loader::new(Arc::clone(&data), order, t, from(0, 0, 0), options(3, 2)));
        let mut seen = 0;
        for (_, labels, indices, _) in &batches {
            for (&label, &index) in labels.iter().zip(indices) {
                let want = usize::from(index >= 5);
                assert_eq!(label as usize, want, "index {index}");
                let class = &data.classes()[label as usize];
                assert!(data.describe(index).starts_with(&dir.path().join(class).display().to_string()));
                seen += 1;
            }
        }
        assert_eq!(seen, 11);
    }

    #[test]
    fn eval_batch_of_constant_images_is_normalised_constant() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("a")).unwrap();
        image::RgbImage::from_pixel(30, 17, image::Rgb([10, 100, 250]))
            .save(dir.path().join("a/x.png"))
            .unwrap();
        let data: Arc<dyn Dataset> = Arc::new(ImageFolder::open(dir.path()).unwrap());
        let t = Transform::eval(8, 9);
        let batches = collect(Loader::new(data, vec![0, 0], t, from(0, 0, 0), options(2, 1)));
        let images = &batches[0].0;
        assert_eq!(batches[0].3, vec![2, 3, 8, 8]);
        for (c, v) in [10u8, 100, 250].into_iter().enumerate() {
            let want = (f32::from(v) / 255.0 - IMAGENET_MEAN[c]) / IMAGENET_STD[c];
            for img in 0..2 {
                let plane = &images[img * 192 + c * 64..img * 192 + (c + 1) * 64];
                assert!(plane.iter().all(|&x| x == want), "channel {c}");
            }
        }
    }

    #[test]
    fn start_skips_and_count_caps() {
        let dir = tempfile::tempdir().unwrap();
        make_tree(dir.path());
        let data: Arc<dyn Dataset> = Arc::new(ImageFolder::open(dir.path()).unwrap());
        let order: Vec<usize> = (0..11).collect();
        let t = Transform::train(8, Augment::default());
        let full = collect(Loader::new(
            Arc::clone(&data),
            order.clone(),
            t.clone(),
            EpochBatches { seed: 1, epoch: 0, count: 3, start: 0 },
            options(3, 0),
        ));
        assert_eq!(full.len(), 3); // 11 / 3, last partial dropped
        for workers in [0, 2] {
            let resumed = Loader::new(
                Arc::clone(&data),
                order.clone(),
                t.clone(),
                EpochBatches { seed: 1, epoch: 0, count: 3, start: 2 },
                options(3, workers),
            );
            assert_eq!(resumed.len(), 1);
            assert_eq!(resumed.epoch_batches(), 3);
            let resumed = collect(resumed);
            assert_eq!(resumed.len(), 1);
            assert_eq!(resumed[0].2, vec![6, 7, 8]);
            assert_eq!(resumed[0].0, full[2].0);
        }
        // Skipping past the end yields nothing.
        let past = Loader::new(Arc::clone(&data), order.clone(), t.clone(), from(1, 0, 9), options(3, 2));
        assert!(past.is_empty());
        assert_eq!(past.count(), 0);
    }

    #[test]
    fn start_does_not_decode_skipped_batches() {
        // Sample 0 is corrupt; skipping its batch must not touch it.
        let dir = tempfile::tempdir().unwrap();
        make_tree(dir.path());
        std::fs::write(dir.path().join("ants/00.png"), b"garbage").unwrap();
        let data: Arc<dyn Dataset> = Arc::new(ImageFolder::open(dir.path()).unwrap());
        let t = Transform::eval(8, 8);
        let order: Vec<usize> = (0..11).collect();
        for workers in [0, 2] {
            let got = collect(Loader::new(
                Arc::clone(&data),
                order.clone(),
                t.clone(),
                from(0, 0, 1),
                options(4, workers),
            ));
            assert_eq!(got.len(), 2);
        }
    }

    #[test]
    fn corrupt_file_ends_the_epoch_with_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        make_tree(dir.path());
        let bad = dir.path().join("bees/02.png");
        std::fs::write(&bad, b"\x89PNG\r\n\x1a\n truncated").unwrap();
        let data: Arc<dyn Dataset> = Arc::new(ImageFolder::open(dir.path()).unwrap());
        let bad_index = (0..data.len()).position(|i| data.describe(i) == bad.display().to_string()).unwrap();
        let t = Transform::eval(8, 8);
        let order: Vec<usize> = (0..11).collect();
        for workers in [0, 1, 3] {
            let mut loader =
                Loader::new(Arc::clone(&data), order.clone(), t.clone(), from(0, 0, 0), options(2, workers));
            let bad_batch = bad_index / 2;
            for _ in 0..bad_batch {
                assert!(loader.next().unwrap().is_ok());
            }
            let err = loader.next().unwrap().unwrap_err();
            assert!(matches!(err, DataError::Decode { .. }), "{err:?}");
            assert!(err.to_string().contains(&*bad.to_string_lossy()), "{err}");
            assert!(loader.next().is_none(), "workers={workers}");
        }
    }

    #[test]
    fn skipping_bad_samples_leaves_them_out_and_keeps_the_others_identical() {
        let dir = tempfile::tempdir().unwrap();
        make_tree(dir.path());
        let clean: Arc<dyn Dataset> = Arc::new(ImageFolder::open(dir.path()).unwrap());
        let t = Transform::train(8, Augment::default());
        let order: Vec<usize> = (0..11).rev().collect();
        let skip = |workers| LoaderOptions { skip_bad_samples: true, ..options(4, workers) };
        let expected =
            collect(Loader::new(Arc::clone(&clean), order.clone(), t.clone(), from(5, 1, 0), skip(0)));

        let bad = dir.path().join("bees/02.png");
        std::fs::write(&bad, b"\x89PNG\r\n\x1a\n truncated").unwrap();
        let data: Arc<dyn Dataset> = Arc::new(ImageFolder::open(dir.path()).unwrap());
        let bad_index = (0..data.len()).position(|i| data.describe(i) == bad.display().to_string()).unwrap();
        for workers in [0, 2] {
            let batches: Vec<Batch> =
                Loader::new(Arc::clone(&data), order.clone(), t.clone(), from(5, 1, 0), skip(workers))
                    .map(Result::unwrap)
                    .collect();
            let skipped: Vec<String> =
                batches.iter().flat_map(|b| &b.skipped).map(|s| s.to_string()).collect();
            assert_eq!(skipped.len(), 1, "workers={workers}");
            assert!(skipped[0].contains(&*bad.to_string_lossy()), "{}", skipped[0]);
            // Every other sample arrives, augmented exactly as without the bad file.
            let mut got_indices: Vec<usize> = Vec::new();
            let mut got_values = Vec::new();
            for batch in &batches {
                assert_eq!(batch.images.size()[0], batch.indices.len() as i64);
                assert_eq!(batch.labels.size()[0], batch.indices.len() as i64);
                got_indices.extend(&batch.indices);
                got_values.extend(Vec::<f32>::try_from(batch.images.flatten(0, -1)).unwrap());
            }
            let per_image = 3 * 8 * 8;
            let mut want_indices = Vec::new();
            let mut want_values = Vec::new();
            for (values, _, indices, _) in &expected {
                for (i, &index) in indices.iter().enumerate() {
                    if index != bad_index {
                        want_indices.push(index);
                        want_values.extend_from_slice(&values[i * per_image..(i + 1) * per_image]);
                    }
                }
            }
            assert_eq!(got_indices, want_indices, "workers={workers}");
            assert_eq!(got_values, want_values, "workers={workers}");
        }
    }

    #[test]
    fn dropping_early_stops_workers() {
        let dir = tempfile::tempdir().unwrap();
        make_tree(dir.path());
        let data: Arc<dyn Dataset> = Arc::new(ImageFolder::open(dir.path()).unwrap());
        let order: Vec<usize> = (0..11).cycle().take(400).collect();
        let t = Transform::train(16, Augment::default());
        let mut loader = Loader::new(
            Arc::clone(&data),
            order,
            t,
            from(0, 0, 0),
            LoaderOptions {
                batch_size: 2,
                workers: 3,
                prefetch: 1,
                skip_bad_samples: false,
                low_priority: false,
                pin_for: None,
            },
        );
        assert!(loader.next().unwrap().is_ok());
        // Let the workers fill their channels and block on send.
        std::thread::sleep(std::time::Duration::from_millis(100));
        drop(loader);
        // The workers held the only other references to the dataset: all joined.
        assert_eq!(Arc::strong_count(&data), 1);
    }

    #[test]
    fn zero_batch_size_and_bad_index_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        make_tree(dir.path());
        let data: Arc<dyn Dataset> = Arc::new(ImageFolder::open(dir.path()).unwrap());
        let t = Transform::eval(8, 8);
        let mut loader = Loader::new(Arc::clone(&data), vec![0, 1], t.clone(), from(0, 0, 0), options(0, 2));
        assert!(matches!(loader.next(), Some(Err(DataError::InvalidOptions { .. }))));
        assert!(loader.next().is_none());

        let mut loader = Loader::new(data, vec![0, 99], t, from(0, 0, 0), options(2, 1));
        assert!(matches!(loader.next(), Some(Err(DataError::IndexOutOfRange { index: 99, .. }))));
        assert!(loader.next().is_none());
    }

    /// Records the nice value of the thread that loads each sample.
    struct NiceProbe {
        root: std::path::PathBuf,
        classes: Vec<String>,
        seen: std::sync::Mutex<Vec<i32>>,
    }

    impl Dataset for NiceProbe {
        fn root(&self) -> &Path {
            &self.root
        }
        fn classes(&self) -> &[String] {
            &self.classes
        }
        fn len(&self) -> usize {
            4
        }
        fn label(&self, index: usize) -> Option<usize> {
            (index < 4).then_some(0)
        }
        fn encoded(&self, _index: usize) -> Result<std::borrow::Cow<'_, [u8]>, DataError> {
            // SAFETY: plain integer calls. getpriority can return -1 legitimately, but the
            // nice values here are 0 and 10.
            let nice = unsafe { libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t) };
            self.seen.lock().unwrap().push(nice);
            let mut png = Vec::new();
            image::RgbImage::new(8, 8)
                .write_to(&mut std::io::Cursor::new(&mut png), image::ImageFormat::Png)
                .unwrap();
            Ok(png.into())
        }
        fn describe(&self, index: usize) -> String {
            format!("probe sample {index}")
        }
        fn files(&self) -> Vec<std::path::PathBuf> {
            Vec::new()
        }
    }

    #[test]
    fn low_priority_workers_decode_at_a_higher_nice_value_than_the_caller() {
        // SAFETY: getpriority and gettid have no preconditions.
        let before = unsafe { libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t) };
        for (low_priority, expected) in [(false, before), (true, LOW_PRIORITY_NICE.max(before))] {
            let probe = Arc::new(NiceProbe {
                root: "probe".into(),
                classes: vec!["a".into()],
                seen: Default::default(),
            });
            let data: Arc<dyn Dataset> = probe.clone();
            let t = Transform::train(4, Augment::default());
            let loader = Loader::new(
                data,
                vec![0, 1, 2, 3],
                t,
                from(0, 0, 0),
                LoaderOptions { low_priority, ..options(2, 2) },
            );
            assert_eq!(loader.count(), 2);
            assert_eq!(*probe.seen.lock().unwrap(), vec![expected; 4], "low_priority = {low_priority}");
        }
        // SAFETY: as above.
        let after = unsafe { libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t) };
        assert_eq!(after, before, "the caller's own priority is untouched");
    }
}
