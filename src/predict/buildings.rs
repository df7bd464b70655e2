//! Per building (`predict --footprints`, `rtrain buildings`): each classified, positioned
//! photo given its building by [`super::assign`], each building's photos fused into one
//! estimate, and `buildings.geojson` (RFC 7946) and `buildings.csv` (RFC 4180) written with
//! one row per footprint that has photos (every footprint with `--all-footprints`), as
//! BRAILS++ and pelicun count assets.
//!
//! Fusion is over the probabilities as the prediction files print them (the f64 of each f32's
//! shortest decimal), so that anyone recomputing a building from `predictions.jsonl` gets the
//! same numbers. They are the model's calibrated probabilities when the model is calibrated
//! (`rtrain calibrate`): the temperature is applied before a record is written.
//! - `mean` (the default): the mean per class.
//! - `product`: the normalised product per class, the rule for independent evidence, summed
//!   in log space so that hundreds of photos do not underflow. A class one photo gives
//!   probability 0 is ruled out (0 after fusion). When every class is ruled out by some photo
//!   the photos contradict each other outright and the product is 0/0: that building falls
//!   back to the mean, says so in its `fused_by` column, and the summary counts it.
//!
//! The class is the fused argmax, a tie going to the first class in the model's order; the
//! spread per class is the largest minus the smallest photo probability (0 for one photo).
//!
//! Every byte written is a function of the records and the footprints, in their order, so
//! the outputs are the same at any world size and for a resumed job.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::assign::{Assigner, Assignment, AssignmentKind};
use super::footprints::{FootprintError, Footprints};
use super::map::{self, MapFootprint, MapPhoto};
use super::outputs::{decimal, neutralised, Record};
use crate::plot::PlotError;
use crate::util::files::{write_atomic, FileError};

/// `buildings.geojson`.
pub const GEOJSON_FILE: &str = "buildings.geojson";
/// `buildings.csv`.
pub const CSV_FILE: &str = "buildings.csv";

/// How a building's photos become one estimate.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Fusion {
    /// The mean of the photos' probabilities.
    #[default]
    Mean,
    /// The normalised product of the photos' probabilities (independent evidence).
    Product,
}

impl Fusion {
    fn as_str(self) -> &'static str {
        match self {
            Fusion::Mean => "mean",
            Fusion::Product => "product",
        }
    }
}

