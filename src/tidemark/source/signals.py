"""Debezium's signals: the rows of a signal table that steer a running capture.

A signal table has Debezium's layout (``id varchar(42) PRIMARY KEY, type varchar(32)
NOT NULL, data varchar(2048) NULL``, see :func:`signal_table_ddl`); a row inserted into
it is read from the log by the connector and turned into a :data:`Signal` by
:func:`parse_signal`. The types and the JSON in ``data`` are Debezium's, so a signal
written for Debezium works unchanged:

* ``execute-snapshot``: ``{"data-collections": ["public.orders"], "type": "incremental",
  "additional-conditions": [{"data-collection": "public.orders", "filter": "…"}],
  "surrogate-key": "column"}`` (only ``data-collections`` is required);
* ``stop-snapshot``: ``{"data-collections": [...], "type": "incremental"}`` (no tables:
  stop all);
* ``pause-snapshot``, ``resume-snapshot``: ``data`` is ignored;
* ``log``: ``{"message": "…"}``;
* ``tidemark-repair`` (tidemark's own): ``{"data-collection": "schema.table", "keys":
  [{"id": 5}, ...]}`` (:mod:`tidemark.source.repair_signal`).

Where tidemark is stricter than Debezium, it says so in the error instead of guessing:
table names are ``schema.table`` (or ``table``, in ``public``) made of the characters
PostgreSQL accepts in an unquoted name, never regular expressions or quoted names —
they end up in SQL the connector builds; ``blocking`` snapshots (which stop the stream)
are refused; unknown keys are refused rather than ignored, so a misspelt or outdated key
(Debezium's old ``additional-condition``) cannot silently snapshot a whole table.

A ``filter`` is kept as written: it is a SQL boolean expression by design, as in
Debezium, and runs with the connector's privileges. Whoever may insert into the signal
table may therefore read what the connector's role can read; grant INSERT on it
accordingly.

:func:`send_signal` asks the DSN's source kind to write a row; the rest is parsing.
"""

from __future__ import annotations

import json
import re
import unicodedata
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final

from tidemark.errors import TerminalError
from tidemark.event import TableId
from tidemark.source.repair_signal import REPAIR_TYPE, RepairDataError, RepairSignal, parse_repair

#: The signal types tidemark acts on (the ``type`` column), as Debezium names them.
SIGNAL_TYPES: Final = ("execute-snapshot", "stop-snapshot", "pause-snapshot",
                       "resume-snapshot", "log", REPAIR_TYPE)

#: Debezium signal types tidemark knows of but does not take, with the reason.
_NOT_TAKEN: Final = {
    "schema-changes": "it exists for Debezium's schema history, which tidemark does not "
                      "keep",
    "snapshot-window-open": "tidemark's snapshot windows are logical decoding messages, "
                            "never signal-table rows",
    "snapshot-window-close": "tidemark's snapshot windows are logical decoding messages, "
                             "never signal-table rows",
}

#: The longest signal id Debezium's layout holds (``id varchar(42)``).
MAX_SIGNAL_ID_LENGTH: Final = 42

#: PostgreSQL cuts longer names to this many bytes (NAMEDATALEN - 1), so a longer name
#: would silently mean another table.
_MAX_NAME_BYTES: Final = 63

#: A name PostgreSQL accepts without quotes: a letter or ``_``, then letters, digits,
#: ``_`` and ``$`` (letters and digits of any script, as PostgreSQL allows them).
_NAME: Final = re.compile(r"[^\W\d][\w$]*")

_NAME_RULE: Final = ("names are made of letters, digits, _ and $, do not start with a "
                     f"digit or $, and are at most {_MAX_NAME_BYTES} bytes long")

SIGNAL_TABLE_COLUMNS: Final = ("(id varchar(42) PRIMARY KEY, type varchar(32) NOT NULL, "
                                "data varchar(2048) NULL)")


class SignalError(TerminalError):
    """A signal that cannot be taken (malformed, or refused): the message names the
    signal's id, what is wrong and what would be accepted."""


