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
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from typing import Final

from tidemark.errors import ConfigError, TidemarkError
from tidemark.event import TableId
from tidemark.lake.delta_checksum import DeltaChecksumSide
from tidemark.pipeline.config import PipelineConfig, Target, load_config
from tidemark.row_checksum import TableShape
from tidemark.source.registry import kind_of
from tidemark.source.verify_snapshot import VerifySnapshot
from tidemark.spark_checkpoint import committed_source_offset
from tidemark.status.verify_record import write_record
from tidemark.verify.compare import bucket_count, compare_keys, compare_tables, keys_named
from tidemark.verify.result import TableResult, VerifyResult
from tidemark.verify.shape import target_shape

log = logging.getLogger(__name__)

#: Rounds of comparing the keys changed while a round ran.
ROUNDS: Final = 5
_POLL_S: Final = 0.2

OpenSnapshot = Callable[[Sequence[TableId]], VerifySnapshot]


def verify(config_path: str | os.PathLike[str], tables: Sequence[str] | None = None,
           wait_s: float = 120.0, *, open_snapshot: OpenSnapshot | None = None,
           record: bool = True) -> VerifyResult:
    """Compare each target of the pipeline file *config_path* (or those of *tables*)
    with its source table; the result says, per table, the rows compared and each
    differing key. Errors (a bad file, an unreachable source, a column that cannot be
    compared) are in :attr:`VerifyResult.error` (exit code 2). The result is kept in
    ``<checkpoint>/verify.json`` unless *record* is false.

    *open_snapshot* opens the source snapshot (default: the source kind's
    ``verify_snapshot`` on the pipeline's publication).
    """
    started = time.time()
    result = VerifyResult(str(config_path), started_at=started)
    config: PipelineConfig | None = None
    try:
        config = load_config(config_path)
        targets = _chosen(config, tables)
        _Verify(config, targets, wait_s, open_snapshot or _kind_snapshot(config)).run(result)
    except (TidemarkError, OSError) as err:
        result.error = str(err)
    result.seconds = time.time() - started
    if record and config is not None:
        try:
            write_record(config.checkpoint, result.as_json())
        except OSError as err:
            log.warning("could not write the verify record in %s: %s", config.checkpoint, err)
    return result


def _chosen(config: PipelineConfig, tables: Sequence[str] | None) -> list[Target]:
    if not tables:
        return list(config.targets)
    by_name = {t.table: t for t in config.targets}
    unknown = [t for t in tables if t not in by_name]
    if unknown:
        raise ConfigError("--table", f"{', '.join(unknown)} is not a target of the "
                          f"pipeline; its targets are {', '.join(by_name)}")
    return [by_name[t] for t in dict.fromkeys(tables)]


def _kind_snapshot(config: PipelineConfig) -> OpenSnapshot:
    kind = kind_of(config.dsn, config.source.kind)

    def open_snapshot(tables: Sequence[TableId]) -> VerifySnapshot:
        return kind.verify_snapshot(config.dsn, tables,
                                           publication=config.source.publication)
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

    def run(self, result: VerifyResult) -> None:
        result.tables = [t.result for t in self.tables]
        for table in self.tables:
            table.open_target().close()  # shapes first: refuse before any snapshot
        active = list(self.tables)
        for number in range(1, ROUNDS + 1):
            started = time.perf_counter()
            snapshot = self.open_snapshot([t.table_id for t in active])
            result.add_phase("snapshot", time.perf_counter() - started)
            try:
                started = time.perf_counter()
                behind = not self._wait_for(snapshot.position)
                result.add_phase("wait", time.perf_counter() - started)
                for table in active:
                    self._round(table, snapshot, number, behind)
            finally:
                snapshot.close()
            active = [t for t in active if t.pending]
            if not active:
                break
        for table in self.tables:
            table.result.seconds = time.monotonic() - table.started

    def _wait_for(self, position: int) -> bool:
        """Wait until the pipeline has committed *position*; False if it did not in time."""
        deadline = time.monotonic() + self.wait_s
        while True:
            _, _, offset = committed_source_offset(self.config.checkpoint)
            if offset is not None and self.kind.log_position(offset) >= position:
                return True
            if time.monotonic() >= deadline:
                log.warning("the pipeline has not committed %s in %.0f s (is it running?): "
                            "comparing the target as it is",
                            self.kind.position_text(position), self.wait_s)
                return False
            time.sleep(_POLL_S)

    def _round(self, table: _Table, snapshot: VerifySnapshot, number: int,
               behind: bool) -> None:
        source = snapshot.side(table.table_id)
        started = time.perf_counter()
        with table.open_target() as target:
            table.result.add_phase("target_open", time.perf_counter() - started)
            assert table.shape is not None
            started = time.perf_counter()
            changed = snapshot.changed_key_hashes(table.table_id, table.shape)
            table.result.add_phase("changed_keys", time.perf_counter() - started)
            table.result.target_behind = table.result.target_behind or behind
            table.result.rounds = number
            if number == 1:
                found = compare_tables(source, target, table.shape, table.buckets,
                                       excluded_keys=changed, target_behind=behind)
                table.pending = changed
            else:
                found = compare_keys(source, target, table.shape, table.pending - changed,
                                     target_behind=behind)
                table.pending = table.pending & changed
            table.result.rows_compared += found.rows_compared
            table.result.rows_fetched += found.rows_fetched
            for phase, seconds in found.phases.items():
                table.result.add_phase(phase, seconds)
            table.result.differences += found.differences
            if table.pending and number == ROUNDS:
                table.result.not_compared = keys_named(
                    [source, target], table.shape, table.pending)
                table.pending = frozenset()
