//! `rtrain verify BUNDLE`: a publication bundle checked as it was written. Every file against
//! SHA256SUMS (and no file beside those it lists), every `sha256` and `contentSize` the
//! RO-Crate records against its file, and each run's weights and checkpoints against the
//! sha256 its own manifest.json recorded when it trained. One byte changed anywhere, the
//! listing included, is a finding, and so is a listed file that is, or lies under, a symbolic
//! link: it would vouch for a file outside the bundle.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::{list_files, PublishError, CHECKSUMS, CRATE_METADATA, LISTING_LIMIT, RUNS_DIR};
use crate::run_dir::manifest::{Finding, Manifest};
use crate::util::files;

/// Whether `dir` is a publication bundle (it has an RO-Crate's metadata file) rather than a
/// run directory.
pub fn is_bundle(dir: &Path) -> bool {
    dir.join(CRATE_METADATA).is_file()
}

/// Checks the bundle at `dir`; one finding per file or check.
pub fn verify(dir: &Path) -> Result<Vec<Finding>, PublishError> {
    let read = |name: &str| {
        let path = dir.join(name);
        files::read_regular(&path, LISTING_LIMIT).map_err(|source| PublishError::Io { path, source })
    };
    let not_a_bundle =
        |name: &str, problem: String| PublishError::NotABundle { path: dir.join(name), problem };
    let listing =
        String::from_utf8(read(CHECKSUMS)?).map_err(|_| not_a_bundle(CHECKSUMS, "not UTF-8 text".into()))?;
    let metadata: Value = serde_json::from_slice(&read(CRATE_METADATA)?)
        .map_err(|e| not_a_bundle(CRATE_METADATA, format!("not JSON: {e}")))?;

    let mut findings = Vec::new();
    // What each listed file hashes to, found once and used by every check below.
    let mut actual: BTreeMap<String, String> = BTreeMap::new();
    for (number, line) in listing.lines().enumerate() {
        let Some((sha256, path)) = line.split_once("  ") else {
            findings.push(Finding::Mismatch(format!("{CHECKSUMS} line {}: not `SHA256  PATH`", number + 1)));
            continue;
        };
        if super::check_listable(path, Path::new(path)).is_err() {
            findings.push(Finding::Mismatch(format!(
                "{CHECKSUMS}: {path:?} is not a plain path inside the bundle; not read"
            )));
            continue;
        }
        let file = dir.join(path);
        // Never through a link: `MODEL_CARD.md -> /etc/passwd` would be checked, and vouched
        // for, as a file of the bundle.
        match files::sha256_below(dir, Path::new(path)) {
            Ok(found) => {
                findings.push(match found == sha256 {
                    true => Finding::Ok(file.display().to_string()),
                    false => Finding::Mismatch(format!(
                        "{}: sha256 {found}, {CHECKSUMS} says {sha256}",
                        file.display()
                    )),
                });
                actual.insert(path.to_string(), found);
            }
            Err(_) if !file.exists() => findings.push(Finding::Missing(file.display().to_string())),
            Err(error) => findings.push(Finding::Mismatch(error.to_string())),
        }
    }
    let listed: BTreeSet<&String> = actual.keys().collect();
    // Files the listing leaves out.
    for (relative, path) in list_files(dir, dir)? {
        if relative != CHECKSUMS && !listed.contains(&relative) {
            findings
                .push(Finding::Mismatch(format!("{}: in the bundle but not in {CHECKSUMS}", path.display())));
        }
    }

    findings.extend(crate_findings(dir, &metadata, &actual));
    findings.extend(run_findings(dir, &actual)?);
    Ok(findings)
}

/// The RO-Crate's `sha256` and `contentSize` of each data entity against the file.
fn crate_findings(dir: &Path, metadata: &Value, actual: &BTreeMap<String, String>) -> Vec<Finding> {
    let graph = metadata.get("@graph").and_then(Value::as_array).map_or(&[][..], Vec::as_slice);
    let mut findings = Vec::new();
    let mut checked = 0;
    for entity in graph {
        let (Some(id), Some(recorded)) =
            (entity.get("@id").and_then(Value::as_str), entity.get("sha256").and_then(Value::as_str))
        else {
            continue;
        };
        // Entities outside the bundle (`#...` identifiers: the training data) are described,
        // not held.
        if id.starts_with('#') || id.contains("://") {
            continue;
        }
        let file = dir.join(id);
        // Only files SHA256SUMS lists (plain paths inside the bundle) are looked at.
        let Some(found) = actual.get(id) else {
            findings.push(Finding::Missing(format!("{}: named by {CRATE_METADATA}", file.display())));
            continue;
        };
        match found == recorded {
            true => checked += 1,
            false => findings.push(Finding::Mismatch(format!(
                "{}: sha256 {found}, {CRATE_METADATA} says {recorded}",
                file.display()
            ))),
        }
        let size = std::fs::metadata(&file).map(|m| m.len()).ok();
        let recorded_size =
            entity.get("contentSize").and_then(Value::as_str).and_then(|s| s.parse::<u64>().ok());
        if size.is_some() && recorded_size != size {
            findings.push(Finding::Mismatch(format!(
                "{}: {} bytes, {CRATE_METADATA} says {}",
                file.display(),
                size.unwrap_or(0),
                recorded_size.map_or("nothing".into(), |s| s.to_string())
            )));
        }
    }
    findings.push(Finding::Ok(format!("{}: {checked} files' sha256", dir.join(CRATE_METADATA).display())));
    findings
}

/// Each bundled run's weights and checkpoints against its manifest.json.
pub(super) fn run_findings(
    dir: &Path,
    actual: &BTreeMap<String, String>,
) -> Result<Vec<Finding>, PublishError> {
    let runs: BTreeSet<&str> = actual
        .keys()
        .filter_map(|path| path.strip_prefix(&format!("{RUNS_DIR}/")))
        .filter_map(|rest| rest.split_once('/').map(|(run, _)| run))
        .collect();
    let mut findings = Vec::new();
    for run in runs {
        let run_dir: PathBuf = dir.join(RUNS_DIR).join(run);
        let manifest = Manifest::read(&run_dir)?;
        let recorded = manifest.weights.iter().map(|w| (&w.path, &w.sha256)).chain(&manifest.checkpoints);
        for (relative, sha256) in recorded {
            // Step checkpoints are listed by the manifest but not carried.
            let Some(found) = actual.get(&format!("{RUNS_DIR}/{run}/{relative}")) else { continue };
            let file = run_dir.join(relative);
            findings.push(match found == sha256 {
                true => Finding::Ok(format!("{}: as its manifest.json recorded", file.display())),
                false => Finding::Mismatch(format!(
                    "{}: sha256 {found}, its manifest.json says {sha256}",
                    file.display()
                )),
            });
        }
    }
    Ok(findings)
}
