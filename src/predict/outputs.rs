//! What `rtrain predict --out DIR` writes: one [`Record`] per input, kept as JSON lines in
//! the parts of a job and merged into `predictions.csv`, `predictions.jsonl`,
//! `predictions.geojson` (RFC 7946) and `summary.json`.
//!
//! A part ends with a seal line: the size and modification time each row's file had when it
//! was classified (so that a rerun knows which photos changed since), and a sha256 of the rows
//! and of those, checked whenever the part is read, so that a part edited or damaged since it
//! was written is never merged.
//!
//! Every byte of the three prediction files is a function of the records alone (no times, no
//! rank numbers), so they are identical at any world size and worker count.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::assign::AssignmentKind;
use crate::calibration;
use crate::data::photo::PhotoTags;
use crate::run_dir::checkpoint::Calibration;

/// One input's prediction, or why it has none.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    pub path: String,
    /// sha256 of the image's bytes (the file, or the shard member).
    pub sha256: Option<String>,
    /// The most likely class and its probability.
    pub class: Option<String>,
    pub probability: Option<f32>,
    /// Every class's probability, in the checkpoint's class order (empty for a bad image).
    pub probabilities: Vec<f32>,
    /// The `--top K` most likely classes, best first (empty unless asked).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub top: Vec<TopClass>,
    pub width: Option<u32>,
    pub height: Option<u32>,
    /// The Exif orientation tag (1-8).
    pub orientation: Option<u16>,
    pub latitude: Option<f64>,
    pub longitude: Option<f64>,
    pub altitude: Option<f64>,
    /// `GPSImgDirection`: degrees clockwise from north the camera faced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heading: Option<f64>,
    /// `GPSImgDirectionRef`: `T` (true north) or `M` (magnetic north).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heading_ref: Option<String>,
    /// `GPSHPositioningError`: the horizontal positioning error in metres.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub position_error_m: Option<f64>,
    /// Why the photo's GPS block, present, could not be read (then it has no position).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gps_problem: Option<String>,
    /// Exif `DateTimeOriginal` (+ `OffsetTimeOriginal`) as ISO 8601.
    pub capture_time: Option<String>,
    /// Why the image has no prediction.
    pub error: Option<String>,
    /// Shannon entropy (nats) of the probabilities: high where the model cannot tell.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entropy: Option<f64>,
    /// Whether the entropy is above the calibrated model's threshold (None: not calibrated).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uncertain: Option<bool>,
    /// The conformal prediction set, in class order (None: no conformal calibration).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prediction_set: Option<Vec<String>>,
    /// With `--abstain`: the set holds more than one class (or none), so no class is claimed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub abstain: Option<bool>,
    /// With `--footprints`: the id of the building the photo was assigned to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub building_id: Option<String>,
    /// With `--footprints`: how the photo was assigned (or that it was not).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub assignment: Option<AssignmentKind>,
    /// With `--footprints`: metres from the photo to its building (0 inside it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub distance_m: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TopClass {
    pub class: String,
    pub probability: f32,
}

impl Record {
    /// A record of `path` with what its file says and no prediction yet. The tags are only
    /// reported for a file whose size could be read (an image).
    pub fn new(
        path: String,
        sha256: Option<String>,
        size: Option<(u32, u32)>,
        tags: Option<&PhotoTags>,
    ) -> Record {
        let tags = tags.filter(|_| size.is_some());
        let gps = tags.and_then(|t| t.gps.as_ref());
        Record {
            path,
            sha256,
            class: None,
            probability: None,
            probabilities: Vec::new(),
            top: Vec::new(),
            width: size.map(|s| s.0),
            height: size.map(|s| s.1),
            orientation: tags.map(|t| t.orientation),
            latitude: gps.map(|g| g.latitude),
            longitude: gps.map(|g| g.longitude),
            altitude: gps.and_then(|g| g.altitude),
            heading: gps.and_then(|g| g.heading),
            heading_ref: gps.and_then(|g| g.heading_ref.clone()),
            position_error_m: gps.and_then(|g| g.horizontal_error_m),
            gps_problem: tags.and_then(|t| t.gps_problem.clone()),
            capture_time: tags.and_then(|t| t.captured.clone()),
            error: None,
            entropy: None,
            uncertain: None,
            prediction_set: None,
            abstain: None,
            building_id: None,
            assignment: None,
            distance_m: None,
        }
    }

