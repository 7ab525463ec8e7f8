"""The MariaDB connector's own ``source`` fields, in Debezium's MySQL order."""

from __future__ import annotations

import msgspec


class MariaDbSourceFields(msgspec.Struct, frozen=True, gc=False):
    """``server_id``, ``gtid``, ``file``, ``pos`` (the rows event's), ``row`` (the row's
    index in it), ``thread``, ``query`` (always null: ``binlog_annotate_row_events`` is
    not read)."""

    server_id: int
    gtid: str | None
    file: str
    pos: int
    row: int
    thread: int | None
    query: str | None = None
