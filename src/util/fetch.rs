//! Downloads: `rtrain data fetch URL --sha256 HEX OUT`.
//!
//! This module owns getting one file from an HTTP(S) server onto disk such that the final name
//! only ever holds the exact bytes the caller vouched for with a sha256. The body streams into
//! `OUT.part` beside `OUT` while it is hashed, so a dataset archive far larger than memory is
//! fine; an interrupted transfer, from a dropped connection now or a killed run earlier, resumes
//! with a `Range` request from what `OUT.part` already holds. Only a complete body whose digest
//! matches is fsynced and renamed onto `OUT`, so a wrong checksum, a truncated body or an HTTP
//! error never leaves a file under the final name. An `OUT.part` that is not a regular file (a
//! planted symbolic link, which would have the download written into the file it points to
//! and then become `OUT`) is refused, never written through.
//!
//! Plain http is refused unless the host is loopback or the caller opts in: the digest protects
//! the content either way, but not the privacy of what is fetched, and an opt-in makes that a
//! decision rather than an accident.

use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter, IsTerminal, Read, Write};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::thread;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use reqwest::blocking::{Client, Response};
use reqwest::header::{CONTENT_RANGE, RANGE, RETRY_AFTER};
use reqwest::{StatusCode, Url};
use sha2::{Digest, Sha256};

use super::io_error::IoError;

/// How [`fetch`] downloads and checks one file.
#[derive(Debug, Clone)]
pub struct FetchOptions {
    /// The expected sha256 of the whole file: 64 hexadecimal digits (or, with
    /// `sha256_prefix`, its first digits).
    pub sha256: String,
    /// torch.hub's check: `sha256` is only the start of the digest (at least 8 hexadecimal
    /// digits), as in the names of torchvision's weight files (`resnet34-b627a593.pth`).
    pub sha256_prefix: bool,
    /// Allow plain http to a host that is not loopback.
    pub allow_http: bool,
    /// Retries after a failed attempt. Only failures in a row count: an attempt that adds to
    /// the partial file starts the count again, so a long download over a flaky link keeps
    /// going while it makes progress.
    pub retries: u32,
    /// Draw a progress bar when stderr is a terminal (otherwise progress is logged).
    pub progress: bool,
    /// How long to wait for a connection, for the response headers and for each read of the
    /// body; a stalled transfer fails after this and is retried.
    pub timeout: Duration,
    /// The first pause before a retry; it doubles with each failure in a row, up to
    /// [`MAX_BACKOFF`].
    pub backoff: Duration,
    /// The file's size in bytes, when known: a server announcing another size is refused, a
    /// body that runs past it is cut off (an endless body cannot fill the disk), and a partial
    /// download longer than it is discarded.
    pub size: Option<u64>,
}

impl Default for FetchOptions {
    fn default() -> Self {
        FetchOptions {
            sha256: String::new(),
            sha256_prefix: false,
            allow_http: false,
            retries: 5,
            progress: true,
            timeout: Duration::from_secs(60),
            backoff: Duration::from_millis(500),
            size: None,
        }
    }
}

/// What [`fetch`] left on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fetched {
    /// The verified file: the `out` that was asked for.
    pub path: PathBuf,
    /// Its size.
    pub bytes: u64,
    /// How many bytes were already on disk when the attempt that completed the file started:
    /// 0 for a fresh download, all of them when `out` was already there.
    pub resumed_from: u64,
    /// HTTP requests made, the successful one included; 0 when `out` was already there.
    pub attempts: u32,
}

/// The longest pause between retries.
pub const MAX_BACKOFF: Duration = Duration::from_secs(8);
/// The longest a server's `Retry-After` is honoured; a longer one is a hint to try another day.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);
/// Hops followed before a redirect loop is called one.
const MAX_REDIRECTS: usize = 10;
/// Read and write granularity; large enough that syscalls are not the bottleneck.
const CHUNK: usize = 256 * 1024;
/// A transfer that brings fewer than this many bytes per second over a whole
/// [`FetchOptions::timeout`] has stalled (curl's `--speed-limit` over `--speed-time`): a server
/// trickling a byte a second never trips a read timeout.
pub const MIN_BYTES_PER_SECOND: u64 = 1024;
/// Without a known size, a progress line is logged every this many bytes.
const LOG_EVERY_UNSIZED: u64 = 512 * 1024 * 1024;

