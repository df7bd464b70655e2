//! The real image: `scripts/container build` makes a Debian base with debootstrap (no registry
//! here), bundles this test build of `rtrain` with the libtorch libraries it loads, and builds
//! the Containerfile on them with Docker. Then, in that image:
//! - `rtrain doctor --json` reports Docker, the image, and the fixes for a small /dev/shm and a
//!   missing `--gpus`;
//! - apptainer.def's `%post` runs as Apptainer runs it (`/bin/sh -ex`, as root) in a container
//!   build, and its `%environment` + `%runscript` + `%test` start rtrain through the entrypoint;
//! - a 2-rank `mpirun` smoke training in one container, and the same job with two containers on
//!   a private network as its two nodes (the host's mpirun starting the ranks inside them, as a
//!   cluster does with Apptainer), end with identical weights.
//!
//! Docker is required when RTRAIN_REQUIRE_DOCKER=1 (scripts/test sets it); elsewhere these tests
//! say why they did not run.

mod common;

use std::path::Path;
use std::process::{Command, Output};
use std::sync::{Mutex, OnceLock};

const TAG: &str = "rtrain:test";

fn docker_usable() -> bool {
    let ok = Command::new("docker").arg("info").output().map(|o| o.status.success()).unwrap_or(false);
    if !ok {
        assert!(
            std::env::var("RTRAIN_REQUIRE_DOCKER").as_deref() != Ok("1"),
            "RTRAIN_REQUIRE_DOCKER=1 but the Docker daemon does not answer (docker info)"
        );
        eprintln!("skipped: no Docker daemon (docker info failed)");
    }
    ok
}

/// Builds the image once for all tests in this file.
fn image() -> &'static str {
    static BUILT: OnceLock<()> = OnceLock::new();
    BUILT.get_or_init(|| {
        let output = Command::new(common::repo().join("scripts/container"))
            .args(["build", "--binary", env!("CARGO_BIN_EXE_rtrain")])
            .env("RTRAIN_IMAGE_TAG", TAG)
            .output()
            .unwrap();
        common::assert_success(output, "scripts/container build");
    });
    TAG
}

fn docker(args: &[&str]) -> Output {
    Command::new("docker").args(args).output().unwrap()
}

fn doctor_json(extra: &[&str]) -> serde_json::Value {
    let mut args = vec!["run", "--rm"];
    args.extend_from_slice(extra);
    args.extend_from_slice(&[image(), "doctor", "--json"]);
    let output = common::assert_success(docker(&args), "docker run doctor");
    serde_json::from_slice(&output.stdout).expect("doctor --json prints JSON")
}

fn fixes(report: &serde_json::Value) -> Vec<String> {
    report["problems"].as_array().unwrap().iter().map(|p| p["fix"].as_str().unwrap().to_string()).collect()
}

#[test]
fn doctor_in_the_image_reports_docker_and_the_fix_for_each_problem() {
    if !docker_usable() {
        return;
    }
    let plain = doctor_json(&[]);
    let environment = &plain["environment"];
    assert_eq!(environment["runtime"], "docker");
    assert_eq!(environment["image"], "rtrain:0.1.0");
    assert_eq!(environment["cuda"]["built"], false);
    assert_eq!(environment["gpu_devices"].as_array().unwrap().len(), 0);
    assert_eq!(environment["mpi"]["built_in"], true);
    // Docker's default /dev/shm is 64 MiB: the one problem, with its fix.
    assert_eq!(fixes(&plain).len(), 1, "{plain:#}");
    assert!(fixes(&plain)[0].contains("--shm-size"), "{plain:#}");

    let roomy = doctor_json(&["--shm-size", "1g"]);
    assert_eq!(fixes(&roomy), Vec::<String>::new(), "{roomy:#}");

    // A CUDA image sets NVIDIA_VISIBLE_DEVICES; run without --gpus, no device appears.
    let forgot_gpus = doctor_json(&["--shm-size", "1g", "-e", "NVIDIA_VISIBLE_DEVICES=all"]);
    assert_eq!(fixes(&forgot_gpus).len(), 1, "{forgot_gpus:#}");
    assert!(fixes(&forgot_gpus)[0].contains("--gpus all"), "{forgot_gpus:#}");
}

