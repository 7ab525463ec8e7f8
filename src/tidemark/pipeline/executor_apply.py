"""A micro-batch applied to Delta on Spark's executors (``spark.apply_on = "executors"``).

The driver never holds the batch. One Spark job per batch, two stages:

1. **route** (``mapInArrow``, one task per source partition, where the batch was
   decoded): each envelope record batch is turned into every target's typed change
   rows, cut by the target's parts (:func:`tidemark.lake.split_apply.split_rows`) and
   sent on as Arrow IPC, keyed by ``(task, order)``: *task* numbers a (target, part),
   *order* is the source partition and the record batch's place in it, so sorting by it
   gives commit order back (partitions are WAL slices in commit order, then snapshot
   chunks).
2. **apply** (one task per (target, part), placed exactly by its number, its rows
   sorted by order with Spark's external sort, which spills): the task merges its rows
   in steps of ``spark.apply_step_rows``
   (:func:`tidemark.lake.split_apply.apply_part`) and returns what it did and what it
   saw (rows, transactions, newest commit time), a few bytes.

A target of one part is committed by its task, with the batch's app transaction as
always. The parts of a split target each leave a branch, which the driver publishes as
one commit (:func:`tidemark.lake.split_apply.publish`); if two parts rewrote the same
file, or a part holds a truncate, that target's batch is applied again as one part.

A task that fails is retried by Spark (on a cluster: on another worker); a retried
part makes a new branch, and a retried one-part task finds the batch already committed
if the failed try got that far (the app transaction). A driver that dies anywhere
replays the batch, as on the driver path.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Iterator, Sequence

import pyarrow as pa
import pyarrow.compute as pc
from pyspark import TaskContext
from pyspark.sql import DataFrame
from pyspark.sql.types import StructType

from tidemark.lake.branch import OverlapError
from tidemark.lake.delta_writer import ApplyResult, NewColumnValues
from tidemark.lake.split_apply import PartResult, TargetPlan, apply_part, publish, split_rows
from tidemark.pipeline import spill
from tidemark.spark.arrow_rows import typed_rows

log = logging.getLogger(__name__)

_ROUTED = "task int, seq long, rows binary"
#: Record batches per source partition the order key has room for (2**40).
_SEQ_BITS = 40


@dataclasses.dataclass(frozen=True)
class TargetWork:
    """One target's share of a batch, for the tasks."""

    table: str
    schema: StructType
    plan: TargetPlan
    new_column_values: NewColumnValues | None = None
    """Picklable: it runs on an executor."""


@dataclasses.dataclass(frozen=True)
class Seen:
    """What the change rows of one task held."""

    rows: int = 0
    commits: frozenset[int] = frozenset()
    newest_commit_us: int | None = None


@dataclasses.dataclass(frozen=True)
class TargetOutcome:
    """What a batch did to one target."""

    result: ApplyResult
    seen: Seen
    parts: int


def apply_on_executors(batch: DataFrame, work: Sequence[TargetWork]
                       ) -> dict[str, TargetOutcome]:
    """Apply *batch* (an envelope DataFrame) to every target of *work* on the executors;
    a target the batch has no rows for is left out of the result."""
    if not work:
        return {}
    outcomes = _run(batch, work)
    again = []
    for item in work:
        parts = outcomes.get(item.table)
        if parts is None or item.plan.parts == 1:
            continue
        if any(p.needs_one_part for p, _ in parts):
            reason = "the batch holds a truncate"
        else:
            try:
                result = publish(item.plan, [p for p, _ in parts])
                outcomes[item.table] = [(dataclasses.replace(parts[0][0], result=result),
                                         _merged(s for _, s in parts))]
                continue
            except OverlapError as err:
                reason = str(err)
        log.info("%s: applying batch %d as one part, not %d (%s)", item.table,
                 item.plan.version, item.plan.parts, reason)
        again.append(dataclasses.replace(item, plan=item.plan.one_part()))
    if again:
        outcomes.update(_run(batch, again))
    return {table: TargetOutcome(parts[0][0].result, parts[0][1],
                                 next(w.plan.parts for w in work if w.table == table))
            for table, parts in outcomes.items()}