/// Why a download failed. Each message names the URL or file involved.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("--sha256 {value:?}: expected 64 hexadecimal digits (a prefix of 8 or more where allowed)")]
    InvalidSha256 { value: String },
    #[error("{url}: not a valid URL ({reason})")]
    InvalidUrl { url: String, reason: String },
    #[error(
        "{url}: unsupported scheme {scheme:?}; only https (and http to loopback, or with \
         --allow-http) can be fetched"
    )]
    UnsupportedScheme { url: String, scheme: String },
    #[error(
        "{url}: refusing plain http to a host that is not loopback; use https, or pass --allow-http \
         to accept an unencrypted transfer (the sha256 check still guards the content)"
    )]
    InsecureHttp { url: String },
    #[error("{}: the output path must name a file", path.display())]
    OutputNotAFile { path: PathBuf },
    #[error(
        "{}: already exists with sha256 {actual}, not the expected {expected}; \
         remove it to download again, or check --sha256",
        path.display()
    )]
    ExistingMismatch { path: PathBuf, expected: String, actual: String },
    #[error("cannot set up the HTTP client")]
    Client {
        #[source]
        source: reqwest::Error,
    },
    #[error("{url}: cannot build the request")]
    Request {
        url: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("{url}: redirect refused")]
    Redirect {
        url: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("{url}: server answered {status}")]
    HttpStatus { url: String, status: StatusCode },
    #[error("{url}: server still answered {status} after {attempts} attempts")]
    ServerUnavailable { url: String, status: StatusCode, attempts: u32 },
    #[error("{url}: giving up after {attempts} attempts")]
    Network {
        url: String,
        attempts: u32,
        #[source]
        source: reqwest::Error,
    },
    #[error("{url}: the transfer kept breaking off; giving up after {attempts} attempts")]
    Interrupted {
        url: String,
        attempts: u32,
        #[source]
        source: io::Error,
    },
    #[error("{url}: download incomplete after {attempts} attempts: {have} of {expected} bytes arrived")]
    Incomplete { url: String, attempts: u32, have: u64, expected: u64 },
    #[error("{url}: asked for bytes from {start} on, but the server answered Content-Range {value:?}")]
    BadContentRange { url: String, start: u64, value: String },
    #[error(
        "{url}: the transfer stalled (fewer than {MIN_BYTES_PER_SECOND} bytes/s for {window:?}) in each of \
         {attempts} attempts; what arrived stays in {} for a later resume (delete it to start over)",
        part.display()
    )]
    Stalled { url: String, attempts: u32, window: Duration, part: PathBuf },
    #[error("{url}: the server announces {announced} bytes, not the expected {size} (--size)")]
    SizeMismatch { url: String, size: u64, announced: u64 },
    #[error("{url}: the server sent more than the expected {size} bytes (--size); the partial download was deleted")]
    TooLong { url: String, size: u64 },
    #[error(
        "{}: the disk filled after {bytes} bytes; the partial download was deleted. Free space (or fetch \
         onto another disk) and fetch again",
        path.display()
    )]
    DiskFull { path: PathBuf, bytes: u64 },
    #[error("{url}: sha256 mismatch: expected {expected}, got {actual}; the downloaded data was deleted")]
    ChecksumMismatch { url: String, expected: String, actual: String },
    #[error(
        "{}: {what}, not a partial download rtrain wrote: nothing is written through it; remove it and fetch again",
        part.display()
    )]
    PartNotAFile { part: PathBuf, what: &'static str },
    /// A filesystem operation failed.
    #[error(transparent)]
    Io(#[from] IoError),
}

/// Downloads `url` to `out`, verifying it against `options.sha256`; see the module docs.
///
/// Returns at once, without a request, when `out` already holds the expected content, and
/// refuses to replace an `out` that holds anything else.
pub fn fetch(url: &str, out: &Path, options: &FetchOptions) -> Result<Fetched, FetchError> {
    let expected = parse_sha256(&options.sha256, options.sha256_prefix)?;
    let parsed = check_url(url, options.allow_http)?;
    let part = part_path(out)?;

    if let Some(bytes) = verify_existing(out, &expected)? {
        tracing::info!(path = %out.display(), bytes, "already downloaded and verified");
        return Ok(Fetched { path: out.to_path_buf(), bytes, resumed_from: bytes, attempts: 0 });
    }
    let dir = parent_dir(out);
    fs::create_dir_all(dir).map_err(IoError::at(dir, "create directory"))?;

    let client = build_client(&parsed, options)?;
    let mut download = Download {
        url,
        client: &client,
        part: PartFile::new(part),
        progress: Progress::new(options.progress, url),
        size: options.size,
        stall_window: options.timeout,
    };
    tracing::info!(url, out = %out.display(), "downloading");

    let mut attempts = 0u32;
    // Failures in a row, counted from the last one that grew the partial file past `high_water`.
    let mut stalled = 0u32;
    let mut high_water = download.part.len_on_disk()?;
    if let Some(size) = options.size.filter(|&size| high_water > size) {
        tracing::warn!(part = %download.part.path.display(), on_disk = high_water, size, "partial download is longer than the file; starting over");
        download.part.discard()?;
        high_water = 0;
    }
    loop {
        attempts += 1;
        let failure = match download.attempt() {
            Ok(Attempt::Complete { resumed_from }) => {
                download.progress.finish();
                let bytes = download.part.publish(url, out, &expected)?;
                tracing::info!(url, out = %out.display(), bytes, attempts, "downloaded and verified");
                return Ok(Fetched { path: out.to_path_buf(), bytes, resumed_from, attempts });
            }
            // Not a failure of the transfer: the next attempt starts afresh without a pause.
            Ok(Attempt::Restart) => continue,
            Err(AttemptError::Fatal(err)) => {
                download.progress.abandon();
                return Err(err);
            }
            Err(AttemptError::Transient(failure)) => failure,
        };

        let on_disk = download.part.len_on_disk()?;
        // A stalled attempt grows the part a little, and must still count, or a trickling
        // server would be retried for ever.
        let too_slow = matches!(failure.kind, TransientKind::TooSlow { .. });
        if on_disk > high_water && !too_slow {
            stalled = 1;
        } else {
            stalled += 1;
        }
        high_water = high_water.max(on_disk);
        if stalled > options.retries {
            download.progress.abandon();
            return Err(failure.kind.into_error(url, attempts));
        }
        let delay = backoff(options.backoff, stalled).max(failure.retry_after.unwrap_or_default());
        tracing::warn!(url, attempt = attempts, error = %failure.kind, "retrying in {delay:?}");
        thread::sleep(delay);
    }
}

/// The pause before retry number `failures` (1-based) in a row: `base`, doubling, capped.
fn backoff(base: Duration, failures: u32) -> Duration {
    let factor = 1u32 << failures.saturating_sub(1).min(16);
    base.saturating_mul(factor).min(MAX_BACKOFF.max(base))
}

/// Checks and lower-cases the expected digest: 64 hexadecimal digits, or, as a `prefix`, 8 to 64.
fn parse_sha256(value: &str, prefix: bool) -> Result<String, FetchError> {
    let length_ok = if prefix { (8..=64).contains(&value.len()) } else { value.len() == 64 };
    if length_ok && value.bytes().all(|b| b.is_ascii_hexdigit()) {
        Ok(value.to_ascii_lowercase())
    } else {
        Err(FetchError::InvalidSha256 { value: value.to_string() })
    }
}

/// Parses `url` and applies the scheme policy. Pure: no name lookup, no connection.
fn check_url(url: &str, allow_http: bool) -> Result<Url, FetchError> {
    let parsed = Url::parse(url)
        .map_err(|err| FetchError::InvalidUrl { url: url.to_string(), reason: err.to_string() })?;
    match parsed.scheme() {
        "https" => Ok(parsed),
        "http" if allow_http || is_loopback(&parsed) => Ok(parsed),
        "http" => Err(FetchError::InsecureHttp { url: url.to_string() }),
        scheme => Err(FetchError::UnsupportedScheme { url: url.to_string(), scheme: scheme.to_string() }),
    }
}

/// Whether `url` names this machine, where plain http crosses no network.
fn is_loopback(url: &Url) -> bool {
    let Some(host) = url.host_str() else { return false };
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    match bare.parse::<IpAddr>() {
        Ok(ip) => ip.is_loopback(),
        Err(_) => bare.eq_ignore_ascii_case("localhost") || bare.eq_ignore_ascii_case("localhost."),
    }
}

/// `OUT.part`, beside `OUT` so that the final rename stays on one filesystem.
fn part_path(out: &Path) -> Result<PathBuf, FetchError> {
    let Some(name) = out.file_name() else {
        return Err(FetchError::OutputNotAFile { path: out.to_path_buf() });
    };
    let mut part = name.to_os_string();
    part.push(".part");
    Ok(out.with_file_name(part))
}

/// The directory `path` lives in: its parent, or `.` for a bare name.
fn parent_dir(path: &Path) -> &Path {
    match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    }
}

/// `Some(size)` when `out` exists with the expected digest, `None` when it does not exist.
fn verify_existing(out: &Path, expected: &str) -> Result<Option<u64>, FetchError> {
    let mut file = match File::open(out) {
        Ok(file) => file,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(IoError::at(out, "open the existing output")(source).into()),
    };
    let is_file = file.metadata().map(|meta| meta.is_file()).unwrap_or(false);
    if !is_file {
        return Err(FetchError::OutputNotAFile { path: out.to_path_buf() });
    }
    let mut hasher = Sha256::new();
    let bytes = hash_into(&mut file, &mut hasher).map_err(IoError::at(out, "read the existing output"))?;
    let actual = hex::encode(hasher.finalize());
    if actual.starts_with(expected) {
        Ok(Some(bytes))
    } else {
        Err(FetchError::ExistingMismatch { path: out.to_path_buf(), expected: expected.to_string(), actual })
    }
}

