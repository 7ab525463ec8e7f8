"""A SIGKILL at each named point of a merge-on-read batch (:mod:`tidemark.faults`), then a
fresh process that applies the same batches again from the first: the table equals a
model of the changes, no row twice, and three readers agree (exactly once holds).

The batches are applied in a child process of its own session (the crash kills its
process group). A table of three files (three batches of inserts) then gets batches of
uniformly random updates, deletes and re-inserts, which mark rows deleted in every
file; the crash comes in the second such batch, when the files already have vectors.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from delta_readers import check_readers_agree
from delta_rows import live_table
from lake_helpers import change, rows
from tidemark import faults
from tidemark.lake import delta_log
from tidemark.lake.deletion_vector import DeletionVector
from tidemark.lake.mor_rows import SCRATCH_DIR

_CHILD = """
import json, sys
import pyarrow.parquet as pq
from tidemark.lake import apply_changes
from tidemark.lake.spec import spec_from_mapping
target, settings, *batches = sys.argv[1:]
spec = spec_from_mapping(json.loads(settings))
for n, file in enumerate(batches):
    result = apply_changes(target, pq.read_table(file), spec, app_id="crash", version=n)
    print(json.dumps({"n": n, "replay": result.already_applied, "merge": result.merge}),
          flush=True)
"""

#: Rows per insert batch (one file each); changes per later batch.
_FILE_ROWS = 500
_CHANGES = 150
_INSERT_BATCHES = 3
_BATCHES = 7
#: The batch the crash comes in: the second of random changes.
_CRASH = 4

_MODES: dict[str, dict[str, Any]] = {
    "scd1": {"keys": ["id"], "merge": "merge_on_read"},
    "scd2": {"keys": ["id"], "merge": "merge_on_read", "stored_as_scd_type": 2},
    "soft": {"keys": ["id"], "merge": "merge_on_read", "soft_delete_column": "_deleted"},
}


class _Model:
    """What the target must hold after the changes: the current values of each key, and
    for SCD2 every version ``(id, name, body, start, end)``."""

    def __init__(self) -> None:
        self.live: dict[int, tuple[str, str]] = {}
        #: The values a soft delete keeps: the row's last ones.
        self.deleted: dict[int, tuple[str, str]] = {}
        self.versions: dict[int, list[list[Any]]] = {}

    def upsert(self, key: int, name: str, body: str, lsn: int) -> None:
        history = self.versions.setdefault(key, [])
        if history and history[-1][4] is None:
            history[-1][4] = lsn
        history.append([key, name, body, lsn, None])
        self.live[key] = (name, body)
        self.deleted.pop(key, None)

    def delete(self, key: int, lsn: int) -> None:
        self.versions[key][-1][4] = lsn
        self.deleted[key] = self.live.pop(key)


def _batches(seed: int) -> tuple[list[pa.Table], _Model]:
    """The change batches (one change per transaction) and the model after all of them."""
    rng = random.Random(seed)
    model = _Model()
    lsn = 100
    batches = []
    for b in range(_INSERT_BATCHES):
        changes = []
        for key in range(b * _FILE_ROWS + 1, (b + 1) * _FILE_ROWS + 1):
            lsn += 1
            changes.append(change("c", lsn, id=key, name=f"n{lsn}", body=f"b{key}"))
            model.upsert(key, f"n{lsn}", f"b{key}", lsn)
        batches.append(rows(*changes))
    for _ in range(_INSERT_BATCHES, _BATCHES):
        changes = []
        for _ in range(_CHANGES):
            lsn += 1
            key = rng.randint(1, _INSERT_BATCHES * _FILE_ROWS)
            if key in model.live and rng.random() < 0.3:
                changes.append(change("d", lsn, id=key))
                model.delete(key, lsn)
            else:
                op = "u" if key in model.live else "c"
                changes.append(change(op, lsn, id=key, name=f"n{lsn}", body=f"b{lsn}"))
                model.upsert(key, f"n{lsn}", f"b{lsn}", lsn)
        batches.append(rows(*changes))
    return batches, model


def _run(target: Path, mode: str, files: list[Path], fault: str | None
         ) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != faults.ENV}
    if fault is not None:
        env[faults.ENV] = fault
    # Its own session: the crash kills the child's process group, not pytest.
    return subprocess.run([sys.executable, "-c", _CHILD, str(target),
                           json.dumps(_MODES[mode]), *map(str, files)],
                          env=env, capture_output=True, text=True, timeout=300,
                          start_new_session=True, check=False)


def _reports(output: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in output.splitlines() if line.startswith("{")]


def _referenced(target: Path) -> tuple[set[str], set[str]]:
    """The data files and the deletion-vector files the table's live files reference."""
    state = delta_log.read_log(target)
    data = {add["path"] for add in state.files.values()}
    vectors = {DeletionVector.from_json(add["deletionVector"]).absolute_path(target).name
               for add in state.files.values()
               if add.get("deletionVector", {}).get("storageType") == "u"}
    return data, vectors


