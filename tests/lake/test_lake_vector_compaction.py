"""Upkeep of merge-on-read targets: files with many deleted rows are rewritten without
them (the same live rows for every reader, later batches still find their keys), and
vacuum deletes the deletion vector files nothing can need any more."""

from __future__ import annotations

import os
import time
from pathlib import Path

from deltalake import DeltaTable

from delta_readers import check_readers_agree
from lake_helpers import change, read, rows
from tidemark.lake import ApplySpec, apply_changes, delta_log
from tidemark.lake.upkeep import UpkeepSettings, UpkeepState, upkeep
from tidemark.lake.vector_compaction import small_files_due
from tidemark.lake.vector_vacuum import delete_unreferenced_vectors

SPEC = ApplySpec(keys=("id",), merge="merge_on_read")
#: Only the rewrite of files with deleted rows (and vacuum where a test asks for it).
ONLY_DELETED = UpkeepSettings(compact_min_files=0, cluster_min_files=0, checkpoint_every=0,
                              vacuum_every_minutes=0, compact_deleted_fraction=0.3)


def _load(path: Path, n: int = 1000) -> dict[int, str]:
    apply_changes(path, rows(*(change("c", 10, i + 1, id=i, name="v0", body="x")
                               for i in range(n))), SPEC, app_id="q", version=0)
    return {i: "v0" for i in range(n)}


def _update(path: Path, model: dict[int, str], ids: list[int], version: int,
            deletes: tuple[int, ...] = ()) -> None:
    lsn = 10 * (version + 1)
    changes = [change("u", lsn, s + 1, id=i, name=f"v{version}", body="x")
               for s, i in enumerate(ids)]
    changes += [change("d", lsn, len(ids) + s + 1, id=i) for s, i in enumerate(deletes)]
    result = apply_changes(path, rows(*changes), SPEC, app_id="q", version=version)
    assert result.merge == "merge_on_read"
    for i in ids:
        model[i] = f"v{version}"
    for i in deletes:
        model.pop(i, None)


def _expected(model: dict[int, str]) -> list[dict[str, object]]:
    return [{"id": i, "name": model[i]} for i in sorted(model)]


def _vectors(path: Path) -> int:
    return sum(1 for add in delta_log.read_log(path).files.values()
               if add.get("deletionVector"))


def test_a_file_past_the_threshold_is_rewritten_and_later_batches_find_their_keys(
        tmp_path: Path) -> None:
    path = tmp_path / "t"
    model = _load(path)
    _update(path, model, list(range(0, 1000, 5)), 1)  # a fifth of the rows: under 0.3
    state = UpkeepState()
    assert upkeep(DeltaTable(str(path)), ONLY_DELETED, state) == []
    assert _vectors(path) == 1
    _update(path, model, list(range(1, 1000, 5)), 2)  # two fifths
    before = check_readers_agree(path)
    version = DeltaTable(str(path)).version()
    tasks = upkeep(DeltaTable(str(path)), ONLY_DELETED, state)
    assert [t.name for t in tasks] == ["compact_deleted"]
    assert "400 deleted rows dropped" in tasks[0].detail
    assert _vectors(path) == 0
    assert check_readers_agree(path) == before
    table = DeltaTable(str(path))
    assert table.version() == version + 1
    assert table.transaction_version("q") == 2  # exactly-once unaffected
    history = table.history(1)[0]
    assert history["operation"] == "OPTIMIZE"
    # The writer's key index follows the rewrite: updates and deletes of rows now in
    # the new file hit them, once.
    _update(path, model, [2, 3, 997], 3, deletes=(4, 998))
    _update(path, model, [3, 500], 4, deletes=(2,))
    check_readers_agree(path)
    assert read(path, "id", "name") == _expected(model)
    # A replayed batch is still recognised.
    assert apply_changes(path, rows(change("u", 50, 1, id=3, name="x", body="x")), SPEC,
                         app_id="q", version=4).already_applied


