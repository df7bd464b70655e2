//! `map.png` and `map.svg` of `predict --footprints`: the buildings filled by their fused
//! class, the photos as points (unassigned ones apart), a legend with counts, a scale bar in
//! metres and a north arrow. No basemap tiles: compute nodes have no network.
//!
//! The map is drawn in the local east/north plane of the assignment (metres, north up) at one
//! scale for both axes, framed on the photos and the buildings that have photos, so that a
//! campaign of a few streets in a county's footprints shows the streets. Footprints without
//! photos are drawn in grey where they fall in the frame: the context the photos sit in.

use std::path::Path;

use geo::{Contains, Coord, LineString, Point, Polygon};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::plot::{ensure_font, PlotError};
use crate::util::files::{write_atomic, write_png};

/// A footprint as drawn: its rings (outer rings and holes, each closed) in metres east and
/// north of the map's origin, and its fused class (None: no photos).
#[derive(Debug, Clone)]
pub struct MapFootprint {
    pub rings: Vec<Vec<(f64, f64)>>,
    pub class: Option<usize>,
}

/// A photo as drawn: metres east and north, and whether it was assigned to a building.
#[derive(Debug, Clone, Copy)]
pub struct MapPhoto {
    pub at: (f64, f64),
    pub assigned: bool,
}

/// The picture's size in pixels: the map square on the left, the legend on the right.
const SIZE: (u32, u32) = (1100, 900);
const MAP_SIDE: u32 = 860;
const MARGIN: u32 = 20;

/// Ordinal colours from no damage (green) to destroyed (dark red), ColorBrewer's RdYlGn
/// reversed: damage classes are ordered, and the map reads as a heat scale.
const DAMAGE_COLOURS: [(u8, u8, u8); 6] =
    [(26, 152, 80), (145, 207, 96), (254, 224, 139), (252, 141, 89), (215, 48, 39), (127, 0, 0)];
const NO_PHOTOS: RGBColor = RGBColor(225, 225, 225);
const OUTLINE: RGBColor = RGBColor(90, 90, 90);
const UNASSIGNED: RGBColor = RGBColor(200, 0, 200);

/// The fill of class `class` of `classes`: the palette's ends for the first and last class,
/// the classes between spread evenly over it.
fn class_colour(class: usize, classes: usize) -> RGBColor {
    let last = DAMAGE_COLOURS.len() - 1;
    let at = if classes <= 1 { 0 } else { (class * last + (classes - 1) / 2) / (classes - 1) };
    let (r, g, b) = DAMAGE_COLOURS[at.min(last)];
    RGBColor(r, g, b)
}

/// The files [`draw`] writes.
pub const FILES: [&str; 2] = ["map.svg", "map.png"];

/// Draws `dir/map.png` and `dir/map.svg`, each written atomically.
pub fn draw(
    dir: &Path,
    classes: &[String],
    footprints: &[MapFootprint],
    photos: &[MapPhoto],
) -> Result<(), PlotError> {
    ensure_font()?;
    let (svg_path, png_path) = (dir.join(FILES[0]), dir.join(FILES[1]));
    let frame = Frame::around(footprints, photos);
    let mut svg = String::new();
    draw_on(SVGBackend::with_string(&mut svg, SIZE).into_drawing_area(), &frame, classes, footprints, photos)
        .map_err(|problem| PlotError::Draw { path: svg_path.clone(), problem })?;
    let mut pixels = vec![0; SIZE.0 as usize * SIZE.1 as usize * 3];
    draw_on(
        BitMapBackend::with_buffer(&mut pixels, SIZE).into_drawing_area(),
        &frame,
        classes,
        footprints,
        photos,
    )
    .map_err(|problem| PlotError::Draw { path: png_path.clone(), problem })?;
    write_atomic(&svg_path, svg.as_bytes())?;
    let image = image::RgbImage::from_raw(SIZE.0, SIZE.1, pixels).expect("a buffer of SIZE pixels");
    write_png(&png_path, &image)?;
    Ok(())
}

/// Metres to pixels: one scale for both axes, north up.
struct Frame {
    west: f64,
    north: f64,
    pixels_per_metre: f64,
}

