//! `rtrain publish RUN_DIR... --out DIR`: a self-contained bundle of finished runs for an
//! archive (DesignSafe's Data Depot, Zenodo). Each run's final and best weights,
//! configuration, manifest, metrics, evaluation and TensorBoard logs under `runs/NAME/`; the
//! report over all runs, with the seed statistics, under `report/`; and what archives and
//! reviewers read: `MODEL_CARD.md` (model_card.rs), `ro-crate-metadata.json` (ro_crate.rs),
//! `CITATION.cff` (citation.rs), and `SHA256SUMS` over every other file, in the format
//! `sha256sum -c` checks. `rtrain verify DIR` checks a bundle (verify.rs).
//!
//! A run is copied only as its manifest recorded it: weights whose sha256 differs from the one
//! the run wrote are refused. Only the files rtrain wrote are carried, by their names (a
//! person's notes or a hidden `.env` in `evaluation/` stay behind), and a symbolic link among
//! them is refused, never followed out of the run. Runs of different class sets are refused:
//! the model card describes one. The bundle is built in a hidden directory beside `DIR` and
//! renamed into place, so an interrupted publish leaves no half-written bundle under the name;
//! a stop signal removes that directory, and the next publish into `DIR` removes one that a
//! killed publish left.

mod citation;
mod model_card;
mod ro_crate;
mod verify;

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::cluster::{self, signals};
use crate::report::evaluation::{self, Evaluated};
use crate::report::runs::{self, RunData, RunReportError, SeedStatistics};
use crate::run_dir::manifest::{self, Manifest, ManifestError};
use crate::run_dir::{tensorboard, RunPaths};
use crate::util::files::{self, FileError};

pub use verify::{is_bundle, verify};

/// The bundle's files that say what it is, at its top level.
pub const MODEL_CARD: &str = "MODEL_CARD.md";
pub const CITATION: &str = "CITATION.cff";
pub const CRATE_METADATA: &str = "ro-crate-metadata.json";
pub const CHECKSUMS: &str = "SHA256SUMS";
/// The largest SHA256SUMS or ro-crate-metadata.json read back (a bundle of tens of thousands
/// of data files lists them in well under this).
const LISTING_LIMIT: u64 = 256 << 20;
/// Where the runs and the report over them are, inside the bundle.
const RUNS_DIR: &str = "runs";
const REPORT_DIR: &str = "report";

/// The files of a run directory a bundle carries beside its weights, the best checkpoint's
/// evaluation and the TensorBoard event files. Step checkpoints stay behind (the best and the
/// final weights are what a reader uses; the manifest still lists every checkpoint's sha256).
const RUN_FILES: [&str; 4] = ["manifest.json", "config.toml", "metrics.jsonl", "summary.json"];