# -- the signals --------------------------------------------------------------------------
# Keyword-only: every field is named where a signal is built, so adding one later cannot
# shift the others.
@dataclass(frozen=True, kw_only=True)
class ExecuteSnapshot:
    """``execute-snapshot``: snapshot *data_collections* incrementally, in this order.

    ``additional_conditions`` maps a table (always one of ``data_collections``) to the
    SQL boolean expression its rows must meet, as written in the signal.
    ``surrogate_key`` is a column to read the tables by instead of their primary key.
    """

    TYPE: ClassVar[str] = "execute-snapshot"

    id: str
    data_collections: tuple[TableId, ...]
    additional_conditions: dict[TableId, str] = field(default_factory=dict)
    surrogate_key: str | None = None
    snapshot_type: str = "incremental"


@dataclass(frozen=True, kw_only=True)
class StopSnapshot:
    """``stop-snapshot``: drop these tables from the running snapshot (none: all)."""

    TYPE: ClassVar[str] = "stop-snapshot"

    id: str
    data_collections: tuple[TableId, ...] = ()


@dataclass(frozen=True, kw_only=True)
class PauseSnapshot:
    """``pause-snapshot``: read no further chunk until ``resume-snapshot``."""

    TYPE: ClassVar[str] = "pause-snapshot"

    id: str


@dataclass(frozen=True, kw_only=True)
class ResumeSnapshot:
    """``resume-snapshot``: continue a paused snapshot."""

    TYPE: ClassVar[str] = "resume-snapshot"

    id: str


@dataclass(frozen=True, kw_only=True)
class LogSignal:
    """``log``: write *message* to the log (Debezium replaces a ``{}`` in it with the
    position in the stream; the connector may do the same)."""

    TYPE: ClassVar[str] = "log"

    id: str
    message: str


Signal = ExecuteSnapshot | StopSnapshot | PauseSnapshot | ResumeSnapshot | LogSignal | RepairSignal


# -- names --------------------------------------------------------------------------------
def _name_problem(part: str) -> str | None:
    """What is wrong with one part of a table name (or a column name), or None."""
    if not part:
        return "is empty"
    for ch in part:
        if ch in "\"'`":
            return (f"contains a quote ({ch}); write names without quotes: tidemark quotes "
                    "them itself")
        if ch.isspace() or unicodedata.category(ch)[0] in "CZ":
            return f"contains whitespace or a control character ({ch!r})"
        if ch in ";":
            return "contains ';'"
    if not _NAME.fullmatch(part):
        bad = next((c for c in part if not (c.isalnum() or c in "_$")), None)
        if bad is None:  # only the first character is wrong: a digit or $
            return f"starts with {part[0]!r}"
        hint = ("; tidemark takes table names, not Debezium's regular expressions"
                if bad in r".*+?[](){}|^\\" else "")
        return f"contains {bad!r}{hint}"
    if len(part.encode()) > _MAX_NAME_BYTES:
        return (f"is {len(part.encode())} bytes long; PostgreSQL would cut it to "
                f"{_MAX_NAME_BYTES}")
    return None


def parse_table_name(text: str) -> TableId:
    """``schema.table`` (or ``table``, meaning ``public.table``) as a :class:`TableId`.

    Only names PostgreSQL accepts without quotes are taken (their case is kept: they
    are matched with the catalog's names exactly). Raises :class:`ValueError` saying
    what is wrong and what is allowed.
    """
    if not isinstance(text, str):
        raise ValueError(f"expected a table name (a string), got {_json_kind(text)}")
    if text.count(".") > 1:
        raise ValueError(f"{text!r} has more than two parts; expected schema.table "
                         "(or table, in schema public)")
    return _checked(TableId.parse(text), text)


def _checked(table: TableId, text: str) -> TableId:
    for what, part in (("schema", table.schema), ("table", table.table)):
        problem = _name_problem(part)
        if problem is not None:
            raise ValueError(f"{text!r} is not a valid schema.table name: the {what} name "
                             f"{problem}; {_NAME_RULE}")
    return table


