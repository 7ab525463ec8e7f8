"""Install, update and remove SQLite log tables: plain SQL triggers, nothing to load.

SQLite has no sequences, no hash function and no user functions that outlive the
application's connection, so everything is written in core SQL: a one-row
``tidemark_cdc_clock`` table gives every change its ``cdc$time`` (SQLite has one writer
at a time, so that order is the commit order and a reader never meets a late commit);
the key hash is a polynomial over the key's ``quote()`` text. Every trigger first checks
that the table still has the columns it was installed with and aborts the write
otherwise (``ALTER TABLE ADD COLUMN`` would else be logged without the new column):
re-running ``tidemark logtable install`` brings the log in line.

The way to alter a captured table is ``tidemark logtable install --ddl "ALTER TABLE …"``:
the triggers are dropped, the statements run and the triggers are made again for the new
columns, all in one transaction, so no write goes unlogged and no unread change is lost
(a renamed column's log column is renamed with it; a dropped column's stays, holding the
values of the changes logged before). A plain ``ALTER TABLE … DROP COLUMN`` is refused by
SQLite itself, because the triggers name the column.

The database is switched to WAL mode (readers never block the application's writer).
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Sequence
from typing import Final

from tidemark.errors import ConfigError
from tidemark.source.logtable import layout

logger = logging.getLogger(__name__)

STREAMS_TABLE: Final = "tidemark_cdc_streams"
TABLES_TABLE: Final = "tidemark_cdc_tables"
CLOCK_TABLE: Final = "tidemark_cdc_clock"
READERS_TABLE: Final = "tidemark_cdc_readers"
#: Characters of the key text that the hash reads, from its end (where keys differ).
_HASHED_CHARS: Final = 12
#: µs since the Unix epoch (julianday has millisecond resolution).
NOW_MICROS: Final = "CAST((julianday('now') - 2440587.5) * 86400000000 AS INTEGER)"

_SHARED = f"""
CREATE TABLE IF NOT EXISTS {STREAMS_TABLE} (
    generation INTEGER PRIMARY KEY, streams INTEGER NOT NULL, groups INTEGER NOT NULL,
    started_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now')));
CREATE TABLE IF NOT EXISTS {TABLES_TABLE} (
    table_name TEXT PRIMARY KEY, log_table TEXT NOT NULL,
    installed_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now')));
CREATE TABLE IF NOT EXISTS {CLOCK_TABLE} (
    id INTEGER PRIMARY KEY CHECK (id = 1), time INTEGER NOT NULL, epoch TEXT);
INSERT OR IGNORE INTO {CLOCK_TABLE} (id, time) VALUES (1, 0);
CREATE TABLE IF NOT EXISTS {READERS_TABLE} (
    reader TEXT NOT NULL, grp INTEGER NOT NULL, position TEXT NOT NULL,
    updated_at TEXT NOT NULL, PRIMARY KEY (reader, grp));
"""


def quote(name: str) -> str:
    """An SQLite identifier, quoted."""
    layout.check_name("identifier", name)
    return '"' + name.replace('"', '""') + '"'


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def table_columns(conn: sqlite3.Connection, table: str) -> list[tuple[str, str, bool]]:
    """(name, declared type, is key) of *table*'s columns in order; [] if it is missing."""
    rows = conn.execute("SELECT name, type, pk FROM pragma_table_info(?)", (table,)).fetchall()
    return [(str(name), str(type_ or ""), bool(pk)) for name, type_, pk in rows]


def key_columns(conn: sqlite3.Connection, table: str) -> list[str]:
    """The primary-key columns of *table* in key order ([] for a rowid-only table)."""
    rows = conn.execute("SELECT name, pk FROM pragma_table_info(?) WHERE pk > 0 ORDER BY pk",
                        (table,)).fetchall()
    return [str(name) for name, _ in rows]


def installed_tables(conn: sqlite3.Connection) -> list[str]:
    """The tables that have a log, in name order."""
    if not conn.execute("SELECT 1 FROM sqlite_master WHERE name = ?",
                        (TABLES_TABLE,)).fetchone():
        return []
    return [str(name) for (name,) in conn.execute(
        f"SELECT table_name FROM {TABLES_TABLE} ORDER BY 1")]


def generations(conn: sqlite3.Connection) -> list[layout.Generation]:
    """The stream description, oldest first ([] before the first install)."""
    if not conn.execute("SELECT 1 FROM sqlite_master WHERE name = ?",
                        (STREAMS_TABLE,)).fetchone():
        return []
    return [layout.Generation(*row) for row in conn.execute(
        f"SELECT generation, streams, groups, started_at FROM {STREAMS_TABLE} "
        "ORDER BY generation")]


def table_name(name: str) -> str:
    """A table name as given (``main.t`` or ``t``) without the ``main`` schema."""
    schema, dot, table = name.partition(".")
    if dot and schema != "main":
        raise ConfigError("tables", f"{name!r}: only tables of the main database can be "
                          "captured (attached databases have their own log)")
    return layout.check_name("table", table if dot else schema)


def _give_the_clock_an_epoch(conn: sqlite3.Connection) -> None:
    """Name this install of the log: an uninstall drops the clock and an install starts it
    at 0 again, so positions saved before would point into the new log's changes; the
    epoch they carry tells them apart (installs made before it existed get one now)."""
    columns = [row[1] for row in conn.execute(f"PRAGMA table_info({CLOCK_TABLE})")]
    if "epoch" not in columns:
        conn.execute(f"ALTER TABLE {CLOCK_TABLE} ADD COLUMN epoch TEXT")
    conn.execute(f"UPDATE {CLOCK_TABLE} SET epoch = lower(hex(randomblob(8))) "
                 "WHERE epoch IS NULL")


def install(conn: sqlite3.Connection, names: Sequence[str], *, streams: int | None = None,
            groups: int | None = None, ddl: Sequence[str] = ()) -> list[str]:
    """Create or update the log tables and triggers of *names* (none: every installed
    table) in one transaction, after the *ddl* statements; returns the tables."""
    conn.execute("PRAGMA journal_mode=WAL")
    existing = generations(conn)
    previous = existing[-1] if existing else None
    wanted_streams, wanted_groups = layout.wanted_counts(previous, streams, groups)
    conn.execute("BEGIN IMMEDIATE")
    try:
        altered = _run_ddl(conn, ddl) if ddl else []
        for statement in filter(None, (s.strip() for s in _SHARED.split(";"))):
            conn.execute(statement)
        _give_the_clock_an_epoch(conn)
        already = installed_tables(conn)
        tables = [table_name(n) for n in names] if names else list(already)
        generation = previous
        if previous is None or wanted_streams != previous.streams:
            number = 1 if previous is None else previous.number + 1
            conn.execute(f"INSERT INTO {STREAMS_TABLE} (generation, streams, groups) "
                         "VALUES (?, ?, ?)", (number, wanted_streams, wanted_groups))
            generation = layout.Generation(number, wanted_streams, wanted_groups)
        assert generation is not None
        # One writer at a time: everything written before this transaction used the old
        # generation, everything after it uses the new one.
        rewrite = sorted(set(tables) | set(already) | set(altered)) \
            if generation is not previous else sorted(set(tables) | set(altered))
        for table in rewrite:
            _install_table(conn, table, generation)
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return tables


def _run_ddl(conn: sqlite3.Connection, ddl: Sequence[str]) -> list[str]:
    """Run *ddl* on tables whose triggers are dropped first (SQLite refuses to drop a
    column a trigger names), following each statement's column renames into the log
    tables; returns the captured tables, whose triggers the caller makes again."""
    captured = installed_tables(conn)
    for table in captured:
        for trigger in trigger_names(table):
            conn.execute(f"DROP TRIGGER IF EXISTS {quote(trigger)}")
    for statement in ddl:
        before = {t: [name for name, _, _ in table_columns(conn, t)] for t in captured}
        try:
            conn.execute(statement)
        except sqlite3.Error as err:
            raise ConfigError("ddl", f"{statement!r} failed: {err}; nothing was changed") \
                from None
        for table, old in before.items():
            new = [name for name, _, _ in table_columns(conn, table)]
            for was, now in _renamed(old, new):
                _rename_log_column(conn, layout.log_table_name(table), was, now)
    return [t for t in captured if table_columns(conn, t)]


def _renamed(old: list[str], new: list[str]) -> list[tuple[str, str]]:
    """The columns one statement renamed: SQLite keeps a renamed column in its place,
    and a statement that renames changes no other column."""
    if len(old) != len(new):
        return []
    return [(a, b) for a, b in zip(old, new, strict=True)
            if a != b and a not in new and b not in old]


def _rename_log_column(conn: sqlite3.Connection, log: str, old: str, new: str) -> None:
    # Unread changes keep their values under the column's new name.
    present = {name for name, _, _ in table_columns(conn, log)}
    for was, now in ((old, new), (layout.deleted_column(old), layout.deleted_column(new))):
        if was in present and now not in present:
            conn.execute(f"ALTER TABLE {quote(log)} RENAME COLUMN {quote(was)} TO {quote(now)}")


def _install_table(conn: sqlite3.Connection, table: str, generation: layout.Generation) -> None:
    columns = table_columns(conn, table)
    if not columns:
        raise ConfigError("tables", f"table {table!r} does not exist")
    keys = key_columns(conn, table)
    if not keys:
        raise ConfigError("tables", f"table {table!r} has no primary key: a log table "
                          "spreads changes over streams by key, and Delta applies them by "
                          "key; declare a PRIMARY KEY")
    layout.check_columns(table, [name for name, _, _ in columns])
    uniques = [str(name) for (name,) in conn.execute(
        "SELECT name FROM pragma_index_list(?) WHERE \"unique\" AND origin <> 'pk'",
        (table,))]
    if uniques:
        # REPLACE deletes the rows it conflicts with without firing delete triggers
        # unless the writing connection has recursive_triggers on.
        logger.warning("table %s has unique constraints besides its key (%s): an INSERT OR "
                       "REPLACE or UPDATE OR REPLACE that removes a conflicting row is "
                       "logged only if the writing connection set PRAGMA "
                       "recursive_triggers = ON", table, ", ".join(uniques))
    log = layout.log_table_name(table)
    others = [name for name, _, _ in columns if name not in keys]
    declared = {name: type_ for name, type_, _ in columns}
    column_defs = [f"{quote(name)} {declared[name]}" for name, _, _ in columns]
    flags = [f"{quote(layout.deleted_column(c))} INTEGER" for c in others]
    conn.execute(
        f"CREATE TABLE IF NOT EXISTS {quote(log)} ({quote(layout.STREAM)} INTEGER NOT NULL, "
        f"{quote(layout.GROUP)} INTEGER NOT NULL, {quote(layout.GENERATION)} INTEGER NOT NULL, "
        f"{quote(layout.TIME)} INTEGER NOT NULL, {quote(layout.BATCH_SEQ)} INTEGER NOT NULL, "
        f"{quote(layout.OPERATION)} INTEGER NOT NULL, {quote(layout.TS)} INTEGER NOT NULL, "
        f"{', '.join(column_defs + flags)})")
    present = {name for name, _, _ in table_columns(conn, log)}
    for name, _, _ in columns:
        if name not in present:
            conn.execute(f"ALTER TABLE {quote(log)} ADD COLUMN {quote(name)} {declared[name]}")
        if name in others and layout.deleted_column(name) not in present:
            conn.execute(f"ALTER TABLE {quote(log)} ADD COLUMN "
                         f"{quote(layout.deleted_column(name))} INTEGER")
    conn.execute(f"CREATE INDEX IF NOT EXISTS {quote(log + '_group')} ON {quote(log)} "
                 f"({quote(layout.GROUP)}, {quote(layout.TIME)})")
    integer_key = len(keys) == 1 and "INT" in declared[keys[0]].upper()
    definition = conn.execute("SELECT sql FROM sqlite_master WHERE type = 'table' AND "
                              "name = ?", (table,)).fetchone()[0]
    for statement in _triggers(table, log, definition, keys, others, generation,
                               integer_key):
        conn.execute(statement)
    conn.execute(f"INSERT OR IGNORE INTO {TABLES_TABLE} (table_name, log_table) VALUES (?, ?)",
                 (table, log))


def _hash(row: str, keys: Sequence[str], integer_key: bool = False) -> str:
    if integer_key:
        # One integer key (the common rowid alias): a multiplicative hash of the value;
        # any other value the column may hold (SQLite's loose typing) takes the text hash.
        value = f"{row}.{quote(keys[0])}"
        return (f"(CASE WHEN typeof({value}) = 'integer' THEN "
                f"(({value} % 2147483648 + 2147483648) % 2147483648 * 1103515245 + 12345) "
                f"% 2147483648 ELSE {_hash(row, keys)} END)")
    text = " || '|' || ".join(f"quote({row}.{quote(k)})" for k in keys)
    h = f"length({text})"
    for i in range(1, _HASHED_CHARS + 1):
        h = f"(({h}) * 31 + coalesce(unicode(substr({text}, -{i}, 1)), 0)) % 2147483648"
    # A multiplicative scramble: the stream and group come from the high bits.
    return f"((({h}) * 1103515245 + 12345) % 2147483648)"


def trigger_names(table: str) -> list[str]:
    """The names of the triggers that log *table*."""
    return [f"tidemark_cdc_{table}_{what}"
            for what in ("insert", "update", "key_update", "delete")]


def _triggers(table: str, log: str, definition: str, keys: list[str], others: list[str],
              generation: layout.Generation, integer_key: bool) -> list[str]:
    names = trigger_names(table)
    # ALTER TABLE rewrites the table's CREATE statement in sqlite_master: comparing it
    # costs a lookup in the (small) schema table, a per-row pragma_table_info would
    # halve the application's write rate.
    message = (f"table {table} changed since its tidemark log table was installed: run "
               "tidemark logtable install for it, and alter a captured table through it "
               "(tidemark logtable install --ddl \"ALTER TABLE …\")")
    guard = (f"SELECT RAISE(ABORT, {_literal(message)}) WHERE (SELECT sql FROM sqlite_master "
             f"WHERE type = 'table' AND name = {_literal(table)}) IS NOT "
             f"{_literal(definition)};")
    tick = f"UPDATE {CLOCK_TABLE} SET time = time + 1;"
    meta = ", ".join(quote(c) for c in (layout.STREAM, layout.GROUP, layout.GENERATION,
                                        layout.TIME, layout.BATCH_SEQ, layout.OPERATION,
                                        layout.TS))
    all_cols = ", ".join([meta, *(quote(c) for c in keys), *(quote(c) for c in others),
                          *(quote(layout.deleted_column(c)) for c in others)])
    key_cols = ", ".join([meta, *(quote(c) for c in keys)])

    def meta_values(row: str, batch: int, op: layout.Operation) -> str:
        return (f"(k.h * {generation.streams}) >> 31, (k.h * {generation.groups}) >> 31, "
                f"{generation.number}, c.time, {batch}, {int(op)}, {NOW_MICROS}")

    def source(row: str) -> str:
        return f"FROM {CLOCK_TABLE} AS c, (SELECT {_hash(row, keys, integer_key)} AS h) AS k"

    def insert_row(batch: int) -> str:
        values = [meta_values("NEW", batch, layout.Operation.INSERT),
                  *(f"NEW.{quote(c)}" for c in keys), *(f"NEW.{quote(c)}" for c in others),
                  *(f"CASE WHEN NEW.{quote(c)} IS NULL THEN 1 END" for c in others)]
        return f"{tick} INSERT INTO {quote(log)} ({all_cols}) SELECT {', '.join(values)} " \
               f"{source('NEW')};"

    def delete_row(batch: int) -> str:
        values = [meta_values("OLD", batch, layout.Operation.ROW_DELETE),
                  *(f"OLD.{quote(c)}" for c in keys)]
        return f"{tick} INSERT INTO {quote(log)} ({key_cols}) SELECT {', '.join(values)} " \
               f"{source('OLD')};"

    update_values = [
        meta_values("NEW", 0, layout.Operation.UPDATE), *(f"NEW.{quote(c)}" for c in keys),
        *(f"CASE WHEN NEW.{quote(c)} IS NOT OLD.{quote(c)} THEN NEW.{quote(c)} END"
          for c in others),
        *(f"CASE WHEN NEW.{quote(c)} IS NULL AND OLD.{quote(c)} IS NOT NULL THEN 1 END"
          for c in others)]
    update_row = (f"{tick} INSERT INTO {quote(log)} ({all_cols}) SELECT "
                  f"{', '.join(update_values)} {source('NEW')};")
    key_changed = " OR ".join(f"NEW.{quote(k)} IS NOT OLD.{quote(k)}" for k in keys)
    target = quote(table)
    return [
        *(f"DROP TRIGGER IF EXISTS {quote(name)}" for name in names),
        f"CREATE TRIGGER {quote(names[0])} AFTER INSERT ON {target} BEGIN {guard} "
        f"{insert_row(0)} END",
        f"CREATE TRIGGER {quote(names[1])} AFTER UPDATE ON {target} WHEN NOT ({key_changed}) "
        f"BEGIN {guard} {update_row} END",
        f"CREATE TRIGGER {quote(names[2])} AFTER UPDATE ON {target} WHEN ({key_changed}) "
        f"BEGIN {guard} {delete_row(0)} {insert_row(1)} END",
        f"CREATE TRIGGER {quote(names[3])} AFTER DELETE ON {target} BEGIN {guard} "
        f"{delete_row(0)} END",
    ]


def uninstall(conn: sqlite3.Connection, names: Sequence[str]) -> list[str]:
    """Remove the triggers and log tables of *names* (none: all, and the shared tables)."""
    installed = installed_tables(conn)
    tables = [table_name(n) for n in names] if names else installed
    for table in tables:
        if table not in installed:
            raise ConfigError("tables", f"table {table!r} has no log table to remove")
    conn.execute("BEGIN IMMEDIATE")
    try:
        for table in tables:
            for trigger in trigger_names(table):
                conn.execute(f"DROP TRIGGER IF EXISTS {quote(trigger)}")
            conn.execute(f"DROP TABLE IF EXISTS {quote(layout.log_table_name(table))}")
            conn.execute(f"DELETE FROM {TABLES_TABLE} WHERE table_name = ?", (table,))
        if set(tables) == set(installed):
            for shared in (STREAMS_TABLE, TABLES_TABLE, CLOCK_TABLE, READERS_TABLE):
                conn.execute(f"DROP TABLE IF EXISTS {shared}")
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return tables
