"""``tidemark verify`` end to end on MariaDB (binlog), PostgreSQL log tables and SQLite
log tables: a real ``tidemark run`` pipeline (trigger 300 ms) running under a writer is
verified again and again (equal every time, exit 0 through the command), then, idle,
with a long transaction open, then its target is changed behind its back and exactly
those keys are named (exit 1).

One pipeline per source, its steps in one test: the databases are the test's own."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from pyspark.sql import SparkSession

from logtable_helpers import LogDb
from pipeline_helpers import _LivePipeline
from tidemark.pipeline import load_config
from tidemark.testing.postgres import sql_connection
from tidemark.verify.result import VerifyResult
from tidemark.verify.run import verify

pytestmark = [pytest.mark.integration, pytest.mark.slow]

#: Rows of t at the start (keys 1..ROWS), and of c (keys (1..C_IDS, 'a'|'b é')).
ROWS = 3000
C_IDS = 1000
#: The writer changes t's keys above WRITER_FROM (and its own new keys), c's above
#: C_WRITER_FROM; the keys below are the target's own to change behind its back.
WRITER_FROM = 1500
C_WRITER_FROM = 500
HOT = 2000
NEW = 100_000
DELETED, CHANGED, ADDED = 10, 20, 99_999
#: The writer's transactions per second (each about seven changes): at most, so that a
#: fast source does not outrun the pipeline on a busy machine.
RATE = 150
#: verify() calls while the writer writes.
LIVE_VERIFIES = 3
WAIT_S = 90.0


@dataclass
class Source:
    """One source's database: how to connect, its DDL's text type, the pipeline's
    ``[source]`` lines and table names, and how t's target is stored."""

    name: str
    dsn: str
    schema: str
    connect: Callable[[], Any]
    text_type: str
    source_lines: str
    target_options: str
    begin: str = "BEGIN"
    install: Callable[[], None] | None = None

    def execute(self, *statements: str) -> None:
        with contextlib.closing(self.connect()) as conn:
            cur = conn.cursor()
            cur.execute(self.begin)
            for statement in statements:
                cur.execute(statement)
            cur.execute("COMMIT")


def _source(name: str, request: pytest.FixtureRequest, tmp_path: Path) -> Source:
    if name == "mariadb":
        mdb = request.getfixturevalue("mdb")

        def connect_mariadb() -> Any:
            return mdb.server.connect(mdb.name)
        return Source(name, mdb.dsn, mdb.name, connect_mariadb, "VARCHAR(40)", "",
                      "stored_as_scd_type = 2\n")
    if name == "sqlite-logtable":
        path = tmp_path / "app.db"
        path.touch()
        db = LogDb("sqlite", f"sqlite:///{path}", path)
        return Source(name, db.dsn, "main",
                      lambda: sqlite3.connect(path, isolation_level=None, timeout=60),
                      "text", "", "", begin="BEGIN IMMEDIATE",
                      install=lambda: db.install(["t", "c"], streams=8, groups=2))
    pg = request.getfixturevalue("db")
    logdb = LogDb("postgres", pg.dsn)
    return Source(name, pg.dsn, "public", lambda: sql_connection(pg.dsn, autocommit=True),
                  "text", 'kind = "logtable"\n', 'soft_delete_column = "_deleted"\n',
                  install=lambda: logdb.install(["t", "c"], streams=8, groups=2))


def _load(source: Source) -> None:
    text = source.text_type
    source.execute(f"CREATE TABLE t (id INT PRIMARY KEY, v {text}, n INT)",
                   f"CREATE TABLE c (id INT NOT NULL, name {text} NOT NULL, v {text}, "
                   "PRIMARY KEY (id, name))")
    if source.install is not None:
        source.install()
    t_rows = ", ".join(f"({i}, 'v{i}', {i})" for i in range(1, ROWS + 1))
    c_rows = ", ".join(f"({i}, '{name}', 'c{i}')" for i in range(1, C_IDS + 1)
                       for name in ("a", "b \u00e9"))
    source.execute(f"INSERT INTO t VALUES {t_rows}", f"INSERT INTO c VALUES {c_rows}")