    /// Fills in the prediction from the class probabilities (`classes` in the model's order),
    /// and what `calibration` says of them (uncertainty, the prediction set); sets and
    /// entropy are taken from the f64 probabilities, before they are stored as f32.
    pub fn predicted(
        &mut self,
        classes: &[String],
        probabilities: &[f64],
        top: usize,
        calibration: Option<&Calibration>,
    ) {
        let stored: Vec<f32> = probabilities.iter().map(|&p| p as f32).collect();
        let mut ranked: Vec<(usize, f32)> = stored.iter().copied().enumerate().collect();
        // Stable: equal probabilities keep the class order.
        ranked.sort_by(|a, b| b.1.total_cmp(&a.1));
        let (best, probability) = ranked[0];
        self.class = Some(classes[best].clone());
        self.probability = Some(probability);
        self.top = ranked
            .iter()
            .take(top)
            .map(|&(i, probability)| TopClass { class: classes[i].clone(), probability })
            .collect();
        self.probabilities = stored;
        let entropy = calibration::entropy(probabilities);
        self.entropy = Some(entropy);
        self.uncertain = calibration.map(|c| entropy > c.entropy_threshold);
        self.prediction_set = calibration.and_then(|c| c.conformal.as_ref()).map(|rule| {
            calibration::prediction_set(probabilities, rule.threshold, rule.method)
                .into_iter()
                .map(|k| classes[k].clone())
                .collect()
        });
    }

    /// The size of the prediction set, if there is one.
    pub fn set_size(&self) -> Option<usize> {
        self.prediction_set.as_ref().map(Vec::len)
    }

    /// With `--abstain`: marks a photo whose set is not a single class.
    pub fn judge_abstention(&mut self) {
        self.abstain = self.set_size().map(|size| size != 1);
    }

    pub fn has_gps(&self) -> bool {
        self.latitude.is_some() && self.longitude.is_some()
    }
}

/// `predictions.csv`: RFC 4180 (the `csv` crate quotes what needs quoting). Columns: path,
/// sha256, class, probability, `probability_<class>` per class, `top<i>_class` and
/// `top<i>_probability` for `--top K`, width, height, orientation, latitude, longitude,
/// altitude, capture_time, error, entropy, uncertain, prediction_set (class names joined by
/// `|`), set_size, abstain; empty where a value is absent. Text cells a spreadsheet would
/// run as a formula are [`neutralised`]; numbers are written as they are.
pub fn csv_bytes(records: &[Record], classes: &[String], top: usize) -> Result<Vec<u8>, csv::Error> {
    let mut writer = csv::Writer::from_writer(Vec::new());
    let mut header: Vec<String> = ["path", "sha256", "class", "probability"].map(String::from).to_vec();
    header.extend(classes.iter().map(|class| format!("probability_{class}")));
    for i in 1..=top {
        header.extend([format!("top{i}_class"), format!("top{i}_probability")]);
    }
    header.extend(
        [
            "width",
            "height",
            "orientation",
            "latitude",
            "longitude",
            "altitude",
            "heading",
            "heading_ref",
            "position_error_m",
            "gps_problem",
            "capture_time",
            "error",
            "entropy",
            "uncertain",
            "prediction_set",
            "set_size",
            "abstain",
            "building_id",
            "assignment",
            "distance_m",
        ]
        .map(String::from),
    );
    writer.write_record(&header)?;
    let text = |value: Option<String>| value.unwrap_or_default();
    let cell = |value: Option<&str>| value.map(neutralised).unwrap_or_default();
    for record in records {
        let mut row = vec![
            neutralised(&record.path),
            text(record.sha256.clone()),
            cell(record.class.as_deref()),
            text(record.probability.map(|p| p.to_string())),
        ];
        row.extend((0..classes.len()).map(|i| text(record.probabilities.get(i).map(|p| p.to_string()))));
        for i in 0..top {
            let entry = record.top.get(i);
            row.extend([
                cell(entry.map(|t| t.class.as_str())),
                text(entry.map(|t| t.probability.to_string())),
            ]);
        }
        row.extend([
            text(record.width.map(|v| v.to_string())),
            text(record.height.map(|v| v.to_string())),
            text(record.orientation.map(|v| v.to_string())),
            text(record.latitude.map(|v| v.to_string())),
            text(record.longitude.map(|v| v.to_string())),
            text(record.altitude.map(|v| v.to_string())),
            text(record.heading.map(|v| v.to_string())),
            cell(record.heading_ref.as_deref()),
            text(record.position_error_m.map(|v| v.to_string())),
            cell(record.gps_problem.as_deref()),
            cell(record.capture_time.as_deref()),
            cell(record.error.as_deref()),
            text(record.entropy.map(|v| v.to_string())),
            text(record.uncertain.map(|v| v.to_string())),
            cell(record.prediction_set.as_ref().map(|set| set.join("|")).as_deref()),
            text(record.set_size().map(|v| v.to_string())),
            text(record.abstain.map(|v| v.to_string())),
            cell(record.building_id.as_deref()),
            text(record.assignment.map(|kind| kind.as_str().to_string())),
            text(record.distance_m.map(|v| v.to_string())),
        ]);
        writer.write_record(&row)?;
    }
    writer.into_inner().map_err(|e| csv::Error::from(e.into_error()))
}

