//! Drawing primitives of the synthetic photographs: a floating-point RGB canvas and the
//! rectangles, polygons, ellipses and strokes painted on it. Coordinates are in pixels as f32;
//! pixel (x, y) covers [x, x+1) × [y, y+1) and is "inside" a shape when its centre is.

pub(super) type Rgb = [f32; 3];
pub(super) type Pt = (f32, f32);

#[derive(Debug, Clone, Copy)]
pub(super) struct Rect {
    pub(super) x0: f32,
    pub(super) y0: f32,
    pub(super) x1: f32,
    pub(super) y1: f32,
}

impl Rect {
    pub(super) fn width(&self) -> f32 {
        self.x1 - self.x0
    }

    pub(super) fn height(&self) -> f32 {
        self.y1 - self.y0
    }

    pub(super) fn contains(&self, x: f32, y: f32) -> bool {
        x >= self.x0 && x < self.x1 && y >= self.y0 && y < self.y1
    }
}

/// Pixel indices whose centres lie in [a, b), clamped to 0..n.
pub(super) fn span(a: f32, b: f32, n: usize) -> std::ops::Range<usize> {
    let lo = (a - 0.5).ceil().max(0.0);
    let hi = (b - 0.5).ceil().max(0.0);
    (lo as usize).min(n)..(hi as usize).min(n)
}

pub(super) struct Canvas {
    pub(super) size: usize,
    pub(super) px: Vec<Rgb>,
}

impl Canvas {
    pub(super) fn new(size: usize) -> Self {
        Self { size, px: vec![[0.0; 3]; size * size] }
    }

    pub(super) fn bounds(&self) -> Rect {
        let s = self.size as f32;
        Rect { x0: 0.0, y0: 0.0, x1: s, y1: s }
    }

    pub(super) fn put(&mut self, x: usize, y: usize, c: Rgb, alpha: f32) {
        if x < self.size && y < self.size {
            let p = &mut self.px[y * self.size + x];
            for ch in 0..3 {
                p[ch] += (c[ch] - p[ch]) * alpha;
            }
        }
    }

    pub(super) fn fill_rect(&mut self, r: Rect, c: Rgb, alpha: f32) {
        for y in span(r.y0, r.y1, self.size) {
            for x in span(r.x0, r.x1, self.size) {
                self.put(x, y, c, alpha);
            }
        }
    }

    /// Even-odd fill of a simple polygon, restricted to `clip`.
    pub(super) fn fill_polygon(&mut self, pts: &[Pt], clip: Rect, c: Rgb, alpha: f32) {
        if pts.len() < 3 {
            return;
        }
        let (mut x0, mut y0, mut x1, mut y1) = (f32::MAX, f32::MAX, f32::MIN, f32::MIN);
        for &(x, y) in pts {
            x0 = x0.min(x);
            y0 = y0.min(y);
            x1 = x1.max(x);
            y1 = y1.max(y);
        }
        for py in span(y0.max(clip.y0), y1.min(clip.y1) + 1.0, self.size) {
            let cy = py as f32 + 0.5;
            for px in span(x0.max(clip.x0), x1.min(clip.x1) + 1.0, self.size) {
                let cx = px as f32 + 0.5;
                if clip.contains(cx, cy) && point_in_polygon(pts, cx, cy) {
                    self.put(px, py, c, alpha);
                }
            }
        }
    }

    /// Filled axis-aligned ellipse, restricted to `clip`.
    pub(super) fn fill_ellipse(&mut self, centre: Pt, rx: f32, ry: f32, clip: Rect, c: Rgb, alpha: f32) {
        if rx <= 0.0 || ry <= 0.0 {
            return;
        }
        let (ex, ey) = centre;
        for py in span(ey - ry, ey + ry, self.size) {
            let cy = py as f32 + 0.5;
            for px in span(ex - rx, ex + rx, self.size) {
                let cx = px as f32 + 0.5;
                let (dx, dy) = ((cx - ex) / rx, (cy - ey) / ry);
                if dx * dx + dy * dy <= 1.0 && clip.contains(cx, cy) {
                    self.put(px, py, c, alpha);
                }
            }
        }
    }

    /// A polyline of the given width, drawn by stamping along it every half pixel. Widths under
    /// 1.5 px become one-pixel-wide lines rather than vanishing between pixel centres.
    pub(super) fn stroke(&mut self, pts: &[Pt], width: f32, clip: Rect, c: Rgb) {
        let r = width / 2.0;
        for pair in pts.windows(2) {
            let ((ax, ay), (bx, by)) = (pair[0], pair[1]);
            let len = ((bx - ax).powi(2) + (by - ay).powi(2)).sqrt();
            let steps = (len * 2.0).ceil().max(1.0) as usize;
            for i in 0..=steps {
                let t = i as f32 / steps as f32;
                let (x, y) = (ax + (bx - ax) * t, ay + (by - ay) * t);
                if r < 0.75 {
                    if clip.contains(x, y) && x >= 0.0 && y >= 0.0 {
                        self.put(x as usize, y as usize, c, 1.0);
                    }
                } else {
                    self.fill_ellipse((x, y), r, r, clip, c, 1.0);
                }
            }
        }
    }
}

fn point_in_polygon(pts: &[Pt], x: f32, y: f32) -> bool {
    let mut inside = false;
    let mut j = pts.len() - 1;
    for i in 0..pts.len() {
        let (xi, yi) = pts[i];
        let (xj, yj) = pts[j];
        if (yi > y) != (yj > y) && x < (xj - xi) * (y - yi) / (yj - yi) + xi {
            inside = !inside;
        }
        j = i;
    }
    inside
}

pub(super) fn mix(a: Rgb, b: Rgb, t: f32) -> Rgb {
    [a[0] + (b[0] - a[0]) * t, a[1] + (b[1] - a[1]) * t, a[2] + (b[2] - a[2]) * t]
}

pub(super) fn scale(c: Rgb, k: f32) -> Rgb {
    [c[0] * k, c[1] * k, c[2] * k]
}

pub(super) fn grey(v: f32) -> Rgb {
    [v, v, v]
}
