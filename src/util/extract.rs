//! Archive extraction: unpacking a downloaded tar, tar.gz or zip into a new directory without
//! trusting anything the archive says.
//!
//! A dataset archive comes from elsewhere, so every entry is checked before anything is
//! written: names must stay inside the destination (no absolute paths, no `..`), links must
//! point inside it, only regular files, directories and such links are accepted, and the entry
//! count and unpacked size are capped so that a small archive cannot fill the disk. The tar and
//! zip crates only parse; the files are written here, to paths computed and checked here, and
//! never through a symbolic link that an earlier entry created.
//!
//! Zip archives (what data portals such as DesignSafe's Data Depot hand out) get the same rules
//! and three of their own, checked from the central directory before anything is written:
//! encrypted entries are refused with a message saying so; an entry that would unpack to more
//! than [`MAX_RATIO`] times its compressed size (past [`RATIO_FLOOR`]) is refused as a
//! compression bomb; and entries whose data overlap (the trick that lets a small zip unpack to
//! petabytes by reusing one compressed stream) are refused.
//!
//! The tree is built in a hidden sibling of the destination and renamed into place when
//! complete ([`super::atomic_dir`]), so a failed or refused extraction leaves no destination and
//! nothing else behind.

use std::cell::Cell;
use std::collections::HashSet;
use std::ffi::OsStr;
use std::fs::{self, File, OpenOptions, Permissions};
use std::io::{self, BufReader, Read, Seek, SeekFrom, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};
use std::rc::Rc;
use std::time::{Duration, SystemTime};

use flate2::read::MultiGzDecoder;
use tar::EntryType;

use super::atomic_dir::{self, AtomicDirError};
use super::io_error::IoError;

/// Caps that keep a hostile or mistaken archive from exhausting the disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExtractLimits {
    /// Total unpacked size, as declared by the entry headers and as actually written.
    pub max_bytes: u64,
    /// Number of entries of any kind.
    pub max_entries: u64,
}

impl Default for ExtractLimits {
    fn default() -> Self {
        // Ample for CIFAR-sized sets and ImageNet subsets while well short of filling a scratch
        // disk; bigger archives (the full ImageNet-1k training tar is about 140 GB, 1.3 million
        // files) need the caller to raise `max_bytes`.
        ExtractLimits { max_bytes: 64 << 30, max_entries: 10_000_000 }
    }
}

/// What [`extract`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Extracted {
    /// Regular files, hard links included.
    pub files: u64,
    /// Bytes of file content written.
    pub bytes: u64,
}

/// The most an extension header (a GNU long name or a pax record set) may hold. The tar crate
/// reads these into memory, so without a cap a compressed run of zeros could exhaust it.
const MAX_EXTENSION_HEADER: u64 = 1 << 20;
/// Read and write granularity for file contents.
const CHUNK: usize = 256 * 1024;
/// A zip entry unpacking to more than this many times its compressed size is a compression
/// bomb. Photos and most data compress far less (JPEGs about 1x, text 3-10x); deflate's
/// ceiling is about 1,032x, reached only by long runs of one byte.
pub const MAX_RATIO: u64 = 100;
/// Entries smaller than this unpacked are never taken for bombs (a small file of zeros is not).
pub const RATIO_FLOOR: u64 = 16 << 20;
/// The longest symbolic link target read from a zip entry's data.
const MAX_LINK_TARGET: u64 = 4096;

