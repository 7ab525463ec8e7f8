"""Every offset store honours the same contract; plus store-specific behaviour.

PostgreSQL tests use the real private server of the ``db`` fixture (no mocks).
"""

from __future__ import annotations

import multiprocessing
import sqlite3
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from conftest import Database
from tidemark.errors import ConfigError, SourceError
from tidemark.offsets.file import FileOffsetStore
from tidemark.offsets.layered import LayeredOffsetStore
from tidemark.offsets.memory import MemoryOffsetStore
from tidemark.offsets.postgres import PostgresOffsetStore
from tidemark.offsets.sqlite import LOAD_SQL, SqliteOffsetStore
from tidemark.offsets.store import OffsetStore

# -- the shared contract ---------------------------------------------------------------

ALL = ["memory", "file", "sqlite", "postgres", "layered(memory, file)"]
DURABLE = [name for name in ALL if name != "memory"]


@dataclass
class Backend:
    """Opens stores of one kind over the same storage (a reopen sees earlier saves)."""

    name: str
    factory: Callable[[], OffsetStore]
    opened: list[OffsetStore] = field(default_factory=list)

    def open(self) -> OffsetStore:
        store = self.factory()
        self.opened.append(store)
        return store


def _close(store: OffsetStore) -> None:
    close = getattr(store, "close", None)
    if callable(close):
        close()


@pytest.fixture(params=ALL)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    name: str = request.param
    factory: Callable[[], OffsetStore]
    if name == "memory":
        memory = MemoryOffsetStore()  # one process: "reopening" is the same dict

        def factory() -> OffsetStore:
            return memory
    elif name == "file":
        def factory() -> OffsetStore:
            return FileOffsetStore(tmp_path / "offsets.json")
    elif name == "sqlite":
        def factory() -> OffsetStore:
            return SqliteOffsetStore(tmp_path / "offsets.db")
    elif name == "postgres":
        db: Database = request.getfixturevalue("db")

        def factory() -> OffsetStore:
            return PostgresOffsetStore(db.dsn)
    else:
        def factory() -> OffsetStore:  # a fresh process: empty memory, the file remains
            return LayeredOffsetStore(MemoryOffsetStore(),
                                      FileOffsetStore(tmp_path / "offsets.json"))
    b = Backend(name, factory)
    yield b
    for store in b.opened:
        _close(store)


def test_round_trip(backend: Backend) -> None:
    store = backend.open()
    store.save("db/slot", {"lsn": 123, "snapshot_completed": True})
    assert store.load("db/slot") == {"lsn": 123, "snapshot_completed": True}


def test_overwrite_replaces_the_whole_offset(backend: Backend) -> None:
    store = backend.open()
    store.save("k", {"lsn": 1, "snapshot_completed": False, "extra": "x"})
    store.save("k", {"lsn": 2, "snapshot_completed": True})
    assert store.load("k") == {"lsn": 2, "snapshot_completed": True}


def test_keys_are_isolated(backend: Backend) -> None:
    store = backend.open()
    keys = ["db/slot", "db/slot2", "db", "", "ключ/🙂", "a'b\"c", "db/slot "]
    for i, key in enumerate(keys):
        store.save(key, {"lsn": i})
    store.save("db/slot", {"lsn": 100})
    assert [store.load(key) for key in keys] == [{"lsn": 100}] + [
        {"lsn": i} for i in range(1, len(keys))]


def test_missing_key_is_none(backend: Backend) -> None:
    store = backend.open()
    assert store.load("nothing") is None
    store.save("something", {"lsn": 1})
    assert store.load("nothing") is None
    assert store.load("somethin") is None and store.load("something ") is None


