"""Apply a Spark DataFrame of Debezium JSON events (a ``value`` column) to a Delta table.

Deliberately thin: the DataFrame is collected to the driver as Arrow (``toArrow``) and
handed to :func:`changes_from_debezium_json` and :func:`apply_changes`, which is what a
``foreachBatch`` over a Debezium topic needs. pyspark is not imported here, so the lake
package works without it.
"""

from __future__ import annotations

import os
from typing import Protocol

import pyarrow as pa

from tidemark.lake.debezium_input import changes_from_debezium_json
from tidemark.lake.delta_writer import ApplyResult, apply_changes
from tidemark.lake.spec import ApplySpec


class ArrowDataFrame(Protocol):
    """The part of ``pyspark.sql.DataFrame`` used here."""

    def select(self, *cols: str) -> ArrowDataFrame: ...

    def toArrow(self) -> pa.Table: ...  # noqa: N802 (pyspark's name)


def apply_debezium_dataframe(df: ArrowDataFrame, target: str | os.PathLike[str],
                             schema: pa.Schema, spec: ApplySpec, *, app_id: str, version: int,
                             value_column: str = "value", decimal_handling_mode: str = "precise",
                             storage_options: dict[str, str] | None = None) -> ApplyResult:
    """Apply the Debezium JSON events in *df*'s *value_column* (string or binary, in the
    DataFrame's order) to the Delta table at *target*; *schema* is the source table's
    Arrow schema. In ``foreachBatch(lambda df, batch_id: …)`` pass the query id as
    *app_id* and ``batch_id`` as *version*."""
    values = df.select(value_column).toArrow().column(0).to_pylist()
    changes = changes_from_debezium_json(values, schema,
                                         decimal_handling_mode=decimal_handling_mode)
    return apply_changes(target, changes, spec, app_id=app_id, version=version,
                         storage_options=storage_options)
