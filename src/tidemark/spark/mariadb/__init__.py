"""The Spark stream of a MariaDB server: whole binlog transactions per batch
(:mod:`.reader`).

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
    from tidemark.spark.mariadb.reader import table_schemas as checked_schemas  # noqa: PLC0415

    return checked_schemas(options)


def stream_reader(options: SourceOptions, schema: StructType) -> DataSourceStreamReader:
    """The reader of a MariaDB stream's query."""
    from tidemark.spark.mariadb.reader import MariaDbStreamReader  # noqa: PLC0415

    return MariaDbStreamReader(options, schema)
