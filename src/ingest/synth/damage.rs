//! Damage painted over a scene, by level: stains, cracks, broken windows, a collapsed part of
//! the building and rubble. Ranges overlap between neighbouring levels on purpose: a classifier
//! should have to weigh several cues, not count one feature.

use std::f32::consts::TAU;

use rand::Rng;
use rand_chacha::ChaCha8Rng;

use super::raster::{grey, mix, scale, span, Canvas, Pt, Rect, Rgb};
use super::scene::{int, unif, Scene};

pub(super) fn damage(level: usize, scene: &Scene, canvas: &mut Canvas, rng: &mut ChaCha8Rng) {
    let s = scene.s;
    let px = s / 96.0; // widths below are tuned for 96-pixel images
    let f = scene.facade;

    // Stains are distractors: darker blotches that are not cracks, most common on intact walls.
    let stains = match level {
        0 => int(rng, 0, 3),
        _ => int(rng, 0, 2),
    };
    for _ in 0..stains {
        stain(scene, canvas, rng);
    }

    let crack_colour =
        |rng: &mut ChaCha8Rng| [unif(rng, 25.0, 45.0), unif(rng, 22.0, 40.0), unif(rng, 20.0, 35.0)];
    match level {
        0 => {
            // A faint hairline: wall-toned, not crack-dark.
            if rng.random_bool(0.25) {
                let c = scale(scene.wall, unif(rng, 0.55, 0.7));
                let len = s * unif(rng, 0.05, 0.12);
                crack(scene, canvas, rng, 1.0 * px, len, c);
            }
        }
        1 => {
            for _ in 0..int(rng, 1, 4) {
                let c = crack_colour(rng);
                let w = unif(rng, 0.9, 1.4) * px;
                let len = s * unif(rng, 0.08, 0.22);
                crack(scene, canvas, rng, w, len, c);
            }
        }
        _ => {
            let (n, wmax) = if level == 2 { (int(rng, 3, 8), 2.4) } else { (int(rng, 2, 7), 2.6) };
            for _ in 0..n {
                let c = crack_colour(rng);
                let w = unif(rng, 1.1, wmax) * px;
                let len = s * unif(rng, 0.12, 0.34);
                crack(scene, canvas, rng, w, len, c);
            }
        }
    }

    let broken = match level {
        0 => 0,
        1 => usize::from(rng.random_bool(0.35)),
        2 => int(rng, 1, 3),
        _ => int(rng, 2, 2 + scene.windows.len() / 2),
    };
    let mut order: Vec<usize> = (0..scene.windows.len()).collect();
    for i in 0..broken.min(order.len()) {
        let j = int(rng, i, order.len() - 1);
        order.swap(i, j);
        break_window(scene, canvas, rng, scene.windows[order[i]]);
    }

    match level {
        0 => {}
        1 => {
            // Occasionally a few fallen fragments, no pile.
            if rng.random_bool(0.2) {
                let w = f.width() * unif(rng, 0.1, 0.25);
                let x = unif(rng, f.x0 + w / 2.0, f.x1 - w / 2.0);
                let loose = int(rng, 3, 8);
                rubble(scene, canvas, rng, x, w, 0.0, loose);
            }
        }
        2 => {
            // Now and then a small bite out of the roofline, overlapping with level 3.
            if rng.random_bool(0.15) {
                collapse(scene, canvas, rng, false);
            }
            if rng.random_bool(0.85) {
                let w = f.width() * unif(rng, 0.15, 0.4);
                let x = unif(rng, f.x0 + w / 2.0, f.x1 - w / 2.0);
                let h = s * unif(rng, 0.035, 0.08);
                rubble(scene, canvas, rng, x, w, h, 0);
            }
        }
        _ => {
            let cut_x = collapse(scene, canvas, rng, true);
            let w = f.width() * unif(rng, 0.4, 0.9);
            let x = (cut_x + unif(rng, -0.1, 0.1) * f.width()).clamp(f.x0, f.x1);
            let h = s * unif(rng, 0.07, 0.16);
            rubble(scene, canvas, rng, x, w, h, 0);
        }
    }
}

fn stain(scene: &Scene, canvas: &mut Canvas, rng: &mut ChaCha8Rng) {
    let f = scene.facade;
    let s = scene.s;
    let centre = (unif(rng, f.x0, f.x1), unif(rng, f.y0, f.y1));
    let r = s * unif(rng, 0.02, 0.06);
    let colour = mix(scale(scene.wall, unif(rng, 0.55, 0.8)), [110.0, 92.0, 62.0], unif(rng, 0.0, 0.4));
    let alpha = unif(rng, 0.25, 0.5);
    for _ in 0..int(rng, 2, 4) {
        let c = (centre.0 + unif(rng, -r, r), centre.1 + unif(rng, -r, r) * 0.6);
        let rx = r * unif(rng, 0.5, 1.0);
        // Run-off streaks are taller than wide.
        let ry = rx * unif(rng, 1.0, 2.5);
        canvas.fill_ellipse(c, rx, ry, f, colour, alpha);
    }
}

