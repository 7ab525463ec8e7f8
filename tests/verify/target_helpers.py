"""Targets written straight into Delta (no pipeline run), for verify tests that need a
target of a given content quickly: a pipeline file naming them, a quiet snapshot."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
from deltalake import write_deltalake
from verify_helpers import QuietSnapshot, pipeline_file

from tidemark.event import TableId
from tidemark.source.verify_snapshot import VerifySnapshot


def quiet(dsn: str) -> Any:
    """An ``open_snapshot`` of :class:`QuietSnapshot` (the source is not written to)."""
    def open_snapshot(tables: Sequence[TableId]) -> VerifySnapshot:
        return QuietSnapshot(dsn, tables)
    return open_snapshot


def write_target(path: Path, rows: list[dict[str, Any]], schema: pa.Schema) -> None:
    """A Delta target holding *rows* (the change metadata columns added)."""
    full = schema.append(pa.field("_commit_lsn", pa.int64())).append(
        pa.field("_seq", pa.int64()))
    write_deltalake(str(path), pa.Table.from_pylist(
        [{**r, "_commit_lsn": 0, "_seq": 0} for r in rows], full))


def target_file(tmp_path: Path, dsn: str, name: str, table: str, extra: str = "", *,
                signal: str = "") -> Path:
    """A pipeline file with the one target *table* at ``lake/t`` keyed by ``id``."""
    return pipeline_file(tmp_path, dsn, name, f'[targets."{table}"]\npath = "lake/t"\n'
                         f'keys = ["id"]\n{extra}', signal=signal)
