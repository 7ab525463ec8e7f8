"""The stream reader: pyspark's contract over any source's read plan.

Spark calls a ``DataSourceStreamReader``; a source gives a
:class:`~tidemark.source.read_plan.ReadPlan` (:mod:`tidemark.spark.sources` finds it).
This module passes the one to the other and knows no source: offsets and partitions are
the plan's (a partition travels wrapped in an ``InputPartition``), and ``read`` hands
the plan the sink that builds the stream's record batches
(:func:`tidemark.spark.stream_sink.stream_sink`).

Where each method runs (pyspark 4.3): ``initialOffset``, ``latestOffset``,
``partitions``, ``commit`` and ``prepareForTriggerAvailableNow`` in one long-lived
Python process on the driver; ``read`` on executors, on a pickled copy of a reader that
never ran any other method. ``commit(end)`` comes after Spark committed the batch to its
checkpoint, so a batch Spark may still replay is never released.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from tidemark.source.read_plan import ReadPlan
from tidemark.spark.options import SourceOptions
from tidemark.spark.stream_sink import gc_paused, stream_sink


class PlanPartition(InputPartition):
    """One of a read plan's partitions, as Spark carries it to an executor."""

    def __init__(self, index: int, part: Any) -> None:
        super().__init__((index, part))
        self.index = index
        self.part = part

    def __repr__(self) -> str:
        return repr(self.part)


class PlanStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches of a source's changes, by its read plan."""

    def __init__(self, options: SourceOptions, schema: StructType, plan: ReadPlan) -> None:
        self.options = options
        self.schema = schema
        self.plan = plan

    # -- driver side -------------------------------------------------------------------
    def initialOffset(self) -> dict[str, Any]:  # noqa: N802 - pyspark API name
        return self.plan.initial_offset()

    def getDefaultReadLimit(self) -> ReadLimit:  # noqa: N802 - pyspark API name
        limit = self.options.max_changes_per_trigger
        return ReadAllAvailable() if limit is None else ReadMaxRows(limit)

    def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802 - pyspark API name
        self.plan.prepare_available_now()

    def latestOffset(self, start: dict[str, Any],  # noqa: N802 - pyspark API name
                     limit: ReadLimit | None = None) -> dict[str, Any]:
        return self.plan.latest(start, limit.max_rows if isinstance(limit, ReadMaxRows)
                                else None)

    def reportLatestOffset(self) -> dict[str, Any] | None:  # noqa: N802 - pyspark API name
        return self.plan.report_latest()

    def partitions(self, start: dict[str, Any],
                   end: dict[str, Any]) -> Sequence[InputPartition]:
        return [PlanPartition(i, part) for i, part in enumerate(self.plan.plan(start, end))]

    def commit(self, end: dict[str, Any]) -> None:
        self.plan.commit(end)

    def stop(self) -> None:
        self.plan.stop()

    # -- executor side -----------------------------------------------------------------
    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """The partition's change rows as record batches of the stream's schema."""
        assert isinstance(partition, PlanPartition)
        sink = stream_sink(self.options, self.schema)
        with gc_paused():
            for _ in self.plan.read(partition.part, sink):
                # Between the plan's chunks: memory stays bounded by the batch size,
                # not the partition's.
                yield from sink.take()
        yield from sink.finish()
