//! Helpers shared by the integration tests: the Python reference interpreter, scratch
//! directories, running the real `rtrain` binary, and the fixtures made once per test binary
//! (`fixtures`).
#![allow(dead_code)]

pub mod fixtures;

use std::path::{Path, PathBuf};
use std::process::Command;

/// The repository root.
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The text of a documentation page, by its path from the repository root
/// (`docs/operations/slurm.md`): the tests that run what the docs show read it from there.
pub fn doc(path: &str) -> String {
    std::fs::read_to_string(repo().join(path)).unwrap_or_else(|e| panic!("read {path}: {e}"))
}

/// The Python with PyTorch and torchvision that `scripts/setup --test` installs. The reference
/// tests need it: without it they fail and say how to get it, rather than silently passing.
/// Checked once per test process: importing torch and torchvision costs 3 CPU-seconds, and a
/// check before each of the suite's eighty reference runs cost CI four minutes of CPU.
pub fn python() -> PathBuf {
    static CHECKED: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    CHECKED
        .get_or_init(|| {
            let python = repo().join(".deps/venv/bin/python");
            let ok = Command::new(&python)
                .args(["-c", "import torch, torchvision, safetensors"])
                .status()
                .map(|s| s.success())
                .unwrap_or(false);
            assert!(ok, "the Python reference (torch, torchvision) is missing: run scripts/setup --test");
            python
        })
        .clone()
}

