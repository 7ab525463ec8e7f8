"""Deletion vectors committed by hand (the format delta-rs, Polars and DuckDB's
delta_scan read), for tests and benchmarks of reads independent of tidemark's writer."""

from __future__ import annotations

import json
import struct
import time
import uuid
import zlib
from pathlib import Path
from typing import Any

from deltalake import DeltaTable
from pyroaring import BitMap

#: The table configuration that gives a new table the deletionVectors feature.
DV = {"delta.enableDeletionVectors": "true"}
_Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"


def _z85(data: bytes) -> str:
    out = []
    for i in range(0, len(data), 4):
        value = int.from_bytes(data[i:i + 4], "big")
        chunk = []
        for _ in range(5):
            chunk.append(_Z85[value % 85])
            value //= 85
        out.extend(reversed(chunk))
    return "".join(out)


def live_adds(path: Path) -> dict[str, dict[str, Any]]:
    """The add actions of the table's latest version, from its JSON commits."""
    adds: dict[str, dict[str, Any]] = {}
    for commit in sorted((path / "_delta_log").glob("*.json")):
        for line in commit.read_text().splitlines():
            action = json.loads(line)
            if "add" in action:
                adds[action["add"]["path"]] = action["add"]
            elif "remove" in action:
                adds.pop(action["remove"]["path"], None)
    return adds


def put_dv(path: Path, file: str, rows: list[int]) -> None:
    """Commit a deletion vector deleting row positions *rows* of data *file* (the
    add action's path; it has no deletion vector yet)."""
    add = live_adds(path)[file]
    bitmap = struct.pack("<I", 1681511377) + struct.pack("<Q", 1) + struct.pack("<I", 0) \
        + BitMap(rows).serialize()
    name = uuid.uuid4()
    with open(path / f"deletion_vector_{name}.bin", "wb") as out:
        out.write(b"\x01" + struct.pack(">I", len(bitmap)) + bitmap
                  + struct.pack(">I", zlib.crc32(bitmap)))
    stats = json.loads(add["stats"])
    stats["tightBounds"] = False
    now = int(time.time() * 1000)
    remove = {"path": add["path"], "deletionTimestamp": now, "dataChange": True,
              "extendedFileMetadata": True, "partitionValues": add["partitionValues"],
              "size": add["size"]}
    new = dict(add, stats=json.dumps(stats), dataChange=True, deletionVector={
        "storageType": "u", "pathOrInlineDv": _z85(name.bytes), "offset": 1,
        "sizeInBytes": len(bitmap), "cardinality": len(rows)})
    version = DeltaTable(str(path)).version() + 1
    with open(path / "_delta_log" / f"{version:020d}.json", "x") as log:
        log.write(json.dumps({"commitInfo": {"timestamp": now, "operation": "DELETE"}}) + "\n")
        log.write(json.dumps({"remove": remove}) + "\n")
        log.write(json.dumps({"add": new}) + "\n")


def file_of(path: Path, key: int) -> str:
    """The data file holding key *key* (from the statistics)."""
    for name, add in live_adds(path).items():
        stats = json.loads(add["stats"])
        if stats["minValues"]["id"] <= key <= stats["maxValues"]["id"]:
            return name
    raise AssertionError(key)