fn section(name: &str) -> String {
    let text = std::fs::read_to_string(common::repo().join("apptainer.def")).unwrap();
    common::apptainer_sections(&text).into_iter().find(|(n, _)| n == name).unwrap().1
}

#[test]
fn apptainer_scripts_run_in_the_image_as_apptainer_runs_them() {
    if !docker_usable() {
        return;
    }
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
    let log = String::from_utf8_lossy(&build.stdout);
    assert!(log.contains("rtrain 0.1.0"), "%post should have printed rtrain's version:\n{log}");
    let _ = docker(&["rmi", "rtrain:test-post"]);

    // %environment is sourced, then %runscript runs with the user's arguments, with neither
    // PATH nor LD_LIBRARY_PATH inherited from the image (Apptainer does not pass them).
    let runscript =
        format!("{}\n{}", section("environment"), section("runscript").replace("\"$@\"", "doctor --json"));
    let run = docker(&[
        "run",
        "--rm",
        "--shm-size",
        "1g",
        "-e",
        "LD_LIBRARY_PATH=",
        "--entrypoint",
        "/bin/sh",
        image(),
        "-ec",
        &runscript,
    ]);
    let run = common::assert_success(run, "%environment + %runscript");
    let report: serde_json::Value = serde_json::from_slice(&run.stdout).unwrap();
    assert_eq!(report["rtrain"], "0.1.0");
    assert!(
        String::from_utf8_lossy(&run.stderr).contains("entrypoint: runtime docker"),
        "runscript goes through the entrypoint"
    );

    let test = common::assert_success(
        docker(&["run", "--rm", "--entrypoint", "/bin/sh", image(), "-ec", &section("test")]),
        "%test",
    );
    assert!(String::from_utf8_lossy(&test.stdout).contains("runtime: docker"));
}

/// Removes the test cluster's containers and network however the test ends.
struct Cluster;

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new(common::repo().join("scripts/container")).args(["cluster", "down"]).output();
    }
}

fn manifest(run: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(run.join("manifest.json")).unwrap()).unwrap()
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

#[test]
fn two_ranks_in_one_container_and_two_containers_as_nodes_train_the_same_model() {
    if !docker_usable() {
        return;
    }
    static SERIAL: Mutex<()> = Mutex::new(());
    let _serial = SERIAL.lock().unwrap();
    let work = tempfile::tempdir().unwrap();
    let shared = work.path().join("shared");
    std::fs::create_dir(&shared).unwrap();
    // The image's user (uid 1000) writes the run directories.
    std::fs::set_permissions(&shared, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let mount = format!("{}:/work", shared.display());
    let train = ["train", "--config", "/opt/rtrain/configs/smoke.toml", "--set", "train.threads=1"];

    // Two ranks in one container, each started through the entrypoint, as
    // `mpirun -np 2 apptainer run rtrain.sif train` starts them.
    let mut one_node =
        vec!["run", "--rm", "--shm-size", "512m", "-v", &mount, "--entrypoint", "mpirun", image()];
    one_node.extend_from_slice(&["-np", "2", "--bind-to", "none", "/opt/rtrain/entrypoint"]);
    one_node.extend_from_slice(&train);
    one_node.extend_from_slice(&["--set", "run.name=one-node"]);
    let output = common::assert_success(docker(&one_node), "2-rank mpirun in one container");
    let stderr = String::from_utf8_lossy(&output.stderr);
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
    // Gradients crossed the private network: the two-node job computed exactly what the
    // one-node job did (an all-reduce over TCP sums two numbers as shared memory does).
    assert_eq!(m1["weights"]["sha256"], m2["weights"]["sha256"]);
    assert_eq!(m1["weights"]["sha256"].as_str().map(str::len), Some(64));
    assert_eq!(epoch_losses(&one), epoch_losses(&two));
    assert_eq!(epoch_losses(&one).len(), 1);
}
