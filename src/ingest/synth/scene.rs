//! The undamaged scene of a synthetic photograph: sky, clouds, ground and a facade with its
//! windows, door, cornice and drainpipe, drawn from the image's random generator and painted on
//! a [`Canvas`]; then lighting, colour temperature and sensor noise ([`finish`]).

use image::RgbImage;
use rand::{Rng, RngCore};
use rand_chacha::ChaCha8Rng;

use super::raster::{grey, mix, scale, span, Canvas, Pt, Rect, Rgb};

/// Uniform in [lo, hi); never panics on an empty range, unlike `random_range`, so degenerate
/// layouts at tiny image sizes cannot crash a render.
pub(super) fn unif(rng: &mut ChaCha8Rng, lo: f32, hi: f32) -> f32 {
    lo + (hi - lo) * rng.random::<f32>()
}

/// Uniform integer in lo..=hi (lo when the range is empty).
pub(super) fn int(rng: &mut ChaCha8Rng, lo: usize, hi: usize) -> usize {
    if hi <= lo {
        lo
    } else {
        rng.random_range(lo..=hi)
    }
}

fn jitter(rng: &mut ChaCha8Rng, c: Rgb, common: f32, each: f32) -> Rgb {
    let k = unif(rng, -common, common);
    [c[0] + k + unif(rng, -each, each), c[1] + k + unif(rng, -each, each), c[2] + k + unif(rng, -each, each)]
}

pub(super) struct Scene {
    /// Image size in pixels.
    pub(super) s: f32,
    pub(super) sky_top: Rgb,
    pub(super) sky_horizon: Rgb,
    pub(super) clouds: Vec<(Pt, f32, f32, f32)>,
    pub(super) ground_y: f32,
    pub(super) ground_top: Rgb,
    pub(super) ground_bottom: Rgb,
    pub(super) facade: Rect,
    pub(super) wall: Rgb,
    /// Relative brightness change from the facade's centre to its right edge (sun side).
    pub(super) light_slope: f32,
    pub(super) cornice: Option<(Rect, Rgb)>,
    pub(super) storey_lines: Vec<f32>,
    pub(super) pipe: Option<(Rect, Rgb)>,
    pub(super) windows: Vec<Rect>,
    pub(super) frame: Rgb,
    pub(super) glass: Rgb,
    pub(super) door: Option<(Rect, Rgb)>,
    pub(super) brightness: f32,
    pub(super) tint: f32,
    pub(super) noise: f32,
}

const WALL_PALETTE: [Rgb; 6] = [
    [205.0, 190.0, 160.0], // beige render
    [160.0, 88.0, 68.0],   // brick
    [168.0, 165.0, 158.0], // concrete
    [222.0, 212.0, 188.0], // cream
    [196.0, 152.0, 94.0],  // ochre
    [210.0, 172.0, 160.0], // pale pink
];

const GROUND_PALETTE: [Rgb; 3] = [
    [108.0, 108.0, 104.0], // asphalt
    [126.0, 104.0, 78.0],  // dirt
    [84.0, 116.0, 62.0],   // grass
];

