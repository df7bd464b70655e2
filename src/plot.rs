//! Charts for run reports and TensorBoard's images, drawn with plotters to SVG and PNG (pure Rust, no Python). Text needs
//! a TrueType font: DejaVu Sans from the system (Debian's fonts-dejavu-core, which
//! scripts/setup and the container install), registered once.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    #[error(
        "no TrueType font for the plots: install fonts-dejavu-core (looked for {})",
        FONT_PATHS.join(", ")
    )]
    NoFont,
    #[error("{path}: drawing failed: {problem}")]
    Draw { path: PathBuf, problem: String },
    #[error(transparent)]
    Write(#[from] crate::util::files::FileError),
}

const FONT_PATHS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
];

/// Registers DejaVu Sans as plotters' "sans-serif", once per process.
pub(super) fn ensure_font() -> Result<(), PlotError> {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    let ok = *REGISTERED.get_or_init(|| {
        FONT_PATHS.iter().filter_map(|path| std::fs::read(path).ok()).any(|bytes| {
            // plotters keeps fonts for the life of the process.
            let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_ok()
        })
    });
    if ok {
        Ok(())
    } else {
        Err(PlotError::NoFont)
    }
}

/// One line of a chart.
pub struct Series {
    pub label: String,
    pub points: Vec<(f64, f64)>,
}

const SIZE: (u32, u32) = (800, 480);

/// The SVG and PNG files of a chart: `.svg` and `.png` appended to the stem (whose name may
/// hold dots of its own, as a run named `lr0.001-s1`).
fn outputs(stem: &Path) -> Result<(PathBuf, PathBuf), PlotError> {
    ensure_font()?;
    Ok((with_suffix(stem, ".svg"), with_suffix(stem, ".png")))
}

fn with_suffix(stem: &Path, suffix: &str) -> PathBuf {
    let mut name = stem.as_os_str().to_os_string();
    name.push(suffix);
    PathBuf::from(name)
}

fn failed(path: &Path) -> impl FnOnce(String) -> PlotError + '_ {
    move |problem| PlotError::Draw { path: path.to_path_buf(), problem }
}

/// A chart's title and axis names.
pub struct Labels<'a> {
    pub title: &'a str,
    pub x: &'a str,
    pub y: &'a str,
    /// Logarithmic y axis (losses that start orders of magnitude above where they end).
    pub log_y: bool,
}

/// Writes a chart drawn in memory: the SVG text, and the RGB pixels as PNG. Each file is
/// written atomically, so a link standing where a chart goes is replaced, never followed.
fn write_chart(svg: &Path, svg_text: &str, png: &Path, pixels: Vec<u8>) -> Result<(), PlotError> {
    crate::util::files::write_atomic(svg, svg_text.as_bytes())?;
    let image = image::RgbImage::from_raw(SIZE.0, SIZE.1, pixels).expect("a buffer of SIZE pixels");
    crate::util::files::write_png(png, &image)?;
    Ok(())
}

fn pixel_buffer() -> Vec<u8> {
    vec![0; SIZE.0 as usize * SIZE.1 as usize * 3]
}

/// A line chart of several series; writes `stem.svg` and `stem.png`.
pub fn lines(stem: &Path, labels: &Labels, series: &[Series]) -> Result<(), PlotError> {
    let (svg, png) = outputs(stem)?;
    let (mut svg_text, mut pixels) = (String::new(), pixel_buffer());
    draw_lines(SVGBackend::with_string(&mut svg_text, SIZE).into_drawing_area(), labels, series)
        .map_err(failed(&svg))?;
    draw_lines(BitMapBackend::with_buffer(&mut pixels, SIZE).into_drawing_area(), labels, series)
        .map_err(failed(&png))?;
    write_chart(&svg, &svg_text, &png, pixels)
}

