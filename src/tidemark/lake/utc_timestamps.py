"""Arrow timestamps in the form Delta takes: labelled ``UTC``.

An Arrow timestamp with a time zone holds UTC instants; the zone is only a label (Spark
labels them with its session time zone, ``Etc/UTC`` or ``America/New_York``). Delta's
``timestamp`` is UTC-adjusted, and delta-rs refuses any label but ``UTC``
(``Invalid data type for Delta Lake: Timestamp(µs, "Etc/UTC")``), so changes are
relabelled before they reach it: the same instants, nothing converted. A timestamp
without a zone is left alone (Delta's ``timestamp_ntz``).
"""

from __future__ import annotations

import pyarrow as pa

_UTC = "UTC"


def utc_type(dtype: pa.DataType) -> pa.DataType:
    """*dtype* with every zoned timestamp in it (nested ones too) labelled ``UTC``."""
    if pa.types.is_timestamp(dtype):
        return pa.timestamp(dtype.unit, _UTC) if dtype.tz not in (None, _UTC) else dtype
    if pa.types.is_list(dtype) or pa.types.is_large_list(dtype):
        inner = utc_type(dtype.value_type)
        if inner == dtype.value_type:
            return dtype
        field = dtype.value_field.with_type(inner)
        return pa.list_(field) if pa.types.is_list(dtype) else pa.large_list(field)
    if pa.types.is_struct(dtype):
        fields = [dtype.field(i) for i in range(dtype.num_fields)]
        relabelled = [f.with_type(utc_type(f.type)) for f in fields]
        return dtype if relabelled == fields else pa.struct(relabelled)
    return dtype


def utc_schema(schema: pa.Schema) -> pa.Schema:
    """*schema* with its zoned timestamps labelled ``UTC`` (itself when none is not)."""
    fields = [f.with_type(utc_type(f.type)) for f in schema]
    return schema if fields == list(schema) else pa.schema(fields, schema.metadata)


def utc_timestamps(table: pa.Table) -> pa.Table:
    """*table* with its zoned timestamps labelled ``UTC``: the same instants."""
    schema = utc_schema(table.schema)
    return table if schema is table.schema else table.cast(schema)
