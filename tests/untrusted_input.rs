//! Untrusted input read safely: the cases of the issue "Untrusted files read safely: a hostile
//! .pth, image, manifest or value never crashes, hangs, leaks memory or loses a run", through
//! the real binary. Each failed on the code before it. This file holds the settings cases
//! (values that passed validation and then crashed, a run name that escaped `run.dir`, a
//! misspelt environment variable ignored in silence), run directories and checkpoints, and
//! images whose header declares more pixels than anyone photographs.

use crate::common;

use std::path::Path;

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A one-epoch run of 32 px images, batches of 4, one thread, into `dir/run`, with `extra`
/// arguments after the settings.
fn train_tiny(dir: &Path, data: &Path, run: &str, extra: &[&str]) -> std::process::Output {
    common::rtrain(dir)
        .args(["train", "--run-dir", run])
        .args(["--set", &format!("data.root={:?}", data.display().to_string())])
        .args(["--set", "data.image_size=32", "--set", "data.batch_size=4", "--set", "train.threads=1"])
        .args(["--set", "train.epochs=1"])
        .args(extra)
        .output()
        .unwrap()
}

/// `rtrain config show --set KEY=VALUE`: the configuration is loaded and validated exactly as
/// `train` loads it, and nothing runs.
fn show_with(dir: &Path, setting: &str) -> std::process::Output {
    common::rtrain(dir).args(["config", "show", "--set", setting]).output().unwrap()
}

/// A value far outside any sane range for each numeric setting in `configs/default.toml` (the
/// file every key must be documented in): a float of 1e300, an integer of 10^13, which a u32
/// setting cannot even hold, each element of a list.
fn far_outside(value: &toml::Value) -> Option<String> {
    match value {
        toml::Value::Float(_) => Some("1e300".into()),
        toml::Value::Integer(_) => Some("10000000000000".into()),
        toml::Value::Array(items) if !items.is_empty() => {
            let each: Option<Vec<String>> = items.iter().map(far_outside).collect();
            each.map(|each| format!("[{}]", each.join(", ")))
        }
        _ => None,
    }
}

/// Case 10: every numeric setting has a range that validation enforces. `data.prefetch =
/// 100000000` aborted on a 10.4 GB allocation, `model.head_hidden = [100000000]` panicked in
/// tch, `dist.timeout_s = 1e300` panicked converting to a Duration, and `dist.timeout_s =
/// 1e-9`, `data.workers = 2000`, `train.threads = 2000` and `data.image_size = 100000` passed
/// and failed later. Each is refused before anything runs: exit 2, naming the key.
#[test]
fn every_numeric_setting_refuses_a_value_far_outside_its_range() {
    let dir = tempfile::tempdir().unwrap();
    let defaults: toml::Table =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("configs/default.toml"))
            .unwrap()
            .parse()
            .unwrap();
    let mut cases: Vec<(String, String)> = Vec::new();
    for (section, table) in &defaults {
        for (key, value) in table.as_table().unwrap() {
            let key = format!("{section}.{key}");
            // The seed spans its whole type: every u64 is a seed.
            if key == "run.seed" {
                continue;
            }
            if let Some(value) = far_outside(value) {
                cases.push((key, value));
            }
        }
    }
    assert!(cases.len() >= 33, "numeric settings found in configs/default.toml: {cases:?}");
    // The issue's own values, and settings that are not numbers by default ("auto", []).
    for (key, value) in [
        ("data.prefetch", "100000000"),
        ("model.head_hidden", "[100000000]"),
        ("dist.timeout_s", "1e300"),
        ("dist.timeout_s", "1e-9"),
        ("data.workers", "2000"),
        ("train.threads", "2000"),
        ("data.image_size", "100000"),
        ("optim.lr", "-1"),
    ] {
        cases.push((key.into(), value.into()));
    }
    let mut wrong = Vec::new();
    for (key, value) in &cases {
        let output = show_with(dir.path(), &format!("{key}={value}"));
        let stderr = text(&output.stderr);
        if output.status.code() != Some(2) || !stderr.contains(key.as_str()) {
            wrong.push(format!("{key}={value}: exit {:?}, {stderr}", output.status.code()));
        }
    }
    assert!(wrong.is_empty(), "accepted or refused without naming the key:\n{}", wrong.join("\n"));
    // The message gives the range, readably.
    let output = show_with(dir.path(), "data.prefetch=100000000");
    assert!(
        text(&output.stderr).contains("data.prefetch: 100000000 is outside [0, 64]"),
        "{}",
        text(&output.stderr)
    );
    let output = show_with(dir.path(), "dist.timeout_s=1e300");
    assert!(text(&output.stderr).contains("1e300 is outside [1, 604800]"), "{}", text(&output.stderr));
    // And the edges of a range are accepted.
    for setting in ["data.prefetch=64", "dist.timeout_s=1", "train.threads=1024", "data.image_size=4096"] {
        let output = show_with(dir.path(), setting);
        assert!(output.status.success(), "{setting}: {}", text(&output.stderr));
    }
}

/// Case 11: `run.name = "../../x"` wrote the run outside `run.dir`. A name is one directory
/// name; a path is what `--run-dir` is for.
#[test]
fn a_run_name_cannot_leave_the_run_directory() {
    let dir = tempfile::tempdir().unwrap();
    // Named after the test's own directory, so that nothing else on the machine is mistaken
    // for the escaped run.
    let escaped = format!("{}-escaped", dir.path().file_name().unwrap().to_string_lossy());
    for name in [format!("../../{escaped}"), "a/b".into(), "..".into(), ".".into()] {
        let output = common::rtrain(dir.path())
            .args(["train", "--set", &format!("run.name={name:?}"), "--set", "train.epochs=1"])
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(2), "run.name = {name:?}: {}", text(&output.stderr));
        assert!(text(&output.stderr).contains("run.name"), "{}", text(&output.stderr));
    }
    assert!(!dir.path().join("runs").exists() && !dir.path().parent().unwrap().join(&escaped).exists());
}

/// Case 11: `RTRAIN_OPTIM_LR` (one underscore) was ignored in silence. It is still not a
/// setting (the layer reads `RTRAIN_SECTION__KEY`), but the run says so and how to spell it;
/// other `RTRAIN_*` variables (the image's labels, the entrypoint's) get no warning.
#[test]
fn a_misspelt_setting_variable_is_named_with_its_correct_spelling() {
    let dir = tempfile::tempdir().unwrap();
    let output = common::rtrain(dir.path())
        .args(["config", "show"])
        .env("RTRAIN_OPTIM_LR", "0.5")
        .env("RTRAIN_IMAGE_TAG", "rtrain:1")
        .env("RTRAIN_TRAIN__EPOCHS", "3")
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", text(&output.stderr));
    let stderr = text(&output.stderr);
    assert!(stderr.contains("RTRAIN_OPTIM_LR") && stderr.contains("RTRAIN_OPTIM__LR"), "{stderr}");
    assert!(!stderr.contains("RTRAIN_IMAGE_TAG") && !stderr.contains("RTRAIN_TRAIN__EPOCHS"), "{stderr}");
    let stdout = text(&output.stdout);
    assert!(stdout.contains("epochs = 3  # environment"), "{stdout}");
    assert!(stdout.contains("lr = 0.002  # default"), "{stdout}");
}

/// Case 16: a weights file whose class list is shorter than the model's outputs made `predict`
/// panic ("index out of bounds: the len is 1 but the index is 3"), and a longer one would have
/// printed names of classes the model never learnt. The file is refused, named, with exit 1.
#[test]
fn weights_whose_class_names_do_not_match_the_outputs_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let data = common::synth(dir.path(), 4, 2, 32);
    let run = dir.path().join("run");
    let settings = [
        format!("data.root={:?}", data.display().to_string()),
        "data.image_size=32".into(),
        "data.batch_size=8".into(),
        "train.epochs=1".into(),
        "train.threads=1".into(),
    ];
    common::rtrain(dir.path())
        .arg("train")
        .arg("--run-dir")
        .arg(&run)
        .args(settings.iter().flat_map(|s| ["--set".to_string(), s.clone()]))
        .assert()
        .success();
    let image = std::fs::read_dir(data.join("val"))
        .unwrap()
        .flat_map(|class| std::fs::read_dir(class.unwrap().path()).unwrap())
        .map(|entry| entry.unwrap().path())
        .next()
        .unwrap();
    let weights = run.join("model.safetensors");
    let file = rtrain::util::files::read_safetensors(&weights).unwrap();
    for kept in [1, 5] {
        let mut metadata = file.metadata.clone();
        let mut meta: serde_json::Value = serde_json::from_str(&metadata["rtrain.weights"]).unwrap();
        let classes: Vec<String> = (0..kept).map(|i| format!("class{i}")).collect();
        meta["classes"] = serde_json::json!(classes);
        metadata.insert("rtrain.weights".into(), meta.to_string());
        let altered = dir.path().join(format!("altered-{kept}.safetensors"));
        let tensors: Vec<(String, tch::Tensor)> =
            file.tensors.iter().map(|(name, tensor)| (name.clone(), tensor.shallow_clone())).collect();
        rtrain::util::files::write_safetensors(&altered, &tensors, Some(metadata)).unwrap();
        let output = common::rtrain(dir.path())
            .args(["predict", "--set", "data.image_size=32", "--checkpoint"])
            .arg(&altered)
            .arg(&image)
            .output()
            .unwrap();
        let stderr = text(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{kept} class names: {stderr}");
        assert!(
            stderr.contains(&format!(
                "altered-{kept}.safetensors: names {kept} classes but its model has 4 outputs"
            )),
            "{stderr}"
        );
    }
    // The untouched file still predicts.
    let output = common::rtrain(dir.path())
        .args(["predict", "--checkpoint"])
        .arg(&weights)
        .arg(&image)
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", text(&output.stderr));

    // The second half of case 16: the class names reversed in the header by hand, tensors
    // untouched, printed the wrong labels in silence. The digest covers the metadata now.
    let bytes = std::fs::read(&weights).unwrap();
    let header_len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + header_len]).unwrap();
    let mut meta: serde_json::Value =
        serde_json::from_str(header["__metadata__"]["rtrain.weights"].as_str().unwrap()).unwrap();
    meta["classes"].as_array_mut().unwrap().reverse();
    header["__metadata__"]["rtrain.weights"] = meta.to_string().into();
    let mut json = serde_json::to_vec(&header).unwrap();
    json.resize(json.len().next_multiple_of(8), b' ');
    let mut edited = (json.len() as u64).to_le_bytes().to_vec();
    edited.extend_from_slice(&json);
    edited.extend_from_slice(&bytes[8 + header_len..]);
    let reversed = dir.path().join("reversed.safetensors");
    std::fs::write(&reversed, edited).unwrap();
    let output = common::rtrain(dir.path())
        .args(["predict", "--checkpoint"])
        .arg(&reversed)
        .arg(&image)
        .output()
        .unwrap();
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("reversed.safetensors") && stderr.contains("metadata do not match the digest"),
        "{stderr}"
    );
}

