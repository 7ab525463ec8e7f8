"""The rows of the conformance matrix: one :class:`SourceUnderTest` per source.

Each makes the matrix table ``mx`` (an integer key and the types every source has, then
its own), runs the standard workload on it, reads its rows back, and knows how each
runtime is pointed at it. Adding a source to the matrix is one class here and its name
in :data:`SOURCES`.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from conformance.debezium_cells import DebeziumCase, mariadb_case, postgres_case
from conformance.type_columns import AS_TEXT, arrow_types, normal, typed
from logtable_helpers import LogDb
from tidemark.testing.postgres import sql_connection
from type_lists import (
    MARIADB_TYPES,
    POSTGRES_LOGTABLE_TYPES,
    POSTGRES_TYPES,
    SQLITE_LOGTABLE_TYPES,
    TypeList,
)

Rows = dict[Any, dict[str, Any]]
Statement = tuple[str, Sequence[Any]]


def canon(value: Any) -> Any:
    """One Python value for what runtimes carry in different shapes: bytes of any kind,
    aware timestamps as naive UTC, and :func:`conformance.type_columns.normal`'s forms
    (decimals without trailing zeros, times as microseconds, UUIDs as text, JSON
    text as its value, lists element by element)."""
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, dt.datetime) and value.tzinfo is not None:
        return value.astimezone(dt.UTC).replace(tzinfo=None)
    return normal(value)


def canon_rows(rows: Rows) -> Rows:
    return {key: {name: canon(v) for name, v in row.items()} for key, row in rows.items()}


@dataclass(frozen=True)
class Column:
    name: str
    sql: str
    arrow: pa.DataType
    value: Callable[[int], Any]
    """The column's value in workload row *i* (None: NULL)."""


def _text(i: int) -> str:
    return f"row {i} \u00e9\u00df"


COMMON = (
    Column("t", "", pa.string(), _text),
    Column("f", "", pa.float64(), lambda i: i + 0.5),
    Column("bin", "", pa.binary(), lambda i: bytes([i % 256, 0, 255])),
)
TYPED = (
    Column("d", "", pa.decimal128(10, 2), lambda i: Decimal(f"{i}.25")),
    Column("b", "", pa.bool_(), lambda i: i % 2 == 0),
    Column("dt", "", pa.date32(), lambda i: dt.date(2024, 2, 29) + dt.timedelta(days=i)),
    Column("ts", "", pa.timestamp("us"),
           lambda i: dt.datetime(2024, 1, 2, 3, 4, 5, 678901) + dt.timedelta(minutes=i)),
)


def _typed(sql: dict[str, str], columns: Sequence[Column]) -> tuple[Column, ...]:
    return tuple(Column(c.name, sql[c.name], c.arrow, c.value) for c in columns)


