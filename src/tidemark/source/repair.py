"""``tidemark-repair`` signals in the Spark stream: the part every source's read plan
shares (:mod:`tidemark.source.repair_signal` is the signal itself).

The driver takes a repair signal like an ``execute-snapshot`` (its id kept in the
offset, :mod:`tidemark.source.signal_requests`) and puts a :class:`RepairRequest` in
the end offset of the batch that takes it, so a replayed batch plans it again. That
batch gets one more partition, :class:`RepairRead`: on an executor, the source reads the
listed keys' current rows with its snapshot reader (a key filter instead of a key
range) and :func:`emit_repair` turns them into change rows after every change of the
batch: ``r`` for each key found, ``d`` (key columns only) for each key absent, at
``_commit_lsn`` = the batch's highest position and ``_seq`` = :data:`REPAIR_SEQ`, above
any change's. ``apply_changes`` applies them as any change. Re-reading on a replay is
idempotent: the rows are the source's current ones either way, and a later change of
a key lands in a later batch, above them.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from tidemark.event import TableId, WireTuple
from tidemark.source.read_plan import ChangeSink, Commit, Layout, LayoutColumn
from tidemark.source.repair_signal import KeyValue, RepairSignal

log = logging.getLogger(__name__)

#: ``_seq`` of a repair's ``r`` rows: above every change of a transaction (numbered
#: from 1) and every log table's ``cdc$time``, below MariaDB's snapshot rows (1 << 62)
#: of a reload that starts where the repair's batch ends.
REPAIR_SEQ: Final = (1 << 62) - 2
#: ``_seq`` of a repair's ``d`` rows: just below the ``r`` rows, so a key read back in a
#: text other than the signal's (``5`` asked, ``5.00`` found) is upserted, not deleted.
REPAIR_DELETE_SEQ: Final = REPAIR_SEQ - 1


@dataclasses.dataclass(frozen=True)
class RepairRequest:
    """A repair taken into a batch: its signal's id, the table (``schema.table``), the
    table's key columns and each key's values in their order."""

    id: str
    table: str
    key_columns: tuple[str, ...]
    keys: tuple[tuple[KeyValue, ...], ...]

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "table": self.table, "key_columns": list(self.key_columns),
                "keys": [list(k) for k in self.keys]}

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> RepairRequest:
        return cls(str(value["id"]), str(value["table"]),
                   tuple(str(c) for c in value["key_columns"]),
                   tuple(tuple(k) for k in value["keys"]))


def requests_json(requests: Sequence[RepairRequest]) -> list[dict[str, Any]]:
    """*requests* as an offset holds them."""
    return [r.to_json() for r in requests]


def requests_from(value: Any) -> tuple[RepairRequest, ...]:
    """The requests an offset holds (none when it has no ``repairs``)."""
    return tuple(RepairRequest.from_json(v) for v in value or ())


def repair_request(signal: RepairSignal, tables: Sequence[str],
                   key_columns: Mapping[str, Sequence[str]] | Any, *,
                   check: Callable[[RepairRequest], str | None] | None = None
                   ) -> RepairRequest | None:
    """The request *signal* makes of a stream of *tables*, or None (logged: a table
    not in the stream, keys that are not its key columns, a key *check* finds the
    source cannot read). *key_columns* gives a table's key columns (a mapping, or a
    function of the table's name); *check* says why the source cannot read a
    request's keys, or None."""
    name = str(signal.table)
    if name not in tables:
        log.warning("signal %s (tidemark-repair) skipped: table %s is not in this stream "
                    "(%s)", signal.id, name, ", ".join(tables))
        return None
    keys = tuple(key_columns[name] if isinstance(key_columns, Mapping)
                 else key_columns(name))
    if set(signal.key_columns) != set(keys) or len(signal.key_columns) != len(keys):
        log.warning("signal %s (tidemark-repair) skipped: its keys name %s, the key "
                    "columns of %s are %s; give each key as {%s}", signal.id,
                    ", ".join(signal.key_columns), name, ", ".join(keys),
                    ", ".join(f'"{k}": ...' for k in keys))
        return None
    order = [signal.key_columns.index(k) for k in keys]
    request = RepairRequest(signal.id, name, keys,
                            tuple(tuple(key[i] for i in order) for key in signal.keys))
    problem = check(request) if check is not None else None
    if problem is not None:
        log.warning("signal %s (tidemark-repair) skipped: %s", signal.id, problem)
        return None
    log.info("signal %s: repair of %d key(s) of %s requested", signal.id, len(signal.keys),
             name)
    return request


class RepairRead:
    """One partition: read the current rows of some tables' keys and emit them at
    *commit_lsn* (the batch's highest position)."""

    def __init__(self, index: int, requests: Sequence[RepairRequest], commit_lsn: int,
                 seq: int = REPAIR_SEQ) -> None:
        self.index = index
        self.requests = tuple(requests)
        self.commit_lsn = commit_lsn
        #: ``_seq`` of the ``r`` rows (the ``d`` rows one below): a source whose later
        #: repairs may share the position of earlier ones makes it rise with them.
        self.seq = seq

    def __repr__(self) -> str:
        return (f"RepairRead({self.index}, {', '.join(r.id for r in self.requests)} at "
                f"{self.commit_lsn})")


def key_text(value: KeyValue) -> str:
    """A key value of a signal as the text a source prints it (numbers as JSON writes
    them)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return value if isinstance(value, str) else str(value)


def emit_repair(sink: ChangeSink, request: RepairRequest, names: Sequence[str],
                rows: Sequence[WireTuple], commit_lsn: int,
                relation_id: int = 1, seq: int = REPAIR_SEQ) -> None:
    """The change rows of *request* into *sink*: an ``r`` for each of *rows* (the keys
    found, values in the order of *names*, as the source's snapshot reads them) and a
    ``d`` for each key not among them; at ``(commit_lsn, seq)``, the ``d`` rows at
    ``seq - 1``."""
    table = TableId.parse(request.table)
    wanted = set(request.key_columns)
    sink.relation(Layout(relation_id, table.schema, table.table,
                         tuple(LayoutColumn(n, n in wanted) for n in names)))
    commit = Commit(commit_lsn, time.time_ns() // 1000, 0)
    at = [list(names).index(k) for k in request.key_columns]
    found = set()
    for row in rows:
        found.add(tuple(row[i] for i in at))
        sink.add(relation_id, "r", row, commit_lsn, seq, commit, False, None)
    absent = 0
    for key in request.keys:
        texts = tuple(key_text(v) for v in key)
        if texts in found:
            continue
        values: list[str | None] = [None] * len(names)
        for i, text in zip(at, texts, strict=True):
            values[i] = text
        sink.add(relation_id, "d", tuple(values), commit_lsn, seq - 1, commit, False, None)
        absent += 1
    log.info("repair %s of %s: %d row(s) found, %d key(s) absent", request.id,
             request.table, len(rows), absent)


def reads_of(requests: Sequence[RepairRequest], first_index: int,
             commit_lsn: int, seq: int = REPAIR_SEQ) -> list[RepairRead]:
    """The partition of a batch's repairs (none without any)."""
    return [RepairRead(first_index, requests, commit_lsn, seq)] if requests else []