/// Case 15: a SIGKILL during a save left `checkpoints/.tmp-XXXXXX` for ever. The trainer that
/// next takes the run directory's lock removes the temporaries of atomic writes (by their exact
/// name pattern) and nothing else.
#[test]
fn temporaries_of_a_killed_save_are_removed_under_the_lock() {
    let dir = tempfile::tempdir().unwrap();
    let data = common::synth(dir.path(), 4, 2, 32);
    let run = dir.path().join("run");
    std::fs::create_dir_all(run.join("checkpoints")).unwrap();
    let stale = [run.join(".tmp-Ab3xYz"), run.join("checkpoints/.tmp-0a9ZQk")];
    let kept = [run.join(".tmp-notes.txt"), run.join("checkpoints/.tmp-Ab3"), run.join("my.tmp-Ab3xYz")];
    for path in stale.iter().chain(&kept) {
        std::fs::write(path, b"partial").unwrap();
    }
    let output = common::rtrain(dir.path())
        .arg("train")
        .arg("--run-dir")
        .arg(&run)
        .args(["--set", &format!("data.root={:?}", data.display().to_string())])
        .args(["--set", "data.image_size=32", "--set", "data.batch_size=8", "--set", "train.epochs=1"])
        .args(["--set", "train.threads=1"])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", text(&output.stderr));
    for path in &stale {
        assert!(!path.exists(), "{} is still there", path.display());
        assert!(text(&output.stderr).contains(&path.display().to_string()), "{}", text(&output.stderr));
    }
    for path in &kept {
        assert!(path.exists(), "{} was removed", path.display());
    }
    assert!(run.join("model.safetensors").exists());
}

/// Case 13: `--resume auto` when every step checkpoint is corrupt warned and started fresh,
/// then `checkpoint.keep_last` deleted the new checkpoints, because the corrupt ones sorted as
/// newer, and the run failed at its end. The corrupt files are set aside (renamed
/// `*.invalid`, named in the log) before anything else, so they never outrank good ones.
#[test]
fn corrupt_checkpoints_are_set_aside_and_never_outrank_new_ones() {
    let dir = tempfile::tempdir().unwrap();
    let data = common::synth(dir.path(), 8, 2, 32);
    let run = dir.path().join("run");
    let train = |extra: &[&str]| {
        common::rtrain(dir.path())
            .arg("train")
            .arg("--run-dir")
            .arg(&run)
            .args(["--set", &format!("data.root={:?}", data.display().to_string())])
            .args(["--set", "data.image_size=32", "--set", "data.batch_size=8", "--set", "train.epochs=1"])
            .args([
                "--set",
                "train.threads=1",
                "--set",
                "checkpoint.every_steps=1",
                "--set",
                "checkpoint.keep_last=2",
            ])
            .args(extra)
            .output()
            .unwrap()
    };
    let first = train(&[]);
    assert!(first.status.success(), "{}", text(&first.stderr));
    let checkpoints = run.join("checkpoints");
    let steps = |dir: &Path| -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("step-"))
            .collect();
        names.sort();
        names
    };
    let before = steps(&checkpoints);
    assert_eq!(before, ["step-000000003.safetensors", "step-000000004.safetensors"]);
    for name in &before {
        // Truncated: the digest and the safetensors header no longer hold.
        let path = checkpoints.join(name);
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
    }
    // A run that never finished (a finished one is left as it is: case 50.7).
    std::fs::remove_file(run.join("summary.json")).unwrap();
    let second = train(&["--resume", "auto"]);
    let stderr = text(&second.stderr);
    assert!(second.status.success(), "{stderr}");
    assert!(stderr.contains("step-000000004.safetensors.invalid"), "{stderr}");
    assert_eq!(
        steps(&checkpoints),
        [
            "step-000000003.safetensors",
            "step-000000003.safetensors.invalid",
            "step-000000004.safetensors",
            "step-000000004.safetensors.invalid"
        ]
    );
    // The new step checkpoints are whole: a third run resumes from the newest (and has nothing
    // left to train).
    let third = train(&["--resume", "auto"]);
    assert!(third.status.success(), "{}", text(&third.stderr));
    assert!(!text(&third.stderr).contains("set aside"), "{}", text(&third.stderr));
}

/// The first image file under `dir` (class folders), in name order.
fn first_image(dir: &Path) -> std::path::PathBuf {
    let mut classes: Vec<_> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
    classes.sort();
    let mut images: Vec<_> = std::fs::read_dir(&classes[0]).unwrap().map(|e| e.unwrap().path()).collect();
    images.sort();
    images.swap_remove(0)
}

/// Rewrites the size in a baseline JPEG's frame header (SOF0: marker, length, precision,
/// height, width), leaving every other byte as it was: a small file that declares a huge image.
fn declare_jpeg_size(path: &Path, width: u16, height: u16) {
    let mut bytes = std::fs::read(path).unwrap();
    let sof = bytes.windows(2).position(|w| w == [0xFF, 0xC0]).expect("a baseline JPEG (SOF0)");
    bytes[sof + 5..sof + 7].copy_from_slice(&height.to_be_bytes());
    bytes[sof + 7..sof + 9].copy_from_slice(&width.to_be_bytes());
    std::fs::write(path, bytes).unwrap();
}

/// Case 8: a JPEG of a few hundred bytes declaring 65500x65500 pixels aborted the process
/// ("memory allocation of 10238338683 bytes failed") in training, even with `on_bad_sample =
/// "skip"`, and in `predict`. The header's size is checked against `data.max_image_pixels`
/// before a pixel is decoded: the file fails the run naming it, or is skipped and counted, and
/// `predict` reports it for that file.
#[test]
fn an_image_declaring_billions_of_pixels_is_a_bad_sample_refused_unread() {
    let dir = tempfile::tempdir().unwrap();
    let data = common::synth(dir.path(), 4, 2, 32);
    let bomb = first_image(&data.join("train"));
    declare_jpeg_size(&bomb, 65500, 65500);
    let train = |run: &str, on_bad_sample: &str| {
        common::rtrain(dir.path())
            .args(["train", "--run-dir", run])
            .args(["--set", &format!("data.root={:?}", data.display().to_string())])
            .args(["--set", "data.image_size=32", "--set", "data.batch_size=4", "--set", "train.epochs=1"])
            .args(["--set", "train.threads=1", "--set", &format!("data.on_bad_sample={on_bad_sample:?}")])
            .output()
            .unwrap()
    };
    let failed = train("fail", "fail");
    let stderr = text(&failed.stderr);
    assert_eq!(failed.status.code(), Some(1), "{stderr}");
    let refusal = "65500x65500 is 4290250000 pixels, above the limit of 178956970 (data.max_image_pixels)";
    assert!(stderr.contains(&bomb.display().to_string()) && stderr.contains(refusal), "{stderr}");

    let skipped = train("skip", "skip");
    let stderr = text(&skipped.stderr);
    assert!(skipped.status.success(), "{stderr}");
    assert!(stderr.contains("skipped 1 undecodable training samples"), "{stderr}");

    let output = common::rtrain(dir.path())
        .args(["predict", "--set", "data.image_size=32", "--checkpoint"])
        .arg(dir.path().join("skip/model.safetensors"))
        .arg(&bomb)
        .output()
        .unwrap();
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains(&bomb.display().to_string()) && stderr.contains(refusal), "{stderr}");
}

/// Case 7: a FIFO named `zz.jpg` in a class folder hung training while the data files were
/// hashed, and `zz.jpg -> /dev/zero` was read for ever; `predict` hung on a FIFO and read
/// `/dev/zero` until memory ran out. Only regular files are images: the run is refused naming
/// the file and what it is, and `predict` reports each such file, all without waiting.
#[test]
fn a_fifo_or_a_device_is_never_read_as_an_image() {
    let dir = tempfile::tempdir().unwrap();
    let data = common::synth(dir.path(), 4, 2, 32);
    let class = first_image(&data.join("train")).parent().unwrap().to_path_buf();
    let planted = class.join("zz.jpg");
    let train = |run: &str| {
        common::rtrain(dir.path())
            .args(["train", "--run-dir", run])
            .args(["--set", &format!("data.root={:?}", data.display().to_string())])
            .args(["--set", "data.image_size=32", "--set", "data.batch_size=4", "--set", "train.epochs=1"])
            .args(["--set", "train.threads=1"])
            .timeout(std::time::Duration::from_secs(120))
            .output()
            .unwrap()
    };
    let mkfifo =
        |path: &Path| assert!(std::process::Command::new("mkfifo").arg(path).status().unwrap().success());
    mkfifo(&planted);
    let fifo = train("fifo");
    let stderr = text(&fifo.stderr);
    assert_eq!(fifo.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains(&format!("{} is a FIFO, not a regular file", planted.display())), "{stderr}");
    std::fs::remove_file(&planted).unwrap();
    std::os::unix::fs::symlink("/dev/zero", &planted).unwrap();
    let zero = train("zero");
    let stderr = text(&zero.stderr);
    assert_eq!(zero.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("{} is a character device, not a regular file", planted.display())),
        "{stderr}"
    );
    std::fs::remove_file(&planted).unwrap();
    assert!(train("clean").status.success());

    let pipe = dir.path().join("pipe.jpg");
    mkfifo(&pipe);
    for (path, what) in [(pipe.as_path(), "a FIFO"), (Path::new("/dev/zero"), "a character device")] {
        let output = common::rtrain(dir.path())
            .args(["predict", "--set", "data.image_size=32", "--checkpoint"])
            .arg(dir.path().join("clean/model.safetensors"))
            .arg(path)
            .timeout(std::time::Duration::from_secs(60))
            .output()
            .unwrap();
        let stderr = text(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{}: {stderr}", path.display());
        let refusal = format!("{}: cannot read image: {what}, not a regular file", path.display());
        assert!(stderr.contains(&refusal), "{stderr}");
    }
}

/// A sparse file of `size` bytes whose first bytes are `start` (no disk space taken).
fn sparse_file(path: &Path, start: &[u8], size: u64) {
    std::fs::write(path, start).unwrap();
    std::fs::OpenOptions::new().write(true).open(path).unwrap().set_len(size).unwrap();
}

/// Whether process `pid` holds `file` open.
fn holds_open(pid: u32, file: &Path) -> bool {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else { return false };
    fds.filter_map(Result::ok).any(|fd| std::fs::read_link(fd.path()).is_ok_and(|target| target == file))
}

