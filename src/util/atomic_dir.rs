//! Publishing a directory atomically: build in a temporary sibling, then rename into place.
//!
//! A writer asks [`staging_dir`] for a temporary directory next to its destination, fills it,
//! and hands it to [`publish`], which renames it onto the destination. Because the staging
//! directory is a sibling, the rename never crosses a filesystem boundary, so readers see either
//! nothing at the destination or the finished tree, never a half-written one; a writer that
//! fails or panics drops its [`TempDir`] and leaves nothing behind. The destination may be
//! absent or an empty directory; anything else there is refused rather than overwritten
//! ([`ensure_free`]).
//!
//! The synthetic dataset and the IDX import use this, and so should anything else that writes
//! a whole directory tree (dataset preparation, archive extraction).

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use tempfile::TempDir;

use super::io_error::IoError;

/// Why a directory could not be staged or published.
#[derive(Debug, thiserror::Error)]
pub enum AtomicDirError {
    /// The destination is there already, holding something we must not overwrite.
    #[error("{}: already exists and is not an empty directory; refusing to overwrite it", path.display())]
    OutputExists { path: PathBuf },
    /// A filesystem operation failed.
    #[error(transparent)]
    Io(#[from] IoError),
    /// Moving the finished staging directory onto the destination failed.
    #[error("cannot rename {} to {}", from.display(), to.display())]
    Rename {
        from: PathBuf,
        to: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// Creates `dest`'s parent directory if needed (the current directory for a bare name) and a
/// fresh temporary directory in it whose name starts with `prefix`, e.g. `".synth-"`.
///
/// The directory is removed again when the returned [`TempDir`] is dropped, unless it was
/// [`publish`]ed. A leading dot in `prefix` keeps it out of class-per-folder listings while it
/// exists.
pub fn staging_dir(dest: &Path, prefix: &str) -> Result<TempDir, AtomicDirError> {
    let parent = parent_of(dest);
    fs::create_dir_all(parent).map_err(IoError::at(parent, "create directory"))?;
    let staging = tempfile::Builder::new().prefix(prefix).tempdir_in(parent);
    Ok(staging.map_err(IoError::at(parent, "create a temporary directory in"))?)
}

/// OK when `dest` is absent or an empty directory, the two states [`publish`] may replace.
///
/// Worth calling before expensive work, so that an occupied destination fails fast; [`publish`]
/// checks again in any case.
pub fn ensure_free(dest: &Path) -> Result<(), AtomicDirError> {
    match fs::symlink_metadata(dest) {
        Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(IoError::at(dest, "inspect the output path")(source).into()),
        Ok(meta) if meta.is_dir() => {
            let mut entries = fs::read_dir(dest).map_err(IoError::at(dest, "list the output directory"))?;
            if entries.next().is_some() {
                Err(AtomicDirError::OutputExists { path: dest.to_path_buf() })
            } else {
                Ok(())
            }
        }
        // A file, or a symlink even to an empty directory: not ours to replace.
        Ok(_) => Err(AtomicDirError::OutputExists { path: dest.to_path_buf() }),
    }
}

/// Renames the finished staging directory `tmp` (from [`staging_dir`] for the same `dest`) onto
/// `dest`, making it world-readable (0755) first.
///
/// `dest` must be absent or an empty directory, which is replaced; otherwise this fails with
/// [`AtomicDirError::OutputExists`], leaves `dest` untouched and drops `tmp`, deleting it.
pub fn publish(tmp: TempDir, dest: &Path) -> Result<(), AtomicDirError> {
    // tempfile creates its directory 0700; a published tree should be as readable as any other
    // directory, e.g. for a container user with another uid.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(tmp.path(), fs::Permissions::from_mode(0o755))
            .map_err(IoError::at(tmp.path(), "set permissions on"))?;
    }
    // Checked again because building the tree takes a while and someone may have written there
    // since.
    ensure_free(dest)?;
    if dest.is_dir() {
        fs::remove_dir(dest).map_err(IoError::at(dest, "remove the empty output directory"))?;
    }
    fs::rename(tmp.path(), dest).map_err(|source| AtomicDirError::Rename {
        from: tmp.path().to_path_buf(),
        to: dest.to_path_buf(),
        source,
    })?;
    // The directory now lives at `dest`; disarm the cleanup that would look for it.
    let _ = tmp.keep();
    Ok(())
}

/// The directory `dest` lives in: its parent, or `.` for a bare name.
fn parent_of(dest: &Path) -> &Path {
    match dest.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    /// A staging directory for `dest` holding one file, `data.txt`.
    fn staged(dest: &Path) -> TempDir {
        let tmp = staging_dir(dest, ".test-").unwrap();
        assert_eq!(tmp.path().parent(), dest.parent());
        assert!(tmp.path().file_name().unwrap().to_string_lossy().starts_with(".test-"));
        fs::write(tmp.path().join("data.txt"), b"new").unwrap();
        tmp
    }

    #[test]
    fn publish_onto_absent_or_empty_dest_moves_the_tree_and_leaves_no_temp_dir() {
        let root = tempfile::tempdir().unwrap();
        // Absent, with a parent that does not exist yet either.
        let absent = root.path().join("nested").join("absent");
        publish(staged(&absent), &absent).unwrap();
        assert_eq!(fs::read(absent.join("data.txt")).unwrap(), b"new");
        assert_eq!(names(&root.path().join("nested")), ["absent"]);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = fs::metadata(&absent).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o755);
        }

        let empty = root.path().join("empty");
        fs::create_dir(&empty).unwrap();
        publish(staged(&empty), &empty).unwrap();
        assert_eq!(names(&empty), ["data.txt"]);
        assert_eq!(names(root.path()), ["empty", "nested"]);
    }

