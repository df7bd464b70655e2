//! What a photo's file says about it besides its pixels: its stored size, Exif orientation,
//! GPS position and capture time, for putting predictions on a map (`rtrain predict --out`)
//! and for keeping a sample's provenance in a shard.
//!
//! GPS coordinates are read as exiftool and Pillow report them: degrees + minutes / 60 +
//! seconds / 3600 from the rationals (one or two of them are degrees and minutes, as exiftool
//! reads them), negative for the southern and western hemispheres (`GPSLatitudeRef` `S`,
//! `GPSLongitudeRef` `W`) and below sea level (`GPSAltitudeRef` 1; any value but 0 and 1 makes
//! the altitude unknown); the heading (`GPSImgDirection`, degrees clockwise from north, with
//! `GPSImgDirectionRef` `T` or `M`) and `GPSHPositioningError` (metres) as their rationals. The
//! same in either byte order, from a JPEG's APP1 or a PNG's eXIf chunk, and from writers that
//! leave out the GPS directory's next-IFD offset (piexif). A GPS block that is present but
//! cannot be read is no position with the reason kept (`gps_problem`), never an error: the
//! photo's pixels are still good; a heading or positioning error that cannot be read is unknown,
//! the position kept. Likewise a damaged part of the Exif block (a truncated directory, a tag
//! declaring more values than the block holds) is skipped with the reason kept, and the rest of
//! the block is read.

use std::io::Cursor;

use exif::{Exif, In, Tag, Value};
use serde::{Deserialize, Serialize};

use super::orientation::{read_exif, Orientation};

/// Where a photo was taken (WGS 84, as Exif records it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpsPosition {
    /// Degrees north (negative: south).
    pub latitude: f64,
    /// Degrees east (negative: west).
    pub longitude: f64,
    /// Metres above sea level (negative: below), when recorded.
    pub altitude: Option<f64>,
    /// `GPSImgDirection`: the direction the camera faced, degrees clockwise from north.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heading: Option<f64>,
    /// `GPSImgDirectionRef`: `T` (true north) or `M` (magnetic north), when recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heading_ref: Option<String>,
    /// `GPSHPositioningError`: the horizontal positioning error in metres, when recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub horizontal_error_m: Option<f64>,
}

/// The Exif facts about a photo that a prediction reports.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PhotoTags {
    /// The Exif orientation tag (1-8; 1 when there is none).
    pub orientation: u16,
    pub gps: Option<GpsPosition>,
    /// Why a GPS block that is present could not be read (reported as a warning).
    pub gps_problem: Option<String>,
    /// `DateTimeOriginal` as ISO 8601 (`2023-02-06T04:17:35`), with `OffsetTimeOriginal`
    /// appended when recorded (`+03:00`).
    pub captured: Option<String>,
    /// What else of the Exif block was skipped, and why (each reported as a warning).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exif_problems: Vec<String>,
}

impl PhotoTags {
    /// The tags of an encoded image (JPEG APP1, PNG eXIf); all absent when it has no readable
    /// Exif block.
    pub fn of(bytes: &[u8]) -> PhotoTags {
        let Some((exif, skipped)) = read_exif(bytes) else {
            return PhotoTags { orientation: Orientation::Upright.tag(), ..PhotoTags::default() };
        };
        let mut exif_problems: Vec<String> = skipped
            .iter()
            .map(|why| format!("part of the Exif block skipped ({why}), the rest read"))
            .collect();
        let (gps, gps_problem) = match gps_position(&exif, &mut exif_problems) {
            Ok(gps) => (gps, None),
            Err(problem) => (None, Some(problem)),
        };
        let captured = capture_time(&exif, &mut exif_problems);
        PhotoTags {
            orientation: Orientation::in_exif(&exif).tag(),
            gps,
            gps_problem,
            captured,
            exif_problems,
        }
    }
}

/// The size an encoded image's header declares, as stored (before any Exif orientation);
/// None when it is not a readable JPEG or PNG header.
pub fn stored_size(bytes: &[u8]) -> Option<(u32, u32)> {
    image::ImageReader::new(Cursor::new(bytes)).with_guessed_format().ok()?.into_dimensions().ok()
}

