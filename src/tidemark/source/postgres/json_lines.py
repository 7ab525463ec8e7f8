"""pgoutput messages to Debezium JSON lines, with the fused fast path for row changes.

:class:`JsonLineBuilder` produces exactly the lines that
:class:`~tidemark.source.postgres.change_builder.ChangeEventBuilder` followed by
:class:`~tidemark.serde.debezium_json.DebeziumJsonSerializer` produce, one text per
change event, for consumers that only want the JSON (``tidemark capture``). Inserts,
updates without an old tuple and deletes of captured tables go through code generated
per table schema (:mod:`tidemark.serde.pgoutput_json`); every other message, and any
row the generated code does not handle, goes through the change builder and the
serializer. The change builder keeps all the stream state (schemas, the open
transaction, the resume position) either way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from tidemark.event import Op
from tidemark.serde.debezium_json import DebeziumJsonSerializer
from tidemark.serde.pgoutput_json import FusedCodec, LineFunction
from tidemark.source.postgres.change_builder import ChangeEventBuilder

# Type and tuple-kind bytes of the row messages the fused path handles: an Insert's new
# tuple, an Update with only a new tuple, a Delete's key or old-row tuple.
_FUSED_KINDS: Final = {
    (0x49, 0x4E): Op.CREATE, (0x55, 0x4E): Op.UPDATE,
    (0x44, 0x4B): Op.DELETE, (0x44, 0x4F): Op.DELETE,
}  # fmt: skip
_RELATION: Final = 0x52

#: What the hot loop keeps per message prefix: the ASCII and UTF-8 line functions and
#: the text around the event's LSN.
_Hot = tuple[LineFunction, LineFunction, tuple[str, str, str]]


class JsonLineBuilder:
    """Stateful converter of pgoutput messages to Debezium JSON lines.

    Shares the stream state of *events*; without transaction metadata only (the
    ``transaction`` block is per event there, and BEGIN/END records are not events).
    """

    def __init__(self, events: ChangeEventBuilder, serializer: DebeziumJsonSerializer) -> None:
        if serializer.options.transaction_metadata:
            raise ValueError("JsonLineBuilder does not support transaction metadata")
        self.events = events
        self._serializer = serializer
        self._codecs: dict[int, FusedCodec] = {}  # relation id -> codec of its schema
        # Message prefix (type, relation id, tuple kind) -> line functions and the text
        # around the LSN; valid for one transaction and one batch (the source block and
        # the processing time differ between them), rebuilt on first use.
        self._hot: dict[bytes, _Hot | None] = {}
        self._context = events.context
        self._now_us = 0
        #: Row messages that the fused path gave up on (for tests and diagnostics).
        self.fallbacks = 0

    def process(self, messages: Sequence[tuple[bytes, int]], now_us: int) -> list[str]:
        """Convert a batch of ``(pgoutput payload, data_start LSN)`` pairs; returns one
        text per change event (its line, and its tombstone line after a delete)."""
        out: list[str] = []
        append = out.append
        hot = self._hot
        hot.clear()  # a new processing time
        self._now_us = now_us
        miss = self._miss
        for data, lsn in messages:
            entry = hot.get(data[:6]) or miss(data)
            if entry is not None:
                ascii_line, utf8_line, parts = entry
                try:
                    try:
                        text = data.decode("ascii")
                    except UnicodeDecodeError:
                        append(utf8_line(data, "", lsn, parts))
                    else:
                        append(ascii_line(data, text, lsn, parts))
                    continue
                except Exception:  # the general path decides what it is
                    self.fallbacks += 1
            self._general(data, lsn, out)
        return out

    def _general(self, data: bytes, lsn: int, out: list[str]) -> None:
        events = self.events
        records = events.process(((data, lsn),), self._now_us)
        if records:
            out += self._serializer.text_lines(records)
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
        codec = self._codecs.get(relation_id)
        if codec is None or codec.schema is not schema:
            codec = self._codecs[relation_id] = FusedCodec(schema, self._serializer.options)
        ascii_line, utf8_line = (codec.insert if op is Op.CREATE else
                                 codec.update if op is Op.UPDATE else codec.delete)
        parts = self._serializer.stream_line_parts(schema, self.events.context, op,
                                                   self._now_us)
        return ascii_line, utf8_line, parts