    #[test]
    fn publish_onto_non_empty_dest_is_refused_and_touches_nothing() {
        let root = tempfile::tempdir().unwrap();
        let dest = root.path().join("taken");
        fs::create_dir(&dest).unwrap();
        fs::write(dest.join("keep.txt"), b"precious").unwrap();
        // Fails fast before any staging, too.
        assert!(matches!(ensure_free(&dest), Err(AtomicDirError::OutputExists { .. })));

        let tmp = staged(&dest);
        let staged_path = tmp.path().to_path_buf();
        let err = publish(tmp, &dest).unwrap_err();
        assert!(matches!(err, AtomicDirError::OutputExists { .. }), "{err:?}");
        assert!(err.to_string().contains(&dest.display().to_string()), "{err}");
        // The destination keeps exactly what it had; the refused staging dir is cleaned up.
        assert_eq!(names(&dest), ["keep.txt"]);
        assert_eq!(fs::read(dest.join("keep.txt")).unwrap(), b"precious");
        assert!(!staged_path.exists());
        assert_eq!(names(root.path()), ["taken"]);
    }

    #[test]
    fn a_file_at_dest_is_refused() {
        let root = tempfile::tempdir().unwrap();
        let dest = root.path().join("file");
        fs::write(&dest, b"x").unwrap();
        let err = ensure_free(&dest).unwrap_err();
        assert!(matches!(err, AtomicDirError::OutputExists { .. }), "{err:?}");
        assert!(err.to_string().contains(&dest.display().to_string()), "{err}");
        let err = publish(staged(&dest), &dest).unwrap_err();
        assert!(matches!(err, AtomicDirError::OutputExists { .. }), "{err:?}");
        assert_eq!(fs::read(&dest).unwrap(), b"x");
        assert_eq!(names(root.path()), ["file"]);
    }

    #[test]
    fn bare_name_stages_in_the_current_directory() {
        assert_eq!(parent_of(Path::new("out")), Path::new("."));
        assert_eq!(parent_of(Path::new("a/out")), Path::new("a"));
        assert_eq!(parent_of(Path::new("/out")), Path::new("/"));
    }
}
