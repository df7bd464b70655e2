//! Writing WebDataset shard sets (`rtrain data prepare`): an image tree
//! (`SRC/<split>/<class>/*.jpg|png`) becomes `OUT/<split>-NNNNNN.tar` shards and
//! `OUT/shards.json`, in the format [`crate::data::shards`] owns, reads, verifies and stages.
//! Samples are shuffled across shards (a streaming reader's shuffle buffer then sees every
//! class), and keys are `<split>-<index>` with the index of the sample in the source tree's
//! order, so the reader can restore that order and a shard set reads exactly like the tree it
//! came from. Each sample's `<key>.json` records its provenance ([`SampleSource`]), which
//! `--resize` would otherwise lose.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

use rand::seq::SliceRandom;
use rand::SeedableRng;

use crate::data::dataset::DataError;
use crate::data::decode::{decode_request, reduced_len, DecodeOptions, Request, MAX_IMAGE_FILE_BYTES};
use crate::data::encode::{encode_jpeg, Subsampling};
use crate::data::folder::ImageFolder;
use crate::data::shards::{
    hash_file, SampleSource, ShardError, ShardInfo, ShardManifest, SplitShards, FORMAT, SHARDS_JSON,
};
use crate::data::transforms::{largest_reduction, resize_rgb, Crop};
use crate::util::atomic_dir::{self, AtomicDirError};
use crate::util::files::read_regular;

