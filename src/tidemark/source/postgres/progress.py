"""How far a pipeline is behind a PostgreSQL server, and how much WAL a batch spans.

Asked between batches on the driver, through one psycopg 3 connection kept open (and
opened again when the server closed it).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import psycopg

from tidemark.source.kind import SourceProgress
from tidemark.source.postgres import wal_reads as wal
from tidemark.source.postgres.stream_offsets import from_offset

log = logging.getLogger(__name__)


class PostgresProgress(SourceProgress):
    """WAL written after a batch's end; WAL between two offsets (a query's first batch:
    from the slot, where the stream starts a new query)."""

    def __init__(self, dsn: str, slot: str, tables: Sequence[str]) -> None:
        self._dsn = dsn
        self._slot = slot
        self._conn: psycopg.Connection[Any] | None = None

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            self._conn = wal.connect(self._dsn, purpose="progress")
        return self._conn

    def lag_bytes(self, end: Mapping[str, Any]) -> int:
        return max(0, wal.flush_lsn(self._connection()) - from_offset(end))

    def batch_bytes(self, start: Mapping[str, Any] | None,
                    end: Mapping[str, Any]) -> int | None:
        if start is not None:
            return max(0, from_offset(end) - from_offset(start))
        try:
            return max(0, from_offset(end) - wal.slot_position(self._connection(),
                                                               self._slot))
        except Exception as err:  # only sizing: the spill is the safe choice
            log.debug("cannot read the slot's position: %s", err)
            return None

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
            self._conn = None
