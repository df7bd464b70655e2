"""Geotagged photos as the common writers write them, for tests/per_building/gps.rs.

Usage:
  python gps_writers.py OUT_DIR
      Writes small JPEGs (and PNGs with an eXIf chunk) geotagged by four writers: the exiftool
      CLI (Debian's libimage-exiftool-perl), the exiv2 CLI (Debian's exiv2), Pillow
      (Image.Exif with the GPS IFD 0x8825) and piexif 1.1.3 (whose GPS IFD has no next-IFD
      offset). Each writer tags one photo per hemisphere (NE, NW, SE, SW), the four of them
      with and without altitude (one below sea level), with a heading to true north, one to
      magnetic north and none, and one with GPSHPositioningError; in big- and little-endian
      where the writer lets one choose; exiv2's longitudes in degrees and decimal minutes (seconds
      0/1), as many cameras write them. Also broken/*.jpg: photos whose GPS block is present
      but unreadable (a latitude reference that is neither N nor S, a zero denominator, a GPS
      IFD pointer past the end of the block), and nogps.jpg without one.
      Prints a JSON list of {"file", "writer", "byte_order" ("II" or "MM", read back from the
      file), "container" ("jpeg" or "png")} for the geotagged photos. The values to compare
      with are what `exiftool -n` reads, which the test asks exiftool for itself.
"""
import json
import os
import struct
import subprocess
import sys
from fractions import Fraction

import piexif
from PIL import Image
from PIL.TiffImagePlugin import IFDRational

GPS_IFD = 0x8825

# (hemisphere, latitude, longitude): places whose seconds need more than two decimals.
PLACES = [
    ("ne", 37.5665351, 126.9779692),
    ("nw", 29.9510658, -90.0715323),
    ("se", -41.2866401, 174.7755718),
    ("sw", -33.4488897, -70.6692655),
]
# (altitude in metres or None, heading (degrees, ref) or None, horizontal error in metres or
# None); writer w tags hemisphere h with VARIANTS[(h + w) % 4], so that each writer writes
# every variant and every hemisphere.
VARIANTS = [
    (12.75, (123.45, "T"), 4.7),
    (None, (359.99, "M"), None),
    (-2.25, None, None),
    (570.0, (0.0, "T"), None),
]


def picture(seed, path, size=(48, 40)):
    """A small photo whose pixels differ from the others'."""
    image = Image.new("RGB", size, (40 * seed % 256, 120, (200 - 30 * seed) % 256))
    image.putpixel((seed % size[0], 3), (255, 255, 255))
    if path.endswith(".png"):
        image.save(path)
    else:
        image.save(path, quality=90)


def rational(value, denominator):
    return Fraction(round(abs(value) * denominator), denominator)


def dms(value):
    """Degrees, minutes and seconds (to 1/10000) as Fractions."""
    value = abs(value)
    degrees = int(value)
    minutes = int((value - degrees) * 60)
    seconds = Fraction(round((value - degrees - minutes / 60) * 3600 * 10000), 10000)
    return [Fraction(degrees), Fraction(minutes), seconds]


def degrees_decimal_minutes(value):
    """Degrees and decimal minutes, seconds 0/1: what many cameras' GPS modules write."""
    value = abs(value)
    degrees = int(value)
    return [Fraction(degrees), Fraction(round((value - degrees) * 60 * 1_000_000), 1_000_000), Fraction(0)]


def with_exiftool(path, lat, lon, alt, heading, error, byte_order):
    args = ["exiftool", "-q", "-overwrite_original", f"-ExifByteOrder={byte_order}"]
    args += [f"-GPSLatitude={abs(lat)!r}", f"-GPSLatitudeRef={'N' if lat >= 0 else 'S'}"]
    args += [f"-GPSLongitude={abs(lon)!r}", f"-GPSLongitudeRef={'E' if lon >= 0 else 'W'}"]
    if alt is not None:
        args += [f"-GPSAltitude={abs(alt)!r}", f"-GPSAltitudeRef#={1 if alt < 0 else 0}"]
    if heading is not None:
        args += [f"-GPSImgDirection={heading[0]!r}", f"-GPSImgDirectionRef#={heading[1]}"]
    if error is not None:
        args += [f"-GPSHPositioningError={error!r}"]
    subprocess.run(args + [path], check=True)


