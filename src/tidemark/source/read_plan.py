"""What a source implements to be read by the Spark stream: a read plan.

The Spark side (:mod:`tidemark.spark.reader`) holds the pyspark contract and knows no
source; a source's read plan (``source/<kind>/read_plan.py``, made by its
``make_read_plan(options)``) knows its positions, how a batch is cut into partitions and
how a partition is read. Between them:

* offsets are JSON-able dicts the plan defines (Spark keeps them in its checkpoint);
* partitions are picklable values the plan defines (they travel to the executors,
  with a pickled copy of the plan that never ran a driver-side method);
* a partition is read into a :class:`ChangeSink`, which builds the change rows of the
  contract (:mod:`tidemark.change_rows`) in the stream's shape.

Nothing here imports pyspark: ``tidemark status`` and the pipeline read offsets with
the plan's modules and no Spark.

Where each method runs (pyspark 4.3): :meth:`ReadPlan.tables` when the user calls
``load()``; ``initial_offset``, ``latest``, ``plan``, ``commit`` in one long-lived
driver-side process (which may keep connections); ``read`` on executors.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, Final, NamedTuple, Protocol

import msgspec

from tidemark.event import Column, TableId, WireTuple

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

#: ``_seq`` of snapshot rows and of the truncate that precedes a restarted table's rows
#: (both at the snapshot's point: the truncate first).
ROW_SEQ: Final = 1
TRUNCATE_SEQ: Final = 0


class Commit(NamedTuple):
    """The transaction a change row belongs to: its ``_commit_lsn`` (the source's
    position of the commit, int64, monotonic in commit order), ``_commit_ts`` and
    ``_txid``."""

    commit_lsn: int
    commit_ts_us: int
    """Commit time, microseconds since the Unix epoch."""
    xid: int


class ChangeColumn(Protocol):
    """A column as the sinks know it: its name, and whether it is part of the key."""

    @property
    def name(self) -> str: ...

    @property
    def is_key(self) -> bool: ...


class ChangeTable(Protocol):
    """A table's column layout as a source reads it: its id within one read (rows name
    it), schema, name and columns in the order of the rows' values. A sink never reads
    a column's type: that comes from the stream's schema."""

    @property
    def relation_id(self) -> int: ...

    @property
    def namespace(self) -> str: ...

    @property
    def name(self) -> str: ...

    @property
    def columns(self) -> Sequence[ChangeColumn]: ...


class LayoutColumn(msgspec.Struct, frozen=True, gc=False):
    """A column of a :class:`Layout`."""

    name: str
    is_key: bool


class Layout(msgspec.Struct, frozen=True, gc=False):
    """A :class:`ChangeTable` for sources that have no wire layout of their own."""

    relation_id: int
    namespace: str
    name: str
    columns: tuple[LayoutColumn, ...]


class DecodedColumns(Protocol):
    """Rows decoded column by column: string arrays in the layout's column order, and
    per row with unchanged columns (values the source did not send), the row's index
    and those columns' indexes (their values are null in the arrays)."""

    @property
    def arrays(self) -> Sequence[pa.Array]: ...

    @property
    def unchanged(self) -> Sequence[tuple[int, Sequence[int]]]: ...


class EncodedRows(Protocol):
    """Row changes of one table still encoded, with their change columns as arrays:
    the vectorized path of a source that can decode many rows at once (PostgreSQL's
    pgoutput walk). Only inserts (``c``), deletes (``d``) and updates that carry just
    their new row (``u``)."""

    def __len__(self) -> int: ...

    @property
    def lsns(self) -> np.ndarray: ...

    @property
    def seqs(self) -> np.ndarray: ...

    @property
    def commit_lsns(self) -> np.ndarray: ...

    @property
    def commit_ts(self) -> np.ndarray: ...

    @property
    def xids(self) -> np.ndarray: ...

    def select(self, which: np.ndarray) -> EncodedRows:
        """The rows picked by *which* (a mask or indexes)."""
        ...

    def op_indexes(self) -> np.ndarray:
        """Each row's op as an index into ``("c", "u", "d")`` (int8)."""
        ...

    def decode(self, width: int) -> DecodedColumns | None:
        """Every row's *width* columns at once; None when the rows do not fit the
        layout of that vectorized decoding (then read them one by one with
        :meth:`row`, which raises the exact error of a malformed one)."""
        ...

    def row(self, i: int) -> tuple[str, WireTuple, int, int, Commit]:
        """Row *i* decoded alone: op, values, position, ``seq`` and commit."""
        ...


