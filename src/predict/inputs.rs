//! What `rtrain predict --out` classifies: the INPUTs of its command line — image files,
//! directories searched recursively, shard sets, and the paths listed in `--from-list` files —
//! gathered into one list in a stable order (sorted by path, byte by byte), behind the
//! loader's [`Dataset`] trait.
//!
//! Inputs are told apart and sorted by their paths as the file system spells them; only their
//! names in the outputs are text, with each byte of a path that is not UTF-8 written as `\xHH`
//! ([`path_text`]), so two photos whose names differ only in such bytes stay two rows. A file
//! named again by another spelling (`./a.jpg`, its absolute path, a link to it; in a list or
//! on the command line) is one row, under the first spelling met; the others are named as left
//! out.
//!
//! A shard set's samples are named by the source photo's path that `data prepare` recorded
//! (`<key>.json`), so they are named, hashed and mapped as the photos they were made from.
//!
//! In a directory an image is recognised by its content (a JPEG's or PNG's first bytes), so a
//! camera's `IMG_0001.JPG`, a phone's extensionless export and `photo.jpeg` are all found;
//! a file with an image's extension whose content is not an image stays in the list, to be
//! reported as a bad image rather than silently left out. Symbolic links are followed, to
//! files and to folders alike; each folder is searched once (known by its canonical path), so
//! a link back up the tree is not a loop. Every file or folder met and left out is kept in
//! [`Inputs::ignored`] with why, for the log and the summary to name: a photo in a format
//! rtrain does not read (TIFF, WebP, BMP, GIF, HEIC...) is named with its format.

use std::borrow::Cow;
use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::data::dataset::{DataError, Dataset};
use crate::data::decode::MAX_IMAGE_FILE_BYTES;
use crate::data::shards::{self, SampleSource, ShardError, ShardSet};
use crate::util::files::{open_regular, path_text, read_regular};

#[derive(Debug, thiserror::Error)]
pub enum InputError {
    #[error("{}: no such file or directory (an INPUT of rtrain predict)", path.display())]
    Missing { path: PathBuf },
    #[error("reading {}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
    #[error(transparent)]
    Shards(#[from] ShardError),
    #[error("no images in {inputs}: nothing to classify")]
    Empty { inputs: String },
}

/// Where one input's bytes are.
enum Source {
    File(PathBuf),
    /// Sample `index` of shard set `set` (an index into [`Inputs::shard_sets`]).
    Shard {
        set: usize,
        index: usize,
    },
}

struct Input {
    /// What inputs are told apart and sorted by: the file's path as reached from its INPUT, or
    /// `<shard set>/<source path>` (`<shard set>/<split>/<key>`) for a shard sample.
    path: OsString,
    /// How outputs name it: `path` as text ([`path_text`]).
    name: String,
    source: Source,
}

impl Input {
    fn new(path: OsString, source: Source) -> Input {
        let name = path_text(Path::new(&path)).into_owned();
        Input { path, name, source }
    }
}

/// Every image to classify, sorted by path, duplicates removed.
pub struct Inputs {
    items: Vec<Input>,
    shard_sets: Vec<ShardSet>,
    /// What was met and left out, in the order met.
    pub ignored: Vec<Ignored>,
    /// Each folder searched, by its canonical path, with the path it was first reached by.
    searched: HashMap<PathBuf, PathBuf>,
    /// Each file taken, by its canonical path, with the path it was first reached by.
    taken: HashMap<PathBuf, PathBuf>,
}

/// A file or folder met and left out, with why.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Ignored {
    pub path: String,
    pub reason: String,
}

/// The extensions a file is expected to be an image by, even when its content says otherwise.
const IMAGE_EXTENSIONS: [&str; 4] = ["jpg", "jpeg", "png", "jfif"];

impl Inputs {
    /// Gathers `paths` (files, directories, shard sets) and every path listed in the
    /// `lists` (one per line; blank lines and lines starting with `#` skipped; relative paths
    /// from the current directory, as on the command line).
    pub fn gather(paths: &[PathBuf], lists: &[PathBuf]) -> Result<Inputs, InputError> {
        let mut all: Vec<PathBuf> = paths.to_vec();
        for list in lists {
            let text = std::fs::read_to_string(list)
                .map_err(|source| InputError::Io { path: list.clone(), source })?;
            all.extend(
                text.lines()
                    .map(str::trim)
                    .filter(|l| !l.is_empty() && !l.starts_with('#'))
                    .map(PathBuf::from),
            );
        }
        let mut inputs = Inputs {
            items: Vec::new(),
            shard_sets: Vec::new(),
            ignored: Vec::new(),
            searched: HashMap::new(),
            taken: HashMap::new(),
        };
        for path in &all {
            inputs.add(path)?;
        }
        inputs.items.sort_by(|a, b| a.path.as_bytes().cmp(b.path.as_bytes()));
        inputs.items.dedup_by(|a, b| a.path == b.path);
        if inputs.items.is_empty() {
            let names: Vec<Cow<'_, str>> = all.iter().map(|p| path_text(p)).collect();
            return Err(InputError::Empty { inputs: names.join(", ") });
        }
        Ok(inputs)
    }