def with_exiv2(path, lat, lon, alt, heading, error, byte_order):
    # exiv2 keeps the byte order of the Exif block it finds (and writes a new one
    # little-endian): a big-endian one is started by exiftool with a tag that is no GPS tag.
    if byte_order == "MM":
        subprocess.run(["exiftool", "-q", "-overwrite_original", "-ExifByteOrder=MM", "-Artist=exiv2", path], check=True)
    text = lambda parts: " ".join(f"{p.numerator}/{p.denominator}" for p in parts)
    commands = [
        "set Exif.GPSInfo.GPSVersionID 2 3 0 0",
        f"set Exif.GPSInfo.GPSLatitudeRef {'N' if lat >= 0 else 'S'}",
        f"set Exif.GPSInfo.GPSLatitude {text(dms(lat))}",
        f"set Exif.GPSInfo.GPSLongitudeRef {'E' if lon >= 0 else 'W'}",
        f"set Exif.GPSInfo.GPSLongitude {text(degrees_decimal_minutes(lon))}",
    ]
    if alt is not None:
        commands += [f"set Exif.GPSInfo.GPSAltitudeRef {1 if alt < 0 else 0}",
                     f"set Exif.GPSInfo.GPSAltitude {text([rational(alt, 100)])}"]
    if heading is not None:
        commands += [f"set Exif.GPSInfo.GPSImgDirectionRef {heading[1]}",
                     f"set Exif.GPSInfo.GPSImgDirection {text([rational(heading[0], 100)])}"]
    if error is not None:
        # exiv2 0.27 has no name for 0x001f: set it by number.
        commands += [f"set Exif.GPSInfo.0x001f Rational {text([rational(error, 10)])}"]
    args = ["exiv2", "-q"]
    for command in commands:
        args += ["-M", command]
    subprocess.run(args + ["mo", path], check=True)


def ifd_rationals(parts):
    return tuple(IFDRational(p.numerator, p.denominator) for p in parts)


def with_pillow(path, lat, lon, alt, heading, error, byte_order):
    exif = Image.Exif()
    # Pillow writes a new Exif block big-endian unless told little.
    exif.endian = "<" if byte_order == "II" else ">"
    gps = exif.get_ifd(GPS_IFD)
    gps[0] = b"\x02\x02\x00\x00"
    gps[1] = "N" if lat >= 0 else "S"
    gps[2] = ifd_rationals(dms(lat))
    gps[3] = "E" if lon >= 0 else "W"
    gps[4] = ifd_rationals(dms(lon))
    if alt is not None:
        gps[5] = 1 if alt < 0 else 0
        gps[6] = ifd_rationals([rational(alt, 1000)])[0]
    if heading is not None:
        gps[16] = heading[1]
        gps[17] = ifd_rationals([rational(heading[0], 100)])[0]
    if error is not None:
        gps[31] = ifd_rationals([rational(error, 100)])[0]
    image = Image.open(path)
    image.load()
    if path.endswith(".png"):
        # An Exif with nothing in IFD0 but the GPS pointer is falsy, and PNG's save skips it.
        image.save(path, exif=exif.tobytes())
    else:
        image.save(path, exif=exif, quality=90)


def piexif_block(lat, lon, alt, heading, error):
    pair = lambda parts: tuple((p.numerator, p.denominator) for p in parts)
    gps = {
        piexif.GPSIFD.GPSVersionID: (2, 2, 0, 0),
        piexif.GPSIFD.GPSLatitudeRef: "N" if lat >= 0 else "S",
        piexif.GPSIFD.GPSLatitude: pair(dms(lat)),
        piexif.GPSIFD.GPSLongitudeRef: "E" if lon >= 0 else "W",
        piexif.GPSIFD.GPSLongitude: pair(dms(lon)),
    }
    if alt is not None:
        gps[piexif.GPSIFD.GPSAltitudeRef] = 1 if alt < 0 else 0
        gps[piexif.GPSIFD.GPSAltitude] = pair([rational(alt, 100)])[0]
    if heading is not None:
        gps[piexif.GPSIFD.GPSImgDirectionRef] = heading[1]
        gps[piexif.GPSIFD.GPSImgDirection] = pair([rational(heading[0], 1000)])[0]
    if error is not None:
        gps[piexif.GPSIFD.GPSHPositioningError] = pair([rational(error, 1000)])[0]
    # An Exif IFD after the GPS IFD, so that the bytes where a next-IFD offset would be are
    # those of the next directory (piexif writes none).
    zeroth = {piexif.ImageIFD.Make: "piexif"}
    exif = {piexif.ExifIFD.DateTimeOriginal: "2023:02:06 04:17:35"}
    return piexif.dump({"0th": zeroth, "Exif": exif, "GPS": gps, "1st": {}, "thumbnail": None})


def with_piexif(path, lat, lon, alt, heading, error, byte_order):
    block = piexif_block(lat, lon, alt, heading, error)
    if path.endswith(".png"):
        # piexif writes JPEG only: the same block in a PNG eXIf chunk, through Pillow.
        image = Image.open(path)
        image.load()
        image.save(path, exif=block)
    else:
        piexif.insert(block, path)