/// The GPS position, `Ok(None)` when the photo has no latitude and longitude, or why the ones
/// it has cannot be read. An altitude, heading or positioning error that cannot be read is
/// unknown, with why in `problems`: the position stands without it.
fn gps_position(exif: &Exif, problems: &mut Vec<String>) -> Result<Option<GpsPosition>, String> {
    let field = |tag| exif.get_field(tag, In::PRIMARY);
    let (latitude, longitude) = match (field(Tag::GPSLatitude), field(Tag::GPSLongitude)) {
        (None, None) => return lost_gps_directory(exif).map_or(Ok(None), Err),
        (Some(latitude), Some(longitude)) => (latitude, longitude),
        _ => return Err("GPSLatitude without GPSLongitude or the reverse".to_string()),
    };
    let latitude = degrees(&latitude.value, "GPSLatitude")?
        * hemisphere(field(Tag::GPSLatitudeRef).map(|f| &f.value), "GPSLatitudeRef", b'N', b'S')?;
    let longitude = degrees(&longitude.value, "GPSLongitude")?
        * hemisphere(field(Tag::GPSLongitudeRef).map(|f| &f.value), "GPSLongitudeRef", b'E', b'W')?;
    if !(-90.0..=90.0).contains(&latitude) || !(-180.0..=180.0).contains(&longitude) {
        return Err(format!("latitude {latitude}, longitude {longitude} is not a place on Earth"));
    }
    let altitude = match field(Tag::GPSAltitude) {
        None => None,
        Some(altitude) => {
            let Value::Rational(ref values) = altitude.value else {
                return Err("GPSAltitude is not a rational".to_string());
            };
            let metres = values.first().ok_or("GPSAltitude is empty")?;
            let metres = rational(metres.num, metres.denom, "GPSAltitude")?;
            // Ref 0 is above sea level, 1 below; without a ref, above (as exiftool reads it).
            match field(Tag::GPSAltitudeRef).map(|f| f.value.get_uint(0)) {
                None | Some(Some(0)) => Some(metres),
                Some(Some(1)) => Some(-metres),
                Some(other) => {
                    let value = other.map_or("not a number".to_string(), |v| v.to_string());
                    problems.push(format!(
                        "GPSAltitudeRef is {value}, not 0 (above sea level) or 1 (below): altitude unknown"
                    ));
                    None
                }
            }
        }
    };
    let heading =
        optional(single_rational(field(Tag::GPSImgDirection).map(|f| &f.value), "GPSImgDirection"), problems)
            .and_then(|degrees| {
                if (0.0..360.0).contains(&degrees) {
                    Some(degrees)
                } else {
                    problems.push(format!(
                        "GPSImgDirection is {degrees}, not in [0, 360) degrees: heading unknown"
                    ));
                    None
                }
            });
    // The reference only means something beside a heading.
    let heading_ref = heading.and_then(|_| heading_reference(field(Tag::GPSImgDirectionRef), problems));
    let horizontal_error_m = optional(
        single_rational(field(Tag::GPSHPositioningError).map(|f| &f.value), "GPSHPositioningError"),
        problems,
    );
    Ok(Some(GpsPosition { latitude, longitude, altitude, heading, heading_ref, horizontal_error_m }))
}

/// The value of an optional tag, or None with why (and that it is left unknown) in `problems`.
fn optional(read: Result<Option<f64>, String>, problems: &mut Vec<String>) -> Option<f64> {
    read.unwrap_or_else(|why| {
        problems.push(format!("{why}: left unknown"));
        None
    })
}

/// A tag of one unsigned rational (`GPSImgDirection`, `GPSHPositioningError`); `Ok(None)` when
/// the photo does not have it.
fn single_rational(value: Option<&Value>, tag: &str) -> Result<Option<f64>, String> {
    match value {
        None => Ok(None),
        Some(Value::Rational(values)) => {
            let value = values.first().ok_or(format!("{tag} is empty"))?;
            rational(value.num, value.denom, tag).map(Some)
        }
        Some(_) => Err(format!("{tag} is not a rational")),
    }
}

