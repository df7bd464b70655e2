"""Checks a bundle `rtrain publish` wrote with the outside tools, and prints what they found as
JSON:

- ro-crate-py (`rocrate`) loads the crate: the root dataset, every `File` data entity with its
  file, its sha256 recomputed with hashlib, each CreateAction with its instrument, objects and
  results;
- roc-validator (`rocrate-validator`) validates it against the Process Run Crate 0.5 profile
  (and RO-Crate 1.1, which it extends) at the REQUIRED and RECOMMENDED levels;
- cffconvert validates CITATION.cff (and the file named by --citation, if given).

The validator fetches the RO-Crate 1.1 JSON-LD context from the web; these machines have no
web, so the context is served from the copy ro-crate-py 0.13 carries, at the transport level
(requests' HTTPAdapter), and any other URL fails as it would offline.

    python rocrate_check.py BUNDLE [--citation OTHER.cff]
"""

import hashlib
import importlib.resources
import io
import json
import os
import subprocess
import sys
import tempfile
import warnings

import requests
import requests.adapters
import rocrate
from rocrate.rocrate import ROCrate

CONTEXT_URL = "https://w3id.org/ro/crate/1.1/context"


def serve_context_offline():
    context = (importlib.resources.files(rocrate) / "data" / "ro-crate.jsonld").read_bytes()
    assert json.loads(context)["@id"] == CONTEXT_URL, "ro-crate-py does not carry the 1.1 context"

    def send(self, request, **kwargs):
        if request.url.rstrip("/") != CONTEXT_URL:
            raise requests.ConnectionError(f"offline: {request.url}")
        response = requests.Response()
        response.status_code = 200
        response.url = request.url
        response.request = request
        response.headers["Content-Type"] = "application/ld+json"
        response.raw = io.BytesIO(context)
        return response

    requests.adapters.HTTPAdapter.send = send


def sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def load(bundle):
    crate = ROCrate(bundle)
    root = crate.root_dataset
    files = []
    for entity in crate.get_entities():
        # Files in the bundle; `#` identifiers are the training data, described but not held.
        if "File" not in entity.type or entity.id.startswith("#"):
            continue
        path = os.path.join(bundle, entity.id)
        files.append({
            "id": entity.id,
            "exists": os.path.isfile(path),
            "sha256_recorded": entity.get("sha256"),
            "sha256_actual": sha256(path) if os.path.isfile(path) else None,
            "size_recorded": entity.get("contentSize"),
            "size_actual": str(os.path.getsize(path)) if os.path.isfile(path) else None,
        })
    ids = lambda value: [v.id for v in (value if isinstance(value, list) else [value]) if v is not None]
    actions = []
    for entity in crate.get_entities():
        if "CreateAction" not in entity.type:
            continue
        instrument = entity.get("instrument")
        actions.append({
            "id": entity.id,
            "instrument": {key: instrument.get(key) for key in ("name", "softwareVersion", "identifier", "sha256")},
            "object": ids(entity.get("object") or []),
            "result": ids(entity.get("result") or []),
            "startTime": entity.get("startTime"),
            "endTime": entity.get("endTime"),
        })
    data = []
    for entity in crate.get_entities():
        if "Dataset" in entity.type and entity.id.startswith("#"):
            parts = entity.get("hasPart") or []
            data.append({
                "id": entity.id,
                "name": entity.get("name"),
                "identifier": entity.get("identifier"),
                "files": {part.get("alternateName"): part.get("sha256") for part in parts},
            })
    return {
        "name": root.get("name"),
        "datePublished": root.get("datePublished"),
        "conformsTo": [c.id for c in (root.get("conformsTo") if isinstance(root.get("conformsTo"), list)
                                      else [root.get("conformsTo")])],
        "hasPart": sorted(ids(root.get("hasPart") or [])),
        "mentions": sorted(ids(root.get("mentions") or [])),
        "files": files,
        "actions": actions,
        "data": data,
    }


def validate(bundle):
    from rocrate_validator.cli.main import cli
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "report.json")
        args = ["validate", "--no-cache", "-p", "process-run-crate-0.5", "-l", "recommended",
                "--skip-availability-check", "--output-format", "json", "-o", out, bundle]
        try:
            cli.main(args=args, standalone_mode=False)
        except SystemExit:
            pass
        with open(out) as f:
            report = json.load(f)
    return {
        "passed": report["passed"],
        "issues": [{"severity": i["severity"], "check": i["check"]["identifier"], "message": i["message"],
                    "entity": i.get("violatingEntity")} for i in report["issues"]],
    }


def cff_valid(path):
    cffconvert = os.path.join(os.path.dirname(sys.executable), "cffconvert")
    done = subprocess.run([cffconvert, "--validate", "-i", path], capture_output=True, text=True)
    return {"ok": done.returncode == 0, "output": (done.stdout + done.stderr).strip()[-2000:]}


def main():
    warnings.simplefilter("ignore")  # ro-crate-py on the `#` data files: described, not held
    bundle = sys.argv[1]
    serve_context_offline()
    result = {"crate": load(bundle), "validator": validate(bundle),
              "citation": cff_valid(os.path.join(bundle, "CITATION.cff"))}
    if "--citation" in sys.argv:
        result["other_citation"] = cff_valid(sys.argv[sys.argv.index("--citation") + 1])
    print(json.dumps(result))


if __name__ == "__main__":
    main()
