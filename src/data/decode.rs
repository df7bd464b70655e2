//! Encoded images to RGB8 pixels.
//!
//! JPEGs go through libjpeg-turbo (`src/shim/jpeg_shim.c`), the library Pillow uses, set up as
//! Pillow sets it up, so rtrain sees the pixels torchvision sees. A training crop usually
//! covers part of a photo, so [`decode_region`] reads the header first, lets the caller choose
//! the rectangle it will read (drawing its random crop from the image size), and decodes only
//! that: rows above and below are skipped and columns outside are cropped. PNGs and JPEGs that
//! libjpeg cannot turn into RGB (CMYK) go through the `image` crate, whole.
//!
//! Two departures from Pillow's default pixels are the caller's choice ([`decode_request`]): a
//! JPEG may be decoded reduced to 1/2, 1/4 or 1/8 of its size in the DCT domain (Pillow's
//! `Image.draft`), which makes a camera photo several times cheaper to decode when the network
//! sees 244 pixels of it; and the Exif orientation may be applied (Pillow's
//! `ImageOps.exif_transpose`), in which case the caller sees the photo's displayed size and
//! asks for rectangles of the displayed image.
//!
//! Photos come from elsewhere, so the size a header declares is checked before a pixel is
//! decoded ([`DecodeOptions::max_pixels`], Pillow's decompression-bomb check): a 1.6 KB JPEG
//! may declare 65500 x 65500 pixels, 12 GB of RGB.

use std::ffi::{c_char, c_int, CStr};
use std::marker::PhantomData;
use std::ptr::NonNull;

use image::RgbImage;

use super::orientation::Orientation;
use super::transforms::Crop;
pub use super::transforms::DEFAULT_MAX_IMAGE_PIXELS;

/// Why an image could not be decoded.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    /// libjpeg's complaint about a JPEG.
    #[error("JPEG: {0}")]
    Jpeg(String),
    /// The `image` crate's complaint about another format.
    #[error(transparent)]
    Image(#[from] image::ImageError),
    /// The header declares more pixels than [`DecodeOptions::max_pixels`].
    #[error(
        "{width}x{height} is {} pixels, above the limit of {limit} (data.max_image_pixels): \
         refused before decoding, as Pillow refuses a decompression bomb",
        u64::from(*width) * u64::from(*height)
    )]
    TooManyPixels { width: u32, height: u32, limit: u64 },
}

/// An image file larger than this is refused unread: no photo comes near it, and an
/// uncompressed PNG at the default pixel limit is 537 MB.
pub const MAX_IMAGE_FILE_BYTES: u64 = 1 << 30;

/// What a caller asks of every image it decodes, whatever the image holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeOptions {
    /// Show the photo as its Exif orientation says: sizes and rectangles are then of the
    /// displayed image (`data.exif_orientation`).
    pub exif_orientation: bool,
    /// An image whose header declares more pixels is refused before it is decoded
    /// (`data.max_image_pixels`).
    pub max_pixels: u64,
}

impl Default for DecodeOptions {
    /// As stored (no Exif orientation), at the default pixel limit.
    fn default() -> Self {
        DecodeOptions { exif_orientation: false, max_pixels: DEFAULT_MAX_IMAGE_PIXELS }
    }
}

impl DecodeOptions {
    fn check_size(&self, width: u32, height: u32) -> Result<(), DecodeError> {
        if u64::from(width) * u64::from(height) > self.max_pixels {
            return Err(DecodeError::TooManyPixels { width, height, limit: self.max_pixels });
        }
        Ok(())
    }
}

/// Decoded pixels of a rectangle of an image: packed RGB rows.
pub struct Region {
    /// `3 * rect.width * rect.height` bytes.
    pub pixels: Vec<u8>,
    /// Where the pixels sit in the image as decoded (reduced by `reduction`).
    pub rect: Crop,
    /// The image was decoded at 1/`reduction` of its size: 1, 2, 4 or 8.
    pub reduction: u32,
}

