"""The sources the Spark stream reads, and what a source provides to be one of them.

The stream (:mod:`tidemark.spark.source`) knows a source only through
:class:`SparkSource`: a package under ``tidemark/spark/`` (``postgres/``, ``mariadb/``,
``logtable/``) whose ``__init__`` has the two functions below. Its reader is a pyspark
``DataSourceStreamReader``: offsets, partitions and ``read`` are the source's own, and
``read`` hands its changes to the shared sinks
(:func:`tidemark.spark.stream_sink.stream_sink`): as pgoutput row blocks, the sinks'
native input (the PostgreSQL reader's vectorized path, :mod:`tidemark.spark.decode`),
or as change events through :class:`tidemark.spark.event_feeder.EventFeeder`, as the
MariaDB and log-table readers do. Adding a source is a
new package and one line in :func:`spark_source`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Protocol, cast

from pyspark.sql.datasource import DataSourceStreamReader
from pyspark.sql.types import StructType

from tidemark.event import TableId
from tidemark.spark.options import SourceOptions


class SparkSource(Protocol):
    """What a source gives the Spark stream."""

    def table_schemas(self, options: SourceOptions) -> dict[TableId, StructType]:
        """Check what can be checked before a query starts (the server, privileges,
        the tables and their keys) and return each table's typed Spark schema (key
        columns marked ``{"tidemark.key": true}``), raising a SourceError that says
        what to fix."""
        ...

    def stream_reader(self, options: SourceOptions,
                      schema: StructType) -> DataSourceStreamReader:
        """The reader of a query of the stream whose schema is *schema*."""
        ...


def spark_source(options: SourceOptions) -> SparkSource:
    """The source *options* name (imported on first use: a PostgreSQL stream never
    imports the MariaDB client, nor the reverse)."""
    package = "mariadb" if options.is_mariadb else "logtable" if options.is_logtable \
        else "postgres"
    return cast(SparkSource, importlib.import_module(f"tidemark.spark.{package}"))


if TYPE_CHECKING:  # mypy checks that each package is a SparkSource
    from tidemark.spark import logtable, mariadb, postgres

    _SOURCES: tuple[SparkSource, ...] = (postgres, mariadb, logtable)