#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    #[error("{}: already exists and is not an empty directory: publish writes a new bundle; name another --out, or remove it", .0.display())]
    OutExists(PathBuf),
    #[error("{}: the run has not finished (its manifest.json records no final weights): publish finished runs", .0.display())]
    NotFinished(PathBuf),
    #[error("{}: sha256 {found}, but {manifest} recorded {recorded}: the run directory changed after training; not published", file.display(), manifest = manifest.display())]
    Changed { file: PathBuf, manifest: PathBuf, found: String, recorded: String },
    #[error("runs {} and {} would both be runs/{name} in the bundle: rename one run directory", first.display(), second.display())]
    SameName { first: PathBuf, second: PathBuf, name: String },
    #[error("{}: {problem}", path.display())]
    Unlistable { path: PathBuf, problem: &'static str },
    #[error("{}: a symbolic link: a bundle carries no file from outside its runs; replace it with the directory it points to, or remove it", .0.display())]
    Link(PathBuf),
    #[error("runs {} and {} classify different classes ({first_classes} and {second_classes}): one bundle, one model card, describes runs of one class set; publish them apart", first.display(), second.display())]
    DifferentClasses { first: PathBuf, first_classes: String, second: PathBuf, second_classes: String },
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    #[error(transparent)]
    File(#[from] FileError),
    #[error(transparent)]
    Report(#[from] RunReportError),
    #[error("{}: {source:#}", path.display())]
    Evaluation { path: PathBuf, source: anyhow::Error },
    #[error("{}: {problem}", path.display())]
    NotABundle { path: PathBuf, problem: String },
    #[error("installing the stop-signal handlers: {0}")]
    Signals(std::io::Error),
    #[error("stopped by a stop signal (SIGTERM, SIGINT or SIGUSR1)")]
    Stopped,
}

/// What the author says about the bundle on the command line; whatever is left out is a
/// placeholder in the model card, the RO-Crate and the citation.
#[derive(Debug, Clone, Default)]
pub struct Authorship {
    /// The model's title (default: from the architecture, classes and number of runs).
    pub title: Option<String>,
    /// Authors as "Given Family" names, each perhaps with its ORCID URL (`NAME <URL>`, see
    /// [`name_and_link`]), in citation order.
    pub authors: Vec<String>,
    /// The licence of the weights, as an SPDX identifier (`CC-BY-4.0`).
    pub license: Option<String>,
    /// The authors' organisation (`NAME <URL>` with its ROR URL or homepage).
    pub affiliation: Option<String>,
    /// Who publishes the bundle (the archive: DesignSafe's Data Depot, Zenodo), as `NAME <URL>`.
    pub publisher: Option<String>,
}

/// A person or organisation as given on the command line: `NAME` or `NAME <URL>` (an ORCID
/// or ROR URL, a homepage), as git writes `NAME <EMAIL>`.
pub fn name_and_link(text: &str) -> (&str, Option<&str>) {
    match text.trim().strip_suffix('>').and_then(|rest| rest.rsplit_once(" <")) {
        Some((name, url)) if url.starts_with("http") => (name.trim(), Some(url)),
        _ => (text.trim(), None),
    }
}

/// One file of the bundle, by its path relative to the bundle's top ('/'-separated).
#[derive(Debug, Clone, PartialEq)]
pub struct BundleFile {
    pub path: String,
    pub sha256: String,
    pub bytes: u64,
}

/// A run as the bundle holds it.
pub struct BundledRun {
    /// Its directory's name under `runs/`.
    pub name: String,
    /// Where it was published from.
    pub source: PathBuf,
    pub manifest: Manifest,
    /// The best checkpoint's evaluation (`evaluation/metrics.json`), when the run has one.
    pub evaluation: Option<Evaluated>,
    /// Its files in the bundle.
    pub files: Vec<BundleFile>,
}

impl BundledRun {
    /// The bundle path of one of its files (`runs/NAME/relative`).
    pub fn path(&self, relative: &str) -> String {
        format!("{RUNS_DIR}/{}/{relative}", self.name)
    }

    /// Its file at `relative`, if the bundle holds it.
    pub fn file(&self, relative: &str) -> Option<&BundleFile> {
        let path = self.path(relative);
        self.files.iter().find(|file| file.path == path)
    }
}

/// Everything the model card, RO-Crate and citation are written from.
pub struct Bundle {
    pub authorship: Authorship,
    /// The day of publishing, `YYYY-MM-DD`.
    pub date: String,
    pub runs: Vec<BundledRun>,
    pub seeds: SeedStatistics,
    /// The report's files (`report/...`).
    pub report_files: Vec<BundleFile>,
    /// MODEL_CARD.md and CITATION.cff, once written.
    pub documents: Vec<BundleFile>,
}

impl Bundle {
    /// The title: the author's, or one made from the first run.
    pub fn title(&self) -> String {
        if let Some(title) = &self.authorship.title {
            return title.clone();
        }
        let config = &self.runs[0].manifest.config;
        let seeds = match self.runs.len() {
            1 => String::new(),
            n => format!(", {n} runs"),
        };
        format!(
            "{} image classifier of {} classes trained with rtrain{seeds}",
            config.model.arch,
            self.classes().len()
        )
    }

    /// The class names, in the order of the model's outputs (the first run's).
    pub fn classes(&self) -> &[String] {
        self.runs[0].manifest.data.first().map_or(&[], |split| split.classes.as_slice())
    }
}

/// Publishes `runs` into a new bundle at `out`; returns what was bundled.
///
/// A stop signal (SIGTERM, SIGINT, SIGUSR1) ends it at the next file or step with
/// [`PublishError::Stopped`], the staging directory removed; one that kills it at once (a
/// second signal, SIGKILL) leaves the staging directory, which the next publish into the same
/// `out` removes.
pub fn publish(runs: &[PathBuf], out: &Path, authorship: Authorship) -> Result<Bundle, PublishError> {
    signals::install().map_err(PublishError::Signals)?;
    signals::arm(cluster::single().as_ref()).expect("a job of one agrees with itself");
    check_out(out)?;
    let parent = match out.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent.to_path_buf(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&parent).map_err(|source| PublishError::Io { path: parent.clone(), source })?;
    let prefix = staging_prefix(out);
    remove_stale_staging(&parent, &prefix, out)?;
    // Removed on any error below (dropped); kept by the rename at the end. Locked while this
    // publish lives, so that another publish into `out` does not take it for a killed one's.
    let staging = tempfile::Builder::new()
        .prefix(&prefix)
        .rand_bytes(STAGING_RANDOM_CHARS)
        .tempdir_in(&parent)
        .map_err(|source| PublishError::Io { path: parent.clone(), source })?;
    let root = staging.path();
    let _lock = std::fs::File::open(root)
        .and_then(|handle| files::try_lock_exclusive(&handle).map(|_| handle))
        .map_err(|source| PublishError::Io { path: root.to_path_buf(), source })?;

    let names = bundle_names(runs)?;
    let mut bundled = Vec::new();
    for (source, name) in runs.iter().zip(names) {
        let run = copy_run(source, root, name)?;
        check_same_classes(bundled.first().unwrap_or(&run), &run)?;
        bundled.push(run);
    }
    check_stop()?;

    let mut report_runs = Vec::new();
    for run in &bundled {
        let relative = Path::new(RUNS_DIR).join(&run.name);
        report_runs.push(RunData::read(&root.join(&relative))?.shown_as(&relative));
    }
    runs::write(&report_runs, &root.join(REPORT_DIR), &[])?;
    let seeds = runs::seed_statistics(&report_runs, &[]);
    let report_files = hash_tree(root, REPORT_DIR)?;

    let date = manifest::now()[..10].to_string();
    let mut bundle = Bundle { authorship, date, runs: bundled, seeds, report_files, documents: Vec::new() };
    let card = model_card::write(&bundle);
    bundle.documents.push(write_file(root, MODEL_CARD, card.as_bytes())?);
    let citation = citation::write(&bundle);
    bundle.documents.push(write_file(root, CITATION, citation.as_bytes())?);
    let metadata = serde_json::to_string_pretty(&ro_crate::metadata(&bundle))
        .map_err(|e| PublishError::Io { path: root.join(CRATE_METADATA), source: e.into() })?;
    write_file(root, CRATE_METADATA, metadata.as_bytes())?;
    write_checksums(root)?;
    check_stop()?;

    // Archives and group directories on a cluster need to read it: a temporary directory is
    // private (0700), and files follow the umask, which may be private too.
    make_readable(root)?;
    // Replaces `out` if it is an empty directory (check_out refused anything else).
    std::fs::rename(root, out).map_err(|source| PublishError::Io { path: out.to_path_buf(), source })?;
    let _ = staging.keep();
    Ok(bundle)
}

/// Seals a bundle again after its author filled in MODEL_CARD.md or CITATION.cff: the
/// RO-Crate's `sha256` and `contentSize` of every file it describes, and SHA256SUMS, are
/// written anew. Refused when a run's weights or checkpoints differ from what its manifest
/// recorded, or when the bundle holds a file the RO-Crate does not describe.
pub fn seal(dir: &Path) -> Result<usize, PublishError> {
    let not_a_bundle = |problem: String| PublishError::NotABundle { path: dir.join(CRATE_METADATA), problem };
    let bytes = files::read_regular(&dir.join(CRATE_METADATA), LISTING_LIMIT)
        .map_err(|source| PublishError::Io { path: dir.join(CRATE_METADATA), source })?;
    let mut metadata: serde_json::Value =
        serde_json::from_slice(&bytes).map_err(|e| not_a_bundle(format!("not JSON: {e}")))?;
    let mut actual = std::collections::BTreeMap::new();
    for (relative, path) in list_files(dir, dir)? {
        if relative != CHECKSUMS && relative != CRATE_METADATA {
            check_listable(&relative, &path)?;
            // A listed file that is a link would vouch for a file outside the bundle.
            let sha256 = files::sha256_below(dir, Path::new(&relative))?;
            actual.insert(relative, sha256);
        }
    }
    for finding in verify::run_findings(dir, &actual)? {
        if let manifest::Finding::Mismatch(what) = finding {
            return Err(not_a_bundle(format!("not sealed: {what}")));
        }
    }
    let graph = metadata.get_mut("@graph").and_then(serde_json::Value::as_array_mut);
    let mut described = BTreeSet::new();
    for entity in graph.into_iter().flatten() {
        let Some(id) = entity.get("@id").and_then(serde_json::Value::as_str).map(str::to_string) else {
            continue;
        };
        if let Some(sha256) = actual.get(&id) {
            let path = dir.join(&id);
            let bytes = std::fs::metadata(&path).map_err(|source| PublishError::Io { path, source })?.len();
            entity["sha256"] = serde_json::json!(sha256);
            entity["contentSize"] = serde_json::json!(bytes.to_string());
            described.insert(id);
        }
    }
    if let Some(extra) = actual.keys().find(|path| !described.contains(*path)) {
        return Err(not_a_bundle(format!(
            "{extra} is in the bundle but not described here: remove it, or describe it as a File"
        )));
    }
    let json = serde_json::to_string_pretty(&metadata).map_err(|e| not_a_bundle(e.to_string()))?;
    files::write_atomic(&dir.join(CRATE_METADATA), json.as_bytes())?;
    write_checksums(dir)?;
    make_readable(dir)?;
    Ok(described.len())
}

/// The staging directory of a publish into `out` is beside it, hidden, named after it and
/// ending in this many random letters and digits, so that the next publish into the same `out`
/// knows what a killed one left.
const STAGING_RANDOM_CHARS: usize = 6;

fn staging_prefix(out: &Path) -> String {
    let name = out.file_name().map_or_else(|| "bundle".into(), |name| name.to_string_lossy().into_owned());
    format!(".publish-{name}-")
}

/// Removes the staging directories in `parent` that a publish into `out` left when it was
/// killed (SIGKILL, a second stop signal, a lost node): those no live publish holds locked.
fn remove_stale_staging(parent: &Path, prefix: &str, out: &Path) -> Result<(), PublishError> {
    let Ok(entries) = std::fs::read_dir(parent) else { return Ok(()) };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(random) = name.to_str().and_then(|name| name.strip_prefix(prefix)) else { continue };
        let ours = random.len() == STAGING_RANDOM_CHARS && random.bytes().all(|b| b.is_ascii_alphanumeric());
        if !ours || !entry.file_type().is_ok_and(|kind| kind.is_dir()) {
            continue;
        }
        let path = entry.path();
        let io = |source| PublishError::Io { path: path.clone(), source };
        let handle = std::fs::File::open(&path).map_err(io)?;
        if !files::try_lock_exclusive(&handle).map_err(io)? {
            continue;
        }
        std::fs::remove_dir_all(&path).map_err(io)?;
        tracing::warn!(
            "removed {}, left by a publish into {} that was killed",
            path.display(),
            out.display()
        );
    }
    Ok(())
}

/// Ends the publish at a stop signal (its staging directory is removed as the error returns).
fn check_stop() -> Result<(), PublishError> {
    match signals::requested() {
        Some(_) => Err(PublishError::Stopped),
        None => Ok(()),
    }
}

/// Refuses an `out` that exists and is anything but an empty directory.
fn check_out(out: &Path) -> Result<(), PublishError> {
    match std::fs::read_dir(out).map(|mut entries| entries.next().is_none()) {
        Ok(true) => Ok(()),
        Ok(false) => Err(PublishError::OutExists(out.to_path_buf())),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(_) => Err(PublishError::OutExists(out.to_path_buf())),
    }
}

/// Each run's directory name in the bundle: its own name, with every character that is not a
/// letter, digit, `.`, `_` or `-` replaced by `_` (bundle paths are written into SHA256SUMS and
/// used as RO-Crate identifiers as they are).
fn bundle_names(runs: &[PathBuf]) -> Result<Vec<String>, PublishError> {
    let mut names: Vec<String> = Vec::new();
    for (index, run) in runs.iter().enumerate() {
        let own = std::fs::canonicalize(run)
            .ok()
            .and_then(|dir| dir.file_name().map(|n| n.to_string_lossy().into_owned()))
            .unwrap_or_else(|| "run".to_string());
        let name: String = own
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() || "._-".contains(c) { c } else { '_' })
            .collect();
        let name = if name.starts_with('.') { format!("_{name}") } else { name };
        if let Some(first) = names.iter().position(|other| *other == name) {
            return Err(PublishError::SameName {
                first: runs[first].clone(),
                second: runs[index].clone(),
                name,
            });
        }
        names.push(name);
    }
    Ok(names)
}

