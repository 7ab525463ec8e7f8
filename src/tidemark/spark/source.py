"""The ``tidemark`` PySpark data source: validation and the stream's schema.

``DataSource.schema()`` runs when the user calls ``load()``, before any query starts, so
every check that can fail without reading data happens there: options, the database
being reachable, ``wal_level``, the replication privilege, the tables existing, having
primary keys and being readable; the publication is created (or completed) there too,
after those checks. The slot is
created when the query starts (:meth:`TidemarkStreamReader.initialOffset`), so a
DataFrame that is never started holds no WAL.

The schema is fixed when the query starts. A typed stream whose table gains a column
fails with a message saying to restart the query (see
:class:`tidemark.spark.options.OnSchemaChange`); the envelope stream carries any
columns.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader
from pyspark.sql.types import StructField, StructType

from tidemark.errors import SourceError
from tidemark.event import TableId
from tidemark.source.postgres import catalog, session, slot
from tidemark.spark import wal
from tidemark.spark.arrow_rows import (
    ENVELOPE_SCHEMA,
    PACKED_SCHEMA,
    TABLE_SCHEMAS_KEY,
    envelope_table_schemas,
    struct_envelope_schema,
    typed_schema,
)
from tidemark.spark.options import RowFormat, SourceOptions
from tidemark.spark.reader import TidemarkStreamReader
from tidemark.spark.signals import check_signal_table
from tidemark.spark.type_mapping import spark_type

__all__ = ["TidemarkDataSource", "envelope_table_schemas", "table_spark_schema"]


class TidemarkDataSource(DataSource):
    """``spark.readStream.format("tidemark")``: PostgreSQL changes as a stream.

    With ``table`` set, a typed stream of that table (its columns plus the change
    columns of :mod:`tidemark.spark.arrow_rows`); otherwise the envelope stream of every
    table in ``tables``. Options: :mod:`tidemark.spark.options`.
    """

    @classmethod
    def name(cls) -> str:
        return "tidemark"

    def _options(self) -> SourceOptions:
        return SourceOptions.parse(self.options, default_partitions=os.cpu_count() or 1)

    def schema(self) -> StructType:
        """Validate the options and the database, then build the stream's schema."""
        options = self._options()
        if options.is_mariadb:
            from tidemark.spark.mariadb_reader import table_schemas  # noqa: PLC0415

            return self._stream_schema(options, table_schemas(options))
        if options.is_logtable:
            from tidemark.spark import logtable_reader  # noqa: PLC0415

            return self._stream_schema(options, logtable_reader.table_schemas(options))
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
            schemas = {t: table_spark_schema(conn, t, keys[t], generated=generated)
                       for t in tables}
        if options.signal_table is not None:
            with contextlib.closing(wal.connect(options.dsn, purpose="catalog")) as signals:
                check_signal_table(signals, options.signal_table)
        return self._stream_schema(options, schemas)

    @staticmethod
    def _stream_schema(options: SourceOptions, schemas: dict[TableId, StructType]
                       ) -> StructType:
        if options.table is not None:
            return schemas[options.table]
        metadata = {TABLE_SCHEMAS_KEY: {str(t): s.json() for t, s in schemas.items()}}
        if options.row_format is RowFormat.STRUCT:
            envelope = struct_envelope_schema({str(t): s for t, s in schemas.items()})
            carrier = "table"
        elif options.row_format is RowFormat.ARROW:
            envelope, carrier = PACKED_SCHEMA, "table"
        else:
            envelope, carrier = ENVELOPE_SCHEMA, "after"
        return StructType([StructField(f.name, f.dataType, f.nullable,
                                       metadata if f.name == carrier else f.metadata)
                           for f in envelope.fields])

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:  # noqa: N802 - pyspark API name
        options = self._options()
        if options.is_mariadb:
            from tidemark.spark.mariadb_reader import MariaDbStreamReader  # noqa: PLC0415

            return MariaDbStreamReader(options, schema)
        if options.is_logtable:
            from tidemark.spark.logtable_reader import LogTableStreamReader  # noqa: PLC0415

            return LogTableStreamReader(options, schema)
        return TidemarkStreamReader(options, schema)


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