/// Why an archive was not extracted. Each message names the archive, and the entry where one
/// is to blame.
#[derive(Debug, thiserror::Error)]
pub enum ExtractError {
    #[error(
        "{}: {format} archives are not supported; decompress it first (`{tool}`) and extract \
         the .tar",
        archive.display()
    )]
    Unsupported { archive: PathBuf, format: &'static str, tool: &'static str },
    #[error("{}: the file is empty, not an archive", archive.display())]
    Empty { archive: PathBuf },
    #[error(
        "{}: cannot read it as a tar or tar.gz archive (corrupt, truncated or another format)",
        archive.display()
    )]
    Read {
        archive: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{}: cannot read it as a zip archive (corrupt or truncated): {message}", archive.display())]
    ZipRead { archive: PathBuf, message: String },
    #[error("{}: cannot read entry {entry:?} (corrupt or truncated archive)", archive.display())]
    ReadEntry {
        archive: PathBuf,
        entry: String,
        #[source]
        source: io::Error,
    },
    #[error("{}: entry {entry:?} is truncated: {written} of {expected} bytes", archive.display())]
    Truncated { archive: PathBuf, entry: String, written: u64, expected: u64 },
    #[error("{}: refusing entry {entry:?}: {reason}; nothing was extracted", archive.display())]
    Unsafe { archive: PathBuf, entry: String, reason: String },
    #[error("{}: more than {limit} entries; nothing was extracted", archive.display())]
    TooManyEntries { archive: PathBuf, limit: u64 },
    #[error(
        "{}: entry {entry:?} takes the unpacked size past the limit of {limit} bytes; nothing was \
         extracted",
        archive.display()
    )]
    TooLarge { archive: PathBuf, entry: String, limit: u64 },
    #[error(
        "{}: an extension header (long name or pax records) is larger than {limit} bytes; \
         refusing it",
        archive.display()
    )]
    ExtensionHeaderTooLarge { archive: PathBuf, limit: u64 },
    #[error("{}: the destination must name a new directory", path.display())]
    BadDestination { path: PathBuf },
    #[error(transparent)]
    Output(#[from] AtomicDirError),
    /// A filesystem operation failed.
    #[error(transparent)]
    Io(#[from] IoError),
}

/// Extracts `archive` (tar or gzip-compressed tar, told apart by content) into `dest`, which
/// must not exist yet (or be an empty directory, as elsewhere in `rtrain data`).
///
/// Either the whole archive is extracted and `dest` appears complete, or an error is returned
/// and `dest` does not exist; see the module docs for what is refused.
pub fn extract(archive: &Path, dest: &Path, limits: &ExtractLimits) -> Result<Extracted, ExtractError> {
    let Some(name) = dest.file_name() else {
        return Err(ExtractError::BadDestination { path: dest.to_path_buf() });
    };
    // Fail before reading a possibly large archive when the result could not be published.
    atomic_dir::ensure_free(dest)?;
    let format = open_archive(archive)?;
    let staging = atomic_dir::staging_dir(dest, &format!(".{}.partial-", name.to_string_lossy()))?;

    let unpacker = Unpacker::new(archive, staging.path(), limits);
    // On error `staging` is dropped here, removing everything written so far.
    let extracted = match format {
        Format::Tar(reader) => unpacker.run(reader)?,
        Format::Zip(file) => unpacker.run_zip(file)?,
    };

    // One filesystem-wide flush instead of an fsync per file: datasets hold millions of small
    // files. It must precede the rename, or a crash could publish a tree of empty files.
    sync_filesystem(staging.path())
        .map_err(IoError::at(staging.path(), "flush the extracted files to disk"))?;
    atomic_dir::publish(staging, dest)?;
    let parent = match dest.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    File::open(parent)
        .and_then(|dir| dir.sync_all())
        .map_err(IoError::at(parent, "flush directory to disk"))?;
    tracing::info!(
        archive = %archive.display(),
        dest = %dest.display(),
        files = extracted.files,
        bytes = extracted.bytes,
        "extracted"
    );
    Ok(extracted)
}

/// An opened archive: a stream of tar blocks, or a zip file (read by its central directory).
enum Format {
    Tar(Box<dyn Read>),
    Zip(File),
}

/// Opens `archive` as a stream of tar blocks, decompressing gzip, or as a zip file; other
/// compressions are named and refused rather than failing later as a corrupt tar.
fn open_archive(archive: &Path) -> Result<Format, ExtractError> {
    let io_error = |action, source| IoError::at(archive, action)(source);
    let mut file = File::open(archive).map_err(|source| io_error("open", source))?;
    let mut magic = [0u8; 6];
    let len = read_up_to(&mut file, &mut magic).map_err(|source| io_error("read", source))?;
    file.seek(SeekFrom::Start(0)).map_err(|source| io_error("read", source))?;
    let unsupported =
        |format, tool| ExtractError::Unsupported { archive: archive.to_path_buf(), format, tool };
    match &magic[..len] {
        [] => Err(ExtractError::Empty { archive: archive.to_path_buf() }),
        [0x1f, 0x8b, ..] => Ok(Format::Tar(Box::new(MultiGzDecoder::new(file)))),
        // A local file header, or the end-of-central-directory record of an empty zip.
        [b'P', b'K', 3, 4, ..] | [b'P', b'K', 5, 6, ..] => Ok(Format::Zip(file)),
        [0x28, 0xb5, 0x2f, 0xfd, ..] => Err(unsupported("zstd", "zstd -d")),
        [0xfd, b'7', b'z', b'X', b'Z', 0x00] => Err(unsupported("xz", "xz -d")),
        [b'B', b'Z', b'h', ..] => Err(unsupported("bzip2", "bzip2 -d")),
        // Anything else goes to the tar parser, which rejects a non-tar by its header checksum.
        _ => Ok(Format::Tar(Box::new(BufReader::with_capacity(CHUNK, file)))),
    }
}

/// Reads until `buf` is full or the input ends; returns how much was read.
fn read_up_to(reader: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match reader.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
            Err(err) => return Err(err),
        }
    }
    Ok(filled)
}

/// Makes what reached `dir`'s filesystem durable.
fn sync_filesystem(dir: &Path) -> io::Result<()> {
    let handle = File::open(dir)?;
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        // SAFETY: `handle` is an open descriptor for the duration of the call.
        if unsafe { libc::syncfs(handle.as_raw_fd()) } != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        drop(handle);
        // SAFETY: sync takes no arguments and cannot fail.
        unsafe { libc::sync() };
    }
    Ok(())
}

/// The archive stream, failing once `allowance` bytes have been read. [`Unpacker::run`] lifts
/// the cap while an entry's own data is read and sets it to what the parser may legitimately
/// need before asking for the next entry, which bounds the extension headers the tar crate
/// buffers in memory.
struct Metered<R> {
    inner: R,
    allowance: Rc<Cell<u64>>,
}

/// The marker error [`Metered`] fails with, told apart from a corrupt archive by type.
#[derive(Debug, thiserror::Error)]
#[error("extension header over the size limit")]
struct AllowanceExceeded;

impl<R: Read> Read for Metered<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.allowance.get();
        if left == 0 && !buf.is_empty() {
            return Err(io::Error::other(AllowanceExceeded));
        }
        let want = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        let n = self.inner.read(&mut buf[..want])?;
        self.allowance.set(left - n as u64);
        Ok(n)
    }
}

/// What is written of a regular file besides its bytes.
struct FileMeta {
    /// As declared by the archive; the data must have exactly this length.
    size: u64,
    executable: bool,
    /// Seconds since the Unix epoch.
    mtime: Option<u64>,
}

/// Where a zip entry lies in the archive file, from its local header to the end of its data.
struct ZipSpan {
    name: String,
    start: u64,
    end: u64,
}

/// `S_IFMT` and the file types of a Unix mode (zip entries made on Unix record one).
const S_IFMT: u32 = 0o170_000;
const S_IFREG: u32 = 0o100_000;
const S_IFDIR: u32 = 0o040_000;
const S_IFLNK: u32 = 0o120_000;

