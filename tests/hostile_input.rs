//! Nothing silently wrong: what a hostile user (or a failing disk, or a careless launch) does
//! to rtrain, through the real binary, and the clear refusal each case must get. One test per
//! case of the issue "Nothing silently wrong"; each failed on the code before it.

// Helpers of the tier-gated tests are unused in the fast loop (`cargo test` without features).
#![cfg_attr(not(feature = "all-tiers"), allow(dead_code, unused_imports))]

use crate::common;

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// The settings of every run here: 32 px images, one epoch, one thread, data at `data`.
fn tiny(data: &Path) -> Vec<String> {
    let sets = [
        format!("data.root={:?}", data.display().to_string()),
        "data.image_size=32".into(),
        "data.batch_size=4".into(),
        "train.epochs=1".into(),
        "train.threads=1".into(),
        "optim.lr=0.01".into(),
    ];
    sets.iter().flat_map(|s| ["--set".to_string(), s.clone()]).collect()
}

fn sets(pairs: &[&str]) -> Vec<String> {
    pairs.iter().flat_map(|s| ["--set".to_string(), s.to_string()]).collect()
}

/// `rtrain train` of the tiny run into `run`, with more settings.
fn train(dir: &Path, data: &Path, run: &Path, more: &[&str]) -> assert_cmd::Command {
    let mut command = common::rtrain(dir);
    command.arg("train").arg("--run-dir").arg(run).args(tiny(data)).args(sets(more));
    command
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// Flips every bit of the byte at `offset`.
fn flip_byte(path: &Path, offset: usize) {
    let mut bytes = std::fs::read(path).unwrap();
    bytes[offset] ^= 0xff;
    std::fs::write(path, bytes).unwrap();
}

fn step_checkpoint(run: &Path, step: u64) -> PathBuf {
    run.join(format!("checkpoints/step-{step:09}.safetensors"))
}

/// An image of the training split (for `predict`).
fn some_image(data: &Path) -> PathBuf {
    let class = std::fs::read_dir(data.join("train")).unwrap().next().unwrap().unwrap().path();
    std::fs::read_dir(class).unwrap().next().unwrap().unwrap().path()
}

/// Case 1: a checkpoint whose weights lost a byte is refused by eval and predict, skipped by
/// `--resume auto` for the next older one, and never re-hashed into the manifest.
#[test]
fn a_checkpoint_with_a_flipped_byte_is_refused_skipped_and_not_rehashed() {
    let dir = tempfile::tempdir().unwrap();
    let data = common::synth(dir.path(), 8, 2, 32);
    let run = dir.path().join("run");
    // 32 images / batch 4: steps 2, 4, 6 and the epoch's end, 8.
    train(dir.path(), &data, &run, &["checkpoint.every_steps=2", "checkpoint.keep_last=10"])
        .assert()
        .success();
    let (older, newest) = (step_checkpoint(&run, 4), step_checkpoint(&run, 8));
    for file in [&older, &newest] {
        let len = std::fs::metadata(file).unwrap().len() as usize;
        flip_byte(file, len / 2);
    }

    let eval =
        common::rtrain(dir.path()).arg("eval").arg("--checkpoint").arg(&older).args(tiny(&data)).output();
    let eval = eval.unwrap();
    assert!(!eval.status.success(), "eval used a corrupt checkpoint:\n{}", text(&eval.stdout));
    let stderr = text(&eval.stderr);
    assert!(stderr.contains("step-000000004.safetensors") && stderr.contains("digest"), "{stderr}");
    let predict = common::rtrain(dir.path())
        .arg("predict")
        .arg("--checkpoint")
        .arg(&older)
        .arg(some_image(&data))
        .output();
    let predict = predict.unwrap();
    assert!(!predict.status.success(), "predict used a corrupt checkpoint:\n{}", text(&predict.stdout));
    assert!(text(&predict.stderr).contains("step-000000004.safetensors"), "{}", text(&predict.stderr));

    // Resume sets the corrupt newest aside (step-000000008.safetensors.invalid) for step 6,
    // trains on (writing step 8 again), and leaves the corrupt step 4, older than the one it
    // resumed from, as the manifest knew it, so that verify still finds it.
    let resumed = train(dir.path(), &data, &run, &["checkpoint.every_steps=2", "checkpoint.keep_last=10"])
        .args(["--resume", "auto"])
        .output()
        .unwrap();
    let resumed = common::assert_success(resumed, "resume");
    let stderr = text(&resumed.stderr);
    assert!(
        stderr.contains("set aside as") && stderr.contains("step-000000008.safetensors.invalid"),
        "{stderr}"
    );
    let summary = json(&run.join("summary.json"));
    assert!(summary["resumed_from"].as_str().unwrap().ends_with("step-000000006.safetensors"), "{summary}");
    let verify = common::rtrain(dir.path()).arg("verify").arg(&run).output().unwrap();
    let stdout = text(&verify.stdout);
    assert!(!verify.status.success(), "verify passed over a corrupt checkpoint:\n{stdout}");
    let bad: Vec<&str> = stdout.lines().filter(|line| !line.starts_with("ok")).collect();
    assert_eq!(bad.len(), 1, "{stdout}");
    assert!(bad[0].starts_with("MISMATCH") && bad[0].contains("step-000000004"), "{stdout}");
}

/// Case 2: a last batch of one image would put NaN into BatchNorm's running variance; it is
/// dropped (and a batch size of 1 refused), so the run ends with finite statistics.
#[test]
fn a_last_batch_of_one_image_is_dropped_not_averaged_into_nan() {
    let dir = tempfile::tempdir().unwrap();
    // 28 training images in batches of 3: nine of 3 and one of 1.
    let data = common::synth(dir.path(), 7, 2, 32);
    let run = dir.path().join("run");
    let output =
        train(dir.path(), &data, &run, &["data.batch_size=3", "data.drop_last=false"]).output().unwrap();
    let output = common::assert_success(output, "train");
    let summary = json(&run.join("summary.json"));
    assert_eq!(summary["global_steps"], 9, "the batch of one is dropped: {summary}");
    let loss = summary["final_eval"]["loss"].as_f64().unwrap_or(f64::NAN);
    assert!(loss.is_finite(), "validation loss {loss}: BatchNorm statistics went NaN");
    assert!(text(&output.stderr).contains("1 image"), "{}", text(&output.stderr));

    let refused = train(dir.path(), &data, &dir.path().join("one"), &["data.batch_size=1"]).output().unwrap();
    assert_eq!(refused.status.code(), Some(2), "{}", text(&refused.stderr));
    assert!(text(&refused.stderr).contains("data.batch_size"), "{}", text(&refused.stderr));
}

/// Case 3: a shard whose bytes no longer match shards.json fails training, naming the shard.
#[test]
fn training_from_a_shard_that_changed_fails_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let data = common::synth(dir.path(), 4, 2, 32);
    let shards = dir.path().join("shards");
    common::rtrain(dir.path()).args(["data", "prepare"]).arg(&data).arg(&shards).assert().success();
    let shard = std::fs::read_dir(&shards)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            p.file_name().unwrap().to_string_lossy().starts_with("train")
                && p.extension() == Some(OsStr::new("tar"))
        })
        .expect("a training shard");
    // A byte in the middle of the first image: it still decodes, to other pixels.
    let mut archive = tar::Archive::new(std::fs::File::open(&shard).unwrap());
    let (position, size) = archive
        .entries()
        .unwrap()
        .map(|e| e.unwrap())
        .find(|e| e.path().unwrap().extension() == Some(OsStr::new("jpg")))
        .map(|e| (e.raw_file_position() as usize, e.size() as usize))
        .expect("a jpg in the shard");
    flip_byte(&shard, position + size / 2);
    let output = train(dir.path(), &shards, &dir.path().join("run"), &[]).output().unwrap();
    assert!(!output.status.success(), "trained from a changed shard");
    let name = shard.file_name().unwrap().to_string_lossy().into_owned();
    assert!(text(&output.stderr).contains(&name), "{}", text(&output.stderr));
}

