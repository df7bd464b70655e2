//! Which building each photo shows (`predict --footprints`): the footprint containing its
//! position; else, with a true heading, the first footprint its line of sight crosses within
//! `--max-distance`; else the nearest footprint within `--max-distance`; else none.
//!
//! Distances are measured in a plane: the footprints and photos are projected once onto the
//! plane tangent to the WGS 84 ellipsoid at the centre of the footprints' longitude/latitude
//! bounding box (east and north in metres: the ellipsoidal orthographic projection, which is
//! exactly ECEF to local east-north-up with "up" dropped; PROJ's `+proj=ortho +ellps=WGS84`,
//! which the reference tests compare with). Its scale is exact at the centre and shrinks
//! radially by cos(r/R): a 30 m distance measured r away from the centre comes out short by
//! at most 0.02 mm for a campaign 10 km across (r = 7.1 km at the corners) and 1.9 mm for one
//! 100 km across (r = 71 km), measured against geodesics (pyproj `Geod`). A campaign that
//! straddles the antimeridian is not supported (its bounding box spans the globe).
//!
//! The rules, in order:
//! - Inside: the footprint that contains the position, its boundary included (a photo on the
//!   shared wall of two row houses is inside both; geopandas' `within` says neither). A point
//!   in a hole (a courtyard) is not inside. Of overlapping footprints, the first in file order.
//!   `distance_m` is 0.
//! - LineOfSight (only with a heading relative to true north): a ray from the position along
//!   the heading (the direction of the geodesic leaving the photo at that azimuth, in the
//!   plane), `max_distance_m` long; the footprint whose boundary it meets first, by distance
//!   along the ray (touching a corner counts). Equal distances: the first in file order.
//!   `distance_m` is the distance along the ray. A photo in a courtyard looks at the wall of
//!   its own courtyard building.
//! - Nearest: the footprint at the least distance from the position, within `max_distance_m`
//!   (inclusive). Equal distances (exactly equal f64): the first in file order. `distance_m` is
//!   that distance.
//! - None: nothing within `max_distance_m`, or a position or a maximum distance that is not a
//!   finite number (a heading that is not finite counts as no heading).
//!
//! The footprints' bounding boxes are in an R-tree (rstar), so that a photo costs a logarithmic
//! search and exact tests on the few footprints near it.

use geo::{BoundingRect, Distance, Euclidean, Intersects, Line, LineIntersection, MultiPolygon, Point};
use rstar::primitives::{GeomWithData, Rectangle};
use rstar::{RTree, AABB};
use serde::{Deserialize, Serialize};

use super::footprints::Footprints;

/// How a photo was assigned to its building, or that it was not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AssignmentKind {
    /// The photo's position is inside the footprint (or on its boundary).
    Inside,
    /// The footprint is the first one the photo's line of sight (its true heading) crosses.
    LineOfSight,
    /// The footprint is the nearest one.
    Nearest,
    /// No footprint within the maximum distance, or the photo has no position.
    None,
}

impl AssignmentKind {
    /// The name written in the CSV and GeoJSON (as serde writes it).
    pub fn as_str(self) -> &'static str {
        match self {
            AssignmentKind::Inside => "inside",
            AssignmentKind::LineOfSight => "line_of_sight",
            AssignmentKind::Nearest => "nearest",
            AssignmentKind::None => "none",
        }
    }
}

/// A photo's building, or none.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Assignment {
    /// The index of the footprint in [`Footprints::items`].
    pub footprint: Option<usize>,
    pub kind: AssignmentKind,
    /// Metres from the photo's position to the footprint (0 inside; along the line of sight
    /// for [`AssignmentKind::LineOfSight`]).
    pub distance_m: Option<f64>,
}

impl Assignment {
    const NONE: Assignment = Assignment { footprint: None, kind: AssignmentKind::None, distance_m: None };

    fn to(footprint: usize, kind: AssignmentKind, distance_m: f64) -> Assignment {
        Assignment { footprint: Some(footprint), kind, distance_m: Some(distance_m) }
    }
}

/// WGS 84 semi-major axis (m) and first eccentricity squared.
const WGS84_A: f64 = 6_378_137.0;
const WGS84_E2: f64 = (2.0 - 1.0 / 298.257_223_563) / 298.257_223_563;

