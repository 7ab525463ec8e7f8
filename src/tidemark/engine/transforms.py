"""Single-record transformations, applied in order before conversion.

A transform takes a :class:`ChangeRecord` and returns it (changed or not), a new one, or
None to drop it. Transforms run in the worker pool, so they must not keep per-stream
state that depends on order; the ones here only cache per table schema.
"""

from __future__ import annotations

import hashlib
import re
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from typing import ClassVar, Protocol

import msgspec

from tidemark.engine.java_replacement import parse_replacement, replace_first
from tidemark.engine.records import ChangeRecord, DeleteHandling, Flatten
from tidemark.errors import ConfigError
from tidemark.event import UNAVAILABLE, ChangeEvent, Column, Op, TableSchema, WireTuple
from tidemark.logical_type import STRING

_HASHES = tuple(sorted(a for a in hashlib.algorithms_guaranteed if not a.startswith("shake")))
_MAX_RENAMED = 10_000  # a Route's cache of renamed destinations
_FLATTEN_FIELDS = ("op", "table", "schema", "db", "lsn", "txId", "source_ts_ms", "ts_ms")


class Transform(Protocol):
    """One step of the transformation chain.

    A transform that never replaces ``record.event`` (it may drop the record, change
    its destination or flatten it) may say so with a class attribute
    ``keeps_event = True``: with only such transforms, sources may hand the engine
    events whose JSON they wrote already (see :mod:`tidemark.engine.prerender`).
    """

    def __call__(self, record: ChangeRecord) -> ChangeRecord | None: ...


def apply_transforms(transforms: Sequence[Transform],
                     records: Iterable[ChangeRecord]) -> list[ChangeRecord]:
    """Run every record through the chain, dropping those a transform drops."""
    out: list[ChangeRecord] = []
    for record in records:
        current: ChangeRecord | None = record
        for transform in transforms:
            current = transform(current)  # type: ignore[arg-type]  # None breaks out
            if current is None:
                break
        if current is not None:
            out.append(current)
    return out


class Filter:
    """Keep the change events that match; transaction BEGIN/END records always pass.

    ``ops``: operation codes to keep (``"c"``, ``"u"`` …); ``tables``: regular
    expressions matched against ``schema.table``; ``predicate``: any test of the event.
    All given conditions must hold.
    """

    def __init__(self, predicate: Callable[[ChangeEvent], bool] | None = None, *,
                 ops: Iterable[str] | None = None, tables: Iterable[str] | None = None) -> None:
        self._predicate = predicate
        self._ops = None if ops is None else frozenset(_checked_op(op) for op in ops)
        self._tables = None if tables is None else [_regex("tables", t) for t in tables]

    keeps_event: ClassVar[bool] = True

    def __call__(self, record: ChangeRecord) -> ChangeRecord | None:
        event = record.event
        if not isinstance(event, ChangeEvent):
            return record
        if self._ops is not None and event.op.value not in self._ops:
            return None
        if self._tables is not None:
            name = f"{event.table.schema}.{event.table.table}"
            if not any(t.fullmatch(name) for t in self._tables):
                return None
        if self._predicate is not None and not self._predicate(event):
            return None
        return record


class Route:
    """Rename destinations like Kafka Connect's ``RegexRouter``: where *regex* matches
    the whole destination, the first match of *regex* in it is replaced by
    *replacement*, in Java's syntax (``$1``, ``${name}``, ``\\$`` for a literal dollar;
    see :mod:`tidemark.engine.java_replacement`). *regex* is a Python regular
    expression (name a group ``(?P<name>…)``)."""

    def __init__(self, regex: str, replacement: str) -> None:
        self._regex = _regex("regex", regex)
        self._parts = parse_replacement(self._regex, replacement)
        # Destinations are few (one per table): each is renamed once.
        self._renamed: dict[str, str] = {}

    keeps_event: ClassVar[bool] = True

    def __call__(self, record: ChangeRecord) -> ChangeRecord:
        destination = record.destination
        renamed = self._renamed.get(destination)
        if renamed is None:
            renamed = destination
            if self._regex.fullmatch(destination) is not None:
                renamed = replace_first(self._regex, self._parts, destination)
            if len(self._renamed) >= _MAX_RENAMED:
                self._renamed.clear()
            self._renamed[destination] = renamed
        record.destination = renamed
        return record


