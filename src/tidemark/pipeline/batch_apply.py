"""A pipeline's micro-batch on the driver: read from Spark (collected, or spilled by the
executors), applied to every target in steps, or applied on the executors; then upkeep
and the batch's report."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pyarrow as pa
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

from tidemark import faults
from tidemark.errors import ConfigError
from tidemark.lake import ApplyResult, apply_changes
from tidemark.lake.delta_writer import SnapshotLoad, apply_changes_in_steps, load_in_steps
from tidemark.lake.held_tables import HELD
from tidemark.lake.split_apply import plan_target
from tidemark.lake.upkeep import HEAVY_TASKS, UpkeepState, upkeep
from tidemark.lake.widening import TypeChangeError
from tidemark.lake.written_targets import WrittenTargets
from tidemark.pipeline import spill
from tidemark.pipeline.batch_seen import BatchSeen
from tidemark.pipeline.batch_source import (
    BatchSource,
    batch_offset,
    checkpoint_query_id,
    existing_row_values_of,
)
from tidemark.pipeline.config import PipelineConfig, Target
from tidemark.pipeline.executor_apply import TargetWork, apply_on_executors
from tidemark.pipeline.in_flight import InFlight
from tidemark.pipeline.progress import BatchReport
from tidemark.pipeline.query_errors import STOPPED_BEFORE, PipelineError, StopBeforeBatch
from tidemark.pipeline.run_metrics import RunMetrics
from tidemark.run_record import record_batch
from tidemark.source.postgres.stream_offsets import SourceOffset
from tidemark.spark import arrow_pieces
from tidemark.spark.change_schemas import arrow_schema, envelope_table_schemas, typed_rows

log = logging.getLogger(__name__)

T = TypeVar("T")


class BatchApply:
    """The batch half of :class:`tidemark.pipeline.runner.Pipeline` (its state is the
    pipeline's, set up by its ``__init__``)."""

    config: PipelineConfig
    _spark: SparkSession | None
    _stop: threading.Event
    _in_flight: InFlight
    _source: BatchSource
    _schemas: dict[str, StructType] | None
    _written: WrittenTargets | None
    _spill_path: Path | None
    _upkeep_state: dict[str, UpkeepState]
    _batches_applied: int
    _last_batch_end: float | None
    _metrics: RunMetrics
    _on_batch: Callable[[BatchReport], None] | None
    _query_id: str | None

    def _process(self, batch: DataFrame, batch_id: int) -> None:
        if self._stop.is_set():
            # Under load the next trigger starts as soon as a batch is committed, so
            # there may be no moment between batches to stop in. Failing the batch
            # before it has done anything ends the query there: it is planned in the
            # checkpoint, not committed, and runs on the next start.
            raise StopBeforeBatch(f"{STOPPED_BEFORE} {batch_id} (it runs on the next "
                                   "start)")
        with self._in_flight.batch():
            self._process_batch(batch, batch_id)

    def _process_batch(self, batch: DataFrame, batch_id: int) -> None:
        started = time.monotonic()
        if self._last_batch_end is not None:
            # Spark's own work between two batches (offsets, planning, its logs): with
            # a trigger interval, the wait for the next trigger too.
            log.debug("batch %d started %.2f s after the last one ended", batch_id,
                      started - self._last_batch_end)
            self._last_batch_end = None  # a batch that fails sets none
        raw_offset = batch_offset(self.config.checkpoint, batch_id)
        offset = self._source.offset(raw_offset)
        loads = self._source.loads(raw_offset, offset)
        if self._schemas is None:
            self._schemas = envelope_table_schemas(batch.schema)
        size = self._source.batch_bytes(batch_id, raw_offset, offset)
        if self.config.spark.apply_on == "executors":
            self._process_on_executors(batch, batch_id, raw_offset, offset, loads, size,
                                       started)
            return
        limit = self.config.spark.collect_max_mb << 20
        if size is None or size > limit:
            inputs = self._spilled(batch, batch_id, size)
        else:
            inputs = self._collected(batch, batch_id)
        timings = [f"read {time.monotonic() - started:.2f} s"]
        seen = BatchSeen()
        changes: dict[str, int] = {}
        replayed: list[str] = []
        merges: list[tuple[str, str]] = []
        try:
            for target in self.config.targets:
                rows = inputs.pop(target.table)
                load = loads.get(target.table)
                step_started = time.monotonic()
                result = self._apply(target, rows, load, batch_id, seen)
                timings.append(f"{target.table} {time.monotonic() - step_started:.2f} s")
                if result is None:
                    changes[target.table] = 0
                    continue
                faults.crash_point("between_targets", batch_id)
                changes[target.table] = 0 if result.already_applied else \
                    seen.rows.get(target.table, 0)
                if result.merge:
                    merges.append((target.table, result.merge))
                if result.already_applied:
                    replayed.append(target.table)
        finally:
            if self._spill_path is not None:
                spill.remove(self._spill_path)
                self._spill_path = None
        self._finish(batch_id, changes, replayed, seen, timings, offset, raw_offset, started,
                     merges)

    def _process_on_executors(self, batch: DataFrame, batch_id: int,
                              raw_offset: dict[str, Any], offset: SourceOffset | None,
                              loads: dict[str, SnapshotLoad], size: int | None,
                              started: float) -> None:
        """Apply the batch on the executors (:mod:`tidemark.pipeline.executor_apply`):
        the driver plans each target and commits the parts of split ones."""
        with self._changelog_first(batch, batch_id) as rows:
            self._apply_on_executors(rows, batch_id, raw_offset, offset, loads, size,
                                     started)

    def _apply_on_executors(self, batch: DataFrame, batch_id: int,
                            raw_offset: dict[str, Any], offset: SourceOffset | None,
                            loads: dict[str, SnapshotLoad], size: int | None,
                            started: float) -> None:
        assert self._schemas is not None
        faults.crash_point("after_read", batch_id)
        written = self._written_targets()
        written.check(self.config.targets, identity=False)  # deleted while the query runs
        parts = self._apply_parts(size)
        changes: dict[str, int] = {}
        replayed: list[str] = []
        work: list[TargetWork] = []
        for target in self.config.targets:
            typed = self._schemas[target.table]
            try:
                plan = plan_target(
                    target.path, target.spec, arrow_schema(typed),
                    app_id=self._app_id(target), version=batch_id, parts=parts,
                    step_rows=self.config.spark.apply_step_rows,
                    step_bytes=self.config.spark.apply_step_mb << 20,
                    snapshot_load=loads.get(target.table),
                    storage_options=target.storage_options,
                    new_column_values=functools.partial(self._source.existing_row_values,
                                                        target.table))
            except TypeChangeError as err:
                raise PipelineError(f"{target.table}: {err}") from None
            if isinstance(plan, ApplyResult):
                changes[target.table] = 0
                replayed.append(target.table)
                continue
            work.append(TargetWork(target.table, typed, plan, functools.partial(
                existing_row_values_of, self._source.kind, self.config.dsn, target.table)))
        planned = time.monotonic()
        outcomes = apply_on_executors(batch, work)
        seen = BatchSeen()
        merges: list[tuple[str, str]] = []
        targets = {t.table: t for t in self.config.targets}
        for item in work:
            outcome = outcomes.get(item.table)
            changes[item.table] = 0
            if outcome is None:
                if item.plan.snapshot_load == "replace":
                    # An empty table's snapshot: no task had rows, and the target must
                    # still become (or be replaced by) the empty table.
                    apply_changes(item.plan.uri, arrow_schema(item.schema).empty_table(),
                                  item.plan.spec, app_id=item.plan.app_id,
                                  version=batch_id, snapshot_load="replace",
                                  storage_options=item.plan.storage_options)
                    written.record(targets[item.table])
                continue
            seen.merge(outcome.seen)
            if outcome.result.already_applied:
                replayed.append(item.table)
            else:
                changes[item.table] = outcome.seen.rows.get(item.table, 0)
            if outcome.result.merge:
                merges.append((item.table, outcome.result.merge))
            written.record(targets[item.table])
        split = {t: o.parts for t, o in outcomes.items() if o.parts > 1}
        timings = [f"plan {planned - started:.2f} s",
                   f"executors {time.monotonic() - planned:.2f} s"
                   + (f" ({', '.join(f'{t} in {n} parts' for t, n in split.items())})"
                      if split else "")]
        self._finish(batch_id, changes, replayed, seen, timings, offset, raw_offset, started,
                     merges)

    def _apply_parts(self, size: int | None) -> int:
        """How many parts a target's batch may be split into: ``spark.apply_parts``
        (default: Spark's default parallelism), one per ``spark.apply_part_mb`` of
        source log."""
        most = self.config.spark.apply_parts
        if most is None:
            spark = self._spark
            most = spark.sparkContext.defaultParallelism if spark is not None else 1
        per_part = self.config.spark.apply_part_mb << 20
        if size is None or not per_part:
            return most
        return max(1, min(most, size // per_part))

    def _finish(self, batch_id: int, changes: dict[str, int], replayed: list[str],
                seen: BatchSeen, timings: list[str], offset: SourceOffset | None,
                raw_offset: dict[str, Any], started: float,
                merges: Sequence[tuple[str, str]] = ()) -> None:
        """What follows a batch's writes: the crash point, upkeep, the report."""
        faults.crash_point("after_write", batch_id)
        applied = time.monotonic() - started
        upkeep = self._upkeep([t for t in self.config.targets if changes.get(t.table)])
        upkept = time.monotonic() - started - applied
        report = self._source.report(batch_id, changes, applied, replayed, seen.newest_commit_us,
                              offset, raw_offset)
        report = dataclasses.replace(report, upkeep=upkeep, merges=tuple(merges))
        log.info("batch %d applied: %s", batch_id, changes)
        log.debug("batch %d took %.2f s: %s; upkeep %.2f s", batch_id, applied,
                  ", ".join(timings), upkept)
        self._metrics.observe(report, 0 if replayed else len(seen.commits))
        self._batches_applied += 1
        record_batch(self.config.checkpoint, report)  # for tidemark status
        if self._on_batch is not None:
            self._on_batch(report)
        self._last_batch_end = time.monotonic()

    def _upkeep(self, targets: Sequence[Target]) -> tuple[tuple[str, str, str], ...]:
        """Upkeep of the targets the batch wrote to, between this batch and the next
        (compaction or vacuum of one target at most, so a batch waits for one at most).
        A failure is logged: the batch is committed, and the next batch tries again."""
        done: list[tuple[str, str, str]] = []
        heavy = True
        for target in targets:
            state = self._upkeep_state.setdefault(target.table, UpkeepState())
            try:
                # The table the batch was applied with (held_tables), not a new open.
                table = HELD.take(target.path, target.storage_options) or \
                    DeltaTable(target.path, storage_options=target.storage_options)
                # Rewrites of a merge-on-read target's files run beside the next batches.
                tasks = upkeep(table, target.upkeep, state,
                               keys=target.spec.keys, heavy=heavy, background=True)
                HELD.give_back(target.path, target.storage_options, table)
            except Exception as err:
                log.warning("upkeep of %s failed (the batch is committed; the next batch "
                            "tries again): %s", target.path, err)
                continue
            heavy = heavy and not any(t.name in HEAVY_TASKS for t in tasks)
            done += [(target.table, task.name, str(task)) for task in tasks]
        return tuple(done)

    def _read_once(self, batch: DataFrame, batch_id: int,
                   read: Callable[[DataFrame], T]) -> T:
        """*read* the batch (a Spark action), the change log written first."""
        with self._changelog_first(batch, batch_id) as rows:
            result = read(rows)
            faults.crash_point("after_read", batch_id)
        return result

    @contextlib.contextmanager
    def _changelog_first(self, batch: DataFrame, batch_id: int) -> Iterator[DataFrame]:
        """Write the change log (if there is one) first, then give what the batch is read
        from: the change log's files, so the source is read once (the batch, without one).
        Spark's cache of the batch did that before, but it builds blocks of 10,000 rows
        in the heap, whatever their width: a 1 GB transaction of 1 KB rows overflowed a
        512 MB heap."""
        if not self.config.changelog:
            yield batch
            return
        path = self._write_changelog(batch, batch_id)
        yield batch.sparkSession.read.schema(batch.schema).parquet(str(path))

    def _collected(self, batch: DataFrame, batch_id: int) -> dict[str, pa.Table]:
        """Every target's rows of the batch, brought to the driver in one Spark action."""
        # One action gives every table's rows and the batch's statistics.
        envelope = self._read_once(batch, batch_id, DataFrame.toArrow)
        assert self._schemas is not None
        return {t.table: typed_rows(envelope, t.table, self._schemas[t.table])
                for t in self.config.targets}

    def _spilled(self, batch: DataFrame, batch_id: int,
                 size: int | None) -> dict[str, Iterator[pa.Table]]:
        """Every target's rows of the batch as pieces read from the executors' spill."""
        path = spill.spill_dir(self.config.checkpoint, batch_id)
        step = self.config.spark.apply_step_rows
        log.info("batch %d spans %s of source log (spark.collect_max_mb = %d): the "
                 "executors write it to %s and it is applied in steps of %d rows or %d MB",
                 batch_id, "an unknown amount" if size is None else f"{size / 2**20:.0f} MB",
                 self.config.spark.collect_max_mb, path, step,
                 self.config.spark.apply_step_mb)
        self._read_once(batch, batch_id, lambda rows: spill.spill(rows, path))
        self._spill_path = path
        assert self._schemas is not None
        # What toArrow() would give (pyspark 4.3's DataFrame.toArrow).
        large = batch.sparkSession.conf.get("spark.sql.execution.arrow.useLargeVarTypes")
        envelope = to_arrow_schema(batch.schema, error_on_duplicated_field_names_in_struct=True,
                                   timezone="UTC", prefers_large_types=large == "true")
        return {t.table: spill.table_pieces(path, t.table, self._schemas[t.table], envelope,
                                            step, self.config.spark.apply_step_mb << 20)
                for t in self.config.targets}

    def _apply(self, target: Target, rows: pa.Table | Iterator[pa.Table],
               load: SnapshotLoad | None, batch_id: int, seen: BatchSeen) -> ApplyResult | None:
        """Apply one target's rows of the batch (a table, or pieces of a spilled batch);
        None when there was nothing to apply."""
        if isinstance(rows, pa.Table):
            # A collected batch too is applied in steps: its log can be far smaller than
            # its rows (values PostgreSQL compressed: 586 MB of rows in 10 MB of WAL).
            rows = arrow_pieces.pieces([rows], self.config.spark.apply_step_rows,
                                self.config.spark.apply_step_mb << 20)
        pieces = seen.count(target.table, rows)
        first = next(pieces, None)
        if first is None and load == "replace":
            # An empty table's snapshot still replaces (or creates) the target.
            assert self._schemas is not None
            first = arrow_schema(self._schemas[target.table]).empty_table()
        if first is None or (not first.num_rows and load != "replace"):
            return None
        written = self._written_targets()
        written.check((target,), identity=False)  # deleted while the query runs
        new_column_values = functools.partial(self._source.existing_row_values, target.table)
        try:
            stream = crash_between_steps(arrow_pieces.first_then(first, pieces), batch_id)
            del first  # the stream lets go of it once applied, like any other piece
            if load is not None:  # a snapshot's rows: written, not merged
                result = load_in_steps(
                    target.path, stream, target.spec, app_id=self._app_id(target),
                    version=batch_id, how=load, new_column_values=new_column_values,
                    storage_options=target.storage_options)
            else:
                result = apply_changes_in_steps(
                    target.path, stream, target.spec,
                    app_id=self._app_id(target), version=batch_id,
                    storage_options=target.storage_options,
                    new_column_values=new_column_values)
        except TypeChangeError as err:
            raise PipelineError(f"{target.table}: {err}") from None
        except ConfigError as err:
            if err.key != "target":  # a setting of the target's apply spec names itself
                raise
            # delta-rs could not make the table: the key it is configured under.
            raise PipelineError(f'targets."{target.table}".path: '
                                f"{str(err).removeprefix('target: ')}") from None
        except (MemoryError, DeltaError) as err:
            if isinstance(err, DeltaError) and "Resources exhausted" not in str(err):
                raise
            raise PipelineError(
                f"batch {batch_id} could not be applied to {target.path}: {err} (after "
                f"{seen.rows.get(target.table, 0)} change rows of {target.table}, "
                f"transactions committing up to {seen.last_commit(self._source.position_text)}); "
                f"lower "
                f"spark.apply_step_rows (now {self.config.spark.apply_step_rows}), "
                f"spark.apply_step_mb (now {self.config.spark.apply_step_mb}) or "
                "spark.collect_max_mb, or give the driver more memory. Nothing of the "
                "batch was committed: the pipeline resumes from its checkpoint and "
                "applies it again") from None
        written.record(target)
        return result


    def _written_targets(self) -> WrittenTargets:
        if self._written is None:
            self._written = WrittenTargets(self.config.checkpoint)
        return self._written

    def _write_changelog(self, batch: DataFrame, batch_id: int) -> Path:
        # One directory per batch, overwritten on replay: a batch replayed after a crash
        # replaces its own files instead of adding a second copy (readable as one
        # Parquet dataset partitioned by batch_id). Row groups sized as the spill's.
        path = Path(self.config.changelog or "") / f"batch_id={batch_id}"
        batch.write.mode("overwrite").options(**spill.ROW_GROUP_OPTIONS).parquet(str(path))
        return path

    def _app_id(self, target: Target) -> str:
        if self._query_id is None:
            self._query_id = checkpoint_query_id(self.config.checkpoint)
        return f"tidemark-{self._query_id}-{target.table}"



def crash_between_steps(pieces: Iterator[pa.Table], batch_id: int) -> Iterator[pa.Table]:
    """*pieces*, with :mod:`tidemark.faults`' ``between_steps`` point when the third is
    asked for: the first two are merged into the target's branch by then."""
    for n, piece in enumerate(pieces):
        if n == 2:
            faults.crash_point("between_steps", batch_id)
        yield piece


#: Bytes a log-table change is taken to span in the lag behind the log (an estimate,