@dataclass
class SourceUnderTest:
    """One source's database with the matrix table; subclasses say how to reach it."""

    name: str
    dsn: str
    columns: tuple[Column, ...]
    placeholder: str = "%s"
    table: str = "public.mx"
    """The table as events name it."""
    restart_refusal: str | None = None
    """Why this source has no server to restart (None: it has one)."""
    types: TypeList | None = None
    """Every type of the source (:mod:`type_lists`, shared with the converters' test)."""
    extra: dict[str, Any] = field(default_factory=dict)
    refused_capture: tuple[list[str], str] = (["--slot", "other"], "")
    """A ``tidemark capture`` option this source does not have, and what its refusal
    says ("": the source has every option the runtimes give; nothing to refuse)."""
    refused_spark: tuple[str, str] = ("readerName", "applies to log tables only")
    """A Spark source option this source does not have, and what its refusal says."""
    refused_engine: tuple[str, Any] = ("slot_name", "x")
    """A connector setting this source's connector does not have, and a value."""
    refused_run: tuple[str, str] = ('slot = "other"', "slot")
    """A ``[source]`` line of ``pipeline.toml`` this source does not take, and what its
    refusal says."""
    typed: bool = False
    """The table has every type of :attr:`types` (:meth:`use_types`)."""
    log_groups: int = 2
    """The stream groups of a log-table source's log."""

    def engine_cells(self) -> bool:
        """The engine's converters write this source's non-key columns as ScyllaDB's
        cells by default (log tables)."""
        return False

    # -- the database -------------------------------------------------------------------
    def connect(self) -> Any:
        raise NotImplementedError

    def execute(self, *statements: Statement | str) -> None:
        """Run *statements* in one transaction."""
        with contextlib.closing(self.connect()) as conn:
            cur = conn.cursor()
            cur.execute("BEGIN")
            for statement in statements:
                sql, params = (statement, ()) if isinstance(statement, str) else statement
                cur.execute(sql, tuple(params))
            cur.execute("COMMIT")

    def query(self, sql: str) -> list[tuple[Any, ...]]:
        with contextlib.closing(self.connect()) as conn:
            cur = conn.cursor()
            cur.execute(sql)
            return list(cur.fetchall())

    def key_sql(self) -> str:
        return "id integer PRIMARY KEY"

    def create(self) -> None:
        if self.typed:
            assert self.types is not None
            self.execute(*self.types.prelude, f"CREATE TABLE mx ({self.types.columns})")
            return
        cols = ", ".join(f"{c.name} {c.sql}" for c in self.columns)
        self.execute(f"CREATE TABLE mx ({self.key_sql()}, {cols})")

    def use_types(self) -> None:
        """Make the matrix table of every type of :attr:`types` instead (the ``types``
        check): its columns typed for the runtimes' readers (:mod:`conformance.
        type_columns`)."""
        assert self.types is not None
        self.typed = True
        self.columns = tuple(Column(name, "", arrow, lambda _i: None)
                             for name, arrow in arrow_types(self.types).items())

    def types_workload(self) -> list[list[Statement | str]]:
        """The ``types`` check's changes: rows of every type's values (edge values, and
        in MariaDB's second row NULLs and zeros), a row of NULLs, a row updated to
        NULLs, a row of NULLs updated to values, a delete."""
        assert self.types is not None
        row = self.types.row
        # The rows of values (keys from 1) stay to the end, compared; a copy of them
        # (keys from 11) is updated to NULLs and deleted.
        if "%s" in row:  # one row per numeric of the test's choice
            numerics = ("12345678901234567890.123456789", "-0.5", "0")
            rows = [row % (key + base, n) for base in (0, 10)
                    for key, n in enumerate(numerics, start=1)]
        else:  # two rows of its own, keys (1, 2) and (11, 12)
            rows = [row % (1, 2), row % (11, 12)]
        non_key = [c.name for c in self.columns]
        return [
            [f"INSERT INTO mx VALUES {text}" for text in rows],
            [self.insert(9, nulls=True)],
            [self.update(11, **{name: None for name in non_key}),
             self.copy_row(1, 9, non_key)],
            ["DELETE FROM mx WHERE id = 12"],
        ]

    def copy_row(self, source: int, target: int, names: list[str]) -> str:
        """An UPDATE giving row *target* row *source*'s values of *names*."""
        listed = ", ".join(names)
        return (f"UPDATE mx SET ({listed}) = (SELECT {listed} FROM mx WHERE id = "
                f"{int(source)}) WHERE id = {int(target)}")

    def restart_server(self) -> None:
        raise NotImplementedError

    # -- rows ---------------------------------------------------------------------------
    @property
    def names(self) -> list[str]:
        return ["id", *(c.name for c in self.columns)]

    def rows(self) -> Rows:
        """The table's rows now, by key, canonical (:func:`canon`)."""
        found = self.query(f"SELECT {', '.join(self.selected())} FROM mx")
        if self.typed:
            arrows = [pa.int64(), *(c.arrow for c in self.columns)]
            found = [tuple(typed(v, a) for v, a in zip(r, arrows, strict=True))
                     for r in found]
        return canon_rows({r[0]: dict(zip(self.names, r, strict=True)) for r in found})

    def selected(self) -> list[str]:
        """What :meth:`rows` selects: the columns, a type in :data:`AS_TEXT` as text."""
        if not self.typed:
            return self.names
        assert self.types is not None
        text = {d.split()[0] for d in self.types.columns.split(", ")
                if len(d.split()) > 1 and d.split()[1] in AS_TEXT}
        return [f"{n}::text" if n in text else n for n in self.names]

    def arrow_schema(self) -> pa.Schema:
        return pa.schema([pa.field("id", pa.int64()),
                          *(pa.field(c.name, c.arrow) for c in self.columns)])

    def insert(self, i: int, *, nulls: bool = False) -> Statement:
        values = [i, *(None if nulls else c.value(i) for c in self.columns)]
        marks = ", ".join([self.placeholder] * len(values))
        return f"INSERT INTO mx ({', '.join(self.names)}) VALUES ({marks})", values

    def update(self, i: int, **values: Any) -> Statement:
        sets = ", ".join(f"{name} = {self.placeholder}" for name in values)
        return f"UPDATE mx SET {sets} WHERE id = {int(i)}", list(values.values())

    def workload(self) -> list[list[Statement | str]]:
        """Every operation: inserts (a multi-row transaction), a row of NULLs, updates
        to values and to NULL, a primary-key change, a delete, and a transaction that
        inserts, updates and deletes."""
        col = {c.name: c for c in self.columns}
        return [
            [self.insert(i) for i in range(1, 6)],
            [self.insert(6, nulls=True)],
            [self.update(1, t="changed", f=-1.25, bin=b"\x01\x02"),
             self.update(2, **{name: None for name in col})],
            ["UPDATE mx SET id = 30 WHERE id = 3"],
            ["DELETE FROM mx WHERE id = 4"],
            [self.insert(7), self.update(7, t=None, f=7.75), "DELETE FROM mx WHERE id = 5",
             self.update(6, **{name: c.value(60) for name, c in col.items()})],
        ]

    def big_transaction(self, first: int, count: int, width: int) -> list[Statement | str]:
        """One transaction of *count* wide rows (text of *width* characters)."""
        statements: list[Statement | str] = []
        for i in range(first, first + count):
            name, values = self.insert(i)
            values[1] = f"{i:08d}" + "w" * (width - 8)
            statements.append((name, values))
        return statements

    # -- how runtimes reach it ------------------------------------------------------------
    def capture_args(self) -> list[str]:
        """``tidemark capture`` options (besides --dsn and --offsets)."""
        raise NotImplementedError

    def engine_connector(self, **settings: Any) -> tuple[str, dict[str, Any]]:
        """The engine's connector: its class in the ``tidemark`` package and its
        settings (JSON), *settings* over the matrix's own."""
        raise NotImplementedError

    def spark_options(self) -> dict[str, str]:
        """Options of ``read_table`` besides dsn and table."""
        return {}

    def pipeline_source(self) -> str:
        """The ``[source]`` section's lines besides the dsn."""
        return ""

    def batch_settings(self) -> dict[str, Any]:
        """The connector's settings that bound what a batch holds in memory, small."""
        raise NotImplementedError

    def debezium(self) -> DebeziumCase | None:
        """Debezium's own output for a script on this source (None: Debezium has no
        connector for it)."""
        return None


