"""The compiled pgoutput -> JSON line writer (``_pgoutput_line``) must write exactly what
the generated Python code it stands for writes, and what the general path writes.

On a real PostgreSQL stream: every PostgreSQL type of ``tests/type_lists.py`` (inserted,
updated, deleted, and NULL), and a table of the kinds the writer handles in C with
their extremes (control characters, quotes, non-ASCII text, unchanged TOASTed values,
NaN and infinities, numerics of 38 digits, timestamps with every fraction and offset,
dates before Christ), in every serializer mode.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
from test_json_lines import MODES, NOW_US, BuilderFactory, Messages

from capture_helpers import make_connector
from conftest import Database
from tidemark import postgres_connection
from tidemark.event import TableId
from tidemark.serde.debezium_json import DebeziumJsonOptions, DebeziumJsonSerializer
from tidemark.source.postgres import catalog
from tidemark.source.postgres.change_builder import ChangeEventBuilder
from tidemark.source.postgres.json_lines import JsonLineBuilder
from tidemark.source.postgres.pgoutput_json import COMPILED_LINES
from tidemark.source.postgres.replication import ReplicationStream
from type_lists import POSTGRES_TYPES

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not COMPILED_LINES, reason="_pgoutput_line is not built"),
]

_EDGE_COLUMNS = (
    "id bigint PRIMARY KEY, s text, v varchar(40), big text, n numeric(12,2), "
    "w numeric(38,4), u numeric, tz timestamptz, tz3 timestamptz(3), tz0 timestamptz(0), "
    "d date, f float8, r real, b bool, i int, si smallint")
_TEXTS = ["", "plain", "quote \" backslash \\ slash /", "naïve é ☃ 😀 \u2028 \x7f",
          "".join(chr(c) for c in range(1, 32)), "tab\tnewline\ncr\rbs\bff\f"]
_EDGE_ROWS = [
    ("9223372036854775807", "1234567890.12", "99999999999999999999999999999999.9999",
     "'NaN'", "'infinity'", "'infinity'", "'-infinity'", "'infinity'", "'NaN'", "'NaN'",
     "true", "2147483647", "32767"),
    ("-9223372036854775808", "-0.01", "-99999999999999999999999999999999.9999",
     "'-Infinity'", "'-infinity'", "'2024-01-02 03:04:05.1+05:30'",
     "'2024-01-02 03:04:05.123456+00'", "'4713-01-01 BC'", "'Infinity'", "'-Infinity'",
     "false", "-2147483648", "-32768"),
    ("0", "0.00", "0.0000", "'1e-30'", "'2024-01-02 03:04:05.123456+00'",
     "'0001-01-01 00:00:00+00 BC'", "'2024-01-02 03:04:05-08'", "'294276-12-31'",
     "'1e-300'", "'1e30'", "NULL", "0", "0"),
    ("1", "'NaN'", "0.0001", "'123456789012345678901234567890.123456789'",
     "'1970-01-01 00:00:00+00'", "'2024-06-30 23:59:59.999+00'", "'2024-02-29 12:00:00+00'",
     "'2024-02-29'", "'-0'", "'0.001'", "true", "1", "1"),
    ("2", "-1.5", "1.0000", "'0.000001'", "'2024-01-02 03:04:05.1+00'",
     "'2024-01-02 03:04:05.12+00'", "'2024-01-02 03:04:05+00'", "'1999-12-31'",
     "'1e7'", "'9999999'", "false", "-1", "-1"),
    ("3", "7", "-7", "'7'", "'2024-01-02 03:04:05.000001+00'", "NULL", "NULL", "'0001-01-01'",
     "'7'", "'-1234567'", "true", "7", "7"),
    ("4", "100", "0", "'-0'", "NULL", "NULL", "NULL", "NULL", "'0'", "'12345678'", "NULL",
     "0", "0"),
]


def _edge_statements() -> list[str]:
    out = []
    for n, row in enumerate(_EDGE_ROWS):
        key, *rest = row
        text = _TEXTS[n % len(_TEXTS)].replace("'", "''")
        label = _TEXTS[(n + 1) % len(_TEXTS)][:40].replace("'", "''")
        out.append(f"INSERT INTO edge VALUES ({key}, E'{_escape_sql(text)}', "
                   f"E'{_escape_sql(label)}', repeat('x', 100000), {', '.join(rest)})")
    out += [
        f"INSERT INTO edge (id) VALUES ({len(_EDGE_ROWS) + 10})",  # every other column NULL
        # The TOASTed column unchanged (sent as 'u'), the others changed.
        "UPDATE edge SET s = s || E'\\x01', n = n + 1 WHERE id <> 1",
        "UPDATE edge SET s = NULL, v = '', f = 'NaN' WHERE id = 0",
        "DELETE FROM edge WHERE id IN (0, 2)",
    ]
    return out


def _escape_sql(text: str) -> str:
    """*text* inside E'…': backslashes and control characters as escapes."""
    return "".join(c if ord(c) >= 32 and c != "\\" else f"\\x{ord(c):02x}" for c in text)


@pytest.fixture(scope="module")
def stream(pg_cluster: Any) -> Iterator[tuple[Messages, BuilderFactory]]:
    """The pgoutput messages of the type list's table and the edge table, and a
    factory of change builders for them."""
    name = "compiled_lines"
    pg_cluster.create_database(name)
    try:
        db = Database(pg_cluster, name)
        db.execute(*POSTGRES_TYPES.prelude, f"CREATE TABLE t ({POSTGRES_TYPES.columns})",
                   f"CREATE TABLE edge ({_EDGE_COLUMNS})",
                   "ALTER TABLE edge ALTER COLUMN big SET STORAGE EXTERNAL")
        tables = ["public.t", "public.edge"]
        connector = make_connector(db.dsn, *tables, snapshot_mode="no_data",
                                   slot_name=name, publication_name=name)
        connector.start()
        try:
            connector.poll()
        finally:
            connector.stop()
        db.autocommit(
            "INSERT INTO t VALUES " + POSTGRES_TYPES.row % (1, "'NaN'"),
            "INSERT INTO t VALUES " + POSTGRES_TYPES.row % (2, "-0.000123"),
            "INSERT INTO t VALUES " + POSTGRES_TYPES.row % (3, "'Infinity'"),
            "INSERT INTO t (id) VALUES (4)",
            "UPDATE t SET nn = 12345678901234567890.5 WHERE id = 1",
            "DELETE FROM t WHERE id = 2",
            *_edge_statements(),
        )
        end = db.insert_lsn()
        messages: Messages = []
        reader = ReplicationStream(db.dsn, name, name)
        reader.start(0)
        try:
            while not messages or reader.wal_end < end:
                messages += reader.read_batch(10_000, 0.5)
                reader.request_keepalive()
            messages += reader.read_batch(10_000, 0.2)
        finally:
            reader.close()
        conn = postgres_connection.connect(db.dsn)
        ids = [TableId.parse(t) for t in tables]
        keys = catalog.primary_keys(conn, ids)
        not_null = {t: catalog.not_null_columns(conn, t) for t in ids}

        def factory() -> ChangeEventBuilder:
            return ChangeEventBuilder(topic_prefix="p", database=name,
                                      key_columns=keys.get,
                                      type_info=lambda oid: catalog.type_info(conn, oid),
                                      captured=frozenset(ids), not_null_columns=not_null.get)

        try:
            yield messages, factory
        finally:
            conn.close()
    finally:
        with contextlib.suppress(Exception):
            Database(pg_cluster, name).execute(f"SELECT pg_drop_replication_slot('{name}')")
        pg_cluster.drop_database(name)


def _lines(builder: JsonLineBuilder, messages: Messages, batch: int) -> str:
    return "".join("".join(builder.process(messages[i:i + batch], NOW_US + i))
                   for i in range(0, len(messages), batch))


@pytest.mark.parametrize("batch", [1, 100_000])
@pytest.mark.parametrize("mode", MODES)
def test_compiled_lines_equal_the_generated_code_and_the_general_path(
        stream: tuple[Messages, BuilderFactory], mode: dict[str, Any], batch: int) -> None:
    messages, factory = stream
    options = DebeziumJsonOptions(**mode)
    compiled = JsonLineBuilder(factory(), DebeziumJsonSerializer(options))
    generated = JsonLineBuilder(factory(), DebeziumJsonSerializer(options), compiled=False)
    got, reference = _lines(compiled, messages, batch), _lines(generated, messages, batch)
    general = DebeziumJsonSerializer(options).encode_lines(
        factory().process(messages, NOW_US)).decode()
    assert got.count("\n") == 24 + (3 if options.tombstones_on_delete else 0)  # 3 deletes
    assert "\\u0001" in got and "😀" in got and '"__debezium_unavailable_value"' in got
    assert got == reference
    if batch == 100_000:  # one processing time: the general path's ts fields match
        assert got == general
    # Every row was written by the compiled writer, none left to the general path.
    assert compiled._codecs and all(codec.compiled for codec in compiled._codecs.values())
    assert not any(codec.compiled for codec in generated._codecs.values())
    assert compiled.fallbacks == 0 and generated.fallbacks == 0
