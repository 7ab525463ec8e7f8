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

from tidemark.errors import TerminalError
from tidemark.source.kind import SourceProgress
from tidemark.source.postgres.pgoutput import str_to_lsn
from tidemark.source.postgres.session import (
    classify_connect_message,
    keepalive_params,
    session_options,
)

log = logging.getLogger(__name__)


class OffsetError(TerminalError):
    """A checkpointed offset is not a PostgreSQL one."""


def offset_lsn(offset: Mapping[str, Any]) -> int:
    """The LSN of a Spark offset of the PostgreSQL stream (``{"lsn": "0/0", …}``)."""
    text = offset.get("lsn") if isinstance(offset, Mapping) else None
    if not isinstance(text, str):
        raise OffsetError(f"offset {offset!r} is not a tidemark offset ({{'lsn': '0/0'}}): "
                          "was the checkpoint written by another source?")
    try:
        return str_to_lsn(text)
    except ValueError as err:
        raise OffsetError(f"offset {offset!r}: {err}") from None


def connect(dsn: str, *, purpose: str) -> psycopg.Connection[Any]:
    """An autocommit psycopg 3 connection with tidemark's session settings (errors never
    contain the password)."""
    params = psycopg.conninfo.conninfo_to_dict(dsn)
    keepalives: dict[str, Any] = keepalive_params(dsn)
    try:
        return psycopg.Connection.connect(
            dsn, autocommit=True, options=session_options(dsn),
            application_name=f"tidemark spark {purpose}",
            connect_timeout=int(params.get("connect_timeout") or 10), **keepalives)
    except psycopg.OperationalError as err:
        raise classify_connect_message(dsn, str(err)) from None


def flush_lsn(conn: psycopg.Connection[Any]) -> int:
    """``pg_current_wal_flush_lsn()``."""
    row = conn.execute("SELECT (pg_current_wal_flush_lsn() - '0/0')::bigint").fetchone()
    assert row is not None
    return int(row[0])


def slot_lsn(conn: psycopg.Connection[Any], slot: str) -> int | None:
    """The slot's ``confirmed_flush_lsn``; None if it does not exist."""
    row = conn.execute("SELECT (confirmed_flush_lsn - '0/0')::bigint FROM "
                       "pg_replication_slots WHERE slot_name = %s", (slot,)).fetchone()
    return None if row is None or row[0] is None else int(row[0])


class PostgresProgress(SourceProgress):
    """WAL written after a batch's end; WAL between two offsets (a query's first batch:
    from the slot, where the stream starts a new query)."""

    def __init__(self, dsn: str, slot: str, tables: Sequence[str]) -> None:
        self._dsn = dsn
        self._slot = slot
        self._conn: psycopg.Connection[Any] | None = None

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            self._conn = connect(self._dsn, purpose="progress")
        return self._conn

    def lag_bytes(self, end: Mapping[str, Any]) -> int:
        return max(0, flush_lsn(self._connection()) - offset_lsn(end))

    def batch_bytes(self, start: Mapping[str, Any] | None,
                    end: Mapping[str, Any]) -> int | None:
        if start is not None:
            return max(0, offset_lsn(end) - offset_lsn(start))
        try:
            position = slot_lsn(self._connection(), self._slot)
        except Exception as err:  # only sizing: the spill is the safe choice
            log.debug("cannot read the slot's position: %s", err)
            return None
        if position is None:
            log.debug("cannot read the slot's position: slot %r does not exist", self._slot)
            return None
        return max(0, offset_lsn(end) - position)

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
            self._conn = None
