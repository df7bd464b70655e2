"""Reads rtrain's shards with Python's `webdataset` (the reference reader) and prints, per
sample key, the label, the sha256 of the stored image bytes, and the source path its `.json`
member records, as JSON.

    python read_webdataset.py SHARD_DIR SPLIT
"""
import hashlib
import json
import sys
from pathlib import Path

import webdataset as wds


def main():
    root, split = Path(sys.argv[1]), sys.argv[2]
    manifest = json.loads((root / "shards.json").read_text())
    urls = [str(root / shard["name"]) for shard in manifest["splits"][split]["shards"]]
    samples = {}
    for sample in wds.WebDataset(urls, shardshuffle=False):
        image = sample.get("jpg", sample.get("png"))
        samples[sample["__key__"]] = {
            "cls": int(sample["cls"]),
            "sha256": hashlib.sha256(image).hexdigest(),
            "path": json.loads(sample["json"])["path"],
        }
    print(json.dumps(samples))


if __name__ == "__main__":
    main()
