"""``tidemark verify --repair`` through a running ``tidemark run``: targets tampered with
behind the pipeline's back (a key deleted, one changed, one added) on tables keyed by an
integer, by a wall-clock timestamp (SCD2) and by a composite of a date, an instant and a
text are named, repaired and verified equal (exit 0); the target equals the source row
by row and only the differing keys were written. Then, the pipeline stopped, a repair
is queued (exit 1) and applied at its next start. PostgreSQL, MariaDB, and log tables
on PostgreSQL and SQLite."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from click.testing import CliRunner
from deltalake import DeltaTable, write_deltalake

from conftest import Database, MariaDatabase
from delta_rows import live_table
from logtable_helpers import LogDb
from pipeline_helpers import _prepare, _tidemark_run
from tidemark.cli.main import cli
from tidemark.event import TableId
from tidemark.pipeline.compare import compare
from tidemark.source.signals import signal_table_ddl
from tidemark.spark_checkpoint import committed_source_offset
from tidemark.status.verify_record import read_record
from tidemark.verify.run import verify

pytestmark = [pytest.mark.integration, pytest.mark.slow]

_SPARK = ('[spark]\ncheckpoint = "chk"\nmaster = "local[1]"\n'
          'conf = { "spark.ui.enabled" = "false", "spark.sql.shuffle.partitions" = "1" }\n')
_ROWS = 12
#: The columns compared row by row, per table.
_COLUMNS = {"a": ["id", "v"], "w": ["ts", "v"], "c": ["d", "ts", "name", "v"]}


@dataclass
class _Source:
    """One source's database: its SQL and the pipeline file's [source] and names."""

    execute: Callable[..., None]
    dsn: str
    schema: str
    source_toml: str
    snapshot: str
    """The targets' snapshot setting (PostgreSQL streams from a slot made first)."""
    log_tables: bool = False


def _pg_source(db: Database) -> _Source:
    db.execute(signal_table_ddl(TableId.parse("public.dbz_signal")),
               "CREATE TABLE a (id int PRIMARY KEY, v text)",
               "CREATE TABLE w (ts timestamp(6) PRIMARY KEY, v text)",
               "CREATE TABLE c (d date, ts timestamptz(6), name text, v text, "
               "PRIMARY KEY (d, ts, name))")
    toml = _prepare(db, "a", "w", "c") + f'dsn = "{db.dsn}"\n'
    return _Source(db.execute, db.dsn, "public", toml, 'snapshot = "never"\n')


def _maria_source(mdb: MariaDatabase) -> _Source:
    mdb.execute("CREATE TABLE dbz_signal (id VARCHAR(42) PRIMARY KEY, type VARCHAR(32) "
                "NOT NULL, data VARCHAR(2048))",
                "CREATE TABLE a (id INT PRIMARY KEY, v VARCHAR(40))",
                "CREATE TABLE w (ts DATETIME(6) PRIMARY KEY, v VARCHAR(40))",
                "CREATE TABLE c (d DATE, ts TIMESTAMP(6) NOT NULL DEFAULT "
                "'2000-01-01 00:00:00', name VARCHAR(20), v VARCHAR(40), "
                "PRIMARY KEY (d, ts, name))")
    return _Source(mdb.execute, mdb.dsn, mdb.name, f'dsn = "{mdb.dsn}"\n', "")


def _log_source(db: LogDb) -> _Source:
    schema = "main" if db.kind == "sqlite" else "public"
    db.execute(signal_table_ddl(TableId(schema, "dbz_signal")),
               "CREATE TABLE a (id int PRIMARY KEY, v text)",
               "CREATE TABLE w (ts timestamp PRIMARY KEY, v text)",
               "CREATE TABLE c (d date, ts timestamptz, name text, v text, "
               "PRIMARY KEY (d, ts, name))")
    db.install(["a", "w", "c"])
    kind = "" if db.kind == "sqlite" else 'kind = "logtable"\n'
    return _Source(db.execute, db.dsn, schema, f'dsn = "{db.dsn}"\n{kind}',
                   'snapshot = "never"\n', log_tables=True)