/// Copies what the bundle carries of the run at `source` into `root/runs/name`, checking its
/// weights against its manifest.
fn copy_run(source: &Path, root: &Path, name: String) -> Result<BundledRun, PublishError> {
    let paths = RunPaths::new(source);
    let manifest = Manifest::read(source)?;
    let weights = match (&manifest.weights, &manifest.finished) {
        (Some(weights), Some(_)) => weights.clone(),
        _ => return Err(PublishError::NotFinished(source.to_path_buf())),
    };
    let best = paths.relative(&paths.best_checkpoint());
    // (relative path, the sha256 its manifest recorded for it)
    let mut wanted: Vec<(String, Option<String>)> =
        RUN_FILES.iter().map(|file| (file.to_string(), None)).collect();
    wanted.push((weights.path.clone(), Some(weights.sha256.clone())));
    if let Some(sha256) = manifest.checkpoints.get(&best) {
        wanted.push((best, Some(sha256.clone())));
    }
    let evaluated = written_files(&paths.evaluation(), |name| evaluation::WRITTEN_FILES.contains(&name))?;
    let events = written_files(&paths.tensorboard(), tensorboard::is_event_file)?;
    for (dir, names) in [(paths.evaluation(), evaluated), (paths.tensorboard(), events)] {
        let relative = paths.relative(&dir);
        wanted.extend(names.into_iter().map(|file| (format!("{relative}/{file}"), None)));
    }

    let dest = root.join(RUNS_DIR).join(&name);
    let mut copied = Vec::new();
    for (relative, recorded) in wanted {
        let bundle_path = format!("{RUNS_DIR}/{name}/{relative}");
        check_listable(&bundle_path, &source.join(&relative))?;
        let file = copy_file(source, Path::new(&relative), &dest.join(&relative), bundle_path)?;
        if let Some(recorded) = recorded.filter(|recorded| *recorded != file.sha256) {
            return Err(PublishError::Changed {
                file: source.join(&relative),
                manifest: paths.manifest(),
                found: file.sha256,
                recorded,
            });
        }
        copied.push(file);
    }
    // Read from the bundle's copy: what was carried, not whatever the run's directory holds.
    let evaluation_dir = paths.evaluation();
    let carried = dest.join(paths.relative(&evaluation_dir));
    let evaluation = match Evaluated::read(&carried) {
        Ok(evaluation) => Some(evaluation),
        Err(_) if !carried.exists() => None,
        Err(source) => return Err(PublishError::Evaluation { path: evaluation_dir, source }),
    };
    Ok(BundledRun { name, source: source.to_path_buf(), manifest, evaluation, files: copied })
}

