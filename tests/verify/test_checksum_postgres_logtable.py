"""PostgreSQL's checksum dialect (tidemark.source.postgres.checksum) on a table captured
through log tables: its sums equal the Delta side's and the reference's over the rows
``tidemark run`` stored from the log, for every type of POSTGRES_LOGTABLE_TYPES."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest

from checksum_helpers import run_pipeline, target_rows
from conftest import Database
from logtable_helpers import LogDb
from tidemark.event import TableId
from tidemark.lake.delta_checksum import DeltaChecksumSide
from tidemark.postgres_connection import connect
from tidemark.row_checksum import key_hash_of, reference_bucket_sums, row_texts
from tidemark.source.postgres.checksum import PostgresChecksumSide
from type_lists import POSTGRES_LOGTABLE_TYPES

pytestmark = pytest.mark.integration

_NUMERICS = ("0", "-1", "12.5", "1e20", "-0.000", "123456789012345678901234567890.123",
             "3.14159265358979323846", "1e-5", "NULL", "'NaN'")

_EDGES = (
    "UPDATE mx SET t = '00:00:00', iv = '1 year 2 mons 3 days 04:05:06.789', n = 0, "
    "by = '\\x', ai = '{}', j = '[]', ts = '1969-12-31 23:59:59.999999', "
    "tst = '1970-01-01 00:00:00+00', d = '1970-01-01', b = false WHERE id = 1",
    "UPDATE mx SET t = '23:59:59.999999', iv = '-1 mons -00:00:00.5', n = -0.001, "
    "ai = '{NULL}', j = '{\"k\": [1, 2.5, null, \"\u00e9\"]}', ts = 'infinity', "
    "tst = '-infinity', d = 'infinity' WHERE id = 2",
    "UPDATE mx SET iv = '0', by = NULL, j = 'null', d = '0044-03-15', "
    "ts = '0001-01-01 00:00:00' WHERE id = 3",
)


def test_every_type_agrees_with_the_delta_side_and_the_reference(
        spark: Any, db: Database, tmp_path: Path) -> None:
    logdb = LogDb("postgres", db.dsn)
    logdb.execute(f"CREATE TABLE mx ({POSTGRES_LOGTABLE_TYPES.columns})")
    logdb.install(["mx"], streams=8, groups=2)
    rows = [POSTGRES_LOGTABLE_TYPES.row % (i, n) for i, n in enumerate(_NUMERICS)]
    logdb.execute(*(f"INSERT INTO mx VALUES {r}" for r in rows),
                  "INSERT INTO mx (id) VALUES (100)", *_EDGES)
    lake = run_pipeline(spark, db.dsn, "public.mx", tmp_path / "run", 'kind = "logtable"\n')
    found, shape = target_rows(lake, POSTGRES_LOGTABLE_TYPES.names())
    assert len(found) == len(rows) + 1
    with contextlib.closing(connect(db.dsn)) as conn:
        conn.autocommit = False
        source = PostgresChecksumSide(conn, TableId("public", "mx"))
        with DeltaChecksumSide(str(lake)) as target:
            texts = {key_hash_of(t, shape): t for t in (row_texts(r, shape) for r in found)}
            source_texts = dict(source.bucket_rows(shape, 1, [0]))
            differing = {c.name: (s[i], texts[k][i]) for k, s in source_texts.items()
                         if k in texts for i, c in enumerate(shape.columns)
                         if s[i] != texts[k][i]}
            assert differing == {}
            assert source_texts == texts
            assert dict(target.bucket_rows(shape, 1, [0])) == texts
            for buckets in (1, 8, 64):
                expected = reference_bucket_sums(found, shape, buckets)
                assert source.bucket_sums(shape, buckets) == expected
                assert target.bucket_sums(shape, buckets) == expected
            excluded = frozenset(list(texts)[:4])
            kept = [r for r in found
                    if key_hash_of(row_texts(r, shape), shape) not in excluded]
            assert source.bucket_sums(shape, 8, excluded_keys=excluded) == \
                reference_bucket_sums(kept, shape, 8)
            assert source.bucket_sums(shape, 8, only=[2, 5], excluded_keys=excluded) == \
                target.bucket_sums(shape, 8, only=[2, 5], excluded_keys=excluded)
