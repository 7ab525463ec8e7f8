"""``tidemark capture``'s consumer on the engine: Debezium JSON lines on stdout.

Each record the engine's Debezium JSON converter made becomes one line
``{"key": …, "value": …}`` (a tombstone's value and a keyless table's key are
``null``), byte for byte what the serializer's ``encode_lines`` writes. A batch is
written whole and flushed before the engine may commit its offset (at-least-once);
a batch that is cut (``--max-events`` reached inside it, or stdout closed while it is
written) is marked unfinished, so its offset is never saved.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import BinaryIO

from tidemark.engine.consumers import BatchCommitter
from tidemark.event import TransactionBoundary
from tidemark.serde.converted import ConvertedRecord

#: Records encoded per write: larger buffers are mmapped or trimmed back to the OS by
#: malloc on every batch, and faulting that memory in again costs ~10% of the run.
_WRITE_SLICE = 100


class JsonLinesOutput:
    """A batch consumer writing JSON lines to *out* (see the module).

    *max_events*: stop after this many change events (tombstones and transaction
    records are not counted). *stop* is called once the output takes no more (the limit reached,
    the reader gone), from the consumer's thread: it must not wait for the engine.
    ``boundaries``: the converter emits transaction BEGIN/END records.
    """

    def __init__(self, out: BinaryIO, *, max_events: int | None, boundaries: bool,
                 stop: Callable[[], None]) -> None:
        self._out = out
        self._max_events = max_events
        self._boundaries = boundaries
        self._stop = stop
        self.delivered = 0
        """Change events written in full."""
        self.closed = False
        """stdout was closed by its reader."""
        self.done = False
        """Nothing more is written (the limit reached, or stdout closed)."""

    def _is_change(self, record: ConvertedRecord) -> bool:
        """Whether *record* is a change event's (not its tombstone, not a BEGIN/END)."""
        return record.value is not None and not (
            self._boundaries and isinstance(record.event, TransactionBoundary))

    def _changes(self, records: list[ConvertedRecord]) -> int:
        if self._boundaries:
            return sum(1 for r in records if self._is_change(r))
        return len(records) - sum(1 for r in records if r.value is None)

    def handle_batch(self, records: list[ConvertedRecord], committer: BatchCommitter) -> None:
        if self.done:
            committer.mark_batch_unfinished()
            return
        is_change = self._is_change
        cut = False
        if self._max_events is not None:
            remaining = self._max_events - self.delivered
            seen = 0
            for index, record in enumerate(records):
                if is_change(record):
                    seen += 1
                    if seen > remaining:
                        records, cut = records[:index], True
                        break
        out = self._out
        try:
            for start in range(0, len(records), _WRITE_SLICE):
                out.write("".join([
                    f'{{"key":{r.key or "null"},"value":{r.value or "null"}}}\n'
                    for r in records[start:start + _WRITE_SLICE]]).encode())
            out.flush()
        except BrokenPipeError:
            # The batch may be cut anywhere: its offset is not taken, only those of the
            # batches before it, which were written in full.
            self.closed = self.done = True
            committer.mark_batch_unfinished()
            self._stop()
            return
        self.delivered += self._changes(records)
        if cut:
            committer.mark_batch_unfinished()
        if cut or (self._max_events is not None and self.delivered >= self._max_events):
            self.done = True
            self._stop()
