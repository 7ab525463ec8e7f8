"""What every source task hands the engine on each poll."""

from __future__ import annotations

import msgspec

from tidemark.event import Record
from tidemark.offsets.store import Offset


class SourceBatch(msgspec.Struct, frozen=True):
    """Records polled from a source, and the offset to commit once they are durable.

    ``offset`` is the resume position after the last record, or None when the batch does
    not move it (for example it ends inside a transaction). ``finished`` is set on the
    last batch of a bounded capture (a stop position, a snapshot-only run, a synthetic
    source that ran out). ``lines`` is set instead of ``records`` by a source asked for
    JSON lines (``PostgresReader``'s ``json_lines``): one Debezium JSON text per
    change event, in order. A task the engine asked for converted records (see
    :mod:`tidemark.engine.prerender`) may have some of the engine's
    ``RenderedRecord`` s among ``records``.
    """

    records: list[Record]
    offset: Offset | None
    finished: bool = False
    lines: list[str] | None = None
