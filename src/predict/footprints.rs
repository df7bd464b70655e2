//! Building footprints for `predict --footprints FILE`: a GeoJSON (RFC 7946) FeatureCollection
//! of Polygon and MultiPolygon features in WGS 84 longitude/latitude, each with an id property
//! (`--footprint-id KEY`), as BRAILS++ inventories and OSM, Microsoft and FEMA USA Structures
//! footprints converted to GeoJSON hold them.
//!
//! What is refused, each error naming the file and (where one is to blame) the feature by its
//! index in the file and its id:
//! - anything but a FeatureCollection, and one without features;
//! - a `crs` member other than WGS 84 longitude/latitude (`OGC:CRS84` in any of its URN forms,
//!   or `EPSG:4326`, which GDAL and old GeoJSON writers put there for longitude/latitude files);
//! - a feature whose geometry is missing or is not a Polygon or MultiPolygon: a Point or a
//!   LineString in a footprints file is a mistake (a centroid inventory, the wrong layer) worth
//!   naming rather than a building silently dropped;
//! - a coordinate outside longitude [-180, 180] or latitude [-90, 90], or not finite: almost
//!   always a file in a projected CRS (metres) given by mistake, and the error says so;
//! - a feature without an id, an id that is not a string or a number, and an id two features
//!   share.
//!
//! The id is the property `id_key` of the feature; where the feature has no such property (or
//! it is null), the Feature's own `id` member, so that files whose writer put the id there
//! (GDAL's `-lco ID_FIELD`, OSM exports) need no conversion. A number is its decimal text
//! (`12`, `12.5`) as JSON wrote it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use geojson::{FeatureCollection, GeoJson, GeometryValue, PolygonType};

/// One building's footprint.
#[derive(Debug, Clone, PartialEq)]
pub struct Footprint {
    /// The id property's value as text (a number in its decimal form).
    pub id: String,
    /// The footprint, longitude/latitude degrees as the file holds them.
    pub geometry: geo::MultiPolygon<f64>,
    /// The feature's other properties (all but the id property), kept for `buildings.geojson`.
    pub properties: serde_json::Map<String, serde_json::Value>,
}

/// A footprints file, in its order.
#[derive(Debug, Clone)]
pub struct Footprints {
    pub path: PathBuf,
    /// The property that holds each footprint's id.
    pub id_key: String,
    pub items: Vec<Footprint>,
}

/// Why a footprints file cannot be used; each names the file, and the feature where one is to
/// blame.
#[derive(Debug, thiserror::Error)]
pub enum FootprintError {
    #[error("{}: {problem}", path.display())]
    Invalid { path: PathBuf, problem: String },
}

/// The largest footprints file read: 4 GiB, above a US state's Microsoft footprints as GeoJSON
/// (California's is about 3 GB); parsed whole, so the memory it takes is a few times its size.
pub const MAX_FOOTPRINTS_BYTES: u64 = 4 << 30;

/// The names a `crs` member may give WGS 84 longitude/latitude by (compared ignoring case).
const WGS84_CRS_NAMES: &[&str] = &[
    "urn:ogc:def:crs:ogc:1.3:crs84",
    "urn:ogc:def:crs:ogc::crs84",
    "ogc:crs84",
    "crs84",
    "urn:ogc:def:crs:epsg::4326",
    "epsg:4326",
];

impl Footprints {
    /// Reads and checks `path`.
    pub fn read(path: &Path, id_key: &str) -> Result<Footprints, FootprintError> {
        let invalid = |problem: String| FootprintError::Invalid { path: path.to_path_buf(), problem };
        // A FIFO or device is refused rather than waited on; a file beyond the bound, unread.
        let bytes = crate::util::files::read_regular(path, MAX_FOOTPRINTS_BYTES)
            .map_err(|e| invalid(format!("cannot read: {e}")))?;
        let text = String::from_utf8(bytes).map_err(|e| invalid(format!("is not UTF-8 text: {e}")))?;
        let collection = match text.parse::<GeoJson>() {
            Ok(GeoJson::FeatureCollection(collection)) => collection,
            Ok(GeoJson::Feature(_)) => {
                return Err(invalid("is a single GeoJSON Feature, not a FeatureCollection".into()))
            }
            Ok(GeoJson::Geometry(_)) => {
                return Err(invalid("is a bare GeoJSON geometry, not a FeatureCollection".into()))
            }
            Err(e) => return Err(invalid(format!("is not a GeoJSON FeatureCollection: {e}"))),
        };
        let items = footprints_of(collection, id_key).map_err(invalid)?;
        Ok(Footprints { path: path.to_path_buf(), id_key: id_key.to_string(), items })
    }
}

