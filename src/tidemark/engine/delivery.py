"""The four delivery modes (and the processor mode): how records reach consumers.

Every mode registers each polled batch, with its offset, as one *unit* of the
:class:`OffsetTracker`, in source order, and completes it once every consumer has
processed every part of it (a chunk, the records of one worker). The tracker then
yields the highest offset whose predecessors are all done, whatever order units finish
in. A :class:`Capacity` bounds the records handed on and not yet passed by that offset
(processed or not; with ``offset_flush_interval_ms = 0``, not yet passed by the saved
offset), so a slow consumer slows the reader (backpressure), memory stays bounded, and a
crash redelivers at most that many records beyond the saved offset (plus, with an
interval, those processed since the last save), even when one worker lags behind the
others. A part done early does not free its records before the batch's offset covers
them: a crash would redeliver them.

In the batch and ordered modes (:mod:`tidemark.engine.batch_delivery`) a single consumer
runs in its own worker thread, so the reader can read ahead while it works; but a
consumer whose last call returned within 2 ms is called in the reader's thread while
nothing is queued for its worker: handing each batch to another thread would cost more
than such a call (the threads trade the GIL). The first call, and every call after a
slower one, go to the worker (unless ``read_ahead`` is off: then all run in the
reader's thread). A consumer that is quick and then blocks thus blocks the reader
(documented in docs/configuration.md); ``async`` and ``per_key`` never call a consumer
in the reader's thread.
"""

from __future__ import annotations

import logging
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Any

from tidemark.engine.consumers import RecordConsumer, RecordProcessor
from tidemark.engine.converters import ConvertedRecord, Converter, DebeziumJsonConverter
from tidemark.engine.flow_control import Capacity, FailureHolder
from tidemark.engine.key_assignment import KeyAssigner, KeyGroup
from tidemark.engine.lane import Lane
from tidemark.engine.offset_tracker import OffsetTracker
from tidemark.engine.records import Destinations, key_routing_key, table_routing_key
from tidemark.engine.transforms import Transform, apply_transforms
from tidemark.event import Record
from tidemark.offsets.store import Offset
from tidemark.serde.json_lines import JsonLines, lines_of_converted

log = logging.getLogger(__name__)

# Below this many records per worker, splitting a batch for the pool costs more in
# thread hand-offs than it gains.
_MIN_CHUNK = 512


class Unit:
    """A part of a batch that completes when all its consumers are done with it."""

    __slots__ = ("lock", "pending", "seq", "size")

    def __init__(self, seq: int, size: int, pending: int) -> None:
        self.seq = seq
        self.size = size
        self.pending = pending
        self.lock = threading.Lock()


