"""A key held twice is a difference: a duplicate in the target, an SCD2 key with two
current versions; and a bucket whose sums differ never ends as equal."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
from target_helpers import quiet, target_file, write_target

from conftest import Database
from tidemark.lake.delta_checksum import DeltaChecksumSide
from tidemark.row_checksum import BucketSum, BucketSums, ComparedColumn, TableShape
from tidemark.row_checksum import key_hash_of as key_hash
from tidemark.verify.compare import compare_rows, compare_tables
from tidemark.verify.report import text_report
from tidemark.verify.result import Difference
from tidemark.verify.run import verify

_SCHEMA = pa.schema([("id", pa.int32()), ("v", pa.string())])
_SHAPE = TableShape((ComparedColumn("id", pa.int32()), ComparedColumn("v", pa.string())),
                    ("id",))


def _keyed(*rows: tuple[str, str]) -> list[tuple[int, tuple[str | None, ...]]]:
    return [(key_hash(r, _SHAPE), r) for r in rows]


def test_a_duplicated_key_is_named_with_its_counts() -> None:
    source = _keyed(("1", "a"), ("2", "b"))
    assert compare_rows(source, _keyed(("1", "a"), ("2", "b"), ("2", "b")), _SHAPE) == [
        Difference("duplicate", {"id": "2"}, counts=(1, 2))]
    # The same rows on both sides (a source without a unique key) are equal.
    assert compare_rows(source + source, source + source, _SHAPE) == []
    assert compare_rows(source, source, _SHAPE) == []


def test_a_duplicate_in_the_target_is_a_difference(db: Database, tmp_path: Path) -> None:
    db.execute("CREATE TABLE t (id int PRIMARY KEY, v text)",
               "INSERT INTO t VALUES (1, 'a'), (2, 'b')")
    write_target(tmp_path / "lake/t", [{"id": 1, "v": "a"}, {"id": 2, "v": "b"},
                                       {"id": 2, "v": "b"}], _SCHEMA)
    file = target_file(tmp_path, db.dsn, db.name, "public.t")
    result = verify(file, wait_s=0, open_snapshot=quiet(db.dsn))
    assert result.error is None
    assert result.exit_code == 1
    (table,) = result.tables
    assert [(d.kind, d.key, d.counts) for d in table.differences] == \
        [("duplicate", {"id": "2"}, (1, 2))]
    assert any("duplicate id=2 (1 row in the source, 2 in the target)" in line
               for line in text_report(result)), text_report(result)


def test_an_scd2_key_with_two_current_versions_is_a_duplicate(
        db: Database, tmp_path: Path) -> None:
    db.execute("CREATE TABLE t (id int PRIMARY KEY, v text)",
               "INSERT INTO t VALUES (1, 'a'), (2, 'b')")
    schema = _SCHEMA.append(pa.field("__START_AT", pa.int64())).append(
        pa.field("__END_AT", pa.int64()))
    write_target(tmp_path / "lake/t", [
        {"id": 1, "v": "a", "__START_AT": 1, "__END_AT": None},
        {"id": 2, "v": "b", "__START_AT": 1, "__END_AT": None},
        {"id": 2, "v": "b", "__START_AT": 2, "__END_AT": None}], schema)
    file = target_file(tmp_path, db.dsn, db.name, "public.t", "stored_as_scd_type = 2\n")
    result = verify(file, wait_s=0, open_snapshot=quiet(db.dsn))
    assert result.exit_code == 1, result.as_json()
    assert [(d.kind, d.key) for d in result.tables[0].differences] == \
        [("duplicate", {"id": "2"})]


class _FaultySums(DeltaChecksumSide):
    """A target whose bucket sums are off by one (as a hash collision or a fault in a
    dialect would make them) while its rows are right."""

    def bucket_sums(self, shape: TableShape, buckets: int, **kw: object) -> BucketSums:
        sums = super().bucket_sums(shape, buckets, **kw)  # type: ignore[arg-type]
        return {b: BucketSum(s.rows, s.total + 1) for b, s in sums.items()}


def test_differing_sums_with_equal_rows_are_never_equal(tmp_path: Path) -> None:
    rows = [{"id": i, "v": f"v{i}"} for i in range(20)]
    write_target(tmp_path / "s", rows, _SCHEMA)
    write_target(tmp_path / "t", rows, _SCHEMA)
    with DeltaChecksumSide(str(tmp_path / "s")) as source, \
            DeltaChecksumSide(str(tmp_path / "t")) as honest:
        assert compare_tables(source, honest, _SHAPE, 4).differences == []
    with DeltaChecksumSide(str(tmp_path / "s")) as source, \
            _FaultySums(str(tmp_path / "t")) as faulty:
        found = compare_tables(source, faulty, _SHAPE, 4).differences
    assert [d.kind for d in found] == ["checksum"]
    assert found[0].detail is not None and "hash collision" in found[0].detail