/// The names of the files in the run's `dir` (`evaluation/`, `tensorboard/`) that rtrain wrote
/// there (`written`), sorted; none without such a directory. Whatever else it holds (notes, a
/// hidden `.env`, another tool's files) stays behind, and a directory that is a symbolic link
/// is refused: it would carry files from outside the run.
fn written_files(dir: &Path, written: impl Fn(&str) -> bool) -> Result<Vec<String>, PublishError> {
    match dir.symlink_metadata() {
        Ok(meta) if meta.file_type().is_symlink() => return Err(PublishError::Link(dir.to_path_buf())),
        Ok(meta) if meta.is_dir() => {}
        Ok(_) => return Ok(Vec::new()),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => return Err(PublishError::Io { path: dir.to_path_buf(), source }),
    }
    let entries =
        std::fs::read_dir(dir).map_err(|source| PublishError::Io { path: dir.to_path_buf(), source })?;
    let mut names = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|source| PublishError::Io { path: dir.to_path_buf(), source })?;
        let name = entry.file_name().to_string_lossy().into_owned();
        match written(&name) {
            true => names.push(name),
            false => {
                tracing::info!("{}: not a file rtrain wrote; left out of the bundle", entry.path().display())
            }
        }
    }
    names.sort();
    Ok(names)
}

