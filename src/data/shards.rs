//! WebDataset shards: the form rtrain reads fast, stages to node-local disk and verifies.
//!
//! A shard set (written by `rtrain data prepare`, `crate::ingest::shard_writer`) is
//! `OUT/<split>-NNNNNN.tar` shards of `<key>.jpg|png`, `<key>.cls` (the label as decimal text)
//! and `<key>.json` (the sample's provenance, [`SampleSource`]: its source path, sha256, size,
//! Exif orientation, GPS and capture time, which `--resize` would otherwise lose), the layout
//! Python's `webdataset` reads, plus `OUT/shards.json` ([`ShardManifest`]): classes, samples
//! per split and class, and each shard's size and sha256. Keys are `<split>-<index>` with the
//! index of the sample in the source tree's order, so [`ShardSet`] restores that order and a
//! shard set reads exactly like the tree it came from.
//!
//! [`ShardSet`] indexes a split from the tar headers — (shard, offset, length) per sample — and
//! reads samples from memory-mapped shards: random access, so an epoch's order is a seeded
//! permutation of the whole set and each rank reads only its own samples.
//! [`verify`] re-hashes shards against the manifest; [`stage`] copies them to another directory
//! (a node's local disk), skipping those already there with the right hash.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::dataset::DataError;
use super::dataset::Dataset;
use super::photo::{self, PhotoTags};

/// The shard manifest's file name, in a shard directory.
pub const SHARDS_JSON: &str = "shards.json";
/// Its name in shard directories written by rtrain 0.1.0, which a run directory's manifest
/// shares; still read when its `format` says it is a shard manifest.
const LEGACY_MANIFEST_JSON: &str = "manifest.json";
/// The manifest's `format` value.
pub const FORMAT: &str = "webdataset";

/// `OUT/shards.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShardManifest {
    pub format: String,
    pub version: u32,
    /// Class names; a `.cls` value indexes this.
    pub classes: Vec<String>,
    /// The short side images were re-encoded to, or None when stored as they came.
    pub resize: Option<u32>,
    pub splits: BTreeMap<String, SplitShards>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SplitShards {
    pub samples: usize,
    /// Samples per class, in class order.
    pub per_class: Vec<usize>,
    pub shards: Vec<ShardInfo>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShardInfo {
    /// File name in the shard directory.
    pub name: String,
    pub bytes: u64,
    pub sha256: String,
    pub samples: usize,
}

impl ShardManifest {
    /// Reads the shard manifest of `dir` (`shards.json`, or a 0.1.0 set's `manifest.json`).
    pub fn read(dir: &Path) -> Result<ShardManifest, ShardError> {
        let path = manifest_path(dir);
        let text = fs::read(&path).map_err(|source| ShardError::Io { path: path.clone(), source })?;
        let manifest: ShardManifest = serde_json::from_slice(&text)
            .map_err(|source| ShardError::Manifest { path: path.clone(), source })?;
        if manifest.format != FORMAT {
            return Err(ShardError::NotShards { path, format: manifest.format });
        }
        // Shard names are joined to directories we read and write: a name that is not one plain
        // file name ("../x", "/etc/x") would reach outside them.
        for shard in manifest.all_shards() {
            let mut components = Path::new(&shard.name).components();
            let plain = matches!(components.next(), Some(std::path::Component::Normal(_)))
                && components.next().is_none();
            if !plain {
                return Err(ShardError::BadName { path, name: shard.name.clone() });
            }
        }
        Ok(manifest)
    }

    /// Every shard of every split, in split then shard order.
    pub fn all_shards(&self) -> impl Iterator<Item = &ShardInfo> {
        self.splits.values().flat_map(|split| split.shards.iter())
    }
}

/// Where `dir`'s shard manifest is: `shards.json`, else a legacy `manifest.json` whose
/// `format` is a shard set's (a run directory's manifest is not), else `shards.json` (absent).
fn manifest_path(dir: &Path) -> PathBuf {
    let current = dir.join(SHARDS_JSON);
    let legacy = dir.join(LEGACY_MANIFEST_JSON);
    if current.is_file() || !legacy.is_file() {
        return current;
    }
    #[derive(Deserialize)]
    struct Format {
        format: Option<String>,
    }
    let is_shard_manifest = fs::read(&legacy)
        .ok()
        .and_then(|text| serde_json::from_slice::<Format>(&text).ok())
        .is_some_and(|manifest| manifest.format.as_deref() == Some(FORMAT));
    if is_shard_manifest {
        legacy
    } else {
        current
    }
}

/// Whether `dir` holds a shard set (a shard manifest, of this version or 0.1.0).
pub fn is_shard_dir(dir: &Path) -> bool {
    manifest_path(dir).is_file()
}

#[derive(Debug, thiserror::Error)]
pub enum ShardError {
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: io::Error },
    #[error("{}: not a valid shard manifest: {source}", path.display())]
    Manifest { path: PathBuf, source: serde_json::Error },
    #[error("{}: format {format:?} is not {FORMAT:?}", path.display())]
    NotShards { path: PathBuf, format: String },
    #[error("{}: the manifest has no split {split:?} (it has {available:?})", dir.display())]
    NoSplit { dir: PathBuf, split: String, available: Vec<String> },
    #[error("{}: {problem}", shard.display())]
    BadShard { shard: PathBuf, problem: String },
    #[error("{}: shard name {name:?} is not a plain file name", path.display())]
    BadName { path: PathBuf, name: String },
    #[error("copying {} to {}: sha256 {actual}, but the manifest says {expected}", src.display(), dest.display())]
    CopyMismatch { src: PathBuf, dest: PathBuf, expected: String, actual: String },
    #[error("{}: sha256 {found}, but it was recorded as {recorded} when the data were prepared: the shard changed since (run rtrain data verify; prepare or stage the data again)", shard.display())]
    Changed { shard: PathBuf, found: String, recorded: String },
    #[error(transparent)]
    Data(#[from] DataError),
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> ShardError + '_ {
    move |source| ShardError::Io { path: path.to_path_buf(), source }
}

/// `<key>.json` beside each sample: where it came from, as the source file says (not the
/// re-encoded copy), so that a prediction on shards names and maps the original photo.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SampleSource {
    /// The source file's path relative to `data prepare`'s SRC (`val/C2/IMG_0042.jpg`; a
    /// name that is not UTF-8 is written lossily).
    pub path: String,
    /// sha256 of the source file.
    pub sha256: String,
    /// The source image's stored size.
    pub width: Option<u32>,
    pub height: Option<u32>,
    #[serde(flatten)]
    pub tags: PhotoTags,
}