    fn add(&mut self, path: &Path) -> Result<(), InputError> {
        let metadata = match std::fs::metadata(path) {
            Ok(metadata) => metadata,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                return Err(InputError::Missing { path: path.to_path_buf() });
            }
            Err(source) => return Err(InputError::Io { path: path.to_path_buf(), source }),
        };
        if !metadata.is_dir() {
            // Named on purpose: classified (or reported) whatever it holds.
            self.push_file(path.to_path_buf());
        } else if shards::is_shard_dir(path) {
            self.add_shard_set(path)?;
        } else {
            self.add_directory(path)?;
        }
        Ok(())
    }

    /// Takes the file at `path`, unless it was taken already by another spelling (`./a.jpg`,
    /// its absolute path, a link to it): one photo is one row, under the first spelling met.
    fn push_file(&mut self, path: PathBuf) {
        let canonical = std::fs::canonicalize(&path).unwrap_or_else(|_| path.clone());
        if let Some(first) = self.taken.get(&canonical) {
            let reason = format!("the same file as {}", path_text(first));
            self.ignore(&path, reason);
            return;
        }
        self.taken.insert(canonical, path.clone());
        self.items.push(Input::new(path.clone().into_os_string(), Source::File(path)));
    }

    fn add_shard_set(&mut self, root: &Path) -> Result<(), InputError> {
        let manifest = shards::ShardManifest::read(root)?;
        for split in manifest.splits.keys() {
            let set = ShardSet::open(root, split)?;
            let index_of_set = self.shard_sets.len();
            let root_bytes = root.as_os_str().as_bytes();
            let kept = root_bytes.iter().rposition(|&b| b != b'/').map_or(0, |last| last + 1);
            let root_name = OsStr::from_bytes(&root_bytes[..kept]);
            for index in 0..set.len() {
                // The source photo's path under the shard set when the shard records it (so
                // the rows of a tree and of its shards have the same names below their roots).
                let below = match set.source(index) {
                    Some(source) => source.path,
                    None => format!("{split}/{}", set.key(index).unwrap_or_default()),
                };
                let mut path = root_name.to_os_string();
                path.push("/");
                path.push(below);
                self.items.push(Input::new(path, Source::Shard { set: index_of_set, index }));
            }
            self.shard_sets.push(set);
        }
        Ok(())
    }

    fn ignore(&mut self, path: &Path, reason: String) {
        self.ignored.push(Ignored { path: path_text(path).into_owned(), reason });
    }

    fn add_directory(&mut self, dir: &Path) -> Result<(), InputError> {
        let canonical = std::fs::canonicalize(dir)
            .map_err(|source| InputError::Io { path: dir.to_path_buf(), source })?;
        if let Some(first) = self.searched.get(&canonical) {
            let first = path_text(first).into_owned();
            let is_link = std::fs::symlink_metadata(dir).is_ok_and(|m| m.file_type().is_symlink());
            let reason = if is_link {
                format!("a link to {first}, a folder already searched")
            } else {
                format!("a folder already searched, as {first}")
            };
            self.ignore(dir, reason);
            return Ok(());
        }
        self.searched.insert(canonical, dir.to_path_buf());
        let entries =
            std::fs::read_dir(dir).map_err(|source| InputError::Io { path: dir.to_path_buf(), source })?;
        let mut paths = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|source| InputError::Io { path: dir.to_path_buf(), source })?;
            paths.push(entry.path());
        }
        paths.sort();
        for path in paths {
            // Links followed: a link to a folder is searched as the folder.
            match std::fs::metadata(&path) {
                Ok(metadata) if metadata.is_dir() => self.add_directory(&path)?,
                Ok(_) if is_image(&path) => self.push_file(path),
                Ok(_) => {
                    let reason = match head(&path).as_deref().and_then(photo_format) {
                        Some(format) => format!("a {format} image: rtrain reads JPEG and PNG only"),
                        None => "not a JPEG or PNG image".to_string(),
                    };
                    self.ignore(&path, reason);
                }
                // A dangling link named as an image is a row with its error, as an unreadable
                // image is.
                Err(_) if has_image_extension(&path) => self.push_file(path),
                Err(error) => self.ignore(&path, format!("cannot read: {error}")),
            }
        }
        Ok(())
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// The name outputs give input `index`.
    pub fn name(&self, index: usize) -> &str {
        self.items.get(index).map_or("", |input| input.name.as_str())
    }

    /// Input `index`'s file (None for a shard sample).
    pub fn file(&self, index: usize) -> Option<&Path> {
        match self.items.get(index)?.source {
            Source::File(ref path) => Some(path),
            Source::Shard { .. } => None,
        }
    }

    /// Where shard sample `index` came from, as its shard records it (None for a file).
    pub fn shard_source(&self, index: usize) -> Option<SampleSource> {
        match self.items.get(index)?.source {
            Source::Shard { set, index } => self.shard_sets[set].source(index),
            Source::File(_) => None,
        }
    }

    /// Every input's path, in order (what ranks compare to know they see the same inputs).
    pub fn paths(&self) -> impl Iterator<Item = &OsStr> {
        self.items.iter().map(|input| input.path.as_os_str())
    }
}

