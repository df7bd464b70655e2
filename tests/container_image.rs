//! The image users get, built here as `docker build` builds it, but from parts this machine can
//! have: `scripts/container build` makes a Debian bookworm base with debootstrap (no registry;
//! it stands in for debian:bookworm-slim), bundles the CUDA build of rtrain (`RTRAIN_CUDA_BINARY`,
//! built by scripts/test) with every library of PyTorch's wheels, and builds the Containerfile
//! on them. Then, in that image:
//! - `doctor --json` reports Docker, the CUDA build, cuDNN and NCCL found by dlopen, no GPU,
//!   and exits non-zero on a problem (a small /dev/shm, a missing `--gpus`), zero without;
//! - `ldd` of the binary and of every bundled library finds everything but the host's driver
//!   and network libraries, and rtrain starts with LD_LIBRARY_PATH unset and with a hostile one;
//! - two fake GPU device nodes and no driver: training stops with the driver/CUDA cause, while
//!   `train.device = "cpu"` still trains;
//! - apptainer.def's `%post` runs as Apptainer runs it (`/bin/sh -ex`, as root) in a container
//!   build; `%environment` + `%runscript` run as `--cleanenv` leaves them (`env -i`), on a
//!   read-only root with a tmpfs /tmp, as uid 1000 and as another uid, and never start ranks of
//!   their own; `%test` fails on a problem;
//! - the README's one-box Docker line trains and leaves its run on the host;
//! - a 2-rank `mpirun` training in one container, and the same job with two containers on a
//!   private network as its two nodes, end with identical weights; the manifest records the
//!   revision, the image digest and the CUDA stack;
//! - the Containerfile builds on a base that already has uid 1000 (as Ubuntu's images do);
//! - the MPICH variant (`--mpi mpich`, the bind model) builds, trains 2 ranks under Hydra, and
//!   loads the MPI library bound over it through LD_LIBRARY_PATH.
//!
//! The Docker tier (`--features test-docker`): it needs a Docker engine and the CUDA and MPICH
//! builds that scripts/test makes (RTRAIN_CUDA_BINARY, RTRAIN_MPICH_BINARY), and fails,
//! saying which, without them.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Mutex, OnceLock};

const TAG: &str = "rtrain:test";
const MPICH_TAG: &str = "rtrain:test-mpich";
const SMOKE: &str = "/opt/rtrain/configs/smoke.toml";

/// This tier needs a Docker engine: without one its tests fail, saying so.
fn require_docker() {
    let ok = Command::new("docker").arg("info").output().map(|o| o.status.success()).unwrap_or(false);
    assert!(ok, "the Docker tier (--features test-docker) needs a Docker engine: `docker info` failed");
}

/// A binary named by `variable`, which this tier requires (scripts/test builds and sets it).
fn binary_from(variable: &str) -> PathBuf {
    let path = std::env::var_os(variable).map(PathBuf::from);
    let path =
        path.unwrap_or_else(|| panic!("the Docker tier needs {variable} (scripts/test builds and sets it)"));
    assert!(path.is_file(), "{variable}={} is not a file", path.display());
    path
}

/// The CUDA build the image users get holds.
fn cuda_binary() -> PathBuf {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY.get_or_init(|| binary_from("RTRAIN_CUDA_BINARY")).clone()
}

/// Builds with `scripts/container build`, one at a time: they share target/container. The lock
/// comes back still held, for a caller that reads what the build left there.
fn build(tag: &str, args: &[&str]) -> common::fixtures::ContainerBuild {
    let one_at_a_time = common::fixtures::container_build();
    let output = Command::new(common::repo().join("scripts/container"))
        .arg("build")
        .args(args)
        .env("RTRAIN_IMAGE_TAG", tag)
        .output()
        .unwrap();
    let output = common::assert_success(output, &format!("scripts/container build {args:?}"));
    // Image size and build time, for the record.
    eprint!("{}", String::from_utf8_lossy(&output.stderr));
    one_at_a_time
}

