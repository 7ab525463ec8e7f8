"""Later rounds of verify fetch their keys by value (``KeyedChanges.changed_keys``,
``KeyLookup.key_rows``) instead of scanning both sides for their hashes: the rows found
are those the hash scan finds, for integer and text keys (single and composite), and a
key type that cannot be looked up by value falls back to the scan (None)."""

from __future__ import annotations

import contextlib
import datetime as dt
from pathlib import Path

import pyarrow as pa
import pytest
from target_helpers import write_target

from conftest import Database
from tidemark.event import TableId
from tidemark.lake.delta_checksum import DeltaChecksumSide
from tidemark.row_checksum import ComparedColumn, KeyLookup, TableShape
from tidemark.source.postgres.verify_snapshot import open_verify_snapshot
from tidemark.source.verify_snapshot import KeyedChanges
from tidemark.verify.compare import KEY_BUCKETS, compare_keys

pytestmark = pytest.mark.integration

_SHAPE = TableShape((ComparedColumn("a", pa.int64()), ComparedColumn("b", pa.string()),
                     ComparedColumn("x", pa.int32()), ComparedColumn("d", pa.date32())),
                    ("a", "b"))
_SCHEMA = pa.schema([("a", pa.int64()), ("b", pa.string()), ("x", pa.int32()),
                     ("d", pa.date32())])


def test_changed_keys_are_looked_up_by_value_on_both_sides(db: Database,
                                                           tmp_path: Path) -> None:
    db.autocommit("CREATE TABLE k (a bigint, b varchar(10), x int, d date, "
                  "PRIMARY KEY (a, b))", "CREATE PUBLICATION p FOR TABLE k",
                  "INSERT INTO k SELECT i, 'k' || i, i, DATE '2024-01-01' + i "
                  "FROM generate_series(1, 500) AS i")
    day = dt.date(2024, 1, 1)
    rows = [{"a": i, "b": f"k{i}", "x": i, "d": day + dt.timedelta(days=i)}
            for i in range(1, 501)]
    rows[6]["x"] = -1  # key (7, k7) differs
    write_target(tmp_path / "t", [r for r in rows if r["a"] != 9], _SCHEMA)  # 9 missing
    table = TableId("public", "k")
    with contextlib.closing(open_verify_snapshot(db.dsn, [table], publication="p")) as snap:
        assert isinstance(snap, KeyedChanges)
        db.execute("UPDATE k SET x = x + 1 WHERE a IN (7, 8, 9)",
                   "UPDATE k SET b = 'moved' WHERE a = 10", "DELETE FROM k WHERE a = 11",
                   "INSERT INTO k VALUES (-3, 'new', 0, NULL)")
        keyed = snap.changed_keys(table, _SHAPE)
        assert frozenset(keyed) == snap.changed_key_hashes(table, _SHAPE)
        assert sorted(keyed.values()) == sorted(
            [("7", "k7"), ("8", "k8"), ("9", "k9"), ("10", "k10"), ("10", "moved"),
             ("11", "k11"), ("-3", "new")])
        # Read on a new snapshot: the rows as the changes left them.
        with contextlib.closing(open_verify_snapshot(db.dsn, [table],
                                                     publication="p")) as later, \
                DeltaChecksumSide(str(tmp_path / "t")) as target:
            source = later.side(table)
            wanted = sorted(keyed)
            for side in (source, target):
                assert isinstance(side, KeyLookup)
                found = side.key_rows(_SHAPE, [keyed[k] for k in wanted])
                assert found is not None
                scanned = side.bucket_rows(_SHAPE, KEY_BUCKETS, wanted)
                assert sorted(r for r in found if r[0] in keyed) == sorted(scanned)
            by_value = compare_keys(source, target, _SHAPE, wanted, key_texts=keyed)
            by_hash = compare_keys(source, target, _SHAPE, wanted)
            assert by_value.differences == by_hash.differences
            assert {(d.kind, d.key["a"]) for d in by_value.differences} == {
                ("different", "7"), ("different", "8"), ("missing", "9"),
                ("missing", "10"), ("extra", "10"), ("extra", "11"), ("missing", "-3")}


def test_a_key_not_looked_up_by_value_falls_back_to_the_hash_scan(
        db: Database, tmp_path: Path) -> None:
    db.autocommit("CREATE TABLE k (a bigint, b varchar(10), x int, d date)",
                  "INSERT INTO k VALUES (1, 'one', 1, '2024-01-01')")
    write_target(tmp_path / "t", [{"a": 1, "b": "one", "x": 1, "d": dt.date(2024, 1, 1)}],
                 _SCHEMA)
    by_date = TableShape(_SHAPE.columns, ("d",))
    table = TableId("public", "k")
    db.autocommit("CREATE PUBLICATION p FOR TABLE k")
    with contextlib.closing(open_verify_snapshot(db.dsn, [table], publication="p")) as snap, \
            DeltaChecksumSide(str(tmp_path / "t")) as target:
        source = snap.side(table)
        for side in (source, target):
            assert isinstance(side, KeyLookup)
            assert side.key_rows(by_date, [("19723",)]) is None
            assert side.key_rows(_SHAPE, [("1", None)]) is None
        keyed = {123: ("19723",)}
        found = compare_keys(source, target, by_date, [123], key_texts=keyed)
        assert found.differences == [] and found.rows_compared == 0
