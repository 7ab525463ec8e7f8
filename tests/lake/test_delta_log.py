"""The Delta log replay agrees with delta-rs on the live files (JSON commits, classic
single- and multi-part checkpoints), keeps the deletion vectors tidemark commits (also
through a delta-rs checkpoint), and commits are exclusive."""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake
from pyroaring import BitMap64

from tidemark.errors import TidemarkError
from tidemark.lake.deletion_vector import DeletionVector, write_vectors
from tidemark.lake.delta_log import (
    CommitConflictError,
    LogState,
    UnsupportedLogError,
    advance,
    commit,
    now_ms,
    read_log,
    replace_file_actions,
)

_DV_CONFIG = {"delta.enableDeletionVectors": "true"}


def _batch(start: int, n: int) -> pa.Table:
    return pa.table({"id": pa.array(range(start, start + n), pa.int64()),
                     "v": pa.array([f"v{i}" for i in range(n)])})


def _delta_rs_files(path: Path, version: int | None = None) -> dict[str, int]:
    table = DeltaTable(str(path), version=version)
    actions = pa.table(table.get_add_actions(flatten=True)).to_pylist()
    return {a["path"]: a["num_records"] for a in actions}


def _ours(state: LogState) -> dict[str, int]:
    return {p: json.loads(a["stats"])["numRecords"] for p, a in state.files.items()}


def _history(path: Path) -> None:
    """Appends, a merge, a compaction and a checkpoint in between, all by delta-rs."""
    for k in range(3):
        write_deltalake(str(path), _batch(100 * k, 50), mode="append", configuration=_DV_CONFIG)
    (DeltaTable(str(path)).merge(_batch(20, 100), "t.id = s.id", source_alias="s",
                                 target_alias="t")
     .when_matched_update_all().when_not_matched_insert_all().execute())
    DeltaTable(str(path)).create_checkpoint()
    write_deltalake(str(path), _batch(1000, 10), mode="append")
    DeltaTable(str(path)).optimize.compact()
    write_deltalake(str(path), _batch(2000, 10), mode="append")


def test_replay_equals_delta_rs_at_every_version(tmp_path: Path) -> None:
    path = tmp_path / "t"
    _history(path)
    latest = DeltaTable(str(path)).version()
    assert (path / "_delta_log" / f"{3:020d}.checkpoint.parquet").exists()
    for version in range(latest + 1):
        state = read_log(path, version)
        assert state.version == version
        assert _ours(state) == _delta_rs_files(path, version), version
    state = read_log(path)
    assert state.version == latest
    assert "deletionVectors" in state.protocol["readerFeatures"]
    assert state.metadata["configuration"]["delta.enableDeletionVectors"] == "true"


def test_replay_from_a_checkpoint_alone_after_log_cleanup(tmp_path: Path) -> None:
    path = tmp_path / "t"
    _history(path)
    expected = _delta_rs_files(path)
    for version in range(3):  # what log cleanup removes: the commits before the checkpoint
        (path / "_delta_log" / f"{version:020d}.json").unlink()
    assert _ours(read_log(path)) == expected
    with pytest.raises(FileNotFoundError, match="lacks commit"):
        read_log(path, 1)


def test_a_multi_part_checkpoint_is_read(tmp_path: Path) -> None:
    path = tmp_path / "t"
    _history(path)
    expected = _delta_rs_files(path)
    log = path / "_delta_log"
    single = log / f"{3:020d}.checkpoint.parquet"
    table = pq.read_table(single)
    half = table.num_rows // 2
    for i, part in enumerate((table.slice(0, half), table.slice(half)), 1):
        pq.write_table(part, log / f"{3:020d}.checkpoint.{i:010d}.{2:010d}.parquet")
    single.unlink()
    for version in range(3):
        (log / f"{version:020d}.json").unlink()
    assert _ours(read_log(path)) == expected


def test_a_v2_checkpoint_is_refused_by_name(tmp_path: Path) -> None:
    path = tmp_path / "t"
    write_deltalake(str(path), _batch(0, 5), configuration=_DV_CONFIG)
    write_deltalake(str(path), _batch(5, 5), mode="append")
    (path / "_delta_log" / f"{1:020d}.checkpoint.{uuid.uuid4()}.json").write_text("{}\n")
    with pytest.raises(UnsupportedLogError, match="not supported for merge-on-read"):
        read_log(path)


def _mark(path: Path, deletions: dict[str, list[int]]) -> dict[str, DeletionVector]:
    state = read_log(path)
    paths = sorted(deletions)
    dvs = write_vectors(path, [BitMap64(deletions[p]) for p in paths])
    actions: list[dict[str, Any]] = []
    for p, dv in zip(paths, dvs, strict=True):
        actions += replace_file_actions(state.files[p], dv, now_ms())
    commit(path, state.version + 1, actions)
    return dict(zip(paths, dvs, strict=True))


def _dvs(state: LogState) -> dict[str, DeletionVector]:
    return {p: DeletionVector.from_json(a["deletionVector"])
            for p, a in state.files.items() if "deletionVector" in a}


