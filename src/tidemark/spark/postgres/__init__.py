"""The Spark stream of a PostgreSQL database: logical decoding (pgoutput) read on the
executors from copies of the query's slot (:mod:`.reader`, :mod:`.wal`), LSN offsets
(:mod:`.offsets`) and snapshots from an exported snapshot (:mod:`.snapshot`)."""

from __future__ import annotations

from pyspark.sql.datasource import DataSourceStreamReader
from pyspark.sql.types import StructType

from tidemark.spark.options import SourceOptions
from tidemark.spark.postgres.schema import table_schemas

__all__ = ["stream_reader", "table_schemas"]


def stream_reader(options: SourceOptions, schema: StructType) -> DataSourceStreamReader:
    """The reader of a PostgreSQL stream's query."""
    from tidemark.spark.postgres.reader import TidemarkStreamReader  # noqa: PLC0415

    return TidemarkStreamReader(options, schema)