impl Frame {
    /// The frame around the photos and the buildings with photos (else every footprint), with
    /// a margin of a tenth of its side, and at least 50 m across.
    fn around(footprints: &[MapFootprint], photos: &[MapPhoto]) -> Frame {
        let with_photos = footprints.iter().filter(|f| f.class.is_some());
        let mut points: Vec<(f64, f64)> = with_photos
            .flat_map(|f| f.rings.iter().flatten().copied())
            .chain(photos.iter().map(|p| p.at))
            .collect();
        if points.is_empty() {
            points = footprints.iter().flat_map(|f| f.rings.iter().flatten().copied()).collect();
        }
        let finite = points.iter().filter(|(x, y)| x.is_finite() && y.is_finite());
        let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
        for &(x, y) in finite {
            (x0, x1, y0, y1) = (x0.min(x), x1.max(x), y0.min(y), y1.max(y));
        }
        if x0 > x1 {
            (x0, x1, y0, y1) = (0.0, 0.0, 0.0, 0.0);
        }
        let side = ((x1 - x0).max(y1 - y0) * 1.2).max(50.0);
        let (centre_x, centre_y) = ((x0 + x1) / 2.0, (y0 + y1) / 2.0);
        Frame {
            west: centre_x - side / 2.0,
            north: centre_y + side / 2.0,
            pixels_per_metre: f64::from(MAP_SIDE) / side,
        }
    }

    fn pixel(&self, (east, north): (f64, f64)) -> (i32, i32) {
        let x = f64::from(MARGIN) + (east - self.west) * self.pixels_per_metre;
        let y = f64::from(MARGIN) + (self.north - north) * self.pixels_per_metre;
        // Far outside the picture only where a footprint lies far from the frame: clamped so
        // that the backends' integer arithmetic cannot overflow.
        (x.clamp(-1e6, 1e6) as i32, y.clamp(-1e6, 1e6) as i32)
    }

    /// Whether any part of `ring`'s bounding box falls in the map square.
    fn shows(&self, ring: &[(f64, f64)]) -> bool {
        let pixels: Vec<(i32, i32)> = ring.iter().map(|&p| self.pixel(p)).collect();
        let (low, high) = (MARGIN as i32, (MARGIN + MAP_SIDE) as i32);
        let x_in = pixels.iter().any(|p| p.0 >= low) && pixels.iter().any(|p| p.0 <= high);
        let y_in = pixels.iter().any(|p| p.1 >= low) && pixels.iter().any(|p| p.1 <= high);
        x_in && y_in
    }
}

/// Each ring of a footprint with its depth: 0 for an outer ring, 1 for a hole in it, 2 for an
/// island in the hole. Depth comes from containment, not from the rings' order or winding,
/// which writers do not all follow.
fn ring_depths(rings: &[Vec<(f64, f64)>]) -> Vec<usize> {
    let polygons: Vec<Polygon<f64>> = rings
        .iter()
        .map(|ring| {
            Polygon::new(
                LineString::from(ring.iter().map(|&(x, y)| Coord { x, y }).collect::<Vec<_>>()),
                vec![],
            )
        })
        .collect();
    rings
        .iter()
        .enumerate()
        .map(|(i, ring)| {
            let Some(&(x, y)) = ring.first() else { return 0 };
            let inside = |(j, polygon): (usize, &Polygon<f64>)| j != i && polygon.contains(&Point::new(x, y));
            polygons.iter().enumerate().filter(|&(j, p)| inside((j, p))).count()
        })
        .collect()
}