/// A text cell as a spreadsheet shows it rather than runs it: OWASP's rule against CSV
/// injection, a `'` before a cell that starts with `=`, `+`, `-`, `@`, a tab or a carriage
/// return (a file named `=HYPERLINK(...).jpg`, a class named `-1`). Applied to text cells only,
/// so a negative longitude stays a number.
pub(crate) fn neutralised(text: &str) -> String {
    if text.starts_with(['=', '+', '-', '@', '\t', '\r']) {
        format!("'{text}")
    } else {
        text.to_string()
    }
}

/// One JSON object per line, as the parts hold them.
pub fn jsonl_bytes(records: &[Record]) -> Result<Vec<u8>, serde_json::Error> {
    let mut bytes = Vec::new();
    for record in records {
        serde_json::to_writer(&mut bytes, record)?;
        bytes.push(b'\n');
    }
    Ok(bytes)
}

/// The records of JSON-lines `bytes` (a part, or `predictions.jsonl`).
pub fn parse_jsonl(bytes: &[u8]) -> Result<Vec<Record>, serde_json::Error> {
    bytes.split(|&b| b == b'\n').filter(|line| !line.is_empty()).map(serde_json::from_slice).collect()
}

/// Why a part's bytes are not a part to merge.
#[derive(Debug, thiserror::Error)]
pub enum PartError {
    #[error("no seal line at its end (cut short, or not written by this version of rtrain)")]
    Unsealed,
    #[error("its rows do not match the sha256 it was sealed with (edited or damaged since)")]
    Mismatch,
    #[error("not JSON lines of predictions: {0}")]
    Json(#[from] serde_json::Error),
}

/// A file as it was when read: a rerun compares it with the file as it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileStamp {
    pub size: u64,
    /// Modification time: seconds since the epoch, and nanoseconds.
    pub modified_s: i64,
    pub modified_ns: i64,
}

impl FileStamp {
    pub fn of(metadata: &std::fs::Metadata) -> FileStamp {
        use std::os::unix::fs::MetadataExt;
        FileStamp { size: metadata.size(), modified_s: metadata.mtime(), modified_ns: metadata.mtime_nsec() }
    }
}

/// One part of a job: its records, and the stamp of each record's file (None for a shard
/// sample, or a file that could not be read).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Part {
    pub records: Vec<Record>,
    pub files: Vec<Option<FileStamp>>,
}

/// A part's last line.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct PartSeal {
    files: Vec<Option<FileStamp>>,
    /// sha256 of every byte of the part before this line, then of `files` as JSON.
    sha256: String,
}