def _transaction(i: int) -> list[str]:
    """Writer transaction *i*: the hot keys updated, a new row, updates and deletes of
    the writer's keys."""
    statements = [
        f"UPDATE t SET n = n + 1 WHERE id = {HOT}",
        f"INSERT INTO t VALUES ({NEW + i}, 'w{i}', {i})",
        f"UPDATE t SET v = 'u{i}' WHERE id = {WRITER_FROM + 1 + (i * 7) % WRITER_FROM}",
        f"UPDATE c SET v = 'h{i}' WHERE id = {C_IDS} AND name = 'b \u00e9'",
        f"UPDATE c SET v = 'u{i}' WHERE id = {C_WRITER_FROM + 1 + i % 400} AND name = 'a'",
        f"INSERT INTO c VALUES ({NEW + i}, 'n \u00e9', 'x{i}')",
    ]
    if i % 3 == 0:
        statements.append(f"DELETE FROM t WHERE id = {NEW + i - 2}")
    if i % 5 == 0:
        statements.append(f"DELETE FROM t WHERE id = {WRITER_FROM + 1 + (i * 13) % 1400}")
    if i % 4 == 0:
        statements.append(f"DELETE FROM c WHERE id = {NEW + i - 1} AND name = 'n \u00e9'")
    return statements


class Writer(threading.Thread):
    """Commits :func:`_transaction` after another until stopped, at most :data:`RATE`
    a second."""

    def __init__(self, source: Source) -> None:
        super().__init__(daemon=True)
        self.source = source
        self.committed = 0
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with contextlib.closing(self.source.connect()) as conn:
                cur = conn.cursor()
                started = time.monotonic()
                while not self.stop.wait(max(0.0, started + self.committed / RATE
                                             - time.monotonic())):
                    cur.execute(self.source.begin)
                    for statement in _transaction(self.committed + 1):
                        cur.execute(statement)
                    cur.execute("COMMIT")
                    self.committed += 1
        except BaseException as err:  # reported by the test
            self.error = err

    def finish(self) -> None:
        self.stop.set()
        self.join(60)
        if self.error is not None:
            raise self.error


@contextlib.contextmanager
def _writing(source: Source) -> Iterator[Writer]:
    writer = Writer(source)
    writer.start()
    try:
        yield writer
    finally:
        writer.finish()


@contextlib.contextmanager
def _open_transaction(source: Source) -> Iterator[None]:
    """A transaction that has written (a row of ``other``), open in the block."""
    with contextlib.closing(source.connect()) as conn:
        cur = conn.cursor()
        cur.execute(source.begin)
        cur.execute("INSERT INTO other VALUES (2)")
        try:
            yield
        finally:
            cur.execute("ROLLBACK")


def _pipeline_file(source: Source, where: Path) -> Path:
    file = where / "pipeline.toml"
    file.write_text(
        f'[source]\ndsn = "{source.dsn}"\n{source.source_lines}'
        f'[spark]\ncheckpoint = "{where}/chk"\ntrigger_interval_ms = 300\n'
        f'[targets."{source.schema}.t"]\npath = "{where}/lake/t"\nkeys = ["id"]\n'
        f"{source.target_options}"
        f'[targets."{source.schema}.c"]\npath = "{where}/lake/c"\nkeys = ["id", "name"]\n')
    return file


def _summary(result: VerifyResult) -> str:
    return json.dumps(result.as_json(), indent=1)[:4000]


def _assert_equal(result: VerifyResult) -> None:
    assert result.exit_code == 0, _summary(result)
    for table in result.tables:
        assert not table.target_behind, _summary(result)
        assert table.rows_compared > 0, _summary(result)


def _cli(file: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tidemark", "verify", str(file), *args],
                          capture_output=True, text=True, timeout=300, check=False)


