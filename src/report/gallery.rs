//! The gallery of a model's most confident mistakes: for each (true, predicted) pair off the
//! diagonal of the confusion matrix, the images it got wrong with the highest probability, as
//! thumbnails captioned with the file name, the true and predicted class and the probability,
//! in one PNG (as DesignSafe's notebooks show "low damage, but predicted high" and the reverse).

use std::path::Path;

use plotters::prelude::*;

use crate::data::dataset::Dataset;
use crate::plot::{ensure_font, PlotError};
use crate::train::eval::ImageResult;

/// Thumbnails shown per (true, predicted) pair by default.
pub const DEFAULT_PER_PAIR: usize = 4;

/// One wrongly classified image: its dataset index, classes and the predicted class's
/// probability.
#[derive(Debug, Clone, PartialEq)]
pub struct Mistake {
    pub index: usize,
    pub label: usize,
    pub predicted: usize,
    pub probability: f64,
}

/// The `per_pair` most confident mistakes of each off-diagonal (true, predicted) pair that has
/// any, pairs in (true, predicted) order, most confident first (equal ones by dataset index).
/// The predicted class is the most probable one, as the metrics count it.
pub fn most_confident_mistakes(images: &[ImageResult], per_pair: usize) -> Vec<Vec<Mistake>> {
    let mut mistakes: Vec<Mistake> = images
        .iter()
        .filter_map(|image| {
            let predicted = crate::metrics::argmax(&image.probabilities);
            (predicted != image.label).then(|| Mistake {
                index: image.index,
                label: image.label,
                predicted,
                probability: image.probabilities[predicted],
            })
        })
        .collect();
    mistakes.sort_by(|a, b| {
        (a.label, a.predicted)
            .cmp(&(b.label, b.predicted))
            .then(b.probability.total_cmp(&a.probability))
            .then(a.index.cmp(&b.index))
    });
    let mut pairs: Vec<Vec<Mistake>> = Vec::new();
    for mistake in mistakes {
        match pairs.last_mut() {
            Some(pair) if (pair[0].label, pair[0].predicted) == (mistake.label, mistake.predicted) => {
                if pair.len() < per_pair {
                    pair.push(mistake);
                }
            }
            _ => pairs.push(vec![mistake]),
        }
    }
    pairs
}

const THUMB: u32 = 128;
const ROW_HEADER: u32 = 170;
const CAPTION: u32 = 44;
const GAP: u32 = 12;
const TITLE: u32 = 44;

