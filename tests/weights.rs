//! Starting weights as torchvision users have them: `.pth` files written by `torch.save`, and
//! published weights fetched by name into PyTorch's cache. The files come from PyTorch itself
//! (tests/reference/torchvision_pth.py).

use crate::common;

use std::collections::BTreeMap;
use std::path::Path;

use rtrain::model::weights::PUBLISHED;
use tch::Tensor;

fn safetensors(path: &Path) -> BTreeMap<String, Tensor> {
    rtrain::util::files::read_safetensors(path).unwrap().tensors
}

/// Writes torchvision's `arch` with torch.save into `dir`; returns the .pth's hub-style name.
fn write_pth(arch: &str, dir: &Path) -> String {
    let output = std::process::Command::new(common::python())
        .arg(common::repo().join("tests/reference/torchvision_pth.py"))
        .args(["write", arch])
        .arg(dir)
        .output()
        .unwrap();
    let output = common::assert_success(output, "torchvision_pth.py write");
    String::from_utf8(output.stdout).unwrap().trim().to_string()
}

#[test]
fn published_weights_match_torchvision() {
    let output = std::process::Command::new(common::python())
        .arg(common::repo().join("tests/reference/torchvision_pth.py"))
        .arg("published")
        .output()
        .unwrap();
    let output = common::assert_success(output, "torchvision_pth.py published");
    let table: BTreeMap<String, BTreeMap<String, String>> = serde_json::from_slice(&output.stdout).unwrap();
    let ours: BTreeMap<String, BTreeMap<String, String>> =
        PUBLISHED.iter().fold(BTreeMap::new(), |mut t, p| {
            t.entry(p.arch.name().to_string()).or_default().insert(p.name.to_string(), p.file.to_string());
            t
        });
    assert_eq!(ours, table);
}

/// `rtrain weights convert` reads PyTorch's zip archive and writes every tensor with its exact
/// dtype, shape and bytes (the reference: the same state dict saved by Python's safetensors).
#[test]
fn a_torch_save_file_converts_tensor_for_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let name = write_pth("resnet34", dir.path());
    common::rtrain(dir.path())
        .args(["weights", "convert", &name, "converted.safetensors"])
        .assert()
        .success();
    let (ours, expected) = (
        safetensors(&dir.path().join("converted.safetensors")),
        safetensors(&dir.path().join("expected.safetensors")),
    );
    assert_eq!(ours.keys().collect::<Vec<_>>(), expected.keys().collect::<Vec<_>>());
    assert!(ours.len() > 200, "{} tensors", ours.len());
    for (key, tensor) in &expected {
        assert_eq!(ours[key].kind(), tensor.kind(), "{key}");
        assert!(ours[key].equal(tensor), "{key} differs");
    }
}

/// `model.weights` names a file on a server (loopback here) that is not in the cache: training
/// fetches it into an empty `$TORCH_HOME/hub/checkpoints`, checks it against the hash prefix in
/// its name, starts from it (with backbone and BatchNorm frozen, the trained model still holds
/// its exact tensors) and records it in the manifest. A second run finds it cached.
#[test]
fn training_fetches_named_weights_into_an_empty_cache_and_starts_from_them() {
    let dir = tempfile::tempdir().unwrap();
    let served = dir.path().join("served");
    std::fs::create_dir_all(&served).unwrap();
    let name = write_pth("resnet18", &served);
    let url = common::serve_dir(&served);
    let data = common::synth(dir.path(), 4, 2, 32);
    let torch_home = dir.path().join("torch");
    let train = |run: &str, base_url: &str| {
        let mut command = common::rtrain(dir.path());
        command
            .env("TORCH_HOME", &torch_home)
            .args(["train", "--run-dir", run])
            .args(["--set", &format!("data.root={:?}", data.to_string_lossy())])
            .args(["--set", "data.image_size=32", "--set", "data.batch_size=8", "--set", "train.epochs=1"])
            .args(["--set", "model.freeze_backbone=true", "--set", "model.freeze_batchnorm=true"])
            .args([
                "--set",
                &format!("model.weights={name:?}"),
                "--set",
                &format!("model.weights_url={base_url:?}"),
            ]);
        command
    };
    train("first", &url).assert().success();

    let cached = torch_home.join("hub/checkpoints").join(&name);
    assert_eq!(std::fs::read(&cached).unwrap(), std::fs::read(served.join(&name)).unwrap());
    let expected = safetensors(&served.join("expected.safetensors"));
    let trained = safetensors(&dir.path().join("first/model.safetensors"));
    assert_eq!(trained.keys().collect::<Vec<_>>(), expected.keys().collect::<Vec<_>>());
    // The head is new and the counters count this run's steps; every other tensor is frozen.
    let kept = |key: &&String| !key.starts_with("fc.") && !key.ends_with(".num_batches_tracked");
    let keys: Vec<&String> = expected.keys().filter(kept).collect();
    assert_eq!(keys.len(), 100, "60 parameters and 40 BatchNorm statistics");
    for key in keys {
        assert!(trained[key].equal(&expected[key]), "{key} is not the served file's");
    }
    assert_eq!(trained["fc.weight"].size(), [4, 512], "the head is re-initialised for 4 classes");
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("first/manifest.json")).unwrap())
            .unwrap();
    let start = &manifest["starting_weights"];
    assert_eq!(start["name"], name.as_str());
    assert_eq!(start["url"], format!("{url}{name}").as_str());
    let sha = start["sha256"].as_str().unwrap();
    assert!(name.contains(&sha[..8]) && sha.len() == 64, "{sha} vs {name}");

    // Cached: a server that does not answer is never asked.
    train("second", "http://127.0.0.1:9/").assert().success();
}