fn draw_lines<DB: DrawingBackend>(
    area: DrawingArea<DB, Shift>,
    labels: &Labels,
    series: &[Series],
) -> Result<(), String> {
    let log_y =
        labels.log_y && series.iter().flat_map(|s| &s.points).all(|&(_, y)| y > 0.0 || !y.is_finite());
    let series: Vec<Series> = series
        .iter()
        .map(|s| Series {
            label: s.label.clone(),
            points: s.points.iter().map(|&(x, y)| (x, if log_y { y.log10() } else { y })).collect(),
        })
        .collect();
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    area.fill(&WHITE).map_err(err)?;
    let all = series.iter().flat_map(|s| s.points.iter());
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for &(x, y) in all.filter(|(x, y)| x.is_finite() && y.is_finite()) {
        (x0, x1, y0, y1) = (x0.min(x), x1.max(x), y0.min(y), y1.max(y));
    }
    if x0 > x1 {
        (x0, x1, y0, y1) = (0.0, 1.0, 0.0, 1.0);
    }
    // A log axis is drawn as log10 values over whole decades, so that its ticks fall on powers
    // of ten (plotters steps by 1, 2 or 5 times a power of ten: whole numbers here), labelled
    // in the original units: 0.1, 1, 10, 100.
    let (y_range, y_ticks) = match log_y {
        true => {
            let (low, high) = (y0.floor(), y1.ceil().max(y0.floor() + 1.0));
            (low..high, (high - low) as usize + 1)
        }
        false => {
            let pad = ((y1 - y0) * 0.05).max(1e-9);
            ((y0 - pad)..(y1 + pad), 10)
        }
    };
    let mut chart = ChartBuilder::on(&area)
        .caption(labels.title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(64)
        .build_cartesian_2d(x0..x1.max(x0 + 1e-9), y_range)
        .map_err(err)?;
    let y_format = |v: &f64| if log_y { decade_label(*v) } else { format!("{v:.3}") };
    let y_desc = if log_y { format!("{} (log scale)", labels.y) } else { labels.y.to_string() };
    chart
        .configure_mesh()
        .x_desc(labels.x)
        .y_desc(y_desc)
        .y_labels(y_ticks)
        .y_label_formatter(&y_format)
        .draw()
        .map_err(err)?;
    for (i, s) in series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(s.points.iter().copied(), color.stroke_width(2)))
            .map_err(err)?
            .label(s.label.clone())
            .legend(legend_swatch(color.stroke_width(2)));
    }
    draw_legend(&mut chart, SeriesLabelPosition::MiddleRight).map_err(err)?;
    area.present().map_err(err)
}

/// One measured point of a scaling chart: images per second at a world size, and the
/// efficiency against linear scaling.
pub struct ScalingPoint {
    pub ranks: f64,
    pub images_per_second: f64,
    pub efficiency: f64,
}

/// Throughput against ranks, with each point labelled (img/s and efficiency) and the ideal
/// (linear from the first point) dashed: the SVG document, for the caller to write.
pub fn scaling_svg(points: &[ScalingPoint]) -> Result<String, PlotError> {
    ensure_font()?;
    let mut svg = String::new();
    draw_scaling(SVGBackend::with_string(&mut svg, SIZE).into_drawing_area(), points)
        .map_err(|problem| PlotError::Draw { path: PathBuf::from("the scaling plot"), problem })?;
    Ok(svg)
}

