//! `rtrain predict --out DIR` as a campaign's users run it: a folder of photos (nested, some
//! broken, some geotagged by Pillow) and the same photos as shards, checked against torchvision's
//! probabilities, Pillow's GPS tags and the `geojson` package; the same bytes at 1 and 2 ranks
//! (real `mpirun`) and at 0 and 2 loader workers; a SIGTERM'd and a SIGKILL'd job resumed to the
//! bytes of an uninterrupted one.

use crate::common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

/// The evaluation transform the torchvision reference applies: Resize((32, 32)) of the upright
/// photo, ToTensor, Normalize; JPEGs decoded at full size (no DCT draft), as Pillow decodes them;
/// fp32 (predict computes in bf16 where the CPU has it natively, as training does).
const AS_TORCHVISION: [&str; 8] = [
    "--set",
    "data.image_size=32",
    "--set",
    "data.eval_transform=resize",
    "--set",
    "data.jpeg_draft=false",
    "--set",
    "train.precision=fp32",
];

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn reference(args: &[&std::ffi::OsStr]) -> Value {
    let output = Command::new(common::python())
        .arg(common::repo().join("tests/reference/predict_reference.py"))
        .args(args)
        .output()
        .unwrap();
    let output = common::assert_success(output, "predict_reference.py");
    serde_json::from_slice(&output.stdout).unwrap()
}

/// A ResNet-18 trained for one epoch on a small synthetic set (`dir/data`), its final weights.
fn trained_model(dir: &Path, train_per_class: usize, val_per_class: usize, photo_size: u32) -> PathBuf {
    let data = common::synth(dir, train_per_class, val_per_class, photo_size);
    let output = common::rtrain(dir)
        .args(["train", "--run-dir", "run"])
        .args(["--set", &format!("data.root={:?}", data.display().to_string())])
        .args(AS_TORCHVISION)
        .args(["--set", "data.batch_size=8", "--set", "train.epochs=1", "--set", "train.threads=1"])
        .output()
        .unwrap();
    common::assert_success(output, "rtrain train");
    dir.join("run/model.safetensors")
}

/// Batches of 4, so that parts of 4 images are possible (parts are whole batches).
const SMALL_BATCHES: [&str; 2] = ["--set", "data.eval_batch_size=4"];

fn predict(dir: &Path, model: &Path, out: &str) -> assert_cmd::Command {
    let mut command = common::rtrain(dir);
    command.args(["predict", "--checkpoint"]).arg(model).args(AS_TORCHVISION).args(SMALL_BATCHES);
    command.args(["--out", out]);
    command
}