@pytest.fixture(params=["postgres", "mariadb", "postgres-logtable", "sqlite"])
def source(request: pytest.FixtureRequest, tmp_path: Path) -> _Source:
    if request.param == "postgres":
        return _pg_source(request.getfixturevalue("db"))
    if request.param == "mariadb":
        return _maria_source(request.getfixturevalue("mdb"))
    if request.param == "sqlite":
        path = tmp_path / "app.db"
        path.touch()
        return _log_source(LogDb("sqlite", f"sqlite:///{path}", path))
    return _log_source(LogDb("postgres", request.getfixturevalue("db").dsn))


def _insert(src: _Source, first: int, last: int) -> None:
    src.execute(*(f"INSERT INTO a VALUES ({i}, 'a{i}')" for i in range(first, last + 1)),
                *(f"INSERT INTO w VALUES ('2024-01-{i:02d} 10:00:00.{i:06d}', 'w{i}')"
                  for i in range(first, last + 1)),
                *(f"INSERT INTO c VALUES ('2023-02-{i:02d}', '2024-03-04 05:06:{i:02d}.5', "
                  f"'n{i % 3}', 'c{i}')" for i in range(first, last + 1)))


def _config(tmp_path: Path, src: _Source) -> Path:
    s = src.schema
    file = tmp_path / "pipeline.toml"
    file.write_text(
        f'[source]\n{src.source_toml}signal_table = "{s}.dbz_signal"\n{_SPARK}'
        f'[targets."{s}.a"]\npath = "lake/a"\nkeys = ["id"]\n{src.snapshot}'
        f'[targets."{s}.w"]\npath = "lake/w"\nkeys = ["ts"]\n{src.snapshot}'
        "stored_as_scd_type = 2\n"
        f'[targets."{s}.c"]\npath = "lake/c"\nkeys = ["d", "ts", "name"]\n'
        f"{src.snapshot}")
    return file