/// Feeds all of `reader` to `hasher`, returning how many bytes that was.
fn hash_into(reader: &mut impl Read, hasher: &mut Sha256) -> io::Result<u64> {
    let mut buf = vec![0u8; CHUNK];
    let mut total = 0u64;
    loop {
        match reader.read(&mut buf) {
            Ok(0) => return Ok(total),
            Ok(n) => {
                hasher.update(&buf[..n]);
                total += n as u64;
            }
            Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
            Err(err) => return Err(err),
        }
    }
}

fn build_client(url: &Url, options: &FetchOptions) -> Result<Client, FetchError> {
    let allow_http = options.allow_http;
    // The scheme policy holds for every hop, or a redirect could quietly downgrade to http.
    let redirects = reqwest::redirect::Policy::custom(move |attempt| {
        if attempt.previous().len() >= MAX_REDIRECTS {
            attempt.error(format!("more than {MAX_REDIRECTS} redirects"))
        } else {
            let target = attempt.url().to_string();
            match check_url(&target, allow_http) {
                Ok(_) => attempt.follow(),
                Err(err) => attempt.error(err.to_string()),
            }
        }
    });
    let mut builder = Client::builder()
        .user_agent(concat!("rtrain/", env!("CARGO_PKG_VERSION")))
        // The blocking client applies this to waiting for the headers and to each body read,
        // not to the whole transfer, which may rightly take hours.
        .timeout(options.timeout)
        .connect_timeout(options.timeout)
        .redirect(redirects);
    if is_loopback(url) {
        // A proxy from the environment cannot reach this machine's loopback.
        builder = builder.no_proxy();
    }
    builder.build().map_err(|source| FetchError::Client { source })
}

/// One download in progress: the request side and the partial file.
struct Download<'a> {
    url: &'a str,
    client: &'a Client,
    part: PartFile,
    progress: Progress,
    /// [`FetchOptions::size`].
    size: Option<u64>,
    /// The window of [`MIN_BYTES_PER_SECOND`]: [`FetchOptions::timeout`].
    stall_window: Duration,
}

/// How an attempt that did not fail ended.
enum Attempt {
    /// The partial file holds the whole body; `resumed_from` bytes were there before.
    Complete { resumed_from: u64 },
    /// The partial file was stale and has been discarded; start again from zero.
    Restart,
}

enum AttemptError {
    /// Worth retrying: the next attempt resumes from what is on disk.
    Transient(Transient),
    /// Retrying cannot help.
    Fatal(FetchError),
}

struct Transient {
    kind: TransientKind,
    /// The server's own `Retry-After`, if it gave one.
    retry_after: Option<Duration>,
}

enum TransientKind {
    Network(reqwest::Error),
    Status(StatusCode),
    /// The body broke off (with a read error, or a clean close) before `expected` bytes.
    Truncated {
        have: u64,
        expected: u64,
    },
    /// The body broke off and its length was never announced.
    Body(io::Error),
    /// Fewer than [`MIN_BYTES_PER_SECOND`] arrived over a whole `window`.
    TooSlow {
        window: Duration,
        part: PathBuf,
    },
}

impl std::fmt::Display for TransientKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TransientKind::Network(err) => write!(f, "{err}"),
            TransientKind::Status(status) => write!(f, "server answered {status}"),
            TransientKind::Truncated { have, expected } => {
                write!(f, "body ended early: {have} of {expected} bytes on disk")
            }
            TransientKind::Body(err) => write!(f, "body read failed: {err}"),
            TransientKind::TooSlow { window, .. } => {
                write!(f, "fewer than {MIN_BYTES_PER_SECOND} bytes/s for {window:?}")
            }
        }
    }
}

impl TransientKind {
    fn into_error(self, url: &str, attempts: u32) -> FetchError {
        let url = url.to_string();
        match self {
            TransientKind::Network(source) => FetchError::Network { url, attempts, source },
            TransientKind::Status(status) => FetchError::ServerUnavailable { url, status, attempts },
            TransientKind::Truncated { have, expected } => {
                FetchError::Incomplete { url, attempts, have, expected }
            }
            TransientKind::Body(source) => FetchError::Interrupted { url, attempts, source },
            TransientKind::TooSlow { window, part } => FetchError::Stalled { url, attempts, window, part },
        }
    }
}

impl From<TransientKind> for AttemptError {
    fn from(kind: TransientKind) -> Self {
        AttemptError::Transient(Transient { kind, retry_after: None })
    }
}

impl From<FetchError> for AttemptError {
    fn from(err: FetchError) -> Self {
        AttemptError::Fatal(err)
    }
}