/// Why a shard set could not be written.
#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    #[error("invalid prepare option: {0}")]
    Options(String),
    #[error("split {split:?} of {} has classes {found:?}, but earlier splits have {expected:?}", src.display())]
    ClassMismatch { src: PathBuf, split: String, found: Vec<String>, expected: Vec<String> },
    #[error("re-encoding {}: {source}", path.display())]
    Decode { path: PathBuf, source: crate::data::decode::DecodeError },
    #[error("re-encoding {}: {source}", path.display())]
    Encode { path: PathBuf, source: crate::data::encode::EncodeError },
    /// Reading the source tree, or writing and hashing a shard (`PATH: error`).
    #[error(transparent)]
    Shards(#[from] ShardError),
    #[error(transparent)]
    Data(#[from] DataError),
    #[error(transparent)]
    Output(#[from] AtomicDirError),
}

/// A shard set's I/O errors read as the reader's do: the path, then the error.
fn io_err(path: &Path) -> impl FnOnce(io::Error) -> PrepareError + '_ {
    move |source| ShardError::Io { path: path.to_path_buf(), source }.into()
}

/// How `rtrain data prepare` writes shards.
#[derive(Debug, Clone)]
pub struct PrepareOptions {
    /// The splits to convert (subdirectories of SRC), e.g. train and val.
    pub splits: Vec<String>,
    /// A shard is closed before it would grow past this many bytes (at least one sample each).
    pub shard_bytes: u64,
    /// Re-encode images as JPEG with this short side (never enlarging), so training decodes
    /// small images; None stores the files as they are.
    pub resize: Option<u32>,
    /// JPEG quality when re-encoding.
    pub quality: u8,
    /// Seeds the order of samples across shards.
    pub seed: u64,
    /// When re-encoding, turn photos upright by their Exif orientation first (the re-encoded
    /// file carries no tag); false keeps the pixels as stored.
    pub exif_orientation: bool,
}

impl Default for PrepareOptions {
    fn default() -> Self {
        PrepareOptions {
            splits: vec!["train".into(), "val".into()],
            shard_bytes: 256 << 20,
            resize: None,
            quality: 90,
            seed: 0,
            exif_orientation: true,
        }
    }
}

/// A sample's key: its split and its index in the source tree's order (no dots: WebDataset
/// splits a file name into key and extension at the first dot).
fn sample_key(split: &str, index: usize) -> String {
    format!("{split}-{index:09}")
}

/// One sample's stored bytes and extension: the source file's `bytes` themselves, or a JPEG
/// re-encoded to `resize`.
fn sample_bytes(
    path: &Path,
    bytes: Vec<u8>,
    options: &PrepareOptions,
) -> Result<(Vec<u8>, &'static str), PrepareError> {
    let Some(short) = options.resize else {
        // The stored extension follows the content, so a PNG named .jpg stays decodable by name.
        let ext = match image::guess_format(&bytes) {
            Ok(image::ImageFormat::Png) => "png",
            _ => "jpg",
        };
        return Ok((bytes, ext));
    };
    // Decoded and resampled as training decodes and resamples (DCT-scaled as far as the new
    // size allows, PIL's antialiased bilinear filter), so a prepared image is what training
    // would have made of the original at that size.
    let mut size = (0, 0);
    let mut target = (0, 0);
    // At the default pixel limit: preparing reads no training configuration.
    let decode = DecodeOptions { exif_orientation: options.exif_orientation, ..DecodeOptions::default() };
    let region = decode_request(&bytes, decode, |w, h| {
        size = (w, h);
        target = if w.min(h) > short {
            let scale = f64::from(short) / f64::from(w.min(h));
            (((f64::from(w) * scale).round() as u32).max(1), ((f64::from(h) * scale).round() as u32).max(1))
        } else {
            (w, h)
        };
        let ratio = (f64::from(w) / f64::from(target.0)).min(f64::from(h) / f64::from(target.1));
        let reduction = largest_reduction(ratio);
        let rect =
            Crop { top: 0, left: 0, width: reduced_len(w, reduction), height: reduced_len(h, reduction) };
        Some(Request { reduction, rect })
    })
    .map_err(|source| PrepareError::Decode { path: path.to_path_buf(), source })?;
    let resized = resize_rgb(&region.pixels, region.rect, size, region.reduction, target.0, target.1);
    let bytes = encode_jpeg(resized.as_raw(), target.0, target.1, options.quality, Subsampling::Quarter, &[])
        .map_err(|source| PrepareError::Encode { path: path.to_path_buf(), source })?;
    Ok((bytes, "jpg"))
}

/// Writes one tar member with fixed metadata (mode 0644, owner 0, mtime 0): shards of the same
/// input are byte-identical.
fn append(builder: &mut tar::Builder<BufWriter<File>>, name: &str, data: &[u8]) -> io::Result<()> {
    let mut header = tar::Header::new_ustar();
    header.set_size(data.len() as u64);
    header.set_mode(0o644);
    header.set_mtime(0);
    header.set_uid(0);
    header.set_gid(0);
    builder.append_data(&mut header, name, data)
}

/// Size of a tar member: a 512-byte header plus the data padded to 512.
fn member_bytes(len: usize) -> u64 {
    512 + (len as u64).div_ceil(512) * 512
}

/// Converts the image tree at `src` into shards and a manifest at `out`, atomically: `out` appears
/// complete or not at all. `out` must not exist (or be an empty directory).
pub fn prepare(src: &Path, out: &Path, options: &PrepareOptions) -> Result<ShardManifest, PrepareError> {
    if options.resize == Some(0) {
        return Err(PrepareError::Options("--resize must be at least 1".into()));
    }
    // A split name becomes part of shard names and sample keys, which WebDataset splits at the
    // first dot.
    if let Some(bad) = options.splits.iter().find(|s| s.is_empty() || s.contains(['.', '/', '\\'])) {
        return Err(PrepareError::Options(format!(
            "split name {bad:?} must be non-empty, without '.' or '/'"
        )));
    }
    atomic_dir::ensure_free(out)?;
    let staging = atomic_dir::staging_dir(out, ".shards-")?;
    let mut manifest = ShardManifest {
        format: FORMAT.into(),
        version: 1,
        classes: Vec::new(),
        resize: options.resize,
        splits: BTreeMap::new(),
    };
    for split in &options.splits {
        let folder = ImageFolder::open(&src.join(split))?;
        if manifest.classes.is_empty() {
            manifest.classes = folder.classes.clone();
        } else if manifest.classes != folder.classes {
            return Err(PrepareError::ClassMismatch {
                src: src.to_path_buf(),
                split: split.clone(),
                found: folder.classes.clone(),
                expected: manifest.classes.clone(),
            });
        }
        let mut order: Vec<usize> = (0..folder.samples.len()).collect();
        order.shuffle(&mut rand_chacha::ChaCha8Rng::seed_from_u64(options.seed));
        let mut per_class = vec![0usize; folder.classes.len()];
        let mut shards = Vec::new();
        let mut writer: Option<(tar::Builder<BufWriter<File>>, PathBuf, u64, usize)> = None;
        for index in order {
            let (path, label) = &folder.samples[index];
            per_class[*label] += 1;
            let original = read_regular(path, MAX_IMAGE_FILE_BYTES).map_err(io_err(path))?;
            let source = SampleSource::of(path.strip_prefix(src).unwrap_or(path), &original);
            let source = serde_json::to_vec(&source).expect("a sample's source serialises");
            let (bytes, ext) = sample_bytes(path, original, options)?;
            let label_text = label.to_string();
            let size =
                member_bytes(bytes.len()) + member_bytes(label_text.len()) + member_bytes(source.len());
            // Close the current shard when this sample would overfill it (tar's 1 KiB end marker
            // included), unless it is still empty.
            if let Some((_, _, written, samples)) = &writer {
                if *samples > 0 && written + size + 1024 > options.shard_bytes {
                    let (builder, shard_path, _, samples) = writer.take().expect("checked above");
                    shards.push(finish_shard(builder, &shard_path, samples)?);
                }
            }
            if writer.is_none() {
                let shard_path = staging.path().join(format!("{split}-{:06}.tar", shards.len()));
                let file = File::create(&shard_path).map_err(io_err(&shard_path))?;
                writer = Some((tar::Builder::new(BufWriter::new(file)), shard_path, 0, 0));
            }
            let (builder, shard_path, written, samples) = writer.as_mut().expect("just created");
            let key = sample_key(split, index);
            append(builder, &format!("{key}.{ext}"), &bytes).map_err(io_err(shard_path))?;
            append(builder, &format!("{key}.cls"), label_text.as_bytes()).map_err(io_err(shard_path))?;
            append(builder, &format!("{key}.json"), &source).map_err(io_err(shard_path))?;
            *written += size;
            *samples += 1;
        }
        if let Some((builder, shard_path, _, samples)) = writer.take() {
            shards.push(finish_shard(builder, &shard_path, samples)?);
        }
        manifest
            .splits
            .insert(split.clone(), SplitShards { samples: folder.samples.len(), per_class, shards });
    }
    let manifest_path = staging.path().join(SHARDS_JSON);
    let text = serde_json::to_vec_pretty(&manifest).expect("the manifest serialises");
    let mut file = File::create(&manifest_path).map_err(io_err(&manifest_path))?;
    file.write_all(&text).and_then(|()| file.sync_all()).map_err(io_err(&manifest_path))?;
    atomic_dir::publish(staging, out)?;
    Ok(manifest)
}

/// Ends a shard's tar stream, syncs it and describes it for the manifest.
fn finish_shard(
    builder: tar::Builder<BufWriter<File>>,
    path: &Path,
    samples: usize,
) -> Result<ShardInfo, PrepareError> {
    let file =
        builder.into_inner().map_err(io_err(path))?.into_inner().map_err(|e| io_err(path)(e.into_error()))?;
    file.sync_all().map_err(io_err(path))?;
    let (sha256, bytes) = hash_file(path)?;
    let name = path.file_name().expect("a shard path has a name").to_string_lossy().into_owned();
    Ok(ShardInfo { name, bytes, sha256, samples })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::shards::ShardSet;
    use image::RgbImage;
    use std::fs;

    #[test]
    fn a_sample_without_its_label_names_the_shard_and_key() {
        let dir = tempfile::tempdir().unwrap();
        let shard = dir.path().join("train-000000.tar");
        let mut builder = tar::Builder::new(BufWriter::new(File::create(&shard).unwrap()));
        let mut png = Vec::new();
        RgbImage::new(4, 4).write_to(&mut io::Cursor::new(&mut png), image::ImageFormat::Png).unwrap();
        append(&mut builder, "train-000000000.png", &png).unwrap();
        append(&mut builder, "train-000000000.cls", b"0").unwrap();
        append(&mut builder, "train-000000001.png", &png).unwrap();
        builder.into_inner().unwrap().flush().unwrap();
        let (sha256, bytes) = hash_file(&shard).unwrap();
        let manifest = ShardManifest {
            format: FORMAT.into(),
            version: 1,
            classes: vec!["x".into()],
            resize: None,
            splits: BTreeMap::from([(
                "train".to_string(),
                SplitShards {
                    samples: 2,
                    per_class: vec![2],
                    shards: vec![ShardInfo { name: "train-000000.tar".into(), bytes, sha256, samples: 2 }],
                },
            )]),
        };
        fs::write(dir.path().join(SHARDS_JSON), serde_json::to_vec(&manifest).unwrap()).unwrap();
        let err = ShardSet::open(dir.path(), "train").err().unwrap().to_string();
        assert!(err.contains("train-000000.tar") && err.contains("train-000000001"), "{err}");
        let err = ShardSet::open(dir.path(), "val").err().unwrap().to_string();
        assert!(err.contains("no split \"val\""), "{err}");
    }
}