fn json_file(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

const CLASSES: [&str; 4] = ["0-none", "1-minor", "2-moderate", "3-severe"];

/// A folder as a reconnaissance team brings it back: photos in nested folders (one without an
/// extension), four geotagged photos and one without GPS, a corrupt JPEG, a text file named
/// `.jpg`, an empty `.jpg` and a README that is no image. Returns the bad files' names.
fn campaign_folder(dir: &Path, data: &Path) -> (PathBuf, Vec<String>) {
    let campaign = dir.join("campaign");
    let photos = campaign.join("day1/street");
    std::fs::create_dir_all(&photos).unwrap();
    for class in CLASSES {
        for entry in std::fs::read_dir(data.join("val").join(class)).unwrap() {
            let path = entry.unwrap().path();
            std::fs::copy(
                &path,
                photos.join(format!("{class}-{}", path.file_name().unwrap().to_string_lossy())),
            )
            .unwrap();
        }
    }
    let first = std::fs::read_dir(&photos).unwrap().next().unwrap().unwrap().path();
    std::fs::copy(&first, campaign.join("day1/IMG_0001")).unwrap();
    reference(&["geotag".as_ref(), campaign.join("day2").as_os_str()]);
    let mut corrupt = std::fs::read(&first).unwrap();
    corrupt.truncate(corrupt.len() / 3);
    corrupt[200..260].fill(0x55);
    std::fs::write(campaign.join("day2/corrupt.jpg"), corrupt).unwrap();
    std::fs::write(campaign.join("day2/notes.jpg"), "not a photo\n").unwrap();
    std::fs::write(campaign.join("day2/empty.jpg"), b"").unwrap();
    std::fs::write(campaign.join("day2/README.txt"), "field notes\n").unwrap();
    let bad = ["corrupt.jpg", "notes.jpg", "empty.jpg"].map(|f| format!("campaign/day2/{f}")).to_vec();
    (campaign, bad)
}

/// The folder's predictions equal torchvision's; the same photos as shards give the same
/// probabilities; GPS and capture time are Pillow's; the GeoJSON is valid; bad files are rows
/// with their error (and end the job with `--on-bad-image error`).
#[test]
fn a_campaign_folder_and_its_shards_agree_with_torchvision_pillow_and_geojson() {
    let dir = tempfile::tempdir().unwrap();
    let model = trained_model(dir.path(), 6, 3, 48);
    let data = dir.path().join("data");
    let (_, bad) = campaign_folder(dir.path(), &data);

    let output =
        predict(dir.path(), &model, "out").args(["campaign", "--top", "2", "--part-size", "5"]).output();
    let output = common::assert_success(output.unwrap(), "rtrain predict --out");
    assert_eq!(text(&output.stdout).trim(), "out");
    let out = dir.path().join("out");
    let rows = common::csv_rows(&out.join("predictions.csv"));
    let names: Vec<&str> = rows.iter().map(|r| r["path"].as_str()).collect();
    // 12 validation photos, the extensionless copy, 6 tagged photos, 3 bad files; no README.
    assert_eq!(rows.len(), 12 + 1 + 6 + 3, "{names:?}");
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(names, sorted, "rows are in the sorted order of their paths");
    assert!(names.contains(&"campaign/day1/IMG_0001"), "{names:?}");
    assert!(!names.iter().any(|n| n.ends_with("README.txt")), "{names:?}");
    for row in &rows {
        let is_bad = bad.contains(&row["path"]);
        assert_eq!(row["error"].is_empty(), !is_bad, "{row:?}");
        assert_eq!(row["class"].is_empty(), is_bad, "{row:?}");
    }
    let errors: BTreeMap<&str, &str> = rows
        .iter()
        .filter(|r| !r["error"].is_empty())
        .map(|r| (r["path"].as_str(), r["error"].as_str()))
        .collect();
    assert!(errors.values().all(|e| e.starts_with("cannot decode")), "{errors:?}");

    // Probabilities against torchvision on the same photos, with `rtrain export`'s weights.
    let exported = dir.path().join("exported.safetensors");
    common::rtrain(dir.path()).args(["export", "--checkpoint"]).arg(&model).arg(&exported).assert().success();
    let good: Vec<&BTreeMap<String, String>> = rows.iter().filter(|r| r["error"].is_empty()).collect();
    let mut args: Vec<std::ffi::OsString> =
        vec!["predict".into(), "resnet18".into(), "4".into(), exported.clone().into(), "32".into()];
    args.extend(good.iter().map(|r| dir.path().join(&r["path"]).into_os_string()));
    let torch = reference(&args.iter().map(|a| a.as_os_str()).collect::<Vec<_>>());
    let mut worst: f64 = 0.0;
    for row in &good {
        let theirs = &torch[dir.path().join(&row["path"]).to_str().unwrap()];
        for (c, class) in CLASSES.iter().enumerate() {
            let ours: f64 = row[&format!("probability_{class}")].parse().unwrap();
            worst = worst.max((ours - theirs[c].as_f64().unwrap()).abs());
        }
        let best =
            (0..4).max_by(|&a, &b| theirs[a].as_f64().unwrap().total_cmp(&theirs[b].as_f64().unwrap()));
        assert_eq!(row["class"], CLASSES[best.unwrap()], "{row:?}");
        assert_eq!(row["top1_class"], row["class"]);
    }
    eprintln!(
        "predict --out vs torchvision: max |probability difference| {worst:e} over {} photos",
        good.len()
    );
    assert!(worst < 1e-5, "rtrain predict and torchvision differ by {worst:e}");

    // GPS and capture time as Pillow wrote them, in all four hemispheres.
    let tagged = reference(&["geotag".as_ref(), dir.path().join("tags-again").as_os_str()]);
    for (file, expected) in tagged.as_object().unwrap() {
        let row = rows.iter().find(|r| r["path"] == format!("campaign/day2/{file}")).unwrap();
        for key in ["latitude", "longitude", "altitude"] {
            let ours: f64 = row[key].parse().unwrap();
            let theirs = expected[key].as_f64().unwrap();
            assert!((ours - theirs).abs() < 1e-9, "{file} {key}: {ours} vs Pillow's {theirs}");
        }
        assert_eq!(row["capture_time"], expected["capture_time"].as_str().unwrap(), "{file}");
    }
    let untagged = rows.iter().find(|r| r["path"] == "campaign/day2/nogps.jpg").unwrap();
    assert!(untagged["latitude"].is_empty() && untagged["capture_time"].is_empty(), "{untagged:?}");
    // A malformed GPS block is no position and a warning, and the photo is still classified.
    let malformed = rows.iter().find(|r| r["path"] == "campaign/day2/badgps.jpg").unwrap();
    assert!(malformed["latitude"].is_empty() && !malformed["class"].is_empty(), "{malformed:?}");
    let stderr = text(&output.stderr);
    assert!(
        stderr.contains("campaign/day2/badgps.jpg: GPS block not read (GPSLatitudeRef is 'X'"),
        "{stderr}"
    );

    // The GeoJSON: valid for the geojson package, one point per tagged photo.
    let geojson = reference(&["geojson".as_ref(), out.join("predictions.geojson").as_os_str()]);
    assert_eq!(geojson["valid"], true, "{geojson}");
    assert_eq!(geojson["points"].as_array().unwrap().len(), 4, "{geojson}");

    let summary = json_file(&out.join("summary.json"));
    assert_eq!(summary["images"], 22, "{summary}");
    assert_eq!(summary["refused"], 3, "{summary}");
    // Four tagged photos; badgps.jpg's block is present but unreadable, counted apart.
    assert_eq!(summary["without_gps"], 19 - 4 - 1, "{summary}");
    assert_eq!(summary["gps_unreadable"], 1, "{summary}");
    assert_eq!(summary["gps_unreadable_examples"][0]["path"], "campaign/day2/badgps.jpg", "{summary}");
    assert_eq!(summary["ignored_files"], 1, "{summary}");
    let per_class: u64 =
        summary["per_class"].as_object().unwrap().values().map(|v| v.as_u64().unwrap()).sum();
    assert_eq!(per_class, 19, "{summary}");
    let jsonl = std::fs::read_to_string(out.join("predictions.jsonl")).unwrap();
    assert_eq!(jsonl.lines().count(), 22);

    // --on-bad-image error: the job fails, naming the first bad image it meets.
    let strict =
        predict(dir.path(), &model, "strict").args(["campaign", "--on-bad-image", "error"]).output().unwrap();
    assert_eq!(strict.status.code(), Some(1), "{}", text(&strict.stderr));
    let stderr = text(&strict.stderr);
    assert!(bad.iter().any(|b| stderr.contains(&format!("{b}: cannot decode"))), "{stderr}");
    assert!(!dir.path().join("strict/predictions.csv").exists());

    // The same photos as shards (stored unchanged): each sample is named by its source photo
    // (`<key>.json`), with the same sha256 and the same probabilities.
    common::rtrain(dir.path()).args(["data", "prepare"]).arg(&data).arg("shards").assert().success();
    let output = predict(dir.path(), &model, "from-shards").arg("shards").output().unwrap();
    common::assert_success(output, "rtrain predict --out on shards");
    let from_shards = common::csv_rows(&dir.path().join("from-shards/predictions.csv"));
    assert_eq!(from_shards.len(), 6 * 4 + 3 * 4, "every sample of both splits");
    for row in &from_shards {
        let source = data.join(row["path"].strip_prefix("shards/").unwrap());
        let bytes = std::fs::read(&source).unwrap_or_else(|e| panic!("{}: {e}", source.display()));
        assert_eq!(row["sha256"], hex_sha256(&bytes), "{}", row["path"]);
    }
    let mut compared = 0;
    for row in &good {
        for twin in from_shards.iter().filter(|r| r["sha256"] == row["sha256"]) {
            for class in CLASSES {
                let key = format!("probability_{class}");
                assert_eq!(twin[&key], row[&key], "{} vs {}", twin["path"], row["path"]);
            }
            compared += 1;
        }
    }
    assert!(compared >= 12, "only {compared} shard samples matched a photo by sha256");

    // Geotagged photos re-encoded smaller (`--resize` drops their Exif): the shards keep
    // where each was taken, and the predictions map them as the photos themselves.
    let tagged = dir.path().join("tagged/val/photos");
    std::fs::create_dir_all(&tagged).unwrap();
    for file in ["ne.jpg", "nw.jpg", "se.jpg", "sw.jpg", "nogps.jpg"] {
        std::fs::copy(dir.path().join("campaign/day2").join(file), tagged.join(file)).unwrap();
    }
    common::rtrain(dir.path())
        .args(["data", "prepare", "tagged", "tagged-shards", "--splits", "val", "--resize", "24"])
        .assert()
        .success();
    let output = predict(dir.path(), &model, "tagged-out").arg("tagged-shards").output().unwrap();
    common::assert_success(output, "rtrain predict --out on resized shards");
    let mapped = common::csv_rows(&dir.path().join("tagged-out/predictions.csv"));
    assert_eq!(mapped.len(), 5);
    for row in &mapped {
        let file = row["path"].strip_prefix("tagged-shards/val/photos/").unwrap();
        let photo = rows.iter().find(|r| r["path"] == format!("campaign/day2/{file}")).unwrap();
        for key in ["sha256", "width", "height", "latitude", "longitude", "altitude", "capture_time"] {
            assert_eq!(row[key], photo[key], "{file} {key}");
        }
    }
}

fn hex_sha256(bytes: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(bytes))
}