def test_zero_never_rewrites(tmp_path: Path) -> None:
    path = tmp_path / "t"
    model = _load(path, 100)
    _update(path, model, list(range(0, 100, 2)), 1)
    off = UpkeepSettings(compact_min_files=0, cluster_min_files=0, checkpoint_every=0,
                         vacuum_every_minutes=0, compact_deleted_fraction=0)
    assert upkeep(DeltaTable(str(path)), off, UpkeepState()) == []
    assert _vectors(path) == 1


def _dv_files(path: Path) -> set[str]:
    return {p.name for p in path.glob("deletion_vector_*.bin")}


def _age(paths: list[Path], hours: float) -> None:
    past = time.time() - hours * 3600
    for p in paths:
        os.utime(p, (past, past))


def test_vacuum_deletes_the_vector_files_no_version_in_the_retention_needs(
        tmp_path: Path) -> None:
    path = tmp_path / "t"
    model = _load(path, 20_000)  # vectors of this many rows are files, not inline
    _update(path, model, list(range(0, 20_000, 3)), 1)
    first = _dv_files(path)
    assert len(first) == 1
    _update(path, model, list(range(1, 20_000, 3)), 2)  # replaces the first vector
    live = _dv_files(path) - first
    assert len(live) == 1
    _age([path / n for n in _dv_files(path)], 2)
    # Within the retention a commit still names the first vector: time travel needs it.
    assert delete_unreferenced_vectors(path, 1) == 0
    _age(list((path / "_delta_log").iterdir()), 2)
    assert delete_unreferenced_vectors(path, 1) == 1
    assert _dv_files(path) == live  # the live one stays, and nothing else went
    assert len(list(path.glob("*.parquet"))) >= 2
    check_readers_agree(path)
    assert read(path, "id", "name") == _expected(model)


def test_upkeep_vacuum_deletes_vector_files_left_by_a_rewrite(tmp_path: Path) -> None:
    path = tmp_path / "t"
    model = _load(path, 20_000)
    _update(path, model, list(range(0, 20_000, 2)), 1)
    assert len(_dv_files(path)) == 1
    settings = UpkeepSettings(compact_min_files=0, cluster_min_files=0, checkpoint_every=0,
                              vacuum_every_minutes=1, vacuum_retention_hours=0)
    state = UpkeepState()
    clock = time.time()
    tasks = upkeep(DeltaTable(str(path)), settings, state, now=clock)
    assert [t.name for t in tasks] == ["compact_deleted"]
    tasks = upkeep(DeltaTable(str(path)), settings, state, now=clock + 61)
    assert [t.name for t in tasks] == ["vacuum"]
    assert "and 1 deletion vector files" in tasks[0].detail
    assert _dv_files(path) == set()
    check_readers_agree(path)
    assert read(path, "id", "name") == _expected(model)


def test_vacuum_keeps_a_live_vector_file_older_than_the_retention(tmp_path: Path) -> None:
    """delta-rs's full vacuum deletes it (the table is then unreadable)."""
    path = tmp_path / "t"
    model = _load(path, 20_000)
    _update(path, model, list(range(0, 20_000, 3)), 1)  # a third: not rewritten
    _update(path, model, list(range(1, 20_000, 7)), 2)
    live = {p for p in _dv_files(path)}
    _age([p for p in path.rglob("*") if p.is_file()], 2)
    settings = UpkeepSettings(compact_min_files=0, cluster_min_files=0, checkpoint_every=0,
                              vacuum_every_minutes=1, vacuum_retention_hours=1,
                              compact_deleted_fraction=0.9)
    state = UpkeepState()
    clock = time.time()
    assert upkeep(DeltaTable(str(path)), settings, state, now=clock) == []
    tasks = upkeep(DeltaTable(str(path)), settings, state, now=clock + 61)
    assert [t.name for t in tasks] == ["vacuum"]
    assert "and 1 deletion vector files" in tasks[0].detail  # the replaced one
    assert len(_dv_files(path)) == 1 and _dv_files(path) < live
    check_readers_agree(path)
    assert read(path, "id", "name") == _expected(model)