/// Writes checked entries under `root`, the staging directory.
struct Unpacker<'a> {
    archive: &'a Path,
    root: &'a Path,
    limits: &'a ExtractLimits,
    /// Every directory created so far, relative to `root`. These are real directories (never
    /// replaced later, see [`Unpacker::clear_slot`]), so writing beneath them follows no link.
    dirs: HashSet<PathBuf>,
    entries: u64,
    /// Sum of the sizes the headers declared, checked before anything is read.
    declared: u64,
    files: u64,
    bytes: u64,
    buf: Vec<u8>,
}

/// How an entry is written, decided from its header.
enum Kind {
    File,
    Dir,
    Symlink,
    HardLink,
}

impl<'a> Unpacker<'a> {
    fn new(archive: &'a Path, root: &'a Path, limits: &'a ExtractLimits) -> Self {
        Unpacker {
            archive,
            root,
            limits,
            dirs: HashSet::new(),
            entries: 0,
            declared: 0,
            files: 0,
            bytes: 0,
            buf: vec![0u8; CHUNK],
        }
    }

    fn run(mut self, reader: Box<dyn Read>) -> Result<Extracted, ExtractError> {
        let allowance = Rc::new(Cell::new(MAX_EXTENSION_HEADER));
        let mut archive = tar::Archive::new(Metered { inner: reader, allowance: Rc::clone(&allowance) });
        let entries = archive.entries().map_err(|err| self.read_error(err))?;
        for entry in entries {
            let mut entry = entry.map_err(|err| self.read_error(err))?;
            allowance.set(u64::MAX);
            let size = entry.size();
            self.unpack(&mut entry)?;
            // Before the next header the parser skips whatever of this entry's data and padding
            // was not read, then reads headers and any extension records.
            allowance.set(size.saturating_add(511).saturating_add(MAX_EXTENSION_HEADER));
        }
        Ok(Extracted { files: self.files, bytes: self.bytes })
    }

    fn run_zip(mut self, file: File) -> Result<Extracted, ExtractError> {
        let mut zip = zip::ZipArchive::new(BufReader::with_capacity(CHUNK, file)).map_err(|err| {
            ExtractError::ZipRead { archive: self.archive.to_path_buf(), message: err.to_string() }
        })?;
        self.check_zip(&mut zip)?;
        for index in 0..zip.len() {
            let mut entry = zip.by_index(index).map_err(|err| self.zip_entry_error(index, err))?;
            let name = entry.name().to_string();
            let mode = entry.unix_mode();
            let kind = match mode.map(|mode| mode & S_IFMT) {
                _ if entry.is_dir() => Kind::Dir,
                Some(S_IFLNK) => Kind::Symlink,
                None | Some(0) | Some(S_IFREG) => Kind::File,
                Some(S_IFDIR) => Kind::Dir,
                Some(_) => return Err(self.refuse(&name, "it is a device file, FIFO or socket")),
            };
            let rel = relative_path(name.as_bytes()).map_err(|reason| self.refuse(&name, reason))?;
            if rel.as_os_str().is_empty() {
                // `./` names the destination itself, which the staging directory already is.
                match kind {
                    Kind::Dir => continue,
                    _ => return Err(self.refuse(&name, "it has an empty name")),
                }
            }
            match kind {
                Kind::File => {
                    let meta = FileMeta {
                        size: entry.size(),
                        executable: mode.is_some_and(|mode| mode & 0o111 != 0),
                        mtime: None,
                    };
                    self.write_file(&mut entry, meta, &rel, &name)?;
                }
                Kind::Dir => self.make_dir(&rel, &name)?,
                Kind::Symlink => {
                    // A zip stores a link's target as the entry's data.
                    let mut target = Vec::new();
                    (&mut entry).take(MAX_LINK_TARGET + 1).read_to_end(&mut target).map_err(|source| {
                        ExtractError::ReadEntry {
                            archive: self.archive.to_path_buf(),
                            entry: name.clone(),
                            source,
                        }
                    })?;
                    if target.len() as u64 > MAX_LINK_TARGET {
                        return Err(self.refuse(&name, "its symbolic link target is longer than 4096 bytes"));
                    }
                    self.make_symlink(&target, &rel, &name)?;
                }
                Kind::HardLink => unreachable!("zip archives have no hard links"),
            }
        }
        Ok(Extracted { files: self.files, bytes: self.bytes })
    }

    /// The zip-wide checks, from the central directory and local headers, before anything is
    /// written: entry count, declared size, encryption, compression ratio, overlapping data.
    fn check_zip<R: Read + Seek>(&mut self, zip: &mut zip::ZipArchive<R>) -> Result<(), ExtractError> {
        let mut spans = Vec::with_capacity(zip.len());
        for index in 0..zip.len() {
            let entry = zip.by_index_raw(index).map_err(|err| self.zip_entry_error(index, err))?;
            let name = entry.name().to_string();
            self.entries += 1;
            if self.entries > self.limits.max_entries {
                return Err(ExtractError::TooManyEntries {
                    archive: self.archive.to_path_buf(),
                    limit: self.limits.max_entries,
                });
            }
            if entry.encrypted() {
                return Err(self.refuse(
                    &name,
                    "it is encrypted (password-protected), which rtrain does not read: extract the \
                     archive with its password (`7z x` or `unzip -P`) and use the folder",
                ));
            }
            let (size, packed) = (entry.size(), entry.compressed_size());
            self.declared = self.declared.saturating_add(size);
            if self.declared > self.limits.max_bytes {
                return Err(self.too_large(&name));
            }
            if size > RATIO_FLOOR && size > packed.saturating_mul(MAX_RATIO) {
                let reason = format!(
                    "it would unpack {size} bytes from {packed} ({}x), past the {MAX_RATIO}x that marks a \
                     compression bomb",
                    size / packed.max(1)
                );
                return Err(self.refuse(&name, reason));
            }
            let start = entry.header_start();
            let end = entry.data_start().unwrap_or(start).saturating_add(packed);
            spans.push(ZipSpan { name, start, end });
        }
        spans.sort_by_key(|span| span.start);
        for pair in spans.windows(2) {
            if pair[1].start < pair[0].end {
                let reason = format!(
                    "its data overlap those of entry {:?} (overlapping entries are how zip bombs \
                     multiply their output)",
                    pair[0].name
                );
                return Err(self.refuse(&pair[1].name, reason));
            }
        }
        Ok(())
    }