LARGE_OFFSET: dict[str, Any] = {
    "lsn": 2**64 - 1,
    "huge": 2**100,
    "negative": -(2**70),
    "float": 1.5,
    "quotes": 'he said "hi" and \'bye\'',
    "backslashes": "C:\\path\\to\\\"x\"",
    "injection": "'); DROP TABLE tidemark_offsets; --",
    "unicode": "zażółć 🙂 \u2028",
    "control": "tab\tnewline\n",
    "null": None,
    "flags": [True, False],
    "nested": {"a": {"b": {"c": [1, {"d": "e"}, []]}}, "empty": {}},
    "long": "x" * 200_000,
    "tables": {f"public.t{i}": {"lsn": i * 1_000_003, "txid": 2**40 + i} for i in range(500)},
}


def test_large_json_offsets(backend: Backend) -> None:
    store = backend.open()
    store.save("big", LARGE_OFFSET)
    assert store.load("big") == LARGE_OFFSET


@pytest.mark.parametrize("backend", DURABLE, indirect=True)
def test_survives_reopening(backend: Backend) -> None:
    first = backend.open()
    first.save("a", {"lsn": 1})
    first.save("b", LARGE_OFFSET)
    first.save("a", {"lsn": 2})
    _close(first)
    second = backend.open()
    assert second.load("a") == {"lsn": 2} and second.load("b") == LARGE_OFFSET
    assert second.load("c") is None


# -- SQLite ----------------------------------------------------------------------------

def test_sqlite_rejects_a_file_that_is_not_a_database(tmp_path: Path) -> None:
    bad = tmp_path / "offsets.db"
    bad.write_text("this is not a SQLite database, just some text " * 20)
    with pytest.raises(ConfigError, match="not a usable SQLite database") as info:
        SqliteOffsetStore(bad)
    assert info.value.key == "offsets"
    assert bad.read_text().startswith("this is not")  # left untouched