/// The footprints of `collection`, checked; the error is the problem's text without the path.
fn footprints_of(collection: FeatureCollection, id_key: &str) -> Result<Vec<Footprint>, String> {
    check_crs(&collection)?;
    if collection.features.is_empty() {
        return Err("has no features (an empty FeatureCollection)".into());
    }
    let mut first_index_of: HashMap<String, usize> = HashMap::with_capacity(collection.features.len());
    let mut items = Vec::with_capacity(collection.features.len());
    for (index, feature) in collection.features.into_iter().enumerate() {
        let mut properties = feature.properties.unwrap_or_default();
        let id = match properties.remove(id_key) {
            Some(serde_json::Value::Null) | None => feature.id.map(|id| match id {
                geojson::feature::Id::String(text) => serde_json::Value::String(text),
                geojson::feature::Id::Number(number) => serde_json::Value::Number(number),
            }),
            Some(value) => Some(value),
        };
        let id = match id {
            Some(serde_json::Value::String(text)) if !text.is_empty() => text,
            Some(serde_json::Value::Number(number)) => number.to_string(),
            Some(other) => {
                return Err(format!("feature {index}: its id {other} is not a non-empty string or a number"))
            }
            None => {
                return Err(format!(
                    "feature {index} has neither a {id_key:?} property nor an id member \
                     (--footprint-id names the property that holds the building id; for footprints \
                     without ids, such as Microsoft's, ogr2ogr -lco ID_GENERATE=YES writes one)"
                ))
            }
        };
        let at = || format!("feature {index} (id {id:?})");
        if let Some(first) = first_index_of.insert(id.clone(), index) {
            return Err(format!("{}: the id is also feature {first}'s; ids must be unique", at()));
        }
        let Some(geometry) = feature.geometry else {
            return Err(format!("{} has no geometry", at()));
        };
        let polygons: Vec<&PolygonType> = match &geometry.value {
            GeometryValue::Polygon { coordinates } => vec![coordinates],
            GeometryValue::MultiPolygon { coordinates } => coordinates.iter().collect(),
            other => {
                return Err(format!(
                    "{} is a {}; a footprint is a Polygon or MultiPolygon",
                    at(),
                    other.type_name()
                ))
            }
        };
        check_positions(&polygons).map_err(|problem| format!("{}: {problem}", at()))?;
        let geometry = geo::MultiPolygon::try_from(&geometry.value)
            .or_else(|_| {
                geo::Polygon::try_from(&geometry.value).map(|polygon| geo::MultiPolygon::new(vec![polygon]))
            })
            .map_err(|e| format!("{}: {e}", at()))?;
        items.push(Footprint { id, geometry, properties });
    }
    Ok(items)
}

/// Refuses a `crs` member that is not WGS 84 longitude/latitude (RFC 7946 dropped `crs`; the
/// 2008 format and GDAL still write it).
fn check_crs(collection: &FeatureCollection) -> Result<(), String> {
    let Some(crs) = collection.foreign_members.as_ref().and_then(|members| members.get("crs")) else {
        return Ok(());
    };
    if crs.is_null() {
        return Ok(());
    }
    let name = crs.pointer("/properties/name").and_then(|name| name.as_str());
    match name {
        Some(name) if WGS84_CRS_NAMES.contains(&name.to_ascii_lowercase().as_str()) => Ok(()),
        Some(name) => Err(format!(
            "its crs is {name}, not WGS 84 longitude/latitude: convert the file to EPSG:4326 \
             (e.g. ogr2ogr -t_srs EPSG:4326 out.geojson in.geojson)"
        )),
        None => Err(format!("its crs member {crs} names no CRS; WGS 84 longitude/latitude is expected")),
    }
}

