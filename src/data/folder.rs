//! Class-per-folder image trees (torchvision's `ImageFolder`).
//!
//! This module owns discovering `root/<class>/**/*.{jpg,jpeg,png}`, the class-name → label
//! mapping and decoding one sample to RGB8; its errors are [`DataError`], which `dataset.rs`
//! owns for every data source. Class and sample order follow torchvision exactly, so a label index here
//! means the same class as in a PyTorch model trained on the same tree.

use std::borrow::Cow;
use std::collections::HashSet;
use std::ffi::OsString;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use image::RgbImage;

use super::dataset::{DataError, Dataset};
use super::decode::{decode, MAX_IMAGE_FILE_BYTES};
use crate::util::files::{not_regular, read_regular};

/// File extensions accepted as images, compared case-insensitively.
const EXTENSIONS: [&str; 3] = ["jpg", "jpeg", "png"];

/// A class-per-folder image dataset: `root/<class>/...` with labels assigned in sorted class
/// order.
#[derive(Debug, Clone)]
pub struct ImageFolder {
    /// The directory the tree was read from.
    pub root: PathBuf,
    /// Class names (subdirectory names), sorted; a sample's label indexes this.
    pub classes: Vec<String>,
    /// Every image file with its label, grouped by class in label order.
    pub samples: Vec<(PathBuf, usize)>,
}

impl ImageFolder {
    /// Scans `dir/<class>/` for `.jpg`, `.jpeg` and `.png` files (extensions compared
    /// case-insensitively).
    ///
    /// Like torchvision, classes are the sorted names of all subdirectories, class
    /// directories are searched recursively (following symlinks), and within a class files
    /// are ordered by their directory, then by file name. Files with other extensions are
    /// ignored.
    ///
    /// # Errors
    /// `dir` missing or not a directory, a directory that cannot be listed, no class
    /// subdirectories, a class folder whose name is not UTF-8, a class without any image, or an
    /// image name that is not a regular file (a FIFO, a device) — each naming the path.
    pub fn open(dir: &Path) -> Result<Self, DataError> {
        let meta = fs::metadata(dir).map_err(|source| {
            if source.kind() == io::ErrorKind::NotFound {
                DataError::Missing { path: dir.to_path_buf() }
            } else {
                DataError::Io { path: dir.to_path_buf(), source }
            }
        })?;
        if !meta.is_dir() {
            return Err(DataError::NotADirectory { path: dir.to_path_buf() });
        }

        let mut class_names = Vec::new();
        for entry in read_dir_sorted(dir)? {
            // `fs::metadata` follows symlinks, as torchvision's `entry.is_dir()` does.
            if entry.path.is_dir() {
                // A class name must be text because it is reported and stored in
                // checkpoints; made text lossily, two names could become one class name.
                let Some(name) = entry.name.to_str() else {
                    return Err(DataError::ClassNameNotUtf8 { path: entry.path });
                };
                class_names.push((name.to_string(), entry.path));
            }
        }
        if class_names.is_empty() {
            return Err(DataError::NoClasses { path: dir.to_path_buf() });
        }

        let mut samples = Vec::new();
        for (label, (_, class_dir)) in class_names.iter().enumerate() {
            let before = samples.len();
            collect_class(class_dir, label, &mut samples)?;
            if samples.len() == before {
                return Err(DataError::EmptyClass { path: class_dir.clone() });
            }
        }

        Ok(Self {
            root: dir.to_path_buf(),
            classes: class_names.into_iter().map(|(name, _)| name).collect(),
            samples,
        })
    }

    /// Number of samples.
    pub fn len(&self) -> usize {
        self.samples.len()
    }

    /// Whether there are no samples (never true for a folder from [`ImageFolder::open`]).
    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    /// Decodes sample `index` to 8-bit RGB; grayscale, 16-bit and alpha images are converted
    /// (alpha dropped, as PIL's `convert("RGB")` does).
    ///
    /// The format is sniffed from the file's contents, so a PNG saved as `.jpg` still loads.
    ///
    /// # Errors
    /// An out-of-range index, an unreadable file or an undecodable image, naming the file.
    pub fn load(&self, index: usize) -> Result<RgbImage, DataError> {
        let bytes = self.encoded(index)?;
        decode(&bytes).map_err(|source| DataError::Decode { path: self.samples[index].0.clone(), source })
    }