class _Postgres(SourceUnderTest):
    def connect(self) -> Any:
        conn = sql_connection(self.dsn)
        conn.autocommit = True
        conn.execute("SET IntervalStyle = iso_8601")  # an interval's text: ISO 8601
        return conn

    def restart_server(self) -> None:
        self.extra["cluster"].restart()


class PostgresSource(_Postgres):
    """PostgreSQL through pgoutput logical replication."""

    def capture_args(self) -> list[str]:
        return ["--table", "public.mx", "--slot", self.extra["slot"], "--snapshot-mode",
                "no_data", "--heartbeat-interval-ms", "200"]

    def engine_connector(self, **settings: Any) -> tuple[str, dict[str, Any]]:
        return "PostgresConnector", {"dsn": self.dsn, "snapshot_mode": "no_data",
                                     "slot_name": self.extra["slot"],
                                     "table_include_list": ["public.mx"],
                                     "heartbeat_interval_ms": 200, **settings}

    def spark_options(self) -> dict[str, str]:
        return {"slot": self.extra["slot"] + "_spark"}

    def pipeline_source(self) -> str:
        return f'slot = "{self.extra["slot"]}_run"\n'

    def batch_settings(self) -> dict[str, Any]:
        return {"max_batch_messages": 50}

    def debezium(self) -> DebeziumCase | None:
        return postgres_case(self.dsn, self.extra["slot"])


class PostgresLogTableSource(_Postgres):
    """CDC log tables (triggers) on PostgreSQL."""

    def engine_cells(self) -> bool:
        return True

    def create(self) -> None:
        super().create()
        LogDb("postgres", self.dsn).install(["mx"], streams=max(8, self.log_groups),
                                            groups=self.log_groups)

    def capture_args(self) -> list[str]:
        return ["--source", "logtable", "--no-cells"]

    def engine_connector(self, **settings: Any) -> tuple[str, dict[str, Any]]:
        return "LogTableConnector", {"dsn": self.dsn, "poll_interval_ms": 20, **settings}

    def spark_options(self) -> dict[str, str]:
        return {"source": "logtable"}

    def pipeline_source(self) -> str:
        return 'kind = "logtable"\n'

    def batch_settings(self) -> dict[str, Any]:
        return {"max_batch_events": 50}


