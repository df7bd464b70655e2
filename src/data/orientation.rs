//! Exif orientation: which way up a photo is meant to be shown.
//!
//! Phones and many cameras store the sensor's pixels as read and record in the Exif tag 0x0112
//! how to turn them for display; every photo viewer applies it, torchvision's `ImageFolder` does
//! not. This module owns reading the Exif block (the `kamadak-exif` crate; [`read_exif`], which
//! [`crate::data::photo`] reads GPS and capture time from too) and the eight orientations'
//! geometry: mapping a rectangle of the displayed image back to the stored pixels, so that a
//! region decode still reads only what the transform needs, and turning decoded pixels the way
//! Pillow's `ImageOps.exif_transpose` does.

use std::io::Cursor;

use super::transforms::Crop;

/// The Exif orientation: how the stored pixels become the displayed image, in the tag's
/// numbering (1 = as stored ... 8), with the operation Pillow's `exif_transpose` applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Orientation {
    /// 1: as stored.
    Upright,
    /// 2: `FLIP_LEFT_RIGHT`.
    Mirrored,
    /// 3: `ROTATE_180`.
    UpsideDown,
    /// 4: `FLIP_TOP_BOTTOM`.
    Flipped,
    /// 5: `TRANSPOSE` (mirror along the main diagonal).
    Transposed,
    /// 6: `ROTATE_270` (a quarter turn clockwise): a phone held upright.
    TurnedRight,
    /// 7: `TRANSVERSE` (mirror along the other diagonal).
    Transversed,
    /// 8: `ROTATE_90` (a quarter turn anticlockwise).
    TurnedLeft,
}

impl Orientation {
    /// The orientation for a tag value; values outside 1..=8 mean upright, as Pillow treats them.
    pub fn from_tag(value: u32) -> Self {
        match value {
            2 => Self::Mirrored,
            3 => Self::UpsideDown,
            4 => Self::Flipped,
            5 => Self::Transposed,
            6 => Self::TurnedRight,
            7 => Self::Transversed,
            8 => Self::TurnedLeft,
            _ => Self::Upright,
        }
    }

    /// The tag value.
    pub fn tag(self) -> u16 {
        match self {
            Self::Upright => 1,
            Self::Mirrored => 2,
            Self::UpsideDown => 3,
            Self::Flipped => 4,
            Self::Transposed => 5,
            Self::TurnedRight => 6,
            Self::Transversed => 7,
            Self::TurnedLeft => 8,
        }
    }

    /// The orientation recorded in an encoded image's Exif data (JPEG APP1, PNG eXIf); upright
    /// when there is none or it cannot be read (a broken Exif block does not make the pixels
    /// unreadable, and Pillow then shows them as stored too).
    pub fn of(bytes: &[u8]) -> Self {
        read_exif(bytes).map_or(Self::Upright, |(exif, _)| Self::in_exif(&exif))
    }

    /// The orientation a read Exif block records; upright when it has none.
    pub fn in_exif(exif: &exif::Exif) -> Self {
        exif.get_field(exif::Tag::Orientation, exif::In::PRIMARY)
            .and_then(|field| field.value.get_uint(0))
            .map_or(Self::Upright, Self::from_tag)
    }

    /// Whether width and height trade places.
    pub fn swaps_sides(self) -> bool {
        matches!(self, Self::Transposed | Self::TurnedRight | Self::Transversed | Self::TurnedLeft)
    }

    /// The displayed size of a stored `width` x `height` image.
    pub fn displayed_size(self, width: u32, height: u32) -> (u32, u32) {
        if self.swaps_sides() {
            (height, width)
        } else {
            (width, height)
        }
    }

    /// The stored pixel shown at displayed position (`x`, `y`) of an image stored as `width` x
    /// `height`.
    fn stored(self, x: u32, y: u32, width: u32, height: u32) -> (u32, u32) {
        let (right, bottom) = (width - 1, height - 1);
        match self {
            Self::Upright => (x, y),
            Self::Mirrored => (right - x, y),
            Self::UpsideDown => (right - x, bottom - y),
            Self::Flipped => (x, bottom - y),
            Self::Transposed => (y, x),
            Self::TurnedRight => (y, bottom - x),
            Self::Transversed => (right - y, bottom - x),
            Self::TurnedLeft => (right - y, x),
        }
    }

