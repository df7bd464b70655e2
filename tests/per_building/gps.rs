//! GPS positions and headings as exiftool reads them (`exiftool -n`), from photos geotagged by
//! exiftool, exiv2, Pillow and piexif (tests/reference/gps_writers.py): all four hemispheres,
//! with and without altitude (one below sea level), heading to true and magnetic north,
//! `GPSHPositioningError`, big- and little-endian, JPEG APP1 and PNG eXIf, through the real
//! `rtrain predict --out`; photos whose GPS block is present but unreadable counted apart from
//! those without one.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

use serde_json::Value;

use super::common;

/// A ResNet-18 trained for one epoch on 8 synthetic 32-pixel photos: what predict needs to
/// write its files (its predictions are not what is tested): common's tiny run, trained once per
/// test binary.
pub fn tiny_model() -> &'static Path {
    &common::fixtures::tiny_run().model
}

/// What `exiftool -n` reads of each file: the composite (signed) position and altitude, and
/// the GPS directory's heading, its reference and the positioning error, by file name.
fn exiftool(dir: &Path, files: &[String]) -> BTreeMap<String, Value> {
    let output = Command::new("exiftool")
        .args(["-n", "-json", "-G1", "-Composite:GPSLatitude", "-Composite:GPSLongitude"])
        .args(["-Composite:GPSAltitude", "-GPS:GPSImgDirection", "-GPS:GPSImgDirectionRef"])
        .args(["-GPS:GPSHPositioningError"])
        .args(files)
        .current_dir(dir)
        .output()
        .expect("exiftool (Debian's libimage-exiftool-perl) is missing: run scripts/setup --test");
    let output = common::assert_success(output, "exiftool -n -json");
    let read: Vec<Value> = serde_json::from_slice(&output.stdout).unwrap();
    read.into_iter().map(|tags| (tags["SourceFile"].as_str().unwrap().to_string(), tags)).collect()
}

