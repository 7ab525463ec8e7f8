"""Type changes of source columns: widen the target where Delta's type widening allows,
stop with one line where it does not.

``ALTER TABLE … ALTER COLUMN a TYPE bigint`` (or MariaDB's ``MODIFY`` to a wider type)
makes the change rows carry the wider type, which the target's column cannot hold
(a MERGE casts 5000000000 to its int and fails). Delta's ``typeWidening`` table feature
lists the changes a reader can follow: a wider integer, float to double, an integer to
double, a decimal with at least as many integer and fraction digits, an integer to a
decimal that holds it, date to timestamp without time zone. delta-rs (1.6) cannot
widen a column in place, so the target is rewritten with the widened schema, as one
commit (``overwrite`` with the new schema, read from the version before it): a reader
sees the old table or the new one, and a crash before the batch's merge leaves a
table that the replayed batch finds already widened.

A change a Delta column cannot follow (a number becoming text, a narrower type holding
values the target's cannot, …) stops the batch with a :class:`TypeChangeError` naming
the table, the column and both types.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator, Sequence
from typing import Final

import pyarrow as pa
from deltalake import DeltaTable, Field, write_deltalake

from tidemark.errors import TerminalError
from tidemark.lake.delta_read import live_rows

log = logging.getLogger(__name__)

_INTEGERS: Final = ("byte", "short", "integer", "long")
#: Decimal digits an integer type needs.
_INTEGER_DIGITS: Final = {"byte": 3, "short": 5, "integer": 10, "long": 20}
_DECIMAL: Final = re.compile(r"decimal\((\d+),\s*(-?\d+)\)")


class TypeChangeError(TerminalError):
    """A source column's type changed to one the Delta target's column cannot take."""


def _decimal(name: str) -> tuple[int, int] | None:
    match = _DECIMAL.fullmatch(name)
    return (int(match[1]), int(match[2])) if match else None


def widens(old: str, new: str) -> bool:
    """Whether Delta's type widening goes from primitive type *old* to *new* (names as
    delta-rs gives them: ``integer``, ``decimal(10,2)``, …)."""
    if old == new:
        return True
    if old in _INTEGERS and new in _INTEGERS:
        return _INTEGERS.index(old) <= _INTEGERS.index(new)
    if new == "double" and old in ("float", "byte", "short", "integer"):
        return True
    if old == "date" and new == "timestamp_ntz":
        return True
    target = _decimal(new)
    if target is None:
        return False
    precision, scale = target
    if old in _INTEGERS:
        return precision - scale >= _INTEGER_DIGITS[old]
    source = _decimal(old)
    return source is not None and scale >= source[1] and \
        precision - scale >= source[0] - source[1]


def _primitive(field: Field | None) -> str | None:
    """The name of *field*'s primitive Delta type; None for no field or a nested type."""
    kind = getattr(field, "type", None)
    name = getattr(kind, "type", None)
    return name if isinstance(name, str) else None


def widen_target(table: DeltaTable, fields: Sequence[pa.Field]) -> DeltaTable:
    """*table* with its columns widened to the types of *fields* (the target's fields
    as the batch has them) where they are wider; raises :class:`TypeChangeError` for a
    column whose new type is neither its type, narrower, nor a widening of it."""
    present = {f.name: f for f in table.schema().fields}
    widened: dict[str, pa.DataType] = {}
    for field in fields:
        have = _primitive(present.get(field.name))
        want = _primitive(Field.from_arrow(field))
        if have is None or want is None or have == want:  # new, or not primitive
            continue
        if widens(want, have):
            continue  # a narrower source type: its values fit the target's column
        if not widens(have, want):
            raise TypeChangeError(
                f"column {field.name!r} of {table.table_uri} is {have} in Delta but "
                f"{want} in the source now, a change Delta's type widening does not "
                f"allow: change the source column back to a type that {have} holds, "
                "or move the target aside and reload it (execute-snapshot, or a new "
                "checkpoint with snapshot = \"initial\")")
        widened[field.name] = field.type
    if not widened:
        return table
    _rewrite(table, widened)
    return table


def _rewrite(table: DeltaTable, widened: dict[str, pa.DataType]) -> None:
    """Rewrite *table* with *widened* columns' new types, as one commit, holding one
    record batch at a time."""
    version = table.version()
    old = pa.schema(table.schema().to_arrow())
    new = pa.schema([f.with_type(widened[f.name]) if f.name in widened else f for f in old])
    log.warning("%s: widening column(s) %s to the source's new type(s) %s; rewriting the "
                "table (one commit, version %d -> %d)", table.table_uri, ", ".join(widened),
                ", ".join(str(t) for t in widened.values()), version, version + 1)
    # The files of this version, listed before the write (delta-rs cannot be called
    # from inside its own write); the overwrite leaves them in place for time travel.
    dataset = live_rows(table)

    def batches() -> Iterator[pa.RecordBatch]:
        for batch in dataset.to_batches():
            yield pa.Table.from_batches([batch]).cast(new).combine_chunks().to_batches()[0] \
                if batch.num_rows else pa.RecordBatch.from_pylist([], schema=new)

    metadata = table.metadata()
    write_deltalake(table, pa.RecordBatchReader.from_batches(new, batches()),
                    mode="overwrite", schema_mode="overwrite",
                    partition_by=list(metadata.partition_columns) or None,
                    configuration=dict(metadata.configuration) or None)
    table.update_incremental()
