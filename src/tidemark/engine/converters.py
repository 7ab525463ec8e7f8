"""Converters: records after the transforms → what the consumer receives.

Each converter turns a list of :class:`ChangeRecord` into :class:`ConvertedRecord` s
(destination, key, value). ``DebeziumJsonConverter`` gives JSON text identical to what
Debezium's JsonConverter (``schemas.enable=false``) writes, ``AvroConverter`` (own module) Avro
bytes, ``EventConverter`` the Python event objects untouched. Converters are called from
several workers at once, so they keep their caches per thread.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Sequence
from typing import Any, Protocol, TypeVar

import msgspec

from tidemark.engine.records import (
    NO_SCHEMA,
    ChangeRecord,
    DeleteHandling,
    Destinations,
    Flatten,
    Routed,
    as_change_record,
    default_destination,
)
from tidemark.engine.transforms import ExtractNewRecordState, Transform
from tidemark.event import ChangeEvent, Op, Record
from tidemark.serde.converted import ConvertedBatch, ConvertedRecord, RenderedRecord
from tidemark.serde.debezium_json import (
    DebeziumJsonOptions,
    DebeziumJsonSerializer,
    EventRenderer,
)
from tidemark.serde.json_lines import JsonLines, lines_of_events
from tidemark.serde.modes import TimePrecisionMode
from tidemark.serde.rendered import RenderedEvent
from tidemark.source.spi import SourceConnector, cells_by_default, source_time_precision_mode

__all__ = ["ConvertedBatch", "ConvertedRecord", "Converter", "DebeziumJsonConverter",
           "EventConverter", "PerThread", "RenderedRecord", "converter_for_source",
           "flat_row"]


class Converter(Protocol):
    """Turns records into consumer records; may emit more records than it gets
    (Debezium's tombstone after a delete) or fewer. A record is a :class:`ChangeRecord`
    when a transform touched it, else the event itself (default destination, not
    flattened). Must be thread-safe."""

    def convert(self, records: Sequence[Routed]) -> list[ConvertedRecord]: ...


class EventConverter:
    """No serialization: the value is the event itself (``ChangeEvent`` or
    ``TransactionBoundary``), the key the event's key as a dict."""

    def convert(self, records: Sequence[Routed]) -> list[ConvertedRecord]:
        out = []
        for routed in records:
            record = as_change_record(routed)
            event, destination = record.event, record.destination
            key = event.key if isinstance(event, ChangeEvent) else {"id": event.id}
            out.append(ConvertedRecord(destination, key, event, event))
        return out


def flat_row(value: dict[str, Any], flatten: Flatten,
             cells: Sequence[str] | None = None) -> dict[str, Any] | None:
    """The row of a flattened record from the decoded envelope (None: a tombstone).

    *cells* names the columns written as ScyllaDB's cells (``{"value": …}``, ``null``
    when unchanged): a set one is flattened to its value, an unchanged one is left out
    of the row, so that absent (unchanged) stays apart from null (set to NULL), where
    Scylla's ``ScyllaExtractNewState`` writes null for both."""
    op = value["op"]
    deleted = op == "d"
    if deleted and flatten.delete_handling is DeleteHandling.TOMBSTONE:
        return None
    row: dict[str, Any] = dict(value["before"] if deleted else value["after"])
    for name in cells or ():
        cell = row.get(name)
        if isinstance(cell, dict):
            row[name] = cell["value"]
        else:
            row.pop(name, None)
    source = value["source"]
    for field in flatten.add_fields:
        if field in ("op", "ts_ms"):
            row[f"__{field}"] = value[field]
        elif field == "source_ts_ms":
            row["__source_ts_ms"] = source["ts_ms"]
        else:
            row[f"__{field}"] = source[field]
    if flatten.delete_handling is DeleteHandling.REWRITE:
        row["__deleted"] = "true" if deleted else "false"
    return row


class PerThread:
    """A serializer per worker thread (they cache per table schema and are not
    thread-safe)."""

    def __init__(self, options: DebeziumJsonOptions) -> None:
        self.options = options
        self._local = threading.local()

    @property
    def json(self) -> DebeziumJsonSerializer:
        serializer: DebeziumJsonSerializer | None = getattr(self._local, "json", None)
        if serializer is None:
            serializer = self._local.json = DebeziumJsonSerializer(self.options)
        return serializer

    @property
    def destinations(self) -> Destinations:
        cache: Destinations | None = getattr(self._local, "destinations", None)
        if cache is None:
            cache = self._local.destinations = Destinations()
        return cache



class _OptionsConverter(Protocol):
    options: DebeziumJsonOptions

    def __init__(self, options: DebeziumJsonOptions | None = None) -> None: ...


_Options = TypeVar("_Options", bound=_OptionsConverter)


def with_options(converter: _Options, options: DebeziumJsonOptions) -> _Options:
    """*converter* made anew with *options* (a copy whose per-thread state is fresh), or
    *converter* itself when they are its own: what ``for_source`` returns."""
    if options is converter.options:
        return converter
    resolved = copy.copy(converter)
    type(converter).__init__(resolved, options)
    return resolved


def converter_for_source(converter: Converter, connector: SourceConnector,
                         transforms: Sequence[Transform]) -> Converter:
    """*converter* with what its options leave to the source resolved for *connector*
    (cells on log tables, :func:`~tidemark.source.spi.cells_by_default`), through its
    optional ``for_source(source, cells_by_default, flattens=…, time_precision_mode=…)``
    (*flattens*: one of *transforms* is ExtractNewRecordState; *time_precision_mode*: the
    connector's, or None; a converter without the method is used as it is). Called once,
    as the engine is made: nothing of it is left to do per record."""
    for_source = getattr(converter, "for_source", None)
    if for_source is None:
        return converter
    flattens = any(isinstance(t, ExtractNewRecordState) for t in transforms)
    resolved: Converter = for_source(connector.name, cells_by_default(connector),
                                     flattens=flattens,
                                     time_precision_mode=source_time_precision_mode(connector))
    return resolved


class DebeziumJsonConverter:
    """Debezium JSON key and value texts (``str``, as Debezium's engine gives with its
    Json format); a tombstone after each delete unless turned off in the options;
    BEGIN/END records only with ``transaction_metadata``.

    A :class:`RenderedEvent` already carries its texts (a source wrote them in
    :attr:`rendered_options`, on the engine's request): they are passed through, and
    so is a :class:`RenderedRecord` (the source made the record too), and a
    :class:`ConvertedBatch` as a whole."""

    def __init__(self, options: DebeziumJsonOptions | None = None) -> None:
        self.options = options or DebeziumJsonOptions()
        self._per_thread = PerThread(self.options)
        self._encoder = msgspec.json.Encoder()

    def for_source(self, source: str, cells_by_default: bool, *, flattens: bool,
                   time_precision_mode: TimePrecisionMode | None = None
                   ) -> DebeziumJsonConverter:
        """This converter with the source's default where its options leave it (a copy;
        ``self`` when nothing is left): cells on a log table. Without cells an
        unchanged column is Debezium's placeholder text, also in a column of another
        type (schema-invalid there, but never taken for NULL)."""
        return with_options(self, self.options.for_source(cells_by_default,
                                                          time_precision_mode))

    @property
    def rendered_options(self) -> DebeziumJsonOptions | None:
        """The options in which sources may pre-render events for this converter (None
        with transaction metadata, whose per-event blocks sources do not write)."""
        return None if self.options.transaction_metadata else self.options

    def lines(self, records: Sequence[Record]) -> JsonLines:
        """Untransformed *records* as Debezium JSON lines, written by the serializer
        without a record per event (for a lines consumer, when the source did not
        write the lines itself)."""
        return lines_of_events(self._per_thread.json, records)

    def convert(self, records: Sequence[Routed]) -> list[ConvertedRecord]:
        # Made by the source for this converter (outside the Routed types, as below).
        if type(records) is ConvertedBatch:  # type: ignore[comparison-overlap]
            return records
        per_thread = self._per_thread
        serializer = per_thread.json
        destination_of = per_thread.destinations.of
        renderer = serializer.renderer
        tombstones = self.options.tombstones_on_delete
        out: list[ConvertedRecord] = []
        append = out.append
        delete = Op.DELETE
        last_schema: object = NO_SCHEMA  # of the last event's table, and its destination
        last_destination = ""
        render_schema: object = NO_SCHEMA  # of the last serialized event, and its writer
        render: EventRenderer = serializer.general_key_and_value
        # The hot path of the engine: unwrapped by hand (as_change_record would allocate
        # a ChangeRecord per event), with the destination and the generated writer
        # looked up once per run of one table's changes (a schema object belongs to one
        # task, so one topic prefix), and exact type tests first: isinstance() of a
        # msgspec struct that is not of that class costs as much as writing a row.
        for record in records:
            # Made by the source for this converter (the engine asked for them, having
            # no transforms: they are outside the Routed types transforms see).
            if type(record) is RenderedRecord:  # type: ignore[comparison-overlap]
                append(record)
                continue
            if type(record) is RenderedEvent:
                # Untouched and already written (the fused path).
                if record.schema is not last_schema:
                    last_schema, last_destination = record.schema, destination_of(record)
                key_text = record.key_text
                append(ConvertedRecord(last_destination, key_text, record.value_text, record))
                if tombstones and key_text is not None and record.op is delete:
                    append(ConvertedRecord(last_destination, key_text, None, record))
                continue
            flatten: Flatten | None = None
            event: Record
            if type(record) is ChangeRecord:
                event, destination, flatten = record.event, record.destination, record.flatten
            elif type(record) is ChangeEvent:
                if record.schema is not last_schema:
                    last_schema, last_destination = record.schema, destination_of(record)
                event, destination = record, last_destination
            elif isinstance(record, ChangeRecord):
                event, destination, flatten = record.event, record.destination, record.flatten
            elif isinstance(record, ChangeEvent):
                event, destination = record, destination_of(record)
            else:
                event, destination = record, default_destination(record)
            if type(event) is RenderedEvent:
                key_text, value = event.key_text, event.value_text
            elif type(event) is ChangeEvent or isinstance(event, ChangeEvent):
                schema = event.schema
                if schema is not render_schema:
                    render_schema, render = schema, renderer(schema)
                key, value = render(event)
                key_text = None if key == "null" else key
            else:
                if self.options.transaction_metadata:
                    key, value = serializer.boundary_key_and_value(event)
                    append(ConvertedRecord(destination, key, value, event))
                continue
            if flatten is not None:
                cells = None
                if self.options.cells and isinstance(event, ChangeEvent) and event.schema:
                    cells = [c.name for c in event.schema.columns if not c.is_key]
                row = flat_row(msgspec.json.decode(value), flatten, cells)
                append(ConvertedRecord(destination, key_text,
                                       None if row is None else
                                       self._encoder.encode(row).decode(), event))
                continue
            append(ConvertedRecord(destination, key_text, value, event))
            if tombstones and key_text is not None and event.op is delete:
                append(ConvertedRecord(destination, key_text, None, event))
        return out