/// Metres east and north of an origin: the plane distances and the map are measured in.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LocalProjection {
    pub origin_latitude: f64,
    pub origin_longitude: f64,
}

impl LocalProjection {
    /// The projection centred on the middle of the footprints' longitude/latitude bounding box
    /// (0, 0 for no footprints).
    pub fn centred_on(footprints: &Footprints) -> LocalProjection {
        let all = MultiPolygon::new(
            footprints.items.iter().flat_map(|footprint| footprint.geometry.0.iter().cloned()).collect(),
        );
        match all.bounding_rect() {
            Some(bounds) => LocalProjection {
                origin_latitude: (bounds.min().y + bounds.max().y) / 2.0,
                origin_longitude: (bounds.min().x + bounds.max().x) / 2.0,
            },
            None => LocalProjection { origin_latitude: 0.0, origin_longitude: 0.0 },
        }
    }

    /// The PROJ definition of the same projection (`+proj=ortho` on the WGS 84 ellipsoid), for
    /// tools that should measure as rtrain does.
    pub fn proj_string(&self) -> String {
        format!(
            "+proj=ortho +lat_0={:?} +lon_0={:?} +ellps=WGS84 +x_0=0 +y_0=0 +units=m +no_defs",
            self.origin_latitude, self.origin_longitude
        )
    }

    /// (east, north) in metres of a WGS 84 longitude and latitude: the ellipsoidal orthographic
    /// projection (EPSG guidance note 7-2, 3.3.5), as PROJ computes it.
    pub fn to_metres(&self, longitude: f64, latitude: f64) -> (f64, f64) {
        let (sin_lat0, cos_lat0) = self.origin_latitude.to_radians().sin_cos();
        let (sin_lat, cos_lat) = latitude.to_radians().sin_cos();
        let (sin_lon, cos_lon) = (longitude.to_radians() - self.origin_longitude.to_radians()).sin_cos();
        let nu0 = 1.0 / (1.0 - WGS84_E2 * sin_lat0 * sin_lat0).sqrt();
        let nu = 1.0 / (1.0 - WGS84_E2 * sin_lat * sin_lat).sqrt();
        let east = nu * cos_lat * sin_lon;
        let north = nu * (sin_lat * cos_lat0 - cos_lat * sin_lat0 * cos_lon)
            + WGS84_E2 * (nu0 * sin_lat0 - nu * sin_lat) * cos_lat0;
        (WGS84_A * east, WGS84_A * north)
    }

    /// The unit vector (east, north) in the plane along which a geodesic leaves the point at
    /// `longitude`, `latitude` with azimuth `heading` degrees clockwise from true north: the
    /// point's own east/north axes seen in the plane of the origin (the projection is linear in
    /// earth-centred coordinates, so it maps tangent vectors linearly).
    pub fn direction(&self, longitude: f64, latitude: f64, heading: f64) -> (f64, f64) {
        let (sin_lat0, cos_lat0) = self.origin_latitude.to_radians().sin_cos();
        let (sin_lat, cos_lat) = latitude.to_radians().sin_cos();
        let (sin_lon, cos_lon) = (longitude.to_radians() - self.origin_longitude.to_radians()).sin_cos();
        let (sin_h, cos_h) = heading.to_radians().sin_cos();
        let east = sin_h * cos_lon - cos_h * sin_lat * sin_lon;
        let north = sin_lat0 * (sin_h * sin_lon + cos_h * sin_lat * cos_lon) + cos_lat0 * cos_h * cos_lat;
        let length = east.hypot(north);
        (east / length, north / length)
    }
}

/// A footprint's bounding box in the plane, with its index in file order.
type IndexedBox = GeomWithData<Rectangle<[f64; 2]>, usize>;

/// Footprints projected and indexed for assigning photos to them.
pub struct Assigner {
    projection: LocalProjection,
    max_distance_m: f64,
    /// The footprints in metres, in file order.
    shapes: Vec<MultiPolygon<f64>>,
    index: RTree<IndexedBox>,
}