    fn zip_entry_error(&self, index: usize, err: zip::result::ZipError) -> ExtractError {
        ExtractError::ZipRead {
            archive: self.archive.to_path_buf(),
            message: format!("entry {index}: {err}"),
        }
    }

    fn read_error(&self, source: io::Error) -> ExtractError {
        let archive = self.archive.to_path_buf();
        if source.get_ref().is_some_and(|inner| inner.is::<AllowanceExceeded>()) {
            ExtractError::ExtensionHeaderTooLarge { archive, limit: MAX_EXTENSION_HEADER }
        } else {
            ExtractError::Read { archive, source }
        }
    }

    fn refuse(&self, entry: &str, reason: impl Into<String>) -> ExtractError {
        ExtractError::Unsafe {
            archive: self.archive.to_path_buf(),
            entry: entry.to_string(),
            reason: reason.into(),
        }
    }

    fn unpack<R: Read>(&mut self, entry: &mut tar::Entry<'_, R>) -> Result<(), ExtractError> {
        let name_bytes = entry.path_bytes().into_owned();
        let name = String::from_utf8_lossy(&name_bytes).into_owned();

        self.entries += 1;
        if self.entries > self.limits.max_entries {
            return Err(ExtractError::TooManyEntries {
                archive: self.archive.to_path_buf(),
                limit: self.limits.max_entries,
            });
        }
        // Every entry's data has to be decompressed, whatever its type, so all of it counts.
        let size = entry.size();
        self.declared = self.declared.saturating_add(size);
        if self.declared > self.limits.max_bytes {
            return Err(self.too_large(&name));
        }

        let entry_type = entry.header().entry_type();
        if entry_type.is_pax_global_extensions() {
            // Archive-wide metadata (e.g. from `git archive`), not a file.
            return Ok(());
        }
        let kind = match entry_type {
            EntryType::Regular | EntryType::Continuous => {
                // Pre-POSIX archivers marked directories only by a trailing slash.
                if name_bytes.ends_with(b"/") && size == 0 {
                    Kind::Dir
                } else {
                    Kind::File
                }
            }
            EntryType::Directory => Kind::Dir,
            EntryType::Symlink => Kind::Symlink,
            EntryType::Link => Kind::HardLink,
            EntryType::Char | EntryType::Block => return Err(self.refuse(&name, "it is a device file")),
            EntryType::Fifo => return Err(self.refuse(&name, "it is a FIFO")),
            EntryType::GNUSparse => return Err(self.refuse(&name, "sparse files are not supported")),
            other => {
                let reason = format!("entry type {:?} is not supported", other.as_byte() as char);
                return Err(self.refuse(&name, reason));
            }
        };

        let rel = relative_path(&name_bytes).map_err(|reason| self.refuse(&name, reason))?;
        if rel.as_os_str().is_empty() {
            // `./` names the destination itself, which the staging directory already is.
            return match kind {
                Kind::Dir => Ok(()),
                _ => Err(self.refuse(&name, "it has an empty name")),
            };
        }
        match kind {
            Kind::File => {
                let header = entry.header();
                let meta = FileMeta {
                    size,
                    executable: header.mode().is_ok_and(|mode| mode & 0o111 != 0),
                    mtime: header.mtime().ok(),
                };
                self.write_file(entry, meta, &rel, &name)
            }
            Kind::Dir => self.make_dir(&rel, &name),
            Kind::Symlink => match entry.link_name_bytes() {
                Some(target) => self.make_symlink(&target, &rel, &name),
                None => Err(self.refuse(&name, "it is a symbolic link without a target")),
            },
            Kind::HardLink => self.make_hard_link(entry, &rel, &name),
        }
    }

    fn too_large(&self, name: &str) -> ExtractError {
        ExtractError::TooLarge {
            archive: self.archive.to_path_buf(),
            entry: name.to_string(),
            limit: self.limits.max_bytes,
        }
    }

    fn io_error(path: PathBuf, action: &'static str, source: io::Error) -> ExtractError {
        IoError { path, action, source }.into()
    }

    fn write_file(
        &mut self,
        entry: &mut dyn Read,
        meta: FileMeta,
        rel: &Path,
        name: &str,
    ) -> Result<(), ExtractError> {
        self.make_parents(rel, name)?;
        let path = self.root.join(rel);
        self.clear_slot(&path, false, name)?;
        // create_new never follows a link at `path`; clear_slot has removed any earlier one.
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(|source| Self::io_error(path.clone(), "create", source))?;

        let expected = meta.size;
        let mut written = 0u64;
        loop {
            let n = match entry.read(&mut self.buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
                Err(source) => {
                    return Err(ExtractError::ReadEntry {
                        archive: self.archive.to_path_buf(),
                        entry: name.to_string(),
                        source,
                    })
                }
            };
            written += n as u64;
            // Counted as written too, not only as declared, should the two ever disagree.
            if self.bytes + written > self.limits.max_bytes {
                return Err(self.too_large(name));
            }
            file.write_all(&self.buf[..n]).map_err(|source| Self::io_error(path.clone(), "write", source))?;
        }
        if written != expected {
            return Err(ExtractError::Truncated {
                archive: self.archive.to_path_buf(),
                entry: name.to_string(),
                written,
                expected,
            });
        }

        let mode = if meta.executable { 0o755 } else { 0o644 };
        file.set_permissions(Permissions::from_mode(mode))
            .map_err(|source| Self::io_error(path.clone(), "set permissions on", source))?;
        if let Some(mtime) = meta.mtime {
            // Cosmetic, so a time the filesystem cannot store is not worth failing over.
            let _ = file.set_modified(SystemTime::UNIX_EPOCH + Duration::from_secs(mtime));
        }
        self.files += 1;
        self.bytes += written;
        Ok(())
    }