fn seal_digest(rows: &[u8], files: &[Option<FileStamp>]) -> Result<String, serde_json::Error> {
    let mut hasher = Sha256::new();
    hasher.update(rows);
    hasher.update(serde_json::to_vec(files)?);
    Ok(hex::encode(hasher.finalize()))
}

/// A part as its file holds it: its records as JSON lines, then its seal.
pub fn part_bytes(part: &Part) -> Result<Vec<u8>, serde_json::Error> {
    let mut bytes = jsonl_bytes(&part.records)?;
    let seal = PartSeal { sha256: seal_digest(&bytes, &part.files)?, files: part.files.clone() };
    serde_json::to_writer(&mut bytes, &seal)?;
    bytes.push(b'\n');
    Ok(bytes)
}

/// The part that [`part_bytes`] wrote, refused unless its seal matches it.
pub fn parse_part(bytes: &[u8]) -> Result<Part, PartError> {
    let body = bytes.strip_suffix(b"\n").ok_or(PartError::Unsealed)?;
    let rows_end = body.iter().rposition(|&b| b == b'\n').map_or(0, |newline| newline + 1);
    let (rows, seal) = body.split_at(rows_end);
    let seal: PartSeal = serde_json::from_slice(seal).map_err(|_| PartError::Unsealed)?;
    if seal_digest(rows, &seal.files)? != seal.sha256 {
        return Err(PartError::Mismatch);
    }
    let records = parse_jsonl(rows)?;
    if records.len() != seal.files.len() {
        return Err(PartError::Mismatch);
    }
    Ok(Part { records, files: seal.files })
}

/// `predictions.geojson`: an RFC 7946 FeatureCollection with one Point (longitude, latitude[,
/// altitude]) per photo that has a GPS position, its properties the CSV's columns (flat, as
/// QGIS and Hazmapper show them). Photos without a position are left out here (they are in the
/// CSV and counted in the summary).
pub fn geojson_bytes(records: &[Record], classes: &[String]) -> Result<Vec<u8>, serde_json::Error> {
    let features: Vec<serde_json::Value> = records
        .iter()
        .filter_map(|record| {
            let (latitude, longitude) = (record.latitude?, record.longitude?);
            let mut coordinates = vec![longitude, latitude];
            coordinates.extend(record.altitude);
            Some(serde_json::json!({
                "type": "Feature",
                "geometry": { "type": "Point", "coordinates": coordinates },
                "properties": properties(record, classes),
            }))
        })
        .collect();
    let collection = serde_json::json!({ "type": "FeatureCollection", "features": features });
    let mut bytes = serde_json::to_vec(&collection)?;
    bytes.push(b'\n');
    Ok(bytes)
}

/// A probability as the f64 of its shortest decimal form, so that a JSON value built from it
/// prints as the CSV and the JSON lines do (`0.32229975`, not `0.3222997486591339`).
pub(crate) fn decimal(probability: f32) -> f64 {
    probability.to_string().parse().unwrap_or(f64::NAN)
}

fn properties(record: &Record, classes: &[String]) -> serde_json::Value {
    let mut map = serde_json::Map::new();
    map.insert("path".into(), record.path.clone().into());
    map.insert("sha256".into(), record.sha256.clone().into());
    map.insert("class".into(), record.class.clone().into());
    map.insert("probability".into(), record.probability.map(decimal).into());
    for (class, probability) in classes.iter().zip(&record.probabilities) {
        map.insert(format!("probability_{class}"), decimal(*probability).into());
    }
    for (i, entry) in record.top.iter().enumerate() {
        map.insert(format!("top{}_class", i + 1), entry.class.clone().into());
        map.insert(format!("top{}_probability", i + 1), decimal(entry.probability).into());
    }
    map.insert("width".into(), record.width.into());
    map.insert("height".into(), record.height.into());
    map.insert("orientation".into(), record.orientation.into());
    map.insert("latitude".into(), record.latitude.into());
    map.insert("longitude".into(), record.longitude.into());
    map.insert("altitude".into(), record.altitude.into());
    map.insert("heading".into(), record.heading.into());
    map.insert("heading_ref".into(), record.heading_ref.clone().into());
    map.insert("position_error_m".into(), record.position_error_m.into());
    map.insert("gps_problem".into(), record.gps_problem.clone().into());
    map.insert("capture_time".into(), record.capture_time.clone().into());
    map.insert("error".into(), record.error.clone().into());
    map.insert("entropy".into(), record.entropy.into());
    map.insert("uncertain".into(), record.uncertain.into());
    map.insert("prediction_set".into(), record.prediction_set.clone().into());
    map.insert("set_size".into(), record.set_size().into());
    map.insert("abstain".into(), record.abstain.into());
    map.insert("building_id".into(), record.building_id.clone().into());
    map.insert("assignment".into(), record.assignment.map(AssignmentKind::as_str).into());
    map.insert("distance_m".into(), record.distance_m.into());
    serde_json::Value::Object(map)
}