/// What `--footprints` and its flags ask for.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// The footprints file (GeoJSON).
    pub footprints: PathBuf,
    /// The property holding each footprint's id.
    pub id_key: String,
    /// How far from a photo its building may be, in metres.
    pub max_distance_m: f64,
    pub fusion: Fusion,
    /// Write every footprint, those without photos too.
    pub all_footprints: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum BuildingsError {
    #[error(transparent)]
    Footprints(#[from] FootprintError),
    #[error("{path}: {found} probabilities for the model's {classes} classes")]
    Probabilities { path: String, found: usize, classes: usize },
    #[error("{path}: a probability that is not a number in [0, 1] ({value})")]
    NotAProbability { path: String, value: f32 },
    #[error("writing {file}: {source}")]
    Csv { file: &'static str, source: csv::Error },
    #[error("writing {file}: {source}")]
    Json { file: &'static str, source: serde_json::Error },
    #[error(transparent)]
    Write(#[from] FileError),
    #[error("drawing the map: {0}")]
    Map(#[from] PlotError),
}

/// The footprints of a request, read and indexed: done before any photo is classified, so
/// that a bad footprints file fails a job at once.
pub struct Prepared {
    pub request: Request,
    pub footprints: Footprints,
    assigner: Assigner,
}

impl Prepared {
    pub fn read(request: &Request) -> Result<Prepared, FootprintError> {
        let footprints = Footprints::read(&request.footprints, &request.id_key)?;
        let assigner = Assigner::new(&footprints, request.max_distance_m);
        Ok(Prepared { request: request.clone(), footprints, assigner })
    }
}

/// Photos by how they were assigned.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PhotoCounts {
    pub inside: usize,
    pub line_of_sight: usize,
    pub nearest: usize,
    pub none: usize,
}

impl PhotoCounts {
    fn add(&mut self, kind: AssignmentKind) {
        match kind {
            AssignmentKind::Inside => self.inside += 1,
            AssignmentKind::LineOfSight => self.line_of_sight += 1,
            AssignmentKind::Nearest => self.nearest += 1,
            AssignmentKind::None => self.none += 1,
        }
    }
}

/// `summary.json`'s `buildings`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub footprints: PathBuf,
    pub id_key: String,
    pub footprints_read: usize,
    pub max_distance_m: f64,
    pub fusion: Fusion,
    pub all_footprints: bool,
    /// Footprints with at least one photo.
    pub buildings_with_photos: usize,
    /// Classified photos with a position, by how each was assigned.
    pub photos: PhotoCounts,
    /// Of those, the photos no footprint was found for (`photos.none`).
    pub photos_unassigned: usize,
    /// Classified photos without a position: not assigned, no assignment columns.
    pub photos_without_position: usize,
    /// Photos whose heading is relative to magnetic north (or an unknown reference): their
    /// line of sight is not used, the declination being unknown.
    pub magnetic_headings_not_used: usize,
    /// Buildings whose product was 0 for every class, fused by the mean instead.
    pub product_fallbacks: usize,
}

/// Each record's building, as the assignment step found it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Assigned {
    /// For each record, the footprint it was assigned to.
    pub footprint_of: Vec<Option<usize>>,
    pub photos: PhotoCounts,
    pub without_position: usize,
    pub magnetic_headings_not_used: usize,
}

/// The heading to look along, when it is relative to true north: `T`, or no reference
/// (read as true north). A magnetic (`M`) heading is not used.
fn true_heading(record: &Record) -> Result<Option<f64>, ()> {
    match (record.heading, record.heading_ref.as_deref()) {
        (None, _) => Ok(None),
        (Some(heading), None) => Ok(Some(heading)),
        (Some(heading), Some(reference)) if reference.trim().eq_ignore_ascii_case("T") => Ok(Some(heading)),
        (Some(_), Some(_)) => Err(()),
    }
}

/// Gives each classified, positioned record its building through `assign` (latitude,
/// longitude, true heading) and sets its `building_id`, `assignment` and `distance_m`; every
/// other record's are cleared (a record read back from an earlier run may carry them).
pub fn assign_records(
    records: &mut [Record],
    footprints: &Footprints,
    assign: impl Fn(f64, f64, Option<f64>) -> Assignment,
) -> Assigned {
    let mut assigned = Assigned { footprint_of: vec![None; records.len()], ..Assigned::default() };
    for (record, footprint_of) in records.iter_mut().zip(&mut assigned.footprint_of) {
        (record.building_id, record.assignment, record.distance_m) = (None, None, None);
        if record.class.is_none() {
            continue;
        }
        let (Some(latitude), Some(longitude)) = (record.latitude, record.longitude) else {
            assigned.without_position += 1;
            continue;
        };
        let heading = true_heading(record).unwrap_or_else(|()| {
            assigned.magnetic_headings_not_used += 1;
            None
        });
        let assignment = assign(latitude, longitude, heading);
        // A footprint index the footprints do not hold is no building.
        let footprint = assignment.footprint.filter(|&i| i < footprints.items.len());
        let kind = if footprint.is_some() { assignment.kind } else { AssignmentKind::None };
        assigned.photos.add(kind);
        record.assignment = Some(kind);
        record.building_id = footprint.map(|i| footprints.items[i].id.clone());
        record.distance_m = footprint.and(assignment.distance_m);
        *footprint_of = footprint;
    }
    assigned
}

/// The mean per class of `photos` (each a probability per class; at least one photo).
pub fn fuse_mean(photos: &[&[f64]]) -> Vec<f64> {
    let classes = photos.first().map_or(0, |p| p.len());
    let mut sum = vec![0.0; classes];
    for photo in photos {
        sum.iter_mut().zip(photo.iter()).for_each(|(s, p)| *s += p);
    }
    sum.iter().map(|s| s / photos.len() as f64).collect()
}

/// The normalised product per class of `photos`, computed from the sums of logarithms (no
/// underflow however many photos). A class some photo gives 0 is 0. None when every class is
/// 0 (the photos rule out every class between them).
pub fn fuse_product(photos: &[&[f64]]) -> Option<Vec<f64>> {
    let classes = photos.first().map_or(0, |p| p.len());
    let mut logs = vec![0.0f64; classes];
    for photo in photos {
        logs.iter_mut().zip(photo.iter()).for_each(|(l, p)| *l += p.ln());
    }
    let top = logs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if top == f64::NEG_INFINITY {
        return None;
    }
    let scaled: Vec<f64> = logs.iter().map(|l| (l - top).exp()).collect();
    let total: f64 = scaled.iter().sum();
    Some(scaled.iter().map(|s| s / total).collect())
}

/// The first index of the largest value.
fn argmax(values: &[f64]) -> usize {
    let mut best = 0;
    for (i, &value) in values.iter().enumerate() {
        if value > values[best] {
            best = i;
        }
    }
    best
}

/// A building's fused estimate.
#[derive(Debug, Clone, PartialEq)]
pub struct Estimate {
    /// Per class, in the model's order.
    pub probabilities: Vec<f64>,
    pub class: usize,
    pub probability: f64,
    /// Per class: the largest minus the smallest photo probability.
    pub spread: Vec<f64>,
    /// The rule that gave the probabilities (the mean where the product fell back to it).
    pub fused_by: Fusion,
}

/// The fused estimate of `photos`' probabilities (at least one photo).
pub fn estimate(photos: &[&[f64]], fusion: Fusion) -> Estimate {
    let (probabilities, fused_by) = match fusion {
        Fusion::Mean => (fuse_mean(photos), Fusion::Mean),
        Fusion::Product => match fuse_product(photos) {
            Some(product) => (product, Fusion::Product),
            None => (fuse_mean(photos), Fusion::Mean),
        },
    };
    let class = argmax(&probabilities);
    let classes = probabilities.len();
    let spread = (0..classes)
        .map(|k| {
            let values = photos.iter().map(|p| p[k]);
            values.clone().fold(f64::NEG_INFINITY, f64::max) - values.fold(f64::INFINITY, f64::min)
        })
        .collect();
    Estimate { probability: probabilities[class], probabilities, class, spread, fused_by }
}

/// One footprint in the outputs.
#[derive(Debug, Clone, PartialEq)]
pub struct Building {
    /// The index of its footprint.
    pub footprint: usize,
    /// The indices of its photos' records, in input order.
    pub photos: Vec<usize>,
    /// None without photos.
    pub estimate: Option<Estimate>,
}

/// A record's probabilities as the prediction files print them.
fn printed_probabilities(record: &Record) -> Vec<f64> {
    record.probabilities.iter().map(|&p| decimal(p)).collect()
}

/// Checks that every record that takes part holds one probability in [0, 1] per class.
fn check_probabilities(
    records: &[Record],
    footprint_of: &[Option<usize>],
    classes: usize,
) -> Result<(), BuildingsError> {
    for (record, _) in records.iter().zip(footprint_of).filter(|(_, f)| f.is_some()) {
        if record.probabilities.len() != classes {
            return Err(BuildingsError::Probabilities {
                path: record.path.clone(),
                found: record.probabilities.len(),
                classes,
            });
        }
        if let Some(&value) = record.probabilities.iter().find(|p| !(0.0..=1.0).contains(*p)) {
            return Err(BuildingsError::NotAProbability { path: record.path.clone(), value });
        }
    }
    Ok(())
}

/// The buildings, in the footprints' order: those with photos, or with `all` every one of
/// the `footprints`. `footprint_of` gives each record's footprint.
pub fn fuse_buildings(
    records: &[Record],
    footprint_of: &[Option<usize>],
    footprints: usize,
    fusion: Fusion,
    all: bool,
) -> Vec<Building> {
    let mut photos: Vec<Vec<usize>> = vec![Vec::new(); footprints];
    for (index, footprint) in footprint_of.iter().enumerate() {
        if let Some(&footprint) = footprint.as_ref().filter(|&&f| f < footprints) {
            photos[footprint].push(index);
        }
    }
    photos
        .into_iter()
        .enumerate()
        .filter(|(_, photos)| all || !photos.is_empty())
        .map(|(footprint, photos)| {
            let probabilities: Vec<Vec<f64>> =
                photos.iter().map(|&i| printed_probabilities(&records[i])).collect();
            let rows: Vec<&[f64]> = probabilities.iter().map(Vec::as_slice).collect();
            let estimate = (!rows.is_empty()).then(|| estimate(&rows, fusion));
            Building { footprint, photos, estimate }
        })
        .collect()
}

/// The per-building result of a request over a campaign's records.
pub struct Fused {
    pub buildings: Vec<Building>,
    pub summary: Summary,
    assigned: Assigned,
}

/// Assigns `records` (setting their building columns) and fuses each building's photos.
pub fn assign_and_fuse(
    prepared: &Prepared,
    records: &mut [Record],
    classes: &[String],
) -> Result<Fused, BuildingsError> {
    let assigned = assign_records(records, &prepared.footprints, |latitude, longitude, heading| {
        prepared.assigner.assign(latitude, longitude, heading)
    });
    check_probabilities(records, &assigned.footprint_of, classes.len())?;
    let request = &prepared.request;
    let count = prepared.footprints.items.len();
    let buildings =
        fuse_buildings(records, &assigned.footprint_of, count, request.fusion, request.all_footprints);
    let with_photos = buildings.iter().filter(|b| !b.photos.is_empty()).count();
    let summary = Summary {
        footprints: request.footprints.clone(),
        id_key: request.id_key.clone(),
        footprints_read: count,
        max_distance_m: request.max_distance_m,
        fusion: request.fusion,
        all_footprints: request.all_footprints,
        buildings_with_photos: with_photos,
        photos: assigned.photos.clone(),
        photos_unassigned: assigned.photos.none,
        photos_without_position: assigned.without_position,
        magnetic_headings_not_used: assigned.magnetic_headings_not_used,
        product_fallbacks: buildings
            .iter()
            .filter_map(|b| b.estimate.as_ref())
            .filter(|e| e.fused_by != request.fusion)
            .count(),
    };
    Ok(Fused { buildings, summary, assigned })
}

/// Writes `buildings.geojson`, `buildings.csv` and the map into `out`, each atomically.
pub fn write(
    out: &Path,
    prepared: &Prepared,
    fused: &Fused,
    records: &[Record],
    classes: &[String],
) -> Result<(), BuildingsError> {
    let table = Table::new(&prepared.footprints, classes);
    let geojson = table
        .geojson_bytes(&fused.buildings, records)
        .map_err(|source| BuildingsError::Json { file: GEOJSON_FILE, source })?;
    write_atomic(&out.join(GEOJSON_FILE), &geojson)?;
    let csv = table
        .csv_bytes(&fused.buildings, records)
        .map_err(|source| BuildingsError::Csv { file: CSV_FILE, source })?;
    write_atomic(&out.join(CSV_FILE), &csv)?;
    draw_map(out, prepared, fused, records, classes)
}

/// The map: every footprint (filled by its class where it has photos) and every positioned,
/// classified photo.
fn draw_map(
    out: &Path,
    prepared: &Prepared,
    fused: &Fused,
    records: &[Record],
    classes: &[String],
) -> Result<(), BuildingsError> {
    let projection = prepared.assigner.projection();
    let mut class_of: Vec<Option<usize>> = vec![None; prepared.footprints.items.len()];
    for building in &fused.buildings {
        class_of[building.footprint] = building.estimate.as_ref().map(|e| e.class);
    }
    let footprints: Vec<MapFootprint> = prepared
        .footprints
        .items
        .iter()
        .zip(class_of)
        .map(|(footprint, class)| MapFootprint {
            rings: footprint
                .geometry
                .0
                .iter()
                .flat_map(|polygon| std::iter::once(polygon.exterior()).chain(polygon.interiors()))
                .map(|ring| ring.0.iter().map(|c| projection.to_metres(c.x, c.y)).collect())
                .collect(),
            class,
        })
        .collect();
    let photos: Vec<MapPhoto> = records
        .iter()
        .zip(&fused.assigned.footprint_of)
        .filter(|(record, _)| record.assignment.is_some())
        .filter_map(|(record, footprint)| {
            let at = projection.to_metres(record.longitude?, record.latitude?);
            Some(MapPhoto { at, assigned: footprint.is_some() })
        })
        .collect();
    map::draw(out, classes, &footprints, &photos)?;
    Ok(())
}

/// The columns of the building outputs: the footprints' own properties (the union, in the
/// order first met), then ours. A footprint property named as one of ours is kept under
/// `footprint_<name>` (prefixed again until the name is free), so that ours always mean the
/// same; the id key's own value is written as read, in our place.
struct Table<'a> {
    footprints: &'a Footprints,
    classes: &'a [String],
    /// Each footprint property's name, and the name it is written under.
    own: Vec<(String, String)>,
}

impl<'a> Table<'a> {
    fn new(footprints: &'a Footprints, classes: &'a [String]) -> Table<'a> {
        let reserved: BTreeSet<String> = ours(&footprints.id_key, classes).into_iter().collect();
        let mut names: Vec<String> = Vec::new();
        for footprint in &footprints.items {
            for key in footprint.properties.keys() {
                if *key != footprints.id_key && !names.contains(key) {
                    names.push(key.clone());
                }
            }
        }
        let mut taken: BTreeSet<String> = reserved.iter().chain(&names).cloned().collect();
        let own = names
            .iter()
            .map(|name| {
                let mut written = name.clone();
                if reserved.contains(name) {
                    while taken.contains(&written) {
                        written = format!("footprint_{written}");
                    }
                    taken.insert(written.clone());
                }
                (name.clone(), written)
            })
            .collect();
        Table { footprints, classes, own }
    }

    /// Every column after the footprints' own, in order.
    fn header(&self) -> Vec<String> {
        let mut header: Vec<String> = self.own.iter().map(|(_, written)| written.clone()).collect();
        header.extend(ours(&self.footprints.id_key, self.classes));
        header
    }

    /// A building's values, one per column of [`Table::header`].
    fn values(&self, building: &Building, records: &[Record]) -> Vec<Value> {
        let footprint = &self.footprints.items[building.footprint];
        let mut values: Vec<Value> = self
            .own
            .iter()
            .map(|(name, _)| footprint.properties.get(name).cloned().unwrap_or(Value::Null))
            .collect();
        let id = footprint.properties.get(&self.footprints.id_key).cloned();
        values.push(id.unwrap_or_else(|| footprint.id.clone().into()));
        values.push(building.photos.len().into());
        values.push(building.photos.iter().map(|&i| Value::from(records[i].path.clone())).collect());
        let estimate = building.estimate.as_ref();
        values.push(estimate.map(|e| e.fused_by.as_str()).into());
        values.push(estimate.map(|e| self.classes[e.class].clone()).into());
        values.push(estimate.map(|e| e.probability).into());
        let per_class = |values: &mut Vec<Value>, of: fn(&Estimate) -> &Vec<f64>| {
            values.extend((0..self.classes.len()).map(|k| estimate.map(|e| of(e)[k]).into()));
        };
        per_class(&mut values, |e| &e.probabilities);
        per_class(&mut values, |e| &e.spread);
        values
    }

    /// `buildings.geojson`: a FeatureCollection, one Feature per building with its footprint
    /// (a Polygon where it is one polygon, else a MultiPolygon) and the columns as properties.
    fn geojson_bytes(
        &self,
        buildings: &[Building],
        records: &[Record],
    ) -> Result<Vec<u8>, serde_json::Error> {
        let header = self.header();
        let features: Vec<Value> = buildings
            .iter()
            .map(|building| {
                let properties: Map<String, Value> =
                    header.iter().cloned().zip(self.values(building, records)).collect();
                serde_json::json!({
                    "type": "Feature",
                    "geometry": geometry(&self.footprints.items[building.footprint].geometry),
                    "properties": properties,
                })
            })
            .collect();
        let mut bytes =
            serde_json::to_vec(&serde_json::json!({ "type": "FeatureCollection", "features": features }))?;
        bytes.push(b'\n');
        Ok(bytes)
    }

    /// `buildings.csv`: the same columns flat: photo paths joined by `|`, nested property
    /// values as compact JSON, absent values empty, text cells neutralised against CSV
    /// injection as `predictions.csv`'s are.
    fn csv_bytes(&self, buildings: &[Building], records: &[Record]) -> Result<Vec<u8>, csv::Error> {
        let mut writer = csv::Writer::from_writer(Vec::new());
        writer.write_record(self.header())?;
        for building in buildings {
            let row: Vec<String> = self.values(building, records).iter().map(csv_cell).collect();
            writer.write_record(&row)?;
        }
        writer.into_inner().map_err(|e| csv::Error::from(e.into_error()))
    }
}

