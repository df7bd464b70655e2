//! What a photo's file says about it besides its pixels: its stored size, Exif orientation,
//! GPS position and capture time, for putting predictions on a map (`rtrain predict --out`)
//! and for keeping a sample's provenance in a shard.
//!
//! GPS coordinates are read as exiftool and Pillow report them: degrees + minutes / 60 +
//! seconds / 3600 from the three rationals, negative for the southern and western
//! hemispheres (`GPSLatitudeRef` `S`, `GPSLongitudeRef` `W`) and below sea level
//! (`GPSAltitudeRef` 1; any value but 0 and 1 makes the altitude unknown). A GPS block that
//! cannot be read is "no GPS" with the reason kept, never an error: the photo's pixels are still
//! good. Likewise a damaged part of the Exif block (a truncated directory, a tag declaring more
//! values than the block holds) is skipped with the reason kept, and the rest of the block is
//! read.

use std::io::Cursor;

use exif::{Exif, In, Tag, Value};
use serde::{Deserialize, Serialize};

use super::orientation::{read_exif, Orientation};

/// Where a photo was taken (WGS 84, as Exif records it).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct GpsPosition {
    /// Degrees north (negative: south).
    pub latitude: f64,
    /// Degrees east (negative: west).
    pub longitude: f64,
    /// Metres above sea level (negative: below), when recorded.
    pub altitude: Option<f64>,
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
/// it has cannot be read. An altitude that cannot be read is unknown, with why in `problems`.
fn gps_position(exif: &Exif, problems: &mut Vec<String>) -> Result<Option<GpsPosition>, String> {
    let field = |tag| exif.get_field(tag, In::PRIMARY);
    let (latitude, longitude) = match (field(Tag::GPSLatitude), field(Tag::GPSLongitude)) {
        (None, None) => return Ok(None),
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
    Ok(Some(GpsPosition { latitude, longitude, altitude }))
}

/// Degrees from Exif's three rationals: degrees, minutes, seconds.
fn degrees(value: &Value, tag: &str) -> Result<f64, String> {
    let Value::Rational(values) = value else { return Err(format!("{tag} is not rationals")) };
    if values.len() != 3 {
        return Err(format!("{tag} has {} values, not degrees, minutes and seconds", values.len()));
    }
    let part = |i: usize| rational(values[i].num, values[i].denom, tag);
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

    #[test]
    fn degrees_minutes_seconds_and_a_zero_denominator() {
        let r = |num, denom| exif::Rational { num, denom };
        let value = Value::Rational(vec![r(29, 1), r(57, 1), r(3036, 100)]);
        assert!((degrees(&value, "t").unwrap() - (29.0 + 57.0 / 60.0 + 30.36 / 3600.0)).abs() < 1e-12);
        let broken = Value::Rational(vec![r(29, 1), r(57, 0), r(0, 1)]);
        assert!(degrees(&broken, "GPSLatitude").unwrap_err().contains("zero denominator"));
    }
}