def _on_disk(target: Path) -> tuple[set[str], set[str]]:
    """The Parquet files and the deletion-vector files in the target's root."""
    return ({p.name for p in target.glob("*.parquet")},
            {p.name for p in target.glob("deletion_vector_*.bin")})


def _assert_equals_model(target: Path, mode: str, model: _Model) -> None:
    table = live_table(target)
    assert table.num_rows == len(check_readers_agree(target))
    got = sorted(zip(*(table.column(c).to_pylist() for c in table.column_names),
                     strict=True))
    names = table.column_names
    records = [dict(zip(names, row, strict=True)) for row in got]
    if mode == "scd2":
        versions = sorted((r["id"], r["name"], r["body"], r["__START_AT"], r["__END_AT"])
                          for r in records)
        want = sorted(tuple(v) for history in model.versions.values() for v in history)
        assert len(set(versions)) == len(versions), "a version is in the table twice"
        assert versions == want
        return
    ids = [r["id"] for r in records]
    assert len(set(ids)) == len(ids), "a key is in the table twice"
    if mode == "scd1":
        assert {r["id"]: (r["name"], r["body"]) for r in records} == model.live
    else:
        assert {r["id"]: (r["name"], r["body"], r["_deleted"]) for r in records} == {
            **{k: (*v, False) for k, v in model.live.items()},
            **{k: (*v, True) for k, v in model.deleted.items()}}


@pytest.mark.parametrize("mode", sorted(_MODES))
@pytest.mark.parametrize("point", ["mor_after_vectors", "mor_after_files",
                                   "mor_after_commit"])
def test_a_sigkill_in_a_merge_on_read_batch_then_a_replay_applies_it_once(
        tmp_path: Path, point: str, mode: str) -> None:
    batches, model = _batches(seed=37)
    files = []
    for n, batch in enumerate(batches):
        files.append(tmp_path / f"batch-{n}.parquet")
        pq.write_table(batch, files[-1])
    target = tmp_path / "t"

    crashed = _run(target, mode, files, f"{point}:{_CRASH}")
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-3000:]
    done = _reports(crashed.stdout)
    assert [r["n"] for r in done] == list(range(_CRASH))
    assert {r["merge"] for r in done} == {"merge_on_read"}
    # The crash left what its point says: the batch's vector file and its new data
    # files in the scratch table, nobody references them; then the data files moved into
    # the target; then its commit, which references them (the scratch table still there).
    data, vectors = _referenced(target)
    parquet, vector_files = _on_disk(target)
    newest = max(target.glob("deletion_vector_*.bin"), key=lambda p: p.stat().st_mtime_ns)
    scratch = list((target / SCRATCH_DIR).rglob("*.parquet"))
    committed = DeltaTable(str(target)).transaction_version("crash")
    assert committed == (_CRASH if point == "mor_after_commit" else _CRASH - 1)
    assert vectors <= vector_files
    if point == "mor_after_vectors":
        assert newest.name not in vectors and scratch and parquet == data
    elif point == "mor_after_files":
        assert newest.name not in vectors and parquet > data
    else:
        assert newest.name in vectors and any((target / SCRATCH_DIR).iterdir()) \
            and parquet == data

    again = _run(target, mode, files, None)
    assert again.returncode == 0, again.stderr[-3000:]
    replays = [r["n"] for r in _reports(again.stdout) if r["replay"]]
    assert replays == list(range(_CRASH + (point == "mor_after_commit")))
    applied = [r for r in _reports(again.stdout) if not r["replay"]]
    assert applied and {r["merge"] for r in applied} == {"merge_on_read"}
    _assert_equals_model(target, mode, model)
    # The later batches ran over the crash's leftovers: nothing of them is referenced,
    # and the work folder holds nothing.
    assert not list((target / SCRATCH_DIR).rglob("*.parquet"))
    # Vacuum of what the batches removed keeps the files whose vector was replaced (a
    # remove and an add of one path).
    DeltaTable(str(target)).vacuum(retention_hours=0, enforce_retention_duration=False,
                                   dry_run=False)
    _assert_equals_model(target, mode, model)