impl Download<'_> {
    /// One request: resumes from whatever the partial file holds.
    fn attempt(&mut self) -> Result<Attempt, AttemptError> {
        let start = self.part.len_on_disk()?;
        let mut request = self.client.get(self.url);
        if start > 0 {
            request = request.header(RANGE, format!("bytes={start}-"));
        }
        let response = request.send().map_err(|err| self.classify(err))?;
        let status = response.status();
        match status {
            StatusCode::OK => {
                // A full body: either nothing was on disk or the server ignored the Range.
                let file = self.part.restart()?;
                let total = response.content_length();
                self.check_size(total)?;
                self.stream(response, file, 0, total)?;
                Ok(Attempt::Complete { resumed_from: 0 })
            }
            StatusCode::PARTIAL_CONTENT if start > 0 => {
                let total = self.check_content_range(&response, start)?;
                self.check_size(total)?;
                let file = self.part.append(start)?;
                self.stream(response, file, start, total)?;
                Ok(Attempt::Complete { resumed_from: start })
            }
            StatusCode::RANGE_NOT_SATISFIABLE if start > 0 => {
                // Nothing after `start`: the part is complete, unless the server says the file
                // is shorter than what we hold, in which case what we hold is not this file.
                match content_range_total(&response) {
                    Some(total) if total != start => {
                        tracing::warn!(
                            url = self.url,
                            on_disk = start,
                            remote = total,
                            "partial download is longer than the remote file; starting over"
                        );
                        self.part.discard()?;
                        Ok(Attempt::Restart)
                    }
                    _ => Ok(Attempt::Complete { resumed_from: start }),
                }
            }
            StatusCode::REQUEST_TIMEOUT | StatusCode::TOO_MANY_REQUESTS => Err(self.busy(&response)),
            status if status.is_server_error() => Err(self.busy(&response)),
            status => Err(FetchError::HttpStatus { url: self.url.to_string(), status }.into()),
        }
    }

    /// Refuses a file the server announces at another size than `--size` says.
    fn check_size(&self, announced: Option<u64>) -> Result<(), FetchError> {
        match (self.size, announced) {
            (Some(size), Some(announced)) if size != announced => {
                Err(FetchError::SizeMismatch { url: self.url.to_string(), size, announced })
            }
            _ => Ok(()),
        }
    }

    /// A failed write to the partial file; a full disk deletes it (resuming cannot help until
    /// space is freed, and an endless body would otherwise stay behind filling it).
    fn write_failed(&mut self, written: u64, source: io::Error) -> AttemptError {
        if source.raw_os_error() == Some(libc::ENOSPC) {
            let path = self.part.path.clone();
            return match self.part.discard() {
                Ok(()) => FetchError::DiskFull { path, bytes: written }.into(),
                Err(err) => err.into(),
            };
        }
        self.part.io_error("write", source).into()
    }

    fn classify(&self, err: reqwest::Error) -> AttemptError {
        let url = self.url.to_string();
        if err.is_redirect() {
            AttemptError::Fatal(FetchError::Redirect { url, source: err })
        } else if err.is_builder() {
            AttemptError::Fatal(FetchError::Request { url, source: err })
        } else {
            TransientKind::Network(err).into()
        }
    }

    /// A status that says "not now": retried, after the server's `Retry-After` if it gave one.
    fn busy(&self, response: &Response) -> AttemptError {
        let retry_after = response
            .headers()
            .get(RETRY_AFTER)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.trim().parse::<u64>().ok())
            .map(|secs| Duration::from_secs(secs).min(MAX_RETRY_AFTER));
        AttemptError::Transient(Transient { kind: TransientKind::Status(response.status()), retry_after })
    }

    /// The file's total size from a 206's `Content-Range: bytes START-END/TOTAL`, after checking
    /// that the range starts where the partial file ends.
    fn check_content_range(&self, response: &Response, start: u64) -> Result<Option<u64>, FetchError> {
        let value = response.headers().get(CONTENT_RANGE).and_then(|v| v.to_str().ok()).unwrap_or("");
        let bad =
            || FetchError::BadContentRange { url: self.url.to_string(), start, value: value.to_string() };
        let (range, total) =
            value.strip_prefix("bytes ").and_then(|rest| rest.split_once('/')).ok_or_else(bad)?;
        let (first, last) = range.split_once('-').ok_or_else(bad)?;
        let first: u64 = first.trim().parse().map_err(|_| bad())?;
        let last: u64 = last.trim().parse().map_err(|_| bad())?;
        if first != start || last < first {
            return Err(bad());
        }
        match total.trim() {
            "*" => Ok(Some(last + 1)),
            total => {
                let total: u64 = total.parse().map_err(|_| bad())?;
                if total != last + 1 {
                    return Err(bad());
                }
                Ok(Some(total))
            }
        }
    }

    /// Copies the body to the partial file, hashing as it goes. `total` is the size the whole
    /// file should reach, when the server said.
    fn stream(
        &mut self,
        mut body: Response,
        file: File,
        start: u64,
        total: Option<u64>,
    ) -> Result<(), AttemptError> {
        self.progress.start(start, total);
        let mut writer = BufWriter::with_capacity(4 * CHUNK, file);
        let mut buf = vec![0u8; CHUNK];
        let mut len = start;
        let (mut window_start, mut window_from) = (Instant::now(), start);
        let broke_off = loop {
            match body.read(&mut buf) {
                Ok(0) => break None,
                Ok(n) => {
                    if self.size.is_some_and(|size| len + n as u64 > size) {
                        let size = self.size.unwrap_or_default();
                        drop(writer);
                        self.part.discard()?;
                        return Err(FetchError::TooLong { url: self.url.to_string(), size }.into());
                    }
                    self.part.hasher.update(&buf[..n]);
                    if let Err(source) = writer.write_all(&buf[..n]) {
                        drop(writer);
                        return Err(self.write_failed(len, source));
                    }
                    len += n as u64;
                    self.progress.update(len);
                    if window_start.elapsed() >= self.stall_window {
                        let minimum = MIN_BYTES_PER_SECOND.saturating_mul(self.stall_window.as_secs().max(1));
                        if len - window_from < minimum {
                            break Some(BrokeOff::TooSlow);
                        }
                        (window_start, window_from) = (Instant::now(), len);
                    }
                }
                Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
                Err(err) => break Some(BrokeOff::Error(err)),
            }
        };
        // Whatever was hashed must be on disk, so that the next attempt can resume from it.
        if let Err(source) = writer.flush() {
            drop(writer);
            return Err(self.write_failed(len, source));
        }
        self.part.hashed_len = Some(len);
        match (broke_off, total) {
            (Some(BrokeOff::TooSlow), _) => {
                Err(TransientKind::TooSlow { window: self.stall_window, part: self.part.path.clone() }.into())
            }
            (_, Some(expected)) if len < expected => {
                Err(TransientKind::Truncated { have: len, expected }.into())
            }
            (Some(BrokeOff::Error(err)), None) => Err(TransientKind::Body(err).into()),
            // A read error after the announced length arrived cannot have cost any content.
            _ => Ok(()),
        }
    }
}

/// Why a body stopped before its end.
enum BrokeOff {
    Error(io::Error),
    /// Slower than [`MIN_BYTES_PER_SECOND`] over a whole stall window.
    TooSlow,
}

/// TOTAL from a `Content-Range: bytes */TOTAL` (or any other form) header, if there is one.
fn content_range_total(response: &Response) -> Option<u64> {
    let value = response.headers().get(CONTENT_RANGE)?.to_str().ok()?;
    value.rsplit_once('/')?.1.trim().parse().ok()
}

/// `OUT.part` and the digest of what it holds.
struct PartFile {
    path: PathBuf,
    /// The digest state after exactly `hashed_len` bytes of the file, when that is known;
    /// kept across attempts so that resuming does not re-read the whole part.
    hasher: Sha256,
    hashed_len: Option<u64>,
}

impl PartFile {
    fn new(path: PathBuf) -> Self {
        PartFile { path, hasher: Sha256::new(), hashed_len: None }
    }

    fn io_error(&self, action: &'static str, source: io::Error) -> FetchError {
        IoError::at(&self.path, action)(source).into()
    }

    /// The bytes the part holds. Anything but a regular file under the name is refused: a
    /// symbolic link planted as `OUT.part` would have the download written into the file it
    /// points to, and then be renamed onto `OUT` (and a FIFO would block the write for ever).
    fn len_on_disk(&self) -> Result<u64, FetchError> {
        match fs::symlink_metadata(&self.path) {
            Ok(meta) if meta.file_type().is_symlink() => {
                Err(FetchError::PartNotAFile { part: self.path.clone(), what: "a symbolic link" })
            }
            Ok(meta) => match crate::util::files::not_regular(&meta) {
                None => Ok(meta.len()),
                Some(what) => Err(FetchError::PartNotAFile { part: self.path.clone(), what }),
            },
            Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(0),
            Err(source) => Err(self.io_error("inspect the partial download", source)),
        }
    }

