"""Upkeep of a Delta target under many small batches: compaction, checkpoints, log
cleanup and vacuum keep it small to read, and never change what it holds."""

from __future__ import annotations

import time
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from lake_helpers import change, read, rows
from tidemark.lake import ApplySpec, apply_changes
from tidemark.lake import upkeep as upkeep_module
from tidemark.lake.delta_read import has_deletion_vectors_feature
from tidemark.lake.upkeep import UpkeepSettings, UpkeepState, upkeep

SPEC = ApplySpec(keys=("id",))


def _batch(n: int) -> list[dict[str, object]]:
    """Batch *n*: five new rows (an insert-heavy target: a new file per batch), and in
    every tenth an update of a row of the batch before."""
    lsn = 10 * (n + 1)
    changes = [change("c", lsn, s, id=5 * n + s, name=f"n{n}", body="x") for s in range(1, 6)]
    if n % 10 == 9:
        changes.append(change("u", lsn, 6, id=5 * n - 1, name="updated", body="y"))
    return changes


def _model(batches: int) -> list[dict[str, object]]:
    table = {}
    for n in range(batches):
        for c in _batch(n):
            table[c["id"]] = {"id": c["id"], "name": c["name"], "body": c["body"]}
    return [table[k] for k in sorted(table)]


def _live(path: Path) -> set[str]:
    return {Path(u).name for u in DeltaTable(str(path)).file_uris()}


def _files(path: Path) -> int:
    return len(DeltaTable(str(path)).file_uris())


@pytest.mark.parametrize("background", [False, True])
def test_many_small_batches_stay_few_files_with_a_checkpoint_and_the_same_rows(
        tmp_path: Path, background: bool) -> None:
    """With *background* (as ``tidemark run`` calls it), checkpoints are written on
    upkeep's thread and reported by the call after."""
    path = tmp_path / "t"
    settings = UpkeepSettings(target_file_mb=1, compact_min_files=8, checkpoint_every=10,
                              vacuum_every_minutes=0)
    state = UpkeepState()
    ran: list[str] = []
    most = 0
    for n in range(40):
        apply_changes(path, rows(*_batch(n)), SPEC, app_id="q", version=n)
        tasks = upkeep(DeltaTable(str(path)), settings, state, background=background)
        ran += [task.name for task in tasks]
        assert all(("beside the batches" in t.detail) == background
                   for t in tasks if t.name == "checkpoint")
        most = max(most, _files(path))
    assert "compact" in ran and "checkpoint" in ran
    # Compaction starts at 8 small files; a merge adds at most one file per batch.
    assert most <= 8
    assert (path / "_delta_log" / "_last_checkpoint").exists()
    # A reader opens it from the checkpoint, sees every row, and the batches stay
    # exactly-once (compaction commits keep the app transaction).
    started = time.monotonic()
    table = DeltaTable(str(path))
    assert time.monotonic() - started < 5
    assert table.transaction_version("q") == 39
    assert read(path, "id", "name", "body") == _model(40)
    result = apply_changes(path, rows(*_batch(39)), SPEC, app_id="q", version=39)
    assert result.already_applied


def test_a_checkpoint_beside_the_batches_leaves_the_log_cleanup_to_the_next_call(
        tmp_path: Path) -> None:
    """Readers list the log, then open what they listed: only the writer's thread
    deletes from it, when it reports the checkpoint written beside the batches."""
    path = tmp_path / "t"
    settings = UpkeepSettings(compact_min_files=0, checkpoint_every=3, log_retention_hours=0,
                              vacuum_every_minutes=0)
    state = UpkeepState()
    ran: list[str] = []
    for n in range(12):
        apply_changes(path, rows(*_batch(n)), SPEC, app_id="q", version=n)
        if state.checkpoint is not None:
            deadline = time.monotonic() + 60
            while not state.checkpoint.done():  # the thread's checkpoint, then the call
                assert time.monotonic() < deadline
                time.sleep(0.01)
            logs = set((path / "_delta_log").glob("*.json"))
            tasks = upkeep(DeltaTable(str(path)), settings, state, background=True)
            assert [t.name for t in tasks][:1] == ["checkpoint"]
            if "cleanup" in [t.name for t in tasks]:
                assert set((path / "_delta_log").glob("*.json")) < logs
        else:
            tasks = upkeep(DeltaTable(str(path)), settings, state, background=True)
            assert "cleanup" not in [t.name for t in tasks], "cleaned up beside the batches"
        ran += [t.name for t in tasks]
    assert "cleanup" in ran
    assert read(path, "id", "name", "body") == _model(12)


def test_without_upkeep_the_files_pile_up(tmp_path: Path) -> None:
    """The control: the same batches leave a file per batch (so the bound above is
    upkeep's doing)."""
    path = tmp_path / "t"
    for n in range(20):
        apply_changes(path, rows(*_batch(n)), SPEC, app_id="q", version=n)
        upkeep(DeltaTable(str(path)), UpkeepSettings(enabled=False), UpkeepState())
    assert _files(path) >= 15


