"""Vacuum of a table with deletion vectors: :func:`vacuum_keeping_vectors` and
:func:`delete_unreferenced_vectors`.

delta-rs's vacuum keeps the vector files live files reference but never deletes the
others; :func:`delete_unreferenced_vectors` does, once no version newer than the vacuum
retention can need them.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Final
from urllib.parse import unquote

import pyarrow.parquet as pq
from deltalake import DeltaTable

from tidemark.lake import delta_log
from tidemark.lake.deletion_vector import DeletionVector

#: How a file holding deletion vectors is named (Delta protocol).
_VECTOR_FILE_GLOB: Final = "deletion_vector_*.bin"


def vacuum_keeping_vectors(table: DeltaTable, root: Path,
                           retention_hours: int) -> tuple[int, int]:
    """Vacuum of a local table with deletion vectors: the data files delta-rs's full
    vacuum would delete, then the vector files :func:`delete_unreferenced_vectors`
    finds. Returns how many of each were deleted.

    delta-rs's full vacuum (deltalake 1.6.6) deletes every vector file older than the
    retention, the live ones too (measured: the table is then unreadable), so it only
    lists here, and its vector files are left out."""
    listed = table.vacuum(retention_hours=retention_hours, dry_run=True,
                          enforce_retention_duration=False, full=True)
    data = {name for name in listed if not _is_vector_file(Path(name).name)}
    for name in data:
        path = root / name
        (path if path.exists() else root / unquote(name)).unlink(missing_ok=True)
    return len(data), delete_unreferenced_vectors(root, retention_hours)


def _is_vector_file(name: str) -> bool:
    return name.startswith("deletion_vector_") and name.endswith(".bin")


def delete_unreferenced_vectors(root: Path, retention_hours: float,
                                now: float | None = None) -> int:
    """Delete the deletion vector files in the local table *root* that no version newer
    than *retention_hours* can reference: referenced by no live file, named by no commit
    or checkpoint written since, and older than that themselves. Returns how many."""
    now = time.time() if now is None else now
    cutoff = now - retention_hours * 3600
    candidates = [p for p in root.glob(_VECTOR_FILE_GLOB) if _mtime(p) < cutoff]
    if not candidates:
        return 0
    state = delta_log.read_log(root)
    needed = {path for add in state.files.values()
              if (path := _vector_file(root, add.get("deletionVector"))) is not None}
    for entry in (root / "_delta_log").iterdir():
        if _mtime(entry) < cutoff:
            continue
        if entry.name.endswith(".json"):
            for action in _read_actions(entry):
                for kind in ("add", "remove"):
                    if kind in action and (path := _vector_file(
                            root, action[kind].get("deletionVector"))) is not None:
                        needed.add(path)
        elif entry.name.endswith(".parquet"):
            needed |= _checkpoint_vectors(root, entry)
    deleted = 0
    for path in candidates:
        if path not in needed:
            path.unlink(missing_ok=True)
            deleted += 1
    return deleted


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except FileNotFoundError:
        return float("inf")  # gone meanwhile: neither a candidate nor a reference


def _read_actions(path: Path) -> list[dict[str, Any]]:
    try:
        with open(path, encoding="utf-8") as source:
            return [json.loads(line) for line in source if line.strip()]
    except FileNotFoundError:
        return []


def _vector_file(root: Path, dv: dict[str, Any] | None) -> Path | None:
    if not dv or dv.get("storageType") == "i":
        return None
    try:
        return DeletionVector.from_json(dv).absolute_path(root)
    except ValueError:
        return None


def _checkpoint_vectors(root: Path, path: Path) -> set[Path]:
    """The vector files a checkpoint's adds and removes reference."""
    found: set[Path] = set()
    names = pq.read_schema(path).names
    for kind in ("add", "remove"):
        if kind not in names:
            continue
        for value in pq.read_table(path, columns=[kind]).column(kind).to_pylist():
            if value is not None and (file := _vector_file(
                    root, value.get("deletionVector"))) is not None:
                found.add(file)
    return found
