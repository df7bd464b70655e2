"""Which building each photo shows, as geopandas and shapely find it: the reference of rtrain's
`predict --footprints` assignment (src/predict/assign.rs), used by tests/per_building/assignment.rs
and bench/compare_assign.py.

    footprints_reference.py generate DIR [--blocks-x N --blocks-y N --photos N --seed S]
        writes DIR/footprints.geojson (a generated neighbourhood: row houses sharing walls,
        courtyard buildings with holes, house + garage MultiPolygons, rotated and irregular
        shapes, a few overlaps and a duplicate) and DIR/photos.csv (photo,latitude,longitude,
        heading,case: inside, near, in holes, far, on shared corners; some with headings).
    footprints_reference.py assign FOOTPRINTS PHOTOS OUT.json [--max-distance M] [--id-key K]
        the assignment of every photo: geopandas' sjoin(predicate="within"), then
        sjoin_nearest(max_distance=M) in rtrain's plane (PROJ's +proj=ortho on WGS 84 centred on
        the footprints' bounding box); for a photo with a heading and no footprint around it,
        first shapely's intersection of its line of sight (a LineString M metres long along the
        heading) with the footprints.

rtrain counts a boundary as inside; `within` does not, so a photo whose nearest footprint is 0 m
away (on a wall or a shared corner) is "inside" here too. Ties (overlaps, equal distances, equal
distances along the ray) go to the first footprint in file order, as in rtrain.
"""

import argparse
import csv
import json
import math
import sys
import time

import numpy as np

WGS84_ORIGIN = (29.95, -90.07)  # latitude, longitude of the generated neighbourhood's centre


def ortho_definition(latitude, longitude):
    """rtrain's plane (LocalProjection::proj_string)."""
    return f"+proj=ortho +lat_0={float(latitude)!r} +lon_0={float(longitude)!r} +ellps=WGS84 +x_0=0 +y_0=0 +units=m +no_defs"


def ortho_crs(latitude, longitude):
    import pyproj

    return pyproj.CRS.from_proj4(ortho_definition(latitude, longitude))


# ---------------------------------------------------------------------------------------------
# generate