/// The rest of case 7. `export` (and eval, predict) read a 20 GB sparse file whole before
/// looking at its header: a safetensors file is now checked against its header first and
/// refused unread. And a signal during start-up work did nothing until that work ended
/// (minutes of hashing a large dataset or weights file): before training's first step, the
/// first stop signal ends the process at once with 75, "try again", having lost nothing.
#[test]
fn start_up_work_honours_a_signal_and_a_huge_file_is_judged_by_its_header() {
    let dir = tempfile::tempdir().unwrap();
    let huge = dir.path().join("huge.safetensors");
    sparse_file(&huge, b"", 20 << 30);
    let output = common::rtrain(dir.path())
        .args(["export", "--checkpoint"])
        .arg(&huge)
        .arg("out.safetensors")
        .timeout(std::time::Duration::from_secs(120))
        .output()
        .unwrap();
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("huge.safetensors") && stderr.contains("refused unread"), "{stderr}");

    // Weights of 4 GiB (sparse: nothing on disk), hashed at start-up before a step is taken.
    let data = common::fixtures::synth_tree();
    let weights = dir.path().join("big.safetensors");
    let tensor_bytes: u64 = 4 << 30;
    let mut header = format!(
        r#"{{"w":{{"dtype":"F32","shape":[{}],"data_offsets":[0,{tensor_bytes}]}}}}"#,
        tensor_bytes / 4
    )
    .into_bytes();
    header.resize(header.len().next_multiple_of(8), b' ');
    let mut start = (header.len() as u64).to_le_bytes().to_vec();
    start.extend_from_slice(&header);
    sparse_file(&weights, &start, start.len() as u64 + tensor_bytes);
    let mut child = std::process::Command::new(assert_cmd::cargo::cargo_bin("rtrain"))
        .current_dir(dir.path())
        .args(["train", "--run-dir", "run"])
        .args(["--set", &format!("data.root={:?}", data.display().to_string())])
        .args(["--set", &format!("model.pretrained={:?}", weights.display().to_string())])
        .args(["--set", "data.image_size=32", "--set", "data.batch_size=4", "--set", "train.epochs=1"])
        .args(["--set", "train.threads=1"])
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !holds_open(child.id(), &weights) {
        assert!(child.try_wait().unwrap().is_none(), "ended before it read the weights");
        assert!(std::time::Instant::now() < deadline, "never opened {}", weights.display());
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let killed =
        std::process::Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    assert!(killed.success());
    let status =
        common::wait_within(&mut child, std::time::Duration::from_secs(60), "a run signalled at start-up");
    assert_eq!(status.code(), Some(75), "{status:?}");
}

/// Case 12: `--resume PATH` with another run's checkpoint into a fresh run directory trained to
/// the end and then failed ("best.safetensors: No such file or directory"), writing no
/// model.safetensors or summary.json: the checkpoint's best top-1 named a best checkpoint that
/// lies in the other run. The new run keeps its own best from where it resumed.
#[test]
fn a_checkpoint_of_another_run_resumes_into_a_fresh_directory_to_the_end() {
    let dir = tempfile::tempdir().unwrap();
    let data = common::synth(dir.path(), 4, 2, 32);
    let train = |run: &str, epochs: &str, resume: Option<&Path>| {
        let mut command = common::rtrain(dir.path());
        command
            .args(["train", "--run-dir", run])
            .args(["--set", &format!("data.root={:?}", data.display().to_string())])
            .args(["--set", "data.image_size=32", "--set", "data.batch_size=4", "--set", "train.threads=1"])
            .args(["--set", &format!("train.epochs={epochs}")]);
        if let Some(checkpoint) = resume {
            command.arg("--resume").arg(checkpoint);
        }
        command.output().unwrap()
    };
    let first = train("first", "1", None);
    assert!(first.status.success(), "{}", text(&first.stderr));
    let first_checkpoints: Vec<_> =
        std::fs::read_dir(dir.path().join("first/checkpoints")).unwrap().map(|e| e.unwrap().path()).collect();
    let step = first_checkpoints
        .iter()
        .find(|p| p.file_name().unwrap().to_string_lossy().starts_with("step-"))
        .expect("a step checkpoint in the first run");
    assert!(dir.path().join("first/checkpoints/best.safetensors").exists());

    let second = train("second", "2", Some(step));
    let stderr = text(&second.stderr);
    assert!(second.status.success(), "{stderr}");
    assert!(stderr.contains("resumed from another run directory"), "{stderr}");
    let second_dir = dir.path().join("second");
    for file in ["model.safetensors", "summary.json", "checkpoints/best.safetensors"] {
        assert!(second_dir.join(file).exists(), "{file} is missing: {stderr}");
    }
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(second_dir.join("summary.json")).unwrap()).unwrap();
    // Only epoch 2 was evaluated in this run, so it is this run's best.
    assert_eq!(summary["best_epoch"], 2, "{summary}");
    // The other run is untouched.
    assert_eq!(
        std::fs::read_dir(dir.path().join("first/checkpoints")).unwrap().count(),
        first_checkpoints.len()
    );
}

/// Case 14: a new `train` into a finished run directory whose `checkpoints/` was removed
/// replaced its model.safetensors, summary.json and manifest.json and appended to its
/// metrics.jsonl (two runs mixed; `report` showed 3 epochs for a 1-epoch run). Such a
/// directory is refused, naming what it holds, and left as it was (`--resume` says to
/// continue it, as before); `--overwrite` replaces it, and the new run's metrics are its own
/// alone.
#[test]
fn a_directory_holding_a_finished_run_is_refused_unless_overwritten() {
    let dir = tempfile::tempdir().unwrap();
    let data = common::synth(dir.path(), 4, 2, 32);
    let train = |extra: &[&str]| train_tiny(dir.path(), &data, "run", extra);
    let run = dir.path().join("run");
    let epochs = || {
        let metrics = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
        metrics.lines().filter(|line| line.contains(r#""kind":"epoch""#)).count()
    };
    let first = train(&[]);
    assert!(first.status.success(), "{}", text(&first.stderr));
    std::fs::remove_dir_all(run.join("checkpoints")).unwrap();
    let weights = std::fs::read(run.join("model.safetensors")).unwrap();
    assert_eq!(epochs(), 1);

    let again = train(&[]);
    let stderr = text(&again.stderr);
    assert_eq!(again.status.code(), Some(1), "{stderr}");
    let names =
        "already holds a run (config.toml, manifest.json, metrics.jsonl, summary.json, model.safetensors)";
    assert!(stderr.contains(names) && stderr.contains("--overwrite"), "{stderr}");
    assert_eq!(std::fs::read(run.join("model.safetensors")).unwrap(), weights, "replaced the weights");
    assert_eq!(epochs(), 1, "appended to metrics.jsonl");

    let replaced = train(&["--overwrite"]);
    assert!(replaced.status.success(), "{}", text(&replaced.stderr));
    assert_eq!(epochs(), 1, "the replaced run's metrics are its own");
    assert!(run.join("checkpoints").is_dir() && run.join("summary.json").exists());
}

/// Case 18: `report` followed a `RUN/report` link and wrote wherever it pointed, and a
/// truncated manifest or a corrupt summary.json gave exit 0, "(unfinished)" and arch "?" without
/// a word. The default report directory must be a directory inside the run (a link is refused,
/// and so are links where its files go: replaced, never followed), and an unreadable manifest
/// or summary is a warning naming the file.
#[test]
fn report_writes_only_inside_the_run_and_names_unreadable_files() {
    let dir = tempfile::tempdir().unwrap();
    let data = common::synth(dir.path(), 4, 2, 32);
    let trained = train_tiny(dir.path(), &data, "run", &[]);
    assert!(trained.status.success(), "{}", text(&trained.stderr));
    let run = dir.path().join("run");
    let outside = dir.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    let report = || common::rtrain(dir.path()).args(["report", "run"]).output().unwrap();

    std::os::unix::fs::symlink(&outside, run.join("report")).unwrap();
    let linked = report();
    let stderr = text(&linked.stderr);
    assert_eq!(linked.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("report") && stderr.contains("symbolic link"), "{stderr}");
    assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0, "wrote through the link");

    std::fs::remove_file(run.join("report")).unwrap();
    std::fs::create_dir(run.join("report")).unwrap();
    for name in ["report.md", "loss.svg", "loss.png", "epochs.csv"] {
        std::fs::write(outside.join(name), "keep").unwrap();
        std::os::unix::fs::symlink(outside.join(name), run.join("report").join(name)).unwrap();
    }
    let written = report();
    assert!(written.status.success(), "{}", text(&written.stderr));
    for name in ["report.md", "loss.svg", "loss.png", "epochs.csv"] {
        assert_eq!(
            std::fs::read_to_string(outside.join(name)).unwrap(),
            "keep",
            "{name} written through a link"
        );
        let meta = std::fs::symlink_metadata(run.join("report").join(name)).unwrap();
        assert!(meta.is_file() && meta.len() > 4, "{name}: {meta:?}");
    }

    let manifest = std::fs::read(run.join("manifest.json")).unwrap();
    std::fs::write(run.join("manifest.json"), &manifest[..manifest.len() / 2]).unwrap();
    std::fs::write(run.join("summary.json"), "{\"best_top1\": ").unwrap();
    let damaged = report();
    let stderr = text(&damaged.stderr);
    assert!(damaged.status.success(), "{stderr}");
    assert!(
        stderr.contains("manifest.json") && stderr.contains("summary.json"),
        "no warning naming them: {stderr}"
    );
}

/// Case 17: a run directory from elsewhere only makes rtrain read inside it, and its manifest's
/// configuration is checked as `train` checks its own. `verify` read and hashed any path a
/// manifest named (`/dev/zero` hung it, `../x` left the directory); `reproduce` ran an
/// `optim.lr = -1` that `train` refuses, and said "reproduced" for an edited configuration or
/// another version without a word.
#[test]
fn a_manifest_from_elsewhere_reads_only_inside_its_run_and_is_validated() {
    let dir = tempfile::tempdir().unwrap();
    let data = common::synth(dir.path(), 4, 2, 32);
    let trained = train_tiny(dir.path(), &data, "run", &["--set", "run.deterministic=true"]);
    assert!(trained.status.success(), "{}", text(&trained.stderr));
    let manifest_path = dir.path().join("run/manifest.json");
    let pristine: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&manifest_path).unwrap()).unwrap();
    std::fs::write(dir.path().join("outside.safetensors"), b"not in the run").unwrap();
    let write = |manifest: &serde_json::Value| std::fs::write(&manifest_path, manifest.to_string()).unwrap();

    let mut escaping = pristine.clone();
    escaping["checkpoints"]["/dev/zero"] = "00".into();
    escaping["checkpoints"]["../outside.safetensors"] = "00".into();
    write(&escaping);
    let verify = common::rtrain(dir.path())
        .args(["verify", "run"])
        .timeout(std::time::Duration::from_secs(60))
        .output()
        .unwrap();
    let stdout = text(&verify.stdout);
    assert_eq!(verify.status.code(), Some(1), "{stdout}{}", text(&verify.stderr));
    for named in ["/dev/zero", "../outside.safetensors"] {
        assert!(
            stdout.contains(&format!("checkpoint {named}: names a path outside run; not read")),
            "{stdout}"
        );
    }

    let mut negative = pristine.clone();
    negative["config"]["optim"]["lr"] = (-1.0).into();
    write(&negative);
    let reproduce =
        common::rtrain(dir.path()).args(["reproduce", "run", "--out", "again-lr"]).output().unwrap();
    let stderr = text(&reproduce.stderr);
    assert_eq!(reproduce.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("optim.lr"), "{stderr}");
    assert!(!dir.path().join("again-lr").exists());

    let mut edited = pristine.clone();
    edited["config"]["train"]["epochs"] = 2.into();
    write(&edited);
    let reproduce =
        common::rtrain(dir.path()).args(["reproduce", "run", "--out", "again-edited"]).output().unwrap();
    let stderr = text(&reproduce.stderr);
    assert_eq!(reproduce.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("is not the hash of the configuration it records"), "{stderr}");

    let mut other_version = pristine.clone();
    other_version["rtrain_version"] = "9.9.9".into();
    write(&other_version);
    let reproduce =
        common::rtrain(dir.path()).args(["reproduce", "run", "--out", "again-version"]).output().unwrap();
    let stdout = text(&reproduce.stdout);
    assert!(reproduce.status.success(), "{stdout}{}", text(&reproduce.stderr));
    assert!(stdout.contains("the original ran 9.9.9"), "{stdout}");
    assert!(stdout.contains("reproduced"), "{stdout}");
}