def _change_behind_the_back(path: str, target_options: str) -> None:
    """Key DELETED deleted, CHANGED's v changed, ADDED added (current rows of SCD2,
    unflagged rows of soft delete)."""
    current = " AND __END_AT IS NULL" if "scd" in target_options else ""
    table = DeltaTable(path)
    table.delete(f"id = {DELETED}{current}")
    DeltaTable(path).update({"v": "'zzz'"}, predicate=f"id = {CHANGED}{current}")
    schema = pa.schema(DeltaTable(path).schema().to_arrow())
    row: dict[str, Any] = {"id": ADDED, "v": "new", "n": 1}
    for field in schema:
        if field.name not in row:
            row[field.name] = False if pa.types.is_boolean(field.type) else \
                None if field.nullable else 0
    write_deltalake(path, pa.Table.from_pylist([row], schema), mode="append")


@pytest.mark.parametrize("name", ["mariadb", "postgres-logtable", "sqlite-logtable"])
def test_verify_under_a_writer_then_drift(name: str, request: pytest.FixtureRequest,
                                          spark: SparkSession, tmp_path: Path) -> None:
    source = _source(name, request, tmp_path)
    _load(source)
    file = _pipeline_file(source, tmp_path)
    with _LivePipeline(load_config(file), spark) as live:
        live.applied(ROWS + 2 * C_IDS)
        with _writing(source) as writer:
            live.wait_until(lambda: writer.committed >= 100 or writer.error is not None,
                            "the writer's first transactions")
            for _ in range(LIVE_VERIFIES):
                result = verify(file, wait_s=WAIT_S)
                assert writer.is_alive(), writer.error
                _assert_equal(result)
                # The hot keys changed in every round: named as not compared, found by
                # their key hashes (the changed keys' and the sides' agree).
                t, c = result.tables
                assert {"id": str(HOT)} in t.not_compared, _summary(result)
                assert {"id": str(C_IDS), "name": "b \u00e9"} in c.not_compared, \
                    _summary(result)
            done = _cli(file, "--wait", str(WAIT_S))
            assert done.returncode == 0, done.stdout + done.stderr
            assert writer.committed > 200
        _assert_equal(verify(file, wait_s=WAIT_S))  # the writer's last changes applied
        # Idle and caught up, then the source's log moved on by a table the pipeline does
        # not read: verify waits for no position the pipeline never reaches (it would be
        # marked behind after WAIT_S).
        source.execute("CREATE TABLE other (id INT PRIMARY KEY)",
                       "INSERT INTO other VALUES (1)")
        _assert_equal(verify(file, wait_s=WAIT_S))
        # A long transaction open (it holds a transaction id) while t changes: the
        # pipeline's position never passes it, yet it holds every change of the
        # snapshot; verify must not wait for it to end.
        with _open_transaction(source):
            if source.name != "sqlite-logtable":  # SQLite: it holds the one write lock
                source.execute(f"UPDATE t SET n = n + 1 WHERE id = {HOT}")
            _assert_equal(verify(file, wait_s=WAIT_S))

        _change_behind_the_back(str(tmp_path / "lake/t"), source.target_options)
        result = verify(file, wait_s=WAIT_S)
        assert result.exit_code == 1, _summary(result)
        t, c = result.tables
        assert (c.equal, t.target_behind) == (True, False), _summary(result)
        assert [(d.kind, d.key, d.columns) for d in t.differences] == [
            ("different", {"id": str(CHANGED)}, ("v",)),
            ("extra", {"id": str(ADDED)}, ()),
            ("missing", {"id": str(DELETED)}, ())], _summary(result)
        done = _cli(file, "--json", "--wait", str(WAIT_S))
        assert done.returncode == 1, done.stdout + done.stderr
        report = json.loads(done.stdout)
        assert [d["key"]["id"] for d in report["tables"][0]["differences"]] == \
            [str(CHANGED), str(ADDED), str(DELETED)]
        assert not live.failures, live.failures