/// A random-walk polyline from a random point or window corner, with an occasional branch.
fn crack(scene: &Scene, canvas: &mut Canvas, rng: &mut ChaCha8Rng, width: f32, length: f32, c: Rgb) {
    let f = scene.facade;
    let start = if !scene.windows.is_empty() && rng.random_bool(0.5) {
        // Cracks like to start at window corners, where stress concentrates.
        let w = scene.windows[int(rng, 0, scene.windows.len() - 1)];
        match int(rng, 0, 3) {
            0 => (w.x0, w.y0),
            1 => (w.x1, w.y0),
            2 => (w.x0, w.y1),
            _ => (w.x1, w.y1),
        }
    } else {
        (unif(rng, f.x0, f.x1), unif(rng, f.y0, f.y1))
    };
    let step = (scene.s * 0.02).max(1.0);
    let angle = unif(rng, 0.0, TAU);
    let pts = walk(rng, start, angle, step, length);
    canvas.stroke(&pts, width, f, c);
    if pts.len() > 3 && rng.random_bool(0.35) {
        let from = pts[pts.len() / 2];
        let turn = unif(rng, -1.2, 1.2);
        let branch = walk(rng, from, angle + turn, step, length * 0.45);
        canvas.stroke(&branch, (width * 0.7).max(1.0), f, c);
    }
}

fn walk(rng: &mut ChaCha8Rng, start: Pt, mut angle: f32, step: f32, length: f32) -> Vec<Pt> {
    let n = ((length / step).ceil() as usize).max(2);
    let mut pts = Vec::with_capacity(n + 1);
    let mut p = start;
    pts.push(p);
    for _ in 0..n {
        angle += unif(rng, -0.7, 0.7);
        p = (p.0 + step * angle.cos(), p.1 + step * angle.sin());
        pts.push(p);
    }
    pts
}

/// A dark hole with a few jagged shards of glass left along the frame.
fn break_window(scene: &Scene, canvas: &mut Canvas, rng: &mut ChaCha8Rng, w: Rect) {
    canvas.fill_rect(w, grey(unif(rng, 10.0, 26.0)), 1.0);
    for _ in 0..int(rng, 2, 5) {
        let (t0, t1) = (unif(rng, 0.0, 1.0), unif(rng, 0.0, 1.0));
        let depth = unif(rng, 0.2, 0.6);
        let tip = unif(rng, 0.0, 1.0);
        let (dx, dy) = (w.width(), w.height());
        let tri = match int(rng, 0, 3) {
            0 => [(w.x0 + t0 * dx, w.y0), (w.x0 + t1 * dx, w.y0), (w.x0 + tip * dx, w.y0 + depth * dy)],
            1 => [(w.x0 + t0 * dx, w.y1), (w.x0 + t1 * dx, w.y1), (w.x0 + tip * dx, w.y1 - depth * dy)],
            2 => [(w.x0, w.y0 + t0 * dy), (w.x0, w.y0 + t1 * dy), (w.x0 + depth * dx, w.y0 + tip * dy)],
            _ => [(w.x1, w.y0 + t0 * dy), (w.x1, w.y0 + t1 * dy), (w.x1 - depth * dx, w.y0 + tip * dy)],
        };
        canvas.fill_polygon(&tri, w, scale(scene.glass, unif(rng, 0.95, 1.3)), 1.0);
    }
}