/// Refuses a run whose classes (names, in the order of the model's outputs) are not the first
/// run's: the model card, the report's per-class tables and the title describe one class set.
fn check_same_classes(first: &BundledRun, run: &BundledRun) -> Result<(), PublishError> {
    let classes =
        |run: &BundledRun| run.manifest.data.first().map(|split| split.classes.clone()).unwrap_or_default();
    let (expected, found) = (classes(first), classes(run));
    if expected == found {
        return Ok(());
    }
    Err(PublishError::DifferentClasses {
        first: first.source.clone(),
        first_classes: expected.join(", "),
        second: run.source.clone(),
        second_classes: found.join(", "),
    })
}

/// Refuses a bundle path that SHA256SUMS or an RO-Crate identifier could not hold as it is,
/// or that would leave the bundle (a manifest from elsewhere may name `../../x` as weights).
fn check_listable(bundle_path: &str, source: &Path) -> Result<(), PublishError> {
    let refuse = |problem| Err(PublishError::Unlistable { path: source.to_path_buf(), problem });
    if !bundle_path.chars().all(|c| c.is_ascii_alphanumeric() || "._-/+".contains(c)) {
        return refuse("a file name with characters other than letters, digits and ._-+: not published");
    }
    if bundle_path.split('/').any(|part| part.is_empty() || part == "." || part == "..") {
        return refuse("a path with an empty, `.` or `..` part (or a leading /): it would leave the bundle");
    }
    Ok(())
}

