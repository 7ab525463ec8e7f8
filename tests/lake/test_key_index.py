"""The key index of merge-on-read targets: after any sequence of batches it finds exactly
the live rows of each key, for integer, text and composite keys, through its recent
level, its merges and its rebuilds."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from pyroaring import BitMap64

from delta_readers import check_readers_agree
from lake_helpers import change, read, rows
from tidemark.lake import (
    ApplySpec,
    apply_changes,
    background_rewrite,
    key_index,
    key_lookup,
    merge_on_read,
    relocations,
)
from tidemark.lake.delta_log import read_log
from tidemark.lake.key_index import KeyIndex
from tidemark.lake.upkeep import UpkeepSettings, UpkeepState, upkeep

_TEXT = pa.schema([pa.field("name", pa.string())])


#: (fresh maximum, recent fraction, dead fraction, dead minimum, where folds run):
#: every batch merges the levels; every batch rebuilds; the same with the merges and
#: rebuilds in the background, taken a batch later ("late") or when the real thread is
#: done; every batch merges the fresh level into the recent one, never into the base;
#: nothing is ever merged or rebuilt (dead entries stay in the lookup).
_TUNINGS = {"merges": (0, 0.01, 0.2, 1 << 40, None), "rebuilds": (0, 0.01, 0.05, 0, None),
            "merges, later": (0, 0.01, 0.2, 1 << 40, "late"),
            "rebuilds, later": (0, 0.01, 0.05, 0, "late"),
            "rebuilds, thread": (0, 0.01, 0.05, 0, "thread"),
            "recent": (0, 1e9, 0.2, 1 << 40, None),
            "neither": (1 << 40, 1e9, 0.2, 1 << 40, None)}


@pytest.mark.parametrize("tuning", sorted(_TUNINGS))
@pytest.mark.parametrize("keys", [("id",), ("name",), ("id", "name")])
def test_the_index_finds_exactly_the_live_rows_of_each_key(
        tmp_path: Path, keys: tuple[str, ...], tuning: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    _tune(monkeypatch, tuning)
    spec = ApplySpec(keys=keys, merge="merge_on_read")
    path = tmp_path / "t"
    merge_on_read.TARGETS._held.clear()
    rng = random.Random(7)
    model: dict[tuple[object, ...], str] = {}
    lsn = 10
    for batch in range(12):
        changes, lsn = _random_batch(rng, keys, model, batch, lsn, size=40, deletes=0.3)
        apply_changes(path, rows(*changes), spec, app_id="q", version=batch)
        table = read(path, *dict.fromkeys((*keys, "id", "body")), sort=keys)
        found = {tuple(r[k] for k in keys): r["body"] for r in table}
        assert found == model
        assert len(table) == len(found), "a key is held by two rows"
        check_readers_agree(path)
        # The index this process keeps between batches: one live row per key, none for
        # a deleted key.
        ((index, _),) = merge_on_read.TARGETS._held.values()
        _check_lookup(index, path, keys, model, gone=[k for k in _all_keys(keys)
                                                       if k not in model])
        _check_layout(index)
    # A fresh index built from the table finds every key once, and a missing one never.
    index = KeyIndex(path, keys, ())
    index.sync(read_log(path))
    _check_lookup(index, path, keys, model, gone=[])
    assert index.live_rows() == len(model)


def _tune(monkeypatch: pytest.MonkeyPatch, tuning: str) -> None:
    fresh, recent, dead, dead_min, later = _TUNINGS[tuning]
    monkeypatch.setattr(key_lookup, "_FRESH_MAX", fresh)
    monkeypatch.setattr(key_index, "_RECENT_FRACTION", recent)
    monkeypatch.setattr(key_index, "_DEAD_FRACTION", dead)
    monkeypatch.setattr(key_index, "_DEAD_MIN", dead_min)
    if later is not None:
        monkeypatch.setattr(key_index, "_BACKGROUND_MIN", 0)
    if later == "late":
        monkeypatch.setattr(key_index, "FOLDER", _LateFolder())


class _LateFolder:
    """The background thread, deterministic: a fold is computed when it starts (from the
    rows alive then, as the thread does) and done when asked the third time, so it is
    taken a batch later (lookups, new files, deletion vectors, dropped files meanwhile)."""

    def submit(self, work: Callable[[], Any]) -> concurrent.futures.Future[Any]:
        return _LateFold(work())


class _LateFold(concurrent.futures.Future[Any]):
    def __init__(self, result: Any) -> None:
        super().__init__()
        self._late, self._polls = result, 0

    def done(self) -> bool:
        self._polls += 1
        if self._polls >= 3 and not super().done():
            self.set_result(self._late)
        return super().done()

    def result(self, timeout: float | None = None) -> Any:
        if not super().done():
            self.set_result(self._late)
        return super().result(timeout)


def _random_batch(rng: random.Random, keys: tuple[str, ...],
                  model: dict[tuple[object, ...], str], batch: int, lsn: int, *,
                  size: int, deletes: float) -> tuple[list[dict[str, object]], int]:
    """*size* changes of keys among 60 (a share *deletes* of those present deleted, the
    rest inserted or updated), *model* brought along; and the last LSN used."""
    changes = []
    for _ in range(size):
        lsn += 1
        ident = rng.randrange(60)
        key = _all_keys(keys)[ident]
        fields: dict[str, object] = dict(zip(keys, key, strict=True))
        fields.setdefault("id", ident)
        fields.setdefault("name", f"n{ident}")
        if key in model and rng.random() < deletes:
            changes.append(change("d", lsn, **fields))
            del model[key]
        else:
            body = f"b{batch}-{lsn}"
            changes.append(change("u" if key in model else "c", lsn, **fields, body=body))
            model[key] = body
    return changes, lsn


def _all_keys(keys: tuple[str, ...]) -> list[tuple[object, ...]]:
    return [(i, f"k{i % 7}-é") if len(keys) == 2 else (i,) if keys == ("id",)
            else (f"k{i}-é",) for i in range(60)]


def _check_lookup(index: KeyIndex, path: Path, keys: tuple[str, ...],
                  model: dict[tuple[object, ...], str], gone: list[tuple[object, ...]]) -> None:
    schema = pa.schema([index_field(path, k) for k in keys])
    probe = pa.Table.from_pylist([dict(zip(keys, k, strict=True)) for k in model], schema)
    hits = index.lookup(probe)
    assert sorted(hits.probe.tolist()) == list(range(len(model)))
    found = index.values(hits.row, keys).to_pylist()
    assert [tuple(r[k] for k in keys) for r in found] == \
        [list(model)[i] for i in hits.probe.tolist()]
    if gone:
        absent = pa.Table.from_pylist([dict(zip(keys, k, strict=True)) for k in gone], schema)
        assert len(index.lookup(absent).row) == 0


def _check_layout(index: KeyIndex) -> None:
    """The index's files in order: each live file once, in its place, no dropped one."""
    placed = [f for f in index._order if f is not None]
    assert {f.path for f in placed} == set(index._files)
    assert all(index._files[f.path] is f and index._order[f.at] is f for f in placed)
    assert [index._starts[f.at] for f in placed] == [f.start for f in placed]
    assert len(index._starts) == len(index._order)
    assert max((f.start + len(f.rows) for f in placed), default=0) <= len(index._alive)