impl Assigner {
    /// Indexes `footprints` for photos up to `max_distance_m` metres away.
    pub fn new(footprints: &Footprints, max_distance_m: f64) -> Assigner {
        let projection = LocalProjection::centred_on(footprints);
        let shapes: Vec<MultiPolygon<f64>> = footprints
            .items
            .iter()
            .map(|footprint| {
                let mut shape = footprint.geometry.clone();
                geo::MapCoordsInPlace::map_coords_in_place(&mut shape, |c| {
                    let (x, y) = projection.to_metres(c.x, c.y);
                    geo::coord! { x: x, y: y }
                });
                shape
            })
            .collect();
        let boxes = shapes
            .iter()
            .enumerate()
            .filter_map(|(i, shape)| {
                let bounds = shape.bounding_rect()?;
                let corners = Rectangle::from_corners(bounds.min().x_y().into(), bounds.max().x_y().into());
                Some(IndexedBox::new(corners, i))
            })
            .collect();
        Assigner { projection, max_distance_m, shapes, index: RTree::bulk_load(boxes) }
    }

    /// The building of a photo at `latitude`, `longitude` (degrees) facing `true_heading`
    /// (degrees clockwise from true north, when known).
    pub fn assign(&self, latitude: f64, longitude: f64, true_heading: Option<f64>) -> Assignment {
        if !(latitude.is_finite() && longitude.is_finite()) {
            return Assignment::NONE;
        }
        let (x, y) = self.projection.to_metres(longitude, latitude);
        if let Some(footprint) = self.containing(x, y) {
            return Assignment::to(footprint, AssignmentKind::Inside, 0.0);
        }
        if !(self.max_distance_m.is_finite() && self.max_distance_m >= 0.0) {
            return Assignment::NONE;
        }
        if let Some(heading) = true_heading.filter(|heading| heading.is_finite()) {
            let direction = self.projection.direction(longitude, latitude, heading);
            if let Some((footprint, distance)) = self.first_along(x, y, direction) {
                return Assignment::to(footprint, AssignmentKind::LineOfSight, distance);
            }
        }
        match self.nearest(x, y) {
            Some((footprint, distance)) => Assignment::to(footprint, AssignmentKind::Nearest, distance),
            None => Assignment::NONE,
        }
    }

    pub fn projection(&self) -> &LocalProjection {
        &self.projection
    }

    pub fn max_distance_m(&self) -> f64 {
        self.max_distance_m
    }

    /// The first footprint in file order that contains (x, y) or has it on its boundary.
    fn containing(&self, x: f64, y: f64) -> Option<usize> {
        let point = Point::new(x, y);
        self.index
            .locate_all_at_point(&[x, y])
            .map(|candidate| candidate.data)
            .filter(|&i| self.shapes[i].intersects(&point))
            .min()
    }

