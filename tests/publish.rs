//! `rtrain publish` on three seeds of one configuration, checked by the outside tools: the
//! RO-Crate loaded by ro-crate-py and validated by roc-validator against the Process Run Crate
//! profile, every recorded sha256 recomputed (hashlib, `sha256sum -c`), both CITATION.cff files
//! validated by cffconvert; the model card's numbers equal to the report's and the evaluations'.
//! Then `rtrain verify` on the bundle: as published it passes; one byte changed in any file
//! (weights, model card, RO-Crate, the checksum listing itself) or a file added fails it;
//! `--seal` after the author's edit makes it pass again, and refuses changed weights.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;
use sha2::{Digest, Sha256};

fn sha256(path: &Path) -> String {
    hex::encode(Sha256::digest(std::fs::read(path).unwrap()))
}

/// Every file under `dir`, relative to it, '/'-separated.
fn files_under(dir: &Path) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(next) = pending.pop() {
        for entry in std::fs::read_dir(next).unwrap() {
            let path = entry.unwrap().path();
            match path.is_dir() {
                true => pending.push(path),
                false => {
                    found.insert(path.strip_prefix(dir).unwrap().to_string_lossy().into_owned());
                }
            }
        }
    }
    found
}

fn verify(dir: &Path, bundle: &Path) -> std::process::Output {
    common::rtrain(dir).arg("verify").arg(bundle).output().unwrap()
}

/// Flips one byte of `file` at `offset`, runs `check`, and puts the byte back.
fn with_byte_flipped(file: &Path, offset: usize, check: impl FnOnce()) {
    let original = std::fs::read(file).unwrap();
    let mut changed = original.clone();
    changed[offset] ^= 0x01;
    std::fs::write(file, &changed).unwrap();
    check();
    std::fs::write(file, &original).unwrap();
}

fn assert_verify_fails(dir: &Path, bundle: &Path, names: &str, what: &str) {
    let output = verify(dir, bundle);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(1), "{what}: verify passed:\n{stdout}");
    let flagged: Vec<&str> = stdout.lines().filter(|l| !l.starts_with("ok")).collect();
    assert!(flagged.iter().any(|line| line.contains(names)), "{what}: no finding names {names}:\n{stdout}");
}