def index_field(path: Path, name: str) -> pa.Field:
    from deltalake import DeltaTable  # noqa: PLC0415
    field = pa.schema(DeltaTable(str(path)).schema().to_arrow()).field(name)
    return field.with_type(pa.string()) if pa.types.is_string_view(field.type) else field


#: (target file size in bytes, or None: the default; which upkeep rewrites run).
_REWRITES = {"deleted rows": (None, "deleted"), "small files": (None, "small"),
             "deleted rows, in pieces": (600, "deleted")}


class _AtOnce:
    """The rewrite thread, deterministic: a rewrite's files are written when it starts
    (from the vectors of then, as the thread reads them) and committed by the next
    upkeep call, after the next batch deleted more of its rows."""

    def submit(self, work: Callable[..., Any], *args: Any) -> concurrent.futures.Future[Any]:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        future.set_result(work(*args))
        return future


@pytest.mark.parametrize("where", ["between batches", "beside batches"])
@pytest.mark.parametrize("rewrite", sorted(_REWRITES))
@pytest.mark.parametrize("tuning", ["rebuilds", "rebuilds, later", "neither"])
@pytest.mark.parametrize("keys", [("id",), ("name",), ("id", "name")])
def test_rows_an_upkeep_rewrite_moved_are_found_in_their_new_files(
        tmp_path: Path, keys: tuple[str, ...], tuning: str, rewrite: str, where: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Upkeep rewrites files between batches, or beside them (committed after the next
    batch deleted more of their rows); the writer's index takes the rows where the
    rewrite says they went (reading none of the new files) and still finds exactly the
    live row of each key, through rebuilds too, as an index built afresh does."""
    _tune(monkeypatch, tuning)
    beside = where == "beside batches"
    if beside:
        monkeypatch.setattr(background_rewrite, "REWRITER", _AtOnce())
    file_size, kind = _REWRITES[rewrite]
    spec = ApplySpec(keys=keys, merge="merge_on_read")
    path = tmp_path / "t"
    merge_on_read.TARGETS._held.clear()
    settings = UpkeepSettings(
        compact_deleted_fraction=0.1 if kind == "deleted" else 0,
        compact_min_files=3 if kind == "small" else 0, cluster_min_files=0,
        checkpoint_every=0, vacuum_every_minutes=0, target_file_mb=1)
    state = UpkeepState()
    rng = random.Random(11)
    model: dict[tuple[object, ...], str] = {}
    lsn, rewrites = 10, 0
    for batch in range(14):
        changes, lsn = _random_batch(rng, keys, model, batch, lsn, size=50, deletes=0.25)
        apply_changes(path, rows(*changes), spec, app_id="q", version=batch)
        if batch == 0 and file_size is not None:
            DeltaTable(str(path)).alter.set_table_properties(
                {"delta.targetFileSize": str(file_size)})
        done = upkeep(DeltaTable(str(path)), settings, state, keys=keys, background=beside)
        rewrites += sum(task.name in {"compact_deleted", "compact"} and
                        "started" not in task.detail for task in done)
        if batch:  # the next batch takes the rewrite (the last one: a check of its own)
            table = read(path, *dict.fromkeys((*keys, "id", "body")), sort=keys)
            assert {tuple(r[k] for k in keys): r["body"] for r in table} == model
            assert len(table) == len(model), "a key is held by two rows"
            _check_layout(next(iter(merge_on_read.TARGETS._held.values()))[0])
    # The last rewrite taken by a sync as the next batch's would: no file read.
    ((index, _),) = merge_on_read.TARGETS._held.values()
    read_before = index.files_read
    index.sync(read_log(path))
    assert rewrites >= 3, "the settings made too few rewrites to test anything"
    if file_size is not None:
        assert max(len(r.outputs) for r in relocations.RELOCATIONS._tables[str(path)]) > 1
    assert index.files_relocated >= rewrites
    assert index.files_read == read_before, "the index read a file a rewrite made"
    if beside:
        assert _rewrites_marking_rows(path), "no batch deleted rows of a file being rewritten"
    check_readers_agree(path)
    _check_lookup(index, path, keys, model,
                  gone=[k for k in _all_keys(keys) if k not in model])
    assert index.live_rows() == len(model)
    positions = index.locate(index.lookup(pa.Table.from_pylist(
        [dict(zip(keys, k, strict=True)) for k in model],
        pa.schema([index_field(path, k) for k in keys]))).row)
    assert set(positions) <= set(read_log(path).files), "a row located in a dead file"
    fresh_index = KeyIndex(path, keys, ())
    fresh_index.sync(read_log(path))
    _check_lookup(fresh_index, path, keys, model, gone=[])


def _rewrites_marking_rows(path: Path) -> int:
    """Upkeep rewrites whose commit gave a new file a deletion vector (rows the batches
    deleted while it was written)."""
    found = 0
    for commit in sorted((path / "_delta_log").glob("*.json")):
        actions = [json.loads(line) for line in commit.read_text().splitlines() if line]
        if any(a.get("commitInfo", {}).get("operation") == "OPTIMIZE" for a in actions):
            found += any("add" in a and a["add"].get("deletionVector") for a in actions)
    return found


def test_a_relocation_that_does_not_match_the_index_is_not_taken(tmp_path: Path) -> None:
    """A rewrite's note naming a deletion vector the index does not hold, and not one
    the index's grew from (another writer changed the file first), is ignored: the index
    reads the new file instead."""
    spec = ApplySpec(keys=("id",), merge="merge_on_read")
    path = tmp_path / "t"
    merge_on_read.TARGETS._held.clear()
    apply_changes(path, rows(*[change("c", 10 + i, id=i, name=f"n{i}", body="a")
                               for i in range(20)]), spec, app_id="q", version=0)
    apply_changes(path, rows(*[change("d", 40 + i, id=i, name=f"n{i}") for i in range(8)]),
                  spec, app_id="q", version=1)
    ((index, _),) = merge_on_read.TARGETS._held.values()
    settings = UpkeepSettings(compact_deleted_fraction=0.1, compact_min_files=0,
                              cluster_min_files=0, checkpoint_every=0,
                              vacuum_every_minutes=0)
    assert upkeep(DeltaTable(str(path)), settings, UpkeepState(), keys=("id",))
    noted = relocations.RELOCATIONS._tables[str(path)][-1]
    source = noted.sources[0]
    relocations.RELOCATIONS._tables[str(path)][-1] = dataclasses.replace(
        noted, sources=(dataclasses.replace(source, dv_id="u-not-this-one",
                                            vector=BitMap64([19])),
                        *noted.sources[1:]))
    read_before = index.files_read
    index.sync(read_log(path))
    assert index.files_relocated == 0 and index.files_read == read_before + 1
    found = index.lookup(pa.table({"id": pa.array(list(range(20)), pa.int64())}))
    assert sorted(found.probe.tolist()) == list(range(8, 20))
