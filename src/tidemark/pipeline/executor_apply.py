"""A micro-batch applied to Delta on Spark's executors (``spark.apply_on = "executors"``).

The driver never holds the batch. One Spark job per batch, two stages:

1. **send** (where the source decoded the batch, no Python): every envelope row gets
   its place in commit order (``monotonically_increasing_id``: the source partition,
   then the row's place in it; partitions are WAL slices in commit order, then snapshot
   chunks) and goes to every task of its table (*task*: a part of a target), by a key
   that Spark's hash places in that task's partition exactly (:func:`placing_keys`).
2. **apply** (``mapInArrow``, one task per part, its rows sorted by commit order with
   Spark's external sort, which spills): the task keeps the change rows of its part's
   key range (:func:`tidemark.lake.split_apply.part_rows`), merges them in steps of
   ``spark.apply_step_rows`` (:func:`tidemark.lake.split_apply.apply_part`) and returns
   what it did and what it saw (rows, transactions, newest commit time), a few bytes.

Every part of a split target reads all of the target's rows and keeps its range: the
rows cross the shuffle once per part, as Arrow IPC blobs (the ``arrow`` row format) that
cost little to skip, which spares a Python stage to cut them before the shuffle.

A target of one part is committed by its task, with the batch's app transaction as
always. The parts of a split target each leave a branch, which the driver publishes as
one commit (:func:`tidemark.lake.split_apply.publish`); if two parts rewrote the same
file, or a part holds a truncate (or a key change whose values the new key takes
from the old one), that target's batch is applied again as one part.

A task that fails is retried by Spark (on a cluster: on another worker); a retried
part makes a new branch, and a retried one-part task finds the batch already committed
if the failed try got that far (the app transaction). A driver that dies anywhere
replays the batch, as on the driver path.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import pickle
from collections.abc import Iterable, Iterator, Sequence

import numpy as np
import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F  # noqa: N812 (pyspark's convention)
from pyspark.sql.types import StructType

from tidemark.lake.branch import OverlapError
from tidemark.lake.delta_target import NewColumnValues
from tidemark.lake.delta_writer import ApplyResult
from tidemark.lake.split_apply import (
    PartResult,
    TargetPlan,
    abandon,
    apply_part,
    part_rows,
    publish,
)
from tidemark.lake.widening import TypeChangeError
from tidemark.pipeline.batch_seen import BatchSeen
from tidemark.spark import arrow_pieces
from tidemark.spark.change_schemas import typed_rows

log = logging.getLogger(__name__)

_TASK = "_tidemark_task"
_SEQ = "_tidemark_seq"
_OUTCOME = pa.schema([("outcome", pa.binary())])


@dataclasses.dataclass(frozen=True)
class TargetWork:
    """One target's share of a batch, for the tasks."""

    table: str
    schema: StructType
    plan: TargetPlan
    new_column_values: NewColumnValues | None = None
    """Picklable: it runs on an executor."""


@dataclasses.dataclass(frozen=True)
class TargetOutcome:
    """What a batch did to one target."""

    result: ApplyResult
    seen: BatchSeen
    parts: int


def apply_on_executors(batch: DataFrame, work: Sequence[TargetWork]
                       ) -> dict[str, TargetOutcome]:
    """Apply *batch* (an envelope DataFrame) to every target of *work* on the executors;
    a target the batch has no rows for is left out of the result."""
    if not work:
        return {}
    outcomes = _run(batch, work)
    used = {item.table: item.plan.parts for item in work}
    again = []
    for item in work:
        parts = outcomes.get(item.table)
        if parts is None or item.plan.parts == 1:
            continue
        if any(p.needs_one_part for p, _ in parts):
            reason = "the batch holds a truncate or a key change to carry values over"
            abandon(item.plan)
        else:
            try:
                result = publish(item.plan, [p for p, _ in parts])
                seen = BatchSeen()
                for _, part_seen in parts:
                    seen.merge(part_seen)
                outcomes[item.table] = [(dataclasses.replace(parts[0][0], result=result),
                                         seen)]
                continue
            except OverlapError as err:
                reason = str(err)
        log.info("%s: applying batch %d as one part, not %d (%s)", item.table,
                 item.plan.version, item.plan.parts, reason)
        again.append(dataclasses.replace(item, plan=item.plan.one_part()))
        used[item.table] = 1
    if again:
        outcomes.update(_run(batch, again))
    return {table: TargetOutcome(parts[0][0].result, parts[0][1], used[table])
            for table, parts in outcomes.items()}


