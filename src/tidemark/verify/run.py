"""``tidemark verify``'s algorithm: each target of a pipeline compared with its source
table at one exact source position.

1. The target's shape (:func:`tidemark.verify.shape.target_shape`).
2. A source snapshot at position P (``kind.verify_snapshot``).
3. Wait (at most *wait_s*) until the pipeline has committed P: then the target holds
   every change before P. A stopped pipeline is compared anyway, its differences marked
   ``target behind``.
4. The target at its latest version V (every change up to some T >= P).
5. K: the keys changed after P (up to now, so covering (P, T]).
6. Bucket sums of both sides without K; the differing buckets' rows compared.
7. Keys in K: later rounds (new snapshot, version and K') compare those not changed
   again, up to :data:`ROUNDS` rounds; keys changed in every round are reported as not
   compared, never as differences.

With *repair*, the differing keys then go to the pipeline as ``tidemark-repair``
signals (:mod:`tidemark.verify.repair`); once it has committed the batch that took
them, the repaired tables are verified again and that verify is their result.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from tidemark.errors import ConfigError
from tidemark.event import TableId
from tidemark.lake.delta_checksum import DeltaChecksumSide
from tidemark.pipeline.config import PipelineConfig, Target, load_config
from tidemark.row_checksum import ChecksumSide, RowTexts, TableShape
from tidemark.run_record import may_be_running
from tidemark.source.registry import kind_of
from tidemark.source.verify_snapshot import (
    KeyedChanges,
    ReachedByOffset,
    TruncatedAfterSnapshotError,
    VerifySnapshot,
)
from tidemark.spark_checkpoint import committed_source_offset
from tidemark.status.verify_record import write_record
from tidemark.verify import DEFAULT_REPAIR_LIMIT
from tidemark.verify.compare import bucket_count, compare_keys, compare_tables, keys_named
from tidemark.verify.failures import FAILURES, describe, failing
from tidemark.verify.repair import (
    check_repairable,
    check_signals_read,
    repair_after,
    send_repairs,
    wait_taken,
)
from tidemark.verify.result import RoundResult, TableResult, VerifyResult
from tidemark.verify.shape import add_column_differences, target_shape

log = logging.getLogger(__name__)

#: Rounds of comparing the keys changed while a round ran.
ROUNDS: Final = 5
_POLL_S: Final = 0.2

OpenSnapshot = Callable[[Sequence[TableId]], VerifySnapshot]


def verify(config_path: str | os.PathLike[str], tables: Sequence[str] | None = None,
           wait_s: float = 120.0, *, open_snapshot: OpenSnapshot | None = None,
           record: bool = True, repair: bool = False,
           repair_limit: int = DEFAULT_REPAIR_LIMIT) -> VerifyResult:
    """Compare each target of the pipeline file *config_path* (or those of *tables*)
    with its source table; the result says, per table, the rows compared and each
    differing key. Errors (a bad file, an unreachable source, a column that cannot be
    compared) are in :attr:`VerifyResult.error` (exit code 2). The result is kept in
    ``<checkpoint>/verify.json`` unless *record* is false.

    *open_snapshot* opens the source snapshot (default: the source kind's
    ``verify_snapshot`` on the pipeline's publication).

    With *repair*, each table with differences (at most *repair_limit* keys; more are
    refused: reload such a table) has its differing keys re-read from the source by
    the running pipeline (through ``[source] signal_table``, required); once it has
    applied them (waiting at most *wait_s*) the table is verified again, its result
    that verify's. A pipeline that does not take them in time applies them at its next
    start (the table's repair is ``queued``, its differences those found).
    """
    started = time.time()
    result = VerifyResult(str(config_path), started_at=started)
    config: PipelineConfig | None = None
    try:
        config = load_config(config_path)
        targets = _chosen(config, tables)
        if repair:
            check_repairable(config, kind_of(config.dsn, config.source.kind), targets)
        snapshots = open_snapshot or _kind_snapshot(config, wait_s)
        _Verify(config, targets, wait_s, snapshots).run(result)
        if repair and result.exit_code == 1:
            _repair(config, targets, wait_s, snapshots, repair_limit, result)
    except FAILURES as err:
        result.error = describe(err)
    result.seconds = time.time() - started
    if record and config is not None:
        try:
            write_record(config.checkpoint, result.as_json())
        except OSError as err:
            log.warning("could not write the verify record in %s: %s", config.checkpoint, err)
    return result


def _repair(config: PipelineConfig, targets: list[Target], wait_s: float,
            open_snapshot: OpenSnapshot, limit: int, result: VerifyResult) -> None:
    """Send the differing keys, wait for the pipeline to apply them, verify again."""
    kind = kind_of(config.dsn, config.source.kind)
    check_signals_read(config, kind)
    sent = send_repairs(config, kind, result.tables, limit)
    if not sent:
        return
    queued = [t for t in result.tables if t.repair is not None and t.repair.state == "queued"]
    if not wait_taken(config, kind, sent, wait_s):
        for table in queued:
            assert table.repair is not None
            table.repair = dataclasses.replace(table.repair, message=(
                f"the pipeline has not taken the repair in {wait_s:.0f} s (is it "
                "running?): it is queued and applied when the pipeline next runs; verify "
                "again then"))
        return
    again = VerifyResult(result.config, started_at=time.time())
    by_name = {t.table: t for t in targets}
    _Verify(config, [by_name[t.table] for t in queued], wait_s, open_snapshot).run(again)
    after = {t.table: t for t in again.tables}
    for index, table in enumerate(result.tables):
        if table.table in after and table.repair is not None:
            after[table.table].repair = repair_after(table.repair, after[table.table])
            result.tables[index] = after[table.table]


def _chosen(config: PipelineConfig, tables: Sequence[str] | None) -> list[Target]:
    if not tables:
        return list(config.targets)
    by_name = {t.table: t for t in config.targets}
    unknown = [t for t in tables if t not in by_name]
    if unknown:
        raise ConfigError("--table", f"{', '.join(unknown)} is not a target of the "
                          f"pipeline; its targets are {', '.join(by_name)}")
    return [by_name[t] for t in dict.fromkeys(tables)]


def _kind_snapshot(config: PipelineConfig, wait_s: float) -> OpenSnapshot:
    kind = kind_of(config.dsn, config.source.kind)

    def open_snapshot(tables: Sequence[TableId]) -> VerifySnapshot:
        return kind.verify_snapshot(config.dsn, tables,
                                    publication=config.source.publication, wait_s=wait_s)
    return open_snapshot


class _Table:
    """One target through the rounds."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self.table_id = TableId.parse(target.table)
        self.result = TableResult(target.table, target.path)
        self.shape: TableShape | None = None
        self.buckets = 1
        self.pending: frozenset[int] = frozenset()
        self.key_texts: dict[int, RowTexts] = {}
        """The canonical key texts of changed keys, where the snapshot gives them
        (:class:`KeyedChanges`): later rounds look those keys up by value."""
        self.compared_all = False
        """Whether a round compared the whole table (a truncate after the first
        round's position leaves that to the next round)."""
        self.started = time.monotonic()

    def open_target(self) -> DeltaChecksumSide:
        spec = self.target.spec
        try:
            side = DeltaChecksumSide(self.target.path, storage_options=self.target.storage_options,
                                     scd2=spec.stored_as_scd_type == 2,
                                     soft_delete_column=spec.soft_delete_column)
        except Exception as err:  # deltalake's errors: no table there yet, unreadable
            raise ConfigError(f'targets."{self.target.table}".path',
                              f"cannot read the Delta table {self.target.path}: {err}") \
                from None
        if self.shape is None:
            self.shape = target_shape(self.target.table, side.schema, spec)
            self.result.shape = self.shape
            self.buckets = bucket_count(side.row_estimate())
        self.result.target_version = side.version
        return side


class _Verify:
    def __init__(self, config: PipelineConfig, targets: list[Target], wait_s: float,
                 open_snapshot: OpenSnapshot) -> None:
        self.config = config
        self.tables = [_Table(t) for t in targets]
        self.wait_s = wait_s
        self.open_snapshot = open_snapshot
        self.kind = kind_of(config.dsn, config.source.kind)
        self.lagging = False  # a running pipeline did not reach a round's position

    def run(self, result: VerifyResult) -> None:
        result.tables = [t.result for t in self.tables]
        for table in self.tables:
            with failing(f"reading the target of {table.target.table}"):
                table.open_target().close()  # shapes first: refuse before any snapshot
        with failing("reading the columns of the source tables"):
            add_column_differences(self.kind, self.config,
                                   [(t.target, t.shape, t.result) for t in self.tables])
        active = list(self.tables)
        for number in range(1, ROUNDS + 1):
            started = time.perf_counter()
            with failing("opening the source snapshot of "
                         + ", ".join(str(t.table_id) for t in active)):
                snapshot = self.open_snapshot([t.table_id for t in active])
            result.add_phase("snapshot", time.perf_counter() - started)
            try:
                started = time.perf_counter()
                behind = not self._wait_for(snapshot)
                result.add_phase("wait", time.perf_counter() - started)
                for table in active:
                    with failing(f"comparing {table.target.table} with its source"):
                        self._round(table, snapshot, number, behind)
            finally:
                snapshot.close()
            active = [t for t in active if t.pending or not t.compared_all]
            if not active:
                break
        for table in self.tables:
            table.result.seconds = time.monotonic() - table.started
        unsure = [t.result.table for t in self.tables
                  if any(d.target_behind for d in t.result.differences)]
        if self.lagging and unsure:
            # Not a difference to report (or repair): the rows may be changes the
            # running pipeline has read and not applied yet.
            result.error = (
                f"the pipeline is running but did not commit the source's position in "
                f"{self.wait_s:.0f} s, and {', '.join(unsure)} differ(s) from the source: "
                "the rows listed (target behind) may be changes still in flight; verify "
                "again once it has caught up (tidemark status shows its lag), or give "
                "it longer with --wait")

    def _wait_for(self, snapshot: VerifySnapshot) -> bool:
        """Wait until the pipeline has committed the *snapshot*'s position; False if it
        did not in time, at once when no run of the pipeline is alive (nothing would
        commit it)."""
        position = snapshot.position
        deadline = time.monotonic() + self.wait_s
        while True:
            _, _, offset = committed_source_offset(self.config.checkpoint)
            if offset is not None and self._reached(snapshot, offset):
                return True
            if not may_be_running(self.config.checkpoint):
                # Not a warning: a stopped pipeline that has applied everything compares
                # equal; one that has not is reported, each difference marked behind.
                log.info("the pipeline is not running and has not committed %s: "
                         "comparing the target as it is",
                         self.kind.position_text(position))
                return False
            if time.monotonic() >= deadline:
                self.lagging = True
                log.warning("the pipeline has not committed %s in %.0f s (is it running?): "
                            "comparing the target as it is",
                            self.kind.position_text(position), self.wait_s)
                return False
            time.sleep(_POLL_S)

    def _reached(self, snapshot: VerifySnapshot, offset: Mapping[str, Any]) -> bool:
        if isinstance(snapshot, ReachedByOffset):
            return snapshot.reached_by(offset)
        return self.kind.verified_position(
            offset, [t.target.table for t in self.tables]) >= snapshot.position

    def _round(self, table: _Table, snapshot: VerifySnapshot, number: int,
               behind: bool) -> None:
        source = snapshot.side(table.table_id)
        started = time.perf_counter()
        with table.open_target() as target:
            table.result.add_phase("target_open", time.perf_counter() - started)
            assert table.shape is not None
            # Read after the target version is opened: covers every change it holds
            # beyond the snapshot's position.
            started = time.perf_counter()
            try:
                if isinstance(snapshot, KeyedChanges):
                    keyed = snapshot.changed_keys(table.table_id, table.shape)
                    table.key_texts.update(keyed)
                    changed = frozenset(keyed)
                else:
                    changed = snapshot.changed_key_hashes(table.table_id, table.shape)
            except TruncatedAfterSnapshotError:
                if number == ROUNDS and not table.compared_all:
                    raise
                # Every row may have changed since the position: this round compares
                # nothing, the next one (after the truncate) compares what this would.
                log.info("%s was truncated after %s: comparing it at a new snapshot",
                         table.target.table, self.kind.position_text(snapshot.position))
                table.result.rounds = number
                table.result.round_results.append(RoundResult(
                    number, self.kind.position_text(snapshot.position), target.version,
                    behind, -1, 0, 0))
                if number == ROUNDS:
                    self._not_compared(table, [source, target])
                return
            table.result.add_phase("changed_keys", time.perf_counter() - started)
            table.result.target_behind = table.result.target_behind or behind
            table.result.rounds = number
            if not table.compared_all:
                recompared: frozenset[int] = frozenset()
                found = compare_tables(source, target, table.shape, table.buckets,
                                       excluded_keys=changed, target_behind=behind)
                table.pending = changed
                table.compared_all = True
            else:
                recompared = table.pending - changed
                found = compare_keys(source, target, table.shape, recompared,
                                     target_behind=behind, key_texts=table.key_texts)
                table.pending = table.pending & changed
            table.result.rows_compared += found.rows_compared
            table.result.rows_fetched += found.rows_fetched
            for phase, seconds in found.phases.items():
                table.result.add_phase(phase, seconds)
            table.result.differences += found.differences
            table.result.round_results.append(RoundResult(
                number, self.kind.position_text(snapshot.position), target.version, behind,
                len(changed), len(recompared), found.rows_compared))
            if number == ROUNDS:
                self._not_compared(table, [source, target])

    @staticmethod
    def _not_compared(table: _Table, sides: list[ChecksumSide]) -> None:
        """The keys still pending after the last round: changed during every round."""
        assert table.shape is not None
        table.result.keys_not_compared = len(table.pending)
        table.result.not_compared = keys_named(sides, table.shape, table.pending,
                                               table.key_texts)
        table.pending = frozenset()