use super::transforms::REDUCTIONS;

/// The length of a side of `len` pixels decoded at 1/`reduction` of its size (libjpeg rounds
/// up).
pub fn reduced_len(len: u32, reduction: u32) -> u32 {
    len.div_ceil(reduction.max(1))
}

/// What [`decode_request`]'s caller asks for, given the image's size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    /// Decode at 1/`reduction` of the size: 1, 2, 4 or 8 (a PNG is always decoded at 1).
    pub reduction: u32,
    /// The rectangle wanted, in the reduced image (of [`reduced_len`] sides).
    pub rect: Crop,
}

/// Decodes the whole image (grey, 16-bit and alpha converted to RGB8, alpha dropped, as
/// Pillow's `convert("RGB")` does).
///
/// # Errors
/// The decoder's complaint when `bytes` is not a readable image.
pub fn decode(bytes: &[u8]) -> Result<RgbImage, DecodeError> {
    decode_whole(bytes, DecodeOptions::default(), |_, _| 1)
}

/// Decodes the part of an image that `choose` asks for, given the image's width and height, at
/// full size and as stored (no Exif orientation), at the default pixel limit: the pixels
/// torchvision + Pillow see. The result may be larger than asked (a PNG is decoded whole);
/// `None` decodes nothing. `choose` is called exactly once for a readable header.
///
/// # Errors
/// The decoder's complaint when `bytes` is not a readable image.
///
/// # Panics
/// If `choose` returns a rectangle outside the image (a caller bug).
pub fn decode_region(
    bytes: &[u8],
    choose: impl FnOnce(u32, u32) -> Option<Crop>,
) -> Result<Region, DecodeError> {
    decode_request(bytes, DecodeOptions::default(), |width, height| {
        choose(width, height).map(|rect| Request { reduction: 1, rect })
    })
}

/// Decodes what `choose` asks for, given the image's width and height (as displayed when
/// `options.exif_orientation`, else as stored): a rectangle of the image reduced by a factor
/// of its choice. The result may differ from the request: a PNG is decoded whole at full size,
/// so read [`Region::reduction`] and [`Region::rect`]. `None` decodes nothing. `choose` is
/// called exactly once for a readable header within the pixel limit.
///
/// # Errors
/// The decoder's complaint when `bytes` is not a readable image; [`DecodeError::TooManyPixels`]
/// when its header declares more than `options.max_pixels`.
///
/// # Panics
/// If `choose` returns a rectangle outside the reduced image or a reduction other than 1, 2, 4
/// or 8 (caller bugs).
pub fn decode_request(
    bytes: &[u8],
    options: DecodeOptions,
    choose: impl FnOnce(u32, u32) -> Option<Request>,
) -> Result<Region, DecodeError> {
    let orientation = if options.exif_orientation { Orientation::of(bytes) } else { Orientation::Upright };
    if is_jpeg(bytes) {
        let jpeg = Jpeg::open(bytes)?;
        options.check_size(jpeg.width, jpeg.height)?;
        // A region decode stops after the region's last row, so libjpeg would notice a
        // truncated file only when the crop reached the missing part. Pillow refuses every
        // truncated file; so does this check, whatever the crop: the end-of-image marker must
        // follow the scan data (which cannot contain it).
        if !bytes[jpeg.scan_offset.min(bytes.len())..].windows(2).rev().any(|w| w == [0xFF, 0xD9]) {
            return Err(DecodeError::Jpeg("premature end of JPEG data (the file is truncated)".into()));
        }
        // libjpeg makes RGB from grey and YCbCr; CMYK and YCCK are left to the image crate.
        if jpeg.components == 1 || jpeg.components == 3 {
            let (width, height) = orientation.displayed_size(jpeg.width, jpeg.height);
            let Some(Request { reduction, rect }) =
                choose(width, height).filter(|r| r.rect.width > 0 && r.rect.height > 0)
            else {
                return Ok(Region {
                    pixels: Vec::new(),
                    rect: Crop { top: 0, left: 0, height: 0, width: 0 },
                    reduction: 1,
                });
            };
            assert!(REDUCTIONS.contains(&reduction), "reduction {reduction} is not 1, 2, 4 or 8");
            let (stored_w, stored_h) =
                (reduced_len(jpeg.width, reduction), reduced_len(jpeg.height, reduction));
            let (shown_w, shown_h) = orientation.displayed_size(stored_w, stored_h);
            assert!(
                rect.left + rect.width <= shown_w && rect.top + rect.height <= shown_h,
                "region {rect:?} lies outside the {shown_w}x{shown_h} image"
            );
            let stored = orientation.stored_rect(rect, stored_w, stored_h);
            let pixels = jpeg.read(reduction, stored)?;
            let pixels = orientation.turn(pixels, stored, rect, stored_w, stored_h);
            return Ok(Region { pixels, rect, reduction });
        }
    }
    // The header alone first (cheap); `load_from_memory` then decodes under the image crate's
    // own allocation limit too.
    let header = image::ImageReader::new(std::io::Cursor::new(bytes))
        .with_guessed_format()
        .map_err(image::ImageError::IoError)?;
    let (declared_w, declared_h) = header.into_dimensions()?;
    options.check_size(declared_w, declared_h)?;
    let image = image::load_from_memory(bytes)?.into_rgb8();
    let (stored_w, stored_h) = image.dimensions();
    let (width, height) = orientation.displayed_size(stored_w, stored_h);
    // Called for its side effects (the caller's random draws), whatever it asks for.
    let _ = choose(width, height);
    let all = Crop { top: 0, left: 0, height: stored_h, width: stored_w };
    let rect = Crop { top: 0, left: 0, height, width };
    let pixels = orientation.turn(image.into_raw(), all, rect, stored_w, stored_h);
    Ok(Region { pixels, rect, reduction: 1 })
}

