"""The ``tidemark`` PySpark data source: the stream's schema and its reader.

``DataSource.schema()`` runs when the user calls ``load()``, before any query starts, so
every check that can fail without reading data happens there; the source of the stream
(:mod:`tidemark.spark.sources`, by the DSN) does its own checks and gives each table's
typed schema, from which this module builds the stream's schema (one table's, or the
envelope of all of them).

The schema is fixed when the query starts. A typed stream whose table gains a column
fails with a message saying to restart the query (see
:class:`tidemark.spark.options.OnSchemaChange`); the envelope stream carries any
columns.
"""

from __future__ import annotations

import os
from typing import ClassVar

from pyspark.sql.datasource import DataSource, DataSourceStreamReader
from pyspark.sql.types import StructField, StructType

from tidemark.event import TableId
from tidemark.source.kind import SourceKind
from tidemark.spark.change_schemas import (
    ENVELOPE_SCHEMA,
    PACKED_SCHEMA,
    TABLE_SCHEMAS_KEY,
    envelope_table_schemas,
    struct_envelope_schema,
)
from tidemark.spark.options import RowFormat, SourceOptions
from tidemark.spark.sources import spark_source

__all__ = ["TidemarkDataSource", "envelope_table_schemas"]


class TidemarkDataSource(DataSource):
    """``spark.readStream.format("tidemark")``: a database's changes as a stream.

    With ``table`` set, a typed stream of that table (its columns plus the change
    columns of :mod:`tidemark.spark.arrow_rows`); otherwise the envelope stream of every
    table in ``tables``. Options: :mod:`tidemark.spark.options`.
    """

    #: Source kinds registered at run time, which the Python workers that run this data
    #: source never registered: they travel with the class (see :func:`carrying`).
    kinds: ClassVar[tuple[SourceKind, ...]] = ()

    @classmethod
    def name(cls) -> str:
        return "tidemark"

    def _options(self) -> SourceOptions:
        return SourceOptions.parse(self.options, default_partitions=os.cpu_count() or 1,
                                   kinds=self.kinds)

    def schema(self) -> StructType:
        """Validate the options and the database, then build the stream's schema."""
        options = self._options()
        return self._stream_schema(options, spark_source(options).table_schemas(options))

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
        return spark_source(options).stream_reader(options, schema)


def carrying(kinds: tuple[SourceKind, ...]) -> type[TidemarkDataSource]:
    """The data source class to register in a session: :class:`TidemarkDataSource`
    itself, or, when source kinds were registered at run time, a subclass made here that
    holds them. Spark pickles a registered class to its Python workers; a class that is
    not a module attribute travels by value, with its kinds (no option a user could set
    carries code)."""
    if not kinds:
        return TidemarkDataSource
    carrier: type[TidemarkDataSource] = type(
        "TidemarkDataSourceWithKinds", (TidemarkDataSource,),
        {"kinds": kinds, "__module__": __name__, "__doc__": TidemarkDataSource.__doc__})
    return carrier