/// `GPSImgDirectionRef`: `T` (true north) or `M` (magnetic north), uppercase; None when absent
/// or another letter (with why in `problems`).
fn heading_reference(field: Option<&exif::Field>, problems: &mut Vec<String>) -> Option<String> {
    let letter = match &field?.value {
        Value::Ascii(strings) => strings.first().and_then(|s| s.first()).map(u8::to_ascii_uppercase),
        _ => None,
    };
    match letter {
        Some(c @ (b'T' | b'M')) => Some((c as char).to_string()),
        other => {
            let seen = other.map_or("not a letter".to_string(), |c| format!("{:?}", c as char));
            problems.push(format!(
                "GPSImgDirectionRef is {seen}, not T (true north) or M (magnetic north): heading reference unknown"
            ));
            None
        }
    }
}

/// Why the GPS directory that IFD0 points to gave no position although it holds one (or cannot
/// be read at all), when it is so: kamadak-exif skips a directory it cannot read, and keeps no
/// trace of the pointer, so that a damaged GPS block would otherwise look like no GPS block.
/// None when IFD0 has no GPS pointer, or its directory has no latitude and longitude.
fn lost_gps_directory(exif: &Exif) -> Option<String> {
    let tiff = exif.buf();
    let little = exif.little_endian();
    let u16_at = |at: usize| {
        let bytes: [u8; 2] = tiff.get(at..at.checked_add(2)?)?.try_into().ok()?;
        Some(if little { u16::from_le_bytes(bytes) } else { u16::from_be_bytes(bytes) })
    };
    let u32_at = |at: usize| {
        let bytes: [u8; 4] = tiff.get(at..at.checked_add(4)?)?.try_into().ok()?;
        Some(if little { u32::from_le_bytes(bytes) } else { u32::from_be_bytes(bytes) })
    };
    // The tags of the directory at `at` (12-byte entries after a 2-byte count), or None.
    let tags = |at: usize| -> Option<Vec<u16>> {
        let count = usize::from(u16_at(at)?);
        (0..count).map(|i| u16_at(at + 2 + 12 * i)).collect()
    };
    let ifd0 = usize::try_from(u32_at(4)?).ok()?;
    let entries = usize::from(u16_at(ifd0)?);
    let pointer = (0..entries).map(|i| ifd0 + 2 + 12 * i).find(|&entry| u16_at(entry) == Some(0x8825))?;
    let Some(gps) = u32_at(pointer + 8).and_then(|offset| usize::try_from(offset).ok()) else {
        return Some("the GPS directory pointer cannot be read".to_string());
    };
    match tags(gps) {
        None => Some(format!(
            "the GPS directory at offset {gps} lies outside the {}-byte Exif block or is cut short",
            tiff.len()
        )),
        Some(tags) if tags.contains(&2) || tags.contains(&4) => Some(
            "the GPS directory holds GPSLatitude or GPSLongitude, but they could not be read".to_string(),
        ),
        Some(_) => None,
    }
}

/// Degrees from Exif's rationals: degrees, minutes, seconds. Like exiftool, one or two values
/// are degrees (and minutes), the rest taken as 0.
fn degrees(value: &Value, tag: &str) -> Result<f64, String> {
    let Value::Rational(values) = value else { return Err(format!("{tag} is not rationals")) };
    if !(1..=3).contains(&values.len()) {
        return Err(format!("{tag} has {} values, not degrees, minutes and seconds", values.len()));
    }
    let part = |i: usize| values.get(i).map_or(Ok(0.0), |v| rational(v.num, v.denom, tag));
    Ok(part(0)? + part(1)? / 60.0 + part(2)? / 3600.0)
}

fn rational(num: u32, denom: u32, tag: &str) -> Result<f64, String> {
    if denom == 0 {
        return Err(format!("{tag} has a zero denominator"));
    }
    Ok(f64::from(num) / f64::from(denom))
}

/// 1 for the `positive` reference letter, -1 for the `negative` one.
fn hemisphere(value: Option<&Value>, tag: &str, positive: u8, negative: u8) -> Result<f64, String> {
    let letter = match value {
        Some(Value::Ascii(strings)) => strings.first().and_then(|s| s.first()).copied(),
        _ => None,
    };
    match letter.map(|c| c.to_ascii_uppercase()) {
        Some(c) if c == positive => Ok(1.0),
        Some(c) if c == negative => Ok(-1.0),
        Some(c) => Err(format!("{tag} is {:?}, not {} or {}", c as char, positive as char, negative as char)),
        None => Err(format!("{tag} is missing")),
    }
}

