"""pgoutput messages to Debezium JSON, with the fused fast path for row changes.

Two builders share one hot loop (:class:`FusedBuilder`) and produce exactly what
:class:`~tidemark.source.postgres.change_builder.ChangeEventBuilder` followed by
:class:`~tidemark.serde.debezium_json.DebeziumJsonSerializer` produce:

* :class:`JsonLineBuilder` — one text per change event, for consumers that only want the
  JSON (``tidemark capture``);
* :class:`RenderedEventBuilder` — the change events themselves, each row change a
  :class:`~tidemark.serde.rendered.RenderedEvent` that carries its key and value texts
  (the embedded engine, whose Debezium JSON converter passes them through).

Inserts, updates without an old tuple and deletes of captured tables go through code
generated per table schema (:mod:`tidemark.source.postgres.pgoutput_json`); every other message,
and any row the generated code does not handle, goes through the change builder (and,
for lines, the serializer). The change builder keeps all the stream state (schemas, the
open transaction and its event counts, the resume position) either way.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any, Final, Generic, TypeVar

from tidemark.event import Op, Record, SnapshotMarker, TableSchema
from tidemark.serde.converted import ConvertedBatch, RenderedRecord, table_destination
from tidemark.serde.debezium_json import DebeziumJsonSerializer
from tidemark.serde.rendered import PENDING, RenderedEvent
from tidemark.source.postgres import pgoutput
from tidemark.source.postgres.change_builder import ChangeEventBuilder
from tidemark.source.postgres.pgoutput_json import Emit, FusedCodec

# Type and tuple-kind bytes of the row messages the fused path handles: an Insert's new
# tuple, an Update with only a new tuple, a Delete's key or old-row tuple.
_FUSED_KINDS: Final = {
    (0x49, 0x4E): Op.CREATE, (0x55, 0x4E): Op.UPDATE,
    (0x44, 0x4B): Op.DELETE, (0x44, 0x4F): Op.DELETE,
}  # fmt: skip
_RELATION: Final = 0x52
#: The hot-loop entry of a row message whose operation is skipped (skipped.operations):
#: dropped before anything is decoded or counted.
_SKIP: Final[tuple[Any, Any, tuple[Any, ...]]] = (None, None, ())
_NOT_SNAPSHOT: Final = SnapshotMarker.FALSE

_T = TypeVar("_T")

#: What the hot loop keeps per message prefix: the ASCII and UTF-8 generated functions
#: and the parts they are called with.
_Hot = tuple[Any, Any, tuple[Any, ...]]


class FusedBuilder(ABC, Generic[_T]):
    """Stateful converter of pgoutput messages with the fused fast path for rows.

    Shares the stream state of *events*; without transaction metadata only (the
    ``transaction`` block is per event there, and BEGIN/END records are not events).
    Subclasses choose the shape of the generated code and of the output; *compiled*
    False keeps lines in the generated Python code (what the compiled writer is tested
    against).
    """

    def __init__(self, events: ChangeEventBuilder, serializer: DebeziumJsonSerializer, *,
                 compiled: bool = True) -> None:
        if serializer.options.transaction_metadata:
            raise ValueError(f"{type(self).__name__} does not support transaction metadata")
        self.events = events
        self._serializer = serializer
        self._codecs: dict[int, FusedCodec] = {}  # relation id -> codec of its schema
        # Message prefix (type, relation id, tuple kind) -> generated functions and their
        # parts; valid for one transaction and one batch (the source block and the
        # processing time differ between them), rebuilt on first use.
        self._hot: dict[bytes, _Hot | None] = {}
        self._context = events.context
        self._compiled = compiled  # lines by the compiled writer where it is built
        self._now_us = 0
        # The append of the batch being processed (for what makes two records of one
        # message; parts are made during a batch and live for it only).
        self._append: Callable[[Any], None] = list[Any]().append
        #: Row messages that the fused path gave up on (for tests and diagnostics).
        self.fallbacks = 0

    def process(self, messages: Sequence[tuple[bytes, int]], now_us: int) -> list[_T]:
        """Convert a batch of ``(pgoutput payload, data_start LSN)`` pairs, in order."""
        out: list[_T] = []
        append = self._append = out.append
        hot = self._hot
        hot.clear()  # a new processing time
        self._now_us = now_us
        miss = self._miss
        for data, lsn in messages:
            entry = hot.get(data[:6]) or miss(data)
            if entry is not None:
                if entry is _SKIP:
                    continue
                ascii_fused, utf8_fused, parts = entry
                try:
                    if ascii_fused is utf8_fused:  # compiled: reads the bytes itself
                        append(ascii_fused(data, "", lsn, parts))
                        continue
                    try:
                        text = data.decode("ascii")
                    except UnicodeDecodeError:
                        append(utf8_fused(data, "", lsn, parts))
                    else:
                        append(ascii_fused(data, text, lsn, parts))
                    continue
                except Exception:  # the general path decides what it is
                    self.fallbacks += 1
            self._general(data, lsn, out)
        return out

    @abstractmethod
    def _add_general(self, records: list[Record], out: list[_T]) -> None:
        """Append what the general path made of one message."""

    def _codec(self, schema: TableSchema) -> FusedCodec:
        return FusedCodec(schema, self._serializer.options, compiled=self._compiled)

    @abstractmethod
    def _parts(self, schema: TableSchema, op: Op) -> tuple[Any, ...]:
        """The *parts* argument of the generated functions for the current transaction
        and batch."""

    def _general(self, data: bytes, lsn: int, out: list[_T]) -> None:
        events = self.events
        records = events.process(((data, lsn),), self._now_us)
        if records:
            self._add_general(records, out)
        if events.context is not self._context or (data and data[0] == _RELATION):
            # A new transaction (or origin) changes the source block; a Relation
            # message may change a schema.
            self._context = events.context
            self._hot.clear()

    def _miss(self, data: bytes) -> _Hot | None:
        """The hot-loop entry for messages starting like *data*, made and remembered
        for a row message (None: use the general path)."""
        prefix = data[:6]
        if len(prefix) < 6 or prefix in self._hot:
            return None
        op = _FUSED_KINDS.get((data[0], data[5]))
        if op is None:
            return None
        entry = self._hot[prefix] = self._make_entry(data, op)
        return entry

    def _make_entry(self, data: bytes, op: Op) -> _Hot | None:
        relation_id = int.from_bytes(data[1:5], "big")
        schema = self.events.schemas.get(relation_id)
        if schema is None:  # not captured, or unknown: the general path says which
            return None
        if op in self.events.skipped_operations:
            # The fused kinds are one operation each (an Update without an old tuple
            # kept its key), so the whole message goes.
            return _SKIP
        codec = self._codecs.get(relation_id)
        if codec is None or codec.schema is not schema:
            codec = self._codecs[relation_id] = self._codec(schema)
        ascii_fused, utf8_fused = (codec.insert if op is Op.CREATE else
                                   codec.update if op is Op.UPDATE else codec.delete)
        return ascii_fused, utf8_fused, self._parts(schema, op)


class JsonLineBuilder(FusedBuilder[str]):
    """pgoutput messages to Debezium JSON lines: one text per change event (its line,
    and its tombstone line after a delete)."""

    def _add_general(self, records: list[Record], out: list[str]) -> None:
        out += self._serializer.text_lines(records)

    def _parts(self, schema: TableSchema, op: Op) -> tuple[Any, ...]:
        return self._serializer.stream_line_parts(schema, self.events.context, op,
                                                  self._now_us)


class RenderedEventBuilder(FusedBuilder[Record]):
    """pgoutput messages to change events; row changes the fused path handles become
    :class:`RenderedEvent` s carrying the serializer's key and value texts, all others
    are the change builder's records.

    With *converted_records*, row changes the fused path handles become the engine's
    :class:`~tidemark.serde.converted.RenderedRecord` s instead: what its Debezium
    JSON converter would make of the RenderedEvent (a delete, its record and its
    tombstone's), with the event of an insert or update made only if someone reads it
    (for an engine without transforms, see :mod:`tidemark.engine.prerender`). A batch
    made of those records only is a :class:`~tidemark.serde.converted.ConvertedBatch`.
    """

    def __init__(self, events: ChangeEventBuilder, serializer: DebeziumJsonSerializer, *,
                 converted_records: bool = False) -> None:
        super().__init__(events, serializer)
        self._converted_records = converted_records
        self._general_records = False  # the current batch has some of the general path's

    def process(self, messages: Sequence[tuple[bytes, int]], now_us: int) -> list[Record]:
        self._general_records = False
        out = super().process(messages, now_us)
        if self._converted_records and not self._general_records:
            # Records outside the Routed types, as in _record_parts.
            batch: Any = ConvertedBatch(out)  # type: ignore[arg-type]
            return batch  # type: ignore[no-any-return]
        return out

    def _codec(self, schema: TableSchema) -> FusedCodec:
        return FusedCodec(schema, self._serializer.options, events=True,
                          records=self._converted_records)

    def _add_general(self, records: list[Record], out: list[Record]) -> None:
        if records:
            self._general_records = True
            out += records

    def _parts(self, schema: TableSchema, op: Op) -> tuple[Any, ...]:
        head, middle, tail = self._serializer.stream_value_parts(
            schema, self.events.context, op, self._now_us)
        if not self._converted_records:
            return head, middle, tail, self._emitter(schema, op)
        if op is Op.DELETE:
            return head, middle, tail, self._delete_records(schema)
        return head, middle, tail, *self._record_parts(schema, op)

    def _emitter(self, schema: TableSchema, op: Op) -> Emit:
        """What the generated code of (*schema*, *op*) hands its results to in the
        current transaction and batch: makes the event, as the change builder would,
        counting it in the transaction's orders (kept here: entries live for one
        transaction, the orders object too)."""
        orders = self.events.orders
        cell = orders.cell(schema.table)
        context = self.events.context
        now_us = self._now_us
        # The row is decoded from the message only if someone reads it (see RenderedEvent).
        before, after = (PENDING, None) if op is Op.DELETE else (None, PENDING)

        def emit(lsn: int, data: bytes, key: str | None, value: str) -> RenderedEvent:
            total = orders.total = orders.total + 1
            order = cell[0] = cell[0] + 1
            return RenderedEvent(op, schema, before, after, context, lsn, total, order,
                                 now_us, _NOT_SNAPSHOT, None, None, key, value, data,
                                 pgoutput.parse_row)
        return emit

    def _delete_records(self, schema: TableSchema) -> Emit:
        """The *emit* of a delete's generated code for converted records in the current
        transaction and batch: appends the delete's record and returns its tombstone's
        (or, without a tombstone, returns the delete's), both with the event the
        converter would give them."""
        make_event = self._emitter(schema, Op.DELETE)
        destination = table_destination(self.events.context.name, schema.table)
        append = self._append
        tombstones = self._serializer.options.tombstones_on_delete

        def emit(lsn: int, data: bytes, key: str | None, value: str) -> RenderedRecord:
            event = make_event(lsn, data, key, value)
            record = RenderedRecord(destination, key, value, event)
            if key is None or not tombstones:
                return record
            append(record)
            return RenderedRecord(destination, key, None, event)
        return emit

    def _record_parts(self, schema: TableSchema, op: Op) -> tuple[Any, ...]:
        """The rest of a :data:`~tidemark.source.postgres.pgoutput_json.RecordFunction`'s parts in
        the current transaction and batch: RenderedRecords whose event, made on demand,
        is the one :meth:`_emitter` would make."""
        context = self.events.context
        now_us = self._now_us

        def make_event(record: RenderedRecord) -> RenderedEvent:
            return RenderedEvent(op, schema, None, PENDING, context, record.lsn,
                                 record.total_order, record.collection_order, now_us,
                                 _NOT_SNAPSHOT, None, None, record.key, record.value,
                                 record.wire, pgoutput.parse_row)

        orders = self.events.orders
        return (RenderedRecord, table_destination(context.name, schema.table), make_event,
                orders, orders.cell(schema.table))
