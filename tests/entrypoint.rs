//! The container entrypoint (`entrypoint`, POSIX sh) across simulated runtimes, GPUs and
//! launchers: a fake filesystem root holds the runtime marks and `/dev/nvidia*`, and fake
//! `rtrain` and `mpirun` record how they were called. Also: shellcheck finds nothing.

// Helpers of the tier-gated tests are unused in the fast loop (`cargo test` without features).
#![cfg_attr(not(feature = "all-tiers"), allow(dead_code, unused_imports))]

use crate::common;

use std::path::Path;
use std::process::{Command, Output};

/// Writes an executable script that prints its name and then each argument on its own line.
fn recorder(dir: &Path, name: &str) {
    let path = dir.join(name);
    std::fs::write(
        &path,
        format!("#!/bin/sh\necho {name}\nfor a in \"$@\"; do printf '[%s]\\n' \"$a\"; done\n"),
    )
    .unwrap();
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
}

struct Scene {
    dir: tempfile::TempDir,
}

impl Scene {
    /// A fake root with the given marks (paths relative to it) and fake binaries.
    fn new(marks: &[&str]) -> Scene {
        let dir = tempfile::tempdir().unwrap();
        for mark in marks {
            let path = dir.path().join("root").join(mark);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            if mark.ends_with('/') {
                std::fs::create_dir_all(&path).unwrap();
            } else {
                std::fs::write(&path, "").unwrap();
            }
        }
        std::fs::create_dir_all(dir.path().join("root")).unwrap();
        std::fs::create_dir_all(dir.path().join("bin")).unwrap();
        recorder(&dir.path().join("bin"), "rtrain");
        recorder(&dir.path().join("bin"), "mpirun");
        Scene { dir }
    }

    fn run(&self, env: &[(&str, &str)], args: &[&str]) -> Output {
        let output = self.run_unchecked(env, args);
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        output
    }

    /// Runs the entrypoint as Apptainer's `--cleanenv` does: nothing but `env` and PATH.
    fn run_unchecked(&self, env: &[(&str, &str)], args: &[&str]) -> Output {
        let path = format!("{}:/usr/bin:/bin", self.dir.path().join("bin").display());
        let mut command = Command::new(common::repo().join("entrypoint"));
        command.env_clear().env("PATH", path).env("RTRAIN_ENTRYPOINT_ROOT", self.dir.path().join("root"));
        for (k, v) in env {
            command.env(k, v);
        }
        command.args(args).output().unwrap()
    }
}

