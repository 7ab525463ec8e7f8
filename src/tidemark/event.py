"""The change event: Debezium's envelope, as immutable Python objects.

A :class:`ChangeEvent` is what every connector produces and every runtime (the
embedded engine, ``tidemark capture``, the Spark source) consumes. It mirrors
Debezium's record — ``op``, ``before``, ``after``, ``source``, ``transaction`` and the
record key — and adds what Debezium leaves out: the commit LSN and commit timestamp of
the event's transaction, on every event.

Row values are kept in the source's wire form and converted on access, so that a
runtime which only re-serializes events (``tidemark capture``) never builds Python
objects it does not need. ``before``/``after``/``key`` return native Python values
(``int``, ``Decimal``, ``datetime`` …); an unchanged TOASTed column that the source did
not send is :data:`UNAVAILABLE`, never ``None``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping, Sequence
from enum import StrEnum
from typing import Any, Final, TypeAlias

import msgspec

from tidemark.logical_type import LogicalType
from tidemark.source_block import BARE_BLOCK, SourceBlock, block_dict


class Unavailable:
    """Type of :data:`UNAVAILABLE`; a singleton that survives pickling."""

    __slots__ = ()
    _instance: Unavailable | None = None

    def __new__(cls) -> Unavailable:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNAVAILABLE"

    def __reduce__(self) -> str:
        return "UNAVAILABLE"

    def __bool__(self) -> bool:
        return False


#: A column value the source did not send (PostgreSQL: an unchanged TOASTed value).
#: Debezium writes ``__debezium_unavailable_value`` in its place; Python code sees this
#: marker, never ``None``, so "unknown" cannot be mistaken for SQL NULL.
UNAVAILABLE: Final = Unavailable()

#: A column value as a source sent it: text, binary, SQL NULL, or not sent.
WireValue: TypeAlias = str | bytes | Unavailable | None
WireTuple: TypeAlias = tuple[WireValue, ...]


class Op(StrEnum):
    """Debezium operation codes."""

    CREATE = "c"
    UPDATE = "u"
    DELETE = "d"
    READ = "r"  # a snapshot row
    TRUNCATE = "t"
    MESSAGE = "m"  # a logical decoding message


class SnapshotMarker(StrEnum):
    """Values of ``source.snapshot`` (Debezium's ``SnapshotRecord``)."""

    FALSE = "false"
    TRUE = "true"
    FIRST = "first"
    FIRST_IN_DATA_COLLECTION = "first_in_data_collection"
    LAST_IN_DATA_COLLECTION = "last_in_data_collection"
    LAST = "last"
    INCREMENTAL = "incremental"


class TableId(msgspec.Struct, frozen=True, gc=False):
    """A table's schema-qualified name."""

    schema: str
    table: str

    def __str__(self) -> str:
        return f"{self.schema}.{self.table}"

    @classmethod
    def parse(cls, text: str, default_schema: str = "public") -> TableId:
        """Parse ``schema.table`` (or ``table`` in *default_schema*)."""
        schema, dot, table = text.partition(".")
        if not dot:
            return cls(default_schema, schema)
        return cls(schema, table)


class Column(msgspec.Struct, frozen=True, gc=False):
    """A column of a captured table, as the source described it.

    ``logical`` is what serializers switch on, and fixes the text form of the column's
    wire values (:mod:`tidemark.wire_text`); ``type_name`` is the source's own name of
    the type (``numeric(12,2)``, ``mood[]``, ``bigint unsigned``); ``parse`` turns a text
    value into its native Python value.
    """

    name: str
    logical: LogicalType
    type_name: str
    is_key: bool
    parse: Callable[[str], Any]
    nullable: bool = True


class TableSchema(msgspec.Struct, frozen=True, gc=False):
    """One version of a table's columns; a new object after every schema change.

    ``key_indexes`` are the positions of the record-key columns: the primary key, or
    the replica identity index, or empty when the table has neither (no key).
    """

    table: TableId
    columns: tuple[Column, ...]
    key_indexes: tuple[int, ...]
    replica_identity: str
    version: int = 0

    @property
    def column_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    @property
    def key_names(self) -> tuple[str, ...]:
        return tuple(self.columns[i].name for i in self.key_indexes)

    def to_python(self, values: WireTuple | None) -> dict[str, Any] | None:
        """Convert a wire tuple to ``{column: native value}``."""
        if values is None:
            return None
        row: dict[str, Any] = {}
        for col, raw in zip(self.columns, values, strict=True):
            if raw is None or raw is UNAVAILABLE or isinstance(raw, bytes):
                row[col.name] = raw
            else:
                row[col.name] = col.parse(raw)  # type: ignore[arg-type]
        return row

    def key_of(self, values: WireTuple | None) -> dict[str, Any] | None:
        """The record key (``{key column: value}``) of a wire tuple, or None if keyless."""
        if values is None or not self.key_indexes:
            return None
        out: dict[str, Any] = {}
        for i in self.key_indexes:
            raw = values[i]
            col = self.columns[i]
            out[col.name] = col.parse(raw) if isinstance(raw, str) else raw
        return out


class SourceInfo(msgspec.Struct, frozen=True, gc=False):
    """Where an event came from: Debezium's ``source`` block.

    ``lsn`` is the event's position (the source's int64 ordering key; PostgreSQL: the
    LSN of the change itself), ``last_commit_lsn`` that of the previous commit where
    the source has it; ``ts_us`` is the commit time (µs since the Unix epoch). For
    snapshot rows ``lsn`` is the slot's consistent point and ``ts_us`` the snapshot
    start. ``fields`` holds the block's own fields (after the common ones and the
    table), in the order the source's :class:`~tidemark.source_block.SourceBlock`
    gives them (PostgreSQL: ``txId``, ``lsn``, ``xmin``, ``origin``, ``origin_lsn``;
    MariaDB: ``server_id``, ``gtid``, ``file``, ``pos``, ``row``, ``thread``,
    ``query``). ``txid``, ``xmin`` and ``origin`` repeat PostgreSQL's for callers that
    read them there.
    """

    connector: str
    name: str
    db: str
    schema: str
    table: str
    ts_us: int
    snapshot: SnapshotMarker
    txid: int | None
    lsn: int | None
    last_commit_lsn: int | None
    xmin: int | None = None
    origin: str | None = None
    fields: Mapping[str, Any] | None = None

    @property
    def position(self) -> int | None:
        """The event's position: the source's int64 ordering key (same as ``lsn``)."""
        return self.lsn


class TransactionInfo(msgspec.Struct, frozen=True, gc=False):
    """The event's place in its transaction plus the transaction's commit position.

    ``id`` follows Debezium's PostgreSQL form ``"<txid>:<lsn>"``. ``total_order`` counts
    events in the transaction from 1; ``data_collection_order`` counts them per table.
    """

    id: str
    total_order: int
    data_collection_order: int
    commit_lsn: int
    commit_ts_us: int


class SourceContext(msgspec.Struct, frozen=True, gc=False):
    """What every event of one transaction (or one snapshot) shares.

    ``tx_id``/``commit_lsn`` are None for snapshot rows and non-transactional messages.
    Sharing one object per transaction keeps per-event allocation small.
    ``commit_lsn`` is the source's int64 commit position (PostgreSQL: the commit LSN);
    ``txid`` the source's transaction number where it has one (the change rows'
    ``_txid``). ``block`` describes the ``source`` block
    (:class:`~tidemark.source_block.SourceBlock`; None: the common fields and the
    table only); it reads its own fields from ``source_fields`` (a ``msgspec.Struct``
    of them, or a tuple in the block's order) or, for a block that carries the event's
    position, from the context's other fields (PostgreSQL's ``txid``,
    ``last_commit_lsn``, ``origin``).
    """

    connector: str
    name: str
    db: str
    ts_us: int
    txid: int | None
    last_commit_lsn: int | None
    tx_id: str | None = None
    commit_lsn: int | None = None
    origin: str | None = None
    source_fields: tuple[Any, ...] | msgspec.Struct | None = None
    block: SourceBlock | None = None


def source_fields_dict(context: SourceContext, position: int | None = None
                       ) -> dict[str, Any]:
    """The own fields of *context*'s ``source`` block by name, in their order, for an
    event at *position*."""
    return block_dict(context.block or BARE_BLOCK, context, position)


class ChangeEvent(msgspec.Struct, frozen=True, gc=False):
    """One row change (or truncate, or logical message), Debezium's envelope.

    ``schema`` describes the row tuples; ``raw_before``/``raw_after`` hold the wire values.
    Use :attr:`before`, :attr:`after` and :attr:`key` for native Python values, and
    :attr:`source`/:attr:`transaction` for Debezium's blocks. ``lsn`` is the change's
    own position — the source's int64 ordering key, whatever the source (PostgreSQL:
    the LSN; MariaDB: binlog file number and offset; log tables: ``cdc$time``), also
    readable as :attr:`position`; ``total_order``/``collection_order`` its place in
    the transaction.
    ``ts_us`` is when tidemark processed the event (Debezium's top-level ``ts_ms``).
    ``message_prefix``/``message_content`` are set for ``op == "m"`` only.
    """

    op: Op
    schema: TableSchema | None
    raw_before: WireTuple | None
    raw_after: WireTuple | None
    context: SourceContext
    lsn: int | None
    total_order: int
    collection_order: int
    ts_us: int
    snapshot: SnapshotMarker = SnapshotMarker.FALSE
    message_prefix: str | None = None
    message_content: bytes | None = None

    @property
    def table(self) -> TableId:
        return self.schema.table if self.schema is not None else TableId("", "")

    @property
    def source(self) -> SourceInfo:
        """Debezium's ``source`` block."""
        c = self.context
        table = self.table
        fields = source_fields_dict(c, self.lsn) if c.block is not None else None
        return SourceInfo(c.connector, c.name, c.db, table.schema, table.table, c.ts_us,
                          self.snapshot, c.txid, self.lsn, c.last_commit_lsn, None, c.origin,
                          fields)

    @property
    def position(self) -> int | None:
        """The event's position: the source's int64 ordering key (``lsn``'s value)."""
        return self.lsn

    @property
    def transaction(self) -> TransactionInfo | None:
        """The event's place in its transaction; None for snapshot rows."""
        c = self.context
        if c.tx_id is None or c.commit_lsn is None or not self.total_order:
            return None
        return TransactionInfo(c.tx_id, self.total_order, self.collection_order,
                               c.commit_lsn, c.ts_us)

    @property
    def before(self) -> dict[str, Any] | None:
        """The row before the change (native values), or None."""
        return self.schema.to_python(self.raw_before) if self.schema else None

    @property
    def after(self) -> dict[str, Any] | None:
        """The row after the change (native values), or None."""
        return self.schema.to_python(self.raw_after) if self.schema else None

    @property
    def key(self) -> dict[str, Any] | None:
        """The record key: primary key / replica identity columns and values."""
        if self.schema is None:
            return None
        row = self.raw_after if self.op != Op.DELETE else self.raw_before
        return self.schema.key_of(row)

    @property
    def commit_lsn(self) -> int | None:
        """LSN of the commit record of the event's transaction (None for snapshot rows)."""
        return self.context.commit_lsn

    @property
    def commit_ts(self) -> dt.datetime:
        """Commit time of the event's transaction (snapshot time for snapshot rows)."""
        return dt.datetime.fromtimestamp(self.context.ts_us / 1_000_000, tz=dt.UTC)


class TransactionBoundary(msgspec.Struct, frozen=True, gc=False):
    """A BEGIN or END record of the transaction-metadata stream.

    ``event_count`` and ``data_collections`` (``(table, count)`` pairs) are set on END.
    ``topic_prefix``: the capture's ``topic.prefix`` (the record's topic is
    ``<topic_prefix>.transaction``).
    """

    status: str
    id: str
    ts_us: int
    commit_lsn: int
    event_count: int | None = None
    data_collections: Sequence[tuple[str, int]] | None = None
    topic_prefix: str = ""


#: What a source task emits: row changes, and BEGIN/END records of the transaction stream.
Record = ChangeEvent | TransactionBoundary
