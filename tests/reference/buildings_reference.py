"""Reference for tests/per_building/buildings.rs: a scene of footprints and geotagged photos,
and the per-building outputs of `rtrain predict --out --footprints` recomputed with numpy and
read with the `geojson` package and geopandas.

  python buildings_reference.py scene OUT_DIR
      Writes OUT_DIR/footprints.geojson (four buildings near 29.76 N, 95.37 W, id property
      `bid`, one a MultiPolygon, each with a `class` property of its own) and OUT_DIR/photos/
      (JPEGs tagged by Pillow: GPS position, some with GPSImgDirection and its reference T or M;
      one without GPS). Prints {"footprints": [ids], "photos": {name: where it was placed}}.
  python buildings_reference.py check OUT_DIR FOOTPRINTS ID_KEY FUSION ALL
      Groups OUT_DIR/predictions.jsonl by building_id, fuses each building's probabilities with
      numpy (FUSION mean, or product: the normalised product, the mean where it is 0 for every
      class) and compares them, the class (argmax, first on ties), its probability, the spread
      (max minus min) and the photos with OUT_DIR/buildings.csv and buildings.geojson; ALL (0
      or 1) says whether footprints without photos are expected too. Validates the GeoJSON with
      the `geojson` package and reads it with geopandas. Prints {"max_difference", "buildings",
      "valid", "errors", "geopandas_rows", "geopandas_classes", "crs", "problems"}.
"""
import csv
import json
import math
import os
import sys

import numpy as np
from PIL import Image
from PIL.TiffImagePlugin import IFDRational

GPS_IFD = 0x8825
LATITUDE, LONGITUDE = 29.76, -95.37
# Metres per degree here (WGS 84, the ellipsoid's meridian and parallel radii of curvature).
A, E2 = 6378137.0, 0.00669437999014
_PHI = math.radians(LATITUDE)
_W = math.sqrt(1 - E2 * math.sin(_PHI) ** 2)
NORTH_M_PER_DEGREE = math.radians(1) * A * (1 - E2) / _W**3
EAST_M_PER_DEGREE = math.radians(1) * A * math.cos(_PHI) / _W


def degrees(east, north):
    """[longitude, latitude] of a point `east`, `north` metres from the scene's origin."""
    return [round(LONGITUDE + east / EAST_M_PER_DEGREE, 9), round(LATITUDE + north / NORTH_M_PER_DEGREE, 9)]


def square(x0, y0, x1, y1):
    return [[degrees(x0, y0), degrees(x1, y0), degrees(x1, y1), degrees(x0, y1), degrees(x0, y0)]]


def dms(value):
    """Degrees, minutes, seconds as Exif rationals (seconds to 1/1000000)."""
    value = abs(value)
    d = int(value)
    m = int((value - d) * 60)
    s = round((value - d - m / 60) * 3600 * 1_000_000)
    return (IFDRational(d, 1), IFDRational(m, 1), IFDRational(s, 1_000_000))


# (name, east, north, heading, reference): metres from the origin.
PHOTOS = [
    ("a1.jpg", 6, 6, None, None),  # inside bldg-1
    ("a2.jpg", 3, 9, 90.0, "T"),  # inside bldg-1
    ("a3.jpg", 9, 3, 45.0, "M"),  # inside bldg-1; a magnetic heading, not used
    ("b1.jpg", 35, 5, None, None),  # inside bldg-2's first part
    ("b2.jpg", 46, 4, None, None),  # inside bldg-2's second part
    ("b3.jpg", 20, 6, 90.0, "T"),  # between bldg-1 (8 m west) and bldg-2 (10 m east), facing east
    ("c1.jpg", 5, 60, None, None),  # 10 m north of bldg-3, nothing else within 30 m
    ("far.jpg", 300, 300, None, None),  # no building within 30 m
]


def scene(out):
    os.makedirs(os.path.join(out, "photos"), exist_ok=True)
    features = [
        ("bldg-1", {"type": "Polygon", "coordinates": square(0, 0, 12, 12)}, {"class": "residential", "name": "A"}),
        (
            "bldg-2",
            {"type": "MultiPolygon", "coordinates": [square(30, 0, 40, 10), square(42, 0, 50, 8)]},
            {"class": "commercial", "name": "B", "storeys": 2},
        ),
        ("bldg-3", {"type": "Polygon", "coordinates": square(0, 40, 10, 50)}, {"class": "residential", "name": "C"}),
        ("bldg-4", {"type": "Polygon", "coordinates": square(100, 100, 110, 110)}, {"class": "school", "name": "D"}),
    ]
    collection = {
        "type": "FeatureCollection",
        "features": [
            {"type": "Feature", "geometry": geometry, "properties": {"bid": bid, **properties}}
            for bid, geometry, properties in features
        ],
    }
    with open(os.path.join(out, "footprints.geojson"), "w") as f:
        json.dump(collection, f)
    placed = {}
    for i, (name, east, north, heading, reference) in enumerate(PHOTOS + [("nogps.jpg", None, None, None, None)]):
        # Pictures unlike each other, so that the model's probabilities differ between photos.
        rng = np.random.default_rng(i)
        pixels = rng.integers(0, 256, size=(48, 64, 3), dtype=np.uint8)
        pixels[: 8 + 4 * i, :, i % 3] = 255 - 20 * i
        image = Image.fromarray(pixels)
        exif = Image.Exif()
        if east is not None:
            longitude, latitude = degrees(east, north)
            gps = exif.get_ifd(GPS_IFD)
            gps[1] = "N"
            gps[2] = dms(latitude)
            gps[3] = "W"
            gps[4] = dms(longitude)
            if heading is not None:
                gps[16] = reference
                gps[17] = IFDRational(int(heading * 100), 100)
        image.save(os.path.join(out, "photos", name), exif=exif, quality=90)
        placed[name] = None if east is None else [east, north]
    print(json.dumps({"footprints": [bid for bid, _, _ in features], "photos": placed}))


