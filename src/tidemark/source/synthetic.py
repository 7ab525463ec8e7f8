"""A synthetic connector: deterministic change events without a database.

For engine tests and micro-benchmarks. Record *n* of a task is fully determined by *n*:
its ``lsn`` is *n*, its key ``id`` is ``n % keys``, it is an insert the first time a key
appears and an update after. The offset after a batch is ``{"position": next n}``, so a
restarted task continues exactly where the saved offset says, and tests can check
at-least-once delivery by the positions they received.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from tidemark.errors import ConfigError
from tidemark.event import (
    ChangeEvent,
    Column,
    Op,
    Record,
    SourceContext,
    TableId,
    TableSchema,
)
from tidemark.logical_type import INT64, STRING
from tidemark.offsets.store import Offset, OffsetReader
from tidemark.source.batch import SourceBatch
from tidemark.source.spi import TaskConfig


def synthetic_schema(text_columns: int = 2, table: str = "items") -> TableSchema:
    """``id bigint`` primary key plus *text_columns* text columns."""
    columns = [Column("id", INT64, "bigint", True, int, False)]
    columns += [Column(f"c{i}", STRING, "text", False, str) for i in range(text_columns)]
    return TableSchema(TableId("synthetic", table), tuple(columns), (0,), "default")


class SyntheticTask:
    """One task of :class:`SyntheticConnector`."""

    def __init__(self, connector: SyntheticConnector, index: int) -> None:
        self.connector = connector
        self.index = index
        self.position = 0
        self.polls = 0
        self.active = False  # between start() and stop(): what a slot would be
        self.committed: list[Offset] = []
        self._schema = synthetic_schema(connector.text_columns)
        self._filler = "x" * connector.value_size
        self._key_texts = [str(key) for key in range(connector.keys)]

    @property
    def partition(self) -> str:
        return f"synthetic/{self.connector.name}/{self.index}"

    def start(self, offsets: OffsetReader) -> None:
        self.active = True
        if self.connector.start_delay_s:
            time.sleep(self.connector.start_delay_s)
        saved = offsets.load(self.partition)
        self.position = int(saved["position"]) if saved else 0

    def poll(self) -> SourceBatch:
        self.polls += 1
        hook = self.connector.poll_hook
        if hook is not None:
            hook(self)
        total = self.connector.total
        start = self.position
        if total is not None and start >= total:
            return SourceBatch([], None, finished=True)
        end = start + self.connector.batch_size
        if total is not None:
            end = min(end, total)
        self.position = end
        return SourceBatch(self._records(start, end), {"position": end},
                           finished=total is not None and end >= total)

    def _records(self, start: int, end: int) -> list[Record]:
        keys = self.connector.keys
        schema = self._schema
        filler = self._filler
        width = len(schema.columns) - 1
        now_us = time.time_ns() // 1000
        context = SourceContext("synthetic", self.connector.name, "synthetic", now_us, None,
                                None)
        create, update = Op.CREATE, Op.UPDATE
        out: list[Record] = []
        append = out.append
        key_texts = self._key_texts
        for n in range(start, end):
            text = f"{filler}{n}"
            # The common width spelled out: building the row costs more than the event.
            values = ((key_texts[n % keys], text, text) if width == 2 else
                      (key_texts[n % keys], *(text,) * width))
            append(ChangeEvent(create if n < keys else update, schema,
                               None, values, context, n, 0, 0, now_us))
        return out

    def commit(self, offset: Offset) -> None:
        self.committed.append(offset)

    def stop(self) -> None:
        self.active = False


class SyntheticConnector:
    """Generates *total* records per task (None: without end) in batches.

    *poll_hook* is called with the task before every poll (tests use it to inject
    failures or delays); *start_delay_s* makes start slow (to test stopping while
    tasks start).
    """

    def __init__(self, *, total: int | None = 10_000, tasks: int = 1, batch_size: int = 1024,
                 keys: int = 1_000, text_columns: int = 2, value_size: int = 8,
                 name: str = "synthetic", start_delay_s: float = 0.0,
                 poll_hook: Callable[[SyntheticTask], None] | None = None) -> None:
        for key, value in (("tasks", tasks), ("batch_size", batch_size), ("keys", keys)):
            if value <= 0:
                raise ConfigError(key, f"must be > 0, got {value}")
        self.total = total
        self.tasks = tasks
        self.batch_size = batch_size
        self.keys = keys
        self.text_columns = text_columns
        self.value_size = value_size
        self._name = name
        self.start_delay_s = start_delay_s
        self.poll_hook = poll_hook
        self.created: list[SyntheticTask] = []
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        return self._name

    def task_configs(self, tasks_max: int) -> list[TaskConfig]:
        if self.tasks > tasks_max:
            raise ConfigError("tasks_max", f"the synthetic connector was given {self.tasks} "
                              f"tasks; raise tasks_max to at least {self.tasks}")
        return [{"index": i} for i in range(self.tasks)]

    def create_task(self, config: Mapping[str, Any]) -> SyntheticTask:
        task = SyntheticTask(self, int(config["index"]))
        with self._lock:
            self.created.append(task)
        return task
