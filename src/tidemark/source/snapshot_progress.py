"""Where an incremental snapshot of one table stands: the part of a connector's offset
that lets a restarted capture continue from the chunk after the last one it emitted.

Shared by the sources that snapshot tables chunk by chunk in key order; each source
keeps its keys in the JSON form its own chunk queries read back (PostgreSQL: the text
its output functions print; MariaDB: numbers, text, or tagged bytes).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any, Final

from tidemark.event import TableId
from tidemark.source.signals import (
    ExecuteSnapshot,
    LogSignal,
    PauseSnapshot,
    ResumeSnapshot,
    Signal,
    StopSnapshot,
)

log = logging.getLogger(__name__)

#: The offset's key for the snapshot's state.
OFFSET_KEY: Final = "incremental_snapshot"


@dataclasses.dataclass
class TableProgress:
    """Where the snapshot of one table stands (persisted in the offset)."""

    table: TableId
    max_key: list[Any] | None = None
    """The table's largest key when its snapshot began (None: not read yet / empty)."""
    last_key: list[Any] | None = None
    """The largest key emitted so far (None: none yet)."""
    read_key: list[Any] | None = None
    """The largest key read into a window so far (not saved: a restart reads on from
    ``last_key``)."""
    read_all: bool = False
    """Every chunk up to ``max_key`` has been read into a window."""
    condition: str | None = None
    """Debezium's ``additional-conditions`` filter for this table (raw SQL, by design)."""
    surrogate_key: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"table": str(self.table), "max_key": self.max_key, "last_key": self.last_key,
                "condition": self.condition, "surrogate_key": self.surrogate_key}

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> TableProgress:
        last = value.get("last_key")
        return cls(TableId.parse(str(value["table"])), value.get("max_key"), last,
                   read_key=last, condition=value.get("condition"),
                   surrogate_key=value.get("surrogate_key"))


class SignalledSnapshots:
    """The queue of tables an incremental snapshot still has to read, driven by
    signals (``execute-snapshot``, ``stop-snapshot``, ``pause-snapshot``,
    ``resume-snapshot``, ``log``) and saved in the offset (:data:`OFFSET_KEY`).

    A source subclasses it with how it reads chunks; :meth:`refusal` says why a table
    cannot be snapshotted, :meth:`stopped` drops what was read ahead for stopped tables.
    """

    def __init__(self, captured: Callable[[TableId], bool],
                 state: dict[str, Any] | None = None) -> None:
        self._is_captured = captured
        self.queue: list[TableProgress] = []
        self.paused = False
        self.changed = False
        """The state changed since the last offset was taken."""
        if state:
            self.queue = [TableProgress.from_json(t) for t in state.get("tables", [])]
            self.paused = bool(state.get("paused", False))

    @property
    def active(self) -> bool:
        """A snapshot is queued or running (paused or not)."""
        return bool(self.queue)

    def state(self) -> dict[str, Any] | None:
        """The offset's :data:`OFFSET_KEY` value (None when nothing is queued)."""
        if not self.queue:
            return None
        return {"tables": [t.to_json() for t in self.queue], "paused": self.paused}

    def refusal(self, table: TableId, signal: ExecuteSnapshot) -> str | None:
        """Why *table* cannot be snapshotted as *signal* asks (None: it can)."""
        return None

    def stopped(self, tables: set[TableId]) -> None:
        """The snapshots of *tables* were stopped: forget what was read for them."""

    def on_signal(self, signal: Signal) -> None:
        """Act on one signal read from the stream."""
        if isinstance(signal, ExecuteSnapshot):
            queued = {t.table for t in self.queue}
            for table in signal.data_collections:
                if not self._is_captured(table):
                    log.error("signal %s: table %s is not captured; skipped", signal.id,
                              table)
                    continue
                refusal = self.refusal(table, signal)
                if refusal is not None:
                    log.error("signal %s: table %s %s; skipped", signal.id, table, refusal)
                    continue
                if table in queued:
                    log.info("signal %s: table %s is already being snapshotted", signal.id,
                             table)
                    continue
                self.queue.append(TableProgress(
                    table, condition=signal.additional_conditions.get(table),
                    surrogate_key=signal.surrogate_key))
                queued.add(table)
                log.info("signal %s: incremental snapshot of %s queued", signal.id, table)
        elif isinstance(signal, StopSnapshot):
            stop = set(signal.data_collections) or {t.table for t in self.queue}
            self.queue = [t for t in self.queue if t.table not in stop]
            self.stopped(stop)
            log.info("signal %s: incremental snapshot stopped for %s", signal.id,
                     ", ".join(sorted(map(str, stop))) or "nothing")
        elif isinstance(signal, PauseSnapshot):
            self.paused = True
            log.info("signal %s: incremental snapshot paused", signal.id)
        elif isinstance(signal, ResumeSnapshot):
            self.paused = False
            log.info("signal %s: incremental snapshot resumed", signal.id)
        elif isinstance(signal, LogSignal):
            log.info("signal %s: %s", signal.id, signal.message)
        else:
            log.warning("signal %s (%s) skipped: it is taken by tidemark run's Spark "
                        "stream, not by this capture", signal.id, signal.TYPE)
        self.changed = True