def neighbourhood(blocks_x, blocks_y, rng):
    """Footprints in metres east/north of WGS84_ORIGIN: a list of (kind, shapely geometry)."""
    from shapely import affinity
    from shapely.geometry import MultiPolygon, Polygon, box

    block_w, block_h, street = 100.0, 64.0, 16.0
    footprints = []
    x0 = -blocks_x * (block_w + street) / 2
    y0 = -blocks_y * (block_h + street) / 2
    for bx in range(blocks_x):
        for by in range(blocks_y):
            w, s = x0 + bx * (block_w + street), y0 + by * (block_h + street)
            kind = (bx * 7 + by * 3) % 5
            if kind == 4 and (bx + by) % 4 == 0:
                # A park: no buildings, photos here are far from any.
                continue
            if kind in (0, 1, 2):
                # Row houses on both long sides, sharing walls (the same vertices, exactly).
                width = block_w / 10
                for row_south, depth in ((s, 14.0), (s + block_h - 14.0, 14.0)):
                    xs = [round(w + i * width, 6) for i in range(11)]
                    for i in range(10):
                        footprints.append(("row", box(xs[i], row_south, xs[i + 1], row_south + depth)))
                # In the middle: detached houses, rotated, some with a garage (MultiPolygon).
                for i in range(4):
                    cx, cy = w + 12 + i * 25, s + block_h / 2
                    house = affinity.rotate(box(cx - 5, cy - 6, cx + 5, cy + 6), rng.uniform(-40, 40), origin=(cx, cy))
                    if i % 2 == 0:
                        garage = box(cx + 8.5, cy - 3, cx + 12, cy + 3)
                        footprints.append(("house+garage", MultiPolygon([house, garage])))
                    else:
                        footprints.append(("house", house))
                if kind == 2:
                    # A shed overlapping a house: overlaps go to the first in file order.
                    cx, cy = w + 37, s + block_h / 2
                    footprints.append(("overlap", box(cx - 2, cy - 8, cx + 3, cy - 2)))
            elif kind == 3:
                # Courtyard buildings: polygons with a hole, and an L-shaped wing.
                outer = box(w + 5, s + 5, w + 60, s + block_h - 5)
                hole = box(w + 17, s + 17, w + 48, s + block_h - 17)
                footprints.append(("courtyard", Polygon(outer.exterior.coords, [hole.exterior.coords])))
                l_shape = Polygon([(w + 68, s + 5), (w + 95, s + 5), (w + 95, s + 20), (w + 80, s + 20),
                                   (w + 80, s + 59), (w + 68, s + 59)])
                footprints.append(("l-shape", l_shape))
            else:
                # Irregular shapes: star-like polygons around random centres.
                for i in range(8):
                    cx, cy = w + 12 + (i % 4) * 25, s + 16 + (i // 4) * 32
                    n = int(rng.integers(5, 11))
                    angles = (np.arange(n) + rng.uniform(-0.3, 0.3, n)) * 2 * math.pi / n  # star-shaped: simple
                    radii = rng.uniform(3.0, 9.0, n)
                    footprints.append(("irregular", Polygon(
                        [(cx + r * math.cos(a), cy + r * math.sin(a)) for a, r in zip(angles, radii)])))
    # A duplicate of the first footprint (the same building in two source data sets).
    footprints.append(("duplicate", footprints[0][1]))
    return footprints


def to_lonlat(geometry, transformer):
    import shapely

    return shapely.transform(geometry, lambda xy: np.column_stack(transformer.transform(xy[:, 0], xy[:, 1])))


def photos_around(footprints, count, rng, headings=True):
    """Photos in metres: (x, y, heading or None, case); `count` without a heading and, with
    `headings`, half as many again with one."""
    from shapely.geometry import Point, Polygon

    shapes = [g for _, g in footprints]
    xmin = min(g.bounds[0] for g in shapes) - 40
    ymin = min(g.bounds[1] for g in shapes) - 40
    xmax = max(g.bounds[2] for g in shapes) + 40
    ymax = max(g.bounds[3] for g in shapes) + 40
    photos = []
    courtyards = [Polygon(g.interiors[0].coords) for k, g in footprints if k == "courtyard"]
    rows = [g for k, g in footprints if k == "row"]

    def point_in(geometry):
        gx0, gy0, gx1, gy1 = geometry.bounds
        while True:
            p = Point(rng.uniform(gx0, gx1), rng.uniform(gy0, gy1))
            if geometry.contains(p):
                return p

    for i in range(count):
        case = ["inside", "near", "near", "street", "hole", "corner", "far"][i % 7]
        kind, shape = footprints[int(rng.integers(len(footprints)))]
        if case == "inside":
            p = point_in(shape)
        elif case == "near":
            # A point on the boundary pushed out 0-35 m (some beyond the 30 m reach).
            boundary = shape.boundary
            q = boundary.interpolate(rng.uniform(0, boundary.length))
            angle = rng.uniform(0, 2 * math.pi)
            d = rng.uniform(0.1, 35.0)
            p = Point(q.x + d * math.cos(angle), q.y + d * math.sin(angle))
        elif case == "hole":
            p = point_in(courtyards[int(rng.integers(len(courtyards)))])
        elif case == "corner":
            x, y = rows[int(rng.integers(len(rows)))].exterior.coords[int(rng.integers(4))]
            p = Point(x, y)  # exactly a vertex: on one or two row houses' boundaries
        elif case == "street":
            p = Point(rng.uniform(xmin, xmax), rng.uniform(ymin, ymax))
        else:
            # Anywhere, up to 140 m beyond the outermost buildings: some far from all.
            p = Point(rng.uniform(xmin - 100, xmax + 100), rng.uniform(ymin - 100, ymax + 100))
        photos.append((p.x, p.y, None, case))
    # Photos with a heading: in the street and near buildings, looking anywhere.
    for i in range(count // 2 if headings else 0):
        _, shape = footprints[int(rng.integers(len(footprints)))]
        q = shape.boundary.interpolate(rng.uniform(0, shape.boundary.length))
        angle = rng.uniform(0, 2 * math.pi)
        d = rng.uniform(0.5, 25.0)
        photos.append((q.x + d * math.cos(angle), q.y + d * math.sin(angle), float(rng.uniform(0, 360)), "heading"))
    return photos


def generate(out_dir, blocks_x, blocks_y, photo_count, seed, headings=True):
    import pyproj
    from shapely.geometry import mapping

    rng = np.random.default_rng(seed)
    inverse = pyproj.Transformer.from_crs(ortho_crs(*WGS84_ORIGIN), "EPSG:4326", always_xy=True)
    footprints = neighbourhood(blocks_x, blocks_y, rng)
    assert all(geometry.is_valid for _, geometry in footprints)
    features = []
    for i, (kind, geometry) in enumerate(footprints):
        features.append({
            "type": "Feature",
            "properties": {"id": f"bldg-{i}", "kind": kind},
            "geometry": mapping(to_lonlat(geometry, inverse)),
        })
    with open(f"{out_dir}/footprints.geojson", "w") as f:
        json.dump({"type": "FeatureCollection", "features": features}, f)
    write_variants(out_dir, features)
    with open(f"{out_dir}/photos.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["photo", "latitude", "longitude", "heading", "case"])
        for i, (x, y, heading, case) in enumerate(photos_around(footprints, photo_count, rng, headings)):
            longitude, latitude = inverse.transform(x, y)
            writer.writerow([f"p{i}", repr(latitude), repr(longitude), "" if heading is None else repr(heading), case])
    return len(features)


def write_variants(out_dir, features):
    """The same footprints as the files rtrain is given in the field: a BRAILS++ inventory
    (AssetInventory.write_to_geojson moves the "id" property into the Feature's id member, as
    text, indented), FEMA USA Structures converted by GDAL (a numeric BUILD_ID property, a crs
    member) and Microsoft footprints, which carry no id, converted by GDAL with
    -lco ID_GENERATE=YES (numeric Feature ids)."""
    import geopandas as gpd
    from shapely.geometry import shape

    brails = []
    for feature in features:
        properties = dict(feature["properties"])
        brails.append({"type": "Feature", "properties": properties, "geometry": feature["geometry"],
                       "id": str(properties.pop("id"))})
    with open(f"{out_dir}/brails.geojson", "w") as f:
        json.dump({"type": "FeatureCollection", "features": brails}, f, indent=2)
    frame = gpd.GeoDataFrame(
        {"BUILD_ID": [1000 + i for i in range(len(features))]},
        geometry=[shape(feature["geometry"]) for feature in features], crs="EPSG:4326")
    frame.to_file(f"{out_dir}/fema.geojson", driver="GeoJSON", engine="pyogrio")
    frame[["geometry"]].to_file(f"{out_dir}/microsoft.geojson", driver="GeoJSON", engine="pyogrio",
                                layer_options={"ID_GENERATE": "YES"})


# ---------------------------------------------------------------------------------------------
# assign


def read_photos(path):
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    latitude = np.array([float(r["latitude"]) for r in rows])
    longitude = np.array([float(r["longitude"]) for r in rows])
    heading = np.array([float(r["heading"]) if r.get("heading") else np.nan for r in rows])
    return [r["photo"] for r in rows], latitude, longitude, heading


def first_by_distance(pairs):
    """{left index: (right index, distance)}: the least distance, then the first right index."""
    best = {}
    for left, right, distance in pairs:
        key = (distance, right)
        if left not in best or key < (best[left][1], best[left][0]):
            best[left] = (right, distance)
    return best


def assign(footprints_path, photos_path, max_distance, timings=None):
    """Per photo: (footprint index or None, kind, distance or None), and the projection's origin."""
    import geopandas as gpd
    import pyproj
    from shapely.geometry import LineString, Point

    started = time.perf_counter()
    footprints = gpd.read_file(footprints_path)
    names, latitude, longitude, heading = read_photos(photos_path)
    read_done = time.perf_counter()
    minx, miny, maxx, maxy = footprints.total_bounds
    origin = ((miny + maxy) / 2, (minx + maxx) / 2)
    crs = ortho_crs(*origin)
    buildings = footprints[["geometry"]].to_crs(crs)
    buildings.index = np.arange(len(buildings))
    photos = gpd.GeoDataFrame(geometry=gpd.points_from_xy(longitude, latitude), crs="EPSG:4326").to_crs(crs)
    photos.index = np.arange(len(photos))

    result = [(None, "none", None)] * len(photos)
    within = gpd.sjoin(photos, buildings, predicate="within", how="inner")
    for left, right in sorted(zip(within.index, within["index_right"])):
        if result[left][0] is None:
            result[left] = (int(right), "inside", 0.0)
    rest = photos[[r[0] is None for r in result]]
    nearest = gpd.sjoin_nearest(rest, buildings, max_distance=max_distance, distance_col="distance", how="inner")
    nearest_of = first_by_distance(zip(nearest.index, nearest["index_right"], nearest["distance"]))
    # The boundary is inside for rtrain: a nearest distance of 0 is a photo on a wall.
    for left, (right, distance) in nearest_of.items():
        if distance == 0.0:
            result[left] = (int(right), "inside", 0.0)

    # Line of sight: the heading's direction in the plane is that of the geodesic leaving the
    # photo (pyproj's Geod.fwd 1 m along it, projected), the ray max_distance long.
    geod = pyproj.Geod(ellps="WGS84")
    to_plane = pyproj.Transformer.from_crs("EPSG:4326", crs, always_xy=True)
    tree = buildings.sindex
    geometries = buildings.geometry.values
    for i in np.flatnonzero(~np.isnan(heading)):
        if result[i][1] == "inside":
            continue
        ahead_lon, ahead_lat, _ = geod.fwd(longitude[i], latitude[i], heading[i], 1.0)
        x0, y0 = photos.geometry.values[i].x, photos.geometry.values[i].y
        x1, y1 = to_plane.transform(ahead_lon, ahead_lat)
        length = math.hypot(x1 - x0, y1 - y0)
        end = (x0 + max_distance * (x1 - x0) / length, y0 + max_distance * (y1 - y0) / length)
        ray = LineString([(x0, y0), end])
        start = Point(x0, y0)
        hits = [(start.distance(ray.intersection(geometries[j])), int(j)) for j in tree.query(ray, predicate="intersects")]
        if hits:
            distance, j = min(hits)
            result[i] = (j, "line_of_sight", distance)
    for left, (right, distance) in nearest_of.items():
        if result[left][0] is None:
            result[left] = (int(right), "nearest", float(distance))
    if timings is not None:
        timings["read_seconds"] = read_done - started
        timings["join_seconds"] = time.perf_counter() - read_done
    return names, result, origin, crs


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    gen = commands.add_parser("generate")
    gen.add_argument("dir")
    gen.add_argument("--blocks-x", type=int, default=14)
    gen.add_argument("--blocks-y", type=int, default=10)
    gen.add_argument("--photos", type=int, default=700)
    gen.add_argument("--seed", type=int, default=52)
    run = commands.add_parser("assign")
    run.add_argument("footprints")
    run.add_argument("photos")
    run.add_argument("out")
    run.add_argument("--max-distance", type=float, default=30.0)
    args = parser.parse_args()
    if args.command == "generate":
        count = generate(args.dir, args.blocks_x, args.blocks_y, args.photos, args.seed)
        print(f"{count} footprints", file=sys.stderr)
        return
    names, result, origin, crs = assign(args.footprints, args.photos, args.max_distance)
    with open(args.out, "w") as f:
        json.dump({
            "origin_latitude": origin[0],
            "origin_longitude": origin[1],
            "crs": ortho_definition(*origin),
            "photos": [
                {"photo": name, "footprint": footprint, "kind": kind, "distance_m": distance}
                for name, (footprint, kind, distance) in zip(names, result)
            ],
        }, f)


if __name__ == "__main__":
    main()
