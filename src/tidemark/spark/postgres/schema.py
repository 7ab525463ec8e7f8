"""The PostgreSQL stream's checks and typed schemas, before any query starts.

Everything that can fail without reading data fails here: the database being reachable,
``wal_level``, the replication privilege, the tables existing, having primary keys and
being readable; the publication is created (or completed) after those checks. The slot
is created when the query starts (``TidemarkStreamReader.initialOffset`` in
:mod:`tidemark.spark.postgres.reader`), so a DataFrame that is never started holds no
WAL.
"""

from __future__ import annotations

import contextlib
from typing import Any

from pyspark.sql.types import StructField, StructType

from tidemark.errors import SourceError
from tidemark.event import TableId
from tidemark.source.postgres import catalog, session, slot
from tidemark.spark.arrow_rows import META_NAMES, typed_schema
from tidemark.spark.column_history import TableLayout, with_layout
from tidemark.spark.options import SourceOptions
from tidemark.spark.postgres import wal
from tidemark.spark.signals import check_signal_table
from tidemark.spark.type_mapping import spark_type


def table_schemas(options: SourceOptions) -> dict[TableId, StructType]:
    """Check the database, the tables and the publication; each table's typed schema."""
    with contextlib.closing(session.connect(options.dsn,
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
        schemas = {t: table_spark_schema(conn, t, keys[t], generated=generated)
                   for t in tables}
        schemas = {t: _with_layout(conn, t, s, options.publication, read_at, generated)
                   for t, s in schemas.items()}
    if options.signal_table is not None:
        with contextlib.closing(wal.connect(options.dsn, purpose="catalog")) as signals:
            check_signal_table(signals, options.signal_table)
    return schemas


def _with_layout(conn: Any, table: TableId, schema: StructType, publication: str,
                 read_at: int, generated: bool) -> StructType:
    """*schema* with the table's attributes (:class:`TableLayout`) in its first
    column's metadata, for matching the stream's older layouts to its columns."""
    found = catalog.column_layout(conn, table, publication, generated=generated)
    if found is None:
        return schema
    relid, attrs = found
    columns = [f for f in schema.fields if f.name not in META_NAMES]
    if [a[0] for a in attrs if a is not None] != [f.name for f in columns]:
        return schema  # the table changed between the two reads: names only
    return with_layout(schema, TableLayout(relid, read_at, tuple(attrs)))


def table_spark_schema(conn: Any, table: TableId, key: tuple[str, ...], *,
                       generated: bool = False) -> StructType:
    """The typed schema of *table* from the catalog (stored generated columns with
    *generated*: the publication sends them); the key columns are marked in each
    field's metadata (``{"tidemark.key": true}``) for ``apply_changes``."""
    described = catalog.table_schema(conn, table, key, generated=generated)
    columns = [
        StructField(c.name, spark_type(c.logical), True,
                    {"tidemark.key": True, "tidemark.pg_type": c.type_name} if c.is_key
                    else {"tidemark.pg_type": c.type_name})
        for c in described.columns
    ]
    return typed_schema(columns)