#[test]
fn positions_and_headings_of_every_writer_are_exiftools_and_unreadable_blocks_are_counted_apart() {
    let dir = tempfile::tempdir().unwrap();
    let photos = dir.path().join("photos");
    let output = Command::new(common::python())
        .arg(common::repo().join("tests/reference/gps_writers.py"))
        .arg(&photos)
        .output()
        .unwrap();
    let output = common::assert_success(output, "gps_writers.py (exiftool, exiv2, Pillow, piexif)");
    let written: Vec<Value> = serde_json::from_slice(&output.stdout).unwrap();
    let files: Vec<String> = written.iter().map(|w| w["file"].as_str().unwrap().to_string()).collect();
    let kinds = |key: &str| -> BTreeSet<&str> { written.iter().map(|w| w[key].as_str().unwrap()).collect() };
    assert_eq!(kinds("writer"), BTreeSet::from(["exiftool", "exiv2", "piexif", "pillow"]));
    assert_eq!(kinds("byte_order"), BTreeSet::from(["II", "MM"]));
    assert_eq!(kinds("container"), BTreeSet::from(["jpeg", "png"]));

    let output = common::rtrain(dir.path())
        .args(["predict", "--set", "train.threads=1", "--checkpoint"])
        .arg(tiny_model())
        .args(["photos", "--out", "out"])
        .output()
        .unwrap();
    let output = common::assert_success(output, "rtrain predict --out");
    let stderr = String::from_utf8_lossy(&output.stderr);
    let jsonl = std::fs::read_to_string(dir.path().join("out/predictions.jsonl")).unwrap();
    let records: BTreeMap<String, Value> = jsonl
        .lines()
        .map(|line| serde_json::from_str::<Value>(line).unwrap())
        .map(|record| (record["path"].as_str().unwrap().trim_start_matches("photos/").to_string(), record))
        .collect();

    let reference = exiftool(&photos, &files);
    let mut largest = 0.0f64;
    let mut seen = BTreeSet::new();
    for file in &files {
        let (ours, theirs) = (&records[file], &reference[file]);
        assert!(ours["class"].is_string() && ours.get("gps_problem").is_none(), "{file}: {ours}");
        for (key, tag) in [
            ("latitude", "Composite:GPSLatitude"),
            ("longitude", "Composite:GPSLongitude"),
            ("altitude", "Composite:GPSAltitude"),
            ("heading", "GPS:GPSImgDirection"),
            ("position_error_m", "GPS:GPSHPositioningError"),
        ] {
            let (value, expected) =
                (ours.get(key).and_then(Value::as_f64), theirs.get(tag).and_then(Value::as_f64));
            match (value, expected) {
                (Some(value), Some(expected)) => {
                    let difference = (value - expected).abs();
                    assert!(difference <= 1e-9, "{file} {key}: {value} vs exiftool's {expected}");
                    largest = largest.max(difference);
                }
                (None, None) => {}
                _ => panic!("{file} {key}: rtrain {value:?}, exiftool {expected:?}\n{ours}\n{theirs}"),
            }
        }
        assert_eq!(
            ours.get("heading_ref").and_then(Value::as_str),
            theirs.get("GPS:GPSImgDirectionRef").and_then(Value::as_str),
            "{file}"
        );
        let number = |key: &str| ours.get(key).and_then(Value::as_f64);
        let sign = |v: Option<f64>| v.map(|v| if v < 0.0 { "-" } else { "+" });
        seen.insert(format!("hemisphere {:?}{:?}", sign(number("latitude")), sign(number("longitude"))));
        seen.insert(format!("altitude {:?}", sign(number("altitude"))));
        seen.insert(format!("heading {:?}", ours.get("heading_ref")));
        seen.insert(format!("error {}", number("position_error_m").is_some()));
    }
    eprintln!("{} photos, largest difference from exiftool -n: {largest:e}", files.len());
    // Well-formed blocks are read without a word, piexif's too (no next-directory offset after
    // its GPS directory: every entry is read, as exiftool and Pillow read them silently).
    for file in &files {
        let said: Vec<&str> =
            stderr.lines().filter(|line| line.contains(&format!("photos/{file}: "))).collect();
        assert!(said.is_empty(), "warnings about a well-formed photo: {said:?}");
    }
    // What the photos cover, so that a writer script that stopped writing some of it fails.
    for case in [
        "hemisphere Some(\"+\")Some(\"+\")",
        "hemisphere Some(\"+\")Some(\"-\")",
        "hemisphere Some(\"-\")Some(\"+\")",
        "hemisphere Some(\"-\")Some(\"-\")",
        "altitude Some(\"+\")",
        "altitude Some(\"-\")",
        "altitude None",
        "heading Some(String(\"T\"))",
        "heading Some(String(\"M\"))",
        "heading None",
        "error true",
        "error false",
    ] {
        assert!(seen.contains(case), "no photo with {case}: {seen:?}");
    }

    // GPS blocks present but unreadable: no position, the reason kept, counted apart from the
    // photo without GPS; the photos are still classified.
    let broken = [
        ("broken/gps-pointer-past-end.jpg", "the GPS directory at offset"),
        ("broken/latitude-ref-x.jpg", "GPSLatitudeRef is 'X'"),
        ("broken/zero-denominator.jpg", "GPSLatitude has a zero denominator"),
    ];
    for (file, reason) in broken {
        let record = &records[file];
        assert!(record["class"].is_string() && record["latitude"].is_null(), "{file}: {record}");
        let problem = record["gps_problem"].as_str().unwrap_or_default();
        assert!(problem.contains(reason), "{file}: {problem:?} does not say {reason:?}");
    }
    assert!(records["nogps.jpg"].get("gps_problem").is_none(), "{}", records["nogps.jpg"]);
    let summary: Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("out/summary.json")).unwrap()).unwrap();
    let counts = (summary["without_gps"].as_u64(), summary["gps_unreadable"].as_u64());
    assert_eq!(counts, (Some(1), Some(3)), "{summary}");
    let examples: Vec<&str> = summary["gps_unreadable_examples"]
        .as_array()
        .unwrap()
        .iter()
        .map(|example| example["path"].as_str().unwrap())
        .collect();
    assert_eq!(examples, broken.map(|(file, _)| format!("photos/{file}")), "{summary}");
    assert!(
        stderr.contains(
            "1 without GPS, 3 with an unreadable GPS block (first: photos/broken/gps-pointer-past-end.jpg: \
             the GPS directory at offset"
        ),
        "{stderr}"
    );
}