#: Only the compaction of small files: files under 256 KB, merged up to 512 KB.
ONLY_SMALL = UpkeepSettings(target_file_mb=1, compact_min_files=4, cluster_min_files=0,
                            checkpoint_every=0, vacuum_every_minutes=0,
                            compact_deleted_fraction=0)
_SMALL = 1 << 18


def _sizes(path: Path) -> dict[str, int]:
    return {p: int(a["size"]) for p, a in delta_log.read_log(path).files.items()}


def test_small_files_are_merged_and_a_full_one_is_left_alone(tmp_path: Path) -> None:
    """Each batch adds a small file (and updates and deletes rows of earlier ones): the
    oldest small files are merged into one, without their deleted rows; a file past
    half the size (one a compaction made) is never rewritten again (delta-rs's
    compaction rewrites every file under its target, so that one each time); the
    readers agree and the writer's key index finds the rows where they went."""
    path = tmp_path / "t"
    model = _load(path, 10)
    state = UpkeepState()
    ran = 0
    next_id = 10
    for version in range(1, 25):
        ids = list(range(next_id, next_id + 1500))
        next_id += 1500
        lsn = 10 * (version + 1)
        changes = [change("c", lsn, s + 1, id=i, name=f"v{version}",
                          body=f"{i * 7919:x}" * 6) for s, i in enumerate(ids)]
        # An update and a delete of rows of the batch before: vectors on small files.
        changes += [change("u", lsn, 2000, id=next_id - 2000, name="u", body="u"),
                    change("d", lsn, 2001, id=next_id - 2100)]
        assert apply_changes(path, rows(*changes), SPEC, app_id="q",
                             version=version).merge == "merge_on_read"
        model.update({i: f"v{version}" for i in ids})
        model[next_id - 2000] = "u"
        model.pop(next_id - 2100, None)
        before = _sizes(path)
        tasks = upkeep(DeltaTable(str(path)), ONLY_SMALL, state)
        if not tasks:
            continue
        ran += 1
        assert [t.name for t in tasks] == ["compact"], tasks
        assert "small files into 1," in tasks[0].detail, tasks[0].detail
        removed = set(before) - set(_sizes(path))
        assert len(removed) >= 2 and all(before[p] < _SMALL for p in removed), \
            {p: before[p] for p in removed}
        assert len(check_readers_agree(path)) == len(model)
    full = [p for p, size in _sizes(path).items() if size >= _SMALL]
    assert ran >= 3 and full, (ran, _sizes(path))
    assert read(path, "id", "name") == _expected(model)
    # Later batches still find the keys the compactions moved.
    _update(path, model, [11, 500, next_id - 1], 40, deletes=(12, 600))
    assert read(path, "id", "name") == _expected(model)


def test_small_files_of_one_partition_are_chosen() -> None:
    """Files of different partitions cannot become one file: the oldest partition with
    two small files at least gives them, oldest first, within the byte budget."""
    def add(name: str, size: int, at: int, region: str) -> dict[str, object]:
        return {"path": name, "size": size, "modificationTime": at,
                "partitionValues": {"region": region}}
    files = [add("a1", 10, 1, "eu"), add("b1", 10, 2, "us"), add("b2", 10, 3, "us"),
             add("a2", 10, 4, "eu"), add("a3", 10, 5, "eu"), add("big", 900, 0, "eu"),
             add("c1", 10, 0, "asia")]
    state = delta_log.LogState(version=1, files={str(f["path"]): f for f in files},
                               protocol={}, metadata={})
    assert [f["path"] for f in small_files_due(state, 100, 1000)] == ["a1", "a2", "a3"]
    assert [f["path"] for f in small_files_due(state, 100, 15)] == ["a1", "a2"]
    only_one_each = delta_log.LogState(version=1, files={"x": add("x", 10, 1, "eu"),
                                                         "y": add("y", 10, 2, "us")},
                                       protocol={}, metadata={})
    assert small_files_due(only_one_each, 100, 1000) == []
