//! IDX import: reads MNIST-style IDX files (such as Debian's `dataset-fashion-mnist`, installed
//! under `/usr/share/datasets/fashion-mnist/`) and writes them out as a class-per-folder PNG tree
//! that the folder loader and torchvision's `ImageFolder` read.
//!
//! This module owns IDX parsing and validation (magic numbers, sizes, label ranges), the
//! decompression of `.gz` files, and the writing of one split (`OUT/<split>/<class>/…`), which
//! [`crate::util::atomic_dir`] publishes atomically. The crate has no gzip dependency, so `.gz` files
//! are decompressed by running the system's `gzip -dc`, which every Linux image we ship on has.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use image::codecs::png::PngEncoder;
use image::{ExtendedColorType, ImageEncoder};

use crate::util::atomic_dir::{self, AtomicDirError};
use crate::util::io_error::IoError;

use super::pool::{self, Stopped};

/// Fashion-MNIST's ten classes as folder names; the numeric prefix keeps alphabetical order
/// equal to label order.
pub const FASHION_MNIST_CLASSES: [&str; 10] = [
    "0-tshirt-top",
    "1-trouser",
    "2-pullover",
    "3-dress",
    "4-coat",
    "5-sandal",
    "6-shirt",
    "7-sneaker",
    "8-bag",
    "9-ankle-boot",
];

/// IDX magic of an unsigned-byte 3-dimensional array: images `[n, rows, cols]`.
const IMAGES_MAGIC: u32 = 0x0000_0803;
/// IDX magic of an unsigned-byte 1-dimensional array: labels `[n]`.
const LABELS_MAGIC: u32 = 0x0000_0801;
const IMAGES_HEADER: usize = 16;
const LABELS_HEADER: usize = 8;
/// Labels when no class names are given are the digits 0–9, as in MNIST and Fashion-MNIST.
const DEFAULT_CLASSES: usize = 10;

/// Grayscale images from an IDX file, row-major, `count` × `rows` × `cols` bytes.
#[derive(Debug, Clone, PartialEq)]
pub struct IdxImages {
    pub rows: usize,
    pub cols: usize,
    pub pixels: Vec<u8>,
    pub count: usize,
}

impl IdxImages {
    /// The pixels of image `i`, or `None` past the end.
    pub fn image(&self, i: usize) -> Option<&[u8]> {
        let len = self.rows * self.cols;
        self.pixels.get(i * len..(i + 1) * len)
    }
}

