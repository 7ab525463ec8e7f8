"""Every JSON line tidemark writes is JSON, whatever the value: each source's edge values
(zero dates, YEAR 0, ZEROFILL, negative and 838-hour TIME, BIT(64), DECIMAL(65,30),
±Infinity/NaN floats, numerics beyond a double, BC and year-294276 instants, infinite
intervals, unusual unicode) go through a real server, are read by the snapshot and by
the stream, and are written by every writer — the C writer, the generated Python writer,
the general Python code and, for PostgreSQL, capture's fused pgoutput path — in every
serializer mode. Each line must parse with a strict parser (no ``NaN``/``Infinity``
literals, no leading zeros, valid UTF-8), the writers must agree to the byte, and a row
must read the same snapshotted as streamed.

Hypothesis draws the rows: the edge values above and random values of each type.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import itertools
import json
import math
import time
from collections.abc import Sequence
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from capture_helpers import make_connector
from conftest import Database, MariaDatabase
from logtable_helpers import LogDb
from logtable_helpers import drain as drain_log
from logtable_helpers import reader as log_reader
from mariadb_helpers import capture as capture_mariadb
from tidemark import postgres_connection
from tidemark.event import ChangeEvent, Op, Record, TableId
from tidemark.serde.debezium_json import DebeziumJsonOptions, DebeziumJsonSerializer
from tidemark.serde.modes import DecimalHandlingMode, TimePrecisionMode
from tidemark.source.mariadb import client as mariadb_client
from tidemark.source.mariadb import snapshot as mariadb_snapshot
from tidemark.source.mariadb.config import MariaDbSourceConfig
from tidemark.source.postgres import catalog
from tidemark.source.postgres import snapshot as pg_snapshot
from tidemark.source.postgres.change_builder import ChangeEventBuilder
from tidemark.source.postgres.json_lines import JsonLineBuilder
from tidemark.source.postgres.replication import ReplicationStream

EXAMPLES = 25
# Every example is a round trip through a real server: no shrinking (minutes of it),
# the failing example is reported as drawn.
SETTINGS = settings(max_examples=EXAMPLES, deadline=None,
                    phases=[Phase.explicit, Phase.reuse, Phase.generate])
# Every decimal and time mode; interval and cell modes where a source has them.
MODES = [DebeziumJsonOptions(decimal_handling_mode=d, time_precision_mode=t)
         for d, t in itertools.product(DecimalHandlingMode, TimePrecisionMode)]
PG_MODES = [*MODES, DebeziumJsonOptions(interval_handling_mode="string"),
            DebeziumJsonOptions(decimal_handling_mode=DecimalHandlingMode.DOUBLE,
                                interval_handling_mode="string")]
LOG_MODES = [*MODES, *(DebeziumJsonOptions(decimal_handling_mode=d, cells=True)
                       for d in DecimalHandlingMode)]

# Text that JSON must escape or that is unusual: controls, quotes, the separators
# JavaScript treats as line ends, a BOM, astral characters, the last code point.
ODD_TEXT = ["", "\x00", "\x01\x1f\x7f", '"\\/', "\u2028\u2029", "\ufeff", "😀",
            "\U0010ffff", "é\u0301", "\r\n\t", "{\"a\": 1}"]
TEXT = st.sampled_from(ODD_TEXT) | st.text(
    st.characters(exclude_categories=("Cs",)), max_size=12)


def _reject(constant: str) -> Any:
    raise ValueError(f"not JSON: the literal {constant}")


def strict_json(line: str) -> Any:
    """*line* parsed as JSON, strictly: what a consumer in any language accepts."""
    line.encode("utf-8")  # a lone surrogate cannot be written out
    return json.loads(line, parse_constant=_reject)


def _split(text: str) -> list[str]:
    """Newline-terminated lines (not str.splitlines, which also splits at U+2028)."""
    assert text.endswith("\n")
    return text.split("\n")[:-1]


def _general_lines(serializer: DebeziumJsonSerializer, event: ChangeEvent) -> list[str]:
    key, value = serializer.general_key_and_value(event)
    lines = [f'{{"key":{key},"value":{value}}}\n']
    if serializer.options.tombstones_on_delete and key != "null" and event.op is Op.DELETE:
        lines.append(f'{{"key":{key},"value":null}}\n')
    return lines


def check_writers(events: Sequence[ChangeEvent], modes: Sequence[DebeziumJsonOptions]
                  ) -> dict[tuple[int, Op], dict[str, Any]]:
    """Write *events* with every writer in every mode: every line must be strict JSON
    and the writers must agree. Returns the parsed values of the first mode's lines by
    (id, op)."""
    values: dict[tuple[int, Op], dict[str, Any]] = {}
    for n, options in enumerate(modes):
        compiled = DebeziumJsonSerializer(options, compiled=True)
        generated = DebeziumJsonSerializer(options, compiled=False)
        general = DebeziumJsonSerializer(options)
        for event in events:
            lines = compiled.text_lines([event])
            for line in _split("".join(lines)):
                parsed = strict_json(line)
                if n == 0 and parsed["value"] is not None:
                    row = parsed["value"]["after"] or parsed["value"]["before"]
                    values[(row["id"], event.op)] = parsed["value"]
            assert generated.text_lines([event]) == lines, (options, event)
            assert "".join(_general_lines(general, event)) == "".join(lines), (options, event)
    return values


def _same_row(snapshotted: dict[str, Any], streamed: dict[str, Any]) -> None:
    """A snapshot row's JSON equals the streamed row's (NaN is not equal to itself)."""
    assert json.dumps(snapshotted, sort_keys=True) == json.dumps(streamed, sort_keys=True)


def _nullable(values: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.none() | values


class Column:
    """A column of a test table: its SQL type, a strategy of its values as parameters
    (None for NULL), and the SQL placeholder of a value."""

    def __init__(self, name: str, sql_type: str, values: st.SearchStrategy[Any],
                 placeholder: str = "%s") -> None:
        self.name, self.sql_type, self.values, self.placeholder = \
            name, sql_type, values, placeholder


# -- MariaDB -------------------------------------------------------------------------------
def _time_text(micros: int) -> str:
    sign = "-" if micros < 0 else ""
    seconds, fraction = divmod(abs(micros), 1_000_000)
    return f"{sign}{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}.{fraction:06d}"


_MAX_TIME_US = (838 * 3600 + 59 * 60 + 59) * 1_000_000 + 999_999
_ZERO_DATES = ["0000-00-00", "2020-00-15", "2020-01-00", "0000-01-01", "1000-01-01",
               "9999-12-31", "1970-01-01"]
_ZERO_DATETIMES = ["0000-00-00 00:00:00", "0000-00-00 00:00:00.000001",
                   "2020-00-15 01:02:03", "1000-01-01 00:00:00", "9999-12-31 23:59:59.999999"]
_DATETIMES = st.datetimes(min_value=dt.datetime(1000, 1, 1)).map(
    lambda d: d.isoformat(" "))

MARIADB_COLUMNS = [
    Column("y", "YEAR", _nullable(st.sampled_from([0, 1901, 2155, 2000])
                                  | st.integers(1901, 2155))),
    Column("yz", "YEAR NOT NULL DEFAULT 0", st.sampled_from(["0000", "0", "00", "69", "70"])),
    Column("izf", "INT(6) UNSIGNED ZEROFILL", _nullable(st.integers(0, 2**32 - 1))),
    Column("ti", "TINYINT", _nullable(st.integers(-128, 127))),
    Column("mi", "MEDIUMINT UNSIGNED", _nullable(st.integers(0, 2**24 - 1))),
    Column("bi", "BIGINT", _nullable(st.integers(-(2**63), 2**63 - 1))),
    Column("bu", "BIGINT UNSIGNED ZEROFILL", _nullable(st.integers(0, 2**64 - 1))),
    Column("f", "FLOAT", _nullable(st.sampled_from([16777217.0, 0.1, 3.4028234e38, -1.17549435e-38,
                                                    1e-45, 0.0, -0.0])
                                   | st.floats(width=32, allow_nan=False,
                                               allow_infinity=False))),
    Column("fz", "FLOAT ZEROFILL", _nullable(st.floats(0, 2.0**127, width=32))),
    Column("d", "DOUBLE", _nullable(st.sampled_from([1.7976931348623157e308, 5e-324, -0.0, 0.1])
                                    | st.floats(allow_nan=False, allow_infinity=False))),
    Column("dz", "DOUBLE ZEROFILL", _nullable(st.floats(0, 1e300))),
    Column("n65", "DECIMAL(65,30)", _nullable(
        st.sampled_from([Decimal("99999999999999999999999999999999999." + "9" * 30),
                         Decimal("-99999999999999999999999999999999999." + "9" * 30),
                         Decimal("-0." + "0" * 29 + "1"), Decimal(0)])
        | st.decimals(-10**35 + 1, 10**35 - 1, places=30))),
    Column("n650", "DECIMAL(65,0)", _nullable(st.integers(-10**65 + 1, 10**65 - 1))),
    Column("nz", "DECIMAL(10,2) ZEROFILL", _nullable(st.decimals(0, Decimal("99999999.99"),
                                                                   places=2))),
    Column("b64", "BIT(64)", _nullable(st.sampled_from([0, 1, 2**63, 2**64 - 1])
                                       | st.integers(0, 2**64 - 1))),
    Column("b1", "BIT(1)", _nullable(st.integers(0, 1))),
    Column("dt", "DATE", _nullable(st.sampled_from(_ZERO_DATES) | st.dates().map(str))),
    Column("dtn", "DATE NOT NULL", st.sampled_from(_ZERO_DATES)),
    Column("dtm", "DATETIME(6)", _nullable(st.sampled_from(_ZERO_DATETIMES) | _DATETIMES)),
    Column("dtmn", "DATETIME NOT NULL", st.sampled_from(_ZERO_DATETIMES)),
    Column("ts", "TIMESTAMP(6) NULL", _nullable(st.sampled_from(
        ["0000-00-00 00:00:00", "1970-01-01 00:00:01", "2038-01-19 03:14:07.999999"]))),
    Column("tm", "TIME(6)", _nullable(
        st.sampled_from([-_MAX_TIME_US, _MAX_TIME_US, -1, 0]) |
        st.integers(-_MAX_TIME_US, _MAX_TIME_US)).map(
            lambda v: None if v is None else _time_text(v))),
    Column("tm0", "TIME", _nullable(st.sampled_from(["-838:59:59", "838:59:59", "-00:00:01"]))),
    Column("tx", "TEXT", _nullable(TEXT)),
    Column("lat", "VARCHAR(20) CHARACTER SET latin1", _nullable(
        st.text(st.characters(codec="latin-1"), max_size=10))),
    Column("vb", "VARBINARY(16)", _nullable(st.binary(max_size=16))),
    Column("e", "ENUM('a','é','😀')", _nullable(st.sampled_from(["a", "é", "😀", ""]))),
    Column("s", "SET('x','y')", _nullable(st.sampled_from(["", "x", "x,y"]))),
    Column("j", "JSON", _nullable(st.sampled_from(['{"a": 1e400}', "[]", "null",
                                                  '"\\u2028"']))),
]


class MariaDbHarness:
    """A table with every MariaDB edge type: each round's rows are inserted and
    snapshotted, then changed (update, delete); the binlog from before the inserts is
    streamed."""

    def __init__(self, mdb: MariaDatabase) -> None:
        self.mdb = mdb
        self.conn = mdb.server.connect(mdb.name)
        self.next_id = 1
        self._sql("SET SESSION sql_mode = ''")  # zero dates and out-of-enum values allowed
        self._sql("CREATE TABLE edge (id INT PRIMARY KEY, rev INT NOT NULL DEFAULT 0, "
                  + ", ".join(f"{c.name} {c.sql_type}" for c in MARIADB_COLUMNS) + ")")
        self.config = MariaDbSourceConfig.from_mapping(
            {"dsn": mdb.dsn, "snapshot_mode": "no_data", "heartbeat_interval_ms": 200})
        _, self.offset = capture_mariadb(self.config)

    def _sql(self, statement: str, params: Any = None) -> None:
        with self.conn.cursor() as cur:
            cur.execute(statement, params)

    def check(self, rows: list[list[Any]]) -> None:
        ids = list(range(self.next_id, self.next_id + len(rows)))
        self.next_id += len(rows)
        names = ", ".join(["id", *(c.name for c in MARIADB_COLUMNS)])
        marks = ", ".join(["%s", *(c.placeholder for c in MARIADB_COLUMNS)])
        for row_id, row in zip(ids, rows, strict=True):
            self._sql(f"INSERT INTO edge ({names}) VALUES ({marks})", [row_id, *row])
        snapshot = [e for e in self._snapshot() if e.key and e.key["id"] in ids]
        assert len(snapshot) == len(rows)
        id_list = ", ".join(map(str, ids))
        self._sql(f"UPDATE edge SET rev = 1 WHERE id IN ({id_list})")
        self._sql(f"DELETE FROM edge WHERE id IN ({id_list})")
        records, self.offset = capture_mariadb(self.config, self.offset)
        stream = [e for e in _events(records) if e.table.table == "edge"]
        assert len(stream) == 3 * len(rows)
        values = check_writers([*snapshot, *stream], MODES)
        for row_id in ids:
            _same_row(values[(row_id, Op.READ)]["after"], values[(row_id, Op.CREATE)]["after"])

    def _snapshot(self) -> list[ChangeEvent]:
        conn = mariadb_client.connect(
            mariadb_client.parse_url(self.mdb.dsn), conv=mariadb_client.RAW_VALUES)
        with contextlib.closing(conn):
            position = mariadb_snapshot.begin_snapshot(conn)
            return [e for chunk in mariadb_snapshot.snapshot_events(
                conn, [TableId(self.mdb.name, "edge")], position=position, name="t",
                fetch_size=100) for e in chunk]

    def close(self) -> None:
        self.conn.close()


def _events(records: Sequence[Record]) -> list[ChangeEvent]:
    return [r for r in records if isinstance(r, ChangeEvent)]


def _rows(columns: Sequence[Column]) -> st.SearchStrategy[list[list[Any]]]:
    return st.lists(st.tuples(*(c.values for c in columns)).map(list), min_size=1,
                    max_size=4)


@pytest.mark.integration
def test_mariadb_edge_values_are_strict_json_from_every_writer(mdb: MariaDatabase) -> None:
    harness = MariaDbHarness(mdb)
    try:
        @SETTINGS
        @given(_rows(MARIADB_COLUMNS))
        def run(rows: list[list[Any]]) -> None:
            harness.check(rows)

        run()
    finally:
        harness.close()


# -- PostgreSQL ----------------------------------------------------------------------------
def _pg_float(width: int) -> st.SearchStrategy[str]:
    specials = ["NaN", "Infinity", "-Infinity", "-0", "0"]
    extremes = (["3.4028235e38", "1.4e-45", "-1.17549435e-38"] if width == 32 else
                ["1.7976931348623157e308", "5e-324", "-2.2250738585072014e-308"])
    return st.sampled_from(specials + extremes) | st.floats(
        width=width, allow_nan=False, allow_infinity=False).map(repr)


_PG_NUMERICS = st.sampled_from(
    ["NaN", "Infinity", "-Infinity", "1e400", "-1e400", "1e-400", "-1e-16383",
     "9" * 1000, "0.000000000000000000000000000001", "-0", "123.4500"]
) | st.decimals(allow_nan=False, allow_infinity=False).map(str)
_PG_TIMESTAMPS = ["infinity", "-infinity", "4713-01-01 00:00:00 BC", "0001-01-01 00:00:00 BC",
                  "0005-01-01 00:00:00", "294276-12-31 23:59:59.999999",
                  "1969-12-31 23:59:59.999999", "2000-02-29 12:00:00"]
_PG_INSTANTS = [t if "infinity" in t else t.replace(" BC", "+00 BC") if "BC" in t else t + "+00"
                for t in _PG_TIMESTAMPS] + ["0005-01-01 00:30:00+01", "2000-01-01 00:00:00-15:59"]
_PG_DATES = ["infinity", "-infinity", "4713-01-01 BC", "5874897-12-31", "0001-01-01",
             "1970-01-01"]
_PG_INTERVALS = ["infinity", "-infinity", "178000000 years", "-178000000 years",
                 "PT0.000001S", "-1 mon 2 days -00:00:01", "0"]

PG_COLUMNS = [
    Column("i2", "int2", _nullable(st.integers(-(2**15), 2**15 - 1))),
    Column("i8", "int8", _nullable(st.integers(-(2**63), 2**63 - 1))),
    Column("o", "oid", _nullable(st.integers(0, 2**32 - 1))),
    Column("f4", "real", _nullable(_pg_float(32)), "%s::real"),
    Column("f8", "double precision", _nullable(_pg_float(64)), "%s::float8"),
    Column("n", "numeric", _nullable(_PG_NUMERICS), "%s::numeric"),
    Column("n30", "numeric(65,30)", _nullable(st.decimals(-10**35 + 1, 10**35 - 1, places=30)
                                              .map(str)), "%s::numeric"),
    Column("m", "money", _nullable(st.sampled_from(["-92233720368547758.08",
                                                    "92233720368547758.07", "0"])),
           "%s::numeric::money"),
    Column("d", "date", _nullable(st.sampled_from(_PG_DATES)), "%s::date"),
    Column("ts", "timestamp", _nullable(st.sampled_from(_PG_TIMESTAMPS)), "%s::timestamp"),
    Column("ts3", "timestamp(3)", _nullable(st.sampled_from(_PG_TIMESTAMPS)), "%s::timestamp"),
    Column("tz", "timestamptz", _nullable(st.sampled_from(_PG_INSTANTS)), "%s::timestamptz"),
    Column("tz0", "timestamptz(0)", _nullable(st.sampled_from(_PG_INSTANTS)),
           "%s::timestamptz"),
    Column("t", "time", _nullable(st.sampled_from(["24:00:00", "00:00:00", "23:59:59.999999"])),
           "%s::time"),
    Column("ttz", "timetz", _nullable(st.sampled_from(["24:00:00-15:59", "00:00:00+15:59",
                                                       "12:00:00+00"])), "%s::timetz"),
    Column("iv", "interval", _nullable(st.sampled_from(_PG_INTERVALS)), "%s::interval"),
    Column("tx", "text", _nullable(TEXT.map(lambda s: s.replace("\x00", "")))),
    Column("j", "jsonb", _nullable(st.sampled_from(['{"a": 1e400}', "[]", "null",
                                                   '"\\u2028"', "-0"])), "%s::jsonb"),
    Column("by", "bytea", _nullable(st.binary(max_size=8))),
    Column("f8a", "float8[]", _nullable(st.lists(_nullable(_pg_float(64)), max_size=3)),
           "%s::float8[]"),
    Column("na", "numeric[]", _nullable(st.lists(_nullable(_PG_NUMERICS), max_size=3)),
           "%s::numeric[]"),
    Column("tza", "timestamptz[]", _nullable(st.lists(st.sampled_from(_PG_INSTANTS),
                                                      max_size=2)), "%s::timestamptz[]"),
    Column("iva", "interval[]", _nullable(st.lists(st.sampled_from(_PG_INTERVALS), max_size=2)),
           "%s::interval[]"),
]


class PostgresHarness:
    """A table with PostgreSQL's edge types and one slot: each round's rows are
    snapshotted, then changed and streamed; the stream's pgoutput messages go through
    the general path (change builder, then each writer) and capture's fused path."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.next_id = 1
        db.execute("CREATE TABLE edge (id int PRIMARY KEY, rev int NOT NULL DEFAULT 0, "
                   + ", ".join(f"{c.name} {c.sql_type}" for c in PG_COLUMNS) + ")")
        # The connector makes the publication and the slot; its stream is not used.
        connector = make_connector(db.dsn, "public.edge", snapshot_mode="no_data",
                                   slot_name="edge", publication_name="edge")
        connector.start()
        try:
            connector.poll()
        finally:
            connector.stop()
        self.conn = postgres_connection.connect(db.dsn)
        table = TableId("public", "edge")
        keys = catalog.primary_keys(self.conn, [table])
        not_null = {table: catalog.not_null_columns(self.conn, table)}
        self.schema = catalog.table_schema(self.conn, table, keys.get(table))

        def factory() -> ChangeEventBuilder:
            return ChangeEventBuilder(
                topic_prefix="t", database=db.name, key_columns=keys.get,
                type_info=lambda oid: catalog.type_info(self.conn, oid),
                captured=frozenset([table]), not_null_columns=not_null.get)

        # One builder per path and mode for the whole run: a Relation message comes
        # once per replication session.
        self.events = factory()
        self.lines = [JsonLineBuilder(factory(), DebeziumJsonSerializer(o)) for o in PG_MODES]
        self.stream = ReplicationStream(db.dsn, "edge", "edge")
        self.stream.start(0)

    def check(self, rows: list[list[Any]]) -> None:
        ids = list(range(self.next_id, self.next_id + len(rows)))
        self.next_id += len(rows)
        names = ", ".join(["id", *(c.name for c in PG_COLUMNS)])
        marks = ", ".join(["%s", *(c.placeholder for c in PG_COLUMNS)])
        for row_id, row in zip(ids, rows, strict=True):
            self.db.execute(f"INSERT INTO edge ({names}) VALUES ({marks})",
                            params=[row_id, *row])
        snapshot = [e for e in self._snapshot() if e.key and e.key["id"] in ids]
        assert len(snapshot) == len(rows)
        id_list = ", ".join(map(str, ids))
        self.db.autocommit(f"UPDATE edge SET rev = 1 WHERE id IN ({id_list})",
                           f"DELETE FROM edge WHERE id IN ({id_list})")
        messages = self._messages(self.db.insert_lsn())
        now_us = time.time_ns() // 1000
        stream = _events(self.events.process(messages, now_us))
        assert len(stream) == 3 * len(rows)
        values = check_writers([*snapshot, *stream], PG_MODES)
        for row_id in ids:
            _same_row(values[(row_id, Op.READ)]["after"], values[(row_id, Op.CREATE)]["after"])
        for options, fused in zip(PG_MODES, self.lines, strict=True):
            lines = fused.process(messages, now_us)
            assert fused.fallbacks == 0
            for line in _split("".join(lines)):
                strict_json(line)
            # What the general path writes for the same events, byte for byte.
            assert "".join(lines) == "".join(
                DebeziumJsonSerializer(options).text_lines(stream)), options

    def _messages(self, end: int) -> list[tuple[bytes, int]]:
        messages: list[tuple[bytes, int]] = []
        deadline = time.monotonic() + 30
        while self.stream.wal_end < end or not messages:
            assert time.monotonic() < deadline, "the stream did not reach the changes"
            messages += self.stream.read_batch(10_000, 0.2)
            self.stream.request_keepalive()
        messages += self.stream.read_batch(10_000, 0.1)
        return messages

    def _snapshot(self) -> list[ChangeEvent]:
        conn = postgres_connection.connect(self.db.dsn)
        with contextlib.closing(conn):
            txid = pg_snapshot.begin_snapshot(conn, None)
            return [e for chunk in pg_snapshot.snapshot_events(
                conn, [self.schema], topic_prefix="t", database=self.db.name, lsn=0,
                txid=txid, ts_us=time.time_ns() // 1000, fetch_size=100) for e in chunk]

    def close(self) -> None:
        self.stream.close()
        self.conn.close()
        self.db.execute("SELECT pg_drop_replication_slot('edge')")


@pytest.mark.integration
def test_postgres_edge_values_are_strict_json_from_every_writer(db: Database) -> None:
    harness = PostgresHarness(db)
    try:
        @SETTINGS
        @given(_rows(PG_COLUMNS))
        def run(rows: list[list[Any]]) -> None:
            harness.check(rows)

        run()
    finally:
        harness.close()


# -- log tables (PostgreSQL, SQLite) -------------------------------------------------------
def _sqlite_real() -> st.SearchStrategy[float]:
    # NaN is stored as NULL by SQLite; the infinities are stored.
    return st.sampled_from([math.inf, -math.inf, -0.0, 5e-324, 1.7976931348623157e308]) \
        | st.floats(allow_nan=False)


# (name, SQLite type, PostgreSQL type, values, PostgreSQL placeholder)
_LOG_COLUMNS: list[tuple[str, str, str, st.SearchStrategy[Any], str]] = [
    ("i", "INTEGER", "int8", st.integers(-(2**63), 2**63 - 1), "%s"),
    ("r", "REAL", "float8", _sqlite_real(), "%s::float8"),
    # SQLite: stored as text (NaN), integer, or real (1e+20, 1e-07, inf); PostgreSQL:
    # numeric.
    ("n", "NUMERIC", "numeric", st.sampled_from(["NaN", "1e20", "1e-7", "-0", "0.10", "1e400",
                                                 "-1e400"])
     | st.integers(-(2**63), 2**63 - 1).map(str)
     | st.floats(allow_nan=False, allow_infinity=False).map(repr), "%s::numeric"),
    ("dec", "DECIMAL(10,2)", "numeric(10,2)", st.decimals(-10**7, 10**7, places=2).map(str),
     "%s::numeric"),
    ("tx", "TEXT", "text", TEXT.map(lambda s: s.replace("\x00", "")), "%s"),
    ("bl", "BLOB", "bytea", st.binary(max_size=8), "%s"),
    ("b", "BOOLEAN", "boolean", st.booleans(), "%s"),
]


class LogTableHarness:
    """A table with a log on PostgreSQL or SQLite: each round's rows are inserted,
    updated and deleted, and read from the log."""

    def __init__(self, log: LogDb) -> None:
        self.log = log
        self.next_id = 1
        sqlite = log.kind == "sqlite"
        self.columns = [Column(name, lite if sqlite else pg, _nullable(values),
                               "?" if sqlite else mark)
                        for name, lite, pg, values, mark in _LOG_COLUMNS]
        key = "INTEGER PRIMARY KEY" if sqlite else "int PRIMARY KEY"
        log.execute(f"CREATE TABLE edge (id {key}, rev INTEGER NOT NULL DEFAULT 0, "
                    + ", ".join(f"{c.name} {c.sql_type}" for c in self.columns) + ")")
        log.install(["edge"])
        self.reader = log_reader(log, table_include_list=["edge"])
        drain_log(self.reader)

    def check(self, rows: list[list[Any]]) -> None:
        ids = list(range(self.next_id, self.next_id + len(rows)))
        self.next_id += len(rows)
        names = ", ".join(["id", *(c.name for c in self.columns)])
        marks = ", ".join(["?" if self.log.kind == "sqlite" else "%s",
                           *(c.placeholder for c in self.columns)])
        id_list = ", ".join(map(str, ids))
        with self.log.connection() as conn:
            cur = conn.cursor()
            for row_id, row in zip(ids, rows, strict=True):
                cur.execute(f"INSERT INTO edge ({names}) VALUES ({marks})", [row_id, *row])
            cur.execute(f"UPDATE edge SET rev = 1 WHERE id IN ({id_list})")
            cur.execute(f"DELETE FROM edge WHERE id IN ({id_list})")
        stream = drain_log(self.reader)
        assert len(stream) == 3 * len(rows)
        check_writers(stream, LOG_MODES)

    def close(self) -> None:
        self.reader.stop()


@pytest.mark.integration
def test_log_table_edge_values_are_strict_json_from_every_writer(logdb: LogDb) -> None:
    harness = LogTableHarness(logdb)
    try:
        @SETTINGS
        @given(st.data())
        def run(data: st.DataObject) -> None:
            harness.check(data.draw(_rows(harness.columns)))

        run()
    finally:
        harness.close()
