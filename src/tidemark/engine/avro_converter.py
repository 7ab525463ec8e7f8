"""The Avro converter (its own module, so that only its users import fastavro)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Final

import msgspec

from tidemark.engine.converters import ConvertedRecord, PerThread, flat_row, with_options
from tidemark.engine.records import Routed, as_change_record
from tidemark.event import ChangeEvent, Op
from tidemark.serde.avro import AvroEncoder
from tidemark.serde.debezium_json import DebeziumJsonOptions
from tidemark.serde.modes import TimePrecisionMode

log = logging.getLogger(__name__)

#: The columns whose Avro type holds no placeholder text: an unavailable value of them
#: is null in a plain (not cell) row.
LOSSY_KINDS: Final = ("integer, float, boolean, date, time, timestamp without time "
                      "zone, interval, and decimal or money unless decimal_handling_mode "
                      "is string; arrays of booleans, dates, times, timestamps, "
                      "intervals, decimals, bytes")


class AvroConverter:
    """Avro key and value bytes (schemaless binary; the schemas come from
    :func:`tidemark.serde.avro.avro_schemas`). Transaction BEGIN/END records and
    logical messages are not converted (they have no table schema)."""

    def __init__(self, options: DebeziumJsonOptions | None = None) -> None:
        self.options = options or DebeziumJsonOptions()
        self._per_thread = PerThread(self.options)
        self._avro = threading.local()

    def for_source(self, source: str, cells_by_default: bool, *, flattens: bool,
                   time_precision_mode: TimePrecisionMode | None = None) -> AvroConverter:
        """This converter with the source's default where its options leave it (a copy;
        ``self`` when nothing is left): cells on a log table. Warns once, here, of what
        a log table's unchanged columns lose in Avro: with ``cells=False`` set
        explicitly, or in flattened rows (a flat record has no cells)."""
        if cells_by_default and not flattens and self.options.cells is False:
            log.warning("AvroConverter with DebeziumJsonOptions(cells=False) on a %s "
                        "source: a column an update did not set is written as null "
                        "where its Avro type holds no placeholder (%s), the same as a "
                        "NULL, so a consumer applying it loses the value; leave cells "
                        "unset or set cells=True (cells tell unchanged from NULL)",
                        source, LOSSY_KINDS)
        if cells_by_default and flattens:
            log.warning("AvroConverter after ExtractNewRecordState on a %s source: in a "
                        "flat row a column an update did not set is Debezium's "
                        "placeholder where its Avro type holds one (text, bytes) and "
                        "null otherwise (%s), the same as a NULL; leave out "
                        "ExtractNewRecordState to keep the cells, or flatten with "
                        "DebeziumJsonConverter (leaves the column out of the row) or "
                        "ArrowConverter (names it in _unavailable)", source, LOSSY_KINDS)
        return with_options(self, self.options.for_source(cells_by_default,
                                                          time_precision_mode))

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
                # Cells flatten to their values (an unchanged one left out of the row,
                # so placeholder or null below): the flat schema holds plain values.
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

