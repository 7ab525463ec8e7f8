"""Upkeep's rewrites of a merge-on-read target beside the batches
(``upkeep(background=True)``, :mod:`tidemark.lake.background_rewrite`): the rows the
batches delete meanwhile stay deleted, a rewrite whose file went is abandoned without a
trace, and nothing else heavy runs while one is written."""

from __future__ import annotations

import concurrent.futures
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from delta_readers import check_readers_agree
from lake_helpers import change, read, rows
from tidemark.lake import (
    ApplySpec,
    apply_changes,
    background_rewrite,
    merge_on_read,
    rewrite_files,
)
from tidemark.lake.upkeep import UpkeepSettings, UpkeepState, upkeep
from waiting import wait_for

SPEC = ApplySpec(keys=("id",), merge="merge_on_read")
ONLY_DELETED = UpkeepSettings(compact_min_files=0, cluster_min_files=0, checkpoint_every=0,
                              vacuum_every_minutes=0, compact_deleted_fraction=0.3)


def _apply(path: Path, model: dict[int, str], version: int, updates: Sequence[int] = (),
           deletes: Sequence[int] = (), inserts: Sequence[int] = ()) -> None:
    lsn = 10 * (version + 1)
    changes = [change("c", lsn, s + 1, id=i, name=f"v{version}", body="x")
               for s, i in enumerate(inserts)]
    changes += [change("u", lsn, 100 + s, id=i, name=f"v{version}", body="x")
                for s, i in enumerate(updates)]
    changes += [change("d", lsn, 200 + s, id=i) for s, i in enumerate(deletes)]
    result = apply_changes(path, rows(*changes), SPEC, app_id="q", version=version)
    assert result.merge == "merge_on_read"
    for i in (*inserts, *updates):
        model[i] = f"v{version}"
    for i in deletes:
        model.pop(i, None)


def _check(path: Path, model: dict[int, str]) -> None:
    check_readers_agree(path)
    assert read(path, "id", "name") == [{"id": i, "name": model[i]} for i in sorted(model)]


def _wait(state: UpkeepState) -> None:
    deadline = time.monotonic() + 60
    while state.rewrite is not None and not state.rewrite.done():
        assert time.monotonic() < deadline, "the rewrite did not finish"
        time.sleep(0.01)


def _unreferenced(path: Path) -> set[str]:
    """Data files in the table's folder no commit names."""
    named = set()
    for commit in (path / "_delta_log").glob("*.json"):
        for line in commit.read_text().splitlines():
            action = json.loads(line)
            if "add" in action:
                named.add(action["add"]["path"])
    return {p.name for p in path.glob("*.parquet")} - named


class _Held:
    """The rewrite thread, held: a rewrite's files are written when it starts and it is
    done only once the test says so."""

    def __init__(self) -> None:
        self.futures: list[concurrent.futures.Future[Any]] = []

    def submit(self, work: Callable[..., Any], *args: Any) -> concurrent.futures.Future[Any]:
        self.futures.append(concurrent.futures.Future())
        self._result = work(*args)
        return self.futures[-1]

    def release(self) -> None:
        self.futures[-1].set_result(self._result)


