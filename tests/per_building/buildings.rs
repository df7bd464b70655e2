//! `predict --out --footprints` and `rtrain buildings` through the binary: each building's
//! fused probabilities as numpy computes them from `predictions.jsonl` (mean and normalised
//! product, to 1e-9), `buildings.geojson` valid for the `geojson` package and read by
//! geopandas, the same files whether the footprints come with the campaign or after it, and a
//! bad footprints file refused before any photo is classified
//! (tests/reference/buildings_reference.py holds the scene and the numpy side).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use serde_json::Value;

use super::common;

const CLASSES: [&str; 3] = ["C0", "C2", "C4"];

/// A fresh ResNet-18 for 32-pixel images, saved once for the binary: its probabilities differ
/// between photos, which is all fusion needs (no training).
fn model() -> &'static Path {
    static MODEL: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    let (_, path) = MODEL.get_or_init(|| {
        use rtrain::model::{Arch, Model};
        let dir = tempfile::tempdir().unwrap();
        tch::manual_seed(52);
        let model = Model::with_head(Arch::Resnet18, CLASSES.len(), &[], tch::Device::Cpu).unwrap();
        let classes = CLASSES.map(String::from).to_vec();
        let meta = common::checkpoint_meta(Arch::Resnet18, classes, &[], 1, 32);
        let path = dir.path().join("model.safetensors");
        rtrain::run_dir::checkpoint::save(&path, &meta, model.state_dict().into_iter().collect(), vec![])
            .unwrap();
        (dir, path)
    });
    path
}

fn reference(args: &[&std::ffi::OsStr]) -> Value {
    let output = Command::new(common::python())
        .arg(common::repo().join("tests/reference/buildings_reference.py"))
        .args(args)
        .output()
        .unwrap();
    serde_json::from_slice(&common::assert_success(output, "buildings_reference.py").stdout).unwrap()
}

/// `rtrain predict --out OUT` of the scene's photos, with `extra` flags.
fn predict(dir: &Path, out: &str, extra: &[&str]) -> std::process::Output {
    common::rtrain(dir)
        .args(["predict", "--checkpoint"])
        .arg(model())
        .args(["--set", "train.threads=1", "--set", "data.image_size=32", "--out", out, "photos"])
        .args(extra)
        .output()
        .unwrap()
}

fn json_file(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap())
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The reference's comparison of `out` with numpy, asserted.
fn matches_numpy(dir: &Path, out: &str, fusion: &str, all: bool, buildings: &[&str]) -> Value {
    let out = dir.join(out);
    let all_flag = if all { "1" } else { "0" };
    let footprints = dir.join("footprints.geojson");
    let checked = reference(&[
        "check".as_ref(),
        out.as_os_str(),
        footprints.as_os_str(),
        "bid".as_ref(),
        fusion.as_ref(),
        all_flag.as_ref(),
    ]);
    assert_eq!(checked["problems"], serde_json::json!([]), "{fusion}: {checked}");
    let worst = checked["max_difference"].as_f64().unwrap();
    eprintln!("{fusion}: fused probabilities within {worst:e} of numpy's");
    assert!(worst <= 1e-9, "{checked}");
    assert_eq!(checked["buildings"], serde_json::json!(buildings), "{checked}");
    assert_eq!(checked["valid"], true, "the geojson package: {checked}");
    assert_eq!(checked["geopandas_rows"], buildings.len(), "{checked}");
    assert_eq!(checked["crs"], 4326, "{checked}");
    checked
}

fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The campaign with footprints (mean; then product with every footprint) against numpy, the
/// `geojson` package and geopandas; and footprints joined after the campaign (`rtrain
/// buildings`) giving the same bytes.
#[test]
fn fused_buildings_match_numpy_and_load_in_geopandas() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    reference(&["scene".as_ref(), dir.as_os_str()]);

    let output = predict(dir, "mean", &["--footprints", "footprints.geojson", "--footprint-id", "bid"]);
    common::assert_success(output, "rtrain predict --out --footprints");
    let mean = matches_numpy(dir, "mean", "mean", false, &["bldg-1", "bldg-2", "bldg-3"]);
    eprintln!("geopandas read the classes {}", mean["geopandas_classes"]);

    // Each photo's building, as the scene placed it.
    let rows = common::csv_rows(&dir.join("mean/predictions.csv"));
    let row = |name: &str| rows.iter().find(|r| r["path"] == format!("photos/{name}")).unwrap().clone();
    for (name, building, assignment) in [
        ("a1.jpg", "bldg-1", "inside"),
        ("a3.jpg", "bldg-1", "inside"),
        ("b2.jpg", "bldg-2", "inside"),
        ("c1.jpg", "bldg-3", "nearest"),
        ("far.jpg", "", "none"),
        ("nogps.jpg", "", ""),
    ] {
        let row = row(name);
        assert_eq!(
            (row["building_id"].as_str(), row["assignment"].as_str()),
            (building, assignment),
            "{row:?}"
        );
    }
    assert_eq!(row("a1.jpg")["distance_m"], "0");
    let seen = row("b3.jpg");
    assert_eq!(
        (seen["building_id"].as_str(), seen["assignment"].as_str()),
        ("bldg-2", "line_of_sight"),
        "facing east from between two buildings: {seen:?}"
    );
    let summary = json_file(&dir.join("mean/summary.json"));
    let buildings = &summary["buildings"];
    assert_eq!(buildings["footprints_read"], 4, "{buildings}");
    assert_eq!(buildings["buildings_with_photos"], 3, "{buildings}");
    let photos = &buildings["photos"];
    assert_eq!(
        (&photos["inside"], &photos["line_of_sight"], &photos["nearest"], &photos["none"]),
        (&5.into(), &1.into(), &1.into(), &1.into()),
        "{buildings}"
    );
    assert_eq!(
        (&buildings["photos_unassigned"], &buildings["photos_without_position"]),
        (&1.into(), &1.into())
    );
    assert_eq!(buildings["magnetic_headings_not_used"], 1, "{buildings}");
    assert_eq!((&buildings["fusion"], &buildings["max_distance_m"]), (&"mean".into(), &30.0.into()));

    // The map: its legend counts what the summary counts (3 buildings with photos, 1 without;
    // 7 photos assigned, 1 not), and the PNG is the picture the SVG is. A copy stays in the
    // target directory for a look.
    for file in ["map.png", "map.svg"] {
        let kept = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("per_building_{file}"));
        std::fs::copy(dir.join("mean").join(file), kept).unwrap();
    }
    let svg = String::from_utf8(read(&dir.join("mean/map.svg"))).unwrap();
    // The SVG's text elements, as they read.
    let texts: Vec<&str> = svg
        .split("<text")
        .skip(1)
        .filter_map(|element| element.split_once('>')?.1.split_once("</text>").map(|(text, _)| text.trim()))
        .collect();
    for label in ["no photos (1)", "photo (7)", "unassigned (1)", "N", "Buildings by fused class"] {
        assert!(texts.contains(&label), "the map's legend lacks {label:?}: {texts:?}");
    }
    let per_class: usize = CLASSES
        .iter()
        .map(|class| {
            let row = texts.iter().find_map(|text| text.strip_prefix(&format!("{class} (")));
            let row = row.unwrap_or_else(|| panic!("no legend row for {class}: {texts:?}"));
            row.trim_end_matches(')').parse::<usize>().unwrap()
        })
        .sum();
    assert_eq!(per_class, 3, "buildings per class in the legend");
    let png = image::open(dir.join("mean/map.png")).unwrap();
    assert_eq!((png.width(), png.height()), (1100, 900));
    std::fs::copy(
        dir.join("mean/map.png"),
        Path::new(env!("CARGO_TARGET_TMPDIR")).join("per_building_map.png"),
    )
    .unwrap();

    let flags = ["--footprints", "footprints.geojson", "--footprint-id", "bid", "--fusion", "product"];
    let output = predict(dir, "product", &[&flags[..], &["--all-footprints"]].concat());
    common::assert_success(output, "rtrain predict --out --footprints --fusion product --all-footprints");
    let every = ["bldg-1", "bldg-2", "bldg-3", "bldg-4"];
    let product = matches_numpy(dir, "product", "product", true, &every);
    assert_eq!(product["geopandas_classes"][3], Value::Null, "no photos, no class: {product}");

    // The same campaign without footprints, joined to them afterwards: the same files.
    let output = predict(dir, "later", &[]);
    common::assert_success(output, "rtrain predict --out");
    assert!(!dir.join("later/buildings.geojson").exists());
    assert!(json_file(&dir.join("later/summary.json")).get("buildings").is_none());
    let plain = read(&dir.join("later/predictions.csv"));
    let output = common::rtrain(dir)
        .args(["buildings", "later", "--fusion", "product", "--all-footprints"])
        .args(&flags[..4])
        .output()
        .unwrap();
    common::assert_success(output, "rtrain buildings");
    for file in
        ["predictions.csv", "predictions.jsonl", "predictions.geojson", "buildings.geojson", "buildings.csv"]
    {
        assert!(
            read(&dir.join("later").join(file)) == read(&dir.join("product").join(file)),
            "{file} differs"
        );
    }
    assert_ne!(plain, read(&dir.join("later/predictions.csv")), "the building columns were filled");
    let later = json_file(&dir.join("later/summary.json"));
    assert_eq!(later["buildings"], json_file(&dir.join("product/summary.json"))["buildings"]);
    assert_eq!(later["classes"], serde_json::json!(CLASSES));

    // The same job again without footprints (its parts are only merged): the building files of
    // the earlier merge would describe a join this one did not make, and go.
    common::assert_success(predict(dir, "product", &[]), "rtrain predict --out, again without footprints");
    for file in ["buildings.geojson", "buildings.csv", "map.png", "map.svg"] {
        assert!(!dir.join("product").join(file).exists(), "{file} outlived the footprints");
    }
    assert!(json_file(&dir.join("product/summary.json")).get("buildings").is_none());
}

/// A footprints file that cannot be used ends `predict --out` at once, naming it, before any
/// photo is classified (no output directory, no parts); the same for `rtrain buildings`.
#[test]
fn a_bad_footprints_file_fails_before_any_photo_is_classified() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    reference(&["scene".as_ref(), dir.as_os_str()]);
    std::fs::write(dir.join("broken.geojson"), "{\"type\": \"FeatureCollection\", \"features\": [").unwrap();
    let output = predict(dir, "out", &["--footprints", "broken.geojson"]);
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("broken.geojson"), "the file is named: {stderr}");
    assert!(!dir.join("out").exists(), "nothing was classified: {stderr}");

    // Flags that need --footprints, and a distance that is no distance, are usage errors.
    for flags in
        [&["--fusion", "product"][..], &["--footprints", "footprints.geojson", "--max-distance", "0"]]
    {
        let output = predict(dir, "out", flags);
        assert_eq!(output.status.code(), Some(2), "{flags:?}: {output:?}");
    }
    let missing =
        common::rtrain(dir).args(["buildings", "nowhere", "--footprints", "footprints.geojson"]).output();
    let missing = missing.unwrap();
    assert_eq!(missing.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("nowhere/summary.json"), "{missing:?}");
}