class ExtractNewRecordState:
    """Deliver the new row instead of the envelope, as Debezium's ``ExtractNewRecordState``.

    Deletes follow *delete_handling*; truncates and logical messages are dropped (they
    have no row). *add_fields* copies envelope fields into the row as ``__<field>``.
    """

    def __init__(self, delete_handling: DeleteHandling | str = DeleteHandling.DROP,
                 add_fields: Iterable[str] = ()) -> None:
        try:
            handling = DeleteHandling(delete_handling)
        except ValueError:
            raise ConfigError("delete_handling",
                              f"{delete_handling!r} is not allowed; choose one of "
                              f"{', '.join(m.value for m in DeleteHandling)}") from None
        fields = tuple(add_fields)
        for field in fields:
            if field not in _FLATTEN_FIELDS:
                raise ConfigError("add_fields", f"{field!r} is not an envelope field; "
                                  f"choose from {', '.join(_FLATTEN_FIELDS)}")
        self._flatten = Flatten(handling, fields)

    keeps_event: ClassVar[bool] = True

    def __call__(self, record: ChangeRecord) -> ChangeRecord | None:
        event = record.event
        if not isinstance(event, ChangeEvent):
            return record
        if event.op in (Op.TRUNCATE, Op.MESSAGE):
            return None
        if event.op is Op.DELETE and self._flatten.delete_handling is DeleteHandling.DROP:
            return None
        record.flatten = self._flatten
        return record


class _ColumnRewrite(ABC):
    """Replace the values of some columns by text computed from them (mask, hash); the
    columns become ``text`` in the event's schema so every converter sees text."""

    def __init__(self, columns: Iterable[str], tables: Iterable[str] | None) -> None:
        self._columns = frozenset(columns)
        if not self._columns:
            raise ConfigError("columns", "name at least one column")
        self._tables = None if tables is None else [_regex("tables", t) for t in tables]
        self._lock = threading.Lock()
        # id(schema) → (schema, rewritten schema, indexes); holding the schema keeps
        # its id from being reused by another object.
        self._schemas: dict[int, tuple[TableSchema, TableSchema, tuple[int, ...]]] = {}

    @abstractmethod
    def rewrite(self, value: str | bytes) -> str:
        """The text that replaces one (non-null) value."""

    def __call__(self, record: ChangeRecord) -> ChangeRecord:
        event = record.event
        if not isinstance(event, ChangeEvent) or event.schema is None:
            return record
        entry = self._schemas.get(id(event.schema))
        if entry is None or entry[0] is not event.schema:
            entry = self._rewritten_schema(event.schema)
        _, schema, indexes = entry
        if not indexes:
            return record
        record.event = msgspec.structs.replace(
            event, schema=schema, raw_before=self._values(event.raw_before, indexes),
            raw_after=self._values(event.raw_after, indexes))
        return record

    def _rewritten_schema(
            self, schema: TableSchema) -> tuple[TableSchema, TableSchema, tuple[int, ...]]:
        name = f"{schema.table.schema}.{schema.table.table}"
        applies = self._tables is None or any(t.fullmatch(name) for t in self._tables)
        indexes = tuple(i for i, c in enumerate(schema.columns)
                        if applies and c.name in self._columns)
        columns = tuple(
            Column(c.name, STRING, "text", c.is_key, str, c.nullable)
            if i in indexes else c for i, c in enumerate(schema.columns))
        entry = (schema, msgspec.structs.replace(schema, columns=columns), indexes)
        with self._lock:
            self._schemas[id(schema)] = entry
        return entry

    def _values(self, row: WireTuple | None, indexes: tuple[int, ...]) -> WireTuple | None:
        if row is None:
            return None
        values = list(row)
        for i in indexes:
            value = values[i]
            if value is not None and value is not UNAVAILABLE:
                values[i] = self.rewrite(value)  # type: ignore[arg-type]
        return tuple(values)


class MaskField(_ColumnRewrite):
    """Replace the values of *columns* (in tables matching *tables*, default all) with
    *replacement*; nulls stay null."""

    def __init__(self, columns: Iterable[str], replacement: str = "****", *,
                 tables: Iterable[str] | None = None) -> None:
        super().__init__(columns, tables)
        self._replacement = replacement

    def rewrite(self, value: str | bytes) -> str:
        return self._replacement


class HashField(_ColumnRewrite):
    """Replace the values of *columns* with the hex digest of *salt* + their text form,
    so equal values stay joinable without revealing them."""

    def __init__(self, columns: Iterable[str], algorithm: str = "sha256", *,
                 salt: str = "", tables: Iterable[str] | None = None) -> None:
        super().__init__(columns, tables)
        if algorithm not in _HASHES:
            raise ConfigError("algorithm", f"{algorithm!r} is not available; choose one of "
                              f"{', '.join(_HASHES)}")
        self._algorithm = algorithm
        self._salt = salt.encode()

    def rewrite(self, value: str | bytes) -> str:
        data = value.encode() if isinstance(value, str) else value
        return hashlib.new(self._algorithm, self._salt + data).hexdigest()


def _checked_op(op: str) -> str:
    try:
        return Op(op).value
    except ValueError:
        raise ConfigError("ops", f"{op!r} is not an operation code; choose from "
                          f"{', '.join(o.value for o in Op)}") from None


def _regex(key: str, pattern: str) -> re.Pattern[str]:
    try:
        return re.compile(pattern)
    except re.error as err:
        raise ConfigError(key, f"{pattern!r} is not a valid regular expression: {err}") from None
