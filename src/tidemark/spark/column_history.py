"""Which of a table's columns today a column of an older layout in the stream is.

PostgreSQL's Relation message names a table's columns as they were when the change was
made, in attribute number (``attnum``) order, leaving out dropped columns and the
generated columns the publication does not send (``logicalrep_write_attrs`` in
PostgreSQL's ``proto.c``). Its names are no identity: ``RENAME COLUMN c1 TO c1r``
changes the name, ``DROP COLUMN c1`` then ``ADD COLUMN c1r`` gives another column
that looks the same in the stream. The attribute numbers are: one is never reused, and
``pg_attribute`` keeps a dropped column's row for good (``attisdropped``, named
``........pg.dropped.N........``). So from the catalog read when the query started
(every attribute in attnum order, dropped ones marked) the layouts the table can have
had before are known: the attributes up to some number, all live ones then and any
subset of the dropped ones (each may or may not have been dropped yet). A message of
*n* columns fits one or more of them; when every fit gives each position the same
column (or "dropped"), that is which column each position is, renamed or not.

That holds for changes committed before the catalog was read (the query's schema
position, ``read_at``), while the publication sends the same columns it sends now:
a generated column made a plain one (``ALTER COLUMN ... DROP EXPRESSION``) or a
publication that changed which columns it sends can make an older layout look like a
rename. A fit that renames a column whose type differs is therefore not trusted, nor
one that contradicts names that all still exist.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Final

import msgspec
import pyarrow as pa
from pyspark.sql.types import StructField, StructType

#: Field metadata key, on a typed schema's first column: the table's
#: :class:`TableLayout` as JSON.
LAYOUT_KEY: Final = "tidemark.layout"

#: Where pyspark keeps a field's metadata in an Arrow schema.
_SPARK_METADATA: Final = b"SPARK::metadata::json"

#: A position of a message that is a column dropped since.
DROPPED: Final = ""


class TableLayout(msgspec.Struct, frozen=True):
    """A table's attributes when the query read its schema.

    ``attrs`` holds, in attnum order, ``[name, type OID]`` per column the stream
    carries and ``None`` per dropped attribute (generated columns the publication
    does not send are left out: they were never in the stream). ``read_at`` is the
    source's position just before the catalog was read: a change that commits before
    it was made under this layout or an older one.
    """

    relid: int
    read_at: int
    attrs: tuple[tuple[str, int] | None, ...] | None
    """None for a source without column numbers (MariaDB: a binlog's table map names
    the columns of its time, by position only)."""

    def to_metadata(self) -> str:
        return msgspec.json.encode(self).decode()

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, Any] | None) -> TableLayout | None:
        raw = (metadata or {}).get(LAYOUT_KEY)
        if not isinstance(raw, str):
            return None
        return msgspec.json.decode(raw, type=cls)


def _fits(attrs: Sequence[tuple[str, int] | None], n: int, limit: int = 2
          ) -> list[tuple[str, ...]]:
    """The distinct ways (at most *limit*) an older layout of *n* columns maps onto
    *attrs*: per position a column's name, or :data:`DROPPED`."""
    # fits[i][k]: the ways positions from attribute i on fill k columns. An older
    # layout is a prefix of the attributes holding every live one and any dropped ones.
    size = len(attrs)
    fits: list[list[list[tuple[str, ...]]]] = [[[] for _ in range(n + 1)]
                                              for _ in range(size + 1)]
    for i in range(size, -1, -1):
        fits[i][0] = [()]
        if i == size:
            continue
        attr = attrs[i]
        for k in range(1, n + 1):
            head = DROPPED if attr is None else attr[0]
            ways = [(head, *rest) for rest in fits[i + 1][k - 1]]
            if attr is None:  # or dropped before then: not in the layout
                ways += [w for w in fits[i + 1][k] if w not in ways]
            fits[i][k] = ways[:limit]
    return fits[0][n]


class Unmatched(msgspec.Struct, frozen=True):
    """Why an older layout's columns cannot be matched to today's with certainty."""

    reason: str


def match(layout: TableLayout, relid: int, names: Sequence[str],
          type_oids: Sequence[int]) -> tuple[str, ...] | Unmatched:
    """Today's name (or :data:`DROPPED`) of each column of an older layout of the
    table (a Relation message's *names* and *type_oids*, of relation *relid*)."""
    if layout.attrs is None:
        return Unmatched("the source has no column numbers that outlast a rename")
    current = {a[0]: a[1] for a in layout.attrs if a is not None}
    if list(names) == list(current)[:len(names)]:
        return tuple(names)  # the usual case: no column renamed or dropped since
    if relid != layout.relid:
        return Unmatched("the table was dropped and created again since")
    fits = _fits(layout.attrs, len(names))
    if not fits:
        return Unmatched(f"the table has fewer than those {len(names)} columns, even "
                         "counting dropped ones")
    if len(fits) > 1:
        return Unmatched("the table has dropped columns, so a column dropped since and "
                         "one renamed since look the same")
    (fit,) = fits
    if set(names) <= set(current):
        return Unmatched("columns of those names still exist, in other places")
    for name, oid, now in zip(names, type_oids, fit, strict=True):
        if now not in (DROPPED, name) and current[now] != oid:
            return Unmatched(f"{now!r}, in {name!r}'s place, has another type")
    return fit


def describe(fit: Sequence[str], names: Sequence[str]) -> str:
    """The renames and drops a match found, for the log."""
    return ", ".join(f"{old} is now {new}" if new != DROPPED else f"{old} was dropped"
                     for old, new in zip(names, fit, strict=True) if new != old)


def without_layout(schema: StructType) -> StructType:
    """*schema* without the layout: it changes at every query start, and what reaches a
    Delta table's schema must not (delta-rs refuses to merge differing field metadata)."""
    fields = list(schema.fields)
    if not fields or LAYOUT_KEY not in (fields[0].metadata or {}):
        return schema
    first = fields[0]
    metadata = {k: v for k, v in first.metadata.items() if k != LAYOUT_KEY}
    fields[0] = StructField(first.name, first.dataType, first.nullable, metadata)
    return StructType(fields)


def arrow_without_layout(table: pa.Table) -> pa.Table:
    """*table* (rows Spark handed over, its field metadata in Spark's JSON) without the
    layout (see :func:`without_layout`)."""
    if not table.schema or not table.schema[0].metadata:
        return table
    first = table.schema[0]
    raw = first.metadata.get(_SPARK_METADATA)
    if raw is None or LAYOUT_KEY.encode() not in raw:
        return table
    spark = {k: v for k, v in json.loads(raw).items() if k != LAYOUT_KEY}
    metadata = {k: v for k, v in first.metadata.items() if k != _SPARK_METADATA}
    if spark:
        metadata[_SPARK_METADATA] = json.dumps(spark).encode()
    return table.cast(table.schema.set(0, first.with_metadata(metadata)))


def with_layout(schema: StructType, layout: TableLayout) -> StructType:
    """*schema* (a typed table's) with *layout* in its first column's metadata."""
    fields = list(schema.fields)
    first = fields[0]
    fields[0] = StructField(first.name, first.dataType, first.nullable,
                            {**(first.metadata or {}), LAYOUT_KEY: layout.to_metadata()})
    return StructType(fields)
