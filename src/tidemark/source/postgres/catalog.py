"""What the source's catalog says: prerequisites, captured tables, their columns and keys.

Every check that can fail raises :class:`tidemark.errors.SourceError` with a message
that names the setting, role or table at fault and says how to fix it.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Sequence
from typing import Any

import psycopg2.extensions

from tidemark.errors import SourceError
from tidemark.event import Column, TableId, TableSchema
from tidemark.source.postgres.session import cursor
from tidemark.source.postgres.types import (
    ARRAY_ELEMENT_OID,
    TEXT_ARRAY_OID,
    TEXT_OID,
    python_parser,
)

log = logging.getLogger(__name__)

BUILTIN_OIDS = frozenset(ARRAY_ELEMENT_OID) | frozenset(ARRAY_ELEMENT_OID.values())
ARRAY_OID_OF = {element: array for array, element in ARRAY_ELEMENT_OID.items()}
_SYSTEM_SCHEMAS = ("pg_catalog", "information_schema", "pg_toast")
_REGEX_META = re.compile(r"[\\^$.|?*+()\[\]{}]")


def check_wal_level(conn: psycopg2.extensions.connection) -> None:
    """Fail unless ``wal_level`` is ``logical``."""
    with cursor(conn) as cur:
        cur.execute("SHOW wal_level")
        (level,) = cur.fetchone()
    if level != "logical":
        raise SourceError(
            f"wal_level is {level!r} but logical decoding needs wal_level = logical: run "
            "ALTER SYSTEM SET wal_level = logical (or set it in postgresql.conf) and "
            "restart PostgreSQL"
        )


def check_replication_privilege(conn: psycopg2.extensions.connection) -> None:
    """Fail unless the current role may use replication (REPLICATION or superuser)."""
    with cursor(conn) as cur:
        cur.execute(
            "SELECT current_user, rolreplication OR rolsuper FROM pg_roles "
            "WHERE rolname = current_user"
        )
        user, allowed = cur.fetchone()
    if not allowed:
        raise SourceError(
            f"role {user!r} may not use logical replication: grant it with "
            f'ALTER ROLE "{user}" WITH REPLICATION (as a superuser)'
        )


def current_database(conn: psycopg2.extensions.connection) -> str:
    with cursor(conn) as cur:
        cur.execute("SELECT current_database()")
        name: str = cur.fetchone()[0]
        return name


def resolve_tables(
    conn: psycopg2.extensions.connection,
    include: Sequence[str],
    exclude: Sequence[str] = (),
) -> list[TableId]:
    """The captured tables: every ``include`` entry resolved against the catalog.

    An entry that is a plain ``schema.table`` name must exist; an entry that is a
    regular expression must match at least one table. ``exclude`` patterns remove
    tables. An empty ``include`` means every ordinary table outside system schemas.
    """
    with cursor(conn) as cur:
        cur.execute(
            "SELECT n.nspname, c.relname FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE c.relkind IN ('r', 'p') AND NOT c.relispartition "
            "AND n.nspname <> ALL(%s) AND n.nspname NOT LIKE 'pg_temp%%' "
            "ORDER BY 1, 2",
            (list(_SYSTEM_SCHEMAS),),
        )
        existing = [TableId(s, t) for s, t in cur.fetchall()]
    database = current_database(conn)
    chosen: list[TableId] = []
    if not include:
        # Publishing a table without a key would make PostgreSQL refuse its UPDATEs and
        # DELETEs; only tables named explicitly are captured regardless.
        chosen = _keyed_tables(conn, existing)
    for entry in include:
        if not _REGEX_META.search(entry.replace(".", "", 1)):
            table = TableId.parse(entry)
            if table not in existing:
                raise SourceError(
                    f"table {table} not found in database {database!r}: check the name "
                    "(schema.table, case-sensitive) in the table include list"
                )
            matches = [table]
        else:
            pattern = re.compile(entry)
            matches = [t for t in existing if pattern.fullmatch(str(t))]
            if not matches:
                raise SourceError(
                    f"no table in database {database!r} matches the include pattern "
                    f"'{entry}': patterns are regular expressions matched against the whole "
                    "schema.table name; fix the pattern in the table include list"
                )
        chosen.extend(m for m in matches if m not in chosen)
    excluded = [re.compile(p) for p in exclude]
    return [t for t in chosen if not any(p.fullmatch(str(t)) for p in excluded)]


def _keyed_tables(conn: psycopg2.extensions.connection,
                  tables: list[TableId]) -> list[TableId]:
    """The tables with a primary key or a replica identity other than DEFAULT/NOTHING."""
    with cursor(conn) as cur:
        cur.execute(
            "SELECT n.nspname, c.relname FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE c.relreplident IN ('f', 'i') OR EXISTS ("
            "  SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND i.indisprimary)"
        )
        keyed = {TableId(s, t) for s, t in cur.fetchall()}
    return [t for t in tables if t in keyed]


def primary_keys(
    conn: psycopg2.extensions.connection, tables: Iterable[TableId]
) -> dict[TableId, tuple[str, ...]]:
    """Primary-key columns per table, in key order; tables without one are absent."""
    tables = list(tables)
    if not tables:
        return {}
    with cursor(conn) as cur:
        cur.execute(
            "SELECT n.nspname, c.relname, array_agg(a.attname ORDER BY k.ord) "
            "FROM pg_index i "
            "JOIN pg_class c ON c.oid = i.indrelid "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord) "
            "JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = k.attnum "
            "WHERE i.indisprimary AND (n.nspname, c.relname) IN "
            "(SELECT * FROM unnest(%s::text[], %s::text[])) "
            "GROUP BY 1, 2",
            ([t.schema for t in tables], [t.table for t in tables]),
        )
        return {TableId(s, t): tuple(cols) for s, t, cols in cur.fetchall()}


def not_null_columns(conn: psycopg2.extensions.connection, table: TableId) -> frozenset[str]:
    """Names of the table's NOT NULL columns."""
    with cursor(conn) as cur:
        cur.execute(
            "SELECT a.attname FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND c.relname = %s AND a.attnum > 0 AND a.attnotnull "
            "AND NOT a.attisdropped",
            (table.schema, table.table),
        )
        return frozenset(name for (name,) in cur.fetchall())