def _run(batch: DataFrame, work: Sequence[TargetWork]
         ) -> dict[str, list[tuple[PartResult, Seen]]]:
    """One Spark job: route, then apply; the task results by table."""
    tasks = [(t, part) for t, item in enumerate(work) for part in range(item.plan.parts)]
    number = {task: n for n, task in enumerate(tasks)}
    work = list(work)

    def route(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        context = TaskContext.get()
        partition = context.partitionId() if context is not None else 0
        for n, record_batch in enumerate(batches):
            envelope = pa.Table.from_batches([record_batch])
            order = (partition << _SEQ_BITS) + n
            for t, item in enumerate(work):
                rows = typed_rows(envelope, item.table, item.schema)
                if not rows.num_rows:
                    continue
                for part, mine in split_rows(item.plan, rows):
                    yield pa.RecordBatch.from_pydict(
                        {"task": [number[(t, part)]], "seq": [order], "rows": [_ipc(mine)]},
                        schema=pa.schema([("task", pa.int32()), ("seq", pa.int64()),
                                          ("rows", pa.binary())]))

    def apply(index: int, items: Iterable[tuple[tuple[int, int], bytes]]
              ) -> Iterator[tuple[str, PartResult, Seen]]:
        t, part = tasks[index]
        item = work[t]
        counted = _Counter()
        pieces = spill.pieces(counted.count(_tables(blob for _, blob in items)),
                         item.plan.step_rows)
        first = next(pieces, None)
        if first is None:
            return
        context = TaskContext.get()
        attempt = str(context.taskAttemptId()) if context is not None else "0"
        result = apply_part(item.plan, part, spill.first_then(first, pieces), attempt,
                            new_column_values=item.new_column_values)
        # What is left unread of a part that stopped early (needs_one_part).
        for _ in pieces:
            pass
        yield item.table, result, counted.seen()

    routed = batch.mapInArrow(route, _ROUTED)
    keyed = routed.rdd.map(lambda row: ((row[0], row[1]), bytes(row[2])))
    results = (keyed.repartitionAndSortWithinPartitions(
        numPartitions=max(1, len(tasks)), partitionFunc=lambda key: key[0])
        .mapPartitionsWithIndex(apply).collect())
    by_table: dict[str, list[tuple[PartResult, Seen]]] = {}
    for table, result, seen in results:
        by_table.setdefault(table, []).append((result, seen))
    return by_table


def _merged(seens: Iterable[Seen]) -> Seen:
    rows, commits, newest = 0, set[int](), None
    for seen in seens:
        rows += seen.rows
        commits |= seen.commits
        if seen.newest_commit_us is not None and (newest is None
                                                  or seen.newest_commit_us > newest):
            newest = seen.newest_commit_us
    return Seen(rows, frozenset(commits), newest)


class _Counter:
    def __init__(self) -> None:
        self.rows = 0
        self.commits: set[int] = set()
        self.newest: int | None = None

    def count(self, tables: Iterable[pa.Table]) -> Iterator[pa.Table]:
        for table in tables:
            if table.num_rows:
                self.rows += table.num_rows
                self.commits.update(pc.unique(table.column("_commit_lsn")).to_pylist())
                newest = pc.max(table.column("_commit_ts")).value
                if newest is not None and (self.newest is None or newest > self.newest):
                    self.newest = newest
            yield table

    def seen(self) -> Seen:
        return Seen(self.rows, frozenset(self.commits), self.newest)


def _ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


def _tables(blobs: Iterable[bytes]) -> Iterator[pa.Table]:
    for blob in blobs:
        yield pa.ipc.open_stream(blob).read_all()