fn draw_on<DB: DrawingBackend>(
    area: DrawingArea<DB, Shift>,
    frame: &Frame,
    classes: &[String],
    footprints: &[MapFootprint],
    photos: &[MapPhoto],
) -> Result<(), String> {
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    area.fill(&WHITE).map_err(err)?;
    // Footprints are drawn whole, in the picture's pixels, and whatever falls outside the map
    // square is painted over afterwards (plotters does not clip polygons).
    for footprint in footprints {
        let fill = footprint.class.map_or(NO_PHOTOS, |class| class_colour(class, classes.len()));
        let depths = ring_depths(&footprint.rings);
        let mut order: Vec<usize> = (0..footprint.rings.len()).collect();
        order.sort_by_key(|&i| depths[i]);
        for i in order {
            let ring = &footprint.rings[i];
            if ring.len() < 3 || !frame.shows(ring) {
                continue;
            }
            let pixels: Vec<(i32, i32)> = ring.iter().map(|&p| frame.pixel(p)).collect();
            let colour = if depths[i] % 2 == 0 { fill } else { WHITE };
            area.draw(&plotters::element::Polygon::new(pixels.clone(), colour.filled())).map_err(err)?;
            area.draw(&PathElement::new(pixels, OUTLINE.stroke_width(1))).map_err(err)?;
        }
    }
    for photo in photos {
        let at = frame.pixel(photo.at);
        if photo.assigned {
            area.draw(&Circle::new(at, 3, BLACK.filled())).map_err(err)?;
        } else {
            let (x, y) = at;
            let cross = UNASSIGNED.stroke_width(2);
            area.draw(&PathElement::new(vec![(x - 4, y - 4), (x + 4, y + 4)], cross)).map_err(err)?;
            area.draw(&PathElement::new(vec![(x - 4, y + 4), (x + 4, y - 4)], cross)).map_err(err)?;
        }
    }
    // Whatever was drawn outside the map square is painted over: the margins and the legend.
    let (edge, far) = (MARGIN as i32, (MARGIN + MAP_SIDE) as i32);
    let (width, height) = (SIZE.0 as i32, SIZE.1 as i32);
    for (from, to) in [
        ((0, 0), (width, edge)),
        ((0, far), (width, height)),
        ((0, 0), (edge, height)),
        ((far, 0), (width, height)),
    ] {
        area.draw(&Rectangle::new([from, to], WHITE.filled())).map_err(err)?;
    }
    area.draw(&Rectangle::new([(edge, edge), (far, far)], BLACK.stroke_width(1))).map_err(err)?;
    draw_scale_bar(&area, frame).map_err(err)?;
    draw_north_arrow(&area).map_err(err)?;
    draw_legend(&area, classes, footprints, photos).map_err(err)?;
    area.present().map_err(err)
}

/// A bar of a round length (1, 2 or 5 times a power of ten metres) near a fifth of the map's
/// width, at its bottom left.
fn draw_scale_bar<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    frame: &Frame,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let metres = round_length(f64::from(MAP_SIDE) / 5.0 / frame.pixels_per_metre);
    let length = (metres * frame.pixels_per_metre).round() as i32;
    let (x, y) = (MARGIN as i32 + 20, (MARGIN + MAP_SIDE) as i32 - 24);
    area.draw(&Rectangle::new([(x - 4, y - 22), (x + length + 4, y + 8)], WHITE.mix(0.8).filled()))?;
    area.draw(&Rectangle::new([(x, y), (x + length, y + 5)], BLACK.filled()))?;
    let label = if metres >= 1000.0 { format!("{} km", metres / 1000.0) } else { format!("{metres} m") };
    let style = ("sans-serif", 15).into_font().color(&BLACK).pos(Pos::new(HPos::Center, VPos::Bottom));
    area.draw(&Text::new(label, (x + length / 2, y - 3), style))
}

/// 1, 2 or 5 times a power of ten, the largest not above `metres`.
fn round_length(metres: f64) -> f64 {
    let decade = 10f64.powf(metres.max(1e-3).log10().floor());
    [5.0, 2.0, 1.0].into_iter().map(|m| m * decade).find(|&length| length <= metres).unwrap_or(decade)
}

/// An arrow pointing up with an N above it, at the map's top right: the plane's north is true
/// north at its origin (and within a fraction of a degree across a campaign).
fn draw_north_arrow<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let (x, top) = ((MARGIN + MAP_SIDE) as i32 - 30, MARGIN as i32 + 30);
    area.draw(&Rectangle::new([(x - 16, top - 22), (x + 16, top + 46)], WHITE.mix(0.8).filled()))?;
    area.draw(&plotters::element::Polygon::new(
        vec![(x, top), (x - 10, top + 24), (x + 10, top + 24)],
        BLACK.filled(),
    ))?;
    area.draw(&PathElement::new(vec![(x, top + 20), (x, top + 42)], BLACK.stroke_width(3)))?;
    let style = ("sans-serif", 18).into_font().color(&BLACK).pos(Pos::new(HPos::Center, VPos::Bottom));
    area.draw(&Text::new("N", (x, top - 2), style))
}

