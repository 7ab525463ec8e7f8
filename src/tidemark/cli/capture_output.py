"""``tidemark capture``'s consumer on the engine: Debezium JSON lines on stdout.

A lines consumer (:class:`~tidemark.engine.consumers.JsonLinesConsumer`): the engine
hands it each batch as lines ready to write ``{"key": …, "value": …}``, the ones the
PostgreSQL reader writes straight from the pgoutput bytes unchanged. A batch is written
whole and flushed before the engine may commit its offset (at-least-once); a batch that
is cut (``--max-events`` reached inside it, or stdout closed while it is written) is
marked unfinished, so its offset is never saved.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import BinaryIO

from tidemark.engine.consumers import BatchCommitter
from tidemark.serde.json_lines import JsonLines

#: Lines encoded per write: larger buffers are mmapped or trimmed back to the OS by
#: malloc on every batch, and faulting that memory in again costs ~10% of the run.
_WRITE_SLICE = 100


class JsonLinesOutput:
    """A lines consumer writing to *out* (see the module).

    *max_events*: stop after this many change events (tombstones and transaction
    records are not counted). *stop* is called once the output takes no more (the limit
    reached, the reader gone), from the consumer's thread: it must not wait for the
    engine.
    """

    def __init__(self, out: BinaryIO, *, max_events: int | None,
                 stop: Callable[[], None]) -> None:
        self._out = out
        self._max_events = max_events
        self._stop = stop
        self.delivered = 0
        """Change events written in full."""
        self.closed = False
        """stdout was closed by its reader."""
        self.done = False
        """Nothing more is written (the limit reached, or stdout closed)."""

    def handle_lines(self, lines: JsonLines, committer: BatchCommitter) -> None:
        if self.done:
            committer.mark_batch_unfinished()
            return
        cut = False
        if self._max_events is not None:
            first = lines.first_changes(self._max_events - self.delivered)
            if first is not None:
                lines, cut = first, True
        texts = lines.texts
        out = self._out
        try:
            for start in range(0, len(texts), _WRITE_SLICE):
                out.write("".join(texts[start:start + _WRITE_SLICE]).encode())
            out.flush()
        except BrokenPipeError:
            # The batch may be cut anywhere: its offset is not taken, only those of the
            # batches before it, which were written in full.
            self.closed = self.done = True
            committer.mark_batch_unfinished()
            self._stop()
            return
        self.delivered += lines.changes
        if cut:
            committer.mark_batch_unfinished()
        if cut or (self._max_events is not None and self.delivered >= self._max_events):
            self.done = True
            self._stop()