    /// The rectangle of the stored `width` x `height` image that holds the displayed
    /// rectangle `shown` (which must be non-empty and inside the displayed image).
    pub fn stored_rect(self, shown: Crop, width: u32, height: u32) -> Crop {
        let a = self.stored(shown.left, shown.top, width, height);
        let b = self.stored(shown.left + shown.width - 1, shown.top + shown.height - 1, width, height);
        let (left, top) = (a.0.min(b.0), a.1.min(b.1));
        Crop { top, left, width: a.0.max(b.0) - left + 1, height: a.1.max(b.1) - top + 1 }
    }

    /// The displayed rectangle `shown` of an image stored as `width` x `height`, from `pixels`:
    /// the packed RGB rows of the stored rectangle `stored` (which holds it, see
    /// [`Orientation::stored_rect`]). Returns `shown`'s packed RGB rows (`pixels` themselves
    /// when upright).
    pub fn turn(self, pixels: Vec<u8>, stored: Crop, shown: Crop, width: u32, height: u32) -> Vec<u8> {
        if self == Self::Upright && stored == shown {
            return pixels;
        }
        let mut out = Vec::with_capacity(shown.width as usize * shown.height as usize * 3);
        for y in shown.top..shown.top + shown.height {
            for x in shown.left..shown.left + shown.width {
                let (sx, sy) = self.stored(x, y, width, height);
                let at =
                    ((sy - stored.top) as usize * stored.width as usize + (sx - stored.left) as usize) * 3;
                out.extend_from_slice(&pixels[at..at + 3]);
            }
        }
        out
    }

    /// The stored pixels of an image stored as `width` x `height` whose displayed image (of
    /// [`Orientation::displayed_size`]) is `shown`: what a camera writes for a photo it tags
    /// with this orientation.
    pub fn store(self, shown: &[u8], width: u32, height: u32) -> Vec<u8> {
        let (shown_w, shown_h) = self.displayed_size(width, height);
        let mut stored = vec![0u8; shown.len()];
        for y in 0..shown_h {
            for x in 0..shown_w {
                let (sx, sy) = self.stored(x, y, width, height);
                let from = (y as usize * shown_w as usize + x as usize) * 3;
                let to = (sy as usize * width as usize + sx as usize) * 3;
                stored[to..to + 3].copy_from_slice(&shown[from..from + 3]);
            }
        }
        stored
    }
}

/// What kamadak-exif says of a subdirectory (Exif, GPS) whose next-directory offset is not 0:
/// piexif writes none, so the bytes after its entries are read as one. Every entry has been
/// read by then, so nothing is lost, and exiftool and Pillow say nothing; neither does rtrain
/// (a campaign geotagged so would log it twice for every photo).
const NEXT_AFTER_SUBDIRECTORY: &str = "Unexpected next IFD";

/// An encoded image's Exif block (JPEG APP1, PNG eXIf) as far as it can be read, with why each
/// part that could not was skipped; None when there is none or not even its header can be read.
/// One bad part costs only itself, as in Pillow: a GPS directory without its next-directory
/// offset (a common Python geotagging tool writes them so) or a tag declaring more values than
/// the block holds would otherwise take the orientation and every other tag with it.
pub fn read_exif(bytes: &[u8]) -> Option<(exif::Exif, Vec<String>)> {
    let read = exif::Reader::new().continue_on_error(true).read_from_container(&mut Cursor::new(bytes));
    match read {
        Ok(exif) => Some((exif, Vec::new())),
        Err(exif::Error::PartialResult(partial)) => {
            let (exif, skipped) = partial.into_inner();
            let lost = skipped.iter().map(ToString::to_string).filter(|why| why != NEXT_AFTER_SUBDIRECTORY);
            Some((exif, lost.collect()))
        }
        Err(_) => None,
    }
}