impl SampleSource {
    /// The provenance of the source file `bytes`, found at `relative` under SRC.
    pub fn of(relative: &Path, bytes: &[u8]) -> SampleSource {
        let size = photo::stored_size(bytes);
        SampleSource {
            path: relative.to_string_lossy().into_owned(),
            sha256: hex::encode(Sha256::digest(bytes)),
            width: size.map(|s| s.0),
            height: size.map(|s| s.1),
            tags: PhotoTags::of(bytes),
        }
    }
}

/// sha256 (hex) and length of a file, read in 1 MiB blocks.
pub fn hash_file(path: &Path) -> Result<(String, u64), ShardError> {
    let mut file = File::open(path).map_err(io_err(path))?;
    copy_hashing(&mut file, &mut io::sink()).map_err(io_err(path))
}

/// Copies `from` into `to` while hashing; returns the sha256 (hex) and the byte count.
fn copy_hashing(from: &mut impl Read, to: &mut impl Write) -> io::Result<(String, u64)> {
    let mut hasher = Sha256::new();
    let mut buffer = vec![0u8; 1 << 20];
    let mut total = 0u64;
    loop {
        let n = from.read(&mut buffer)?;
        if n == 0 {
            break;
        }
        hasher.update(&buffer[..n]);
        to.write_all(&buffer[..n])?;
        total += n as u64;
    }
    Ok((hex::encode(hasher.finalize()), total))
}

/// Refuses a file of `data` whose sha256 differs from the one recorded when the data were made
/// (a shard's, in the shard manifest), as a training run does when it hashes its data for its
/// manifest: a label changed inside a shard keeps the shard's size, which is all that opening
/// it checks. Files with no recorded hash (an image folder's) are not read.
pub fn check_recorded_sha256(data: &dyn Dataset) -> Result<(), ShardError> {
    for file in data.files() {
        let Some(recorded) = data.recorded_sha256(&file) else { continue };
        let (found, _) = hash_file(&file)?;
        if found != recorded {
            return Err(ShardError::Changed { recorded: recorded.to_string(), shard: file, found });
        }
    }
    Ok(())
}