/// Decodes the whole image, reduced by the factor `reduction_for` picks from its width and
/// height (as displayed when `options.exif_orientation`), and turned upright when it is.
///
/// # Errors
/// As [`decode_request`].
pub fn decode_whole(
    bytes: &[u8],
    options: DecodeOptions,
    reduction_for: impl FnOnce(u32, u32) -> u32,
) -> Result<RgbImage, DecodeError> {
    let region = decode_request(bytes, options, |width, height| {
        let reduction = reduction_for(width, height);
        let (width, height) = (reduced_len(width, reduction), reduced_len(height, reduction));
        Some(Request { reduction, rect: Crop { top: 0, left: 0, height, width } })
    })?;
    let Crop { width, height, .. } = region.rect;
    Ok(RgbImage::from_raw(width, height, region.pixels).expect("a region holds width * height RGB pixels"))
}

/// JPEG's start-of-image marker followed by the start of another marker.
fn is_jpeg(bytes: &[u8]) -> bool {
    bytes.starts_with(&[0xFF, 0xD8, 0xFF])
}

/// The shim's decoder state (opaque here).
#[repr(C)]
struct RawJpeg {
    _private: [u8; 0],
}

extern "C" {
    fn rtrain_jpeg_open(
        data: *const u8,
        len: usize,
        width: *mut u32,
        height: *mut u32,
        components: *mut c_int,
        scan_offset: *mut usize,
        error: *mut c_char,
        error_len: usize,
    ) -> *mut RawJpeg;
    fn rtrain_jpeg_read(
        jpeg: *mut RawJpeg,
        reduction: u32,
        left: u32,
        top: u32,
        cols: u32,
        rows: u32,
        out: *mut u8,
        error: *mut c_char,
        error_len: usize,
    ) -> c_int;
    fn rtrain_jpeg_close(jpeg: *mut RawJpeg);
}

/// A JPEG whose header has been read, borrowing its bytes (libjpeg reads them in place).
struct Jpeg<'a> {
    raw: NonNull<RawJpeg>,
    width: u32,
    height: u32,
    components: c_int,
    /// Where the entropy-coded data of the first scan starts.
    scan_offset: usize,
    bytes: PhantomData<&'a [u8]>,
}

