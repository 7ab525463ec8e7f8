"""``create_delta_cdc_flow``: Spark Declarative Pipelines' ``create_auto_cdc_flow`` into a
Delta table, with tidemark's apply.

``pyspark.pipelines.create_auto_cdc_flow`` needs a target format that supports MERGE
(Delta's or Iceberg's Spark connector), which a plain pyspark install lacks: it fails with
``AUTOCDC_TARGET_DOES_NOT_SUPPORT_MERGE``. This declares instead a sink of
:mod:`tidemark.spark.delta_sink` (delta-rs, no connector) and an append flow into it from
*source*, with the same parameters and meanings. ``sequence_by`` and ``apply_as_deletes``
may be SQL expressions, as there: the flow computes them into columns the sink reads
(and leaves out of the target). Where the source is tidemark's (it has the ``_op``
column), deletes and truncates are known without ``apply_as_deletes``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, Literal

from pyspark.sql import DataFrame, SparkSession

from tidemark.errors import ConfigError
from tidemark.spark import register
from tidemark.spark.delta_sink import NAME

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SEQUENCE = "_tidemark_sequence"
_DELETE = "_tidemark_delete"


def create_delta_cdc_flow(
    target: str,
    source: str,
    keys: Sequence[str],
    sequence_by: str | Sequence[str],
    apply_as_deletes: str | None = None,
    column_list: Sequence[str] | None = None,
    except_column_list: Sequence[str] | None = None,
    stored_as_scd_type: Literal[1, 2, "1", "2"] | None = None,
    name: str | None = None,
    *,
    track_history_column_list: Sequence[str] | None = None,
    track_history_except_column_list: Sequence[str] | None = None,
    path: str,
    storage_options: dict[str, str] | None = None,
) -> None:
    """Declare, in the pipeline being defined, a sink *target* writing the Delta table at
    *path* and a flow (*name*, default *target*) applying the changes of the streaming
    dataset *source* to it, as ``create_auto_cdc_flow(target, source, keys, sequence_by,
    …)`` would into a MERGE-capable table. Call it at import, outside query functions."""
    from pyspark import pipelines as dp  # noqa: PLC0415

    if column_list is not None and except_column_list is not None:
        raise ConfigError("column_list", "give column_list or except_column_list, not both")
    spark = SparkSession.active()
    register(spark)
    # A list of columns (an extension: tidemark's order is _commit_lsn, then _seq), one
    # column, or an expression computed into a column by the flow.
    if isinstance(sequence_by, str):
        sequence = sequence_by if _IDENTIFIER.fullmatch(sequence_by) else _SEQUENCE
    else:
        sequence = ",".join(sequence_by)
    helpers = [c for c, used in ((_SEQUENCE, sequence == _SEQUENCE),
                                 (_DELETE, apply_as_deletes is not None)) if used]
    options: dict[str, str] = {"path": path, "keys": ",".join(keys), "sequenceBy": sequence,
                               "appId": f"tidemark-cdc-flow-{name or target}"}
    if apply_as_deletes is not None:
        options["deletesColumn"] = _DELETE
    excluded = [*(except_column_list or ()), *helpers]
    if column_list is not None:
        options["columnList"] = ",".join(column_list)
    elif excluded:
        options["exceptColumnList"] = ",".join(excluded)
    if stored_as_scd_type is not None:
        options["storedAsScdType"] = str(stored_as_scd_type)
    if track_history_column_list is not None:
        options["trackHistoryColumnList"] = ",".join(track_history_column_list)
    if track_history_except_column_list is not None:
        options["trackHistoryExceptColumnList"] = ",".join(track_history_except_column_list)
    for key, value in (storage_options or {}).items():
        options[f"storage.{key}"] = value
    dp.create_sink(target, format=NAME, options=options)

    def flow() -> DataFrame:
        from pyspark.sql import functions as F  # noqa: N812, PLC0415

        changes: Any = spark.readStream.table(source)
        if sequence == _SEQUENCE:
            assert isinstance(sequence_by, str)
            changes = changes.withColumn(_SEQUENCE, F.expr(sequence_by))
        if apply_as_deletes is not None:
            changes = changes.withColumn(_DELETE, F.expr(apply_as_deletes))
        frame: DataFrame = changes
        return frame

    dp.append_flow(target=target, name=name or target)(flow)