    /// The footprint whose boundary the ray from (x, y) along `direction` meets first within the
    /// maximum distance, and the distance along the ray.
    fn first_along(&self, x: f64, y: f64, (east, north): (f64, f64)) -> Option<(usize, f64)> {
        let length = self.max_distance_m;
        let ray = Line::new(
            geo::coord! { x: x, y: y },
            geo::coord! { x: x + length * east, y: y + length * north },
        );
        let envelope = AABB::from_corners([ray.start.x, ray.start.y], [ray.end.x, ray.end.y]);
        let distance_from_photo = |c: geo::Coord<f64>| (c.x - x).hypot(c.y - y);
        self.index
            .locate_in_envelope_intersecting(&envelope)
            .filter_map(|candidate| {
                let rings = self.shapes[candidate.data]
                    .0
                    .iter()
                    .flat_map(|polygon| std::iter::once(polygon.exterior()).chain(polygon.interiors()));
                let hits = rings.flat_map(|ring| ring.lines()).filter_map(|edge| {
                    match geo::line_intersection::line_intersection(ray, edge)? {
                        LineIntersection::SinglePoint { intersection, .. } => {
                            Some(distance_from_photo(intersection))
                        }
                        LineIntersection::Collinear { intersection } => Some(
                            distance_from_photo(intersection.start)
                                .min(distance_from_photo(intersection.end)),
                        ),
                    }
                });
                let first = hits.fold(f64::INFINITY, f64::min);
                first.is_finite().then_some((candidate.data, first))
            })
            .min_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)))
    }

    /// The nearest footprint within the maximum distance (first in file order of equals), and
    /// its distance.
    fn nearest(&self, x: f64, y: f64) -> Option<(usize, f64)> {
        let point = Point::new(x, y);
        let reach = self.max_distance_m;
        self.index
            .locate_within_distance([x, y], reach * reach)
            .map(|candidate| {
                let shape = &self.shapes[candidate.data];
                let distance = shape
                    .0
                    .iter()
                    .map(|polygon| Euclidean.distance(&point, polygon))
                    .fold(f64::INFINITY, f64::min);
                (candidate.data, distance)
            })
            .filter(|&(_, distance)| distance <= reach)
            .min_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)))
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::predict::footprints::Footprint;

    /// Degrees of longitude and latitude per metre at the equator, where the tests build.
    const LON_PER_M: f64 = 1.0 / 111_319.490_793;
    const LAT_PER_M: f64 = 1.0 / 110_574.272_7;

    /// A rectangle from (west, south) to (east, north) in metres from (0°, 0°), with holes.
    fn rectangle(bounds: [f64; 4], holes: &[[f64; 4]]) -> geo::Polygon<f64> {
        let ring = |[w, s, e, n]: [f64; 4]| {
            geo::LineString::from(vec![
                (w * LON_PER_M, s * LAT_PER_M),
                (e * LON_PER_M, s * LAT_PER_M),
                (e * LON_PER_M, n * LAT_PER_M),
                (w * LON_PER_M, n * LAT_PER_M),
                (w * LON_PER_M, s * LAT_PER_M),
            ])
        };
        geo::Polygon::new(ring(bounds), holes.iter().map(|&hole| ring(hole)).collect())
    }

    fn footprints(polygons: Vec<geo::Polygon<f64>>) -> Footprints {
        let items = polygons
            .into_iter()
            .enumerate()
            .map(|(i, polygon)| Footprint {
                id: format!("b{i}"),
                geometry: MultiPolygon::new(vec![polygon]),
                properties: serde_json::Map::new(),
            })
            .collect();
        Footprints { path: PathBuf::from("test.geojson"), id_key: "id".into(), items }
    }

    /// Assigns a photo at (east, north) metres from (0°, 0°).
    fn at(assigner: &Assigner, east: f64, north: f64, heading: Option<f64>) -> Assignment {
        assigner.assign(north * LAT_PER_M, east * LON_PER_M, heading)
    }

    fn assert_assigned(assignment: Assignment, footprint: usize, kind: AssignmentKind, distance_m: f64) {
        assert_eq!((assignment.footprint, assignment.kind), (Some(footprint), kind), "{assignment:?}");
        let distance = assignment.distance_m.unwrap();
        assert!((distance - distance_m).abs() < 0.01, "{distance} m, not {distance_m} m");
    }

    #[test]
    fn projection_matches_proj_ortho_on_wgs84() {
        // pyproj 3.7.2 (PROJ 9.5.1): Transformer.from_crs("EPSG:4326", "+proj=ortho +lat_0=37.87
        // +lon_0=-122.27 +ellps=WGS84 +units=m", always_xy=True).transform(-121.7, 38.3)
        let projection = LocalProjection { origin_latitude: 37.87, origin_longitude: -122.27 };
        let (east, north) = projection.to_metres(-121.7, 38.3);
        assert!((east - 49859.04218874385).abs() < 1e-6, "{east}");
        assert!((north - 47880.97593921866).abs() < 1e-6, "{north}");
        assert_eq!(projection.to_metres(-122.27, 37.87), (0.0, 0.0));
        let (east, north) = projection.direction(-122.27, 37.87, 90.0);
        assert!((east - 1.0).abs() < 1e-12 && north.abs() < 1e-12);
        // Away from the centre, true north turns by the meridians' convergence (~0.35° here).
        let (east, north) = projection.direction(-121.7, 38.3, 0.0);
        assert!(east < -0.005 && north > 0.99, "{east} {north}");
    }

    #[test]
    fn inside_wins_and_a_courtyard_is_not_inside() {
        let courtyard = rectangle([0.0, 0.0, 30.0, 30.0], &[[10.0, 10.0, 20.0, 20.0]]);
        let assigner =
            Assigner::new(&footprints(vec![courtyard, rectangle([40.0, 0.0, 50.0, 10.0], &[])]), 30.0);
        assert_assigned(at(&assigner, 5.0, 5.0, Some(90.0)), 0, AssignmentKind::Inside, 0.0);
        assert_assigned(at(&assigner, 45.0, 5.0, None), 1, AssignmentKind::Inside, 0.0);
        // In the hole: nearest is the courtyard wall 3 m away, not "inside".
        assert_assigned(at(&assigner, 13.0, 15.0, None), 0, AssignmentKind::Nearest, 3.0);
        // Looking east from the courtyard: its own wall, 7 m along the ray.
        assert_assigned(at(&assigner, 13.0, 15.0, Some(90.0)), 0, AssignmentKind::LineOfSight, 7.0);
    }

    #[test]
    fn boundaries_and_overlaps_go_to_the_first_in_file_order() {
        let row = |order: [usize; 2]| {
            let houses = [rectangle([0.0, 0.0, 10.0, 10.0], &[]), rectangle([10.0, 0.0, 20.0, 10.0], &[])];
            Assigner::new(&footprints(order.iter().map(|&i| houses[i].clone()).collect()), 30.0)
        };
        // The shared corner of two row houses is on both boundaries.
        for order in [[0, 1], [1, 0]] {
            assert_assigned(at(&row(order), 10.0, 10.0, None), 0, AssignmentKind::Inside, 0.0);
        }
        let overlapping =
            footprints(vec![rectangle([0.0, 0.0, 10.0, 10.0], &[]), rectangle([5.0, 0.0, 15.0, 10.0], &[])]);
        let assigner = Assigner::new(&overlapping, 30.0);
        assert_assigned(at(&assigner, 7.0, 5.0, None), 0, AssignmentKind::Inside, 0.0);
        assert_assigned(at(&assigner, 12.0, 5.0, None), 1, AssignmentKind::Inside, 0.0);
    }

    #[test]
    fn nearest_within_the_maximum_distance_first_of_equals() {
        let house = rectangle([0.0, 0.0, 10.0, 10.0], &[]);
        let assigner = Assigner::new(
            &footprints(vec![house.clone(), house, rectangle([0.0, 50.0, 10.0, 60.0], &[])]),
            30.0,
        );
        // Two identical footprints (a duplicate in the source data): equal distances.
        assert_assigned(at(&assigner, 22.0, 5.0, None), 0, AssignmentKind::Nearest, 12.0);
        assert_assigned(at(&assigner, 5.0, 40.0, None), 2, AssignmentKind::Nearest, 10.0);
        assert_eq!(at(&assigner, 45.0, 5.0, None), Assignment::NONE);
        assert_eq!(at(&assigner, f64::NAN, 5.0, None), Assignment::NONE);
        let nothing_near = Assigner::new(&footprints(vec![rectangle([0.0, 0.0, 10.0, 10.0], &[])]), 0.0);
        assert_eq!(at(&nothing_near, 12.0, 5.0, None), Assignment::NONE);
    }

    #[test]
    fn line_of_sight_takes_the_first_boundary_along_the_heading() {
        // From (0, 0): a far house east first in the file, a near house east, one just north.
        let houses = vec![
            rectangle([25.0, -5.0, 35.0, 5.0], &[]),
            rectangle([15.0, -5.0, 20.0, 5.0], &[]),
            rectangle([-5.0, 4.0, 5.0, 10.0], &[]),
        ];
        let assigner = Assigner::new(&footprints(houses), 30.0);
        assert_assigned(at(&assigner, 0.0, 0.0, Some(90.0)), 1, AssignmentKind::LineOfSight, 15.0);
        assert_assigned(at(&assigner, 0.0, 0.0, Some(90.0 + 360.0)), 1, AssignmentKind::LineOfSight, 15.0);
        assert_assigned(at(&assigner, 0.0, 0.0, None), 2, AssignmentKind::Nearest, 4.0);
        // Looking west at nothing: the nearest instead.
        assert_assigned(at(&assigner, 0.0, 0.0, Some(270.0)), 2, AssignmentKind::Nearest, 4.0);
        assert_assigned(at(&assigner, 0.0, 0.0, Some(f64::NAN)), 2, AssignmentKind::Nearest, 4.0);
        // Along a ray that only reaches the far house beyond 30 m: nearest again.
        let far = Assigner::new(
            &footprints(vec![
                rectangle([35.0, -5.0, 45.0, 5.0], &[]),
                rectangle([-5.0, 20.0, 5.0, 30.0], &[]),
            ]),
            30.0,
        );
        assert_assigned(at(&far, 0.0, 0.0, Some(90.0)), 1, AssignmentKind::Nearest, 20.0);
    }
}
