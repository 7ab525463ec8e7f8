"""``tidemark verify --repair``: the differing keys of a verify sent to the running
pipeline as ``tidemark-repair`` signals (:mod:`tidemark.source.repair_signal`), and the
wait until it has taken them.

Only the keys named missing, extra or different are sent (never those "not compared",
which a writer changed during every round: the stream brings them anyway). Their
canonical texts become the source's values through the kind
(``SourceKind.repair_key_value``). A table with more differing keys than the limit is
not repaired key by key: reloading it (``execute-snapshot``) is cheaper than thousands
of signals, and the message says so.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence
from typing import Final

from tidemark.errors import ConfigError
from tidemark.event import TableId
from tidemark.lake import change_rows as cr
from tidemark.pipeline.config import PipelineConfig, Target
from tidemark.source.kind import SourceKind
from tidemark.source.repair_keys import RepairKeyError
from tidemark.source.repair_signal import REPAIR_TYPE, KeyValue, repair_signals_data
from tidemark.source.signals import send_signal, signal_table_ddl
from tidemark.spark_checkpoint import committed_source_offset
from tidemark.verify.result import Difference, TableRepair, TableResult

log = logging.getLogger(__name__)

_POLL_S: Final = 0.2


def check_repairable(config: PipelineConfig, kind: SourceKind,
                     targets: Sequence[Target] = ()) -> None:
    """Refuse ``--repair`` of a pipeline without a signal table, naming the setting, and
    of *targets* sequenced by their own columns (``sequence_by``): a repair row is
    sequenced after the batch's changes by ``_commit_lsn``/``_seq`` only, so such a
    target would take it for an old change and drop it."""
    for target in targets:
        if target.spec.sequence_by != cr.DEFAULT_SEQUENCE:
            raise ConfigError(f'targets."{target.table}".sequence_by', "--repair cannot "
                              f"mend this target: it orders changes by "
                              f"{', '.join(target.spec.sequence_by)}, and the rows a repair "
                              "re-reads carry a new position only in _commit_lsn/_seq, so "
                              "they would be dropped as older than the target's; reload the "
                              f"table instead ({_reload(config, kind, target.table)}), or "
                              "leave it out of the repair (--table)")
    if config.source.signal_table is None:
        example = TableId("public", "tidemark_signal")
        raise ConfigError("source.signal_table", "--repair sends the differing keys "
                          "through the pipeline's signal table, and this pipeline has "
                          "none: create one in the source database "
                          f"({signal_table_ddl(example)}), set signal_table = "
                          f'"{example}" in [source] and restart the pipeline once '
                          "so that it reads the table")


def _reload(config: PipelineConfig, kind: SourceKind, table: str) -> str:
    signal_table = config.source.signal_table
    return kind.reload_hint(table, None if signal_table is None else str(signal_table))


def signal_keys(table: TableResult, kind: SourceKind) -> list[dict[str, KeyValue]]:
    """The repair signal's keys of *table*'s differences (missing, extra, different),
    each key column's canonical text turned into the source's value; raises
    RepairKeyError for a key it cannot name."""
    assert table.shape is not None, "a compared table has its shape"
    types = {c.name: c.target_type for c in table.shape.columns}
    keys: list[dict[str, KeyValue]] = []
    for difference in table.differences:
        key: dict[str, KeyValue] = {}
        for name in table.shape.keys:
            text = difference.key.get(name)
            if text is None:
                raise RepairKeyError(f"key column {name} is NULL in a {difference.kind} row; "
                                     "a repair names keys by their values")
            key[name] = kind.repair_key_value(text, types[name])
        keys.append(key)
    return keys


def send_repairs(config: PipelineConfig, kind: SourceKind, tables: Sequence[TableResult],
                 limit: int) -> list[str]:
    """Send the repair signals of every table with differences; set each one's
    :attr:`TableResult.repair` (``queued``, or ``refused`` with the reason) and return
    the ids of the signals written."""
    assert config.source.signal_table is not None
    sent: list[str] = []
    for table in tables:
        if table.equal:
            continue
        if len(table.differences) > limit:
            table.repair = TableRepair("refused", message=(
                f"{len(table.differences)} keys differ, more than the repair limit of "
                f"{limit}: reload the table instead ({_reload(config, kind, table.table)}), "
                "or raise --repair-limit"))
            continue
        unkeyed = [d for d in table.differences if not d.keyed]
        if unkeyed:
            table.repair = TableRepair("refused", message=(
                f"a repair re-reads single keys from the source and cannot mend a "
                f"{unkeyed[0].kind} difference ({_named(unkeyed[0])}): reload the table "
                f"instead ({_reload(config, kind, table.table)})"))
            continue
        try:
            keys = signal_keys(table, kind)
            payloads = repair_signals_data(table.table, keys)
        except (RepairKeyError, ValueError) as err:
            table.repair = TableRepair("refused", message=(
                f"its keys cannot be sent in a repair signal ({err}): reload the table "
                f"instead ({_reload(config, kind, table.table)})"))
            continue
        ids = tuple(send_signal(config.dsn, config.source.signal_table, REPAIR_TYPE, data)
                    for data in payloads)
        log.info("repair of %d key(s) of %s sent in %d signal(s)", len(keys), table.table,
                 len(ids))
        table.repair = TableRepair("queued", len(keys), ids)
        sent += ids
    return sent


def _named(difference: Difference) -> str:
    if difference.detail is not None:
        return difference.detail
    return ", ".join(f"{k}={v}" for k, v in difference.key.items())


def check_signals_read(config: PipelineConfig, kind: SourceKind) -> None:
    """Refuse a repair the pipeline would never take: until it has read its signal
    table once (its first batch after a start with ``signal_table`` set, after an
    initial snapshot), the rows there are history to it, not signals."""
    _, _, offset = committed_source_offset(config.checkpoint)
    if kind.taken_signals(offset) is None:
        raise ConfigError("source.signal_table", f"the pipeline has not read its signal "
                          f"table {config.source.signal_table} yet (it does after a start "
                          "with signal_table set, once an initial snapshot is done), and "
                          "would take signals written now as history: run it until it "
                          "has, then repair")


def wait_taken(config: PipelineConfig, kind: SourceKind, ids: Sequence[str],
               wait_s: float) -> bool:
    """Wait until the pipeline has committed a batch that took every signal of *ids*
    (then its repair rows are in the targets); False if it did not within *wait_s*."""
    wanted = frozenset(ids)
    deadline = time.monotonic() + wait_s
    while True:
        _, _, offset = committed_source_offset(config.checkpoint)
        taken = kind.taken_signals(offset)
        if taken is not None and wanted <= taken:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(_POLL_S)


def repair_after(repair: TableRepair, after: TableResult) -> TableRepair:
    """*repair*'s state once the pipeline has taken its signals and the table has been
    verified again (*after*): applied, unless the target is still behind its source
    there (then the repair's rows may not be written yet, and it stays queued)."""
    if not after.target_behind:
        return dataclasses.replace(repair, state="applied", message=None)
    return dataclasses.replace(repair, state="queued", message=(
        "the pipeline has taken the repair, but the target is still behind its source: "
        "the repair's rows may not be written yet; verify again once the pipeline has "
        "caught up"))