/// The arguments that bundle the image's binary: the CUDA build with every wheel library.
fn image_binary_args() -> Vec<String> {
    vec!["--binary".into(), cuda_binary().display().to_string(), "--all-libs".into()]
}

/// The image users get, built once for all tests in this file.
fn image() -> &'static str {
    bundle_rpaths();
    TAG
}

/// The RPATH (or RUNPATH) of every library bundled into [`image`], read from target/container
/// right after its build, before another build (another test's, another process's) rewrites it.
fn bundle_rpaths() -> &'static [(PathBuf, String)] {
    static RPATHS: OnceLock<Vec<(PathBuf, String)>> = OnceLock::new();
    RPATHS.get_or_init(|| {
        let args = image_binary_args();
        let _bundle_unchanged = build(TAG, &args.iter().map(String::as_str).collect::<Vec<_>>());
        let bundle = common::repo().join("target/container/lib");
        let mut rpaths = Vec::new();
        for entry in std::fs::read_dir(&bundle).unwrap() {
            let path = entry.unwrap().path();
            let rpath = Command::new("patchelf").arg("--print-rpath").arg(&path).output().unwrap();
            rpaths.push((path, text(&rpath.stdout).trim().to_string()));
        }
        rpaths
    })
}

fn docker(args: &[&str]) -> Output {
    Command::new("docker").args(args).output().unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `doctor --json` in the image with `extra` docker options: its exit status and report.
fn doctor_json(extra: &[&str]) -> (Option<i32>, serde_json::Value) {
    let mut args = vec!["run", "--rm"];
    args.extend_from_slice(extra);
    args.extend_from_slice(&[image(), "doctor", "--json"]);
    let output = docker(&args);
    let report = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("doctor --json prints JSON ({e}):\n{}", text(&output.stderr)));
    (output.status.code(), report)
}

fn fixes(report: &serde_json::Value) -> Vec<String> {
    report["problems"].as_array().unwrap().iter().map(|p| p["fix"].as_str().unwrap().to_string()).collect()
}

#[test]
fn doctor_in_the_image_reports_the_cuda_build_and_exits_non_zero_on_a_problem() {
    require_docker();
    let (status, plain) = doctor_json(&[]);
    let environment = &plain["environment"];
    assert_eq!(environment["runtime"], "docker");
    assert_eq!(environment["image"], "rtrain:0.1.0");
    assert_eq!(environment["gpu_devices"].as_array().unwrap().len(), 0);
    assert_eq!(environment["mpi"]["built_in"], true);
    let cuda = &environment["cuda"];
    assert_eq!(cuda["built"], true, "{cuda:#}");
    // The wheels' libraries, found in the image without LD_LIBRARY_PATH: CUDA 13.0's runtime,
    // cuDNN 9 and NCCL 2 (opened by dlopen); no GPU, so CUDA is not available.
    assert_eq!(cuda["runtime"], "13.0", "{cuda:#}");
    assert!(cuda["cudnn"].as_str().is_some_and(|v| v.starts_with("9.")), "{cuda:#}");
    assert!(cuda["nccl"]["Ok"].as_str().is_some_and(|v| v.starts_with("NCCL 2.")), "{cuda:#}");
    assert_eq!((cuda["available"].as_bool(), cuda["devices"].as_u64()), (Some(false), Some(0)));
    // Docker's default /dev/shm is 64 MiB: the one problem, with its fix, and exit status 1.
    assert_eq!(fixes(&plain).len(), 1, "{plain:#}");
    assert!(fixes(&plain)[0].contains("--shm-size"), "{plain:#}");
    assert_eq!(status, Some(1));

    let (status, roomy) = doctor_json(&["--shm-size", "1g"]);
    assert_eq!(fixes(&roomy), Vec::<String>::new(), "{roomy:#}");
    assert_eq!(status, Some(0));

    // GPUs asked for (as `--gpus` or a CUDA image's variable does), but none passed in.
    let (status, forgot_gpus) = doctor_json(&["--shm-size", "1g", "-e", "NVIDIA_VISIBLE_DEVICES=all"]);
    assert_eq!(fixes(&forgot_gpus).len(), 1, "{forgot_gpus:#}");
    assert!(fixes(&forgot_gpus)[0].contains("--gpus all"), "{forgot_gpus:#}");
    assert_eq!(status, Some(1));
}

