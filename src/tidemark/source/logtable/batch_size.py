"""How many bytes of log rows a batch of log tables reads, asked of the database (the
pipeline's batch sizing), and which stream groups moved between two offsets."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from typing import Any

from tidemark.source.logtable.database import Position
from tidemark.source.logtable.reader import open_database


def spans(start: dict[str, Any], end: dict[str, Any]
          ) -> list[tuple[list[int], Position, Position]]:
    """The groups that moved between two offsets, by the positions they share: sorted
    groups, their start and their end."""
    moved: dict[str, list[int]] = {}
    bounds: dict[str, tuple[Position, Position]] = {}
    for group, position in end["groups"].items():
        begin = start["groups"].get(group)
        if begin != position:
            span = json.dumps([begin, position], sort_keys=True)
            moved.setdefault(span, []).append(int(group))
            bounds[span] = (begin, position)
    return [(sorted(groups), *bounds[span]) for span, groups in moved.items()]


def batch_bytes(dsn: str, tables: Sequence[str], start: dict[str, Any],
                end: dict[str, Any]) -> int | None:
    """The bytes of log rows the batch from offset *start* to *end* reads (see
    :meth:`~tidemark.source.logtable.database.LogDatabase.range_bytes`), asked of the
    database; None for a batch that holds tables' rows (a snapshot), whose size the
    log does not tell."""
    if start.get("snapshot") or end.get("loaded"):
        return None
    moved = spans(start, end)
    if not moved:
        return 0
    with contextlib.closing(open_database(dsn)) as db:
        entries = db.tables(list(tables))
        return sum(db.range_bytes(groups, begin, position, entries)
                   for groups, begin, position in moved)