class Pipeline:
    """Transforms then converter, over a list of records, optionally in parallel."""

    def __init__(self, transforms: Sequence[Transform], converter: Converter,
                 executor: Executor | None, workers: int) -> None:
        self.transforms = tuple(transforms)
        self.converter = converter
        self.executor = executor
        self.workers = workers
        self._local = threading.local()

    def convert(self, records: Sequence[Record]) -> list[ConvertedRecord]:
        """Transforms and converter in the calling thread."""
        if not self.transforms:
            return self.converter.convert(records)
        destinations: Destinations | None = getattr(self._local, "destinations", None)
        if destinations is None:
            destinations = self._local.destinations = Destinations()
        return self.converter.convert(apply_transforms(self.transforms,
                                                       destinations.route(records)))

    def convert_parallel(self, records: Sequence[Record]) -> list[ConvertedRecord]:
        """Transforms and converter over chunks in the worker pool, results in order."""
        n = len(records)
        if self.executor is None or self.workers < 2 or n < 2 * _MIN_CHUNK:
            return self.convert(records)
        size = max(_MIN_CHUNK, -(-n // self.workers))
        chunks = [records[i:i + size] for i in range(0, n, size)]
        out: list[ConvertedRecord] = []
        for part in self.executor.map(self.convert, chunks):
            out.extend(part)
        return out

    def convert_lines(self, records: Sequence[Record]) -> JsonLines:
        """Transforms and converter, as Debezium JSON lines: written by the Debezium
        JSON converter itself when nothing transforms the records, else formatted from
        the converter's records."""
        if not self.transforms and type(self.converter) is DebeziumJsonConverter:
            return self.converter.lines(records)
        return lines_of_converted(self.convert_parallel(records))


class Delivery(ABC):
    """Hands batches to consumers in one mode and tracks their completion."""

    def __init__(self, pipeline: Pipeline, tracker: OffsetTracker[Offset],
                 capacity: Capacity, failure: FailureHolder, name: str) -> None:
        self.pipeline = pipeline
        self.tracker = tracker
        self.capacity = capacity
        self.failure = failure
        self.name = name
        self._lanes: list[Lane] = []
        # Set by close(discard=True): no consumer call starts after it.
        self._stopped = False

    def dispatch(self, records: list[Record], offset: Offset | None,
                 lines: list[str] | None = None) -> None:
        """Hand on one polled batch, its *records* or the JSON *lines* the source wrote
        instead (waits while too many records are in flight)."""
        size = len(records) if lines is None else len(lines)
        if not size:
            if offset is not None:  # moves the offset only, e.g. a heartbeat
                # The newest entry, of no records: completing it passes none.
                self.tracker.complete(self.tracker.track(offset, 0))
            return
        self.capacity.acquire(size)
        if lines is None:
            self._dispatch(records, offset)
        else:
            self._dispatch_lines(lines, offset)

    @abstractmethod
    def _dispatch(self, records: list[Record], offset: Offset | None) -> None: ...

    def _dispatch_lines(self, lines: list[str], offset: Offset | None) -> None:
        raise TypeError(f"{type(self).__name__} takes records, but the source handed over "
                        "JSON lines, which the engine asks for only for a "
                        "JsonLinesConsumer")

    def _unit(self, size: int, offset: Offset | None, consumers: int) -> Unit:
        return Unit(self.tracker.track(offset, size), size, consumers)

    def complete(self, unit: Unit) -> None:
        """One consumer is done with *unit*; the last one completes it."""
        with unit.lock:
            unit.pending -= 1
            if unit.pending:
                return
        # A unit's records stop counting as in flight once the committable offset passes
        # them, not when they are processed: what a crash redelivers stays within the
        # limit even when one worker lags behind the others.
        passed = self.tracker.complete(unit.seq)
        if passed:
            if self.capacity.until_saved:
                self.capacity.passed(passed)
            else:
                self.capacity.release(passed)

    def _record_runner(self, consumer: RecordConsumer,
                       done: Callable[[Any], None] | None = None) -> Callable[[Any], None]:
        """A lane's work for a per-record consumer: each record of a unit in order, then
        the unit is done for this consumer (*done*, or :meth:`complete`)."""
        finish = done or self.complete

        def run(item: tuple[Any, list[ConvertedRecord]]) -> None:
            unit, converted = item
            for record in converted:
                if self._stopped:
                    return  # the unit stays incomplete: redelivered after a restart
                consumer(record)
            finish(unit)
        return run

    def _lane(self, label: str, run: Callable[[Any], None]) -> Lane:
        lane = Lane(f"{self.name}-{label}", run, self.failure)
        self._lanes.append(lane)
        return lane

    def close(self, discard: bool) -> None:
        """End the worker threads: after the queued work, or (*discard*) once the
        consumer call in hand returns."""
        self._stopped = self._stopped or discard
        for lane in self._lanes:
            lane.stop(discard)

    def wait_closed(self, timeout_s: float) -> bool:
        """After :meth:`close`: wait until no consumer call runs or can start; False
        if one still runs after *timeout_s*."""
        deadline = time.monotonic() + timeout_s
        for lane in self._lanes:
            if lane.thread is not threading.current_thread():
                lane.thread.join(max(0.0, deadline - time.monotonic()))
                if lane.thread.is_alive():
                    return False
        return True


class AsyncDelivery(Delivery):
    """(c) one call per record, run concurrently by the worker pool: no order at all.
    Each chunk is transformed, converted and consumed by one worker."""

    def __init__(self, consumers: Sequence[RecordConsumer], executor: ThreadPoolExecutor,
                 workers: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._consumers = tuple(consumers)
        self._executor = executor
        self._workers = workers
        # Consumer calls running in the pool, so that close can wait for them.
        self._calls = 0
        self._calls_changed = threading.Condition()

    def _dispatch(self, records: list[Record], offset: Offset | None) -> None:
        # The pool's queue hands each chunk to whichever worker is free. With several
        # batches in flight one chunk per worker is enough: the next batch's chunks
        # fill the gaps, and every chunk costs a submit, a unit and a completion (at 4
        # per worker the I/O-bound benchmark spent 0.7 of a core on them, 0.4 at 1).
        # With room for about one batch, a few per worker keep all busy to its end.
        per_worker = 1 if self.capacity.limit >= 4 * len(records) else 4
        size = max(1, min(256, len(records) // (self._workers * per_worker)))
        starts = range(0, len(records), size)
        # One entry for the whole batch, done when every chunk is: a chunk's records
        # stop counting as in flight only once the batch's offset covers them.
        unit = self._unit(len(records), offset, len(starts) * len(self._consumers))
        for start in starts:
            self._executor.submit(self._convert_and_consume, unit,
                                  records[start:start + size])

    def _convert_and_consume(self, unit: Unit, chunk: list[Record]) -> None:
        if self._stopped or self.failure.error is not None:
            return
        try:
            converted = self.pipeline.convert(chunk)
            for consumer in self._consumers[1:]:
                self._executor.submit(self._consume, consumer, unit, converted)
            self._consume(self._consumers[0], unit, converted)
        except BaseException as err:
            self.failure.set(err)

    def _consume(self, consumer: RecordConsumer, unit: Unit,
                 converted: list[ConvertedRecord]) -> None:
        calls = self._calls_changed
        with calls:
            self._calls += 1
        try:
            # Checked after counting the call: close() either waits for it, or it sees
            # the stop and calls nothing.
            if self._stopped or self.failure.error is not None:
                return
            for record in converted:
                if self._stopped:
                    return
                consumer(record)
            self.complete(unit)
        except BaseException as err:
            self.failure.set(err)
        finally:
            with calls:
                self._calls -= 1
                if not self._calls:
                    calls.notify_all()

    def close(self, discard: bool) -> None:
        super().close(discard)
        if not discard:
            # Queued chunks still run; none is left once nothing is in flight.
            self._stopped = True

    def wait_closed(self, timeout_s: float) -> bool:
        with self._calls_changed:
            return self._calls_changed.wait_for(lambda: not self._calls, timeout_s)


class _KeyedPart:
    """One worker's group of a per-key batch: done when all its consumers are."""

    __slots__ = ("batch", "group", "lock", "pending")

    def __init__(self, batch: Unit, group: KeyGroup[Record], pending: int) -> None:
        self.batch = batch
        self.group = group
        self.pending = pending
        self.lock = threading.Lock()


class PerKeyDelivery(Delivery):
    """(d) records with the same key (or table) are processed one at a time, in source
    order: they go to the worker that has the key's earlier records in flight, and a key
    with none in flight goes to the least busy worker (:class:`KeyAssigner`). Different
    keys run in parallel. Each consumer has its own set of workers. A batch is one
    entry of the offset tracker, done once every worker's group of it is."""

    def __init__(self, consumers: Sequence[RecordConsumer], workers: int, by_table: bool,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._assigner: KeyAssigner[Record] = KeyAssigner(
            workers, table_routing_key if by_table else key_routing_key)
        self._consumer_count = len(consumers)
        self._lanes_by_worker: list[list[Lane]] = [
            [self._lane(f"key{w}.{c}", self._record_runner(consumer, self._part_done))
             for c, consumer in enumerate(consumers)]
            for w in range(workers)
        ]

    def _dispatch(self, records: list[Record], offset: Offset | None) -> None:
        groups = self._assigner.assign(records)
        executor = self.pipeline.executor
        if executor is not None and self.pipeline.workers > 1 and len(records) >= 2 * _MIN_CHUNK:
            converted = list(executor.map(self.pipeline.convert,
                                          [group.records for group in groups]))
        else:
            converted = [self.pipeline.convert(group.records) for group in groups]
        batch = self._unit(len(records), offset, len(groups))
        for i, group in enumerate(groups):
            part = _KeyedPart(batch, group, self._consumer_count)
            for lane in self._lanes_by_worker[group.worker]:
                lane.put((part, converted[i]))

    def _part_done(self, part: _KeyedPart) -> None:
        with part.lock:
            part.pending -= 1
            if part.pending:
                return
        # Before the batch may complete: a reader woken by that sees the key free.
        self._assigner.finished(part.group)
        self.complete(part.batch)


class _Context:
    """The ProcessorContext the engine gives a RecordProcessor."""

    def __init__(self, pipeline: Pipeline, executor: Executor) -> None:
        self._pipeline = pipeline
        self._executor = executor

    @property
    def executor(self) -> Executor:
        return self._executor

    def convert(self, records: Sequence[Record]) -> list[ConvertedRecord]:
        return self._pipeline.convert_parallel(records)


class ProcessorDelivery(Delivery):
    """A RecordProcessor takes each batch as polled and does all the processing."""

    def __init__(self, processor: RecordProcessor, executor: Executor, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        context = _Context(self.pipeline, executor)

        def run(item: tuple[Unit, list[Record]]) -> None:
            unit, records = item
            processor.process(records, context)
            self.complete(unit)

        self._processor_lane = self._lane("processor", run)

    def _dispatch(self, records: list[Record], offset: Offset | None) -> None:
        self._processor_lane.put((self._unit(len(records), offset, 1), records))