/// `ldd` lines that found no library, as "LIBRARY (needed by FILE)".
fn unresolved(ldd_output: &str) -> Vec<String> {
    let mut missing = Vec::new();
    let mut file = "";
    for line in ldd_output.lines() {
        if let Some(name) = line.strip_prefix("== ") {
            file = name;
        } else if line.contains("=> not found") {
            missing.push(format!("{} (needed by {file})", line.split_whitespace().next().unwrap()));
        }
    }
    missing
}

#[test]
fn the_binary_and_every_bundled_library_find_their_libraries_without_ld_library_path() {
    require_docker();
    let script = "for f in /opt/rtrain/bin/rtrain /opt/rtrain/lib/*; do echo \"== $f\"; ldd \"$f\"; done";
    let output = docker(&["run", "--rm", "--entrypoint", "/bin/sh", image(), "-c", script]);
    let listing = text(&common::assert_success(output, "ldd in the image").stdout);
    // Only the driver's library comes from the host (`--gpus`, `--nv`).
    let missing: Vec<String> =
        unresolved(&listing).into_iter().filter(|line| !line.starts_with("libcuda.so.1 ")).collect();
    assert_eq!(missing, Vec::<String>::new(), "libraries the image lacks");
    let binary = listing.split("== ").nth(1).unwrap();
    // Found by the RPATH ($ORIGIN/../lib), not by a search path of the system's.
    assert!(binary.contains("libtorch_cpu.so => /opt/rtrain/bin/../lib/libtorch_cpu.so"), "{binary}");

    // No library of the bundle searches the working directory: an empty RPATH/RUNPATH entry
    // (libcusparseLt's wheel ships `$ORIGIN:`) would load a libcuda.so.1 planted in /work.
    for (path, rpath) in bundle_rpaths() {
        if !rpath.is_empty() {
            assert!(
                !rpath.split(':').any(str::is_empty),
                "{}: RPATH {rpath:?} has an empty entry",
                path.display()
            );
        }
    }

    // No LD_LIBRARY_PATH at all, and one that holds look-alikes of libtorch's libraries (as a
    // host's CUDA toolkit or another PyTorch on LD_LIBRARY_PATH would): the binary's RPATH wins.
    let hostile = "mkdir -p /tmp/hostile && for lib in libc10.so libtorch_cpu.so libtorch.so libgomp.so.1 \
                   libcudart.so.13 libnccl.so.2; do cp /lib/x86_64-linux-gnu/libz.so.1 /tmp/hostile/$lib; done \
                   && env -u LD_LIBRARY_PATH rtrain --version && LD_LIBRARY_PATH=/tmp/hostile rtrain doctor --json";
    let output =
        docker(&["run", "--rm", "--shm-size", "1g", "--entrypoint", "/bin/sh", image(), "-c", hostile]);
    let output = common::assert_success(output, "rtrain with LD_LIBRARY_PATH unset, then hostile");
    let stdout = text(&output.stdout);
    assert!(stdout.starts_with("rtrain 0.1.0"), "{stdout}");
    let report: serde_json::Value = serde_json::from_str(&stdout[stdout.find('{').unwrap()..]).unwrap();
    assert_eq!(report["environment"]["cuda"]["built"], true);
}

