"""tidemark's JSON against Debezium's own, captured from the same SQL script.

``tests/reference/debezium-3.6.3/<run>.jsonl`` holds what Debezium 3.6.3's PostgreSQL
connector emitted for ``tests/reference/debezium_script.sql`` (written by
``scripts/debezium_reference.py``; no Java is needed here). Each test runs the script on
the fixtures' PostgreSQL, captures it with tidemark with the run's settings, normalizes
both the same way (``tidemark.testing.debezium_reference``: times, LSNs, transaction ids
and the database name become placeholders) and compares them record by record, member by
member and in order, on the JSON text (numbers and strings as written).

tidemark is captured four ways, all of which must write the same JSON:

* ``serializer``: change events through ``DebeziumJsonSerializer`` (the compiled writer);
* ``serializer-python``: the same events through the generated Python writer;
* ``capture``: what ``tidemark capture`` writes without transaction metadata, JSON lines
  made straight from the pgoutput bytes (the connector's ``json_lines``);
* ``engine``: the embedded engine's Debezium JSON records, whose topics are compared too.

``TIDEMARK_CONFORMANCE_DUMP=<dir>`` keeps tidemark's output, raw and normalized, there.

A difference either is a bug to fix or is listed in ``ALLOWED`` with its reason (they
are the list in docs/debezium-format.md, "Where tidemark's JSON differs"); an entry
that no longer matches anything fails the test too, so the list stays true.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from capture_helpers import drain, make_connector
from conftest import Database
from debezium_comparison import POSTGRES_ALLOWED, assert_same_as_debezium, differences_in_order
from tidemark.engine.converters import DebeziumJsonConverter
from tidemark.engine.engine import Engine
from tidemark.event import ChangeEvent, Op
from tidemark.offsets.memory import MemoryOffsetStore
from tidemark.serde.debezium_json import (
    COMPILED_RENDERER,
    DebeziumJsonOptions,
    DebeziumJsonSerializer,
    java_float_text,
)
from tidemark.serde.modes import DecimalHandlingMode, TimePrecisionMode
from tidemark.source.postgres.reader import PostgresReader
from tidemark.source.postgres.task import PostgresConnector
from tidemark.testing.debezium_reference import (
    END_PREFIX,
    RUNS,
    TABLES,
    Obj,
    ReferenceRun,
    differences,
    dump,
    load_script,
    normalize_lines,
    parse,
    run_statements,
)
from tidemark.testing.sink import MemorySink

# Run on every PostgreSQL version CI tests (scripts/test.sh).
pytestmark = pytest.mark.every_pg_version

REFERENCE = Path(__file__).parents[2] / "reference"
SCRIPT = load_script(REFERENCE / "debezium_script.sql")
REFERENCE_DIR = REFERENCE / "debezium-3.6.3"


ALLOWED = POSTGRES_ALLOWED


# -- capturing with tidemark ----------------------------------------------------------------
def _options(run: ReferenceRun) -> DebeziumJsonOptions:
    settings = run.tidemark_settings()
    return DebeziumJsonOptions(
        topic_prefix=settings["topic_prefix"],
        decimal_handling_mode=DecimalHandlingMode(settings["decimal_handling_mode"]),
        time_precision_mode=TimePrecisionMode(settings["time_precision_mode"]),
        transaction_metadata=settings["provide_transaction_metadata"],
    )


def _is_end(record: Any) -> bool:
    return isinstance(record, ChangeEvent) and record.op is Op.MESSAGE \
        and record.message_prefix == END_PREFIX


def capture_records(db: Database, run: ReferenceRun,
                    serializer: DebeziumJsonSerializer | None = None) -> list[Any]:
    """The script's records as the connector delivers them: events, or with *serializer*
    (``tidemark capture``'s fast path) JSON lines as well."""
    db.execute(*SCRIPT.setup)
    config = make_connector(db.dsn, *TABLES, **run.tidemark_settings()).config
    connector = PostgresReader(config, json_lines=serializer)
    connector.start()
    try:
        out: list[Any] = drain(connector, db.insert_lsn())
        run_statements(db.dsn, SCRIPT.stream)
        for batch in _batches(connector, db.insert_lsn()):
            out += batch
    finally:
        connector.stop()
    return out


def _batches(connector: Any, until_lsn: int, timeout_s: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        batch = connector.poll()
        yield [*batch.records, *(batch.lines or [])]
        if batch.offset is not None:
            connector.commit(batch.offset)
            if batch.offset["lsn"] >= until_lsn:
                return
    raise AssertionError(f"the capture did not reach {until_lsn} in {timeout_s} s")


def capture_serializer(db: Database, run: ReferenceRun, *, compiled: bool) -> list[str]:
    records = capture_records(db, run)
    serializer = DebeziumJsonSerializer(_options(run), compiled=compiled)
    return serializer.encode_lines(records).decode().splitlines()


def capture_lines(db: Database, run: ReferenceRun) -> list[str]:
    """As ``tidemark capture`` writes them: a batch's records through the serializer, its
    lines as they are."""
    serializer = DebeziumJsonSerializer(_options(run))
    out: list[str] = []
    for item in capture_records(db, run, serializer):
        if isinstance(item, str):
            out += item.splitlines()
        else:
            out += serializer.encode_lines([item]).decode().splitlines()
    return out


def capture_engine(db: Database, run: ReferenceRun) -> list[str]:
    """The embedded engine's records, as ``{"topic":…,"key":…,"value":…}`` lines."""
    db.execute(*SCRIPT.setup)
    sink = MemorySink()
    connector = PostgresConnector({"dsn": db.dsn, "table_include_list": list(TABLES),
                                         **run.tidemark_settings()})
    engine = Engine(connector, sink, config={"offset_flush_interval_ms": 0},
                    converter=DebeziumJsonConverter(_options(run)),
                    offset_store=MemoryOffsetStore())
    thread = threading.Thread(target=engine.run, daemon=True)
    thread.start()
    try:
        _wait_for(lambda: any('"snapshot":"last"' in (r.value or "") for r in sink.records),
                  "the snapshot")
        run_statements(db.dsn, SCRIPT.stream)
        _wait_for(lambda: any(f'"prefix":"{END_PREFIX}"' in (r.key or "")
                              for r in sink.records), "the end of the script")
    finally:
        engine.close()
        thread.join(30)
    assert engine.error is None
    return [f'{{"topic":"{r.destination}","key":{r.key or "null"},"value":{r.value or "null"}}}'
            for r in sink.records]


def _wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


CAPTURES: dict[str, Callable[[Database, ReferenceRun], list[str]]] = {
    "serializer": lambda db, run: capture_serializer(db, run, compiled=True),
    "serializer-python": lambda db, run: capture_serializer(db, run, compiled=False),
    "capture": capture_lines,
    "engine": capture_engine,
}


# tidemark capture writes events with transaction metadata through the serializer: the
# 'serializer' case is its case there.
CASES = [(run, how) for run in RUNS for how in CAPTURES
         if not (how == "capture" and run.transaction_metadata)]


@pytest.mark.integration
@pytest.mark.parametrize(("run", "how"), CASES, ids=[f"{r.name}-{h}" for r, h in CASES])
def test_same_json_as_debezium(run: ReferenceRun, how: str, db: Database) -> None:
    if how == "serializer" and not COMPILED_RENDERER:
        pytest.fail("the compiled event writer is not built")
    reference = (REFERENCE_DIR / f"{run.name}.jsonl").read_text().splitlines()
    raw = CAPTURES[how](db, run)
    got = normalize_lines(raw)
    if dump_dir := os.environ.get("TIDEMARK_CONFORMANCE_DUMP"):  # for a closer look
        for name, lines in (("raw", raw), ("normalized", got)):
            path = Path(dump_dir) / f"{run.name}.{how}.{name}.jsonl"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("".join(f"{line}\n" for line in lines))
    found = differences_in_order(reference, got, topics=how == "engine")
    assert_same_as_debezium(found, ALLOWED, run.name)


# -- the pieces, without a database ------------------------------------------------------------
def test_parse_and_dump_keep_the_text() -> None:
    text = '{"b":1.0E10,"a":[1,-0.5e-3,"\\u00e9\\n",{}],"c":{"x":null,"y":true},"d":[]}'
    tree = parse(text)
    assert isinstance(tree, Obj) and tree.names() == ["b", "a", "c", "d"]
    assert dump(tree) == text
    for bad in ('{"a":1,}', '{"a" 1}', "[1 2]", '{"a":01}', '"x" "y"', ""):
        with pytest.raises(ValueError):
            parse(bad)


def test_differences_name_the_path_and_the_order() -> None:
    expected, got = parse('{"a":{"x":[],"y":1},"b":[1,2]}'), parse('{"a":{"y":1,"x":[]},"b":[1,3]}')
    found = {(d.path, d.kind) for d in differences(expected, got)}
    assert found == {("a", "members"), ("b[1]", "value")}


@pytest.mark.parametrize(("text", "java"), [
    ("1.5", "1.5"), ("0.1", "0.1"), ("100", "100.0"), ("0", "0.0"), ("-0", "-0.0"),
    ("0.001", "0.001"), ("0.0001", "1.0E-4"), ("1234567", "1234567.0"), ("1e+07", "1.0E7"),
    ("123456789.125", "1.23456789125E8"), ("1e-05", "1.0E-5"), ("-2.5e-07", "-2.5E-7"),
    ("1e+300", "1.0E300"), ("NaN", '"NaN"'), ("-Infinity", '"-Infinity"'),
])
def test_floats_are_written_as_java_writes_them(text: str, java: str) -> None:
    assert java_float_text(text) == java
