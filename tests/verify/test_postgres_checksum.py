"""The PostgreSQL side of verify (source/postgres/checksum.py): on every type of
tests/type_lists.py's POSTGRES_TYPES that the pipeline stores, with edge values, its
bucket sums equal the Delta side's and the reference's over the rows the pipeline wrote."""

from __future__ import annotations

import contextlib
import math
import random
import struct
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession
from verify_helpers import pipeline_file, run_pipeline

from conftest import Database
from delta_rows import live_table
from tidemark.event import TableId
from tidemark.lake.delta_checksum import DeltaChecksumSide
from tidemark.lake.spec import ApplySpec
from tidemark.postgres_connection import connect
from tidemark.row_checksum import (
    ComparedColumn,
    TableShape,
    key_hash_of,
    reference_bucket_sums,
    row_texts,
)
from tidemark.source.postgres.checksum import PostgresChecksumSide
from tidemark.source.postgres.verify_snapshot import open_verify_snapshot
from tidemark.verify.shape import target_shape
from type_lists import POSTGRES_TYPES

pytestmark = pytest.mark.integration

_EDGES = (
    "UPDATE t SET f = 'NaN', dp = '-Infinity', ts = 'infinity', tst = '-infinity', "
    "d = 'infinity', n = 'NaN', c = 'a', bi = -9223372036854775808, by = '\\x', "
    "ai = '{}', at = '{}', vc = '' WHERE id = 5",
    "UPDATE t SET f = '-0', dp = '4.9e-324', ts = '-infinity', tst = 'infinity', "
    "d = '-infinity', ts3 = '0001-01-01 00:00:00', nn = 'NaN', at = '{NULL,\"\"}', "
    "c = 'abc', vc = '日本' WHERE id = 6",
    "UPDATE t SET f = 'Infinity', dp = '1e20', tst = '1969-12-31 23:59:59.999999+00', "
    "d = '1969-12-31', n = '-0.000', nn = '-0.000', ai = '{NULL}' WHERE id = 7",
    "UPDATE t SET f = '1e-45', dp = '123.0', d = '4713-01-01 BC', iv = '-1 day', "
    "by = NULL WHERE id = 8",
    "UPDATE t SET f = '3.4028235e38', dp = '1e-7', nn = '12345678901234567890.123' "
    "WHERE id = 9",
)


def _load(db: Database) -> None:
    db.execute(*POSTGRES_TYPES.prelude, f"CREATE TABLE t ({POSTGRES_TYPES.columns})")
    row = POSTGRES_TYPES.row
    db.execute(*(f"INSERT INTO t VALUES {row % (i, value)}" for i, value in
                 enumerate(("1.5", "-12.25", "0", "1", "2", "3", "4", "5", "6"), start=1)),
               "INSERT INTO t (id) VALUES (10)", *_EDGES)