#[test]
fn gpu_device_nodes_without_a_usable_driver_stop_training_with_the_cause() {
    require_docker();
    let work = shared_dir();
    let mount = format!("{}:/work", work.path().display());
    // Two GPU device nodes (host /dev/null standing in) and no driver: what a GPU node whose
    // driver the CUDA 13 wheels cannot use looks like from inside.
    let fake_gpus = ["--device", "/dev/null:/dev/nvidia0", "--device", "/dev/null:/dev/nvidia1"];
    let mut args = vec!["run", "--rm", "--shm-size", "1g", "-v", &mount];
    args.extend_from_slice(&fake_gpus);
    args.extend_from_slice(&[image(), "train", "--config", SMOKE, "--set", "train.threads=1"]);
    let output = docker(&args);
    let stderr = text(&output.stderr);
    assert!(!output.status.success(), "trained on the CPU instead of failing:\n{stderr}");
    // Docker: one rank per GPU device, each refusing the silent CPU fallback with the cause.
    assert!(
        stderr.contains("runtime docker, 2 GPU(s)") && stderr.contains("starting 2 local ranks"),
        "{stderr}"
    );
    for needle in
        ["train.device = \"auto\"", "no NVIDIA driver", "CUDA 13.0", "580", "train.device = \"cpu\""]
    {
        assert!(stderr.contains(needle), "the error should name {needle:?}:\n{stderr}");
    }
    assert!(!work.path().join("runs/smoke/model.safetensors").exists());

    // doctor says the same, and exits 1.
    let mut args = vec!["run", "--rm", "--shm-size", "1g"];
    args.extend_from_slice(&fake_gpus);
    args.extend_from_slice(&[image(), "doctor", "--json"]);
    let output = docker(&args);
    assert_eq!(output.status.code(), Some(1), "{}", text(&output.stderr));
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let problems = report["problems"].to_string();
    assert!(problems.contains("no NVIDIA driver") && problems.contains("580"), "{report:#}");

    // An explicit CPU device still trains, with the GPUs in view.
    let mut args = vec!["run", "--rm", "--shm-size", "1g", "-v", &mount, "-e", "RTRAIN_LOCAL_RANKS=1"];
    args.extend_from_slice(&fake_gpus);
    args.extend_from_slice(&[image(), "train", "--config", SMOKE, "--set", "train.threads=1"]);
    args.extend_from_slice(&["--set", "train.device=cpu", "--set", "run.name=on-cpu"]);
    common::assert_success(docker(&args), "train.device = cpu with GPU device nodes");
    assert!(work.path().join("runs/on-cpu/manifest.json").exists());
}

fn section(name: &str) -> String {
    let text = std::fs::read_to_string(common::repo().join("apptainer.def")).unwrap();
    common::apptainer_sections(&text).into_iter().find(|(n, _)| n == name).unwrap().1
}

/// A directory the image's users (uid 1000, and any other) can write, mounted as /work.
fn shared_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    dir
}

/// `%environment` then `%runscript` with `args`, as Apptainer runs them under `--cleanenv`: an
/// empty environment but for what Apptainer itself sets and the image's own variables.
fn apptainer_runscript(args: &str) -> String {
    let script = format!("{}\n{}", section("environment"), section("runscript").replace("\"$@\"", args));
    let quoted = script.replace('\'', "'\\''");
    format!(
        "exec env -i PATH=/usr/local/bin:/usr/bin:/bin HOME=/tmp APPTAINER_CONTAINER=/scratch/rtrain.sif \
         RTRAIN_IMAGE=\"$RTRAIN_IMAGE\" RTRAIN_MPI=\"$RTRAIN_MPI\" /bin/sh -ec '{quoted}'"
    )
}