/// `n` JPEGs of `size` pixels under `dir/many`, for a job long enough to interrupt.
fn many_photos(dir: &Path, data: &Path, copies: usize) -> PathBuf {
    let many = dir.join("many");
    let photos: Vec<PathBuf> = CLASSES
        .iter()
        .flat_map(|class| std::fs::read_dir(data.join("train").join(class)).unwrap())
        .map(|entry| entry.unwrap().path())
        .collect();
    for copy in 0..copies {
        let sub = many.join(format!("batch{copy:02}"));
        std::fs::create_dir_all(&sub).unwrap();
        for photo in &photos {
            // Each class numbers its photos from 00000.jpg.
            let class = photo.parent().unwrap().file_name().unwrap().to_string_lossy();
            std::fs::copy(
                photo,
                sub.join(format!("{class}-{}", photo.file_name().unwrap().to_string_lossy())),
            )
            .unwrap();
        }
    }
    many
}

fn prediction_files(out: &Path) -> Vec<(String, Vec<u8>)> {
    ["predictions.csv", "predictions.jsonl", "predictions.geojson"]
        .iter()
        .map(|name| (name.to_string(), std::fs::read(out.join(name)).unwrap()))
        .collect()
}

fn parts_done(out: &Path) -> usize {
    std::fs::read_dir(out.join("parts")).map_or(0, |entries| {
        entries.filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().starts_with("part-")).count()
    })
}