/// Our columns: the id (under the id key), `photos`, `photo_paths`, `fused_by`, `class`,
/// `probability`, then `probability_<class>` and `spread_<class>` per class.
fn ours(id_key: &str, classes: &[String]) -> Vec<String> {
    let mut names: Vec<String> =
        [id_key, "photos", "photo_paths", "fused_by", "class", "probability"].map(String::from).to_vec();
    names.extend(classes.iter().map(|class| format!("probability_{class}")));
    names.extend(classes.iter().map(|class| format!("spread_{class}")));
    names
}

fn csv_cell(value: &Value) -> String {
    match value {
        Value::Null => String::new(),
        Value::String(text) => neutralised(text),
        Value::Number(_) | Value::Bool(_) => value.to_string(),
        Value::Array(items) if items.iter().all(Value::is_string) => {
            neutralised(&items.iter().filter_map(Value::as_str).collect::<Vec<_>>().join("|"))
        }
        Value::Array(_) | Value::Object(_) => neutralised(&value.to_string()),
    }
}

/// A footprint as GeoJSON: rings of [longitude, latitude], outer ring first.
fn geometry(footprint: &geo::MultiPolygon<f64>) -> Value {
    let polygon = |polygon: &geo::Polygon<f64>| -> Value {
        std::iter::once(polygon.exterior())
            .chain(polygon.interiors())
            .map(|ring| ring.0.iter().map(|c| Value::from(vec![c.x, c.y])).collect::<Value>())
            .collect()
    };
    match footprint.0.as_slice() {
        [one] => serde_json::json!({ "type": "Polygon", "coordinates": polygon(one) }),
        many => serde_json::json!({
            "type": "MultiPolygon",
            "coordinates": many.iter().map(polygon).collect::<Vec<_>>(),
        }),
    }
}