WRITERS = [
    ("exiftool", with_exiftool, ["II", "MM"]),
    ("exiv2", with_exiv2, ["II", "MM"]),
    ("pillow", with_pillow, ["II", "MM"]),
    # piexif writes big-endian only.
    ("piexif", with_piexif, ["MM"]),
]


def tiff_header(path):
    """The byte order of the Exif block of a JPEG (APP1) or PNG (eXIf) file."""
    data = open(path, "rb").read()
    if data.startswith(b"\x89PNG"):
        at = data.index(b"eXIf") + 4
        return data[at:at + 2].decode()
    at = data.index(b"Exif\x00\x00") + 6
    return data[at:at + 2].decode()


def broken(out):
    """Photos whose GPS block is present but unreadable."""
    os.makedirs(os.path.join(out, "broken"), exist_ok=True)
    made = {}
    # A latitude reference that is neither N nor S.
    path = os.path.join(out, "broken", "latitude-ref-x.jpg")
    picture(90, path)
    exif = Image.Exif()
    gps = exif.get_ifd(GPS_IFD)
    gps[1], gps[2], gps[3], gps[4] = "X", ifd_rationals(dms(10.5)), "E", ifd_rationals(dms(20.25))
    Image.open(path).save(path, exif=exif, quality=90)
    made["latitude-ref-x.jpg"] = "GPSLatitudeRef"
    # Minutes over a zero denominator.
    path = os.path.join(out, "broken", "zero-denominator.jpg")
    picture(91, path)
    block = piexif.dump({"0th": {}, "Exif": {}, "GPS": {
        piexif.GPSIFD.GPSLatitudeRef: "S",
        piexif.GPSIFD.GPSLatitude: ((33, 1), (52, 0), (0, 1)),
        piexif.GPSIFD.GPSLongitudeRef: "E",
        piexif.GPSIFD.GPSLongitude: ((151, 1), (12, 1), (30, 1)),
    }, "1st": {}, "thumbnail": None})
    piexif.insert(block, path)
    made["zero-denominator.jpg"] = "zero denominator"
    # A GPS IFD pointer past the end of the Exif block: the directory cannot be read at all.
    path = os.path.join(out, "broken", "gps-pointer-past-end.jpg")
    picture(92, path)
    exif = Image.Exif()
    exif.endian = "<"
    exif[0x010F] = "broken"  # Make, so that IFD0 is more than the pointer
    gps = exif.get_ifd(GPS_IFD)
    gps[1], gps[2], gps[3], gps[4] = "N", ifd_rationals(dms(10.5)), "E", ifd_rationals(dms(20.25))
    block = bytearray(exif.tobytes())
    tiff = 6
    count = struct.unpack_from("<H", block, tiff + 8)[0]
    for i in range(count):
        entry = tiff + 10 + 12 * i
        if struct.unpack_from("<H", block, entry)[0] == GPS_IFD:
            struct.pack_into("<I", block, entry + 8, 0x00FF_FFF0)
    Image.open(path).save(path, exif=bytes(block), quality=90)
    made["gps-pointer-past-end.jpg"] = "GPS"
    picture(93, os.path.join(out, "nogps.jpg"))
    return made


def main(out):
    os.makedirs(out, exist_ok=True)
    written = []
    seed = 0
    for w, (writer, write, orders) in enumerate(WRITERS):
        for h, (hemisphere, lat, lon) in enumerate(PLACES):
            alt, heading, error = VARIANTS[(h + w) % len(VARIANTS)]
            order = orders[h % len(orders)]
            # One PNG (eXIf) per writer that can write one: Pillow and piexif's block through it.
            container = "png" if h == 1 and writer in ("pillow", "piexif") else "jpeg"
            name = f"{writer}-{hemisphere}-{order}.{'png' if container == 'png' else 'jpg'}"
            path = os.path.join(out, name)
            seed += 1
            picture(seed, path)
            write(path, lat, lon, alt, heading, error, order)
            written.append({"file": name, "writer": writer, "byte_order": tiff_header(path), "container": container})
    # exiftool writes PNG eXIf too (as "EXIF" in a PNG): one, big-endian, with everything.
    path = os.path.join(out, "exiftool-se-png-MM.png")
    picture(seed + 1, path)
    with_exiftool(path, PLACES[2][1], PLACES[2][2], *VARIANTS[0], "MM")
    written.append({"file": "exiftool-se-png-MM.png", "writer": "exiftool", "byte_order": tiff_header(path),
                    "container": "png"})
    broken(out)
    json.dump(written, sys.stdout, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
