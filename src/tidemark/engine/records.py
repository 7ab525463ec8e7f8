"""The record as it moves through the engine: a source record plus what transforms set."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from enum import StrEnum

import msgspec

from tidemark.event import ChangeEvent, Op, Record
from tidemark.serde.converted import table_destination
from tidemark.serde.rendered import RenderedEvent

#: Stands for "no table yet" where a loop caches by schema object (None is a schema
#: value: logical messages have none).
NO_SCHEMA: object = object()


class DeleteHandling(StrEnum):
    """What a flattened delete becomes (Debezium's ``delete.handling.mode`` of
    ``ExtractNewRecordState``)."""

    DROP = "drop"  # no record
    TOMBSTONE = "tombstone"  # the key with a null value
    REWRITE = "rewrite"  # the before row plus "__deleted": "true"


class Flatten(msgspec.Struct, frozen=True, gc=False):
    """Deliver the row state instead of the envelope (set by ExtractNewRecordState).

    ``add_fields`` are envelope fields copied into the row as ``__<field>``: ``op``,
    ``table``, ``schema``, ``db``, ``lsn``, ``txId``, ``source_ts_ms``, ``ts_ms``.
    """

    delete_handling: DeleteHandling = DeleteHandling.DROP
    add_fields: tuple[str, ...] = ()


class ChangeRecord(msgspec.Struct, gc=False):
    """A source record on its way to the consumer.

    ``destination`` names where it goes (Debezium's topic: ``<prefix>.<schema>.<table>``
    by default; a Route transform changes it). ``flatten`` is set when the consumer
    should get the new row state rather than the change envelope.
    """

    event: Record
    destination: str
    flatten: Flatten | None = None

    @classmethod
    def of(cls, record: Record) -> ChangeRecord:
        return cls(record, default_destination(record))


#: What reaches a converter: a record changed by a transform, or (untouched) the event.
Routed = ChangeRecord | Record


def as_change_record(routed: Routed) -> ChangeRecord:
    """*routed* as a ChangeRecord (an untouched event gets its default destination)."""
    return routed if isinstance(routed, ChangeRecord) else ChangeRecord.of(routed)


class Destinations:
    """Default destinations, cached per table schema (one string per table instead of
    one per record). Not thread-safe: one per converter thread."""

    def __init__(self) -> None:
        self._cache: dict[int, tuple[object, str, str]] = {}

    def of(self, event: ChangeEvent) -> str:
        schema = event.schema
        entry = self._cache.get(id(schema))
        name = event.context.name
        if entry is None or entry[0] is not schema or entry[1] != name:
            entry = (schema, name, default_destination(event))
            self._cache[id(schema)] = entry
        return entry[2]

    def route(self, records: Sequence[Record]) -> list[ChangeRecord]:
        """*records* (one task's batch) as ChangeRecords to their default destinations,
        looked up once per run of one table's events."""
        out: list[ChangeRecord] = []
        append = out.append
        last_schema: object = NO_SCHEMA
        destination = ""
        for record in records:
            # Exact types first: isinstance() of a struct of another class is slow.
            if type(record) is ChangeEvent or type(record) is RenderedEvent or isinstance(
                    record, ChangeEvent):
                if record.schema is not last_schema:
                    last_schema, destination = record.schema, self.of(record)
                append(ChangeRecord(record, destination))
            else:
                append(ChangeRecord(record, default_destination(record)))
        return out


def default_destination(record: Record) -> str:
    """Debezium's topic name for *record*."""
    if not isinstance(record, ChangeEvent):  # <topic.prefix>.transaction (confirmed by capture)
        return f"{record.topic_prefix}.transaction" if record.topic_prefix else "transaction"
    if record.op is Op.MESSAGE or record.schema is None:
        return f"{record.context.name}.message"
    return table_destination(record.context.name, record.schema.table)


def key_routing_key(record: Record) -> Hashable:
    """What decides the worker of *record* in per-key delivery by key: its table and key
    values; otherwise (keyless tables, events without a row, messages, boundaries) what
    :func:`table_routing_key` gives."""
    if record.__class__ is ChangeEvent or isinstance(record, ChangeEvent):
        schema = record.schema
        if schema is not None and (keys := schema.key_indexes):
            row = record.raw_before if record.op is Op.DELETE else record.raw_after
            if row is not None:
                if len(keys) == 1:
                    return (schema.table, row[keys[0]])
                return (schema.table, *[row[i] for i in keys])
    return table_routing_key(record)


def table_routing_key(record: Record) -> Hashable:
    """What decides the worker of *record* in per-key delivery by table."""
    if record.__class__ is not ChangeEvent and not isinstance(record, ChangeEvent):
        return record.id
    schema = record.schema
    return record.message_prefix if schema is None else schema.table