// --- Issue 50, training and evaluation ---

/// Every file under `dir` (recursively; the trainer's lock file aside, which each trainer
/// rewrites with its pid) with its bytes and modification time.
fn files_with_times(
    dir: &Path,
) -> std::collections::BTreeMap<std::path::PathBuf, (Vec<u8>, std::time::SystemTime)> {
    let mut found = std::collections::BTreeMap::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(next) = pending.pop() {
        for entry in std::fs::read_dir(&next).unwrap() {
            let path = entry.unwrap().path();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            if meta.is_dir() {
                pending.push(path);
            } else if path.file_name().unwrap() != ".rtrain.lock" {
                found.insert(path.clone(), (std::fs::read(&path).unwrap(), meta.modified().unwrap()));
            }
        }
    }
    found
}

/// Case 50.7: `train --resume auto` on a finished run, what a Slurm requeue script runs,
/// exited 0 but rewrote the run: "val top-1 NaN" in the log, summary.json's `final_eval` null
/// and its throughput 0. A finished run is reported as finished and no file of it changes;
/// raising `train.epochs` still continues it.
#[test]
fn resuming_a_finished_run_leaves_every_file_of_it_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let data = common::synth(dir.path(), 4, 2, 32);
    let run = dir.path().join("run");
    let first = train_tiny(dir.path(), &data, "run", &[]);
    assert!(first.status.success(), "{}", text(&first.stderr));
    let before = files_with_times(&run);
    assert!(before.contains_key(&run.join("summary.json")), "{:?}", before.keys());

    let again = train_tiny(dir.path(), &data, "run", &["--resume", "auto"]);
    let stderr = text(&again.stderr);
    assert_eq!(again.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("holds a finished run"), "{stderr}");
    assert!(!stderr.contains("NaN"), "{stderr}");
    let after = files_with_times(&run);
    assert_eq!(after.keys().collect::<Vec<_>>(), before.keys().collect::<Vec<_>>());
    for (path, (bytes, modified)) in &before {
        let (now, now_modified) = &after[path];
        assert!(now == bytes && now_modified == modified, "{} was rewritten", path.display());
    }

    let further = train_tiny(dir.path(), &data, "run", &["--resume", "auto", "--set", "train.epochs=2"]);
    assert!(further.status.success(), "{}", text(&further.stderr));
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["epochs"], 2, "{summary}");
    assert!(summary["final_eval"]["top1"].is_number(), "{summary}");
}

/// Case 50.12: `eval --data SHARDS` read shards without the digest check training makes:
/// labels flipped inside a shard, its size unchanged, gave top-1 0.0 without a word. A shard
/// whose sha256 differs from the one `data prepare` recorded is refused, naming it.
#[test]
fn eval_refuses_a_shard_changed_since_it_was_prepared() {
    let dir = tempfile::tempdir().unwrap();
    // The shared tiny run and its tree, only read: the shards are this test's own.
    let tiny = common::fixtures::tiny_run();
    let shards = dir.path().join("shards");
    common::assert_success(
        common::rtrain(dir.path()).args(["data", "prepare"]).arg(&tiny.data).arg(&shards).output().unwrap(),
        "data prepare",
    );
    let eval = || {
        common::rtrain(dir.path())
            .args(["eval", "--checkpoint"])
            .arg(tiny.run.join("checkpoints/best.safetensors"))
            .args(["--data", "shards"])
            .args(["--set", "data.image_size=32", "--set", "train.threads=1"])
            .output()
            .unwrap()
    };
    common::assert_success(eval(), "eval of the shards as prepared");

    // Each label of the val shards to the next class: the same bytes in number, other values.
    let mut changed = Vec::new();
    for entry in std::fs::read_dir(&shards).unwrap() {
        let shard = entry.unwrap().path();
        let name = shard.file_name().unwrap().to_string_lossy().into_owned();
        if !(name.starts_with("val") && name.ends_with(".tar")) {
            continue;
        }
        let mut bytes = std::fs::read(&shard).unwrap();
        let mut labels = Vec::new();
        for member in tar::Archive::new(std::io::Cursor::new(bytes.clone())).entries().unwrap() {
            let member = member.unwrap();
            if member.path().unwrap().extension().is_some_and(|ext| ext == "cls") {
                labels.push(member.raw_file_position() as usize);
            }
        }
        assert!(!labels.is_empty(), "{name} has no labels");
        for at in labels {
            assert!(bytes[at].is_ascii_digit(), "{name}: {}", bytes[at]);
            bytes[at] = b'0' + (bytes[at] - b'0' + 1) % 4;
        }
        let size = std::fs::metadata(&shard).unwrap().len();
        std::fs::write(&shard, &bytes).unwrap();
        assert_eq!(std::fs::metadata(&shard).unwrap().len(), size);
        changed.push(name);
    }
    assert!(!changed.is_empty());

    let tampered = eval();
    let stderr = text(&tampered.stderr);
    assert_eq!(tampered.status.code(), Some(1), "{}{stderr}", text(&tampered.stdout));
    assert!(stderr.contains(&changed[0]) && stderr.contains("sha256"), "{stderr}");
}

/// Case 50.6: `data.samples_per_epoch` was held to [0, 10^12] only: 10^12 aborted in an
/// allocation (exit 134) after making the run directory, and 10^9 took 16 GB. It is refused
/// at validation, exit 2 naming the key, before anything is written.
#[test]
fn balanced_draws_per_epoch_have_a_range_checked_before_anything_runs() {
    let dir = tempfile::tempdir().unwrap();
    for draws in ["1000000000000", "1000000000"] {
        let output = common::rtrain(dir.path())
            .args(["train", "--run-dir", "run", "--set", "data.sampler=balanced"])
            .args(["--set", &format!("data.samples_per_epoch={draws}")])
            .output()
            .unwrap();
        let stderr = text(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{draws}: {stderr}");
        assert!(
            stderr.contains("data.samples_per_epoch: ") && stderr.contains("is outside [0, 100000000]"),
            "{stderr}"
        );
        assert!(!dir.path().join("run").exists(), "{draws}: the run directory was made");
    }
    let edge = common::rtrain(dir.path())
        .args(["config", "show", "--set", "data.sampler=balanced"])
        .args(["--set", "data.samples_per_epoch=100000000"])
        .output()
        .unwrap();
    assert!(edge.status.success(), "{}", text(&edge.stderr));
}

/// Case 50.4: `eval --bootstrap 1000000000` grew past 5 GB (about 32 GB projected): the
/// resamples had no range. They are refused above 100,000 (exit 2, naming the flag) before
/// anything is read.
#[test]
fn bootstrap_resamples_have_a_range() {
    let dir = tempfile::tempdir().unwrap();
    let output = common::rtrain(dir.path())
        .args(["eval", "--checkpoint", "missing.safetensors", "--bootstrap", "1000000000"])
        .output()
        .unwrap();
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--bootstrap") && stderr.contains("100000"), "{stderr}");
    assert!(!stderr.contains("missing.safetensors"), "read the checkpoint first: {stderr}");
}

/// Case 50 (exit codes): usage errors found after parsing exited 1, as a failure would: an
/// `explain --layer` or `--class` the checkpoint has not, a `train.class_weights` list of the
/// wrong length for the data, a `reproduce --ranks` the job does not have. Each is the
/// user's to fix, not to retry: exit 2, naming the flag or key. Case 50 (reproduce --epochs
/// 0): printed "reproduced" and exited 0, having compared nothing; refused alike, no run made.
#[test]
fn usage_errors_found_after_parsing_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let data = common::synth(dir.path(), 4, 2, 32);
    let trained = train_tiny(dir.path(), &data, "run", &[]);
    assert!(trained.status.success(), "{}", text(&trained.stderr));
    let image = first_image(&data.join("val"));
    let explain = |flag: &str, value: &str| {
        common::rtrain(dir.path())
            .args(["explain", "--checkpoint", "run/checkpoints/best.safetensors", "--out", "explained"])
            .args([flag, value])
            .arg(&image)
            .output()
            .unwrap()
    };
    let weights = train_tiny(dir.path(), &data, "weighted", &["--set", "train.class_weights=[1.0, 2.0]"]);
    let ranks = common::rtrain(dir.path()).args(["reproduce", "run", "--ranks", "2"]).output().unwrap();
    let no_epochs = common::rtrain(dir.path())
        .args(["reproduce", "run", "--epochs", "0", "--out", "again"])
        .output()
        .unwrap();
    for (what, output, named) in [
        ("explain --layer layer9", explain("--layer", "layer9"), "--layer layer9"),
        ("explain --class no-such-class", explain("--class", "no-such-class"), "--class no-such-class"),
        ("two class weights for four classes", weights, "train.class_weights"),
        ("reproduce --ranks 2 in a job of one", ranks, "--ranks 2"),
        ("reproduce --epochs 0", no_epochs, "--epochs"),
    ] {
        let stderr = text(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{what}: {stderr}");
        assert!(stderr.contains(named), "{what}: {stderr}");
    }
    assert!(!dir.path().join("again").exists(), "reproduce --epochs 0 made a run");
}

/// Case 50 (class_weights message): `train.class_weights = "balance"` was refused with serde's
/// "data did not match any variant of untagged enum ClassWeights", which lists nothing. The
/// error names the key and lists what it takes.
#[test]
fn a_misspelt_class_weight_rule_lists_the_valid_values() {
    let dir = tempfile::tempdir().unwrap();
    for value in [r#""balance""#, "3", r#"["a"]"#] {
        let output = show_with(dir.path(), &format!("train.class_weights={value}"));
        let stderr = text(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{value}: {stderr}");
        assert!(stderr.contains("train.class_weights"), "{value}: {stderr}");
        assert!(
            stderr.contains(r#""none", "balanced", or a list of one positive weight per class"#),
            "{value}: {stderr}"
        );
    }
    for value in [r#""balanced""#, r#""none""#, "[1, 2.5]"] {
        let output = show_with(dir.path(), &format!("train.class_weights={value}"));
        assert!(output.status.success(), "{value}: {}", text(&output.stderr));
    }
}

// --- Issue 50, predict --out ---

/// The tiny model the `predict --out` cases classify with (one epoch, 32 px, 4 classes) and the
/// synthetic data it was trained on: common's tiny run, trained once per test binary.
fn predict_model() -> (&'static Path, &'static Path) {
    let tiny = common::fixtures::tiny_run();
    (&tiny.model, &tiny.data)
}

/// `n` of the synthetic validation photos copied into `dir/<to>` as `p0.jpg`, `p1.jpg`...
fn predict_photos(dir: &Path, to: &str, n: usize) -> Vec<std::path::PathBuf> {
    let (_, data) = predict_model();
    let mut sources: Vec<_> = walk_files(&data.join("val"));
    sources.sort();
    let target = dir.join(to);
    std::fs::create_dir_all(&target).unwrap();
    (0..n)
        .map(|i| {
            let path = target.join(format!("p{i}.jpg"));
            std::fs::copy(&sources[i % sources.len()], &path).unwrap();
            path
        })
        .collect()
}

fn walk_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(walk_files(&path));
        } else {
            files.push(path);
        }
    }
    files
}