def fuse(probabilities, fusion):
    """The numpy answer, and the rule that gave it."""
    p = np.asarray(probabilities, dtype=np.float64)
    if fusion == "product":
        product = np.prod(p, axis=0)
        if product.sum() > 0:
            return product / product.sum(), "product"
    return p.mean(axis=0), "mean"


def check(out, footprints_path, id_key, fusion, all_footprints):
    problems = []
    worst = 0.0

    def differ(what, ours, theirs):
        nonlocal worst
        difference = abs(float(ours) - float(theirs))
        worst = max(worst, difference)
        if not difference <= 1e-9:
            problems.append(f"{what}: {ours} vs numpy's {theirs}")

    with open(os.path.join(out, "summary.json")) as f:
        classes = json.load(f)["classes"]
    rows = [json.loads(line) for line in open(os.path.join(out, "predictions.jsonl"))]
    photos = {}
    for row in rows:
        if row.get("building_id") is not None:
            photos.setdefault(row["building_id"], []).append(row)
    with open(footprints_path) as f:
        footprints = json.load(f)["features"]
    expected = [
        feature for feature in footprints if all_footprints or str(feature["properties"][id_key]) in photos
    ]

    with open(os.path.join(out, "buildings.geojson")) as f:
        text = f.read()
    import geojson

    collection = geojson.loads(text)
    valid = collection.is_valid
    errors = collection.errors()
    features = json.loads(text)["features"]
    with open(os.path.join(out, "buildings.csv"), newline="") as f:
        table = list(csv.DictReader(f))
    if len(features) != len(expected) or len(table) != len(expected):
        problems.append(f"{len(features)} features and {len(table)} rows for {len(expected)} buildings")

    for footprint, feature, row in zip(expected, features, table):
        building = str(footprint["properties"][id_key])
        properties = feature["properties"]
        if str(properties[id_key]) != building or row[id_key] != building:
            problems.append(f"{building}: written as {properties[id_key]} / {row[id_key]}")
            continue
        if feature["geometry"] != footprint["geometry"]:
            problems.append(f"{building}: geometry {feature['geometry']} is not the footprint's")
        for key, value in footprint["properties"].items():
            if key == id_key:
                continue
            written = "footprint_class" if key == "class" else key
            if properties.get(written) != value:
                problems.append(f"{building}: property {key} written as {properties.get(written)}, not {value}")
        members = photos.get(building, [])
        paths = [r["path"] for r in members]
        if properties["photo_paths"] != paths or row["photo_paths"] != "|".join(paths):
            problems.append(f"{building}: photos {properties['photo_paths']} / {row['photo_paths']}, not {paths}")
        if properties["photos"] != len(paths) or int(row["photos"]) != len(paths):
            problems.append(f"{building}: {properties['photos']} photos, not {len(paths)}")
        if not members:
            if properties["class"] is not None or row["class"] != "":
                problems.append(f"{building}: a class without photos")
            continue
        fused, rule = fuse([r["probabilities"] for r in members], fusion)
        spread = np.max([r["probabilities"] for r in members], axis=0) - np.min(
            [r["probabilities"] for r in members], axis=0
        )
        best = int(np.argmax(fused))
        for source, values in [("geojson", properties), ("csv", row)]:
            if values["class"] != classes[best]:
                problems.append(f"{building} {source}: class {values['class']}, numpy's {classes[best]}")
            if values["fused_by"] != rule:
                problems.append(f"{building} {source}: fused by {values['fused_by']}, not {rule}")
            differ(f"{building} {source} probability", values["probability"], fused[best])
            for k, name in enumerate(classes):
                differ(f"{building} {source} probability_{name}", values[f"probability_{name}"], fused[k])
                differ(f"{building} {source} spread_{name}", values[f"spread_{name}"], spread[k])

    import geopandas

    frame = geopandas.read_file(os.path.join(out, "buildings.geojson"))
    print(
        json.dumps(
            {
                "max_difference": worst,
                "buildings": [str(f["properties"][id_key]) for f in expected],
                "valid": valid,
                "errors": str(errors),
                "geopandas_rows": len(frame),
                "geopandas_classes": [c if isinstance(c, str) else None for c in frame["class"]],
                "crs": frame.crs.to_epsg() if frame.crs is not None else None,
                "problems": problems,
            }
        )
    )


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "scene":
        scene(sys.argv[2])
    elif mode == "check":
        check(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6] == "1")
    else:
        sys.exit(f"unknown mode {mode}")