/// Case 4: a second trainer on a run directory in use is refused, naming the first's pid.
#[test]
fn a_second_trainer_on_one_run_directory_is_refused_naming_the_first() {
    let dir = tempfile::tempdir().unwrap();
    let data = common::synth(dir.path(), 8, 2, 32);
    let run = dir.path().join("run");
    let mut first = Command::new(assert_cmd::cargo::cargo_bin("rtrain"))
        .current_dir(dir.path())
        .arg("train")
        .arg("--run-dir")
        .arg(&run)
        .args(tiny(&data))
        .args(sets(&["train.epochs=1000"]))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while !run.join("metrics.jsonl").exists() && started.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(100));
    }
    let second = train(dir.path(), &data, &run, &["train.epochs=1000"])
        .args(["--resume", "auto"])
        .timeout(Duration::from_secs(60))
        .output();
    let _ = first.kill();
    let _ = first.wait();
    let second = second.unwrap();
    assert!(!second.status.success(), "two trainers wrote one run directory");
    let stderr = text(&second.stderr);
    assert!(stderr.contains(&format!("pid {}", first.id())) && stderr.contains("in use"), "{stderr}");
}

/// Case 5: a step that makes the weights non-finite is caught before its checkpoint is
/// written: every checkpoint left is finite (checked by PyTorch), so `--resume auto` never
/// picks a poisoned one.
#[cfg(feature = "test-reference")]
#[test]
fn no_non_finite_checkpoint_is_written_when_a_run_diverges() {
    let dir = tempfile::tempdir().unwrap();
    let data = common::synth(dir.path(), 8, 2, 32);
    let run = dir.path().join("run");
    // SGD at the largest learning rate validation allows (10), from the first step (no warm-up,
    // no decay), diverges within the first epoch; up to three are allowed. With the default
    // warm-up (lr rising from 1 to 10 over the one epoch) the run stayed finite on AVX-512
    // kernels (loss 7e5 at its last step) and only diverged on AVX2 ones.
    let settings = [
        "checkpoint.every_steps=1",
        "optim.name=sgd",
        "optim.lr=10",
        "model.zero_init_residual=false",
        "schedule.kind=\"constant\"",
        "schedule.warmup_epochs=0",
        "train.epochs=3",
    ];
    let diverged = train(dir.path(), &data, &run, &settings).output().unwrap();
    assert!(!diverged.status.success());
    assert!(text(&diverged.stderr).contains("lower optim.lr"), "{}", text(&diverged.stderr));
    let checkpoints: Vec<PathBuf> =
        std::fs::read_dir(run.join("checkpoints")).unwrap().map(|e| e.unwrap().path()).collect();
    assert!(!checkpoints.is_empty(), "the steps before the divergence were saved");
    let script = "import sys, torch; from safetensors.torch import load_file\n\
        for f in sys.argv[1:]:\n\
        \x20   bad = [n for n, t in load_file(f).items() if t.is_floating_point() and not torch.isfinite(t).all()]\n\
        \x20   print(f, bad)\n\
        \x20   assert not bad, f";
    let check = Command::new(common::python()).args(["-c", script]).args(&checkpoints).output().unwrap();
    common::assert_success(check, "every checkpoint left is finite");
}

