"""Debezium's ``skipped.operations`` on every source, through the engine (Debezium JSON,
the fused path on PostgreSQL) and through ``tidemark capture``: the skipped changes are
not delivered (deletes with their tombstones), everything else is, a restart brings
none of them back, and a stretch of skipped changes moves the offset on.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from logtable_helpers import LogDb
from tidemark import (
    Engine,
    LogTableConnector,
    MariaDbConnector,
    PostgresConnector,
    SqliteOffsetStore,
)
from tidemark.engine.converters import DebeziumJsonConverter
from tidemark.errors import ConfigError
from tidemark.event import Op
from tidemark.offsets.sqlite import TABLE as OFFSETS_TABLE
from tidemark.pipeline.config import load_config
from tidemark.skipped_operations import parse_skipped_operations
from tidemark.source.logtable.config import LogTableSourceConfig
from tidemark.source.mariadb.config import MariaDbSourceConfig
from tidemark.source.postgres.config import PostgresSourceConfig
from tidemark.spark.options import SourceOptions
from tidemark.testing.sink import MemorySink
from waiting import wait_for

SOURCES = ("postgres", "mariadb", "postgres-logtable", "sqlite-logtable")

#: (op, id) of a record: id None for a truncate, op None for a tombstone.
Change = tuple[str | None, Any]


# -- the value -----------------------------------------------------------------------
@pytest.mark.parametrize(("text", "ops"), [
    ("none", set()), ("t", {Op.TRUNCATE}), ("u,d", {Op.UPDATE, Op.DELETE}),
    (" c , u,d ,t", {Op.CREATE, Op.UPDATE, Op.DELETE, Op.TRUNCATE}),
])
def test_debeziums_values_are_read(text: str, ops: set[Op]) -> None:
    assert parse_skipped_operations(text) == ops


@pytest.mark.parametrize(("text", "says"), [
    ("x", "'x' in 'x' is not an operation; expected a comma-separated list of c"),
    ("u,", "'' in 'u,' is not an operation"),
    ("", "'' in '' is not an operation"),
    ("none,t", "none cannot be combined"),
    ("U", "'U' in 'U' is not an operation"),
    ("r", "r (snapshot reads) cannot be skipped"),
])
def test_a_bad_value_is_named_with_the_accepted_ones(text: str, says: str) -> None:
    configs: list[Callable[[], object]] = [
        lambda: PostgresSourceConfig.from_mapping({"dsn": "dbname=x",
                                                   "skipped_operations": text}),
        lambda: MariaDbSourceConfig.from_mapping({"dsn": "mariadb://u@h/db",
                                                  "skipped_operations": text}),
        lambda: LogTableSourceConfig.from_mapping({"dsn": "sqlite:///x.db",
                                                   "skipped_operations": text}),
    ]
    for make in configs:
        with pytest.raises(ConfigError) as caught:
            make()
        assert caught.value.key == "skipped_operations"
        assert says in str(caught.value)


def test_tidemarks_default_skips_nothing() -> None:
    assert PostgresSourceConfig.from_mapping({"dsn": "dbname=x"}).skipped == frozenset()


@pytest.mark.parametrize("key", ["skipped.operations", "skippedOperations"])
def test_the_spark_source_refuses_it_by_name(key: str) -> None:
    with pytest.raises(ConfigError, match="the Spark source delivers every operation"):
        SourceOptions.parse({"dsn": "dbname=x", "tables": "public.t", key: "t"})


def test_tidemark_run_refuses_it_by_name(tmp_path: Path) -> None:
    (tmp_path / "pipeline.toml").write_text(
        '[source]\ndsn = "dbname=x"\nskipped_operations = "t"\n'
        '[spark]\ncheckpoint = "cp"\n'
        '[targets."public.t"]\npath = "t"\nkeys = ["id"]\nsequence_by = ["_seq"]\n')
    with pytest.raises(ConfigError, match="tidemark run delivers every operation") as caught:
        load_config(tmp_path / "pipeline.toml")
    assert caught.value.key == "source.skipped_operations"


# -- every source ---------------------------------------------------------------------
@dataclass
class Source:
    """A database with ``skip_t (id int key, v text)``."""

    name: str
    dsn: str
    execute: Callable[..., None]  # statements, one transaction
    connector: Callable[[str], Any]  # skipped_operations -> connector
    capture_args: tuple[str, ...]  # of tidemark capture, besides --dsn
    truncates: bool  # TRUNCATE reaches the stream as a truncate
    key_change_is_update: bool  # skipped as an update (binlog), not as delete+create


@pytest.fixture(params=SOURCES)
def source(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Source]:
    kind: str = request.param
    table = "CREATE TABLE skip_t (id integer PRIMARY KEY, v text)"
    if kind == "mariadb":
        mdb = request.getfixturevalue("mdb")
        mdb.execute("CREATE TABLE skip_t (id INT PRIMARY KEY, v VARCHAR(40))")
        yield Source(kind, mdb.dsn, mdb.execute,
                     lambda skipped: MariaDbConnector({
                         "dsn": mdb.dsn, "snapshot_mode": "no_data",
                         "skipped_operations": skipped}),
                     ("--snapshot-mode", "no_data"), truncates=True,
                     key_change_is_update=True)
        return
    if kind == "sqlite-logtable":
        path = tmp_path / "app.db"
        path.touch()
        lite = LogDb("sqlite", f"sqlite:///{path}", path)
        lite.execute(table)
        lite.install(["skip_t"], streams=8, groups=2)
        yield Source(kind, lite.dsn, lite.execute,
                     lambda skipped: LogTableConnector({
                         "dsn": lite.dsn, "poll_interval_ms": 20,
                         "skipped_operations": skipped}),
                     (), truncates=False, key_change_is_update=False)
        return
    db = request.getfixturevalue("db")
    db.execute(table)
    if kind == "postgres-logtable":
        LogDb("postgres", db.dsn).install(["skip_t"], streams=8, groups=2)
        yield Source(kind, db.dsn, db.execute,
                     lambda skipped: LogTableConnector({
                         "dsn": db.dsn, "poll_interval_ms": 20,
                         "skipped_operations": skipped}),
                     ("--source", "logtable"), truncates=False, key_change_is_update=False)
        return
    yield Source(kind, db.dsn, db.execute,
                 lambda skipped: PostgresConnector({
                     "dsn": db.dsn, "snapshot_mode": "no_data",
                     "table_include_list": ["public.skip_t"], "heartbeat_interval_ms": 0,
                     "skipped_operations": skipped}),
                 ("--table", "public.skip_t", "--snapshot-mode", "no_data",
                  "--heartbeat-interval-ms", "0"),
                 truncates=True, key_change_is_update=False)


def _workload(source: Source) -> None:
    source.execute("INSERT INTO skip_t VALUES (1, 'one')", "INSERT INTO skip_t VALUES (2, 'two')",
                   "INSERT INTO skip_t VALUES (3, 'three')")
    source.execute("UPDATE skip_t SET v = 'uno' WHERE id = 1")
    source.execute("UPDATE skip_t SET id = 20 WHERE id = 2")
    source.execute("DELETE FROM skip_t WHERE id = 3")
    if source.truncates:
        source.execute("TRUNCATE TABLE skip_t")
    source.execute("INSERT INTO skip_t VALUES (5, 'five')")  # the end


def _expected(source: Source, skipped: str) -> list[Change]:
    # (op, id, part of the key change): a tombstone (op None) follows each delete.
    every: list[tuple[str | None, Any, bool]] = [
        ("c", 1, False), ("c", 2, False), ("c", 3, False), ("u", 1, False),
        ("d", 2, True), (None, 2, True), ("c", 20, True), ("d", 3, False), (None, 3, False)]
    if source.truncates:
        every.append(("t", None, False))
    every.append(("c", 5, False))
    ops = {op.value for op in parse_skipped_operations(skipped)}
    kept: list[Change] = []
    for op, key, key_change in every:
        if key_change and source.key_change_is_update and "u" in ops:
            continue  # the binlog's update event, skipped whole
        if (op or "d") in ops:  # a tombstone goes with its delete
            continue
        kept.append((op, key))
    return kept


def _skipped_only(source: Source, skipped: str) -> bool:
    """Make changes that *skipped* leaves out, only; False if the source has none."""
    if skipped == "u,d":
        source.execute("UPDATE skip_t SET v = 'cinq' WHERE id = 5")
        source.execute("DELETE FROM skip_t WHERE id = 5")
        return True
    if skipped == "t" and source.truncates:
        source.execute("TRUNCATE TABLE skip_t")
        return True
    return False


def _has(changes: list[Change], key: int) -> bool:
    return any(k == key for _, k in changes)


def _change(key: str | bytes | None, value: str | bytes | None) -> Change:
    key_id = json.loads(key)["id"] if key else None
    return (json.loads(value)["op"] if value is not None else None), key_id


def _changes(sink: MemorySink, source: Source) -> list[Change]:
    records = list(sink.records)
    if "logtable" in source.name:
        # Log tables deliver groups in turn: a key's changes in order, keys interleaved.
        records.sort(key=lambda r: r.event.lsn or 0)  # type: ignore[union-attr]
    return [_change(r.key, r.value) for r in records]  # type: ignore[arg-type]


def _saved_offsets(path: Path) -> dict[str, str]:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        return dict(conn.execute(f'SELECT key, "offset" FROM {OFFSETS_TABLE}').fetchall())


@contextlib.contextmanager
def _engine(source: Source, skipped: str, store: SqliteOffsetStore) -> Iterator[MemorySink]:
    sink = MemorySink()
    engine = Engine(source.connector(skipped), sink, config={"offset_flush_interval_ms": 0},
                    converter=DebeziumJsonConverter(), offset_store=store)
    thread = threading.Thread(target=engine.run, daemon=True)
    thread.start()
    try:
        yield sink
    finally:
        engine.close()
        thread.join(timeout=60)
        assert not thread.is_alive(), "the engine did not stop"


def _open_stream(source: Source, sink: MemorySink) -> None:
    """Insert markers (ids from 100; inserts are never skipped here) until one arrives,
    which proves the stream open; then forget them."""
    markers = iter(range(100, 10_000))

    def opened() -> bool:
        source.execute(f"INSERT INTO skip_t VALUES ({next(markers)}, 'marker')")
        return bool(sink.records)

    wait_for(opened, 60, f"{source.name}: the stream to open")
    source.execute("DELETE FROM skip_t WHERE id >= 100")


@pytest.mark.integration
@pytest.mark.parametrize("skipped", ["u,d", "t", "none"])
def test_skipped_operations_through_the_engine(source: Source, skipped: str,
                                               tmp_path: Path) -> None:
    offsets = tmp_path / "offsets.db"
    store = SqliteOffsetStore(offsets)
    with _engine(source, skipped, store) as sink:
        _open_stream(source, sink)
        opened = len(sink.records)
        _workload(source)
        wait_for(lambda: _has(_changes(sink, source), 5), 60, f"{source.name}: the workload")
        changes = [c for c in _changes(sink, source)[opened:] if (c[1] or 0) < 100]
        assert changes == _expected(source, skipped), source.name
        # A stretch of skipped changes only moves the offset on all the same.
        wait_for(lambda: len(_saved_offsets(offsets)) > 0, 30, "an offset saved")
        saved = _saved_offsets(offsets)
        delivered = len(sink.records)
        if _skipped_only(source, skipped):
            wait_for(lambda: _saved_offsets(offsets) != saved, 30,
                     f"{source.name}: the offset to move past skipped changes only")
            assert len(sink.records) == delivered, "the skipped changes were delivered"
    # Restarted: nothing skipped comes back, nothing delivered comes again.
    with _engine(source, skipped, store) as again:
        source.execute("INSERT INTO skip_t VALUES (6, 'six')")
        wait_for(lambda: _has(_changes(again, source), 6), 60,
                 f"{source.name}: a change after the restart")
    assert [c for c in _changes(again, source) if (c[1] or 0) < 100] == [("c", 6)], \
        source.name


# -- tidemark capture -------------------------------------------------------------------
def _capture(source: Source, offsets: Path, *args: str) -> list[Change]:
    proc = subprocess.run(
        [sys.executable, "-m", "tidemark", "capture", "--dsn", source.dsn,
         *source.capture_args, "--offsets", str(offsets), "--stop-at-end",
         "--progress-interval-s", "0", *args],
        capture_output=True, text=True, timeout=120, env=dict(os.environ), check=False)
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    changes = [_change(json.dumps(line["key"]) if line["key"] is not None else None,
                       json.dumps(line["value"]) if line["value"] is not None else None)
               for line in lines]
    if "logtable" in source.name:
        return sorted(changes, key=lambda c: (c[1] or 0, c[0] is None))
    return changes


@pytest.mark.integration
@pytest.mark.parametrize("source", ["postgres", "mariadb", "sqlite-logtable"],
                         indirect=True)
@pytest.mark.parametrize("skipped", ["u,d", "t"])
def test_skipped_operations_through_tidemark_capture(source: Source, skipped: str,
                                                     tmp_path: Path) -> None:
    offsets = tmp_path / "offsets.json"
    args = ("--skipped-operations", skipped)
    assert _capture(source, offsets, *args) == []  # the start: a slot, a position
    _workload(source)
    expected = _expected(source, skipped)
    if "logtable" in source.name:
        expected = sorted(expected, key=lambda c: (c[1] or 0, c[0] is None))
    assert _capture(source, offsets, *args) == expected, source.name
    # Skipped changes only: nothing written, and the offset moves past them.
    saved = offsets.read_text()
    if _skipped_only(source, skipped):
        assert _capture(source, offsets, *args) == []
        assert offsets.read_text() != saved
    source.execute("INSERT INTO skip_t VALUES (6, 'six')")
    assert _capture(source, offsets, *args) == [("c", 6)]


@pytest.mark.integration
def test_tidemark_capture_names_a_bad_value(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "tidemark", "capture", "--dsn", f"sqlite:///{tmp_path}/x.db",
         "--skipped-operations", "truncate"],
        capture_output=True, text=True, timeout=60, env=dict(os.environ), check=False)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr, proc.stderr
    assert "skipped_operations" in proc.stderr and "'truncate'" in proc.stderr
    assert "c (inserts), u (updates), d (deletes), t (truncates), or none" in proc.stderr