@contextlib.contextmanager
def _running(config: Path, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    proc = _tidemark_run(config, log)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(120)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(30)


def _until_equal(config: Path, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 240
    while True:
        result = verify(config, wait_s=30, record=False)
        _, _, offset = committed_source_offset(str(config.parent / "chk"))
        # Signals are taken once the pipeline has read its signal table (after a snapshot).
        if result.exit_code == 0 and offset is not None and offset.get("signals") is not None:
            return
        assert proc.poll() is None, log.read_text(errors="replace")[-4000:]
        assert time.monotonic() < deadline, (result.as_json(), log.read_text()[-4000:])
        time.sleep(0.5)


def _lake(tmp_path: Path, table: str) -> pa.Table:
    return live_table(DeltaTable(str(tmp_path / "lake" / table)))


def _tamper(tmp_path: Path, table: str) -> None:
    """The 3rd row deleted, the 5th changed, a copy of the 7th added under a key the
    source lacks (current versions only, in the SCD2 table w)."""
    path = str(tmp_path / "lake" / table)
    target = DeltaTable(path)
    rows = _lake(tmp_path, table)
    if "__END_AT" in rows.column_names:
        rows = rows.filter(pc.is_null(rows.column("__END_AT")))
    rows = rows.sort_by([(k, "ascending") for k in _keys(table)])
    current = "__END_AT IS NULL AND " if table == "w" else ""
    target.delete(current + _where(rows, 2, table))
    target.update({"v": "'tampered'"}, predicate=current + _where(rows, 4, table))
    extra = rows.slice(6, 1)
    key = _keys(table)[-1]
    if table == "a":
        shifted = pa.array([999], extra.schema.field("id").type)
    elif table == "w" and pa.types.is_string(extra.schema.field("ts").type):  # SQLite
        shifted = pc.binary_join_element_wise(extra.column("ts"), "9", "")
    elif table == "w":  # a microsecond later
        ts = extra.column("ts").cast(pa.int64())
        shifted = pc.add(ts, 1).cast(extra.schema.field("ts").type)
    else:
        shifted = pa.chunked_array([["zzz"]], extra.schema.field("name").type)
    extra = extra.set_column(extra.schema.get_field_index(key), key, shifted)
    write_deltalake(path, extra, mode="append")


def _keys(table: str) -> list[str]:
    return {"a": ["id"], "w": ["ts"], "c": ["d", "ts", "name"]}[table]


def _where(rows: pa.Table, index: int, table: str) -> str:
    row = rows.slice(index, 1).to_pylist()[0]
    parts = []
    for key in _keys(table):
        value = row[key]
        if key == "ts" and not isinstance(value, str):  # DataFusion: epoch microseconds
            micros = pc.cast(rows.column("ts").slice(index, 1), pa.int64())[0].as_py()
            parts.append(f"CAST({key} AS BIGINT) = {micros}")
        elif isinstance(value, str):
            parts.append(f"{key} = '{value}'")
        elif key == "d":
            parts.append(f"{key} = DATE '{value.isoformat()}'")
        else:
            parts.append(f"{key} = {value}")
    return " AND ".join(parts)


def _row_set(rows: pa.Table, table: str) -> Counter[tuple[Any, ...]]:
    names = sorted(rows.column_names)
    return Counter(tuple(r[n] for n in names) for r in rows.to_pylist())


def _changed_keys(before: pa.Table, after: pa.Table, table: str) -> set[tuple[Any, ...]]:
    """The keys of rows added or removed between two versions of a target."""
    old, new = _row_set(before, table), _row_set(after, table)
    names = sorted(before.column_names)
    at = [names.index(k) for k in _keys(table)]
    return {tuple(row[i] for i in at) for row in (old - new) + (new - old)}


def test_repair_mends_tampered_targets_through_a_running_pipeline(
        source: _Source, tmp_path: Path) -> None:
    config = _config(tmp_path, source)
    _insert(source, 1, _ROWS)
    tables = ("a", "w", "c")
    log = tmp_path / "run-1.log"
    with _running(config, log) as proc:
        _until_equal(config, proc, log)
        clean = {t: _lake(tmp_path, t) for t in tables}
        for table in tables:
            _tamper(tmp_path, table)
        tampered = {t: _lake(tmp_path, t) for t in tables}
        expected = {t: _changed_keys(clean[t], tampered[t], t) for t in tables}
        assert all(len(keys) == 3 for keys in expected.values()), expected

        # Above the limit: refused, naming the reload; nothing sent.
        result = verify(config, wait_s=30, repair=True, repair_limit=2)
        assert result.exit_code == 1, result.as_json()
        for table in result.tables:
            assert table.repair is not None and table.repair.state == "refused"
            # Log-table streams take no execute-snapshot: a new checkpoint reloads.
            reload = 'snapshot = "initial"' if source.log_tables \
                else "execute-snapshot " + table.table
            assert reload in (table.repair.message or ""), table.repair
        assert {t: _lake(tmp_path, t).num_rows for t in tables} == \
            {t: tampered[t].num_rows for t in tables}

        out = CliRunner().invoke(cli, ["verify", str(config), "--repair", "--json",
                                       "--wait", "120"], standalone_mode=False)
        report = json.loads(out.output)
        assert out.exit_code == 0, ([(t["table"], t["differences"], t.get("repair"))
                                     for t in report["tables"]], log.read_text()[-2000:])
        assert {t["table"]: (t["equal"], t["repair"]["state"], t["repair"]["keys"])
                for t in report["tables"]} == {
            f"{source.schema}.{t}": (True, "applied", 3) for t in tables}
        record = read_record(tmp_path / "chk")
        assert record is not None and record["result"] == "equal"
        assert all(t["repair"]["keys"] == 3 for t in record["tables"])

        for table in tables:
            path = str(tmp_path / "lake" / table)
            src_rows, lake_rows = compare(source.dsn, f"{source.schema}.{table}", path,
                                          _COLUMNS[table], scd2=table == "w")
            assert src_rows == lake_rows, table
            # Only the differing keys were written between the versions.
            assert _changed_keys(tampered[table], _lake(tmp_path, table), table) == \
                expected[table], table

    # Stopped: the repair is queued, and applied when the pipeline next runs.
    _tamper(tmp_path, "a")
    out = CliRunner().invoke(cli, ["verify", str(config), "--repair", "--table",
                                   f"{source.schema}.a", "--wait", "2"],
                             standalone_mode=False)
    assert out.exit_code == 1, out.output
    assert "repair of 3 keys queued" in out.output and "next runs" in out.output, out.output
    assert "missing" in out.output and "extra" in out.output, out.output
    log = tmp_path / "run-2.log"
    with _running(config, log) as proc:
        _until_equal(config, proc, log)