/// Case 6: ranks launched with different configurations (MPMD) stop at the start, naming the
/// rank and the key that differ.
#[cfg(feature = "test-mpi")]
#[test]
fn ranks_with_different_configurations_stop_at_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let data = common::synth(dir.path(), 8, 2, 32);
    let run = dir.path().join("run");
    let rtrain = assert_cmd::cargo::cargo_bin("rtrain");
    let mut args: Vec<String> = vec!["train".into(), "--run-dir".into(), run.display().to_string()];
    args.extend(tiny(&data));
    let output = common::mpirun(dir.path())
        .args(["-np", "1"])
        .arg(&rtrain)
        .args(&args)
        .arg(":")
        .args(["-np", "1"])
        .arg(&rtrain)
        .args(&args)
        .args(["--set", "optim.lr=0.5"])
        .output()
        .unwrap();
    assert!(!output.status.success(), "ranks with different learning rates trained together");
    let stderr = text(&output.stderr);
    assert!(stderr.contains("rank 1") && stderr.contains("optim.lr"), "{stderr}");
    assert!(!run.join("summary.json").exists());
}

/// Case 7: a refused `--resume auto` changes nothing in the run directory.
#[test]
fn a_refused_resume_leaves_the_run_directory_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let data = common::synth(dir.path(), 4, 2, 32);
    let run = dir.path().join("run");
    train(dir.path(), &data, &run, &[]).assert().success();
    let before: Vec<Vec<u8>> = ["config.toml", "metrics.jsonl", "manifest.json"]
        .iter()
        .map(|f| std::fs::read(run.join(f)).unwrap())
        .collect();
    let refused =
        train(dir.path(), &data, &run, &["model.arch=\"resnet34\""]).args(["--resume", "auto"]).output();
    let refused = refused.unwrap();
    assert!(!refused.status.success());
    assert!(text(&refused.stderr).contains("resnet34"), "{}", text(&refused.stderr));
    let after: Vec<Vec<u8>> = ["config.toml", "metrics.jsonl", "manifest.json"]
        .iter()
        .map(|f| std::fs::read(run.join(f)).unwrap())
        .collect();
    assert!(before == after, "the refused resume rewrote the run directory");
}

