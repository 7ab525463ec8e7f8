"""The sources the Spark stream reads: one lookup from a stream's options to its
source's read plan, and the Spark schemas of the tables a plan describes.

A source is readable by Spark when its folder has a ``read_plan`` module with
``make_read_plan(options)`` returning a :class:`~tidemark.source.read_plan.ReadPlan`;
the stream (:mod:`tidemark.spark.source`, :mod:`tidemark.spark.reader`) knows nothing
else of it. The plan's module is imported on first use: a PostgreSQL stream never
imports the MariaDB client, nor the reverse.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from pyspark.sql.types import StructField, StructType

from tidemark.source.registry import kind_named
from tidemark.spark.change_schemas import typed_schema
from tidemark.spark.column_history import TableLayout, with_layout
from tidemark.spark.type_mapping import spark_type

if TYPE_CHECKING:
    from pyspark.sql.datasource import DataSourceStreamReader

    from tidemark.event import TableId
    from tidemark.source.read_plan import ReadPlan, TableColumns
    from tidemark.spark.options import SourceOptions


def reader_modules(kind: str) -> tuple[str, ...]:
    """The modules a source's reads run from on the executors (the kind's name:
    ``postgres``, ``mariadb``, ``logtable``, a plugin's): the neutral reader with its
    sinks, and the source's read plan; what warming their Python workers imports."""
    plan = kind_named(kind).read_plan_module()
    return ("tidemark.spark.reader", *((plan,) if plan is not None else ()))


def read_plan(options: SourceOptions) -> ReadPlan:
    """The read plan of the source *options* name (its kind, chosen by the DSN and
    ``source``)."""
    return options.source_kind.read_plan(options)


def spark_schema(described: TableColumns) -> StructType:
    """A typed table's Spark schema from its read plan's description: its columns (key
    columns marked ``{"tidemark.key": true}``, the source's type name under the plan's
    key), the change columns, and its column layout."""
    schema = typed_schema([
        StructField(c.name, spark_type(c.logical), True,
                    {"tidemark.key": True, described.type_key: c.type_name} if c.is_key
                    else {described.type_key: c.type_name})
        for c in described.columns])
    layout = described.layout
    if layout is None:
        return schema
    return with_layout(schema, TableLayout(layout.relation_id, layout.read_at, layout.attrs))


@dataclasses.dataclass(frozen=True)
class SparkSource:
    """A source as the stream uses it: its tables' schemas, and a reader."""

    plan: ReadPlan

    def table_schemas(self, options: SourceOptions) -> dict[TableId, StructType]:
        """Check what can be checked before a query starts and return each table's
        typed Spark schema (raises a SourceError that says what to fix)."""
        return {table: spark_schema(described)
                for table, described in self.plan.tables().items()}

    def stream_reader(self, options: SourceOptions,
                      schema: StructType) -> DataSourceStreamReader:
        """The reader of a query of the stream whose schema is *schema*."""
        from tidemark.spark.reader import PlanStreamReader  # noqa: PLC0415 - pyspark's streaming API, at query start only

        return PlanStreamReader(options, schema, self.plan)


def spark_source(options: SourceOptions) -> SparkSource:
    """The source *options* name, for the stream."""
    return SparkSource(read_plan(options))