impl Scene {
    pub(super) fn draw(rng: &mut ChaCha8Rng, s: f32) -> Self {
        // Sky: always clearly blue-dominant (b > g > r) so that exposed sky reads as sky.
        let r = unif(rng, 60.0, 140.0);
        let g = r + unif(rng, 15.0, 45.0);
        let b = unif(rng, (g + 25.0).max(185.0), 246.0);
        let sky_top = [r, g, b];
        let sky_horizon = mix(sky_top, [226.0, 232.0, 242.0], unif(rng, 0.45, 0.75));
        let ground_y = s * unif(rng, 0.78, 0.88);
        let n_clouds = int(rng, 0, 3);
        let clouds = (0..n_clouds)
            .map(|_| {
                let centre = (unif(rng, 0.0, s), unif(rng, 0.02 * s, 0.45 * s));
                (centre, s * unif(rng, 0.08, 0.2), s * unif(rng, 0.025, 0.06), unif(rng, 0.2, 0.45))
            })
            .collect();
        let ground = GROUND_PALETTE[int(rng, 0, GROUND_PALETTE.len() - 1)];
        let ground_top = jitter(rng, ground, 12.0, 6.0);
        let ground_bottom = scale(ground_top, unif(rng, 0.8, 1.1));

        // Facade: size and position jitter. Its top stays well below the image top so a
        // collapsed roofline has sky behind it.
        let fw = s * unif(rng, 0.52, 0.8);
        let fh = s * unif(rng, 0.45, 0.64);
        let cx = s * (0.5 + unif(rng, -0.09, 0.09));
        let x0 = (cx - fw / 2.0).max(0.04 * s);
        let x1 = (cx + fw / 2.0).min(0.96 * s);
        let y1 = ground_y + s * unif(rng, 0.0, 0.02);
        let y0 = (y1 - fh).max(0.1 * s);
        let facade = Rect { x0, y0, x1, y1 };
        let base_wall = WALL_PALETTE[int(rng, 0, WALL_PALETTE.len() - 1)];
        let mut wall = jitter(rng, base_wall, 14.0, 5.0);
        // Keep walls from turning blue, which would make them look like sky.
        wall[2] = wall[2].min(wall[0]);
        let light_slope = unif(rng, -0.14, 0.14);

        let cornice = if rng.random_bool(0.6) {
            let h = s * unif(rng, 0.015, 0.035);
            let over = s * unif(rng, 0.0, 0.015);
            let c = scale(wall, unif(rng, 0.75, 1.15));
            Some((Rect { x0: x0 - over, y0, x1: x1 + over, y1: y0 + h }, c))
        } else {
            None
        };
        let top = cornice.map_or(y0, |(r, _)| r.y1);

        // Window grid; rows limited so each storey stays at least ~9% of the image tall.
        let cols = int(rng, 2, 5);
        let max_rows = ((y1 - top) / (0.09 * s)).floor().max(1.0) as usize;
        let rows = int(rng, 2.min(max_rows), 4.min(max_rows));
        let margin_x = facade.width() * unif(rng, 0.06, 0.14);
        let margin_top = s * unif(rng, 0.01, 0.03);
        let cell_w = (facade.width() - 2.0 * margin_x) / cols as f32;
        let cell_h = (y1 - top - margin_top) / rows as f32;
        let win_w = cell_w * unif(rng, 0.42, 0.68);
        let win_h = cell_h * unif(rng, 0.45, 0.66);
        let has_door = rng.random_bool(0.6);
        let door_col = int(rng, 0, cols - 1);
        let door_colour = [unif(rng, 110.0, 150.0), unif(rng, 72.0, 98.0), unif(rng, 44.0, 68.0)];
        let mut windows = Vec::with_capacity(rows * cols);
        let mut door = None;
        let mut storey_lines = Vec::with_capacity(rows);
        for row in 0..rows {
            let cell_y = top + margin_top + row as f32 * cell_h;
            if row > 0 {
                storey_lines.push(cell_y);
            }
            for col in 0..cols {
                let wx = x0 + margin_x + col as f32 * cell_w + (cell_w - win_w) / 2.0;
                let wy = cell_y + (cell_h - win_h) * 0.4;
                if has_door && row + 1 == rows && col == door_col {
                    let dw = cell_w * unif(rng, 0.45, 0.65);
                    let dx = x0 + margin_x + col as f32 * cell_w + (cell_w - dw) / 2.0;
                    door = Some((Rect { x0: dx, y0: wy, x1: dx + dw, y1 }, door_colour));
                } else {
                    windows.push(Rect { x0: wx, y0: wy, x1: wx + win_w, y1: wy + win_h });
                }
            }
        }
        let frame = if rng.random_bool(0.5) {
            grey(unif(rng, 200.0, 235.0))
        } else {
            [unif(rng, 70.0, 95.0), unif(rng, 58.0, 75.0), unif(rng, 45.0, 60.0)]
        };
        // Glass is a dark, only slightly blue grey: bright enough not to read as a crack or a
        // hole, grey enough not to read as sky.
        let gr = unif(rng, 64.0, 88.0);
        let glass = [gr, gr + unif(rng, 2.0, 10.0), gr + unif(rng, 5.0, 18.0)];

        // A drainpipe: a straight dark line, a distractor for cracks at every level.
        let pipe = if rng.random_bool(0.4) {
            let w = s * unif(rng, 0.008, 0.016);
            let px = if rng.random_bool(0.5) { x0 + s * 0.01 } else { x1 - s * 0.01 - w };
            Some((Rect { x0: px, y0: top, x1: px + w, y1 }, grey(unif(rng, 62.0, 90.0))))
        } else {
            None
        };

        Scene {
            s,
            sky_top,
            sky_horizon,
            clouds,
            ground_y,
            ground_top,
            ground_bottom,
            facade,
            wall,
            light_slope,
            cornice,
            storey_lines,
            pipe,
            windows,
            frame,
            glass,
            door,
            brightness: unif(rng, 0.82, 1.12),
            tint: unif(rng, -0.05, 0.05),
            noise: unif(rng, 3.0, 7.0),
        }
    }

    pub(super) fn sky_at(&self, y: f32) -> Rgb {
        let t = (y / self.ground_y).clamp(0.0, 1.0);
        mix(self.sky_top, self.sky_horizon, t.powf(1.5))
    }