def _column_name(text: str) -> str:
    problem = _name_problem(text)
    if problem is not None:
        raise ValueError(f"{text!r} is not a valid column name: it {problem}; {_NAME_RULE}")
    return text


def _json_kind(value: object) -> str:
    """How *value* (a decoded JSON value) is called in JSON."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"a boolean ({json.dumps(value)})"
    if isinstance(value, int | float):
        return f"a number ({json.dumps(value)})"
    if isinstance(value, str):
        return f"a string ({json.dumps(value)})"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


# -- parsing ------------------------------------------------------------------------------
class _DataError(Exception):
    """What is wrong with a signal's data (the caller adds which signal it is)."""


def parse_signal(signal_id: str, signal_type: str, data: str | None) -> Signal:
    """The signal a row of the signal table holds.

    *data* is the ``data`` column: JSON text, or None (an empty text counts as none, as
    in Debezium). Raises :class:`SignalError` naming *signal_id* and saying exactly what
    is wrong and what is allowed.
    """
    where = f"signal {signal_id!r} ({signal_type})"
    if signal_type not in SIGNAL_TYPES:
        reason = _NOT_TAKEN.get(signal_type)
        what = (f"signal type {signal_type!r} is not supported ({reason})" if reason
                else f"unknown signal type {signal_type!r}")
        raise SignalError(f"signal {signal_id!r}: {what}; the types allowed are: "
                          f"{', '.join(SIGNAL_TYPES)}")
    try:
        payload = _payload(data)
        if signal_type == "execute-snapshot":
            return _execute_snapshot(signal_id, payload)
        if signal_type == "stop-snapshot":
            return _stop_snapshot(signal_id, payload)
        if signal_type == "log":
            return _log(signal_id, payload)
        if signal_type == REPAIR_TYPE:
            return parse_repair(signal_id, payload)
    except (_DataError, RepairDataError) as err:
        raise SignalError(f"{where}: {err}") from None
    # Debezium ignores the data of these two; it only has to be readable.
    if signal_type == "pause-snapshot":
        return PauseSnapshot(id=signal_id)
    return ResumeSnapshot(id=signal_id)


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # json.loads keeps the last of repeated keys; which one the writer meant is unknown.
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise _DataError(f"data has the key {key!r} twice")
        result[key] = value
    return result


def _payload(data: str | None) -> dict[str, Any]:
    if data is None or not data.strip():
        return {}
    try:
        value = json.loads(data, object_pairs_hook=_no_duplicate_keys)
    except json.JSONDecodeError as err:
        shown = data if len(data) <= 120 else data[:117] + "..."
        raise _DataError(f"data is not JSON ({err}): {shown!r}") from None
    if not isinstance(value, dict):
        raise _DataError(f"data must be a JSON object ({{...}}), got {_json_kind(value)}")
    return value


def _check_keys(payload: Mapping[str, Any], allowed: tuple[str, ...]) -> None:
    for key in payload:
        if key not in allowed:
            hint = ""
            if key == "additional-condition":
                hint = (" (Debezium's old form, removed in Debezium 2.5, applied one filter "
                        "to every table; give additional-conditions: "
                        '[{"data-collection": "schema.table", "filter": "..."}])')
            raise _DataError(f"unknown key {key!r}{hint}; the keys allowed are: "
                             f"{', '.join(allowed)}")


def _snapshot_type(payload: Mapping[str, Any]) -> str:
    value = payload.get("type")
    if value is None:
        return "incremental"
    if not isinstance(value, str):
        raise _DataError(f"type must be a string, got {_json_kind(value)}; allowed: "
                         '"incremental"')
    # Debezium compares the snapshot type case-insensitively ("INCREMENTAL" in its docs).
    lowered = value.lower()
    if lowered == "incremental":
        return lowered
    if lowered == "blocking":
        raise _DataError('type "blocking" is not supported: a blocking snapshot stops the '
                         'stream; use "incremental" (the default), which reads the table '
                         "while changes keep flowing")
    raise _DataError(f"unknown snapshot type {value!r}; allowed: "
                     '"incremental" (the default)')