/// `DateTimeOriginal` (`YYYY:MM:DD HH:MM:SS`) as ISO 8601, with `OffsetTimeOriginal`. One that
/// is no date and time (`2023:02:30 25:61:61`) is left out, with why in `problems`, rather than
/// passed on as a valid-looking ISO time; so is an offset that is no UTC offset.
fn capture_time(exif: &Exif, problems: &mut Vec<String>) -> Option<String> {
    let ascii = |tag| match exif.get_field(tag, In::PRIMARY).map(|f| &f.value) {
        Some(Value::Ascii(strings)) => strings.first().map(|s| String::from_utf8_lossy(s).trim().to_string()),
        _ => None,
    };
    let stamp = ascii(Tag::DateTimeOriginal)?;
    if is_unknown(&stamp) {
        return None;
    }
    let Some(mut iso) = iso_date_time(&stamp) else {
        problems.push(format!("DateTimeOriginal {stamp:?} is no date and time: no capture time"));
        return None;
    };
    if let Some(offset) = ascii(Tag::OffsetTimeOriginal).filter(|o| !is_unknown(o)) {
        if is_utc_offset(&offset) {
            iso.push_str(&offset);
        } else {
            problems.push(format!("OffsetTimeOriginal {offset:?} is no UTC offset: capture time without it"));
        }
    }
    Some(iso)
}

/// Exif's "unknown" date, time or offset: blanks or zeros where the digits go
/// (`0000:00:00 00:00:00`), or nothing.
fn is_unknown(text: &str) -> bool {
    text.bytes().all(|b| matches!(b, b' ' | b'0' | b':'))
}

/// `YYYY:MM:DD HH:MM:SS` as `YYYY-MM-DDTHH:MM:SS`, when it is a day of the (proleptic
/// Gregorian) calendar and a time of day.
fn iso_date_time(stamp: &str) -> Option<String> {
    let bytes = stamp.as_bytes();
    let shaped = bytes.len() == 19
        && bytes.iter().enumerate().all(|(i, &b)| match i {
            4 | 7 | 13 | 16 => b == b':',
            10 => b == b' ',
            _ => b.is_ascii_digit(),
        });
    if !shaped {
        return None;
    }
    let number = |range: std::ops::Range<usize>| stamp[range].parse::<u32>().ok();
    let (year, month, day) = (number(0..4)?, number(5..7)?, number(8..10)?);
    let (hour, minute, second) = (number(11..13)?, number(14..16)?, number(17..19)?);
    let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
    let days = match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if leap => 29,
        2 => 28,
        _ => return None,
    };
    if !(1..=days).contains(&day) || hour > 23 || minute > 59 || second > 59 {
        return None;
    }
    Some(format!("{}-{}-{}T{}", &stamp[0..4], &stamp[5..7], &stamp[8..10], &stamp[11..19]))
}