/// `rtrain predict --out OUT` with the tiny model: 32 px, batches of 4, one thread, no workers.
fn predict_out(dir: &Path, out: &str) -> assert_cmd::Command {
    let (model, _) = predict_model();
    let mut command = common::rtrain(dir);
    command.args(["predict", "--checkpoint"]).arg(model);
    command.args(["--set", "data.image_size=32", "--set", "data.eval_batch_size=4"]);
    command.args(["--set", "train.threads=1", "--set", "data.workers=0", "--out", out]);
    command
}

fn json_of(path: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

/// Case 50.3: a part whose rows were edited (a class and its probability changed) was merged
/// as it was, into rows that contradict their own probability columns. Each part now carries a
/// digest of its rows: a part that does not match it is set aside (`*.invalid`, named in the
/// log) and classified again, so the rerun writes what the first run wrote.
#[test]
fn an_edited_prediction_part_is_set_aside_and_classified_again() {
    let dir = tempfile::tempdir().unwrap();
    predict_photos(dir.path(), "photos", 8);
    let run = || predict_out(dir.path(), "out").args(["--part-size", "4", "photos"]).output().unwrap();
    common::assert_success(run(), "predict --out");
    let out = dir.path().join("out");
    let first = std::fs::read(out.join("predictions.csv")).unwrap();

    let part = out.join("parts/part-000000.jsonl");
    let text_of_part = std::fs::read_to_string(&part).unwrap();
    let mut lines: Vec<String> = text_of_part.lines().map(String::from).collect();
    let mut row: serde_json::Value = serde_json::from_str(&lines[0]).unwrap();
    let other = if row["class"] == "0-none" { "3-severe" } else { "0-none" };
    row["class"] = other.into();
    row["probability"] = 0.99.into();
    lines[0] = serde_json::to_string(&row).unwrap();
    std::fs::write(&part, lines.join("\n") + "\n").unwrap();

    let again = common::assert_success(run(), "predict --out again");
    let stderr = text(&again.stderr);
    assert!(stderr.contains(&format!("{}", Path::new("out/parts/part-000000.jsonl").display())), "{stderr}");
    assert!(stderr.contains("set aside"), "{stderr}");
    assert!(out.join("parts/part-000000.jsonl.invalid").exists());
    assert_eq!(text(&std::fs::read(out.join("predictions.csv")).unwrap()), text(&first));
    let summary = json_of(&out.join("summary.json"));
    assert_eq!(summary["parts_resumed"], 1, "{summary}");
}

/// Case 50.2: file names that are not UTF-8 were made text (lossily) before they were told
/// apart: `x\xff.jpg` and `x\xfe.jpg` became one row (4 files in, `"images": 3` out, nothing
/// said), and two class folders named so became two classes of the same name. Paths stay paths
/// until written (each byte that is not UTF-8 written as `\xHH`); a class folder whose name is
/// not UTF-8 is refused, naming it.
#[test]
fn names_that_are_not_utf8_stay_apart_and_such_a_class_folder_is_refused() {
    use std::os::unix::ffi::OsStrExt;
    let dir = tempfile::tempdir().unwrap();
    let photos = predict_photos(dir.path(), "photos", 4);
    let named = |bytes: &[u8]| dir.path().join("photos").join(std::ffi::OsStr::from_bytes(bytes));
    std::fs::rename(&photos[2], named(b"x\xff.jpg")).unwrap();
    std::fs::rename(&photos[3], named(b"x\xfe.jpg")).unwrap();
    let output = predict_out(dir.path(), "out").arg("photos").output().unwrap();
    common::assert_success(output, "predict --out");
    let rows = common::csv_rows(&dir.path().join("out/predictions.csv"));
    let paths: Vec<&str> = rows.iter().map(|row| row["path"].as_str()).collect();
    assert_eq!(paths, ["photos/p0.jpg", "photos/p1.jpg", "photos/x\\xfe.jpg", "photos/x\\xff.jpg"]);
    assert!(rows.iter().all(|row| !row["class"].is_empty()), "{rows:?}");
    assert_eq!(json_of(&dir.path().join("out/summary.json"))["images"], 4);

    let data = dir.path().join("classes");
    for split in ["train", "val"] {
        for (class, photo) in [(&b"c\xff"[..], &photos[0]), (&b"c\xfe"[..], &photos[1])] {
            let class_dir = data.join(split).join(std::ffi::OsStr::from_bytes(class));
            std::fs::create_dir_all(&class_dir).unwrap();
            for name in ["a.jpg", "b.jpg"] {
                std::fs::copy(photo, class_dir.join(name)).unwrap();
            }
        }
    }
    let train = train_tiny(dir.path(), &data, "run", &[]);
    let stderr = text(&train.stderr);
    assert_eq!(train.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("classes/train/c\\xfe: a class folder whose name is not UTF-8"), "{stderr}");
    assert!(!dir.path().join("run/model.safetensors").exists());
}

/// What `summary.json` lists as left out: (path, reason) pairs.
fn ignored_in(summary: &serde_json::Value) -> Vec<(String, String)> {
    summary["ignored"]
        .as_array()
        .unwrap_or_else(|| panic!("no list of ignored files: {summary}"))
        .iter()
        .map(|entry| (entry["path"].as_str().unwrap().into(), entry["reason"].as_str().unwrap().into()))
        .collect()
}

/// Case 50.14: the photos under a symbolic link to a folder were left out in silence
/// ("classified 2 of 2 images", the link only counted in `ignored_files: 1`). Links to folders
/// are followed, each folder searched once (a link back up the tree is not a loop), and every
/// path left out is named, with why, in the log and in summary.json's `ignored`.
#[test]
fn a_symlinked_folder_is_searched_once_and_what_is_left_out_is_named() {
    let dir = tempfile::tempdir().unwrap();
    predict_photos(dir.path(), "campaign/day1", 2);
    predict_photos(dir.path(), "elsewhere/day2", 2);
    std::os::unix::fs::symlink("../elsewhere/day2", dir.path().join("campaign/day2")).unwrap();
    std::os::unix::fs::symlink("..", dir.path().join("campaign/day1/up")).unwrap();
    std::fs::write(dir.path().join("campaign/day1/notes.txt"), "field notes\n").unwrap();
    let output = predict_out(dir.path(), "out").arg("campaign").output().unwrap();
    let output = common::assert_success(output, "predict --out");
    let rows = common::csv_rows(&dir.path().join("out/predictions.csv"));
    let paths: Vec<&str> = rows.iter().map(|row| row["path"].as_str()).collect();
    assert_eq!(
        paths,
        ["campaign/day1/p0.jpg", "campaign/day1/p1.jpg", "campaign/day2/p0.jpg", "campaign/day2/p1.jpg"]
    );
    let summary = json_of(&dir.path().join("out/summary.json"));
    assert_eq!(summary["images"], 4, "{summary}");
    let ignored = ignored_in(&summary);
    assert_eq!(
        ignored,
        [
            ("campaign/day1/notes.txt".to_string(), "not a JPEG or PNG image".to_string()),
            ("campaign/day1/up".to_string(), "a link to campaign, a folder already searched".to_string()),
        ]
    );
    assert_eq!(summary["ignored_files"], 2, "{summary}");
    let stderr = text(&output.stderr);
    for (path, reason) in &ignored {
        assert!(stderr.contains(&format!("{path}: left out: {reason}")), "{stderr}");
    }
}

/// Case 50.5: `predict --out --top 4294967296` made a header of 2^33 columns until the
/// machine's OOM killer ended it (23 GB). `--top` is clamped to the model's class count, as
/// `predict` without `--out` does. (Run under a 6 GB address-space limit, so that a regression
/// fails here rather than taking the machine.)
#[test]
fn a_top_beyond_the_class_count_is_the_class_count() {
    let dir = tempfile::tempdir().unwrap();
    predict_photos(dir.path(), "photos", 2);
    let (model, _) = predict_model();
    let output = std::process::Command::new("sh")
        .current_dir(dir.path())
        .args(["-c", "ulimit -v 6000000 && exec \"$@\"", "sh"])
        .arg(assert_cmd::cargo::cargo_bin("rtrain"))
        .args(["predict", "--checkpoint"])
        .arg(model)
        .args(["--set", "data.image_size=32", "--set", "train.threads=1", "--set", "data.workers=0"])
        .args(["--out", "out", "--top", "4294967296", "photos"])
        .output()
        .unwrap();
    common::assert_success(output, "predict --out --top 4294967296");
    let csv = std::fs::read_to_string(dir.path().join("out/predictions.csv")).unwrap();
    let header = csv.lines().next().unwrap();
    assert!(header.contains(",top4_class,top4_probability,") && !header.contains("top5"), "{header}");
    let rows = common::csv_rows(&dir.path().join("out/predictions.csv"));
    assert!(rows.iter().all(|row| !row["top4_class"].is_empty()), "{rows:?}");
}

/// Case 50 (a resumed job): a photo replaced after its part was finished kept its old row
/// (the old sha256 and class) when the job was run again. Each part records the size and
/// modification time of its files; a part with a photo changed since is classified again,
/// naming the photo.
#[test]
fn a_photo_changed_since_its_part_was_done_is_classified_again() {
    use sha2::Digest;
    let dir = tempfile::tempdir().unwrap();
    let photos = predict_photos(dir.path(), "photos", 8);
    let run = || predict_out(dir.path(), "out").args(["--part-size", "4", "photos"]).output().unwrap();
    common::assert_success(run(), "predict --out");
    let replacement = std::fs::read(&photos[6]).unwrap();
    std::fs::write(&photos[1], &replacement).unwrap();
    let again = common::assert_success(run(), "predict --out again");
    let stderr = text(&again.stderr);
    assert!(stderr.contains("photos/p1.jpg") && stderr.contains("changed"), "{stderr}");
    let rows = common::csv_rows(&dir.path().join("out/predictions.csv"));
    let sha256 = hex::encode(sha2::Sha256::digest(&replacement));
    assert_eq!(rows[1]["path"], "photos/p1.jpg");
    assert_eq!(rows[1]["sha256"], sha256, "{:?}", rows[1]);
    assert_eq!(rows[1]["class"], rows[6]["class"]);
    let summary = json_of(&dir.path().join("out/summary.json"));
    assert_eq!(summary["parts_resumed"], 1, "{summary}");
}

/// Case 50 (a lock): two `predict --out` into one directory ran at once, each writing the
/// other's parts and merged files. The job holds an exclusive lock on `DIR/.rtrain.lock`; a
/// second one is refused at once, naming the directory and the holder.
#[test]
fn a_second_prediction_into_one_directory_is_refused_at_once() {
    use std::io::Write;
    use std::os::fd::AsRawFd;
    let dir = tempfile::tempdir().unwrap();
    predict_photos(dir.path(), "photos", 2);
    std::fs::create_dir_all(dir.path().join("out")).unwrap();
    let mut holder = std::fs::File::create(dir.path().join("out/.rtrain.lock")).unwrap();
    // SAFETY: flock on the descriptor of a file this test keeps open.
    assert_eq!(unsafe { libc::flock(holder.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) }, 0);
    holder.write_all(b"pid 4242 on elsewhere").unwrap();
    let refused = predict_out(dir.path(), "out")
        .arg("photos")
        .timeout(std::time::Duration::from_secs(60))
        .output()
        .unwrap();
    let stderr = text(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("out is in use by another rtrain (pid 4242 on elsewhere)"), "{stderr}");
    assert!(!dir.path().join("out/parts").exists());
    drop(holder);
    common::assert_success(predict_out(dir.path(), "out").arg("photos").output().unwrap(), "predict");
}

/// Case 50 (CSV injection): a cell starting with `=`, `@`, `+` or `-` was written as it was,
/// and a spreadsheet opening predictions.csv ran it as a formula (a folder named
/// `=HYPERLINK(...)`). Such text cells get a `'` in front (OWASP's rule); the JSON lines keep
/// the name as it is, and numbers stay numbers.
#[test]
fn csv_cells_a_spreadsheet_would_run_are_neutralised() {
    let dir = tempfile::tempdir().unwrap();
    predict_photos(dir.path(), "=SUM(1)", 1);
    predict_photos(dir.path(), "@x", 1);
    let output = predict_out(dir.path(), "out").args(["=SUM(1)", "@x"]).output().unwrap();
    common::assert_success(output, "predict --out");
    let rows = common::csv_rows(&dir.path().join("out/predictions.csv"));
    let paths: Vec<&str> = rows.iter().map(|row| row["path"].as_str()).collect();
    assert_eq!(paths, ["'=SUM(1)/p0.jpg", "'@x/p0.jpg"]);
    assert!(rows.iter().all(|row| row["probability"].parse::<f64>().is_ok()), "{rows:?}");
    let jsonl = std::fs::read_to_string(dir.path().join("out/predictions.jsonl")).unwrap();
    assert!(jsonl.starts_with("{\"path\":\"=SUM(1)/p0.jpg\""), "{jsonl}");
}

/// Case 50 (formats): TIFF, WebP, BMP and GIF files in a campaign were counted as ignored,
/// unnamed, although they are photos. rtrain reads JPEG and PNG; each other file is named in
/// the log and in summary.json's `ignored`, with its format where its first bytes tell it.
#[test]
fn files_of_formats_rtrain_does_not_read_are_named_with_their_format() {
    let dir = tempfile::tempdir().unwrap();
    predict_photos(dir.path(), "photos", 2);
    let files: [(&str, &[u8]); 4] = [
        ("a.tif", b"II*\0\x08\0\0\0\0\0\0\0"),
        ("b.webp", b"RIFF\x1a\0\0\0WEBPVP8 \0\0\0\0"),
        ("c.bmp", b"BM\x1e\0\0\0\0\0\0\0\x1a\0\0\0"),
        ("d.gif", b"GIF89a\x01\0\x01\0\0\0\0"),
    ];
    for (name, bytes) in files {
        std::fs::write(dir.path().join("photos").join(name), bytes).unwrap();
    }
    let output = predict_out(dir.path(), "out").arg("photos").output().unwrap();
    let output = common::assert_success(output, "predict --out");
    let summary = json_of(&dir.path().join("out/summary.json"));
    assert_eq!(summary["images"], 2, "{summary}");
    let expected: Vec<(String, String)> =
        [("a.tif", "TIFF"), ("b.webp", "WebP"), ("c.bmp", "BMP"), ("d.gif", "GIF")]
            .iter()
            .map(|(name, format)| {
                (format!("photos/{name}"), format!("a {format} image: rtrain reads JPEG and PNG only"))
            })
            .collect();
    assert_eq!(ignored_in(&summary), expected);
    let stderr = text(&output.stderr);
    for (path, reason) in &expected {
        assert!(stderr.contains(&format!("{path}: left out: {reason}")), "{stderr}");
    }
}

/// Case 50 (a list): one photo named three ways in `--from-list` (`photos/p0.jpg`,
/// `./photos/p0.jpg`, its absolute path) was three rows. Inputs are told apart by their
/// canonical path: the first spelling is kept, the others are named in the log and in
/// summary.json's `ignored`.
#[test]
fn one_photo_named_three_ways_in_a_list_is_one_row() {
    let dir = tempfile::tempdir().unwrap();
    predict_photos(dir.path(), "photos", 2);
    let absolute = dir.path().join("photos/p0.jpg");
    let list = format!("photos/p0.jpg\n./photos/p0.jpg\n{}\nphotos/p1.jpg\n", absolute.display());
    std::fs::write(dir.path().join("list.txt"), list).unwrap();
    let output = predict_out(dir.path(), "out").args(["--from-list", "list.txt"]).output().unwrap();
    let output = common::assert_success(output, "predict --out --from-list");
    let rows = common::csv_rows(&dir.path().join("out/predictions.csv"));
    let paths: Vec<&str> = rows.iter().map(|row| row["path"].as_str()).collect();
    assert_eq!(paths, ["photos/p0.jpg", "photos/p1.jpg"]);
    let summary = json_of(&dir.path().join("out/summary.json"));
    assert_eq!((summary["images"].as_u64(), summary["ignored_files"].as_u64()), (Some(2), Some(2)));
    let stderr = text(&output.stderr);
    for again in ["./photos/p0.jpg".to_string(), absolute.display().to_string()] {
        assert!(stderr.contains(&format!("{again}: left out: the same file as photos/p0.jpg")), "{stderr}");
    }
}

// --- Issue 50, Exif ---

/// One IFD entry of a hand-made Exif block: tag, TIFF type (1 BYTE, 2 ASCII, 3 SHORT, 4 LONG,
/// 5 RATIONAL), the count it declares and its value's little-endian bytes. The count is written
/// as given, so an entry can declare far more values than it holds.
struct Entry {
    tag: u16,
    kind: u16,
    count: u32,
    value: Vec<u8>,
}

fn short_entry(tag: u16, value: u16) -> Entry {
    Entry { tag, kind: 3, count: 1, value: value.to_le_bytes().to_vec() }
}

fn byte_entry(tag: u16, value: u8) -> Entry {
    Entry { tag, kind: 1, count: 1, value: vec![value] }
}

fn ascii_entry(tag: u16, text: &str) -> Entry {
    let mut value = text.as_bytes().to_vec();
    value.push(0);
    Entry { tag, kind: 2, count: value.len() as u32, value }
}

fn rationals_entry(tag: u16, values: &[(u32, u32)]) -> Entry {
    let value = values.iter().flat_map(|(num, denom)| [num.to_le_bytes(), denom.to_le_bytes()]).flatten();
    Entry { tag, kind: 5, count: values.len() as u32, value: value.collect() }
}

/// An Exif block as it follows a JPEG APP1 marker and its length, little-endian: IFD0 holding
/// `ifd0` and pointers to an Exif IFD holding `exif` and a GPS IFD holding `gps` (each when not
/// empty), then the values longer than 4 bytes, then the GPS IFD. Without `gps_next_offset` the
/// GPS IFD, and the block, end without its 4-byte next-IFD offset, as a common Python geotagging
/// tool writes it.
fn exif_app1(mut ifd0: Vec<Entry>, exif: Vec<Entry>, gps: Vec<Entry>, gps_next_offset: bool) -> Vec<u8> {
    let ifd_len = |entries: usize| 2 + 12 * entries + 4;
    let pointers = usize::from(!exif.is_empty()) + usize::from(!gps.is_empty());
    let exif_at = 8 + ifd_len(ifd0.len() + pointers);
    let data_at = exif_at + if exif.is_empty() { 0 } else { ifd_len(exif.len()) };
    let long_values =
        |entries: &[Entry]| entries.iter().map(|e| e.value.len()).filter(|&l| l > 4).sum::<usize>();
    let gps_at = data_at + long_values(&ifd0) + long_values(&exif) + long_values(&gps);
    let long =
        |tag: u16, at: usize| Entry { tag, kind: 4, count: 1, value: (at as u32).to_le_bytes().to_vec() };
    if !exif.is_empty() {
        ifd0.push(long(0x8769, exif_at));
    }
    if !gps.is_empty() {
        ifd0.push(long(0x8825, gps_at));
    }
    let mut data = Vec::new();
    let mut ifd = |entries: &[Entry], next_offset: bool| {
        let mut bytes = (entries.len() as u16).to_le_bytes().to_vec();
        for entry in entries {
            bytes.extend_from_slice(&entry.tag.to_le_bytes());
            bytes.extend_from_slice(&entry.kind.to_le_bytes());
            bytes.extend_from_slice(&entry.count.to_le_bytes());
            if entry.value.len() <= 4 {
                let mut inline = entry.value.clone();
                inline.resize(4, 0);
                bytes.extend_from_slice(&inline);
            } else {
                bytes.extend_from_slice(&((data_at + data.len()) as u32).to_le_bytes());
                data.extend_from_slice(&entry.value);
            }
        }
        if next_offset {
            bytes.extend_from_slice(&0u32.to_le_bytes());
        }
        bytes
    };
    let ifd0 = ifd(&ifd0, true);
    let exif = if exif.is_empty() { Vec::new() } else { ifd(&exif, true) };
    let gps = if gps.is_empty() { Vec::new() } else { ifd(&gps, gps_next_offset) };
    let mut block = b"Exif\0\0II*\0".to_vec();
    block.extend_from_slice(&8u32.to_le_bytes());
    for part in [ifd0, exif, data, gps] {
        block.extend_from_slice(&part);
    }
    block
}

/// Case 50.1: one bad part of an Exif block costs only that part, with a warning naming the
/// file. Before, a GPS IFD without its next-IFD offset, or one GPS tag declaring 0x7fffffff
/// values, threw the whole block away in silence: orientation 1, so the photo was classified
/// sideways, and no position. Case 50.1b: `DateTimeOriginal` "2023:02:30 25:61:61" became the
/// valid-looking ISO time "2023-02-30T25:61:61"; it is now no capture time, with a warning.
/// Case 50.1c: `GPSAltitudeRef` 7 was read as above sea level; the altitude is now unknown,
/// with a warning.
#[test]
fn a_bad_part_of_an_exif_block_costs_only_that_part_with_a_warning() {
    use rtrain::data::encode::{encode_jpeg, Subsampling};
    use rtrain::data::orientation::{exif_block, Orientation};

    let dir = tempfile::tempdir().unwrap();
    let data = common::synth(dir.path(), 4, 2, 32);
    common::assert_success(train_tiny(dir.path(), &data, "run", &[]), "rtrain train");

    // Every photo has the same stored pixels, 48 x 32 (shown 32 x 48 when turned right), so
    // that their predictions differ only by how the Exif block turns them.
    let (width, height) = (48u32, 32u32);
    let pixels: Vec<u8> = (0..height)
        .flat_map(|y| (0..width).flat_map(move |x| [x as u8 * 5, y as u8 * 7, (x * y) as u8]))
        .collect();
    let photos = dir.path().join("photos");
    std::fs::create_dir(&photos).unwrap();
    let write = |name: &str, exif: &[u8]| {
        let jpeg = encode_jpeg(&pixels, width, height, 90, Subsampling::Quarter, exif).unwrap();
        std::fs::write(photos.join(name), jpeg).unwrap();
    };
    let turned_right = || vec![short_entry(0x0112, 6)];
    // 29° 57' 30.36" N, 95° 21' 50" W: GPSLatitudeRef, GPSLatitude, GPSLongitudeRef, GPSLongitude.
    let position = || {
        vec![
            ascii_entry(0x0001, "N"),
            rationals_entry(0x0002, &[(29, 1), (57, 1), (3036, 100)]),
            ascii_entry(0x0003, "W"),
            rationals_entry(0x0004, &[(95, 1), (21, 1), (5000, 100)]),
        ]
    };
    write("no-next-offset.jpg", &exif_app1(turned_right(), vec![], position(), false));
    let mut huge_count = position();
    huge_count.push(byte_entry(0x0005, 0));
    huge_count.push(rationals_entry(0x0006, &[(250, 2)]));
    // GPSTimeStamp declaring 0x7fffffff rationals (16 GiB) where the block holds three.
    huge_count.push(Entry { count: 0x7fff_ffff, ..rationals_entry(0x0007, &[(4, 1), (17, 1), (35, 1)]) });
    write("huge-count.jpg", &exif_app1(turned_right(), vec![], huge_count, true));
    write(
        "impossible-time.jpg",
        &exif_app1(turned_right(), vec![ascii_entry(0x9003, "2023:02:30 25:61:61")], vec![], true),
    );
    let mut altitude_ref_7 = position();
    altitude_ref_7.push(byte_entry(0x0005, 7));
    altitude_ref_7.push(rationals_entry(0x0006, &[(250, 2)]));
    write("altitude-ref-7.jpg", &exif_app1(turned_right(), vec![], altitude_ref_7, true));
    // The controls: the orientation alone, as rtrain writes it, and no Exif block at all.
    write("clean.jpg", &exif_block(Orientation::TurnedRight));
    write("stored.jpg", &[]);

    let output = common::rtrain(dir.path())
        .args(["predict", "--set", "data.image_size=32", "--set", "train.threads=1", "--checkpoint"])
        .arg(dir.path().join("run/model.safetensors"))
        .args(["photos", "--out", "out"])
        .output()
        .unwrap();
    let output = common::assert_success(output, "rtrain predict --out");
    let stderr = text(&output.stderr);
    let mut reader = csv::Reader::from_path(dir.path().join("out/predictions.csv")).unwrap();
    let header: Vec<String> = reader.headers().unwrap().iter().map(String::from).collect();
    let rows: std::collections::BTreeMap<String, std::collections::BTreeMap<String, String>> = reader
        .records()
        .map(|row| {
            let row: std::collections::BTreeMap<String, String> =
                header.iter().cloned().zip(row.unwrap().iter().map(String::from)).collect();
            (row["path"].trim_start_matches("photos/").to_string(), row)
        })
        .collect();
    let probabilities = |name: &str| -> Vec<String> {
        rows[name].iter().filter(|(k, _)| k.starts_with("probability_")).map(|(_, v)| v.clone()).collect()
    };
    assert_eq!(probabilities("clean.jpg").len(), 4, "{:?}", rows["clean.jpg"]);
    assert_ne!(
        probabilities("clean.jpg"),
        probabilities("stored.jpg"),
        "turning the photo changes its prediction"
    );

    let latitude = 29.0 + 57.0 / 60.0 + (3036.0 / 100.0) / 3600.0;
    let longitude = -(95.0 + 21.0 / 60.0 + (5000.0 / 100.0) / 3600.0);
    let number = |name: &str, column: &str| rows[name][column].parse::<f64>().ok();
    for name in ["no-next-offset.jpg", "huge-count.jpg"] {
        let row = &rows[name];
        // Orientation 6 read and applied: the photo is classified as the clean one is, upright.
        assert_eq!(row["orientation"], "6", "{row:?}");
        assert_eq!(probabilities(name), probabilities("clean.jpg"), "{name} is not turned upright");
        assert_eq!(number(name, "latitude"), Some(latitude), "{row:?}");
        assert_eq!(number(name, "longitude"), Some(longitude), "{row:?}");
    }
    assert!(stderr.contains("photos/no-next-offset.jpg: part of the Exif block skipped"), "{stderr}");
    assert!(stderr.contains("photos/huge-count.jpg: part of the Exif block skipped"), "{stderr}");
    // The good tags beside the bad one are read: the altitude after it, 125 m above sea level.
    assert_eq!(number("huge-count.jpg", "altitude"), Some(125.0), "{:?}", rows["huge-count.jpg"]);

    // Case 50.1b: an impossible DateTimeOriginal is no capture time, with a warning.
    assert_eq!(rows["impossible-time.jpg"]["orientation"], "6", "{:?}", rows["impossible-time.jpg"]);
    assert_eq!(rows["impossible-time.jpg"]["capture_time"], "", "{:?}", rows["impossible-time.jpg"]);
    assert!(
        stderr.contains(
            "photos/impossible-time.jpg: DateTimeOriginal \"2023:02:30 25:61:61\" is no date and time"
        ),
        "{stderr}"
    );
    // Case 50.1c: an undefined GPSAltitudeRef is an unknown altitude (not 125 m above sea
    // level), with a warning; the position stands.
    let row = &rows["altitude-ref-7.jpg"];
    assert_eq!(
        (number("altitude-ref-7.jpg", "latitude"), row["altitude"].as_str()),
        (Some(latitude), ""),
        "{row:?}"
    );
    assert!(stderr.contains("photos/altitude-ref-7.jpg: GPSAltitudeRef is 7, not 0"), "{stderr}");
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("out/summary.json")).unwrap()).unwrap();
    assert_eq!(summary["without_gps"], 3, "impossible-time, clean and stored: {summary}");
    // The clean files warn of nothing.
    for name in ["clean.jpg", "stored.jpg"] {
        assert!(!stderr.contains(&format!("photos/{name}")), "{stderr}");
    }
}

