"""Writes the `.pth` files of the issue "Untrusted files read safely" (cases 1-6) into OUT.

Well-formed ones come from torch.save itself (the zip archive, the legacy stream of PyTorch
before 1.6, pickle protocol 4), each holding `w` = arange(6) as 2x3 float32 and `b` =
arange(3) as int64. Hostile ones are built by hand as torch.save lays its archive out
(`archive/data.pkl`, `archive/byteorder`, `archive/data/<key>`, `archive/version`), with the
pickle written by Python's pickle module where it can express the lie (a storage's element
count, a tensor's offset) and from raw opcodes where it cannot (nesting, lengths).

    python hostile_pth.py OUT
"""

import collections
import io
import pickle
import struct
import sys
import zipfile
from pathlib import Path

import torch


def state_dict():
    return collections.OrderedDict(
        w=torch.arange(6, dtype=torch.float32).reshape(2, 3),
        b=torch.arange(3, dtype=torch.int64),
    )


class Storage:
    """A storage the pickle refers to by persistent id, as torch.save writes it."""

    def __init__(self, key, dtype_class, numel):
        self.key, self.dtype_class, self.numel = key, dtype_class, numel


class TensorEntry:
    """A tensor as torch.save pickles it: _rebuild_tensor_v2(storage, offset, size, stride, ...)."""

    def __init__(self, storage, offset, size, stride):
        self.args = (storage, offset, tuple(size), tuple(stride), False, collections.OrderedDict())

    def __reduce__(self):
        return (torch._utils._rebuild_tensor_v2, self.args)


class TorchPickler(pickle.Pickler):
    def persistent_id(self, obj):
        if isinstance(obj, Storage):
            return ("storage", obj.dtype_class, obj.key, "cpu", obj.numel)
        return None


def pickled(obj):
    out = io.BytesIO()
    TorchPickler(out, protocol=2).dump(obj)
    return out.getvalue()


def archive(path, pickle_bytes, records, byteorder="little"):
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", pickle_bytes)
        if byteorder is not None:
            z.writestr("archive/byteorder", byteorder)
        for key, data in records.items():
            z.writestr(f"archive/data/{key}", data)
        z.writestr("archive/version", "3\n")


def floats(n):
    return struct.pack(f"<{n}f", *range(n))


def main(out):
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)

    # Well-formed, by torch.save: the reference values and the formats that must be read.
    torch.save(state_dict(), out / "good.pth")
    torch.save(state_dict(), out / "legacy.pth", _use_new_zipfile_serialization=False)
    torch.save(state_dict(), out / "protocol4.pth", pickle_protocol=4)

    # 1. Storages that declare more elements than their records hold, and a view outside its storage.
    six = Storage("0", torch.FloatStorage, 6)
    for name, numel in [("storage_larger_than_record", 1_000_000), ("storage_of_2_40_elements", 1 << 40)]:
        lying = Storage("0", torch.FloatStorage, numel)
        archive(out / f"{name}.pth", pickled({"w": TensorEntry(lying, 0, [numel], [1])}), {"0": floats(6)})
    # A conv weight's record cut short, in a file larger than that weight (another, whole
    # tensor beside it), so that only the record's own size can tell.
    conv, fc = Storage("0", torch.FloatStorage, 64 * 3 * 7 * 7), Storage("1", torch.FloatStorage, 20_000)
    archive(
        out / "conv_record_cut_short.pth",
        pickled({
            "conv1.weight": TensorEntry(conv, 0, [64, 3, 7, 7], [147, 49, 7, 1]),
            "fc.weight": TensorEntry(fc, 0, [20, 1000], [1000, 1]),
        }),
        {"0": floats(25), "1": floats(20_000)},
    )
    archive(out / "view_outside_storage.pth", pickled({"w": TensorEntry(six, 4, [3], [1])}), {"0": floats(6)})

    # 2. Nesting: 200,000 tuples, a million lists, a million dict values (about 200 KB to 3 MB).
    proto = b"\x80\x02"
    archive(out / "nested_tuples.pth", proto + b")" + b"\x85" * 200_000 + b".", {})
    archive(out / "nested_lists.pth", proto + b"]" * 1_000_000 + b"a" * 999_999 + b".", {})
    archive(out / "nested_dicts.pth", proto + b"}K\x00" * 1_000_000 + b"}" + b"s" * 1_000_000 + b".", {})

    # 3. Byte order other than little.
    good = pickled({"w": TensorEntry(six, 0, [2, 3], [3, 1])})
    archive(out / "big_endian.pth", good, {"0": struct.pack(">6f", *range(6))}, byteorder="big")
    archive(out / "middle_endian.pth", good, {"0": floats(6)}, byteorder="middle")

    # 4. Names that do not survive: NUL bytes (C strings end there), safetensors' header key.
    one, two = Storage("0", torch.FloatStorage, 3), Storage("1", torch.FloatStorage, 3)
    archive(
        out / "nul_keys.pth",
        pickled({"w\0one": TensorEntry(one, 0, [3], [1]), "w\0two": TensorEntry(two, 0, [3], [1])}),
        {"0": floats(3), "1": floats(3)},
    )
    archive(
        out / "metadata_key.pth",
        pickled({"__metadata__": TensorEntry(one, 0, [3], [1]), "w": TensorEntry(two, 0, [3], [1])}),
        {"0": floats(3), "1": floats(3)},
    )

    # 5. Small files that ask for much: an empty state dict, a string declaring 4 GiB.
    archive(out / "empty_state_dict.pth", pickled(collections.OrderedDict()), {})
    archive(out / "binunicode_4_gib.pth", proto + b"X\xff\xff\xff\xffabc", {})

    # 6. What no state dict is: an opcode pickle does not have, a truncated pickle.
    archive(out / "unknown_opcode.pth", proto + b"}\xff.", {})
    archive(out / "truncated_pickle.pth", good[: len(good) // 2], {"0": floats(6)})


if __name__ == "__main__":
    main(sys.argv[1])