    /// The bytes of sample `index`'s file.
    ///
    /// # Errors
    /// An out-of-range index or an unreadable file, naming the file.
    pub fn encoded(&self, index: usize) -> Result<Vec<u8>, DataError> {
        let (path, _) = self.samples.get(index).ok_or_else(|| DataError::IndexOutOfRange {
            index,
            len: self.samples.len(),
            root: self.root.clone(),
        })?;
        read_regular(path, MAX_IMAGE_FILE_BYTES)
            .map_err(|source| DataError::Io { path: path.clone(), source })
    }
}

/// One directory entry with its name kept for sorting.
struct Entry {
    name: OsString,
    path: PathBuf,
}

/// Lists `dir` sorted by entry name (byte order, which for UTF-8 names is the code-point
/// order Python's `sorted` uses).
fn read_dir_sorted(dir: &Path) -> Result<Vec<Entry>, DataError> {
    let io_err = |source| DataError::Io { path: dir.to_path_buf(), source };
    let mut entries = Vec::new();
    for entry in fs::read_dir(dir).map_err(io_err)? {
        let entry = entry.map_err(io_err)?;
        entries.push(Entry { name: entry.file_name(), path: entry.path() });
    }
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(entries)
}

fn has_image_extension(path: &Path) -> bool {
    path.extension()
        .and_then(|ext| ext.to_str())
        .is_some_and(|ext| EXTENSIONS.iter().any(|e| ext.eq_ignore_ascii_case(e)))
}

/// Appends the images under `class_dir` in torchvision's order: `sorted(os.walk(...))` visits
/// directories sorted by their full path, and files within one directory by name — so a
/// file directly in the class directory comes before any file in a subdirectory.
fn collect_class(
    class_dir: &Path,
    label: usize,
    samples: &mut Vec<(PathBuf, usize)>,
) -> Result<(), DataError> {
    let mut dirs = Vec::new();
    // Symlinks are followed like `os.walk(followlinks=True)`, but a directory reached twice
    // (a symlink loop) is walked only once instead of forever.
    let mut seen = HashSet::new();
    let mut stack = vec![class_dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let canonical =
            fs::canonicalize(&dir).map_err(|source| DataError::Io { path: dir.clone(), source })?;
        if !seen.insert(canonical) {
            continue;
        }
        let mut files = Vec::new();
        for entry in read_dir_sorted(&dir)? {
            if entry.path.is_dir() {
                stack.push(entry.path);
            } else if has_image_extension(&entry.path) {
                // Only regular files (symlinks followed): torchvision would list a FIFO named
                // x.jpg and block on it, or a link to /dev/zero and read for ever; the run's
                // manifest hashes every file before training.
                let metadata = fs::metadata(&entry.path)
                    .map_err(|source| DataError::Io { path: entry.path.clone(), source })?;
                if let Some(what) = not_regular(&metadata) {
                    return Err(DataError::NotARegularFile { path: entry.path, what });
                }
                files.push(entry.path);
            }
        }
        dirs.push((dir, files));
    }
    dirs.sort_by(|a, b| a.0.as_os_str().cmp(b.0.as_os_str()));
    for (_, files) in dirs {
        samples.extend(files.into_iter().map(|path| (path, label)));
    }
    Ok(())
}