#[test]
fn a_three_seed_bundle_validates_and_verifies() {
    let dir = tempfile::tempdir().unwrap();
    let data = common::synth(dir.path(), 6, 4, 32);
    let data_arg = format!("data.root={:?}", data.display().to_string());
    let runs = ["seed-1", "seed-2", "seed-3"];
    for (seed, name) in runs.iter().enumerate() {
        common::assert_success(
            common::rtrain(dir.path())
                .args(["train", "--run-dir", name, "--set", &data_arg])
                .args([
                    "--set",
                    "data.image_size=32",
                    "--set",
                    "data.batch_size=4",
                    "--set",
                    "train.epochs=2",
                ])
                .args(["--set", "train.threads=1", "--set", &format!("run.seed={}", seed + 1)])
                .output()
                .unwrap(),
            name,
        );
    }
    let bundle = dir.path().join("bundle");
    common::assert_success(
        common::rtrain(dir.path())
            .arg("publish")
            .args(runs)
            .args(["--out", "bundle", "--author", "Ada Lovelace <https://orcid.org/0000-0002-1825-0097>"])
            .args(["--author", "Grace Hopper", "--license", "CC-BY-4.0"])
            .args(["--affiliation", "University of Texas at Austin <https://ror.org/00hj54h04>"])
            .args(["--publisher", "DesignSafe Data Depot <https://www.designsafe-ci.org>"])
            .output()
            .unwrap(),
        "publish",
    );

    // The outside tools.
    let checked = Command::new(common::python())
        .arg(common::repo().join("tests/reference/rocrate_check.py"))
        .arg(&bundle)
        .arg("--citation")
        .arg(common::repo().join("CITATION.cff"))
        .output()
        .unwrap();
    let checked = common::assert_success(checked, "rocrate_check.py");
    let checked: Value = serde_json::from_slice(&checked.stdout).unwrap();
    let validator = &checked["validator"];
    let issues = validator["issues"].as_array().unwrap();
    assert!(
        validator["passed"] == true && issues.is_empty(),
        "roc-validator (Process Run Crate 0.5, recommended): {validator:#}"
    );
    for citation in ["citation", "other_citation"] {
        assert!(checked[citation]["ok"] == true, "cffconvert on the {citation}: {}", checked[citation]);
    }
    let root_citation = std::fs::read_to_string(common::repo().join("CITATION.cff")).unwrap();
    assert!(
        root_citation.contains(&format!("version: \"{}\"", env!("CARGO_PKG_VERSION"))),
        "CITATION.cff at the repository root names another version than Cargo.toml's"
    );

    let crate_ = &checked["crate"];
    assert!(crate_["conformsTo"]
        .as_array()
        .unwrap()
        .iter()
        .any(|c| c == "https://w3id.org/ro/wfrun/process/0.5"));
    // Every file of the bundle is described with its sha256 and size, recomputed by hashlib.
    let described: BTreeSet<String> =
        crate_["files"].as_array().unwrap().iter().map(|f| f["id"].as_str().unwrap().to_string()).collect();
    let mut on_disk = files_under(&bundle);
    on_disk.remove("ro-crate-metadata.json");
    on_disk.remove("SHA256SUMS");
    assert_eq!(described, on_disk, "the RO-Crate's File entities against the bundle's files");
    let has_part: BTreeSet<String> =
        crate_["hasPart"].as_array().unwrap().iter().map(|f| f.as_str().unwrap().to_string()).collect();
    assert_eq!(has_part, on_disk, "the root's hasPart");
    for file in crate_["files"].as_array().unwrap() {
        assert_eq!(file["sha256_recorded"], file["sha256_actual"], "{}", file["id"]);
        assert_eq!(file["size_recorded"], file["size_actual"], "{}", file["id"]);
    }
    for name in runs {
        for weights in ["model.safetensors", "checkpoints/best.safetensors"] {
            assert_eq!(
                sha256(&bundle.join("runs").join(name).join(weights)),
                sha256(&dir.path().join(name).join(weights)),
                "{name}/{weights} is the run's own"
            );
        }
    }

    // One training action per run, by the rtrain that trained it, from its configuration and
    // data, to its weights; and the report's action.
    let actions = crate_["actions"].as_array().unwrap();
    assert_eq!(actions.len(), 4, "{actions:#?}");
    let manifest: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("seed-2/manifest.json")).unwrap())
            .unwrap();
    let train = actions.iter().find(|a| a["id"] == "#train-seed-2").expect("seed-2's action");
    assert_eq!(train["instrument"]["name"], "rtrain");
    assert_eq!(train["instrument"]["softwareVersion"], manifest["rtrain_version"]);
    assert_eq!(
        train["instrument"]["identifier"],
        format!("git:{}", manifest["git_revision"].as_str().unwrap())
    );
    assert_eq!(train["instrument"]["sha256"], manifest["software"]["rtrain_sha256"]);
    let with_offset = |time: &Value| time.as_str().unwrap().replace('Z', "+00:00");
    assert_eq!(train["startTime"], with_offset(&manifest["started"]));
    assert_eq!(train["endTime"], with_offset(&manifest["finished"]));
    let results: Vec<&str> =
        train["result"].as_array().unwrap().iter().map(|r| r.as_str().unwrap()).collect();
    for expected in [
        "runs/seed-2/model.safetensors",
        "runs/seed-2/checkpoints/best.safetensors",
        "runs/seed-2/metrics.jsonl",
    ] {
        assert!(results.contains(&expected), "{expected} not among {results:?}");
    }
    let objects: Vec<&str> =
        train["object"].as_array().unwrap().iter().map(|r| r.as_str().unwrap()).collect();
    assert!(objects.contains(&"runs/seed-2/config.toml"), "{objects:?}");
    // The data it read: two splits, shared by the three runs, each file with its own sha256.
    let collections = crate_["data"].as_array().unwrap();
    assert_eq!(collections.len(), 2, "{collections:#?}");
    for split in ["train", "val"] {
        let collection = collections
            .iter()
            .find(|c| c["name"].as_str().unwrap().starts_with(&format!("{split} split")))
            .unwrap_or_else(|| panic!("no {split} split among {collections:#?}"));
        assert!(
            objects.contains(&collection["id"].as_str().unwrap()),
            "{} not an object of seed-2",
            collection["id"]
        );
        let described: BTreeMap<String, String> = collection["files"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(path, sha)| (path.clone(), sha.as_str().unwrap().to_string()))
            .collect();
        let actual: BTreeMap<String, String> = files_under(&data.join(split))
            .into_iter()
            .map(|f| (f.clone(), sha256(&data.join(split).join(f))))
            .collect();
        assert_eq!(described, actual, "the {split} split's files and their sha256");
    }

    // The model card: its nine sections, the author's parts marked, and its numbers those of
    // the report's seed statistics and of each run's evaluation.
    let card = std::fs::read_to_string(bundle.join("MODEL_CARD.md")).unwrap();
    for section in [
        "## Model details",
        "## Intended use",
        "## Factors",
        "## Metrics",
        "## Evaluation data",
        "## Training data",
        "## Quantitative analyses",
        "## Ethical considerations",
        "## Caveats and recommendations",
    ] {
        assert!(card.contains(section), "model card without {section}");
    }
    assert!(
        card.contains("Ada Lovelace, Grace Hopper (University of Texas at Austin)")
            && card.contains("CC-BY-4.0")
    );
    assert!(card.contains("**Primary intended uses:** **[AUTHOR]**"), "the author's part is not marked");
    let seeds = std::fs::read_to_string(bundle.join("report/seeds.csv")).unwrap();
    let mut reader = csv::Reader::from_reader(seeds.as_bytes());
    let headers = reader.headers().unwrap().clone();
    let column = |name: &str| headers.iter().position(|h| h == name).unwrap();
    let mut rows = 0;
    for row in reader.records().map(Result::unwrap) {
        let number = |name: &str| row[column(name)].parse::<f64>().unwrap();
        let line = format!(
            "| {} | {} | {} | {:.4} | {:.4} | [{:.4}, {:.4}] |",
            &row[column("group")],
            &row[column("metric")],
            &row[column("n")],
            number("mean"),
            number("sd"),
            number("ci_low"),
            number("ci_high")
        );
        assert!(card.contains(&line), "the model card lacks the seed statistics row {line}");
        rows += 1;
    }
    assert!(rows >= 8, "{rows} seed statistics rows");
    for name in runs {
        let evaluation: Value = serde_json::from_str(
            &std::fs::read_to_string(dir.path().join(name).join("evaluation/metrics.json")).unwrap(),
        )
        .unwrap();
        let top1 = format!(
            "{:.4} [{:.4}, {:.4}]",
            evaluation["metrics"]["top1"].as_f64().unwrap(),
            evaluation["intervals"]["top1"]["low"].as_f64().unwrap(),
            evaluation["intervals"]["top1"]["high"].as_f64().unwrap()
        );
        assert!(card.contains(&format!("| {name} | {top1} |")), "{name}'s top-1 with its interval {top1}");
    }

    // Checked without rtrain, then by rtrain verify.
    let sums = Command::new("sha256sum")
        .args(["--check", "--strict", "--quiet", "SHA256SUMS"])
        .current_dir(&bundle)
        .output()
        .unwrap();
    common::assert_success(sums, "sha256sum --check");
    common::assert_success(verify(dir.path(), &bundle), "verify of the bundle as published");

    let weights = bundle.join("runs/seed-2/model.safetensors");
    with_byte_flipped(&weights, 200, || {
        assert_verify_fails(dir.path(), &bundle, "runs/seed-2/model.safetensors", "weights changed")
    });
    with_byte_flipped(&bundle.join("MODEL_CARD.md"), 30, || {
        assert_verify_fails(dir.path(), &bundle, "MODEL_CARD.md", "model card changed")
    });
    let metadata = std::fs::read_to_string(bundle.join("ro-crate-metadata.json")).unwrap();
    let in_a_name = metadata.find("Process Run Crate").unwrap() + 3;
    with_byte_flipped(&bundle.join("ro-crate-metadata.json"), in_a_name, || {
        assert_verify_fails(dir.path(), &bundle, "ro-crate-metadata.json", "RO-Crate changed")
    });
    let listing = std::fs::read_to_string(bundle.join("SHA256SUMS")).unwrap();
    let in_a_name = listing.find("runs/seed-1/config.toml").unwrap() + 5;
    with_byte_flipped(&bundle.join("SHA256SUMS"), in_a_name, || {
        assert_verify_fails(dir.path(), &bundle, "seed-1", "listing changed")
    });
    std::fs::write(bundle.join("runs/seed-1/extra.txt"), b"x").unwrap();
    assert_verify_fails(dir.path(), &bundle, "extra.txt", "file added");
    std::fs::remove_file(bundle.join("runs/seed-1/extra.txt")).unwrap();
    common::assert_success(verify(dir.path(), &bundle), "verify after every change was undone");

    // The author fills in a placeholder; sealing makes the bundle whole again.
    let filled =
        card.replacen("**Primary intended uses:** **[AUTHOR]**", "**Primary intended uses:** triage", 1);
    std::fs::write(bundle.join("MODEL_CARD.md"), filled).unwrap();
    assert_verify_fails(dir.path(), &bundle, "MODEL_CARD.md", "card edited, not sealed");
    common::assert_success(
        common::rtrain(dir.path()).args(["publish", "--seal", "bundle"]).output().unwrap(),
        "seal",
    );
    common::assert_success(verify(dir.path(), &bundle), "verify after sealing");
    let sums = Command::new("sha256sum")
        .args(["--check", "--strict", "--quiet", "SHA256SUMS"])
        .current_dir(&bundle)
        .output()
        .unwrap();
    common::assert_success(sums, "sha256sum --check after sealing");
    // Weights changed are not sealed over: their run's manifest still says what they were.
    with_byte_flipped(&weights, 200, || {
        let sealed = common::rtrain(dir.path()).args(["publish", "--seal", "bundle"]).output().unwrap();
        assert_eq!(sealed.status.code(), Some(1));
        assert!(String::from_utf8_lossy(&sealed.stderr).contains("model.safetensors"));
    });
}

