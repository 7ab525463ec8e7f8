"""The ``tidemark-repair`` signal: re-read some keys of a table from the source and apply
their current rows to the target (``tidemark verify --repair`` sends it).

Its ``data`` is ``{"data-collection": "schema.table", "keys": [{"id": 5}, ...]}``: each
key an object of key column to value, numbers as JSON numbers and every other value as
the text the source prints. Every key names the same columns; that they are exactly the
table's key columns is checked where the key is known, by the stream that takes the
signal. The Spark stream (``tidemark run``) takes it once, in a batch: an ``r`` change
for each key the source has, a ``d`` for each it has not
(:mod:`tidemark.source.repair`). The engine and ``tidemark capture`` skip it.

A signal row's ``data`` holds at most 2,048 characters (Debezium's layout), so
:func:`repair_signals_data` cuts a long list of keys into as many signals as needed.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Final

from tidemark.event import TableId

#: The signal's type (the ``type`` column).
REPAIR_TYPE: Final = "tidemark-repair"

#: The ``data`` column's width in Debezium's layout (``data varchar(2048)``).
MAX_DATA_LENGTH: Final = 2048

_SHAPE: Final = '{"data-collection": "schema.table", "keys": [{"id": 5}, ...]}'

#: A key value: a JSON number or the text the source prints (a boolean too, as JSON).
KeyValue = int | float | str | bool


@dataclass(frozen=True, kw_only=True)
class RepairSignal:
    """``tidemark-repair``: apply the source's current rows of *keys* of *table*.

    ``key_columns`` are the columns every key names (in the order of the first key);
    ``keys`` the values of each key in that order."""

    TYPE: ClassVar[str] = REPAIR_TYPE

    id: str
    table: TableId
    key_columns: tuple[str, ...]
    keys: tuple[tuple[KeyValue, ...], ...]


class RepairDataError(ValueError):
    """What is wrong with a repair signal's data (the caller names the signal)."""


def parse_repair(signal_id: str, payload: Mapping[str, Any]) -> RepairSignal:
    """The repair signal *payload* (decoded ``data``) holds; raises
    :class:`RepairDataError` saying what is wrong and the expected shape."""
    # The name rules are the other signals' (that module imports this one at its top).
    from tidemark.source.signals import (  # noqa: PLC0415
        _column_name as column_name,
    )
    from tidemark.source.signals import _json_kind as json_kind  # noqa: PLC0415
    from tidemark.source.signals import parse_table_name as parse_table  # noqa: PLC0415

    for key in payload:
        if key not in ("data-collection", "keys"):
            raise RepairDataError(f"unknown key {key!r}; the keys allowed are: "
                                  f"data-collection, keys ({_SHAPE})")
    name = payload.get("data-collection")
    if not isinstance(name, str):
        raise RepairDataError(f"data-collection must be a table name (a string), got "
                              f"{json_kind(name)}; expected {_SHAPE}")
    try:
        table = parse_table(name)
    except ValueError as err:
        raise RepairDataError(f"data-collection: {err}") from None
    keys = payload.get("keys")
    if not isinstance(keys, list) or not keys:
        got = "an empty list" if isinstance(keys, list) else json_kind(keys)
        raise RepairDataError(f"keys must be a non-empty list of key objects, got {got}; "
                              f"expected {_SHAPE}")
    columns: tuple[str, ...] | None = None
    values: list[tuple[KeyValue, ...]] = []
    for index, item in enumerate(keys):
        if not isinstance(item, dict) or not item:
            got = "an empty object" if isinstance(item, dict) else json_kind(item)
            raise RepairDataError(f"keys[{index}] must be an object of key column to "
                                  f'value such as {{"id": 5}}, got {got}')
        if columns is None:
            for column in item:
                try:
                    column_name(column)
                except ValueError as err:
                    raise RepairDataError(f"keys[{index}]: {err}") from None
            columns = tuple(item)
        elif set(item) != set(columns):
            raise RepairDataError(f"keys[{index}] names the columns {', '.join(item)}, "
                                  f"keys[0] {', '.join(columns)}: every key names the "
                                  "table's key columns")
        row: list[KeyValue] = []
        for column in columns:
            value = item[column]
            if value is None or isinstance(value, list | dict):
                raise RepairDataError(f"keys[{index}].{column} must be a number or a text, "
                                      f"got {json_kind(value)} (a key column is never null)")
            row.append(value)
        values.append(tuple(row))
    assert columns is not None
    unique = tuple(dict.fromkeys(values))  # a key listed twice is repaired once
    return RepairSignal(id=signal_id, table=table, key_columns=columns, keys=unique)


def repair_signal_data(table: TableId | str,
                       keys: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The ``data`` of one ``tidemark-repair`` signal for *keys* of *table* (each key a
    mapping of key column to value: numbers as numbers, other values as the text the
    source prints). For :func:`tidemark.source.signals.send_signal`, which checks it."""
    return {"data-collection": str(table), "keys": [dict(k) for k in keys]}


def repair_signals_data(table: TableId | str, keys: Sequence[Mapping[str, Any]],
                        max_length: int = MAX_DATA_LENGTH) -> list[dict[str, Any]]:
    """:func:`repair_signal_data` for *keys* cut into as few signals as keep each
    ``data`` within *max_length* characters (a signal row's ``data`` column)."""
    head = len(json.dumps(repair_signal_data(table, []), ensure_ascii=False))
    chunks: list[list[Mapping[str, Any]]] = []
    size = head
    for key in keys:
        text = len(json.dumps(dict(key), ensure_ascii=False)) + 2  # ", " between keys
        if head + text > max_length:
            raise RepairDataError(f"key {dict(key)!r} alone makes the signal's data longer "
                                  f"than {max_length} characters")
        if not chunks or size + text > max_length:
            chunks.append([])
            size = head
        chunks[-1].append(key)
        size += text
    return [repair_signal_data(table, chunk) for chunk in chunks]