/// Removes part of the building, repainting sky behind a jagged broken edge. `severe` takes a
/// large corner or roofline chunk; otherwise a small bite out of the roofline. Returns the
/// horizontal centre of the removed part, where the rubble should fall.
fn collapse(scene: &Scene, canvas: &mut Canvas, rng: &mut ChaCha8Rng, severe: bool) -> f32 {
    let b = scene.building();
    let s = scene.s;
    let n = canvas.size;
    let (bw, bh) = (b.width(), b.height());
    // Depth profile over the cut span, as a function of u in [0, 1] across it.
    let corner = severe && rng.random_bool(0.6);
    let (x_start, x_end, depth_max, shape) = if corner {
        let w = bw * unif(rng, 0.3, 0.6);
        let right = rng.random_bool(0.5);
        let p = unif(rng, 0.6, 1.5);
        if right {
            (b.x1 - w, b.x1 + 1.0, bh * unif(rng, 0.4, 0.8), Shape::RampUp(p))
        } else {
            (b.x0 - 1.0, b.x0 + w, bh * unif(rng, 0.4, 0.8), Shape::RampDown(p))
        }
    } else {
        let (wlo, whi, dlo, dhi) = if severe { (0.3, 0.55, 0.35, 0.7) } else { (0.08, 0.2, 0.05, 0.12) };
        let w = bw * unif(rng, wlo, whi);
        let x = unif(rng, b.x0, b.x1 - w);
        (x, x + w, bh * unif(rng, dlo, dhi), Shape::Notch(unif(rng, 0.7, 2.0)))
    };

    let cols = span(x_start, x_end, n);
    let mut cut = vec![false; n * n];
    let mut jag = 0.0f32;
    let jag_step = s * 0.02;
    let jag_max = s * 0.05;
    for x in cols.clone() {
        let u = ((x as f32 + 0.5 - x_start) / (x_end - x_start).max(1.0)).clamp(0.0, 1.0);
        jag = (jag + unif(rng, -jag_step, jag_step)).clamp(-jag_max, jag_max);
        let depth = (depth_max * shape.at(u) + jag).max(0.0);
        for y in span(b.y0, b.y0 + depth, n) {
            if b.contains(x as f32 + 0.5, y as f32 + 0.5) {
                cut[y * n + x] = true;
                canvas.px[y * n + x] = scene.sky_at(y as f32 + 0.5);
            }
        }
    }

    // Broken concrete showing along the new edge.
    let rim_colour = grey(unif(rng, 72.0, 100.0));
    let rim = if s >= 128.0 { 2 } else { 1 };
    let mut rim_pts = Vec::new();
    for y in span(b.y0, b.y1, n) {
        for x in span(b.x0, b.x1, n) {
            if cut[y * n + x] {
                continue;
            }
            let near_cut = (y.saturating_sub(rim)..=(y + rim).min(n - 1))
                .any(|yy| (x.saturating_sub(rim)..=(x + rim).min(n - 1)).any(|xx| cut[yy * n + xx]));
            if near_cut {
                canvas.put(x, y, rim_colour, 1.0);
                rim_pts.push((x as f32 + 0.5, y as f32 + 0.5));
            }
        }
    }
    // Bent reinforcement bars and, for severe damage, a slab hanging at an angle.
    if !rim_pts.is_empty() {
        let all = canvas.bounds();
        for _ in 0..int(rng, if severe { 2 } else { 0 }, if severe { 5 } else { 2 }) {
            let p = rim_pts[int(rng, 0, rim_pts.len() - 1)];
            let a = unif(rng, -2.8, -0.3); // pointing up into the gap
            let len = s * unif(rng, 0.02, 0.05);
            let q = (p.0 + len * a.cos(), p.1 + len * a.sin());
            canvas.stroke(&[p, q], 1.0, all, grey(unif(rng, 40.0, 62.0)));
        }
        if severe && rng.random_bool(0.5) {
            let p = rim_pts[int(rng, 0, rim_pts.len() - 1)];
            let a = unif(rng, 0.35, 0.9) * if rng.random_bool(0.5) { 1.0 } else { -1.0 };
            let len = s * unif(rng, 0.08, 0.15);
            let th = s * unif(rng, 0.015, 0.03);
            let (dx, dy) = (len * a.cos(), len * a.sin().abs());
            let dir = if p.0 < (b.x0 + b.x1) / 2.0 { 1.0 } else { -1.0 };
            let slab = [p, (p.0 + dir * dx, p.1 + dy), (p.0 + dir * dx, p.1 + dy + th), (p.0, p.1 + th)];
            canvas.fill_polygon(&slab, all, scale(scene.wall, unif(rng, 0.55, 0.8)), 1.0);
        }
    }
    (x_start.max(b.x0) + x_end.min(b.x1)) / 2.0
}

#[derive(Debug, Clone, Copy)]
enum Shape {
    /// Depth grows towards u = 1 (the right-hand corner is gone).
    RampUp(f32),
    /// Depth grows towards u = 0 (the left-hand corner is gone).
    RampDown(f32),
    /// Deepest in the middle.
    Notch(f32),
}

impl Shape {
    fn at(self, u: f32) -> f32 {
        match self {
            Shape::RampUp(p) => u.powf(p),
            Shape::RampDown(p) => (1.0 - u).powf(p),
            Shape::Notch(p) => 1.0 - (2.0 * u - 1.0).abs().powf(p),
        }
    }
}