/// Starts a job on `many`, waits for its first finished part, and sends `signal`; returns the
/// exit status.
fn interrupt(dir: &Path, model: &Path, many: &Path, out: &str, signal: i32) -> std::process::ExitStatus {
    let mut child = Command::new(assert_cmd::cargo::cargo_bin("rtrain"))
        .current_dir(dir)
        .args(["predict", "--checkpoint"])
        .arg(model)
        .args(AS_TORCHVISION)
        .args(SMALL_BATCHES)
        .args(["--out", out, "--part-size", "4", "--set", "train.threads=1", "--set", "data.workers=0"])
        .arg(many)
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    while parts_done(&dir.join(out)) == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    // SAFETY: kill takes plain integers; the child is ours and not yet reaped.
    unsafe { libc::kill(child.id() as i32, signal) };
    child.wait().unwrap()
}

/// The same bytes at 1 rank with 0 and 2 workers and at 2 ranks under mpirun; a SIGTERM'd job
/// exits 75 with whole parts only and continues to the same bytes; so does a SIGKILL'd one.
/// (The part size is the same throughout: it decides which images share a batch.)
#[test]
fn ranks_workers_and_interruptions_do_not_change_a_byte() {
    let dir = tempfile::tempdir().unwrap();
    let model = trained_model(dir.path(), 10, 2, 96);
    let many = many_photos(dir.path(), &dir.path().join("data"), 4);
    let run = |out: &str, extra: &[&str]| {
        let output = predict(dir.path(), &model, out)
            .args(["--part-size", "4", "--set", "train.threads=1"])
            .args(extra)
            .arg(&many)
            .output()
            .unwrap();
        common::assert_success(output, out);
        prediction_files(&dir.path().join(out))
    };
    let reference = run("w0", &["--set", "data.workers=0"]);
    assert_eq!(reference[0].1.iter().filter(|&&b| b == b'\n').count(), 1 + 4 * 40);
    assert_eq!(run("w2", &["--set", "data.workers=2"]), reference, "0 vs 2 loader workers");

    let mpi = common::mpirun(dir.path())
        .args(["-np", "2"])
        .arg(assert_cmd::cargo::cargo_bin("rtrain"))
        .args(["predict", "--checkpoint"])
        .arg(&model)
        .args(AS_TORCHVISION)
        .args(SMALL_BATCHES)
        .args(["--out", "mpi", "--part-size", "4", "--set", "train.threads=1", "--set", "data.workers=1"])
        .arg(&many)
        .output()
        .unwrap();
    common::assert_success(mpi, "mpirun -np 2 rtrain predict --out");
    assert_eq!(prediction_files(&dir.path().join("mpi")), reference, "1 vs 2 ranks");
    assert_eq!(json_file(&dir.path().join("mpi/summary.json"))["ranks"], 2);

    for (out, signal) in [("term", libc::SIGTERM), ("kill", libc::SIGKILL)] {
        let status = interrupt(dir.path(), &model, &many, out, signal);
        let stopped = dir.path().join(out);
        let done = parts_done(&stopped);
        if signal == libc::SIGTERM {
            assert_eq!(status.code(), Some(75), "{out}: {status}");
        } else {
            assert_eq!(std::os::unix::process::ExitStatusExt::signal(&status), Some(libc::SIGKILL));
        }
        assert!((1..40).contains(&done), "{out}: {done} of 40 parts done when stopped");
        assert!(!stopped.join("predictions.csv").exists(), "{out}: merged files before the end");
        // Without --part-size: the continued job's parts of 4 (job.json).
        let again = predict(dir.path(), &model, out)
            .args(["--set", "train.threads=1", "--set", "data.workers=0"])
            .arg(&many)
            .output()
            .unwrap();
        common::assert_success(again, &format!("{out} continued"));
        let summary = json_file(&stopped.join("summary.json"));
        assert!(summary["parts_resumed"].as_u64().unwrap() >= done as u64, "{out}: {summary}");
        assert_eq!(prediction_files(&stopped), reference, "{out}: continued vs uninterrupted");
    }

    // A rerun into a directory of another job is refused, naming it.
    let other = predict(dir.path(), &model, "w0").args(["--part-size", "8"]).arg(&many).output().unwrap();
    assert_eq!(other.status.code(), Some(1));
    assert!(text(&other.stderr).contains("holds the parts of another prediction"), "{}", text(&other.stderr));
}