class SqliteLogTableSource(SourceUnderTest):
    """CDC log tables (triggers) on SQLite: a file, no server."""

    def engine_cells(self) -> bool:
        return True

    def connect(self) -> Any:
        return sqlite3.connect(self.extra["path"], isolation_level=None, timeout=30)

    def create(self) -> None:
        super().create()
        LogDb("sqlite", self.dsn, self.extra["path"]).install(
            ["mx"], streams=max(8, self.log_groups), groups=self.log_groups)

    def capture_args(self) -> list[str]:
        return ["--no-cells"]

    def engine_connector(self, **settings: Any) -> tuple[str, dict[str, Any]]:
        return "LogTableConnector", {"dsn": self.dsn, "poll_interval_ms": 20, **settings}

    def batch_settings(self) -> dict[str, Any]:
        return {"max_batch_events": 50}


class MariaDbSource(SourceUnderTest):
    """MariaDB through its binlog."""

    def connect(self) -> Any:
        return self.extra["mdb"].server.connect(self.extra["mdb"].name)

    def execute(self, *statements: Statement | str) -> None:
        # PyMySQL: no BEGIN needed, but COMMIT is; the base class's text works too.
        super().execute(*statements)

    def restart_server(self) -> None:
        self.extra["mdb"].server.restart()

    def capture_args(self) -> list[str]:
        return ["--snapshot-mode", "no_data", "--heartbeat-interval-ms", "200"]

    def engine_connector(self, **settings: Any) -> tuple[str, dict[str, Any]]:
        return "MariaDbConnector", {"dsn": self.dsn, "snapshot_mode": "no_data", **settings}

    def batch_settings(self) -> dict[str, Any]:
        return {"max_batch_events": 50, "max_transaction_rows_in_memory": 50}

    def copy_row(self, source: int, target: int, names: list[str]) -> str:
        # MariaDB has no row-valued SET; a self-join does it.
        sets = ", ".join(f"a.{name} = b.{name}" for name in names)
        return (f"UPDATE mx a JOIN mx b ON b.id = {int(source)} SET {sets} "
                f"WHERE a.id = {int(target)}")

    def debezium(self) -> DebeziumCase | None:
        return mariadb_case(self.extra["mdb"].server, self.extra["mdb"].name)


_PG_SQL = {"t": "text", "f": "double precision", "bin": "bytea", "d": "numeric(10,2)",
           "b": "boolean", "dt": "date", "ts": "timestamp(6)"}
_MARIA_SQL = {"t": "TEXT", "f": "DOUBLE", "bin": "VARBINARY(20)", "d": "DECIMAL(10,2)",
              "b": "BOOLEAN", "dt": "DATE", "ts": "DATETIME(6)"}
_SQLITE_SQL = {"t": "text", "f": "real", "bin": "blob"}

SOURCES = ("postgres", "mariadb", "postgres-logtable", "sqlite-logtable")


def make_source(name: str, request: pytest.FixtureRequest, tmp_path: Path, *,
                typed: bool = False, log_groups: int = 2) -> SourceUnderTest:
    """The matrix table on source *name* (its table made, nothing else yet); *typed*:
    the table of every type of the source's list (:meth:`SourceUnderTest.use_types`);
    *log_groups*: the stream groups of a log-table source's log."""
    source: SourceUnderTest
    if name == "mariadb":
        mdb = request.getfixturevalue("mdb")
        source = MariaDbSource(name, mdb.dsn, _typed(_MARIA_SQL, COMMON + TYPED),
                               types=MARIADB_TYPES,
                               table=f"{mdb.name}.mx", extra={"mdb": mdb},
                               refused_capture=(["--slot", "other"],
                                                "--slot applies to PostgreSQL only"))
    elif name == "sqlite-logtable":
        path = tmp_path / "app.db"
        path.touch()
        source = SqliteLogTableSource(
            name, f"sqlite:///{path}", _typed(_SQLITE_SQL, COMMON), placeholder="?",
            table="main.mx", extra={"path": path}, types=SQLITE_LOGTABLE_TYPES,
            refused_capture=(["--slot", "other"], "--slot does not apply to log tables"),
            refused_spark=("slot", "does not apply"),
            restart_refusal="a SQLite file has no server to restart")
    else:
        db = request.getfixturevalue("db")
        kind = PostgresSource if name == "postgres" else PostgresLogTableSource
        refusals: dict[str, Any] = {
            "refused_engine": ("server_id", 5),
            "refused_run": ("retention_s = 60", "retention")} if name == "postgres" else {
            "refused_capture": (["--slot", "other"], "--slot does not apply to log tables"),
            "refused_spark": ("slot", "does not apply")}
        source = kind(name, db.dsn, _typed(_PG_SQL, COMMON + TYPED),
                      types=POSTGRES_TYPES if name == "postgres" else POSTGRES_LOGTABLE_TYPES,
                      extra={"cluster": db.cluster, "slot": f"mx_{db.name}"}, **refusals)
    if typed:
        source.use_types()
    source.log_groups = log_groups
    source.create()
    return source
