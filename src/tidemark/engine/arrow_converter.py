"""The Arrow converter (its own module: importing pyarrow takes a while, and only the
users of this converter should pay for it)."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from tidemark.engine.converters import ConvertedRecord
from tidemark.engine.records import Routed, as_change_record
from tidemark.event import ChangeEvent
from tidemark.serde.arrow_changes import ArrowChangeEncoder


class ArrowConverter:
    """Arrow record batches of change rows (:mod:`tidemark.serde.arrow_changes`): one
    ConvertedRecord per run of consecutive events of one table and destination, whose
    value is a ``pyarrow.RecordBatch`` (key None). The rows are already flat, so
    ExtractNewRecordState changes nothing here; logical messages and transaction
    BEGIN/END records are left out."""

    def __init__(self) -> None:
        self._local = threading.local()

    def convert(self, records: Sequence[Routed]) -> list[ConvertedRecord]:
        encoder: ArrowChangeEncoder | None = getattr(self._local, "encoder", None)
        if encoder is None:
            encoder = self._local.encoder = ArrowChangeEncoder()
        out: list[ConvertedRecord] = []
        run: list[ChangeEvent] = []  # consecutive events of one destination and schema
        run_destination = ""
        for routed in records:
            record = as_change_record(routed)
            event = record.event
            if not isinstance(event, ChangeEvent) or event.schema is None:
                continue
            if run and (record.destination != run_destination
                        or event.schema is not run[0].schema):
                out.append(ConvertedRecord(run_destination, None, encoder.encode(run), run[-1]))
                run = []
            run_destination = record.destination
            run.append(event)
        if run:
            out.append(ConvertedRecord(run_destination, None, encoder.encode(run), run[-1]))
        return out