/// Room for libjpeg's longest message (`JMSG_LENGTH_MAX` is 200).
const MESSAGE_LEN: usize = 256;

fn message(buffer: &[c_char; MESSAGE_LEN]) -> String {
    // SAFETY: the buffer was zeroed and the shim writes a NUL-terminated string that fits.
    unsafe { CStr::from_ptr(buffer.as_ptr()) }.to_string_lossy().into_owned()
}

impl<'a> Jpeg<'a> {
    fn open(bytes: &'a [u8]) -> Result<Self, DecodeError> {
        let (mut width, mut height, mut components, mut scan_offset) = (0u32, 0u32, 0 as c_int, 0usize);
        let mut error = [0 as c_char; MESSAGE_LEN];
        // SAFETY: every pointer is valid for the call; `bytes` outlives the handle, which
        // reads them, through the lifetime on `Jpeg`.
        let raw = unsafe {
            rtrain_jpeg_open(
                bytes.as_ptr(),
                bytes.len(),
                &mut width,
                &mut height,
                &mut components,
                &mut scan_offset,
                error.as_mut_ptr(),
                MESSAGE_LEN,
            )
        };
        let raw = NonNull::new(raw).ok_or_else(|| DecodeError::Jpeg(message(&error)))?;
        Ok(Self { raw, width, height, components, scan_offset, bytes: PhantomData })
    }

    /// Decodes `rect` (inside the image reduced by `reduction`) to packed RGB rows. Consumes
    /// the decoder: libjpeg decodes an image once.
    fn read(self, reduction: u32, rect: Crop) -> Result<Vec<u8>, DecodeError> {
        let mut pixels = vec![0u8; rect.width as usize * rect.height as usize * 3];
        let mut error = [0 as c_char; MESSAGE_LEN];
        // SAFETY: `pixels` holds `rect.width * rect.height` RGB pixels, as the shim writes;
        // the handle is live until `self` drops after this call.
        let status = unsafe {
            rtrain_jpeg_read(
                self.raw.as_ptr(),
                reduction,
                rect.left,
                rect.top,
                rect.width,
                rect.height,
                pixels.as_mut_ptr(),
                error.as_mut_ptr(),
                MESSAGE_LEN,
            )
        };
        if status == 0 {
            Ok(pixels)
        } else {
            Err(DecodeError::Jpeg(message(&error)))
        }
    }
}

