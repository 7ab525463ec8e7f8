"""The Spark stream of CDC log tables (PostgreSQL or SQLite): stream groups read over the
query's partitions (:mod:`.reader`).

Nothing here imports pyspark until a function is called: ``tidemark status`` reads this
package's offsets without Spark."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql.datasource import DataSourceStreamReader
    from pyspark.sql.types import StructType

    from tidemark.event import TableId
    from tidemark.spark.options import SourceOptions

__all__ = ["stream_reader", "table_schemas"]


def table_schemas(options: SourceOptions) -> dict[TableId, StructType]:
    """Check the source and return each table's typed Spark schema."""
    from tidemark.spark.logtable.reader import table_schemas as checked_schemas  # noqa: PLC0415

    return checked_schemas(options)


def stream_reader(options: SourceOptions, schema: StructType) -> DataSourceStreamReader:
    """The reader of a log-table stream's query."""
    from tidemark.spark.logtable.reader import LogTableStreamReader  # noqa: PLC0415

    return LogTableStreamReader(options, schema)
