"""The key index of merge-on-read targets: after any sequence of batches it finds exactly
the live rows of each key, for integer, text and composite keys, through its recent
level, its merges and its rebuilds."""

from __future__ import annotations

import random
from pathlib import Path

import pyarrow as pa
import pytest

from delta_readers import check_readers_agree
from lake_helpers import change, read, rows
from tidemark.lake import ApplySpec, apply_changes, key_index, merge_on_read
from tidemark.lake.delta_log import read_log
from tidemark.lake.key_index import KeyIndex

_TEXT = pa.schema([pa.field("name", pa.string())])


#: (fresh maximum, recent fraction, dead fraction, dead minimum): every batch merges the
#: levels; every batch rebuilds; every batch merges the fresh level into the recent one,
#: never into the base; nothing is ever merged or rebuilt (dead entries stay in the
#: lookup).
_TUNINGS = {"merges": (0, 0.01, 0.2, 1 << 40), "rebuilds": (0, 0.01, 0.05, 0),
            "recent": (0, 1e9, 0.2, 1 << 40), "neither": (1 << 40, 1e9, 0.2, 1 << 40)}


@pytest.mark.parametrize("tuning", sorted(_TUNINGS))
@pytest.mark.parametrize("keys", [("id",), ("name",), ("id", "name")])
def test_the_index_finds_exactly_the_live_rows_of_each_key(
        tmp_path: Path, keys: tuple[str, ...], tuning: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    fresh, recent, dead, dead_min = _TUNINGS[tuning]
    monkeypatch.setattr(key_index, "_FRESH_MAX", fresh)
    monkeypatch.setattr(key_index, "_RECENT_FRACTION", recent)
    monkeypatch.setattr(key_index, "_DEAD_FRACTION", dead)
    monkeypatch.setattr(key_index, "_DEAD_MIN", dead_min)
    spec = ApplySpec(keys=keys, merge="merge_on_read")
    path = tmp_path / "t"
    merge_on_read.TARGETS._held.clear()
    rng = random.Random(7)
    model: dict[tuple[object, ...], str] = {}
    lsn = 10
    for batch in range(12):
        changes = []
        for _ in range(40):
            lsn += 1
            ident = rng.randrange(60)
            key = (ident, f"k{ident % 7}-é") if len(keys) == 2 else \
                (ident,) if keys == ("id",) else (f"k{ident}-é",)
            fields = dict(zip(keys, key, strict=True))
            if "id" not in fields:
                fields["id"] = ident
            if "name" not in fields:
                fields["name"] = f"n{ident}"
            if key in model and rng.random() < 0.3:
                changes.append(change("d", lsn, **fields))
                del model[key]
            else:
                body = f"b{batch}-{lsn}"
                changes.append(change("u" if key in model else "c", lsn, **fields, body=body))
                model[key] = body
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
    # A fresh index built from the table finds every key once, and a missing one never.
    index = KeyIndex(path, keys, ())
    index.sync(read_log(path))
    _check_lookup(index, path, keys, model, gone=[])
    assert index.live_rows() == len(model)


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


def index_field(path: Path, name: str) -> pa.Field:
    from deltalake import DeltaTable  # noqa: PLC0415
    field = pa.schema(DeltaTable(str(path)).schema().to_arrow()).field(name)
    return field.with_type(pa.string()) if pa.types.is_string_view(field.type) else field
