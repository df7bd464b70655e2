//! `rtrain report` over runs that differ only in their seeds: the groups it forms and its
//! statistics, checked against SciPy (`t.interval`, Welch's `ttest_ind`) on the numbers the runs'
//! own `metrics.jsonl` hold.

use crate::common;

use serde_json::Value;

/// Whether our number equals SciPy's to 1e-9 (relative above 1); the reference writes NaN and
/// the infinities as the strings "NaN", "inf", "-inf".
fn close(ours: f64, reference: &Value, what: &str) {
    let reference = reference
        .as_f64()
        .or_else(|| reference.as_str().and_then(|text| text.parse().ok()))
        .unwrap_or_else(|| panic!("{what}: SciPy gave {reference}"));
    let agree = ours == reference
        || (ours.is_nan() && reference.is_nan())
        || (ours - reference).abs() <= 1e-9 * reference.abs().max(1.0);
    assert!(agree, "{what}: ours {ours}, SciPy {reference}");
}

fn rows(path: &std::path::Path) -> Vec<csv::StringRecord> {
    let mut reader = csv::Reader::from_path(path).unwrap();
    reader.records().map(Result::unwrap).collect()
}

/// Six runs, two learning rates x three seeds: two groups named by the learning rate, each
/// metric's mean, sd and t-interval and the groups' Welch comparison equal to SciPy's to 1e-9;
/// `--ignore-key optim.lr` puts all six in one group.
#[test]
fn seed_groups_and_their_statistics_match_scipy() {
    let dir = tempfile::tempdir().unwrap();
    let data = common::synth(dir.path(), 4, 3, 32);
    let data_arg = format!("data.root={:?}", data.display().to_string());
    let runs = [
        ("a1", "0.01", 1),
        ("a2", "0.01", 2),
        ("a3", "0.01", 3),
        ("b1", "0.004", 1),
        ("b2", "0.004", 2),
        ("b3", "0.004", 3),
    ];
    for (name, lr, seed) in runs {
        let trained = common::rtrain(dir.path())
            .args(["train", "--run-dir", name, "--set", &data_arg])
            .args(["--set", "data.image_size=32", "--set", "data.batch_size=4", "--set", "train.epochs=2"])
            // fp32 everywhere: under bf16 (the default on CPUs that compute it natively) the
            // larger rate collapses every seed to one class, and groups without spread compare
            // nothing.
            .args(["--set", "train.precision=fp32"])
            .args([
                "--set",
                "train.threads=1",
                "--set",
                &format!("optim.lr={lr}"),
                "--set",
                &format!("run.seed={seed}"),
            ])
            .output()
            .unwrap();
        assert!(trained.status.success(), "{name}: {}", String::from_utf8_lossy(&trained.stderr));
    }
    let names: Vec<&str> = runs.iter().map(|r| r.0).collect();
    let reported =
        common::rtrain(dir.path()).arg("report").args(&names).args(["--out", "report"]).output().unwrap();
    assert!(reported.status.success(), "{}", String::from_utf8_lossy(&reported.stderr));

    // The numbers each run logged, read from its metrics.jsonl.
    let epochs = |name: &str| -> Vec<Value> {
        std::fs::read_to_string(dir.path().join(name).join("metrics.jsonl"))
            .unwrap()
            .lines()
            .map(|line| serde_json::from_str::<Value>(line).unwrap())
            .filter(|r| r["kind"] == "epoch")
            .collect()
    };
    let metric = |name: &str, metric: &str| -> f64 {
        let epochs = epochs(name);
        let last = &epochs.last().unwrap()["val"];
        match metric {
            "final_val_top1" => last["top1"].as_f64().unwrap(),
            "best_val_top1" => {
                epochs.iter().map(|e| e["val"]["top1"].as_f64().unwrap()).fold(f64::MIN, f64::max)
            }
            "final_val_loss" => last["loss"].as_f64().unwrap(),
            "final_val_macro_f1" => last["macro_f1"].as_f64().unwrap(),
            _ => unreachable!(),
        }
    };
    let (a, b) = ("optim.lr=0.01", "optim.lr=0.004");
    let summaries = rows(&dir.path().join("report/seeds.csv"));
    let comparisons = rows(&dir.path().join("report/comparisons.csv"));
    for name in ["final_val_top1", "best_val_top1", "final_val_loss", "final_val_macro_f1"] {
        let values = |group: &[&str]| -> Vec<f64> { group.iter().map(|run| metric(run, name)).collect() };
        let given = serde_json::json!({
            "groups": {a: values(&names[..3]), b: values(&names[3..])},
            "pairs": [[a, b]],
        });
        let input = dir.path().join(format!("{name}.json"));
        std::fs::write(&input, given.to_string()).unwrap();
        let output = std::process::Command::new(common::python())
            .arg(common::repo().join("tests/reference/seed_stats_reference.py"))
            .arg(&input)
            .output()
            .unwrap();
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        let scipy: Value = serde_json::from_slice(&output.stdout).unwrap();
        for group in [a, b] {
            let row = summaries
                .iter()
                .find(|r| &r[0] == group && &r[1] == name)
                .unwrap_or_else(|| panic!("no {group} {name}"));
            assert_eq!(&row[2], "3", "{row:?}");
            // Runs of different seeds differ, so the comparisons below are of real spreads
            // (equal runs would give sd 0 and NaN t statistics, which compare equal too).
            let sd: f64 = row[4].parse().unwrap();
            assert!(sd.is_finite() && sd > 0.0, "{group} {name}: sd {sd} over seeds 1-3: {row:?}");
            for (column, key) in [(3, "mean"), (4, "sd"), (5, "ci_low"), (6, "ci_high")] {
                close(
                    row[column].parse().unwrap(),
                    &scipy["groups"][group][key],
                    &format!("{group} {name} {key}"),
                );
            }
        }
        let row = comparisons.iter().find(|r| &r[0] == name).unwrap();
        assert_eq!((&row[1], &row[2]), (a, b));
        let t: f64 = row[8].parse().unwrap();
        assert!(t.is_finite(), "{name}: Welch t {t}: {row:?}");
        for (column, key) in [(6, "ci_low"), (7, "ci_high"), (8, "t"), (9, "df"), (10, "p")] {
            close(row[column].parse().unwrap(), &scipy["pairs"][0][key], &format!("{name} Welch {key}"));
        }
    }
    let report = std::fs::read_to_string(dir.path().join("report/report.md")).unwrap();
    assert!(report.contains(&format!("**{a}**: a1 (seed 1), a2 (seed 2), a3 (seed 3)")), "{report}");
    for figure in ["seeds-1.svg", "seeds-1.png", "seeds-2.svg"] {
        assert!(dir.path().join("report").join(figure).is_file(), "{figure}");
    }

    // The learning rate ignored: one group of six.
    let reported = common::rtrain(dir.path())
        .arg("report")
        .args(&names)
        .args(["--out", "together", "--ignore-key", "optim.lr"])
        .output()
        .unwrap();
    assert!(reported.status.success(), "{}", String::from_utf8_lossy(&reported.stderr));
    let summaries = rows(&dir.path().join("together/seeds.csv"));
    assert!(summaries.iter().all(|r| &r[0] == "all runs" && &r[2] == "6"), "{summaries:?}");
    assert!(rows(&dir.path().join("together/comparisons.csv")).is_empty());
}