/// `+HH:MM` or `-HH:MM`, within the offsets in use (-12:00 to +14:00).
fn is_utc_offset(offset: &str) -> bool {
    let o = offset.as_bytes();
    let shaped = o.len() == 6
        && (o[0] == b'+' || o[0] == b'-')
        && o[3] == b':'
        && [1, 2, 4, 5].iter().all(|&i| o[i].is_ascii_digit());
    shaped
        && offset[1..3].parse::<u32>().is_ok_and(|h| h <= 14)
        && offset[4..6].parse::<u32>().is_ok_and(|m| m <= 59)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hemisphere_letters_give_the_sign_and_others_are_refused() {
        let ascii = |s: &str| Value::Ascii(vec![s.as_bytes().to_vec()]);
        assert_eq!(hemisphere(Some(&ascii("N")), "r", b'N', b'S'), Ok(1.0));
        assert_eq!(hemisphere(Some(&ascii("S")), "r", b'N', b'S'), Ok(-1.0));
        assert_eq!(hemisphere(Some(&ascii("w")), "r", b'E', b'W'), Ok(-1.0));
        assert!(hemisphere(Some(&ascii("X")), "r", b'E', b'W').unwrap_err().contains("'X'"));
        assert!(hemisphere(None, "GPSLatitudeRef", b'N', b'S').unwrap_err().contains("GPSLatitudeRef"));
    }

    #[test]
    fn only_a_day_of_the_calendar_and_a_time_of_day_is_a_capture_time() {
        assert_eq!(iso_date_time("2023:02:06 04:17:35").as_deref(), Some("2023-02-06T04:17:35"));
        assert_eq!(iso_date_time("2024:02:29 23:59:59").as_deref(), Some("2024-02-29T23:59:59"));
        for impossible in [
            "2023:02:30 25:61:61",
            "2023:02:29 12:00:00",
            "1900:02:29 12:00:00",
            "2023:13:01 12:00:00",
            "2023:04:31 12:00:00",
            "2023:01:00 12:00:00",
            "2023:01:01 24:00:00",
            "2023:01:01 12:60:00",
            "2023:01:01 12:00:60",
            "2023-01-01 12:00:00",
            "2023:01:01 12:00",
        ] {
            assert_eq!(iso_date_time(impossible), None, "{impossible}");
        }
        assert!(is_unknown("0000:00:00 00:00:00") && is_unknown("    :  :     :  :  ") && is_unknown(""));
        assert!(is_utc_offset("+03:00") && is_utc_offset("-12:00") && is_utc_offset("+14:00"));
        assert!(
            !is_utc_offset("+ab:cd")
                && !is_utc_offset("+15:00")
                && !is_utc_offset("03:00")
                && !is_utc_offset("+03:60")
        );
    }

    /// A GPS entry: tag, Exif type (2 ASCII, 5 RATIONAL), count, and its value's bytes in
    /// big-endian order (swapped per 2- or 4-byte unit for a little-endian block).
    type Entry = (u16, u16, u32, Vec<u8>);

    fn ascii(tag: u16, text: &str) -> Entry {
        let mut bytes = text.as_bytes().to_vec();
        bytes.push(0);
        (tag, 2, bytes.len() as u32, bytes)
    }

    fn rationals(tag: u16, values: &[(u32, u32)]) -> Entry {
        let bytes = values.iter().flat_map(|(n, d)| [n.to_be_bytes(), d.to_be_bytes()].concat()).collect();
        (tag, 5, values.len() as u32, bytes)
    }

    /// A JPEG's first bytes up to an APP1 block whose IFD0 holds only the GPS pointer, at
    /// `gps_offset` (None: right after IFD0, where the directory of `entries` is written).
    fn jpeg_with_gps(little: bool, entries: &[Entry], gps_offset: Option<u32>) -> Vec<u8> {
        let u16b = |v: u16| if little { v.to_le_bytes().to_vec() } else { v.to_be_bytes().to_vec() };
        let u32b = |v: u32| if little { v.to_le_bytes().to_vec() } else { v.to_be_bytes().to_vec() };
        let mut tiff = if little { b"II*\0".to_vec() } else { b"MM\0*".to_vec() };
        tiff.extend(u32b(8));
        let gps_at = 8 + 2 + 12 + 4;
        tiff.extend(u16b(1));
        tiff.extend([u16b(0x8825), u16b(4), u32b(1), u32b(gps_offset.unwrap_or(gps_at))].concat());
        tiff.extend(u32b(0));
        let mut data_at = gps_at as usize + 2 + 12 * entries.len() + 4;
        let mut data = Vec::new();
        tiff.extend(u16b(entries.len() as u16));
        for (tag, kind, count, value) in entries {
            let value: Vec<u8> = if little && *kind == 5 {
                value.chunks(4).flat_map(|c| c.iter().rev().copied().collect::<Vec<u8>>()).collect()
            } else {
                value.clone()
            };
            tiff.extend([u16b(*tag), u16b(*kind), u32b(*count)].concat());
            if value.len() <= 4 {
                let mut inline = value.clone();
                inline.resize(4, 0);
                tiff.extend(inline);
            } else {
                tiff.extend(u32b(data_at as u32));
                data_at += value.len();
                data.extend(value);
            }
        }
        tiff.extend(u32b(0));
        tiff.extend(data);
        let mut jpeg = vec![0xFF, 0xD8, 0xFF, 0xE1];
        jpeg.extend(((tiff.len() + 8) as u16).to_be_bytes());
        jpeg.extend(b"Exif\0\0");
        jpeg.extend(tiff);
        jpeg.extend([0xFF, 0xD9]);
        jpeg
    }

    fn position() -> Vec<Entry> {
        vec![
            ascii(1, "S"),
            rationals(2, &[(33, 1), (52, 1), (768, 100)]),
            ascii(3, "E"),
            rationals(4, &[(151, 1), (12, 1), (3000, 100)]),
        ]
    }

    #[test]
    fn heading_reference_and_positioning_error_in_either_byte_order() {
        let mut entries = position();
        entries.extend([ascii(0x10, "m"), rationals(0x11, &[(12345, 100)]), rationals(0x1f, &[(47, 10)])]);
        for little in [true, false] {
            let tags = PhotoTags::of(&jpeg_with_gps(little, &entries, None));
            let gps = tags.gps.clone().unwrap_or_else(|| panic!("little-endian {little}: {tags:?}"));
            assert_eq!(gps.latitude, -(33.0 + 52.0 / 60.0 + 7.68 / 3600.0));
            assert_eq!(gps.longitude, 151.0 + 12.0 / 60.0 + 30.0 / 3600.0);
            assert_eq!((gps.heading, gps.heading_ref.as_deref()), (Some(123.45), Some("M")));
            assert_eq!(gps.horizontal_error_m, Some(4.7));
            assert!(tags.exif_problems.is_empty() && tags.gps_problem.is_none(), "{tags:?}");
        }
    }

    #[test]
    fn a_bad_heading_or_positioning_error_is_unknown_and_the_position_stands() {
        let mut entries = position();
        entries.extend([ascii(0x10, "X"), rationals(0x11, &[(400, 1)]), rationals(0x1f, &[(5, 0)])]);
        let tags = PhotoTags::of(&jpeg_with_gps(false, &entries, None));
        let gps = tags.gps.unwrap();
        assert_eq!((gps.heading, gps.heading_ref, gps.horizontal_error_m), (None, None, None));
        let problems = tags.exif_problems.join("\n");
        assert!(problems.contains("GPSImgDirection is 400, not in [0, 360)"), "{problems}");
        assert!(problems.contains("GPSHPositioningError has a zero denominator"), "{problems}");
        // A heading without a reference has none.
        let mut entries = position();
        entries.push(rationals(0x11, &[(90, 1)]));
        let gps = PhotoTags::of(&jpeg_with_gps(true, &entries, None)).gps.unwrap();
        assert_eq!((gps.heading, gps.heading_ref), (Some(90.0), None));
    }

    #[test]
    fn a_gps_directory_that_cannot_be_read_is_a_gps_problem_not_no_gps() {
        let tags = PhotoTags::of(&jpeg_with_gps(true, &position(), Some(0x00FF_FFF0)));
        assert_eq!(tags.gps, None);
        let problem = tags.gps_problem.unwrap_or_default();
        assert!(problem.contains("GPS directory at offset 16777200 lies outside"), "{problem}");
        // A GPS directory without a position is no GPS.
        let tags = PhotoTags::of(&jpeg_with_gps(false, &[ascii(0x10, "T")], None));
        assert_eq!((tags.gps, tags.gps_problem), (None, None));
    }

    #[test]
    fn degrees_minutes_seconds_and_a_zero_denominator() {
        let r = |num, denom| exif::Rational { num, denom };
        let value = Value::Rational(vec![r(29, 1), r(57, 1), r(3036, 100)]);
        assert!((degrees(&value, "t").unwrap() - (29.0 + 57.0 / 60.0 + 30.36 / 3600.0)).abs() < 1e-12);
        let broken = Value::Rational(vec![r(29, 1), r(57, 0), r(0, 1)]);
        assert!(degrees(&broken, "GPSLatitude").unwrap_err().contains("zero denominator"));
        // Degrees and decimal minutes without seconds, as exiftool reads them.
        let short = Value::Rational(vec![r(29, 1), r(5706, 100)]);
        assert!((degrees(&short, "t").unwrap() - (29.0 + 57.06 / 60.0)).abs() < 1e-12);
        assert!(degrees(&Value::Rational(vec![]), "GPSLatitude").unwrap_err().contains("0 values"));
    }
}