def test_log_cleanup_and_vacuum_delete_what_no_reader_needs(tmp_path: Path) -> None:
    path = tmp_path / "t"
    settings = UpkeepSettings(target_file_mb=1, compact_min_files=4, checkpoint_every=5,
                              log_retention_hours=0, vacuum_every_minutes=1,
                              vacuum_retention_hours=0)
    state = UpkeepState()
    clock = 1_000_000.0
    tasks = []
    for n in range(12):
        apply_changes(path, rows(*_batch(n)), SPEC, app_id="q", version=n)
        clock += 61
        tasks += upkeep(DeltaTable(str(path)), settings, state, now=clock)
    assert {"compact", "checkpoint", "cleanup", "vacuum"} <= {t.name for t in tasks}
    assert any(t.name == "vacuum" and t.detail != "vacuum deleted 0 files" for t in tasks)
    logs = sorted(p.name for p in (path / "_delta_log").glob("*.json"))
    assert "00000000000000000000.json" not in logs  # cleaned up before the checkpoint
    # Whatever the last compaction replaced goes with the next vacuum.
    last = upkeep(DeltaTable(str(path)), settings, state, now=clock + 61)
    assert [t.name for t in last] == ["vacuum"]
    assert {p.name for p in path.glob("*.parquet")} == _live(path)
    assert read(path, "id", "name", "body") == _model(12)


def test_heavy_tasks_wait_when_the_batch_had_one(tmp_path: Path) -> None:
    path = tmp_path / "t"
    for n in range(10):
        apply_changes(path, rows(*_batch(n)), SPEC, app_id="q", version=n)
    settings = UpkeepSettings(target_file_mb=1, compact_min_files=4, checkpoint_every=0,
                              vacuum_every_minutes=1)
    state = UpkeepState()
    assert upkeep(DeltaTable(str(path)), settings, state, heavy=False, now=0) == []
    tasks = upkeep(DeltaTable(str(path)), settings, state, now=61)
    assert [t.name for t in tasks] == ["compact"]
    # Vacuum was due too, and waits for the next call.
    tasks = upkeep(DeltaTable(str(path)), settings, state, now=62)
    assert [t.name for t in tasks] == ["vacuum"]
    # The first call only starts vacuum's clock.
    assert upkeep(DeltaTable(str(path)), settings, UpkeepState(), now=0) == []


@pytest.mark.parametrize("mode", ["copy_on_write", "merge_on_read"])
def test_clustering_backs_off_on_merge_on_read_tables_while_groups_keep_forming(
        tmp_path: Path, mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A merge-on-read table's merges rewrite no file: where every batch's file overlaps
    the table again (updates spread over all keys), clustering every 20 batches sorted
    the whole table each time. There the interval doubles while it keeps finding a
    group; copy-on-write tables keep theirs; a round that finds nothing resets it."""
    path = tmp_path / "t"
    spec = ApplySpec(keys=("id",), merge=mode)  # type: ignore[arg-type]
    apply_changes(path, rows(*_batch(0)), spec, app_id="q", version=0)
    apply_changes(path, rows(*_batch(1)), spec, app_id="q", version=1)
    found = {"group": True}
    ran: list[int] = []
    call = [0]

    def cluster(*_: object, **__: object) -> str | None:
        if not found["group"]:
            return None
        ran.append(call[0])
        return "sorted 2 files by key"
    monkeypatch.setattr(upkeep_module, "cluster", cluster)
    settings = UpkeepSettings(compact_min_files=0, checkpoint_every=0,
                              vacuum_every_minutes=0, compact_deleted_fraction=0)
    state = UpkeepState()
    table = DeltaTable(str(path))
    for call[0] in range(400):
        upkeep(table, settings, state, keys=("id",))
    # The lake tests also run with every spec taken as merge-on-read: the table says.
    on_read = has_deletion_vectors_feature(table)
    assert on_read or mode == "copy_on_write"
    if on_read:
        assert ran == [0, 40, 120, 280]  # after 40, 80, 160 batches
    else:
        assert ran == list(range(0, 400, 20))
    found["group"] = False
    for _ in range(state.cluster_every):
        upkeep(table, settings, state, keys=("id",))
    assert state.cluster_every == 20


@pytest.mark.parametrize("field", ["compact_min_files", "checkpoint_every",
                                   "vacuum_retention_hours"])
def test_negative_settings_are_refused(field: str) -> None:
    import msgspec  # noqa: PLC0415

    with pytest.raises(msgspec.ValidationError, match=f"`\\$.{field}`"):
        msgspec.convert({field: -1}, UpkeepSettings)


def test_a_batch_writes_files_of_the_target_s_file_size(tmp_path: Path) -> None:
    """Once the target has ``delta.targetFileSize`` (upkeep sets it at the first
    checkpoint), a batch's new rows are written in files of that size, in both merge
    modes (merge-on-read writes them through a scratch table of its own)."""
    apply_changes(str(tmp_path / "t"), rows(change("c", 1, 1, id=-1, name="x", body="x")),
                  SPEC, app_id="a", version=0)
    DeltaTable(str(tmp_path / "t")).alter.set_table_properties(
        {"delta.targetFileSize": str(1 << 20)})
    batch = [change("c", 2, i + 1, id=i, name=f"name {i}" * 8, body=f"{i * 7919:x}" * 6)
             for i in range(60_000)]
    apply_changes(str(tmp_path / "t"), rows(*batch), SPEC, app_id="a", version=1)
    table = DeltaTable(str(tmp_path / "t"))
    sizes = pa.table(table.get_add_actions(flatten=True)).column("size_bytes").to_pylist()
    assert len(sizes) > 3 and max(sizes) < 2 << 20, sizes
    assert len(read(tmp_path / "t")) == 60_001