@pytest.fixture(params=["whole row groups", "small read batches and row groups"])
def group_rows(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> int:
    """How many rows a rewrite's row groups hold at most: delta-rs's, or 50 with the old
    file read 7 rows at a time (the rows must keep their order across both)."""
    if request.param == "whole row groups":
        return 1 << 20
    monkeypatch.setattr(rewrite_files, "_READ_ROWS", 7)
    monkeypatch.setattr(rewrite_files, "_GROUP_ROWS", 50)
    return 50


def test_rows_deleted_while_a_file_is_rewritten_stay_deleted(tmp_path: Path,
                                                             group_rows: int) -> None:
    path = tmp_path / "t"
    model: dict[int, str] = {}
    _apply(path, model, 0, inserts=list(range(1000)))
    _apply(path, model, 1, updates=list(range(0, 1000, 3)), deletes=list(range(1, 1000, 9)))
    state = UpkeepState()
    started = upkeep(DeltaTable(str(path)), ONLY_DELETED, state, background=True)
    assert [t.name for t in started] == ["compact_deleted"]
    assert "started beside the batches" in started[0].detail
    _wait(state)  # the real thread, done: its files are written, not committed
    assert len(_unreferenced(path)) == 1
    version = DeltaTable(str(path)).version()
    # Batches meanwhile: rows of the file being rewritten updated and deleted.
    _apply(path, model, 2, updates=[2, 5, 998], deletes=[8, 11, 500, 999], inserts=[1000])
    _apply(path, model, 3, updates=[5, 14], deletes=[2, 20])
    done = upkeep(DeltaTable(str(path)), ONLY_DELETED, state, background=True)
    assert [t.name for t in done] == ["compact_deleted"]
    assert "written beside the batches" in done[0].detail
    assert DeltaTable(str(path)).version() == version + 3
    commit = path / "_delta_log" / f"{version + 3:020d}.json"
    (added,) = [a["add"] for a in map(json.loads, commit.read_text().splitlines())
                if "add" in a]
    # The file held 555 live rows when read; the two batches then replaced or deleted 8
    # of them (2, 5, 8, 11, 14, 20, 500, 998).
    assert json.loads(added["stats"])["numRecords"] == 555
    assert pq.ParquetFile(path / added["path"]).metadata.num_row_groups == \
        -(-555 // group_rows)
    assert added["deletionVector"]["cardinality"] == 8
    assert not _unreferenced(path)
    _check(path, model)
    # The writer's key index takes the rows over (reading no file, though its vector
    # grew after the rewrite read it): later batches hit them, once.
    (index, _), = [held for key, held in merge_on_read.TARGETS._held.items()
                   if key[0] == str(path)]
    read_before, relocated_before = index.files_read, index.files_relocated
    _apply(path, model, 4, updates=[3, 5, 997], deletes=[4, 14, 998])
    assert index.files_relocated == relocated_before + 1
    assert index.files_read == read_before + 1  # the batch's own new file only
    _check(path, model)
    assert DeltaTable(str(path)).transaction_version("q") == 4
    assert apply_changes(path, rows(change("u", 99, 1, id=3, name="x", body="x")), SPEC,
                         app_id="q", version=4).already_applied


def _abandoned_rewrite(path: Path, monkeypatch: pytest.MonkeyPatch
                      ) -> tuple[dict[int, str], UpkeepState, _Held]:
    """A rewrite of the first of two files, started beside the batches, whose file a
    batch then deletes whole: the call after it finds nothing to commit."""
    held = _Held()
    monkeypatch.setattr(background_rewrite, "REWRITER", held)
    model: dict[int, str] = {}
    _apply(path, model, 0, inserts=list(range(100)))
    _apply(path, model, 1, inserts=list(range(100, 200)))  # a second file
    _apply(path, model, 2, deletes=list(range(50)))
    state = UpkeepState()
    assert upkeep(DeltaTable(str(path)), ONLY_DELETED, state, background=True)
    assert len(_unreferenced(path)) == 1
    _apply(path, model, 3, deletes=list(range(50, 100)))  # the rest of the first file
    held.release()
    version = DeltaTable(str(path)).version()
    assert upkeep(DeltaTable(str(path)), ONLY_DELETED, state, background=True) == []
    assert DeltaTable(str(path)).version() == version
    return model, state, held


def test_a_rewrite_whose_file_went_is_abandoned_without_a_trace(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "t"
    model, state, _ = _abandoned_rewrite(path, monkeypatch)
    assert not _unreferenced(path), "the abandoned rewrite's file is left behind"
    assert state.rewrite is None
    _check(path, model)


def test_nothing_else_heavy_runs_while_a_rewrite_is_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    held = _Held()
    monkeypatch.setattr(background_rewrite, "REWRITER", held)
    path = tmp_path / "t"
    model: dict[int, str] = {}
    _apply(path, model, 0, inserts=list(range(200)))
    _apply(path, model, 1, inserts=list(range(200, 400)))
    _apply(path, model, 2, deletes=list(range(0, 400, 2)))  # both files half deleted
    settings = UpkeepSettings(compact_min_files=0, cluster_min_files=0, checkpoint_every=0,
                              vacuum_every_minutes=1, vacuum_retention_hours=0,
                              compact_deleted_fraction=0.3, target_file_mb=1)
    state = UpkeepState()
    clock = time.time()
    assert [t.name for t in upkeep(DeltaTable(str(path)), settings, state, now=clock,
                                   background=True)] == ["compact_deleted"]
    # Vacuum is due: it waits (with no retention it would delete the new file, in no
    # version yet), and no second rewrite starts.
    assert upkeep(DeltaTable(str(path)), settings, state, now=clock + 120,
                  background=True) == []
    assert len(held.futures) == 1 and len(_unreferenced(path)) == 1
    held.release()
    done = upkeep(DeltaTable(str(path)), settings, state, now=clock + 121, background=True)
    assert [t.name for t in done] == ["compact_deleted"]
    assert "written beside" in done[0].detail
    assert [t.name for t in upkeep(DeltaTable(str(path)), settings, state, now=clock + 122,
                                   background=True)] == ["vacuum"]
    assert len(held.futures) == 1
    _check(path, model)


def test_after_an_abandoned_rewrite_the_next_runs_between_batches(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "t"
    model, state, held = _abandoned_rewrite(path, monkeypatch)
    _apply(path, model, 4, deletes=list(range(100, 160)))
    # The next rewrite waits as long as the abandoned one took, and on a loaded machine
    # the batch above can take less.
    def next_rewrite() -> list[Any]:
        assert time.monotonic() < state.rewrite_after + 5, "no rewrite after the pause"
        return upkeep(DeltaTable(str(path)), ONLY_DELETED, state, background=True)

    done = wait_for(next_rewrite, 60, "the next rewrite", interval_s=0.01)
    assert [t.name for t in done] == ["compact_deleted"]
    assert "rewrote 1 files" in done[0].detail and "beside" not in done[0].detail
    assert len(held.futures) == 1 and state.beside
    _check(path, model)


def test_the_next_rewrite_waits_as_long_as_the_last_one_took(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    took = 2.0
    real = background_rewrite.prepare_rewrite

    def slow(root: Path, plan: Any) -> Any:
        time.sleep(took)
        return real(root, plan)

    monkeypatch.setattr(background_rewrite, "prepare_rewrite", slow)
    path = tmp_path / "t"
    model: dict[int, str] = {}
    _apply(path, model, 0, inserts=list(range(100)))
    _apply(path, model, 1, inserts=list(range(100, 200)))
    _apply(path, model, 2, deletes=list(range(50)))  # the first file half deleted
    state = UpkeepState()
    assert [t.name for t in upkeep(DeltaTable(str(path)), ONLY_DELETED, state,
                                   background=True)] == ["compact_deleted"]
    _wait(state)
    done = upkeep(DeltaTable(str(path)), ONLY_DELETED, state, background=True)
    assert [t.name for t in done] == ["compact_deleted"] and "beside" in done[0].detail
    committed = time.monotonic()
    assert state.rewrite_after >= committed + took - 0.5
    _apply(path, model, 3, deletes=list(range(100, 150)))  # the second file is due
    assert time.monotonic() < state.rewrite_after, "the batch took longer than the pause"
    assert upkeep(DeltaTable(str(path)), ONLY_DELETED, state, background=True) == []
    assert state.rewrite is None
    started = wait_for(lambda: upkeep(DeltaTable(str(path)), ONLY_DELETED, state,
                                      background=True), 60, "the second rewrite to start")
    assert time.monotonic() >= state.rewrite_after
    assert [t.name for t in started] == ["compact_deleted"]
    assert "started beside" in started[0].detail
    _wait(state)
    assert upkeep(DeltaTable(str(path)), ONLY_DELETED, state, background=True)
    _check(path, model)


def test_a_partitioned_table_s_rewrite_runs_between_batches(tmp_path: Path) -> None:
    spec = ApplySpec(keys=("id",), merge="merge_on_read", partition_by=("body",))
    path = tmp_path / "t"
    apply_changes(path, rows(*[change("c", 10, i + 1, id=i, name="a", body="x")
                               for i in range(100)]), spec, app_id="q", version=0)
    apply_changes(path, rows(*[change("d", 20, i + 1, id=i) for i in range(50)]), spec,
                  app_id="q", version=1)
    done = upkeep(DeltaTable(str(path)), ONLY_DELETED, UpkeepState(), background=True)
    assert [t.name for t in done] == ["compact_deleted"]
    assert "beside" not in done[0].detail
    check_readers_agree(path)
    assert [r["id"] for r in read(path, "id")] == list(range(50, 100))