    fn make_dir(&mut self, rel: &Path, name: &str) -> Result<(), ExtractError> {
        if self.dirs.contains(rel) {
            return Ok(());
        }
        self.make_parents(rel, name)?;
        let path = self.root.join(rel);
        self.clear_slot(&path, true, name)?;
        self.create_dir(rel)
    }

    fn create_dir(&mut self, rel: &Path) -> Result<(), ExtractError> {
        let path = self.root.join(rel);
        fs::create_dir(&path).map_err(|source| Self::io_error(path.clone(), "create directory", source))?;
        fs::set_permissions(&path, Permissions::from_mode(0o755))
            .map_err(|source| Self::io_error(path.clone(), "set permissions on", source))?;
        self.dirs.insert(rel.to_path_buf());
        Ok(())
    }

    /// Creates the directories above `rel` that do not exist yet, refusing to go through
    /// anything that is not a directory created here, above all a symbolic link.
    fn make_parents(&mut self, rel: &Path, name: &str) -> Result<(), ExtractError> {
        let Some(parent) = rel.parent() else { return Ok(()) };
        if parent.as_os_str().is_empty() || self.dirs.contains(parent) {
            return Ok(());
        }
        let mut prefix = PathBuf::new();
        for component in parent.components() {
            prefix.push(component);
            if self.dirs.contains(&prefix) {
                continue;
            }
            let path = self.root.join(&prefix);
            match fs::symlink_metadata(&path) {
                Err(err) if err.kind() == io::ErrorKind::NotFound => self.create_dir(&prefix)?,
                Err(source) => return Err(Self::io_error(path, "inspect", source)),
                Ok(meta) if meta.file_type().is_symlink() => {
                    let reason = format!(
                        "its parent {:?} is a symbolic link, and writing through it could leave \
                         the destination",
                        prefix.display().to_string()
                    );
                    return Err(self.refuse(name, reason));
                }
                Ok(_) => {
                    let reason = format!("its parent {:?} is not a directory", prefix.display().to_string());
                    return Err(self.refuse(name, reason));
                }
            }
        }
        Ok(())
    }

    /// Makes room at `path` for a new entry. A later file or link replaces an earlier one of the
    /// same name, as with `tar -x`; replacing a directory, or a file with a directory, is
    /// refused, which is what keeps every directory in `dirs` real.
    fn clear_slot(&self, path: &Path, for_dir: bool, name: &str) -> Result<(), ExtractError> {
        match fs::symlink_metadata(path) {
            Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(Self::io_error(path.to_path_buf(), "inspect", source)),
            Ok(meta) if meta.is_dir() => {
                Err(self.refuse(name, "it would replace a directory extracted earlier"))
            }
            Ok(_) if for_dir => Err(self.refuse(name, "it would replace a file or link extracted earlier")),
            // Removing a symbolic link removes the link, never its target.
            Ok(_) => {
                fs::remove_file(path).map_err(|source| Self::io_error(path.to_path_buf(), "replace", source))
            }
        }
    }

    fn make_symlink(&mut self, target: &[u8], rel: &Path, name: &str) -> Result<(), ExtractError> {
        if let Err(reason) = check_symlink_target(rel, target) {
            let reason = format!("symbolic link to {:?} {reason}", String::from_utf8_lossy(target));
            return Err(self.refuse(name, reason));
        }
        self.make_parents(rel, name)?;
        let path = self.root.join(rel);
        self.clear_slot(&path, false, name)?;
        std::os::unix::fs::symlink(OsStr::from_bytes(target), &path)
            .map_err(|source| Self::io_error(path, "create symbolic link", source))
    }

    fn make_hard_link<R: Read>(
        &mut self,
        entry: &tar::Entry<'_, R>,
        rel: &Path,
        name: &str,
    ) -> Result<(), ExtractError> {
        let Some(target_bytes) = entry.link_name_bytes() else {
            return Err(self.refuse(name, "it is a hard link without a target"));
        };
        let shown = String::from_utf8_lossy(&target_bytes).into_owned();
        // Tar stores hard link targets relative to the archive root, like entry names.
        let target = relative_path(&target_bytes)
            .map_err(|reason| self.refuse(name, format!("hard link to {shown:?}: {reason}")))?;
        // Only a regular file in a directory created here is certainly inside: linking to a
        // symbolic link, or through one, could reach anything.
        let in_our_dir =
            target.parent().is_none_or(|dir| dir.as_os_str().is_empty() || self.dirs.contains(dir));
        let is_extracted_file = !target.as_os_str().is_empty()
            && target != rel
            && in_our_dir
            && fs::symlink_metadata(self.root.join(&target)).is_ok_and(|meta| meta.is_file());
        if !is_extracted_file {
            let reason = format!("hard link to {shown:?} does not point to a file extracted before it");
            return Err(self.refuse(name, reason));
        }
        self.make_parents(rel, name)?;
        let path = self.root.join(rel);
        self.clear_slot(&path, false, name)?;
        fs::hard_link(self.root.join(&target), &path)
            .map_err(|source| Self::io_error(path, "create hard link", source))?;
        self.files += 1;
        Ok(())
    }
}