fn has_image_extension(path: &Path) -> bool {
    path.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| IMAGE_EXTENSIONS.contains(&e.to_ascii_lowercase().as_str()))
}

/// Whether a file met in a directory is to be classified: its first bytes are a JPEG's or a
/// PNG's, or its extension says it is an image (then a failure to decode it is reported). Only
/// regular files are opened: a FIFO is never waited on, and one with an image's extension is
/// kept so that it is reported.
fn is_image(path: &Path) -> bool {
    if has_image_extension(path) {
        return true;
    }
    let Some(head) = head(path) else { return false };
    matches!(image::guess_format(&head), Ok(image::ImageFormat::Jpeg | image::ImageFormat::Png))
}

/// A regular file's first 16 bytes (fewer if it is shorter); None for anything else.
fn head(path: &Path) -> Option<Vec<u8>> {
    let (file, _) = open_regular(path).ok()?;
    let mut head = Vec::with_capacity(16);
    file.take(16).read_to_end(&mut head).ok()?;
    Some(head)
}

/// The name of the image format of a file that starts with `head`, for the formats a camera,
/// a phone or an image editor writes that rtrain does not read. (Formats whose signature is
/// two printable letters, such as PNM's `P1`, are left out: a text file could start so.)
fn photo_format(head: &[u8]) -> Option<&'static str> {
    use image::ImageFormat;
    // ISO base media files: `ftyp` at byte 4, then the brand.
    if head.get(4..8) == Some(b"ftyp") {
        if let Some(b"heic" | b"heix" | b"hevc" | b"mif1" | b"msf1") = head.get(8..12) {
            return Some("HEIC");
        }
    }
    Some(match image::guess_format(head).ok()? {
        ImageFormat::Tiff => "TIFF",
        ImageFormat::WebP => "WebP",
        ImageFormat::Bmp => "BMP",
        ImageFormat::Gif => "GIF",
        ImageFormat::Avif => "AVIF",
        ImageFormat::OpenExr => "OpenEXR",
        ImageFormat::Hdr => "Radiance HDR",
        ImageFormat::Qoi => "QOI",
        _ => return None,
    })
}

impl Dataset for Inputs {
    fn root(&self) -> &Path {
        Path::new("the inputs")
    }

    /// Inputs have no classes of their own: the checkpoint's are used.
    fn classes(&self) -> &[String] {
        &[]
    }

    fn len(&self) -> usize {
        self.items.len()
    }

    fn label(&self, index: usize) -> Option<usize> {
        (index < self.items.len()).then_some(0)
    }

    fn encoded(&self, index: usize) -> Result<Cow<'_, [u8]>, DataError> {
        let input = self.items.get(index).ok_or_else(|| DataError::IndexOutOfRange {
            index,
            len: self.items.len(),
            root: PathBuf::from("the inputs"),
        })?;
        match input.source {
            Source::File(ref path) => read_regular(path, MAX_IMAGE_FILE_BYTES)
                .map(Cow::Owned)
                .map_err(|source| DataError::Io { path: path.clone(), source }),
            Source::Shard { set, index } => self.shard_sets[set].encoded(index),
        }
    }

    fn describe(&self, index: usize) -> String {
        self.name(index).to_string()
    }

    fn files(&self) -> Vec<PathBuf> {
        self.items
            .iter()
            .filter_map(|input| match input.source {
                Source::File(ref path) => Some(path.clone()),
                Source::Shard { .. } => None,
            })
            .collect()
    }
}
