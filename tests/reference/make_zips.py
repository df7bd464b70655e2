"""Zip archives for tests/zip_archives.rs, made by Python's zipfile (the outside reference):
one good archive with the file tree it must extract to (expected.json), and hostile ones,
each of which `rtrain data extract` must refuse without writing anything.

Usage: make_zips.py OUT_DIR
"""

import hashlib
import json
import stat
import struct
import sys
import zipfile
from pathlib import Path


def info(name, mode):
    entry = zipfile.ZipInfo(name, date_time=(2024, 5, 1, 12, 0, 0))
    entry.create_system = 3  # Unix: external_attr holds st_mode in its high 16 bits
    entry.external_attr = mode << 16
    entry.compress_type = zipfile.ZIP_DEFLATED
    return entry


def write(path, entries):
    with zipfile.ZipFile(path, "w") as archive:
        for entry, data in entries:
            archive.writestr(entry, data)


def main(out):
    out.mkdir(parents=True, exist_ok=True)
    photo = bytes(range(256)) * 300
    good = [
        # `zip -r` of "." starts so; it names the destination itself.
        (info("./", stat.S_IFDIR | 0o755), b""),
        (info("Dataset_2/", stat.S_IFDIR | 0o755), b""),
        (info("Dataset_2/Train/C0/house 1.jpg", stat.S_IFREG | 0o644), photo),
        (info("Dataset_2/Train/C2/café.jpg", stat.S_IFREG | 0o644), photo[::-1]),
        (info("Dataset_2/Validation/C4/h.jpg", stat.S_IFREG | 0o644), b"\xff\xd8" + photo[:999]),
        (info("Dataset_2/run.sh", stat.S_IFREG | 0o755), b"#!/bin/sh\necho hi\n"),
        (info("Dataset_2/latest", stat.S_IFLNK | 0o777), b"Train/C0/house 1.jpg"),
        # Made on Windows: no Unix mode at all.
        (zipfile.ZipInfo("Dataset_2/README.txt", date_time=(2024, 5, 1, 12, 0, 0)), b"readme\n"),
    ]
    write(out / "good.zip", good)
    expected = {}
    for entry, data in good[1:]:
        name = entry.filename.rstrip("/")
        mode = entry.external_attr >> 16
        if stat.S_ISDIR(mode):
            expected[name] = {"kind": "dir"}
        elif stat.S_ISLNK(mode):
            expected[name] = {"kind": "link", "target": data.decode()}
        else:
            executable = bool(mode & 0o111)
            expected[name] = {"kind": "file", "sha256": hashlib.sha256(data).hexdigest(), "executable": executable}
    (out / "expected.json").write_text(json.dumps(expected, indent=1, sort_keys=True))

    regular = stat.S_IFREG | 0o644
    write(out / "dotdot.zip", [(info("ok.txt", regular), b"ok"), (info("../evil.txt", regular), b"evil")])
    write(out / "absolute.zip", [(info("/tmp/rtrain-evil.txt", regular), b"evil")])
    write(out / "link-out.zip", [(info("a/link", stat.S_IFLNK | 0o777), b"../../outside")])
    write(
        out / "through-link.zip",
        [(info("here", stat.S_IFLNK | 0o777), b"."), (info("here/evil.txt", regular), b"evil")],
    )
    write(out / "device.zip", [(info("dev/null", stat.S_IFCHR | 0o644), b"")])
    write(out / "fifo.zip", [(info("pipe", stat.S_IFIFO | 0o644), b"")])
    # zipfile cannot encrypt (and clears the flag when writing), but the flag is what a reader
    # must act on: set it in the local header and in the central directory.
    write(out / "encrypted.zip", [(info("secret.jpg", regular), photo)])
    data = bytearray((out / "encrypted.zip").read_bytes())
    for signature, flags_at in ((b"PK\x03\x04", 6), (b"PK\x01\x02", 8)):
        at = data.index(signature) + flags_at
        struct.pack_into("<H", data, at, struct.unpack_from("<H", data, at)[0] | 0x1)
    (out / "encrypted.zip").write_bytes(bytes(data))
    # 64 MiB of zeros deflate to about 64 KiB: a 1,000x ratio.
    write(out / "bomb.zip", [(info("zeros.bin", regular), bytes(64 << 20))])
    write(out / "many.zip", [(info(f"f{i}.txt", regular), b"x") for i in range(5)])

    # Two central directory entries pointing at one local header and its data.
    write(out / "overlap.zip", [(info("a.jpg", regular), photo), (info("b.jpg", regular), photo)])
    data = bytearray((out / "overlap.zip").read_bytes())
    second = data.index(b"PK\x01\x02", data.index(b"PK\x01\x02") + 4)
    struct.pack_into("<I", data, second + 42, 0)
    (out / "overlap.zip").write_bytes(bytes(data))

    # The central directory cut off.
    whole = (out / "good.zip").read_bytes()
    (out / "truncated.zip").write_bytes(whole[: whole.index(b"PK\x01\x02") + 10])


if __name__ == "__main__":
    main(Path(sys.argv[1]))
