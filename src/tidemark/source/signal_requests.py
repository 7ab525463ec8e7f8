"""The snapshot requests in a signal table's rows, as the Spark stream takes them (every
source's read plan: see :mod:`tidemark.source.postgres.stream_signals` for the rule).

The driver reads the signal table before a batch and takes the rows whose id it has not
seen; the ids seen travel in the offset, so a replayed batch or a restarted query takes
each signal once, and the rows already there when the query first reads the table are
history, not requests.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from tidemark.source.repair_signal import RepairSignal
from tidemark.source.signals import ExecuteSnapshot, LogSignal, SignalError, parse_signal

log = logging.getLogger(__name__)


def requests_in(rows: Sequence[Sequence[Any]], seen: tuple[str, ...] | None,
                tables: Sequence[str], repairs: list[RepairSignal] | None = None
                ) -> tuple[list[str], tuple[str, ...]]:
    """:func:`~tidemark.source.postgres.stream_signals.snapshot_requests` on the signal
    table's rows, however they were read
    (``(id, type, data)`` each): the part every source shares. New ``tidemark-repair``
    signals are appended to *repairs* (without it, skipped with a warning)."""
    ids = tuple(sorted(str(row[0]) for row in rows))
    if seen is None:
        return [], ids
    taken = set(seen)
    requested: list[str] = []
    for signal_id, signal_type, data in rows:
        if signal_id in taken:
            continue
        try:
            signal = parse_signal(str(signal_id), str(signal_type), data)
        except SignalError as err:
            log.warning("signal skipped: %s", err)
            continue
        if isinstance(signal, LogSignal):
            log.info("signal %s: %s", signal.id, signal.message)
        elif isinstance(signal, RepairSignal) and repairs is not None:
            repairs.append(signal)
        elif not isinstance(signal, ExecuteSnapshot):
            log.warning("signal %s (%s) skipped: the Spark source takes execute-snapshot, "
                        "tidemark-repair and log signals", signal_id, signal_type)
        elif signal.additional_conditions or signal.surrogate_key:
            log.warning("signal %s skipped: the Spark source reloads whole tables by their "
                        "primary key; leave out additional-conditions and surrogate-key",
                        signal_id)
        else:
            for name in (str(t) for t in signal.data_collections):
                if name not in tables:
                    log.warning("signal %s: table %s skipped: it is not in this stream "
                                "(%s)", signal_id, name, ", ".join(tables))
                elif name not in requested:
                    log.info("signal %s: snapshot of %s requested", signal_id, name)
                    requested.append(name)
    return requested, ids