def _tables(value: Any, key: str, *, required: bool) -> tuple[TableId, ...]:
    example = f'e.g. {{"{key}": ["public.orders"]}}'
    if value is None:
        if required:
            raise _DataError(f"{key} is missing: give the tables to snapshot, {example}")
        return ()
    if not isinstance(value, list):
        raise _DataError(f"{key} must be a list of table names, got {_json_kind(value)}; "
                         f"{example}")
    if not value and required:
        raise _DataError(f"{key} is empty: give at least one table, {example}")
    tables: list[TableId] = []
    for index, item in enumerate(value):
        if not isinstance(item, str):
            raise _DataError(f"{key}[{index}] must be a table name (a string), got "
                             f"{_json_kind(item)}")
        try:
            table = parse_table_name(item)
        except ValueError as err:
            raise _DataError(f"{key}[{index}]: {err}") from None
        if table not in tables:  # "orders" and "public.orders" are one table
            tables.append(table)
    return tuple(tables)


def _conditions(value: Any, tables: tuple[TableId, ...]) -> dict[TableId, str]:
    shape = '[{"data-collection": "schema.table", "filter": "<SQL condition>"}]'
    if value is None:
        return {}
    if not isinstance(value, list):
        raise _DataError(f"additional-conditions must be a list like {shape}, got "
                         f"{_json_kind(value)}")
    conditions: dict[TableId, str] = {}
    for index, item in enumerate(value):
        at = f"additional-conditions[{index}]"
        if not isinstance(item, dict):
            raise _DataError(f"{at} must be an object like {shape[1:-1]}, got "
                             f"{_json_kind(item)}")
        for key in item:
            if key not in ("data-collection", "filter"):
                raise _DataError(f"{at} has the unknown key {key!r}; the keys allowed are: "
                                 "data-collection, filter")
        name = item.get("data-collection")
        if not isinstance(name, str):
            raise _DataError(f"{at}.data-collection must be a table name (a string), got "
                             f"{_json_kind(name)}")
        try:
            table = parse_table_name(name)
        except ValueError as err:
            raise _DataError(f"{at}.data-collection: {err}") from None
        if table not in tables:
            raise _DataError(f"{at} is for {table}, which is not in data-collections "
                             f"({', '.join(map(str, tables))}); a condition applies only to "
                             "a table being snapshotted")
        if table in conditions:
            raise _DataError(f"{at}: {table} has a condition already; give one condition "
                             "per table (combine them with AND)")
        condition = item.get("filter")
        if not isinstance(condition, str) or not condition.strip():
            got = "an empty string" if isinstance(condition, str) else _json_kind(condition)
            raise _DataError(f"{at}.filter must be a non-empty SQL condition such as "
                             f"\"status = 'open'\", got {got}")
        conditions[table] = condition
    return conditions


def _execute_snapshot(signal_id: str, payload: dict[str, Any]) -> ExecuteSnapshot:
    _check_keys(payload, ("data-collections", "type", "additional-conditions",
                          "surrogate-key"))
    snapshot_type = _snapshot_type(payload)
    tables = _tables(payload.get("data-collections"), "data-collections", required=True)
    conditions = _conditions(payload.get("additional-conditions"), tables)
    key = payload.get("surrogate-key")
    if key is not None and not isinstance(key, str):
        raise _DataError(f"surrogate-key must be a column name (a string), got "
                         f"{_json_kind(key)}")
    if key == "":
        key = None  # Debezium reads an empty surrogate-key as none given
    if key is not None:
        try:
            key = _column_name(key)
        except ValueError as err:
            raise _DataError(f"surrogate-key: {err}") from None
    return ExecuteSnapshot(id=signal_id, data_collections=tables,
                           additional_conditions=conditions, surrogate_key=key,
                           snapshot_type=snapshot_type)


def _stop_snapshot(signal_id: str, payload: dict[str, Any]) -> StopSnapshot:
    _check_keys(payload, ("data-collections", "type"))
    _snapshot_type(payload)
    tables = _tables(payload.get("data-collections"), "data-collections", required=False)
    return StopSnapshot(id=signal_id, data_collections=tables)


