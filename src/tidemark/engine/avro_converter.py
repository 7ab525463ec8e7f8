"""The Avro converter (its own module, so that only its users import fastavro)."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import msgspec

from tidemark.engine.converters import ConvertedRecord, PerThread, flat_row
from tidemark.engine.records import Routed, as_change_record
from tidemark.event import ChangeEvent, Op
from tidemark.serde.avro import AvroEncoder
from tidemark.serde.debezium_json import DebeziumJsonOptions


class AvroConverter:
    """Avro key and value bytes (schemaless binary; the schemas come from
    :func:`tidemark.serde.avro.avro_schemas`). Transaction BEGIN/END records and
    logical messages are not converted (they have no table schema)."""

    def __init__(self, options: DebeziumJsonOptions | None = None) -> None:
        self.options = options or DebeziumJsonOptions()
        self._per_thread = PerThread(self.options)
        self._avro = threading.local()

    def convert(self, records: Sequence[Routed]) -> list[ConvertedRecord]:
        serializer = self._per_thread.json
        avro: AvroEncoder | None = getattr(self._avro, "encoder", None)
        if avro is None:
            avro = self._avro.encoder = AvroEncoder(self.options)
        tombstones = self.options.tombstones_on_delete
        out: list[ConvertedRecord] = []
        for routed in records:
            record = as_change_record(routed)
            event = record.event
            if not isinstance(event, ChangeEvent) or event.schema is None:
                continue
            key_json, value_json = serializer.key_and_value(event)
            key = avro.key(event, key_json)
            value = msgspec.json.decode(value_json)
            if record.flatten is not None:
                # Cells flatten to their values (an unchanged one to null), as the JSON
                # converter's rows: the flat schema holds plain values.
                cells = None
                if self.options.cells:
                    cells = [c.name for c in event.schema.columns if not c.is_key]
                row = flat_row(value, record.flatten, cells)
                out.append(ConvertedRecord(
                    record.destination, key,
                    None if row is None else avro.flat(event, row, record.flatten.add_fields),
                    event))
                continue
            out.append(ConvertedRecord(record.destination, key, avro.envelope(event, value),
                                       event))
            if tombstones and key is not None and event.op is Op.DELETE:
                out.append(ConvertedRecord(record.destination, key, None, event))
        return out

