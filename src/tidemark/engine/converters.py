"""Converters: records after the transforms → what the consumer receives.

Each converter turns a list of :class:`ChangeRecord` into :class:`ConvertedRecord` s
(destination, key, value). ``DebeziumJsonConverter`` gives JSON bytes identical to what
Debezium's JsonConverter (``schemas.enable=false``) writes, ``AvroConverter`` Avro
bytes, ``EventConverter`` the Python event objects untouched. Converters are called from
several workers at once, so they keep their caches per thread.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any, Protocol

import msgspec

from tidemark.engine.records import ChangeRecord, DeleteHandling, Flatten
from tidemark.event import ChangeEvent, Op, TransactionBoundary
from tidemark.serde.avro import AvroEncoder
from tidemark.serde.debezium_json import DebeziumJsonOptions, DebeziumJsonSerializer


class ConvertedRecord(msgspec.Struct, gc=False):
    """What a consumer receives: ``key`` and ``value`` in the converter's format (None
    for a tombstone's value or a keyless table's key), and the record they came from."""

    destination: str
    key: Any
    value: Any
    record: ChangeRecord


class Converter(Protocol):
    """Turns transformed records into consumer records; may emit more records than it
    gets (Debezium's tombstone after a delete) or fewer. Must be thread-safe."""

    def convert(self, records: Sequence[ChangeRecord]) -> list[ConvertedRecord]: ...


class EventConverter:
    """No serialization: the value is the event itself (``ChangeEvent`` or
    ``TransactionBoundary``), the key the event's key as a dict."""

    def convert(self, records: Sequence[ChangeRecord]) -> list[ConvertedRecord]:
        out = []
        for record in records:
            event = record.event
            key = event.key if isinstance(event, ChangeEvent) else {"id": event.id}
            out.append(ConvertedRecord(record.destination, key, event, record))
        return out


def _flat_row(value: dict[str, Any], flatten: Flatten) -> dict[str, Any] | None:
    """The row of a flattened record from the decoded envelope (None: a tombstone)."""
    op = value["op"]
    deleted = op == "d"
    if deleted and flatten.delete_handling is DeleteHandling.TOMBSTONE:
        return None
    row: dict[str, Any] = dict(value["before"] if deleted else value["after"])
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


class _PerThread:
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
    def avro(self) -> AvroEncoder:
        encoder: AvroEncoder | None = getattr(self._local, "avro", None)
        if encoder is None:
            encoder = self._local.avro = AvroEncoder(self.options)
        return encoder


class DebeziumJsonConverter:
    """Debezium JSON key and value bytes (tombstones after deletes unless turned off in
    the options; BEGIN/END records only with ``transaction_metadata``)."""

    def __init__(self, options: DebeziumJsonOptions | None = None) -> None:
        self.options = options or DebeziumJsonOptions()
        self._per_thread = _PerThread(self.options)
        self._encoder = msgspec.json.Encoder()

    def convert(self, records: Sequence[ChangeRecord]) -> list[ConvertedRecord]:
        serializer = self._per_thread.json
        key_and_value = serializer.key_and_value
        tombstones = self.options.tombstones_on_delete
        out: list[ConvertedRecord] = []
        append = out.append
        for record in records:
            event = record.event
            if isinstance(event, TransactionBoundary):
                if self.options.transaction_metadata:
                    key, value = serializer.boundary_key_and_value(event)
                    append(ConvertedRecord(record.destination, key.encode(), value.encode(),
                                           record))
                continue
            key, value = key_and_value(event)
            key_bytes = None if key == "null" else key.encode()
            if record.flatten is not None:
                row = _flat_row(msgspec.json.decode(value), record.flatten)
                append(ConvertedRecord(record.destination, key_bytes,
                                       None if row is None else self._encoder.encode(row),
                                       record))
                continue
            append(ConvertedRecord(record.destination, key_bytes, value.encode(), record))
            if tombstones and key_bytes is not None and event.op is Op.DELETE:
                append(ConvertedRecord(record.destination, key_bytes, None, record))
        return out


class AvroConverter:
    """Avro key and value bytes (schemaless binary; the schemas come from
    :func:`tidemark.serde.avro.avro_schemas`). Transaction BEGIN/END records and
    logical messages are not converted (they have no table schema)."""

    def __init__(self, options: DebeziumJsonOptions | None = None) -> None:
        self.options = options or DebeziumJsonOptions()
        self._per_thread = _PerThread(self.options)

    def convert(self, records: Sequence[ChangeRecord]) -> list[ConvertedRecord]:
        serializer = self._per_thread.json
        avro = self._per_thread.avro
        tombstones = self.options.tombstones_on_delete
        out: list[ConvertedRecord] = []
        for record in records:
            event = record.event
            if not isinstance(event, ChangeEvent) or event.schema is None:
                continue
            key_json, value_json = serializer.key_and_value(event)
            key = avro.key(event, key_json)
            value = msgspec.json.decode(value_json)
            if record.flatten is not None:
                row = _flat_row(value, record.flatten)
                out.append(ConvertedRecord(
                    record.destination, key,
                    None if row is None else avro.flat(event, row, record.flatten.add_fields),
                    record))
                continue
            out.append(ConvertedRecord(record.destination, key, avro.envelope(event, value),
                                       record))
            if tombstones and key is not None and event.op is Op.DELETE:
                out.append(ConvertedRecord(record.destination, key, None, record))
        return out
