"""The deliveries that hand each batch whole to one worker per consumer: ``batch``
(``handle_batch``, or ``handle_lines`` for a :class:`JsonLinesConsumer`) and
``ordered`` (one call per record, in source order).

Several consumers of one stream run in parallel (P3). A single consumer runs in the
reader's thread while its last call returned quickly (see
:class:`~tidemark.engine.lane.Lane`), or always without ``read_ahead``.
"""

from __future__ import annotations

import threading
from abc import abstractmethod
from collections.abc import Callable, Sequence
from typing import Any

from tidemark.engine.consumers import ChangeConsumer, JsonLinesConsumer, RecordConsumer
from tidemark.engine.delivery import Delivery, Unit
from tidemark.event import Record
from tidemark.offsets.store import Offset
from tidemark.serde.json_lines import JsonLines


class _Committer:
    """The BatchCommitter of one (batch, consumer). A finished batch's offset is saved
    at the next flush (``offset_flush_interval_ms``), as every other mode's."""

    __slots__ = ("_delivery", "_done", "_lock", "_unit")

    def __init__(self, delivery: Delivery, unit: Unit) -> None:
        self._delivery = delivery
        self._unit = unit
        self._done = False
        # A consumer may finish from a thread of its own while handle_batch returns:
        # counted twice, the batch would complete before another consumer had it.
        self._lock = threading.Lock()

    def mark_batch_finished(self) -> None:
        with self._lock:
            if self._done:
                return
            self._done = True
        self._delivery.complete(self._unit)

    def mark_batch_unfinished(self) -> None:
        self._delivery.tracker.withhold_from(self._unit.seq)
        self.mark_batch_finished()


class _WholeBatchDelivery(Delivery):
    """Converts each batch once and hands all of it to one worker per consumer."""

    def __init__(self, consumers: Sequence[Any], label: str, *, read_ahead: bool = True,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._here = not read_ahead and len(consumers) == 1
        self._consumer_lanes = [
            self._lane(f"{label}{i}", self._runner(consumer))
            for i, consumer in enumerate(consumers)
        ]

    @abstractmethod
    def _runner(self, consumer: Any) -> Callable[[Any], None]: ...

    def _dispatch(self, records: list[Record], offset: Offset | None) -> None:
        self._hand_on(self._unit(len(records), offset, len(self._consumer_lanes)),
                      self.pipeline.convert_parallel(records))

    def _batch_runner(self, handle: Callable[[Any, Any], None]) -> Callable[[Any], None]:
        """A consumer lane's function for *handle* (``handle_batch``, ``handle_lines``),
        called with a whole batch and its committer; a batch the consumer did not mark
        otherwise is finished when it returns."""
        def run(item: tuple[Unit, Any]) -> None:
            unit, batch = item
            committer = _Committer(self, unit)
            handle(batch, committer)
            committer.mark_batch_finished()
        return run

    def _hand_on(self, unit: Unit, converted: object) -> None:
        lanes = self._consumer_lanes
        if self._here or (len(lanes) == 1 and lanes[0].runs_here()):
            lanes[0].run_here((unit, converted))
            return
        for lane in lanes:
            lane.put((unit, converted))


class BatchDelivery(_WholeBatchDelivery):
    """(a) ``handle_batch(records, committer)`` per batch."""

    def __init__(self, consumers: Sequence[ChangeConsumer], *, read_ahead: bool = True,
                 **kwargs: Any) -> None:
        super().__init__(consumers, "batch", read_ahead=read_ahead, **kwargs)

    def _runner(self, consumer: ChangeConsumer) -> Callable[[Any], None]:
        return self._batch_runner(consumer.handle_batch)


class LinesDelivery(_WholeBatchDelivery):
    """(a) ``handle_lines(lines, committer)`` per batch: the JSON lines a source wrote
    are handed on as they came (the engine asks sources for them only with no
    transforms), other batches are converted into lines."""

    def __init__(self, consumers: Sequence[JsonLinesConsumer], *, read_ahead: bool = True,
                 **kwargs: Any) -> None:
        super().__init__(consumers, "lines", read_ahead=read_ahead, **kwargs)

    def _dispatch(self, records: list[Record], offset: Offset | None) -> None:
        self._hand_on(self._unit(len(records), offset, len(self._consumer_lanes)),
                      self.pipeline.convert_lines(records))

    def _dispatch_lines(self, lines: list[str], offset: Offset | None) -> None:
        self._hand_on(self._unit(len(lines), offset, len(self._consumer_lanes)),
                      JsonLines(lines))

    def _runner(self, consumer: JsonLinesConsumer) -> Callable[[Any], None]:
        return self._batch_runner(consumer.handle_lines)


class OrderedDelivery(_WholeBatchDelivery):
    """(b) one call per record in source order (one worker per consumer)."""

    def __init__(self, consumers: Sequence[RecordConsumer], *, read_ahead: bool = True,
                 **kwargs: Any) -> None:
        super().__init__(consumers, "ordered", read_ahead=read_ahead, **kwargs)

    def _runner(self, consumer: RecordConsumer) -> Callable[[Any], None]:
        return self._record_runner(consumer)
