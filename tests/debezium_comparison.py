"""Comparing tidemark's JSON lines with Debezium 3.6.3's references, shared by the
sources' Debezium conformance tests (tests/source/postgres/test_debezium_conformance.py,
tests/source/mariadb/test_mariadb_conformance.py) and the conformance matrix's
``debezium`` check (tests/conformance/): the deliberate differences of each connector
(``POSTGRES_ALLOWED``, ``MARIADB_ALLOWED``, the list in docs/debezium-format.md) and the
record-by-record comparison, in order (PostgreSQL) or paired by table, op and key
(MariaDB, so that a missing record is reported as such).

Both sides are normalized first (``tidemark.testing.debezium_reference`` and
``…_mariadb``); an allowed difference that no longer occurs is reported as stale, so the
lists stay true.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tidemark.testing.debezium_reference import Difference, Obj, differences, dump, parse


@dataclass(frozen=True)
class Allowed:
    """A deliberate difference: at paths matching *path* (a regular expression over
    ``key…``/``value…``/``topic``, or ``records`` for records missing or extra), of this
    *kind*, where the reference's JSON text matches *expected* and tidemark's *got*
    (None: any), in these runs (None: all)."""

    path: str
    kind: str
    reason: str
    expected: str | None = None
    got: str | None = None
    runs: tuple[str, ...] | None = None

    def applies(self, run: str) -> bool:
        return self.runs is None or run in self.runs

    def matches(self, run: str, difference: Difference) -> bool:
        return (difference.kind == self.kind and self.applies(run)
                and re.fullmatch(self.path, difference.path) is not None
                and (self.expected is None
                     or re.fullmatch(self.expected, difference.expected) is not None)
                and (self.got is None or re.fullmatch(self.got, difference.got) is not None))


#: Deliberate differences from Debezium 3.6.3's PostgreSQL connector, one line of reason
#: each (the list in docs/debezium-format.md). Each must still occur.
POSTGRES_ALLOWED: tuple[Allowed, ...] = (
    Allowed(r"value\.source\.version", "value",
            "source.version names tidemark and its version, not a Debezium release"),
    Allowed(r"value\.transaction", "members",
            "tidemark's transaction block ends with commit_lsn, commit_ts_ms, commit_ts_us",
            runs=("transaction-metadata",)),
    Allowed(r"value\.source\.sequence", "value",
            "first transaction after a fresh start: tidemark's lastCommitLsn is the start "
            "position, Debezium's null, so that source.sequence keeps growing over restarts",
            expected=r'"\[null,\\"<lsn>\\"\]"'),
    Allowed(r"value\.(after|before)\.(note|n|status)", "value",
            "a column's DEFAULT is not written for a null or missing value (Debezium's "
            "replace.null.with.default: 'none', 7, 'new' for the table nn's NULLs)",
            expected=r'"none"|7|"new"'),
)

#: Deliberate differences from Debezium 3.6.3's MySQL connector (the reference's; see
#: tests/reference/mariadb/README.md), one line of reason each. Each must still occur.
MARIADB_ALLOWED: tuple[Allowed, ...] = (
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


def _without_topic(node: Any) -> Obj:
    assert isinstance(node, Obj)
    node.members = [(k, v) for k, v in node.members if k != '"topic"']
    return node


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


def differences_in_order(reference: Sequence[str], got: Sequence[str], *, topics: bool
                         ) -> list[tuple[int, Difference]]:
    """Every difference of record *n* (1-based) with record *n*; a count that differs is
    one ``records`` difference naming the first extra record."""
    out: list[tuple[int, Difference]] = []
    for n, (expected_text, got_text) in enumerate(zip(reference, got, strict=False), 1):
        expected, actual = parse(expected_text), parse(got_text)
        assert isinstance(expected, Obj) and isinstance(actual, Obj)
        if not topics:
            expected = _without_topic(expected)
        out += [(n, d) for d in differences(expected, actual)]
    if len(reference) != len(got):
        extra = list(reference) + list(got)
        out.append((min(len(reference), len(got)) + 1, Difference(
            "records", "records", f"{len(reference)} records",
            f"{len(got)} records; the first extra: "
            f"{extra[min(len(reference), len(got))][:300]}")))
    return out


def differences_paired(reference: Sequence[str], got: Sequence[str]
                       ) -> list[tuple[int, Difference]]:
    """Every difference, with the number of the reference's record (1-based); records
    are paired by table, op and key first (topics are not compared)."""
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


def explain(found: list[tuple[int, Difference]], allowed: Sequence[Allowed], run: str
            ) -> tuple[list[tuple[int, Difference]], list[str]]:
    """The differences no entry of *allowed* explains, and the reasons of the entries
    (that apply to *run*) no difference used: stale ones."""
    unexplained: list[tuple[int, Difference]] = []
    used: set[Allowed] = set()
    for n, difference in found:
        entry = next((a for a in allowed if a.matches(run, difference)), None)
        if entry is None:
            unexplained.append((n, difference))
        else:
            used.add(entry)
    return unexplained, [a.reason for a in allowed if a.applies(run) and a not in used]


def report(unexplained: list[tuple[int, Difference]]) -> str:
    """The differences grouped by path (array indexes elided), with one example each."""
    groups: dict[str, list[str]] = {}
    for n, difference in unexplained:
        groups.setdefault(re.sub(r"\[\d+\]", "[]", difference.path), []).append(
            f"record {n}: {difference}")
    return f"{len(unexplained)} differences from Debezium:\n" + "\n".join(
        f"  {len(lines)}x {where}\n      e.g. {lines[0][:400]}"
        for where, lines in groups.items())


def assert_same_as_debezium(found: list[tuple[int, Difference]],
                            allowed: Sequence[Allowed], run: str) -> None:
    """Fail naming every unexplained difference, then every stale allowed one."""
    unexplained, stale = explain(found, allowed, run)
    assert not unexplained, report(unexplained)
    assert not stale, f"allowed differences that no longer occur (remove them): {stale}"