def test_sqlite_missing_directory_and_foreign_table(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        SqliteOffsetStore(tmp_path / "missing" / "offsets.db")
    with pytest.raises(ConfigError, match="is a directory"):
        SqliteOffsetStore(tmp_path)
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE tidemark_offsets (id INTEGER PRIMARY KEY, data BLOB)")
    conn.close()
    with pytest.raises(ConfigError, match="not tidemark's"):
        SqliteOffsetStore(other)


def test_sqlite_uses_wal_with_full_sync(tmp_path: Path) -> None:
    path = tmp_path / "offsets.db"
    with SqliteOffsetStore(path) as store:
        store.save("k", {"lsn": 1})
        assert store._conn is not None
        assert store._conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
        reader = sqlite3.connect(path)
        try:
            assert reader.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
            row = reader.execute(
                'SELECT key, "offset", updated_at FROM tidemark_offsets').fetchone()
        finally:
            reader.close()
    assert row[0] == "k" and row[1] == '{"lsn":1}' and row[2].endswith("Z")
    with pytest.raises(ValueError, match="closed"):
        store.load("k")


def test_sqlite_load_is_a_key_lookup(tmp_path: Path) -> None:
    path = tmp_path / "offsets.db"
    with SqliteOffsetStore(path) as store:
        for i in range(10_000):
            store.save(f"db/slot-{i}", {"lsn": i, "snapshot_completed": True})
        started = time.perf_counter()
        offset = store.load("db/slot-7777")
        elapsed = time.perf_counter() - started
        assert offset == {"lsn": 7777, "snapshot_completed": True}
        assert elapsed < 0.5  # a loose sanity bound, not a benchmark
        # The real guarantee: SQLite answers the load from the primary-key index.
        assert store._conn is not None
        plan = " ".join(str(row[-1]) for row in
                        store._conn.execute(f"EXPLAIN QUERY PLAN {LOAD_SQL}", ("x",)))
    assert plan.startswith("SEARCH") and "INDEX" in plan and "SCAN" not in plan


def test_sqlite_stores_share_one_database(tmp_path: Path) -> None:
    path = tmp_path / "offsets.db"
    with SqliteOffsetStore(path) as first, SqliteOffsetStore(path) as second:
        first.save("a", {"lsn": 1})
        second.save("b", {"lsn": 2})
        assert first.load("b") == {"lsn": 2} and second.load("a") == {"lsn": 1}


# -- PostgreSQL --------------------------------------------------------------------------

BAD_NAMES = ["Offsets", "1offsets", "a" * 64, "", "offsets-x", "t;drop", 'tidemark_offsets"',
             "offsets\n", "ofsets ", "public.offsets"]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_postgres_bad_table_name_is_a_config_error(name: str) -> None:
    # Names are checked before connecting: this DSN would fail with SourceUnavailableError.
    unreachable = "host=127.0.0.1 port=1 dbname=x connect_timeout=1"
    with pytest.raises(ConfigError, match="not a valid name") as info:
        PostgresOffsetStore(unreachable, table=name)
    assert info.value.key == "offsets.table"


def test_postgres_schema_needing_quotes_is_rejected_not_injected(db: Database) -> None:
    evil = 'public"; DROP SCHEMA public CASCADE; --'
    db.execute("CREATE TABLE canary (id int)")
    with pytest.raises(ConfigError) as info:
        PostgresOffsetStore(db.dsn, schema=evil)
    assert info.value.key == "offsets.schema"
    with pytest.raises(ConfigError, match="not a valid name") as info:
        PostgresOffsetStore(db.dsn, schema="My Schema")
    assert info.value.key == "offsets.schema"
    assert db.scalar("SELECT to_regclass('public.canary') IS NOT NULL")
    assert db.scalar("SELECT count(*) FROM pg_class WHERE relname = 'tidemark_offsets'") == 0


def test_postgres_names_are_quoted_identifiers(db: Database) -> None:
    # Valid names that are reserved words only work if quoted.
    db.execute('CREATE SCHEMA "user"')
    with PostgresOffsetStore(db.dsn, table="order", schema="user") as store:
        assert store.qualified_name == "user.order"
        store.save("k", {"lsn": 5})
        assert store.load("k") == {"lsn": 5}
    assert db.query('SELECT key, "offset"->>\'lsn\' FROM "user"."order"') == [("k", "5")]


def test_postgres_table_layout_and_key_lookup(db: Database) -> None:
    with PostgresOffsetStore(db.dsn) as store:
        store.save("k", {"lsn": 1})
    columns = db.query(
        "SELECT attname, format_type(atttypid, atttypmod), attnotnull FROM pg_attribute "
        "WHERE attrelid = 'public.tidemark_offsets'::regclass AND attnum > 0 ORDER BY attnum")
    assert columns == [("key", "text", True), ("offset", "jsonb", True),
                       ("updated_at", "timestamp with time zone", True)]
    db.execute("INSERT INTO tidemark_offsets SELECT 'k' || i, jsonb_build_object('lsn', i), "
               "now() FROM generate_series(1, 10000) i ON CONFLICT DO NOTHING",
               "ANALYZE tidemark_offsets")
    plan = " ".join(r[0] for r in db.query(
        "EXPLAIN SELECT \"offset\"::text FROM public.tidemark_offsets WHERE key = 'k5000'"))
    assert "Index" in plan and "tidemark_offsets_pkey" in plan and "Seq Scan" not in plan
    with PostgresOffsetStore(db.dsn) as reopened:  # an existing table is reused
        assert reopened.load("k5000") == {"lsn": 5000}


def test_postgres_rejects_a_foreign_table_and_a_missing_schema(db: Database) -> None:
    db.execute("CREATE TABLE tidemark_offsets (id int PRIMARY KEY, data jsonb)",
               "CREATE TABLE keyless (key text, \"offset\" jsonb, updated_at timestamptz)")
    with pytest.raises(ConfigError, match="not a tidemark offsets table") as info:
        PostgresOffsetStore(db.dsn).connect()
    assert info.value.key == "offsets.table"
    with pytest.raises(ConfigError, match="no primary key or unique index"):
        PostgresOffsetStore(db.dsn, table="keyless").load("k")
    with pytest.raises(ConfigError, match="schema 'nope' does not exist") as info:
        PostgresOffsetStore(db.dsn, schema="nope").save("k", {"lsn": 1})
    assert db.cluster.password not in str(info.value)


def test_postgres_reconnects_once_after_a_lost_connection(db: Database) -> None:
    def backends() -> list[int]:
        return [r[0] for r in db.query(
            "SELECT pid FROM pg_stat_activity "
            "WHERE datname = %s AND application_name = 'tidemark-offsets'", (db.name,))]

    def kill() -> int:
        """Terminate the store's backend and wait until it is gone, so that the next
        call surely finds its connection lost; returns the backend's pid."""
        (pid,) = backends()
        assert db.scalar("SELECT pg_terminate_backend(%s)", (pid,)) is True
        deadline = time.monotonic() + 10
        while pid in backends():
            assert time.monotonic() < deadline, f"backend {pid} did not exit"
            time.sleep(0.02)
        return pid

    with PostgresOffsetStore(db.dsn) as store:
        store.save("k", {"lsn": 1})
        first = kill()
        store.save("k", {"lsn": 2})  # reconnects
        second = backends()
        assert len(second) == 1 and second[0] != first, "save() did not reconnect"
        assert kill() == second[0]
        assert store.load("k") == {"lsn": 2}  # reconnects again
        third = backends()
        assert len(third) == 1 and third[0] != second[0], "load() did not reconnect"
    assert db.query("SELECT \"offset\"->>'lsn' FROM tidemark_offsets") == [("2",)]


def test_postgres_errors_never_contain_the_password(db: Database) -> None:
    secret = "Wr0ng-s3cret-pw"
    with pytest.raises(SourceError, match="authentication failed") as info:
        PostgresOffsetStore(db.cluster.dsn(db.name, password=secret)).connect()
    assert secret not in str(info.value)


def test_postgres_commits_synchronously_even_if_the_database_default_is_off(
        db: Database) -> None:
    db.autocommit(f'ALTER DATABASE "{db.name}" SET synchronous_commit = off')
    with PostgresOffsetStore(db.dsn) as store:
        store.connect()
        assert store._conn is not None
        with store._conn.cursor() as cur:
            cur.execute("SHOW synchronous_commit")
            assert cur.fetchone() == ("on",)


# -- layered -----------------------------------------------------------------------------

def test_layered_remote_only_value_is_found_and_copied_to_local(tmp_path: Path) -> None:
    local, remote = MemoryOffsetStore(), FileOffsetStore(tmp_path / "offsets.json")
    remote.save("k", {"lsn": 7})
    store = LayeredOffsetStore(local, remote)
    assert local.load("k") is None
    assert store.load("k") == {"lsn": 7}
    assert local.load("k") == {"lsn": 7}
    assert store.load("missing") is None and local.load("missing") is None


def test_layered_local_wins_and_save_writes_both(tmp_path: Path) -> None:
    local, remote = MemoryOffsetStore(), FileOffsetStore(tmp_path / "offsets.json")
    local.save("k", {"lsn": 2})
    remote.save("k", {"lsn": 1})
    store = LayeredOffsetStore(local, remote)
    assert store.load("k") == {"lsn": 2}
    assert remote.load("k") == {"lsn": 1}  # reading does not write remote
    store.save("k", {"lsn": 3})
    assert local.load("k") == {"lsn": 3}
    assert FileOffsetStore(tmp_path / "offsets.json").load("k") == {"lsn": 3}


class _FailingStore:
    def load(self, key: str) -> dict[str, Any] | None:
        return None

    def save(self, key: str, offset: dict[str, Any]) -> None:
        raise OSError("remote is down")


def test_layered_save_raises_when_remote_fails_and_local_is_ahead() -> None:
    local = MemoryOffsetStore()
    store = LayeredOffsetStore(local, _FailingStore())
    with pytest.raises(OSError, match="remote is down"):
        store.save("k", {"lsn": 1})
    assert store.load("k") == {"lsn": 1}  # local was written first, and wins


def test_layered_sqlite_over_postgres_survives_losing_the_machine(
        db: Database, tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with LayeredOffsetStore(SqliteOffsetStore(tmp_path / "a" / "offsets.db"),
                            PostgresOffsetStore(db.dsn)) as first:
        first.save("db/slot", {"lsn": 42, "snapshot_completed": True})
    # machine "a" is gone; a new one starts with an empty local store
    with LayeredOffsetStore(SqliteOffsetStore(tmp_path / "b" / "offsets.db"),
                            PostgresOffsetStore(db.dsn)) as second:
        assert second.load("db/slot") == {"lsn": 42, "snapshot_completed": True}
        assert isinstance(second.local, SqliteOffsetStore)
        assert second.local.load("db/slot") == {"lsn": 42, "snapshot_completed": True}


def test_ten_thousand_keys_save_at_once_and_load_each(backend: Backend) -> None:
    """A log-table capture keeps one offset per stream group: thousands of keys, saved
    together (one write, all or none) and each loaded by a lookup."""
    store = backend.open()
    offsets = {f"shop/logtable/group-{g}": {"after": g * 7} for g in range(10_000)}
    store.save_many(offsets)
    store.save_many({"shop/logtable/group-5": {"after": 1}})
    store = backend.open()
    assert store.load("shop/logtable/group-5") == {"after": 1}
    assert store.load("shop/logtable/group-9999") == {"after": 9999 * 7}
    loaded = store.load_many([*offsets, "shop/logtable/group-none"])
    assert len(loaded) == 10_000 and loaded["shop/logtable/group-5"] == {"after": 1}
    assert loaded["shop/logtable/group-77"] == {"after": 77 * 7}
    assert all(store.load(key) == value for key, value in offsets.items()
               if key != "shop/logtable/group-5")


def _save_repeatedly(path: str, key: str, count: int) -> None:
    store = FileOffsetStore(path)
    for n in range(count):
        store.save(key, {"n": n})


def test_processes_sharing_an_offsets_file_keep_each_others_last_saves(
        tmp_path: Path) -> None:
    """One file, one key per process, saves at once: each save re-reads the file, and
    without a lock two could read the same version and one undo the other's key."""
    path = tmp_path / "offsets.json"
    context = multiprocessing.get_context("spawn")
    savers = [context.Process(target=_save_repeatedly, args=(str(path), f"k{i}", 300))
              for i in range(4)]
    for saver in savers:
        saver.start()
    for saver in savers:
        saver.join(120)
        assert saver.exitcode == 0
    keys = [f"k{i}" for i in range(4)]
    assert FileOffsetStore(path).load_many(keys) == {k: {"n": 299} for k in keys}


def test_a_sqlite_save_whose_commit_fails_leaves_no_transaction_open(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A COMMIT that fails must not leave its transaction open: the next saves would run
    inside it and return without being durable."""
    import sqlite3  # noqa: PLC0415

    store = SqliteOffsetStore(tmp_path / "offsets.db")
    real = store._connection()
    failed: list[str] = []

    class FailingCommit:
        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)

        def execute(self, statement: str, *args: Any) -> Any:
            if statement == "COMMIT" and not failed:
                failed.append(statement)
                raise sqlite3.OperationalError("disk I/O error (injected)")
            return real.execute(statement, *args)

    monkeypatch.setattr(store, "_connection", FailingCommit)
    with pytest.raises(sqlite3.OperationalError):
        store.save_many({"a": {"lsn": 1}})
    store.save_many({"b": {"lsn": 2}})
    with SqliteOffsetStore(tmp_path / "offsets.db") as other:
        assert other.load("b") == {"lsn": 2}
    store.close()