fn draw_scaling<DB: DrawingBackend>(
    area: DrawingArea<DB, Shift>,
    points: &[ScalingPoint],
) -> Result<(), String> {
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    area.fill(&WHITE).map_err(err)?;
    let max_ranks = points.iter().map(|p| p.ranks).fold(2.0, f64::max);
    let ideal: Vec<(f64, f64)> = points
        .first()
        .map(|p| vec![(p.ranks, p.images_per_second), (max_ranks, p.images_per_second * max_ranks / p.ranks)])
        .unwrap_or_default();
    let top = points.iter().map(|p| p.images_per_second).chain(ideal.iter().map(|p| p.1)).fold(1.0, f64::max);
    let mut chart = ChartBuilder::on(&area)
        .caption("Training throughput against ranks", ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(64)
        .build_cartesian_2d(0.0..max_ranks * 1.05, 0.0..top * 1.15)
        .map_err(err)?;
    chart.configure_mesh().x_desc("ranks").y_desc("images / s").draw().map_err(err)?;
    let gray = BLACK.mix(0.5);
    chart
        .draw_series(DashedLineSeries::new(ideal, 6, 4, gray.stroke_width(1)))
        .map_err(err)?
        .label("ideal (linear)")
        .legend(legend_swatch(gray.into()));
    let blue = RGBColor(70, 130, 180);
    let measured: Vec<(f64, f64)> = points.iter().map(|p| (p.ranks, p.images_per_second)).collect();
    chart
        .draw_series(LineSeries::new(measured.iter().copied(), blue.stroke_width(2)))
        .map_err(err)?
        .label("measured")
        .legend(legend_swatch(blue.stroke_width(2)));
    chart
        .draw_series(points.iter().map(|p| {
            let label = format!("{:.0} img/s, {:.0}%", p.images_per_second, 100.0 * p.efficiency);
            EmptyElement::at((p.ranks, p.images_per_second))
                + Circle::new((0, 0), 4, blue.filled())
                + Text::new(label, (-40, -20), ("sans-serif", 13))
        }))
        .map_err(err)?;
    draw_legend(&mut chart, SeriesLabelPosition::UpperLeft).map_err(err)?;
    area.present().map_err(err)
}

/// One stacked bar: its label and its segments (name, value) from the bottom up.
pub struct StackedBar {
    pub label: String,
    pub segments: Vec<(String, f64)>,
}

/// Stacked bars side by side (e.g. each world size's step split into phases), one colour per
/// segment name, written as `<stem>.svg` and `<stem>.png`; returns both paths.
pub fn stacked_bars(
    stem: &Path,
    title: &str,
    y: &str,
    bars: &[StackedBar],
) -> Result<(PathBuf, PathBuf), PlotError> {
    let (svg, png) = outputs(stem)?;
    let (mut svg_text, mut pixels) = (String::new(), pixel_buffer());
    draw_stacked_bars(SVGBackend::with_string(&mut svg_text, SIZE).into_drawing_area(), title, y, bars)
        .map_err(failed(&svg))?;
    draw_stacked_bars(BitMapBackend::with_buffer(&mut pixels, SIZE).into_drawing_area(), title, y, bars)
        .map_err(failed(&png))?;
    write_chart(&svg, &svg_text, &png, pixels)?;
    Ok((svg, png))
}

fn draw_stacked_bars<DB: DrawingBackend>(
    area: DrawingArea<DB, Shift>,
    title: &str,
    y: &str,
    bars: &[StackedBar],
) -> Result<(), String> {
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    area.fill(&WHITE).map_err(err)?;
    let top = bars.iter().map(|b| b.segments.iter().map(|s| s.1.max(0.0)).sum::<f64>()).fold(1e-9, f64::max);
    let mut names: Vec<&str> = Vec::new();
    for (name, _) in bars.iter().flat_map(|b| &b.segments) {
        if !names.contains(&name.as_str()) {
            names.push(name);
        }
    }
    // Two empty slots on the right hold the legend, clear of the bars.
    let slots = bars.len().max(1) + 2;
    let mut chart = ChartBuilder::on(&area)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(64)
        .build_cartesian_2d(0.0..slots as f64, 0.0..top * 1.3)
        .map_err(err)?;
    let labels: Vec<String> = bars.iter().map(|b| b.label.clone()).collect();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(slots * 2 + 1)
        .x_label_formatter(&|x| {
            let index = x.floor() as usize;
            match (x - x.floor() - 0.5).abs() < 0.01 {
                true => labels.get(index).cloned().unwrap_or_default(),
                false => String::new(),
            }
        })
        .y_desc(y)
        .draw()
        .map_err(err)?;
    for (k, name) in names.iter().enumerate() {
        let color = Palette99::pick(k).to_rgba();
        let rects: Vec<Rectangle<(f64, f64)>> = bars
            .iter()
            .enumerate()
            .filter_map(|(i, bar)| {
                let at = bar.segments.iter().position(|(n, _)| n == name)?;
                let below: f64 = bar.segments[..at].iter().map(|s| s.1.max(0.0)).sum();
                let value = bar.segments[at].1.max(0.0);
                let x = i as f64;
                Some(Rectangle::new([(x + 0.2, below), (x + 0.8, below + value)], color.filled()))
            })
            .collect();
        chart
            .draw_series(rects)
            .map_err(err)?
            .label(*name)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled()));
    }
    draw_legend(&mut chart, SeriesLabelPosition::UpperRight).map_err(err)?;
    area.present().map_err(err)
}

