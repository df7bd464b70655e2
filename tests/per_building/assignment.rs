//! Each photo's building as geopandas and shapely find it (tests/reference/footprints_reference.py):
//! on a generated neighbourhood of 2,269 footprints (row houses sharing walls, courtyard
//! buildings with holes, house + garage MultiPolygons, rotated and irregular shapes, overlaps, a
//! duplicate), 700 photos without a heading must get geopandas' `sjoin(within)` then
//! `sjoin_nearest(max_distance=30)` in the same plane, and 350 with a heading shapely's first
//! intersection of their line of sight, photo for photo. The same footprints as a BRAILS++
//! inventory export and as GDAL converts FEMA's and Microsoft's must read with their ids and give
//! every photo the same building.

use std::path::Path;

use rtrain::predict::assign::{Assigner, AssignmentKind};
use rtrain::predict::footprints::Footprints;

use crate::common;

const MAX_DISTANCE_M: f64 = 30.0;

#[derive(serde::Deserialize)]
struct Reference {
    origin_latitude: f64,
    origin_longitude: f64,
    crs: String,
    photos: Vec<ReferencePhoto>,
}

#[derive(serde::Deserialize)]
struct ReferencePhoto {
    photo: String,
    footprint: Option<usize>,
    kind: AssignmentKind,
    distance_m: Option<f64>,
}

fn reference(dir: &Path) -> Reference {
    let footprints = dir.join("footprints.geojson");
    let photos = dir.join("photos.csv");
    let out = dir.join("reference.json");
    common::run_python("footprints_reference.py", &["generate".as_ref(), dir.as_os_str()]);
    common::run_python(
        "footprints_reference.py",
        &[
            "assign".as_ref(),
            footprints.as_os_str(),
            photos.as_os_str(),
            out.as_os_str(),
            "--max-distance".as_ref(),
            MAX_DISTANCE_M.to_string().as_ref(),
        ],
    );
    serde_json::from_slice(&std::fs::read(out).unwrap()).unwrap()
}

#[test]
fn assignment_equals_geopandas_and_shapely_photo_for_photo() {
    let dir = tempfile::tempdir().unwrap();
    let reference = reference(dir.path());
    let footprints = Footprints::read(&dir.path().join("footprints.geojson"), "id").unwrap();
    assert!(footprints.items.len() >= 2000, "{} footprints", footprints.items.len());
    let assigner = Assigner::new(&footprints, MAX_DISTANCE_M);
    let projection = assigner.projection();
    assert_eq!(
        (projection.origin_latitude, projection.origin_longitude),
        (reference.origin_latitude, reference.origin_longitude),
        "the plane's centre"
    );
    assert_eq!(projection.proj_string(), reference.crs);

    let photos = common::csv_rows(&dir.path().join("photos.csv"));
    assert_eq!(photos.len(), reference.photos.len());
    let mut mismatches = Vec::new();
    let mut worst = [0.0f64; 2];
    let mut counts = std::collections::BTreeMap::new();
    for (photo, expected) in photos.iter().zip(&reference.photos) {
        assert_eq!(photo["photo"], expected.photo);
        let heading = (!photo["heading"].is_empty()).then(|| photo["heading"].parse::<f64>().unwrap());
        let latitude: f64 = photo["latitude"].parse().unwrap();
        let longitude: f64 = photo["longitude"].parse().unwrap();
        let got = assigner.assign(latitude, longitude, heading);
        *counts.entry((heading.is_some(), photo["case"].clone(), expected.kind)).or_insert(0) += 1;
        let distance_error = match (got.distance_m, expected.distance_m) {
            (Some(a), Some(b)) => (a - b).abs(),
            (None, None) => 0.0,
            _ => f64::INFINITY,
        };
        let worst = &mut worst[usize::from(heading.is_some())];
        *worst = worst.max(distance_error);
        if got.footprint != expected.footprint || got.kind != expected.kind || distance_error > 1e-6 {
            mismatches.push(format!(
                "{} ({}): rtrain {:?} {:?} {:?}, reference {:?} {:?} {:?}",
                expected.photo,
                photo["case"],
                got.footprint,
                got.kind,
                got.distance_m,
                expected.footprint,
                expected.kind,
                expected.distance_m
            ));
        }
    }
    eprintln!("photos by (heading, case, kind): {counts:?}");
    eprintln!("largest distance difference: {:.1e} m without heading, {:.1e} m with", worst[0], worst[1]);
    assert!(
        mismatches.is_empty(),
        "{} of {} photos differ:\n{}",
        mismatches.len(),
        photos.len(),
        mismatches.join("\n")
    );

    // The data exercise every rule and the tricky places.
    let count = |heading: bool, case: &str, kind: AssignmentKind| {
        counts.get(&(heading, case.to_string(), kind)).copied().unwrap_or(0)
    };
    let without_heading: usize = counts.iter().filter(|(key, _)| !key.0).map(|(_, n)| n).sum();
    assert!(without_heading >= 500, "{without_heading} photos without a heading");
    assert!(count(false, "hole", AssignmentKind::Nearest) >= 50, "courtyard photos");
    assert!(count(false, "corner", AssignmentKind::Inside) >= 50, "photos on shared corners");
    assert!(count(false, "far", AssignmentKind::None) >= 10, "photos beyond the reach");
    assert!(count(false, "near", AssignmentKind::Nearest) >= 50, "photos near a building");
    assert!(count(true, "heading", AssignmentKind::LineOfSight) >= 100, "photos looking at a building");
    assert!(count(true, "heading", AssignmentKind::Nearest) >= 20, "photos looking past the buildings");

    // The same footprints as BRAILS++ exports them and as GDAL converts FEMA's and Microsoft's:
    // the ids where each keeps them, the same buildings for every photo.
    for (file, id_key, first_id) in [
        ("brails.geojson", "id", "bldg-0"),
        ("fema.geojson", "BUILD_ID", "1000"),
        ("microsoft.geojson", "id", "0"),
    ] {
        let variant = Footprints::read(&dir.path().join(file), id_key).unwrap();
        assert_eq!(variant.items.len(), footprints.items.len(), "{file}");
        assert_eq!(variant.items[0].id, first_id, "{file}");
        let variant_assigner = Assigner::new(&variant, MAX_DISTANCE_M);
        for photo in &photos {
            let heading = (!photo["heading"].is_empty()).then(|| photo["heading"].parse::<f64>().unwrap());
            let (latitude, longitude) =
                (photo["latitude"].parse().unwrap(), photo["longitude"].parse().unwrap());
            let (a, b) = (
                assigner.assign(latitude, longitude, heading),
                variant_assigner.assign(latitude, longitude, heading),
            );
            assert_eq!((a.footprint, a.kind), (b.footprint, b.kind), "{file}: photo {}", photo["photo"]);
        }
    }
}
