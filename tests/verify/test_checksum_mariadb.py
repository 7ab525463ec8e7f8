"""MariaDB's checksum dialect (tidemark.source.mariadb.checksum) agrees with the
reference (tidemark.row_checksum) on the rows as the Delta target holds them."""

from __future__ import annotations

import contextlib
import math
import random
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa

from checksum_helpers import run_pipeline, target_rows
from tidemark.event import TableId
from tidemark.row_checksum import (
    ComparedColumn,
    TableShape,
    key_hash_of,
    reference_bucket_sums,
    row_texts,
)
from tidemark.source.mariadb.checksum import MariaDbChecksumSide
from type_lists import MARIADB_TYPES

_FLOATS = [1e20, 1e-7, 0.1 + 0.2, 123.0, 1.5e300, -0.0, 0.0, 5e-324, 2.2250738585072014e-308,
           1.7976931348623157e308, -2.25e100, 1e15, 1e16, 1e21, 1e-5, 100.0, 0.000123,
           123456789012345680000.0, -1.0, 3.0e-300, 0.1, 1 / 3, 6.9830165215099616e16,
           2.0 ** -1022, 2.0 ** -1074, -(2.0 ** 1023), 2.0 ** 52 - 0.5, 4.9e-324]
_RANDOM = random.Random(38)
_FLOATS += [f for f in (struct.unpack("<d", struct.pack("<Q", _RANDOM.getrandbits(64)))[0]
                        for _ in range(300)) if math.isfinite(f)]
_FLOATS += [float(_RANDOM.randint(-10 ** 17, 10 ** 17)) for _ in range(100)]
_FLOAT32S = [1.1, 1.5, 3.4028234e38, 1e-45, -0.0, 0.1, 16777217.0, 1e-38, -2.5]


def _float32(value: float) -> float:
    return float(struct.unpack("<f", struct.pack("<f", value))[0])


@contextlib.contextmanager
def _side(mdb: Any, table: str) -> Iterator[MariaDbChecksumSide]:
    conn = mdb.server.connect(mdb.name)
    try:
        with conn.cursor() as cur:
            cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT")
        yield MariaDbChecksumSide(conn, TableId(mdb.name, table))
    finally:
        conn.close()


def test_floats_of_every_magnitude_print_as_the_reference_does(mdb: Any) -> None:
    mdb.execute("CREATE TABLE fl (id INT PRIMARY KEY, d DOUBLE, f FLOAT)")
    rows = [{"id": i, "d": d, "f": _FLOAT32S[i % len(_FLOAT32S)]}
            for i, d in enumerate(_FLOATS)]
    mdb.execute(*(f"INSERT INTO fl VALUES ({r['id']}, {r['d']!r}, {r['f']!r})" for r in rows))
    # MariaDB stores -0 as 0 (so does its binlog carry it).
    expected = [{**r, "d": r["d"] + 0.0, "f": _float32(r["f"]) + 0.0} for r in rows]
    shape = TableShape((ComparedColumn("id", pa.int32()), ComparedColumn("d", pa.float64()),
                        ComparedColumn("f", pa.float32())), ("id",))
    with _side(mdb, "fl") as side:
        got = dict(side.bucket_rows(shape, 1, [0]))
        want = {key_hash_of(t, shape): t for t in (row_texts(r, shape) for r in expected)}
        assert got == want
        assert side.bucket_sums(shape, 4) == reference_bucket_sums(expected, shape, 4)


def test_every_type_equals_the_reference_of_what_the_pipeline_stored(
        spark: Any, mdb: Any, tmp_path: Path) -> None:
    """The table of every MariaDB type, its rows put into Delta through the binlog by
    ``tidemark run``: the SQL checksums equal the reference's of the Delta rows."""
    mdb.execute(f"CREATE TABLE mx ({MARIADB_TYPES.columns})")
    table = f"{mdb.name}.mx"
    run_pipeline(spark, mdb.dsn, table, tmp_path)  # the empty table's snapshot
    rows = [MARIADB_TYPES.row % (2 * i + 1, 2 * i + 2) for i in range(20)]
    mdb.execute(*(f"INSERT INTO mx VALUES {r}" for r in rows),
                "INSERT INTO mx (id) VALUES (1000)",
                "UPDATE mx SET dd = 0.1 + 0.2, f = 1.1, n = -0.001 WHERE id = 3",
                "UPDATE mx SET dd = -0.0, n = 0, dt3 = '1969-12-31 23:59:59.999' WHERE id = 4")
    lake = run_pipeline(spark, mdb.dsn, table, tmp_path)
    found, shape = target_rows(lake, MARIADB_TYPES.names())
    assert len(found) == 41
    with _side(mdb, "mx") as side:
        for buckets in (1, 8, 64):
            assert side.bucket_sums(shape, buckets) == \
                reference_bucket_sums(found, shape, buckets)
        texts = {key_hash_of(t, shape): t for t in (row_texts(r, shape) for r in found)}
        assert dict(side.bucket_rows(shape, 4, [0, 1, 2, 3])) == texts
        # Leaving keys out: they are neither summed nor listed.
        excluded = frozenset(list(texts)[:7])
        kept = [r for r in found if key_hash_of(row_texts(r, shape), shape) not in excluded]
        assert side.bucket_sums(shape, 8, excluded_keys=excluded) == \
            reference_bucket_sums(kept, shape, 8)
        assert side.bucket_sums(shape, 8, only=[1, 5], excluded_keys=excluded) == {
            b: s for b, s in reference_bucket_sums(kept, shape, 8).items() if b in (1, 5)}
        assert set(dict(side.bucket_rows(shape, 2, [0, 1], excluded_keys=excluded))) == \
            set(texts) - excluded


def test_a_different_value_changes_its_bucket_only(mdb: Any) -> None:
    mdb.execute("CREATE TABLE d (id INT PRIMARY KEY, t TEXT)",
                *(f"INSERT INTO d VALUES ({i}, 'v{i}')" for i in range(50)))
    shape = TableShape((ComparedColumn("id", pa.int32()), ComparedColumn("t", pa.string())),
                       ("id",))
    rows = [{"id": i, "t": f"v{i}"} for i in range(50)]
    rows[7]["t"] = "changed"
    with _side(mdb, "d") as side:
        got = side.bucket_sums(shape, 16)
    want = reference_bucket_sums(rows, shape, 16)
    differing = [b for b in want if got.get(b) != want[b]]
    assert differing == [key_hash_of(row_texts(rows[7], shape), shape) % 16]