/// Case 8: the final `model.safetensors` works for eval and predict; a bare state dict and a
/// resume from the final weights get errors that name the file to use instead.
#[cfg(feature = "test-reference")]
#[test]
fn the_final_weights_file_is_usable_and_a_bare_one_names_the_alternative() {
    let dir = tempfile::tempdir().unwrap();
    let data = common::synth(dir.path(), 4, 2, 32);
    let run = dir.path().join("run");
    train(dir.path(), &data, &run, &[]).assert().success();
    let weights = run.join("model.safetensors");
    let eval = common::rtrain(dir.path())
        .arg("eval")
        .arg("--checkpoint")
        .arg(&weights)
        .args(tiny(&data))
        .arg("--json")
        .output()
        .unwrap();
    let eval = common::assert_success(eval, "eval model.safetensors");
    let report: Value = serde_json::from_slice(&eval.stdout).unwrap();
    let summary = json(&run.join("summary.json"));
    assert_eq!(report["top1"], summary["final_eval"]["top1"], "{report}");
    let predict = common::rtrain(dir.path())
        .arg("predict")
        .arg("--checkpoint")
        .arg(&weights)
        .arg(some_image(&data))
        .output();
    common::assert_success(predict.unwrap(), "predict model.safetensors");

    let resume = train(dir.path(), &data, &run, &[]).arg("--resume").arg(&weights).output().unwrap();
    assert!(!resume.status.success());
    let newest = step_checkpoint(&run, 4);
    assert!(newest.exists());
    assert!(text(&resume.stderr).contains(&newest.display().to_string()), "{}", text(&resume.stderr));

    // The same tensors with no metadata (as torchvision or safetensors.torch.save_file writes).
    let bare = run.join("bare.safetensors");
    let script = "import sys; from safetensors.torch import load_file, save_file; save_file(load_file(sys.argv[1]), sys.argv[2])";
    let status =
        Command::new(common::python()).args(["-c", script]).arg(&weights).arg(&bare).status().unwrap();
    assert!(status.success());
    let refused = common::rtrain(dir.path())
        .arg("predict")
        .arg("--checkpoint")
        .arg(&bare)
        .arg(some_image(&data))
        .output();
    let refused = refused.unwrap();
    assert!(!refused.status.success());
    let stderr = text(&refused.stderr);
    assert!(stderr.contains("bare.safetensors") && stderr.contains("model.safetensors"), "{stderr}");
}

