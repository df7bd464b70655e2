//! The one error for a failed filesystem operation, shared by the tools that write trees and
//! files (atomic directories, downloads, archive extraction, the synthetic set, IDX import):
//! which path, what was being done to it, and the operating system's reason as its source.
//! Each tool's error enum wraps it transparently, so the message reads the same everywhere.

use std::io;
use std::path::{Path, PathBuf};

/// A filesystem operation on `path` failed; shown as `PATH: cannot ACTION`, with the OS error
/// as its source (printed after it by `{:#}`).
#[derive(Debug, thiserror::Error)]
#[error("{}: cannot {action}", path.display())]
pub struct IoError {
    pub path: PathBuf,
    /// What was being done, as a verb phrase: "write", "create directory".
    pub action: &'static str,
    #[source]
    pub source: io::Error,
}

impl IoError {
    /// A `map_err` adapter: `fs::write(&path, bytes).map_err(IoError::at(&path, "write"))?`.
    pub fn at<'a>(path: &'a Path, action: &'static str) -> impl FnOnce(io::Error) -> IoError + 'a {
        move |source| IoError { path: path.to_path_buf(), action, source }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_the_path_and_the_action_and_keeps_the_cause() {
        let error =
            IoError::at(Path::new("/data/out"), "create directory")(io::Error::from(io::ErrorKind::NotFound));
        assert_eq!(error.to_string(), "/data/out: cannot create directory");
        let cause = std::error::Error::source(&error).expect("the OS error is the source");
        assert_eq!(cause.to_string(), io::Error::from(io::ErrorKind::NotFound).to_string());
    }
}