/// Copies the regular file `run/relative` to `to` (a new file), hashing what it copies, and
/// flushes it to disk. A link anywhere below `run` is refused, never followed.
fn copy_file(
    run: &Path,
    relative: &Path,
    to: &Path,
    bundle_path: String,
) -> Result<BundleFile, PublishError> {
    let from = run.join(relative);
    let read_error = |source| PublishError::Io { path: from.clone(), source };
    let write_error = |source| PublishError::Io { path: to.to_path_buf(), source };
    let (mut input, _) = files::open_regular_below(run, relative).map_err(read_error)?;
    if let Some(dir) = to.parent() {
        std::fs::create_dir_all(dir).map_err(write_error)?;
    }
    let mut output =
        std::fs::OpenOptions::new().write(true).create_new(true).open(to).map_err(write_error)?;
    let (mut hasher, mut bytes, mut buffer) = (Sha256::new(), 0u64, vec![0u8; 1 << 20]);
    loop {
        check_stop()?;
        let n = input.read(&mut buffer).map_err(read_error)?;
        if n == 0 {
            break;
        }
        hasher.update(&buffer[..n]);
        output.write_all(&buffer[..n]).map_err(write_error)?;
        bytes += n as u64;
    }
    output.sync_all().map_err(write_error)?;
    Ok(BundleFile { path: bundle_path, sha256: hex::encode(hasher.finalize()), bytes })
}

/// Writes `bytes` to `root/name` and returns it as a bundle file.
fn write_file(root: &Path, name: &str, bytes: &[u8]) -> Result<BundleFile, PublishError> {
    let sha256 = files::write_atomic(&root.join(name), bytes)?;
    Ok(BundleFile { path: name.to_string(), sha256, bytes: bytes.len() as u64 })
}

/// Every regular file under `root/dir`, hashed, in path order.
fn hash_tree(root: &Path, dir: &str) -> Result<Vec<BundleFile>, PublishError> {
    let mut found = Vec::new();
    for (relative, path) in list_files(root, &root.join(dir))? {
        check_listable(&relative, &path)?;
        let sha256 = files::sha256_file(&path)?;
        let bytes =
            std::fs::metadata(&path).map_err(|source| PublishError::Io { path: path.clone(), source })?.len();
        found.push(BundleFile { path: relative, sha256, bytes });
    }
    Ok(found)
}

