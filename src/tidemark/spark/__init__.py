"""tidemark on Spark: PostgreSQL changes as a PySpark streaming source.

Two ways to read, one data source (``format("tidemark")``):

* **one typed table** — :func:`read_table` (or ``.option("table", "public.orders")``): the
  table's own columns and Spark types plus ``_op``, ``_lsn``, ``_commit_lsn``, ``_seq``,
  ``_commit_ts``, ``_txid``, ``_unavailable``. The fastest path (columns are converted
  as whole Arrow arrays) and the shape ``apply_changes`` takes.
* **many tables in one stream** — :func:`read_changes` (or ``.option("tables", "a,b")``):
  the envelope (``table``, the change columns, ``key``/``before``/``after`` as JSON).
  Every table's changes of one transaction are in the same micro-batch, so a
  ``foreachBatch`` sees transactions whole; :func:`table_changes` gives the typed view
  of one table of it, with the same types as :func:`read_table`. With
  ``row_format="struct"`` the envelope carries each table's typed row in a struct
  column instead of JSON text: the fast path when the consumer wants typed rows; with
  ``row_format="arrow"`` each row is a whole Arrow batch of one table, for consumers
  that collect batches to the driver (:func:`tidemark.spark.change_schemas.typed_rows`).

Each streaming query needs its own replication slot (the slot's position is the query's
progress): two typed tables read as two queries use two slots.

Example::

    import tidemark.spark as ts
    orders = ts.read_table(spark, dsn=dsn, table="public.orders", slot="orders_cdc")
    (orders.writeStream.format("parquet").option("path", "out/orders")
           .option("checkpointLocation", "chk/orders").trigger(availableNow=True).start())

pyspark is imported on first use, not by ``import tidemark.spark``: the package's pure
modules (``options``, ``offsets``, ``wal``) serve commands that never start Spark
(``tidemark status``, the validation of a pipeline file), which must not pay for it.
"""

from __future__ import annotations

import os
import sys
import weakref
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import msgspec
import pyarrow as pa

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from tidemark.source.kind import SourceKind
    from tidemark.spark.source import TidemarkDataSource


def __getattr__(name: str) -> Any:
    """``TidemarkDataSource``, imported (with pyspark) when first asked for."""
    if name == "TidemarkDataSource":
        from tidemark.spark.source import TidemarkDataSource  # noqa: PLC0415

        return TidemarkDataSource
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["TidemarkDataSource", "read_changes", "read_table", "register", "table_changes"]


def register(spark: SparkSession) -> None:
    """Make ``spark.readStream.format("tidemark")`` and the ``tidemark-delta`` sink
    (:mod:`tidemark.spark.delta_sink`) available in *spark*.

    Also points ``PYSPARK_PYTHON`` at this interpreter when it is unset, so that Spark's
    Python workers import the same tidemark (local mode; on a cluster, install tidemark
    on the executors' Python).
    """
    from tidemark.source.registry import runtime_kinds  # noqa: PLC0415
    from tidemark.spark.delta_sink import DeltaChangesSink  # noqa: PLC0415
    from tidemark.spark.source import carrying  # noqa: PLC0415

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    # Once per session (and again if kinds were registered since): a Spark Declarative
    # Pipeline forbids registering inside its query functions, so it registers at import
    # and read_table must not do it again.
    kinds = runtime_kinds()
    if _registered.get(spark) == kinds:
        return
    spark.dataSource.register(carrying(kinds))
    spark.dataSource.register(DeltaChangesSink)
    _registered[spark] = kinds


_registered: weakref.WeakKeyDictionary[SparkSession, tuple[SourceKind, ...]] = \
    weakref.WeakKeyDictionary()


def _default_parallelism(spark: SparkSession) -> int:
    try:
        return int(spark.sparkContext.defaultParallelism)
    except Exception:  # Spark Connect has no SparkContext
        return os.cpu_count() or 1


def _reader(spark: SparkSession, dsn: str, options: Mapping[str, Any]) -> DataFrame:
    register(spark)
    stream = spark.readStream.format("tidemark").option("dsn", dsn)
    values = {k: v for k, v in options.items() if v is not None}
    values.setdefault("numPartitions", _default_parallelism(spark))
    for key, value in values.items():
        stream = stream.option(key, str(value))
    return stream.load()