/// Weights that are neither cached nor fetchable: the error names the cache file, the URL and
/// the command that fills the cache.
#[test]
fn weights_neither_cached_nor_fetchable_name_the_file_url_and_fetch_command() {
    let dir = tempfile::tempdir().unwrap();
    let data = common::fixtures::synth_tree();
    let torch_home = dir.path().join("torch");
    let output = common::rtrain(dir.path())
        .env("TORCH_HOME", &torch_home)
        .args(["train", "--run-dir", "run"])
        .args(["--set", &format!("data.root={:?}", data.to_string_lossy())])
        .args(["--set", "data.batch_size=4", "--set", "data.image_size=32"])
        .args(["--set", "model.arch=\"resnet34\"", "--set", "model.weights=\"IMAGENET1K_V1\""])
        .args(["--set", "model.weights_url=\"http://127.0.0.1:9/models/\""])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    let file = torch_home.join("hub/checkpoints/resnet34-b627a593.pth");
    for needle in [
        file.to_string_lossy().as_ref(),
        "http://127.0.0.1:9/models/resnet34-b627a593.pth",
        "rtrain weights fetch resnet34 --weights IMAGENET1K_V1",
    ] {
        assert!(stderr.contains(needle), "missing {needle:?} in:\n{stderr}");
    }
    assert!(!file.exists());
}

/// The hostile and unusual `.pth` files of tests/reference/hostile_pth.py, in a fresh directory.
fn hostile_pth_files() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    common::run_python("hostile_pth.py", &[dir.path().as_os_str()]);
    dir
}

