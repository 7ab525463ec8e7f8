"""Targets written straight into Delta (no pipeline run), for verify tests that need a
target of a given content quickly: a pipeline file naming them, a quiet snapshot."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
from deltalake import write_deltalake
from psycopg import Connection
from verify_helpers import pipeline_file

from tidemark.event import TableId
from tidemark.postgres_connection import connect
from tidemark.row_checksum import ChecksumSide, TableShape
from tidemark.source.postgres.checksum import PostgresChecksumSide
from tidemark.source.verify_snapshot import VerifySnapshot


class QuietSnapshot:
    """A REPEATABLE READ snapshot at ``pg_current_wal_lsn()``, reporting no changed keys:
    right only while nothing writes to the source, for targets written straight into
    Delta (no pipeline, so no publication or slot to read changes from)."""

    def __init__(self, dsn: str, tables: Sequence[TableId] = ()) -> None:
        self.conn: Connection[Any] = connect(dsn, application_name="tidemark verify test")
        self.conn.autocommit = False
        with self.conn.cursor() as cur:
            cur.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            cur.execute("SELECT (pg_current_wal_lsn() - '0/0')::bigint")
            row = cur.fetchone()
            assert row is not None
            self._position = int(row[0])

    @property
    def position(self) -> int:
        return self._position

    def side(self, table: TableId) -> ChecksumSide:
        return PostgresChecksumSide(self.conn, table)

    def changed_key_hashes(self, table: TableId, shape: TableShape) -> frozenset[int]:
        return frozenset()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.conn.rollback()
        self.conn.close()


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
