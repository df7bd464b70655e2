//! `rtrain doctor` as scripts use it (apptainer.def's `%test`, a job's first step): it prints
//! its report, human or JSON, whatever it finds, and its exit status says whether it found a
//! problem.

use crate::common;

#[test]
fn doctor_exits_non_zero_on_a_problem_and_still_prints_the_report() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-data");
    let set = format!("data.root={}", missing.display());

    let json = common::rtrain(dir.path()).args(["doctor", "--json", "--set", &set]).output().unwrap();
    assert_eq!(json.status.code(), Some(1), "{}", String::from_utf8_lossy(&json.stderr));
    let report: serde_json::Value = serde_json::from_slice(&json.stdout).expect("the JSON report on stdout");
    let problems = report["problems"].as_array().unwrap();
    assert_eq!(problems.len(), 1, "{report:#}");
    assert!(problems[0]["problem"].as_str().unwrap().contains("no-such-data"), "{report:#}");
    assert!(String::from_utf8_lossy(&json.stderr).contains("doctor found 1 problem(s)"));

    let human = common::rtrain(dir.path()).args(["doctor", "--set", &set]).output().unwrap();
    assert_eq!(human.status.code(), Some(1));
    let text = String::from_utf8_lossy(&human.stdout);
    assert!(text.contains("problems: 1") && text.contains("fix: point data.root at"), "{text}");

    // The same machine with data that exists: nothing to fix, exit 0.
    std::fs::create_dir(&missing).unwrap();
    let fine = common::rtrain(dir.path()).args(["doctor", "--json", "--set", &set]).output().unwrap();
    let report: serde_json::Value = serde_json::from_slice(&fine.stdout).unwrap();
    assert_eq!(report["problems"], serde_json::json!([]), "{report:#}");
    assert_eq!(fine.status.code(), Some(0));
}
