"""The Arrow converter (its own module: importing pyarrow takes a while, and only the
users of this converter should pay for it)."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from tidemark.engine.converters import ConvertedRecord
from tidemark.engine.records import ChangeRecord, Routed, default_destination
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
        run: list[ChangeEvent] = []
        run_key: tuple[str, object] | None = None
        for routed in records:
            if isinstance(routed, ChangeRecord):
                event, destination = routed.event, routed.destination
            else:
                event, destination = routed, default_destination(routed)
            if not isinstance(event, ChangeEvent) or event.schema is None:
                continue
            key = (destination, event.schema)
            if run and (run_key is None or run_key[0] != key[0] or run_key[1] is not key[1]):
                out.append(ConvertedRecord(run_key[0] if run_key else destination, None,
                                           encoder.encode(run), run[-1]))
                run = []
            run_key = key
            run.append(event)
        if run and run_key is not None:
            out.append(ConvertedRecord(run_key[0], None, encoder.encode(run), run[-1]))
        return out