/// Refuses a polygon without rings or an exterior, a position with fewer than two numbers, and a
/// coordinate that is not longitude/latitude.
fn check_positions(polygons: &[&PolygonType]) -> Result<(), String> {
    if polygons.is_empty()
        || polygons.iter().any(|polygon| polygon.first().is_none_or(|ring| ring.is_empty()))
    {
        return Err("has an empty polygon".into());
    }
    for position in polygons.iter().flat_map(|polygon| polygon.iter().flatten()) {
        let &[longitude, latitude, ..] = position.as_slice() else {
            return Err(format!("position {:?} has fewer than two coordinates", position.as_slice()));
        };
        // NaN is in no range, infinities in neither.
        if !((-180.0..=180.0).contains(&longitude) && (-90.0..=90.0).contains(&latitude)) {
            return Err(format!(
                "coordinate ({longitude}, {latitude}) is not a WGS 84 longitude/latitude: the file looks \
                 projected (metres?); convert it to EPSG:4326 (e.g. ogr2ogr -t_srs EPSG:4326 out.geojson in.geojson)"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_text(text: &str, id_key: &str) -> Result<Footprints, FootprintError> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("footprints.geojson");
        std::fs::write(&path, text).unwrap();
        Footprints::read(&path, id_key)
    }

    fn problem(text: &str) -> String {
        match read_text(text, "id") {
            Err(e) => e.to_string(),
            Ok(footprints) => panic!("accepted {} footprints", footprints.items.len()),
        }
    }

    const SQUARE: &str =
        r#"{"type":"Polygon","coordinates":[[[10,50],[10.001,50],[10.001,50.001],[10,50]]]}"#;

    fn collection(features: &[String]) -> String {
        format!(r#"{{"type":"FeatureCollection","features":[{}]}}"#, features.join(","))
    }

    fn feature(properties: &str, geometry: &str) -> String {
        format!(r#"{{"type":"Feature","properties":{properties},"geometry":{geometry}}}"#)
    }

    #[test]
    fn reads_polygons_and_multipolygons_with_ids_in_order() {
        let multi = r#"{"type":"MultiPolygon","coordinates":[[[[11,50],[11.001,50],[11,50.001],[11,50]]],
            [[[12,50],[12.001,50],[12,50.001],[12,50]]]]}"#;
        let text = collection(&[
            feature(r#"{"BldgID":"b1","occupancy":"RES1"}"#, SQUARE),
            feature(r#"{"BldgID":17}"#, multi),
            r#"{"type":"Feature","id":"from-member","properties":{},"geometry":{"type":"Polygon","coordinates":[[[1,2],[1.001,2],[1,2.001],[1,2]]]}}"#.into(),
        ]);
        let footprints = read_text(&text, "BldgID").unwrap();
        let ids: Vec<&str> = footprints.items.iter().map(|f| f.id.as_str()).collect();
        assert_eq!(ids, ["b1", "17", "from-member"]);
        assert_eq!(footprints.items[1].geometry.0.len(), 2);
        assert_eq!(footprints.items[0].properties.get("occupancy").unwrap(), "RES1");
        assert!(!footprints.items[0].properties.contains_key("BldgID"));
    }

    #[test]
    fn refuses_what_is_not_a_footprint_naming_the_feature() {
        let point = r#"{"type":"Point","coordinates":[10,50]}"#;
        let e = problem(&collection(&[feature(r#"{"id":"a"}"#, SQUARE), feature(r#"{"id":"p"}"#, point)]));
        assert!(e.contains("feature 1 (id \"p\") is a Point"), "{e}");
        let e = problem(&collection(&[feature(r#"{"id":"a"}"#, SQUARE), feature(r#"{"id":"a"}"#, SQUARE)]));
        assert!(e.contains("feature 1 (id \"a\")") && e.contains("feature 0"), "{e}");
        let e = problem(&collection(&[feature(r#"{"other":1}"#, SQUARE)]));
        assert!(e.contains("feature 0 has neither"), "{e}");
        let e = problem(&collection(&[]));
        assert!(e.contains("no features"), "{e}");
        let metres = r#"{"type":"Polygon","coordinates":[[[512000,4190000],[512010,4190000],[512000,4190010],[512000,4190000]]]}"#;
        let e = problem(&collection(&[feature(r#"{"id":"m"}"#, metres)]));
        assert!(e.contains("feature 0 (id \"m\")") && e.contains("projected"), "{e}");
        let e = problem(&collection(&[feature(r#"{"id":"n"}"#, "null")]));
        assert!(e.contains("no geometry"), "{e}");
        let e = problem(&collection(&[feature(r#"{"id":true}"#, SQUARE)]));
        assert!(e.contains("not a non-empty string or a number"), "{e}");
        let e = problem(r#"{"type":"Feature","properties":{},"geometry":null}"#);
        assert!(e.contains("not a FeatureCollection"), "{e}");
    }

    #[test]
    fn crs_must_be_wgs84_longitude_latitude() {
        let with_crs = |name: &str| {
            format!(
                r#"{{"type":"FeatureCollection","crs":{{"type":"name","properties":{{"name":"{name}"}}}},"features":[{}]}}"#,
                feature(r#"{"id":"a"}"#, SQUARE)
            )
        };
        assert!(read_text(&with_crs("urn:ogc:def:crs:OGC:1.3:CRS84"), "id").is_ok());
        assert!(read_text(&with_crs("EPSG:4326"), "id").is_ok());
        let e = read_text(&with_crs("urn:ogc:def:crs:EPSG::32610"), "id").unwrap_err().to_string();
        assert!(e.contains("EPSG::32610") && e.contains("footprints.geojson"), "{e}");
    }
}
