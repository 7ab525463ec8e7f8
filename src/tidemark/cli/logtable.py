"""``tidemark logtable install | uninstall | status``: manage CDC log tables.

The log tables and their triggers live in the captured database (PostgreSQL or SQLite);
these commands create, update and remove them, and report what they hold.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Iterator
from typing import Any

import click
from psycopg import sql

from tidemark.postgres_connection import Connection
from tidemark.postgres_connection import connect as pg_connect
from tidemark.source.logtable import layout, postgres_install, sqlite_install
from tidemark.source.logtable.config import is_sqlite
from tidemark.source.logtable.sqlite import connect as sqlite_connect
from tidemark.source.postgres.config import redact_dsn

_DSN_HELP = ("The database: a PostgreSQL connection string or URI, or sqlite:///path.db "
             "(or $TIDEMARK_DSN).")


@contextlib.contextmanager
def _connection(dsn: str) -> Iterator[Any]:
    conn: Any = sqlite_connect(dsn) if is_sqlite(dsn) else pg_connect(
        dsn, application_name="tidemark-logtable")
    try:
        yield conn
    finally:
        conn.close()


@click.group()
def logtable() -> None:
    """CDC log tables: changes kept as rows of a table beside each captured table,
    written by triggers and read by `tidemark capture` / `tidemark run` without a
    replication slot (PostgreSQL) or where nothing else can capture (SQLite)."""


@logtable.command()
@click.argument("dsn", envvar="TIDEMARK_DSN")
@click.option("--table", "tables", multiple=True,
              help="Table to capture (repeatable; schema.table or table). Without any: "
                   "update the log tables already installed.")
@click.option("--streams", type=click.IntRange(min=1, max=layout.MAX_STREAMS),
              help=f"Streams the changes are spread over (default {layout.DEFAULT_STREAMS} "
                   "at the first install). Changing it starts a new generation.")
@click.option("--groups", type=click.IntRange(min=1, max=layout.MAX_STREAMS),
              help=f"Stream groups: the most readers that can share the work (default "
                   f"{layout.DEFAULT_GROUPS}); fixed at the first install.")
@click.option("--ddl", multiple=True,
              help="A statement run first in the same transaction: the way to ALTER a "
                   "captured table so that its log table follows (repeatable).")
def install(dsn: str, tables: tuple[str, ...], streams: int | None, groups: int | None,
            ddl: tuple[str, ...]) -> None:
    """Create or update log tables and their triggers, in one transaction."""
    with _connection(dsn) as conn:
        if is_sqlite(dsn):
            done = sqlite_install.install(conn, tables, streams=streams, groups=groups,
                                          ddl=ddl)
            generation = sqlite_install.generations(conn)[-1]
        else:
            done = [str(t) for t in postgres_install.install(conn, tables, streams=streams,
                                                             groups=groups, ddl=ddl)]
            current = postgres_install.current_generation(conn)
            assert current is not None
            generation = current
    click.echo(f"log tables installed for {', '.join(map(str, done)) or 'no table'}: "
               f"generation {generation.number}, {generation.streams} streams in "
               f"{generation.groups} groups")


@logtable.command()
@click.argument("dsn", envvar="TIDEMARK_DSN")
@click.option("--table", "tables", multiple=True,
              help="Table to stop capturing (repeatable). Without any: all of them, and "
                   "the shared description tables.")
def uninstall(dsn: str, tables: tuple[str, ...]) -> None:
    """Remove triggers and log tables (their unread changes with them)."""
    with _connection(dsn) as conn:
        if is_sqlite(dsn):
            done = sqlite_install.uninstall(conn, tables)
        else:
            done = [str(t) for t in postgres_install.uninstall(conn, tables)]
    click.echo(f"log tables removed for {', '.join(map(str, done)) or 'no table'}")


@logtable.command()
@click.argument("dsn", envvar="TIDEMARK_DSN")
@click.argument("reader")
def forget(dsn: str, reader: str) -> None:
    """Unregister READER (a capture's --topic-prefix, a pipeline's `run:<checkpoint>`)
    that will not read again: retention stops waiting for it."""
    from tidemark.source.logtable.reader import open_database  # noqa: PLC0415

    db = open_database(dsn)
    try:
        groups = db.forget(reader)
    finally:
        db.close()
    if not groups:
        raise click.UsageError(f"no reader {reader!r} is registered (see `tidemark logtable "
                               "status`)")
    click.echo(f"reader {reader!r} forgotten ({groups} group positions)")


@logtable.command()
@click.argument("dsn", envvar="TIDEMARK_DSN")
@click.option("--json", "as_json", is_flag=True, help="One JSON object instead of text.")
def status(dsn: str, as_json: bool) -> None:
    """What is installed: generations, captured tables and the changes each log holds."""
    with _connection(dsn) as conn:
        report = _sqlite_status(conn) if is_sqlite(dsn) else _postgres_status(conn)
    report["readers"] = _readers(dsn) if report["generations"] else []
    report["database"] = dsn if is_sqlite(dsn) else redact_dsn(dsn)
    if as_json:
        click.echo(json.dumps(report))
        return
    click.echo(f"database: {report['database']}")
    if not report["generations"]:
        click.echo("no log tables installed (run `tidemark logtable install`)")
        return
    for generation in report["generations"]:
        click.echo(f"generation {generation['number']}: {generation['streams']} streams in "
                   f"{generation['groups']} groups, since {generation['started_at']}")
    for table in report["tables"]:
        click.echo(f"{table['table']}: log {table['log']}, {table['rows']} changes held"
                   + (f", oldest {table['oldest']}" if table["oldest"] else ""))
    for reader in report["readers"]:
        click.echo(f"reader {reader['reader']}: {reader['groups']} groups, last saved "
                   f"{reader['updated_at']}")
    if not report["readers"]:
        click.echo("no reader registered yet (retention deletes nothing)")


def _readers(dsn: str) -> list[dict[str, Any]]:
    from tidemark.source.logtable.reader import open_database  # noqa: PLC0415

    db = open_database(dsn)
    try:
        by_reader: dict[str, dict[str, Any]] = {}
        for entry in db.readers():
            row = by_reader.setdefault(entry.reader, {"reader": entry.reader, "groups": 0,
                                                      "updated_at": entry.updated_at})
            row["groups"] += 1
            row["updated_at"] = min(row["updated_at"], entry.updated_at)
        return list(by_reader.values())
    finally:
        db.close()


def _generations(generations: list[layout.Generation]) -> list[dict[str, Any]]:
    return [{"number": g.number, "streams": g.streams, "groups": g.groups,
             "started_at": g.started_at} for g in generations]


def _sqlite_status(conn: sqlite3.Connection) -> dict[str, Any]:
    q = sqlite_install.quote
    tables = []
    for table in sqlite_install.installed_tables(conn):
        log = layout.log_table_name(table)
        rows, oldest = conn.execute(
            f"SELECT count(*), datetime(min({q(layout.TS)}) / 1000000, 'unixepoch') "
            f"FROM {q(log)}").fetchone()
        tables.append({"table": table, "log": log, "rows": rows, "oldest": oldest})
    return {"generations": _generations(sqlite_install.generations(conn)), "tables": tables}


def _postgres_status(conn: Connection) -> dict[str, Any]:
    current = postgres_install.current_generation(conn)
    if current is None:
        return {"generations": [], "tables": []}
    cur: Any = conn.cursor()
    cur.execute(sql.SQL("SELECT generation, streams, groups, started_at::text FROM {}.{} "
                        "ORDER BY 1").format(sql.Identifier(postgres_install.SCHEMA),
                                             sql.Identifier(postgres_install.STREAMS_TABLE)))
    generations = [layout.Generation(*row) for row in cur.fetchall()]
    tables = []
    for table in postgres_install.installed_tables(conn):
        log = layout.log_table_name(table.table)
        cur.execute(sql.SQL("SELECT count(*), min({})::text FROM {}").format(
            sql.Identifier(layout.TS), sql.Identifier(table.schema, log)))
        rows, oldest = cur.fetchone()
        tables.append({"table": str(table), "log": f"{table.schema}.{log}", "rows": rows,
                       "oldest": oldest})
    cur.close()
    return {"generations": _generations(generations), "tables": tables}