/// Counts over the records for `summary.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Counts {
    pub images: usize,
    pub classified: usize,
    /// Inputs that could not be read or decoded (rows with an error).
    pub refused: usize,
    /// Classified photos with no GPS block at all (in the CSV, not on the map).
    pub without_gps: usize,
    /// Classified photos whose GPS block is present but could not be read (in the CSV, not on
    /// the map): counted apart from `without_gps`, since these are the ones to look into.
    pub gps_unreadable: usize,
    /// The first [`GPS_UNREADABLE_EXAMPLES`] of them, in the records' order, with why.
    pub gps_unreadable_examples: Vec<GpsUnreadable>,
    pub per_class: BTreeMap<String, usize>,
    /// Photos whose entropy is above the calibrated threshold (None: not calibrated).
    pub uncertain: Option<usize>,
    /// The mean size of the conformal prediction sets (None: no conformal calibration).
    pub mean_set_size: Option<f64>,
    /// Photos abstained on (`--abstain`).
    pub abstained: Option<usize>,
}

/// How many photos with an unreadable GPS block `summary.json` names.
pub const GPS_UNREADABLE_EXAMPLES: usize = 5;

/// A photo whose GPS block is present but could not be read.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpsUnreadable {
    pub path: String,
    pub problem: String,
}

pub fn counts(records: &[Record], classes: &[String]) -> Counts {
    let mut per_class: BTreeMap<String, usize> = classes.iter().map(|c| (c.clone(), 0)).collect();
    for class in records.iter().filter_map(|r| r.class.as_ref()) {
        *per_class.entry(class.clone()).or_default() += 1;
    }
    let classified = records.iter().filter(|r| r.class.is_some()).count();
    let unreadable =
        records.iter().filter(|r| r.class.is_some()).filter_map(|r| Some((&r.path, r.gps_problem.as_ref()?)));
    Counts {
        images: records.len(),
        classified,
        refused: records.len() - classified,
        without_gps: records
            .iter()
            .filter(|r| r.class.is_some() && !r.has_gps() && r.gps_problem.is_none())
            .count(),
        gps_unreadable: unreadable.clone().count(),
        gps_unreadable_examples: unreadable
            .take(GPS_UNREADABLE_EXAMPLES)
            .map(|(path, problem)| GpsUnreadable { path: path.clone(), problem: problem.clone() })
            .collect(),
        per_class,
        uncertain: count_some(records, |r| r.uncertain),
        mean_set_size: {
            let sizes: Vec<usize> = records.iter().filter_map(Record::set_size).collect();
            (!sizes.is_empty()).then(|| sizes.iter().sum::<usize>() as f64 / sizes.len() as f64)
        },
        abstained: count_some(records, |r| r.abstain),
    }
}

