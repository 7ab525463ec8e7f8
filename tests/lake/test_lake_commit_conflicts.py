"""A batch that another writer races (an OPTIMIZE, a manual fix, another tool committing
to the target between the batch's read and its commit) is applied again on the new
version, exactly once (tidemark.lake.delta_writer.apply_changes)."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from lake_helpers import change, read, rows
from tidemark.lake import ApplySpec, apply_changes, commit_conflicts, delta_log, delta_writer

SPEC = ApplySpec(keys=("id",))


def _race(monkeypatch: pytest.MonkeyPatch, commit: Callable[[], None], merge_mode: str,
          times: int = 1) -> list[int]:
    """Make *commit* (another writer's) land after the next *times* batches read the
    table and before they commit; the list counts the attempts. Copy-on-write reads the
    table before it prepares the batch (delta-rs merges it at that version);
    merge-on-read reads the log when it plans, so the race is at its commit."""
    module: Any = delta_log if merge_mode == "merge_on_read" else delta_writer
    name = "commit" if merge_mode == "merge_on_read" else "prepare_batch"
    real = getattr(module, name)
    attempts: list[int] = []

    def racing(*args: Any, **kwargs: Any) -> Any:
        attempts.append(1)
        if len(attempts) <= times:
            commit()
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, racing)
    return attempts


def _load(path: Path) -> dict[int, str]:
    for version, ids in enumerate((range(0, 100), range(100, 200))):  # two files
        apply_changes(path, rows(*(change("c", 10 * (version + 1), s + 1, id=i, name="v0",
                                          body="x") for s, i in enumerate(ids))),
                      SPEC, app_id="q", version=version)
    return {i: "v0" for i in range(200)}


def _app_transactions(path: Path, version: int) -> int:
    """How many commits of the log carry the app transaction ("q", *version*)."""
    found = 0
    for commit in sorted((path / "_delta_log").glob("*.json")):
        for line in commit.read_text().splitlines():
            action = json.loads(line)
            if action.get("txn", {}).get("appId") == "q" and \
                    action["txn"]["version"] == version:
                found += 1
    return found


def test_a_batch_raced_by_a_delete_is_applied_again_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
        merge_mode: str) -> None:
    model = _load(tmp_path)
    # The other writer deletes a row of the file the batch updates: the batch's read
    # of that file is stale.
    attempts = _race(monkeypatch, lambda: DeltaTable(str(tmp_path)).delete("id = 6"),
                     merge_mode)
    batch = rows(change("u", 30, 1, id=5, name="v1", body="x"),
                 change("c", 30, 2, id=500, name="v1", body="x"),
                 change("d", 30, 3, id=7))
    with caplog.at_level(logging.WARNING, "tidemark.lake.commit_conflicts"):
        result = apply_changes(tmp_path, batch, SPEC, app_id="q", version=2)
    assert len(attempts) == 2, "the first attempt must have met the other commit"
    assert "another writer committed" in caplog.text
    assert (result.inserted, result.updated, result.deleted) == (1, 1, 1)
    model.update({5: "v1", 500: "v1"})
    for gone in (6, 7):
        del model[gone]
    assert read(tmp_path, "id", "name") == [{"id": i, "name": model[i]} for i in sorted(model)]
    assert _app_transactions(tmp_path, 2) == 1
    # Replayed (a restart), the batch is skipped: it is in the table once.
    again = apply_changes(tmp_path, batch, SPEC, app_id="q", version=2)
    assert again.already_applied and _app_transactions(tmp_path, 2) == 1


def test_a_writer_that_always_wins_fails_the_batch_naming_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, merge_mode: str) -> None:
    _load(tmp_path)
    deleted = iter(range(10, 100))
    attempts = _race(monkeypatch, lambda: DeltaTable(str(tmp_path)).delete(
        f"id = {next(deleted)}"), merge_mode, times=1000)
    with pytest.raises(Exception, match=r"(?i)concurrent|conflict|another writer"):
        apply_changes(tmp_path, rows(change("u", 30, 1, id=5, name="v1", body="x")), SPEC,
                      app_id="q", version=2)
    assert len(attempts) == commit_conflicts.COMMIT_CONFLICT_RETRIES + 1
    assert _app_transactions(tmp_path, 2) == 0