// --- Issue 50, publish ---

/// The files under `dir`, relative to it, '/'-separated, no link followed; empty when `dir`
/// does not exist.
fn files_below(dir: &Path) -> std::collections::BTreeSet<String> {
    let mut found = std::collections::BTreeSet::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(next) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&next) else { continue };
        for entry in entries {
            let entry = entry.unwrap();
            match entry.file_type().unwrap().is_dir() {
                true => pending.push(entry.path()),
                false => {
                    found.insert(entry.path().strip_prefix(dir).unwrap().to_string_lossy().into_owned());
                }
            }
        }
    }
    found
}

/// The entries of `dir` whose names start with `prefix`.
fn named_like(dir: &Path, prefix: &str) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with(prefix))
        .collect()
}

/// Case 50.8: `publish` carried every file of `evaluation/` and `tensorboard/` (a hidden
/// `.env`, notes) into the public bundle, and followed a linked `tensorboard/` out of the run
/// (a key file from elsewhere was published). Only the files rtrain wrote are carried, by name;
/// a link anywhere in what is carried is refused, naming it, and no bundle is left.
/// Case 50.9: `verify` and `publish --seal` followed a listed file that is a link out of the
/// bundle (`MODEL_CARD.md -> /etc/passwd`: sealed, then verified "ok"); both refuse it now, as
/// they do a linked directory holding files the listing names.
/// Case 50.13: runs with different class sets made one model card of "4 classes" with a
/// per-class table "over 2 runs" that only one run had; they are refused, naming both.
#[test]
fn publish_carries_only_what_rtrain_wrote_and_follows_no_link() {
    let dir = tempfile::tempdir().unwrap();
    let data = common::synth(dir.path(), 4, 2, 32);
    let trained = train_tiny(dir.path(), &data, "run", &[]);
    assert!(trained.status.success(), "{}", text(&trained.stderr));
    let run = dir.path().join("run");
    let carried_dirs = |file: &String| file.starts_with("evaluation/") || file.starts_with("tensorboard/");
    let written: std::collections::BTreeSet<String> =
        files_below(&run).into_iter().filter(carried_dirs).collect();
    assert!(written.contains("evaluation/metrics.json"), "{written:?}");
    assert!(written.iter().any(|f| f.starts_with("tensorboard/events.out.tfevents.")), "{written:?}");
    let secret = "SECRET_TOKEN=hunter2";
    for private in ["evaluation/.env", "evaluation/notes.txt", "tensorboard/.env", "tensorboard/notes.md"] {
        std::fs::write(run.join(private), secret).unwrap();
    }
    let publish = |args: &[&str]| common::rtrain(dir.path()).arg("publish").args(args).output().unwrap();

    let published = publish(&["run", "--out", "bundle"]);
    assert!(published.status.success(), "{}", text(&published.stderr));
    let bundle = dir.path().join("bundle");
    let carried: std::collections::BTreeSet<String> =
        files_below(&bundle.join("runs/run")).into_iter().filter(carried_dirs).collect();
    assert_eq!(
        carried, written,
        "the bundle carries rtrain's files of evaluation/ and tensorboard/, no other"
    );
    for file in files_below(&bundle) {
        let bytes = std::fs::read(bundle.join(&file)).unwrap();
        assert!(!text(&bytes).contains("hunter2"), "{file} carries the private file");
    }

    // Links out of the run: a directory, then a file.
    let outside = dir.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("id_ed25519"), secret).unwrap();
    std::fs::write(outside.join("events.out.tfevents.1.elsewhere.rtrain"), secret).unwrap();
    let refused = |out: &str, named: &str| {
        let output = publish(&["run", "--out", out]);
        let stderr = text(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{named}: {stderr}");
        assert!(stderr.contains(named) && stderr.contains("symbolic link"), "{stderr}");
        assert!(!dir.path().join(out).exists(), "{out} was written");
        assert_eq!(named_like(dir.path(), ".publish-"), Vec::<String>::new(), "staging left behind");
    };
    std::fs::rename(run.join("tensorboard"), dir.path().join("tensorboard-real")).unwrap();
    std::os::unix::fs::symlink(&outside, run.join("tensorboard")).unwrap();
    refused("bundle-dir-link", "tensorboard");
    std::fs::remove_file(run.join("tensorboard")).unwrap();
    std::fs::rename(dir.path().join("tensorboard-real"), run.join("tensorboard")).unwrap();
    std::fs::rename(run.join("evaluation/report.md"), dir.path().join("report.md")).unwrap();
    std::os::unix::fs::symlink(outside.join("id_ed25519"), run.join("evaluation/report.md")).unwrap();
    refused("bundle-file-link", "report.md");
    std::fs::remove_file(run.join("evaluation/report.md")).unwrap();
    std::fs::rename(dir.path().join("report.md"), run.join("evaluation/report.md")).unwrap();

    // Case 50.9: a listed file of the bundle replaced by a link out of it.
    let card = bundle.join("MODEL_CARD.md");
    let metadata = std::fs::read(bundle.join("ro-crate-metadata.json")).unwrap();
    std::fs::rename(&card, dir.path().join("MODEL_CARD.md")).unwrap();
    std::os::unix::fs::symlink(outside.join("id_ed25519"), &card).unwrap();
    let sealed = publish(&["--seal", "bundle"]);
    let stderr = text(&sealed.stderr);
    assert_eq!(sealed.status.code(), Some(1), "sealed a link: {stderr}");
    assert!(stderr.contains("MODEL_CARD.md") && stderr.contains("symbolic link"), "{stderr}");
    assert_eq!(std::fs::read(bundle.join("ro-crate-metadata.json")).unwrap(), metadata, "sealed anyway");
    let verify = || common::rtrain(dir.path()).args(["verify", "bundle"]).output().unwrap();
    let verified = verify();
    let stdout = text(&verified.stdout);
    assert_eq!(verified.status.code(), Some(1), "verified a link: {stdout}");
    assert!(
        stdout
            .lines()
            .any(|l| !l.starts_with("ok") && l.contains("MODEL_CARD.md") && l.contains("symbolic link")),
        "{stdout}"
    );
    std::fs::remove_file(&card).unwrap();
    std::fs::rename(dir.path().join("MODEL_CARD.md"), &card).unwrap();
    assert!(verify().status.success(), "{}", text(&verify().stdout));
    // A linked directory holding the very files the listing names is no better.
    let evaluation = bundle.join("runs/run/evaluation");
    std::fs::rename(&evaluation, dir.path().join("evaluation-copy")).unwrap();
    std::os::unix::fs::symlink(dir.path().join("evaluation-copy"), &evaluation).unwrap();
    let verified = verify();
    let stdout = text(&verified.stdout);
    assert_eq!(verified.status.code(), Some(1), "verified through a linked directory: {stdout}");
    assert!(stdout.contains("runs/run/evaluation is a symbolic link"), "{stdout}");
    let sealed = publish(&["--seal", "bundle"]);
    assert_eq!(sealed.status.code(), Some(1), "sealed through a linked directory: {}", text(&sealed.stderr));

    // Case 50.13: a run of two of the four classes beside the run of four.
    let two = dir.path().join("two-classes");
    for split in ["train", "val"] {
        let mut classes: Vec<_> =
            std::fs::read_dir(data.join(split)).unwrap().map(|e| e.unwrap().path()).collect();
        classes.sort();
        for class in &classes[..2] {
            let to = two.join(split).join(class.file_name().unwrap());
            std::fs::create_dir_all(&to).unwrap();
            for image in std::fs::read_dir(class).unwrap() {
                let image = image.unwrap().path();
                std::fs::copy(&image, to.join(image.file_name().unwrap())).unwrap();
            }
        }
    }
    let trained = train_tiny(dir.path(), &two, "run-two", &[]);
    assert!(trained.status.success(), "{}", text(&trained.stderr));
    let mixed = publish(&["run", "run-two", "--out", "bundle-mixed"]);
    let stderr = text(&mixed.stderr);
    assert_eq!(mixed.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("run-two") && stderr.contains("classes"), "{stderr}");
    assert!(!dir.path().join("bundle-mixed").exists());
}