/// Runs a reference script with arguments; panics with its output if it fails.
pub fn run_python(script: &str, args: &[&std::ffi::OsStr]) {
    let output = Command::new(python())
        .arg(repo().join("tests/reference").join(script))
        .args(args)
        .output()
        .expect("start python");
    assert!(
        output.status.success(),
        "{script} failed:\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// The built `rtrain` binary, run with `dir` as its working directory.
pub fn rtrain(dir: &Path) -> assert_cmd::Command {
    let mut command = assert_cmd::Command::cargo_bin("rtrain").expect("rtrain binary");
    command.current_dir(dir).env_remove("RUST_LOG");
    command
}

/// The Fashion-MNIST IDX files from Debian's dataset-fashion-mnist (scripts/setup --test).
pub fn fashion_mnist(file: &str) -> PathBuf {
    let path = Path::new("/usr/share/datasets/fashion-mnist").join(file);
    assert!(path.exists(), "{} is missing: run scripts/setup --test", path.display());
    path
}

/// The Fashion-MNIST subset the learning tests train on, imported to `dir/fmnist`: the first
/// `train_images` training images (configs/fashion-mnist.toml documents 3,000) and 1,000 test
/// images.
pub fn fashion_mnist_subset(dir: &Path, train_images: usize) -> PathBuf {
    let data = dir.join("fmnist");
    let train_limit = train_images.to_string();
    for (images, labels, split, limit) in [
        ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", "train", train_limit.as_str()),
        ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz", "val", "1000"),
    ] {
        rtrain(dir)
            .args(["data", "import-idx"])
            .arg(fashion_mnist(images))
            .arg(fashion_mnist(labels))
            .arg(&data)
            .args(["--split", split, "--limit", limit])
            .assert()
            .success();
    }
    data
}

/// A small synthetic damage set under `dir/data` (4 classes), made by `rtrain data synth`.
pub fn synth(dir: &Path, train_per_class: usize, val_per_class: usize, image_size: u32) -> PathBuf {
    let data = dir.join("data");
    rtrain(dir)
        .args(["data", "synth"])
        .arg(&data)
        .args(["--train-per-class", &train_per_class.to_string()])
        .args(["--val-per-class", &val_per_class.to_string()])
        .args(["--image-size", &image_size.to_string()])
        .assert()
        .success();
    data
}

/// The body of each `%section` of an Apptainer definition file, in order.
pub fn apptainer_sections(text: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for line in text.lines() {
        if let Some(name) = line.strip_prefix('%') {
            out.push((name.trim().to_string(), String::new()));
        } else if let Some((_, body)) = out.last_mut() {
            body.push_str(line);
            body.push('\n');
        }
    }
    out
}

/// A finished command's output, after asserting it succeeded (its output shown when not).
pub fn assert_success(output: std::process::Output, what: &str) -> std::process::Output {
    assert!(
        output.status.success(),
        "{what} failed ({}):\n{}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// `mpirun` for ranks on this machine, as root if need be, with shared memory that works in a
/// container (no single-copy) and no core binding (the tests oversubscribe 2 cores).
pub fn mpirun(dir: &Path) -> Command {
    let mut command = Command::new("mpirun");
    command
        .current_dir(dir)
        .env_remove("RUST_LOG")
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .args(["--oversubscribe", "--bind-to", "none"])
        .args(["--mca", "btl", "self,vader", "--mca", "btl_vader_single_copy_mechanism", "none"]);
    command
}

/// A loopback HTTP server for the files of `dir` (GET only, one request per connection), on a
/// port of its own; it runs until the test process ends. Returns its base URL.
pub fn serve_dir(dir: &Path) -> String {
    use std::io::{BufRead, BufReader, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
    let url = format!("http://{}/", listener.local_addr().unwrap());
    let dir = dir.to_path_buf();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut reader = BufReader::new(&stream);
            let mut request = String::new();
            if reader.read_line(&mut request).is_err() {
                continue;
            }
            // Skip the headers.
            let mut line = String::new();
            while reader.read_line(&mut line).map(|n| n > 2).unwrap_or(false) {
                line.clear();
            }
            let path = request.split_whitespace().nth(1).unwrap_or("/").trim_start_matches('/').to_string();
            let mut stream = &stream;
            match std::fs::read(dir.join(&path)) {
                Ok(body) if !path.contains("..") => {
                    let head = format!(
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                        body.len()
                    );
                    let _ = stream.write_all(head.as_bytes()).and_then(|()| stream.write_all(&body));
                }
                _ => {
                    let _ = stream.write_all(
                        b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                    );
                }
            }
        }
    });
    url
}

/// Waits for a child up to `limit`; kills it and fails the test if it is still running.
pub fn wait_within(
    child: &mut std::process::Child,
    limit: std::time::Duration,
    what: &str,
) -> std::process::ExitStatus {
    let started = std::time::Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            panic!("{what}: still running after {limit:?} (a hang)");
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// The metadata of a checkpoint of a fresh `arch` model with `classes` and an MLP head of
/// `head_hidden`, taken after `global_step` steps, for tests that save one themselves.
pub fn checkpoint_meta(
    arch: rtrain::model::Arch,
    classes: Vec<String>,
    head_hidden: &[usize],
    global_step: u64,
    image_size: u32,
) -> rtrain::run_dir::checkpoint::CheckpointMeta {
    rtrain::run_dir::checkpoint::CheckpointMeta {
        arch,
        num_classes: classes.len(),
        classes,
        head_hidden: head_hidden.to_vec(),
        epoch: 1,
        step_in_epoch: 0,
        global_step,
        seed: 0,
        image_size: Some(image_size),
        preprocessing: None,
        config_hash: String::new(),
        val_top1: None,
        best_val_top1: None,
        epoch_totals: rtrain::run_dir::checkpoint::EpochTotals::default(),
        plateau: None,
        early_stopping: Default::default(),
        accumulate: 1,
        rtrain_version: "test".into(),
    }
}

/// tests/reference/calibration_reference.py's answer in `mode` (scikit-learn, netcal, MAPIE) to
/// `given`, JSON both ways through its stdin and stdout.
pub fn calibration_reference(mode: &str, given: &serde_json::Value) -> serde_json::Value {
    use std::io::Write;
    let mut child = Command::new(python())
        .arg(repo().join("tests/reference/calibration_reference.py"))
        .args(["--mode", mode])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(given.to_string().as_bytes()).unwrap();
    let output = child.wait_with_output().unwrap();
    serde_json::from_slice(&assert_success(output, "calibration_reference.py").stdout).unwrap()
}

/// A CSV file's rows, each as header -> cell.
pub fn csv_rows(path: &Path) -> Vec<std::collections::BTreeMap<String, String>> {
    let mut reader = csv::Reader::from_path(path).unwrap();
    let header: Vec<String> = reader.headers().unwrap().iter().map(String::from).collect();
    reader
        .records()
        .map(|row| header.iter().cloned().zip(row.unwrap().iter().map(String::from)).collect())
        .collect()
}