fn lines(output: &Output) -> Vec<String> {
    String::from_utf8_lossy(&output.stdout).lines().map(String::from).collect()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn no_container_no_gpu_runs_rtrain_with_the_arguments_untouched() {
    let scene = Scene::new(&[]);
    let tricky = ["train", "--set", "run.name=\"a b\"", "$(touch /tmp/rtrain-pwned)", "*", ""];
    let output = scene.run(&[], &tricky);
    let expected: Vec<String> =
        std::iter::once("rtrain".to_string()).chain(tricky.iter().map(|a| format!("[{a}]"))).collect();
    assert_eq!(lines(&output), expected);
    assert!(!Path::new("/tmp/rtrain-pwned").exists(), "an argument was executed");
    assert!(stderr(&output).contains("runtime none, 0 GPU(s), launcher: no"), "{}", stderr(&output));
}

#[test]
fn docker_with_two_gpus_starts_two_local_ranks_for_train_only() {
    let scene = Scene::new(&[".dockerenv", "dev/nvidia0", "dev/nvidia1", "dev/nvidiactl"]);
    let output = scene.run(&[], &["train", "--config", "configs/designsafe.toml"]);
    let got = lines(&output);
    assert_eq!(got[0], "mpirun");
    let np = got.iter().position(|l| l == "[-np]").expect("-np");
    assert_eq!(got[np + 1], "[2]", "one rank per GPU device (nvidiactl is not one): {got:?}");
    let rest: Vec<&str> = got.iter().map(String::as_str).skip_while(|l| !l.ends_with("rtrain]")).collect();
    assert!(rest[0].ends_with("rtrain]"), "{got:?}");
    assert_eq!(&rest[1..], ["[train]", "[--config]", "[configs/designsafe.toml]"]);
    assert!(stderr(&output).contains("runtime docker, 2 GPU(s)"));

    // Other commands stay one process.
    assert_eq!(lines(&scene.run(&[], &["doctor"])), vec!["rtrain", "[doctor]"]);
}

/// The entrypoint and rtrain decide "launched or not" alike, from the same variables: each case
/// of the table through the real entrypoint (two GPUs visible, so that "not launched" starts
/// mpirun) and through rtrain's own detection.
#[test]
fn entrypoint_and_rtrain_agree_on_being_launched() {
    let scene = Scene::new(&[".dockerenv", "dev/nvidia0", "dev/nvidia1"]);
    let cases: &[(&[(&str, &str)], bool)] = &[
        (&[], false),
        (&[("OMPI_COMM_WORLD_RANK", "1"), ("OMPI_COMM_WORLD_SIZE", "2")], true),
        (&[("OMPI_COMM_WORLD_SIZE", "2")], false),
        (&[("PMI_RANK", "0"), ("PMI_SIZE", "2")], true),
        (&[("PMI_SIZE", "2")], false),
        (&[("MV2_COMM_WORLD_RANK", "0"), ("MV2_COMM_WORLD_SIZE", "2")], true),
        (&[("SLURM_PROCID", "0"), ("SLURM_NTASKS", "2"), ("SLURM_STEP_ID", "0")], true),
        (&[("SLURM_NTASKS", "2")], false),
        (&[("SLURM_PROCID", "0")], false),
        (&[("PMIX_RANK", "0")], true),
        (&[("PMIX_RANK", "")], false),
        (&[("RANK", "1"), ("WORLD_SIZE", "2")], true),
        (&[("WORLD_SIZE", "2")], false),
    ];
    for &(env, launched) in cases {
        let output = scene.run(env, &["train"]);
        let by_entrypoint = lines(&output) == ["rtrain", "[train]"];
        let map: std::collections::HashMap<&str, &str> = env.iter().copied().collect();
        let by_rtrain =
            rtrain::cluster::launcher::detect(|name| map.get(name).map(|v| v.to_string())).unwrap().is_some();
        assert_eq!((by_entrypoint, by_rtrain), (launched, launched), "{env:?}: {}", stderr(&output));
    }
}

/// A Slurm batch script that runs the image without `srun` has `SLURM_PROCID` and
/// `SLURM_NTASKS` too (as Slurm 22.05 sets them, recorded here: no `SLURM_STEP_ID`). Neither
/// the entrypoint nor rtrain takes that for a launch, and the entrypoint starts no ranks of its
/// own inside a Slurm job even where GPUs would make it (the job's ranks are srun's to start):
/// one process, told to use srun.
#[test]
fn a_slurm_batch_script_without_srun_is_one_process() {
    let scene = Scene::new(&[".dockerenv", "dev/nvidia0", "dev/nvidia1"]);
    let batch = [("SLURM_JOB_ID", "7"), ("SLURM_PROCID", "0"), ("SLURM_NTASKS", "2"), ("SLURM_LOCALID", "0")];
    let output = scene.run(&batch, &["train"]);
    assert_eq!(lines(&output), vec!["rtrain", "[train]"], "{}", stderr(&output));
    assert!(
        stderr(&output).contains("launcher: no") && stderr(&output).contains("srun"),
        "{}",
        stderr(&output)
    );
    let map: std::collections::HashMap<&str, &str> = batch.iter().copied().collect();
    let env = |name: &str| map.get(name).map(|v| v.to_string());
    assert_eq!(rtrain::cluster::launcher::detect(env).unwrap(), None);
    assert!(rtrain::cluster::launcher::unlaunched_in_slurm_batch(env).is_some_and(|w| w.contains("srun")));
}

/// Under Apptainer (and Charliecloud) the host's launcher starts the ranks. With `--cleanenv` (or `--containall`)
/// its variables are gone while /dev shows every GPU of the node: each of srun's tasks must
/// still be one process, not G ranks of its own.
#[test]
fn apptainer_and_charliecloud_never_start_ranks_of_their_own() {
    for marks in [&[".singularity.d/", "dev/nvidia0", "dev/nvidia1"][..], &["dev/nvidia0", "dev/nvidia1"]] {
        let scene = Scene::new(marks);
        let output = scene.run(&[("APPTAINER_CONTAINER", "/scratch/rtrain.sif")], &["train"]);
        assert_eq!(lines(&output), ["rtrain", "[train]"], "{}", stderr(&output));
        assert!(stderr(&output).contains("runtime apptainer, 2 GPU(s), launcher: no"), "{}", stderr(&output));
        assert!(
            stderr(&output).contains("RTRAIN_LOCAL_RANKS=2"),
            "says how to get 2 ranks: {}",
            stderr(&output)
        );
    }
    // Charliecloud's ch-run on an image directory from `docker export` (it keeps /.dockerenv):
    // an HPC runtime under the host's launcher, not Docker, so no ranks of its own either.
    let exported = Scene::new(&[".dockerenv", "dev/nvidia0", "dev/nvidia1"]);
    let output = exported.run(&[("CH_RUNNING", "Weird Al Yankovic")], &["train"]);
    assert_eq!(lines(&output), ["rtrain", "[train]"], "{}", stderr(&output));
    assert!(stderr(&output).contains("runtime charliecloud, 2 GPU(s), launcher: no"), "{}", stderr(&output));
    // No container at all (a login node, a bare GPU box): the same.
    let bare = Scene::new(&["dev/nvidia0", "dev/nvidia1"]).run(&[], &["train"]);
    assert_eq!(lines(&bare), ["rtrain", "[train]"]);
}

#[test]
fn rtrain_local_ranks_chooses_the_number_of_local_ranks() {
    let np = |output: &Output| {
        let got = lines(output);
        got.iter().position(|l| l == "[-np]").map(|i| got[i + 1].clone())
    };
    let apptainer = Scene::new(&[".singularity.d/"]);
    let asked = apptainer.run(&[("RTRAIN_LOCAL_RANKS", "3")], &["train"]);
    assert_eq!(np(&asked).as_deref(), Some("[3]"), "{:?}", lines(&asked));
    // Under a launcher the variable is ignored: the launcher already started the ranks.
    let launched = apptainer.run(&[("RTRAIN_LOCAL_RANKS", "3"), ("PMIX_RANK", "0")], &["train"]);
    assert_eq!(lines(&launched), ["rtrain", "[train]"]);
    let docker = Scene::new(&[".dockerenv", "dev/nvidia0", "dev/nvidia1"]);
    let one = docker.run(&[("RTRAIN_LOCAL_RANKS", "1")], &["train"]);
    assert_eq!(lines(&one), ["rtrain", "[train]"]);
    // The bind-model image's Hydra takes no Open MPI options.
    let hydra = docker.run(&[("RTRAIN_MPI", "mpich")], &["train"]);
    assert_eq!(lines(&hydra)[..3], ["mpirun", "[-np]", "[2]"]);
    assert_eq!(lines(&hydra)[4..], ["[train]"], "{:?}", lines(&hydra));
    for bad in ["0", "two", "-1", "02"] {
        let output = docker.run_unchecked(&[("RTRAIN_LOCAL_RANKS", bad)], &["train"]);
        assert_eq!(output.status.code(), Some(2), "{bad}");
        assert!(stderr(&output).contains(&format!("not '{bad}'")), "{}", stderr(&output));
    }
}

/// The entrypoint counts the GPUs a process may use as rtrain does: device nodes, limited by
/// NVIDIA_VISIBLE_DEVICES and CUDA_VISIBLE_DEVICES lists, one MIG instance at most. Each case
/// through the real entrypoint (Docker, so that the count is printed) and rtrain's own count.
#[test]
fn entrypoint_and_rtrain_count_the_same_usable_gpus() {
    let four = [".dockerenv", "dev/nvidia0", "dev/nvidia1", "dev/nvidia2", "dev/nvidia3", "dev/nvidiactl"];
    let cases: &[(&[(&str, &str)], usize)] = &[
        (&[], 4),
        (&[("NVIDIA_VISIBLE_DEVICES", "all")], 4),
        (&[("NVIDIA_VISIBLE_DEVICES", "0,1")], 2),
        (&[("NVIDIA_VISIBLE_DEVICES", "none")], 0),
        (&[("NVIDIA_VISIBLE_DEVICES", "void")], 0),
        (&[("NVIDIA_VISIBLE_DEVICES", "GPU-5c1f2a,GPU-77aa01,GPU-0b9e33")], 3),
        (&[("CUDA_VISIBLE_DEVICES", "")], 0),
        (&[("CUDA_VISIBLE_DEVICES", "2")], 1),
        (&[("CUDA_VISIBLE_DEVICES", "0,1,2")], 3),
        (&[("CUDA_VISIBLE_DEVICES", "0,-1,2")], 1),
        (&[("CUDA_VISIBLE_DEVICES", "0,1,")], 2),
        (&[("CUDA_VISIBLE_DEVICES", "0,1,2,3,4,5,6,7")], 4),
        (&[("CUDA_VISIBLE_DEVICES", "MIG-1a2b,MIG-3c4d")], 1),
        (&[("NVIDIA_VISIBLE_DEVICES", "MIG-1a2b,MIG-3c4d")], 1),
        (&[("NVIDIA_VISIBLE_DEVICES", "0,1,2"), ("CUDA_VISIBLE_DEVICES", "0,1")], 2),
        (&[("NVIDIA_VISIBLE_DEVICES", "*")], 1),
        (&[("NVIDIA_VISIBLE_DEVICES", "0,,2")], 1),
    ];
    let scene = Scene::new(&four);
    for &(env, expected) in cases {
        let output = scene.run(env, &["doctor"]);
        let by_entrypoint = format!("runtime docker, {expected} GPU(s)");
        assert!(stderr(&output).contains(&by_entrypoint), "{env:?}: {}", stderr(&output));
        let probe = rtrain::cluster::runtime::Probe::simulated(scene.dir.path().join("root"), env);
        assert_eq!(rtrain::cluster::runtime::usable_gpus(&probe), expected, "rtrain, {env:?}");
    }
}

/// The entrypoint's list of launcher variables is rtrain's, pair for pair.
#[test]
fn entrypoint_lists_rtrains_launch_variables() {
    let text = std::fs::read_to_string(common::repo().join("entrypoint")).unwrap();
    let line = text.lines().find(|l| l.starts_with("for entry in ")).expect("the entrypoint's launcher list");
    let listed: Vec<String> = line
        .trim_start_matches("for entry in ")
        .trim_end_matches("; do")
        .split(' ')
        .map(String::from)
        .collect();
    assert_eq!(listed, rtrain::cluster::launcher::launch_variables());
}

#[test]
fn gpus_expected_but_absent_get_the_fix_for_the_runtime() {
    /// Marks in the fake root, environment, and the fix the warning must name.
    type Case<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)], &'a str);
    let cases: [Case; 3] = [
        (&[".dockerenv"], &[], "docker run --gpus all"),
        (&[], &[("APPTAINER_CONTAINER", "/images/rtrain.sif")], "apptainer exec --nv"),
        (&["run/.containerenv"], &[], "nvidia.com/gpu=all"),
    ];
    for (marks, env, fix) in cases {
        let scene = Scene::new(marks);
        let mut env = env.to_vec();
        env.push(("NVIDIA_VISIBLE_DEVICES", "all"));
        let output = scene.run(&env, &["train"]);
        assert!(stderr(&output).contains(fix), "{fix}: {}", stderr(&output));
        assert_eq!(lines(&output), vec!["rtrain", "[train]"], "still trains, on CPU");
    }
    // The variable alone, with no GPU expected by the runtime: no warning without it.
    let quiet = Scene::new(&[".dockerenv"]).run(&[], &["train"]);
    assert!(!stderr(&quiet).contains("no GPU visible"));
}