/// The Exif block of a photo whose only tag is its orientation: what [`Orientation::of`] reads
/// and Pillow's `getexif` too. The bytes follow a JPEG APP1 marker and its length.
pub fn exif_block(orientation: Orientation) -> Vec<u8> {
    let mut block = b"Exif\0\0".to_vec();
    // TIFF header, little-endian, first IFD right after it at offset 8.
    block.extend_from_slice(b"II*\0");
    block.extend_from_slice(&8u32.to_le_bytes());
    // IFD0: one entry (tag, type SHORT = 3, count 1, value left-justified), no next IFD.
    block.extend_from_slice(&1u16.to_le_bytes());
    block.extend_from_slice(&0x0112u16.to_le_bytes());
    block.extend_from_slice(&3u16.to_le_bytes());
    block.extend_from_slice(&1u32.to_le_bytes());
    block.extend_from_slice(&orientation.tag().to_le_bytes());
    block.extend_from_slice(&[0, 0]);
    block.extend_from_slice(&0u32.to_le_bytes());
    block
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [Orientation; 8] = [
        Orientation::Upright,
        Orientation::Mirrored,
        Orientation::UpsideDown,
        Orientation::Flipped,
        Orientation::Transposed,
        Orientation::TurnedRight,
        Orientation::Transversed,
        Orientation::TurnedLeft,
    ];

    /// A 3 x 2 image whose pixel at (x, y) is [x, y, 0].
    fn labelled(width: u32, height: u32) -> Vec<u8> {
        (0..height).flat_map(|y| (0..width).flat_map(move |x| [x as u8, y as u8, 0])).collect()
    }

    #[test]
    fn a_quarter_turn_clockwise_puts_the_bottom_left_pixel_top_left() {
        // Stored 3 wide, 2 tall; shown 2 wide, 3 tall.
        let stored = Crop { top: 0, left: 0, width: 3, height: 2 };
        let shown = Crop { top: 0, left: 0, width: 2, height: 3 };
        let pixels = Orientation::TurnedRight.turn(labelled(3, 2), stored, shown, 3, 2);
        // Row 0 of the shown image is column 0 of the stored one read bottom up.
        assert_eq!(&pixels[..6], &[0, 1, 0, 0, 0, 0]);
        assert_eq!(&pixels[12..], &[2, 1, 0, 2, 0, 0]);
        let pixels = Orientation::TurnedLeft.turn(labelled(3, 2), stored, shown, 3, 2);
        assert_eq!(&pixels[..6], &[2, 0, 0, 2, 1, 0]);
    }

    #[test]
    fn a_shown_rectangle_comes_from_its_stored_rectangle_in_every_orientation() {
        let (width, height) = (7, 5);
        let all = Crop { top: 0, left: 0, width, height };
        for orientation in ALL {
            let (w, h) = orientation.displayed_size(width, height);
            let whole = orientation.turn(
                labelled(width, height),
                all,
                Crop { top: 0, left: 0, width: w, height: h },
                width,
                height,
            );
            let shown = Crop { top: 1, left: 2, width: w - 3, height: h - 2 };
            let stored = orientation.stored_rect(shown, width, height);
            let inside = {
                let mut rows = Vec::new();
                for y in stored.top..stored.top + stored.height {
                    let start = ((y * width + stored.left) * 3) as usize;
                    rows.extend_from_slice(
                        &labelled(width, height)[start..start + stored.width as usize * 3],
                    );
                }
                rows
            };
            let part = orientation.turn(inside, stored, shown, width, height);
            let expected: Vec<u8> = (shown.top..shown.top + shown.height)
                .flat_map(|y| {
                    let start = ((y * w + shown.left) * 3) as usize;
                    whole[start..start + shown.width as usize * 3].to_vec()
                })
                .collect();
            assert_eq!(part, expected, "{orientation:?}");
            assert_eq!(stored.width * stored.height, shown.width * shown.height, "{orientation:?}");
        }
    }

    #[test]
    fn the_tag_written_is_the_tag_read() {
        for orientation in ALL {
            let block = exif_block(orientation);
            // A minimal JPEG: SOI, APP1 with the block, EOI; the reader stops at the Exif.
            let mut jpeg = vec![0xFF, 0xD8, 0xFF, 0xE1];
            jpeg.extend_from_slice(&((block.len() + 2) as u16).to_be_bytes());
            jpeg.extend_from_slice(&block);
            jpeg.extend_from_slice(&[0xFF, 0xD9]);
            assert_eq!(Orientation::of(&jpeg), orientation);
        }
        assert_eq!(Orientation::of(b"not an image"), Orientation::Upright);
        assert_eq!(Orientation::from_tag(9), Orientation::Upright);
    }

    /// A JPEG holding `tiff` (a TIFF header and its directories) as its Exif block.
    fn jpeg_with_exif(tiff: &[u8]) -> Vec<u8> {
        let mut jpeg = vec![0xFF, 0xD8, 0xFF, 0xE1];
        jpeg.extend_from_slice(&((tiff.len() + 8) as u16).to_be_bytes());
        jpeg.extend_from_slice(b"Exif\0\0");
        jpeg.extend_from_slice(tiff);
        jpeg.extend_from_slice(&[0xFF, 0xD9]);
        jpeg
    }

    #[test]
    fn a_damaged_gps_directory_costs_only_itself() {
        let entry = |tag: u16, kind: u16, count: u32, value: [u8; 4]| {
            [&tag.to_le_bytes()[..], &kind.to_le_bytes(), &count.to_le_bytes(), &value].concat()
        };
        // IFD0 at 8: Orientation 6 and the GPS directory's offset, 8 + 2 + 2 * 12 + 4 = 38.
        let mut tiff = b"II*\0".to_vec();
        tiff.extend_from_slice(&8u32.to_le_bytes());
        tiff.extend_from_slice(&2u16.to_le_bytes());
        tiff.extend_from_slice(&entry(0x0112, 3, 1, [6, 0, 0, 0]));
        tiff.extend_from_slice(&entry(0x8825, 4, 1, 38u32.to_le_bytes()));
        tiff.extend_from_slice(&0u32.to_le_bytes());
        // The GPS directory: GPSLatitudeRef "N", then the block ends where its next-directory
        // offset should be.
        tiff.extend_from_slice(&1u16.to_le_bytes());
        tiff.extend_from_slice(&entry(0x0001, 2, 2, [b'N', 0, 0, 0]));
        let jpeg = jpeg_with_exif(&tiff);
        assert_eq!(Orientation::of(&jpeg), Orientation::TurnedRight);
        let (exif, skipped) = read_exif(&jpeg).unwrap();
        assert_eq!(skipped, ["Truncated next IFD offset"]);
        let latitude_ref = exif.get_field(exif::Tag::GPSLatitudeRef, exif::In::PRIMARY).unwrap();
        assert!(matches!(&latitude_ref.value, exif::Value::Ascii(v) if v == &[b"N".to_vec()]));

        // A tag declaring 0x7fffffff rationals (16 GiB) is skipped; the one after it is read.
        let mut tiff = b"II*\0".to_vec();
        tiff.extend_from_slice(&8u32.to_le_bytes());
        tiff.extend_from_slice(&2u16.to_le_bytes());
        tiff.extend_from_slice(&entry(0x010F, 5, 0x7fff_ffff, 8u32.to_le_bytes()));
        tiff.extend_from_slice(&entry(0x0112, 3, 1, [8, 0, 0, 0]));
        tiff.extend_from_slice(&0u32.to_le_bytes());
        let (exif, skipped) = read_exif(&jpeg_with_exif(&tiff)).unwrap();
        assert_eq!((Orientation::in_exif(&exif), skipped.len()), (Orientation::TurnedLeft, 1));
        assert!(read_exif(b"not an image").is_none());
    }
}
