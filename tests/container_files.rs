//! Static checks of the container definitions, which cannot be built on this machine's test
//! path: the Containerfile passes hadolint (with .hadolint.yaml), apptainer.def has the
//! sections Apptainer needs and its scripts pass shellcheck as /bin/sh scripts.

use crate::common;

use std::process::Command;

#[test]
fn containerfile_passes_hadolint() {
    let hadolint = common::repo().join(".deps/venv/bin/hadolint");
    assert!(hadolint.exists(), "hadolint is missing: run scripts/setup --test");
    let output = Command::new(hadolint)
        .current_dir(common::repo())
        .args(["--config", ".hadolint.yaml", "Containerfile"])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stdout));
}

#[test]
fn apptainer_definition_has_its_sections_and_clean_scripts() {
    let text = std::fs::read_to_string(common::repo().join("apptainer.def")).unwrap();
    assert!(text.starts_with("Bootstrap: docker-daemon\nFrom: {{ IMAGE }}\n"), "header");
    assert!(text.contains("%arguments\n    IMAGE=rtrain:latest\n"), "the image defaults to rtrain:latest");
    let sections = common::apptainer_sections(&text);
    let names: Vec<&str> = sections.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["arguments", "labels", "environment", "post", "runscript", "test", "help"]);
    let help = &sections.iter().find(|(n, _)| n == "help").unwrap().1;
    for launcher in ["mpirun", "srun", "ibrun", "--nv"] {
        assert!(help.contains(launcher), "%help should show {launcher}");
    }
    let dir = tempfile::tempdir().unwrap();
    for (name, body) in
        sections.iter().filter(|(n, _)| ["environment", "post", "runscript", "test"].contains(&n.as_str()))
    {
        // Apptainer runs these with /bin/sh (%post as `/bin/sh -e`).
        let script = dir.path().join(name);
        std::fs::write(&script, format!("#!/bin/sh\n{body}")).unwrap();
        let output =
            Command::new("shellcheck").arg(&script).output().expect("shellcheck: run scripts/setup --test");
        assert!(output.status.success(), "%{name}: {}", String::from_utf8_lossy(&output.stdout));
    }
}

/// The project's shell scripts (setup, test, simcluster, slurm, container, GPU check and build, CI,
/// benchmark runners) pass shellcheck.
#[test]
fn shell_scripts_pass_shellcheck() {
    let scripts = [
        "scripts/setup",
        "scripts/test",
        "scripts/simcluster",
        "scripts/slurm",
        "scripts/container",
        "scripts/bundle",
        "scripts/gpu-check",
        "scripts/build-gpu-binary",
        ".ci/run",
        "bench/run",
        "bench/scaling",
    ];
    let output = Command::new("shellcheck")
        .current_dir(common::repo())
        .args(scripts)
        .output()
        .expect("shellcheck: run scripts/setup --test");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stdout));
}