#[test]
fn apptainer_scripts_run_in_the_image_as_apptainer_runs_them() {
    require_docker();
    // %post: in a container build, as root, with `/bin/sh -ex` (Apptainer's way).
    let context = tempfile::tempdir().unwrap();
    std::fs::write(context.path().join("post.sh"), section("post")).unwrap();
    std::fs::write(
        context.path().join("Dockerfile"),
        format!("FROM {}\nUSER root\nCOPY post.sh /post.sh\nRUN /bin/sh -ex /post.sh\n", image()),
    )
    .unwrap();
    let build = docker(&["build", "--no-cache", "-t", "rtrain:test-post", &context.path().to_string_lossy()]);
    let build = common::assert_success(build, "docker build of %post");
    let log = text(&build.stdout);
    assert!(log.contains("rtrain 0.1.0"), "%post should have printed rtrain's version:\n{log}");
    let _ = docker(&["rmi", "rtrain:test-post"]);

    // %environment + %runscript as `--cleanenv` runs them, on a read-only root with a tmpfs
    // /tmp, as the image's user and as another uid (Apptainer runs as the caller), with two GPU
    // device nodes in /dev and no launcher variables: one process, never ranks of its own.
    for uid in ["1000:1000", "4242:4242"] {
        let work = shared_dir();
        let mount = format!("{}:/work", work.path().display());
        let train = format!("train --config {SMOKE} --set train.threads=1 --set train.device=cpu");
        let run = docker(&[
            "run",
            "--rm",
            "--read-only",
            "--tmpfs",
            "/tmp",
            "--shm-size",
            "1g",
            "-u",
            uid,
            "-v",
            &mount,
            "--device",
            "/dev/null:/dev/nvidia0",
            "--device",
            "/dev/null:/dev/nvidia1",
            "--entrypoint",
            "/bin/sh",
            image(),
            "-c",
            &apptainer_runscript(&train),
        ]);
        let run = common::assert_success(run, &format!("%environment + %runscript train as {uid}"));
        let stderr = text(&run.stderr);
        assert!(stderr.contains("entrypoint: runtime apptainer, 2 GPU(s), launcher: no"), "{uid}: {stderr}");
        assert!(!stderr.contains("starting 2 local ranks"), "{uid}: {stderr}");
        let manifest = manifest(&work.path().join("runs/smoke"));
        assert_eq!(manifest["container"]["runtime"], "apptainer", "{uid}");
        assert_eq!(manifest["job"]["world_size"], 1, "{uid}");
    }

    // %test fails on a problem (Docker's 64 MiB /dev/shm here) and passes without one.
    let test_script = section("test");
    let test = |extra: &[&str]| {
        let mut args = vec!["run", "--rm"];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--entrypoint", "/bin/sh", image(), "-ec", &test_script]);
        docker(&args)
    };
    let small_shm = test(&[]);
    assert_eq!(small_shm.status.code(), Some(1), "{}", text(&small_shm.stdout));
    assert!(text(&small_shm.stdout).contains("--shm-size"));
    let fine = common::assert_success(test(&["--shm-size", "1g"]), "%test");
    assert!(text(&fine.stdout).contains("runtime: docker"));
}

/// The README's one-box Docker command line.
fn readme_docker_line() -> String {
    let readme = common::doc("docs/operations/containers.md");
    readme
        .lines()
        .map(str::trim)
        .find(|line| line.starts_with("docker run") && line.contains(" train "))
        .expect("README shows a `docker run ... train` line")
        .to_string()
}

#[test]
fn the_readmes_docker_line_trains_and_leaves_its_run_on_the_host() {
    require_docker();
    let line = readme_docker_line();
    assert!(line.contains("--shm-size") || line.contains("--ipc=host"), "{line}");
    assert!(line.contains("-v \"$PWD/runs:/work/runs\""), "runs must outlive the container: {line}");
    let config = line.split_whitespace().skip_while(|w| *w != "--config").nth(1).expect("--config PATH");
    assert!(config.starts_with("/opt/rtrain/configs/"), "a path inside the image: {config}");
    let exists = docker(&["run", "--rm", "--entrypoint", "test", image(), "-f", config]);
    assert!(exists.status.success(), "{config} is not in the image");

    // The line as written, run by the shell in a directory with data/ and runs/ made (as the
    // README says to), but: no GPU here, this test's image, the smoke configuration.
    let host = shared_dir();
    for dir in ["data", "runs"] {
        std::fs::create_dir(host.path().join(dir)).unwrap();
    }
    let until_settings = line.split(" --set ").next().unwrap();
    let command = until_settings
        .replace("--gpus all ", "")
        .replace(" rtrain train ", &format!(" {} train ", image()))
        .replace(config, SMOKE)
        + " --set train.threads=1 --set run.name=one-box";
    assert!(!command.contains("--gpus"), "{command}");
    let output = Command::new("bash")
        .args(["-ec", &command])
        .current_dir(host.path())
        .env("PWD", host.path())
        .output()
        .unwrap();
    common::assert_success(output, &command);
    let run = host.path().join("runs/one-box");
    assert!(run.join("manifest.json").exists() && run.join("model.safetensors").exists(), "{run:?}");
}