/// The mode bits of `path` (without its type).
fn mode(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::symlink_metadata(path).unwrap().permissions().mode() & 0o7777
}

/// Case 50.11: `train --overwrite` deleted `checkpoints/`, `evaluation/` and `tensorboard/`
/// whole, with files rtrain never wrote in them (a user's copy of the model, notes, an edited
/// figure saved beside the original, another run's TensorBoard directory), against the README's
/// "deleting that run's files by name, nothing else". The earlier run's files are deleted by
/// their names now (its step checkpoints, its event file), and the rest is kept.
/// And the umask: every file written atomically (config, manifest, summary, weights,
/// checkpoints, evaluation/, tensorboard/) was 0600 whatever the umask, so a project group
/// could not read a shared run directory. They are made as a plain write makes them: under
/// umask 027, 0640.
#[test]
fn overwrite_deletes_only_the_earlier_runs_files_and_files_honour_the_umask() {
    let dir = tempfile::tempdir().unwrap();
    let data = common::synth(dir.path(), 4, 2, 32);
    let first = train_tiny(dir.path(), &data, "run", &[]);
    assert!(first.status.success(), "{}", text(&first.stderr));
    let run = dir.path().join("run");
    let theirs = [
        "checkpoints/my-model.safetensors",
        "checkpoints/notes.txt",
        "evaluation/notes.md",
        "evaluation/confusion-edited.svg",
        "tensorboard/other-run/events.out.tfevents.1700000000.otherhost",
        "tensorboard/events.out.tfevents.1700000000.otherhost.12345.0",
    ];
    for file in theirs {
        std::fs::create_dir_all(run.join(file).parent().unwrap()).unwrap();
        std::fs::write(run.join(file), "theirs").unwrap();
    }
    // A step checkpoint of the earlier run that the new one does not write again.
    let steps = named_like(&run.join("checkpoints"), "step-");
    assert!(!steps.is_empty());
    let old_step = run.join("checkpoints/step-000000999.safetensors");
    std::fs::copy(run.join("checkpoints").join(&steps[0]), &old_step).unwrap();
    let rtrain_events = || {
        let mut names = named_like(&run.join("tensorboard"), "events.out.tfevents.");
        names.retain(|name| name.ends_with(".rtrain"));
        names
    };
    assert_eq!(rtrain_events().len(), 1);

    let replaced = std::process::Command::new("sh")
        .current_dir(dir.path())
        .env_remove("RUST_LOG")
        .args(["-c", "umask 027 && exec \"$0\" \"$@\""])
        .arg(assert_cmd::cargo::cargo_bin("rtrain"))
        .args(["train", "--run-dir", "run", "--overwrite"])
        .args(["--set", &format!("data.root={:?}", data.display().to_string())])
        .args(["--set", "data.image_size=32", "--set", "data.batch_size=4", "--set", "train.threads=1"])
        .args(["--set", "train.epochs=1"])
        .output()
        .unwrap();
    assert!(replaced.status.success(), "{}", text(&replaced.stderr));
    for file in theirs {
        assert_eq!(std::fs::read_to_string(run.join(file)).ok().as_deref(), Some("theirs"), "{file} deleted");
    }
    assert!(!old_step.exists(), "the earlier run's step checkpoint is still there");
    assert_eq!(rtrain_events().len(), 1, "the earlier run's event file is still there");

    let step = format!("checkpoints/{}", named_like(&run.join("checkpoints"), "step-")[0]);
    let events = format!("tensorboard/{}", rtrain_events()[0]);
    let written = [
        "config.toml",
        "manifest.json",
        "metrics.jsonl",
        "summary.json",
        "model.safetensors",
        "checkpoints/best.safetensors",
        &step,
        "evaluation/metrics.json",
        "evaluation/report.md",
        &events,
    ];
    let wrong: Vec<String> = written
        .iter()
        .map(|file| (file, mode(&run.join(file))))
        .filter(|(_, mode)| *mode != 0o640)
        .map(|(file, mode)| format!("{file} {mode:o}"))
        .collect();
    assert!(wrong.is_empty(), "not 0640 under umask 027: {wrong:?}");
}

