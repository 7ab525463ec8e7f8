"""Offset stores (no database needed)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tidemark.errors import ConfigError
from tidemark.offsets.file import FileOffsetStore
from tidemark.offsets.memory import MemoryOffsetStore


def test_file_store_round_trip_and_survives_reopen(tmp_path: Path) -> None:
    path = tmp_path / "offsets.json"
    store = FileOffsetStore(path)
    assert store.load("a") is None
    store.save("a", {"lsn": 10, "snapshot_completed": True})
    assert FileOffsetStore(path).load("a") == {"lsn": 10, "snapshot_completed": True}
    assert [p.name for p in tmp_path.iterdir()] == ["offsets.json"]  # no temp files left


def test_two_stores_sharing_a_file_keep_each_others_keys(tmp_path: Path) -> None:
    path = tmp_path / "offsets.json"
    first, second = FileOffsetStore(path), FileOffsetStore(path)
    first.save("db1/slot", {"lsn": 1})
    second.save("db2/slot", {"lsn": 2})
    first.save("db1/slot", {"lsn": 3})
    reopened = FileOffsetStore(path)
    assert reopened.load("db1/slot") == {"lsn": 3} and reopened.load("db2/slot") == {"lsn": 2}


def test_file_store_errors_name_the_problem(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        FileOffsetStore(tmp_path / "missing" / "offsets.json")
    bad = tmp_path / "bad.json"
    bad.write_text("not json")
    with pytest.raises(ConfigError, match="not a tidemark offsets file"):
        FileOffsetStore(bad)


def test_file_store_refuses_a_place_it_could_not_save_to(tmp_path: Path) -> None:
    """Found when the store is made, not at the first save, after capture has begun."""
    plain = tmp_path / "plain"
    plain.write_text("x")
    with pytest.raises(ConfigError, match=f"{plain} is not a directory"):
        FileOffsetStore(plain / "offsets.json")
    with pytest.raises(ConfigError, match="cannot create files in /proc"):
        FileOffsetStore(f"/proc/tidemark-offsets-{os.getpid()}.json")  # even for root
    with pytest.raises(ConfigError, match="is a directory"):
        FileOffsetStore(tmp_path)
    assert list(tmp_path.iterdir()) == [plain]  # the probe left nothing behind


def test_file_store_refuses_keys_that_hold_no_object(tmp_path: Path) -> None:
    path = tmp_path / "offsets.json"
    path.write_text('{"good": {"lsn": 1}, "bad": 5}')
    with pytest.raises(ConfigError) as info:
        FileOffsetStore(path)
    assert info.value.key == "offsets"
    assert "key 'bad' holds 5" in str(info.value) and "JSON object" in str(info.value)
    assert str(FileOffsetStore(tmp_path / "other.json")) == \
        f"offsets file {tmp_path / 'other.json'}"


def test_memory_store() -> None:
    store = MemoryOffsetStore()
    store.save("k", {"lsn": 1})
    assert store.load("k") == {"lsn": 1} and store.load("other") is None
