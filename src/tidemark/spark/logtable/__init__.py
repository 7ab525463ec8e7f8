"""The Spark stream of CDC log tables (PostgreSQL or SQLite): stream groups read over the
query's partitions (:mod:`.reader`)."""

from __future__ import annotations

from pyspark.sql.datasource import DataSourceStreamReader
from pyspark.sql.types import StructType

from tidemark.spark.logtable.reader import LogTableStreamReader, table_schemas
from tidemark.spark.options import SourceOptions

__all__ = ["stream_reader", "table_schemas"]


def stream_reader(options: SourceOptions, schema: StructType) -> DataSourceStreamReader:
    """The reader of a log-table stream's query."""
    return LogTableStreamReader(options, schema)