/// Issue 50, an interrupted publish: a SIGTERM during `publish` ended it with 143 and left a
/// hidden `.publish-*` directory of hundreds of MB. It ends with 75 ("try again") now, its
/// staging directory removed; and the staging directory of a killed publish (SIGKILL) is removed
/// by the next publish into the same `--out`, with a line saying so, while another `--out`'s is
/// left alone.
#[test]
fn an_interrupted_publish_leaves_no_staging_directory() {
    let dir = tempfile::tempdir().unwrap();
    let data = common::synth(dir.path(), 4, 2, 32);
    let trained = train_tiny(dir.path(), &data, "run", &[]);
    assert!(trained.status.success(), "{}", text(&trained.stderr));
    let killed = dir.path().join(".publish-bundle-Ab3xYz");
    std::fs::create_dir_all(killed.join("runs/run")).unwrap();
    std::fs::write(killed.join("runs/run/model.safetensors"), "partial").unwrap();
    let other = dir.path().join(".publish-other-Ab3xYz");
    std::fs::create_dir(&other).unwrap();

    let mut child = std::process::Command::new(assert_cmd::cargo::cargo_bin("rtrain"))
        .current_dir(dir.path())
        .env_remove("RUST_LOG")
        .args(["publish", "run", "--out", "bundle"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Stopped as soon as its own staging directory appears, then signalled: the signal lands
    // while the bundle is staged, however fast this machine copies.
    let started = std::time::Instant::now();
    let staged = loop {
        let staging = named_like(dir.path(), ".publish-bundle-");
        if staging.iter().any(|name| !name.ends_with("Ab3xYz")) {
            break true;
        }
        if child.try_wait().unwrap().is_some() || started.elapsed() > std::time::Duration::from_secs(60) {
            break false;
        }
    };
    let pid = child.id() as i32;
    // SAFETY: signals to the child this test started and has not yet reaped.
    unsafe {
        libc::kill(pid, libc::SIGSTOP);
        libc::kill(pid, libc::SIGTERM);
        libc::kill(pid, libc::SIGCONT);
    }
    let output = child.wait_with_output().unwrap();
    let stderr = text(&output.stderr);
    assert!(staged, "no staging directory appeared: {stderr}");
    assert_eq!(output.status.code(), Some(75), "{stderr}");
    assert!(stderr.contains("stop signal"), "{stderr}");
    assert!(
        stderr.contains(".publish-bundle-Ab3xYz, left by a publish into bundle that was killed"),
        "the killed publish's staging directory unnamed: {stderr}"
    );
    assert_eq!(named_like(dir.path(), ".publish-bundle-"), Vec::<String>::new(), "staging left behind");
    assert!(other.is_dir(), "another --out's staging directory was removed");
    assert!(!dir.path().join("bundle").exists());

    let again = common::rtrain(dir.path()).args(["publish", "run", "--out", "bundle"]).output().unwrap();
    assert!(again.status.success(), "{}", text(&again.stderr));
}