/// The summary in a line, for the log.
pub fn describe(summary: &Summary) -> String {
    let photos = &summary.photos;
    format!(
        "{} of {} footprints with photos (photos inside {}, by line of sight {}, nearest {}, none {}), fused by the {}",
        summary.buildings_with_photos,
        summary.footprints_read,
        photos.inside,
        photos.line_of_sight,
        photos.nearest,
        photos.none,
        summary.fusion.as_str()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn classes() -> Vec<String> {
        ["C0", "C2", "C4"].map(String::from).to_vec()
    }

    fn close(a: &[f64], b: &[f64]) -> bool {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-12)
    }

    #[test]
    fn mean_and_product_by_hand() {
        let photos: [&[f64]; 2] = [&[0.5, 0.25, 0.25], &[0.25, 0.25, 0.5]];
        assert!(close(&fuse_mean(&photos), &[0.375, 0.25, 0.375]));
        // Products 0.125, 0.0625, 0.125 over 0.3125.
        assert!(close(&fuse_product(&photos).unwrap(), &[0.4, 0.2, 0.4]));
        // A zero rules a class out; zeros over every class leave no product.
        let zero: [&[f64]; 2] = [&[0.0, 0.5, 0.5], &[0.5, 0.4, 0.1]];
        assert!(close(&fuse_product(&zero).unwrap(), &[0.0, 0.8, 0.2]));
        let contradiction: [&[f64]; 2] = [&[0.0, 1.0], &[1.0, 0.0]];
        assert_eq!(fuse_product(&contradiction), None);
        let fallback = estimate(&contradiction, Fusion::Product);
        assert_eq!((fallback.fused_by, fallback.probabilities.clone()), (Fusion::Mean, vec![0.5, 0.5]));
        // The tie goes to the first class.
        assert_eq!((fallback.class, fallback.probability), (0, 0.5));
        assert_eq!(fallback.spread, vec![1.0, 1.0]);
    }

    #[test]
    fn the_product_of_500_photos_does_not_underflow() {
        let photo: &[f64] = &[0.1, 0.2, 0.7];
        let photos = vec![photo; 500];
        // 0.7^500 is about 1e-78 and 0.1^500 is 1e-500, below f64's range: a direct product
        // would be 0 for C0 and C2 alike, but their ratio to C4 is known.
        assert_eq!(photos.iter().map(|p| p[0]).product::<f64>(), 0.0);
        let fused = fuse_product(&photos).unwrap();
        assert_eq!(fused[2], 1.0);
        let expected = (500.0 * (0.2f64 / 0.7).ln()).exp();
        // 500 logarithms summed: the rounding of each adds up, relative to the result.
        assert!((fused[1] - expected).abs() <= 1e-10 * expected, "{} vs {expected}", fused[1]);
        // (1/7)^500 is below f64's range: C0 is 0 beside C4's 1.
        assert_eq!(fused[0], 0.0);
        let mean = estimate(&photos, Fusion::Mean);
        assert!(close(&mean.probabilities, photo) && mean.spread == vec![0.0; 3]);
    }

    #[test]
    fn ties_go_to_the_first_class_and_spread_is_max_minus_min() {
        let photos: [&[f64]; 3] = [&[0.2, 0.4, 0.4], &[0.3, 0.35, 0.35], &[0.1, 0.45, 0.45]];
        let fused = estimate(&photos, Fusion::Mean);
        assert_eq!(fused.class, 1);
        assert!(close(&fused.spread, &[0.2, 0.1, 0.1]));
        assert_eq!(argmax(&[0.25, 0.25, 0.5, 0.5]), 2);
    }

    fn photo(path: &str, probabilities: &[f64], at: Option<(f64, f64)>) -> Record {
        let mut record = Record::new(path.into(), None, Some((4, 3)), None);
        record.predicted(&classes(), probabilities, 0, None);
        (record.latitude, record.longitude) = (at.map(|a| a.0), at.map(|a| a.1));
        record
    }

    fn footprints(ids: &[&str]) -> Footprints {
        let square = |x: f64| {
            geo::MultiPolygon(vec![geo::Polygon::new(
                geo::LineString::from(vec![(x, 0.0), (x + 1.0, 0.0), (x + 1.0, 1.0), (x, 1.0), (x, 0.0)]),
                vec![],
            )])
        };
        let items = ids
            .iter()
            .enumerate()
            .map(|(i, id)| {
                let mut properties = Map::new();
                properties.insert("height".into(), (3.5 * i as f64).into());
                properties.insert("class".into(), "residential".into());
                if i == 1 {
                    properties.insert("footprint_class".into(), "=taken".into());
                }
                super::super::footprints::Footprint {
                    id: id.to_string(),
                    geometry: square(i as f64 * 2.0),
                    properties,
                }
            })
            .collect();
        Footprints { path: "f.geojson".into(), id_key: "bid".into(), items }
    }

    /// The assignment as a stub: a photo at latitude `f` belongs to footprint `f` (negative:
    /// none); headings are recorded to see which were passed on.
    fn assign_all(records: &mut [Record], footprints: &Footprints) -> (Assigned, Vec<Option<f64>>) {
        let seen = std::cell::RefCell::new(Vec::new());
        let assigned = assign_records(records, footprints, |latitude, _, heading| {
            seen.borrow_mut().push(heading);
            let footprint = (latitude >= 0.0).then_some(latitude as usize);
            let kind = if footprint.is_some() { AssignmentKind::Nearest } else { AssignmentKind::None };
            Assignment { footprint, kind, distance_m: footprint.map(|_| 4.5) }
        });
        (assigned, seen.into_inner())
    }

    #[test]
    fn only_classified_positioned_photos_are_assigned_and_magnetic_headings_are_not_used() {
        let footprints = footprints(&["a", "b", "c"]);
        let mut records = vec![
            photo("1.jpg", &[0.5, 0.25, 0.25], Some((1.0, 0.0))),
            photo("2.jpg", &[0.25, 0.25, 0.5], Some((1.0, 0.0))),
            photo("3.jpg", &[0.2, 0.2, 0.6], None),
            photo("4.jpg", &[0.2, 0.2, 0.6], Some((-1.0, 0.0))),
            photo("5.jpg", &[0.6, 0.2, 0.2], Some((2.0, 0.0))),
            Record::new("bad.jpg".into(), None, None, None),
        ];
        (records[0].heading, records[0].heading_ref) = (Some(90.0), Some("M".into()));
        (records[1].heading, records[1].heading_ref) = (Some(45.0), Some("T".into()));
        records[4].heading = Some(10.0);
        // Left from an earlier run: cleared.
        records[2].building_id = Some("old".into());
        let (assigned, headings) = assign_all(&mut records, &footprints);
        assert_eq!(headings, vec![None, Some(45.0), None, Some(10.0)]);
        assert_eq!(assigned.footprint_of, vec![Some(1), Some(1), None, None, Some(2), None]);
        assert_eq!(assigned.photos, PhotoCounts { inside: 0, line_of_sight: 0, nearest: 3, none: 1 });
        assert_eq!((assigned.without_position, assigned.magnetic_headings_not_used), (1, 1));
        assert_eq!(records[1].building_id.as_deref(), Some("b"));
        assert_eq!(
            (records[1].assignment, records[1].distance_m),
            (Some(AssignmentKind::Nearest), Some(4.5))
        );
        assert_eq!((records[2].building_id.clone(), records[2].assignment), (None, None));
        assert_eq!((records[3].assignment, records[3].distance_m), (Some(AssignmentKind::None), None));
        assert_eq!(records[5].assignment, None);

        let buildings = fuse_buildings(&records, &assigned.footprint_of, 3, Fusion::Mean, false);
        assert_eq!(
            buildings.iter().map(|b| (b.footprint, b.photos.clone())).collect::<Vec<_>>(),
            vec![(1, vec![0, 1]), (2, vec![4])]
        );
        assert!(close(&buildings[0].estimate.as_ref().unwrap().probabilities, &[0.375, 0.25, 0.375]));
        let all = fuse_buildings(&records, &assigned.footprint_of, 3, Fusion::Product, true);
        assert_eq!((all.len(), all[0].estimate.clone()), (3, None));
    }

    #[test]
    fn the_outputs_keep_the_footprints_properties_beside_ours() {
        let footprints = footprints(&["a", "=b"]);
        let mut records = vec![
            photo("-1.jpg", &[0.1, 0.2, 0.7], Some((1.0, 0.0))),
            photo("2.jpg", &[0.3, 0.2, 0.5], Some((1.0, 0.0))),
        ];
        let (assigned, _) = assign_all(&mut records, &footprints);
        let buildings = fuse_buildings(&records, &assigned.footprint_of, 2, Fusion::Mean, true);
        let classes = classes();
        let table = Table::new(&footprints, &classes);
        // The footprints' own `class` (their properties come in key order) is written under a
        // name of its own, past their `footprint_class`.
        let header = table.header();
        assert_eq!(header[..4], ["footprint_footprint_class", "height", "footprint_class", "bid"]);
        let geojson: Value =
            serde_json::from_slice(&table.geojson_bytes(&buildings, &records).unwrap()).unwrap();
        let features = geojson["features"].as_array().unwrap();
        assert_eq!(features.len(), 2);
        assert_eq!(features[0]["geometry"]["type"], "Polygon");
        assert_eq!(features[0]["geometry"]["coordinates"][0][1], serde_json::json!([1.0, 0.0]));
        let second = &features[1]["properties"];
        assert_eq!((second["bid"].clone(), second["photos"].clone()), ("=b".into(), 2.into()));
        assert_eq!(second["photo_paths"], serde_json::json!(["-1.jpg", "2.jpg"]));
        assert_eq!(second["class"], "C4");
        assert_eq!(second["footprint_footprint_class"], "residential");
        assert_eq!(second["footprint_class"], "=taken");
        assert_eq!(second["probability_C4"], 0.6);
        assert_eq!(features[0]["properties"]["class"], Value::Null);
        let csv = table.csv_bytes(&buildings, &records).unwrap();
        let mut reader = csv::Reader::from_reader(csv.as_slice());
        assert_eq!(reader.headers().unwrap().iter().collect::<Vec<_>>(), header);
        let rows: Vec<Vec<String>> =
            reader.records().map(|r| r.unwrap().iter().map(String::from).collect()).collect();
        let none = ["residential", "0.0", "", "a", "0"].into_iter().chain([""; 10]);
        assert_eq!(rows[0], none.map(String::from).collect::<Vec<_>>());
        let number = |x: f64| Value::from(x).to_string();
        let mut expected: Vec<String> =
            ["residential", "3.5", "'=taken", "'=b", "2", "'-1.jpg|2.jpg", "mean", "C4"]
                .map(String::from)
                .to_vec();
        expected.extend([0.6, 0.2, 0.2, 0.6, 0.3 - 0.1, 0.0, 0.7 - 0.5].map(number));
        assert_eq!(rows[1], expected);
    }
}
