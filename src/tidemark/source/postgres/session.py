"""Connections to the source database: tidemark's one :func:`connect`, re-exported.

The connection code lives in the core (:mod:`tidemark.postgres_connection`) so that
offsets, sources, Spark and the pipeline all open connections the same way; this
module keeps the names the PostgreSQL source has always used.
"""

from __future__ import annotations

from tidemark.postgres_connection import (
    SESSION_SETTINGS,
    Connection,
    classify_connect_error,
    classify_connect_message,
    connect,
    cursor,
    keepalive_params,
    on_standby,
    session_options,
)

__all__ = ["SESSION_SETTINGS", "Connection", "classify_connect_error",
           "classify_connect_message", "connect", "cursor", "keepalive_params", "on_standby",
           "session_options"]
