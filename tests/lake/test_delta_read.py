"""The live rows of a Delta table with deletion vectors (tidemark.lake.delta_read).

The deletion vectors are put on the table by a hand-written commit (the format delta-rs,
Polars and DuckDB's delta_scan read), independent of tidemark's own writer; delta-rs's
``DeltaTable.scan()`` (DataFusion) is the second reader the rows are checked against."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable, write_deltalake
from deltalake.exceptions import DeltaProtocolError

from dv_commit import DV, file_of, put_dv
from tidemark.lake.delta_checksum import DeltaChecksumSide
from tidemark.lake.delta_read import deleted_rows, live_rows
from tidemark.row_checksum import ComparedColumn, TableShape


def _rows(table: pa.Table) -> list[dict[str, Any]]:
    return sorted(table.to_pylist(), key=lambda r: r["id"])


def _batch(low: int, high: int, **extra: list[Any]) -> pa.Table:
    ids = list(range(low, high))
    return pa.table({"id": pa.array(ids, pa.int64()), "s": [f"s{i}" for i in ids], **extra})


@pytest.fixture
def dv_table(tmp_path: Path) -> Path:
    """Three files (ids 0-9, 10-19, 20-29) on a table with the deletionVectors feature;
    ids 1, 3 and 12 deleted by deletion vectors on the first two."""
    path = tmp_path / "t"
    for low in (0, 10, 20):
        write_deltalake(str(path), _batch(low, low + 10), mode="append", configuration=DV)
    put_dv(path, file_of(path, 0), [1, 3])
    put_dv(path, file_of(path, 10), [2])
    return path


LIVE = [i for i in range(30) if i not in (1, 3, 12)]


def test_live_rows_drop_the_deleted_positions(dv_table: Path) -> None:
    table = DeltaTable(str(dv_table))
    with pytest.raises(DeltaProtocolError):
        table.to_pyarrow_dataset()
    rows = live_rows(table)
    assert rows.has_deletions and rows.count_rows() == len(LIVE)
    read = rows.to_table()
    assert read.schema == pa.schema(table.schema().to_arrow())
    assert read.schema.field("s").type == pa.string()  # what callers got before
    assert _rows(read) == [{"id": i, "s": f"s{i}"} for i in LIVE]
    assert _rows(read) == _rows(pa.table(table.scan().read_all()).cast(read.schema))
    assert sorted(rows.to_reader(["id"]).read_all().column("id").to_pylist()) == LIVE
    assert sum(b.num_rows for b in rows.to_batches(batch_size=4)) == len(LIVE)
    assert {len(v) for v in deleted_rows(table).values()} == {1, 2}


def test_filters_and_column_subsets(dv_table: Path) -> None:
    rows = live_rows(DeltaTable(str(dv_table)))
    wanted = pc.field("id").isin(pa.array([0, 1, 2, 12, 13, 25], pa.int64()))
    assert _rows(rows.to_table(filter=wanted)) == [
        {"id": i, "s": f"s{i}"} for i in (0, 2, 13, 25)]
    # The filter's column not among those read; positions still count the whole file.
    assert sorted(rows.to_table(columns=["s"], filter=pc.field("id") >= 2)
                  .column("s").to_pylist()) == sorted(f"s{i}" for i in LIVE if i >= 2)
    assert rows.to_table(columns=["id"], filter=pc.field("s") == "s3").num_rows == 0
    assert rows.to_table(columns=["id"], filter=pc.field("id") > 100).num_rows == 0


def test_a_column_added_later_reads_as_null_in_older_files(dv_table: Path) -> None:
    write_deltalake(str(dv_table), _batch(30, 33, extra=[1.5, None, 2.5]), mode="append",
                    schema_mode="merge")
    put_dv(dv_table, file_of(dv_table, 30), [0])
    put_dv(dv_table, file_of(dv_table, 20), [9])
    table = DeltaTable(str(dv_table))
    read = live_rows(table).to_table(columns=["id", "extra"])
    live = [i for i in [*LIVE, 31, 32] if i != 29]
    assert _rows(read) == [{"id": i, "extra": {32: 2.5}.get(i)} for i in live]
    scanned = pa.table(table.scan(columns=["id", "extra"]).read_all())
    assert _rows(read) == _rows(scanned)


def test_a_pinned_version_reads_its_own_deletions(dv_table: Path) -> None:
    first = live_rows(DeltaTable(str(dv_table), version=2))  # the three appends only
    assert sorted(first.to_table().column("id").to_pylist()) == list(range(30))
    assert sorted(live_rows(DeltaTable(str(dv_table), version=3)).to_table()
                  .column("id").to_pylist()) == [i for i in range(30) if i not in (1, 3)]


def test_partitioned_table(tmp_path: Path) -> None:
    path = tmp_path / "p"
    write_deltalake(str(path), _batch(0, 10, part=["a b%"] * 5 + ["c"] * 5),
                    partition_by=["part"], configuration=DV)
    put_dv(path, file_of(path, 0), [0, 4])
    table = DeltaTable(str(path))
    rows = live_rows(table)
    read = rows.to_table(filter=pc.field("part") == "a b%")
    assert _rows(read) == [{"id": i, "s": f"s{i}", "part": "a b%"} for i in (1, 2, 3)]
    assert sorted(rows.to_table(columns=["part"]).column("part").to_pylist()) == \
        ["a b%"] * 3 + ["c"] * 5


def test_without_the_feature_reads_what_to_pyarrow_dataset_reads(tmp_path: Path) -> None:
    path = tmp_path / "plain"
    for low in (0, 10):
        write_deltalake(str(path), _batch(low, low + 10), mode="append")
    write_deltalake(str(path), _batch(20, 22, extra=[1, None]), mode="append",
                    schema_mode="merge")
    table = DeltaTable(str(path))
    rows = live_rows(table)
    dataset = table.to_pyarrow_dataset()
    assert not rows.has_deletions and rows.schema == dataset.schema
    assert rows.to_table().equals(dataset.to_table())
    where = pc.field("id") > 15
    assert rows.to_table(["id", "extra"], where).equals(dataset.to_table(["id", "extra"],
                                                                        filter=where))
    assert rows.count_rows() == dataset.count_rows() == 22


def test_verify_checksums_skip_deleted_rows(dv_table: Path, tmp_path: Path) -> None:
    """verify's Delta side over a table with deletion vectors sums what a plain table
    of the same live rows sums."""
    plain = tmp_path / "plain"
    write_deltalake(str(plain), pa.table({"id": pa.array(LIVE, pa.int64()),
                                          "s": [f"s{i}" for i in LIVE]}))
    shape = TableShape((ComparedColumn("id", pa.int64()), ComparedColumn("s", pa.string())),
                       ("id",))
    with DeltaChecksumSide(str(dv_table)) as side, DeltaChecksumSide(str(plain)) as expected:
        assert side.row_estimate() == len(LIVE)
        assert side.bucket_sums(shape, 4) == expected.bucket_sums(shape, 4)
        assert side.bucket_sums(shape, 4, only=[1]) == expected.bucket_sums(shape, 4, only=[1])
        assert sorted(side.bucket_rows(shape, 2, [0])) == \
            sorted(expected.bucket_rows(shape, 2, [0]))
        keys = [("1",), ("2",), ("12",)]
        assert side.key_rows(shape, keys) == expected.key_rows(shape, keys)
