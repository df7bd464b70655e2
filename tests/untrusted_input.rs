//! Untrusted input read safely: the cases of the issue "Untrusted files read safely: a hostile
//! .pth, image, manifest or value never crashes, hangs, leaks memory or loses a run", through
//! the real binary. Each failed on the code before it. This file holds the settings cases
//! (values that passed validation and then crashed, a run name that escaped `run.dir`, a
//! misspelt environment variable ignored in silence), run directories and checkpoints, and
//! images whose header declares more pixels than anyone photographs.

mod common;

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
    let data = common::synth(dir.path(), 2, 1, 32);
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