/// What [`verify`] found.
#[derive(Debug, Clone, PartialEq)]
pub struct VerifyReport {
    pub shards: usize,
    pub bytes: u64,
    /// Each bad shard's name and what is wrong with it.
    pub bad: Vec<(String, String)>,
}

/// Re-hashes every shard of `dir` against its manifest; names every shard that is missing,
/// has the wrong size or the wrong sha256.
pub fn verify(dir: &Path) -> Result<VerifyReport, ShardError> {
    let manifest = ShardManifest::read(dir)?;
    let mut report = VerifyReport { shards: 0, bytes: 0, bad: Vec::new() };
    for shard in manifest.all_shards() {
        report.shards += 1;
        let path = dir.join(&shard.name);
        match hash_file(&path) {
            Err(ShardError::Io { source, .. }) => {
                report.bad.push((shard.name.clone(), format!("cannot read: {source}")))
            }
            Err(other) => return Err(other),
            Ok((sha256, bytes)) => {
                report.bytes += bytes;
                if bytes != shard.bytes {
                    report.bad.push((
                        shard.name.clone(),
                        format!("{bytes} bytes, the manifest says {}", shard.bytes),
                    ));
                } else if sha256 != shard.sha256 {
                    report.bad.push((
                        shard.name.clone(),
                        format!("sha256 {sha256}, the manifest says {}", shard.sha256),
                    ));
                }
            }
        }
    }
    Ok(report)
}

/// What [`stage`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StageReport {
    pub copied: usize,
    pub skipped: usize,
    pub bytes_copied: u64,
}

/// A copy of a shard set to node-local disk before training (`data.stage_dir`).
#[derive(Debug, Clone, PartialEq)]
pub struct Staging {
    /// The shard set as configured (`data.root`), which the run records.
    pub from: PathBuf,
    /// Its node-local copy ([`staged_root`]), which training reads.
    pub to: PathBuf,
}

/// Where `data.stage_dir` puts the shard set at `root`: a folder named after it plus a short hash
/// of its absolute path, so two data sets with the same folder name never share a copy.
pub fn staged_root(root: &Path, stage_dir: &Path) -> PathBuf {
    let absolute = fs::canonicalize(root).unwrap_or_else(|_| root.to_path_buf());
    let name = absolute.file_name().map_or_else(|| "data".into(), |n| n.to_string_lossy().into_owned());
    let digest = hex::encode(Sha256::digest(absolute.as_os_str().as_encoded_bytes()));
    stage_dir.join(format!("{name}-{}", &digest[..8]))
}

/// Copies the shard set at `src` to `dest` (created if needed): each shard not already there
/// with the manifest's size and sha256 is copied to a temporary name while hashed, checked,
/// synced and renamed into place; the manifest is written last, so `dest` is a usable shard set
/// only once every shard is. A shard whose copy does not match the manifest is an error naming
/// it (the source is damaged) and leaves nothing under its name.
pub fn stage(src: &Path, dest: &Path) -> Result<StageReport, ShardError> {
    let manifest = ShardManifest::read(src)?;
    fs::create_dir_all(dest).map_err(io_err(dest))?;
    // An earlier staging's manifest must not vouch for a half-replaced set if this one fails.
    for name in [SHARDS_JSON, LEGACY_MANIFEST_JSON] {
        match fs::remove_file(dest.join(name)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(io_err(&dest.join(name))(e)),
            _ => {}
        }
    }
    let mut report = StageReport::default();
    for shard in manifest.all_shards() {
        let target = dest.join(&shard.name);
        let present = fs::metadata(&target).is_ok_and(|m| m.len() == shard.bytes)
            && hash_file(&target).is_ok_and(|(sha256, _)| sha256 == shard.sha256);
        if present {
            report.skipped += 1;
            continue;
        }
        let source_path = src.join(&shard.name);
        let mut from = File::open(&source_path).map_err(io_err(&source_path))?;
        let mut partial = tempfile::Builder::new()
            .prefix(&format!(".{}.", shard.name))
            .suffix(".partial")
            .tempfile_in(dest)
            .map_err(io_err(dest))?;
        // Read and write failures are told apart only by the error; name both ends.
        let (sha256, bytes) = copy_hashing(&mut from, partial.as_file_mut()).map_err(|e| {
            io_err(&source_path)(io::Error::new(e.kind(), format!("copying to {}: {e}", target.display())))
        })?;
        if sha256 != shard.sha256 {
            return Err(ShardError::CopyMismatch {
                src: source_path,
                dest: target,
                expected: shard.sha256.clone(),
                actual: sha256,
            });
        }
        partial.as_file().sync_all().map_err(io_err(&target))?;
        partial.persist(&target).map_err(|e| io_err(&target)(e.error))?;
        report.copied += 1;
        report.bytes_copied += bytes;
    }
    let text = serde_json::to_vec_pretty(&manifest).expect("the manifest serialises");
    crate::util::files::write_atomic(&dest.join(SHARDS_JSON), &text).map_err(|e| ShardError::Io {
        path: dest.join(SHARDS_JSON),
        source: io::Error::other(e.to_string()),
    })?;
    Ok(report)
}

