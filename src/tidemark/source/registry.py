"""Which source a connection string names: the one place that tells them apart.

A URL whose scheme is ``mariadb://`` or ``mysql://`` is a MariaDB (MySQL-protocol)
server; ``sqlite:`` is a SQLite file, captured through log tables (the only way to
capture SQLite); anything else is a libpq connection string or URI (PostgreSQL),
captured through logical replication unless log tables are asked for.
"""

from __future__ import annotations

from typing import Final, Literal

from tidemark.errors import ConfigError

SourceKind = Literal["postgres", "mariadb", "logtable"]

MARIADB_SCHEMES: Final = ("mariadb://", "mysql://")
SQLITE_SCHEME: Final = "sqlite:"
#: What ``--source`` / ``[source] kind`` accept.
KINDS: Final = ("replication", "logtable")


def source_kind(dsn: str, requested: str | None = None) -> SourceKind:
    """The kind of source *dsn* connects to; *requested* ``"logtable"`` reads a
    PostgreSQL database's log tables instead of its WAL."""
    text = dsn.strip().lower()
    if requested not in (None, *KINDS):
        raise ConfigError("source", f"{requested!r} is not a source kind; use one of "
                          f"{', '.join(KINDS)}")
    if text.startswith(MARIADB_SCHEMES):
        if requested == "logtable":
            raise ConfigError("source", "log tables are for PostgreSQL and SQLite; a "
                              "MariaDB server is captured from its binlog")
        return "mariadb"
    if text.startswith(SQLITE_SCHEME):
        if requested == "replication":
            raise ConfigError("source", "SQLite has no replication stream; it is captured "
                              "through log tables (leave out the source kind)")
        return "logtable"
    return "logtable" if requested == "logtable" else "postgres"
