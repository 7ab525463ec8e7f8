"""Hashing the keys of merge-on-read targets (:func:`key_hashes`) and merging the key
index's sorted lookup levels (:func:`merged_levels`); :func:`plain_schema`, the Arrow
types the key index and the rewrites hold."""

from __future__ import annotations

from typing import Any

import duckdb
import numpy as np
import pyarrow as pa

_U64 = np.dtype(np.uint64)


def plain_schema(schema: pa.Schema) -> pa.Schema:
    """*schema* with delta-rs's string and binary views as plain strings and binaries
    (what Parquet files read as, and what every Arrow kernel takes)."""
    return pa.schema([field.with_type(_plain(field.type)) for field in schema])


def _plain(kind: pa.DataType) -> pa.DataType:
    if pa.types.is_string_view(kind):
        return pa.string()
    if pa.types.is_binary_view(kind):
        return pa.binary()
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return pa.list_(kind.value_field.with_type(_plain(kind.value_type)))
    return kind


def key_hashes(keys: pa.Table) -> tuple[np.ndarray[Any, np.dtype[np.uint64]], bool]:
    """A 64-bit hash of each row of *keys*, and whether it is exact (the key itself: one
    integer column). Inexact hashes are checked against the key values on lookup. Types
    are widened first (every integer to int64, strings and binaries to their plain
    types), so a key hashes the same in a batch and in a file written before a widening."""
    keys = keys.cast(pa.schema([f.with_type(_hash_type(f.type)) for f in keys.schema]))
    if keys.num_columns == 1 and pa.types.is_integer(keys.schema.field(0).type):
        values = keys.column(0).to_numpy()
        return np.ascontiguousarray(values).view(_U64), True
    con = duckdb.connect()
    try:
        con.register("k", keys)
        names = ", ".join('"' + n.replace('"', '""') + '"' for n in keys.column_names)
        hashes = con.execute(f"SELECT hash({names}) FROM k").to_arrow_table().column(0)
    finally:
        con.close()
    return np.asarray(hashes.to_numpy(), dtype=_U64), False


def _hash_type(kind: pa.DataType) -> pa.DataType:
    if pa.types.is_integer(kind):
        return pa.int64()
    if pa.types.is_string(kind) or pa.types.is_large_string(kind) \
            or pa.types.is_string_view(kind):
        return pa.string()
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind) \
            or pa.types.is_binary_view(kind):
        return pa.binary()
    return kind


def merged_levels(first: tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]],
            second: tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]
            ) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """Two lookup levels (hashes sorted, with their row numbers) as one, sorted."""
    if not len(first[0]):
        return second
    if not len(second[0]):
        return first
    at = np.searchsorted(first[0], second[0], side="right")
    return np.insert(first[0], at, second[0]), np.insert(first[1], at, second[1])