impl Dataset for ImageFolder {
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
        self.samples.get(index).map(|s| s.1)
    }

    fn encoded(&self, index: usize) -> Result<Cow<'_, [u8]>, DataError> {
        ImageFolder::encoded(self, index).map(Cow::Owned)
    }

    fn load(&self, index: usize) -> Result<RgbImage, DataError> {
        ImageFolder::load(self, index)
    }

    fn describe(&self, index: usize) -> String {
        self.samples.get(index).map_or_else(|| format!("#{index}"), |s| s.0.display().to_string())
    }

    fn files(&self) -> Vec<PathBuf> {
        self.samples.iter().map(|s| s.0.clone()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_png(path: &Path, width: u32, height: u32, rgb: [u8; 3]) {
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).unwrap();
        }
        RgbImage::from_pixel(width, height, image::Rgb(rgb)).save(path).unwrap();
    }

    #[test]
    fn classes_and_samples_follow_torchvision_order() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        write_png(&root.join("zebra/b.png"), 4, 4, [1, 2, 3]);
        write_png(&root.join("zebra/a.PNG"), 4, 4, [1, 2, 3]);
        write_png(&root.join("cat/sub/a.png"), 4, 4, [1, 2, 3]);
        write_png(&root.join("cat/x.png"), 4, 4, [1, 2, 3]);
        // An image with a .JPeG extension (content sniffed, so PNG bytes are fine).
        write_png(&root.join("cat/y.JPeG"), 4, 4, [1, 2, 3]);
        fs::write(root.join("cat/notes.txt"), "ignored").unwrap();
        fs::write(root.join("stray.png"), "not a class").unwrap();

        let folder = ImageFolder::open(root).unwrap();
        assert_eq!(folder.classes, vec!["cat".to_string(), "zebra".to_string()]);
        let rel: Vec<(String, usize)> = folder
            .samples
            .iter()
            .map(|(p, l)| {
                let rel = p.strip_prefix(root).unwrap().to_string_lossy().replace('\\', "/");
                (rel, *l)
            })
            .collect();
        let expected = [
            ("cat/x.png", 0),
            ("cat/y.JPeG", 0),
            ("cat/sub/a.png", 0),
            ("zebra/a.PNG", 1),
            ("zebra/b.png", 1),
        ];
        let expected: Vec<(String, usize)> = expected.iter().map(|(p, l)| (p.to_string(), *l)).collect();
        assert_eq!(rel, expected);
        assert_eq!(folder.len(), 5);
        assert!(!folder.is_empty());
    }

    #[test]
    fn load_converts_to_rgb() {
        let dir = tempfile::tempdir().unwrap();
        let gray = dir.path().join("a/gray.png");
        fs::create_dir_all(gray.parent().unwrap()).unwrap();
        image::GrayImage::from_pixel(3, 2, image::Luma([77])).save(&gray).unwrap();
        let rgba = dir.path().join("b/rgba.png");
        fs::create_dir_all(rgba.parent().unwrap()).unwrap();
        image::RgbaImage::from_pixel(2, 5, image::Rgba([10, 20, 30, 0])).save(&rgba).unwrap();
        let folder = ImageFolder::open(dir.path()).unwrap();
        let g = folder.load(0).unwrap();
        assert_eq!(g.dimensions(), (3, 2));
        assert!(g.pixels().all(|p| p.0 == [77, 77, 77]));
        let c = folder.load(1).unwrap();
        assert_eq!(c.dimensions(), (2, 5));
        assert!(c.pixels().all(|p| p.0 == [10, 20, 30]));
        assert!(matches!(folder.load(2), Err(DataError::IndexOutOfRange { index: 2, len: 2, .. })));
    }

    #[test]
    fn errors_name_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope");
        let err = ImageFolder::open(&missing).unwrap_err();
        assert!(matches!(err, DataError::Missing { .. }));
        assert!(err.to_string().contains(&*missing.to_string_lossy()));

        let empty_root = dir.path().join("empty");
        fs::create_dir(&empty_root).unwrap();
        fs::write(empty_root.join("file.png"), "x").unwrap();
        let err = ImageFolder::open(&empty_root).unwrap_err();
        assert!(matches!(err, DataError::NoClasses { .. }));
        assert!(err.to_string().contains(&*empty_root.to_string_lossy()));

        let root = dir.path().join("tree");
        write_png(&root.join("good/a.png"), 2, 2, [0, 0, 0]);
        fs::create_dir_all(root.join("hollow")).unwrap();
        fs::write(root.join("hollow/readme.txt"), "no images").unwrap();
        let err = ImageFolder::open(&root).unwrap_err();
        assert!(matches!(err, DataError::EmptyClass { .. }));
        assert!(err.to_string().contains(&*root.join("hollow").to_string_lossy()));

        let file = root.join("good/a.png");
        let err = ImageFolder::open(&file).unwrap_err();
        assert!(matches!(err, DataError::NotADirectory { .. }));
    }

    #[test]
    fn corrupt_file_error_names_it() {
        let dir = tempfile::tempdir().unwrap();
        let bad = dir.path().join("c/bad.jpg");
        fs::create_dir_all(bad.parent().unwrap()).unwrap();
        fs::write(&bad, b"\xff\xd8\xff\xe0 definitely not a jpeg").unwrap();
        let folder = ImageFolder::open(dir.path()).unwrap();
        let err = folder.load(0).unwrap_err();
        assert!(matches!(err, DataError::Decode { .. }), "{err:?}");
        assert!(err.to_string().contains(&*bad.to_string_lossy()));
    }
}