    /// The part opened by `options`, never through a symbolic link (one that appeared since
    /// [`PartFile::len_on_disk`] looked is an error, `ELOOP`).
    fn open(&self, options: &mut OpenOptions, action: &'static str) -> Result<File, FetchError> {
        use std::os::unix::fs::OpenOptionsExt;
        options
            .custom_flags(libc::O_NOFOLLOW)
            .open(&self.path)
            .map_err(|source| self.io_error(action, source))
    }

    /// Empties the part for a full body.
    fn restart(&mut self) -> Result<File, FetchError> {
        let file = self.open(OpenOptions::new().write(true).create(true).truncate(true), "create")?;
        self.hasher = Sha256::new();
        self.hashed_len = Some(0);
        Ok(file)
    }

    /// Opens the part to append after its first `start` bytes, bringing the digest up to them.
    fn append(&mut self, start: u64) -> Result<File, FetchError> {
        self.catch_up(start)?;
        self.open(OpenOptions::new().append(true), "open")
    }

    /// Makes `hasher` cover the first `len` bytes on disk, re-reading them unless it already
    /// does (the part was left by an earlier run, or an attempt wrote less than it hashed).
    fn catch_up(&mut self, len: u64) -> Result<(), FetchError> {
        if self.hashed_len == Some(len) {
            return Ok(());
        }
        let mut file = self.open(OpenOptions::new().read(true), "open")?;
        let mut hasher = Sha256::new();
        let read = hash_into(&mut (&mut file).take(len), &mut hasher)
            .map_err(|source| self.io_error("read", source))?;
        if read != len {
            let source = io::Error::new(io::ErrorKind::UnexpectedEof, "the file shrank while being read");
            return Err(self.io_error("read", source));
        }
        self.hasher = hasher;
        self.hashed_len = Some(len);
        Ok(())
    }

    fn discard(&mut self) -> Result<(), FetchError> {
        self.hasher = Sha256::new();
        self.hashed_len = None;
        match fs::remove_file(&self.path) {
            Ok(()) => Ok(()),
            Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(self.io_error("remove", source)),
        }
    }

    /// Verifies the complete part against `expected` and renames it onto `out` durably; a
    /// mismatch deletes the part, since resuming from bad bytes would only fail again.
    fn publish(&mut self, url: &str, out: &Path, expected: &str) -> Result<u64, FetchError> {
        let len = self.len_on_disk()?;
        self.catch_up(len)?;
        let actual = hex::encode(std::mem::take(&mut self.hasher).finalize());
        // A whole digest or, for torch.hub's convention, its first digits.
        if !actual.starts_with(expected) {
            self.discard()?;
            return Err(FetchError::ChecksumMismatch {
                url: url.to_string(),
                expected: expected.to_string(),
                actual,
            });
        }
        File::open(&self.path)
            .and_then(|file| file.sync_all())
            .map_err(|source| self.io_error("flush to disk", source))?;
        fs::rename(&self.path, out).map_err(IoError::at(out, "move the verified download into place at"))?;
        // The rename itself is only durable once the directory entry is.
        let dir = parent_dir(out);
        File::open(dir)
            .and_then(|dir| dir.sync_all())
            .map_err(IoError::at(dir, "flush directory to disk"))?;
        Ok(len)
    }
}

/// Progress for a human at a terminal, or a light log trail for everyone else.
enum Progress {
    Bar(ProgressBar),
    Log { url: String, total: Option<u64>, next_log: u64 },
}

impl Progress {
    fn new(progress: bool, url: &str) -> Self {
        if progress && io::stderr().is_terminal() {
            Progress::Bar(ProgressBar::no_length())
        } else {
            Progress::Log { url: url.to_string(), total: None, next_log: 0 }
        }
    }

    /// A new attempt starts at `position` of `total` bytes.
    fn start(&mut self, position: u64, total: Option<u64>) {
        match self {
            Progress::Bar(bar) => {
                let template = match total {
                    Some(total) => {
                        bar.set_length(total);
                        "{bar:40} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}"
                    }
                    None => "{spinner} {bytes} {bytes_per_sec}",
                };
                if let Ok(style) = ProgressStyle::with_template(template) {
                    bar.set_style(style);
                }
                bar.reset_eta();
                bar.set_position(position);
            }
            Progress::Log { total: logged_total, next_log, .. } => {
                *logged_total = total;
                *next_log = Self::next_mark(position, total);
            }
        }
    }

    fn update(&mut self, position: u64) {
        match self {
            Progress::Bar(bar) => bar.set_position(position),
            Progress::Log { url, total, next_log } => {
                if position >= *next_log {
                    match total {
                        Some(total) if *total > 0 => {
                            let percent = position.saturating_mul(100) / *total;
                            tracing::info!(url = url.as_str(), bytes = position, "downloaded {percent}%");
                        }
                        _ => tracing::info!(url = url.as_str(), bytes = position, "downloading"),
                    }
                    *next_log = Self::next_mark(position, *total);
                }
            }
        }
    }

    /// The next position worth a log line: the next tenth of `total`, or the next
    /// [`LOG_EVERY_UNSIZED`] bytes.
    fn next_mark(position: u64, total: Option<u64>) -> u64 {
        match total {
            Some(total) if total >= 10 => {
                let step = total / 10;
                (position / step + 1).saturating_mul(step)
            }
            Some(_) => u64::MAX,
            None => (position / LOG_EVERY_UNSIZED + 1).saturating_mul(LOG_EVERY_UNSIZED),
        }
    }

    fn finish(&self) {
        if let Progress::Bar(bar) = self {
            bar.finish_and_clear();
        }
    }

    fn abandon(&self) {
        if let Progress::Bar(bar) = self {
            bar.abandon();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, BufReader};
    use std::net::{Shutdown, TcpListener, TcpStream};
    use std::sync::{Arc, Mutex};

    /// What the test server does with one request.
    #[derive(Debug, Clone)]
    enum Behaviour {
        /// Answer properly: 200, or 206/416 for a Range request.
        Serve,
        /// Like `Serve`, but close the connection after this many body bytes.
        CloseAfter(usize),
        /// Answer with this status and an empty body.
        Status(u16),
        /// Send the whole file with 200 whatever the Range.
        IgnoreRange,
        /// Like `IgnoreRange`, but close after this many body bytes.
        IgnoreRangeCloseAfter(usize),
        /// 302 to this URL.
        RedirectTo(String),
        /// 200 without a Content-Length, then zeros until the client goes away.
        Endless,
        /// 200 with the right Content-Length, then one byte every 100 ms.
        Trickle,
    }

    /// A one-connection-at-a-time HTTP/1.1 server on loopback that plays `script`, one
    /// behaviour per request, then `then` for every later request.
    struct Server {
        base: String,
        /// The Range header of each request received, in order.
        ranges: Arc<Mutex<Vec<Option<String>>>>,
    }

    impl Server {
        fn start(payload: &[u8], script: Vec<Behaviour>, then: Behaviour) -> Server {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let base = format!("http://{}", listener.local_addr().unwrap());
            let ranges = Arc::new(Mutex::new(Vec::new()));
            let seen = Arc::clone(&ranges);
            let payload = payload.to_vec();
            // Never joined: it blocks in accept until the test process exits.
            thread::spawn(move || {
                let mut script = script.into_iter();
                for stream in listener.incoming() {
                    let Ok(stream) = stream else { continue };
                    let behaviour = script.next().unwrap_or_else(|| then.clone());
                    let _ = respond(stream, &behaviour, &payload, &seen);
                }
            });
            Server { base, ranges }
        }

        fn url(&self) -> String {
            format!("{}/data.bin", self.base)
        }

        fn ranges(&self) -> Vec<Option<String>> {
            self.ranges.lock().unwrap().clone()
        }
    }

    fn respond(
        mut stream: TcpStream,
        behaviour: &Behaviour,
        payload: &[u8],
        seen: &Mutex<Vec<Option<String>>>,
    ) -> io::Result<()> {
        let mut range = None;
        let mut reader = BufReader::new(stream.try_clone()?);
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line)? == 0 || line == "\r\n" {
                break;
            }
            if let Some((name, value)) = line.split_once(':') {
                if name.eq_ignore_ascii_case("range") {
                    range = Some(value.trim().to_string());
                }
            }
        }
        seen.lock().unwrap().push(range.clone());