/// What publish refuses, leaving nothing behind: an existing bundle, a run whose weights
/// changed after training, a run that has not finished.
#[test]
fn publish_refuses_what_it_cannot_vouch_for() {
    let dir = tempfile::tempdir().unwrap();
    let data = common::fixtures::synth_tree();
    let data_arg = format!("data.root={:?}", data.display().to_string());
    common::assert_success(
        common::rtrain(dir.path())
            .args(["train", "--run-dir", "run", "--set", &data_arg])
            .args(["--set", "data.image_size=32", "--set", "data.batch_size=4", "--set", "train.epochs=1"])
            .args(["--set", "train.threads=1"])
            .output()
            .unwrap(),
        "train",
    );
    let publish =
        |out: &str| common::rtrain(dir.path()).args(["publish", "run", "--out", out]).output().unwrap();
    let leftovers = || -> Vec<PathBuf> {
        std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with(".publish-"))
            .collect()
    };

    std::fs::create_dir(dir.path().join("taken")).unwrap();
    std::fs::write(dir.path().join("taken/notes.txt"), b"mine").unwrap();
    let refused = publish("taken");
    assert_eq!(refused.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("already exists"));
    assert_eq!(std::fs::read(dir.path().join("taken/notes.txt")).unwrap(), b"mine");

    let weights = dir.path().join("run/model.safetensors");
    let original = std::fs::read(&weights).unwrap();
    let mut changed = original.clone();
    let last = changed.len() - 1;
    changed[last] ^= 0x01;
    std::fs::write(&weights, &changed).unwrap();
    let refused = publish("changed");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("model.safetensors") && stderr.contains("changed after training"), "{stderr}");
    assert!(!dir.path().join("changed").exists() && leftovers().is_empty(), "a refused publish left files");
    std::fs::write(&weights, &original).unwrap();

    let manifest_path = dir.path().join("run/manifest.json");
    let manifest = std::fs::read_to_string(&manifest_path).unwrap();
    let mut unfinished: Value = serde_json::from_str(&manifest).unwrap();
    unfinished["finished"] = Value::Null;
    std::fs::write(&manifest_path, serde_json::to_string(&unfinished).unwrap()).unwrap();
    let refused = publish("unfinished");
    assert!(String::from_utf8_lossy(&refused.stderr).contains("has not finished"));
    assert!(!dir.path().join("unfinished").exists() && leftovers().is_empty());
    std::fs::write(&manifest_path, manifest).unwrap();

    common::assert_success(publish("fine"), "publish of the restored run");
    assert!(dir.path().join("fine/MODEL_CARD.md").is_file() && leftovers().is_empty());
    let card = std::fs::read_to_string(dir.path().join("fine/MODEL_CARD.md")).unwrap();
    assert!(card.contains("1 run(s): with fewer than three seeds"), "the single run is not called out");
    // With the people, licence and publisher left as placeholders it still validates.
    let checked = Command::new(common::python())
        .arg(common::repo().join("tests/reference/rocrate_check.py"))
        .arg(dir.path().join("fine"))
        .output()
        .unwrap();
    let checked: Value =
        serde_json::from_slice(&common::assert_success(checked, "rocrate_check.py").stdout).unwrap();
    // Placeholders have no URL, which the recommended level asks of organisations; nothing is
    // missing that the profile requires.
    let issues = checked["validator"]["issues"].as_array().unwrap();
    assert!(
        issues.iter().all(|i| i["severity"] == "RECOMMENDED" && i["check"] == "ro-crate-1.1_31.2"),
        "{issues:#?}"
    );
    assert!(checked["citation"]["ok"] == true, "{}", checked["citation"]);
}