/// `rtrain weights convert FILE out.safetensors` under a 3 GiB address-space limit, so that an
/// allocation of what a small file declares (4 GiB and more) fails rather than succeeds.
fn convert_bounded(dir: &Path, file: &str) -> std::process::Output {
    let rtrain = assert_cmd::cargo::cargo_bin("rtrain");
    std::process::Command::new("bash")
        .current_dir(dir)
        .env_remove("RUST_LOG")
        .args(["-c", r#"ulimit -v 3145728 && exec "$0" weights convert "$1" out.safetensors"#])
        .arg(rtrain)
        .arg(file)
        .output()
        .unwrap()
}

/// Issue "Untrusted files read safely", cases 1-6: a `.pth` that lies about its storages, nests
/// a million levels deep, claims another byte order, hides names behind NUL bytes, asks for
/// gigabytes from a few bytes, or is not a pickle a state dict can be, is refused with one line
/// that names the file and the problem, exit 1, no output written: never a segfault, an abort,
/// heap bytes in the output or a silently lost tensor. (libtorch's unpickler read these before:
/// 4 MB of process heap written for the first, segfaults, stack overflows, a big-endian file
/// read unswapped, two NUL-named tensors collapsed into one, "0 tensors" written, 16-frame C++
/// backtraces.)
#[test]
fn a_hostile_pth_is_refused_with_one_line_naming_the_file() {
    let dir = hostile_pth_files();
    let cases = [
        ("storage_larger_than_record.pth", "more than the file's 650"),
        ("storage_of_2_40_elements.pth", "4398046511104 bytes"),
        ("conv_record_cut_short.pth", "conv1.weight"),
        ("view_outside_storage.pth", "storage"),
        ("nested_tuples.pth", "nesting"),
        ("nested_lists.pth", "nesting"),
        ("nested_dicts.pth", "nesting"),
        ("big_endian.pth", "big-endian"),
        ("middle_endian.pth", "'middle'"),
        ("nul_keys.pth", "control character"),
        ("metadata_key.pth", "__metadata__"),
        ("empty_state_dict.pth", "no tensors"),
        ("binunicode_4_gib.pth", "4294967295 bytes"),
        ("unknown_opcode.pth", "pickle"),
        ("truncated_pickle.pth", "pickle"),
    ];
    for (file, problem) in cases {
        let output = convert_bounded(dir.path(), file);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{file}: {:?}\n{stderr}", output.status);
        let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
        assert_eq!(lines.len(), 1, "{file}: one line, not\n{stderr}");
        assert!(lines[0].starts_with("error: ") && lines[0].contains(file), "{file}: {stderr}");
        assert!(lines[0].to_lowercase().contains(problem), "{file}: no {problem:?} in {stderr}");
        assert!(!dir.path().join("out.safetensors").exists(), "{file}: wrote an output");
    }
}

/// The formats torch.save writes besides today's default: the legacy stream of PyTorch before
/// 1.6 (reported as "not a valid safetensors file: header too large" before) and pickle
/// protocol 4 ("found protocol = " before) convert to the values torch.save was given.
#[test]
fn legacy_and_protocol_4_torch_save_files_read_as_torch_wrote_them() {
    let dir = hostile_pth_files();
    for file in ["good.pth", "legacy.pth", "protocol4.pth"] {
        let out = format!("{file}.safetensors");
        common::rtrain(dir.path()).args(["weights", "convert", file, &out]).assert().success();
        let tensors = safetensors(&dir.path().join(&out));
        assert_eq!(tensors.keys().collect::<Vec<_>>(), ["b", "w"], "{file}");
        let w = Tensor::arange(6, (tch::Kind::Float, tch::Device::Cpu)).reshape([2, 3]);
        assert!(
            tensors["w"].kind() == tch::Kind::Float && tensors["w"].equal(&w),
            "{file}: w = {}",
            tensors["w"]
        );
        let b = Tensor::arange(3, (tch::Kind::Int64, tch::Device::Cpu));
        assert!(
            tensors["b"].kind() == tch::Kind::Int64 && tensors["b"].equal(&b),
            "{file}: b = {}",
            tensors["b"]
        );
    }
}

/// `model.pretrained` reads through the same checks: a conv weight whose record is cut short
/// (a segfault in `train` before) ends the run with the file named, before any training.
#[test]
fn training_from_a_lying_pth_stops_naming_it() {
    let dir = hostile_pth_files();
    let data = common::fixtures::synth_tree();
    let pretrained = dir.path().join("conv_record_cut_short.pth");
    let output = common::rtrain(dir.path())
        .args(["train", "--set", &format!("data.root={:?}", data.display().to_string())])
        .args(["--set", &format!("model.pretrained={:?}", pretrained.display().to_string())])
        .args(["--set", "data.image_size=32", "--set", "data.batch_size=4", "--set", "train.epochs=1"])
        .args(["--set", "train.threads=1"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{:?}\n{stderr}", output.status);
    assert!(stderr.contains("conv_record_cut_short.pth") && stderr.contains("conv1.weight"), "{stderr}");
}

/// The archive at `path` with `mutate` applied to the entry whose name ends with `entry`,
/// rewritten as a valid zip (stored, right CRCs), so that the mutation reaches the parser
/// behind the container rather than failing its checksum.
fn rezip_with(path: &Path, entry: &str, mutate: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    use std::io::{Read, Write};
    let mut archive = zip::ZipArchive::new(std::fs::File::open(path).unwrap()).unwrap();
    let mut out = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let stored = zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    let mut mutate = Some(mutate);
    for i in 0..archive.len() {
        let mut file = archive.by_index(i).unwrap();
        let name = file.name().to_string();
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes).unwrap();
        if name.ends_with(entry) {
            if let Some(mutate) = mutate.take() {
                mutate(&mut bytes);
            }
        }
        out.start_file(name, stored).unwrap();
        out.write_all(&bytes).unwrap();
    }
    out.finish().unwrap().into_inner()
}

/// One random change: bytes flipped, a run cut out, a run repeated, the end cut off, or a
/// length-like value (0, 0xFF.., a big count) written over four bytes.
fn mutate(bytes: &mut Vec<u8>, rng: &mut impl rand::Rng) {
    if bytes.is_empty() {
        bytes.push(rng.random());
        return;
    }
    let at = rng.random_range(0..bytes.len());
    match rng.random_range(0..5) {
        0 => {
            for _ in 0..rng.random_range(1..4) {
                let i = rng.random_range(0..bytes.len());
                bytes[i] ^= 1 << rng.random_range(0..8);
            }
        }
        1 => {
            let end = (at + rng.random_range(1..16)).min(bytes.len());
            bytes.drain(at..end);
        }
        2 => {
            let end = (at + rng.random_range(1..64)).min(bytes.len());
            let run: Vec<u8> = bytes[at..end].to_vec();
            for _ in 0..rng.random_range(1..200) {
                bytes.splice(at..at, run.iter().copied());
            }
        }
        3 => bytes.truncate(at),
        _ => {
            let value: u32 = [0, u32::MAX, 1 << 30, rng.random()][rng.random_range(0..4)];
            for (k, b) in value.to_le_bytes().into_iter().enumerate() {
                if let Some(slot) = bytes.get_mut(at + k) {
                    *slot = b;
                }
            }
        }
    }
}

/// The fuzz target of the issue "Untrusted files read safely": `.pth` files (their pickle and
/// their storages, inside valid zips, and the legacy stream as a whole) and safetensors files
/// (header and data) mutated at random, read in this process by the reader `train`, `convert`
/// and `eval` use. Each must read or fail with an error; a panic fails the test naming the
/// seed and the iteration (the input is kept in the test's directory). Seeded, so a failure
/// repeats; `RTRAIN_FUZZ_SECONDS` (default 30) sets how long it runs.
#[test]
fn mutated_weights_files_never_crash_the_readers() {
    use rand::{Rng, SeedableRng};
    let dir = hostile_pth_files();
    let safetensors_seed = dir.path().join("seed.safetensors");
    let tensors: Vec<(String, Tensor)> = vec![
        ("w".into(), Tensor::arange(6, (tch::Kind::Float, tch::Device::Cpu)).reshape([2, 3])),
        ("b".into(), Tensor::arange(3, (tch::Kind::Int64, tch::Device::Cpu))),
    ];
    let metadata = std::collections::HashMap::from([(
        "rtrain.weights".to_string(),
        r#"{"classes":["a","b"]}"#.to_string(),
    )]);
    rtrain::util::files::write_safetensors(&safetensors_seed, &tensors, Some(metadata)).unwrap();
    let seconds: u64 = std::env::var("RTRAIN_FUZZ_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(30);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(31);
    let input = dir.path().join("input");
    let started = std::time::Instant::now();
    let (mut iterations, mut read_ok) = (0u64, 0u64);
    while started.elapsed() < std::time::Duration::from_secs(seconds) {
        let bytes = match rng.random_range(0..5) {
            0 => rezip_with(&dir.path().join("good.pth"), "data.pkl", |b| mutate(b, &mut rng)),
            1 => rezip_with(&dir.path().join("protocol4.pth"), "data.pkl", |b| mutate(b, &mut rng)),
            2 => rezip_with(&dir.path().join("good.pth"), "data/0", |b| mutate(b, &mut rng)),
            3 => {
                let mut b = std::fs::read(dir.path().join("legacy.pth")).unwrap();
                mutate(&mut b, &mut rng);
                b
            }
            _ => {
                let mut b = std::fs::read(&safetensors_seed).unwrap();
                // Mostly the header: the JSON, its length, the offsets.
                let header_end = (8 + u64::from_le_bytes(b[..8].try_into().unwrap()) as usize).min(b.len());
                let mut header = b[..header_end].to_vec();
                mutate(&mut header, &mut rng);
                b.splice(..header_end, header);
                b
            }
        };
        std::fs::write(&input, &bytes).unwrap();
        let read = std::panic::catch_unwind(|| rtrain::model::weights::read_state_dict(&input).is_ok());
        match read {
            Ok(ok) => read_ok += u64::from(ok),
            Err(_) => {
                let kept = dir.keep().join("input");
                panic!("iteration {iterations} (seed 31) panicked; the input is {}", kept.display());
            }
        }
        iterations += 1;
    }
    eprintln!(
        "{iterations} mutated files in {seconds} s, {read_ok} of them read as state dicts, none crashed"
    );
    assert!(iterations > 100, "only {iterations} iterations");
}