/// Where one sample's image is: shard, byte offset and length inside it.
#[derive(Debug, Clone)]
struct SampleRef {
    key: String,
    shard: usize,
    offset: usize,
    len: usize,
    label: usize,
    /// Where its `<key>.json` ([`SampleSource`]) is in the shard, if it has one (shards of
    /// rtrain before 0.2 do not).
    source: Option<(usize, usize)>,
}

/// One split of a shard directory, indexed and memory-mapped.
pub struct ShardSet {
    root: PathBuf,
    classes: Vec<String>,
    shards: Vec<(PathBuf, Mmap)>,
    /// Each shard's sha256 as the manifest records it, in the order of `shards`.
    recorded_sha256: Vec<String>,
    samples: Vec<SampleRef>,
}

impl ShardSet {
    /// Maps the split's shards and indexes them from their tar headers. Samples are ordered by
    /// key, which restores the source tree's order.
    ///
    /// # Errors
    /// A missing split, an unreadable shard, a shard whose size differs from the manifest (a
    /// cheap check; `rtrain data verify` hashes), a member that is not a regular file, a
    /// sample without its image or label, a label out of range, or a sample count different
    /// from the manifest's — each naming the shard.
    pub fn open(root: &Path, split: &str) -> Result<ShardSet, ShardError> {
        let manifest = ShardManifest::read(root)?;
        let Some(info) = manifest.splits.get(split) else {
            return Err(ShardError::NoSplit {
                dir: root.to_path_buf(),
                split: split.to_string(),
                available: manifest.splits.keys().cloned().collect(),
            });
        };
        let mut shards = Vec::with_capacity(info.shards.len());
        let mut samples = Vec::with_capacity(info.samples);
        for (shard_index, shard) in info.shards.iter().enumerate() {
            let path = root.join(&shard.name);
            let bad = |problem: String| ShardError::BadShard { shard: path.clone(), problem };
            let file = File::open(&path).map_err(io_err(&path))?;
            let len = file.metadata().map_err(io_err(&path))?.len();
            if len != shard.bytes {
                return Err(bad(format!(
                    "{len} bytes, the manifest says {} (run rtrain data verify)",
                    shard.bytes
                )));
            }
            // SAFETY: the shard is opened read-only and rtrain never writes shards in place
            // (prepare and stage publish them by rename); a file truncated underneath the map by
            // another program would fault, which is the documented risk of mmap.
            let map = unsafe { Mmap::map(&file) }.map_err(io_err(&path))?;
            let mut images: BTreeMap<String, (usize, usize)> = BTreeMap::new();
            let mut labels: BTreeMap<String, usize> = BTreeMap::new();
            let mut sources: BTreeMap<String, (usize, usize)> = BTreeMap::new();
            let mut archive = tar::Archive::new(io::Cursor::new(&map[..]));
            for entry in archive.entries_with_seek().map_err(|e| bad(e.to_string()))? {
                let entry = entry.map_err(|e| bad(format!("reading the tar headers: {e}")))?;
                if entry.header().entry_type() != tar::EntryType::Regular {
                    continue;
                }
                let name = entry.path().map_err(|e| bad(e.to_string()))?.to_string_lossy().into_owned();
                let (dir, file_name) = name.rsplit_once('/').map_or(("", name.as_str()), |(d, f)| (d, f));
                let Some((stem, ext)) = file_name.split_once('.') else { continue };
                let key = if dir.is_empty() { stem.to_string() } else { format!("{dir}/{stem}") };
                let offset = usize::try_from(entry.raw_file_position()).unwrap_or(usize::MAX);
                let size = usize::try_from(entry.size()).unwrap_or(usize::MAX);
                let data = map
                    .get(offset..offset.saturating_add(size))
                    .ok_or_else(|| bad(format!("{name} runs past the end")))?;
                match ext.to_ascii_lowercase().as_str() {
                    "cls" => {
                        let text = std::str::from_utf8(data).unwrap_or("").trim();
                        let label: usize = text
                            .parse()
                            .map_err(|_| bad(format!("{name}: label {text:?} is not a number")))?;
                        if label >= manifest.classes.len() {
                            return Err(bad(format!(
                                "{name}: label {label} but there are {} classes",
                                manifest.classes.len()
                            )));
                        }
                        labels.insert(key, label);
                    }
                    "jpg" | "jpeg" | "png" => {
                        images.insert(key, (offset, size));
                    }
                    "json" => {
                        sources.insert(key, (offset, size));
                    }
                    _ => {}
                }
            }
            for (key, (offset, len)) in images {
                let label = labels
                    .remove(&key)
                    .ok_or_else(|| bad(format!("sample {key} has an image but no .cls label")))?;
                let source = sources.get(&key).copied();
                samples.push(SampleRef { key, shard: shard_index, offset, len, label, source });
            }
            if let Some(key) = labels.keys().next() {
                return Err(bad(format!("sample {key} has a .cls label but no image")));
            }
            shards.push((path, map));
        }
        if samples.len() != info.samples {
            return Err(ShardError::BadShard {
                shard: root.to_path_buf(),
                problem: format!(
                    "split {split} has {} samples in its shards, the manifest says {}",
                    samples.len(),
                    info.samples
                ),
            });
        }
        samples.sort_by(|a, b| a.key.cmp(&b.key));
        let recorded_sha256 = info.shards.iter().map(|shard| shard.sha256.clone()).collect();
        Ok(ShardSet { root: root.to_path_buf(), classes: manifest.classes, shards, recorded_sha256, samples })
    }