/// The files under `start` (a directory inside `root`), recursively, sorted, each with its name
/// relative to `root` ('/'-separated, as bundle paths are written). Symbolic links and other
/// non-files are included, so that the caller can refuse them.
fn list_files(root: &Path, start: &Path) -> Result<Vec<(String, PathBuf)>, PublishError> {
    let mut found = Vec::new();
    let mut pending = vec![start.to_path_buf()];
    while let Some(dir) = pending.pop() {
        let entries =
            std::fs::read_dir(&dir).map_err(|source| PublishError::Io { path: dir.clone(), source })?;
        for entry in entries {
            let entry = entry.map_err(|source| PublishError::Io { path: dir.clone(), source })?;
            let kind = entry.file_type().map_err(|source| PublishError::Io { path: entry.path(), source })?;
            match kind.is_dir() {
                true => pending.push(entry.path()),
                false => found.push(entry.path()),
            }
        }
    }
    found.sort();
    Ok(found
        .into_iter()
        .map(|path| (path.strip_prefix(root).unwrap_or(&path).to_string_lossy().into_owned(), path))
        .collect())
}

/// Writes SHA256SUMS: every other file of the bundle, as `sha256sum` writes and checks it.
fn write_checksums(root: &Path) -> Result<(), PublishError> {
    let mut listing = String::new();
    for (relative, path) in list_files(root, root)? {
        if relative == CHECKSUMS {
            continue;
        }
        listing.push_str(&format!("{}  {relative}\n", files::sha256_file(&path)?));
    }
    files::write_atomic(&root.join(CHECKSUMS), listing.as_bytes())?;
    Ok(())
}

/// Directories 0755 and files 0644 throughout the bundle.
fn make_readable(root: &Path) -> Result<(), PublishError> {
    use std::os::unix::fs::PermissionsExt;
    let set = |path: &Path, mode: u32| {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
            .map_err(|source| PublishError::Io { path: path.to_path_buf(), source })
    };
    let mut dirs: BTreeSet<PathBuf> = BTreeSet::from([root.to_path_buf()]);
    for (_, file) in list_files(root, root)? {
        set(&file, 0o644)?;
        let mut parent = file.parent();
        while let Some(dir) = parent.filter(|dir| dir.starts_with(root)) {
            dirs.insert(dir.to_path_buf());
            parent = dir.parent();
        }
    }
    for dir in dirs {
        set(&dir, 0o755)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bundle_names_are_plain_and_distinct() {
        let dir = tempfile::tempdir().unwrap();
        let make = |name: &str| {
            let path = dir.path().join(name);
            std::fs::create_dir_all(&path).unwrap();
            path
        };
        let names = bundle_names(&[make("lr0.01-s1"), make("my run (2)"), make(".hidden")]).unwrap();
        assert_eq!(names, ["lr0.01-s1", "my_run__2_", "_.hidden"]);
        let clash = bundle_names(&[make("a b"), make("a_b")]).unwrap_err();
        assert!(clash.to_string().contains("runs/a_b"), "{clash}");
    }

    #[test]
    fn bundle_paths_stay_inside_the_bundle() {
        let listable = |path: &str| check_listable(path, Path::new(path)).is_ok();
        assert!(listable("runs/a-1/checkpoints/best.safetensors"));
        for path in
            ["runs/a/../../../etc/passwd", "/etc/passwd", "runs//x", "runs/./x", "runs/a b", "runs/a\\b"]
        {
            assert!(!listable(path), "{path}");
        }
    }

    #[test]
    fn names_may_carry_a_link() {
        let orcid = "https://orcid.org/0000-0002-1825-0097";
        assert_eq!(name_and_link(&format!("Ada Lovelace <{orcid}>")), ("Ada Lovelace", Some(orcid)));
        assert_eq!(name_and_link("  Ada Lovelace "), ("Ada Lovelace", None));
        assert_eq!(name_and_link("Ada <ada@example.org>"), ("Ada <ada@example.org>", None), "not a URL");
    }

    #[test]
    fn an_existing_bundle_is_never_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        assert!(check_out(&dir.path().join("new")).is_ok());
        assert!(check_out(dir.path()).is_ok(), "an empty directory is taken");
        std::fs::write(dir.path().join("x"), b"x").unwrap();
        assert!(matches!(check_out(dir.path()), Err(PublishError::OutExists(_))));
        assert!(matches!(check_out(&dir.path().join("x")), Err(PublishError::OutExists(_))));
    }
}