/// Removes the test cluster's containers and network however the test ends.
struct Cluster;

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new(common::repo().join("scripts/container")).args(["cluster", "down"]).output();
    }
}

fn manifest(run: &Path) -> serde_json::Value {
    let path = run.join("manifest.json");
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_slice(&bytes).unwrap()
}

fn epoch_losses(run: &Path) -> Vec<f64> {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str::<serde_json::Value>(line).unwrap())
        .filter(|record| record["kind"] == "epoch")
        .map(|record| record["train_loss"].as_f64().unwrap())
        .collect()
}

fn head_revision() -> String {
    let output =
        Command::new("git").current_dir(common::repo()).args(["rev-parse", "HEAD"]).output().unwrap();
    text(&output.stdout).trim().to_string()
}

#[test]
fn two_ranks_in_one_container_and_two_containers_as_nodes_train_the_same_model() {
    require_docker();
    static SERIAL: Mutex<()> = Mutex::new(());
    let _serial = SERIAL.lock().unwrap();
    let work = tempfile::tempdir().unwrap();
    let shared = work.path().join("shared");
    std::fs::create_dir(&shared).unwrap();
    // The image's user (uid 1000) writes the run directories.
    std::fs::set_permissions(&shared, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let mount = format!("{}:/work", shared.display());
    let train = ["train", "--config", SMOKE, "--set", "train.threads=1"];
    let digest = text(&docker(&["image", "inspect", "-f", "{{.Id}}", image()]).stdout).trim().to_string();
    let digest_variable = format!("RTRAIN_IMAGE_DIGEST={digest}");

    // Two ranks in one container, each started through the entrypoint, as
    // `mpirun -np 2 apptainer run rtrain.sif train` starts them.
    let mut one_node = vec!["run", "--rm", "--shm-size", "512m", "-v", &mount, "-e", &digest_variable];
    one_node.extend_from_slice(&["--entrypoint", "mpirun", image()]);
    one_node.extend_from_slice(&["-np", "2", "--bind-to", "none", "/opt/rtrain/entrypoint"]);
    one_node.extend_from_slice(&train);
    one_node.extend_from_slice(&["--set", "run.name=one-node"]);
    let output = common::assert_success(docker(&one_node), "2-rank mpirun in one container");
    let stderr = text(&output.stderr);
    assert_eq!(
        stderr.matches("entrypoint: runtime docker, 0 GPU(s), launcher: OMPI_COMM_WORLD_RANK").count(),
        2
    );

    // The same job on two containers as nodes.
    let _cluster = Cluster;
    let script = common::repo().join("scripts/container");
    let up = Command::new(&script)
        .args(["cluster", "up", "2"])
        .env("RTRAIN_CLUSTER_DIR", &shared)
        .env("RTRAIN_IMAGE_TAG", image())
        .output();
    common::assert_success(up.unwrap(), "cluster up");
    let mut two_nodes = vec!["cluster", "mpirun", "-np", "2", "rtrain"];
    two_nodes.extend_from_slice(&train);
    two_nodes.extend_from_slice(&["--set", "run.name=two-nodes"]);
    let output = Command::new(&script).args(&two_nodes).env("RTRAIN_CLUSTER_DIR", &shared).output();
    common::assert_success(output.unwrap(), "2 containers as MPI nodes");

    let (one, two) = (shared.join("runs/one-node"), shared.join("runs/two-nodes"));
    let (m1, m2) = (manifest(&one), manifest(&two));
    assert_eq!((m1["job"]["world_size"].as_u64(), m1["job"]["nodes"].as_u64()), (Some(2), Some(1)));
    assert_eq!((m2["job"]["world_size"].as_u64(), m2["job"]["nodes"].as_u64()), (Some(2), Some(2)));
    assert_eq!(m2["job"]["hosts"], serde_json::json!(["rtnode0", "rtnode1"]));
    assert_eq!(m1["container"]["runtime"], "docker");
    assert_eq!(m2["container"]["runtime"], "docker");
    // What reproduces the run: the image it ran in (passed in: nothing inside a container can
    // read its own digest), the binary's hash, the commit it was built from, the CUDA stack.
    assert_eq!(m1["container"]["image_digest"], digest.as_str(), "{m1:#}");
    assert_eq!(m2["container"]["image_digest"], serde_json::Value::Null);
    assert_eq!(m1["software"]["rtrain_sha256"].as_str().map(str::len), Some(64), "{m1:#}");
    assert_eq!(m1["software"]["rtrain_sha256"], m2["software"]["rtrain_sha256"]);
    assert!(m1["git_revision"].as_str().unwrap().starts_with(&head_revision()), "{m1:#}");
    assert_eq!(m1["software"]["cuda"]["runtime"], "13.0", "{m1:#}");
    // Gradients crossed the private network: the two-node job computed exactly what the
    // one-node job did (an all-reduce over TCP sums two numbers as shared memory does).
    assert_eq!(m1["weights"]["sha256"], m2["weights"]["sha256"]);
    assert_eq!(m1["weights"]["sha256"].as_str().map(str::len), Some(64));
    assert_eq!(epoch_losses(&one), epoch_losses(&two));
    assert_eq!(epoch_losses(&one).len(), 1);
}

/// The build context carries .git, so that a `docker build` from the checkout records the
/// commit (build.rs) as a build from the checkout does.
#[test]
fn the_build_context_carries_git_for_the_revision() {
    let ignore = std::fs::read_to_string(common::repo().join(".dockerignore")).unwrap();
    let patterns: Vec<&str> =
        ignore.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')).collect();
    for pattern in &patterns {
        assert!(
            !matches!(*pattern, ".git" | ".git/" | ".git*" | "*" | ".*"),
            ".dockerignore drops .git: {pattern}"
        );
    }
    let containerfile = std::fs::read_to_string(common::repo().join("Containerfile")).unwrap();
    assert!(containerfile.contains("COPY . ."), "the build stage copies the whole context, .git included");
}

/// A base that already has uid 1000, as Ubuntu's images (and so NVIDIA's CUDA images on Ubuntu
/// 24.04) hold user `ubuntu`: the Containerfile builds on it and runs as that uid.
fn base_with_uid_1000() -> &'static str {
    const BASE: &str = "rtrain-base:uid1000";
    {
        // The debootstrap base (made once, skipped when present), not the CUDA image built on it.
        let _one_at_a_time = common::fixtures::container_build();
        let output = Command::new(common::repo().join("scripts/container")).arg("base").output().unwrap();
        common::assert_success(output, "scripts/container base");
    }
    let context = tempfile::tempdir().unwrap();
    std::fs::write(
        context.path().join("Dockerfile"),
        "FROM rtrain-base:bookworm\nRUN useradd --create-home --uid 1000 --user-group ubuntu\n",
    )
    .unwrap();
    let base = docker(&["build", "-q", "-t", BASE, &context.path().to_string_lossy()]);
    common::assert_success(base, "a base with uid 1000 taken");
    BASE
}