class ChangeSink(Protocol):
    """Receives a partition's changes and builds the stream's change rows."""

    def relation(self, rel: ChangeTable, at: int = 0) -> None:
        """A table's (new) column layout, seen in a transaction committing at *at* (0:
        unknown); later rows of ``rel.relation_id`` use it."""

    def rows(self, relation_id: int, block: EncodedRows) -> None:
        """Row changes of one table, still encoded (the vectorized path)."""

    def add(self, relation_id: int, op: str, values: WireTuple | None, lsn: int, seq: int,
            txn: Commit, may_have_toast: bool, old: WireTuple | None) -> None:
        """One decoded row change: *values* in the layout's column order (None for a
        truncate); *may_have_toast*: values may hold
        :data:`~tidemark.event.UNAVAILABLE` (columns the change left as they were);
        *old*: an update's old row when the source has it."""

    def snapshot(self, table: str, texts: pa.Table, at: int, taken_us: int,
                 truncate_first: bool, keys: Sequence[str]) -> None:
        """A snapshot chunk's rows of *table* (``schema.table``) as string columns named
        as the table's, read at position *at*; with *truncate_first*, a truncate first."""

    def columns(self, table: str) -> list[str]:
        """The columns the stream carries for *table* (``schema.table``), in order."""
        ...


class ReadOptions(Protocol):
    """The stream's options a read plan reads (``tidemark.spark.options.SourceOptions``
    is one; kept a protocol so sources need not import the Spark layer)."""

    @property
    def dsn(self) -> str: ...
    @property
    def tables(self) -> Sequence[TableId]: ...
    @property
    def table(self) -> TableId | None: ...
    @property
    def slot(self) -> str: ...
    @property
    def publication(self) -> str: ...
    @property
    def slot_failover(self) -> bool | None: ...
    @property
    def num_partitions(self) -> int: ...
    @property
    def arrow_batch_rows(self) -> int: ...
    @property
    def arrow_batch_bytes(self) -> int: ...
    @property
    def server_timeout_ms(self) -> int: ...
    @property
    def snapshot(self) -> str: ...
    @property
    def snapshot_tables(self) -> Sequence[TableId]: ...
    @property
    def snapshot_chunk_rows(self) -> int: ...
    @property
    def snapshot_chunks_per_trigger(self) -> int: ...
    @property
    def signal_table(self) -> TableId | None: ...
    @property
    def retention_s(self) -> float: ...
    @property
    def reader_name(self) -> str: ...


#: The value of ``snapshot`` that takes tables' existing rows first.
SNAPSHOT_INITIAL: Final = "initial"


@dataclasses.dataclass(frozen=True)
class ColumnLayout:
    """Where a table's columns stood when the query read them, for matching changes
    made under older layouts (renames) to today's columns: the table's id, the
    position the columns were read at, and per attribute number its ``(name, type)``
    (None for a dropped one), or None when the source has no attribute numbers."""

    relation_id: int
    read_at: int
    attrs: tuple[tuple[str, int] | None, ...] | None


@dataclasses.dataclass(frozen=True)
class TableColumns:
    """A captured table as a read plan describes it before a query starts: its columns
    (neutral types, :attr:`tidemark.event.Column.logical`), the metadata key naming the
    source's own type of each column, and its layout (None: none known)."""

    columns: tuple[Column, ...]
    type_key: str = "tidemark.type"
    layout: ColumnLayout | None = None


class ReadPlan(Protocol):
    """What a source implements to be readable by the Spark stream (see the module
    docstring). Picklable: it travels to the executors (drop connections in
    ``__getstate__``)."""

    def tables(self) -> dict[TableId, TableColumns]:
        """Check what can be checked before a query starts (the server, privileges, the
        tables, their keys, the signal table) and describe each captured table; raise a
        SourceError that says what to fix."""
        ...

    def initial_offset(self) -> dict[str, Any]:
        """Where a new query starts."""
        ...

    def prepare_available_now(self) -> None:
        """Trigger.AvailableNow: fix the end the query reads to, then stops."""

    def latest(self, start: dict[str, Any], max_changes: int | None) -> dict[str, Any]:
        """The end of the next batch from *start* (*start* itself when there is nothing
        to read); with *max_changes*, at most that many changes (whole transactions)."""
        ...

    def report_latest(self) -> dict[str, Any] | None:
        """The newest position available, for Spark's progress (None: unknown)."""
        ...

    def plan(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[Any]:
        """The batch ``[start, end)`` as picklable partitions (``num_partitions`` at
        most, but snapshot chunks)."""
        ...

    def read(self, partition: Any, sink: ChangeSink) -> Iterator[None]:
        """Read *partition* into *sink*, yielding wherever the sink's finished batches
        may be handed on (memory stays bounded by the batch size)."""
        ...

    def commit(self, end: dict[str, Any]) -> None:
        """Every batch up to *end* is committed: release what the source keeps for it."""

    def stop(self) -> None:
        """The query stops: close what the driver holds."""