/// How many records say true, or None when none says anything.
fn count_some(records: &[Record], flag: impl Fn(&Record) -> Option<bool>) -> Option<usize> {
    let said: Vec<bool> = records.iter().filter_map(flag).collect();
    (!said.is_empty()).then(|| said.iter().filter(|&&f| f).count())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn classes() -> Vec<String> {
        ["C0", "C2", "C4"].map(String::from).to_vec()
    }

    #[test]
    fn the_csv_quotes_and_leaves_absent_values_empty() {
        let mut good = Record::new("a, \"b\".jpg".into(), Some("ab".into()), Some((4, 3)), None);
        good.predicted(&classes(), &[0.25, 0.5, 0.25], 2, None);
        let mut bad = Record::new("bad.jpg".into(), None, None, None);
        bad.error = Some("JPEG: not a JPEG file".into());
        let text = String::from_utf8(csv_bytes(&[good, bad], &classes(), 2).unwrap()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "path,sha256,class,probability,probability_C0,probability_C2,probability_C4,top1_class,\
             top1_probability,top2_class,top2_probability,width,height,orientation,latitude,longitude,\
             altitude,heading,heading_ref,position_error_m,gps_problem,capture_time,error,entropy,uncertain,\
             prediction_set,set_size,abstain,building_id,assignment,distance_m"
        );
        // Equal probabilities keep the class order (C0 before C4); the entropy of (1/4, 1/2,
        // 1/4) is 1.5 ln 2.
        let entropy = 1.5 * std::f64::consts::LN_2;
        assert_eq!(
            lines[1],
            format!(
                "\"a, \"\"b\"\".jpg\",ab,C2,0.5,0.25,0.5,0.25,C2,0.5,C0,0.25,4,3,,,,,,,,,,,{entropy},,,,,,,"
            )
        );
        assert_eq!(lines[2], "bad.jpg,,,,,,,,,,,,,,,,,,,,,,JPEG: not a JPEG file,,,,,,,,");
    }

    #[test]
    fn only_photos_with_a_position_are_features_and_counts_say_so() {
        let mut mapped = Record::new("m.jpg".into(), None, None, None);
        mapped.predicted(&classes(), &[0.1, 0.2, 0.7], 0, None);
        (mapped.latitude, mapped.longitude, mapped.altitude) = (Some(-33.5), Some(151.25), Some(-2.0));
        let mut unmapped = mapped.clone();
        (unmapped.path, unmapped.latitude, unmapped.longitude) = ("u.jpg".into(), None, None);
        let mut unreadable = unmapped.clone();
        unreadable.path = "x.jpg".into();
        unreadable.gps_problem = Some("GPSLatitudeRef is 'X', not N or S".into());
        let mut unreadable_refused = unreadable.clone();
        (unreadable_refused.path, unreadable_refused.class) = ("y.jpg".into(), None);
        let records = [mapped, unmapped, unreadable, unreadable_refused];
        let geojson: serde_json::Value =
            serde_json::from_slice(&geojson_bytes(&records, &classes()).unwrap()).unwrap();
        let features = geojson["features"].as_array().unwrap();
        assert_eq!(features.len(), 1, "photos without a position, readable or not, are no features");
        assert_eq!(features[0]["geometry"]["coordinates"], serde_json::json!([151.25, -33.5, -2.0]));
        assert_eq!(features[0]["properties"]["class"], "C4");
        // Printed as in the CSV: 0.7f32 is 0.699999988079071 as an f64.
        let text = String::from_utf8(geojson_bytes(&records, &classes()).unwrap()).unwrap();
        assert!(text.contains("\"probability_C4\":0.7,"), "{text}");
        let counts = counts(&records, &classes());
        assert_eq!((counts.images, counts.classified, counts.refused), (4, 3, 1));
        // No GPS block (u.jpg) apart from an unreadable one (x.jpg; y.jpg was not classified).
        assert_eq!((counts.without_gps, counts.gps_unreadable), (1, 1));
        assert_eq!(
            counts.gps_unreadable_examples,
            [GpsUnreadable { path: "x.jpg".into(), problem: "GPSLatitudeRef is 'X', not N or S".into() }]
        );
        assert_eq!(counts.per_class["C4"], 3);
        assert_eq!(parse_jsonl(&jsonl_bytes(&records).unwrap()).unwrap(), records);
    }

    /// Case 50: CSV cells starting with `=`, `@`, `+` or `-` were written as they were, and a
    /// spreadsheet ran them as formulas. Text cells so starting get OWASP's `'` in front;
    /// numbers (a negative longitude) stay numbers; the JSON files keep the text as it is.
    #[test]
    fn text_cells_a_spreadsheet_would_run_are_neutralised_and_numbers_are_not() {
        let formulas = ["=1+1", "@SUM(A1)", "+1", "-1", "\t=1", "\r=1"];
        let classes: Vec<String> = formulas.iter().map(|f| f.to_string()).collect();
        let mut record = Record::new("=HYPERLINK(\"http://x\").jpg".into(), None, Some((4, 3)), None);
        record.predicted(&classes, &[0.5, 0.1, 0.1, 0.1, 0.1, 0.1], 2, None);
        (record.latitude, record.longitude) = (Some(-33.5), Some(-151.25));
        let mut bad = Record::new("-x.jpg".into(), None, None, None);
        bad.error = Some("+cannot decode".into());
        let tab = Record::new("\t=x.jpg".into(), None, None, None);
        let plain = Record::new("a=1.jpg".into(), None, None, None);
        let csv = csv_bytes(&[record.clone(), bad, tab, plain], &classes, 2).unwrap();
        let mut reader = csv::Reader::from_reader(csv.as_slice());
        let header: Vec<String> = reader.headers().unwrap().iter().map(String::from).collect();
        let rows: Vec<Vec<String>> =
            reader.records().map(|r| r.unwrap().iter().map(String::from).collect()).collect();
        let cell =
            |row: usize, column: &str| rows[row][header.iter().position(|h| h == column).unwrap()].clone();
        assert_eq!(cell(0, "path"), "'=HYPERLINK(\"http://x\").jpg");
        assert_eq!(cell(0, "class"), "'=1+1");
        assert_eq!(cell(0, "top1_class"), "'=1+1");
        assert_eq!(cell(0, "top2_class"), "'@SUM(A1)");
        assert_eq!((cell(0, "latitude"), cell(0, "longitude")), ("-33.5".into(), "-151.25".into()));
        assert_eq!((cell(1, "path"), cell(1, "error")), ("'-x.jpg".into(), "'+cannot decode".into()));
        assert_eq!((cell(2, "path"), cell(3, "path")), ("'\t=x.jpg".into(), "a=1.jpg".into()));
        for (class, column) in classes.iter().zip(&header[4..10]) {
            assert_eq!(*column, format!("probability_{class}"), "a header cell starts with a letter");
        }
        assert_eq!(parse_jsonl(&jsonl_bytes(&[record.clone()]).unwrap()).unwrap()[0].path, record.path);
    }

    #[test]
    fn a_part_is_read_only_as_it_was_sealed() {
        let mut record = Record::new("a.jpg".into(), Some("ab".into()), Some((4, 3)), None);
        record.predicted(&classes(), &[0.25, 0.5, 0.25], 0, None);
        let stamp = FileStamp { size: 10, modified_s: 1_700_000_000, modified_ns: 5 };
        let records = vec![record.clone(), record];
        let part = Part { records: records.clone(), files: vec![Some(stamp), None] };
        let bytes = part_bytes(&part).unwrap();
        assert_eq!(parse_part(&bytes).unwrap(), part);
        assert_eq!(parse_part(&part_bytes(&Part::default()).unwrap()).unwrap(), Part::default());
        // A file's stamp changed (to hide that the photo changed): refused.
        let restamped = String::from_utf8(bytes.clone()).unwrap().replacen("\"size\":10", "\"size\":11", 1);
        assert!(matches!(parse_part(restamped.as_bytes()), Err(PartError::Mismatch)));
        // The class of the first row changed, its probabilities left: refused.
        let edited = String::from_utf8(bytes.clone()).unwrap().replacen("\"C2\"", "\"C4\"", 1);
        assert!(matches!(parse_part(edited.as_bytes()), Err(PartError::Mismatch)));
        // A row dropped, or the seal cut off.
        let text = String::from_utf8(bytes.clone()).unwrap();
        let dropped: String = text.lines().skip(1).map(|line| format!("{line}\n")).collect();
        assert!(matches!(parse_part(dropped.as_bytes()), Err(PartError::Mismatch)));
        let unsealed = jsonl_bytes(&records).unwrap();
        assert!(matches!(parse_part(&unsealed), Err(PartError::Unsealed)));
        assert!(matches!(parse_part(&bytes[..bytes.len() - 3]), Err(PartError::Unsealed)));
    }
}