    /// Sample `index`'s key (`<split>-<number>`, the name its files share in the shard).
    pub fn key(&self, index: usize) -> Option<&str> {
        self.samples.get(index).map(|s| s.key.as_str())
    }

    /// Sample `index`'s provenance from its `<key>.json`; None when the shard has none or it
    /// cannot be read (a warning names the sample).
    pub fn source(&self, index: usize) -> Option<SampleSource> {
        let sample = self.samples.get(index)?;
        match self.read_source(sample)? {
            Ok(source) => Some(source),
            Err(error) => {
                let shard = self.shards[sample.shard].0.display();
                tracing::warn!("{shard}: {}.json is not a sample's source: {error}", sample.key);
                None
            }
        }
    }

    fn read_source(&self, sample: &SampleRef) -> Option<Result<SampleSource, serde_json::Error>> {
        let (offset, len) = sample.source?;
        Some(serde_json::from_slice(&self.shards[sample.shard].1[offset..offset + len]))
    }
}

impl Dataset for ShardSet {
    fn root(&self) -> &Path {
        &self.root
    }

    fn classes(&self) -> &[String] {
        &self.classes
    }

    fn len(&self) -> usize {
        self.samples.len()
    }

    fn label(&self, index: usize) -> Option<usize> {
        self.samples.get(index).map(|s| s.label)
    }