/// The bind model's image: Debian's MPICH (MPICH ABI) in place of Open MPI, built on a base
/// that already has uid 1000 (one build for both: the user logic is the same whatever MPI the
/// image holds). It runs as that uid, a 2-rank job trains in it under MPICH's Hydra, and the
/// MPI library bound over the image's (here the host's own MPICH, as a site binds its MVAPICH2
/// or Cray MPICH) is the one loaded.
#[test]
fn the_mpich_image_on_a_base_with_uid_1000_trains_two_ranks_and_loads_the_mpi_bound_over_it() {
    require_docker();
    let base = base_with_uid_1000();
    let binary = binary_from("RTRAIN_MPICH_BINARY");
    build(MPICH_TAG, &["--binary", &binary.to_string_lossy(), "--mpi", "mpich", "--base", base]);
    let who = docker(&["run", "--rm", "--entrypoint", "id", MPICH_TAG]);
    let who = text(&common::assert_success(who, "id in the image").stdout);
    assert!(who.starts_with("uid=1000(ubuntu)"), "{who}");
    let work = shared_dir();
    let mount = format!("{}:/work", work.path().display());
    // Bounded: MPICH 4.0's UCX hangs in MPI_Finalize under Docker with its TCP transport (the
    // entrypoint keeps it to shared memory there); a hang must fail the test, not stall CI.
    const NAME: &str = "rtrain-test-mpich";
    let _ = docker(&["rm", "-f", NAME]);
    let mut args = vec!["-k", "10", "300", "docker", "run", "--rm", "--name", NAME, "--shm-size", "512m"];
    args.extend_from_slice(&["-v", &mount, "--entrypoint", "mpirun", MPICH_TAG]);
    args.extend_from_slice(&["-np", "2", "/opt/rtrain/entrypoint", "train", "--config", SMOKE]);
    args.extend_from_slice(&["--set", "train.threads=1", "--set", "run.name=mpich"]);
    let output = Command::new("timeout").args(&args).output().unwrap();
    let _ = docker(&["rm", "-f", NAME]);
    let output = common::assert_success(output, "2-rank Hydra job in the MPICH image");
    let stderr = text(&output.stderr);
    assert_eq!(stderr.matches("launcher: PMI_RANK").count(), 2, "{stderr}");
    let manifest = manifest(&work.path().join("runs/mpich"));
    assert_eq!(manifest["job"]["world_size"], 2);
    assert_eq!(manifest["weights"]["sha256"].as_str().map(str::len), Some(64));

    // The bind model: the host's MPI library directory mounted and put on LD_LIBRARY_PATH.
    let host_mpi = tempfile::tempdir().unwrap();
    let library = std::fs::canonicalize("/usr/lib/x86_64-linux-gnu/libmpich.so.12").unwrap();
    std::fs::copy(&library, host_mpi.path().join("libmpi.so.12")).unwrap();
    std::fs::copy(&library, host_mpi.path().join("libmpich.so.12")).unwrap();
    let bind = format!("{}:/opt/hostmpi:ro", host_mpi.path().display());
    let ldd = docker(&[
        "run",
        "--rm",
        "-v",
        &bind,
        "-e",
        "LD_LIBRARY_PATH=/opt/hostmpi",
        "--entrypoint",
        "ldd",
        MPICH_TAG,
        "/opt/rtrain/bin/rtrain",
    ]);
    let ldd = text(&common::assert_success(ldd, "ldd with the host's MPI bound").stdout);
    let mpi_line = ldd.lines().find(|l| l.contains("libmpi")).unwrap_or_default();
    assert!(mpi_line.contains("=> /opt/hostmpi/"), "the host's MPI should win: {mpi_line}\n{ldd}");
    assert!(ldd.contains("libtorch_cpu.so => /opt/rtrain/bin/../lib/"), "{ldd}");
    let _ = docker(&["rmi", MPICH_TAG, base]);
}