/// The legend's sample of a series: a short line in its style.
fn legend_swatch(style: ShapeStyle) -> impl Fn((i32, i32)) -> PathElement<(i32, i32)> {
    move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], style)
}

/// Every chart's legend: framed, on a translucent white box, at `position`.
fn draw_legend<'a, DB: DrawingBackend + 'a>(
    chart: &mut ChartContext<'a, DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>,
    position: SeriesLabelPosition,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    chart
        .configure_series_labels()
        .position(position)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 14))
        .draw()
}

/// The label of the log axis' tick at log10 value `v`: the power of ten it stands for, as a
/// plain number (`0.01`, `1`, `1000`).
fn decade_label(v: f64) -> String {
    let value = 10f64.powi(v.round() as i32);
    // Display prints the shortest form that reads back exactly: 0.01, 1, 1000.
    format!("{value}")
}

/// What a confusion matrix's cells show: the counts, or each row's shares (the recall of its
/// class on the diagonal).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Cells {
    Counts,
    RowShares,
}

/// The confusion matrix as a heat map (rows: true class, columns: predicted), shaded by the
/// share of the row, with counts or shares written in.
pub fn confusion(
    stem: &Path,
    title: &str,
    classes: &[String],
    counts: &[Vec<u64>],
    cells: Cells,
) -> Result<(), PlotError> {
    let (svg, png) = outputs(stem)?;
    let (mut svg_text, mut pixels) = (String::new(), pixel_buffer());
    let svg_area = SVGBackend::with_string(&mut svg_text, SIZE).into_drawing_area();
    draw_confusion(svg_area, title, classes, counts, cells).map_err(failed(&svg))?;
    let png_area = BitMapBackend::with_buffer(&mut pixels, SIZE).into_drawing_area();
    draw_confusion(png_area, title, classes, counts, cells).map_err(failed(&png))?;
    write_chart(&svg, &svg_text, &png, pixels)
}

/// The confusion matrix as [`confusion`] draws its PNG, in memory.
pub fn confusion_image(
    title: &str,
    classes: &[String],
    counts: &[Vec<u64>],
    cells: Cells,
) -> Result<image::RgbImage, PlotError> {
    ensure_font()?;
    let mut pixels = pixel_buffer();
    let area = BitMapBackend::with_buffer(&mut pixels, SIZE).into_drawing_area();
    draw_confusion(area, title, classes, counts, cells)
        .map_err(|problem| PlotError::Draw { path: PathBuf::from("(in memory)"), problem })?;
    Ok(image::RgbImage::from_raw(SIZE.0, SIZE.1, pixels).expect("a buffer of SIZE pixels"))
}

