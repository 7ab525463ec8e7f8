"""The PostgreSQL stream's checks and table descriptions, before any query starts.

Everything that can fail without reading data fails here: the database being reachable,
``wal_level``, the replication privilege, the tables existing, having primary keys and
being readable; the publication is created (or completed) after those checks. The slot
is created when the query starts (``initial_offset`` of
:class:`~tidemark.source.postgres.read_plan.PostgresReadPlan`), so a DataFrame that is
never started holds no WAL.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

from tidemark import postgres_connection
from tidemark.errors import SourceError
from tidemark.event import TableId
from tidemark.source.postgres import catalog, slot
from tidemark.source.postgres import wal_reads as wal
from tidemark.source.postgres.stream_signals import check_signal_table
from tidemark.source.read_plan import ColumnLayout, ReadOptions, TableColumns

#: The metadata key of a column's PostgreSQL type name in the stream's schema.
TYPE_KEY = "tidemark.pg_type"


def table_columns(options: ReadOptions) -> dict[TableId, TableColumns]:
    """Check the database, the tables and the publication; describe each table."""
    with contextlib.closing(postgres_connection.connect(options.dsn,
                                            application_name="tidemark spark")) as conn:
        catalog.check_wal_level(conn)
        catalog.check_replication_privilege(conn)
        tables = catalog.resolve_tables(conn, [str(t) for t in options.tables])
        keys = catalog.primary_keys(conn, tables)
        keyless = [str(t) for t in tables if t not in keys]
        if keyless:
            raise SourceError(
                f"table(s) {', '.join(keyless)} have no primary key: change streams are "
                "keyed by it; add one (ALTER TABLE ... ADD PRIMARY KEY (...)) or leave "
                "the table out"
            )
        catalog.check_read_privileges(conn, tables)
        catalog.warn_about_identity_index(conn, tables, keys)
        slot.ensure_publication(conn, options.publication, tables)
        generated = catalog.publishes_generated(conn, options.publication)
        catalog.warn_about_unstreamed(conn, tables, generated_published=generated)
        # Before the catalog is read: changes committed before this position were made
        # under the columns read now or older ones (see tidemark.spark.column_history).
        read_at = catalog.wal_position(conn)
        described = {t: describe_table(conn, t, keys[t], generated=generated)
                     for t in tables}
        described = {t: _with_layout(conn, t, d, options.publication, read_at, generated)
                     for t, d in described.items()}
    if options.signal_table is not None:
        with contextlib.closing(wal.connect(options.dsn, purpose="catalog")) as signals:
            check_signal_table(signals, options.signal_table)
    return described


def _with_layout(conn: Any, table: TableId, described: TableColumns, publication: str,
                 read_at: int, generated: bool) -> TableColumns:
    """*described* with the table's attributes, for matching the stream's older layouts
    to its columns."""
    found = catalog.column_layout(conn, table, publication, generated=generated)
    if found is None:
        return described
    relid, attrs = found
    if [a[0] for a in attrs if a is not None] != [c.name for c in described.columns]:
        return described  # the table changed between the two reads: names only
    return TableColumns(described.columns, described.type_key,
                        ColumnLayout(relid, read_at, tuple(attrs)))


def describe_table(conn: Any, table: TableId, key: tuple[str, ...], *,
                   generated: bool = False) -> TableColumns:
    """*table*'s columns from the catalog (stored generated columns with *generated*:
    the publication sends them), its key columns marked."""
    return TableColumns(catalog.table_schema(conn, table, key, generated=generated).columns,
                        TYPE_KEY)


def columns_of(dsn: str, tables: Sequence[str], *,
               publication: str | None = None) -> dict[str, tuple[str, ...]]:
    """The columns of each of *tables* (``schema.table``) that exists, in their order;
    reads the catalog only (creates nothing). With *publication*, only the columns its
    stream carries: stored generated columns only if it publishes them."""
    parsed = [TableId.parse(name) for name in tables]
    with contextlib.closing(wal.connect(dsn, purpose="catalog")) as conn:
        generated = publication is None or catalog.publishes_generated(conn, publication)
        rows = conn.execute(
            "SELECT n.nspname, c.relname, a.attname FROM pg_attribute a "
            "JOIN pg_class c ON c.oid = a.attrelid "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE (n.nspname, c.relname) IN "
            "(SELECT * FROM unnest(%s::text[], %s::text[])) "
            "AND a.attnum > 0 AND NOT a.attisdropped AND (%s OR a.attgenerated = '') "
            "ORDER BY a.attrelid, a.attnum",
            ([t.schema for t in parsed], [t.table for t in parsed], generated)).fetchall()
    found: dict[str, list[str]] = {}
    for schema, table, column in rows:
        found.setdefault(str(TableId(schema, table)), []).append(column)
    return {name: tuple(columns) for name, columns in found.items()}
