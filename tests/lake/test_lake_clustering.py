"""Clustering by key: files whose key ranges overlap are rewritten sorted, so a merge on
a few keys rewrites one file instead of all of them, and the rows never change."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable, write_deltalake

from delta_rows import live_table
from tidemark.lake.clustering import FileRange, cluster, key_ranges, overlapping_groups
from tidemark.lake.upkeep import UpkeepSettings, UpkeepState, upkeep

_MB = 1 << 20


def _rows(ids: list[int], version: int = 0) -> pa.Table:
    # Bodies that do not compress, so that files have the size of their rows.
    bodies = [hashlib.sha256(b"%d %d" % (i, version)).hexdigest() for i in ids]
    return pa.table({"id": pa.array(ids, pa.int64()),
                     "v": pa.array([version] * len(ids), pa.int64()),
                     "body": pa.array(bodies)})


def _interleaved(path: Path, files: int, rows: int) -> None:
    """*files* files over the same key range 1..files*rows (file k holds the ids equal
    to k modulo *files*): every file overlaps every other, as a merge's parallel writers
    leave them."""
    for k in range(files):
        write_deltalake(path, _rows(list(range(k + 1, files * rows + 1, files))),
                        mode="append")


def _content(path: Path) -> list[dict[str, object]]:
    table = live_table(DeltaTable(str(path)))
    return table.sort_by([("id", "ascending"), ("v", "ascending")]).to_pylist()


def _groups(path: Path) -> list[int]:
    ranges = key_ranges(DeltaTable(str(path)), "id")
    assert ranges is not None
    return [len(group) for group in overlapping_groups(ranges)]


def test_groups_chain_overlaps_and_keep_disjoint_files_apart() -> None:
    files = [FileRange(1, 10, 1), FileRange(20, 30, 1), FileRange(5, 12, 1),
             FileRange(12, 15, 1), FileRange(31, 40, 1), FileRange(25, 26, 1)]
    groups = overlapping_groups(files)
    assert [[(f.low, f.high) for f in g] for g in groups] == [
        [(1, 10), (5, 12), (12, 15)], [(20, 30), (25, 26)], [(31, 40)]]


def test_overlapping_files_are_sorted_into_disjoint_ones_with_the_same_rows(
        tmp_path: Path) -> None:
    path = tmp_path / "t"
    _interleaved(path, files=4, rows=10_000)  # 4 files of 0.7 MB
    before = _content(path)
    assert _groups(path) == [4]
    # Not yet worth it: less than one and a half target files.
    assert upkeep(DeltaTable(str(path)), UpkeepSettings(target_file_mb=3), UpkeepState(),
                  keys=("id",)) == []
    tasks = upkeep(DeltaTable(str(path)), UpkeepSettings(target_file_mb=1), UpkeepState(),
                   keys=("id",))
    assert [task.name for task in tasks] == ["cluster"]
    assert "sorted 4 files by key (40000 rows)" in str(tasks[0])
    assert _content(path) == before
    assert set(_groups(path)) == {1}, "the rewritten files' key ranges still overlap"
    files = sorted(pa.table(DeltaTable(str(path)).get_add_actions(flatten=True)).to_pylist(),
                   key=lambda f: f["min.id"])
    assert len(files) > 1
    # Newest keys first: the part file holds the oldest keys, the newest are in a whole one.
    assert files[0]["num_records"] < files[-1]["num_records"]

    # What clustering is for: a merge on a few neighbouring keys now rewrites one file.
    table = DeltaTable(str(path))
    table.alter.set_table_properties({"delta.targetFileSize": str(_MB)})
    metrics = table.merge(_rows([100, 101, 102, 103], version=1), "t.id = s.id",
                          source_alias="s", target_alias="t") \
        .when_matched_update_all().execute()
    assert metrics["num_target_files_removed"] == 1


def test_a_merge_on_unclustered_files_rewrites_every_overlapping_one(tmp_path: Path) -> None:
    """The other side of the test above: without clustering the same merge rewrites all
    four files (so the test above measures clustering, not delta-rs' pruning)."""
    path = tmp_path / "t"
    _interleaved(path, files=4, rows=10_000)
    metrics = DeltaTable(str(path)).merge(_rows([100, 101, 102, 103], version=1), "t.id = s.id",
                                          source_alias="s", target_alias="t") \
        .when_matched_update_all().execute()
    assert metrics["num_target_files_removed"] == 4


def test_rows_of_one_key_in_several_versions_keep_every_version(tmp_path: Path) -> None:
    """An SCD2 target holds a key once per version: sorting keeps them all."""
    path = tmp_path / "t"
    for version in range(3):
        write_deltalake(path, _rows(list(range(1, 3_001)), version=version), mode="append")
    before = _content(path)
    done = cluster(DeltaTable(str(path)), ("id", "v"), min_files=3, min_bytes=0,
                   max_bytes=64 * _MB,
                   target_file_size=_MB)
    assert done == "sorted 3 files by key (9000 rows)"
    assert _content(path) == before
    ids = live_table(DeltaTable(str(path))).column("id")
    assert pc.count_distinct(ids).as_py() == 3_000


def test_only_groups_of_enough_files_within_the_size_bound_are_sorted(
        tmp_path: Path) -> None:
    path = tmp_path / "t"
    _interleaved(path, files=2, rows=2_000)
    table = DeltaTable(str(path))
    assert cluster(table, ("id",), min_files=3, min_bytes=0, max_bytes=64 * _MB,
                   target_file_size=_MB) is None
    # A group bigger than max_bytes is most of the table: left alone.
    assert cluster(table, ("id",), min_files=2, min_bytes=0, max_bytes=1_000,
                   target_file_size=_MB) is None
    assert table.version() == 1, "a skipped clustering wrote a commit"
    assert upkeep(table, UpkeepSettings(cluster_min_files=0), UpkeepState(),
                  keys=("id",)) == []
    assert upkeep(table, UpkeepSettings(), UpkeepState(), keys=()) == []


@pytest.mark.parametrize("case", ["string key", "partitioned"])
def test_tables_whose_ranges_cannot_be_trusted_are_left_alone(tmp_path: Path,
                                                              case: str) -> None:
    path = tmp_path / "t"
    for k in range(3):
        rows = _rows(list(range(k + 1, 3_000, 3)))
        if case == "string key":
            write_deltalake(path, rows.set_column(0, "id", pc.cast(rows["id"], pa.string())),
                            mode="append")
        else:
            write_deltalake(path, rows, mode="append", partition_by=["v"])
    table = DeltaTable(str(path))
    assert key_ranges(table, "id") is None
    assert cluster(table, ("id",), min_files=2, min_bytes=0, max_bytes=64 * _MB,
                   target_file_size=_MB) is None


def test_a_target_is_clustered_again_only_after_twenty_batches(tmp_path: Path) -> None:
    path = tmp_path / "t"
    _interleaved(path, files=4, rows=12_000)  # 3.5 MB: over 1.5 target files
    settings, state = UpkeepSettings(target_file_mb=2), UpkeepState()
    assert [t.name for t in upkeep(DeltaTable(str(path)), settings, state, keys=("id",))] \
        == ["cluster"]
    _interleaved(path, files=3, rows=12_000)  # overlapping again, at once
    for _ in range(19):
        assert upkeep(DeltaTable(str(path)), settings, state, keys=("id",)) == []
    assert [t.name for t in upkeep(DeltaTable(str(path)), settings, state, keys=("id",))] \
        == ["cluster"]