fn draw_confusion<DB: DrawingBackend>(
    area: DrawingArea<DB, Shift>,
    title: &str,
    classes: &[String],
    counts: &[Vec<u64>],
    cells: Cells,
) -> Result<(), String> {
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    area.fill(&WHITE).map_err(err)?;
    let n = counts.len().max(1);
    let label = |i: usize| classes.get(i).cloned().unwrap_or_else(|| i.to_string());
    let mut chart = ChartBuilder::on(&area)
        .caption(title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(48)
        .y_label_area_size(140)
        // plotters counts an integer range inclusively: n - 1 gives n segments.
        .build_cartesian_2d((0..n - 1).into_segmented(), (0..n - 1).into_segmented())
        .map_err(err)?;
    // Row 0 (the first class) at the top, as confusion matrices are read.
    let centre = |v: &SegmentValue<usize>, flip: bool| match v {
        SegmentValue::CenterOf(i) if *i < n => label(if flip { n - 1 - *i } else { *i }),
        _ => String::new(),
    };
    chart
        .configure_mesh()
        .disable_mesh()
        .x_desc("predicted")
        .y_desc("true")
        .x_labels(n)
        .y_labels(n)
        .x_label_formatter(&|v| centre(v, false))
        .y_label_formatter(&|v| centre(v, true))
        .draw()
        .map_err(err)?;
    let centred = Pos::new(HPos::Center, VPos::Center);
    for (truth, row) in counts.iter().enumerate() {
        let total = row.iter().sum::<u64>().max(1) as f64;
        for (predicted, &count) in row.iter().enumerate() {
            let share = count as f64 / total;
            let y = n - 1 - truth;
            let shade = RGBColor(255 - (200.0 * share) as u8, 255 - (120.0 * share) as u8, 255);
            let corners = [
                (SegmentValue::Exact(predicted), SegmentValue::Exact(y)),
                (SegmentValue::Exact(predicted + 1), SegmentValue::Exact(y + 1)),
            ];
            chart.draw_series(std::iter::once(Rectangle::new(corners, shade.filled()))).map_err(err)?;
            let ink = if share > 0.6 { WHITE } else { BLACK };
            let at = (SegmentValue::CenterOf(predicted), SegmentValue::CenterOf(y));
            chart
                .draw_series(std::iter::once(Text::new(
                    match cells {
                        Cells::Counts => count.to_string(),
                        Cells::RowShares => format!("{share:.2}"),
                    },
                    at,
                    ("sans-serif", 18).into_font().color(&ink).pos(centred),
                )))
                .map_err(err)?;
        }
    }
    area.present().map_err(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stem_with_dots_keeps_them() {
        // with_extension would have made both runs' charts confusion-lr0.svg.
        assert_eq!(
            with_suffix(Path::new("out/confusion-lr0.001-s1"), ".svg"),
            Path::new("out/confusion-lr0.001-s1.svg")
        );
        assert_eq!(with_suffix(Path::new("out/loss"), ".png"), Path::new("out/loss.png"));
    }

    #[test]
    fn a_log_axis_is_labelled_at_powers_of_ten() {
        let dir = tempfile::tempdir().unwrap();
        let stem = dir.path().join("loss");
        // A validation loss that starts three decades above where it ends (the default run's
        // first epochs before the recipe changed).
        let series = [Series {
            label: "val".into(),
            points: vec![(1.0, 1067.0), (2.0, 85.0), (3.0, 1.4), (4.0, 0.76)],
        }];
        let labels = Labels { title: "loss", x: "epoch", y: "loss", log_y: true };
        lines(&stem, &labels, &series).unwrap();
        let svg = std::fs::read_to_string(stem.with_extension("svg")).unwrap();
        let ticks: Vec<&str> = svg
            .split("<text")
            .filter_map(|text| text.split('>').nth(1))
            .filter_map(|rest| rest.split('<').next().map(str::trim))
            .collect();
        for decade in ["0.1", "1", "10", "100", "1000", "10000"] {
            assert!(ticks.contains(&decade), "no tick labelled {decade}: {ticks:?}");
        }
        assert!(!svg.contains("316.228") && !svg.contains("3.162"), "ticks between decades: {ticks:?}");
    }
}