/// The entry name as a relative path of plain components, or why it is not one.
fn relative_path(name: &[u8]) -> Result<PathBuf, &'static str> {
    let mut rel = PathBuf::new();
    for component in Path::new(OsStr::from_bytes(name)).components() {
        match component {
            Component::Normal(part) => rel.push(part),
            Component::CurDir => {}
            Component::ParentDir => return Err("it has a `..` component"),
            Component::RootDir | Component::Prefix(_) => return Err("it is an absolute path"),
        }
    }
    Ok(rel)
}

/// Checks that a symbolic link at `link` (relative to the destination) with `target` resolves
/// inside the destination, however the links it passes through resolve.
///
/// Accepted targets are relative and have the form `../../a/b`: leading `..`s, no more than the
/// link's depth, then names. The `..`s climb real directories (every directory is one created
/// here), and each later name is a directory, a file, or a link that passed this same check, so
/// by induction the result stays inside. A `..` after a name (`a/../b`) would climb out of
/// wherever the link `a` leads, so it is refused rather than resolved.
fn check_symlink_target(link: &Path, target: &[u8]) -> Result<(), &'static str> {
    if target.is_empty() {
        return Err("has an empty target");
    }
    let depth = link.parent().map_or(0, |dir| dir.components().count());
    let mut ups = 0;
    let mut named = false;
    for component in Path::new(OsStr::from_bytes(target)).components() {
        match component {
            Component::RootDir | Component::Prefix(_) => return Err("points to an absolute path"),
            Component::CurDir => {}
            Component::ParentDir if named => {
                return Err("has `..` after a name, which cannot be checked without following links")
            }
            Component::ParentDir => {
                ups += 1;
                if ups > depth {
                    return Err("points outside the destination");
                }
            }
            Component::Normal(_) => named = true,
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use flate2::write::GzEncoder;
    use flate2::Compression;
    use tar::Header;

    /// A header for `name` written byte for byte, so that names `Header::set_path` rejects
    /// (absolute, `..`) can be built.
    fn header(name: &[u8], entry_type: EntryType, size: u64) -> Header {
        let mut header = Header::new_gnu();
        header.as_old_mut().name[..name.len()].copy_from_slice(name);
        header.set_entry_type(entry_type);
        header.set_size(size);
        header.set_mode(if entry_type == EntryType::Directory { 0o755 } else { 0o644 });
        header.set_mtime(1_700_000_000);
        header.set_cksum();
        header
    }

    fn link_header(name: &[u8], entry_type: EntryType, target: &[u8]) -> Header {
        let mut header = header(name, entry_type, 0);
        header.as_old_mut().linkname[..target.len()].copy_from_slice(target);
        header.set_cksum();
        header
    }

    /// One entry of a test archive: a header and its data.
    struct Item(Header, Vec<u8>);

    fn file(name: &str, data: &[u8]) -> Item {
        Item(header(name.as_bytes(), EntryType::Regular, data.len() as u64), data.to_vec())
    }

    fn dir(name: &str) -> Item {
        Item(header(name.as_bytes(), EntryType::Directory, 0), Vec::new())
    }

    fn symlink(name: &str, target: &str) -> Item {
        Item(link_header(name.as_bytes(), EntryType::Symlink, target.as_bytes()), Vec::new())
    }

    fn hard_link(name: &str, target: &str) -> Item {
        Item(link_header(name.as_bytes(), EntryType::Link, target.as_bytes()), Vec::new())
    }

    fn tar_bytes(items: &[Item]) -> Vec<u8> {
        let mut builder = tar::Builder::new(Vec::new());
        for Item(header, data) in items {
            builder.append(header, &data[..]).unwrap();
        }
        builder.into_inner().unwrap()
    }

    fn gzip(bytes: &[u8]) -> Vec<u8> {
        let mut encoder = GzEncoder::new(Vec::new(), Compression::fast());
        encoder.write_all(bytes).unwrap();
        encoder.finish().unwrap()
    }

    /// A scratch layout: `root/archive` and `root/outer/inner/dest`, with `outer` as the
    /// sentinel that must not change when an extraction fails.
    struct Scene {
        _root: tempfile::TempDir,
        archive: PathBuf,
        outer: PathBuf,
        dest: PathBuf,
    }

    fn scene(archive_bytes: &[u8]) -> Scene {
        let root = tempfile::tempdir().unwrap();
        let archive = root.path().join("archive");
        fs::write(&archive, archive_bytes).unwrap();
        let outer = root.path().join("outer");
        fs::create_dir_all(outer.join("inner")).unwrap();
        fs::write(outer.join("x"), b"target of hostile links").unwrap();
        let dest = outer.join("inner").join("dest");
        Scene { _root: root, archive, outer, dest }
    }

    /// Every path under `dir`, relative, with the content of files and targets of links.
    fn tree(dir: &Path) -> Vec<String> {
        fn walk(base: &Path, dir: &Path, out: &mut Vec<String>) {
            for entry in fs::read_dir(dir).unwrap() {
                let path = entry.unwrap().path();
                let rel = path.strip_prefix(base).unwrap().display().to_string();
                let meta = fs::symlink_metadata(&path).unwrap();
                if meta.file_type().is_symlink() {
                    out.push(format!("{rel} -> {}", fs::read_link(&path).unwrap().display()));
                } else if meta.is_dir() {
                    out.push(format!("{rel}/"));
                    walk(base, &path, out);
                } else {
                    out.push(format!("{rel} = {:?}", String::from_utf8_lossy(&fs::read(&path).unwrap())));
                }
            }
        }
        let mut out = Vec::new();
        walk(dir, dir, &mut out);
        out.sort();
        out
    }

    /// Extracts `items` as a plain tar and checks the failure left nothing anywhere; returns the
    /// error for the caller to inspect.
    fn refused(items: &[Item], limits: &ExtractLimits) -> ExtractError {
        refused_bytes(&tar_bytes(items), limits)
    }

    fn refused_bytes(bytes: &[u8], limits: &ExtractLimits) -> ExtractError {
        let scene = scene(bytes);
        let before = tree(&scene.outer);
        let err = extract(&scene.archive, &scene.dest, limits).unwrap_err();
        assert!(!scene.dest.exists(), "{err}");
        assert_eq!(tree(&scene.outer), before, "{err}");
        assert!(err.to_string().contains(&scene.archive.display().to_string()), "{err}");
        err
    }

    /// The entry names the error blames, and that it is a refusal.
    fn assert_refused(err: &ExtractError, entry: &str) {
        match err {
            ExtractError::Unsafe { entry: blamed, .. } => assert_eq!(blamed, entry, "{err}"),
            other => panic!("expected a refusal of {entry:?}, got {other:?}"),
        }
        assert!(err.to_string().contains(&format!("{entry:?}")), "{err}");
    }

    fn limits() -> ExtractLimits {
        ExtractLimits::default()
    }

    #[test]
    fn parent_dir_names_are_refused() {
        let err = refused(&[file("ok.txt", b"fine"), file("../evil", b"x")], &limits());
        assert_refused(&err, "../evil");
        let err = refused(&[file("a/../../evil", b"x")], &limits());
        assert_refused(&err, "a/../../evil");
        assert!(err.to_string().contains(".."), "{err}");
    }

    #[test]
    fn absolute_names_are_refused() {
        let err = refused(&[file("/abs/evil", b"x")], &limits());
        assert_refused(&err, "/abs/evil");
        assert!(err.to_string().contains("absolute"), "{err}");
    }

    #[test]
    fn symlinks_leaving_the_destination_are_refused() {
        assert_refused(&refused(&[symlink("link", "../../outside")], &limits()), "link");
        assert_refused(&refused(&[symlink("a/b/link", "../../../x")], &limits()), "a/b/link");
        assert_refused(&refused(&[symlink("link", "/etc/passwd")], &limits()), "link");
        // Inside lexically, but `a` may itself be a link, so `..` after it is not trusted.
        assert_refused(&refused(&[dir("a"), symlink("link", "a/../..")], &limits()), "link");
    }

    #[test]
    fn writing_through_a_symlink_is_refused() {
        // The link itself escapes and is refused first.
        let err = refused(&[symlink("link", ".."), file("link/evil", b"x")], &limits());
        assert_refused(&err, "link");
        // This link stays inside (it names the destination root), so it is accepted, but a
        // file beneath it must not be written through it.
        let err = refused(&[symlink("sub/link", ".."), file("sub/link/evil", b"x")], &limits());
        assert_refused(&err, "sub/link/evil");
        assert!(err.to_string().contains("symbolic link"), "{err}");
    }

    #[test]
    fn a_later_file_replaces_an_earlier_link_instead_of_writing_through_it() {
        let bytes = tar_bytes(&[file("b.txt", b"original"), symlink("f", "b.txt"), file("f", b"new")]);
        let scene = scene(&bytes);
        extract(&scene.archive, &scene.dest, &limits()).unwrap();
        assert_eq!(tree(&scene.dest), [r#"b.txt = "original""#, r#"f = "new""#]);
    }

    #[test]
    fn hard_links_outside_or_to_nothing_are_refused() {
        let err = refused(&[hard_link("hl", "../x")], &limits());
        assert_refused(&err, "hl");
        assert!(err.to_string().contains("../x"), "{err}");
        assert_refused(&refused(&[hard_link("hl", "/etc/passwd")], &limits()), "hl");
        assert_refused(&refused(&[hard_link("hl", "later.txt"), file("later.txt", b"x")], &limits()), "hl");
        // Through a link that stays inside, to a file that exists: still refused, since the
        // target is not where a file was extracted.
        let items = [file("real.txt", b"x"), symlink("alias", "."), hard_link("hl", "alias/real.txt")];
        assert_refused(&refused(&items, &limits()), "hl");
    }

    #[test]
    fn devices_and_fifos_are_refused() {
        let mut char_device = header(b"dev/null", EntryType::Char, 0);
        char_device.set_device_major(1).unwrap();
        char_device.set_device_minor(3).unwrap();
        char_device.set_cksum();
        let err = refused(&[Item(char_device, Vec::new())], &limits());
        assert_refused(&err, "dev/null");
        assert!(err.to_string().contains("device"), "{err}");

        let err =
            refused(&[file("ok", b"1"), Item(header(b"pipe", EntryType::Fifo, 0), Vec::new())], &limits());
        assert_refused(&err, "pipe");
        assert!(err.to_string().contains("FIFO"), "{err}");
    }

    #[test]
    fn too_many_entries_are_refused() {
        let items: Vec<Item> = (0..4).map(|i| file(&format!("f{i}"), b"x")).collect();
        let small = ExtractLimits { max_entries: 3, ..limits() };
        let err = refused(&items, &small);
        assert!(matches!(err, ExtractError::TooManyEntries { limit: 3, .. }), "{err:?}");
        // Exactly at the limit is fine.
        let scene = scene(&tar_bytes(&items[..3]));
        assert_eq!(extract(&scene.archive, &scene.dest, &small).unwrap().files, 3);
    }

    #[test]
    fn too_many_bytes_are_refused_before_writing() {
        // Two honest entries of 60 bytes against a 100-byte limit: the second is blamed.
        let small = ExtractLimits { max_bytes: 100, ..limits() };
        let err = refused(&[file("a", &[1; 60]), file("b", &[2; 60])], &small);
        assert!(matches!(&err, ExtractError::TooLarge { entry, limit: 100, .. } if entry == "b"), "{err:?}");

        // A header claiming a terabyte, with no data behind it: refused on the claim alone.
        let mut bytes = tar_bytes(&[]);
        let huge = header(b"huge.bin", EntryType::Regular, 1 << 40);
        bytes.splice(0..0, huge.as_bytes().iter().copied());
        let err = refused_bytes(&bytes, &limits());
        assert!(matches!(&err, ExtractError::TooLarge { entry, .. } if entry == "huge.bin"), "{err:?}");
    }

    #[test]
    fn oversized_extension_headers_are_refused_without_buffering_them() {
        let size = 2 * MAX_EXTENSION_HEADER;
        let long_name =
            Item(header(b"././@LongLink", EntryType::GNULongName, size), vec![b'a'; size as usize]);
        let err = refused(&[long_name, file("x", b"x")], &limits());
        assert!(matches!(err, ExtractError::ExtensionHeaderTooLarge { .. }), "{err:?}");
    }

    #[test]
    fn other_compressions_are_named_and_refused() {
        let err = refused_bytes(&[0x28, 0xb5, 0x2f, 0xfd, 0, 0, 0, 0], &limits());
        assert!(matches!(err, ExtractError::Unsupported { format: "zstd", .. }), "{err:?}");
        assert!(err.to_string().contains("zstd -d"), "{err}");
        let err = refused_bytes(b"BZh91AY&SY", &limits());
        assert!(matches!(err, ExtractError::Unsupported { format: "bzip2", .. }), "{err:?}");
    }

    #[test]
    fn not_an_archive_is_an_error_naming_it() {
        let err = refused_bytes(&[b'z'; 2048], &limits());
        assert!(matches!(err, ExtractError::Read { .. }), "{err:?}");
        let err = refused_bytes(b"", &limits());
        assert!(matches!(err, ExtractError::Empty { .. }), "{err:?}");
        // A good archive cut off in the middle of a file's data.
        let mut bytes = tar_bytes(&[file("big", &[7; 5000])]);
        bytes.truncate(512 + 3000);
        let err = refused_bytes(&bytes, &limits());
        let blamed = match &err {
            ExtractError::Truncated { entry, .. } | ExtractError::ReadEntry { entry, .. } => entry,
            other => panic!("expected a truncated entry, got {other:?}"),
        };
        assert_eq!(blamed, "big");
    }

    #[test]
    fn an_existing_destination_is_not_merged_into() {
        let scene = scene(&tar_bytes(&[file("new.txt", b"new")]));
        fs::create_dir(&scene.dest).unwrap();
        fs::write(scene.dest.join("old.txt"), b"old").unwrap();
        let before = tree(&scene.outer);
        let err = extract(&scene.archive, &scene.dest, &limits()).unwrap_err();
        assert!(matches!(err, ExtractError::Output(AtomicDirError::OutputExists { .. })), "{err:?}");
        assert!(err.to_string().contains(&scene.dest.display().to_string()), "{err}");
        assert_eq!(tree(&scene.outer), before);
    }

    fn good_archive() -> Vec<u8> {
        let mut script = header(b"bin/run.sh", EntryType::Regular, 10);
        script.set_mode(0o700);
        script.set_cksum();
        let mut private = header(b"a/b/c.txt", EntryType::Regular, 5);
        private.set_mode(0o600);
        private.set_cksum();
        tar_bytes(&[
            dir("./"),
            dir("a/"),
            Item(private, b"hello".to_vec()),
            file("a/d/e.txt", b"nested"),
            symlink("a/link", "b/c.txt"),
            symlink("a/d/up", "../b"),
            hard_link("a/hard", "a/b/c.txt"),
            Item(script, b"#!/bin/sh\n".to_vec()),
            dir("empty"),
        ])
    }

    fn check_good_extraction(compressed: bool) {
        let plain = good_archive();
        let scene = scene(&if compressed { gzip(&plain) } else { plain });
        let extracted = extract(&scene.archive, &scene.dest, &limits()).unwrap();

        assert_eq!(extracted, Extracted { files: 4, bytes: 5 + 6 + 10 });
        assert_eq!(
            tree(&scene.dest),
            [
                "a/",
                "a/b/",
                r#"a/b/c.txt = "hello""#,
                "a/d/",
                r#"a/d/e.txt = "nested""#,
                "a/d/up -> ../b",
                r#"a/hard = "hello""#,
                "a/link -> b/c.txt",
                "bin/",
                "bin/run.sh = \"#!/bin/sh\\n\"",
                "empty/",
            ]
        );
        // The links work.
        assert_eq!(fs::read(scene.dest.join("a/link")).unwrap(), b"hello");
        assert_eq!(fs::read(scene.dest.join("a/d/up/c.txt")).unwrap(), b"hello");
        let mode = |rel: &str| fs::metadata(scene.dest.join(rel)).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode("a/b/c.txt"), 0o644);
        assert_eq!(mode("bin/run.sh"), 0o755);
        assert_eq!(mode("a/d"), 0o755);
        assert_eq!(mode(""), 0o755);
        // The staging directory is gone: only `dest` is new.
        let inner: Vec<_> =
            fs::read_dir(scene.outer.join("inner")).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(inner, ["dest"]);
    }

    #[test]
    fn a_good_tar_extracts_completely() {
        check_good_extraction(false);
    }

    #[test]
    fn a_good_tar_gz_extracts_completely() {
        check_good_extraction(true);
    }

    #[test]
    fn symlink_target_rule() {
        let at = |link: &str, target: &str| check_symlink_target(Path::new(link), target.as_bytes());
        assert!(at("a/b/l", "../../x").is_ok());
        assert!(at("a/b/l", "./../c/./d").is_ok());
        assert!(at("l", ".").is_ok());
        assert!(at("a/b/l", "../../../x").is_err());
        assert!(at("l", "x/../y").is_err());
        assert!(at("l", "").is_err());
        assert!(at("l", "/x").is_err());
    }
}
