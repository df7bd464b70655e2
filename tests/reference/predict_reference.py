"""The outside references for `rtrain predict --out` (tests/predict_campaign.rs).

Usage:
  python predict_reference.py geotag OUT_DIR
      Writes JPEG photos tagged by Pillow: one per hemisphere (NE, NW, SE, SW) with GPSLatitude,
      GPSLongitude, GPSAltitude (one below sea level), DateTimeOriginal and OffsetTimeOriginal,
      one without GPS, and one whose GPSLatitudeRef is "X". Prints {file name: {"latitude", "longitude", "altitude",
      "capture_time"}} with the values written (decimal degrees, metres).
  python predict_reference.py predict ARCH NUM_CLASSES WEIGHTS.safetensors SIZE IMAGE...
      The obvious PyTorch way: torchvision's ARCH with the weights `rtrain export` wrote,
      strictly loaded, in eval mode, on Pillow's image turned upright (ImageOps.exif_transpose),
      Resize((SIZE, SIZE)), ToTensor, Normalize(ImageNet). Prints {image: [probabilities]}.
  python predict_reference.py geojson FILE
      Validates FILE with the `geojson` package; prints {"valid": ..., "errors": ...,
      "points": [[lon, lat(, alt)], ...]}.
"""
import json
import os
import sys
from fractions import Fraction

from PIL import Image, ImageOps
from PIL.TiffImagePlugin import IFDRational

GPS_IFD = 0x8825
EXIF_IFD = 0x8769


def dms(value):
    """Degrees, minutes, seconds as Exif rationals (seconds to 1/10000)."""
    value = abs(value)
    degrees = int(value)
    minutes = int((value - degrees) * 60)
    seconds = Fraction(round((value - degrees - minutes / 60) * 3600 * 10000), 10000)
    return (IFDRational(degrees, 1), IFDRational(minutes, 1), IFDRational(seconds.numerator, seconds.denominator))


def geotag(out):
    os.makedirs(out, exist_ok=True)
    # (name, latitude, longitude, altitude, time, offset)
    places = [
        ("ne.jpg", 29.951065, 90.071533, 12.5, "2023:02:06 04:17:35", "+03:00"),
        ("nw.jpg", 34.052235, -118.243683, 89.0, "2020:10:30 14:51:27", "-07:00"),
        ("se.jpg", -41.28664, 174.77557, -2.25, "2016:11:14 00:02:56", "+13:00"),
        ("sw.jpg", -33.44889, -70.669265, 570.0, "2010:02:27 03:34:08", "-03:00"),
    ]
    written = {}
    for i, (name, lat, lon, alt, time, offset) in enumerate(places):
        image = Image.new("RGB", (48 + 8 * i, 40), (40 * i, 120, 200 - 30 * i))
        exif = Image.Exif()
        gps = exif.get_ifd(GPS_IFD)
        gps[1] = "N" if lat >= 0 else "S"
        gps[2] = dms(lat)
        gps[3] = "E" if lon >= 0 else "W"
        gps[4] = dms(lon)
        gps[5] = 1 if alt < 0 else 0
        metres = Fraction(abs(alt)).limit_denominator(1000)
        gps[6] = IFDRational(metres.numerator, metres.denominator)
        tags = exif.get_ifd(EXIF_IFD)
        tags[0x9003] = time  # DateTimeOriginal
        tags[0x9011] = offset  # OffsetTimeOriginal
        image.save(os.path.join(out, name), exif=exif, quality=90)
        # What was written, read back as Pillow reports it (degrees + minutes/60 + seconds/3600).
        back = Image.open(os.path.join(out, name)).getexif().get_ifd(GPS_IFD)
        sign = lambda ref, negative: -1 if ref == negative else 1
        degrees = lambda v: float(v[0]) + float(v[1]) / 60 + float(v[2]) / 3600
        iso = time[:10].replace(":", "-") + "T" + time[11:] + offset
        written[name] = {
            "latitude": sign(back[1], "S") * degrees(back[2]),
            "longitude": sign(back[3], "W") * degrees(back[4]),
            # GPSAltitudeRef is a BYTE: Pillow reads it back as b"\x01" (below sea level).
            "altitude": (-1 if back[5] in (1, b"\x01") else 1) * float(back[6]),
            "capture_time": iso,
        }
    Image.new("RGB", (40, 40), (10, 200, 10)).save(os.path.join(out, "nogps.jpg"), quality=90)
    # A malformed GPS block: a latitude reference that is neither N nor S.
    exif = Image.Exif()
    gps = exif.get_ifd(GPS_IFD)
    gps[1], gps[2], gps[3], gps[4] = "X", dms(10.5), "E", dms(20.25)
    Image.new("RGB", (40, 40), (200, 10, 10)).save(os.path.join(out, "badgps.jpg"), exif=exif, quality=90)
    print(json.dumps(written))


def predict(arch, num_classes, weights, size, images):
    import torch
    import torchvision
    from safetensors.torch import load_file
    from torchvision import transforms

    size = int(size)
    model = getattr(torchvision.models, arch)(weights=None, num_classes=int(num_classes))
    model.load_state_dict(load_file(weights), strict=True)
    model.eval()
    transform = transforms.Compose(
        [
            transforms.Resize((size, size)),
            transforms.ToTensor(),
            transforms.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),
        ]
    )
    batch = torch.stack([transform(ImageOps.exif_transpose(Image.open(p)).convert("RGB")) for p in images])
    with torch.inference_mode():
        probabilities = model(batch).softmax(-1)
    print(json.dumps({path: row.tolist() for path, row in zip(images, probabilities)}))


def validate_geojson(path):
    import geojson

    with open(path) as f:
        collection = geojson.load(f)
    points = [feature["geometry"]["coordinates"] for feature in collection["features"]]
    print(json.dumps({"valid": collection.is_valid, "errors": collection.errors(), "points": points}))


if __name__ == "__main__":
    command, args = sys.argv[1], sys.argv[2:]
    if command == "geotag":
        geotag(args[0])
    elif command == "predict":
        predict(args[0], args[1], args[2], args[3], args[4:])
    elif command == "geojson":
        validate_geojson(args[0])
    else:
        sys.exit(f"unknown command {command!r}")