impl Drop for Jpeg<'_> {
    fn drop(&mut self) {
        // SAFETY: the handle came from rtrain_jpeg_open and is closed once.
        unsafe { rtrain_jpeg_close(self.raw.as_ptr()) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use image::codecs::jpeg::JpegEncoder;
    use rand::{Rng, SeedableRng};

    /// A JPEG with texture and edges in every channel, so a misplaced row or column shows.
    fn jpeg(width: u32, height: u32) -> Vec<u8> {
        let image = RgbImage::from_fn(width, height, |x, y| {
            image::Rgb([(x * 7 + y * 3) as u8, ((x ^ y) * 5) as u8, ((x / 9 + y / 5) * 40) as u8])
        });
        let mut bytes = Vec::new();
        JpegEncoder::new_with_quality(&mut bytes, 90).encode_image(&image).unwrap();
        bytes
    }

    #[test]
    fn a_region_is_the_same_rectangle_of_the_whole_image() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        // Odd sizes, so regions start and end inside MCUs and at the image's ragged edge.
        for (width, height) in [(67, 45), (160, 120), (33, 97), (16, 16)] {
            let bytes = jpeg(width, height);
            let whole = decode(&bytes).unwrap();
            assert_eq!(whole.dimensions(), (width, height));
            for _ in 0..40 {
                let left = rng.random_range(0..width);
                let top = rng.random_range(0..height);
                let rect = Crop {
                    left,
                    top,
                    width: rng.random_range(1..=width - left),
                    height: rng.random_range(1..=height - top),
                };
                let region = decode_region(&bytes, |_, _| Some(rect)).unwrap();
                assert_eq!(region.rect, rect);
                for row in 0..rect.height {
                    let start = ((rect.top + row) * width + rect.left) as usize * 3;
                    let expected = &whole.as_raw()[start..start + rect.width as usize * 3];
                    let got = &region.pixels
                        [(row * rect.width) as usize * 3..((row + 1) * rect.width) as usize * 3];
                    assert_eq!(got, expected, "{width}x{height}, region {rect:?}, row {row}");
                }
            }
        }
    }

    #[test]
    fn choose_sees_the_image_size_and_none_decodes_nothing() {
        let bytes = jpeg(50, 30);
        let mut seen = None;
        let region = decode_region(&bytes, |w, h| {
            seen = Some((w, h));
            None
        })
        .unwrap();
        assert_eq!(seen, Some((50, 30)));
        assert!(region.pixels.is_empty());
    }

    #[test]
    fn png_decodes_whole_through_the_image_crate() {
        let image = RgbImage::from_fn(9, 4, |x, y| image::Rgb([x as u8 * 20, y as u8 * 50, 7]));
        let mut png = Vec::new();
        image.write_to(&mut std::io::Cursor::new(&mut png), image::ImageFormat::Png).unwrap();
        let region = decode_region(&png, |_, _| Some(Crop { top: 1, left: 2, height: 2, width: 3 })).unwrap();
        assert_eq!(region.rect, Crop { top: 0, left: 0, height: 4, width: 9 });
        assert_eq!(region.pixels, image.into_raw());
    }

    /// The limit applies to the size the header declares, for JPEGs (libjpeg) and PNGs (the
    /// image crate) alike, before anything is decoded: `choose` is never asked.
    #[test]
    fn an_image_above_the_pixel_limit_is_refused_before_it_is_decoded() {
        let mut png = Vec::new();
        RgbImage::new(20, 10).write_to(&mut std::io::Cursor::new(&mut png), image::ImageFormat::Png).unwrap();
        for (bytes, format) in [(jpeg(20, 10), "JPEG"), (png, "PNG")] {
            let at_limit = DecodeOptions { exif_orientation: false, max_pixels: 200 };
            assert_eq!(decode_whole(&bytes, at_limit, |_, _| 1).unwrap().dimensions(), (20, 10), "{format}");
            let below = DecodeOptions { max_pixels: 199, ..at_limit };
            let err = decode_request(&bytes, below, |_, _| panic!("{format}: asked for a region")).err();
            let err = err.unwrap_or_else(|| panic!("{format} of 200 pixels accepted at a limit of 199"));
            assert!(matches!(err, DecodeError::TooManyPixels { width: 20, height: 10, limit: 199 }), "{err}");
            assert!(err.to_string().contains("20x10 is 200 pixels, above the limit of 199"), "{err}");
        }
    }

    #[test]
    fn truncated_and_garbage_jpegs_are_errors_with_libjpegs_reason() {
        let bytes = jpeg(64, 64);
        let err = decode(&bytes[..bytes.len() / 2]).unwrap_err();
        assert!(err.to_string().contains("truncated"), "{err}");
        // Also when the region lies in the part that is still there.
        let top = Crop { top: 0, left: 0, height: 8, width: 8 };
        let err = decode_region(&bytes[..bytes.len() - 40], |_, _| Some(top)).err().expect("truncated");
        assert!(err.to_string().contains("truncated"), "{err}");
        // Bytes after the end-of-image marker (camera trailers) are fine.
        let mut trailer = bytes.clone();
        trailer.extend_from_slice(b"trailing data");
        assert_eq!(decode(&trailer).unwrap(), decode(&bytes).unwrap());
        let mut garbage = bytes[..20].to_vec();
        garbage.extend([0x55; 100]);
        let err = decode(&garbage).unwrap_err();
        assert!(matches!(err, DecodeError::Jpeg(_)), "{err}");
    }
}