/// One row per class (buildings of that fused class), then footprints without photos, photos
/// and unassigned photos, each with its count.
fn draw_legend<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    classes: &[String],
    footprints: &[MapFootprint],
    photos: &[MapPhoto],
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let x = (2 * MARGIN + MAP_SIDE) as i32;
    let mut y = MARGIN as i32 + 10;
    let font = ("sans-serif", 15).into_font().color(&BLACK).pos(Pos::new(HPos::Left, VPos::Center));
    area.draw(&Text::new("Buildings by fused class", (x, y), font.clone()))?;
    y += 26;
    let swatch =
        |y: i32, colour: RGBColor, label: String| -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
            area.draw(&Rectangle::new([(x, y - 8), (x + 22, y + 8)], colour.filled()))?;
            area.draw(&Rectangle::new([(x, y - 8), (x + 22, y + 8)], OUTLINE.stroke_width(1)))?;
            area.draw(&Text::new(label, (x + 30, y), font.clone()))
        };
    for (class, name) in classes.iter().enumerate() {
        let count = footprints.iter().filter(|f| f.class == Some(class)).count();
        swatch(y, class_colour(class, classes.len()), format!("{name} ({count})"))?;
        y += 24;
    }
    let without = footprints.iter().filter(|f| f.class.is_none()).count();
    swatch(y, NO_PHOTOS, format!("no photos ({without})"))?;
    y += 40;
    let assigned = photos.iter().filter(|p| p.assigned).count();
    area.draw(&Circle::new((x + 11, y), 3, BLACK.filled()))?;
    area.draw(&Text::new(format!("photo ({assigned})"), (x + 30, y), font.clone()))?;
    y += 24;
    let cross = UNASSIGNED.stroke_width(2);
    area.draw(&PathElement::new(vec![(x + 7, y - 4), (x + 15, y + 4)], cross))?;
    area.draw(&PathElement::new(vec![(x + 7, y + 4), (x + 15, y - 4)], cross))?;
    area.draw(&Text::new(format!("unassigned ({})", photos.len() - assigned), (x + 30, y), font))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn square(x: f64, y: f64, side: f64) -> Vec<(f64, f64)> {
        vec![(x, y), (x + side, y), (x + side, y + side), (x, y + side), (x, y)]
    }

    #[test]
    fn holes_are_found_by_containment_whatever_the_order() {
        let rings = vec![square(4.0, 4.0, 2.0), square(0.0, 0.0, 10.0), square(4.5, 4.5, 1.0)];
        assert_eq!(ring_depths(&rings), [1, 0, 2]);
    }

    #[test]
    fn the_scale_bar_is_a_round_length() {
        assert_eq!(round_length(173.0), 100.0);
        assert_eq!(round_length(260.0), 200.0);
        assert_eq!(round_length(9.9), 5.0);
        assert_eq!(round_length(5000.0), 5000.0);
    }

    #[test]
    fn the_first_and_last_classes_take_the_palettes_ends() {
        assert_eq!(class_colour(0, 4), RGBColor(26, 152, 80));
        assert_eq!(class_colour(3, 4), RGBColor(127, 0, 0));
        assert_eq!(class_colour(0, 1), RGBColor(26, 152, 80));
    }

    #[test]
    fn a_frame_keeps_north_up_and_one_scale() {
        let photos =
            [MapPhoto { at: (0.0, 0.0), assigned: true }, MapPhoto { at: (100.0, 50.0), assigned: false }];
        let frame = Frame::around(&[], &photos);
        let (west, east) = (frame.pixel((0.0, 25.0)), frame.pixel((100.0, 25.0)));
        let (south, north) = (frame.pixel((50.0, 0.0)), frame.pixel((50.0, 50.0)));
        assert_eq!(west.1, east.1);
        assert!(north.1 < south.1, "north is up");
        let (across, up) = (east.0 - west.0, south.1 - north.1);
        assert!(
            (across - 2 * up).abs() <= 2,
            "one scale: 100 m east ({across} px) is twice 50 m north ({up} px)"
        );
    }
}
