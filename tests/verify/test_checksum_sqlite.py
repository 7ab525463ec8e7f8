"""SQLite's checksum dialect (tidemark.source.logtable.sqlite_checksum) agrees with the
reference (tidemark.row_checksum) on the rows as the Delta target holds them."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa

from checksum_helpers import run_pipeline, target_rows
from logtable_helpers import LogDb
from tidemark.event import TableId
from tidemark.row_checksum import (
    ComparedColumn,
    TableShape,
    key_hash_of,
    reference_bucket_sums,
    row_texts,
)
from tidemark.source.logtable.sqlite_checksum import SqliteChecksumSide
from type_lists import SQLITE_LOGTABLE_TYPES

# NUMERIC values of every form SQLite stores: integers, reals, texts of decimals.
_NUMERICS = ["0", "-1", "12.5", "1e20", "'1.50'", "-0.0", "123456789012345678901234567890",
             "'3.14159265358979323846'", "1e-5", "NULL"]


@contextlib.contextmanager
def _side(path: Path, table: str) -> Iterator[SqliteChecksumSide]:
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("BEGIN")
        yield SqliteChecksumSide(conn, TableId("main", table))
    finally:
        conn.close()


def test_every_type_equals_the_reference_of_what_the_pipeline_stored(
        spark: Any, tmp_path: Path) -> None:
    """The table of every type a SQLite log table has, rows with edge values put into
    Delta by ``tidemark run`` from the log: the checksums equal the reference's."""
    path = tmp_path / "app.db"
    path.touch()
    db = LogDb("sqlite", f"sqlite:///{path}", path)
    db.execute(f"CREATE TABLE mx ({SQLITE_LOGTABLE_TYPES.columns})")
    db.install(["mx"], streams=8, groups=2)
    rows = [SQLITE_LOGTABLE_TYPES.row % (i, n) for i, n in enumerate(_NUMERICS)]
    db.execute(*(f"INSERT INTO mx VALUES {r}" for r in rows),
               "INSERT INTO mx (id) VALUES (100)",
               "INSERT INTO mx VALUES (101, 1e300, '', x'', 0, 7, -0.5, '', '[]')",
               "INSERT INTO mx VALUES (102, 5e-324, 'a\u00e9\U0001f600', x'ff', 1, 2.5, 3, "
               "'1970-01-01', 'null')",
               "INSERT INTO mx VALUES (103, 0.1, 42, 'text', 1, '-7.25', 0.125, 1, '{}')",
               "UPDATE mx SET r = 0.30000000000000004, tx = 'changed' WHERE id = 1")
    lake = run_pipeline(spark, db.dsn, "main.mx", tmp_path / "run", 'kind = "logtable"\n')
    found, shape = target_rows(lake, SQLITE_LOGTABLE_TYPES.names())
    assert len(found) == len(rows) + 4
    with _side(path, "mx") as side:
        for buckets in (1, 8, 64):
            assert side.bucket_sums(shape, buckets) == \
                reference_bucket_sums(found, shape, buckets)
        texts = {key_hash_of(t, shape): t for t in (row_texts(r, shape) for r in found)}
        assert side.bucket_rows(shape, 4, [0, 1, 2, 3]) == texts
        excluded = frozenset(list(texts)[:5])
        kept = [r for r in found if key_hash_of(row_texts(r, shape), shape) not in excluded]
        assert side.bucket_sums(shape, 8, excluded_keys=excluded) == \
            reference_bucket_sums(kept, shape, 8)
        assert side.bucket_sums(shape, 8, only=[2, 3], excluded_keys=excluded) == {
            b: s for b, s in reference_bucket_sums(kept, shape, 8).items() if b in (2, 3)}
        assert set(side.bucket_rows(shape, 2, [0, 1], excluded_keys=excluded)) == \
            set(texts) - excluded


def test_sums_of_many_rows_are_exact(tmp_path: Path) -> None:
    """More rows than SQLite's 64-bit sum holds of 60-bit hashes."""
    path = tmp_path / "big.db"
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as conn:
        conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)")
        conn.executemany("INSERT INTO t VALUES (?, ?)", [(i, f"v{i}") for i in range(500)])
    shape = TableShape((ComparedColumn("id", pa.int64()), ComparedColumn("v", pa.string())),
                       ("id",))
    rows = [{"id": i, "v": f"v{i}"} for i in range(500)]
    with _side(path, "t") as side:
        assert side.bucket_sums(shape, 1) == reference_bucket_sums(rows, shape, 1)
