//! RGB8 pixels to JPEG files as cameras and phones write them: a chosen quality and chroma
//! subsampling, and an Exif block in place of JFIF's header when there is one. Encoding goes
//! through libjpeg-turbo (`src/shim/jpeg_shim.c`), the library that decodes them.

use std::ffi::{c_char, c_int, CStr};

/// How the two chroma planes are sampled against luma.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Subsampling {
    /// 4:4:4, full chroma resolution.
    None,
    /// 4:2:2, half horizontally (most cameras).
    Half,
    /// 4:2:0, half both ways (phones, the web).
    Quarter,
}

impl Subsampling {
    /// The luma component's sampling factors, horizontal and vertical.
    fn luma_factors(self) -> (c_int, c_int) {
        match self {
            Self::None => (1, 1),
            Self::Half => (2, 1),
            Self::Quarter => (2, 2),
        }
    }
}

/// libjpeg refused to encode.
#[derive(Debug, thiserror::Error)]
#[error("JPEG encoding: {0}")]
pub struct EncodeError(String);

extern "C" {
    #[allow(clippy::too_many_arguments)]
    fn rtrain_jpeg_encode(
        pixels: *const u8,
        width: u32,
        height: u32,
        quality: c_int,
        luma_h: c_int,
        luma_v: c_int,
        exif: *const u8,
        exif_len: usize,
        out: *mut *mut u8,
        out_len: *mut usize,
        error: *mut c_char,
        error_len: usize,
    ) -> c_int;
    fn rtrain_jpeg_free(buffer: *mut u8);
}

/// Encodes `width` x `height` packed RGB `pixels` at `quality` (1-100) with `subsampling`, and
/// `exif` (an Exif block as it follows the APP1 marker) when not empty.
///
/// # Panics
/// If `pixels` does not hold `width * height` RGB pixels (a caller bug).
pub fn encode_jpeg(
    pixels: &[u8],
    width: u32,
    height: u32,
    quality: u8,
    subsampling: Subsampling,
    exif: &[u8],
) -> Result<Vec<u8>, EncodeError> {
    assert_eq!(pixels.len(), width as usize * height as usize * 3, "pixels do not match the size");
    let (luma_h, luma_v) = subsampling.luma_factors();
    let mut out: *mut u8 = std::ptr::null_mut();
    let mut out_len = 0usize;
    let mut error = [0 as c_char; 256];
    // SAFETY: every pointer is valid for the call and `pixels` holds the rows it reads; on
    // success the shim hands over a malloc'd buffer of `out_len` bytes, copied and freed below.
    let status = unsafe {
        rtrain_jpeg_encode(
            pixels.as_ptr(),
            width,
            height,
            c_int::from(quality),
            luma_h,
            luma_v,
            exif.as_ptr(),
            exif.len(),
            &mut out,
            &mut out_len,
            error.as_mut_ptr(),
            error.len(),
        )
    };
    if status != 0 || out.is_null() {
        // SAFETY: the shim wrote a NUL-terminated message into the zeroed buffer.
        let message = unsafe { CStr::from_ptr(error.as_ptr()) }.to_string_lossy().into_owned();
        return Err(EncodeError(message));
    }
    // SAFETY: `out` holds `out_len` bytes written by libjpeg and is freed once, after the copy.
    let bytes = unsafe { std::slice::from_raw_parts(out, out_len) }.to_vec();
    // SAFETY: `out` came from the shim's allocator, is no longer borrowed, and is freed once.
    unsafe { rtrain_jpeg_free(out) };
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::decode::decode;
    use crate::data::orientation::{exif_block, Orientation};

    #[test]
    fn an_encoded_photo_decodes_close_to_its_pixels_with_its_orientation() {
        let (width, height) = (48u32, 32u32);
        let pixels: Vec<u8> =
            (0..width * height).flat_map(|i| [(i % width * 5) as u8, (i / width * 7) as u8, 90]).collect();
        for subsampling in [Subsampling::None, Subsampling::Half, Subsampling::Quarter] {
            let bytes =
                encode_jpeg(&pixels, width, height, 95, subsampling, &exif_block(Orientation::TurnedRight))
                    .unwrap();
            assert_eq!(Orientation::of(&bytes), Orientation::TurnedRight);
            let decoded = decode(&bytes).unwrap();
            assert_eq!(decoded.dimensions(), (width, height));
            let worst = decoded.as_raw().iter().zip(&pixels).map(|(a, b)| a.abs_diff(*b)).max().unwrap();
            assert!(worst <= 12, "{subsampling:?}: a value is off by {worst}");
        }
        let plain = encode_jpeg(&pixels, width, height, 90, Subsampling::Quarter, &[]).unwrap();
        assert_eq!(Orientation::of(&plain), Orientation::Upright);
        assert_eq!(&plain[6..10], b"JFIF");
    }
}