def read_table(spark: SparkSession, *, dsn: str, table: str, slot: str | None = None,
               publication: str | None = None, max_changes_per_trigger: int | None = None,
               num_partitions: int | None = None, **options: Any) -> DataFrame:
    """The typed change stream of one table (see the module docstring).

    ``num_partitions`` defaults to Spark's default parallelism; further ``options`` are
    passed on as source options (:mod:`tidemark.spark.options`).
    """
    return _reader(spark, dsn, {"table": table, "slot": slot, "publication": publication,
                                "maxChangesPerTrigger": max_changes_per_trigger,
                                "numPartitions": num_partitions, **options})


def read_changes(spark: SparkSession, *, dsn: str, tables: Sequence[str],
                 slot: str | None = None, publication: str | None = None,
                 max_changes_per_trigger: int | None = None,
                 num_partitions: int | None = None, row_format: str | None = None,
                 **options: Any) -> DataFrame:
    """The envelope change stream of several tables (see the module docstring);
    *row_format* is ``json`` (default), ``struct`` or ``arrow``."""
    return _reader(spark, dsn, {"tables": ",".join(tables), "slot": slot,
                                "publication": publication, "rowFormat": row_format,
                                "maxChangesPerTrigger": max_changes_per_trigger,
                                "numPartitions": num_partitions, **options})


def table_changes(envelope: DataFrame, table: str) -> DataFrame:
    """The rows of *table* in an envelope stream (or batch of it), in the typed shape.

    Works on the streaming DataFrame and on the batch DataFrames a ``foreachBatch``
    receives; the conversion is the typed stream's, so both give equal rows.
    """
    from pyspark.sql import functions as F  # noqa: N812, PLC0415 - pyspark's convention

    from tidemark.change_rows import CHANGE_COLUMNS  # noqa: PLC0415
    from tidemark.spark.change_schemas import (  # noqa: PLC0415
        META_NAMES,
        arrow_schema,
        envelope_table_schemas,
        is_packed_envelope,
        is_struct_envelope,
        typed_rows,
    )
    from tidemark.spark.type_mapping import converter  # noqa: PLC0415

    schemas = envelope_table_schemas(envelope.schema)
    name = table if "." in table else f"public.{table}"
    if name not in schemas:
        raise ValueError(f"table {name} is not in this stream; it has {', '.join(schemas)}")
    typed = schemas[name]
    if is_packed_envelope(envelope.schema.fieldNames()):
        def unpack(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            for batch in batches:
                yield from typed_rows(pa.Table.from_batches([batch]), name, typed).to_batches()

        return envelope.where(F.col("table") == name).mapInArrow(unpack, typed)
    if is_struct_envelope(envelope.schema):
        row = F.col("`" + name.replace("`", "``") + "`")
        data = [row.getField(f.name).alias(f.name) for f in typed.fields
                if f.name not in META_NAMES]
        meta_columns = [F.col(f.name) for f in typed.fields if f.name in META_NAMES]
        return envelope.where(F.col("table") == name).select(*data, *meta_columns)
    target = arrow_schema(typed)
    columns = [f for f in typed.fields if f.name not in META_NAMES]
    converters = [converter(f.dataType, target.field(f.name).type) for f in columns]
    names = [f.name for f in columns]
    meta = CHANGE_COLUMNS

    def convert(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        decode = msgspec.json.Decoder(dict[str, str | None]).decode
        for batch in batches:
            ops = batch.column("_op").to_pylist()
            afters = batch.column("after").to_pylist()
            befores = batch.column("before").to_pylist()
            rows: list[dict[str, str | None]] = []
            for op, after, before in zip(ops, afters, befores, strict=True):
                text = before if op == "d" else after
                rows.append(decode(text) if text is not None else {})
            arrays = [convert_column([r.get(n) for r in rows])
                      for n, convert_column in zip(names, converters, strict=True)]
            arrays += [batch.column(m).cast(target.field(m).type) for m in meta]
            yield pa.RecordBatch.from_arrays(arrays, schema=target)

    return envelope.where(F.col("table") == name).mapInArrow(convert, typed)