def test_own_dvs_are_replayed_and_survive_a_delta_rs_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "t"
    for k in range(3):
        write_deltalake(str(path), _batch(100 * k, 100), mode="append", configuration=_DV_CONFIG)
    a, b, c = sorted(read_log(path).files)
    first = _mark(path, {a: [1, 2], b: list(range(0, 100, 3))})
    second = _mark(path, {a: list(range(0, 100, 2)), c: [7]})
    state = read_log(path)
    assert _dvs(state) == {a: second[a], b: first[b], c: second[c]}
    assert _ours(state) == {a: 100, b: 100, c: 100}  # numRecords stays physical
    add = state.files[a]
    assert json.loads(add["stats"])["tightBounds"] is False

    DeltaTable(str(path)).create_checkpoint()
    checkpoint = path / "_delta_log" / f"{state.version:020d}.checkpoint.parquet"
    written = [r for r in pq.read_table(checkpoint, columns=["add"])["add"].to_pylist()
               if r is not None and r["deletionVector"] is not None]
    assert {r["path"]: DeletionVector.from_json(r["deletionVector"]) for r in written} \
        == _dvs(state)
    for version in range(state.version):
        (path / "_delta_log" / f"{version:020d}.json").unlink()
    from_checkpoint = read_log(path)
    assert _dvs(from_checkpoint) == _dvs(state)
    assert from_checkpoint.files == state.files


def test_the_remove_names_the_old_vector_and_the_add_the_new(tmp_path: Path) -> None:
    path = tmp_path / "t"
    write_deltalake(str(path), _batch(0, 100), configuration=_DV_CONFIG)
    (p,) = read_log(path).files
    old = _mark(path, {p: [1]})[p]
    new_dv = DeletionVector("i", "x" * 5, None, 4, 1)
    remove, add = replace_file_actions(read_log(path).files[p], new_dv, 123)
    assert remove["remove"]["deletionVector"] == old.to_json()
    assert remove["remove"]["deletionTimestamp"] == 123
    assert remove["remove"]["extendedFileMetadata"] is True
    assert add["add"]["deletionVector"] == new_dv.to_json()
    assert add["add"]["size"] == remove["remove"]["size"]


def test_a_remove_of_another_vector_leaves_the_live_file(tmp_path: Path) -> None:
    path = tmp_path / "t"
    write_deltalake(str(path), _batch(0, 100), configuration=_DV_CONFIG)
    (p,) = read_log(path).files
    _mark(path, {p: [1]})
    live = read_log(path).files[p]
    stale = dict(live, deletionVector=DeletionVector("i", "00000", None, 4, 0).to_json())
    commit(path, 2, [{"remove": {"path": p, "deletionTimestamp": 1, "dataChange": True,
                                 "deletionVector": stale["deletionVector"]}}])
    assert read_log(path).files == {p: live}
    commit(path, 3, [replace_file_actions(live, None, 1)[0]])
    assert read_log(path).files == {}


def test_a_second_commit_of_a_version_conflicts(tmp_path: Path) -> None:
    path = tmp_path / "t"
    write_deltalake(str(path), _batch(0, 10), configuration=_DV_CONFIG)
    before = (path / "_delta_log" / f"{0:020d}.json").read_bytes()
    with pytest.raises(CommitConflictError, match="version 0 already exists") as caught:
        commit(path, 0, [{"commitInfo": {"timestamp": 1}}])
    assert caught.value.version == 0
    assert isinstance(caught.value, TidemarkError)
    assert (path / "_delta_log" / f"{0:020d}.json").read_bytes() == before
    assert sorted(p.name for p in (path / "_delta_log").iterdir()) == [f"{0:020d}.json"]


def test_advance_equals_a_fresh_replay(tmp_path: Path) -> None:
    path = tmp_path / "t"
    write_deltalake(str(path), _batch(0, 50), configuration=_DV_CONFIG)
    start = read_log(path)
    write_deltalake(str(path), _batch(50, 50), mode="append")
    (p, *_) = sorted(read_log(path).files)
    _mark(path, {p: [3, 4]})
    DeltaTable(str(path)).optimize.compact()
    advanced = advance(path, start)
    assert advanced == read_log(path)
    assert start.version == 0 and len(start.files) == 1  # the input is left as it was
    assert advance(path, advanced) == advanced


def test_advance_falls_back_to_the_checkpoint_after_log_cleanup(tmp_path: Path) -> None:
    path = tmp_path / "t"
    write_deltalake(str(path), _batch(0, 50), configuration=_DV_CONFIG)
    start = read_log(path)
    for k in range(1, 4):
        write_deltalake(str(path), _batch(50 * k, 50), mode="append")
    DeltaTable(str(path)).create_checkpoint()
    for version in range(3):
        (path / "_delta_log" / f"{version:020d}.json").unlink()
    write_deltalake(str(path), _batch(500, 5), mode="append")
    assert advance(path, start) == read_log(path)
    assert _ours(advance(path, start)) == _delta_rs_files(path)


@pytest.mark.parametrize("again", [1, 2, 4], ids=["fewer", "as-many", "more"])
def test_advance_replays_a_table_made_again_at_the_same_path(tmp_path: Path,
                                                            again: int) -> None:
    path = tmp_path / "t"
    write_deltalake(str(path), _batch(0, 50), configuration=_DV_CONFIG)
    write_deltalake(str(path), _batch(50, 50), mode="append")
    old = read_log(path)
    assert old.version == 1
    shutil.rmtree(path)
    write_deltalake(str(path), _batch(1000, 5), configuration=_DV_CONFIG)
    for k in range(1, again + 1):
        write_deltalake(str(path), _batch(1000 + 10 * k, 5), mode="append")
    assert advance(path, old) == read_log(path)
    assert _ours(advance(path, old)) == _delta_rs_files(path)