def type_info(conn: psycopg2.extensions.connection, oid: int) -> tuple[str, int]:
    """(name, decoding OID) of a type.

    The decoding OID is the built-in type whose text form the type shares: a domain
    decodes as its base type, an enum as text, an array of either as an array of that
    (``mood[]`` as ``text[]``). Built-in types decode as themselves.
    """
    with cursor(conn) as cur:
        cur.execute(
            "WITH RECURSIVE base(oid, depth) AS ("
            "  SELECT %s::oid, 0"
            "  UNION ALL SELECT t.typbasetype, b.depth + 1 FROM base b"
            "  JOIN pg_type t ON t.oid = b.oid WHERE t.typtype = 'd' AND b.depth < 10) "
            "SELECT format_type(%s::oid, NULL), t.oid, t.typtype, t.typcategory, t.typelem, "
            "e.typtype, e.typbasetype "
            "FROM base b JOIN pg_type t ON t.oid = b.oid "
            "LEFT JOIN pg_type e ON e.oid = t.typelem "
            "ORDER BY b.depth DESC LIMIT 1",
            (oid, oid),
        )
        row = cur.fetchone()
    if row is None:
        return str(oid), oid
    name, base, typtype, category, element, element_type, element_base = row
    if int(base) in BUILTIN_OIDS:
        return str(name), int(base)
    if category == "A" and element:
        if element_type == "d" and int(element_base) in BUILTIN_OIDS:
            array = ARRAY_OID_OF.get(int(element_base))
            if array is not None:
                return str(name), array
        return str(name), TEXT_ARRAY_OID
    del typtype  # enums, ranges, composites and extension types decode as their text
    return str(name), TEXT_OID


def table_schema(
    conn: psycopg2.extensions.connection, table: TableId, key: Sequence[str] | None
) -> TableSchema:
    """The current columns of *table* from the catalog (used by the snapshot)."""
    with cursor(conn) as cur:
        cur.execute(
            "SELECT a.attname, a.atttypid, a.atttypmod, format_type(a.atttypid, NULL), "
            "c.relreplident, a.attnotnull "
            "FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND c.relname = %s AND a.attnum > 0 "
            "AND NOT a.attisdropped AND a.attgenerated = '' ORDER BY a.attnum",
            (table.schema, table.table),
        )
        rows: list[Any] = cur.fetchall()
    if not rows:
        raise SourceError(f"table {table} not found (was it dropped?)")
    key = tuple(key or ())
    decoding = {int(oid): type_info(conn, int(oid))[1] for _, oid, *_ in rows}
    columns = tuple(
        Column(name, decoding[int(oid)], int(typmod), str(tname), name in key,
               python_parser(decoding[int(oid)], int(typmod)), not notnull)
        for name, oid, typmod, tname, _, notnull in rows
    )
    names = [c.name for c in columns]
    return TableSchema(table, columns, tuple(names.index(k) for k in key), str(rows[0][4]))


def warn_about_keyless(
    conn: psycopg2.extensions.connection, tables: Iterable[TableId],
    keys: dict[TableId, tuple[str, ...]],
) -> None:
    """Log tables whose updates and deletes PostgreSQL cannot publish or we cannot key."""
    for table in tables:
        if table in keys:
            continue
        with cursor(conn) as cur:
            cur.execute(
                "SELECT c.relreplident FROM pg_class c JOIN pg_namespace n "
                "ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relname = %s",
                (table.schema, table.table),
            )
            (ident,) = cur.fetchone()
        if ident in ("d", "n"):
            log.warning(
                "table %s has no primary key and REPLICA IDENTITY %s: PostgreSQL will "
                "refuse its UPDATEs and DELETEs while it is published; add a primary key "
                "or ALTER TABLE %s REPLICA IDENTITY FULL", table,
                "DEFAULT" if ident == "d" else "NOTHING", table,
            )
        else:
            log.warning("table %s has no primary key: its events have no key", table)
