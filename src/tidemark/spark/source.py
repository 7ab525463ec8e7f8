"""The ``tidemark`` PySpark data source: validation and the stream's schema.

``DataSource.schema()`` runs when the user calls ``load()``, before any query starts, so
every check that can fail without reading data happens there: options, the database
being reachable, ``wal_level``, the replication privilege, the tables existing and
having primary keys; the publication is created (or completed) there too. The slot is
created when the query starts (:meth:`TidemarkStreamReader.initialOffset`), so a
DataFrame that is never started holds no WAL.

The schema is fixed when the query starts. A typed stream whose table gains a column
fails with a message saying to restart the query (see
:class:`tidemark.spark.options.OnSchemaChange`); the envelope stream carries any
columns.
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Any, Final

from pyspark.sql.datasource import DataSource, DataSourceStreamReader
from pyspark.sql.types import StructField, StructType

from tidemark.errors import SourceError
from tidemark.event import TableId
from tidemark.source.postgres import catalog, session, slot
from tidemark.spark.arrow_rows import ENVELOPE_SCHEMA, typed_schema
from tidemark.spark.options import SourceOptions
from tidemark.spark.reader import TidemarkStreamReader
from tidemark.spark.type_mapping import spark_type

#: Metadata key on the envelope's ``after`` field: table name -> typed schema (JSON).
TABLE_SCHEMAS_KEY: Final = "tidemark.table_schemas"


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
            slot.ensure_publication(conn, options.publication, tables)
            schemas = {t: table_spark_schema(conn, t, keys[t]) for t in tables}
        if options.table is not None:
            return schemas[options.table]
        metadata = {TABLE_SCHEMAS_KEY: {str(t): s.json() for t, s in schemas.items()}}
        fields = [StructField(f.name, f.dataType, f.nullable,
                              metadata if f.name == "after" else f.metadata)
                  for f in ENVELOPE_SCHEMA.fields]
        return StructType(fields)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:  # noqa: N802 - pyspark API name
        return TidemarkStreamReader(self._options(), schema)


def table_spark_schema(conn: Any, table: TableId, key: tuple[str, ...]) -> StructType:
    """The typed schema of *table* from the catalog; the key columns are marked in each
    field's metadata (``{"tidemark.key": true}``) for ``apply_changes``."""
    described = catalog.table_schema(conn, table, key)
    columns = [
        StructField(c.name, spark_type(c.type_oid, c.type_modifier), True,
                    {"tidemark.key": True, "tidemark.pg_type": c.type_name} if c.is_key
                    else {"tidemark.pg_type": c.type_name})
        for c in described.columns
    ]
    return typed_schema(columns)


def envelope_table_schemas(schema: StructType) -> dict[str, StructType]:
    """The typed schemas an envelope stream's schema carries, by ``schema.table``."""
    after = schema["after"] if "after" in schema.fieldNames() else None
    raw = (after.metadata or {}).get(TABLE_SCHEMAS_KEY) if after is not None else None
    if not isinstance(raw, dict):
        raise ValueError("not a tidemark envelope stream (its 'after' column has no table "
                         "schemas): use tidemark.spark.read_changes")
    return {name: StructType.fromJson(json.loads(text)) for name, text in raw.items()}