def _run(batch: DataFrame, work: Sequence[TargetWork]
         ) -> dict[str, list[tuple[PartResult, BatchSeen]]]:
    """One Spark job: the batch's rows sent to their tasks, then applied; the task
    results by table."""
    tasks = [(t, part) for t, item in enumerate(work) for part in range(item.plan.parts)]
    keys = placing_keys(batch.sparkSession, len(tasks))
    task_of = {key: n for n, key in enumerate(keys)}
    columns = batch.columns
    work = list(work)
    by_table: dict[str, list[int]] = {}
    for n, (t, _) in enumerate(tasks):
        by_table.setdefault(work[t].table, []).append(keys[n])

    def apply(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for key, group in itertools.groupby(_task_slices(batches, columns),
                                            key=lambda item: item[0]):
            t, part = tasks[task_of[key]]
            item = work[t]
            seen = BatchSeen()
            rows = (part_rows(item.plan, part, typed_rows(envelope, item.table, item.schema))
                    for _, envelope in group)
            pieces = arrow_pieces.pieces(seen.count(item.table, rows), item.plan.step_rows,
                                  item.plan.step_bytes)
            first = next(pieces, None)
            if first is None:
                continue
            context = TaskContext.get()
            attempt = str(context.taskAttemptId()) if context is not None else "0"
            try:
                result = apply_part(item.plan, part, arrow_pieces.first_then(first, pieces),
                                    attempt, new_column_values=item.new_column_values)
            except TypeChangeError as err:
                raise TypeChangeError(f"{item.table}: {err}") from None
            outcome = pickle.dumps((item.table, result, seen))
            yield pa.RecordBatch.from_pydict({"outcome": [outcome]}, schema=_OUTCOME)

    mapping = F.create_map(*(value for table, placed in by_table.items()
                             for value in (F.lit(table), F.array(*map(F.lit, placed)))))
    # Plain names: a struct envelope's columns are table names, dots included, which
    # Spark's column resolution would take apart. The tasks give the names back.
    plain = [f"_c{i}" for i in range(len(columns))]
    routed = (batch.toDF(*plain)
              .withColumn(_SEQ, F.monotonically_increasing_id())
              .withColumn(_TASK, F.explode(mapping[F.col(plain[columns.index("table")])]))
              .repartition(len(tasks), _TASK)
              .sortWithinPartitions(_TASK, _SEQ))
    results: dict[str, list[tuple[PartResult, BatchSeen]]] = {}
    for row in routed.mapInArrow(apply, "outcome binary").collect():
        table, result, seen = pickle.loads(row[0])
        results.setdefault(table, []).append((result, seen))
    return results


def placing_keys(spark: SparkSession, count: int) -> list[int]:
    """*count* integers that ``repartition(count, column)`` sends to partitions 0, 1, …
    in turn: Spark hashes a column (Murmur3) to place a row, so task numbers 0..n-1
    would share partitions by chance, and tasks sharing one run one after the other."""
    if count not in _PLACING:
        found: dict[int, int] = {}
        candidates = 64 * count
        while len(found) < count:
            rows = spark.range(candidates).select(
                F.col("id").cast("int").alias("k"),
                F.expr(f"pmod(hash(CAST(id AS INT)), {count})").alias("p")).collect()
            for key, place in rows:
                found.setdefault(place, key)
            candidates *= 4
        _PLACING[count] = [found[p] for p in range(count)]
    return _PLACING[count]


_PLACING: dict[int, list[int]] = {}


def _task_slices(batches: Iterable[pa.RecordBatch], columns: Sequence[str]
                 ) -> Iterator[tuple[int, pa.Table]]:
    """The runs of rows of one task in *batches* (sorted by task): (its key, the rows
    of the envelope, whose *columns* come first, under their names)."""
    for record_batch in batches:
        table = pa.Table.from_batches([record_batch])
        tasks = table.column(_TASK).to_numpy()
        starts = [0, *(np.flatnonzero(tasks[1:] != tasks[:-1]) + 1).tolist(), len(tasks)]
        for lo, hi in itertools.pairwise(starts):
            if hi > lo:
                envelope = table.slice(lo, hi - lo).select(list(range(len(columns))))
                yield int(tasks[lo]), envelope.rename_columns(list(columns))
