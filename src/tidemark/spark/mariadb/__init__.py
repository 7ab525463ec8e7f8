"""The Spark stream of a MariaDB server: whole binlog transactions per batch
(:mod:`.reader`)."""

from __future__ import annotations

from pyspark.sql.datasource import DataSourceStreamReader
from pyspark.sql.types import StructType

from tidemark.spark.mariadb.reader import MariaDbStreamReader, table_schemas
from tidemark.spark.options import SourceOptions

__all__ = ["stream_reader", "table_schemas"]


def stream_reader(options: SourceOptions, schema: StructType) -> DataSourceStreamReader:
    """The reader of a MariaDB stream's query."""
    return MariaDbStreamReader(options, schema)