/// Draws `pairs` (from [`most_confident_mistakes`]) of `dataset`'s images as a PNG at `path`,
/// written atomically, each shown as `picture` gives it (the photo; its Grad-CAM overlay), scaled
/// to a thumbnail. An image without a picture shows as a grey square.
pub fn draw(
    path: &Path,
    title: &str,
    dataset: &dyn Dataset,
    classes: &[String],
    pairs: &[Vec<Mistake>],
    mut picture: impl FnMut(&Mistake) -> Option<image::RgbImage>,
) -> Result<(), PlotError> {
    ensure_font()?;
    let columns = pairs.iter().map(Vec::len).max().unwrap_or(0).max(1) as u32;
    let width = ROW_HEADER + columns * (THUMB + GAP) + GAP;
    let height = TITLE + pairs.len().max(1) as u32 * (THUMB + CAPTION + GAP);
    let mut pixels = vec![255u8; (width * height * 3) as usize];
    let failed = |problem: String| PlotError::Draw { path: path.to_path_buf(), problem };
    let class = |i: usize| classes.get(i).cloned().unwrap_or_else(|| i.to_string());
    {
        let area = BitMapBackend::with_buffer(&mut pixels, (width, height)).into_drawing_area();
        let err = |e: DrawingAreaErrorKind<_>| failed(e.to_string());
        let text = |s: String, at: (i32, i32), size: u32| Text::new(s, at, ("sans-serif", size).into_font());
        area.draw(&text(title.to_string(), (GAP as i32, 12), 20)).map_err(err)?;
        if pairs.is_empty() {
            area.draw(&text("no mistakes".into(), (GAP as i32, TITLE as i32 + 20), 16)).map_err(err)?;
        }
        for (row, pair) in pairs.iter().enumerate() {
            let top = (TITLE + row as u32 * (THUMB + CAPTION + GAP)) as i32;
            let header = format!("true {}", class(pair[0].label));
            area.draw(&text(header, (GAP as i32, top + 40), 16)).map_err(err)?;
            let header = format!("predicted {}", class(pair[0].predicted));
            area.draw(&text(header, (GAP as i32, top + 62), 16)).map_err(err)?;
            for (column, mistake) in pair.iter().enumerate() {
                let left = (ROW_HEADER + column as u32 * (THUMB + GAP)) as i32;
                let name = Path::new(&dataset.describe(mistake.index))
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default();
                let name: String = name.chars().take(20).collect();
                let below = top + THUMB as i32 + 4;
                area.draw(&text(name, (left, below), 13)).map_err(err)?;
                let caption = format!("p({}) = {:.3}", class(mistake.predicted), mistake.probability);
                area.draw(&text(caption, (left, below + 18), 13)).map_err(err)?;
            }
        }
        area.present().map_err(err)?;
    }
    let mut gallery =
        image::RgbImage::from_raw(width, height, pixels).expect("a buffer of the gallery's size");
    for (row, pair) in pairs.iter().enumerate() {
        let top = TITLE + row as u32 * (THUMB + CAPTION + GAP);
        for (column, mistake) in pair.iter().enumerate() {
            let left = ROW_HEADER + column as u32 * (THUMB + GAP);
            let thumbnail = match picture(mistake) {
                Some(photo) => {
                    let scale = f64::from(THUMB) / f64::from(photo.width().max(photo.height()));
                    let (w, h) = (
                        (f64::from(photo.width()) * scale) as u32,
                        (f64::from(photo.height()) * scale) as u32,
                    );
                    image::imageops::thumbnail(&photo, w.max(1), h.max(1))
                }
                None => image::RgbImage::from_pixel(THUMB, THUMB, image::Rgb([160, 160, 160])),
            };
            image::imageops::overlay(&mut gallery, &thumbnail, i64::from(left), i64::from(top));
        }
    }
    crate::util::files::write_png(path, &gallery)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(index: usize, label: usize, probabilities: &[f64]) -> ImageResult {
        ImageResult {
            index,
            label,
            predicted: 0,
            loss: 0.0,
            probabilities: probabilities.to_vec(),
            logits: Vec::new(),
        }
    }

    #[test]
    fn mistakes_are_grouped_by_pair_most_confident_first() {
        let images = [
            image(0, 0, &[0.2, 0.1, 0.7]),   // C0 -> C2, 0.7
            image(1, 0, &[0.9, 0.05, 0.05]), // right
            image(2, 0, &[0.05, 0.05, 0.9]), // C0 -> C2, 0.9
            image(3, 2, &[0.6, 0.3, 0.1]),   // C2 -> C0, 0.6
            image(4, 0, &[0.1, 0.2, 0.7]),   // C0 -> C2, 0.7 (equal to image 0: by index)
            image(5, 1, &[0.1, 0.5, 0.4]),   // right
            image(6, 0, &[0.3, 0.4, 0.3]),   // C0 -> C1, 0.4
        ];
        let pairs = most_confident_mistakes(&images, 2);
        let shown: Vec<Vec<(usize, usize, usize)>> =
            pairs.iter().map(|p| p.iter().map(|m| (m.label, m.predicted, m.index)).collect()).collect();
        assert_eq!(shown, vec![vec![(0, 1, 6)], vec![(0, 2, 2), (0, 2, 0)], vec![(2, 0, 3)]]);
        assert_eq!(pairs[1][0].probability, 0.9);
    }
}