    fn wall_at(&self, x: f32) -> Rgb {
        let f = &self.facade;
        let u = (x - (f.x0 + f.x1) / 2.0) / (f.width() / 2.0).max(1.0);
        scale(self.wall, 1.0 + self.light_slope * u)
    }

    /// The facade including its cornice overhang: everything a collapse can remove.
    pub(super) fn building(&self) -> Rect {
        let f = self.facade;
        match self.cornice {
            Some((c, _)) => Rect { x0: f.x0.min(c.x0), x1: f.x1.max(c.x1), ..f },
            None => f,
        }
    }

    pub(super) fn paint(&self, canvas: &mut Canvas) {
        let n = canvas.size;
        let s = self.s;
        for y in 0..n {
            let cy = y as f32 + 0.5;
            let c = if cy < self.ground_y {
                self.sky_at(cy)
            } else {
                let t = (cy - self.ground_y) / (s - self.ground_y).max(1.0);
                mix(self.ground_top, self.ground_bottom, t)
            };
            canvas.px[y * n..(y + 1) * n].fill(c);
        }
        let all = canvas.bounds();
        for &(centre, rx, ry, alpha) in &self.clouds {
            let sky_clip = Rect { y1: self.ground_y, ..all };
            canvas.fill_ellipse(centre, rx, ry, sky_clip, [236.0, 240.0, 248.0], alpha);
        }

        let f = self.facade;
        for y in span(f.y0, f.y1, n) {
            for x in span(f.x0, f.x1, n) {
                let c = self.wall_at(x as f32 + 0.5);
                canvas.put(x, y, c, 1.0);
            }
        }
        for &ly in &self.storey_lines {
            let band = Rect { y0: ly - 0.006 * s, y1: ly + 0.006 * s, ..f };
            canvas.fill_rect(band, scale(self.wall, 0.86), 0.6);
        }
        if let Some((r, c)) = self.cornice {
            canvas.fill_rect(r, c, 1.0);
        }
        if let Some((r, c)) = self.pipe {
            canvas.fill_rect(r, c, 1.0);
        }
        let fw = 0.008 * s;
        for w in &self.windows {
            let outer = Rect { x0: w.x0 - fw, y0: w.y0 - fw, x1: w.x1 + fw, y1: w.y1 + fw };
            canvas.fill_rect(outer, self.frame, 1.0);
            self.paint_glass(canvas, *w);
            let sill = Rect { x0: w.x0 - 2.0 * fw, y0: w.y1 + fw, x1: w.x1 + 2.0 * fw, y1: w.y1 + 2.5 * fw };
            canvas.fill_rect(sill, scale(self.wall, 1.12), 1.0);
        }
        if let Some((r, c)) = self.door {
            let outer = Rect { x0: r.x0 - fw, y0: r.y0 - fw, x1: r.x1 + fw, ..r };
            canvas.fill_rect(outer, self.frame, 1.0);
            canvas.fill_rect(r, c, 1.0);
        }
    }

    /// Glass with a soft diagonal reflection streak.
    fn paint_glass(&self, canvas: &mut Canvas, w: Rect) {
        let n = canvas.size;
        for y in span(w.y0, w.y1, n) {
            let v = (y as f32 + 0.5 - w.y0) / w.height().max(1.0);
            for x in span(w.x0, w.x1, n) {
                let u = (x as f32 + 0.5 - w.x0) / w.width().max(1.0);
                let streak = (1.0 - ((u + v) - 0.9).abs() / 0.25).max(0.0);
                let c = self.glass;
                canvas.put(x, y, [c[0] + 16.0 * streak, c[1] + 16.0 * streak, c[2] + 16.0 * streak], 1.0);
            }
        }
    }
}

/// Lighting, colour temperature and sensor noise, then quantisation to 8 bits.
pub(super) fn finish(scene: &Scene, canvas: &Canvas, rng: &mut ChaCha8Rng, size: u32) -> RgbImage {
    let gain =
        [scene.brightness * (1.0 + scene.tint), scene.brightness, scene.brightness * (1.0 - scene.tint)];
    let mut img = RgbImage::new(size, size);
    // pixels_mut runs row by row, the canvas's own layout.
    for (p, c) in img.pixels_mut().zip(&canvas.px) {
        let bits = rng.next_u32();
        for ch in 0..3 {
            let byte = ((bits >> (8 * ch)) & 0xff) as f32;
            let noise = (byte / 255.0 - 0.5) * 2.0 * scene.noise;
            p.0[ch] = (c[ch] * gain[ch] + noise).round().clamp(0.0, 255.0) as u8;
        }
    }
    img
}