def _log(signal_id: str, payload: dict[str, Any]) -> LogSignal:
    _check_keys(payload, ("message",))
    message = payload.get("message")
    if message is None:
        raise _DataError('message is missing: give the text to log, e.g. {"message": "hello"}')
    if not isinstance(message, str) or not message:
        got = "an empty string" if isinstance(message, str) else _json_kind(message)
        raise _DataError(f'message must be a non-empty string, e.g. {{"message": "hello"}}, '
                         f"got {got}")
    return LogSignal(id=signal_id, message=message)


# -- writing signals ----------------------------------------------------------------------
def execute_snapshot_data(
    tables: Iterable[str | TableId],
    additional_conditions: Mapping[str, str] | Mapping[TableId, str] | None = None,
    surrogate_key: str | None = None,
) -> dict[str, Any]:
    """The ``data`` of an ``execute-snapshot`` signal, in Debezium's JSON shape.

    Nothing is checked here: :func:`send_signal` and :func:`parse_signal` do that.
    """
    data: dict[str, Any] = {"data-collections": [str(t) for t in tables],
                            "type": "incremental"}
    if additional_conditions:
        data["additional-conditions"] = [{"data-collection": str(table), "filter": condition}
                                         for table, condition in additional_conditions.items()]
    if surrogate_key is not None:
        data["surrogate-key"] = surrogate_key
    return data


def _quote(name: str) -> str:
    # PostgreSQL's quoting of an identifier: double quotes, inner ones doubled.
    return '"' + name.replace('"', '""') + '"'


def quoted_name(table: TableId) -> str:
    """*table* as PostgreSQL's quoted ``"schema"."table"``."""
    return f"{_quote(table.schema)}.{_quote(table.table)}"


def signal_table_ddl(table: TableId) -> str:
    """The ``CREATE TABLE`` statement of a signal table with Debezium's layout."""
    return f"CREATE TABLE IF NOT EXISTS {quoted_name(table)} {SIGNAL_TABLE_COLUMNS}"


def _signal_table(signal_table: str | TableId) -> TableId:
    try:
        if isinstance(signal_table, TableId):
            return _checked(signal_table, str(signal_table))
        return parse_table_name(signal_table)
    except ValueError as err:
        raise SignalError(f"signal table: {err}") from None


def send_signal(dsn: str, signal_table: str | TableId, signal_type: str,
                data: Mapping[str, Any] | None, *, signal_id: str | None = None) -> str:
    """Write a signal into *signal_table* and return its id.

    The signal is checked with :func:`parse_signal` first, so one that a connector would
    skip is refused before anything is written. The id is *signal_id*, or a new random
    one (32 hex digits). Raises :class:`SignalError` for a bad signal or signal table
    name, for a signal table that does not exist (the message holds its ``CREATE
    TABLE``) and for a role that may not insert into it; connection failures raise what
    the source's connection raises (for PostgreSQL
    :func:`tidemark.postgres_connection.connect`).
    """
    table = _signal_table(signal_table)
    if signal_id is None:
        signal_id = uuid.uuid4().hex
    if not signal_id or len(signal_id) > MAX_SIGNAL_ID_LENGTH:
        raise SignalError(f"signal id {signal_id!r} must be 1 to {MAX_SIGNAL_ID_LENGTH} "
                          "characters long (Debezium's id varchar(42))")
    if any(unicodedata.category(ch)[0] == "C" for ch in signal_id):
        raise SignalError(f"signal id {signal_id!r} contains a control character")
    text = None
    if data is not None:
        try:
            # A mapping is written as an object; anything else as itself, for
            # parse_signal to refuse by name.
            text = json.dumps(dict(data) if isinstance(data, Mapping) else data,
                              ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError) as err:
            raise SignalError(f"signal {signal_id!r} ({signal_type}): data cannot be "
                              f"written as JSON: {err}") from None
    parse_signal(signal_id, signal_type, text)

    from tidemark.source.registry import kind_of  # noqa: PLC0415

    kind_of(dsn).write_signal(dsn, table, signal_id, signal_type, text)
    return signal_id