        match behaviour {
            Behaviour::Endless => {
                stream.write_all(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n")?;
                let zeros = vec![0u8; 64 * 1024];
                loop {
                    stream.write_all(&zeros)?;
                }
            }
            Behaviour::Trickle => {
                let head = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    payload.len()
                );
                stream.write_all(head.as_bytes())?;
                for byte in payload {
                    stream.write_all(&[*byte])?;
                    thread::sleep(Duration::from_millis(100));
                }
                return Ok(());
            }
            _ => {}
        }
        let len = payload.len();
        let honours_range = matches!(behaviour, Behaviour::Serve | Behaviour::CloseAfter(_));
        let start = range
            .as_deref()
            .filter(|_| honours_range)
            .and_then(|r| r.strip_prefix("bytes="))
            .and_then(|r| r.strip_suffix('-'))
            .map(|r| r.parse::<usize>().unwrap());
        let (status, content_range, body) = match (behaviour, start) {
            (Behaviour::Status(code), _) => (format!("{code} Scripted"), None, &[][..]),
            (Behaviour::RedirectTo(location), _) => {
                (format!("302 Found\r\nLocation: {location}"), None, &[][..])
            }
            (_, None) => ("200 OK".to_string(), None, payload),
            (_, Some(s)) if s >= len => {
                ("416 Range Not Satisfiable".to_string(), Some(format!("bytes */{len}")), &[][..])
            }
            (_, Some(s)) => (
                "206 Partial Content".to_string(),
                Some(format!("bytes {s}-{}/{len}", len - 1)),
                &payload[s..],
            ),
        };
        let cut = match behaviour {
            Behaviour::CloseAfter(k) | Behaviour::IgnoreRangeCloseAfter(k) => *k,
            _ => body.len(),
        };
        let mut head =
            format!("HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n", body.len());
        if let Some(content_range) = content_range {
            head += &format!("Content-Range: {content_range}\r\n");
        }
        head += "\r\n";
        stream.write_all(head.as_bytes())?;
        stream.write_all(&body[..cut.min(body.len())])?;
        stream.flush()?;
        stream.shutdown(Shutdown::Both)
    }

    /// 1 MiB of pseudo-random bytes, so that data from the wrong offset cannot pass for right.
    fn payload() -> Vec<u8> {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        (0..1 << 20)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                (state >> 24) as u8
            })
            .collect()
    }

    fn sha256_hex(data: &[u8]) -> String {
        hex::encode(Sha256::digest(data))
    }

    fn options(payload: &[u8]) -> FetchOptions {
        FetchOptions {
            sha256: sha256_hex(payload),
            retries: 3,
            progress: false,
            timeout: Duration::from_secs(10),
            backoff: Duration::from_millis(10),
            ..FetchOptions::default()
        }
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn full_download_matches_payload_and_leaves_no_part() {
        let data = payload();
        let server = Server::start(&data, vec![], Behaviour::Serve);
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("sub").join("data.bin");

        let fetched = fetch(&server.url(), &out, &options(&data)).unwrap();

        assert_eq!(fs::read(&out).unwrap(), data);
        assert_eq!(
            fetched,
            Fetched { path: out.clone(), bytes: data.len() as u64, resumed_from: 0, attempts: 1 }
        );
        assert_eq!(names(&dir.path().join("sub")), ["data.bin"]);
        assert_eq!(server.ranges(), [None]);
    }

    #[test]
    fn dropped_connection_resumes_with_a_range_request_where_it_stopped() {
        let data = payload();
        let k = 300_000;
        let server = Server::start(&data, vec![Behaviour::CloseAfter(k)], Behaviour::Serve);
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("data.bin");

        let fetched = fetch(&server.url(), &out, &options(&data)).unwrap();

        assert_eq!(server.ranges(), [None, Some(format!("bytes={k}-"))]);
        assert_eq!(fs::read(&out).unwrap(), data);
        assert_eq!(fetched.resumed_from, k as u64);
        assert_eq!(fetched.attempts, 2);
        assert_eq!(names(dir.path()), ["data.bin"]);
    }

    #[test]
    fn a_part_left_by_an_earlier_run_is_resumed_and_rehashed() {
        let data = payload();
        let k = 123_457;
        let server = Server::start(&data, vec![], Behaviour::Serve);
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("data.bin");
        fs::write(dir.path().join("data.bin.part"), &data[..k]).unwrap();

        let fetched = fetch(&server.url(), &out, &options(&data)).unwrap();

        assert_eq!(server.ranges(), [Some(format!("bytes={k}-"))]);
        assert_eq!(fs::read(&out).unwrap(), data);
        assert_eq!((fetched.resumed_from, fetched.attempts), (k as u64, 1));
    }

    #[test]
    fn a_server_ignoring_range_restarts_the_part_from_zero() {
        let data = payload();
        let server = Server::start(&data, vec![], Behaviour::IgnoreRange);
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("data.bin");
        // Garbage that must not survive: the 200 body replaces it.
        fs::write(dir.path().join("data.bin.part"), vec![0xAA; 5000]).unwrap();

        let fetched = fetch(&server.url(), &out, &options(&data)).unwrap();

        assert_eq!(server.ranges(), [Some("bytes=5000-".to_string())]);
        assert_eq!(fs::read(&out).unwrap(), data);
        assert_eq!(fetched.resumed_from, 0);
        assert_eq!(names(dir.path()), ["data.bin"]);
    }

    #[test]
    fn a_complete_part_answered_with_416_is_verified_and_published() {
        let data = payload();
        let server = Server::start(&data, vec![], Behaviour::Serve);
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("data.bin");
        fs::write(dir.path().join("data.bin.part"), &data).unwrap();

        let fetched = fetch(&server.url(), &out, &options(&data)).unwrap();

        assert_eq!(server.ranges(), [Some(format!("bytes={}-", data.len()))]);
        assert_eq!(fs::read(&out).unwrap(), data);
        assert_eq!(fetched.resumed_from, data.len() as u64);
        assert_eq!(names(dir.path()), ["data.bin"]);
    }

    #[test]
    fn wrong_sha256_names_url_and_both_digests_and_leaves_nothing() {
        let data = payload();
        let server = Server::start(&data, vec![], Behaviour::Serve);
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("data.bin");
        let wrong = sha256_hex(b"something else");
        let opts = FetchOptions { sha256: wrong.clone(), ..options(&data) };

        let err = fetch(&server.url(), &out, &opts).unwrap_err();

        assert!(matches!(err, FetchError::ChecksumMismatch { .. }), "{err:?}");
        let message = err.to_string();
        assert!(message.contains(&server.url()), "{message}");
        assert!(message.contains(&wrong), "{message}");
        assert!(message.contains(&sha256_hex(&data)), "{message}");
        assert!(!out.exists());
        assert_eq!(names(dir.path()), Vec::<String>::new());
        // A mismatch is not retried: the same bytes would arrive again.
        assert_eq!(server.ranges().len(), 1);
    }

    #[test]
    fn not_found_fails_at_once_naming_url_and_status() {
        let data = payload();
        let server = Server::start(&data, vec![], Behaviour::Status(404));
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("data.bin");

        let err = fetch(&server.url(), &out, &options(&data)).unwrap_err();

        assert!(matches!(err, FetchError::HttpStatus { status: StatusCode::NOT_FOUND, .. }), "{err:?}");
        let message = err.to_string();
        assert!(message.contains(&server.url()) && message.contains("404"), "{message}");
        assert_eq!(server.ranges().len(), 1);
        assert!(!out.exists());
    }

    #[test]
    fn service_unavailable_twice_then_success_takes_three_attempts() {
        let data = payload();
        let server =
            Server::start(&data, vec![Behaviour::Status(503), Behaviour::Status(503)], Behaviour::Serve);
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("data.bin");

        let fetched = fetch(&server.url(), &out, &options(&data)).unwrap();

        assert_eq!(fetched.attempts, 3);
        assert_eq!(server.ranges(), [None, None, None]);
        assert_eq!(fs::read(&out).unwrap(), data);
    }

    #[test]
    fn persistent_truncation_gives_up_saying_how_much_arrived() {
        let data = payload();
        let k = 100_000;
        let server = Server::start(&data, vec![], Behaviour::IgnoreRangeCloseAfter(k));
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("data.bin");
        let opts = options(&data);

        let err = fetch(&server.url(), &out, &opts).unwrap_err();

        let FetchError::Incomplete { have, expected, attempts, .. } = &err else {
            panic!("expected Incomplete, got {err:?}");
        };
        assert_eq!((*have, *expected), (k as u64, data.len() as u64));
        // The first attempt made progress; then `retries` more in a row made none.
        assert_eq!(*attempts, opts.retries + 1);
        assert_eq!(server.ranges().len() as u32, opts.retries + 1);
        let message = err.to_string();
        assert!(message.contains(&server.url()), "{message}");
        assert!(message.contains(&format!("{k} of {}", data.len())), "{message}");
        assert!(!out.exists());
    }

    #[test]
    fn plain_http_to_another_host_is_refused_before_any_network_use() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("x");
        let url = "http://example.invalid/x";
        let opts = FetchOptions { sha256: sha256_hex(b""), progress: false, ..FetchOptions::default() };

        // Resolving `.invalid` would fail with a network error instead, so this variant shows
        // the refusal came first.
        let err = fetch(url, &out, &opts).unwrap_err();

        assert!(matches!(err, FetchError::InsecureHttp { .. }), "{err:?}");
        let message = err.to_string();
        assert!(message.contains(url) && message.contains("--allow-http"), "{message}");
        assert_eq!(names(dir.path()), Vec::<String>::new());
    }

    #[test]
    fn a_redirect_to_plain_http_elsewhere_is_refused() {
        let data = payload();
        let target = "http://example.invalid/data.bin";
        let server = Server::start(&data, vec![Behaviour::RedirectTo(target.to_string())], Behaviour::Serve);
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("data.bin");

        let err = fetch(&server.url(), &out, &options(&data)).unwrap_err();

        assert!(matches!(err, FetchError::Redirect { .. }), "{err:?}");
        let mut chain = err.to_string();
        let mut source = std::error::Error::source(&err);
        while let Some(cause) = source {
            chain += &format!(": {cause}");
            source = cause.source();
        }
        assert!(chain.contains(&server.url()) && chain.contains(target), "{chain}");
        assert!(chain.contains("--allow-http"), "{chain}");
        // Not retried, and no file.
        assert_eq!(server.ranges().len(), 1);
        assert_eq!(names(dir.path()), Vec::<String>::new());
    }

    #[test]
    fn a_redirect_within_loopback_is_followed() {
        let data = payload();
        let server = Server::start(&data, vec![], Behaviour::Serve);
        let front = Server::start(&data, vec![], Behaviour::RedirectTo(server.url()));
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("data.bin");

        fetch(&front.url(), &out, &options(&data)).unwrap();

        assert_eq!(fs::read(&out).unwrap(), data);
        assert_eq!((front.ranges().len(), server.ranges().len()), (1, 1));
    }

    #[test]
    fn scheme_policy() {
        assert!(check_url("https://example.invalid/x", false).is_ok());
        assert!(check_url("http://example.invalid/x", true).is_ok());
        for loopback in
            ["http://127.0.0.1:8/x", "http://127.9.9.9/x", "http://[::1]:80/x", "http://LocalHost/x"]
        {
            assert!(check_url(loopback, false).is_ok(), "{loopback}");
        }
        for remote in ["http://10.0.0.1/x", "http://localhost.example.invalid/x", "http://[::2]/x"] {
            assert!(matches!(check_url(remote, false), Err(FetchError::InsecureHttp { .. })), "{remote}");
        }
        assert!(matches!(check_url("ftp://127.0.0.1/x", true), Err(FetchError::UnsupportedScheme { .. })));
        assert!(matches!(check_url("not a url", true), Err(FetchError::InvalidUrl { .. })));
    }

    #[test]
    fn sha256_must_be_64_hex_digits() {
        let upper = "AB".repeat(32);
        assert_eq!(parse_sha256(&upper, false).unwrap(), "ab".repeat(32));
        for bad in ["", "abc", &"g".repeat(64), &"a".repeat(65)] {
            assert!(matches!(parse_sha256(bad, false), Err(FetchError::InvalidSha256 { .. })), "{bad}");
        }
        // torch.hub's prefixes: 8 digits or more, never a whole-digest requirement.
        assert_eq!(parse_sha256("B627A593", true).unwrap(), "b627a593");
        assert!(parse_sha256(&"a".repeat(64), true).is_ok());
        for bad in ["", "b627a59", &"a".repeat(65), "b627a59x"] {
            assert!(matches!(parse_sha256(bad, true), Err(FetchError::InvalidSha256 { .. })), "{bad}");
        }
    }

    #[test]
    fn a_digest_prefix_accepts_the_file_it_starts_and_refuses_another() {
        let data = payload();
        let dir = tempfile::tempdir().unwrap();
        let full = sha256_hex(&data);
        let server = Server::start(&data, vec![], Behaviour::Serve);
        let good = FetchOptions { sha256: full[..8].to_string(), sha256_prefix: true, ..options(&data) };
        let out = dir.path().join("w-good.pth");
        fetch(&server.url(), &out, &good).unwrap();
        assert_eq!(fs::read(&out).unwrap(), data);
        let wrong_prefix = if full.starts_with('0') { "10000000" } else { "00000000" };
        let bad = FetchOptions { sha256: wrong_prefix.to_string(), sha256_prefix: true, ..options(&data) };
        let out = dir.path().join("w-bad.pth");
        assert!(matches!(fetch(&server.url(), &out, &bad), Err(FetchError::ChecksumMismatch { .. })));
        assert!(!out.exists());
    }

    #[test]
    fn existing_output_with_the_right_hash_makes_no_request() {
        let data = payload();
        let server = Server::start(&data, vec![], Behaviour::Serve);
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("data.bin");
        fs::write(&out, &data).unwrap();

        let fetched = fetch(&server.url(), &out, &options(&data)).unwrap();

        let size = data.len() as u64;
        assert_eq!(fetched, Fetched { path: out.clone(), bytes: size, resumed_from: size, attempts: 0 });
        assert!(server.ranges().is_empty());
    }

    #[test]
    fn existing_output_with_a_wrong_hash_is_refused_and_kept() {
        let data = payload();
        let server = Server::start(&data, vec![], Behaviour::Serve);
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("data.bin");
        fs::write(&out, b"stale").unwrap();

        let err = fetch(&server.url(), &out, &options(&data)).unwrap_err();

        assert!(matches!(err, FetchError::ExistingMismatch { .. }), "{err:?}");
        let message = err.to_string();
        assert!(message.contains(&out.display().to_string()) && message.contains(&sha256_hex(b"stale")));
        assert_eq!(fs::read(&out).unwrap(), b"stale");
        assert!(server.ranges().is_empty());
    }

    /// Case 50.10: a symbolic link planted as `OUT.part` had the download written through it
    /// into the file it pointed to, and was then renamed onto `OUT`. It is refused before any
    /// request, and neither the file it points to nor `OUT` is touched.
    #[test]
    fn a_part_that_is_a_link_is_refused_and_nothing_is_written_through_it() {
        let data = payload();
        let server = Server::start(&data, vec![], Behaviour::Serve);
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("data.bin");
        for victim in ["empty.txt", "notes.txt"] {
            let victim = dir.path().join(victim);
            let kept: &[u8] = if victim.ends_with("empty.txt") { b"" } else { b"keep me" };
            fs::write(&victim, kept).unwrap();
            let part = dir.path().join("data.bin.part");
            let _ = fs::remove_file(&part);
            std::os::unix::fs::symlink(&victim, &part).unwrap();

            let err = fetch(&server.url(), &out, &options(&data)).unwrap_err();

            assert!(err.to_string().contains("data.bin.part: a symbolic link"), "{err}");
            assert_eq!(fs::read(&victim).unwrap(), kept, "written through the link");
            assert!(out.symlink_metadata().is_err(), "OUT was made");
            assert!(
                part.symlink_metadata().unwrap().file_type().is_symlink(),
                "the link is left to the user"
            );
        }
        assert_eq!(server.ranges(), [], "a request was made");
    }

    #[test]
    fn backoff_doubles_and_is_capped() {
        let base = Duration::from_millis(500);
        let delays: Vec<u64> = (1..=6).map(|n| backoff(base, n).as_millis() as u64).collect();
        assert_eq!(delays, [500, 1000, 2000, 4000, 8000, 8000]);
        assert_eq!(backoff(base, 1000), MAX_BACKOFF);
    }

    /// An endless body (no Content-Length) with the size known: cut off at the size, the part
    /// deleted, never retried (issue "Untrusted files read safely", case 9; it wrote 5.2 GB in
    /// 20 s before, and left it behind).
    #[test]
    fn an_endless_body_stops_at_the_expected_size_and_leaves_nothing() {
        let data = payload();
        let server = Server::start(&data, vec![], Behaviour::Endless);
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("data.bin");
        let opts = FetchOptions { size: Some(data.len() as u64), ..options(&data) };
        let err = fetch(&server.url(), &out, &opts).unwrap_err();
        assert!(matches!(err, FetchError::TooLong { size, .. } if size == data.len() as u64), "{err}");
        assert!(err.to_string().contains(&server.url()), "{err}");
        assert_eq!(names(dir.path()), Vec::<String>::new());
        assert_eq!(server.ranges().len(), 1, "retried a body that cannot be right");
    }

    /// A server announcing another size than `--size` is refused before a byte is written; a
    /// partial download longer than the size is discarded, not resumed (every rerun failed).
    #[test]
    fn the_expected_size_refuses_another_and_discards_a_longer_part() {
        let data = payload();
        let server = Server::start(&data, vec![], Behaviour::Serve);
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("data.bin");
        let wrong = FetchOptions { size: Some(1000), ..options(&data) };
        let err = fetch(&server.url(), &out, &wrong).unwrap_err();
        assert!(
            matches!(err, FetchError::SizeMismatch { size: 1000, announced, .. } if announced == data.len() as u64),
            "{err}"
        );

        fs::write(dir.path().join("data.bin.part"), vec![7u8; data.len() + 10]).unwrap();
        let right = FetchOptions { size: Some(data.len() as u64), ..options(&data) };
        let fetched = fetch(&server.url(), &out, &right).unwrap();
        assert_eq!(fetched.resumed_from, 0);
        assert_eq!(fs::read(&out).unwrap(), data);
    }

    /// A server trickling a byte every 100 ms never trips a read timeout; it is a stall, and
    /// its attempts count as failures although each adds a few bytes (no retrying for ever).
    #[test]
    fn a_trickling_server_is_a_stall_that_ends_the_fetch() {
        let data = payload();
        let server = Server::start(&data, vec![], Behaviour::Trickle);
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("data.bin");
        let opts = FetchOptions { timeout: Duration::from_secs(1), retries: 1, ..options(&data) };
        let started = Instant::now();
        let err = fetch(&server.url(), &out, &opts).unwrap_err();
        assert!(matches!(err, FetchError::Stalled { attempts: 2, .. }), "{err}");
        let message = err.to_string();
        assert!(message.contains("data.bin.part") && message.contains("stalled"), "{message}");
        assert!(started.elapsed() < Duration::from_secs(30), "took {:?}", started.elapsed());
    }
}