def _delta_rows(path: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = live_table(DeltaTable(path)).to_pylist()
    return rows


@pytest.mark.slow
def test_every_type_agrees_with_the_delta_side_and_the_reference(
        spark: SparkSession, db: Database, tmp_path: Path) -> None:
    _load(db)
    file = pipeline_file(tmp_path, db.dsn, db.name,
                         '[targets."public.t"]\npath = "lake/t"\nkeys = ["id"]\n')
    run_pipeline(spark, file)
    path = str(tmp_path / "lake/t")
    schema = pa.schema(DeltaTable(path).schema().to_arrow())
    shape = target_shape("public.t", schema, ApplySpec(keys=("id",)))
    assert len(shape.columns) == POSTGRES_TYPES.width
    rows = _delta_rows(path)
    assert len(rows) == 10
    snapshot = open_verify_snapshot(db.dsn, [TableId("public", "t")],
                                    publication=f"p_{db.name}")
    try:
        source = snapshot.side(TableId("public", "t"))
        with DeltaChecksumSide(path) as target:
            source_texts = dict(source.bucket_rows(shape, 1, [0]))
            target_texts = dict(target.bucket_rows(shape, 1, [0]))
            differing = {c.name: (s[i], t[i]) for k, s in source_texts.items()
                         for t in [target_texts.get(k, ())] for i, c in enumerate(shape.columns)
                         if t and s[i] != t[i]}
            assert differing == {}
            assert source_texts == target_texts
            for buckets in (1, 4, 16):
                expected = reference_bucket_sums(rows, shape, buckets)
                assert target.bucket_sums(shape, buckets) == expected
                assert source.bucket_sums(shape, buckets) == expected
            excluded = frozenset(list(source_texts)[:3])
            assert source.bucket_sums(shape, 4, excluded_keys=excluded, only=[0, 1, 3]) == \
                target.bucket_sums(shape, 4, excluded_keys=excluded, only=[0, 1, 3])
    finally:
        snapshot.close()


def _fits_real(text: str) -> bool:
    value = abs(float(text))
    return math.isinf(value) or math.isnan(value) or value == 0 or 1.5e-45 < value < 3e38


def _single(value: float) -> float:
    narrowed: float = struct.unpack("f", struct.pack("f", value))[0]
    return narrowed


def _floats_shape() -> TableShape:
    return TableShape((ComparedColumn("id", pa.int64()), ComparedColumn("r", pa.float32()),
                       ComparedColumn("d", pa.float64())), ("id",))


def test_floats_are_laid_out_as_the_reference_does(db: Database) -> None:
    values = ["0", "-0", "1.5", "100", "0.001", "1e20", "1e-7", "123.0", "4.9e-324",
              "2.2250738585072014e-308", "1.7976931348623157e308", "-2.25e100", "NaN",
              "Infinity", "-Infinity", "0.1", "1234567890123456.8", "1e16", "1e15", "1e-5",
              "123456.789", "-1e-300", "9007199254740993",
              # PostgreSQL's shortest digits differ from Python's and DuckDB's here.
              "6.9830165215099616e+16", "-5.5965926116848736e+16", "5.7818834298070976e+16"]
    rng = random.Random(38)
    values += [repr(struct.unpack("<d", struct.pack("<Q", rng.getrandbits(64)))[0])
               for _ in range(500)]
    values += [repr(float(rng.randint(-10 ** 17, 10 ** 17))) for _ in range(500)]
    values = [{"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}.get(v, v) for v in values]
    db.execute("CREATE TABLE fl (id bigint PRIMARY KEY, r real, d double precision)")
    db.execute(*(f"INSERT INTO fl VALUES ({i}, "
                 f"'{v if _fits_real(v) else '1'}', '{v}')"
                 for i, v in enumerate(values)),
               "INSERT INTO fl VALUES (100000, NULL, NULL), (100001, '1e-45', '5e-324')")
    shape = _floats_shape()
    with contextlib.closing(connect(db.dsn)) as conn:
        conn.autocommit = False
        side = PostgresChecksumSide(conn, TableId("public", "fl"))
        with conn.cursor() as cur:
            cur.execute("SELECT id, r, d FROM fl")
            # The target holds a real as a float32 (psycopg reads it as the nearest double).
            rows = [{"id": i, "r": None if r is None else _single(r), "d": d}
                    for i, r, d in cur.fetchall()]
        texts = dict(side.bucket_rows(shape, 1, [0]))
        for row in rows:
            expected = row_texts(row, shape)
            assert texts[key_hash_of(expected, shape)] == expected, row
        assert side.bucket_sums(shape, 8) == reference_bucket_sums(rows, shape, 8)


def test_a_database_not_in_utf8_hashes_the_utf8_text(db: Database) -> None:
    """``md5(text)`` hashes the server encoding's bytes: a LATIN1 database's é must be
    hashed as its UTF-8 bytes, as the target's are."""
    name = f"{db.name}_latin1"
    db.autocommit(f"CREATE DATABASE {name} ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C' "
                  "TEMPLATE template0")
    try:
        dsn = db.cluster.dsn(name)
        with contextlib.closing(connect(dsn)) as conn:
            conn.autocommit = True
            conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
            conn.execute("INSERT INTO t VALUES (1, 'caf\u00e9'), (2, '\u00e0 la')")
            conn.autocommit = False
            side = PostgresChecksumSide(conn, TableId("public", "t"))
            shape = TableShape((ComparedColumn("id", pa.int32()),
                                ComparedColumn("v", pa.string())), ("id",))
            rows = [{"id": 1, "v": "caf\u00e9"}, {"id": 2, "v": "\u00e0 la"}]
            assert side.bucket_sums(shape, 4) == reference_bucket_sums(rows, shape, 4)
            conn.rollback()
    finally:
        db.autocommit(f"DROP DATABASE {name}")
