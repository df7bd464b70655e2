//! Per building, as the field counts damage, through the real binary and against outside
//! references: GPS positions and headings as exiftool reads them from the files of exiftool,
//! exiv2, Pillow and piexif; each photo's building as geopandas and shapely find it; fused
//! probabilities as numpy computes them; `buildings.geojson` as the `geojson` package and
//! geopandas read it.

use crate::common;

mod assignment;
mod buildings;
mod gps;