    fn encoded(&self, index: usize) -> Result<Cow<'_, [u8]>, DataError> {
        let sample = self.samples.get(index).ok_or_else(|| DataError::IndexOutOfRange {
            index,
            len: self.samples.len(),
            root: self.root.clone(),
        })?;
        Ok(Cow::Borrowed(&self.shards[sample.shard].1[sample.offset..sample.offset + sample.len]))
    }

    /// `shard.tar:key`, and the source file's path when the shard records it.
    fn describe(&self, index: usize) -> String {
        let Some(sample) = self.samples.get(index) else { return format!("#{index}") };
        let at = format!("{}:{}", self.shards[sample.shard].0.display(), sample.key);
        match self.read_source(sample) {
            Some(Ok(source)) => format!("{at} ({})", source.path),
            _ => at,
        }
    }

    fn files(&self) -> Vec<PathBuf> {
        self.shards.iter().map(|(path, _)| path.clone()).collect()
    }

    fn recorded_sha256(&self, file: &Path) -> Option<&str> {
        let index = self.shards.iter().position(|(path, _)| path == file)?;
        self.recorded_sha256.get(index).map(String::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::folder::ImageFolder;
    use crate::ingest::shard_writer::{prepare, PrepareError, PrepareOptions};
    use crate::util::atomic_dir::AtomicDirError;
    use image::RgbImage;

    /// SRC/{train,val}/{a,b,c}/: PNGs and JPEGs of different sizes and colours.
    fn make_tree(root: &Path, per_class: u32) {
        for split in ["train", "val"] {
            for (c, class) in ["a", "b", "c"].iter().enumerate() {
                let dir = root.join(split).join(class);
                fs::create_dir_all(&dir).unwrap();
                for i in 0..per_class {
                    let (w, h) = (40 + 7 * i, 30 + 3 * (c as u32));
                    let img = RgbImage::from_fn(w, h, |x, y| {
                        image::Rgb([(x * 5 + i) as u8, (y * 9) as u8, (c * 80) as u8])
                    });
                    let ext = if i % 2 == 0 { "png" } else { "jpg" };
                    img.save(dir.join(format!("{i:03}.{ext}"))).unwrap();
                }
            }
        }
    }

    fn small_shards() -> PrepareOptions {
        PrepareOptions { shard_bytes: 40 << 10, ..PrepareOptions::default() }
    }

    #[test]
    fn shards_read_back_exactly_as_the_tree_they_came_from() {
        let dir = tempfile::tempdir().unwrap();
        make_tree(&dir.path().join("src"), 12);
        let out = dir.path().join("shards");
        let manifest = prepare(&dir.path().join("src"), &out, &small_shards()).unwrap();
        assert_eq!(manifest.classes, ["a", "b", "c"]);
        let train = &manifest.splits["train"];
        assert_eq!((train.samples, train.per_class.clone()), (36, vec![12, 12, 12]));
        assert!(train.shards.len() >= 3, "40 KiB shards: {:?}", train.shards);
        for shard in &train.shards {
            assert!(shard.bytes <= 40 << 10, "{shard:?}");
            assert_eq!(fs::metadata(out.join(&shard.name)).unwrap().len(), shard.bytes);
        }
        for split in ["train", "val"] {
            let folder = ImageFolder::open(&dir.path().join("src").join(split)).unwrap();
            let shards = ShardSet::open(&out, split).unwrap();
            assert_eq!(Dataset::len(&shards), folder.len());
            for index in 0..folder.len() {
                assert_eq!(shards.label(index), Dataset::label(&folder, index), "{split} {index}");
                assert_eq!(shards.load(index).unwrap(), folder.load(index).unwrap(), "{split} {index}");
            }
        }
        // Shuffled across shards: the first shard does not hold just the first class.
        let first = ShardSet::open(&out, "train").unwrap();
        let in_first: Vec<usize> = first.samples.iter().filter(|s| s.shard == 0).map(|s| s.label).collect();
        assert!(in_first.iter().any(|&l| l != in_first[0]), "{in_first:?}");
        // Deterministic: the same input gives byte-identical shards.
        let again = prepare(&dir.path().join("src"), &dir.path().join("again"), &small_shards()).unwrap();
        assert_eq!(again.splits, manifest.splits);
    }

    #[test]
    fn verify_names_every_bad_shard() {
        let dir = tempfile::tempdir().unwrap();
        make_tree(&dir.path().join("src"), 8);
        let out = dir.path().join("shards");
        let manifest = prepare(&dir.path().join("src"), &out, &small_shards()).unwrap();
        let clean = verify(&out).unwrap();
        assert_eq!(clean.bad, []);
        assert_eq!(clean.shards, manifest.all_shards().count());
        let shards: Vec<&ShardInfo> = manifest.all_shards().collect();
        let flipped = out.join(&shards[1].name);
        let mut bytes = fs::read(&flipped).unwrap();
        bytes[700] ^= 1;
        fs::write(&flipped, bytes).unwrap();
        fs::remove_file(out.join(&shards[2].name)).unwrap();
        let report = verify(&out).unwrap();
        let names: Vec<&str> = report.bad.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, [shards[1].name.as_str(), shards[2].name.as_str()]);
        assert!(report.bad[0].1.contains("sha256"), "{:?}", report.bad);
        assert!(report.bad[1].1.contains("cannot read"), "{:?}", report.bad);
    }

    #[test]
    fn a_shard_set_of_0_1_0_is_still_read_and_a_run_manifest_is_no_shard_set() {
        let dir = tempfile::tempdir().unwrap();
        make_tree(&dir.path().join("src"), 4);
        let out = dir.path().join("shards");
        let manifest = prepare(&dir.path().join("src"), &out, &small_shards()).unwrap();
        assert!(out.join("shards.json").is_file() && !out.join("manifest.json").exists());
        // 0.1.0 wrote the same file as manifest.json.
        fs::rename(out.join("shards.json"), out.join("manifest.json")).unwrap();
        assert!(is_shard_dir(&out));
        assert_eq!(ShardManifest::read(&out).unwrap(), manifest);
        let samples = crate::data::open_split(&out, "train", &[]).unwrap().len();
        assert_eq!(samples, manifest.splits["train"].samples);
        // Staging it writes the current name and withdraws the old one.
        let local = dir.path().join("local");
        stage(&out, &local).unwrap();
        assert!(local.join("shards.json").is_file() && !local.join("manifest.json").exists());
        // A run directory's manifest.json is not a shard manifest.
        let run = dir.path().join("run");
        fs::create_dir_all(&run).unwrap();
        fs::write(run.join("manifest.json"), br#"{"rtrain_version": "0.1.0", "config_hash": "x"}"#).unwrap();
        assert!(!is_shard_dir(&run));
        assert!(ShardManifest::read(&run).is_err());
    }

    #[test]
    fn staging_copies_what_is_missing_or_wrong_and_refuses_a_damaged_source() {
        let dir = tempfile::tempdir().unwrap();
        make_tree(&dir.path().join("src"), 8);
        let out = dir.path().join("shards");
        let manifest = prepare(&dir.path().join("src"), &out, &small_shards()).unwrap();
        let total = manifest.all_shards().count();
        let local = dir.path().join("local/shards");
        let first = stage(&out, &local).unwrap();
        assert_eq!((first.copied, first.skipped), (total, 0));
        assert_eq!(verify(&local).unwrap().bad, []);
        let again = stage(&out, &local).unwrap();
        assert_eq!((again.copied, again.skipped), (0, total));
        // A damaged local copy is replaced; the rest is left alone.
        let name = manifest.splits["val"].shards[0].name.clone();
        fs::write(local.join(&name), b"junk").unwrap();
        let repaired = stage(&out, &local).unwrap();
        assert_eq!((repaired.copied, repaired.skipped), (1, total - 1));
        assert_eq!(verify(&local).unwrap().bad, []);
        // A damaged source: an error naming it, and nothing under the shard's name.
        let fresh = dir.path().join("fresh");
        let mut bytes = fs::read(out.join(&name)).unwrap();
        bytes[100] ^= 0xff;
        fs::write(out.join(&name), bytes).unwrap();
        let err = stage(&out, &fresh).unwrap_err();
        assert!(matches!(err, ShardError::CopyMismatch { .. }), "{err}");
        // Over an earlier complete copy whose shard must be copied again, a failed staging
        // withdraws that copy's manifest.
        fs::write(local.join(&name), b"junk").unwrap();
        assert!(stage(&out, &local).is_err());
        assert!(!local.join(SHARDS_JSON).exists());
        assert!(err.to_string().contains(&name), "{err}");
        assert!(!fresh.join(&name).exists());
        assert!(!fresh.join(SHARDS_JSON).exists(), "a partly staged set must not look complete");
        let leftovers: Vec<_> = fs::read_dir(&fresh)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .filter(|n| n.to_string_lossy().contains("partial"))
            .collect();
        assert_eq!(leftovers, Vec::<std::ffi::OsString>::new());
    }

    #[test]
    fn resize_turns_sideways_photos_upright_unless_told_not_to() {
        use crate::data::orientation::Orientation;
        use crate::ingest::photos::KINDS;
        use crate::ingest::synth::photo;
        use rand::SeedableRng;
        let dir = tempfile::tempdir().unwrap();
        let kind = KINDS.iter().find(|k| k.orientation == Orientation::TurnedRight).unwrap();
        for split in ["train", "val"] {
            let class = dir.path().join("src").join(split).join("a");
            fs::create_dir_all(&class).unwrap();
            let bytes = photo(0, kind, 0.05, &mut rand_chacha::ChaCha8Rng::seed_from_u64(1)).unwrap();
            fs::write(class.join("phone.jpg"), bytes).unwrap();
        }
        for (exif_orientation, portrait) in [(true, true), (false, false)] {
            let out = dir.path().join(format!("shards-{exif_orientation}"));
            let options = PrepareOptions { resize: Some(40), exif_orientation, ..PrepareOptions::default() };
            prepare(&dir.path().join("src"), &out, &options).unwrap();
            let image = ShardSet::open(&out, "train").unwrap().load(0).unwrap();
            assert_eq!(image.width().min(image.height()), 40);
            assert_eq!(image.height() > image.width(), portrait, "exif_orientation = {exif_orientation}");
        }
    }

    #[test]
    fn resize_stores_small_jpegs_and_output_must_be_free() {
        let dir = tempfile::tempdir().unwrap();
        make_tree(&dir.path().join("src"), 4);
        let out = dir.path().join("shards");
        let options = PrepareOptions { resize: Some(20), ..PrepareOptions::default() };
        prepare(&dir.path().join("src"), &out, &options).unwrap();
        let set = ShardSet::open(&out, "train").unwrap();
        for index in 0..Dataset::len(&set) {
            let image = set.load(index).unwrap();
            assert_eq!(image.width().min(image.height()), 20, "sample {index}");
        }
        let err = prepare(&dir.path().join("src"), &out, &options).unwrap_err();
        assert!(matches!(err, PrepareError::Output(AtomicDirError::OutputExists { .. })), "{err}");
        for bad in [
            PrepareOptions { resize: Some(0), ..PrepareOptions::default() },
            PrepareOptions { splits: vec!["train".into(), "val.small".into()], ..PrepareOptions::default() },
            PrepareOptions { splits: vec!["a/b".into()], ..PrepareOptions::default() },
        ] {
            let err = prepare(&dir.path().join("src"), &dir.path().join("other"), &bad).unwrap_err();
            assert!(matches!(err, PrepareError::Options(_)), "{err}");
        }
        assert!(!dir.path().join("other").exists());
    }

    #[test]
    fn manifest_shard_names_must_be_plain_file_names() {
        let dir = tempfile::tempdir().unwrap();
        make_tree(&dir.path().join("src"), 2);
        let out = dir.path().join("shards");
        prepare(&dir.path().join("src"), &out, &PrepareOptions::default()).unwrap();
        let text = fs::read_to_string(out.join(SHARDS_JSON)).unwrap();
        for evil in ["../../outside.tar", "/etc/passwd", "a/b.tar"] {
            fs::write(out.join(SHARDS_JSON), text.replace("train-000000.tar", evil)).unwrap();
            let err = ShardManifest::read(&out).unwrap_err();
            assert!(matches!(err, ShardError::BadName { .. }), "{evil}: {err}");
            assert!(stage(&out, &dir.path().join("dest")).is_err());
        }
    }

    #[test]
    fn staged_copies_of_same_named_sets_do_not_collide() {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir_all(dir.path().join("a/shards")).unwrap();
        fs::create_dir_all(dir.path().join("b/shards")).unwrap();
        let stage_dir = Path::new("/tmp/rtrain");
        let a = staged_root(&dir.path().join("a/shards"), stage_dir);
        let b = staged_root(&dir.path().join("b/shards"), stage_dir);
        assert_ne!(a, b);
        assert!(a.file_name().unwrap().to_string_lossy().starts_with("shards-"));
        assert_eq!(a, staged_root(&dir.path().join("a/../a/shards"), stage_dir), "same set, same copy");
    }
}
