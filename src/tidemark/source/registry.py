"""Which source a connection string names: the one place that tells them apart.

A URL whose scheme is ``mariadb://`` or ``mysql://`` is a MariaDB (MySQL-protocol)
server; anything else is a libpq connection string or URI (PostgreSQL). Users write
the URL they already have; there is no separate ``--source`` switch to keep in step.
"""

from __future__ import annotations

from typing import Final, Literal

SourceKind = Literal["postgres", "mariadb"]

MARIADB_SCHEMES: Final = ("mariadb://", "mysql://")


def source_kind(dsn: str) -> SourceKind:
    """The kind of source *dsn* connects to."""
    return "mariadb" if dsn.strip().lower().startswith(MARIADB_SCHEMES) else "postgres"