#[cfg(feature = "test-reference")]
#[test]
fn entrypoint_is_shellcheck_clean() {
    let output = Command::new("shellcheck").arg(common::repo().join("entrypoint")).output();
    let output = output.expect("shellcheck is missing: run scripts/setup --test");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stdout));
}

/// The value of `variable` in the environment the entrypoint hands to rtrain, on a fake root
/// with `marks` (`env` stands in for rtrain and prints it).
fn exported(variable: &str, marks: &[&str], env: &[(&str, &str)]) -> Option<String> {
    let mut env = env.to_vec();
    env.push(("RTRAIN_BIN", "env"));
    let output = Scene::new(marks).run(&env, &[]);
    lines(&output).iter().find_map(|line| line.strip_prefix(&format!("{variable}=")).map(String::from))
}

/// Docker and Podman drop CAP_SYS_PTRACE, which Open MPI's single-copy shared-memory transport
/// needs: the entrypoint turns it off there (unless the user chose), and leaves it elsewhere.
#[test]
fn shared_memory_single_copy_is_off_only_under_docker_and_podman() {
    const VAR: &str = "OMPI_MCA_btl_vader_single_copy_mechanism";
    let setting = |marks: &[&str], env: &[(&str, &str)]| exported(VAR, marks, env);
    assert_eq!(setting(&[".dockerenv"], &[]).as_deref(), Some("none"));
    assert_eq!(setting(&["run/.containerenv"], &[]).as_deref(), Some("none"));
    assert_eq!(setting(&[".dockerenv"], &[(VAR, "cma")]).as_deref(), Some("cma"));
    assert_eq!(setting(&[".singularity.d/"], &[]), None);
    assert_eq!(setting(&[], &[]), None);
}

/// MPICH's UCX hangs in MPI_Finalize under Docker with its TCP transport: the MPICH image's
/// entrypoint keeps to shared memory there (unless the user chose), and nowhere else.
#[test]
fn ucx_transports_are_chosen_only_for_the_mpich_image_under_docker_and_podman() {
    let setting = |marks: &[&str], env: &[(&str, &str)]| exported("UCX_TLS", marks, env);
    let mpich = ("RTRAIN_MPI", "mpich");
    assert_eq!(setting(&[".dockerenv"], &[mpich]).as_deref(), Some("self,sm"));
    assert_eq!(setting(&["run/.containerenv"], &[mpich]).as_deref(), Some("self,sm"));
    assert_eq!(setting(&[".dockerenv"], &[mpich, ("UCX_TLS", "rc,sm")]).as_deref(), Some("rc,sm"));
    assert_eq!(setting(&[".dockerenv"], &[]), None);
    assert_eq!(setting(&[".singularity.d/"], &[mpich]), None);
}