/// Why IDX data could not be read or imported.
#[derive(Debug, thiserror::Error)]
pub enum IdxError {
    /// A filesystem operation failed.
    #[error(transparent)]
    Io(#[from] IoError),
    /// `gzip` could not be started at all.
    #[error("{}: cannot run `gzip -dc` to decompress it (is gzip installed?)", path.display())]
    GzipSpawn {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// `gzip -dc` ran and failed, e.g. on a corrupt or non-gzip file.
    #[error("{}: `gzip -dc` failed ({status}): {stderr}", path.display())]
    Gzip { path: PathBuf, status: String, stderr: String },
    /// The file is not a well-formed IDX file of the expected kind.
    #[error("{}: {problem}", path.display())]
    Format { path: PathBuf, problem: String },
    /// Images and labels disagree on how many items there are.
    #[error(
        "{} holds {images} images but {} holds {labels} labels",
        images_path.display(),
        labels_path.display()
    )]
    CountMismatch { images_path: PathBuf, images: usize, labels_path: PathBuf, labels: usize },
    /// A label has no class to go to.
    #[error(
        "{}: label {label} of item {index} is out of range for {classes} classes",
        path.display()
    )]
    LabelOutOfRange { path: PathBuf, index: usize, label: u8, classes: usize },
    /// The class names cannot serve as folder names.
    #[error("invalid class names: {0}")]
    ClassNames(String),
    /// The split name cannot serve as a folder name.
    #[error("invalid split name {0:?}: it must be one plain path component such as \"train\"")]
    Split(String),
    /// Staging or publishing the output directory failed (it exists, or a rename failed).
    #[error(transparent)]
    Publish(#[from] AtomicDirError),
    /// The PNG encoder rejected an image.
    #[error("{}: cannot encode PNG", path.display())]
    Encode {
        path: PathBuf,
        #[source]
        source: image::ImageError,
    },
    /// A worker thread could not be started.
    #[error("cannot start a PNG-writing thread")]
    Thread(#[source] io::Error),
    /// A worker thread panicked; that is a bug in this module, not a problem with the input.
    #[error("a PNG-writing thread panicked")]
    WorkerPanicked,
}

/// Reads an IDX image file (magic 0x00000803, unsigned bytes `[n, rows, cols]`), gzipped when
/// its name ends in `.gz`.
pub fn read_images(path: &Path) -> Result<IdxImages, IdxError> {
    let data = read_maybe_gzip(path)?;
    let format = |problem: String| IdxError::Format { path: path.to_path_buf(), problem };
    // The magic first: a wrong kind of file is the likelier mistake than a short one.
    if data.len() >= 4 {
        check_magic(path, &data, IMAGES_MAGIC, "images")?;
    }
    if data.len() < IMAGES_HEADER {
        return Err(format(format!(
            "only {} bytes; an IDX image file starts with a {IMAGES_HEADER}-byte header",
            data.len()
        )));
    }
    let count = be_u32(&data, 4) as usize;
    let rows = be_u32(&data, 8) as usize;
    let cols = be_u32(&data, 12) as usize;
    if rows == 0 || cols == 0 {
        return Err(format(format!("image size {rows}x{cols} has no pixels")));
    }
    let needed = count
        .checked_mul(rows)
        .and_then(|n| n.checked_mul(cols))
        .ok_or_else(|| format(format!("{count} images of {rows}x{cols} is too large")))?;
    let have = data.len() - IMAGES_HEADER;
    if have < needed {
        return Err(format(format!(
            "truncated: the header announces {count} images of {rows}x{cols} \
             ({needed} bytes) but only {have} bytes follow it"
        )));
    }
    if have > needed {
        return Err(format(format!(
            "{} unexpected bytes after {count} images of {rows}x{cols}",
            have - needed
        )));
    }
    let mut pixels = data;
    pixels.drain(..IMAGES_HEADER);
    Ok(IdxImages { rows, cols, pixels, count })
}

/// Reads an IDX label file (magic 0x00000801, unsigned bytes `[n]`), gzipped when its name ends
/// in `.gz`.
pub fn read_labels(path: &Path) -> Result<Vec<u8>, IdxError> {
    let data = read_maybe_gzip(path)?;
    let format = |problem: String| IdxError::Format { path: path.to_path_buf(), problem };
    // The magic first: a wrong kind of file is the likelier mistake than a short one.
    if data.len() >= 4 {
        check_magic(path, &data, LABELS_MAGIC, "labels")?;
    }
    if data.len() < LABELS_HEADER {
        return Err(format(format!(
            "only {} bytes; an IDX label file starts with an {LABELS_HEADER}-byte header",
            data.len()
        )));
    }
    let count = be_u32(&data, 4) as usize;
    let have = data.len() - LABELS_HEADER;
    if have < count {
        return Err(format(format!(
            "truncated: the header announces {count} labels but only {have} bytes follow it"
        )));
    }
    if have > count {
        return Err(format(format!("{} unexpected bytes after {count} labels", have - count)));
    }
    let mut labels = data;
    labels.drain(..LABELS_HEADER);
    Ok(labels)
}

/// Imports IDX `images` and `labels` as `out/<split>/<class>/<NNNNN>.png` (grayscale PNG) and
/// returns how many images it wrote. Classes are named by `class_names` (which must sort in
/// label order), or `0` … `9` when `None`; `limit` keeps only the first N items, for small
/// subsets.
///
/// `NNNNN` is the item's index in the IDX file, so a file can be traced back to its source.
/// With `class_names` of `None` there are ten classes named `0` … `9`. Every class gets a folder,
/// even one that `limit` leaves empty, so that folder order and label order always agree.
/// The split is written into a temporary directory inside `out` and renamed to `out/<split>` at
/// the end (inside `out`, so the rename never crosses a filesystem boundary); an existing empty
/// `out/<split>` is replaced.
pub fn import(
    images: &Path,
    labels: &Path,
    out: &Path,
    split: &str,
    limit: Option<usize>,
    class_names: Option<&[&str]>,
) -> Result<usize, IdxError> {
    check_split(split)?;
    let names: Vec<String> = match class_names {
        Some(names) => {
            check_class_names(names)?;
            names.iter().map(|n| (*n).to_owned()).collect()
        }
        None => (0..DEFAULT_CLASSES).map(|label| format!("{label}")).collect(),
    };
    let dest = out.join(split);
    // Fail on an occupied destination before spending time on decompression.
    atomic_dir::ensure_free(&dest)?;

    let imgs = read_images(images)?;
    let labs = read_labels(labels)?;
    if imgs.count != labs.len() {
        return Err(IdxError::CountMismatch {
            images_path: images.to_path_buf(),
            images: imgs.count,
            labels_path: labels.to_path_buf(),
            labels: labs.len(),
        });
    }
    // Every label is checked, not just the kept ones: a bad label anywhere means the files do
    // not match the class list, which is worth knowing before training on a subset.
    if let Some((index, &label)) = labs.iter().enumerate().find(|(_, &l)| usize::from(l) >= names.len()) {
        return Err(IdxError::LabelOutOfRange {
            path: labels.to_path_buf(),
            index,
            label,
            classes: names.len(),
        });
    }
    let n = limit.map_or(imgs.count, |l| l.min(imgs.count));

    // `dest` is `out/<split>`, so the staging directory lives in `out` itself.
    let tmp = atomic_dir::staging_dir(&dest, ".idx-")?;
    for name in &names {
        let dir = tmp.path().join(name);
        fs::create_dir(&dir).map_err(IoError::at(&dir, "create directory"))?;
    }
    write_pngs(tmp.path(), &imgs, &labs[..n], &names)?;
    atomic_dir::publish(tmp, &dest)?;
    tracing::info!(
        images = %images.display(),
        out = %dest.display(),
        written = n,
        "imported IDX split"
    );
    Ok(n)
}

fn be_u32(data: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([data[at], data[at + 1], data[at + 2], data[at + 3]])
}

fn check_magic(path: &Path, data: &[u8], expected: u32, what: &str) -> Result<(), IdxError> {
    let found = be_u32(data, 0);
    if found == expected {
        return Ok(());
    }
    let hint = match found {
        IMAGES_MAGIC => " (an IDX image file)",
        LABELS_MAGIC => " (an IDX label file)",
        // 0x1f8b is gzip's magic: a compressed file whose name does not end in .gz.
        m if m >> 16 == 0x1f8b => " (gzip data; name the file *.gz)",
        _ => "",
    };
    Err(IdxError::Format {
        path: path.to_path_buf(),
        problem: format!("expected magic {expected:#010x} (IDX {what}), found {found:#010x}{hint}"),
    })
}

/// The file's bytes, decompressed by `gzip -dc` when the name ends in `.gz`.
fn read_maybe_gzip(path: &Path) -> Result<Vec<u8>, IdxError> {
    let gz = path.file_name().is_some_and(|n| n.to_string_lossy().ends_with(".gz"));
    if !gz {
        return Ok(fs::read(path).map_err(IoError::at(path, "read"))?);
    }
    // gzip's own message for a missing file is fine, but checking first gives the usual
    // io::ErrorKind to callers that match on it.
    fs::metadata(path).map_err(IoError::at(path, "read"))?;
    let output = Command::new("gzip")
        .arg("-dc")
        .arg("--")
        .arg(path)
        .stdin(Stdio::null())
        .output()
        .map_err(|source| IdxError::GzipSpawn { path: path.to_path_buf(), source })?;
    if !output.status.success() {
        return Err(IdxError::Gzip {
            path: path.to_path_buf(),
            status: output.status.to_string(),
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        });
    }
    Ok(output.stdout)
}

/// One plain path component, so that `out.join(split)` stays directly inside `out`.
fn check_split(split: &str) -> Result<(), IdxError> {
    if is_plain_component(split) {
        Ok(())
    } else {
        Err(IdxError::Split(split.to_owned()))
    }
}

fn is_plain_component(name: &str) -> bool {
    !name.is_empty()
        && name != "."
        && name != ".."
        && !name.contains(['/', '\\', '\0'])
        // A leading dot would hide the folder from ImageFolder-style listings.
        && !name.starts_with('.')
}

fn check_class_names(names: &[&str]) -> Result<(), IdxError> {
    if names.is_empty() {
        return Err(IdxError::ClassNames("the list is empty".to_owned()));
    }
    if names.len() > 256 {
        return Err(IdxError::ClassNames(format!("{} names, but u8 labels allow at most 256", names.len())));
    }
    if let Some(bad) = names.iter().find(|n| !is_plain_component(n)) {
        return Err(IdxError::ClassNames(format!("{bad:?} is not a plain folder name")));
    }
    // Folder order is label order only if the names sort the way the labels count.
    if let Some(w) = names.windows(2).find(|w| w[0] >= w[1]) {
        return Err(IdxError::ClassNames(format!(
            "{:?} does not sort before {:?}; folder names must be unique and in label order",
            w[0], w[1]
        )));
    }
    Ok(())
}

fn write_one(root: &Path, imgs: &IdxImages, index: usize, class: &str) -> Result<(), IdxError> {
    let path = root.join(class).join(format!("{index:05}.png"));
    let pixels = imgs.image(index).ok_or_else(|| IdxError::Format {
        path: path.clone(),
        problem: format!("image {index} is past the end of the data"),
    })?;
    let (w, h) = (
        u32::try_from(imgs.cols).map_err(|_| too_big(&path, imgs))?,
        u32::try_from(imgs.rows).map_err(|_| too_big(&path, imgs))?,
    );
    let mut bytes = Vec::with_capacity(pixels.len() + 128);
    PngEncoder::new(&mut bytes)
        .write_image(pixels, w, h, ExtendedColorType::L8)
        .map_err(|source| IdxError::Encode { path: path.clone(), source })?;
    Ok(fs::write(&path, &bytes).map_err(IoError::at(&path, "write"))?)
}

fn too_big(path: &Path, imgs: &IdxImages) -> IdxError {
    IdxError::Format {
        path: path.to_path_buf(),
        problem: format!("image size {}x{} is too large for PNG", imgs.rows, imgs.cols),
    }
}

/// Writes item i of `labels` on a few threads; each file depends only on its own item, so the
/// result does not depend on the threading.
fn write_pngs(root: &Path, imgs: &IdxImages, labels: &[u8], names: &[String]) -> Result<(), IdxError> {
    let written = pool::for_each("idx-png", labels, |index, &label| {
        let class = names
            .get(usize::from(label))
            .ok_or_else(|| IdxError::ClassNames(format!("no class for label {label}")))?;
        write_one(root, imgs, index, class)
    });
    written.map_err(|stopped| match stopped {
        Stopped::Failed(err) => err,
        Stopped::Spawn(err) => IdxError::Thread(err),
        Stopped::Panicked => IdxError::WorkerPanicked,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pixel(i: usize, j: usize) -> u8 {
        ((i * 37 + j * 11) % 256) as u8
    }

    fn images_bytes(n: usize, rows: usize, cols: usize) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&IMAGES_MAGIC.to_be_bytes());
        for d in [n, rows, cols] {
            v.extend_from_slice(&(d as u32).to_be_bytes());
        }
        for i in 0..n {
            for j in 0..rows * cols {
                v.push(pixel(i, j));
            }
        }
        v
    }

    fn labels_bytes(labels: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&LABELS_MAGIC.to_be_bytes());
        v.extend_from_slice(&(labels.len() as u32).to_be_bytes());
        v.extend_from_slice(labels);
        v
    }

    fn gzip(src: &Path) -> PathBuf {
        let dest = PathBuf::from(format!("{}.gz", src.display()));
        let file = fs::File::create(&dest).unwrap();
        let status = Command::new("gzip").arg("-c").arg(src).stdout(file).status().unwrap();
        assert!(status.success());
        dest
    }

    fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
        let p = dir.join(name);
        fs::write(&p, bytes).unwrap();
        p
    }

    #[test]
    fn reads_raw_and_gzipped_images_alike() {
        let dir = tempfile::tempdir().unwrap();
        let raw = write(dir.path(), "imgs-idx3-ubyte", &images_bytes(5, 3, 4));
        let gz = gzip(&raw);
        let a = read_images(&raw).unwrap();
        let b = read_images(&gz).unwrap();
        assert_eq!((a.count, a.rows, a.cols), (5, 3, 4));
        assert_eq!(a.pixels.len(), 60);
        assert_eq!(a.image(2).unwrap()[5], pixel(2, 5));
        assert!(a.image(5).is_none());
        assert_eq!(a, b);
    }

    #[test]
    fn import_round_trips_pixels_through_png() {
        let dir = tempfile::tempdir().unwrap();
        let labels = [2u8, 0, 1, 2, 2, 0];
        let imgs = write(dir.path(), "i-idx3-ubyte", &images_bytes(labels.len(), 5, 7));
        let labs = gzip(&write(dir.path(), "l-idx1-ubyte", &labels_bytes(&labels)));
        let out = dir.path().join("out");
        let names = ["a-zero", "b-one", "c-two"];
        let n = import(&imgs, &labs, &out, "train", None, Some(&names)).unwrap();
        assert_eq!(n, labels.len());
        let count = |c: &str| fs::read_dir(out.join("train").join(c)).unwrap().count();
        assert_eq!((count("a-zero"), count("b-one"), count("c-two")), (2, 1, 3));
        for (i, &label) in labels.iter().enumerate() {
            let path = out.join("train").join(names[usize::from(label)]).join(format!("{i:05}.png"));
            let img = image::open(&path).unwrap();
            assert_eq!(img.color(), image::ColorType::L8, "{}", path.display());
            let img = img.to_luma8();
            assert_eq!((img.width(), img.height()), (7, 5));
            let expected: Vec<u8> = (0..35).map(|j| pixel(i, j)).collect();
            assert_eq!(img.into_raw(), expected, "{}", path.display());
        }
        // Only the split itself is left in OUT, no temporary directory.
        assert_eq!(fs::read_dir(&out).unwrap().count(), 1);
    }

    #[test]
    fn limit_and_default_class_names() {
        let dir = tempfile::tempdir().unwrap();
        let imgs = write(dir.path(), "i", &images_bytes(4, 2, 2));
        let labs = write(dir.path(), "l", &labels_bytes(&[9, 3, 9, 0]));
        let out = dir.path().join("out");
        assert_eq!(import(&imgs, &labs, &out, "val", Some(2), None).unwrap(), 2);
        assert!(out.join("val/9/00000.png").is_file());
        assert!(out.join("val/3/00001.png").is_file());
        assert!(!out.join("val/9/00002.png").exists());
        // All ten class folders exist so label order survives.
        assert_eq!(fs::read_dir(out.join("val")).unwrap().count(), 10);
        assert_eq!(fs::read_dir(out.join("val/0")).unwrap().count(), 0);
    }

    #[test]
    fn wrong_magic_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let labs = gzip(&write(dir.path(), "x-labels-idx1-ubyte", &labels_bytes(&[1, 2])));
        let imgs = write(dir.path(), "x-images-idx3-ubyte", &images_bytes(2, 2, 2));
        let err = read_images(&labs).unwrap_err().to_string();
        assert!(err.contains("x-labels-idx1-ubyte.gz"), "{err}");
        assert!(err.contains("expected magic 0x00000803"), "{err}");
        assert!(err.contains("found 0x00000801"), "{err}");
        let err = read_labels(&imgs).unwrap_err().to_string();
        assert!(err.contains("x-images-idx3-ubyte"), "{err}");
        assert!(err.contains("expected magic 0x00000801"), "{err}");
    }

    #[test]
    fn truncated_and_oversized_files_are_rejected() {
        let dir = tempfile::tempdir().unwrap();
        let mut bytes = images_bytes(3, 4, 4);
        bytes.truncate(bytes.len() - 5);
        let short = write(dir.path(), "short-idx3-ubyte", &bytes);
        let err = read_images(&short).unwrap_err().to_string();
        assert!(err.contains("short-idx3-ubyte") && err.contains("truncated"), "{err}");

        let header_only = write(dir.path(), "tiny-idx1-ubyte", &[0, 0, 8]);
        let err = read_labels(&header_only).unwrap_err().to_string();
        assert!(err.contains("tiny-idx1-ubyte") && err.contains("only 3 bytes"), "{err}");

        let mut long = labels_bytes(&[1, 2, 3]);
        long.push(0);
        let long = write(dir.path(), "long-idx1-ubyte", &long);
        let err = read_labels(&long).unwrap_err().to_string();
        assert!(err.contains("long-idx1-ubyte") && err.contains("1 unexpected"), "{err}");
    }

    #[test]
    fn count_mismatch_and_bad_labels_name_the_files() {
        let dir = tempfile::tempdir().unwrap();
        let imgs = write(dir.path(), "four-idx3-ubyte", &images_bytes(4, 2, 2));
        let three = write(dir.path(), "three-idx1-ubyte", &labels_bytes(&[0, 1, 2]));
        let out = dir.path().join("out");
        let err = import(&imgs, &three, &out, "train", None, None).unwrap_err();
        assert!(matches!(err, IdxError::CountMismatch { .. }), "{err:?}");
        let msg = err.to_string();
        assert!(msg.contains("four-idx3-ubyte") && msg.contains("three-idx1-ubyte"), "{msg}");

        let bad = write(dir.path(), "bad-idx1-ubyte", &labels_bytes(&[0, 1, 5, 1]));
        let err = import(&imgs, &bad, &out, "train", None, Some(&["a", "b", "c"])).unwrap_err().to_string();
        assert!(err.contains("bad-idx1-ubyte") && err.contains("label 5 of item 2"), "{err}");
        // Failed imports leave nothing behind.
        assert!(!out.join("train").exists());
        assert_eq!(fs::read_dir(&out).map_or(0, |d| d.count()), 0);
    }

    #[test]
    fn corrupt_gzip_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let fake = write(dir.path(), "fake-idx1-ubyte.gz", b"not gzip at all");
        let err = read_labels(&fake).unwrap_err();
        assert!(matches!(err, IdxError::Gzip { .. }), "{err:?}");
        assert!(err.to_string().contains("fake-idx1-ubyte.gz"), "{err}");
        let missing = dir.path().join("missing-idx1-ubyte.gz");
        let err = read_labels(&missing).unwrap_err().to_string();
        assert!(err.contains("missing-idx1-ubyte.gz"), "{err}");
    }

    #[test]
    fn refuses_existing_split_and_bad_names() {
        let dir = tempfile::tempdir().unwrap();
        let imgs = write(dir.path(), "i", &images_bytes(2, 2, 2));
        let labs = write(dir.path(), "l", &labels_bytes(&[0, 1]));
        let out = dir.path().join("out");
        fs::create_dir_all(out.join("train")).unwrap();
        fs::write(out.join("train/keep"), b"x").unwrap();
        let err = import(&imgs, &labs, &out, "train", None, None).unwrap_err();
        assert!(matches!(err, IdxError::Publish(AtomicDirError::OutputExists { .. })), "{err:?}");
        assert!(err.to_string().contains(&out.join("train").display().to_string()));
        // Another split next to it is fine, and an empty directory is replaced.
        fs::create_dir_all(out.join("val")).unwrap();
        assert_eq!(import(&imgs, &labs, &out, "val", None, None).unwrap(), 2);

        for split in ["", "..", "a/b", ".hidden"] {
            let err = import(&imgs, &labs, &out, split, None, None).unwrap_err();
            assert!(matches!(err, IdxError::Split(_)), "{split:?}: {err:?}");
        }
        let err = import(&imgs, &labs, &out, "x", None, Some(&["b", "a"])).unwrap_err();
        assert!(matches!(err, IdxError::ClassNames(_)), "{err:?}");
        let err = import(&imgs, &labs, &out, "x", None, Some(&["a", "../b"])).unwrap_err();
        assert!(matches!(err, IdxError::ClassNames(_)), "{err:?}");
    }

    #[test]
    fn fashion_mnist_class_names_are_valid_and_ordered() {
        check_class_names(&FASHION_MNIST_CLASSES).unwrap();
    }
}