/// Case 9: a data file whose name is not UTF-8 is recorded losslessly and found by verify.
#[test]
fn a_non_utf8_file_name_is_found_again_by_verify() {
    let dir = tempfile::tempdir().unwrap();
    let data = common::synth(dir.path(), 4, 2, 32);
    let image = some_image(&data);
    let renamed = image.with_file_name(OsStr::from_bytes(b"caf\xe9-latin1.jpg"));
    std::fs::rename(&image, &renamed).unwrap();
    let run = dir.path().join("run");
    train(dir.path(), &data, &run, &[]).assert().success();
    let verify = common::rtrain(dir.path()).arg("verify").arg(&run).output().unwrap();
    common::assert_success(verify, "verify");
}

/// Case 10: a rank launched with PMIx's rank variable alone (the Open MPI job's own variables
/// removed) joins the job instead of training as a single process.
#[cfg(feature = "test-mpi")]
#[test]
fn pmix_rank_alone_joins_the_mpi_job() {
    let dir = tempfile::tempdir().unwrap();
    let data = common::synth(dir.path(), 4, 2, 32);
    let run = dir.path().join("run");
    let mut unset = Vec::new();
    for var in ["RANK", "SIZE", "LOCAL_RANK", "LOCAL_SIZE", "NODE_RANK"] {
        unset.extend(["-u".to_string(), format!("OMPI_COMM_WORLD_{var}")]);
    }
    let output = common::mpirun(dir.path())
        .args(["-np", "2", "env"])
        .args(&unset)
        .arg(assert_cmd::cargo::cargo_bin("rtrain"))
        .arg("train")
        .arg("--run-dir")
        .arg(&run)
        .args(tiny(&data))
        .output()
        .unwrap();
    common::assert_success(output, "mpirun with PMIX_RANK only");
    assert_eq!(json(&run.join("summary.json"))["world_size"], 2);
}

/// Case 11: an error says its cause once, configuration keys carry no profile prefix, and
/// verify says each file once.
#[test]
fn errors_say_each_thing_once() {
    let dir = tempfile::tempdir().unwrap();
    let missing =
        common::rtrain(dir.path()).args(["eval", "--checkpoint", "nowhere.safetensors"]).output().unwrap();
    let line = text(&missing.stderr);
    let parts: Vec<&str> = line.trim().split(": ").collect();
    assert!(parts.windows(2).all(|pair| pair[0] != pair[1]), "a cause said twice: {line}");
    assert!(line.contains("nowhere.safetensors"), "{line}");

    let config = dir.path().join("bad.toml");
    std::fs::write(&config, "[train]\nepochz = 3\n").unwrap();
    let bad = common::rtrain(dir.path()).arg("train").arg("--config").arg(&config).output().unwrap();
    let stderr = text(&bad.stderr);
    assert!(stderr.contains("train.epochz") && !stderr.contains("default."), "{stderr}");

    let data = common::synth(dir.path(), 4, 2, 32);
    let run = dir.path().join("run");
    train(dir.path(), &data, &run, &[]).assert().success();
    let verify = common::assert_success(
        common::rtrain(dir.path()).arg("verify").arg(&run).output().unwrap(),
        "verify",
    );
    let stdout = text(&verify.stdout);
    let mut lines: Vec<&str> = stdout.lines().collect();
    let total = lines.len();
    lines.sort_unstable();
    lines.dedup();
    assert_eq!(lines.len(), total, "a line said twice:\n{stdout}");
}