/// A mound of debris `height` tall and `width` wide at the facade's base, centred on `cx`,
/// strewn with angular chunks. `height` 0 gives `loose` scattered fragments and no mound.
fn rubble(
    scene: &Scene,
    canvas: &mut Canvas,
    rng: &mut ChaCha8Rng,
    cx: f32,
    width: f32,
    height: f32,
    loose: usize,
) {
    let s = scene.s;
    let n = canvas.size;
    let base = scene.facade.y1 + s * 0.01;
    let half = width / 2.0;
    let dust = mix(scale(scene.wall, 0.75), [122.0, 116.0, 106.0], 0.4);
    let all = canvas.bounds();

    let mut profile = Vec::new();
    if height > 0.0 {
        let mut jag = 0.0f32;
        for x in span(cx - half, cx + half, n) {
            let u = (x as f32 + 0.5 - cx) / half.max(1.0);
            jag = (jag + unif(rng, -0.06, 0.06)).clamp(-0.2, 0.2);
            let h = height * (1.0 - u * u).max(0.0).powf(0.6) * (1.0 + jag);
            for y in span(base - h, base, n) {
                let t = (base - (y as f32 + 0.5)) / height.max(1.0);
                canvas.put(x, y, scale(dust, 0.85 + 0.2 * t), 1.0);
            }
            profile.push((x as f32 + 0.5, h));
        }
    }

    let chunks = if height > 0.0 {
        ((width * height) / (s * s) * 2200.0).round().clamp(4.0, 400.0) as usize
    } else {
        loose
    };
    for _ in 0..chunks {
        let (x, y) = if profile.is_empty() {
            (cx + unif(rng, -half, half), base - unif(rng, 0.0, 0.02 * s))
        } else {
            let (x, h) = profile[int(rng, 0, profile.len() - 1)];
            (x, base - h * unif(rng, 0.0, 1.0))
        };
        let r = s * unif(rng, 0.008, 0.025);
        let colour = match int(rng, 0, 9) {
            0..=3 => scale(scene.wall, unif(rng, 0.6, 1.0)),
            4..=7 => grey(unif(rng, 105.0, 170.0)),
            _ => grey(unif(rng, 25.0, 50.0)), // shadowed gaps between chunks
        };
        let a0 = unif(rng, 0.0, TAU);
        let quad: Vec<Pt> = (0..4)
            .map(|k| {
                let a = a0 + k as f32 * TAU / 4.0 + unif(rng, -0.4, 0.4);
                let rr = r * unif(rng, 0.6, 1.2);
                (x + rr * a.cos(), y + rr * a.sin())
            })
            .collect();
        canvas.fill_polygon(&quad, all, colour, 1.0);
    }
}

#[cfg(test)]
mod tests {
    use super::super::render;
    use image::RgbImage;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    fn luma(p: &image::Rgb<u8>) -> f32 {
        0.299 * p.0[0] as f32 + 0.587 * p.0[1] as f32 + 0.114 * p.0[2] as f32
    }

    /// Fraction of near-black pixels: cracks, holes of broken windows, rubble shadows.
    fn dark_fraction(img: &RgbImage) -> f32 {
        let n = img.pixels().filter(|p| luma(p) < 55.0).count();
        n as f32 / (img.width() * img.height()) as f32
    }

    /// Fraction of clearly blue pixels: sky, including sky showing where the building is gone.
    fn sky_fraction(img: &RgbImage) -> f32 {
        let n = img
            .pixels()
            .filter(|p| {
                let [r, g, b] = p.0.map(f32::from);
                b > r + 30.0 && b > g + 10.0
            })
            .count();
        n as f32 / (img.width() * img.height()) as f32
    }

    #[test]
    fn damage_statistics_grow_with_level() {
        const N: u64 = 20;
        let mut dark = [0.0f32; 4];
        let mut sky = [0.0f32; 4];
        for i in 0..N {
            for level in 0..4 {
                // Same seed at every level: same building, different damage.
                let mut rng = ChaCha8Rng::seed_from_u64(1000 + i);
                let img = render(level, &mut rng, 64);
                dark[level] += dark_fraction(&img) / N as f32;
                sky[level] += sky_fraction(&img) / N as f32;
            }
        }
        assert!(dark[0] < 0.01, "intact facades should be almost free of dark pixels: {dark:?}");
        assert!(dark[1] > dark[0] + 0.005, "{dark:?}");
        assert!(dark[2] > dark[1] + 0.01, "{dark:?}");
        assert!(dark[3] > dark[1] + 0.01, "{dark:?}");
        assert!(sky[3] > sky[2] + 0.02, "collapse should expose sky: {sky:?}");
        assert!((sky[1] - sky[0]).abs() < 0.01, "{sky:?}");
    }
}
